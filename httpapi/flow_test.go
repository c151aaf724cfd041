package httpapi

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/internal/testenv"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
	"github.com/sandboxwich/sandboxwich/wire"
)

// TestWorkerFlow: prepare → tenant claim → validate → worker lookup shows
// the claim → destroy → lease status.
func TestWorkerFlow(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b)
		r := e.do("POST", workerPath(worker1, "/prepare"), tokWorker1, e.prepareBody(lease.KataMicroVM)).must(t, 200)
		checkSchema(t, "CellResponse", r.body)
		cell := decodeAs[wire.CellResponse](t, r).Cell
		if cell.State != lease.Ready || cell.Generation != 1 || cell.WorkerID != worker1.ID.String() || cell.Disposition != nil {
			t.Fatalf("prepared cell %+v", cell)
		}
		r = e.do("GET", workerPath(worker1, "/"+cell.CellID.String()), tokWorker1, nil).must(t, 200)
		checkSchema(t, "WorkerCellResponse", r.body)
		if !bytes.Contains(r.body, []byte(`"claim":null`)) || !bytes.Contains(r.body, []byte(`"disposition":null`)) {
			t.Fatalf("lookup before claim: %s", r.body)
		}

		claimID := uuid.Must(uuid.NewV7())
		r = e.do("POST", "/v1/sterile-cells/claim", tokAcme, e.claimBody(&claimID, lease.KataMicroVM)).must(t, 200)
		checkSchema(t, "ClaimResponse", r.body)
		c := decodeAs[wire.ClaimResponse](t, r)
		if c.Lease == nil || c.Lease.CellID != cell.CellID || c.Lease.Generation != 2 || !strings.HasPrefix(*c.LeaseAttestation, "swla1_") {
			t.Fatalf("claim %s", r.body)
		}
		if c.Lease.ExpiresAt.After(time.Now().Add(121*time.Second)) || c.Lease.ExpiresAt.Before(time.Now().Add(100*time.Second)) {
			t.Errorf("default lease expiry %v", c.Lease.ExpiresAt)
		}

		// Any principal of the tenant validates; the lease equals the claim's.
		for _, who := range []struct {
			token string
			hdr   []string
		}{{tokAcme, nil}, {tokAcme, []string{wire.OperatorHeader, tokOperator}}, {tokWorker1, nil}, {tokWorker2, nil}} {
			r = e.do("POST", leasePath(c.Lease.LeaseID, "/validate"), who.token, proofBody(c), who.hdr...).must(t, 200)
			checkSchema(t, "ValidateResponse", r.body)
			v := decodeAs[wire.ValidateResponse](t, r)
			if lb, _ := json.Marshal(c.Lease); !bytes.Equal(mustJSON(t, v.Lease), lb) {
				t.Fatalf("validate lease %s, claim lease %s", mustJSON(t, v.Lease), lb)
			}
		}
		// Another tenant, or a worker of another tenant: not found.
		e.do("POST", leasePath(c.Lease.LeaseID, "/validate"), tokGlobex, proofBody(c)).errCode(t, 404, "not_found")
		e.do("POST", leasePath(c.Lease.LeaseID, "/validate"), tokWorker3, proofBody(c)).errCode(t, 404, "not_found")
		// A wrong fence: conflict.
		e.do("POST", leasePath(c.Lease.LeaseID, "/validate"), tokAcme, with(proofBody(c), "thread_id", "thread-2")).errCode(t, 409, "conflict")

		r = e.do("GET", workerPath(worker1, "/"+cell.CellID.String()), tokWorker1, nil).must(t, 200)
		checkSchema(t, "WorkerCellResponse", r.body)
		wc := decodeAs[wire.WorkerCellResponse](t, r)
		if wc.Cell.State != lease.Leased || wc.Cell.Generation != 2 || wc.Claim == nil ||
			wc.Claim.ClaimID != claimID || wc.Claim.LeaseID != c.Lease.LeaseID || wc.Claim.Generation != 2 ||
			!wc.Claim.ExpiresAt.Equal(c.Lease.ExpiresAt.Time) {
			t.Fatalf("lookup after claim: %s", r.body)
		}
		mustNotContain(t, "worker lookup", string(r.body), *c.LeaseAttestation, attest.Digest(*c.LeaseAttestation))
		// Another worker of the same tenant does not see the cell.
		e.do("GET", workerPath(worker2, "/"+cell.CellID.String()), tokWorker2, nil).errCode(t, 404, "not_found")

		destroy := map[string]any{"lease_id": c.Lease.LeaseID, "generation": 2, "disposition": "destroyed"}
		r = e.do("POST", workerPath(worker1, "/"+cell.CellID.String()+"/destroy"), tokWorker1, destroy).must(t, 200)
		checkSchema(t, "CellResponse", r.body)
		if d := decodeAs[wire.CellResponse](t, r).Cell; d.State != lease.Destroyed || d.Disposition == nil || *d.Disposition != lease.Destroyed {
			t.Fatalf("destroy: %s", r.body)
		}
		r2 := e.do("POST", workerPath(worker1, "/"+cell.CellID.String()+"/destroy"), tokWorker1, destroy).must(t, 200)
		if !bytes.Equal(r.body, r2.body) {
			t.Errorf("destroy replay differs:\n%s\n%s", r.body, r2.body)
		}
		e.do("POST", workerPath(worker1, "/"+cell.CellID.String()+"/destroy"), tokWorker1,
			with(destroy, "disposition", "quarantined")).errCode(t, 409, "conflict")

		r = e.do("GET", leasePath(c.Lease.LeaseID, ""), tokAcme, nil).must(t, 200)
		checkSchema(t, "StatusResponse", r.body)
		want := `{"ok":true,"status":{"lease_id":"` + c.Lease.LeaseID.String() + `","cell_id":"` + cell.CellID.String() +
			`","generation":2,"state":"destroyed","disposition":"destroyed","provider_absent":false,"cleanup_pending":false}}`
		if string(r.body) != want {
			t.Errorf("status\n got %s\nwant %s", r.body, want)
		}
		e.do("POST", leasePath(c.Lease.LeaseID, "/validate"), tokAcme, proofBody(c)).errCode(t, 409, "conflict")
	})
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestFencedClaim: replays are byte-identical and consume one cell; a
// different request under the claim ID conflicts; an empty outcome is
// durable; unfenced claims lease a new cell each.
func TestFencedClaim(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b)
		first := e.prepare(worker1, tokWorker1, lease.GVisorLowerRisk)
		second := e.prepare(worker1, tokWorker1, lease.GVisorLowerRisk)

		id := uuid.Must(uuid.NewV7())
		body := e.claimBody(&id, lease.GVisorLowerRisk)
		r1 := e.do("POST", "/v1/sterile-cells/claim", tokAcme, body).must(t, 200)
		r2 := e.do("POST", "/sterile-cells/claim", tokAcme, body).must(t, 200) // the alias
		// UUIDs in any spelling name the same claim.
		r3 := e.do("POST", "/v1/sterile-cells/claim", tokAcme, with(body, "claim_id", "{"+strings.ToUpper(id.String())+"}")).must(t, 200)
		if !bytes.Equal(r1.body, r2.body) || !bytes.Equal(r1.body, r3.body) {
			t.Fatalf("fenced replays differ:\n%s\n%s\n%s", r1.body, r2.body, r3.body)
		}
		if got := decodeAs[wire.ClaimResponse](t, r1).Lease.CellID; got != first.CellID {
			t.Fatalf("claimed %s, want the oldest cell %s", got, first.CellID)
		}
		e.do("POST", "/v1/sterile-cells/claim", tokAcme, with(body, "lease_seconds", 120)).errCode(t, 409, "conflict")

		// claim_id null is an unfenced claim: it takes the second cell.
		r := e.do("POST", "/v1/sterile-cells/claim", tokAcme, with(body, "claim_id", nil)).must(t, 200)
		if got := decodeAs[wire.ClaimResponse](t, r).Lease.CellID; got != second.CellID {
			t.Fatalf("unfenced claim took %s, want %s", got, second.CellID)
		}
		lookup := e.do("GET", workerPath(worker1, "/"+second.CellID.String()), tokWorker1, nil).must(t, 200)
		if !bytes.Contains(lookup.body, []byte(`"claim":null`)) { // unfenced: the worker cannot learn the lease
			t.Errorf("unfenced claim lookup: %s", lookup.body)
		}

		// Empty, and durably so.
		const empty = `{"ok":true,"lease":null,"lease_attestation":null}`
		id2 := uuid.Must(uuid.NewV7())
		if r := e.do("POST", "/v1/sterile-cells/claim", tokAcme, e.claimBody(&id2, lease.GVisorLowerRisk)).must(t, 200); string(r.body) != empty {
			t.Fatalf("empty claim: %s", r.body)
		}
		checkSchema(t, "ClaimResponse", []byte(empty))
		e.prepare(worker1, tokWorker1, lease.GVisorLowerRisk)
		if r := e.do("POST", "/v1/sterile-cells/claim", tokAcme, e.claimBody(&id2, lease.GVisorLowerRisk)).must(t, 200); string(r.body) != empty {
			t.Fatalf("empty fenced claim replay: %s", r.body)
		}
		// The nil UUID is not a claim ID.
		e.do("POST", "/v1/sterile-cells/claim", tokAcme, with(body, "claim_id", uuid.Nil.String())).errCode(t, 422, "invalid_request")
	})
}

// TestConcurrentFencedClaims: identical concurrent claims get identical
// bodies and consume one cell.
func TestConcurrentFencedClaims(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b)
		e.prepare(worker1, tokWorker1, lease.KataMicroVM)
		e.prepare(worker1, tokWorker1, lease.KataMicroVM)
		id := uuid.Must(uuid.NewV7())
		body := e.claimBody(&id, lease.KataMicroVM)
		const n = 6
		bodies := make([][]byte, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				bodies[i] = e.do("POST", "/v1/sterile-cells/claim", tokAcme, body).must(t, 200).body
			})
		}
		wg.Wait()
		for i := 1; i < n; i++ {
			if !bytes.Equal(bodies[0], bodies[i]) {
				t.Fatalf("concurrent fenced claims differ:\n%s\n%s", bodies[0], bodies[i])
			}
		}
		if c := e.claim(tokAcme, nil, lease.KataMicroVM); c.Lease == nil {
			t.Fatal("the fenced claims consumed more than one cell")
		}
	})
}

// TestClaimValidationOrder: release (400, 403) before the binding (400);
// shape errors (422) before both.
func TestClaimValidationOrder(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b)
		body := e.claimBody(nil, lease.KataMicroVM)
		badSig := with(body, "release", with(toMap(t, e.release(lease.KataMicroVM)), "signature", "swrs1_x"))
		e.do("POST", "/v1/sterile-cells/claim", tokAcme, with(badSig, "organization_id", "bad org")).errCode(t, 403, "authorization_denied")
		badSet := with(body, "release", with(toMap(t, e.release(lease.KataMicroVM)), "release_set_id", "bad set"))
		e.do("POST", "/v1/sterile-cells/claim", tokAcme, badSet).errCode(t, 400, "bad_request")
		r := e.do("POST", "/v1/sterile-cells/claim", tokAcme, with(body, "workspace_id", "bad ws", "thread_id", "bad thread"))
		r.errCode(t, 400, "bad_request")
		if !bytes.Contains(r.body, []byte("workspace_id is invalid")) {
			t.Errorf("binding order: %s", r.body)
		}
		// The signature is over the class: the other class's signature is 403.
		other := with(body, "release", with(toMap(t, e.release(lease.KataMicroVM)), "runtime_class", "gvisor_lower_risk"))
		e.do("POST", "/v1/sterile-cells/claim", tokAcme, other).errCode(t, 403, "authorization_denied")
		// Unknown fields are ignored; lease_seconds is clamped, not rejected.
		e.do("POST", "/v1/sterile-cells/claim", tokAcme, with(body, "surprise", []int{1}, "lease_seconds", 100000)).must(t, 200)
		e.do("POST", "/v1/sterile-cells/claim", tokAcme, with(body, "lease_seconds", 0)).must(t, 200)
	})
}

func toMap(t *testing.T, v any) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(mustJSON(t, v), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestPoolRelease: release of a pool cell, provider_mode, the cleanup fence
// mismatch, and exec.
func TestPoolRelease(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		// A pool p1 with a dry-run provider and no reconcile pass: the
		// plane reports its mode for the cells poolCell admits.
		e := newEnvWith(t, b, []sandboxwich.Option{sandboxwich.WithPools(pool.Config{Name: "p1", TenantID: "acme",
			Release: signedRelease(t, lease.GVisorLowerRisk), Target: 1, Provider: fake.New(fake.Config{})})})
		e.poolCell("acme", lease.GVisorLowerRisk)
		c := e.claim(tokAcme, nil, lease.GVisorLowerRisk)
		r := e.do("GET", leasePath(c.Lease.LeaseID, ""), tokAcme, nil).must(t, 200)
		checkSchema(t, "StatusResponse", r.body)
		if st := decodeAs[wire.StatusResponse](t, r).Status; st.ProviderMode != "dry_run" || st.State != lease.Leased || st.Disposition != nil {
			t.Fatalf("status: %s", r.body)
		}
		rel := with(proofBody(c), "disposition", "destroyed")
		r1 := e.do("POST", leasePath(c.Lease.LeaseID, "/release"), tokAcme, rel).must(t, 202)
		checkSchema(t, "StatusResponse", r1.body)
		st := decodeAs[wire.StatusResponse](t, r1).Status
		if st.State != lease.Leased || st.ProviderAbsent || st.CleanupPending || st.ProviderMode != "dry_run" {
			t.Fatalf("release: %s", r1.body)
		}
		r2 := e.do("POST", leasePath(c.Lease.LeaseID, "/release"), tokAcme, rel).must(t, 202)
		if !bytes.Equal(r1.body, r2.body) {
			t.Errorf("exact release retry differs:\n%s\n%s", r1.body, r2.body)
		}
		e.do("POST", leasePath(c.Lease.LeaseID, "/release"), tokAcme, with(rel, "disposition", "quarantined")).errCode(t, 409, "conflict")
		st = decodeAs[wire.StatusResponse](t, e.do("GET", leasePath(c.Lease.LeaseID, ""), tokAcme, nil).must(t, 200)).Status
		if st.State != lease.Quarantined || !st.CleanupPending || st.Disposition == nil || *st.Disposition != lease.Quarantined {
			t.Fatalf("after the cleanup fence mismatch: %+v", st)
		}

		// Exec: a pool cell's provider has no exec here (501); a worker's
		// cell has no provider here (404); bad base64 is 422.
		e.poolCell("acme", lease.GVisorLowerRisk)
		c2 := e.claim(tokAcme, nil, lease.GVisorLowerRisk)
		exec := with(proofBody(c2), "argv", []string{"true"}, "stdin_base64", "aGVsbG8=", "env", map[string]string{"A": "b"}, "timeout_seconds", 5)
		e.do("POST", leasePath(c2.Lease.LeaseID, "/exec"), tokAcme, exec).errCode(t, 501, "exec_unsupported")
		e.do("POST", leasePath(c2.Lease.LeaseID, "/exec"), tokAcme, with(exec, "stdin_base64", "!!")).errCode(t, 422, "invalid_request")
		e.do("POST", leasePath(c2.Lease.LeaseID, "/exec"), tokAcme, with(exec, "argv", []string{})).errCode(t, 422, "invalid_request")
		e.prepare(worker1, tokWorker1, lease.KataMicroVM)
		c3 := e.claim(tokAcme, nil, lease.KataMicroVM)
		e.do("POST", leasePath(c3.Lease.LeaseID, "/exec"), tokAcme, with(proofBody(c3), "argv", []string{"true"})).errCode(t, 404, "not_found")
		// Release of a worker's cell: 404 (its worker destroys it).
		e.do("POST", leasePath(c3.Lease.LeaseID, "/release"), tokAcme, with(proofBody(c3), "disposition", "destroyed")).errCode(t, 404, "not_found")
	})
}

// TestRetire: only ready/1 → quarantined; exact repeat 200; else 409.
func TestRetire(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b)
		cell := e.prepare(worker1, tokWorker1, lease.KataMicroVM)
		path := workerPath(worker1, "/"+cell.CellID.String()+"/retire")
		e.do("POST", path, tokWorker1, map[string]any{"generation": 2}).errCode(t, 409, "conflict")
		r := e.do("POST", path, tokWorker1, map[string]any{"generation": 1}).must(t, 200)
		if c := decodeAs[wire.CellResponse](t, r).Cell; c.State != lease.Quarantined || *c.Disposition != lease.Quarantined {
			t.Fatalf("retire: %s", r.body)
		}
		e.do("POST", path, tokWorker1, map[string]any{"generation": 1}).must(t, 200)
		// Another worker's cell, through that worker's own path: 404.
		e.do("POST", workerPath(worker2, "/"+cell.CellID.String()+"/retire"), tokWorker2, map[string]any{"generation": 1}).errCode(t, 404, "not_found")
		// Destroy of a cell that is not leased quarantines it (already is) and conflicts.
		ready := e.prepare(worker1, tokWorker1, lease.KataMicroVM)
		e.do("POST", workerPath(worker1, "/"+ready.CellID.String()+"/destroy"), tokWorker1,
			map[string]any{"lease_id": uuid.NewString(), "generation": 2, "disposition": "destroyed"}).errCode(t, 409, "conflict")
		lookup := decodeAs[wire.WorkerCellResponse](t, e.do("GET", workerPath(worker1, "/"+ready.CellID.String()), tokWorker1, nil).must(t, 200))
		if lookup.Cell.State != lease.Quarantined {
			t.Errorf("mismatched destroy left the cell %s", lookup.Cell.State)
		}
	})
}

// TestPrepareErrors: the prepare checks of CONTRACT §7.
func TestPrepareErrors(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b)
		path := workerPath(worker2, "/prepare")
		body := e.prepareBody(lease.GVisorLowerRisk)
		e.do("POST", path, tokWorker2, with(body, "release", with(toMap(t, e.release(lease.GVisorLowerRisk)), "signature", "nope"))).errCode(t, 403, "authorization_denied")
		e.do("POST", path, tokWorker2, e.prepareBody(lease.KataMicroVM)).errCode(t, 403, "authorization_denied")
		e.do("POST", path, tokWorker2, with(body, "expires_at", "2020-01-01T00:00:00+02:00")).errCode(t, 400, "bad_request")
		e.do("POST", path, tokWorker2, with(body, "provider_cell_id", "no spaces")).errCode(t, 400, "bad_request")
		e.do("POST", path, tokWorker2, with(body, "expires_at", "tomorrow")).errCode(t, 422, "invalid_request")
		e.do("POST", path, tokWorker2, with(body, "cell_id", "cell-1")).errCode(t, 422, "invalid_request")
		e.do("POST", path, tokWorker2, body).must(t, 200)
		e.do("POST", path, tokWorker2, body).errCode(t, 409, "conflict")
		e.do("POST", path, tokWorker2, with(body, "cell_id", uuid.NewString())).errCode(t, 409, "conflict") // same provider_cell_id
		// The same provider_cell_id under another worker is fine.
		e.do("POST", workerPath(worker1, "/prepare"), tokWorker1, with(body, "cell_id", uuid.NewString())).must(t, 200)
	})
}

// TestCrossTenant: another tenant's lease is indistinguishable from an
// unknown one.
func TestCrossTenant(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b)
		e.prepare(worker1, tokWorker1, lease.KataMicroVM)
		c := e.claim(tokAcme, nil, lease.KataMicroVM)
		unknown := uuid.Must(uuid.NewV7())
		for _, tc := range []struct {
			method, rest string
			body         any
		}{
			{"GET", "", nil},
			{"POST", "/validate", proofBody(c)},
			{"POST", "/release", with(proofBody(c), "disposition", "destroyed")},
			{"POST", "/exec", with(proofBody(c), "argv", []string{"id"})},
		} {
			foreign := e.do(tc.method, leasePath(c.Lease.LeaseID, tc.rest), tokGlobex, tc.body)
			foreign.errCode(t, 404, "not_found")
			none := e.do(tc.method, leasePath(unknown, tc.rest), tokGlobex, tc.body)
			if !bytes.Equal(foreign.body, none.body) || foreign.status != none.status {
				t.Errorf("%s %s: foreign %s, unknown %s", tc.method, tc.rest, foreign.body, none.body)
			}
		}
		// A tenant never sees another tenant's inventory.
		e.prepare(worker3, tokWorker3, lease.KataMicroVM)
		if got := e.claim(tokAcme, nil, lease.KataMicroVM); got.Lease != nil {
			t.Fatalf("acme leased globex's cell %s", got.Lease.CellID)
		}
		if got := e.claim(tokGlobex, nil, lease.KataMicroVM); got.Lease == nil {
			t.Fatal("globex could not lease its own cell")
		}
	})
}

// TestLeaseExpiry: an expired lease is quarantined on validate and 409.
func TestLeaseExpiry(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		clock := testenv.NewClock()
		clock.Advance(time.Since(clock.Now())) // the worker's cell expires by the wall clock
		e := newEnvWith(t, b, []sandboxwich.Option{sandboxwich.WithClock(clock.Now)})
		e.prepare(worker1, tokWorker1, lease.KataMicroVM)
		r := e.do("POST", "/v1/sterile-cells/claim", tokAcme, with(e.claimBody(nil, lease.KataMicroVM), "lease_seconds", 1)).must(t, 200)
		c := decodeAs[wire.ClaimResponse](t, r)
		clock.Advance(c.Lease.ExpiresAt.Sub(clock.Now()) + 50*time.Millisecond)
		e.do("POST", leasePath(c.Lease.LeaseID, "/validate"), tokAcme, proofBody(c)).errCode(t, 409, "conflict")
		st := decodeAs[wire.StatusResponse](t, e.do("GET", leasePath(c.Lease.LeaseID, ""), tokAcme, nil).must(t, 200)).Status
		if st.State != lease.Quarantined {
			t.Errorf("expired lease left %s", st.State)
		}
	})
}

// TestWorkerCellUnfencedClaim: a cell leased by an unfenced (legacy) claim
// shows "claim": null to its worker (CONTRACT §7, as in the Rust
// implementation); the worker cannot learn that lease, and the cell ends by
// expiry.
func TestWorkerCellUnfencedClaim(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b)
		cell := e.prepare(worker1, tokWorker1, lease.KataMicroVM)
		if c := e.claim(tokAcme, nil, lease.KataMicroVM); c.Lease == nil || c.Lease.CellID != cell.CellID {
			t.Fatalf("unfenced claim: %+v", c)
		}
		r := e.do("GET", workerPath(worker1, "/"+cell.CellID.String()), tokWorker1, nil).must(t, 200)
		checkSchema(t, "WorkerCellResponse", r.body)
		if wc := decodeAs[wire.WorkerCellResponse](t, r); wc.Cell.State != lease.Leased || !bytes.Contains(r.body, []byte(`"claim":null`)) {
			t.Fatalf("lookup after an unfenced claim: %s", r.body)
		}
	})
}
