package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

var errCellNotFound = errcode.New(errcode.NotFound, "cell not found")

// Prepare implements store.Store.
func (s *Store) Prepare(ctx context.Context, p store.PrepareParams) (lease.Cell, error) {
	r := p.Release
	c := lease.Cell{
		ID:             p.CellID,
		TenantID:       p.TenantID,
		WorkerID:       p.WorkerID,
		ProviderCellID: p.ProviderCellID,
		State:          lease.Ready,
		Generation:     lease.GenerationReady,
		Release:        r,
		ExpiresAt:      fromUS(us(p.ExpiresAt)),
		CreatedAt:      fromUS(us(p.Now)),
	}
	n, err := affected(s.w.exec(ctx, s.q.prepare, c.ID.String(), c.TenantID, c.WorkerID, c.ProviderCellID,
		r.ReleaseSetID, string(r.RuntimeClass), r.PolicyDigest, r.Signature, us(c.ExpiresAt), us(p.Now), us(p.Now),
		c.ID.String()))
	if err != nil {
		return lease.Cell{}, s.fail(ctx, "prepare", err)
	}
	if n != 1 {
		return lease.Cell{}, errcode.New(errcode.Conflict, "cell_id or provider_cell_id was already used")
	}
	return c, nil
}

// WorkerCell implements store.Store.
func (s *Store) WorkerCell(ctx context.Context, workerID string, cellID uuid.UUID) (lease.Cell, *store.ClaimInfo, error) {
	c, err := scanCell(s.r.row(ctx, s.q.cellByWorker, cellID.String(), workerID))
	if errors.Is(err, sql.ErrNoRows) {
		return c, nil, errCellNotFound
	}
	if err != nil || c.Lease == nil {
		return c, nil, s.fail(ctx, "worker cell", err)
	}
	info := &store.ClaimInfo{LeaseID: c.Lease.ID, Generation: c.Generation, ExpiresAt: c.Lease.ExpiresAt}
	var claimID string
	switch err := s.r.row(ctx, s.q.claimOfCell, c.ID.String()).Scan(&claimID); {
	case errors.Is(err, sql.ErrNoRows): // an unfenced claim
	case err != nil:
		return c, nil, s.fail(ctx, "worker cell claim", err)
	default:
		if info.ClaimID, err = uuid.Parse(claimID); err != nil {
			return c, nil, s.fail(ctx, "worker cell claim", err)
		}
	}
	return c, info, nil
}

// workerCell reads a worker's cell inside a write transaction.
func (s *Store) workerCell(ctx context.Context, tx txn, workerID string, cellID uuid.UUID) (lease.Cell, error) {
	c, err := scanCell(tx.row(ctx, s.q.cellByWorker, cellID.String(), workerID))
	if errors.Is(err, sql.ErrNoRows) {
		return c, errCellNotFound
	}
	return c, err
}

// Retire implements store.Store.
func (s *Store) Retire(ctx context.Context, p store.RetireParams) (lease.Cell, error) {
	var c lease.Cell
	err := s.inTx(ctx, func(tx txn) error {
		var err error
		if c, err = s.workerCell(ctx, tx, p.WorkerID, p.CellID); err != nil {
			return err
		}
		switch {
		case p.Generation != lease.GenerationReady || c.Generation != lease.GenerationReady:
		case c.State == lease.Ready:
			return s.quarantine(ctx, tx, &c, store.ReasonWorkerRetire, p.Now)
		case c.State == lease.Quarantined:
			return nil // exact repeat
		}
		return errcode.New(errcode.Conflict, "only a ready generation-1 cell can be retired")
	})
	return c, s.fail(ctx, "retire", err)
}

// Destroy implements store.Store.
func (s *Store) Destroy(ctx context.Context, p store.DestroyParams) (lease.Cell, error) {
	if !lease.ValidDisposition(p.Disposition) {
		return lease.Cell{}, errcode.New(errcode.InvalidRequest, "disposition must be destroyed or quarantined")
	}
	var c lease.Cell
	err := s.inTx(ctx, func(tx txn) error {
		var err error
		if c, err = s.workerCell(ctx, tx, p.WorkerID, p.CellID); err != nil {
			return err
		}
		if c.PoolName != "" {
			return errcode.New(errcode.Conflict, "pool cells are stopped by their pool")
		}
		sameLease := c.Lease != nil && c.Lease.ID == p.LeaseID && c.Generation == p.Generation
		if c.State.Terminal() {
			if sameLease && c.State == p.Disposition {
				return nil // replay
			}
			return errcode.New(errcode.Conflict, "cell is already "+string(c.State))
		}
		if c.State != lease.Leased || !sameLease {
			if err := s.quarantine(ctx, tx, &c, store.ReasonFenceMismatch, p.Now); err != nil {
				return err
			}
			return commitThen{errcode.New(errcode.Conflict,
				"destroy does not match the cell's live lease; the cell is quarantined")}
		}
		return s.terminal(ctx, tx, &c, p.Disposition, store.ReasonWorkerDestroy, p.Now) // sameLease: c.Lease.ID is p.LeaseID
	})
	return c, s.fail(ctx, "destroy", err)
}

// ExpireUnmanaged implements store.Store.
func (s *Store) ExpireUnmanaged(ctx context.Context, now time.Time) (int, error) {
	var total int64
	err := s.inTx(ctx, func(tx txn) error {
		total = 0
		for _, q := range []string{s.q.expireLeased, s.q.expireReady} {
			n, err := affected(tx.exec(ctx, q, us(now), us(now), us(now)))
			if err != nil {
				return err
			}
			total += n
		}
		_, err := tx.exec(ctx, s.q.expireIdempotency, us(now))
		return err
	})
	return int(total), s.fail(ctx, "expire", err)
}
