package storetest

import (
	"reflect"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

var memberScenarios = []scenario{
	{"Members/CreateAndAdmit", testMemberCreateAdmit},
	{"Members/CreateDuplicate", testMemberDuplicate},
	{"Members/ListAndCounts", testMemberList},
	{"Members/AdmitNotProvisioning", testAdmitNotProvisioning},
	{"Members/ReusedIDs", testAdmitReused},
	{"Members/NotFound", testMemberNotFound},
}

func testMemberCreateAdmit(e *env) {
	p := store.CreateMemberParams{CellID: newID(), Pool: poolA, TenantID: tenantA, Now: e.now}
	m, err := e.s.CreateMember(e.ctx, p)
	e.wantOK(err, "CreateMember")
	want := store.Member{CellID: p.CellID, Pool: poolA, TenantID: tenantA, State: lease.MemberProvisioning,
		CreatedAt: e.now, UpdatedAt: e.now}
	e.wantMember(m, want, "CreateMember result")
	e.wantMemberCell(m, nil, "CreateMember result")
	e.wantMember(e.member(p.CellID), want, "Member after CreateMember")
	e.wantCellCounts(nil)

	e.advance(time.Second)
	ap := e.admitParams(m)
	ap.ProviderCellID = "pod-" + m.CellID.String()
	c, err := e.s.AdmitMember(e.ctx, ap)
	e.wantOK(err, "AdmitMember")
	wantCell := lease.Cell{
		ID:             m.CellID,
		TenantID:       tenantA,
		WorkerID:       poolWorker(poolA),
		PoolName:       poolA,
		ProviderCellID: ap.ProviderCellID,
		State:          lease.Ready,
		Generation:     lease.GenerationReady,
		Release:        e.kata,
		ExpiresAt:      ap.ReadyDeadline,
		CreatedAt:      e.now,
	}
	e.wantCell(c, wantCell, "AdmitMember result")
	e.wantCell(e.cell(poolWorker(poolA), m.CellID), wantCell, "WorkerCell after AdmitMember")
	want.State, want.Identity, want.UpdatedAt = lease.MemberReady, ap.Identity, e.now
	e.wantMember(e.member(m.CellID), want, "Member after AdmitMember")
	ms, err := e.s.Members(e.ctx, poolA)
	e.wantOK(err, "Members")
	if len(ms) != 1 {
		e.t.Fatalf("Members = %+v, want one", ms)
	}
	e.wantMember(ms[0], want, "Members after AdmitMember")
	e.wantMemberCell(ms[0], &wantCell, "Members after AdmitMember")
	e.wantCellCounts(map[lease.State]int{lease.Ready: 1})
	if mc := dropZero(e.memberCounts()); !reflect.DeepEqual(mc, map[string]map[lease.MemberState]int{poolA: {lease.MemberReady: 1}}) {
		e.t.Errorf("MemberCounts = %v, want %s: ready 1", mc, poolA)
	}
	// The admitted cell is inventory.
	res := e.claim()
	if res.Lease == nil || res.Lease.CellID != m.CellID || res.PoolName != poolA {
		e.t.Errorf("claim after AdmitMember = %+v, want the member's cell", res)
	}
}

func testMemberDuplicate(e *env) {
	m := e.createMember(poolA)
	before := e.snapshot()
	for _, pool := range []string{poolA, poolB} {
		_, err := e.s.CreateMember(e.ctx, store.CreateMemberParams{CellID: m.CellID, Pool: pool, TenantID: tenantB, Now: e.now})
		e.wantErr(err, errcode.ErrConflict, "CreateMember with a reused cell ID")
	}
	e.unchanged(before, "CreateMember with a reused cell ID")
	// Also once admitted and stopped.
	_, err := e.s.AdmitMember(e.ctx, e.admitParams(m))
	e.wantOK(err, "AdmitMember")
	_, err = e.s.BeginStop(e.ctx, store.StopIntent{CellID: m.CellID, From: []lease.MemberState{lease.MemberReady},
		Disposition: lease.Destroyed, Now: e.now})
	e.wantOK(err, "BeginStop")
	before = e.snapshot()
	_, err = e.s.CreateMember(e.ctx, store.CreateMemberParams{CellID: m.CellID, Pool: poolA, TenantID: tenantA, Now: e.now})
	e.wantErr(err, errcode.ErrConflict, "CreateMember with the cell ID of a stopping member")
	e.unchanged(before, "CreateMember with a reused cell ID")
}

func testMemberList(e *env) {
	id := func(n byte) uuid.UUID {
		u := uuid.MustParse("01890a5d-ac96-774b-bcce-000000000000")
		u[15] = n
		return u
	}
	create := func(cell uuid.UUID, pool string, d time.Duration) store.Member {
		m, err := e.s.CreateMember(e.ctx, store.CreateMemberParams{CellID: cell, Pool: pool, TenantID: tenantA, Now: base.Add(d)})
		e.wantOK(err, "CreateMember")
		return m
	}
	m1 := create(id(9), poolA, 0)
	m2 := create(id(8), poolA, time.Second)
	m3 := create(id(7), poolA, 2*time.Second)
	m4 := create(id(6), poolA, 2*time.Second) // same time as m3, lower ID
	mb := create(id(1), poolB, 3*time.Second)
	e.advance(5 * time.Second)
	_, err := e.s.AdmitMember(e.ctx, e.admitParams(m2))
	e.wantOK(err, "AdmitMember")
	_, err = e.s.BeginStop(e.ctx, store.StopIntent{CellID: m3.CellID, From: []lease.MemberState{lease.MemberProvisioning},
		Disposition: lease.Quarantined, Now: e.now})
	e.wantOK(err, "BeginStop")

	ids := func(ms []store.Member) []uuid.UUID {
		out := []uuid.UUID{}
		for _, m := range ms {
			out = append(out, m.CellID)
		}
		return out
	}
	for _, tc := range []struct {
		pool   string
		states []lease.MemberState
		want   []store.Member
	}{
		{poolA, nil, []store.Member{m1, m2, m4, m3}},
		{poolA, []lease.MemberState{lease.MemberReady}, []store.Member{m2}},
		{poolA, []lease.MemberState{lease.MemberProvisioning, lease.MemberStopping}, []store.Member{m1, m4, m3}},
		{poolA, []lease.MemberState{lease.MemberStopping, lease.MemberProvisioning}, []store.Member{m1, m4, m3}},
		{poolA, []lease.MemberState{lease.MemberLeased, lease.MemberCleanupPending, lease.MemberDestroyed}, nil},
		{poolA, lease.MemberStates, []store.Member{m1, m2, m4, m3}},
		{poolB, nil, []store.Member{mb}},
		{"pool-none", nil, nil},
	} {
		got, err := e.s.Members(e.ctx, tc.pool, tc.states...)
		e.wantOK(err, "Members")
		if !reflect.DeepEqual(ids(got), ids(tc.want)) {
			e.t.Errorf("Members(%s, %v) = %v, want %v", tc.pool, tc.states, ids(got), ids(tc.want))
			continue
		}
		for i, m := range got {
			want := e.member(tc.want[i].CellID)
			e.wantMember(m, want, "Members entry")
			e.wantMemberCell(m, want.Cell, "Members entry")
		}
	}
	wantCounts := map[string]map[lease.MemberState]int{
		poolA: {lease.MemberProvisioning: 2, lease.MemberReady: 1, lease.MemberStopping: 1},
		poolB: {lease.MemberProvisioning: 1},
	}
	if mc := dropZero(e.memberCounts()); !reflect.DeepEqual(mc, wantCounts) {
		e.t.Errorf("MemberCounts = %v, want %v", mc, wantCounts)
	}
	e.wantCellCounts(map[lease.State]int{lease.Ready: 1})
}

func testAdmitNotProvisioning(e *env) {
	admitted, _ := e.poolCell(poolA)
	stopping := e.createMember(poolA)
	_, err := e.s.BeginStop(e.ctx, store.StopIntent{CellID: stopping.CellID,
		From: []lease.MemberState{lease.MemberProvisioning}, Disposition: lease.Quarantined, Now: e.now})
	e.wantOK(err, "BeginStop")
	otherPool := e.createMember(poolA)
	e.advance(time.Second)

	before := e.snapshot()
	for name, p := range map[string]store.AdmitParams{
		"ready member":           e.admitParams(admitted),
		"ready member, new ID":   func() store.AdmitParams { p := e.admitParams(admitted); p.ProviderCellID = "other"; return p }(),
		"stopping member":        e.admitParams(stopping),
		"member of another pool": func() store.AdmitParams { p := e.admitParams(otherPool); p.Pool = poolB; return p }(),
		"member of another pool 2": func() store.AdmitParams {
			p := e.admitParams(otherPool)
			p.Pool, p.WorkerID = poolB, poolWorker(poolB)
			return p
		}(),
	} {
		_, err := e.s.AdmitMember(e.ctx, p)
		e.wantErr(err, errcode.ErrConflict, "AdmitMember of a "+name)
	}
	e.unchanged(before, "refused AdmitMember")
	e.wantCellCounts(map[lease.State]int{lease.Ready: 1})
}

func testAdmitReused(e *env) {
	// The provider cell ID of an admitted cell is registered once per pool.
	_, fc := e.poolCell(poolA)
	m := e.createMember(poolA)
	before := e.snapshot()
	p := e.admitParams(m)
	p.ProviderCellID = fc.ProviderCellID
	_, err := e.s.AdmitMember(e.ctx, p)
	e.wantErr(err, errcode.ErrConflict, "AdmitMember with a reused provider cell ID")
	e.unchanged(before, "AdmitMember with a reused provider cell ID")

	// A cell ID shared by a membership and another worker's prepared cell,
	// in either order: if the store lets both exist, the membership never
	// takes the prepared cell for its own.
	for _, memberFirst := range []bool{true, false} {
		id := newID()
		var pc lease.Cell
		var err error
		prepare := func() {
			pc, err = e.s.Prepare(e.ctx, e.prepareParams(func(p *store.PrepareParams) { p.CellID, p.Release = id, e.gvis }))
		}
		create := func() {
			_, err = e.s.CreateMember(e.ctx, store.CreateMemberParams{CellID: id, Pool: poolA, TenantID: tenantA, Now: e.now})
		}
		first, second, what := create, prepare, "Prepare with the cell ID of a provisioning member"
		if !memberFirst {
			first, second, what = prepare, create, "CreateMember with the cell ID of a prepared cell"
		}
		first()
		e.wantOK(err, "first of CreateMember and Prepare")
		second()
		if err != nil {
			e.wantErr(err, errcode.ErrConflict, what)
			continue
		}
		if !memberFirst {
			pc = e.cell(workerA, id)
		}
		before := e.snapshot() // also checks Member(id).Cell
		_, err = e.s.AdmitMember(e.ctx, e.admitParams(e.member(id)))
		e.wantErr(err, errcode.ErrConflict, "AdmitMember of a cell ID taken by a prepared cell")
		e.unchanged(before, "AdmitMember of a cell ID taken by a prepared cell")

		// Stopping the membership must not touch the other worker's cell.
		stop, err := e.beginStop(id, lease.Destroyed, lease.MemberProvisioning)
		e.wantOK(err, "BeginStop of the member")
		if stop.StopGeneration != 0 || stop.StopLeaseID != uuid.Nil {
			e.t.Errorf("stop of a member without cell recorded fence (%s, %d), want (nil, 0)", stop.StopLeaseID, stop.StopGeneration)
		}
		_, err = e.completeStop(stop, true, "")
		e.wantOK(err, "CompleteStop of the member")
		e.wantCell(e.cell(workerA, id), pc, "prepared cell after the member with its ID stopped")
	}
}

func testMemberNotFound(e *env) {
	e.poolCell(poolA)
	before := e.snapshot()
	unknown := newID()
	_, err := e.s.Member(e.ctx, unknown)
	e.wantErr(err, errcode.ErrNotFound, "Member of an unknown cell")
	_, err = e.s.AdmitMember(e.ctx, e.admitParams(store.Member{CellID: unknown, Pool: poolA}))
	e.wantErr(err, errcode.ErrNotFound, "AdmitMember of an unknown member")
	_, err = e.s.BeginStop(e.ctx, store.StopIntent{CellID: unknown, From: lease.MemberStates, Disposition: lease.Quarantined, Now: e.now})
	e.wantErr(err, errcode.ErrNotFound, "BeginStop of an unknown member")
	_, err = e.s.CompleteStop(e.ctx, store.StopOutcome{CellID: unknown, Disposition: lease.Quarantined, Proven: true, Now: e.now})
	e.wantErr(err, errcode.ErrNotFound, "CompleteStop of an unknown member")
	e.unchanged(before, "operations on unknown members")
	// A prepared cell has no membership.
	c := e.prepare()
	before = e.snapshot()
	_, err = e.s.Member(e.ctx, c.ID)
	e.wantErr(err, errcode.ErrNotFound, "Member of a prepared cell")
	_, err = e.s.BeginStop(e.ctx, store.StopIntent{CellID: c.ID, From: lease.MemberStates, Disposition: lease.Quarantined, Now: e.now})
	e.wantErr(err, errcode.ErrNotFound, "BeginStop of a prepared cell")
	e.unchanged(before, "member operations on a prepared cell")
	ok, err := e.s.LockMember(e.ctx, unknown, "owner", e.now.Add(time.Minute), e.now)
	if ok || err != nil {
		e.t.Errorf("LockMember of an unknown member = %v, %v; want false, nil", ok, err)
	}
}
