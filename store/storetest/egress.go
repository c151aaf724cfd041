package storetest

import (
	"github.com/sandboxwich/sandboxwich/store"
)

// Egress policy (CONTRACT §22): a claim restricted to pools takes only
// their cells, and a claim that names egress leaves its canonical form on
// the leased cell, which evidence reports.
var egressScenarios = []scenario{
	{"Egress/PoolsAndNarrowing", testEgressClaim},
}

// testEgressClaim: cells of pool A (egress allowing pkgs.test), pool B
// (none) and an external worker; a claim restricted to pool A takes pool
// A's cell though the others are older, and its egress becomes the cell's;
// a restriction matches whole pool names only; a claim with no restriction
// takes the oldest cell and keeps that cell's egress.
func testEgressClaim(e *env) {
	const open = "pkgs.test:443\npkgs.test:80"
	w := e.prepare()
	admit := func(pool, egress string) {
		e.t.Helper()
		ap := e.admitParams(e.createMember(pool))
		ap.Egress = egress
		_, err := e.s.AdmitMember(e.ctx, ap)
		e.wantOK(err, "AdmitMember")
	}
	admit(poolB, "")
	admit(poolA, open)
	restrict := func(egress string, pools ...string) func(*store.ClaimParams) {
		return func(p *store.ClaimParams) { p.Pools, p.Egress = pools, egress }
	}
	e.mustEmpty(restrict("pkgs.test:443", "pool")) // a prefix of both names
	l := e.mustLease(restrict("pkgs.test:443", poolB+"-x", poolA))
	if ev := e.evidence(tenantA, l); ev.Pool != poolA || ev.Egress != "pkgs.test:443" {
		e.t.Errorf("a claim restricted to %s narrowing egress: evidence %+v, want pool A's cell with egress pkgs.test:443", poolA, ev)
	}
	e.mustEmpty(restrict("pkgs.test:443", poolA))
	if l := e.mustLease(); l.CellID != w.ID {
		e.t.Errorf("an unrestricted claim leased %s, want the oldest cell %s", l.CellID, w.ID)
	} else if ev := e.evidence(tenantA, l); ev.Egress != "none" {
		e.t.Errorf("an external worker's cell has egress %q, want none", ev.Egress)
	}
	l = e.mustLease()
	if ev := e.evidence(tenantA, l); ev.Pool != poolB || ev.Egress != "none" {
		e.t.Errorf("pool B's cell: evidence %+v, want egress none", ev)
	}
}
