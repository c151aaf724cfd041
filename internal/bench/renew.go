package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
)

// RenewReport compares a lease renewal with a claim, in the same run, on
// pool cells whose agent is active (CONTRACT §20): a renewal passes the
// lease fence, tells the cell's agent the later expiry, then commits it.
type RenewReport struct {
	// Cells is the number of leases measured: each is claimed (timed),
	// activated by an exec, renewed (timed) and released.
	Cells int `json:"cells"`
	// Claim is the in-process claim of a ready cell, Renew the in-process
	// renewal of its lease from 60 s to the maximum lease.
	Claim Stats `json:"claim"`
	Renew Stats `json:"renew"`
	// Ratio is Renew p50 ÷ Claim p50 (target ≤ 1.0).
	Ratio float64 `json:"ratio"`
}

// benchRenew measures renew_claim_ratio on a SQLite plane whose pool runs
// the fake provider's in-memory agent: the agent round trip is the
// plane's own code, not a sandbox's, so the ratio is the store and plane
// cost of a renewal against a claim's. Each is timed on a settled pool
// (settle): timed at once, a renewal met the pool's writes replacing the
// cell just claimed and a claim those of the last release, unequal loads
// that made the ratio a measure of the pool's timing (1.16–1.34), not of
// the two operations.
func benchRenew(ctx context.Context, dir string, quick bool) (*RenewReport, error) {
	r := &RenewReport{Cells: 600}
	if quick {
		r.Cells = 200
	}
	const target = 16
	plane, _, rel, stop, err := runPool(ctx, dir, pool.Config{Name: "renew", Target: target, MaxProvisioning: target,
		Provider: fake.NewWithAgent(fake.Config{Mode: driver.Apply})})
	if err != nil {
		return nil, err
	}
	defer stop()
	waitReady(ctx, plane, target)

	claims := make([]time.Duration, 0, r.Cells)
	renews := make([]time.Duration, 0, r.Cells)
	var claimErrs int
	start := time.Now()
	deadline := start.Add(60 * time.Second)
	short, long := uint64(60), uint64(sandboxwich.MaxLeaseSeconds)
	for len(renews) < r.Cells {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("renew: %d of %d leases in %v", len(renews), r.Cells, time.Since(start))
		}
		settle(ctx, plane, target)
		t0 := time.Now()
		res, err := plane.Claim(ctx, benchTenant, sandboxwich.ClaimRequest{ClaimID: uuid.Must(uuid.NewV7()), Release: rel,
			Binding: benchBinding, LeaseSeconds: &short})
		took := time.Since(t0)
		switch {
		case err != nil:
			claimErrs++
			continue
		case res.Lease == nil:
			time.Sleep(time.Millisecond) // the pool is refilling
			continue
		}
		claims = append(claims, took)
		proof := res.Proof()
		if _, err := plane.Exec(ctx, benchTenant, res.Lease.ID, proof, sandboxwich.ExecRequest{Argv: []string{"echo", "on"}}); err != nil {
			return nil, fmt.Errorf("renew: activating exec: %w", err)
		}
		settle(ctx, plane, target-1) // the claimed cell's replacement may still be on its way
		t0 = time.Now()
		l, err := plane.Renew(ctx, benchTenant, res.Lease.ID, proof, long)
		took = time.Since(t0)
		if err == nil && !l.ExpiresAt.After(res.Lease.ExpiresAt) {
			err = errors.New("the renewal did not move the expiry")
		}
		// Released whatever happened, so no lease outlives the run.
		if _, rerr := plane.Release(context.WithoutCancel(ctx), benchTenant, res.Lease.ID, proof, lease.Destroyed); err == nil {
			err = rerr
		}
		if err != nil {
			return nil, fmt.Errorf("renew: %w", err)
		}
		renews = append(renews, took)
	}
	wall := time.Since(start)
	r.Claim, r.Renew = summarize(claims, wall, claimErrs), summarize(renews, wall, 0)
	r.Ratio = ratio(r.Renew.P50MS, r.Claim.P50MS)
	return r, nil
}

// settle waits until the pool has at least ready ready cells, none
// provisioning and none stopping: its own writes are done.
func settle(ctx context.Context, plane *sandboxwich.Plane, ready int) {
	for ctx.Err() == nil {
		if sts, err := plane.Pools().Status(ctx); err == nil {
			m := sts[0].Members
			if m[lease.MemberReady] >= ready && m[lease.MemberProvisioning] == 0 && m[lease.MemberStopping] == 0 {
				return
			}
		}
		time.Sleep(time.Millisecond)
	}
}
