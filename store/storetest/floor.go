package storetest

import (
	"time"

	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

var floorScenarios = []scenario{
	{"ReadyFloor/HoldsPoolMembers", testFloorHolds},
	{"ReadyFloor/PreparedCellsNotHeldBack", testFloorPrepared},
	{"ReadyFloor/OtherPoolsUnaffected", testFloorOtherPool},
	{"ReadyFloor/NoFloor", testFloorNone},
}

func testFloorHolds(e *env) {
	m1, c1 := e.poolCell(poolA)
	m2, _ := e.poolCell(poolA)
	f := floors(map[string]int{poolA: 1})
	res := e.claim(f)
	if res.Lease == nil || res.Lease.CellID != c1.ID || res.PoolName != poolA {
		e.t.Fatalf("claim with 2 ready members and floor 1 = %+v, want cell %s of %s", res, c1.ID, poolA)
	}
	// The membership mirrors the claim.
	got := e.member(m1.CellID)
	want := m1
	want.State, want.UpdatedAt = lease.MemberLeased, e.now
	e.wantMember(got, want, "member after claim")
	rec := e.record(res.Lease.ID)
	if rec.Member == nil {
		e.t.Error("Lease of a pool cell has no member")
	} else {
		e.wantMember(*rec.Member, want, "Lease member")
	}
	if rec.Cell.PoolName != poolA || rec.Cell.WorkerID != poolWorker(poolA) {
		e.t.Errorf("leased pool cell = %s", showCell(rec.Cell))
	}

	before := e.snapshot()
	e.mustEmpty(f)
	e.mustEmpty(f, fenced(newID()))
	e.unchanged(before, "claims held by the ready floor")
	if got := e.member(m2.CellID).State; got != lease.MemberReady {
		e.t.Errorf("member at the floor = %s, want ready", got)
	}
	// Another ready member lifts the pool above its floor again.
	e.advance(time.Second)
	e.poolCell(poolA)
	if l := e.mustLease(f); l.CellID != m2.CellID {
		e.t.Errorf("claim above the floor leased %s, want the oldest member %s", l.CellID, m2.CellID)
	}
	e.mustEmpty(f)
}

func testFloorPrepared(e *env) {
	// The pool's member is older than the prepared cell: it is skipped,
	// not allowed to hide the prepared cell.
	m, _ := e.poolCell(poolA)
	e.advance(time.Second)
	c := e.prepare()
	f := floors(map[string]int{poolA: 1})
	res := e.claim(f)
	if res.Lease == nil || res.Lease.CellID != c.ID || res.PoolName != "" {
		e.t.Fatalf("claim with the pool at its floor = %+v, want the prepared cell %s", res, c.ID)
	}
	e.mustEmpty(f)
	if got := e.member(m.CellID).State; got != lease.MemberReady {
		e.t.Errorf("member at the floor = %s, want ready", got)
	}
	// Without the floor the member is claimable.
	if l := e.mustLease(); l.CellID != m.CellID {
		e.t.Errorf("claim without floor leased %s, want %s", l.CellID, m.CellID)
	}
}

func testFloorOtherPool(e *env) {
	e.poolCell(poolA)
	b1, _ := e.poolCell(poolB)
	b2, _ := e.poolCell(poolB)
	f := floors(map[string]int{poolA: 5})
	for _, want := range []store.Member{b1, b2} {
		res := e.claim(f)
		if res.Lease == nil || res.Lease.CellID != want.CellID || res.PoolName != poolB {
			e.t.Fatalf("claim = %+v, want cell %s of %s", res, want.CellID, poolB)
		}
	}
	e.mustEmpty(f)
}

func testFloorNone(e *env) {
	e.poolCell(poolA)
	e.poolCell(poolA)
	e.mustLease(floors(map[string]int{poolA: 0}))
	e.mustLease()
	e.mustEmpty()
	if mc := e.memberCounts(); mc[poolA][lease.MemberLeased] != 2 {
		e.t.Errorf("MemberCounts = %v, want 2 leased in %s", mc, poolA)
	}
}

func (e *env) memberCounts() map[string]map[lease.MemberState]int {
	e.t.Helper()
	mc, err := e.s.MemberCounts(e.ctx)
	e.wantOK(err, "MemberCounts")
	return mc
}
