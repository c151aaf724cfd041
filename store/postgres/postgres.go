// Package postgres is the shared Store: lib/pq through sqlx, for deployments
// where many server replicas share one PostgreSQL database.
//
// Concurrency: a claim picks the oldest claimable cell with FOR UPDATE SKIP
// LOCKED, so concurrent claims on one inventory take different cells in
// parallel; when every candidate is locked it waits for them instead, so an
// empty answer is exact. Identical fenced claims meet at the fence's
// primary key: the loser rolls back and replays the winner's outcome. Only
// when a pool keeps a ready floor do claims also take a transaction-scoped
// advisory lock on their inventory (tenant and exact release): counting the
// floor needs them one at a time, or two could each see one cell above it
// (the lock key is hashed to 64 bits; a collision only makes two
// inventories wait for each other). A claim with no other claim of its
// Store in flight skips the transaction: it picks with a plain read — or
// takes the next candidate the inventory's previous lease statement
// returned — and writes the lease, its membership and its fence as one
// autocommitted statement whose compare-and-set writes all of it or
// nothing, falling back to the transaction when that statement finds the
// cell taken.
// Every write is still a compare-and-set on (state, generation, lease_id),
// so pool reconciliation can never make a claim take a cell that changed
// under it.
//
// Events: every change of state appends its events through the triggers of
// migration 5, each taking a transaction-level advisory lock before its id
// from the sequence events_id_seq. The lock is held until that transaction
// ends, so event ids commit in their order: a reader of the log never
// passes an id still in flight, whichever replica wrote it. State-changing transactions therefore commit one at a
// time from their first event on; the store's statements change a state
// last, or nearly, in their transaction.
//
// Every fixed statement is prepared once per connection. Behind PgBouncer
// use session pooling, or a version with prepared statement support in
// transaction pooling (1.21+).
package postgres

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"embed"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"syscall"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/sandboxwich/sandboxwich/store"
	"github.com/sandboxwich/sandboxwich/store/internal/sqlstore"
)

//go:embed migrations/*.sql
var embedded embed.FS

// Migrations holds the versioned PostgreSQL migrations (goose format).
var Migrations, _ = fs.Sub(embedded, "migrations")

// Store is the PostgreSQL implementation of store.Store, with the optional
// abilities store.Webhooks, store.IdempotencyStore and store.Clock. Each
// method's contract is the doc comment of the interface that declares it.
type Store struct {
	s *sqlstore.Store
}

var (
	_ store.Store            = (*Store)(nil)
	_ store.Webhooks         = (*Store)(nil)
	_ store.IdempotencyStore = (*Store)(nil)
	_ store.Clock            = (*Store)(nil)
)

// DatabaseTime implements store.Clock: the server's clock_timestamp(),
// the time at the statement's execution (not at the transaction's start).
func (s *Store) DatabaseTime(ctx context.Context) (time.Time, error) {
	var t time.Time
	if err := s.DB().QueryRowContext(ctx, "SELECT clock_timestamp()").Scan(&t); err != nil {
		return time.Time{}, fmt.Errorf("postgres: clock: %w", err)
	}
	return t, nil
}

// Options tunes Open. The zero value is the recommended configuration.
type Options struct {
	// SkipMigrate leaves the schema as it is; Ping then fails until
	// `sandboxwich migrate` has run.
	SkipMigrate bool
	// MaxConns bounds the connection pool (default 16).
	MaxConns int
}

// Open connects to the database at url (a postgres:// URL or lib/pq
// key=value string), migrates it unless told not to, and returns a Store.
func Open(ctx context.Context, url string, opts Options) (*Store, error) {
	db, err := sqlx.Open("postgres", url)
	if err != nil {
		return nil, fmt.Errorf("postgres: open: %w", err)
	}
	n := opts.MaxConns
	if n <= 0 {
		n = 16
	}
	db.SetMaxOpenConns(n)
	db.SetMaxIdleConns(n)
	st, err := New(ctx, db.DB, opts)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	return st, nil
}

// New returns a Store over an open *sql.DB of the lib/pq driver, migrating
// it unless told not to. The Store takes ownership of db.
func New(ctx context.Context, db *sql.DB, opts Options) (*Store, error) {
	if err := db.PingContext(ctx); err != nil {
		return nil, fmt.Errorf("postgres: connect: %w", err)
	}
	if !opts.SkipMigrate {
		if err := Migrate(ctx, db); err != nil {
			return nil, err
		}
	}
	version, err := sqlstore.LatestVersion(goose.DialectPostgres, db, Migrations)
	if err != nil {
		return nil, err
	}
	x := sqlx.NewDb(db, "postgres")
	return &Store{s: sqlstore.New(x, x, sqlstore.Dialect{
		Name:            "postgres",
		Bind:            sqlx.DOLLAR,
		Lock:            `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`,
		RowLock:         "FOR UPDATE",
		WritableCTE:     true,
		Retryable:       retryable,
		UniqueViolation: uniqueViolation,
		Unavailable:     unavailable,
		SchemaVersion:   version,
	})}, nil
}

// Migrate applies the embedded migrations to db under a session advisory
// lock, so replicas starting together migrate once. The lock is keyed by the
// current schema: deployments (and tests) in other schemas of the same
// database do not wait for each other.
func Migrate(ctx context.Context, db *sql.DB) error {
	var schema string
	if err := db.QueryRowContext(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		return fmt.Errorf("postgres: current schema: %w", err)
	}
	sum := sha256.Sum256([]byte("sandboxwich-migrate\x00" + schema))
	locker, err := lock.NewPostgresSessionLocker(
		lock.WithLockID(int64(binary.BigEndian.Uint64(sum[:8]))),
		lock.WithLockTimeout(1, 300))
	if err != nil {
		return err
	}
	return sqlstore.Migrate(ctx, db, goose.DialectPostgres, Migrations, locker)
}

func pqCode(err error) pqerror.Code {
	if e, ok := errors.AsType[*pq.Error](err); ok {
		return e.Code
	}
	return ""
}

func retryable(err error) bool {
	switch pqCode(err) {
	case pqerror.TRSerializationFailure, pqerror.TRDeadlockDetected, pqerror.LockNotAvailable:
		return true
	}
	return false
}

func uniqueViolation(err error) bool { return pqCode(err) == pqerror.UniqueViolation }

// unavailable: the server is unreachable or the connection broke (a
// network error, or the connection's end without an answer), it is
// shutting down or starting (class 57: admin_shutdown, crash_shutdown,
// cannot_connect_now), or it lacks resources (class 53: disk_full,
// too_many_connections, …), or the connection failed (class 08).
func unavailable(err error) bool {
	if c := pqCode(err); c != "" {
		switch c.Class() {
		case pqerror.ClassConnectionException, pqerror.ClassInsufficientResources, pqerror.ClassOperatorIntervention:
			return c != pqerror.QueryCanceled
		}
		return false
	}
	if _, ok := errors.AsType[*net.OpError](err); ok {
		return true
	}
	return errors.Is(err, driver.ErrBadConn) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}
