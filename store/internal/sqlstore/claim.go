package sqlstore

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/fence"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

var (
	errDigestMismatch = errcode.New(errcode.Conflict, "claim_id was already used for a different claim")
	errClaimNotLive   = errcode.Wrap(errcode.Conflict, "the lease recorded for this claim_id is no longer live", lease.ErrNotLive)
	errContended      = errcode.New(errcode.ClaimContended, "no consistent claim attempt; retry with the same claim_id")
)

// Claim implements store.Store.
//
// A claim with no other claim of this store in flight, on a dialect with
// writable CTEs and no ready floor to count, first tries claimAlone; every
// other claim, and one claimAlone cannot decide, runs in a transaction.
//
// A fenced claim assumes its claim_id is new: it does not read the fence,
// it inserts it with the lease. When the insert finds the claim_id taken —
// a retry, or an identical claim that committed first — nothing is written
// and the next attempt replays the recorded outcome.
func (s *Store) Claim(ctx context.Context, p store.ClaimParams) (store.ClaimResult, error) {
	if p.TenantID == "" || p.Sign == nil || p.LeaseSeconds == 0 || p.LeaseID == uuid.Nil {
		return store.ClaimResult{}, errcode.New(errcode.InvalidRequest, "claim parameters are incomplete")
	}
	alone := s.claiming.Add(1) == 1
	defer s.claiming.Add(-1)
	cl := &claim{ClaimParams: &p, key: inventory(&p)}
	done, err := false, error(nil)
	if alone && s.d.WritableCTE && len(p.ReadyFloors) == 0 {
		done, err = s.claimAlone(ctx, cl)
	}
	if !done && (err == nil || errors.Is(err, errRetry)) {
		err = s.inTx(ctx, func(tx txn) error {
			cl.res, cl.next = store.ClaimResult{}, nil
			return s.claimOnce(ctx, tx, cl)
		})
		if err == nil {
			s.remember(cl.key, cl.next) // committed
		}
	}
	switch {
	case err == nil:
		return cl.res, nil
	case errors.Is(err, errRetry):
		// Every attempt lost a compare-and-set or a serialization race. A
		// fenced claim may be retried safely; an unfenced one just found
		// nothing it could take.
		if p.ClaimID != uuid.Nil {
			return store.ClaimResult{}, errContended
		}
		return store.ClaimResult{}, nil
	}
	return store.ClaimResult{}, s.fail(ctx, "claim", err)
}

// claim is one call of Claim: its parameters, its inventory's key, and
// what its attempts learn.
type claim struct {
	*store.ClaimParams
	key string
	// taken records, across attempts, that the claim_id's fence row
	// exists: the next attempt replays it.
	taken bool
	// res is the outcome of the last attempt; next holds the inventory's
	// next candidates it saw, to remember once its transaction commits.
	res  store.ClaimResult
	next []candidate
}

// claimOnce is one attempt.
//
// On a dialect whose writers are serialized (no row locks: SQLite), the
// transaction sees every committed lease, so a remembered candidate is as
// good as a pick once its compare-and-set holds: the claim tries the next
// remembered one first, and a pick reads hintDepth candidates for the
// claims that follow.
func (s *Store) claimOnce(ctx context.Context, tx txn, cl *claim) error {
	p := cl.ClaimParams
	fenced := p.ClaimID != uuid.Nil
	if fenced && cl.taken {
		if done, err := s.replay(ctx, tx, p, &cl.res); done || err != nil {
			return err
		}
	}
	serial := s.d.RowLock == "" && len(p.ReadyFloors) == 0
	if serial {
		if c, ok := s.takeHint(cl.key); ok {
			if err := s.leaseCandidate(ctx, tx, cl, c); !errors.Is(err, errCellTaken) {
				return err
			}
		}
	}
	if len(p.ReadyFloors) > 0 {
		// Counting a ready floor needs the inventory's claims one at a time.
		if err := s.lock(ctx, tx, cl.key); err != nil {
			return err
		}
	}
	var c candidate
	var err error
	if serial {
		c, cl.next, err = s.pickQueue(ctx, tx, p)
	} else {
		c, err = s.pickCell(ctx, tx, p)
	}
	if errors.Is(err, sql.ErrNoRows) {
		switch {
		case !fenced:
			return nil
		case p.Waiting:
			// Nothing to record yet, but an outcome recorded meanwhile (by
			// a retry elsewhere) decides the claim.
			_, err := s.replay(ctx, tx, p, &cl.res)
			return err
		}
		_, err = tx.exec(ctx, s.q.fenceEmpty, p.TenantID, p.ClaimID.String(), p.Digest, us(p.Now), nullString(p.EmptyReason))
		if err == nil {
			cl.res.EmptyReason = p.EmptyReason
		}
		return s.fenceTaken(err, cl)
	}
	if err != nil {
		return err
	}
	return s.leaseCandidate(ctx, tx, cl, c)
}

// leaseCandidate leases cell c to the claim, or reports errCellTaken,
// having written nothing, when c is no longer claimable.
func (s *Store) leaseCandidate(ctx context.Context, tx txn, cl *claim, c candidate) error {
	l, err := newLease(cl.ClaimParams, c)
	if err != nil {
		return err
	}
	if err := s.fenceTaken(s.leaseCell(ctx, tx, cl, &l, c.pool.Valid), cl); err != nil {
		return err
	}
	cl.res = store.ClaimResult{Lease: &l, PoolName: c.pool.String}
	return nil
}

// pickQueue is the pick of a dialect whose writers are serialized: the
// oldest claimable cell, and the next hintDepth-1 after it.
func (s *Store) pickQueue(ctx context.Context, tx txn, p *store.ClaimParams) (candidate, []candidate, error) {
	rows, err := tx.rows(ctx, s.q.candidateQueue, s.candidateArgs(p)...)
	if err != nil {
		return candidate{}, nil, err
	}
	defer rows.Close()
	var cs []candidate
	for rows.Next() {
		var c candidate
		if err := rows.Scan(c.dest()...); err != nil {
			return candidate{}, nil, err
		}
		cs = append(cs, c)
	}
	if err := rows.Err(); err != nil {
		return candidate{}, nil, err
	}
	if len(cs) == 0 {
		return candidate{}, nil, sql.ErrNoRows
	}
	return cs[0], cs[1:], nil
}

// claimAlone is the fast path of a claim no other claim of this store runs
// beside, on dialects with writable CTEs: the whole lease as one
// autocommitted statement, after a plain read that picks the cell — or
// without it, when the inventory's previous lease statement returned the
// next candidate. One or two round trips where the transaction takes four.
// It reports false, having written nothing, when it cannot decide the claim
// alone: no cell was free (an empty answer must wait for locked
// candidates), the cell was taken meanwhile or is too close to its
// deadline (the statement's compare-and-set matched nothing), or the
// claim_id is taken.
func (s *Store) claimAlone(ctx context.Context, cl *claim) (bool, error) {
	p := cl.ClaimParams
	next, ok := s.takeHint(cl.key)
	if !ok {
		err := s.w.row(ctx, s.q.candidatePeek, s.candidateArgs(p)...).Scan(next.dest()...)
		if errors.Is(err, sql.ErrNoRows) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
	}
	l, err := newLease(p, next)
	if err != nil {
		return false, err
	}
	q, args := s.leaseAll(p, &l)
	var r leaseRow
	if err := s.w.row(ctx, q, args...).Scan(r.dest()...); err != nil {
		return false, s.fenceTaken(err, cl)
	}
	switch {
	case r.cells == 0:
		return false, nil
	case next.pool.Valid && r.members != 1:
		// The compare-and-set required a ready member, and every change
		// to a ready member changes its cell too: this cannot happen
		// unless something else wrote the table. The fence row is
		// written, so a retry replays the lease.
		return false, fmt.Errorf("cell %s leased while its pool member changed", next.id)
	}
	s.remember(cl.key, r.next())
	cl.res = store.ClaimResult{Lease: &l, PoolName: next.pool.String}
	return true, nil
}

// candidate is a claimable cell as the pick reads it.
type candidate struct {
	id       string
	pool     sql.NullString
	deadline int64
}

func (c *candidate) dest() []any { return []any{&c.id, &c.pool, &c.deadline} }

// leaseRow is the row of leaseAll: what it leased, and the next candidate.
type leaseRow struct {
	cells, members   int
	nextID, nextPool sql.NullString
	nextDeadline     sql.NullInt64
}

func (r *leaseRow) dest() []any {
	return []any{&r.cells, &r.members, &r.nextID, &r.nextPool, &r.nextDeadline}
}

// next is the row's next candidate, if it names one.
func (r *leaseRow) next() []candidate {
	if !r.nextID.Valid {
		return nil
	}
	return []candidate{{id: r.nextID.String, pool: r.nextPool, deadline: r.nextDeadline.Int64}}
}

// maxHints bounds the inventories with remembered candidates; hintDepth
// bounds the candidates remembered for one.
const (
	maxHints  = 1024
	hintDepth = 16
)

// remember keeps next, oldest first, as the candidates of inventory key,
// unless it is empty. Only what a committed transaction read may be
// remembered: a rolled-back one may name a cell younger than the one it
// failed to lease.
func (s *Store) remember(key string, next []candidate) {
	if len(next) == 0 {
		return
	}
	s.hintsMu.Lock()
	defer s.hintsMu.Unlock()
	if _, ok := s.hints[key]; !ok && len(s.hints) >= maxHints {
		clear(s.hints)
	}
	s.hints[key] = next
}

// takeHint removes and returns the oldest remembered candidate of
// inventory key: each is tried once.
func (s *Store) takeHint(key string) (candidate, bool) {
	s.hintsMu.Lock()
	defer s.hintsMu.Unlock()
	q := s.hints[key]
	if len(q) == 0 {
		return candidate{}, false
	}
	if len(q) == 1 {
		delete(s.hints, key)
	} else {
		s.hints[key] = q[1:]
	}
	return q[0], true
}

// newLease is the lease a claim makes of cell c.
func newLease(p *store.ClaimParams, c candidate) (lease.Lease, error) {
	cellID, err := uuid.Parse(c.id)
	if err != nil {
		return lease.Lease{}, err
	}
	expires := p.Now.Add(secondsDuration(p.LeaseSeconds))
	if d := fromUS(c.deadline); d.Before(expires) {
		expires = d
	}
	l := lease.Lease{
		ID:         p.LeaseID,
		CellID:     cellID,
		Generation: lease.GenerationLeased,
		Release:    p.Release,
		Binding:    p.Binding,
		ExpiresAt:  fromUS(us(expires)),
		LeasedAt:   fromUS(us(p.Now)),
	}
	l.GrantedExpiresAt = l.ExpiresAt
	l.AttestationDigest = p.Sign(l)
	return l, nil
}

// leaseArgs are the arguments of leaseCell.
func leaseArgs(p *store.ClaimParams, l *lease.Lease) []any {
	b := p.Binding
	var claimID any // NULL for an unfenced claim
	if p.ClaimID != uuid.Nil {
		claimID = p.ClaimID.String()
	}
	return []any{l.ID.String(), b.OrganizationID, b.WorkspaceID, b.ThreadID, b.RunnerSessionID,
		us(l.ExpiresAt), l.AttestationDigest, claimID, us(p.Now), us(p.Now), p.Egress, l.CellID.String(),
		us(p.Now.Add(secondsDuration(p.LeaseSeconds)))}
}

// leaseAll returns the one statement, with its arguments, that writes a
// lease on dialects with writable CTEs.
func (s *Store) leaseAll(p *store.ClaimParams, l *lease.Lease) (string, []any) {
	q, args := s.q.leaseAll, append(leaseArgs(p, l), us(p.Now))
	if p.ClaimID != uuid.Nil {
		q, args = s.q.leaseAllFenced, append(args, p.TenantID, p.ClaimID.String(), p.Digest, us(p.Now))
	}
	// The next candidate is the oldest other ready cell, whatever lease
	// the next claim asks for: its compare-and-set checks the deadline.
	r := p.Release
	pools := poolList(p)
	return q, append(args, p.TenantID, string(r.RuntimeClass), r.ReleaseSetID, r.PolicyDigest, r.Signature,
		us(p.Now), p.Image, p.Image, pools, pools, pools, l.CellID.String())
}

// poolList is the candidate query's argument for p.Pools: "" for any pool,
// else the names between commas (",a,b,"), which no pool name contains
// (lease.ValidIdentifier). The query tests a cell's pool by whether
// replacing ",name," shortens the list: replace and length are the same in
// both dialects, and unlike LIKE they have no wildcard a name could hold.
func poolList(p *store.ClaimParams) string {
	if p.Pools == nil {
		return ""
	}
	return "," + strings.Join(p.Pools, ",") + ","
}

// inventory is the key of a claim's inventory: tenant, exact release,
// image and the pools it may take from.
func inventory(p *store.ClaimParams) string {
	r := p.Release
	return strings.Join([]string{p.TenantID, r.ReleaseSetID, string(r.RuntimeClass), r.PolicyDigest, r.Signature, p.Image, poolList(p)}, "\x1f")
}

// leaseCell writes lease l: the cell's compare-and-set from ready, its
// membership's, and the claim's fence row. With writable CTEs that is one
// statement (one round trip), whose next candidate lands in cl.next;
// otherwise three. It reports errCellTaken, having written nothing, when the
// cell's compare-and-set matched no row.
func (s *Store) leaseCell(ctx context.Context, tx txn, cl *claim, l *lease.Lease, pooled bool) error {
	p := cl.ClaimParams
	if s.d.WritableCTE {
		var r leaseRow
		q, args := s.leaseAll(p, l)
		if err := tx.row(ctx, q, args...).Scan(r.dest()...); err != nil {
			return err
		}
		switch {
		case r.cells != 1:
			return errCellTaken
		case pooled && r.members != 1:
			return errRetry
		}
		cl.next = r.next()
		return nil
	}
	if n, err := affected(tx.exec(ctx, s.q.leaseCell, leaseArgs(p, l)...)); err != nil || n != 1 {
		return cmp.Or(err, errCellTaken)
	}
	if pooled {
		if n, err := affected(tx.exec(ctx, s.q.memberLeased, us(p.Now), l.CellID.String())); err != nil || n != 1 {
			return cmp.Or(err, errRetry)
		}
	}
	if p.ClaimID != uuid.Nil {
		_, err := tx.exec(ctx, s.q.fenceInsert, p.TenantID, p.ClaimID.String(), p.Digest, l.ID.String(), us(p.Now))
		return err
	}
	return nil
}

// errCellTaken is a lost compare-and-set on the cell itself, before
// anything was written: another attempt, or another candidate, may follow.
var errCellTaken = fmt.Errorf("%w: the cell is no longer claimable", errRetry)

// fenceTaken turns a unique violation — the claim_id's fence row already
// exists, committed by an earlier or concurrent claim — into another attempt,
// which replays that row.
func (s *Store) fenceTaken(err error, cl *claim) error {
	if err != nil && s.d.UniqueViolation(err) {
		cl.taken = true
		return errRetry
	}
	return err
}

// replay applies the fence row of a fenced claim, if there is one. It
// reports done when the claim's outcome is decided by the row.
func (s *Store) replay(ctx context.Context, tx txn, p *store.ClaimParams, res *store.ClaimResult) (bool, error) {
	var digest string
	var reason sql.NullString
	var c cellRow
	err := tx.row(ctx, s.q.fence, p.TenantID, p.ClaimID.String()).Scan(append([]any{&digest, &reason}, c.dest()...)...)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	empty := !c.present()
	var cell lease.Cell
	if !empty {
		if cell, err = c.cell(); err != nil {
			return false, err
		}
	}
	rec := &fence.Record{Digest: digest, Empty: empty, Live: !empty && cell.LeaseLive(p.Now)}
	switch fence.Decide(rec, p.Digest) {
	case fence.Conflict:
		return true, errDigestMismatch
	case fence.ReplayEmpty:
		*res = store.ClaimResult{Replayed: true, EmptyReason: reason.String}
		return true, nil
	case fence.ReplayLease:
		*res = store.ClaimResult{Lease: cell.Lease, Replayed: true, PoolName: cell.PoolName}
		return true, nil
	default: // fence.NoLongerLive: expired or terminal never regenerates authority.
		if cell.State == lease.Leased {
			if err := s.quarantine(ctx, tx, &cell, store.ReasonExpired, p.Now); err != nil {
				return false, err
			}
			return true, commitThen{errClaimNotLive}
		}
		return true, errClaimNotLive
	}
}

// pickCell selects, and with row locks locks, the oldest claimable cell,
// skipping the cells of pools held at their ready floor. It first skips
// cells other claims have locked; when that finds none it waits for them,
// so an empty answer is exact: a claim that rolls back leaves its cell
// ready for this one.
func (s *Store) pickCell(ctx context.Context, tx txn, p *store.ClaimParams) (candidate, error) {
	c, err := s.pickWith(ctx, tx, p, s.q.candidateSkip, s.q.skipLocked)
	if errors.Is(err, sql.ErrNoRows) && s.d.RowLock != "" {
		return s.pickWith(ctx, tx, p, s.q.candidateWait, s.q.waitLocked)
	}
	return c, err
}

// candidateArgs are the arguments of the candidate query.
func (s *Store) candidateArgs(p *store.ClaimParams) []any {
	r := p.Release
	pools := poolList(p)
	return []any{p.TenantID, string(r.RuntimeClass), r.ReleaseSetID, r.PolicyDigest, r.Signature,
		us(p.Now.Add(secondsDuration(p.LeaseSeconds))), p.Image, p.Image, pools, pools, pools}
}

func (s *Store) pickWith(ctx context.Context, tx txn, p *store.ClaimParams, first, lockClause string) (candidate, error) {
	args := s.candidateArgs(p)
	row := tx.row(ctx, first, args...)
	var held []any
	for {
		var c candidate
		if err := row.Scan(c.dest()...); err != nil || !c.pool.Valid {
			return c, err
		}
		floor := p.ReadyFloors[c.pool.String]
		if floor <= 0 {
			return c, nil
		}
		var ready int
		if err := tx.row(ctx, s.q.readyMembers, c.pool.String).Scan(&ready); err != nil {
			return c, err
		}
		if ready > floor {
			return c, nil
		}
		held = append(held, c.pool.String)
		query := s.q.rebind(s.q.candidateRaw + ` AND (c.pool_name IS NULL OR c.pool_name NOT IN (?` +
			strings.Repeat(", ?", len(held)-1) + `))` + s.q.candidateOrder + lockClause)
		row = tx.query(ctx, query, append(args, held...)...)
	}
}

// quarantine compare-and-sets a live cell to quarantined, for the event
// reason code given.
func (s *Store) quarantine(ctx context.Context, tx txn, c *lease.Cell, reason string, now time.Time) error {
	if c.State.Terminal() {
		return nil
	}
	n, err := affected(tx.exec(ctx, s.q.quarantine, us(now), us(now), nullString(reason), c.ID.String(), string(c.State), c.Generation))
	if err != nil {
		return err
	}
	if n != 1 {
		return errRetry
	}
	c.State = lease.Quarantined
	return nil
}

// Lease implements store.Store.
func (s *Store) Lease(ctx context.Context, tenantID string, leaseID uuid.UUID) (store.LeaseRecord, error) {
	rec, err := scanRecord(s.r.row(ctx, s.q.recordByLease, leaseID.String(), tenantID))
	if errors.Is(err, sql.ErrNoRows) {
		return store.LeaseRecord{}, errLeaseNotFound
	}
	return rec, s.fail(ctx, "lease", err)
}

var errLeaseNotFound = errcode.New(errcode.NotFound, "lease not found")

// CheckLease implements store.Store. The common case, a live lease, is one
// read; only a lease found no longer live takes a write transaction.
func (s *Store) CheckLease(ctx context.Context, p store.LeaseCheck) (store.LeaseRecord, error) {
	rec, err := s.Lease(ctx, p.TenantID, p.LeaseID)
	if err != nil {
		return rec, err
	}
	if err := rec.Cell.CheckProof(p.Proof, p.Now); !errors.Is(err, lease.ErrNotLive) || rec.Cell.State.Terminal() {
		return rec, fenceError(err)
	}
	err = s.inTx(ctx, func(tx txn) error {
		var err error
		rec, err = s.lockedRecord(ctx, tx, p.TenantID, p.LeaseID)
		if err != nil {
			return err
		}
		return s.applyFence(ctx, tx, &rec, p)
	})
	return rec, s.fail(ctx, "check lease", err)
}

// lockedRecord reads a lease record inside a write transaction.
func (s *Store) lockedRecord(ctx context.Context, tx txn, tenantID string, leaseID uuid.UUID) (store.LeaseRecord, error) {
	rec, err := scanRecord(tx.row(ctx, s.q.recordByLease, leaseID.String(), tenantID))
	if errors.Is(err, sql.ErrNoRows) {
		return rec, errLeaseNotFound
	}
	return rec, err
}

// applyFence checks the lease fence inside a transaction, quarantining a
// lease found no longer live.
func (s *Store) applyFence(ctx context.Context, tx txn, rec *store.LeaseRecord, p store.LeaseCheck) error {
	err := rec.Cell.CheckProof(p.Proof, p.Now)
	if errors.Is(err, lease.ErrNotLive) && !rec.Cell.State.Terminal() {
		if qerr := s.quarantine(ctx, tx, &rec.Cell, store.ReasonExpired, p.Now); qerr != nil {
			return qerr
		}
		return commitThen{fenceError(err)}
	}
	return fenceError(err)
}

func fenceError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, lease.ErrFenceMismatch):
		return errcode.Wrap(errcode.Conflict, "lease proof does not match the live lease fence", err)
	case errors.Is(err, lease.ErrNotLive):
		return errcode.Wrap(errcode.Conflict, "lease is no longer live", err)
	}
	return err
}

// Release implements store.Store.
func (s *Store) Release(ctx context.Context, p store.ReleaseParams) (store.LeaseRecord, error) {
	if !lease.ValidDisposition(p.Disposition) {
		return store.LeaseRecord{}, errcode.New(errcode.InvalidRequest, "disposition must be destroyed or quarantined")
	}
	var rec store.LeaseRecord
	err := s.inTx(ctx, func(tx txn) error {
		var err error
		if rec, err = s.lockedRecord(ctx, tx, p.TenantID, p.LeaseID); err != nil {
			return err
		}
		if err := s.applyFence(ctx, tx, &rec, p.LeaseCheck); err != nil {
			return err
		}
		if rec.Member == nil {
			return errcode.New(errcode.NotFound, "lease has no pool membership; its worker destroys the cell")
		}
		return s.stopLeased(ctx, tx, &rec, p.Disposition, "released by tenant", store.ReasonReleased, p.Now)
	})
	return rec, s.fail(ctx, "release", err)
}

// stopLeased records the tenant's stop of the live lease of a pool cell,
// for Release and Revoke alike: membership leased → stopping with
// disposition d; an exact repeat while stopping changes nothing; a repeat
// with another disposition is a cleanup fence mismatch (cleanup_pending,
// the cell quarantined, committed, and a conflict). code is the event
// reason of the stop.
func (s *Store) stopLeased(ctx context.Context, tx txn, rec *store.LeaseRecord, d lease.Disposition, reason, code string, now time.Time) error {
	m := rec.Member
	switch {
	case m.State == lease.MemberLeased:
		return s.recordStop(ctx, tx, m, &rec.Cell, d, reason, code, now)
	case m.State == lease.MemberStopping && m.RequestedDisposition == d:
		return nil // exact retry: the stop is already recorded
	case m.State == lease.MemberStopping:
		if err := s.cleanupPending(ctx, tx, m, &rec.Cell, "stop requested again with another disposition", store.ReasonFenceMismatch, now); err != nil {
			return err
		}
		return commitThen{errcode.New(errcode.Conflict,
			"disposition differs from the recorded stop; the cell is quarantined")}
	}
	return errcode.New(errcode.Conflict, "lease membership is "+string(m.State))
}

// Renew implements store.Leases. With the caller's read of the record
// (p.Read), it first tries the renewal as one compare-and-set; when that
// finds the lease changed, or without a read, it reads the record, applies
// the fence and answers from what it found.
func (s *Store) Renew(ctx context.Context, p store.RenewParams) (store.LeaseRecord, error) {
	var rec store.LeaseRecord
	to := fromUS(us(p.ExpiresAt))
	err := s.inTx(ctx, func(tx txn) error {
		if r := p.Read; r != nil && r.Cell.Lease != nil && to.After(r.Cell.Lease.ExpiresAt) {
			moved, err := s.renewFrom(ctx, tx, p, *r.Cell.Lease, to)
			if err != nil {
				return err
			}
			if moved {
				rec = renewedRecord(*r, to)
				return nil
			}
		}
		var err error
		if rec, err = s.lockedRecord(ctx, tx, p.TenantID, p.LeaseID); err != nil {
			return err
		}
		if err := s.applyFence(ctx, tx, &rec, p.LeaseCheck); err != nil {
			return err
		}
		if m := rec.Member; m != nil && m.State != lease.MemberLeased {
			return errcode.New(errcode.Conflict, "the lease's stop is already recorded (its cell is "+string(m.State)+")")
		}
		l := rec.Cell.Lease
		if !to.After(l.ExpiresAt) {
			return nil // never shorter, and nothing moved
		}
		moved, err := s.renewFrom(ctx, tx, p, *l, to)
		if err != nil {
			return err
		}
		if !moved {
			return errRetry
		}
		rec = renewedRecord(rec, to)
		return nil
	})
	return rec, s.fail(ctx, "renew", err)
}

// renewFrom moves the lease's expiry from l's to to, under p's fence: it
// reports whether the row still had l's expiry and passed the fence.
func (s *Store) renewFrom(ctx context.Context, tx txn, p store.RenewParams, l lease.Lease, to time.Time) (bool, error) {
	b := p.Proof.Binding
	n, err := affected(tx.exec(ctx, s.q.renew, us(to), us(p.Now), p.LeaseID.String(), p.TenantID,
		int64(p.Proof.Generation), b.OrganizationID, b.WorkspaceID, b.ThreadID, b.RunnerSessionID,
		p.Proof.AttestationDigest, us(l.ExpiresAt), us(p.Now)))
	return n == 1, err
}

// renewedRecord is rec with its lease's expiry moved to to (a copy: rec's
// lease is not changed).
func renewedRecord(rec store.LeaseRecord, to time.Time) store.LeaseRecord {
	l := *rec.Cell.Lease
	l.ExpiresAt = to
	rec.Cell.Lease = &l
	return rec
}
