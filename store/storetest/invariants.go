package storetest

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

// tracker wraps the store under test and checks the invariants of CONTRACT.md
// section 4 on every cell and membership a successful call returns, and once
// more on all of them when the scenario ends:
//
//   - a cell that left ready never reads ready again;
//   - a terminal cell never changes state;
//   - ready is generation 1 without a lease, leased is generation 2 with one;
//   - a cell's lease ID never changes, and no lease ID is on two cells;
//   - a terminal membership never changes state, provider_absent is only
//     ever set on terminal memberships and never cleared;
//   - a membership's stop fence and requested disposition never change once
//     recorded.
type tracker struct {
	store.Store
	// The optional abilities, nil when the store has none (their
	// scenarios do not run then).
	store.Webhooks
	store.IdempotencyStore
	t reporter

	mu      sync.Mutex
	cells   map[uuid.UUID]*cellHistory
	leases  map[uuid.UUID]leaseOwner
	members map[uuid.UUID]*memberHistory

	rmu      sync.Mutex
	reported map[string]bool
}

// reporter is the part of *testing.T the tracker reports through.
type reporter interface {
	Helper()
	Errorf(format string, args ...any)
}

type cellHistory struct {
	worker string
	left   lease.State // last non-ready state seen, "" while only ready
	gen    uint64
	leased uuid.UUID
}

type leaseOwner struct {
	cell   uuid.UUID
	tenant string
}

type memberHistory struct {
	terminal    lease.MemberState
	absent      bool
	stopped     bool
	disposition lease.Disposition
	stopLease   uuid.UUID
	stopGen     uint64
}

func newTracker(t reporter, s store.Store) *tracker {
	w, _ := s.(store.Webhooks)
	i, _ := s.(store.IdempotencyStore)
	return &tracker{
		Store:            s,
		Webhooks:         w,
		IdempotencyStore: i,
		t:                t,
		cells:            map[uuid.UUID]*cellHistory{},
		leases:           map[uuid.UUID]leaseOwner{},
		members:          map[uuid.UUID]*memberHistory{},
		reported:         map[string]bool{},
	}
}

// fail reports a broken invariant once, whichever call saw it first (the
// first argument of every report is where it was seen).
func (k *tracker) fail(format string, args ...any) {
	k.t.Helper()
	key := format + fmt.Sprint(args...)
	if strings.HasPrefix(format, "%s: ") {
		key = format + fmt.Sprint(args[1:]...)
	}
	k.rmu.Lock()
	seen := k.reported[key]
	k.reported[key] = true
	k.rmu.Unlock()
	if !seen {
		k.t.Errorf("invariant: "+format, args...)
	}
}

// observeCell checks one read of a cell against everything seen before.
func (k *tracker) observeCell(where string, c lease.Cell) {
	k.t.Helper()
	k.mu.Lock()
	defer k.mu.Unlock()
	if c.ID == uuid.Nil {
		k.fail("%s returned a cell without ID: %s", where, showCell(c))
		return
	}
	h := k.cells[c.ID]
	if h == nil {
		h = &cellHistory{worker: c.WorkerID}
		k.cells[c.ID] = h
	}
	switch {
	case c.State == lease.Ready && h.left != "":
		k.fail("%s: cell %s reads ready again after it was %s", where, c.ID, h.left)
	case h.left.Terminal() && c.State != h.left:
		k.fail("%s: terminal cell %s changed from %s to %s", where, c.ID, h.left, c.State)
	case !c.State.Valid():
		k.fail("%s: cell %s has state %q", where, c.ID, c.State)
	}
	if c.Generation < h.gen {
		k.fail("%s: cell %s generation went back from %d to %d", where, c.ID, h.gen, c.Generation)
	}
	h.gen = max(h.gen, c.Generation)
	switch c.State {
	case lease.Ready:
		if c.Generation != lease.GenerationReady || c.Lease != nil {
			k.fail("%s: ready cell is not generation 1 without lease: %s", where, showCell(c))
		}
	case lease.Leased:
		if c.Generation != lease.GenerationLeased || c.Lease == nil {
			k.fail("%s: leased cell is not generation 2 with a lease: %s", where, showCell(c))
		}
	}
	if c.State != lease.Ready {
		h.left = c.State
	}
	if l := c.Lease; l != nil {
		if l.CellID != c.ID || l.Generation != c.Generation {
			k.fail("%s: lease %s does not describe its cell: %s", where, l.ID, showCell(c))
		}
		if h.leased != uuid.Nil && h.leased != l.ID {
			k.fail("%s: cell %s lease changed from %s to %s", where, c.ID, h.leased, l.ID)
		}
		h.leased = l.ID
		if o, ok := k.leases[l.ID]; ok && o.cell != c.ID {
			k.fail("%s: lease %s is on cells %s and %s", where, l.ID, o.cell, c.ID)
		}
		k.leases[l.ID] = leaseOwner{cell: c.ID, tenant: c.TenantID}
	} else if h.leased != uuid.Nil {
		k.fail("%s: cell %s lost its lease %s", where, c.ID, h.leased)
	}
}

// observeLease records a lease returned by a claim.
func (k *tracker) observeLease(where, tenant string, l *lease.Lease) {
	k.t.Helper()
	if l == nil {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if o, ok := k.leases[l.ID]; ok && o.cell != l.CellID {
		k.fail("%s: lease %s is on cells %s and %s", where, l.ID, o.cell, l.CellID)
	}
	k.leases[l.ID] = leaseOwner{cell: l.CellID, tenant: tenant}
	h := k.cells[l.CellID]
	if h == nil {
		k.fail("%s: lease %s is on cell %s that the scenario never created", where, l.ID, l.CellID)
		return
	}
	if h.leased != uuid.Nil && h.leased != l.ID {
		k.fail("%s: cell %s lease changed from %s to %s", where, l.CellID, h.leased, l.ID)
	}
	h.leased = l.ID
}

// observeMember checks one read of a membership.
func (k *tracker) observeMember(where string, m store.Member) {
	k.t.Helper()
	if c := m.Cell; c != nil {
		if c.ID != m.CellID || c.PoolName != m.Pool {
			k.fail("%s: member %s of %s has cell %s of pool %q", where, m.CellID, m.Pool, c.ID, c.PoolName)
		}
		k.observeCell(where+" (member cell)", *c)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	h := k.members[m.CellID]
	if h == nil {
		h = &memberHistory{}
		k.members[m.CellID] = h
	}
	if !m.State.Valid() {
		k.fail("%s: member %s has state %q", where, m.CellID, m.State)
	}
	if h.terminal != "" && m.State != h.terminal {
		k.fail("%s: terminal member %s changed from %s to %s", where, m.CellID, h.terminal, m.State)
	}
	if m.State.Terminal() {
		h.terminal = m.State
	}
	if m.ProviderAbsent && !m.State.Terminal() {
		k.fail("%s: member %s is %s with provider_absent", where, m.CellID, m.State)
	}
	if h.absent && !m.ProviderAbsent {
		k.fail("%s: member %s lost provider_absent", where, m.CellID)
	}
	h.absent = h.absent || m.ProviderAbsent
	if m.RequestedDisposition != "" || m.State == lease.MemberStopping || m.State == lease.MemberCleanupPending {
		if h.stopped && (m.RequestedDisposition != h.disposition || m.StopLeaseID != h.stopLease || m.StopGeneration != h.stopGen) {
			k.fail("%s: member %s stop changed from (%s, %s, %d) to (%s, %s, %d)", where, m.CellID,
				h.disposition, h.stopLease, h.stopGen, m.RequestedDisposition, m.StopLeaseID, m.StopGeneration)
		}
		h.stopped, h.disposition, h.stopLease, h.stopGen = true, m.RequestedDisposition, m.StopLeaseID, m.StopGeneration
	} else if h.stopped {
		k.fail("%s: member %s lost its recorded stop: %s", where, m.CellID, showMember(m))
	}
}

func (k *tracker) observeRecord(where string, rec store.LeaseRecord) {
	k.t.Helper()
	k.observeCell(where, rec.Cell)
	if rec.Member != nil {
		k.observeMember(where, *rec.Member)
	}
}

// verify re-reads every cell, lease and membership the scenario created.
func (k *tracker) verify(ctx context.Context) {
	k.t.Helper()
	k.mu.Lock()
	cells := maps.Clone(k.cells)
	workers := map[uuid.UUID]string{}
	for id, h := range cells {
		workers[id] = h.worker
	}
	leases := maps.Clone(k.leases)
	members := slices.Collect(maps.Keys(k.members))
	k.mu.Unlock()

	finalCells := map[uuid.UUID]lease.State{}
	finalMembers := map[uuid.UUID]lease.MemberState{}
	for id, w := range workers {
		c, _, err := k.Store.WorkerCell(ctx, w, id)
		if err != nil {
			k.fail("final read of cell %s: %v", id, err)
			continue
		}
		k.observeCell("final read", c)
		finalCells[id] = c.State
	}
	for id, o := range leases {
		rec, err := k.Store.Lease(ctx, o.tenant, id)
		switch {
		case err != nil:
			k.fail("final read of lease %s: %v", id, err)
		case rec.Cell.ID != o.cell:
			k.fail("lease %s is on cell %s, was returned on cell %s", id, rec.Cell.ID, o.cell)
		}
	}
	for _, id := range members {
		m, err := k.Store.Member(ctx, id)
		if err != nil {
			k.fail("final read of member %s: %v", id, err)
			continue
		}
		k.observeMember("final read", m)
		finalMembers[id] = m.State
	}
	k.verifyLog(ctx, finalCells, finalMembers)
	counts, err := k.Store.CellCounts(ctx)
	if err != nil {
		k.fail("CellCounts: %v", err)
	} else if n := sum(counts); n != len(cells) {
		k.fail("the store holds %d cells %v, the scenario created %d", n, counts, len(cells))
	}
	mc, err := k.Store.MemberCounts(ctx)
	if err != nil {
		k.fail("MemberCounts: %v", err)
		return
	}
	n := 0
	for _, m := range mc {
		n += sum(m)
	}
	if n != len(members) {
		k.fail("the store holds %d memberships %v, the scenario created %d", n, mc, len(members))
	}
}

func sum[K comparable](m map[K]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// The methods below pass through and observe what succeeded.

func (k *tracker) Prepare(ctx context.Context, p store.PrepareParams) (lease.Cell, error) {
	c, err := k.Store.Prepare(ctx, p)
	if err == nil {
		k.observeCell("Prepare", c)
	}
	return c, err
}

func (k *tracker) Replenish(ctx context.Context, p store.ReplenishParams) ([]store.Member, error) {
	ms, err := k.Store.Replenish(ctx, p)
	if err == nil {
		for _, m := range ms {
			k.observeMember("Replenish", m)
		}
	}
	return ms, err
}

func (k *tracker) AdmitMember(ctx context.Context, p store.AdmitParams) (lease.Cell, error) {
	c, err := k.Store.AdmitMember(ctx, p)
	if err == nil {
		k.observeCell("AdmitMember", c)
	}
	return c, err
}

func (k *tracker) Claim(ctx context.Context, p store.ClaimParams) (store.ClaimResult, error) {
	res, err := k.Store.Claim(ctx, p)
	if err == nil {
		k.observeLease("Claim", p.TenantID, res.Lease)
	}
	return res, err
}

func (k *tracker) WorkerCell(ctx context.Context, workerID string, cellID uuid.UUID) (lease.Cell, *store.ClaimInfo, error) {
	c, info, err := k.Store.WorkerCell(ctx, workerID, cellID)
	if err == nil {
		k.observeCell("WorkerCell", c)
	}
	return c, info, err
}

func (k *tracker) Retire(ctx context.Context, p store.RetireParams) (lease.Cell, error) {
	c, err := k.Store.Retire(ctx, p)
	if err == nil {
		k.observeCell("Retire", c)
	}
	return c, err
}

func (k *tracker) Destroy(ctx context.Context, p store.DestroyParams) (lease.Cell, error) {
	c, err := k.Store.Destroy(ctx, p)
	if err == nil {
		k.observeCell("Destroy", c)
	}
	return c, err
}

func (k *tracker) Lease(ctx context.Context, tenantID string, leaseID uuid.UUID) (store.LeaseRecord, error) {
	rec, err := k.Store.Lease(ctx, tenantID, leaseID)
	if err == nil {
		k.observeRecord("Lease", rec)
	}
	return rec, err
}

func (k *tracker) CheckLease(ctx context.Context, p store.LeaseCheck) (store.LeaseRecord, error) {
	rec, err := k.Store.CheckLease(ctx, p)
	if err == nil {
		k.observeRecord("CheckLease", rec)
	}
	return rec, err
}

func (k *tracker) Release(ctx context.Context, p store.ReleaseParams) (store.LeaseRecord, error) {
	rec, err := k.Store.Release(ctx, p)
	if err == nil {
		k.observeRecord("Release", rec)
	}
	return rec, err
}

func (k *tracker) CreateMember(ctx context.Context, p store.CreateMemberParams) (store.Member, error) {
	m, err := k.Store.CreateMember(ctx, p)
	if err == nil {
		k.observeMember("CreateMember", m)
	}
	return m, err
}

func (k *tracker) BeginStop(ctx context.Context, p store.StopIntent) (store.Member, error) {
	m, err := k.Store.BeginStop(ctx, p)
	if err == nil {
		k.observeMember("BeginStop", m)
	}
	return m, err
}

func (k *tracker) CompleteStop(ctx context.Context, p store.StopOutcome) (store.Member, error) {
	m, err := k.Store.CompleteStop(ctx, p)
	if err == nil {
		k.observeMember("CompleteStop", m)
	}
	return m, err
}

func (k *tracker) Member(ctx context.Context, cellID uuid.UUID) (store.Member, error) {
	m, err := k.Store.Member(ctx, cellID)
	if err == nil {
		k.observeMember("Member", m)
	}
	return m, err
}

func (k *tracker) Members(ctx context.Context, pool string, states ...lease.MemberState) ([]store.Member, error) {
	ms, err := k.Store.Members(ctx, pool, states...)
	if err == nil {
		for _, m := range ms {
			k.observeMember("Members", m)
		}
	}
	return ms, err
}

// snapshot is everything a scenario created, as the store holds it now.
type snapshot struct {
	cells   map[uuid.UUID]lease.Cell
	members map[uuid.UUID]store.Member
	counts  map[lease.State]int
	mcounts map[string]map[lease.MemberState]int
}

// snapshot reads every tracked cell and membership.
func (e *env) snapshot() snapshot {
	e.t.Helper()
	k := e.s
	k.mu.Lock()
	workers := map[uuid.UUID]string{}
	for id, h := range k.cells {
		workers[id] = h.worker
	}
	members := slices.Collect(maps.Keys(k.members))
	k.mu.Unlock()
	s := snapshot{cells: map[uuid.UUID]lease.Cell{}, members: map[uuid.UUID]store.Member{}}
	for id, w := range workers {
		s.cells[id] = e.cell(w, id)
	}
	for _, id := range members {
		s.members[id] = e.member(id)
	}
	var err error
	s.counts, err = k.CellCounts(e.ctx)
	e.wantOK(err, "CellCounts")
	s.mcounts, err = k.MemberCounts(e.ctx)
	e.wantOK(err, "MemberCounts")
	return s
}

// unchanged fails if anything in before differs now.
func (e *env) unchanged(before snapshot, what string) {
	e.t.Helper()
	after := e.snapshot()
	for id, c := range before.cells {
		if !sameCell(after.cells[id], c) {
			e.t.Errorf("%s changed cell %s:\n before %s\n after  %s", what, id, showCell(c), showCell(after.cells[id]))
		}
	}
	for id, m := range before.members {
		if !reflect.DeepEqual(normMember(after.members[id]), normMember(m)) {
			e.t.Errorf("%s changed member %s:\n before %s\n after  %s", what, id, showMember(m), showMember(after.members[id]))
		}
	}
	if !sameCounts(before.counts, after.counts) {
		e.t.Errorf("%s changed CellCounts from %v to %v", what, before.counts, after.counts)
	}
	if fmt.Sprint(dropZero(before.mcounts)) != fmt.Sprint(dropZero(after.mcounts)) {
		e.t.Errorf("%s changed MemberCounts from %v to %v", what, before.mcounts, after.mcounts)
	}
}

func sameCounts[K comparable](a, b map[K]int) bool {
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	for k, v := range b {
		if a[k] != v {
			return false
		}
	}
	return true
}

func dropZero(m map[string]map[lease.MemberState]int) map[string]map[lease.MemberState]int {
	out := map[string]map[lease.MemberState]int{}
	for p, byState := range m {
		for s, n := range byState {
			if n == 0 {
				continue
			}
			if out[p] == nil {
				out[p] = map[lease.MemberState]int{}
			}
			out[p][s] = n
		}
	}
	return out
}
