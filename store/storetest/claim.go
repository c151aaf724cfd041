package storetest

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

var claimScenarios = []scenario{
	{"Claim/LeaseFields", testClaimLeaseFields},
	{"Claim/ExpiryTruncatedToMicroseconds", testClaimTruncates},
	{"Claim/OldestFirst", testClaimOldestFirst},
	{"Claim/ExactRelease", testClaimExactRelease},
	{"Claim/TenantIsolation", testClaimTenantIsolation},
	{"Claim/ReadyDeadline", testClaimReadyDeadline},
	{"Claim/DeadlineBetweenClaims", testClaimDeadlineBetweenClaims},
	{"Claim/UnfencedTwice", testClaimUnfencedTwice},
	{"Claim/Empty", testClaimEmpty},
	{"Claim/OnlyReadyCells", testClaimOnlyReady},
	{"Claim/ContextEndsInside", testClaimContextEnds},
	{"Claim/SignPanics", testClaimSignPanics},
}

func testClaimLeaseFields(e *env) {
	c := e.prepare()
	p := e.claimParams(leaseSeconds(300))
	var signed []lease.Lease
	p.Sign = func(l lease.Lease) string {
		signed = append(signed, l)
		return e.sign(l)
	}
	res, err := e.s.Claim(e.ctx, p)
	e.wantOK(err, "Claim")
	want := lease.Lease{
		ID:         p.LeaseID,
		CellID:     c.ID,
		Generation: lease.GenerationLeased,
		Release:    e.kata,
		Binding:    binding1,
		ExpiresAt:  e.now.Add(300 * time.Second),
		// The claim grants its expiry and records when it leased.
		GrantedExpiresAt: e.now.Add(300 * time.Second),
		LeasedAt:         e.now,
	}
	unsigned := want
	want.AttestationDigest = attest.Digest(e.kr.LeaseToken(attest.ClaimsOf(want)))
	e.wantLease(res.Lease, want, "Claim lease")
	if res.Replayed || res.PoolName != "" {
		e.t.Errorf("Claim result = Replayed %v PoolName %q, want false and none", res.Replayed, res.PoolName)
	}
	if len(signed) == 0 {
		e.t.Error("Claim never called Sign")
	} else {
		e.wantLease(&signed[len(signed)-1], unsigned, "lease passed to Sign")
	}
	// The store keeps exactly what was signed.
	rec := e.record(want.ID)
	e.wantCell(rec.Cell, leasedCell(c, want), "Lease after Claim")
	e.wantLease(rec.Cell.Lease, want, "Lease after Claim")
	if rec.Member != nil {
		e.t.Errorf("Lease of a prepared cell has member %+v", *rec.Member)
	}
	if d := rec.Cell.Disposition(); d != "" {
		e.t.Errorf("disposition of a leased cell = %q, want none", d)
	}
	e.wantCell(e.cell(workerA, c.ID), leasedCell(c, want), "WorkerCell after Claim")
	e.wantCellCounts(map[lease.State]int{lease.Leased: 1})
}

func testClaimTruncates(e *env) {
	e.prepare()
	e.now = e.now.Add(789 * time.Nanosecond)
	l := e.mustLease(leaseSeconds(7))
	want := time.UnixMicro(e.now.Add(7 * time.Second).UnixMicro()).UTC()
	if !l.ExpiresAt.Equal(want) {
		e.t.Errorf("lease expiry = %s, want %s (now + lease_seconds truncated to µs)",
			attest.CanonicalTime(l.ExpiresAt), attest.CanonicalTime(want))
	}
	if l.AttestationDigest != e.sign(l) {
		e.t.Error("the stored digest is not the digest of the lease as returned")
	}
	e.wantLease(e.record(l.ID).Cell.Lease, l, "Lease after Claim")
}

func testClaimOldestFirst(e *env) {
	// Created order wins over ID order; equal creation times fall back to ID.
	idLow := uuid.MustParse("01890a5d-ac96-774b-bcce-000000000001")
	idMid := uuid.MustParse("01890a5d-ac96-774b-bcce-000000000002")
	idHigh := uuid.MustParse("01890a5d-ac96-774b-bcce-000000000003")
	idTop := uuid.MustParse("01890a5d-ac96-774b-bcce-000000000004")
	at := func(id uuid.UUID, d time.Duration) func(*store.PrepareParams) {
		return func(p *store.PrepareParams) { p.CellID, p.Now = id, base.Add(d) }
	}
	third := e.prepare(at(idLow, 2*time.Second))
	first := e.prepare(at(idTop, 0))
	second := e.prepare(at(idHigh, time.Second))
	fourth := e.prepare(at(idMid, 2*time.Second))
	e.advance(3 * time.Second)
	for i, want := range []lease.Cell{first, second, third, fourth} {
		if l := e.mustLease(); l.CellID != want.ID {
			e.t.Errorf("claim %d leased cell %s, want %s", i+1, l.CellID, want.ID)
		}
	}
	e.mustEmpty()
}

func testClaimExactRelease(e *env) {
	otherKey, err := attest.NewKeyring([]byte(strings.Repeat("k", 32)))
	e.wantOK(err, "NewKeyring")
	variants := map[string]lease.Release{}
	r := e.kata
	r.ReleaseSetID = "release-set-2026-08-08"
	variants["release_set_id"] = r
	r = e.kata
	r.RuntimeClass = lease.GVisorLowerRisk
	variants["runtime_class"] = r
	r = e.kata
	r.PolicyDigest = strings.Repeat("b", 64)
	variants["policy_digest"] = r
	r = e.kata
	r.Signature = otherKey.SignRelease(r)
	variants["signature"] = r
	variants["gvisor release"] = e.gvis

	cells := map[string]lease.Cell{}
	for name, r := range variants {
		cells[name] = e.prepare(func(p *store.PrepareParams) { p.Release = r })
	}
	// None of them is the kata release.
	e.mustEmpty()
	e.mustEmpty(fenced(newID()))
	// Each claims exactly its own cell.
	for name, r := range variants {
		l := e.mustLease(withRelease(r))
		if l.CellID != cells[name].ID || l.Release != r {
			e.t.Errorf("claim for the %s variant leased cell %s with %+v, want cell %s", name, l.CellID, l.Release, cells[name].ID)
		}
		e.mustEmpty(withRelease(r))
	}
}

func testClaimTenantIsolation(e *env) {
	a := e.prepare()
	// Tenant B sees none of A's inventory.
	e.mustEmpty(asTenant(tenantB))
	e.mustEmpty(asTenant(tenantB), fenced(newID()))
	b := e.prepare(func(p *store.PrepareParams) { p.TenantID, p.WorkerID = tenantB, workerB })
	lb := e.mustLease(asTenant(tenantB))
	if lb.CellID != b.ID {
		e.t.Errorf("tenant B leased cell %s, want its own %s", lb.CellID, b.ID)
	}
	e.mustEmpty(asTenant(tenantB))
	la := e.mustLease()
	if la.CellID != a.ID {
		e.t.Errorf("tenant A leased cell %s, want %s", la.CellID, a.ID)
	}
}

func testClaimReadyDeadline(e *env) {
	deadline := func(d time.Duration) func(*store.PrepareParams) {
		return func(p *store.PrepareParams) { p.ExpiresAt = e.now.Add(d) }
	}
	e.prepare(deadline(-time.Second))
	e.prepare(deadline(0))
	exact := e.prepare(deadline(120 * time.Second))
	// A deadline at or before now + lease_seconds is not claimable.
	e.mustEmpty(leaseSeconds(120))
	e.mustEmpty(leaseSeconds(121), fenced(newID()))
	// One microsecond more is.
	later := e.prepare(deadline(120*time.Second + time.Microsecond))
	l := e.mustLease(leaseSeconds(120))
	if l.CellID != later.ID {
		e.t.Errorf("leased cell %s, want %s", l.CellID, later.ID)
	}
	if !l.ExpiresAt.Equal(e.now.Add(120 * time.Second)) {
		e.t.Errorf("lease expiry = %s, want now + 120 s", attest.CanonicalTime(l.ExpiresAt))
	}
	// A shorter lease fits before the exact deadline.
	l = e.mustLease(leaseSeconds(119))
	if l.CellID != exact.ID {
		e.t.Errorf("leased cell %s, want %s", l.CellID, exact.ID)
	}
	e.mustEmpty(leaseSeconds(1))
}

// testClaimDeadlineBetweenClaims checks the deadline of each claim's own
// lease even when the cell next in line was seen, and found good enough, by
// a shorter claim before it: the candidates a store remembers for the next
// claim (on Postgres, the one a lease statement returns; on SQLite, the
// ones a pick read after its own).
func testClaimDeadlineBetweenClaims(e *env) {
	deadline := func(d time.Duration) func(*store.PrepareParams) {
		return func(p *store.PrepareParams) { p.ExpiresAt = e.now.Add(d) }
	}
	first := e.prepare(deadline(time.Hour))
	soon := e.prepare(deadline(60 * time.Second))
	last := e.prepare(deadline(time.Hour))
	for i, c := range []struct {
		seconds uint64
		want    lease.Cell
	}{{30, first}, {300, last}, {30, soon}} {
		if l := e.mustLease(leaseSeconds(c.seconds), fenced(newID())); l.CellID != c.want.ID {
			e.t.Errorf("claim %d (lease %d s) leased cell %s, want %s", i+1, c.seconds, l.CellID, c.want.ID)
		}
	}
	e.mustEmpty(leaseSeconds(1))
}

func testClaimUnfencedTwice(e *env) {
	e.prepare()
	e.prepare()
	e.prepare()
	p := e.claimParams()
	r1, err := e.s.Claim(e.ctx, p)
	e.wantOK(err, "Claim")
	p.LeaseID = newID()
	r2, err := e.s.Claim(e.ctx, p)
	e.wantOK(err, "identical unfenced Claim")
	if r1.Lease == nil || r2.Lease == nil {
		e.t.Fatalf("identical unfenced claims leased %v and %v, want two leases", r1.Lease, r2.Lease)
	}
	if r1.Lease.CellID == r2.Lease.CellID || r1.Lease.ID == r2.Lease.ID {
		e.t.Errorf("identical unfenced claims share cell or lease: %+v, %+v", *r1.Lease, *r2.Lease)
	}
	if r1.Replayed || r2.Replayed {
		e.t.Error("an unfenced claim reported Replayed")
	}
	e.wantCellCounts(map[lease.State]int{lease.Ready: 1, lease.Leased: 2})
}

func testClaimEmpty(e *env) {
	res := e.mustEmpty()
	if res.Replayed || res.PoolName != "" {
		e.t.Errorf("empty Claim = %+v, want zero result", res)
	}
	res = e.mustEmpty(fenced(newID()))
	if res.Replayed || res.PoolName != "" {
		e.t.Errorf("empty fenced Claim = %+v, want zero result", res)
	}
	e.wantCellCounts(nil)
}

func testClaimOnlyReady(e *env) {
	leased := e.prepare()
	l := e.mustLease()
	destroyedCell := e.prepare()
	l2 := e.mustLease()
	_, err := e.s.Destroy(e.ctx, store.DestroyParams{WorkerID: workerA, CellID: destroyedCell.ID, LeaseID: l2.ID,
		Generation: 2, Disposition: lease.Destroyed, Now: e.now})
	e.wantOK(err, "Destroy")
	retired := e.prepare()
	_, err = e.s.Retire(e.ctx, store.RetireParams{WorkerID: workerA, CellID: retired.ID, Generation: 1, Now: e.now})
	e.wantOK(err, "Retire")
	before := e.snapshot()
	e.mustEmpty()
	e.mustEmpty(fenced(newID()))
	e.unchanged(before, "Claim without ready inventory")
	if l.CellID != leased.ID {
		e.t.Errorf("leased cell %s, want %s", l.CellID, leased.ID)
	}
}

// testClaimContextEnds ends a fenced claim's context from inside the claim,
// in its Sign callback: the claim returns the context's error and writes
// nothing, so the same claim_id leases afresh afterwards.
func testClaimContextEnds(e *env) {
	c := e.prepare()
	claimID := newID()
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	p := e.claimParams(fenced(claimID))
	sign := p.Sign
	p.Sign = func(l lease.Lease) string {
		cancel()
		return sign(l)
	}
	if res, err := e.s.Claim(ctx, p); !errors.Is(err, context.Canceled) {
		e.t.Fatalf("Claim whose context ended inside it = %+v, %v; want context.Canceled", res, err)
	}
	e.wantCellCounts(map[lease.State]int{lease.Ready: 1})
	res, err := e.s.Claim(e.ctx, e.claimParams(fenced(claimID)))
	e.wantOK(err, "Claim after the cancelled one")
	if res.Replayed || res.Lease == nil || res.Lease.CellID != c.ID {
		e.t.Errorf("Claim after the cancelled one = %+v, want a new lease of %s", res, c.ID)
	}
}

// testClaimSignPanics has Sign panic inside the claim: the panic reaches
// the caller, and the store is not left holding the claim's transaction
// (or, on SQLite, its one writer): the next claim leases the cell.
func testClaimSignPanics(e *env) {
	c := e.prepare()
	p := e.claimParams()
	p.Sign = func(lease.Lease) string { panic("sign failed") }
	func() {
		defer func() {
			if recover() == nil {
				e.t.Error("Claim did not pass Sign's panic on")
			}
		}()
		_, _ = e.s.Claim(e.ctx, p)
	}()
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	res, err := e.s.Claim(ctx, e.claimParams())
	e.wantOK(err, "Claim after a panic")
	if res.Lease == nil || res.Lease.CellID != c.ID {
		e.t.Errorf("Claim after a panic = %+v, want a lease of %s", res, c.ID)
	}
}
