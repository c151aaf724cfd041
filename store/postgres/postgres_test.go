package postgres_test

import (
	"database/sql"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/pressly/goose/v3"

	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/fence"
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

// TestNoSecretStored claims a cell with a real lease attestation and checks
// that neither the token, its MAC nor the signing key is in the schema.
func TestNoSecretStored(t *testing.T) {
	url, db := schemaAndDB(t)
	s := open(t, url, postgres.Options{})
	defer s.Close()
	storetest.CheckNoSecretStored(t, s, db)
}

// TestSchemaGuards tries the writes the schema itself must refuse.
func TestSchemaGuards(t *testing.T) {
	url, db := schemaAndDB(t)
	s := open(t, url, postgres.Options{})
	defer s.Close()
	storetest.CheckSchemaGuards(t, s, db, func(q string) string { return sqlx.Rebind(sqlx.DOLLAR, q) })
}

// TestLockWait has another connection hold an exclusive lock on the cells
// table: a write whose context ends while it waits gives up then, and the
// store works once the lock is gone.
func TestLockWait(t *testing.T) {
	url, db := schemaAndDB(t)
	s := open(t, url, postgres.Options{})
	defer s.Close()
	storetest.CheckLockWait(t, s, db, "BEGIN", "LOCK TABLE cells IN EXCLUSIVE MODE")
}

// TestMigrateDown migrates a schema with leases and fences down to version
// 1 and back up.
func TestMigrateDown(t *testing.T) {
	url, db := schemaAndDB(t)
	storetest.CheckMigrateDown(t, func(t *testing.T) store.Store { return open(t, url, postgres.Options{}) },
		db, goose.DialectPostgres, postgres.Migrations)
}

const testKey = "sandboxwich-test-sterile-cell-signing-key-32-bytes-minimum"

// fixture is one tenant's inventory of the kata release of CONTRACT.md 3.6.
type fixture struct {
	kr  *attest.Keyring
	rel lease.Release
	now time.Time
}

func newFixture(tb testing.TB) fixture {
	kr, err := attest.NewKeyring([]byte(testKey))
	if err != nil {
		tb.Fatal(err)
	}
	policy := strings.Repeat("a", 64)
	return fixture{
		kr: kr,
		rel: lease.Release{ReleaseSetID: "release-set-2026-08-07", RuntimeClass: lease.KataMicroVM, PolicyDigest: policy,
			Signature: kr.SignRelease("release-set-2026-08-07", string(lease.KataMicroVM), policy)},
		now: time.Date(2026, 8, 7, 12, 0, 0, 0, time.UTC),
	}
}

func (f fixture) prepare(tb testing.TB, s store.Store, n int) {
	tb.Helper()
	for range n {
		id := uuid.Must(uuid.NewV7())
		if _, err := s.Prepare(tb.Context(), store.PrepareParams{CellID: id, TenantID: "tenant-a",
			WorkerID: "0190f0e0-0000-7000-8000-00000000000a", ProviderCellID: "pc-" + id.String(), Release: f.rel,
			ExpiresAt: f.now.Add(time.Hour), Now: f.now}); err != nil {
			tb.Fatalf("Prepare: %v", err)
		}
	}
}

// claim returns the parameters of an unfenced claim.
func (f fixture) claim() store.ClaimParams {
	b := lease.Binding{OrganizationID: "org-1", WorkspaceID: "workspace-1", ThreadID: "thread-1", RunnerSessionID: "session-1"}
	ls := uint64(120)
	return store.ClaimParams{
		TenantID:     "tenant-a",
		Digest:       fence.DigestOf(f.rel, b, &ls),
		Release:      f.rel,
		Binding:      b,
		LeaseSeconds: ls,
		LeaseID:      uuid.Must(uuid.NewV7()),
		Now:          f.now,
		Sign: func(l lease.Lease) string {
			return attest.Digest(f.kr.LeaseToken(attest.ClaimsOf(l)))
		},
	}
}

// TestMigrateIdempotent opens the same schema again, with and without
// migrating.
func TestMigrateIdempotent(t *testing.T) {
	url := testpg.Schema(t)
	storetest.CheckReopen(t, func(t *testing.T, migrate bool) store.Store {
		return open(t, url, postgres.Options{SkipMigrate: !migrate})
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

// TestSkipMigrate opens a fresh schema without migrating: Ping fails until
// the migrations ran.
func TestSkipMigrate(t *testing.T) {
	url, db := schemaAndDB(t)
	s := open(t, url, postgres.Options{SkipMigrate: true})
	defer s.Close()
	if err := s.Ping(t.Context()); err == nil {
		t.Fatal("Ping on an unmigrated schema succeeded")
	}
	if err := postgres.Migrate(t.Context(), db); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if err := s.Ping(t.Context()); err != nil {
		t.Fatalf("Ping after Migrate: %v", err)
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
	f := newFixture(t)
	f.prepare(t, a, 10)

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
		p := f.claim()
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
				t.Errorf("Claim: %v", err)
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

// TestTwoStoresAlone claims through two stores on one schema, as two
// replicas would; with one claim in flight each, most run alone (one
// autocommitted statement) from a candidate the other may have leased.
func TestTwoStoresAlone(t *testing.T) {
	url := testpg.Schema(t)
	a, b := open(t, url, postgres.Options{}), open(t, url, postgres.Options{})
	defer a.Close()
	defer b.Close()
	storetest.CheckTwoStores(t, a, b)
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
			f := newFixture(t)
			f.prepare(t, s, 1)
			tx, err := db.BeginTx(t.Context(), nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(`SELECT id FROM cells WHERE state = 'ready' FOR UPDATE`); err != nil {
				t.Fatal(err)
			}
			p := f.claim()
			p.ClaimID = uuid.Must(uuid.NewV7())
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

func BenchmarkClaimParallel(b *testing.B) {
	s := newStore(b)
	defer s.Close()
	storetest.BenchmarkClaimParallel(b, s)
}
