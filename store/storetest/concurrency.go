package storetest

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

var concurrencyScenarios = []scenario{
	{"Concurrency/UnfencedClaims", testConcurrentUnfenced},
	{"Concurrency/IdenticalFencedClaims", testConcurrentIdentical},
	{"Concurrency/FencedDigestRace/LeaseSeconds", func(e *env) {
		testConcurrentDigestRace(e, []func(*store.ClaimParams){leaseSeconds(120)}, []func(*store.ClaimParams){leaseSeconds(60)})
	}},
	{"Concurrency/FencedDigestRace/Release", func(e *env) {
		// Other inventories: nothing serializes the two sides but the fence.
		e.prepare(func(p *store.PrepareParams) { p.Release = e.gvis })
		e.prepare(func(p *store.PrepareParams) { p.Release = e.gvis })
		testConcurrentDigestRace(e, nil, []func(*store.ClaimParams){withRelease(e.gvis)})
	}},
	{"Concurrency/FencedLosersRecordEmpty", testConcurrentLosers},
	{"Concurrency/ReadyFloor", testConcurrentFloor},
	{"Concurrency/ClaimsRaceStops", testConcurrentStops},
	{"Concurrency/Release", testConcurrentRelease},
	{"Concurrency/CompleteStop", testConcurrentComplete},
}

// parallel runs fn(i) for i in [0, n) at once.
func parallel(n int, fn func(i int)) {
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			fn(i)
		})
	}
	close(start)
	wg.Wait()
}

// testConcurrentRelease: identical releases racing record one stop and all
// succeed.
func testConcurrentRelease(e *env) {
	m, c, l := e.poolLease()
	parallel(8, func(int) {
		if _, err := e.release(l, lease.Destroyed); err != nil {
			e.t.Errorf("concurrent identical Release: %v", err)
		}
	})
	got := e.member(m.CellID)
	if got.State != lease.MemberStopping || got.RequestedDisposition != lease.Destroyed || got.StopLeaseID != l.ID {
		e.t.Errorf("member after concurrent releases = %s, want stopping under the lease", showMember(got))
	}
	e.wantCell(e.cell(poolWorker(poolA), c.ID), leasedCell(c, l), "cell after concurrent releases")
}

// testConcurrentComplete: replicas reporting the same proven stop at once
// complete it once.
func testConcurrentComplete(e *env) {
	m, c, l := e.poolLease()
	rec, err := e.release(l, lease.Destroyed)
	e.wantOK(err, "Release")
	parallel(8, func(int) {
		if _, err := e.completeStop(*rec.Member, true, ""); err != nil {
			e.t.Errorf("concurrent CompleteStop: %v", err)
		}
	})
	got := e.member(m.CellID)
	if got.State != lease.MemberDestroyed || !got.ProviderAbsent || got.Attempts != 1 {
		e.t.Errorf("member after concurrent completions = %s, want destroyed with provider absent after 1 attempt", showMember(got))
	}
	e.wantCell(e.cell(poolWorker(poolA), c.ID), withState(leasedCell(c, l), lease.Destroyed), "cell after concurrent completions")
}

// testConcurrentIdempotency: of identical requests racing on one key,
// exactly one records the in-flight entry and the others see it.
func testConcurrentIdempotency(e *env) {
	recs := make([]store.IdempotencyRecord, 16)
	parallel(16, func(i int) {
		rec, err := e.s.BeginIdempotent(e.ctx, store.IdempotencyParams{TenantID: tenantA, Key: "key-1",
			Fingerprint: fmt.Sprintf("fp-%d", i), Now: e.now, InFlightUntil: e.now.Add(time.Minute)})
		if err != nil {
			e.t.Errorf("BeginIdempotent: %v", err)
		}
		recs[i] = rec
	})
	created := -1
	for i, r := range recs {
		if r.Created {
			if created >= 0 {
				e.t.Errorf("requests %d and %d both created the entry", created, i)
			}
			created = i
		}
	}
	if created < 0 {
		e.t.Fatal("no request created the entry")
	}
	for i, r := range recs {
		if r.Fingerprint != fmt.Sprintf("fp-%d", created) || r.Done {
			e.t.Errorf("request %d saw %+v, want the in-flight entry of request %d", i, r, created)
		}
	}
}

// outcome is one concurrent claim's result.
type outcome struct {
	p   store.ClaimParams
	res store.ClaimResult
	err error
}

// claimAll runs the claims concurrently, released together.
func (e *env) claimAll(ps []store.ClaimParams) []outcome {
	out := make([]outcome, len(ps))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Go(func() {
			<-start
			res, err := e.s.Claim(e.ctx, p)
			out[i] = outcome{p, res, err}
		})
	}
	close(start)
	wg.Wait()
	return out
}

func testConcurrentUnfenced(e *env) {
	cells := map[uuid.UUID]bool{}
	for range 10 {
		cells[e.prepare().ID] = true
	}
	ps := make([]store.ClaimParams, 32)
	for i := range ps {
		ps[i] = e.claimParams()
	}
	leasedCells := map[uuid.UUID]bool{}
	leaseIDs := map[uuid.UUID]bool{}
	empty := 0
	for _, o := range e.claimAll(ps) {
		switch {
		case o.err != nil:
			e.t.Errorf("concurrent unfenced Claim: %v", o.err)
		case o.res.Lease == nil:
			empty++
		default:
			l := o.res.Lease
			if l.ID != o.p.LeaseID {
				e.t.Errorf("lease ID %s, want the claim's %s", l.ID, o.p.LeaseID)
			}
			if !cells[l.CellID] || leasedCells[l.CellID] || leaseIDs[l.ID] {
				e.t.Errorf("lease %s of cell %s: unknown or repeated", l.ID, l.CellID)
			}
			leasedCells[l.CellID], leaseIDs[l.ID] = true, true
			e.wantLease(e.record(l.ID).Cell.Lease, *l, "stored lease")
		}
	}
	if len(leasedCells) != 10 || len(leaseIDs) != 10 || empty != 22 {
		e.t.Errorf("32 claims on 10 cells: %d cells leased under %d lease IDs, %d empty; want 10, 10, 22",
			len(leasedCells), len(leaseIDs), empty)
	}
	e.wantCellCounts(map[lease.State]int{lease.Leased: 10})
}

func testConcurrentIdentical(e *env) {
	for range 3 {
		e.prepare()
	}
	claimID := newID()
	ps := make([]store.ClaimParams, 16)
	for i := range ps {
		// Identical requests; each server attempt brings its own lease ID.
		ps[i] = e.claimParams(fenced(claimID))
	}
	var first *lease.Lease
	created := 0
	for _, o := range e.claimAll(ps) {
		if o.err != nil {
			e.t.Errorf("identical fenced Claim: %v", o.err)
			continue
		}
		if o.res.Lease == nil {
			e.t.Error("identical fenced Claim leased nothing")
			continue
		}
		if !o.res.Replayed {
			created++
		}
		if first == nil {
			first = o.res.Lease
		}
		e.wantLease(o.res.Lease, *first, "identical fenced Claim")
	}
	if created != 1 {
		e.t.Errorf("%d identical fenced claims were not replays, want exactly 1", created)
	}
	e.wantCellCounts(map[lease.State]int{lease.Ready: 2, lease.Leased: 1})
}

// testConcurrentDigestRace runs 8 claims of side a and 8 of side b, all with
// one claim ID: the side that records the fence first wins and all its
// claims return one lease; every claim of the other side conflicts.
func testConcurrentDigestRace(e *env, a, b []func(*store.ClaimParams)) {
	e.prepare()
	e.prepare()
	claimID := newID()
	var ps []store.ClaimParams
	for i := range 16 {
		side := a
		if i%2 == 1 {
			side = b
		}
		ps = append(ps, e.claimParams(append([]func(*store.ClaimParams){fenced(claimID)}, side...)...))
	}
	wins := map[string][]*lease.Lease{}
	conflicts := map[string]int{}
	for _, o := range e.claimAll(ps) {
		switch {
		case errors.Is(o.err, errcode.ErrConflict):
			conflicts[o.p.Digest]++
		case o.err != nil:
			e.t.Errorf("fenced Claim: %v", o.err)
		default:
			wins[o.p.Digest] = append(wins[o.p.Digest], o.res.Lease)
		}
	}
	if len(wins) != 1 {
		e.t.Fatalf("digests that won: %d, want 1 (wins %v, conflicts %v)", len(wins), wins, conflicts)
	}
	for digest, ls := range wins {
		if len(ls) != 8 || conflicts[digest] != 0 || sum(conflicts) != 8 {
			e.t.Errorf("winning side: %d results, %d conflicts; losing side: %d conflicts; want 8, 0, 8",
				len(ls), conflicts[digest], sum(conflicts)-conflicts[digest])
		}
		for _, l := range ls {
			if l == nil {
				e.t.Error("the winning side got an empty result with inventory available")
				continue
			}
			e.wantLease(l, *ls[0], "winning side lease")
		}
	}
	counts, err := e.s.CellCounts(e.ctx)
	e.wantOK(err, "CellCounts")
	if counts[lease.Leased] != 1 {
		e.t.Errorf("CellCounts = %v, want exactly one cell leased", counts)
	}
}

func testConcurrentLosers(e *env) {
	e.prepare()
	ps := make([]store.ClaimParams, 8)
	for i := range ps {
		ps[i] = e.claimParams(fenced(newID()))
	}
	out := e.claimAll(ps)
	var winner *outcome
	var losers []outcome
	for i, o := range out {
		switch {
		case o.err != nil:
			e.t.Errorf("fenced Claim: %v", o.err)
		case o.res.Lease != nil:
			if winner != nil {
				e.t.Errorf("two claims leased the only cell: %s and %s", winner.res.Lease.ID, o.res.Lease.ID)
			}
			winner = &out[i]
		default:
			losers = append(losers, o)
		}
	}
	if winner == nil || len(losers) != 7 {
		e.t.Fatalf("8 claims for one cell: winner %v, %d empty; want one winner and 7 empty", winner != nil, len(losers))
	}
	// New inventory does not change a loser's outcome.
	for range 3 {
		e.prepare()
	}
	for _, o := range losers {
		res, err := e.s.Claim(e.ctx, o.p)
		e.wantOK(err, "loser retry")
		if res.Lease != nil || !res.Replayed {
			e.t.Errorf("retry of a losing fenced claim = %+v, want a replayed empty result", res)
		}
	}
	res, err := e.s.Claim(e.ctx, winner.p)
	e.wantOK(err, "winner retry")
	e.wantLease(res.Lease, *winner.res.Lease, "winner retry")
	e.wantCellCounts(map[lease.State]int{lease.Ready: 3, lease.Leased: 1})
}

func testConcurrentFloor(e *env) {
	for range 5 {
		e.poolCell(poolA)
	}
	ps := make([]store.ClaimParams, 16)
	for i := range ps {
		if i%2 == 0 {
			ps[i] = e.claimParams(floors(map[string]int{poolA: 2}))
		} else {
			ps[i] = e.claimParams(floors(map[string]int{poolA: 2}), fenced(newID()))
		}
	}
	n := 0
	for _, o := range e.claimAll(ps) {
		switch {
		case o.err != nil:
			e.t.Errorf("Claim: %v", o.err)
		case o.res.Lease != nil:
			n++
		}
	}
	if n != 3 {
		e.t.Errorf("16 claims on 5 ready members with floor 2 leased %d, want 3", n)
	}
	if mc := e.memberCounts(); mc[poolA][lease.MemberReady] != 2 || mc[poolA][lease.MemberLeased] != 3 {
		e.t.Errorf("MemberCounts = %v, want 2 ready and 3 leased", mc)
	}
}

func testConcurrentStops(e *env) {
	var members []store.Member
	for range 8 {
		m, _ := e.poolCell(poolA)
		members = append(members, m)
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	leases := map[uuid.UUID]lease.Lease{} // by cell
	for i := range 8 {
		p := e.claimParams()
		wg.Go(func() {
			<-start
			res, err := e.s.Claim(e.ctx, p)
			if err != nil {
				e.t.Errorf("Claim: %v", err)
				return
			}
			if res.Lease != nil {
				mu.Lock()
				leases[res.Lease.CellID] = *res.Lease
				mu.Unlock()
			}
		})
		id := members[i].CellID
		wg.Go(func() {
			<-start
			_, err := e.s.BeginStop(e.ctx, store.StopIntent{CellID: id, From: []lease.MemberState{lease.MemberReady},
				Disposition: lease.Quarantined, Reason: "ready ttl", Now: e.now})
			if err != nil && !errors.Is(err, errcode.ErrConflict) {
				e.t.Errorf("BeginStop: %v", err)
			}
		})
	}
	close(start)
	wg.Wait()
	for _, m := range members {
		got := e.member(m.CellID)
		c := e.cell(poolWorker(poolA), m.CellID)
		l, leased := leases[m.CellID]
		switch {
		case leased && got.State == lease.MemberLeased && c.State == lease.Leased:
			e.wantLease(c.Lease, l, "leased cell")
		case !leased && got.State == lease.MemberStopping && c.State == lease.Quarantined && c.Lease == nil &&
			got.StopGeneration == 1 && got.StopLeaseID == uuid.Nil:
		default:
			e.t.Errorf("member %s is %s (stop fence %s/%d), cell %s, claimed %v: want leased/leased/claimed or stopping/quarantined/unclaimed",
				m.CellID, got.State, got.StopLeaseID, got.StopGeneration, c.State, leased)
		}
	}
}
