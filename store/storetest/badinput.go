package storetest

import (
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

var badInputScenarios = []scenario{
	{"BadInput/Claim", testBadClaim},
	{"BadInput/Disposition", testBadDisposition},
}

func testBadClaim(e *env) {
	e.prepare()
	claimID := newID()
	before := e.snapshot()
	for name, mutate := range map[string]func(*store.ClaimParams){
		"empty tenant":     func(p *store.ClaimParams) { p.TenantID = "" },
		"nil Sign":         func(p *store.ClaimParams) { p.Sign = nil },
		"zero lease time":  func(p *store.ClaimParams) { p.LeaseSeconds = 0 },
		"nil Sign, fenced": func(p *store.ClaimParams) { p.Sign, p.ClaimID = nil, claimID },
		"zero lease time, fenced": func(p *store.ClaimParams) {
			p.LeaseSeconds, p.ClaimID = 0, claimID
			p.Digest = claimDigest(*p)
		},
	} {
		p := e.claimParams()
		mutate(&p)
		res, err := e.s.Claim(e.ctx, p)
		e.wantErr(err, errcode.ErrInvalidRequest, "Claim with "+name)
		if res.Lease != nil {
			e.t.Errorf("Claim with %s leased %s", name, res.Lease.ID)
		}
	}
	e.unchanged(before, "invalid claims")
	// No fence was recorded under the claim ID.
	res := e.claim(fenced(claimID))
	if res.Lease == nil || res.Replayed {
		e.t.Errorf("first valid claim with the claim ID of invalid ones = %+v, want a new lease", res)
	}
}

var badDispositions = []lease.Disposition{"ready", "leased", "", "DESTROYED", "bogus"}

func testBadDisposition(e *env) {
	_, _, pl := e.poolLease()
	pc := e.prepare()
	l := e.mustLease()
	rm, _ := e.poolCell(poolA)
	before := e.snapshot()
	for _, d := range badDispositions {
		_, err := e.s.Release(e.ctx, store.ReleaseParams{LeaseCheck: e.check(pl), Disposition: d})
		e.wantErr(err, errcode.ErrInvalidRequest, "Release with disposition "+string(d))
		_, err = e.destroy(pc.ID, l.ID, 2, d)
		e.wantErr(err, errcode.ErrInvalidRequest, "Destroy with disposition "+string(d))
		_, err = e.beginStop(rm.CellID, d, lease.MemberReady)
		e.wantErr(err, errcode.ErrInvalidRequest, "BeginStop with disposition "+string(d))
	}
	e.unchanged(before, "calls with an invalid disposition")
}
