// Package sqlite is the embedded Store: modernc.org/sqlite (pure Go, no cgo)
// through sqlx, for one process on one host.
//
// Discipline: the store holds one connection and runs every write on it,
// one at a time, each transaction begun with BEGIN IMMEDIATE, so writers
// queue in Go rather than spinning on SQLITE_BUSY, and a claim's
// read-decide-write happens under SQLite's write lock. Transactions that
// queue while one commits are committed next as a group, each in a
// savepoint, with one fsync; none is answered before its commit. Reads that need no transaction use a separate read-only pool, which
// WAL mode lets run beside the writer. synchronous=FULL makes a committed
// claim survive power loss, so a lease handed out is never forgotten.
//
// What a claim costs is mostly its commit: one WAL frame, a page write,
// for every B-tree page it changed. The schema (migration 2) is shaped so
// that a lease changes few B-trees, and since the writer sees every
// committed lease, one pick serves the next 16 claims of an inventory
// (each a compare-and-set on its candidate); see docs/performance.md.
//
// Events: triggers (migration 5) append a change's events in its
// transaction; an event's id is its rowid, handed out in commit order as
// the writers are serialized.
package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"

	"github.com/jmoiron/sqlx"
	"github.com/pressly/goose/v3"
	sqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/sandboxwich/sandboxwich/store"
	"github.com/sandboxwich/sandboxwich/store/internal/sqlstore"
)

//go:embed migrations/*.sql
var embedded embed.FS

// Migrations holds the versioned SQLite migrations (goose format).
var Migrations, _ = fs.Sub(embedded, "migrations")

// Store is the SQLite implementation of store.Store, with the optional
// abilities store.Webhooks and store.IdempotencyStore. Each method's
// contract is the doc comment of the interface that declares it.
type Store struct {
	s *sqlstore.Store
}

var (
	_ store.Store            = (*Store)(nil)
	_ store.Webhooks         = (*Store)(nil)
	_ store.IdempotencyStore = (*Store)(nil)
)

// Options tunes Open. The zero value is the recommended configuration.
type Options struct {
	// SkipMigrate leaves the schema as it is; Ping then fails until
	// `sandboxwich migrate` has run.
	SkipMigrate bool
	// ReadConns is the size of the read-only pool (default 4).
	ReadConns int
}

// Open opens (creating if needed) the database file at path, migrates it
// unless told not to, and returns a Store. A new database file is created
// with mode 0600, whatever the umask, and SQLite gives its -wal and -shm
// files the same mode; an existing file keeps its mode.
func Open(ctx context.Context, path string, opts Options) (*Store, error) {
	if path == "" {
		return nil, errors.New("sqlite: empty database path")
	}
	if err := createPrivate(path); err != nil {
		return nil, err
	}
	w, err := sqlx.Open("sqlite", dsn(path, "_txlock=immediate"))
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	// One connection the store holds for its writes, one for DB's users.
	w.SetMaxOpenConns(2)
	w.SetMaxIdleConns(2)
	w.SetConnMaxLifetime(0)
	fail := func(err error) (*Store, error) {
		_ = w.Close()
		return nil, err
	}
	if err := w.PingContext(ctx); err != nil {
		return fail(fmt.Errorf("sqlite: open %s: %w", path, err))
	}
	if !opts.SkipMigrate {
		if err := Migrate(ctx, w.DB); err != nil {
			return fail(err)
		}
	}
	version, err := sqlstore.LatestVersion(goose.DialectSQLite3, w.DB, Migrations)
	if err != nil {
		return fail(err)
	}
	r, err := sqlx.Open("sqlite", dsn(path, "_pragma=query_only(1)"))
	if err != nil {
		return fail(fmt.Errorf("sqlite: open %s: %w", path, err))
	}
	n := opts.ReadConns
	if n <= 0 {
		n = 4
	}
	r.SetMaxOpenConns(n)
	r.SetMaxIdleConns(n)
	return &Store{s: sqlstore.New(w, r, sqlstore.Dialect{
		Name:            "sqlite",
		Bind:            sqlx.QUESTION,
		Retryable:       retryable,
		UniqueViolation: uniqueViolation,
		Unavailable:     unavailable,
		SchemaVersion:   version,
		HeldBegin:       "BEGIN IMMEDIATE",
	})}, nil
}

// createPrivate creates the file at path with mode 0600 unless it exists.
func createPrivate(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("sqlite: create %s: %w", path, err)
	}
	err = f.Chmod(0o600) // a umask beyond 077 would have taken bits away
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sqlite: create %s: %w", path, err)
	}
	return nil
}

// Migrate applies the embedded migrations to db.
func Migrate(ctx context.Context, db *sql.DB) error {
	return sqlstore.Migrate(ctx, db, goose.DialectSQLite3, Migrations, nil)
}

func dsn(path, extra string) string {
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(FULL)")
	q.Add("_pragma", "foreign_keys(1)")
	return "file:" + path + "?" + q.Encode() + "&" + extra
}

func code(err error) int {
	if e, ok := errors.AsType[*sqlite.Error](err); ok {
		return e.Code()
	}
	return 0
}

func retryable(err error) bool {
	switch code(err) & 0xff {
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
		return true
	}
	return false
}

// unavailable: the disk is full, or the file cannot be read, written or
// opened (SQLITE_FULL, SQLITE_IOERR, SQLITE_CANTOPEN).
func unavailable(err error) bool {
	switch code(err) & 0xff {
	case sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CANTOPEN:
		return true
	}
	return false
}

func uniqueViolation(err error) bool {
	c := code(err)
	return c == sqlite3.SQLITE_CONSTRAINT_UNIQUE || c == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY
}
