package sandboxwich_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
)

// TestRenewLifetimeCap: renewals move a pool lease's expiry to now +
// lease_seconds, never past the claim time + the pool's MaxCell (clamped,
// not refused); the tenant-scoped RenewLease renews without the
// attestation; the agent, told each time, serves commands past the first
// expiry; each renewal that moved the expiry is one lease.renewed.
func TestRenewLifetimeCap(t *testing.T) {
	var e *env
	prov := fake.NewWithAgent(fake.Config{Mode: driver.Apply, Kind: "fake", Now: func() time.Time { return e.now }})
	e = newEnv(t)
	rel := e.rel
	e = newEnv(t, sandboxwich.WithPools(pool.Config{Name: "p1", TenantID: "acme", Release: rel, Target: 1,
		Provider: prov, MaxCell: 10 * time.Minute}))
	e.plane.Pools().Pass(e.ctx)
	t0 := e.now
	res, err := e.plane.Claim(e.ctx, "acme", sandboxwich.ClaimRequest{ClaimID: uuid.New(), Release: rel, Binding: agentBinding})
	if err != nil || res.Lease == nil {
		t.Fatalf("claim: %+v %v", res, err)
	}
	id, proof := res.Lease.ID, res.Proof()
	mark, _ := e.plane.LastEventID(e.ctx)
	want := func(l lease.Lease, err error, expires time.Time, what string) {
		t.Helper()
		if err != nil || !l.ExpiresAt.Equal(expires) {
			t.Fatalf("%s: expiry %v (%v), want %v", what, l.ExpiresAt, err, expires)
		}
	}

	e.now = t0.Add(time.Minute)
	l, err := e.plane.RenewLease(e.ctx, "acme", id, 300)
	want(l, err, t0.Add(6*time.Minute), "RenewLease (tenant-scoped)")
	e.now = t0.Add(5 * time.Minute)
	l, err = e.plane.Renew(e.ctx, "acme", id, proof, 300)
	want(l, err, t0.Add(10*time.Minute), "Renew up to the cap")
	e.now = t0.Add(8 * time.Minute)
	l, err = e.plane.Renew(e.ctx, "acme", id, proof, 300)
	want(l, err, t0.Add(10*time.Minute), "Renew past the cap (clamped)")

	e.now = t0.Add(9 * time.Minute) // past every expiry but the last
	out, err := e.plane.Exec(e.ctx, "acme", id, proof, sandboxwich.ExecRequest{Argv: []string{"echo", "late"}})
	if err != nil || out.Reason != sandboxwich.ReasonExited {
		t.Fatalf("exec after the first expiries: %+v %v", out, err)
	}
	if v, err := e.plane.Validate(e.ctx, "acme", id, proof); err != nil || v.AttestationDigest != res.Lease.AttestationDigest {
		t.Fatalf("the claim's attestation after renewals: %+v %v", v, err)
	}
	evs, err := e.plane.Events(e.ctx, sandboxwich.EventQuery{After: mark, Limit: 100, TypePrefix: "lease.renewed"})
	if err != nil || len(evs) != 2 {
		t.Fatalf("lease.renewed events: %d (%v), want 2 (the clamped renewal moved nothing)", len(evs), err)
	}
	e.now = t0.Add(10 * time.Minute)
	if _, err := e.plane.RenewLease(e.ctx, "acme", id, 300); !errors.Is(err, errcode.ErrConflict) {
		t.Fatalf("a tenant-scoped renewal at the cap's expiry: %v, want a conflict (the lease has ended)", err)
	}
	if _, err := e.plane.Renew(e.ctx, "acme", id, proof, 300); err == nil {
		t.Fatal("a renewal at the cap's expiry succeeded; the lease has ended")
	}
}

// TestMaxCellAtLeastMaxLease: a pool whose max_cell_seconds is below the
// maximum lease stops start-up, naming the key.
func TestMaxCellAtLeastMaxLease(t *testing.T) {
	e := newEnv(t)
	_, err := sandboxwich.New(e.st, e.keys, sandboxwich.WithPools(pool.Config{Name: "p1", TenantID: "acme", Release: e.rel,
		Target: 1, Provider: fake.New(fake.Config{Mode: driver.Apply, Kind: "fake"}), MaxCell: time.Minute}))
	if err == nil || !strings.Contains(err.Error(), "max_cell_seconds") {
		t.Fatalf("New with max_cell_seconds below the maximum lease: %v", err)
	}
}

// TestCommandAcrossExpiryAfterTheSweep: a command the lease's expiry cut
// short says the lease expired even when the pool had already recorded
// the expired lease's stop before the command's answer came back (the
// order a loaded machine produces; CI once saw "released or revoked").
func TestCommandAcrossExpiryAfterTheSweep(t *testing.T) {
	var e *env
	prov := fake.NewWithAgent(fake.Config{Mode: driver.Apply, Kind: "fake", Now: func() time.Time { return e.now }})
	e = newEnv(t)
	e = newEnv(t, sandboxwich.WithPools(pool.Config{Name: "p1", TenantID: "acme", Release: e.rel, Target: 1, Provider: prov}))
	e.plane.Pools().Pass(e.ctx)
	res, err := e.plane.Claim(e.ctx, "acme", sandboxwich.ClaimRequest{ClaimID: uuid.New(), Release: e.rel, Binding: agentBinding})
	if err != nil || res.Lease == nil {
		t.Fatalf("claim: %+v %v", res, err)
	}
	id, proof, expires := res.Lease.ID, res.Proof(), res.Lease.ExpiresAt
	// While the command writes, the lease expires and the pool's pass
	// records its stop; the command's answer comes after both.
	out, err := e.plane.ExecStream(e.ctx, "acme", id, proof, sandboxwich.ExecRequest{Argv: []string{"echo", "started"}},
		func(sandboxwich.Output) error {
			e.now = expires.Add(time.Second)
			e.plane.Pools().Pass(e.ctx)
			return nil
		})
	if err != nil || out.Reason != sandboxwich.ReasonKilled || !strings.Contains(out.Message, "lease expired at") {
		t.Fatalf("a command across the expiry: %+v %v, want reason killed saying the lease expired", out, err)
	}
	if st, err := e.plane.LeaseStatus(e.ctx, "acme", id); err != nil || st.State == lease.Leased {
		t.Fatalf("the lease after the pass: %+v %v, want it ended", st, err)
	}
}
