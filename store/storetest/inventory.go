package storetest

import (
	"reflect"
	"strings"
	"time"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

var inventoryScenarios = []scenario{
	{"Inventory/CountsReadyByRelease", testInventoryCounts},
	{"Evidence/AdmissionAndVerification", testEvidence},
	{"Evidence/PreparedCell", testEvidencePrepared},
	{"Evidence/UnknownAndForeign", testEvidenceForeign},
	{"RecordVerification/OnlyLiveMembers", testVerificationLiveOnly},
}

func (e *env) inventory(tenant string, after time.Time) []store.InventoryEntry {
	e.t.Helper()
	inv, err := e.s.Inventory(e.ctx, store.InventoryParams{TenantID: tenant, After: after})
	e.wantOK(err, "Inventory")
	for i := range inv {
		inv[i].LatestDeadline = nt(inv[i].LatestDeadline)
	}
	return inv
}

// testInventoryCounts: ready cells that outlive After count by release
// (set, class, digest), in that order; leased, terminal, expiring and
// foreign cells do not.
func testInventoryCounts(e *env) {
	otherDigest := releaseFor(e.kr, releaseSetID, lease.KataMicroVM, strings.Repeat("b", 64))
	otherSet := releaseFor(e.kr, "release-set-0", lease.GVisorLowerRisk, policyDigest)
	deadline := func(d time.Duration) func(*store.PrepareParams) {
		return func(p *store.PrepareParams) { p.ExpiresAt = e.now.Add(d) }
	}
	withRel := func(r lease.Release, d time.Duration) func(*store.PrepareParams) {
		return func(p *store.PrepareParams) { p.Release, p.ExpiresAt = r, e.now.Add(d) }
	}
	e.prepare(deadline(time.Hour))
	e.prepare(deadline(2 * time.Hour))
	e.prepare(deadline(3 * time.Hour))
	e.mustLease()                    // the oldest kata cell: 2 and 3 hours remain
	e.prepare(deadline(time.Second)) // expires within the shortest lease
	e.prepare(withRel(e.gvis, time.Hour))
	e.prepare(withRel(otherDigest, 30*time.Minute))
	e.prepare(withRel(otherSet, 10*time.Minute))
	retired := e.prepare(withRel(otherSet, 4*time.Hour))
	_, err := e.retire(workerA, retired.ID, 1)
	e.wantOK(err, "Retire")
	_, pc := e.poolCell(poolA) // kata, one hour
	e.prepare(func(p *store.PrepareParams) {
		p.TenantID, p.WorkerID, p.ExpiresAt = tenantB, workerB, e.now.Add(5*time.Hour)
	})

	before := e.snapshot()
	after := e.now.Add(time.Second)
	got := e.inventory(tenantA, after)
	want := []store.InventoryEntry{
		{ReleaseSetID: "release-set-0", RuntimeClass: lease.GVisorLowerRisk, PolicyDigest: policyDigest, Ready: 1, LatestDeadline: e.now.Add(10 * time.Minute)},
		{ReleaseSetID: releaseSetID, RuntimeClass: lease.GVisorLowerRisk, PolicyDigest: policyDigest, Ready: 1, LatestDeadline: e.now.Add(time.Hour)},
		{ReleaseSetID: releaseSetID, RuntimeClass: lease.KataMicroVM, PolicyDigest: policyDigest, Ready: 3, LatestDeadline: e.now.Add(3 * time.Hour)},
		{ReleaseSetID: releaseSetID, RuntimeClass: lease.KataMicroVM, PolicyDigest: otherDigest.PolicyDigest, Ready: 1, LatestDeadline: e.now.Add(30 * time.Minute)},
	}
	if pc.ExpiresAt != e.now.Add(time.Hour) {
		e.t.Fatalf("pool cell deadline %s", pc.ExpiresAt)
	}
	if !reflect.DeepEqual(got, want) {
		e.t.Errorf("Inventory:\n got  %+v\n want %+v", got, want)
	}
	// A deadline equal to After does not count.
	got = e.inventory(tenantA, e.now.Add(time.Hour))
	want = []store.InventoryEntry{
		{ReleaseSetID: releaseSetID, RuntimeClass: lease.KataMicroVM, PolicyDigest: policyDigest, Ready: 2, LatestDeadline: e.now.Add(3 * time.Hour)},
	}
	if !reflect.DeepEqual(got, want) {
		e.t.Errorf("Inventory after an hour:\n got  %+v\n want %+v", got, want)
	}
	if got := e.inventory("tenant-c", after); len(got) != 0 || got == nil {
		e.t.Errorf("Inventory of an unknown tenant = %#v, want an empty list", got)
	}
	if got := e.inventory(tenantB, after); len(got) != 1 || got[0].Ready != 1 {
		e.t.Errorf("Inventory of tenant B = %+v, want its one cell", got)
	}
	e.unchanged(before, "Inventory")
}

func (e *env) evidence(tenant string, l lease.Lease) store.Evidence {
	e.t.Helper()
	ev, err := e.s.Evidence(e.ctx, tenant, l.ID)
	e.wantOK(err, "Evidence")
	ev.AdmittedAt, ev.VerifiedAt = nt(ev.AdmittedAt), nt(ev.VerifiedAt)
	return ev
}

const agentDigest = "sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

const imageDigest = "sha256:" + "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"

// testEvidence: admission records what was read back, verified at once;
// a later verification moves the verification time (never back) and the
// observation, not the admission time, nor the membership.
func testEvidence(e *env) {
	m := e.createMember(poolA)
	e.advance(time.Second)
	ap := e.admitParams(m)
	ap.AdmittedClass, ap.AgentDigest, ap.ImageDigest = lease.KataMicroVM, agentDigest, imageDigest
	_, err := e.s.AdmitMember(e.ctx, ap)
	e.wantOK(err, "AdmitMember")
	admitted := e.now
	l := e.mustLease()
	want := store.Evidence{CellID: m.CellID, Pool: poolA, RuntimeClass: lease.KataMicroVM, AgentDigest: agentDigest,
		ImageDigest: imageDigest, Egress: "none", AdmittedAt: admitted, VerifiedAt: admitted}
	if got := e.evidence(tenantA, l); got != want {
		e.t.Errorf("Evidence after admission:\n got  %+v\n want %+v", got, want)
	}

	before := e.snapshot()
	e.advance(10 * time.Second)
	e.wantOK(e.s.RecordVerification(e.ctx, store.VerificationParams{CellID: m.CellID,
		RuntimeClass: lease.KataMicroVM, Now: e.now}), "RecordVerification")
	e.unchanged(before, "RecordVerification")
	want.VerifiedAt, want.AgentDigest, want.ImageDigest = e.now, "", ""
	if got := e.evidence(tenantA, l); got != want {
		e.t.Errorf("Evidence after a verification:\n got  %+v\n want %+v", got, want)
	}
	// A verification stamped earlier (another replica's clock) is ignored.
	e.wantOK(e.s.RecordVerification(e.ctx, store.VerificationParams{CellID: m.CellID,
		RuntimeClass: lease.KataMicroVM, AgentDigest: agentDigest, Now: e.now.Add(-5 * time.Second)}), "RecordVerification")
	if got := e.evidence(tenantA, l); got != want {
		e.t.Errorf("Evidence after an older verification:\n got  %+v\n want %+v", got, want)
	}
	// A verification records the image digest it read back.
	e.advance(time.Second)
	e.wantOK(e.s.RecordVerification(e.ctx, store.VerificationParams{CellID: m.CellID,
		RuntimeClass: lease.KataMicroVM, ImageDigest: imageDigest, Now: e.now}), "RecordVerification")
	want.VerifiedAt, want.ImageDigest = e.now, imageDigest
	if got := e.evidence(tenantA, l); got != want {
		e.t.Errorf("Evidence after a verification with an image:\n got  %+v\n want %+v", got, want)
	}

	// A member admitted without an observation has an admission time only.
	m2 := e.createMember(poolB)
	_, err = e.s.AdmitMember(e.ctx, e.admitParams(m2))
	e.wantOK(err, "AdmitMember")
	l2 := e.mustLease()
	want2 := store.Evidence{CellID: m2.CellID, Pool: poolB, Egress: "none", AdmittedAt: e.now, VerifiedAt: e.now}
	if got := e.evidence(tenantA, l2); got != want2 {
		e.t.Errorf("Evidence without an observation:\n got  %+v\n want %+v", got, want2)
	}
	for _, p := range []store.VerificationParams{{RuntimeClass: lease.KataMicroVM, Now: e.now},
		{CellID: m.CellID, RuntimeClass: "vm", Now: e.now}} {
		e.wantErr(e.s.RecordVerification(e.ctx, p), errcode.ErrInvalidRequest, "RecordVerification with bad parameters")
	}
}

func testEvidencePrepared(e *env) {
	c := e.prepare()
	l := e.mustLease()
	if got := e.evidence(tenantA, l); got != (store.Evidence{CellID: c.ID, Egress: "none"}) {
		e.t.Errorf("Evidence of a prepared cell = %+v, want its cell ID and egress none only", got)
	}
}

func testEvidenceForeign(e *env) {
	e.poolCell(poolA)
	l := e.mustLease()
	for name, tc := range map[string]struct {
		tenant string
		l      lease.Lease
	}{
		"unknown": {tenantA, lease.Lease{ID: newID()}},
		"foreign": {tenantB, l},
	} {
		_, err := e.s.Evidence(e.ctx, tc.tenant, tc.l.ID)
		e.wantErr(err, errcode.ErrNotFound, "Evidence of an "+name+" lease")
	}
}

// testVerificationLiveOnly: verifications of members that are stopping,
// terminal or not yet admitted record nothing, and fail nothing.
func testVerificationLiveOnly(e *env) {
	m, _, l := e.poolLease()
	prov := e.createMember(poolA)
	admitted := e.evidence(tenantA, l)
	_, err := e.release(l, lease.Destroyed)
	e.wantOK(err, "Release")
	before := e.snapshot()
	e.advance(time.Minute)
	for _, id := range []store.Member{m, prov} {
		e.wantOK(e.s.RecordVerification(e.ctx, store.VerificationParams{CellID: id.CellID, RuntimeClass: lease.KataMicroVM,
			AgentDigest: agentDigest, Now: e.now}), "RecordVerification of a member not ready or leased")
	}
	e.wantOK(e.s.RecordVerification(e.ctx, store.VerificationParams{CellID: newID(), Now: e.now}), "RecordVerification of an unknown member")
	e.unchanged(before, "RecordVerification of members not ready or leased")
	if got := e.evidence(tenantA, l); got != admitted {
		e.t.Errorf("Evidence after verifying a stopping member:\n got  %+v\n want %+v", got, admitted)
	}
}
