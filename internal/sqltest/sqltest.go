// Package sqltest is the suite of this repository's SQL stores
// (store/sqlite, store/postgres): what store/storetest cannot check
// through the interface, because it needs this repository's schema — a
// plain connection to the database, the dialect's migrations, the
// statements that lock it, the tables a secret must never reach.
//
// storetest.Run stays what any backend can pass; a SQL store of this
// repository runs both:
//
//	func TestConformance(t *testing.T) { storetest.Run(t, …) }
//	func TestSQL(t *testing.T)         { sqltest.Run(t, sqltest.Backend{…}) }
package sqltest

import (
	"context"
	"database/sql"
	"io/fs"
	"reflect"
	"regexp"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/pressly/goose/v3"

	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/fence"
	"github.com/sandboxwich/sandboxwich/internal/testenv"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
	"github.com/sandboxwich/sandboxwich/store/storetest"
)

// Backend is one SQL store under test.
type Backend struct {
	// Driver is the database/sql driver of a plain connection ("sqlite",
	// "postgres"); its sqlx bind type rebinds the checks' statements.
	Driver string
	// Fresh returns the data source name of a new, empty database,
	// dropped when the test ends.
	Fresh func(t *testing.T) string
	// Open opens a store over the database dsn names, migrating it unless
	// migrate is false.
	Open func(t *testing.T, dsn string, migrate bool) store.Store
	// Migrate migrates a plain connection's database.
	Migrate func(ctx context.Context, db *sql.DB) error
	// Dialect and Migrations are the store's goose migrations.
	Dialect    goose.Dialect
	Migrations fs.FS
	// Lock holds, from another connection, what the store's writes wait
	// for: statements run in a transaction the check rolls back.
	Lock []string
}

// Run runs every check, in parallel, each on a fresh database of b.
func Run(t *testing.T, b Backend) {
	t.Helper()
	for name, check := range map[string]func(t *testing.T, d database){
		"NoSecretStored": checkNoSecretStored,
		"SchemaGuards":   checkSchemaGuards,
		"LockWait":       func(t *testing.T, d database) { checkLockWait(t, d.store(t), d.db, b.Lock...) },
		"MigrateDown":    func(t *testing.T, d database) { checkMigrateDown(t, d, b.Dialect, b.Migrations) },
		"SkipMigrate":    func(t *testing.T, d database) { checkSkipMigrate(t, d, b.Migrate) },
		"Reopen": func(t *testing.T, d database) {
			storetest.CheckReopen(t, func(t *testing.T, migrate bool) store.Store { return d.open(t, d.dsn, migrate) })
			installationForm(t, d.store(t))
		},
		"TwoStores": func(t *testing.T, d database) { storetest.CheckTwoStores(t, d.store(t), d.store(t)) },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			check(t, b.fresh(t))
		})
	}
}

// database is a fresh database of a Backend: a plain connection to it, and
// how to open stores over it.
type database struct {
	dsn    string
	db     *sql.DB
	rebind func(string) string
	open   func(t *testing.T, dsn string, migrate bool) store.Store
}

func (b Backend) fresh(t *testing.T) database {
	dsn := b.Fresh(t)
	db, err := sql.Open(b.Driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	bind := sqlx.BindType(b.Driver)
	return database{dsn: dsn, db: db, open: b.Open, rebind: func(q string) string { return sqlx.Rebind(bind, q) }}
}

// store opens a migrated store over d, closed when the test ends.
func (d database) store(t *testing.T) store.Store {
	s := d.open(t, d.dsn, true)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// checkSkipMigrate opens d without migrating: Ping fails until migrate
// ran.
func checkSkipMigrate(t *testing.T, d database, migrate func(context.Context, *sql.DB) error) {
	s := d.open(t, d.dsn, false)
	defer s.Close()
	if err := s.Ping(t.Context()); err == nil {
		t.Fatal("Ping on an unmigrated database succeeded")
	}
	if err := migrate(t.Context(), d.db); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if err := s.Ping(t.Context()); err != nil {
		t.Fatalf("Ping after Migrate: %v", err)
	}
}

// installationRE is the form of the installation identity the migrations
// create.
var installationRE = regexp.MustCompile(`^[0-9a-f]{32}$`)

// installationForm returns s's installation, failing the test unless it
// has the form the migrations create.
func installationForm(t *testing.T, s store.Store) string {
	t.Helper()
	id, err := s.Installation(t.Context())
	if err != nil || !installationRE.MatchString(id) {
		t.Fatalf("Installation = %q, %v; want 32 lowercase hex digits", id, err)
	}
	return id
}

// The tenant and worker of an Inventory's cells.
const (
	Tenant = "tenant-a"
	Worker = "0190f0e0-0000-7000-8000-00000000000a"
)

// binding is the binding of an Inventory's claims.
var binding = lease.Binding{OrganizationID: "org-1", WorkspaceID: "workspace-1", ThreadID: "thread-1", RunnerSessionID: "session-1"}

// Inventory is Tenant's ready cells of one signed release, prepared by
// Worker, and the claims for them, driven through a store's interface.
type Inventory struct {
	Keys *attest.Keyring
	// Release is the cells' release (kata, testenv.Release).
	Release lease.Release
	// Now is the time every call passes.
	Now time.Time
}

// NewInventory returns an inventory at testenv.Start.
func NewInventory(tb testing.TB) *Inventory {
	keys := testenv.Keyring(tb)
	return &Inventory{Keys: keys, Release: testenv.Release(keys, lease.KataMicroVM), Now: testenv.Start}
}

func (inv *Inventory) prepareParams(ttl time.Duration) store.PrepareParams {
	id := uuid.Must(uuid.NewV7())
	return store.PrepareParams{CellID: id, TenantID: Tenant, WorkerID: Worker, ProviderCellID: "pc-" + id.String(),
		Release: inv.Release, ExpiresAt: inv.Now.Add(ttl), Now: inv.Now}
}

// Prepare inserts a ready cell through s that expires after ttl.
func (inv *Inventory) Prepare(tb testing.TB, s store.Store, ttl time.Duration) lease.Cell {
	tb.Helper()
	c, err := s.Prepare(tb.Context(), inv.prepareParams(ttl))
	if err != nil {
		tb.Fatalf("Prepare: %v", err)
	}
	return c
}

// Claim returns the parameters of a claim of Tenant for rel, fenced under
// claimID unless it is uuid.Nil, whose Sign digests the real attestation.
func (inv *Inventory) Claim(claimID uuid.UUID, rel lease.Release) store.ClaimParams {
	ls := uint64(120)
	return store.ClaimParams{
		TenantID:     Tenant,
		ClaimID:      claimID,
		Digest:       fence.DigestOf(rel, binding, &ls),
		Release:      rel,
		Binding:      binding,
		LeaseSeconds: ls,
		LeaseID:      uuid.Must(uuid.NewV7()),
		Now:          inv.Now,
		Sign:         func(l lease.Lease) string { return attest.Digest(inv.Keys.LeaseToken(attest.ClaimsOf(l))) },
	}
}

// claim runs a claim of the inventory's release through s.
func (inv *Inventory) claim(t *testing.T, s store.Store, claimID uuid.UUID) store.ClaimResult {
	t.Helper()
	res, err := s.Claim(t.Context(), inv.Claim(claimID, inv.Release))
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	return res
}

// lease runs a claim that must lease a cell.
func (inv *Inventory) lease(t *testing.T, s store.Store, claimID uuid.UUID) lease.Lease {
	t.Helper()
	res := inv.claim(t, s, claimID)
	if res.Lease == nil {
		t.Fatal("Claim leased nothing, want a lease")
	}
	return *res.Lease
}

// cells reads cells through Worker.
func cells(t *testing.T, s store.Store, ids ...uuid.UUID) []lease.Cell {
	t.Helper()
	out := make([]lease.Cell, len(ids))
	for i, id := range ids {
		c, _, err := s.WorkerCell(t.Context(), Worker, id)
		if err != nil {
			t.Fatalf("WorkerCell(%s): %v", id, err)
		}
		out[i] = c
	}
	return out
}

// claimOf checks which claim leased a cell (uuid.Nil: unfenced).
func claimOf(t *testing.T, s store.Store, cell, want uuid.UUID) {
	t.Helper()
	if _, info, err := s.WorkerCell(t.Context(), Worker, cell); err != nil || info == nil || info.ClaimID != want {
		t.Errorf("WorkerCell(%s) claim = %+v, %v; want claim %s", cell, info, err, want)
	}
}

// wantCounts compares CellCounts, a missing state counting as 0.
func wantCounts(t *testing.T, s store.Store, want map[lease.State]int) {
	t.Helper()
	got, err := s.CellCounts(t.Context())
	if err != nil {
		t.Fatalf("CellCounts: %v", err)
	}
	for st, n := range got {
		if n == 0 {
			delete(got, st)
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("CellCounts = %v, want %v", got, want)
	}
}
