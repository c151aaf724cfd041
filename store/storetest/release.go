package storetest

import (
	"time"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

var releaseScenarios = []scenario{
	{"Release/RecordsStop", testReleaseRecordsStop},
	{"Release/ExactRetry", testReleaseExactRetry},
	{"Release/OtherDisposition", testReleaseOtherDisposition},
	{"Release/PreparedCell", testReleasePrepared},
	{"Release/AfterCompleteStop", testReleaseAfterStop},
	{"Release/Expired", testReleaseExpired},
}

// poolLease leases a fresh member of poolA.
func (e *env) poolLease() (store.Member, lease.Cell, lease.Lease) {
	e.t.Helper()
	m, c := e.poolCell(poolA)
	l := e.mustLease()
	if l.CellID != c.ID {
		e.t.Fatalf("leased %s, want the pool cell %s", l.CellID, c.ID)
	}
	return e.member(m.CellID), c, l
}

// stopped is m once a stop was recorded under l's fence at e.now.
func (e *env) stopped(m store.Member, l *lease.Lease, gen uint64, d lease.Disposition, got store.Member) store.Member {
	m.State, m.RequestedDisposition, m.StopGeneration, m.UpdatedAt = lease.MemberStopping, d, gen, e.now
	if l != nil {
		m.StopLeaseID = l.ID
	}
	m.LastError = got.LastError // free text
	return m
}

func (e *env) release(l lease.Lease, d lease.Disposition) (store.LeaseRecord, error) {
	return e.s.Release(e.ctx, store.ReleaseParams{LeaseCheck: e.check(l), Disposition: d})
}

func testReleaseRecordsStop(e *env) {
	for _, d := range []lease.Disposition{lease.Destroyed, lease.Quarantined} {
		m, c, l := e.poolLease()
		e.advance(time.Second)
		rec, err := e.release(l, d)
		e.wantOK(err, "Release")
		e.wantCell(rec.Cell, leasedCell(c, l), "Release cell (still leased until the provider confirms)")
		if rec.Member == nil {
			e.t.Fatal("Release returned no member")
		}
		want := e.stopped(m, &l, 2, d, *rec.Member)
		e.wantMember(*rec.Member, want, "Release member")
		e.wantMember(e.member(m.CellID), want, "member after Release")
		e.wantCell(e.cell(poolWorker(poolA), c.ID), leasedCell(c, l), "cell after Release")
		// The lease is still live for CheckLease until the stop completes.
		_, err = e.s.CheckLease(e.ctx, e.check(l))
		e.wantOK(err, "CheckLease after Release")
	}
}

func testReleaseExactRetry(e *env) {
	_, _, l := e.poolLease()
	first, err := e.release(l, lease.Destroyed)
	e.wantOK(err, "Release")
	before := e.snapshot()
	e.advance(10 * time.Second)
	again, err := e.release(l, lease.Destroyed)
	e.wantOK(err, "exact Release retry")
	e.unchanged(before, "exact Release retry")
	if again.Member == nil || first.Member == nil {
		e.t.Fatal("Release returned no member")
	}
	e.wantMember(*again.Member, *first.Member, "member of the retry")
	e.wantCell(again.Cell, first.Cell, "cell of the retry")
}

func testReleaseOtherDisposition(e *env) {
	m, c, l := e.poolLease()
	_, err := e.release(l, lease.Destroyed)
	e.wantOK(err, "Release")
	e.advance(time.Second)
	_, err = e.release(l, lease.Quarantined)
	e.wantErr(err, errcode.ErrConflict, "Release retried with another disposition")
	got := e.member(m.CellID)
	if got.State != lease.MemberCleanupPending || got.ProviderAbsent || got.RequestedDisposition != lease.Destroyed {
		e.t.Errorf("member after a disposition mismatch = %+v, want cleanup_pending, requested destroyed, provider not absent", got)
	}
	e.wantCell(e.cell(poolWorker(poolA), c.ID), withState(leasedCell(c, l), lease.Quarantined), "cell after a disposition mismatch")
	// Now the lease is no longer live.
	_, err = e.release(l, lease.Destroyed)
	e.wantErr(err, lease.ErrNotLive, "Release after a disposition mismatch")
}

func testReleasePrepared(e *env) {
	c := e.prepare()
	l := e.mustLease()
	before := e.snapshot()
	for _, d := range []lease.Disposition{lease.Destroyed, lease.Quarantined} {
		_, err := e.release(l, d)
		e.wantErr(err, errcode.ErrNotFound, "Release of a prepared cell's lease")
	}
	e.unchanged(before, "Release of a prepared cell's lease")
	e.wantCell(e.cell(workerA, c.ID), leasedCell(c, l), "prepared cell after Release")
}

func testReleaseAfterStop(e *env) {
	m, c, l := e.poolLease()
	rec, err := e.release(l, lease.Destroyed)
	e.wantOK(err, "Release")
	done, err := e.s.CompleteStop(e.ctx, store.StopOutcome{CellID: m.CellID, StopLeaseID: l.ID, StopGeneration: 2,
		Disposition: lease.Destroyed, Proven: true, Now: e.now})
	e.wantOK(err, "CompleteStop")
	if done.State != lease.MemberDestroyed || !done.ProviderAbsent {
		e.t.Errorf("member after CompleteStop = %+v, want destroyed with provider absent", done)
	}
	e.wantCell(e.cell(poolWorker(poolA), c.ID), withState(rec.Cell, lease.Destroyed), "cell after CompleteStop")
	before := e.snapshot()
	for _, d := range []lease.Disposition{lease.Destroyed, lease.Quarantined} {
		_, err = e.release(l, d)
		e.wantErr(err, errcode.ErrConflict, "Release after the stop completed")
		e.wantErr(err, lease.ErrNotLive, "Release after the stop completed")
	}
	e.unchanged(before, "Release after the stop completed")
}

func testReleaseExpired(e *env) {
	m, c, l := e.poolLease()
	e.now = l.ExpiresAt
	_, err := e.release(l, lease.Destroyed)
	e.wantErr(err, errcode.ErrConflict, "Release at expiry")
	e.wantErr(err, lease.ErrNotLive, "Release at expiry")
	e.wantCell(e.cell(poolWorker(poolA), c.ID), withState(leasedCell(c, l), lease.Quarantined), "cell after Release at expiry")
	if got := e.member(m.CellID); got.ProviderAbsent || got.State.Terminal() {
		e.t.Errorf("member after Release at expiry = %+v, want live without provider_absent", got)
	}
}
