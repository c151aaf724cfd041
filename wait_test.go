package sandboxwich_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/pool"
)

// waitEnv is a plane with one empty pool of the fake provider: a cell
// comes only when the test raises the pool's target and runs a pass.
func waitEnv(t *testing.T) *env {
	t.Helper()
	rel := newEnv(t).rel
	return newEnv(t, sandboxwich.WithPools(pool.Config{Name: "p1", TenantID: "acme", Release: rel, Target: 0, MaxProvisioning: 8,
		Provider: fake.New(fake.Config{Mode: driver.Apply})}))
}

// addCells raises the pool's target to n and runs a pass, which admits
// the new cells (and wakes the waiting claims).
func (e *env) addCells(t *testing.T, n int) {
	t.Helper()
	if err := e.plane.Pools().SetTarget("p1", n); err != nil {
		t.Fatal(err)
	}
	e.plane.Pools().Pass(e.ctx)
}

// waitFor fails the test unless cond holds within a hang guard.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 30 s", what)
		}
	}
}

type claimOutcome struct {
	res sandboxwich.ClaimResult
	err error
}

// claimAsync starts a claim; its outcome arrives on the channel.
func (e *env) claimAsync(ctx context.Context, req sandboxwich.ClaimRequest) <-chan claimOutcome {
	ch := make(chan claimOutcome, 1)
	go func() {
		res, err := e.plane.Claim(ctx, "acme", req)
		ch <- claimOutcome{res, err}
	}()
	return ch
}

// TestClaimWaitsForACell: with no claimable cell, a claim with
// wait_seconds waits (counted by WaitingClaims) and is answered with the
// cell the pool admits meanwhile; without wait_seconds it answers empty at
// once, as Part I.
func TestClaimWaitsForACell(t *testing.T) {
	e := waitEnv(t)
	res, err := e.plane.Claim(e.ctx, "acme", sandboxwich.ClaimRequest{ClaimID: uuid.New(), Release: e.rel, Binding: binding})
	if err != nil || res.Lease != nil || res.EmptyReason != sandboxwich.EmptyNoInventory {
		t.Fatalf("a claim without wait_seconds: %v %v, want empty (no_inventory) at once", res, err)
	}
	got := e.claimAsync(e.ctx, sandboxwich.ClaimRequest{ClaimID: uuid.New(), Release: e.rel, Binding: binding, WaitSeconds: 60})
	waitFor(t, "the claim waits", func() bool { return e.plane.WaitingClaims() == 1 })
	e.addCells(t, 1)
	out := <-got
	if out.err != nil || out.res.Lease == nil || out.res.Replayed || out.res.PoolName != "p1" {
		t.Fatalf("the waiting claim: %v %v, want the pool's new cell", out.res, out.err)
	}
	if n := e.plane.WaitingClaims(); n != 0 {
		t.Errorf("%d claims still waiting after the answer", n)
	}
}

// TestClaimWaitElapsed: a fenced claim that waited in vain answers empty
// with wait_elapsed; the outcome is durable: its retry replays it, even
// once a cell is claimable.
func TestClaimWaitElapsed(t *testing.T) {
	e := waitEnv(t)
	req := sandboxwich.ClaimRequest{ClaimID: uuid.New(), Release: e.rel, Binding: binding, WaitSeconds: 1}
	start := time.Now()
	res, err := e.plane.Claim(e.ctx, "acme", req)
	if took := time.Since(start); took < time.Second {
		t.Errorf("the claim answered after %v, before its 1 s wait", took)
	}
	if err != nil || res.Lease != nil || res.EmptyReason != sandboxwich.EmptyWaitElapsed || res.Replayed {
		t.Fatalf("a wait in vain: %v %v, want empty (wait_elapsed)", res, err)
	}
	e.addCells(t, 1)
	res, err = e.plane.Claim(e.ctx, "acme", req)
	if err != nil || res.Lease != nil || !res.Replayed || res.EmptyReason != sandboxwich.EmptyWaitElapsed {
		t.Fatalf("the retry: %v %v, want the recorded empty outcome (wait_elapsed) replayed", res, err)
	}
	// The cell the wait missed is inventory for the next claim.
	res, err = e.plane.Claim(e.ctx, "acme", sandboxwich.ClaimRequest{ClaimID: uuid.New(), Release: e.rel, Binding: binding})
	if err != nil || res.Lease == nil {
		t.Fatalf("a new claim after the wait: %v %v, want the cell", res, err)
	}
}

// TestClaimWaitFirstComeFirstServed: claims that wait for the same
// inventory are served in the order they began to wait, one cell at a
// time.
func TestClaimWaitFirstComeFirstServed(t *testing.T) {
	e := waitEnv(t)
	const n = 4
	outs := make([]<-chan claimOutcome, n)
	for i := range outs {
		outs[i] = e.claimAsync(e.ctx, sandboxwich.ClaimRequest{ClaimID: uuid.New(), Release: e.rel, Binding: binding, WaitSeconds: 60})
		waitFor(t, "claim queued", func() bool { return e.plane.WaitingClaims() == i+1 })
	}
	cells := map[uuid.UUID]bool{}
	for i := range outs {
		e.addCells(t, i+1)
		out := <-outs[i]
		if out.err != nil || out.res.Lease == nil {
			t.Fatalf("claim %d (queue position %d): %v %v, want the %d. cell", i, i, out.res, out.err, i+1)
		}
		if cells[out.res.Lease.CellID] {
			t.Fatalf("claim %d got cell %s, already leased", i, out.res.Lease.CellID)
		}
		cells[out.res.Lease.CellID] = true
		waitFor(t, "the served claim leaves the queue", func() bool { return e.plane.WaitingClaims() == n-1-i })
		for j := i + 1; j < n; j++ {
			select {
			case out := <-outs[j]:
				t.Fatalf("claim %d (queue position %d) answered before claim %d: %v %v", j, j, i+1, out.res, out.err)
			default:
			}
		}
	}
}

// TestClaimWaitRetryJoins: a retry of a fenced claim during its wait joins
// it: one lease, answered to both (the retry as a replay); a caller that
// gives up does not end the wait, whose lease a later retry replays; the
// same claim_id with another request is a conflict; wait_seconds above
// 300 is invalid and records nothing.
func TestClaimWaitRetryJoins(t *testing.T) {
	e := waitEnv(t)
	req := sandboxwich.ClaimRequest{ClaimID: uuid.New(), Release: e.rel, Binding: binding, WaitSeconds: 60}
	gone, cancel := context.WithCancel(e.ctx)
	first := e.claimAsync(gone, req)
	waitFor(t, "the claim waits", func() bool { return e.plane.WaitingClaims() == 1 })
	cancel()
	if out := <-first; !errors.Is(out.err, context.Canceled) {
		t.Fatalf("the abandoned call: %v %v, want its context's error", out.res, out.err)
	}
	retry := e.claimAsync(e.ctx, req)
	other := req
	other.WaitSeconds = 30
	if _, err := e.plane.Claim(e.ctx, "acme", other); !errors.Is(err, errcode.ErrConflict) {
		t.Fatalf("the claim_id with another request during the wait: %v, want a conflict", err)
	}
	if n := e.plane.WaitingClaims(); n != 1 {
		t.Fatalf("%d claims waiting, want the one the retries joined", n)
	}
	e.addCells(t, 2)
	out := <-retry
	if out.err != nil || out.res.Lease == nil || !out.res.Replayed {
		t.Fatalf("the retry: %v %v, want the wait's lease, replayed", out.res, out.err)
	}
	again, err := e.plane.Claim(e.ctx, "acme", req)
	if err != nil || again.Lease == nil || again.Lease.ID != out.res.Lease.ID || again.Attestation() != out.res.Attestation() {
		t.Fatalf("a later retry: %v %v, want the same lease and attestation", again, err)
	}
	// One lease: the second cell is still claimable.
	res, err := e.plane.Claim(e.ctx, "acme", sandboxwich.ClaimRequest{ClaimID: uuid.New(), Release: e.rel, Binding: binding})
	if err != nil || res.Lease == nil || res.Lease.CellID == out.res.Lease.CellID {
		t.Fatalf("a new claim: %v %v, want the other cell", res, err)
	}

	bad := sandboxwich.ClaimRequest{ClaimID: uuid.New(), Release: e.rel, Binding: binding, WaitSeconds: sandboxwich.MaxWaitSeconds + 1}
	if _, err := e.plane.Claim(e.ctx, "acme", bad); !errors.Is(err, errcode.ErrInvalidRequest) {
		t.Fatalf("wait_seconds %d: %v, want invalid_request", bad.WaitSeconds, err)
	}
	bad.WaitSeconds = 0
	if res, err := e.plane.Claim(e.ctx, "acme", bad); err != nil || res.Replayed {
		t.Fatalf("the refused claim_id reused: %v %v, want a new claim (the refusal recorded nothing)", res, err)
	}
}
