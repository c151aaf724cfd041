package sandboxwich_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/egress"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
)

func mustEgress(t *testing.T, entries ...string) *egress.Policy {
	t.Helper()
	p, err := egress.Parse(entries)
	if err != nil {
		t.Fatal(err)
	}
	return &p
}

// TestEgressClaims (CONTRACT §22): a pool's egress allow-list reaches its
// provider; a claim that narrows egress takes only cells of pools whose
// list covers it, and its lease's evidence carries the narrowed policy
// and its digest; a wider claim is 422 egress_not_allowed and changes
// nothing; a claim asking for none (or naming none) may take any pool's
// cell; a fenced retry with another egress is a conflict.
func TestEgressClaims(t *testing.T) {
	e := newEnv(t)
	prov := fake.New(fake.Config{Mode: driver.Apply, Kind: "fake", Egress: true})
	open := mustEgress(t, "PKGS.test.", "*.files.test:8443")
	e = newEnv(t, sandboxwich.WithPools(
		pool.Config{Name: "closed", TenantID: "acme", Release: e.rel, Target: 1, Provider: prov},
		pool.Config{Name: "open", TenantID: "acme", Release: e.rel, Target: 1, Provider: prov, Egress: *open},
	))
	e.plane.Pools().Pass(e.ctx)
	claim := func(claimID uuid.UUID, narrow *egress.Policy) (sandboxwich.ClaimResult, error) {
		return e.plane.Claim(e.ctx, "acme", sandboxwich.ClaimRequest{ClaimID: claimID, Release: e.rel, Binding: binding, Egress: narrow})
	}
	before, _ := e.plane.CellCounts(e.ctx)
	for _, wide := range [][]string{{"evil.test"}, {"pkgs.test:8080"}, {"*.other.test"}, {"pkgs.test", "evil.test"}} {
		if _, err := claim(uuid.New(), mustEgress(t, wide...)); !errors.Is(err, errcode.ErrEgressNotAllowed) {
			t.Errorf("a claim of egress %q: %v, want egress_not_allowed", wide, err)
		}
	}
	if after, _ := e.plane.CellCounts(e.ctx); len(after) != len(before) || after["ready"] != before["ready"] {
		t.Errorf("refused claims changed the cells: %v, then %v", before, after)
	}

	id := uuid.New()
	narrow := mustEgress(t, "a.files.test:8443")
	res, err := claim(id, narrow)
	if err != nil || res.Lease == nil || res.PoolName != "open" {
		t.Fatalf("a claim narrowing the open pool's egress: %+v %v, want a lease of pool open", res, err)
	}
	if got := prov.Egress(res.Lease.CellID).Canonical(); got != narrow.Canonical() {
		t.Errorf("the provider holds the cell to egress %q, want the claim's %q (provisioned with the pool's, then narrowed)", got, narrow.Canonical())
	}
	ev, err := e.plane.Evidence(e.ctx, "acme", res.Lease.ID)
	if err != nil || ev.Egress != "a.files.test:8443" || ev.EgressDigest != narrow.Digest() {
		t.Errorf("evidence: egress %q digest %q (%v), want the claim's %q %q", ev.Egress, ev.EgressDigest, err, narrow.Canonical(), narrow.Digest())
	}
	if _, err := claim(id, mustEgress(t, "pkgs.test")); !errors.Is(err, errcode.ErrConflict) {
		t.Errorf("a retry of the claim with another egress: %v, want a conflict", err)
	}
	if again, err := claim(id, narrow); err != nil || !again.Replayed || again.Lease.ID != res.Lease.ID {
		t.Errorf("an exact retry: %+v %v, want the same lease replayed", again, err)
	}
	// Only the open pool covers pkgs.test, and its one cell is leased.
	if res, err := claim(uuid.New(), mustEgress(t, "pkgs.test:443")); err != nil || res.Lease != nil {
		t.Errorf("a claim of pkgs.test with the open pool's cell leased: %+v %v, want empty (never the closed pool's)", res, err)
	}
	// No egress at all: any pool's cell, its lease with none.
	res, err = claim(uuid.New(), &egress.None)
	if err != nil || res.Lease == nil || res.PoolName != "closed" {
		t.Fatalf("a claim of no egress: %+v %v, want the closed pool's cell", res, err)
	}
	if ev, err := e.plane.Evidence(e.ctx, "acme", res.Lease.ID); err != nil || ev.Egress != "none" || ev.EgressDigest != egress.None.Digest() {
		t.Errorf("evidence of a lease without egress: %+v %v", ev, err)
	}
	// A claim that names no egress keeps its pool's policy.
	e = newEnv(t, sandboxwich.WithPools(
		pool.Config{Name: "closed", TenantID: "acme", Release: e.rel, Target: 1, Provider: prov},
		pool.Config{Name: "open", TenantID: "acme", Release: e.rel, Target: 1, Provider: prov, Egress: *open},
	))
	e.plane.Pools().Pass(e.ctx)
	for range 2 {
		res, err := claim(uuid.New(), nil)
		if err != nil || res.Lease == nil {
			t.Fatalf("a claim naming no egress: %+v %v", res, err)
		}
		ev, _ := e.plane.Evidence(e.ctx, "acme", res.Lease.ID)
		if want := map[string]string{"open": open.Canonical(), "closed": "none"}[res.PoolName]; ev.Egress != want {
			t.Errorf("a claim naming no egress from pool %s: egress %q, want the pool's %q", res.PoolName, ev.Egress, want)
		}
	}
}

// TestEgressNeedsAnEnforcingProvider: a pool with an allow-list on a
// provider that enforces none is refused at start-up, naming the key.
func TestEgressNeedsAnEnforcingProvider(t *testing.T) {
	e := newEnv(t)
	_, err := sandboxwich.New(e.st, e.keys, sandboxwich.WithPools(pool.Config{Name: "p", TenantID: "acme", Release: e.rel, Target: 1,
		Provider: fake.New(fake.Config{Mode: driver.Apply, Kind: "fake"}), Egress: *mustEgress(t, "pkgs.test")}))
	if err == nil || !strings.Contains(err.Error(), "egress") {
		t.Fatalf("a pool with an allow-list on a provider enforcing none: %v, want a start-up error naming egress", err)
	}
}

// TestEgressUnsetQuarantines: a claim whose cell could not be held to the
// claim's egress fails, and its cell is quarantined (never leased on with
// the pool's wider policy); a retry of the claim is a conflict.
func TestEgressUnsetQuarantines(t *testing.T) {
	e := newEnv(t)
	prov := fake.New(fake.Config{Mode: driver.Apply, Kind: "fake", Egress: true, Faults: fake.Faults{SetEgress: true}})
	e = newEnv(t, sandboxwich.WithPools(pool.Config{Name: "open", TenantID: "acme", Release: e.rel, Target: 1, Provider: prov,
		Egress: *mustEgress(t, "pkgs.test")}))
	e.plane.Pools().Pass(e.ctx)
	id := uuid.New()
	req := sandboxwich.ClaimRequest{ClaimID: id, Release: e.rel, Binding: binding, Egress: mustEgress(t, "pkgs.test:443")}
	if res, err := e.plane.Claim(e.ctx, "acme", req); err == nil {
		t.Fatalf("a claim whose egress could not be set: %+v, want an error", res)
	}
	if counts, _ := e.plane.CellCounts(e.ctx); counts[lease.Quarantined] != 1 || counts[lease.Leased] != 0 {
		t.Errorf("cells after the failed narrowing: %v, want the one cell quarantined", counts)
	}
	if _, err := e.plane.Claim(e.ctx, "acme", req); !errors.Is(err, errcode.ErrConflict) {
		t.Errorf("a retry of the claim: %v, want a conflict", err)
	}
}
