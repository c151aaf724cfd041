package storetest

import (
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

var workerScenarios = []scenario{
	{"Retire/Ready", testRetireReady},
	{"Retire/Conflicts", testRetireConflicts},
	{"Retire/OtherWorker", testRetireOtherWorker},
	{"Destroy/Leased", testDestroyLeased},
	{"Destroy/TerminalReplay", testDestroyReplay},
	{"Destroy/TerminalMismatch", testDestroyTerminalMismatch},
	{"Destroy/WrongFenceQuarantines", testDestroyWrongFence},
	{"Destroy/ReadyCellQuarantines", testDestroyReady},
	{"Destroy/PoolCell", testDestroyPool},
	{"Destroy/OtherWorker", testDestroyOtherWorker},
}

func (e *env) retire(worker string, id uuid.UUID, gen uint64) (lease.Cell, error) {
	return e.s.Retire(e.ctx, store.RetireParams{WorkerID: worker, CellID: id, Generation: gen, Now: e.now})
}

func (e *env) destroy(id, leaseID uuid.UUID, gen uint64, d lease.Disposition) (lease.Cell, error) {
	return e.s.Destroy(e.ctx, store.DestroyParams{WorkerID: workerA, CellID: id, LeaseID: leaseID,
		Generation: gen, Disposition: d, Now: e.now})
}

func testRetireReady(e *env) {
	c := e.prepare()
	e.advance(time.Second)
	got, err := e.retire(workerA, c.ID, 1)
	e.wantOK(err, "Retire")
	want := withState(c, lease.Quarantined)
	e.wantCell(got, want, "Retire result")
	e.wantCell(e.cell(workerA, c.ID), want, "cell after Retire")
	if d := got.Disposition(); d != lease.Quarantined {
		e.t.Errorf("disposition after Retire = %q, want quarantined", d)
	}
	e.mustEmpty()

	before := e.snapshot()
	e.advance(time.Second)
	again, err := e.retire(workerA, c.ID, 1)
	e.wantOK(err, "exact Retire repeat")
	e.wantCell(again, want, "repeated Retire result")
	e.unchanged(before, "exact Retire repeat")
}

func testRetireConflicts(e *env) {
	ready := e.prepare()
	e.advance(time.Second)
	lc := e.prepare(func(p *store.PrepareParams) { p.Release = e.gvis })
	ll := e.mustLease(withRelease(e.gvis))
	dc := e.prepare(func(p *store.PrepareParams) { p.Release = e.gvis })
	dl := e.mustLease(withRelease(e.gvis))
	_, err := e.destroy(dc.ID, dl.ID, 2, lease.Destroyed)
	e.wantOK(err, "Destroy")
	if ll.CellID != lc.ID || dl.CellID != dc.ID {
		e.t.Fatalf("leased %s and %s, want %s and %s", ll.CellID, dl.CellID, lc.ID, dc.ID)
	}

	before := e.snapshot()
	for name, tc := range map[string]struct {
		id  uuid.UUID
		gen uint64
	}{
		"ready cell, generation 0":  {ready.ID, 0},
		"ready cell, generation 2":  {ready.ID, 2},
		"leased cell, generation 1": {lc.ID, 1},
		"leased cell, generation 2": {lc.ID, 2},
		"destroyed cell, gen 1":     {dc.ID, 1},
		"destroyed cell, gen 2":     {dc.ID, 2},
	} {
		_, err := e.retire(workerA, tc.id, tc.gen)
		e.wantErr(err, errcode.ErrConflict, "Retire of a "+name)
	}
	e.unchanged(before, "refused Retire")
}

func testRetireOtherWorker(e *env) {
	c := e.prepare()
	before := e.snapshot()
	_, err := e.retire(workerB, c.ID, 1)
	e.wantErr(err, errcode.ErrNotFound, "Retire of another worker's cell")
	_, err = e.retire(workerA, newID(), 1)
	e.wantErr(err, errcode.ErrNotFound, "Retire of an unknown cell")
	e.unchanged(before, "Retire by another worker")
}

func testDestroyLeased(e *env) {
	for _, d := range []lease.Disposition{lease.Destroyed, lease.Quarantined} {
		c := e.prepare()
		l := e.mustLease()
		e.advance(time.Second)
		got, err := e.destroy(c.ID, l.ID, 2, d)
		e.wantOK(err, "Destroy "+string(d))
		want := withState(leasedCell(c, l), d)
		e.wantCell(got, want, "Destroy result")
		e.wantCell(e.cell(workerA, c.ID), want, "cell after Destroy")
		if got.Disposition() != d {
			e.t.Errorf("disposition = %q, want %q", got.Disposition(), d)
		}
		_, err = e.s.CheckLease(e.ctx, e.check(l))
		e.wantErr(err, lease.ErrNotLive, "CheckLease after Destroy")
	}
	e.wantCellCounts(map[lease.State]int{lease.Destroyed: 1, lease.Quarantined: 1})
}

func testDestroyReplay(e *env) {
	for _, d := range []lease.Disposition{lease.Destroyed, lease.Quarantined} {
		c := e.prepare()
		l := e.mustLease()
		first, err := e.destroy(c.ID, l.ID, 2, d)
		e.wantOK(err, "Destroy")
		before := e.snapshot()
		e.advance(time.Minute)
		again, err := e.destroy(c.ID, l.ID, 2, d)
		e.wantOK(err, "exact Destroy replay of "+string(d))
		e.wantCell(again, first, "replayed Destroy result")
		e.unchanged(before, "exact Destroy replay")
	}
}

func testDestroyTerminalMismatch(e *env) {
	c := e.prepare()
	l := e.mustLease()
	_, err := e.destroy(c.ID, l.ID, 2, lease.Destroyed)
	e.wantOK(err, "Destroy")
	q := e.prepare()
	ql := e.mustLease()
	_, err = e.destroy(q.ID, ql.ID, 2, lease.Quarantined)
	e.wantOK(err, "Destroy")
	r := e.prepare()
	_, err = e.retire(workerA, r.ID, 1)
	e.wantOK(err, "Retire")

	before := e.snapshot()
	for name, p := range map[string]store.DestroyParams{
		"destroyed, other disposition": {CellID: c.ID, LeaseID: l.ID, Generation: 2, Disposition: lease.Quarantined},
		"destroyed, other lease":       {CellID: c.ID, LeaseID: ql.ID, Generation: 2, Disposition: lease.Destroyed},
		"destroyed, nil lease":         {CellID: c.ID, Generation: 2, Disposition: lease.Destroyed},
		"destroyed, generation 1":      {CellID: c.ID, LeaseID: l.ID, Generation: 1, Disposition: lease.Destroyed},
		"quarantined, other disp.":     {CellID: q.ID, LeaseID: ql.ID, Generation: 2, Disposition: lease.Destroyed},
		"quarantined, other lease":     {CellID: q.ID, LeaseID: l.ID, Generation: 2, Disposition: lease.Quarantined},
		"quarantined, generation 3":    {CellID: q.ID, LeaseID: ql.ID, Generation: 3, Disposition: lease.Quarantined},
		"retired, no lease":            {CellID: r.ID, Generation: 1, Disposition: lease.Quarantined},
		"retired, some lease":          {CellID: r.ID, LeaseID: l.ID, Generation: 2, Disposition: lease.Quarantined},
	} {
		p.WorkerID, p.Now = workerA, e.now
		_, err := e.s.Destroy(e.ctx, p)
		e.wantErr(err, errcode.ErrConflict, "Destroy of a terminal cell: "+name)
	}
	e.unchanged(before, "refused Destroy of terminal cells")
}

func testDestroyWrongFence(e *env) {
	for name, wrong := range map[string]func(l lease.Lease) (uuid.UUID, uint64){
		"other lease": func(l lease.Lease) (uuid.UUID, uint64) { return newID(), 2 },
		"nil lease":   func(l lease.Lease) (uuid.UUID, uint64) { return uuid.Nil, 2 },
		"generation1": func(l lease.Lease) (uuid.UUID, uint64) { return l.ID, 1 },
		"generation3": func(l lease.Lease) (uuid.UUID, uint64) { return l.ID, 3 },
	} {
		for _, d := range []lease.Disposition{lease.Destroyed, lease.Quarantined} {
			c := e.prepare()
			l := e.mustLease()
			id, gen := wrong(l)
			_, err := e.destroy(c.ID, id, gen, d)
			e.wantErr(err, errcode.ErrConflict, "Destroy of a leased cell with "+name)
			// Never destroyed on a mismatch: quarantined.
			e.wantCell(e.cell(workerA, c.ID), withState(leasedCell(c, l), lease.Quarantined),
				"cell after Destroy with "+name+" requesting "+string(d))
			_, err = e.s.CheckLease(e.ctx, e.check(l))
			e.wantErr(err, lease.ErrNotLive, "CheckLease after a mismatched Destroy")
		}
	}
}

func testDestroyReady(e *env) {
	for _, d := range []lease.Disposition{lease.Destroyed, lease.Quarantined} {
		c := e.prepare()
		_, err := e.destroy(c.ID, uuid.Nil, 1, d)
		e.wantErr(err, errcode.ErrConflict, "Destroy of a ready cell")
		e.wantCell(e.cell(workerA, c.ID), withState(c, lease.Quarantined), "ready cell after Destroy")
	}
	e.mustEmpty()
}

func testDestroyPool(e *env) {
	_, lc, l := e.poolLease()
	_, rc := e.poolCell(poolA)
	before := e.snapshot()
	for _, p := range []store.DestroyParams{
		{WorkerID: poolWorker(poolA), CellID: rc.ID, Generation: 1, Disposition: lease.Destroyed},
		{WorkerID: poolWorker(poolA), CellID: lc.ID, LeaseID: l.ID, Generation: 2, Disposition: lease.Destroyed},
		{WorkerID: poolWorker(poolA), CellID: lc.ID, LeaseID: l.ID, Generation: 2, Disposition: lease.Quarantined},
	} {
		p.Now = e.now
		_, err := e.s.Destroy(e.ctx, p)
		e.wantErr(err, errcode.ErrConflict, "Destroy of a pool cell")
	}
	e.unchanged(before, "Destroy of pool cells")
}

func testDestroyOtherWorker(e *env) {
	c := e.prepare()
	l := e.mustLease()
	before := e.snapshot()
	_, err := e.s.Destroy(e.ctx, store.DestroyParams{WorkerID: workerB, CellID: c.ID, LeaseID: l.ID, Generation: 2,
		Disposition: lease.Destroyed, Now: e.now})
	e.wantErr(err, errcode.ErrNotFound, "Destroy of another worker's cell")
	_, err = e.destroy(newID(), l.ID, 2, lease.Destroyed)
	e.wantErr(err, errcode.ErrNotFound, "Destroy of an unknown cell")
	e.unchanged(before, "Destroy by another worker")
}
