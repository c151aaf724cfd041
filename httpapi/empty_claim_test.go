package httpapi

import (
	"strings"
	"testing"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/wire"
)

// TestEmptyClaimReason: an empty claim says in the log and in
// sandboxwich_claims_empty_total whether the inventory is empty or its
// cells expire before the requested lease would end.
func TestEmptyClaimReason(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnvWith(t, b, []sandboxwich.Option{sandboxwich.WithMaxLeaseSeconds(3600)})
		e.prepare(worker1, tokWorker1, lease.KataMicroVM) // ready for 10 minutes
		long := with(e.claimBody(nil, lease.KataMicroVM), "lease_seconds", 3600)
		for _, body := range []map[string]any{long, e.claimBody(nil, lease.GVisorLowerRisk)} {
			r := e.do("POST", "/v1/sterile-cells/claim", tokAcme, body).must(t, 200)
			if !strings.Contains(string(r.body), `"lease":null`) {
				t.Fatalf("claim not empty: %s", r.body)
			}
		}
		if c := e.claim(tokAcme, nil, lease.KataMicroVM); c.Lease == nil {
			t.Fatal("a claim for a lease the cell outlives found no cell")
		}
		metrics := string(e.do("GET", "/metrics", tokAcme, nil, wire.OperatorHeader, tokOperator).must(t, 200).body)
		for _, want := range []string{
			`sandboxwich_claims_empty_total{reason="expires_too_soon"} 1`,
			`sandboxwich_claims_empty_total{reason="no_inventory"} 1`,
			`sandboxwich_claims_empty_total{reason="held_back"} 0`,
			`sandboxwich_claims_total{outcome="empty"} 2`,
		} {
			if !strings.Contains(metrics, want) {
				t.Errorf("metrics lack %s", want)
			}
		}
		logs := e.logs.String()
		for _, want := range []string{
			`"msg":"claim empty","tenant":"acme","reason":"expires_too_soon","lease_seconds":3600`,
			`"msg":"claim empty","tenant":"acme","reason":"no_inventory","lease_seconds":120`,
		} {
			if !strings.Contains(logs, want) {
				t.Errorf("logs lack %s:\n%s", want, logs)
			}
		}
	})
}
