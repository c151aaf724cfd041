package sqlite_test

import (
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/pressly/goose/v3"

	"github.com/sandboxwich/sandboxwich/store"
	"github.com/sandboxwich/sandboxwich/store/sqlite"
	"github.com/sandboxwich/sandboxwich/store/storetest"
)

func open(tb testing.TB, path string, opts sqlite.Options) *sqlite.Store {
	tb.Helper()
	s, err := sqlite.Open(tb.Context(), path, opts)
	if err != nil {
		tb.Fatalf("Open(%s): %v", path, err)
	}
	return s
}

// newStore opens a fresh database file; the caller closes the store.
func newStore(tb testing.TB) *sqlite.Store {
	tb.Helper()
	return open(tb, filepath.Join(tb.TempDir(), "sandboxwich.db"), sqlite.Options{})
}

// fileAndDB returns the path of a fresh database file and a plain
// connection to it, closed when the test ends, for what a test checks
// beside the store.
func fileAndDB(t *testing.T) (string, *sql.DB) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sandboxwich.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return path, db
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return newStore(t) })
}

// TestNoSecretStored claims a cell with a real lease attestation and checks
// that neither the token, its MAC nor the signing key is in the database.
func TestNoSecretStored(t *testing.T) {
	path, db := fileAndDB(t)
	s := open(t, path, sqlite.Options{})
	defer s.Close()
	storetest.CheckNoSecretStored(t, s, db)
}

// TestMigrateIdempotent opens the same file again, with and without
// migrating.
func TestMigrateIdempotent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sandboxwich.db")
	storetest.CheckReopen(t, func(t *testing.T, migrate bool) store.Store {
		return open(t, path, sqlite.Options{SkipMigrate: !migrate})
	})
}

// TestSkipMigrate opens an empty file without migrating: Ping fails until
// the migrations ran.
func TestSkipMigrate(t *testing.T) {
	path, db := fileAndDB(t)
	s := open(t, path, sqlite.Options{SkipMigrate: true})
	defer s.Close()
	if err := s.Ping(t.Context()); err == nil {
		t.Fatal("Ping on an unmigrated file succeeded")
	}
	if err := sqlite.Migrate(t.Context(), db); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if err := s.Ping(t.Context()); err != nil {
		t.Fatalf("Ping after Migrate: %v", err)
	}
}

// TestTwoStores claims through two stores on one file, as two processes
// would: each trusts the candidates its last pick read only as far as its
// compare-and-set holds.
func TestTwoStores(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sandboxwich.db")
	a, b := open(t, path, sqlite.Options{}), open(t, path, sqlite.Options{})
	defer a.Close()
	defer b.Close()
	storetest.CheckTwoStores(t, a, b)
}

// TestLockWait has another connection hold the write lock: a write whose
// context ends while it waits gives up then, not after busy_timeout, and
// the store works once the lock is gone.
func TestLockWait(t *testing.T) {
	path, db := fileAndDB(t)
	s := open(t, path, sqlite.Options{})
	defer s.Close()
	storetest.CheckLockWait(t, s, db, "BEGIN IMMEDIATE")
}

// TestSchemaGuards tries the writes the schema itself must refuse.
func TestSchemaGuards(t *testing.T) {
	path, db := fileAndDB(t)
	s := open(t, path, sqlite.Options{})
	defer s.Close()
	storetest.CheckSchemaGuards(t, s, db, func(q string) string { return q })
}

// TestMigrateDown migrates a database with leases and fences down to
// version 1 and back up.
func TestMigrateDown(t *testing.T) {
	path, db := fileAndDB(t)
	storetest.CheckMigrateDown(t, func(t *testing.T) store.Store { return open(t, path, sqlite.Options{}) },
		db, goose.DialectSQLite3, sqlite.Migrations)
}

func TestOpenEmptyPath(t *testing.T) {
	if s, err := sqlite.Open(t.Context(), "", sqlite.Options{}); err == nil {
		s.Close()
		t.Fatal("Open with an empty path succeeded")
	}
}

func BenchmarkClaim(b *testing.B) {
	s := newStore(b)
	defer s.Close()
	storetest.BenchmarkClaim(b, s)
}

func BenchmarkClaimParallel(b *testing.B) {
	s := newStore(b)
	defer s.Close()
	storetest.BenchmarkClaimParallel(b, s)
}
