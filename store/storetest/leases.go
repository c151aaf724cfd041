package storetest

import (
	"strings"
	"time"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

var leaseScenarios = []scenario{
	{"Lease/NotFound", testLeaseNotFound},
	{"Lease/PoolRecord", testLeasePoolRecord},
	{"CheckLease/Live", testCheckLive},
	{"CheckLease/FenceMismatch", testCheckMismatch},
	{"CheckLease/Expired", testCheckExpired},
	{"CheckLease/Terminal", testCheckTerminal},
}

func testLeaseNotFound(e *env) {
	e.prepare()
	l := e.mustLease()
	e.prepare(func(p *store.PrepareParams) { p.TenantID, p.WorkerID = tenantB, workerB })
	lb := e.mustLease(asTenant(tenantB))
	before := e.snapshot()
	for name, id := range map[string]struct {
		tenant string
		l      lease.Lease
	}{
		"unknown":        {tenantA, lease.Lease{ID: newID(), Generation: 2}},
		"foreign":        {tenantB, l},
		"foreign (B->A)": {tenantA, lb},
		"unknown tenant": {"tenant-c", l},
	} {
		_, err := e.s.Lease(e.ctx, id.tenant, id.l.ID)
		e.wantErr(err, errcode.ErrNotFound, "Lease of an "+name+" lease")
		chk := store.LeaseCheck{TenantID: id.tenant, LeaseID: id.l.ID, Proof: proofOf(id.l), Now: e.now}
		_, err = e.s.CheckLease(e.ctx, chk)
		e.wantErr(err, errcode.ErrNotFound, "CheckLease of an "+name+" lease")
		// Also once the lease expired: a foreign lease is never quarantined.
		chk.Now = e.now.Add(time.Hour)
		_, err = e.s.CheckLease(e.ctx, chk)
		e.wantErr(err, errcode.ErrNotFound, "CheckLease of an expired "+name+" lease")
		_, err = e.s.Release(e.ctx, store.ReleaseParams{LeaseCheck: chk, Disposition: lease.Destroyed})
		e.wantErr(err, errcode.ErrNotFound, "Release of an "+name+" lease")
	}
	e.unchanged(before, "lookups of unknown and foreign leases")
}

func testLeasePoolRecord(e *env) {
	m, c := e.poolCell(poolA)
	l := e.mustLease()
	rec := e.record(l.ID)
	e.wantCell(rec.Cell, leasedCell(c, l), "Lease cell")
	want := m
	want.State = lease.MemberLeased
	if rec.Member == nil {
		e.t.Fatal("Lease of a pool cell has no member")
	}
	e.wantMember(*rec.Member, want, "Lease member")
	got, err := e.s.CheckLease(e.ctx, e.check(l))
	e.wantOK(err, "CheckLease")
	if got.Member == nil {
		e.t.Fatal("CheckLease of a pool cell has no member")
	}
	e.wantCell(got.Cell, rec.Cell, "CheckLease cell")
	e.wantMember(*got.Member, *rec.Member, "CheckLease member")
}

func testCheckLive(e *env) {
	c := e.prepare()
	l := e.mustLease()
	want := leasedCell(c, l)
	for _, d := range []time.Duration{0, time.Minute, 120*time.Second - time.Microsecond} {
		chk := e.check(l)
		chk.Now = base.Add(d)
		rec, err := e.s.CheckLease(e.ctx, chk)
		e.wantOK(err, "CheckLease of a live lease")
		e.wantCell(rec.Cell, want, "CheckLease")
		if rec.Member != nil {
			e.t.Errorf("CheckLease of a prepared cell has member %+v", *rec.Member)
		}
	}
	e.wantCell(e.cell(workerA, c.ID), want, "cell after CheckLease")
}

// wrongProofs are proofs that differ from l's in one field.
func wrongProofs(l lease.Lease) map[string]lease.Proof {
	out := map[string]lease.Proof{}
	add := func(name string, f func(*lease.Proof)) {
		p := proofOf(l)
		f(&p)
		out[name] = p
	}
	add("generation 1", func(p *lease.Proof) { p.Generation = 1 })
	add("generation 3", func(p *lease.Proof) { p.Generation = 3 })
	add("generation 0", func(p *lease.Proof) { p.Generation = 0 })
	add("organization_id", func(p *lease.Proof) { p.Binding.OrganizationID = "org-2" })
	add("workspace_id", func(p *lease.Proof) { p.Binding.WorkspaceID = "workspace-2" })
	add("thread_id", func(p *lease.Proof) { p.Binding.ThreadID = "thread-2" })
	add("runner_session_id", func(p *lease.Proof) { p.Binding.RunnerSessionID = "session-2" })
	add("digest", func(p *lease.Proof) { p.AttestationDigest = strings.Repeat("0", 64) })
	add("uppercase digest", func(p *lease.Proof) { p.AttestationDigest = strings.ToUpper(p.AttestationDigest) })
	add("truncated digest", func(p *lease.Proof) { p.AttestationDigest = p.AttestationDigest[:63] })
	add("empty digest", func(p *lease.Proof) { p.AttestationDigest = "" })
	return out
}

func testCheckMismatch(e *env) {
	e.prepare()
	l := e.mustLease()
	_, pc := e.poolCell(poolA)
	pl := e.mustLease()
	if pl.CellID != pc.ID {
		e.t.Fatalf("leased %s, want the pool cell %s", pl.CellID, pc.ID)
	}
	before := e.snapshot()
	for _, l := range []lease.Lease{l, pl} {
		for name, proof := range wrongProofs(l) {
			// A mismatch is reported before liveness: an expired lease
			// with a wrong proof is not quarantined either.
			for _, at := range []time.Time{e.now, l.ExpiresAt} {
				chk := store.LeaseCheck{TenantID: tenantA, LeaseID: l.ID, Proof: proof, Now: at}
				_, err := e.s.CheckLease(e.ctx, chk)
				e.wantErr(err, errcode.ErrConflict, "CheckLease with a wrong "+name)
				e.wantErr(err, lease.ErrFenceMismatch, "CheckLease with a wrong "+name)
				_, err = e.s.Release(e.ctx, store.ReleaseParams{LeaseCheck: chk, Disposition: lease.Destroyed})
				e.wantErr(err, errcode.ErrConflict, "Release with a wrong "+name)
				e.wantErr(err, lease.ErrFenceMismatch, "Release with a wrong "+name)
			}
		}
	}
	e.unchanged(before, "lease checks with a wrong proof")
}

func testCheckExpired(e *env) {
	c := e.prepare()
	l := e.mustLease(leaseSeconds(30))
	chk := e.check(l)
	chk.Now = l.ExpiresAt
	_, err := e.s.CheckLease(e.ctx, chk)
	e.wantErr(err, errcode.ErrConflict, "CheckLease at expiry")
	e.wantErr(err, lease.ErrNotLive, "CheckLease at expiry")
	want := withState(leasedCell(c, l), lease.Quarantined)
	e.wantCell(e.cell(workerA, c.ID), want, "cell after CheckLease at expiry")
	e.wantCell(e.record(l.ID).Cell, want, "Lease after CheckLease at expiry")
	if d := want.Disposition(); d != lease.Quarantined {
		e.t.Errorf("disposition = %q", d)
	}

	// Checking again, even "before" expiry, finds it terminal.
	before := e.snapshot()
	for _, at := range []time.Time{base, l.ExpiresAt.Add(time.Hour)} {
		chk.Now = at
		_, err = e.s.CheckLease(e.ctx, chk)
		e.wantErr(err, lease.ErrNotLive, "CheckLease of a quarantined lease")
		e.wantErr(err, errcode.ErrConflict, "CheckLease of a quarantined lease")
	}
	e.unchanged(before, "CheckLease of a quarantined lease")
}

func testCheckTerminal(e *env) {
	c := e.prepare()
	l := e.mustLease()
	_, err := e.s.Destroy(e.ctx, store.DestroyParams{WorkerID: workerA, CellID: c.ID, LeaseID: l.ID,
		Generation: 2, Disposition: lease.Destroyed, Now: e.now})
	e.wantOK(err, "Destroy")
	before := e.snapshot()
	for _, at := range []time.Time{e.now, l.ExpiresAt} {
		chk := e.check(l)
		chk.Now = at
		_, err := e.s.CheckLease(e.ctx, chk)
		e.wantErr(err, errcode.ErrConflict, "CheckLease of a destroyed lease")
		e.wantErr(err, lease.ErrNotLive, "CheckLease of a destroyed lease")
	}
	e.unchanged(before, "CheckLease of a destroyed lease")
	want := withState(leasedCell(c, l), lease.Destroyed)
	e.wantCell(e.record(l.ID).Cell, want, "Lease of a destroyed cell")
}
