package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/pressly/goose/v3"

	"github.com/sandboxwich/sandboxwich/internal/sqltest"
	"github.com/sandboxwich/sandboxwich/internal/testpg"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
	"github.com/sandboxwich/sandboxwich/store/postgres"
	"github.com/sandboxwich/sandboxwich/store/storetest"
)

func open(tb testing.TB, url string, opts postgres.Options) *postgres.Store {
	tb.Helper()
	s, err := postgres.Open(tb.Context(), url, opts)
	if err != nil {
		tb.Fatalf("Open: %v", err)
	}
	return s
}

// newStore opens a store on a fresh schema; the caller closes the store.
func newStore(tb testing.TB) *postgres.Store {
	tb.Helper()
	return open(tb, testpg.Schema(tb), postgres.Options{})
}

func TestConformance(t *testing.T) {
	testpg.BaseURL(t) // skip (or fail under CI) once, not per subtest
	storetest.Run(t, func(t *testing.T) store.Store { return newStore(t) })
}

// schemaAndDB returns the URL of a fresh schema and a plain connection to
// it, closed when the test ends, for what a test checks beside the store.
func schemaAndDB(t *testing.T) (string, *sql.DB) {
	t.Helper()
	url := testpg.Schema(t)
	db, err := sql.Open("postgres", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return url, db
}

// TestSQL runs the checks of this repository's SQL schema on fresh
// schemas.
func TestSQL(t *testing.T) {
	testpg.BaseURL(t)
	sqltest.Run(t, sqltest.Backend{
		Driver: "postgres",
		Fresh:  func(t *testing.T) string { return testpg.Schema(t) },
		Open: func(t *testing.T, url string, migrate bool) store.Store {
			return open(t, url, postgres.Options{SkipMigrate: !migrate})
		},
		Migrate: postgres.Migrate, Dialect: goose.DialectPostgres, Migrations: postgres.Migrations,
		// Another connection holds an exclusive lock on the cells table.
		Lock: []string{"BEGIN", "LOCK TABLE cells IN EXCLUSIVE MODE"},
	})
}

// TestConcurrentMigrate opens several stores on one fresh schema at once,
// as replicas starting together do: every Open succeeds.
func TestConcurrentMigrate(t *testing.T) {
	url := testpg.Schema(t)
	var wg sync.WaitGroup
	stores := make([]*postgres.Store, 4)
	errs := make([]error, 4)
	for i := range stores {
		wg.Go(func() { stores[i], errs[i] = postgres.Open(t.Context(), url, postgres.Options{MaxConns: 2}) })
	}
	wg.Wait()
	for i, s := range stores {
		if errs[i] != nil {
			t.Errorf("Open %d: %v", i, errs[i])
			continue
		}
		if err := s.Ping(t.Context()); err != nil {
			t.Errorf("Ping %d: %v", i, err)
		}
		s.Close()
	}
}

// TestTwoPools runs 32 unfenced claims for 10 cells through two stores
// with separate connection pools on one schema, as two replicas would:
// exactly 10 leases, on 10 distinct cells.
func TestTwoPools(t *testing.T) {
	url := testpg.Schema(t)
	a := open(t, url, postgres.Options{})
	defer a.Close()
	b := open(t, url, postgres.Options{})
	defer b.Close()
	inv := sqltest.NewInventory(t)
	for range 10 {
		inv.Prepare(t, a, time.Hour)
	}

	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	cells := map[uuid.UUID]int{}
	leases, empty := 0, 0
	for i := range 32 {
		s := store.Store(a)
		if i%2 == 1 {
			s = b
		}
		p := inv.Claim(uuid.Nil, inv.Release)
		if i%4 >= 2 {
			p.ClaimID = uuid.Must(uuid.NewV7()) // half of them fenced
		}
		wg.Go(func() {
			<-start
			res, err := s.Claim(t.Context(), p)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				t.Errorf("Claim: %v (cause: %v)", err, errors.Unwrap(err))
			case res.Lease == nil:
				empty++
			default:
				leases++
				cells[res.Lease.CellID]++
			}
		})
	}
	close(start)
	wg.Wait()
	if leases != 10 || len(cells) != 10 || empty != 22 {
		t.Errorf("32 claims on 10 cells through two pools: %d leases on %d cells, %d empty; want 10, 10, 22",
			leases, len(cells), empty)
	}
	for _, s := range []store.Store{a, b} {
		counts, err := s.CellCounts(t.Context())
		if err != nil || counts[lease.Leased] != 10 || counts[lease.Ready] != 0 {
			t.Errorf("CellCounts = %v, %v; want 10 leased", counts, err)
		}
	}
}

// TestClaimWaitsForLockedCell holds the only ready cell locked in another
// transaction, as a claim that will roll back would: a claim must neither
// answer empty nor take it while the lock is held, and must lease it once
// the other transaction rolls back. It runs both claim paths: alone (one
// autocommitted statement) and the transaction (SKIP LOCKED, then a wait).
func TestClaimWaitsForLockedCell(t *testing.T) {
	for _, path := range []string{"alone", "transaction"} {
		t.Run(path, func(t *testing.T) {
			url, db := schemaAndDB(t)
			s := open(t, url, postgres.Options{})
			defer s.Close()
			inv := sqltest.NewInventory(t)
			inv.Prepare(t, s, time.Hour)
			tx, err := db.BeginTx(t.Context(), nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(`SELECT id FROM cells WHERE state = 'ready' FOR UPDATE`); err != nil {
				t.Fatal(err)
			}
			p := inv.Claim(uuid.Must(uuid.NewV7()), inv.Release)
			if path == "transaction" {
				p.ReadyFloors = map[string]int{"another-pool": 1} // a floor to count: never alone
			}
			done := make(chan store.ClaimResult, 1)
			go func() {
				res, err := s.Claim(t.Context(), p)
				if err != nil {
					t.Errorf("Claim: %v", err)
				}
				done <- res
			}()
			select {
			case res := <-done:
				t.Fatalf("claim answered %+v while the only cell was locked", res)
			case <-time.After(300 * time.Millisecond):
			}
			if err := tx.Rollback(); err != nil {
				t.Fatal(err)
			}
			if res := <-done; res.Lease == nil {
				t.Errorf("claim after the rollback: %+v, want the cell leased", res)
			}
		})
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
		for _, q := range []string{"DROP TRIGGER cells_event_update ON cells", "DROP TRIGGER cells_event_insert ON cells"} {
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
