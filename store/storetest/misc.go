package storetest

import (
	"time"

	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

var lockScenarios = []scenario{
	{"LockMember", testLockMember},
}

var expireScenarios = []scenario{
	{"ExpireUnmanaged/Cells", testExpireCells},
}

func testLockMember(e *env) {
	m := e.createMember(poolA)
	other := e.createMember(poolA)
	t0 := e.now
	lock := func(owner string, until, now time.Duration, want bool, what string) {
		e.t.Helper()
		ok, err := e.s.LockMember(e.ctx, m.CellID, owner, t0.Add(until), t0.Add(now))
		e.wantOK(err, "LockMember")
		if ok != want {
			e.t.Errorf("%s: LockMember(%s, until +%s, now +%s) = %v, want %v", what, owner, until, now, ok, want)
		}
	}
	unlock := func(owner string) {
		e.t.Helper()
		e.wantOK(e.s.UnlockMember(e.ctx, m.CellID, owner), "UnlockMember")
	}
	lock("a", 10*time.Second, 0, true, "free member")
	lock("b", 20*time.Second, 5*time.Second, false, "held by a")
	lock("a", 30*time.Second, 5*time.Second, true, "renewal by a")
	lock("b", 60*time.Second, 30*time.Second-time.Microsecond, false, "held by a until +30s")
	lock("b", 60*time.Second, 30*time.Second, true, "a's lock expired")
	lock("a", 90*time.Second, 31*time.Second, false, "held by b")
	unlock("a") // not the owner: nothing happens
	lock("a", 90*time.Second, 32*time.Second, false, "after unlock by a non-owner")
	unlock("b")
	lock("a", 90*time.Second, 33*time.Second, true, "after unlock by b")
	// Locks are per member.
	ok, err := e.s.LockMember(e.ctx, other.CellID, "b", t0.Add(time.Hour), t0.Add(33*time.Second))
	if !ok || err != nil {
		e.t.Errorf("LockMember of another member = %v, %v; want true", ok, err)
	}
	// Locking changes nothing a caller can see of the member.
	e.wantMember(e.member(m.CellID), m, "member after locking")
}

func testExpireCells(e *env) {
	t0 := e.now
	// A prepared cell leased for 5 s, and a pool cell leased for 120 s.
	leased := e.prepare()
	ll := e.mustLease(leaseSeconds(5))
	_, _, pl := e.poolLease()
	// Ready cells: prepared ones with deadlines at +10 s and +1 h, and a
	// pool cell with its ready deadline at +10 s.
	soon := e.prepare(func(p *store.PrepareParams) { p.ExpiresAt = t0.Add(10 * time.Second) })
	later := e.prepare()
	pm := e.createMember(poolA)
	ap := e.admitParams(pm)
	ap.ReadyDeadline = t0.Add(10 * time.Second)
	poolReady, err := e.s.AdmitMember(e.ctx, ap)
	e.wantOK(err, "AdmitMember")

	// Before any deadline: nothing.
	n, err := e.s.ExpireUnmanaged(e.ctx, t0.Add(time.Second))
	e.wantOK(err, "ExpireUnmanaged")
	if n != 0 {
		e.t.Errorf("ExpireUnmanaged before any deadline = %d, want 0", n)
	}

	poolBefore := map[string]lease.Cell{
		"leased pool cell": e.cell(poolWorker(poolA), pl.CellID),
		"ready pool cell":  e.cell(poolWorker(poolA), poolReady.ID),
	}
	membersBefore := e.memberCounts()
	n, err = e.s.ExpireUnmanaged(e.ctx, t0.Add(200*time.Second)) // past every deadline but +1 h
	e.wantOK(err, "ExpireUnmanaged")
	if n != 2 {
		e.t.Errorf("ExpireUnmanaged = %d, want 2 (one ready, one leased prepared cell)", n)
	}
	e.wantCell(e.cell(workerA, leased.ID), withState(leasedCell(leased, ll), lease.Quarantined), "expired leased cell")
	e.wantCell(e.cell(workerA, soon.ID), withState(soon, lease.Quarantined), "expired ready cell")
	e.wantCell(e.cell(workerA, later.ID), later, "unexpired ready cell")
	for name, c := range poolBefore {
		e.wantCell(e.cell(poolWorker(poolA), c.ID), c, name+" after ExpireUnmanaged")
	}
	if mc := e.memberCounts(); !sameCounts(mc[poolA], membersBefore[poolA]) {
		e.t.Errorf("MemberCounts after ExpireUnmanaged = %v, want %v", mc, membersBefore)
	}
	_, err = e.s.CheckLease(e.ctx, store.LeaseCheck{TenantID: tenantA, LeaseID: ll.ID, Proof: proofOf(ll), Now: t0})
	e.wantErr(err, lease.ErrNotLive, "CheckLease of an expired lease")

	// Again: nothing left to do.
	before := e.snapshot()
	n, err = e.s.ExpireUnmanaged(e.ctx, t0.Add(200*time.Second))
	e.wantOK(err, "ExpireUnmanaged")
	if n != 0 {
		e.t.Errorf("second ExpireUnmanaged = %d, want 0", n)
	}
	e.unchanged(before, "a second ExpireUnmanaged")

	// The boundary: a deadline exactly at now expires.
	edge := e.prepare(func(p *store.PrepareParams) { p.ExpiresAt = t0.Add(time.Hour + time.Second) })
	n, err = e.s.ExpireUnmanaged(e.ctx, t0.Add(time.Hour))
	e.wantOK(err, "ExpireUnmanaged")
	if n != 1 {
		e.t.Errorf("ExpireUnmanaged at a deadline = %d, want 1", n)
	}
	e.wantCell(e.cell(workerA, later.ID), withState(later, lease.Quarantined), "ready cell at its deadline")
	e.wantCell(e.cell(workerA, edge.ID), edge, "ready cell before its deadline")
}

func testExpireIdempotency(e *env) {
	begin := func(key, fp string, now time.Time) store.IdempotencyRecord {
		e.t.Helper()
		rec, err := e.s.BeginIdempotent(e.ctx, store.IdempotencyParams{TenantID: tenantA, Key: key, Fingerprint: fp,
			Now: now, InFlightUntil: now.Add(30 * time.Second)})
		e.wantOK(err, "BeginIdempotent")
		return rec
	}
	begin("expiring", "fp-1", e.now)
	e.wantOK(e.s.FinishIdempotent(e.ctx, store.IdempotencyResult{TenantID: tenantA, Key: "expiring", Status: 409,
		Body: []byte(`{"ok":false}`), ExpiresAt: e.now.Add(time.Hour)}), "FinishIdempotent")
	begin("kept", "fp-2", e.now)
	e.wantOK(e.s.FinishIdempotent(e.ctx, store.IdempotencyResult{TenantID: tenantA, Key: "kept", Status: 409,
		Body: []byte(`{"ok":false}`), ExpiresAt: e.now.Add(2 * time.Hour)}), "FinishIdempotent")

	n, err := e.s.ExpireUnmanaged(e.ctx, e.now.Add(time.Hour))
	e.wantOK(err, "ExpireUnmanaged")
	if n != 0 {
		e.t.Errorf("ExpireUnmanaged without cells = %d, want 0 (records are not cells)", n)
	}
	// Looked up at the original time, a removed record is gone and a kept
	// one is still there.
	if rec := begin("expiring", "fp-3", e.now); !rec.Created || rec.Fingerprint != "fp-3" {
		e.t.Errorf("BeginIdempotent after ExpireUnmanaged removed the record = %+v, want a new entry", rec)
	}
	if rec := begin("kept", "fp-4", e.now); rec.Created || !rec.Done || rec.Fingerprint != "fp-2" {
		e.t.Errorf("BeginIdempotent of an unexpired record = %+v, want the stored response", rec)
	}
}
