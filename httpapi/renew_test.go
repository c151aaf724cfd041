package httpapi

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/wire"
)

// TestRenew: POST …/renew (CONTRACT §20) moves a pool lease's expiry, the
// cell's agent told first, and changes nothing else: the same attestation
// still validates the lease. Bad input is refused as a claim refuses it
// and changes nothing; a foreign or unknown lease is 404, a wrong fence or
// a released lease 409.
func TestRenew(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			a := newAgentEnv(t, b, 2)
			c := a.lease()
			path := leasePath(c.Lease.LeaseID, "/renew")
			expiry := func() time.Time {
				r := a.do("POST", leasePath(c.Lease.LeaseID, "/validate"), tokAcme, proofBody(c)).must(t, 200)
				return decodeAs[wire.ValidateResponse](t, r).Lease.ExpiresAt.Time
			}
			before := expiry()

			// Bad input: refused with 422, nothing changes.
			for what, body := range map[string]map[string]any{
				"missing":        proofBody(c),
				"a string":       with(proofBody(c), "lease_seconds", "600"),
				"negative":       with(proofBody(c), "lease_seconds", -1),
				"a fraction":     with(proofBody(c), "lease_seconds", 1.5),
				"beyond 2^64":    with(proofBody(c), "lease_seconds", json.Number("18446744073709551616")),
				"null":           with(proofBody(c), "lease_seconds", nil),
				"no attestation": without(with(proofBody(c), "lease_seconds", 60), "lease_attestation"),
			} {
				a.do("POST", path, tokAcme, body).errCode(t, 422, "invalid_request")
				if got := expiry(); !got.Equal(before) {
					t.Fatalf("lease_seconds %s moved the expiry to %v", what, got)
				}
			}
			// 0 is clamped to 1 s: never shorter, nothing moves.
			r := a.do("POST", path, tokAcme, with(proofBody(c), "lease_seconds", 0)).must(t, 200)
			if got := decodeAs[wire.RenewResponse](t, r).Lease.ExpiresAt.Time; !got.Equal(before) {
				t.Fatalf("lease_seconds 0 answered expiry %v, want %v unchanged", got, before)
			}

			// A renewal: the agent is told the later expiry before it is
			// recorded; the answer shows it; huge values are clamped to
			// the maximum lease.
			sent := len(a.prov.Received())
			r = a.do("POST", path, tokAcme, with(proofBody(c), "lease_seconds", 1_000_000)).must(t, 200)
			renewed := decodeAs[wire.RenewResponse](t, r).Lease
			if !renewed.ExpiresAt.After(before) || renewed.ExpiresAt.After(time.Now().Add(301*time.Second)) {
				t.Fatalf("renewed expiry %v: want later than %v and clamped to the 300 s maximum", renewed.ExpiresAt, before)
			}
			if got := expiry(); !got.Equal(renewed.ExpiresAt.Time) {
				t.Fatalf("the same attestation validates expiry %v, want %v", got, renewed.ExpiresAt)
			}
			var told *agent.Activation
			for _, m := range a.prov.Received()[sent:] {
				if m.Op == "activate" {
					told = new(agent.Activation)
					if err := json.Unmarshal(m.Body, told); err != nil {
						t.Fatal(err)
					}
				}
			}
			if told == nil || !told.ExpiresAt.Equal(renewed.ExpiresAt.Time) || told.LeaseID != c.Lease.LeaseID.String() {
				t.Fatalf("the agent was told %+v, want the renewed expiry %v", told, renewed.ExpiresAt)
			}

			// Idempotency-Key: the stored answer is replayed.
			r1 := a.do("POST", path, tokAcme, with(proofBody(c), "lease_seconds", 120), "Idempotency-Key", "renew-1").must(t, 200)
			r2 := a.do("POST", path, tokAcme, with(proofBody(c), "lease_seconds", 120), "Idempotency-Key", "renew-1").must(t, 200)
			if string(r1.body) != string(r2.body) {
				t.Errorf("an Idempotency-Key renewal replayed %s, first %s", r2.body, r1.body)
			}

			// Foreign, unknown, wrong fence, released.
			a.do("POST", path, tokGlobex, with(proofBody(c), "lease_seconds", 60)).errCode(t, 404, "not_found")
			a.do("POST", leasePath(uuid.New(), "/renew"), tokAcme, with(proofBody(c), "lease_seconds", 60)).errCode(t, 404, "not_found")
			a.do("POST", path, tokAcme, with(proofBody(c), "lease_seconds", 60, "thread_id", "other")).errCode(t, 409, "conflict")
			a.do("POST", leasePath(c.Lease.LeaseID, "/release"), tokAcme, with(proofBody(c), "disposition", "destroyed")).must(t, 202)
			a.do("POST", path, tokAcme, with(proofBody(c), "lease_seconds", 60)).errCode(t, 409, "conflict")

			// An agent that cannot be told: the error an exec would get,
			// and the store keeps the expiry it had.
			c2 := a.lease()
			before2 := decodeAs[wire.ValidateResponse](t, a.do("POST", leasePath(c2.Lease.LeaseID, "/validate"), tokAcme, proofBody(c2)).must(t, 200)).Lease.ExpiresAt
			a.prov.SetAgentFaults(fake.AgentFaults{RefuseFence: true})
			a.do("POST", leasePath(c2.Lease.LeaseID, "/renew"), tokAcme, with(proofBody(c2), "lease_seconds", 300)).errCode(t, 409, "cell_agent_unverified")
			a.prov.SetAgentFaults(fake.AgentFaults{})
			rec, err := a.st.Lease(t.Context(), "acme", c2.Lease.LeaseID)
			if err != nil || !rec.Cell.Lease.ExpiresAt.Equal(before2.Time) {
				t.Fatalf("after a renewal the agent refused, the store has expiry %v (%v), want %v", rec.Cell.Lease.ExpiresAt, err, before2)
			}
		})
	}
}
