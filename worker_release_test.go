package sandboxwich_test

import (
	"errors"
	"testing"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
)

// TestReleasePoolCell: the Rust implementation's worker pool release
// (CONTRACT §12). The lookup is by cell, worker and tenant (404), a cell
// that is not leased is 409, and a configured worker's leased cell has no
// pool membership: 404. Nothing ever changes.
func TestReleasePoolCell(t *testing.T) {
	e := newEnv(t)
	cell := e.prepare(t)
	req := sandboxwich.DestroyRequest{LeaseID: uuid.New(), Generation: 2, Disposition: lease.Destroyed}
	check := func(what string, w sandboxwich.Worker, id uuid.UUID, r sandboxwich.DestroyRequest, want error, state lease.State) {
		t.Helper()
		if err := e.plane.ReleasePoolCell(e.ctx, w, id, r); !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", what, err, want)
		}
		got, _, err := e.plane.WorkerCell(e.ctx, e.worker, cell.ID)
		if err != nil || got.State != state || got.Disposition() != "" {
			t.Errorf("%s: the cell is now %s %q (%v), want %s", what, got.State, got.Disposition(), err, state)
		}
	}
	check("unknown cell", e.worker, uuid.New(), req, errcode.ErrNotFound, lease.Ready)
	other := e.worker
	other.ID = uuid.New()
	check("another worker", other, cell.ID, req, errcode.ErrNotFound, lease.Ready)
	// The same worker ID, configured for another tenant since it prepared
	// the cell: not found.
	moved := e.worker
	moved.TenantID = "globex"
	check("another tenant", moved, cell.ID, req, errcode.ErrNotFound, lease.Ready)
	check("ready cell", e.worker, cell.ID, req, errcode.ErrConflict, lease.Ready)
	bad := req
	bad.Disposition = "deleted"
	check("bad disposition", e.worker, cell.ID, bad, errcode.ErrInvalidRequest, lease.Ready)

	res, err := e.plane.Claim(e.ctx, "acme", sandboxwich.ClaimRequest{ClaimID: uuid.New(), Release: e.rel, Binding: binding})
	if err != nil || res.Lease == nil || res.Lease.CellID != cell.ID {
		t.Fatalf("claim: %+v %v", res.Lease, err)
	}
	live := sandboxwich.DestroyRequest{LeaseID: res.Lease.ID, Generation: res.Lease.Generation, Disposition: lease.Destroyed}
	check("leased cell without membership", e.worker, cell.ID, live, errcode.ErrNotFound, lease.Leased)
	check("leased cell, wrong fence", e.worker, cell.ID, req, errcode.ErrNotFound, lease.Leased)
	check("leased cell, another tenant", moved, cell.ID, live, errcode.ErrNotFound, lease.Leased)
}
