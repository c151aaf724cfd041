package storetest

import (
	"errors"
	"strings"
	"time"

	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

var fencedScenarios = []scenario{
	{"FencedClaim/Replay", testFencedReplay},
	{"FencedClaim/ReplayPoolCell", testFencedReplayPool},
	{"FencedClaim/EmptyIsDurable", testFencedEmptyDurable},
	{"FencedClaim/DigestMismatch", testFencedDigestMismatch},
	{"FencedClaim/DigestMismatchAfterEmpty", testFencedDigestMismatchEmpty},
	{"FencedClaim/OtherTenantIndependent", testFencedOtherTenant},
	{"FencedClaim/ReplayAfterExpiry", testFencedReplayExpired},
	{"FencedClaim/ReplayAfterDestroy", func(e *env) { testFencedReplayTerminal(e, lease.Destroyed) }},
	{"FencedClaim/ReplayAfterQuarantine", func(e *env) { testFencedReplayTerminal(e, lease.Quarantined) }},
	{"FencedClaim/WaitingRecordsNothing", testFencedWaiting},
	{"FencedClaim/EmptyReasonReplayed", testFencedEmptyReason},
}

func testFencedReplay(e *env) {
	c := e.prepare()
	e.prepare()
	claimID := newID()
	p := e.claimParams(fenced(claimID))
	first, err := e.s.Claim(e.ctx, p)
	e.wantOK(err, "fenced Claim")
	if first.Lease == nil || first.Replayed {
		e.t.Fatalf("first fenced Claim = %+v, want a new lease", first)
	}
	if first.Lease.CellID != c.ID {
		e.t.Errorf("fenced Claim leased cell %s, want %s", first.Lease.CellID, c.ID)
	}
	for i := range 3 {
		e.advance(10 * time.Second)
		retry := p
		retry.LeaseID, retry.Now = newID(), e.now // a retry brings its own new lease ID
		res, err := e.s.Claim(e.ctx, retry)
		e.wantOK(err, "fenced retry")
		if !res.Replayed {
			e.t.Errorf("retry %d: Replayed = false", i+1)
		}
		e.wantLease(res.Lease, *first.Lease, "replayed lease")
		if res.PoolName != "" {
			e.t.Errorf("retry %d: PoolName = %q", i+1, res.PoolName)
		}
		// The attestation regenerates byte for byte.
		if res.Lease != nil && attest.Digest(e.kr.LeaseToken(attest.ClaimsOf(*res.Lease))) != first.Lease.AttestationDigest {
			e.t.Error("the replayed lease does not regenerate the stored attestation")
		}
	}
	e.wantCellCounts(map[lease.State]int{lease.Ready: 1, lease.Leased: 1})
}

func testFencedReplayPool(e *env) {
	m, _ := e.poolCell(poolA)
	claimID := newID()
	first := e.claim(fenced(claimID))
	if first.Lease == nil || first.PoolName != poolA {
		e.t.Fatalf("fenced Claim of a pool cell = %+v, want a lease in %s", first, poolA)
	}
	again := e.claim(fenced(claimID))
	if !again.Replayed || again.PoolName != poolA {
		e.t.Errorf("replay of a pool lease = Replayed %v PoolName %q, want true and %s", again.Replayed, again.PoolName, poolA)
	}
	e.wantLease(again.Lease, *first.Lease, "replayed pool lease")
	if got := e.member(m.CellID).State; got != lease.MemberLeased {
		e.t.Errorf("member after replay = %s, want leased", got)
	}
}

func testFencedEmptyDurable(e *env) {
	claimID := newID()
	first := e.mustEmpty(fenced(claimID))
	if first.Replayed {
		e.t.Error("the first empty fenced Claim reported Replayed")
	}
	c := e.prepare()
	before := e.snapshot()
	res := e.mustEmpty(fenced(claimID))
	if !res.Replayed {
		e.t.Error("the retry of an empty fenced Claim did not report Replayed")
	}
	e.advance(time.Minute)
	e.mustEmpty(fenced(claimID))
	e.unchanged(before, "retrying an empty fenced claim")
	// The inventory is still there for other claims.
	if l := e.mustLease(fenced(newID())); l.CellID != c.ID {
		e.t.Errorf("new fenced claim leased %s, want %s", l.CellID, c.ID)
	}
}

// waiting marks a claim attempt as one of a waiting claim.
func waiting(p *store.ClaimParams) { p.Waiting = true }

// testFencedWaiting: an attempt of a waiting claim that finds no cell
// records nothing, however often it is made; an outcome recorded under its
// fence meanwhile (a lease, or an empty one) decides it, and another
// request under the claim_id is a conflict; once a cell is claimable, the
// waiting claim leases it like any claim.
func testFencedWaiting(e *env) {
	claimID := newID()
	before := e.snapshot()
	for range 2 {
		if res := e.mustEmpty(fenced(claimID), waiting); res.Replayed || res.EmptyReason != "" {
			e.t.Errorf("a waiting attempt without inventory = %+v, want empty, not replayed", res)
		}
	}
	e.unchanged(before, "waiting attempts without inventory")
	c := e.prepare()
	if l := e.mustLease(fenced(claimID), waiting); l.CellID != c.ID {
		e.t.Errorf("the waiting claim leased %s, want %s", l.CellID, c.ID)
	}
	if again := e.claim(fenced(claimID), waiting); !again.Replayed || again.Lease == nil || again.Lease.CellID != c.ID {
		e.t.Errorf("a waiting attempt after its lease was recorded = %+v, want the lease replayed", again)
	}

	// Recorded empty (the wait's last attempt) decides later attempts.
	claimID = newID()
	e.mustEmpty(fenced(claimID), withEmptyReason("wait_elapsed"))
	e.prepare()
	if res := e.claim(fenced(claimID), waiting); !res.Replayed || res.Lease != nil || res.EmptyReason != "wait_elapsed" {
		e.t.Errorf("a waiting attempt after an empty outcome was recorded = %+v, want it replayed", res)
	}
	p := e.claimParams(fenced(claimID), waiting, leaseSeconds(300))
	if _, err := e.s.Claim(e.ctx, p); !errors.Is(err, errcode.ErrConflict) {
		e.t.Errorf("a waiting attempt with another request under a recorded claim_id: %v, want a conflict", err)
	}
}

func withEmptyReason(r string) func(*store.ClaimParams) {
	return func(p *store.ClaimParams) { p.EmptyReason = r }
}

// testFencedEmptyReason: the reason given with a fenced claim that ends
// empty is recorded with its fence and answered by its replays; without
// one (Part I), replays answer none.
func testFencedEmptyReason(e *env) {
	withReason, without := newID(), newID()
	if res := e.mustEmpty(fenced(withReason), withEmptyReason("wait_elapsed")); res.EmptyReason != "wait_elapsed" || res.Replayed {
		e.t.Errorf("an empty claim with a reason = %+v, want wait_elapsed, not replayed", res)
	}
	if res := e.mustEmpty(fenced(without)); res.EmptyReason != "" {
		e.t.Errorf("an empty claim without a reason = %+v, want none", res)
	}
	e.prepare()
	if res := e.mustEmpty(fenced(withReason), withEmptyReason("wait_elapsed")); !res.Replayed || res.EmptyReason != "wait_elapsed" {
		e.t.Errorf("the replay = %+v, want wait_elapsed replayed", res)
	}
	if res := e.mustEmpty(fenced(without)); !res.Replayed || res.EmptyReason != "" {
		e.t.Errorf("the Part I replay = %+v, want no reason", res)
	}
}

// mismatches are claims that differ from the default claim in one field of
// the digest.
func (e *env) mismatches() map[string][]func(*store.ClaimParams) {
	b := func(f func(*lease.Binding)) []func(*store.ClaimParams) {
		x := binding1
		f(&x)
		return []func(*store.ClaimParams){withBinding(x)}
	}
	r := func(f func(*lease.Release)) []func(*store.ClaimParams) {
		x := e.kata
		f(&x)
		return []func(*store.ClaimParams){withRelease(x)}
	}
	return map[string][]func(*store.ClaimParams){
		"lease_seconds":     {leaseSeconds(300)},
		"organization_id":   b(func(x *lease.Binding) { x.OrganizationID = "org-2" }),
		"workspace_id":      b(func(x *lease.Binding) { x.WorkspaceID = "workspace-2" }),
		"thread_id":         b(func(x *lease.Binding) { x.ThreadID = "thread-2" }),
		"runner_session_id": b(func(x *lease.Binding) { x.RunnerSessionID = "session-2" }),
		"release_set_id":    r(func(x *lease.Release) { x.ReleaseSetID = "release-set-2026-08-08" }),
		"runtime_class":     {withRelease(e.gvis)},
		"policy_digest":     r(func(x *lease.Release) { x.PolicyDigest = strings.Repeat("b", 64) }),
		"signature":         r(func(x *lease.Release) { x.Signature = e.gvis.Signature }),
	}
}

func testFencedDigestMismatch(e *env) {
	claimID := newID()
	e.prepare()
	first := e.mustLease(fenced(claimID))
	// Inventory for every variant, so that a wrong claim could take a cell.
	for _, opts := range e.mismatches() {
		p := e.claimParams(opts...)
		e.prepare(func(pp *store.PrepareParams) { pp.Release = p.Release })
	}
	before := e.snapshot()
	for name, opts := range e.mismatches() {
		_, err := e.s.Claim(e.ctx, e.claimParams(append(opts, fenced(claimID))...))
		e.wantErr(err, errcode.ErrConflict, "same claim_id with another "+name)
	}
	e.unchanged(before, "claims with a mismatched digest")
	res := e.claim(fenced(claimID))
	e.wantLease(res.Lease, first, "replay after mismatches")
}

func testFencedDigestMismatchEmpty(e *env) {
	claimID := newID()
	e.mustEmpty(fenced(claimID))
	for _, opts := range e.mismatches() {
		p := e.claimParams(opts...)
		e.prepare(func(pp *store.PrepareParams) { pp.Release = p.Release })
	}
	before := e.snapshot()
	for name, opts := range e.mismatches() {
		_, err := e.s.Claim(e.ctx, e.claimParams(append(opts, fenced(claimID))...))
		e.wantErr(err, errcode.ErrConflict, "same claim_id as an empty claim with another "+name)
	}
	e.unchanged(before, "claims with a mismatched digest")
}

func testFencedOtherTenant(e *env) {
	claimID := newID()
	a := e.prepare()
	b := e.prepare(func(p *store.PrepareParams) { p.TenantID, p.WorkerID = tenantB, workerB })
	la := e.mustLease(fenced(claimID))
	// The same claim ID, even with another digest, is a new claim for B.
	resB := e.claim(fenced(claimID), asTenant(tenantB), leaseSeconds(60))
	if resB.Lease == nil || resB.Replayed || resB.Lease.CellID != b.ID {
		e.t.Fatalf("tenant B claim with tenant A's claim_id = %+v, want a new lease of cell %s", resB, b.ID)
	}
	if la.CellID != a.ID {
		e.t.Errorf("tenant A leased %s, want %s", la.CellID, a.ID)
	}
	e.wantLease(e.claim(fenced(claimID)).Lease, la, "tenant A replay")
	e.wantLease(e.claim(fenced(claimID), asTenant(tenantB), leaseSeconds(60)).Lease, *resB.Lease, "tenant B replay")
	// An empty record in one tenant does not hold the other back.
	other := newID()
	e.mustEmpty(fenced(other), asTenant(tenantB))
	c := e.prepare()
	if l := e.mustLease(fenced(other)); l.CellID != c.ID {
		e.t.Errorf("tenant A leased %s, want %s", l.CellID, c.ID)
	}
}

func testFencedReplayExpired(e *env) {
	c := e.prepare()
	e.prepare() // spare inventory: an expired claim must not take another cell
	claimID := newID()
	l := e.mustLease(fenced(claimID), leaseSeconds(60))
	e.now = l.ExpiresAt.Add(-time.Microsecond)
	e.wantLease(e.claim(fenced(claimID), leaseSeconds(60)).Lease, l, "replay a microsecond before expiry")

	e.now = l.ExpiresAt
	_, err := e.s.Claim(e.ctx, e.claimParams(fenced(claimID), leaseSeconds(60)))
	e.wantErr(err, errcode.ErrConflict, "replay at expiry")
	want := withState(leasedCell(c, l), lease.Quarantined)
	e.wantCell(e.cell(workerA, c.ID), want, "cell after a replay at expiry")
	e.wantCellCounts(map[lease.State]int{lease.Ready: 1, lease.Quarantined: 1})

	before := e.snapshot()
	e.advance(time.Hour)
	_, err = e.s.Claim(e.ctx, e.claimParams(fenced(claimID), leaseSeconds(60)))
	e.wantErr(err, errcode.ErrConflict, "replay after expiry")
	e.unchanged(before, "replay of a quarantined claim")
}

func testFencedReplayTerminal(e *env, d lease.Disposition) {
	c := e.prepare()
	e.prepare()
	claimID := newID()
	l := e.mustLease(fenced(claimID))
	_, err := e.s.Destroy(e.ctx, store.DestroyParams{WorkerID: workerA, CellID: c.ID, LeaseID: l.ID,
		Generation: 2, Disposition: d, Now: e.now})
	e.wantOK(err, "Destroy")
	before := e.snapshot()
	_, err = e.s.Claim(e.ctx, e.claimParams(fenced(claimID)))
	e.wantErr(err, errcode.ErrConflict, "replay of a "+string(d)+" lease")
	e.unchanged(before, "replay of a "+string(d)+" lease")
	e.wantCell(e.cell(workerA, c.ID), withState(leasedCell(c, l), d), "cell after the replay")
}
