package sqlstore

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

var errMemberNotFound = errcode.New(errcode.NotFound, "pool member not found")

// CreateMember implements store.Store.
func (s *Store) CreateMember(ctx context.Context, p store.CreateMemberParams) (store.Member, error) {
	m := store.Member{CellID: p.CellID, Pool: p.Pool, TenantID: p.TenantID, State: lease.MemberProvisioning,
		Image: p.Image, CreatedAt: fromUS(us(p.Now)), UpdatedAt: fromUS(us(p.Now))}
	n, err := affected(s.w.exec(ctx, s.q.memberInsert, m.CellID.String(), m.Pool, m.TenantID, nil, nil,
		us(p.Now), us(p.Now), nullString(m.Image), m.CellID.String()))
	if (err != nil && s.d.UniqueViolation(err)) || (err == nil && n != 1) {
		return m, errcode.New(errcode.Conflict, "cell_id was already used")
	}
	return m, s.fail(ctx, "create member", err)
}

// Replenish implements store.Store.
func (s *Store) Replenish(ctx context.Context, p store.ReplenishParams) ([]store.Member, error) {
	if p.Pool == "" || p.TenantID == "" || p.NewID == nil {
		return nil, errcode.New(errcode.InvalidRequest, "replenish parameters are incomplete")
	}
	var out []store.Member
	err := s.inTx(ctx, func(tx txn) error {
		out = nil
		if err := s.lock(ctx, tx, "pool\x1f"+p.Pool); err != nil {
			return err
		}
		var live, provisioning int
		if err := tx.row(ctx, s.q.memberLive, p.Pool).Scan(&live, &provisioning); err != nil {
			return err
		}
		n := min(p.Target-live, p.MaxProvisioning-provisioning)
		if p.Images != nil {
			n = min(n, len(p.Images))
		}
		for i := range max(n, 0) {
			m := store.Member{CellID: p.NewID(), Pool: p.Pool, TenantID: p.TenantID, State: lease.MemberProvisioning,
				CreatedAt: fromUS(us(p.Now)), UpdatedAt: fromUS(us(p.Now))}
			if p.Images != nil {
				m.Image = p.Images[i]
			}
			if _, err := tx.exec(ctx, s.q.memberInsert, m.CellID.String(), m.Pool, m.TenantID,
				nullString(p.Owner), us(p.LockUntil), us(p.Now), us(p.Now), nullString(m.Image), m.CellID.String()); err != nil {
				return err
			}
			out = append(out, m)
		}
		return nil
	})
	if err != nil {
		// Members of a transaction that did not commit do not exist:
		// returning them would have the caller provision cells for them.
		return nil, s.fail(ctx, "replenish", err)
	}
	return out, nil
}

// AdmitMember implements store.Store.
func (s *Store) AdmitMember(ctx context.Context, p store.AdmitParams) (lease.Cell, error) {
	r := p.Release
	c := lease.Cell{
		ID:             p.CellID,
		WorkerID:       p.WorkerID,
		PoolName:       p.Pool,
		ProviderCellID: p.ProviderCellID,
		State:          lease.Ready,
		Generation:     lease.GenerationReady,
		Release:        r,
		ExpiresAt:      fromUS(us(p.ReadyDeadline)),
		CreatedAt:      fromUS(us(p.Now)),
	}
	err := s.inTx(ctx, func(tx txn) error {
		m, err := s.memberTx(ctx, tx, p.CellID)
		if err != nil {
			return err
		}
		if m.State != lease.MemberProvisioning || m.Pool != p.Pool {
			return errcode.New(errcode.Conflict, "member is "+string(m.State)+", not provisioning")
		}
		c.TenantID = m.TenantID
		image, class := p.Image, 0
		if m.Image != "" {
			image, class = m.Image, 1
		}
		if _, err := tx.exec(ctx, s.q.cellInsertPool, c.ID.String(), c.TenantID, c.WorkerID, c.PoolName,
			c.ProviderCellID, r.ReleaseSetID, string(r.RuntimeClass), r.PolicyDigest, r.Signature,
			us(c.ExpiresAt), us(p.Now), us(p.Now), nullString(image), class, cmp.Or(p.Egress, "none")); err != nil {
			if s.d.UniqueViolation(err) {
				return errcode.New(errcode.Conflict, "cell_id or provider_cell_id was already used")
			}
			return err
		}
		n, err := affected(tx.exec(ctx, s.q.memberAdmit, p.Identity, nullString(string(p.AdmittedClass)),
			nullString(p.AgentDigest), nullString(p.ImageDigest), us(p.Now), us(p.Now), us(p.Now), c.ID.String(), p.Pool))
		if err != nil {
			return err
		}
		if n != 1 {
			return errRetry
		}
		return nil
	})
	return c, s.fail(ctx, "admit member", err)
}

// BeginStop implements store.Store.
func (s *Store) BeginStop(ctx context.Context, p store.StopIntent) (store.Member, error) {
	if !lease.ValidDisposition(p.Disposition) {
		return store.Member{}, errcode.New(errcode.InvalidRequest, "disposition must be destroyed or quarantined")
	}
	var m store.Member
	err := s.inTx(ctx, func(tx txn) error {
		var err error
		if m, err = s.memberTx(ctx, tx, p.CellID); err != nil {
			return err
		}
		// A stop is recorded once: its fence and disposition never change.
		if !slices.Contains(p.From, m.State) || lease.CheckMemberTransition(m.State, lease.MemberStopping) != nil {
			return errcode.New(errcode.Conflict, "member is "+string(m.State))
		}
		if p.Quarantine && m.Cell != nil {
			if err := s.quarantine(ctx, tx, m.Cell, p.EventReason, p.Now); err != nil {
				return err
			}
		}
		return s.recordStop(ctx, tx, &m, m.Cell, p.Disposition, p.Reason, p.EventReason, p.Now)
	})
	return m, s.fail(ctx, "begin stop", err)
}

// recordStop moves a member to stopping under the fence of its cell as it
// is now. A ready cell is quarantined at once so it can never be claimed; a
// leased cell stays leased until the provider confirms. code is the event
// reason.
func (s *Store) recordStop(ctx context.Context, tx txn, m *store.Member, c *lease.Cell, d lease.Disposition, reason, code string, now time.Time) error {
	var leaseID uuid.UUID
	var gen uint64
	if c != nil {
		gen = c.Generation
		if c.Lease != nil {
			leaseID = c.Lease.ID
		}
		if c.State == lease.Ready {
			if err := s.quarantine(ctx, tx, c, code, now); err != nil {
				return err
			}
		}
	}
	n, err := affected(tx.exec(ctx, s.q.memberStop, string(d), nullUUID(leaseID), gen, reason, us(now),
		nullString(code), m.CellID.String(), string(m.State)))
	if err != nil {
		return err
	}
	if n != 1 {
		return errRetry
	}
	m.State, m.RequestedDisposition, m.StopLeaseID, m.StopGeneration = lease.MemberStopping, d, leaseID, gen
	m.LastError, m.UpdatedAt = reason, fromUS(us(now))
	return nil
}

// cleanupPending records a failed, uncertain or mismatched stop: the member
// is retried later and its cell is quarantined now. code is the event
// reason.
func (s *Store) cleanupPending(ctx context.Context, tx txn, m *store.Member, c *lease.Cell, reason, code string, now time.Time) error {
	if c != nil {
		if err := s.quarantine(ctx, tx, c, code, now); err != nil {
			return err
		}
	}
	n, err := affected(tx.exec(ctx, s.q.memberCleanup, reason, us(now), nullString(code), m.CellID.String()))
	if err != nil {
		return err
	}
	if n != 1 {
		return errRetry
	}
	m.State, m.LastError, m.UpdatedAt = lease.MemberCleanupPending, reason, fromUS(us(now))
	m.Attempts++
	return nil
}

// CompleteStop implements store.Store.
func (s *Store) CompleteStop(ctx context.Context, p store.StopOutcome) (store.Member, error) {
	var m store.Member
	err := s.inTx(ctx, func(tx txn) error {
		var err error
		if m, err = s.memberTx(ctx, tx, p.CellID); err != nil {
			return err
		}
		cell := m.Cell
		if m.State != lease.MemberStopping && m.State != lease.MemberCleanupPending {
			if m.State.Terminal() {
				return nil // already completed
			}
			return errcode.New(errcode.Conflict, "member is "+string(m.State)+", no stop recorded")
		}
		if m.StopLeaseID != p.StopLeaseID || m.StopGeneration != p.StopGeneration || m.RequestedDisposition != p.Disposition {
			if err := s.cleanupPending(ctx, tx, &m, cell, "stop completed under another fence", store.ReasonFenceMismatch, p.Now); err != nil {
				return err
			}
			return commitThen{errcode.New(errcode.Conflict, "stop outcome does not match the recorded fence")}
		}
		if !p.Proven {
			reason := p.Error
			if reason == "" {
				reason = "deletion not proven"
			}
			return s.cleanupPending(ctx, tx, &m, cell, reason, store.ReasonDeletionUncertain, p.Now)
		}
		final := p.Disposition
		if cell != nil {
			final = lease.TerminalFor(cell.State, p.Disposition)
			// A stopping member's cell is leased or already terminal:
			// recordStop quarantined it if it was ready.
			if !cell.State.Terminal() {
				if err := s.terminal(ctx, tx, cell, final, store.ReasonDeletionProven, p.Now); err != nil {
					return err
				}
			}
		}
		n, err := affected(tx.exec(ctx, s.q.memberDone, string(final), us(p.Now), m.CellID.String()))
		if err != nil {
			return err
		}
		if n != 1 {
			return errRetry
		}
		m.State, m.ProviderAbsent, m.LastError, m.UpdatedAt = lease.MemberState(final), true, "", fromUS(us(p.Now))
		m.Attempts++
		return nil
	})
	return m, s.fail(ctx, "complete stop", err)
}

// terminal compare-and-sets a leased cell to a terminal state, for the
// event reason code given.
func (s *Store) terminal(ctx context.Context, tx txn, c *lease.Cell, to lease.State, reason string, now time.Time) error {
	n, err := affected(tx.exec(ctx, s.q.toTerminal, string(to), us(now), us(now), nullString(reason), c.ID.String(), c.Lease.ID.String()))
	if err != nil {
		return err
	}
	if n != 1 {
		return errRetry
	}
	c.State = to
	return nil
}

func (s *Store) memberTx(ctx context.Context, tx txn, cellID uuid.UUID) (store.Member, error) {
	m, err := scanMember(tx.row(ctx, s.q.memberByID, cellID.String()))
	if errors.Is(err, sql.ErrNoRows) {
		return m, errMemberNotFound
	}
	return m, err
}

// Member implements store.Store.
func (s *Store) Member(ctx context.Context, cellID uuid.UUID) (store.Member, error) {
	m, err := scanMember(s.r.row(ctx, s.q.memberByID, cellID.String()))
	if errors.Is(err, sql.ErrNoRows) {
		return m, errMemberNotFound
	}
	return m, s.fail(ctx, "member", err)
}

// Members implements store.Store.
func (s *Store) Members(ctx context.Context, pool string, states ...lease.MemberState) ([]store.Member, error) {
	q := `SELECT ` + memberCols + `, ` + cellCols + ` FROM pool_members m ` + memberCellJoin + ` WHERE m.pool_name = ?`
	args := []any{pool}
	if len(states) > 0 {
		q += ` AND m.state IN (?` + strings.Repeat(", ?", len(states)-1) + `)`
		for _, st := range states {
			args = append(args, string(st))
		}
	}
	rows, err := s.r.db.QueryxContext(ctx, s.r.db.Rebind(q+` ORDER BY m.created_us, m.cell_id`), args...)
	if err != nil {
		return nil, s.fail(ctx, "members", err)
	}
	defer rows.Close()
	var out []store.Member
	for rows.Next() {
		m, err := scanMember(rows)
		if err != nil {
			return nil, s.fail(ctx, "members", err)
		}
		out = append(out, m)
	}
	return out, s.fail(ctx, "members", rows.Err())
}

// MemberCounts implements store.Store.
func (s *Store) MemberCounts(ctx context.Context) (map[string]map[lease.MemberState]int, error) {
	var rows []struct {
		Pool  string `db:"pool_name"`
		State lease.MemberState
		N     int
	}
	if err := s.r.all(ctx, &rows, s.q.memberCounts); err != nil {
		return nil, s.fail(ctx, "member counts", err)
	}
	out := map[string]map[lease.MemberState]int{}
	for _, r := range rows {
		if out[r.Pool] == nil {
			out[r.Pool] = map[lease.MemberState]int{}
		}
		out[r.Pool][r.State] = r.N
	}
	return out, nil
}

// CellCounts implements store.Store.
func (s *Store) CellCounts(ctx context.Context) (map[lease.State]int, error) {
	var rows []struct {
		State lease.State
		N     int
	}
	if err := s.r.all(ctx, &rows, s.q.cellCounts); err != nil {
		return nil, s.fail(ctx, "cell counts", err)
	}
	out := make(map[lease.State]int, len(rows))
	for _, r := range rows {
		out[r.State] = r.N
	}
	return out, nil
}

// CountReady implements store.Store.
func (s *Store) CountReady(ctx context.Context, p store.CountReadyParams) (store.ReadyCount, error) {
	r := p.Release
	var c store.ReadyCount
	err := s.r.row(ctx, s.q.readyCount, us(p.After), p.TenantID, string(r.RuntimeClass), r.ReleaseSetID,
		r.PolicyDigest, r.Signature).Scan(&c.Ready, &c.Lasting)
	return c, s.fail(ctx, "count ready", err)
}

// LockMember implements store.Store.
func (s *Store) LockMember(ctx context.Context, cellID uuid.UUID, owner string, until, now time.Time) (bool, error) {
	n, err := affected(s.w.exec(ctx, s.q.memberLock, owner, us(until), cellID.String(), owner, us(now)))
	return n == 1, s.fail(ctx, "lock member", err)
}

// UnlockMember implements store.Store.
func (s *Store) UnlockMember(ctx context.Context, cellID uuid.UUID, owner string) error {
	_, err := s.w.exec(ctx, s.q.memberUnlock, cellID.String(), owner)
	return s.fail(ctx, "unlock member", err)
}

// BeginIdempotent implements store.Store.
func (s *Store) BeginIdempotent(ctx context.Context, p store.IdempotencyParams) (store.IdempotencyRecord, error) {
	var rec store.IdempotencyRecord
	err := s.inTx(ctx, func(tx txn) error {
		n, err := affected(tx.exec(ctx, s.q.idemUpsert, p.TenantID, p.Key, p.Fingerprint,
			us(p.Now), us(p.InFlightUntil), us(p.Now)))
		if err != nil {
			return err
		}
		if n == 1 {
			rec = store.IdempotencyRecord{Fingerprint: p.Fingerprint, Created: true}
			return nil
		}
		var body string
		rec = store.IdempotencyRecord{}
		if err := tx.row(ctx, s.q.idemGet, p.TenantID, p.Key).Scan(&rec.Fingerprint, &rec.Done, &rec.Status, &body); err != nil {
			return err
		}
		rec.Body = []byte(body)
		return nil
	})
	return rec, s.fail(ctx, "begin idempotent", err)
}

// FinishIdempotent implements store.Store.
func (s *Store) FinishIdempotent(ctx context.Context, p store.IdempotencyResult) error {
	_, err := s.w.exec(ctx, s.q.idemFinish, p.Status, string(p.Body), us(p.ExpiresAt), p.TenantID, p.Key)
	return s.fail(ctx, "finish idempotent", err)
}

// DropIdempotent implements store.Store.
func (s *Store) DropIdempotent(ctx context.Context, tenantID, key string) error {
	_, err := s.w.exec(ctx, s.q.idemDrop, tenantID, key)
	return s.fail(ctx, "drop idempotent", err)
}
