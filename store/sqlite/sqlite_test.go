package sqlite_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/pressly/goose/v3"

	"github.com/sandboxwich/sandboxwich/internal/sqltest"
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

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return newStore(t) })
}

// TestSQL runs the checks of this repository's SQL schema on fresh
// database files.
func TestSQL(t *testing.T) {
	sqltest.Run(t, sqltest.Backend{
		Driver: "sqlite",
		Fresh:  func(t *testing.T) string { return filepath.Join(t.TempDir(), "sandboxwich.db") },
		Open: func(t *testing.T, path string, migrate bool) store.Store {
			return open(t, path, sqlite.Options{SkipMigrate: !migrate})
		},
		Migrate: sqlite.Migrate, Dialect: goose.DialectSQLite3, Migrations: sqlite.Migrations,
		// Another connection holds the write lock.
		Lock: []string{"BEGIN IMMEDIATE"},
	})
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

// BenchmarkClaimWithoutEvents: see storetest.BenchmarkClaimWithoutEvents.
func BenchmarkClaimWithoutEvents(b *testing.B) {
	s := newStore(b)
	defer s.Close()
	storetest.BenchmarkClaimWithoutEvents(b, s, func(ctx context.Context) error {
		for _, q := range []string{"DROP TRIGGER cells_event_update", "DROP TRIGGER cells_event_insert"} {
			if _, err := s.DB().ExecContext(ctx, q); err != nil {
				return err
			}
		}
		return nil
	})
}

func BenchmarkClaimParallel(b *testing.B) {
	s := newStore(b)
	defer s.Close()
	storetest.BenchmarkClaimParallel(b, s)
}
