package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/egress"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
	"github.com/sandboxwich/sandboxwich/wire"
)

// claimFor leases a cell for token with the given runner session.
func (e *env) claimFor(token, session string, class lease.RuntimeClass) wire.ClaimResponse {
	e.t.Helper()
	id := uuid.Must(uuid.NewV7())
	body := with(e.claimBody(&id, class), "runner_session_id", session)
	c := decodeAs[wire.ClaimResponse](e.t, e.do("POST", "/v1/sterile-cells/claim", token, body).must(e.t, 200))
	if c.Lease == nil {
		e.t.Fatal("claim leased nothing")
	}
	return c
}

func listed(t *testing.T, r resp) ([]uuid.UUID, *string) {
	t.Helper()
	checkSchema(t, "LeasesResponse", r.body)
	page := decodeAs[wire.LeasesResponse](t, r)
	ids := make([]uuid.UUID, len(page.Leases))
	for i, l := range page.Leases {
		ids[i] = l.LeaseID
	}
	return ids, page.NextCursor
}

// TestListLeasesRoute: the tenant's leases newest first, in pages that
// follow next_cursor, filtered; bad parameters are 422 and name the
// parameter; another tenant's leases never appear.
func TestListLeasesRoute(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b)
		var want []uuid.UUID // newest first
		var claims []wire.ClaimResponse
		for _, s := range []string{"session-a", "session-b", "session-a"} {
			e.prepare(worker1, tokWorker1, lease.KataMicroVM)
			c := e.claimFor(tokAcme, s, lease.KataMicroVM)
			claims = append(claims, c)
			want = append([]uuid.UUID{c.Lease.LeaseID}, want...)
		}
		e.prepare(worker3, tokWorker3, lease.KataMicroVM)
		foreign := e.claimFor(tokGlobex, "session-a", lease.KataMicroVM)

		r := e.do("GET", "/v1/sterile-cell-leases", tokAcme, nil).must(t, 200)
		if got, next := listed(t, r); !slices.Equal(got, want) || next != nil {
			t.Fatalf("listing = %v next %v, want %v and null", got, next, want)
		}
		l := claims[2].Lease
		wantItem := `{"lease_id":"` + l.LeaseID.String() + `","cell_id":"` + l.CellID.String() + `","generation":2,` +
			`"state":"leased","disposition":null,"provider_absent":false,"cleanup_pending":false,"organization_id":"org-1",` +
			`"workspace_id":"workspace-1","thread_id":"thread-1","runner_session_id":"session-a","expires_at":"` +
			attest.WireTime(l.ExpiresAt.Time) + `","release_set_id":"release-set-2026-08-07"}`
		if !bytes.HasPrefix(r.body, []byte(`{"ok":true,"leases":[`+wantItem+`,`)) || !bytes.HasSuffix(r.body, []byte(`],"next_cursor":null}`)) {
			t.Errorf("listing body %s\nwant first item %s", r.body, wantItem)
		}

		// Pages of two, through the alias too.
		got, next := listed(t, e.do("GET", "/sterile-cell-leases?limit=2", tokAcme, nil).must(t, 200))
		if !slices.Equal(got, want[:2]) || next == nil {
			t.Fatalf("first page = %v next %v", got, next)
		}
		got, next = listed(t, e.do("GET", "/v1/sterile-cell-leases?limit=2&cursor="+*next, tokAcme, nil).must(t, 200))
		if !slices.Equal(got, want[2:]) || next != nil {
			t.Fatalf("second page = %v next %v", got, next)
		}

		// Filters, and live.
		got, _ = listed(t, e.do("GET", "/v1/sterile-cell-leases?runner_session_id=session-a&organization_id=org-1", tokAcme, nil).must(t, 200))
		if !slices.Equal(got, []uuid.UUID{want[0], want[2]}) {
			t.Errorf("session-a = %v", got)
		}
		e.do("POST", workerPath(worker1, "/"+claims[1].Lease.CellID.String()+"/destroy"), tokWorker1,
			map[string]any{"lease_id": claims[1].Lease.LeaseID, "generation": 2, "disposition": "destroyed"}).must(t, 200)
		got, _ = listed(t, e.do("GET", "/v1/sterile-cell-leases?live=false", tokAcme, nil).must(t, 200))
		if !slices.Equal(got, []uuid.UUID{claims[1].Lease.LeaseID}) {
			t.Errorf("live=false = %v", got)
		}
		got, _ = listed(t, e.do("GET", "/v1/sterile-cell-leases?live=true&thread_id=thread-1&workspace_id=workspace-1", tokAcme, nil).must(t, 200))
		if !slices.Equal(got, []uuid.UUID{want[0], want[2]}) {
			t.Errorf("live=true = %v", got)
		}

		// The other tenant sees only its own; a worker is not a tenant.
		if got, _ := listed(t, e.do("GET", "/v1/sterile-cell-leases", tokGlobex, nil).must(t, 200)); !slices.Equal(got, []uuid.UUID{foreign.Lease.LeaseID}) {
			t.Errorf("globex's listing = %v", got)
		}
		e.do("GET", "/v1/sterile-cell-leases", tokWorker1, nil).errCode(t, 401, "unauthorized")
		if got, _ := listed(t, e.do("GET", "/v1/sterile-cell-leases", tokAcme, nil, wire.OperatorHeader, tokOperator).must(t, 200)); len(got) != 3 {
			t.Errorf("the operator's listing = %v, want acme's", got)
		}

		for q, msg := range map[string]string{
			"limit=0":                 "limit must be an integer from 1 to 1000",
			"limit=1001":              "limit must be an integer from 1 to 1000",
			"limit=-1":                "limit must be",
			"limit=ten":               "limit must be",
			"limit=":                  "limit must not be empty",
			"live=yes":                "live must be true or false",
			"live=TRUE":               "live must be true or false",
			"live=true&live=false":    "live must be given at most once",
			"cursor=abc":              "cursor is invalid",
			"cursor=":                 "cursor must not be empty",
			"runner_session_id=a%20b": "runner_session_id is invalid",
			"thread_id=":              "thread_id must not be empty",
			"organization_id=" + strings.Repeat("o", 257): "organization_id is invalid",
		} {
			r := e.do("GET", "/v1/sterile-cell-leases?"+q, tokAcme, nil)
			r.errCode(t, 422, "invalid_request")
			if !strings.Contains(string(r.body), msg) {
				t.Errorf("?%s: %s, want %q", q, r.body, msg)
			}
		}
		e.do("GET", "/v1/sterile-cell-leases?limit=%zz", tokAcme, nil).errCode(t, 400, "invalid_request")
		// Unknown parameters are ignored.
		if got, _ := listed(t, e.do("GET", "/v1/sterile-cell-leases?color=blue", tokAcme, nil).must(t, 200)); len(got) != 3 {
			t.Errorf("with an unknown parameter = %v", got)
		}
	})
}

// TestRevokeRoute: an external worker's cell is quarantined at once (200),
// with or without a body; a pool cell's stop is recorded (202), and the
// holder's release with another disposition is then 409; errors are 404,
// 409, 415 and 422 as for the other lease routes.
func TestRevokeRoute(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b)
		e.prepare(worker1, tokWorker1, lease.KataMicroVM)
		c := e.claimFor(tokAcme, "session-1", lease.KataMicroVM)
		id := c.Lease.LeaseID
		path := leasePath(id, "/revoke")

		e.do("POST", path, tokGlobex, nil).errCode(t, 404, "not_found")
		e.do("POST", leasePath(uuid.Must(uuid.NewV7()), "/revoke"), tokAcme, nil).errCode(t, 404, "not_found")
		e.do("POST", "/v1/sterile-cell-leases/not-a-uuid/revoke", tokAcme, nil).errCode(t, 400, "invalid_request")
		e.do("POST", path, tokAcme, `{"disposition":"ready"}`).errCode(t, 422, "invalid_request")
		e.do("POST", path, tokAcme, `["quarantined"]`).errCode(t, 422, "invalid_request")
		e.do("POST", path, tokAcme, `{"disposition":`).errCode(t, 400, "invalid_request")
		e.do("POST", path, tokAcme, `{}`, "Content-Type", "text/plain").errCode(t, 415, "unsupported_media_type")
		e.do("POST", path, tokWorker1, nil).errCode(t, 401, "unauthorized")

		// No body at all (no Content-Type): quarantined at once.
		r := e.do("POST", path, tokAcme, nil).must(t, 200)
		checkSchema(t, "StatusResponse", r.body)
		want := `{"ok":true,"status":{"lease_id":"` + id.String() + `","cell_id":"` + c.Lease.CellID.String() +
			`","generation":2,"state":"quarantined","disposition":"quarantined","provider_absent":false,"cleanup_pending":false}}`
		if string(r.body) != want {
			t.Errorf("revoke\n got %s\nwant %s", r.body, want)
		}
		e.do("POST", path, tokAcme, nil).errCode(t, 409, "conflict")
		e.do("POST", leasePath(id, "/validate"), tokAcme, proofBody(c)).errCode(t, 409, "conflict")
		cell := decodeAs[wire.WorkerCellResponse](t, e.do("GET", workerPath(worker1, "/"+c.Lease.CellID.String()), tokWorker1, nil).must(t, 200))
		if cell.Cell.State != lease.Quarantined {
			t.Errorf("the worker sees %s", cell.Cell.State)
		}

		// A pool cell, with a disposition in the body: 202, still leased.
		e.poolCell("acme", lease.GVisorLowerRisk)
		pc := e.claimFor(tokAcme, "session-2", lease.GVisorLowerRisk)
		r = e.do("POST", leasePath(pc.Lease.LeaseID, "/revoke"), tokAcme, `{"disposition":"quarantined"}`).must(t, 202)
		if st := decodeAs[wire.StatusResponse](t, r).Status; st.State != lease.Leased || st.CleanupPending {
			t.Errorf("revoked pool lease = %s", r.body)
		}
		e.do("POST", leasePath(pc.Lease.LeaseID, "/revoke"), tokAcme, `{"disposition":null}`).must(t, 202)
		e.do("POST", leasePath(pc.Lease.LeaseID, "/release"), tokAcme, with(proofBody(pc), "disposition", "destroyed")).
			errCode(t, 409, "conflict")
		st := decodeAs[wire.StatusResponse](t, e.do("GET", leasePath(pc.Lease.LeaseID, ""), tokAcme, nil).must(t, 200)).Status
		if st.State != lease.Quarantined || !st.CleanupPending {
			t.Errorf("after revoke then release: %+v, want quarantined, cleanup pending", st)
		}
	})
}

// TestRevokeIdempotent: a revoke under an Idempotency-Key is replayed, not
// run again (a second run would be a 409).
func TestRevokeIdempotent(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b)
		e.prepare(worker1, tokWorker1, lease.KataMicroVM)
		c := e.claimFor(tokAcme, "session-1", lease.KataMicroVM)
		path := leasePath(c.Lease.LeaseID, "/revoke")
		r1 := e.do("POST", path, tokAcme, nil, idemHeader, "revoke-1").must(t, 200)
		r2 := e.do("POST", path, tokAcme, nil, idemHeader, "revoke-1").must(t, 200)
		if !bytes.Equal(r1.body, r2.body) {
			t.Errorf("replay differs:\n%s\n%s", r1.body, r2.body)
		}
		e.do("POST", path, tokAcme, `{"disposition":"destroyed"}`, idemHeader, "revoke-1").errCode(t, 409, "idempotency_key_reused")
		e.do("POST", path, tokAcme, nil, idemHeader, "revoke-2").errCode(t, 409, "conflict")
		e.do("POST", path, tokAcme, nil).errCode(t, 409, "conflict")
	})
}

// TestInventoryRoute: the tenant's ready cells by release, no signatures
// and no cell IDs.
func TestInventoryRoute(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b)
		var cells []wire.Cell
		for range 3 {
			cells = append(cells, e.prepare(worker1, tokWorker1, lease.KataMicroVM))
		}
		cells = append(cells, e.prepare(worker2, tokWorker2, lease.GVisorLowerRisk))
		e.prepare(worker3, tokWorker3, lease.GVisorLowerRisk) // globex
		e.claimFor(tokAcme, "session-1", lease.KataMicroVM)

		r := e.do("GET", "/v1/sterile-cells/inventory", tokAcme, nil).must(t, 200)
		checkSchema(t, "InventoryResponse", r.body)
		inv := decodeAs[wire.InventoryResponse](t, r).Inventory
		rel := e.release(lease.GVisorLowerRisk)
		want := []wire.InventoryEntry{
			{ReleaseSetID: rel.ReleaseSetID, RuntimeClass: lease.GVisorLowerRisk, PolicyDigest: rel.PolicyDigest, Ready: 1, MaxLeaseSeconds: 300},
			{ReleaseSetID: rel.ReleaseSetID, RuntimeClass: lease.KataMicroVM, PolicyDigest: rel.PolicyDigest, Ready: 2, MaxLeaseSeconds: 300},
		}
		if !reflect.DeepEqual(inv, want) {
			t.Errorf("inventory = %s\nwant %+v", r.body, want)
		}
		mustNotContain(t, "inventory", string(r.body), "swrs1_", rel.Signature, e.release(lease.KataMicroVM).Signature)
		for _, c := range cells {
			mustNotContain(t, "inventory", string(r.body), c.CellID.String())
		}
		if inv := decodeAs[wire.InventoryResponse](t, e.do("GET", "/sterile-cells/inventory", tokGlobex, nil).must(t, 200)).Inventory; len(inv) != 1 || inv[0].Ready != 1 {
			t.Errorf("globex's inventory = %+v", inv)
		}
		e.do("GET", "/v1/sterile-cells/inventory", tokWorker1, nil).errCode(t, 401, "unauthorized")
	})
}

// TestEvidenceRoute: a pool cell's evidence as admitted and last verified;
// an external worker's cell, a foreign and an unknown lease are 404.
func TestEvidenceRoute(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b)
		const agent = "sha256:00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
		const image = "sha256:ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100"
		ctx, id, admitted := context.Background(), uuid.Must(uuid.NewV7()), e.plane.Now()
		if _, err := e.st.CreateMember(ctx, store.CreateMemberParams{CellID: id, Pool: "p1", TenantID: "acme", Now: admitted}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.st.AdmitMember(ctx, store.AdmitParams{CellID: id, Pool: "p1", WorkerID: "pool:p1",
			ProviderCellID: id.String(), Identity: "uid", Release: e.release(lease.GVisorLowerRisk),
			ReadyDeadline: admitted.Add(10 * time.Minute), Now: admitted,
			AdmittedClass: lease.GVisorLowerRisk, AgentDigest: agent, ImageDigest: image}); err != nil {
			t.Fatal(err)
		}
		verified := admitted.Add(time.Second)
		if err := e.st.RecordVerification(ctx, store.VerificationParams{CellID: id, RuntimeClass: lease.GVisorLowerRisk,
			AgentDigest: agent, ImageDigest: image, Now: verified}); err != nil {
			t.Fatal(err)
		}
		c := e.claimFor(tokAcme, "session-1", lease.GVisorLowerRisk)
		r := e.do("GET", leasePath(c.Lease.LeaseID, "/evidence"), tokAcme, nil).must(t, 200)
		checkSchema(t, "EvidenceResponse", r.body)
		// The pool is not configured in this plane: provider and mode null.
		want := `{"ok":true,"evidence":{"cell_id":"` + id.String() + `","pool":"p1","provider":null,"provider_mode":null,` +
			`"runtime_class":"gvisor_lower_risk","image_digest":"` + image + `","agent_digest":"` + agent + `","egress":"none",` +
			`"egress_digest":"` + egress.None.Digest() + `","admitted_at":"` +
			attest.WireTime(admitted) + `","last_verified_at":"` + attest.WireTime(verified) + `"}}`
		if string(r.body) != want {
			t.Errorf("evidence\n got %s\nwant %s", r.body, want)
		}
		mustNotContain(t, "evidence", string(r.body), *c.LeaseAttestation, attest.Digest(*c.LeaseAttestation))

		e.do("GET", leasePath(c.Lease.LeaseID, "/evidence"), tokGlobex, nil).errCode(t, 404, "not_found")
		e.do("GET", leasePath(uuid.Must(uuid.NewV7()), "/evidence"), tokAcme, nil).errCode(t, 404, "not_found")
		e.prepare(worker1, tokWorker1, lease.KataMicroVM)
		wc := e.claimFor(tokAcme, "session-2", lease.KataMicroVM)
		e.do("GET", leasePath(wc.Lease.LeaseID, "/evidence"), tokAcme, nil).errCode(t, 404, "not_found")
	})
}

// TestBodiesCarryNoDigest: the lease object, the lease status and the
// worker cell view — and the new listing and inventory — hold no "sha256"
// and no digest field other than policy_digest (CONTRACT §15), whatever
// evidence the plane keeps.
func TestBodiesCarryNoDigest(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b)
		e.prepare(worker1, tokWorker1, lease.KataMicroVM)
		id := uuid.Must(uuid.NewV7())
		claim := e.do("POST", "/v1/sterile-cells/claim", tokAcme, e.claimBody(&id, lease.KataMicroVM)).must(t, 200)
		c := decodeAs[wire.ClaimResponse](t, claim)
		cellID := e.poolCell("acme", lease.GVisorLowerRisk)
		if err := e.st.RecordVerification(context.Background(), store.VerificationParams{CellID: cellID,
			RuntimeClass: lease.GVisorLowerRisk, AgentDigest: "sha256:" + strings.Repeat("0", 64),
			ImageDigest: "sha256:" + strings.Repeat("1", 64), Now: e.plane.Now()}); err != nil {
			t.Fatal(err)
		}
		pc := e.claimFor(tokAcme, "session-2", lease.GVisorLowerRisk)
		bodies := map[string][]byte{
			"claim":        claim.body,
			"validate":     e.do("POST", leasePath(c.Lease.LeaseID, "/validate"), tokAcme, proofBody(c)).must(t, 200).body,
			"status":       e.do("GET", leasePath(c.Lease.LeaseID, ""), tokAcme, nil).must(t, 200).body,
			"pool status":  e.do("GET", leasePath(pc.Lease.LeaseID, ""), tokAcme, nil).must(t, 200).body,
			"worker cell":  e.do("GET", workerPath(worker1, "/"+c.Lease.CellID.String()), tokWorker1, nil).must(t, 200).body,
			"listing":      e.do("GET", "/v1/sterile-cell-leases", tokAcme, nil).must(t, 200).body,
			"inventory":    e.do("GET", "/v1/sterile-cells/inventory", tokAcme, nil).must(t, 200).body,
			"pool release": e.do("POST", leasePath(pc.Lease.LeaseID, "/release"), tokAcme, with(proofBody(pc), "disposition", "destroyed")).must(t, 202).body,
			"revoke":       e.do("POST", leasePath(c.Lease.LeaseID, "/revoke"), tokAcme, nil).must(t, 200).body,
		}
		for name, body := range bodies {
			if bytes.Contains(body, []byte("sha256")) {
				t.Errorf("%s body contains sha256: %s", name, body)
			}
			var v any
			if err := json.Unmarshal(body, &v); err != nil {
				t.Fatal(err)
			}
			for _, k := range jsonKeys(v) {
				if strings.Contains(k, "digest") && k != "policy_digest" {
					t.Errorf("%s body has the field %q: %s", name, k, body)
				}
			}
			if name != "claim" {
				mustNotContain(t, name, string(body), *c.LeaseAttestation, attest.Digest(*c.LeaseAttestation),
					*pc.LeaseAttestation, attest.Digest(*pc.LeaseAttestation))
			}
		}
	})
}

// jsonKeys lists every object key in a decoded JSON value.
func jsonKeys(v any) []string {
	var out []string
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			out = append(out, k)
			out = append(out, jsonKeys(x)...)
		}
	case []any:
		for _, x := range v {
			out = append(out, jsonKeys(x)...)
		}
	}
	return out
}
