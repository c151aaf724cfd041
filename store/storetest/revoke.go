package storetest

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

var revokeScenarios = []scenario{
	{"Revoke/PoolCellStopsAsOnRelease", testRevokePool},
	{"Revoke/ThenRelease", testRevokeThenRelease},
	{"Revoke/Repeat", testRevokeRepeat},
	{"Revoke/PreparedCellQuarantined", testRevokePrepared},
	{"Revoke/NotLive", testRevokeNotLive},
	{"Revoke/UnknownAndForeign", testRevokeForeign},
	{"Revoke/BadDisposition", testRevokeBadDisposition},
}

func (k *tracker) Revoke(ctx context.Context, p store.RevokeParams) (store.LeaseRecord, error) {
	rec, err := k.Store.Revoke(ctx, p)
	if err == nil {
		k.observeRecord("Revoke", rec)
	}
	return rec, err
}

func (e *env) revoke(tenant string, leaseID uuid.UUID, d lease.Disposition) (store.LeaseRecord, error) {
	return e.s.Revoke(e.ctx, store.RevokeParams{TenantID: tenant, LeaseID: leaseID, Disposition: d, Now: e.now})
}

// testRevokePool: a revoked pool lease records the stop under its fence
// with the requested disposition, the cell leased until the provider
// confirms; once it has, the cell takes that disposition.
func testRevokePool(e *env) {
	for _, d := range []lease.Disposition{lease.Destroyed, lease.Quarantined} {
		m, c, l := e.poolLease()
		e.advance(time.Second)
		rec, err := e.revoke(tenantA, l.ID, d)
		e.wantOK(err, "Revoke")
		e.wantCell(rec.Cell, leasedCell(c, l), "Revoke cell (leased until the provider confirms)")
		if rec.Member == nil {
			e.t.Fatal("Revoke of a pool lease returned no member")
		}
		want := e.stopped(m, &l, 2, d, *rec.Member)
		e.wantMember(*rec.Member, want, "Revoke member")
		e.wantMember(e.member(m.CellID), want, "member after Revoke")

		done, err := e.s.CompleteStop(e.ctx, store.StopOutcome{CellID: m.CellID, StopLeaseID: l.ID, StopGeneration: 2,
			Disposition: d, Proven: true, Now: e.now})
		e.wantOK(err, "CompleteStop")
		if done.State != lease.MemberState(d) || !done.ProviderAbsent {
			e.t.Errorf("member after the revoked stop completed = %+v, want %s with provider_absent", done, d)
		}
		e.wantCell(e.record(l.ID).Cell, withState(leasedCell(c, l), d), "cell after the revoked stop completed")
		before := e.snapshot()
		_, err = e.revoke(tenantA, l.ID, d)
		e.wantErr(err, lease.ErrNotLive, "Revoke after the stop completed")
		e.wantErr(err, errcode.ErrConflict, "Revoke after the stop completed")
		e.unchanged(before, "Revoke after the stop completed")
	}
}

// testRevokeThenRelease: after a revocation, the attestation holder's
// release is the release of a stop already recorded: another disposition
// is the cleanup fence mismatch, and once the stop completed the lease is
// no longer live.
func testRevokeThenRelease(e *env) {
	m, c, l := e.poolLease()
	_, err := e.revoke(tenantA, l.ID, lease.Quarantined)
	e.wantOK(err, "Revoke")
	_, err = e.release(l, lease.Destroyed)
	e.wantErr(err, errcode.ErrConflict, "Release with another disposition after Revoke")
	got := e.member(m.CellID)
	if got.State != lease.MemberCleanupPending || got.RequestedDisposition != lease.Quarantined {
		e.t.Errorf("member after Revoke then Release = %+v, want cleanup_pending, requested quarantined", got)
	}
	e.wantCell(e.cell(poolWorker(poolA), c.ID), withState(leasedCell(c, l), lease.Quarantined), "cell after Revoke then Release")
	_, err = e.release(l, lease.Quarantined)
	e.wantErr(err, lease.ErrNotLive, "Release after Revoke and a mismatch")

	_, _, l2 := e.poolLease()
	_, err = e.revoke(tenantA, l2.ID, lease.Destroyed)
	e.wantOK(err, "Revoke")
	_, err = e.s.CompleteStop(e.ctx, store.StopOutcome{CellID: l2.CellID, StopLeaseID: l2.ID, StopGeneration: 2,
		Disposition: lease.Destroyed, Proven: true, Now: e.now})
	e.wantOK(err, "CompleteStop")
	before := e.snapshot()
	for _, d := range []lease.Disposition{lease.Destroyed, lease.Quarantined} {
		_, err = e.release(l2, d)
		e.wantErr(err, lease.ErrNotLive, "Release after the revoked stop completed")
		_, err = e.s.CheckLease(e.ctx, e.check(l2))
		e.wantErr(err, lease.ErrNotLive, "CheckLease after the revoked stop completed")
	}
	e.unchanged(before, "Release after the revoked stop completed")
}

// testRevokeRepeat: a repeated revocation with the same disposition changes
// nothing; with another it is the cleanup fence mismatch.
func testRevokeRepeat(e *env) {
	m, c, l := e.poolLease()
	first, err := e.revoke(tenantA, l.ID, lease.Quarantined)
	e.wantOK(err, "Revoke")
	before := e.snapshot()
	e.advance(time.Second)
	again, err := e.revoke(tenantA, l.ID, lease.Quarantined)
	e.wantOK(err, "repeated Revoke")
	e.unchanged(before, "repeated Revoke")
	e.wantCell(again.Cell, first.Cell, "repeated Revoke cell")
	e.wantMember(*again.Member, *first.Member, "repeated Revoke member")

	_, err = e.revoke(tenantA, l.ID, lease.Destroyed)
	e.wantErr(err, errcode.ErrConflict, "Revoke with another disposition")
	if got := e.member(m.CellID); got.State != lease.MemberCleanupPending || got.RequestedDisposition != lease.Quarantined {
		e.t.Errorf("member after a Revoke disposition mismatch = %+v, want cleanup_pending, requested quarantined", got)
	}
	e.wantCell(e.cell(poolWorker(poolA), c.ID), withState(leasedCell(c, l), lease.Quarantined), "cell after a Revoke mismatch")
}

// testRevokePrepared: an external worker's cell is quarantined at once,
// whatever disposition was asked; its worker's destroy then conflicts.
func testRevokePrepared(e *env) {
	for _, d := range []lease.Disposition{lease.Destroyed, lease.Quarantined} {
		c := e.prepare()
		l := e.mustLease()
		e.advance(time.Second)
		rec, err := e.revoke(tenantA, l.ID, d)
		e.wantOK(err, "Revoke of a prepared cell")
		want := withState(leasedCell(c, l), lease.Quarantined)
		e.wantCell(rec.Cell, want, "Revoke result")
		if rec.Member != nil {
			e.t.Errorf("Revoke of a prepared cell returned member %+v", *rec.Member)
		}
		e.wantCell(e.cell(workerA, c.ID), want, "cell after Revoke")
		_, err = e.s.CheckLease(e.ctx, e.check(l))
		e.wantErr(err, lease.ErrNotLive, "CheckLease after Revoke")
		before := e.snapshot()
		_, err = e.destroy(c.ID, l.ID, 2, lease.Destroyed)
		e.wantErr(err, errcode.ErrConflict, "worker Destroy after Revoke")
		_, err = e.revoke(tenantA, l.ID, d)
		e.wantErr(err, lease.ErrNotLive, "Revoke of a revoked prepared cell")
		e.unchanged(before, "Destroy and Revoke after Revoke")
	}
}

// testRevokeNotLive: a lease found expired is quarantined and reported not
// live; a terminal one is reported not live and changes nothing.
func testRevokeNotLive(e *env) {
	c := e.prepare()
	l := e.mustLease(leaseSeconds(30))
	e.now = l.ExpiresAt
	_, err := e.revoke(tenantA, l.ID, lease.Quarantined)
	e.wantErr(err, errcode.ErrConflict, "Revoke at expiry")
	e.wantErr(err, lease.ErrNotLive, "Revoke at expiry")
	e.wantCell(e.cell(workerA, c.ID), withState(leasedCell(c, l), lease.Quarantined), "cell after Revoke at expiry")

	m, pc, pl := e.poolLease()
	e.now = pl.ExpiresAt.Add(time.Second)
	_, err = e.revoke(tenantA, pl.ID, lease.Destroyed)
	e.wantErr(err, lease.ErrNotLive, "Revoke of an expired pool lease")
	e.wantCell(e.cell(poolWorker(poolA), pc.ID), withState(leasedCell(pc, pl), lease.Quarantined), "pool cell after Revoke past expiry")
	if got := e.member(m.CellID); got.State != lease.MemberLeased {
		e.t.Errorf("member after Revoke past expiry = %+v, want leased (the pool stops it)", got)
	}

	d := e.prepare()
	dl := e.mustLease()
	_, err = e.destroy(d.ID, dl.ID, 2, lease.Destroyed)
	e.wantOK(err, "Destroy")
	before := e.snapshot()
	_, err = e.revoke(tenantA, dl.ID, lease.Quarantined)
	e.wantErr(err, lease.ErrNotLive, "Revoke of a destroyed lease")
	e.unchanged(before, "Revoke of a destroyed lease")
}

func testRevokeForeign(e *env) {
	e.prepare()
	a := e.mustLease()
	_, _, pa := e.poolLease()
	e.prepare(func(p *store.PrepareParams) { p.TenantID, p.WorkerID = tenantB, workerB })
	b := e.mustLease(asTenant(tenantB))
	before := e.snapshot()
	for name, tc := range map[string]struct {
		tenant string
		id     uuid.UUID
	}{
		"unknown":             {tenantA, newID()},
		"foreign (A's, as B)": {tenantB, a.ID},
		"foreign pool lease":  {tenantB, pa.ID},
		"foreign (B's, as A)": {tenantA, b.ID},
		"unknown tenant":      {"tenant-c", a.ID},
	} {
		_, err := e.revoke(tc.tenant, tc.id, lease.Quarantined)
		e.wantErr(err, errcode.ErrNotFound, "Revoke of an "+name+" lease")
	}
	e.unchanged(before, "Revoke of unknown and foreign leases")
}

func testRevokeBadDisposition(e *env) {
	e.prepare()
	l := e.mustLease()
	_, _, pl := e.poolLease()
	before := e.snapshot()
	for _, id := range []uuid.UUID{l.ID, pl.ID} {
		for _, d := range []lease.Disposition{"", lease.Ready, lease.Leased, "Quarantined"} {
			_, err := e.revoke(tenantA, id, d)
			e.wantErr(err, errcode.ErrInvalidRequest, "Revoke with disposition "+string(d))
		}
	}
	e.unchanged(before, "Revoke with a bad disposition")
}
