package sandboxwich

import (
	"context"
	"slices"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

// Worker is an external worker: a process that manages its own provider and
// prepares cells for one tenant (CONTRACT §7).
type Worker struct {
	ID             uuid.UUID
	TenantID       string
	RuntimeClasses []lease.RuntimeClass
}

// DefaultMaxPrepareAhead is how far ahead of now a prepared cell's
// ExpiresAt may be, unless WithMaxPrepareAhead says otherwise.
const DefaultMaxPrepareAhead = 7 * 24 * time.Hour

// WithMaxPrepareAhead bounds how far ahead of now a worker's prepare may set
// a cell's ExpiresAt (default DefaultMaxPrepareAhead); a later ExpiresAt is
// refused with errcode.ErrInvalidRequest. New refuses a bound that is not
// positive.
func WithMaxPrepareAhead(d time.Duration) Option { return func(p *Plane) { p.maxPrepare = d } }

// PrepareRequest registers a cell a worker has prepared.
type PrepareRequest struct {
	CellID         uuid.UUID
	Release        lease.Release
	ProviderCellID string
	// ExpiresAt is the ready deadline, kept to the microsecond: in the
	// future, and at most the plane's prepare bound (WithMaxPrepareAhead)
	// ahead.
	ExpiresAt time.Time
}

// Prepare registers a worker's ready cell. It is not idempotent: resolve an
// ambiguous prepare with WorkerCell.
func (p *Plane) Prepare(ctx context.Context, w Worker, req PrepareRequest) (lease.Cell, error) {
	if err := p.checkRelease(req.Release); err != nil {
		return lease.Cell{}, err
	}
	now := p.Now()
	if !req.ExpiresAt.After(now) {
		return lease.Cell{}, errcode.New(errcode.BadRequest, "expires_at is not in the future")
	}
	if req.ExpiresAt.Sub(now) > p.maxPrepare {
		return lease.Cell{}, errcode.New(errcode.InvalidRequest,
			"expires_at is more than "+strconv.FormatInt(int64(p.maxPrepare/time.Second), 10)+" seconds ahead")
	}
	if !lease.ValidIdentifier(req.ProviderCellID) {
		return lease.Cell{}, errcode.New(errcode.BadRequest, "provider_cell_id is invalid")
	}
	if !slices.Contains(w.RuntimeClasses, req.Release.RuntimeClass) {
		return lease.Cell{}, errcode.New(errcode.AuthorizationDenied, "worker may not prepare "+string(req.Release.RuntimeClass)+" cells")
	}
	if req.CellID == uuid.Nil || w.ID == uuid.Nil || w.TenantID == "" {
		return lease.Cell{}, errcode.New(errcode.InvalidRequest, "cell_id, worker and tenant are required")
	}
	return p.store.Prepare(ctx, store.PrepareParams{
		CellID:         req.CellID,
		TenantID:       w.TenantID,
		WorkerID:       w.ID.String(),
		ProviderCellID: req.ProviderCellID,
		Release:        req.Release,
		ExpiresAt:      req.ExpiresAt.UTC().Truncate(time.Microsecond),
		Now:            now,
	})
}

// WorkerCell returns one of the worker's cells and the fenced claim that
// leased it, if any (CONTRACT §7). A cell leased by an unfenced (legacy)
// claim has no claim here, as in the Rust implementation: its worker cannot
// learn the lease ID, so cannot destroy the cell, which ends by expiry
// (quarantined by the sweeper).
func (p *Plane) WorkerCell(ctx context.Context, w Worker, cellID uuid.UUID) (lease.Cell, *ClaimInfo, error) {
	cell, info, err := p.store.WorkerCell(ctx, w.ID.String(), cellID)
	if info == nil || info.ClaimID == uuid.Nil {
		return cell, nil, err
	}
	ci := ClaimInfo(*info)
	return cell, &ci, err
}

// ClaimInfo is the fenced claim that leased a worker's cell.
type ClaimInfo struct {
	ClaimID    uuid.UUID
	LeaseID    uuid.UUID
	Generation uint64
	ExpiresAt  time.Time
}

// Retire quarantines one of the worker's ready generation-1 cells.
func (p *Plane) Retire(ctx context.Context, w Worker, cellID uuid.UUID, generation uint64) (lease.Cell, error) {
	return p.store.Retire(ctx, store.RetireParams{WorkerID: w.ID.String(), CellID: cellID, Generation: generation, Now: p.Now()})
}

// DestroyRequest ends a worker's leased cell.
type DestroyRequest struct {
	LeaseID     uuid.UUID
	Generation  uint64
	Disposition lease.Disposition
}

// Destroy ends one of the worker's leased cells with the requested
// disposition, once its provider has torn the cell down. A request that does
// not match the live lease quarantines the cell.
func (p *Plane) Destroy(ctx context.Context, w Worker, cellID uuid.UUID, req DestroyRequest) (lease.Cell, error) {
	if !lease.ValidDisposition(req.Disposition) {
		return lease.Cell{}, errcode.New(errcode.InvalidRequest, "disposition must be destroyed or quarantined")
	}
	return p.store.Destroy(ctx, store.DestroyParams{
		WorkerID: w.ID.String(), CellID: cellID, LeaseID: req.LeaseID,
		Generation: req.Generation, Disposition: req.Disposition, Now: p.Now(),
	})
}

// ReleasePoolCell is the worker pool-release route of the Rust
// implementation (POST /v1/workers/{worker_id}/sterile-cells/{cell_id}/release,
// CONTRACT §12), served as it serves it: the cell is looked up by ID, worker
// and tenant (errcode.ErrNotFound when there is none); a cell that is not
// leased is errcode.ErrConflict; then the pool stop would be recorded as a
// tenant's release records it, and a cell without pool membership is
// errcode.ErrNotFound. A configured worker never owns a pool cell (pool
// cells belong to their pool's provider identity), so every leased cell it
// finds has no membership: ReleasePoolCell always returns one of those
// errors (or errcode.ErrInvalidRequest for a bad disposition) and changes
// nothing. A worker ends its own cells with Destroy.
func (p *Plane) ReleasePoolCell(ctx context.Context, w Worker, cellID uuid.UUID, req DestroyRequest) error {
	if !lease.ValidDisposition(req.Disposition) {
		return errcode.New(errcode.InvalidRequest, "disposition must be destroyed or quarantined")
	}
	cell, _, err := p.store.WorkerCell(ctx, w.ID.String(), cellID)
	switch {
	case err != nil:
		return err
	// The tenant is part of the lookup; a pool cell is never a configured
	// worker's, even when a pool's provider identity was set to its ID.
	case cell.TenantID != w.TenantID || cell.PoolName != "":
		return errcode.New(errcode.NotFound, "cell not found")
	case cell.State != lease.Leased:
		return errcode.New(errcode.Conflict, "only a live leased pool cell can be released")
	}
	return errcode.New(errcode.NotFound,
		"the cell has no pool membership: a configured worker's cell is ended with destroy")
}
