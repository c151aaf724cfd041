package httpapi

import (
	"testing"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/egress"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
	"github.com/sandboxwich/sandboxwich/wire"
)

// TestClaimEgress (CONTRACT §22): a claim's egress is a list of strings
// (a malformed one 422 invalid_request, a wider one 422
// egress_not_allowed, neither recording anything); a narrowing claim is
// leased, and its evidence carries the narrowed canonical form and its
// digest; a retry of its claim_id with another egress is 409.
func TestClaimEgress(t *testing.T) {
	rel := signedRelease(t, lease.GVisorLowerRisk)
	open, err := egress.Parse([]string{"pkgs.test"})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnvWith(t, backends[0], []sandboxwich.Option{sandboxwich.WithPools(
		pool.Config{Name: "open", TenantID: "acme", Release: rel, Target: 1,
			Provider: fake.New(fake.Config{Mode: driver.Apply, Kind: "fake", Egress: true}), Egress: open})})
	e.plane.Pools().Pass(t.Context())
	id := uuid.Must(uuid.NewV7())
	body := func(entries any) map[string]any {
		return with(e.claimBody(&id, lease.GVisorLowerRisk), "egress", entries)
	}
	for _, bad := range []any{"pkgs.test", []any{"pkgs.test", nil}, []string{"10.0.0.1"}, []string{"pkgs.test:0"}, []string{"a b"}} {
		e.do("POST", "/v1/sterile-cells/claim", tokAcme, body(bad)).errCode(t, 422, "invalid_request")
	}
	e.do("POST", "/v1/sterile-cells/claim", tokAcme, body([]string{"evil.test"})).errCode(t, 422, "egress_not_allowed")
	r := e.do("POST", "/v1/sterile-cells/claim", tokAcme, body([]string{"PKGS.test.:443"})).must(t, 200)
	c := decodeAs[wire.ClaimResponse](t, r)
	if c.Lease == nil {
		t.Fatalf("a claim narrowing the pool's egress found no cell: %s", r.body)
	}
	ev := decodeAs[wire.EvidenceResponse](t, e.do("GET", leasePath(c.Lease.LeaseID, "/evidence"), tokAcme, nil).must(t, 200)).Evidence
	if ev.Egress != "pkgs.test:443" || ev.EgressDigest != egress.DigestOf("pkgs.test:443") {
		t.Errorf("evidence egress %q digest %q, want pkgs.test:443 and its digest", ev.Egress, ev.EgressDigest)
	}
	r = e.do("GET", leasePath(c.Lease.LeaseID, "/egress"), tokAcme, nil).must(t, 200)
	checkSchema(t, "EgressResponse", r.body)
	if string(r.body) != `{"ok":true,"hosts":[]}` {
		t.Errorf("the egress counts of a cell that carries no traffic: %s", r.body)
	}
	e.do("GET", leasePath(c.Lease.LeaseID, "/egress"), tokGlobex, nil).errCode(t, 404, "not_found")
	e.do("POST", "/v1/sterile-cells/claim", tokAcme, body([]string{})).errCode(t, 409, "conflict")
	if again := decodeAs[wire.ClaimResponse](t, e.do("POST", "/v1/sterile-cells/claim", tokAcme, body([]string{"pkgs.test:443"})).must(t, 200)); again.Lease == nil || again.Lease.LeaseID != c.Lease.LeaseID {
		t.Errorf("a retry with the same canonical egress: %+v, want the same lease", again)
	}
}
