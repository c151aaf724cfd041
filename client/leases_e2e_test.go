package client_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/client"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/wire"
)

// prepareCell registers a ready cell of the e2e worker.
func (e *e2e) prepareCell(t *testing.T) uuid.UUID {
	t.Helper()
	w := e.client(t, client.WithToken(workerToken))
	id := uuid.Must(uuid.NewV7())
	if _, err := w.Prepare(context.Background(), e.workerID, wire.PrepareRequest{CellID: id, Release: e.release,
		ProviderCellID: "vm-" + id.String(), ExpiresAt: wire.Time{Time: time.Now().Add(10 * time.Minute)}}); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestE2ELeasesRevokeInventoryEvidence: the listing's iterator over pages,
// a revocation of each kind of cell, the inventory and the evidence, against
// the real server.
func TestE2ELeasesRevokeInventoryEvidence(t *testing.T) {
	e := startE2E(t)
	ctx := context.Background()
	c := e.client(t)
	var want []uuid.UUID // newest first
	var claims []client.Claim
	for i := range 5 {
		e.prepareCell(t)
		req := e.claimRequest()
		req.RunnerSessionID = []string{"even", "odd"}[i%2]
		cl, err := c.Claim(ctx, req)
		if err != nil || cl.Empty() {
			t.Fatalf("claim: %v %v", cl, err)
		}
		claims = append(claims, cl)
		want = append([]uuid.UUID{cl.Lease.LeaseID}, want...)
	}
	var got []uuid.UUID
	for l, err := range c.Leases(ctx, client.LeaseQuery{Limit: 2}) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, l.LeaseID)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Leases = %v, want %v", got, want)
	}
	page, err := c.ListLeases(ctx, client.LeaseQuery{Binding: wire.Binding{RunnerSessionID: "odd"}})
	if err != nil || len(page.Leases) != 2 || page.NextCursor != "" || page.Leases[0].LeaseID != want[1] ||
		page.Leases[0].RunnerSessionID != "odd" || page.Leases[0].ReleaseSetID != e.release.ReleaseSetID {
		t.Fatalf("odd sessions = %+v, %v", page, err)
	}
	if _, err := c.ListLeases(ctx, client.LeaseQuery{Limit: 5000}); !errors.Is(err, errcode.ErrInvalidRequest) {
		t.Errorf("limit 5000: %v", err)
	}

	// An external worker's cell: quarantined at once; then not live.
	st, err := c.Revoke(ctx, claims[0].Lease.LeaseID, "")
	if err != nil || st.State != lease.Quarantined {
		t.Fatalf("Revoke = %+v, %v", st, err)
	}
	if _, err := c.Revoke(ctx, claims[0].Lease.LeaseID, ""); !errors.Is(err, errcode.ErrConflict) {
		t.Errorf("second Revoke: %v", err)
	}
	if _, err := c.Revoke(ctx, uuid.Must(uuid.NewV7()), lease.Destroyed); !errors.Is(err, errcode.ErrNotFound) {
		t.Errorf("Revoke of an unknown lease: %v", err)
	}
	live := true
	page, err = c.ListLeases(ctx, client.LeaseQuery{Live: &live, Limit: 10})
	if err != nil || len(page.Leases) != 4 || slices.ContainsFunc(page.Leases, func(l wire.LeaseSummary) bool { return l.LeaseID == claims[0].Lease.LeaseID }) {
		t.Errorf("live leases after a revocation = %+v, %v", page, err)
	}

	// A pool cell: its stop is recorded with the disposition asked.
	cellID := e.addPoolCell(t)
	cl, err := c.Claim(ctx, e.claimRequest())
	if err != nil || cl.Empty() || cl.Lease.CellID != cellID {
		t.Fatalf("claim of the pool cell: %v %v", cl, err)
	}
	if st, err = c.Revoke(ctx, cl.Lease.LeaseID, lease.Destroyed); err != nil || st.State != lease.Leased {
		t.Fatalf("Revoke of a pool lease = %+v, %v", st, err)
	}
	e.completeStop(t, cellID, cl.Lease.LeaseID, lease.Destroyed)
	if st, err = c.Lease(ctx, cl.Lease.LeaseID); err != nil || st.State != lease.Destroyed || !st.ProviderAbsent {
		t.Fatalf("after the revoked stop completed: %+v, %v", st, err)
	}

	ev, err := c.Evidence(ctx, cl.Lease.LeaseID)
	if err != nil || ev.CellID != cellID || ev.Pool != testPool || ev.Provider == nil || *ev.Provider != "dry-run" ||
		ev.ProviderMode == nil || *ev.ProviderMode != "dry_run" || ev.AdmittedAt == nil || ev.ImageDigest != nil {
		t.Fatalf("Evidence = %+v, %v", ev, err)
	}
	if _, err := c.Evidence(ctx, claims[1].Lease.LeaseID); !errors.Is(err, errcode.ErrNotFound) {
		t.Errorf("Evidence of an external worker's cell: %v", err)
	}

	e.prepareCell(t)
	inv, err := c.Inventory(ctx)
	if err != nil || len(inv) != 1 || inv[0].Ready != 1 || inv[0].ReleaseSetID != e.release.ReleaseSetID ||
		inv[0].RuntimeClass != e.release.RuntimeClass || inv[0].MaxLeaseSeconds != 300 {
		t.Fatalf("Inventory = %+v, %v", inv, err)
	}
}
