package storetest

import (
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

var stopScenarios = []scenario{
	{"BeginStop/Ready", testBeginStopReady},
	{"BeginStop/Provisioning", testBeginStopProvisioning},
	{"BeginStop/Leased", testBeginStopLeased},
	{"BeginStop/QuarantineAtOnce", testBeginStopQuarantine},
	{"BeginStop/NotInFrom", testBeginStopNotInFrom},
	{"BeginStop/NeverRerecordsAStop", testBeginStopNoRestop},
	{"CompleteStop/ProvenLeased", testCompleteProvenLeased},
	{"CompleteStop/ProvenQuarantinedCell", testCompleteProvenQuarantined},
	{"CompleteStop/NotProvenThenProven", testCompleteNotProven},
	{"CompleteStop/FenceMismatch", testCompleteFenceMismatch},
	{"CompleteStop/Twice", testCompleteTwice},
	{"CompleteStop/NoStopRecorded", testCompleteNoStop},
	{"CompleteStop/NoCell", testCompleteNoCell},
}

func (e *env) beginStop(id uuid.UUID, d lease.Disposition, from ...lease.MemberState) (store.Member, error) {
	return e.s.BeginStop(e.ctx, store.StopIntent{CellID: id, From: from, Disposition: d, Reason: "test stop", Now: e.now})
}

func (e *env) completeStop(m store.Member, proven bool, why string) (store.Member, error) {
	return e.s.CompleteStop(e.ctx, store.StopOutcome{CellID: m.CellID, StopLeaseID: m.StopLeaseID,
		StopGeneration: m.StopGeneration, Disposition: m.RequestedDisposition, Proven: proven, Error: why, Now: e.now})
}

func testBeginStopReady(e *env) {
	m, c := e.poolCell(poolA)
	e.advance(time.Second)
	got, err := e.beginStop(m.CellID, lease.Destroyed, lease.MemberReady)
	e.wantOK(err, "BeginStop")
	want := e.stopped(m, nil, 1, lease.Destroyed, got)
	e.wantMember(got, want, "BeginStop result")
	qc := withState(c, lease.Quarantined)
	e.wantMemberCell(got, &qc, "BeginStop result")
	e.wantMember(e.member(m.CellID), want, "member after BeginStop")
	if got.StopLeaseID != uuid.Nil || got.StopGeneration != 1 {
		e.t.Errorf("stop fence of a ready member = (%s, %d), want (nil, 1)", got.StopLeaseID, got.StopGeneration)
	}
	// Quarantined at once, so it can no longer be claimed.
	e.wantCell(e.cell(poolWorker(poolA), c.ID), withState(c, lease.Quarantined), "cell after BeginStop")
	e.mustEmpty()
	e.wantCellCounts(map[lease.State]int{lease.Quarantined: 1})
}

func testBeginStopProvisioning(e *env) {
	m := e.createMember(poolA)
	e.advance(time.Second)
	got, err := e.beginStop(m.CellID, lease.Quarantined, lease.MemberProvisioning, lease.MemberReady)
	e.wantOK(err, "BeginStop")
	want := e.stopped(m, nil, 0, lease.Quarantined, got)
	e.wantMember(got, want, "BeginStop of a provisioning member")
	e.wantMember(e.member(m.CellID), want, "member after BeginStop")
	e.wantCellCounts(nil)
	// It can no longer be admitted.
	_, err = e.s.AdmitMember(e.ctx, e.admitParams(m))
	e.wantErr(err, errcode.ErrConflict, "AdmitMember after BeginStop")
	e.wantCellCounts(nil)
}

func testBeginStopLeased(e *env) {
	m, c, l := e.poolLease()
	e.advance(time.Second)
	got, err := e.beginStop(m.CellID, lease.Quarantined, lease.MemberLeased)
	e.wantOK(err, "BeginStop")
	want := e.stopped(m, &l, 2, lease.Quarantined, got)
	e.wantMember(got, want, "BeginStop of a leased member")
	e.wantMember(e.member(m.CellID), want, "member after BeginStop")
	// The cell stays leased until the provider confirms.
	e.wantCell(e.cell(poolWorker(poolA), c.ID), leasedCell(c, l), "cell after BeginStop")
}

func testBeginStopQuarantine(e *env) {
	// A leased member whose runtime can no longer be verified: the cell is
	// quarantined at once, under the lease's fence.
	m, c, l := e.poolLease()
	e.advance(time.Second)
	got, err := e.s.BeginStop(e.ctx, store.StopIntent{CellID: m.CellID, From: []lease.MemberState{lease.MemberLeased},
		Disposition: lease.Quarantined, Quarantine: true, Reason: "runtime unverified", Now: e.now})
	e.wantOK(err, "BeginStop with Quarantine")
	want := e.stopped(m, &l, 2, lease.Quarantined, got)
	e.wantMember(got, want, "BeginStop with Quarantine")
	e.wantMember(e.member(m.CellID), want, "member after BeginStop with Quarantine")
	qc := withState(leasedCell(c, l), lease.Quarantined)
	e.wantCell(e.cell(poolWorker(poolA), c.ID), qc, "cell after BeginStop with Quarantine")
	_, err = e.s.CheckLease(e.ctx, e.check(l))
	e.wantErr(err, lease.ErrNotLive, "CheckLease after BeginStop with Quarantine")
	done, err := e.completeStop(got, true, "")
	e.wantOK(err, "CompleteStop")
	if done.State != lease.MemberQuarantined || !done.ProviderAbsent {
		e.t.Errorf("CompleteStop = %s, want quarantined with provider absent", showMember(done))
	}
	e.wantCell(e.cell(poolWorker(poolA), c.ID), qc, "cell after CompleteStop")

	// A ready or provisioning member is stopped as without the flag.
	r, rc := e.poolCell(poolA)
	got, err = e.s.BeginStop(e.ctx, store.StopIntent{CellID: r.CellID, From: []lease.MemberState{lease.MemberReady},
		Disposition: lease.Destroyed, Quarantine: true, Now: e.now})
	e.wantOK(err, "BeginStop of a ready member with Quarantine")
	e.wantMember(got, e.stopped(r, nil, 1, lease.Destroyed, got), "BeginStop of a ready member with Quarantine")
	e.wantCell(e.cell(poolWorker(poolA), rc.ID), withState(rc, lease.Quarantined), "ready cell after BeginStop with Quarantine")
	p := e.createMember(poolA)
	got, err = e.s.BeginStop(e.ctx, store.StopIntent{CellID: p.CellID, From: []lease.MemberState{lease.MemberProvisioning},
		Disposition: lease.Quarantined, Quarantine: true, Now: e.now})
	e.wantOK(err, "BeginStop of a provisioning member with Quarantine")
	e.wantMember(got, e.stopped(p, nil, 0, lease.Quarantined, got), "BeginStop of a provisioning member with Quarantine")
}

func testBeginStopNotInFrom(e *env) {
	leased, _, _ := e.poolLease()
	ready, _ := e.poolCell(poolA)
	prov := e.createMember(poolA)
	before := e.snapshot()
	for name, tc := range map[string]struct {
		id   uuid.UUID
		from []lease.MemberState
	}{
		"ready, from provisioning/leased": {ready.CellID, []lease.MemberState{lease.MemberProvisioning, lease.MemberLeased}},
		"ready, from nothing":             {ready.CellID, nil},
		"provisioning, from ready":        {prov.CellID, []lease.MemberState{lease.MemberReady}},
		"leased, from ready":              {leased.CellID, []lease.MemberState{lease.MemberReady, lease.MemberProvisioning}},
	} {
		_, err := e.beginStop(tc.id, lease.Quarantined, tc.from...)
		e.wantErr(err, errcode.ErrConflict, "BeginStop of a member "+name)
	}
	e.unchanged(before, "BeginStop from a state not in From")
}

// testBeginStopNoRestop: the stop intent, its fence and requested disposition
// are fixed when first recorded (CONTRACT §4.2); stopping, cleanup_pending
// and terminal members never move to stopping again (lease.CheckMemberTransition).
func testBeginStopNoRestop(e *env) {
	stopping, _ := e.poolCell(poolA)
	_, err := e.beginStop(stopping.CellID, lease.Destroyed, lease.MemberReady)
	e.wantOK(err, "BeginStop")
	pending, _, pl := e.poolLease()
	_, err = e.release(pl, lease.Destroyed)
	e.wantOK(err, "Release")
	pm, err := e.completeStop(e.member(pending.CellID), false, "timeout")
	e.wantOK(err, "CompleteStop")
	if pm.State != lease.MemberCleanupPending {
		e.t.Fatalf("member = %s, want cleanup_pending", pm.State)
	}
	done, _ := e.poolCell(poolA)
	_, err = e.beginStop(done.CellID, lease.Quarantined, lease.MemberReady)
	e.wantOK(err, "BeginStop")
	dm, err := e.completeStop(e.member(done.CellID), true, "")
	e.wantOK(err, "CompleteStop")
	if !dm.State.Terminal() {
		e.t.Fatalf("member = %s, want terminal", dm.State)
	}

	before := e.snapshot()
	e.advance(time.Second)
	for name, id := range map[string]uuid.UUID{"stopping": stopping.CellID, "cleanup_pending": pending.CellID, "terminal": done.CellID} {
		for _, d := range []lease.Disposition{lease.Destroyed, lease.Quarantined} {
			_, err := e.beginStop(id, d, lease.MemberStates...)
			e.wantErr(err, errcode.ErrConflict, "BeginStop of a "+name+" member requesting "+string(d))
		}
	}
	e.unchanged(before, "BeginStop of a member whose stop is already recorded")
}

func testCompleteProvenLeased(e *env) {
	for _, d := range []lease.Disposition{lease.Destroyed, lease.Quarantined} {
		m, c, l := e.poolLease()
		rec, err := e.release(l, d)
		e.wantOK(err, "Release")
		e.advance(time.Second)
		got, err := e.completeStop(*rec.Member, true, "")
		e.wantOK(err, "CompleteStop")
		if got.State != lease.MemberState(d) || !got.ProviderAbsent || got.RequestedDisposition != d ||
			got.StopLeaseID != l.ID || got.StopGeneration != 2 || got.CellID != m.CellID || got.Pool != poolA ||
			got.Identity != m.Identity || !got.CreatedAt.Equal(m.CreatedAt) {
			e.t.Errorf("CompleteStop (%s) = %+v, want %s with provider absent under the recorded fence", d, got, d)
		}
		e.wantMember(e.member(m.CellID), got, "member after CompleteStop")
		final := withState(leasedCell(c, l), d)
		e.wantMemberCell(got, &final, "CompleteStop result")
		e.wantCell(e.cell(poolWorker(poolA), c.ID), final, "cell after CompleteStop")
		_, err = e.s.CheckLease(e.ctx, e.check(l))
		e.wantErr(err, lease.ErrNotLive, "CheckLease after CompleteStop")
	}
	e.wantCellCounts(map[lease.State]int{lease.Destroyed: 1, lease.Quarantined: 1})
}

func testCompleteProvenQuarantined(e *env) {
	// A ready member: the cell was quarantined when the stop was recorded.
	m, c := e.poolCell(poolA)
	stop, err := e.beginStop(m.CellID, lease.Destroyed, lease.MemberReady)
	e.wantOK(err, "BeginStop")
	got, err := e.completeStop(stop, true, "")
	e.wantOK(err, "CompleteStop")
	if got.State != lease.MemberQuarantined || !got.ProviderAbsent || got.RequestedDisposition != lease.Destroyed {
		e.t.Errorf("CompleteStop on a quarantined cell = %+v, want quarantined with provider absent, requested destroyed", got)
	}
	e.wantCell(e.cell(poolWorker(poolA), c.ID), withState(c, lease.Quarantined), "cell stays quarantined")

	// A leased member whose lease expired while stopping.
	m2, c2, l := e.poolLease()
	rec, err := e.release(l, lease.Destroyed)
	e.wantOK(err, "Release")
	chk := e.check(l)
	chk.Now = l.ExpiresAt
	_, err = e.s.CheckLease(e.ctx, chk)
	e.wantErr(err, lease.ErrNotLive, "CheckLease at expiry")
	e.now = l.ExpiresAt.Add(time.Second)
	got, err = e.completeStop(*rec.Member, true, "")
	e.wantOK(err, "CompleteStop")
	if got.State != lease.MemberQuarantined || !got.ProviderAbsent {
		e.t.Errorf("CompleteStop on an expired lease = %+v, want quarantined with provider absent", got)
	}
	e.wantMember(e.member(m2.CellID), got, "member after CompleteStop")
	e.wantCell(e.cell(poolWorker(poolA), c2.ID), withState(leasedCell(c2, l), lease.Quarantined), "cell stays quarantined")
}

func testCompleteNotProven(e *env) {
	m, c, l := e.poolLease()
	rec, err := e.release(l, lease.Destroyed)
	e.wantOK(err, "Release")
	stop := *rec.Member
	for i := 1; i <= 2; i++ {
		e.advance(time.Second)
		got, err := e.completeStop(stop, false, "provider timeout")
		e.wantOK(err, "CompleteStop without proof")
		want := stop
		want.State, want.Attempts, want.UpdatedAt, want.LastError = lease.MemberCleanupPending, i, e.now, got.LastError
		e.wantMember(got, want, "CompleteStop without proof")
		e.wantMember(e.member(m.CellID), want, "member after CompleteStop without proof")
		if !strings.Contains(got.LastError, "provider timeout") {
			e.t.Errorf("LastError = %q, want the attempt's error", got.LastError)
		}
		e.wantCell(e.cell(poolWorker(poolA), c.ID), withState(leasedCell(c, l), lease.Quarantined), "cell after an unproven stop")
	}
	_, err = e.s.CheckLease(e.ctx, e.check(l))
	e.wantErr(err, lease.ErrNotLive, "CheckLease after an unproven stop")

	// A later proven completion under the same fence ends it.
	e.advance(time.Second)
	got, err := e.completeStop(stop, true, "")
	e.wantOK(err, "CompleteStop with proof")
	if got.State != lease.MemberQuarantined || !got.ProviderAbsent || got.RequestedDisposition != lease.Destroyed ||
		got.StopLeaseID != l.ID || got.StopGeneration != 2 {
		e.t.Errorf("proven retry = %+v, want quarantined (the cell was quarantined) with provider absent, fence kept", got)
	}
	e.wantMember(e.member(m.CellID), got, "member after the proven retry")
	e.wantCell(e.cell(poolWorker(poolA), c.ID), withState(leasedCell(c, l), lease.Quarantined), "cell after the proven retry")
}

func testCompleteFenceMismatch(e *env) {
	other := newID()
	for name, mutate := range map[string]func(*store.Member){
		"generation 1":      func(m *store.Member) { m.StopGeneration = 1 },
		"other lease":       func(m *store.Member) { m.StopLeaseID = other },
		"nil lease":         func(m *store.Member) { m.StopLeaseID = uuid.Nil },
		"other disposition": func(m *store.Member) { m.RequestedDisposition = lease.Quarantined },
	} {
		m, c, l := e.poolLease()
		rec, err := e.release(l, lease.Destroyed)
		e.wantOK(err, "Release")
		stop := *rec.Member
		wrong := stop
		mutate(&wrong)
		for _, proven := range []bool{true, true, false} { // twice: also from cleanup_pending
			e.advance(time.Second)
			_, err = e.completeStop(wrong, proven, "")
			e.wantErr(err, errcode.ErrConflict, "CompleteStop under a mismatched fence ("+name+")")
			got := e.member(m.CellID)
			if got.State != lease.MemberCleanupPending || got.ProviderAbsent || got.RequestedDisposition != lease.Destroyed ||
				got.StopLeaseID != l.ID || got.StopGeneration != 2 {
				e.t.Errorf("member after a fence mismatch (%s) = %+v, want cleanup_pending, fence kept, provider not absent", name, got)
			}
			e.wantCell(e.cell(poolWorker(poolA), c.ID), withState(leasedCell(c, l), lease.Quarantined), "cell after a fence mismatch")
		}
		// The exact fence still completes it.
		got, err := e.completeStop(stop, true, "")
		e.wantOK(err, "CompleteStop under the recorded fence")
		if got.State != lease.MemberQuarantined || !got.ProviderAbsent {
			e.t.Errorf("CompleteStop under the recorded fence = %+v, want quarantined with provider absent", got)
		}
	}
}

func testCompleteTwice(e *env) {
	m, _, l := e.poolLease()
	rec, err := e.release(l, lease.Destroyed)
	e.wantOK(err, "Release")
	first, err := e.completeStop(*rec.Member, true, "")
	e.wantOK(err, "CompleteStop")
	before := e.snapshot()
	e.advance(time.Minute)
	again, err := e.completeStop(*rec.Member, true, "")
	e.wantOK(err, "second CompleteStop")
	e.wantMember(again, first, "second CompleteStop result")
	// An unproven or mismatched late report changes nothing either.
	_, _ = e.completeStop(*rec.Member, false, "late failure")
	wrong := *rec.Member
	wrong.StopGeneration = 1
	_, _ = e.completeStop(wrong, true, "")
	e.unchanged(before, "completing a terminal member again")
	if got := e.member(m.CellID); got.State != lease.MemberDestroyed || !got.ProviderAbsent {
		e.t.Errorf("member = %+v, want destroyed with provider absent", got)
	}
}

func testCompleteNoStop(e *env) {
	leased, _, l := e.poolLease()
	ready, _ := e.poolCell(poolA)
	prov := e.createMember(poolA)
	before := e.snapshot()
	for name, m := range map[string]store.Member{"ready": ready, "provisioning": prov, "leased": leased} {
		for _, d := range []lease.Disposition{lease.Destroyed, lease.Quarantined} {
			for _, gen := range []uint64{0, 1, 2} {
				for _, lid := range []uuid.UUID{uuid.Nil, l.ID} {
					_, err := e.s.CompleteStop(e.ctx, store.StopOutcome{CellID: m.CellID, StopLeaseID: lid,
						StopGeneration: gen, Disposition: d, Proven: true, Now: e.now})
					e.wantErr(err, errcode.ErrConflict, "CompleteStop of a "+name+" member")
				}
			}
		}
	}
	e.unchanged(before, "CompleteStop without a recorded stop")
}

func testCompleteNoCell(e *env) {
	for _, d := range []lease.Disposition{lease.Destroyed, lease.Quarantined} {
		m := e.createMember(poolA)
		stop, err := e.beginStop(m.CellID, d, lease.MemberProvisioning)
		e.wantOK(err, "BeginStop")
		got, err := e.completeStop(stop, true, "")
		e.wantOK(err, "CompleteStop")
		if got.State != lease.MemberState(d) || !got.ProviderAbsent || got.StopGeneration != 0 || got.StopLeaseID != uuid.Nil {
			e.t.Errorf("CompleteStop of a member without cell = %+v, want %s with provider absent", got, d)
		}
		e.wantMember(e.member(m.CellID), got, "member after CompleteStop")
	}
	e.wantCellCounts(nil)
}
