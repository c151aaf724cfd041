package httpapi

import (
	"net/http"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/wire"
)

// The worker routes of CONTRACT §7. authorize has already checked that the
// token's worker is the {worker_id} of the path.

// prepare serves POST /v1/workers/{worker_id}/sterile-cells/prepare.
func (h *handler) prepare(c *call) (int, any, error) {
	req, err := decodeBody(c.body, readPrepare)
	if err != nil {
		return 0, nil, err
	}
	cell, err := h.plane.Prepare(c.ctx(), *c.p.worker, sandboxwich.PrepareRequest{
		CellID: req.CellID, Release: req.Release, ProviderCellID: req.ProviderCellID, ExpiresAt: req.ExpiresAt.Time,
	})
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.CellResponse{OK: true, Cell: wire.CellOf(&cell)}, nil
}

// workerCell serves GET /v1/workers/{worker_id}/sterile-cells/{cell_id}.
func (h *handler) workerCell(c *call) (int, any, error) {
	id, err := pathUUID(c.r, "cell_id")
	if err != nil {
		return 0, nil, err
	}
	cell, info, err := h.plane.WorkerCell(c.ctx(), *c.p.worker, id)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.WorkerCellResponse{OK: true, Cell: wire.CellOf(&cell), Claim: claimOf(info)}, nil
}

// claimOf is the wire form of the fenced claim that leased a cell.
func claimOf(info *sandboxwich.ClaimInfo) *wire.CellClaim {
	if info == nil {
		return nil
	}
	return &wire.CellClaim{ClaimID: info.ClaimID, LeaseID: info.LeaseID, Generation: info.Generation,
		ExpiresAt: wire.Time{Time: info.ExpiresAt}}
}

// retire serves POST /v1/workers/{worker_id}/sterile-cells/{cell_id}/retire.
func (h *handler) retire(c *call) (int, any, error) {
	id, err := pathUUID(c.r, "cell_id")
	if err != nil {
		return 0, nil, err
	}
	req, err := decodeBody(c.body, readRetire)
	if err != nil {
		return 0, nil, err
	}
	cell, err := h.plane.Retire(c.ctx(), *c.p.worker, id, req.Generation)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.CellResponse{OK: true, Cell: wire.CellOf(&cell)}, nil
}

// destroy serves POST /v1/workers/{worker_id}/sterile-cells/{cell_id}/destroy.
func (h *handler) destroy(c *call) (int, any, error) {
	id, err := pathUUID(c.r, "cell_id")
	if err != nil {
		return 0, nil, err
	}
	req, err := decodeBody(c.body, readDestroy)
	if err != nil {
		return 0, nil, err
	}
	cell, err := h.plane.Destroy(c.ctx(), *c.p.worker, id, sandboxwich.DestroyRequest{
		LeaseID: req.LeaseID, Generation: req.Generation, Disposition: req.Disposition,
	})
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.CellResponse{OK: true, Cell: wire.CellOf(&cell)}, nil
}

// releasePoolCell serves POST /v1/workers/{worker_id}/sterile-cells/{cell_id}/release,
// the Rust implementation's worker pool release (CONTRACT §12). There it
// answers 202 and the cell as read once a pool stop is recorded; here a
// configured worker never owns a pool cell, so the plane answers every
// request with its 404 (unknown cell, or a leased cell without membership)
// or 409 (a cell that is not leased), and never with that 202.
func (h *handler) releasePoolCell(c *call) (int, any, error) {
	id, err := pathUUID(c.r, "cell_id")
	if err != nil {
		return 0, nil, err
	}
	req, err := decodeBody(c.body, readDestroy)
	if err != nil {
		return 0, nil, err
	}
	return 0, nil, h.plane.ReleasePoolCell(c.ctx(), *c.p.worker, id, sandboxwich.DestroyRequest{
		LeaseID: req.LeaseID, Generation: req.Generation, Disposition: req.Disposition,
	})
}
