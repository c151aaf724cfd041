package storetest

import (
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

var basicScenarios = []scenario{
	{"Ping", func(e *env) {
		e.wantOK(e.s.Ping(e.ctx), "Ping on a fresh store")
		e.wantCellCounts(nil)
		mc, err := e.s.MemberCounts(e.ctx)
		e.wantOK(err, "MemberCounts")
		if len(dropZero(mc)) != 0 {
			e.t.Errorf("MemberCounts of a fresh store = %v, want none", mc)
		}
	}},
	{"Prepare/ReturnsReadyCell", testPrepareReady},
	{"Prepare/ReusedCellID", testPrepareReusedCellID},
	{"Prepare/ReusedProviderCellID", testPrepareReusedProviderCellID},
	{"WorkerCell/NotFound", testWorkerCellNotFound},
	{"WorkerCell/ClaimInfo", testWorkerCellClaimInfo},
}

func testPrepareReady(e *env) {
	p := e.prepareParams(func(p *store.PrepareParams) { p.Release = e.gvis })
	got, err := e.s.Prepare(e.ctx, p)
	e.wantOK(err, "Prepare")
	want := lease.Cell{
		ID:             p.CellID,
		TenantID:       tenantA,
		WorkerID:       workerA,
		ProviderCellID: p.ProviderCellID,
		State:          lease.Ready,
		Generation:     lease.GenerationReady,
		Release:        e.gvis,
		ExpiresAt:      p.ExpiresAt,
		CreatedAt:      e.now,
	}
	e.wantCell(got, want, "Prepare result")
	c, info, err := e.s.WorkerCell(e.ctx, workerA, p.CellID)
	e.wantOK(err, "WorkerCell")
	e.wantCell(c, want, "WorkerCell after Prepare")
	if info != nil {
		e.t.Errorf("WorkerCell claim of a ready cell = %+v, want nil", *info)
	}
	if d := c.Disposition(); d != "" {
		e.t.Errorf("disposition of a ready cell = %q, want none", d)
	}
	e.wantCellCounts(map[lease.State]int{lease.Ready: 1})
}

func testPrepareReusedCellID(e *env) {
	destroyed := e.prepare()
	l := e.mustLease()
	_, err := e.s.Destroy(e.ctx, store.DestroyParams{WorkerID: workerA, CellID: destroyed.ID, LeaseID: l.ID,
		Generation: 2, Disposition: lease.Destroyed, Now: e.now})
	e.wantOK(err, "Destroy")
	retired := e.prepare()
	_, err = e.s.Retire(e.ctx, store.RetireParams{WorkerID: workerA, CellID: retired.ID, Generation: 1, Now: e.now})
	e.wantOK(err, "Retire")
	_, pooled := e.poolCell(poolA)
	live := e.prepare()

	before := e.snapshot()
	for _, tc := range []struct {
		name   string
		id     uuid.UUID
		tenant string
		worker string
	}{
		{"same tenant and worker", live.ID, tenantA, workerA},
		{"other worker", live.ID, tenantA, workerB},
		{"other tenant", live.ID, tenantB, workerB},
		{"quarantined cell", retired.ID, tenantA, workerA},
		{"destroyed cell", destroyed.ID, tenantB, workerB},
		{"pool cell", pooled.ID, tenantA, workerA},
	} {
		p := e.prepareParams(func(p *store.PrepareParams) {
			p.CellID, p.TenantID, p.WorkerID = tc.id, tc.tenant, tc.worker
		})
		_, err := e.s.Prepare(e.ctx, p)
		e.wantErr(err, errcode.ErrConflict, "Prepare with the cell ID of a "+tc.name)
	}
	e.unchanged(before, "Prepare with a reused cell ID")
}

func testPrepareReusedProviderCellID(e *env) {
	first := e.prepare()
	before := e.snapshot()
	_, err := e.s.Prepare(e.ctx, e.prepareParams(func(p *store.PrepareParams) { p.ProviderCellID = first.ProviderCellID }))
	e.wantErr(err, errcode.ErrConflict, "Prepare with a reused (worker, provider_cell_id)")
	_, err = e.s.Prepare(e.ctx, e.prepareParams(func(p *store.PrepareParams) {
		p.ProviderCellID, p.TenantID = first.ProviderCellID, tenantB
	}))
	e.wantErr(err, errcode.ErrConflict, "Prepare with a reused (worker, provider_cell_id) for another tenant")
	e.unchanged(before, "Prepare with a reused provider cell ID")

	// Terminal cells keep their provider object registered.
	_, err = e.s.Retire(e.ctx, store.RetireParams{WorkerID: workerA, CellID: first.ID, Generation: 1, Now: e.now})
	e.wantOK(err, "Retire")
	_, err = e.s.Prepare(e.ctx, e.prepareParams(func(p *store.PrepareParams) { p.ProviderCellID = first.ProviderCellID }))
	e.wantErr(err, errcode.ErrConflict, "Prepare with the provider_cell_id of a quarantined cell")

	// Another worker may use the same provider cell ID.
	other := e.prepare(func(p *store.PrepareParams) { p.WorkerID, p.ProviderCellID = workerB, first.ProviderCellID })
	if other.ProviderCellID != first.ProviderCellID || other.WorkerID != workerB {
		e.t.Errorf("Prepare for another worker = %s", showCell(other))
	}
	e.wantCellCounts(map[lease.State]int{lease.Ready: 1, lease.Quarantined: 1})
}

func testWorkerCellNotFound(e *env) {
	c := e.prepare()
	_, info, err := e.s.WorkerCell(e.ctx, workerB, c.ID)
	e.wantErr(err, errcode.ErrNotFound, "WorkerCell of another worker's cell")
	if info != nil {
		e.t.Errorf("WorkerCell of another worker's cell returned claim %+v", *info)
	}
	_, _, err = e.s.WorkerCell(e.ctx, workerA, newID())
	e.wantErr(err, errcode.ErrNotFound, "WorkerCell of an unknown cell")
	_, _, err = e.s.WorkerCell(e.ctx, workerA, uuid.Nil)
	e.wantErr(err, errcode.ErrNotFound, "WorkerCell of the nil cell ID")
}

func testWorkerCellClaimInfo(e *env) {
	fencedCell := e.prepare()
	claimID := newID()
	fl := e.mustLease(fenced(claimID))
	unfencedCell := e.prepare()
	e.advance(time.Second)
	ul := e.mustLease(leaseSeconds(30))

	for _, tc := range []struct {
		name string
		cell lease.Cell
		l    lease.Lease
		want store.ClaimInfo
	}{
		{"fenced", fencedCell, fl, store.ClaimInfo{ClaimID: claimID, LeaseID: fl.ID, Generation: 2, ExpiresAt: base.Add(120 * time.Second)}},
		{"unfenced", unfencedCell, ul, store.ClaimInfo{LeaseID: ul.ID, Generation: 2, ExpiresAt: base.Add(31 * time.Second)}},
	} {
		c, info, err := e.s.WorkerCell(e.ctx, workerA, tc.cell.ID)
		e.wantOK(err, "WorkerCell")
		e.wantCell(c, leasedCell(tc.cell, tc.l), "WorkerCell of a "+tc.name+" leased cell")
		if info == nil {
			e.t.Errorf("WorkerCell of a %s leased cell: no claim", tc.name)
			continue
		}
		got := *info
		got.ExpiresAt = nt(got.ExpiresAt)
		if got != tc.want {
			e.t.Errorf("WorkerCell claim of a %s leased cell = %+v, want %+v", tc.name, *info, tc.want)
		}
	}
}
