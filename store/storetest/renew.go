package storetest

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

var renewScenarios = []scenario{
	{"Renew/MovesOnlyTheExpiry", testRenewMoves},
	{"Renew/NeverShorter", testRenewNeverShorter},
	{"Renew/Repeated", testRenewRepeated},
	{"Renew/Expired", testRenewExpired},
	{"Renew/AfterReleaseOrRevoke", testRenewAfterStop},
	{"Renew/WrongFence", testRenewWrongFence},
	{"Renew/UnknownAndForeign", testRenewForeign},
	{"Renew/PreparedCell", testRenewPrepared},
	{"Renew/ClaimRetryAfterRenewal", testRenewClaimRetry},
	{"Renew/StaleRead", testRenewStaleRead},
}

func (k *tracker) Renew(ctx context.Context, p store.RenewParams) (store.LeaseRecord, error) {
	rec, err := k.Store.Renew(ctx, p)
	if err == nil {
		k.observeRecord("Renew", rec)
	}
	return rec, err
}

// renew renews l to to, passing the store the lease's record read just
// before, as the plane does (RenewParams.Read).
func (e *env) renew(l lease.Lease, to time.Time) (store.LeaseRecord, error) {
	read := e.record(l.ID)
	return e.s.Renew(e.ctx, store.RenewParams{LeaseCheck: e.check(l), ExpiresAt: to, Read: &read})
}

// renewed is l after a renewal to the expiry to.
func renewed(l lease.Lease, to time.Time) lease.Lease {
	l.ExpiresAt = to.Truncate(time.Microsecond)
	return l
}

// testRenewMoves: a renewal moves the expiry of a live pool lease, past
// the cell's ready deadline too, keeps the expiry the claim granted and
// everything else of the lease and its membership, and appends
// lease.renewed; the lease reads back renewed.
func testRenewMoves(e *env) {
	m, c, l := e.poolLease()
	if !l.GrantedExpiresAt.Equal(l.ExpiresAt) || !l.LeasedAt.Equal(e.now) {
		e.t.Errorf("a new lease: granted %v, leased at %v; want %v and %v", l.GrantedExpiresAt, l.LeasedAt, l.ExpiresAt, e.now)
	}
	e.advance(time.Second)
	mark := e.lastEvent()
	to := c.ExpiresAt.Add(time.Hour + 123*time.Nanosecond) // past the ready deadline; truncated to µs
	rec, err := e.renew(l, to)
	e.wantOK(err, "Renew")
	want := renewed(l, to)
	e.wantLease(rec.Cell.Lease, want, "Renew")
	e.wantCell(rec.Cell, leasedCell(c, want), "Renew cell")
	e.wantMember(*rec.Member, e.member(m.CellID), "Renew member")
	if got := e.member(m.CellID); got.State != lease.MemberLeased {
		e.t.Errorf("member after Renew is %s, want leased", got.State)
	}
	e.wantLease(e.record(l.ID).Cell.Lease, want, "lease after Renew")
	e.wantEvents(mark, []string{ev("lease.renewed", c.ID, "", "", store.ReasonRenewed)}, "Renew")
	// The renewed lease is live past its first expiry.
	e.now = l.ExpiresAt.Add(time.Minute)
	_, err = e.s.CheckLease(e.ctx, e.check(l))
	e.wantOK(err, "CheckLease after the first expiry")
}

// testRenewNeverShorter: a renewal to an expiry at or before the current
// one changes nothing and appends no event.
func testRenewNeverShorter(e *env) {
	_, _, l := e.poolLease()
	for _, to := range []time.Time{l.ExpiresAt, l.ExpiresAt.Add(-time.Second), e.now} {
		before, mark := e.snapshot(), e.lastEvent()
		rec, err := e.renew(l, to)
		e.wantOK(err, "Renew to an earlier expiry")
		e.wantLease(rec.Cell.Lease, l, "Renew to an earlier expiry")
		e.unchanged(before, "Renew to an earlier expiry")
		e.wantEvents(mark, nil, "Renew to an earlier expiry")
	}
}

// testRenewRepeated: repeating a renewal (a lost answer retried) never
// adds a second extension: each sets the expiry it asks for, or keeps a
// later one.
func testRenewRepeated(e *env) {
	_, c, l := e.poolLease()
	to := e.now.Add(10 * time.Minute)
	_, err := e.renew(l, to)
	e.wantOK(err, "Renew")
	mark := e.lastEvent()
	rec, err := e.renew(l, to)
	e.wantOK(err, "Renew repeated")
	e.wantLease(rec.Cell.Lease, renewed(l, to), "Renew repeated")
	e.wantEvents(mark, nil, "Renew repeated")
	e.advance(time.Minute)
	later := e.now.Add(10 * time.Minute)
	rec, err = e.renew(l, later)
	e.wantOK(err, "Renew a minute later")
	e.wantLease(rec.Cell.Lease, renewed(l, later), "Renew a minute later")
	e.wantEvents(mark, []string{ev("lease.renewed", c.ID, "", "", store.ReasonRenewed)}, "Renew a minute later")
}

// testRenewExpired: a lease found expired is quarantined, committed, and
// the renewal is a conflict: an expired lease is never revived.
func testRenewExpired(e *env) {
	_, c, l := e.poolLease()
	e.now = l.ExpiresAt
	_, err := e.renew(l, e.now.Add(time.Hour))
	e.wantErr(err, lease.ErrNotLive, "Renew of an expired lease")
	e.wantErr(err, errcode.ErrConflict, "Renew of an expired lease")
	e.wantCell(e.record(l.ID).Cell, withState(leasedCell(c, l), lease.Quarantined), "cell after Renew of an expired lease")
}

// testRenewAfterStop: once a release or a revocation is recorded, a
// renewal is a conflict and changes nothing.
func testRenewAfterStop(e *env) {
	for _, stop := range []func(l lease.Lease) error{
		func(l lease.Lease) error { _, err := e.release(l, lease.Destroyed); return err },
		func(l lease.Lease) error { _, err := e.revoke(tenantA, l.ID, lease.Destroyed); return err },
	} {
		_, _, l := e.poolLease()
		e.wantOK(stop(l), "the stop")
		before := e.snapshot()
		_, err := e.renew(l, e.now.Add(time.Hour))
		e.wantErr(err, errcode.ErrConflict, "Renew after the stop")
		e.unchanged(before, "Renew after the stop")
	}
}

// testRenewWrongFence: any field of the fence wrong is a conflict wrapping
// lease.ErrFenceMismatch, and nothing changes.
func testRenewWrongFence(e *env) {
	_, _, l := e.poolLease()
	for what, wrong := range map[string]func(*store.RenewParams){
		"generation":  func(p *store.RenewParams) { p.Proof.Generation = 1 },
		"binding":     func(p *store.RenewParams) { p.Proof.Binding.ThreadID = "other" },
		"attestation": func(p *store.RenewParams) { p.Proof.AttestationDigest = e.sign(lease.Lease{ID: newID()}) },
	} {
		read := e.record(l.ID)
		for _, read := range []*store.LeaseRecord{nil, &read} {
			p := store.RenewParams{LeaseCheck: e.check(l), ExpiresAt: e.now.Add(time.Hour), Read: read}
			wrong(&p)
			before := e.snapshot()
			_, err := e.s.Renew(e.ctx, p)
			e.wantErr(err, lease.ErrFenceMismatch, "Renew with a wrong "+what)
			e.wantErr(err, errcode.ErrConflict, "Renew with a wrong "+what)
			e.unchanged(before, "Renew with a wrong "+what)
		}
	}
}

// testRenewStaleRead: a renewal given a read of the lease taken before
// another renewal, a release, a revocation or the lease's expiry answers
// as it would without the read.
func testRenewStaleRead(e *env) {
	// Another renewal moved the expiry since the read: this one still
	// moves it, from where it now is.
	_, c, l := e.poolLease()
	stale := e.record(l.ID)
	_, err := e.renew(l, e.now.Add(10*time.Minute))
	e.wantOK(err, "the first renewal")
	mark := e.lastEvent()
	to := e.now.Add(20 * time.Minute)
	rec, err := e.s.Renew(e.ctx, store.RenewParams{LeaseCheck: e.check(l), ExpiresAt: to, Read: &stale})
	e.wantOK(err, "Renew with a read older than the last renewal")
	e.wantLease(rec.Cell.Lease, renewed(l, to), "Renew with a read older than the last renewal")
	e.wantLease(e.record(l.ID).Cell.Lease, renewed(l, to), "lease after a renewal with an old read")
	e.wantEvents(mark, []string{ev("lease.renewed", c.ID, "", "", store.ReasonRenewed)}, "Renew with an old read")
	// ... and one to an expiry the other renewal already passed moves
	// nothing.
	mark = e.lastEvent()
	rec, err = e.s.Renew(e.ctx, store.RenewParams{LeaseCheck: e.check(l), ExpiresAt: e.now.Add(15 * time.Minute), Read: &stale})
	e.wantOK(err, "Renew with an old read to an earlier expiry")
	e.wantLease(rec.Cell.Lease, renewed(l, to), "Renew with an old read to an earlier expiry")
	e.wantEvents(mark, nil, "Renew with an old read to an earlier expiry")

	// The lease was stopped since the read: a conflict, nothing changed.
	for _, stop := range []func(l lease.Lease) error{
		func(l lease.Lease) error { _, err := e.release(l, lease.Destroyed); return err },
		func(l lease.Lease) error { _, err := e.revoke(tenantA, l.ID, lease.Destroyed); return err },
	} {
		_, _, l := e.poolLease()
		stale := e.record(l.ID)
		e.wantOK(stop(l), "the stop")
		before := e.snapshot()
		_, err := e.s.Renew(e.ctx, store.RenewParams{LeaseCheck: e.check(l), ExpiresAt: e.now.Add(time.Hour), Read: &stale})
		e.wantErr(err, errcode.ErrConflict, "Renew with a read taken before the stop")
		e.unchanged(before, "Renew with a read taken before the stop")
	}

	// The lease expired since the read: quarantined, never revived.
	_, c, l = e.poolLease()
	stale = e.record(l.ID)
	e.now = l.ExpiresAt
	_, err = e.s.Renew(e.ctx, store.RenewParams{LeaseCheck: e.check(l), ExpiresAt: e.now.Add(time.Hour), Read: &stale})
	e.wantErr(err, lease.ErrNotLive, "Renew with a read taken before the expiry")
	e.wantCell(e.record(l.ID).Cell, withState(leasedCell(c, l), lease.Quarantined), "cell after Renew with a read taken before the expiry")
}

// testRenewForeign: an unknown lease and another tenant's are not found.
func testRenewForeign(e *env) {
	_, _, l := e.poolLease()
	before := e.snapshot()
	for what, p := range map[string]store.RenewParams{
		"unknown": {LeaseCheck: store.LeaseCheck{TenantID: tenantA, LeaseID: uuid.New(), Now: e.now}, ExpiresAt: e.now.Add(time.Hour)},
		"foreign": {LeaseCheck: store.LeaseCheck{TenantID: tenantB, LeaseID: l.ID, Proof: e.check(l).Proof, Now: e.now},
			ExpiresAt: e.now.Add(time.Hour)},
	} {
		_, err := e.s.Renew(e.ctx, p)
		e.wantErr(err, errcode.ErrNotFound, "Renew of an "+what+" lease")
	}
	e.unchanged(before, "Renew of unknown and foreign leases")
}

// testRenewPrepared: an external worker's cell renews as a pool cell does
// (the plane bounds it by its prepared expiry).
func testRenewPrepared(e *env) {
	c := e.prepare()
	l := e.mustLease()
	if l.CellID != c.ID {
		e.t.Fatalf("leased %s, want the prepared cell %s", l.CellID, c.ID)
	}
	to := c.ExpiresAt
	rec, err := e.renew(l, to)
	e.wantOK(err, "Renew of a prepared cell's lease")
	e.wantLease(rec.Cell.Lease, renewed(l, to), "Renew of a prepared cell's lease")
}

// testRenewClaimRetryAfterRenewal: a fenced claim retried after a renewal
// answers the lease as it is now, whose expiry the claim granted still
// signs the same attestation.
func testRenewClaimRetry(e *env) {
	e.poolCell(poolA)
	claimID := newID()
	fenced := func(p *store.ClaimParams) { p.ClaimID = claimID }
	l := e.mustLease(fenced)
	to := e.now.Add(time.Hour)
	_, err := e.renew(l, to)
	e.wantOK(err, "Renew")
	e.advance(time.Second)
	res := e.claim(fenced)
	if !res.Replayed || res.Lease == nil {
		e.t.Fatalf("the claim retry after a renewal: %+v, want the lease replayed", res)
	}
	e.wantLease(res.Lease, renewed(l, to), "the claim retry after a renewal")
	if e.sign(*res.Lease) != l.AttestationDigest {
		e.t.Error("the replayed lease does not sign the attestation the claim made")
	}
}
