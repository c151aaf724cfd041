package pool_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/internal/testenv"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
)

// TestDefaultReadyTTLServesMaxLease: a pool that sets no ready TTL serves
// a claim for the longest lease.
func TestDefaultReadyTTLServesMaxLease(t *testing.T) {
	f := newFixture(t, pool.Config{Target: 1})
	f.settle()
	max := uint64(sandboxwich.MaxLeaseSeconds)
	res, err := f.plane.Claim(f.ctx, "acme", sandboxwich.ClaimRequest{ClaimID: uuid.Must(uuid.NewV7()),
		Release: f.rel, Binding: binding, LeaseSeconds: &max})
	if err != nil {
		t.Fatal(err)
	}
	if res.Lease == nil {
		t.Fatalf("a claim for the maximum lease (%d s) found no cell in a default pool", max)
	}
	if got := res.Lease.ExpiresAt.Sub(f.clock.Now()); got != time.Duration(max)*time.Second {
		t.Fatalf("lease of %v, want %d s", got, max)
	}
}

// TestShortReadyTTLWarnsAtStartup: a pool whose explicit TTL cannot serve
// the maximum lease is accepted, with a warning naming it; a default pool
// is not warned about.
func TestShortReadyTTLWarnsAtStartup(t *testing.T) {
	st, keys := testenv.SQLite(t), testenv.Keyring(t)
	rel := testenv.Release(keys, lease.GVisorLowerRisk)
	var logs bytes.Buffer
	short := pool.Config{Name: "short", TenantID: "acme", Release: rel, Target: 1, ReadyTTL: time.Minute,
		Provider: fake.New(fake.Config{})}
	long := short
	long.Name, long.ReadyTTL = "default", 0
	_, err := sandboxwich.New(st, keys, sandboxwich.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))),
		sandboxwich.WithPools(short, long))
	if err != nil {
		t.Fatalf("an explicit positive TTL must be accepted: %v", err)
	}
	out := logs.String()
	if !strings.Contains(out, "level=WARN") || !strings.Contains(out, "cannot serve the maximum lease") ||
		!strings.Contains(out, "pool=short ready_ttl=1m0s max_lease=5m0s") {
		t.Fatalf("no start-up warning for a 60 s TTL under a 300 s maximum lease; logs:\n%s", out)
	}
	if strings.Contains(out, "pool=default") {
		t.Fatalf("the default TTL was warned about:\n%s", out)
	}
}

// TestDrainEndsLeasedCells: Drain ends every member, the leased one
// included, with proof; the lease is destroyed and no longer validates.
func TestDrainEndsLeasedCells(t *testing.T) {
	f := newFixture(t, pool.Config{Target: 2})
	f.settle()
	res := f.claim()
	if res.Lease == nil {
		t.Fatal("no cell")
	}
	if err := f.pools.Drain(f.ctx); err != nil {
		t.Fatal(err)
	}
	st, err := f.plane.LeaseStatus(f.ctx, "acme", res.Lease.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != lease.Destroyed || st.Disposition != lease.Destroyed || !st.ProviderAbsent {
		t.Fatalf("leased cell after drain: %+v", st)
	}
	if _, err := f.plane.Validate(f.ctx, "acme", res.Lease.ID, proof(res)); !errors.Is(err, errcode.ErrConflict) {
		t.Fatalf("validate after drain: %v", err)
	}
	if f.prov.Len() != 0 {
		t.Fatalf("provider still holds %d objects", f.prov.Len())
	}
	f.wantCounts(map[lease.MemberState]int{lease.MemberDestroyed: 1, lease.MemberQuarantined: 1})
	f.settle() // the target stays 0: nothing is created again
	if f.prov.Len() != 0 {
		t.Fatalf("the pool refilled after drain: %d objects", f.prov.Len())
	}
}

// TestDrainCutShortIsResumed: a drain whose provider never answers records
// every stop first; when its context ends, the next pass finishes them.
func TestDrainCutShortIsResumed(t *testing.T) {
	prov := fake.New(fake.Config{Mode: "apply"})
	f := newFixture(t, pool.Config{Target: 1, Provider: prov})
	f.settle()
	res := f.claim()
	prov.SetFaults(fake.Faults{DestroyTimeout: 1})
	ctx, cancel := context.WithTimeout(f.ctx, 200*time.Millisecond)
	defer cancel()
	if err := f.pools.Drain(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("drain with a hung provider: %v", err)
	}
	f.wantCounts(map[lease.MemberState]int{lease.MemberStopping: 1})
	prov.SetFaults(fake.Faults{})
	f.settle()
	st, err := f.plane.LeaseStatus(f.ctx, "acme", res.Lease.ID)
	if err != nil || st.State != lease.Destroyed || !st.ProviderAbsent || prov.Len() != 0 {
		t.Fatalf("after the resumed stop: %+v %v, %d objects", st, err, prov.Len())
	}
}
