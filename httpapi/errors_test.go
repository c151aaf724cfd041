package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
	"github.com/sandboxwich/sandboxwich/wire"
)

// TestRequestErrors: 400, 401, 404, 405, 413, 415 and 422 answers.
func TestRequestErrors(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b)
		e.prepare(worker1, tokWorker1, lease.KataMicroVM)
		c := e.claim(tokAcme, nil, lease.KataMicroVM)
		claim := e.claimBody(nil, lease.KataMicroVM)
		release := toMap(t, e.release(lease.KataMicroVM))
		validate := leasePath(c.Lease.LeaseID, "/validate")
		cellPath := workerPath(worker1, "/"+c.Lease.CellID.String())
		const claimPath = "/v1/sterile-cells/claim"

		type tc struct {
			name         string
			method, path string
			token        string
			body         any
			hdr          []string
			status       int
			code         string
		}
		cases := []tc{
			{"no token", "POST", claimPath, "", claim, nil, 401, "unauthorized"},
			{"unknown token", "POST", claimPath, "nope", claim, nil, 401, "unauthorized"},
			{"unknown worker-shaped token", "POST", validate, "sbw_wtok_unknown", proofBody(c), nil, 401, "unauthorized"},
			{"basic auth", "POST", claimPath, "", claim, []string{"Authorization", "Basic " + tokAcme}, 401, "unauthorized"},
			{"empty bearer", "POST", claimPath, "", claim, []string{"Authorization", "Bearer "}, 401, "unauthorized"},
			{"worker token on claim", "POST", claimPath, tokWorker1, claim, nil, 401, "unauthorized"},
			{"worker token on lease status", "GET", leasePath(c.Lease.LeaseID, ""), tokWorker1, nil, nil, 401, "unauthorized"},
			{"tenant token on worker route", "GET", cellPath, tokAcme, nil, nil, 401, "unauthorized"},
			{"operator on worker route", "GET", cellPath, tokAcme, nil, []string{wire.OperatorHeader, tokOperator}, 401, "unauthorized"},
			{"tenant token on pools", "GET", "/v1/pools", tokAcme, nil, nil, 401, "unauthorized"},
			{"wrong operator token on pools", "GET", "/v1/pools", tokAcme, nil, []string{wire.OperatorHeader, "wrong"}, 401, "unauthorized"},
			{"worker token on pools", "GET", "/v1/pools", tokWorker1, nil, []string{wire.OperatorHeader, tokOperator}, 401, "unauthorized"},
			{"worker token on metrics", "GET", "/metrics", tokWorker1, nil, nil, 401, "unauthorized"},
			{"unknown path", "GET", "/v1/nope", tokAcme, nil, nil, 404, "not_found"},
			{"unknown path without token", "POST", "/nope/deeper", "", "{}", nil, 404, "not_found"},
			{"unknown lease", "GET", leasePath(uuid.Must(uuid.NewV7()), ""), tokAcme, nil, nil, 404, "not_found"},
			{"worker token on another worker's path", "GET", workerPath(worker2, "/"+c.Lease.CellID.String()), tokWorker1, nil, nil, 404, "not_found"},
			{"worker of another tenant on the path of a worker", "POST", workerPath(worker1, "/prepare"), tokWorker3, e.prepareBody(lease.KataMicroVM), nil, 404, "not_found"},
			{"bad lease UUID", "GET", "/v1/sterile-cell-leases/not-a-uuid", tokAcme, nil, nil, 400, "invalid_request"},
			{"bad worker UUID", "GET", "/v1/workers/w1/sterile-cells/" + uuid.NewString(), tokWorker1, nil, nil, 400, "invalid_request"},
			{"bad cell UUID", "GET", workerPath(worker1, "/cell-1"), tokWorker1, nil, nil, 400, "invalid_request"},
			{"malformed JSON", "POST", claimPath, tokAcme, "{", nil, 400, "invalid_request"},
			{"empty body", "POST", claimPath, tokAcme, "", nil, 400, "invalid_request"},
			{"trailing data", "POST", claimPath, tokAcme, `{} {}`, nil, 400, "invalid_request"},
			{"no content type", "POST", claimPath, tokAcme, claim, []string{"Content-Type", ""}, 415, "unsupported_media_type"},
			{"text/plain", "POST", claimPath, tokAcme, claim, []string{"Content-Type", "text/plain"}, 415, "unsupported_media_type"},
			{"too large", "POST", claimPath, tokAcme, `{"pad":"` + strings.Repeat("x", MaxBodyBytes) + `"}`, nil, 413, "payload_too_large"},
			{"array body", "POST", claimPath, tokAcme, `[]`, nil, 422, "invalid_request"},
			{"null body", "POST", claimPath, tokAcme, `null`, nil, 422, "invalid_request"},
			{"string body", "POST", claimPath, tokAcme, `"claim"`, nil, 422, "invalid_request"},
			{"missing release", "POST", claimPath, tokAcme, without(claim, "release"), nil, 422, "invalid_request"},
			{"null release", "POST", claimPath, tokAcme, with(claim, "release", nil), nil, 422, "invalid_request"},
			{"release not an object", "POST", claimPath, tokAcme, with(claim, "release", "r"), nil, 422, "invalid_request"},
			{"missing signature", "POST", claimPath, tokAcme, with(claim, "release", without(release, "signature")), nil, 422, "invalid_request"},
			{"unknown runtime class", "POST", claimPath, tokAcme, with(claim, "release", with(release, "runtime_class", "docker")), nil, 422, "invalid_request"},
			{"missing binding field", "POST", claimPath, tokAcme, without(claim, "thread_id"), nil, 422, "invalid_request"},
			{"null binding field", "POST", claimPath, tokAcme, with(claim, "organization_id", nil), nil, 422, "invalid_request"},
			{"number binding field", "POST", claimPath, tokAcme, with(claim, "organization_id", 7), nil, 422, "invalid_request"},
			{"bad claim_id", "POST", claimPath, tokAcme, with(claim, "claim_id", "claim-1"), nil, 422, "invalid_request"},
			{"numeric claim_id", "POST", claimPath, tokAcme, with(claim, "claim_id", 1), nil, 422, "invalid_request"},
			{"negative lease_seconds", "POST", claimPath, tokAcme, with(claim, "lease_seconds", -1), nil, 422, "invalid_request"},
			{"fractional lease_seconds", "POST", claimPath, tokAcme, with(claim, "lease_seconds", 1.5), nil, 422, "invalid_request"},
			{"exponent lease_seconds", "POST", claimPath, tokAcme, strings.Replace(string(mustJSON(t, claim)), "{", `{"lease_seconds":1e2,`, 1), nil, 422, "invalid_request"},
			{"string lease_seconds", "POST", claimPath, tokAcme, with(claim, "lease_seconds", "120"), nil, 422, "invalid_request"},
			{"huge lease_seconds", "POST", claimPath, tokAcme, strings.Replace(string(mustJSON(t, claim)), "{", `{"lease_seconds":18446744073709551616,`, 1), nil, 422, "invalid_request"},
			{"negative generation", "POST", validate, tokAcme, with(proofBody(c), "generation", -2), nil, 422, "invalid_request"},
			{"missing attestation", "POST", validate, tokAcme, without(proofBody(c), "lease_attestation"), nil, 422, "invalid_request"},
			{"bad disposition", "POST", leasePath(c.Lease.LeaseID, "/release"), tokAcme, with(proofBody(c), "disposition", "deleted"), nil, 422, "invalid_request"},
			{"argv with null", "POST", leasePath(c.Lease.LeaseID, "/exec"), tokAcme, with(proofBody(c), "argv", []any{"a", nil}), nil, 422, "invalid_request"},
			{"argv not an array", "POST", leasePath(c.Lease.LeaseID, "/exec"), tokAcme, with(proofBody(c), "argv", "ls"), nil, 422, "invalid_request"},
			{"env not strings", "POST", leasePath(c.Lease.LeaseID, "/exec"), tokAcme, with(proofBody(c), "argv", []string{"ls"}, "env", map[string]any{"A": 1}), nil, 422, "invalid_request"},
			{"bad timestamp", "POST", workerPath(worker1, "/prepare"), tokWorker1, with(e.prepareBody(lease.KataMicroVM), "expires_at", "2026-13-01T00:00:00Z"), nil, 422, "invalid_request"},
			{"expires_at beyond 7 days", "POST", workerPath(worker1, "/prepare"), tokWorker1, with(e.prepareBody(lease.KataMicroVM), "expires_at", time.Now().Add(sandboxwich.DefaultMaxPrepareAhead+time.Minute)), nil, 422, "invalid_request"},
			{"retire without generation", "POST", cellPath + "/retire", tokWorker1, `{}`, nil, 422, "invalid_request"},
			{"destroy with bad lease_id", "POST", cellPath + "/destroy", tokWorker1, map[string]any{"lease_id": "x", "generation": 2, "disposition": "destroyed"}, nil, 422, "invalid_request"},
			{"bad identifier", "POST", claimPath, tokAcme, with(claim, "runner_session_id", strings.Repeat("s", 257)), nil, 400, "bad_request"},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				e.t = t
				e.do(tc.method, tc.path, tc.token, tc.body, tc.hdr...).errCode(t, tc.status, tc.code)
			})
		}
		e.t = t
	})
}

// TestMethodNotAllowed: 405 with Allow and the JSON envelope.
func TestMethodNotAllowed(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b)
		for _, tc := range []struct{ method, path, allow string }{
			{"GET", "/v1/sterile-cells/claim", "POST"},
			{"PUT", "/sterile-cells/claim", "POST"},
			{"DELETE", "/v1/pools", "GET, HEAD"},
			{"POST", "/healthz", "GET, HEAD"},
			{"DELETE", leasePath(uuid.New(), ""), "GET, HEAD"},
		} {
			r := e.do(tc.method, tc.path, tokAcme, nil)
			r.errCode(t, 405, "method_not_allowed")
			if got := r.header.Get("Allow"); got != tc.allow {
				t.Errorf("%s %s: Allow %q, want %q", tc.method, tc.path, got, tc.allow)
			}
		}
	})
}

// TestAccepted: what the contract accepts that a strict server might not.
func TestAccepted(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b)
		e.prepare(worker1, tokWorker1, lease.KataMicroVM)
		claim := e.claimBody(nil, lease.KataMicroVM)
		// Content type with parameters; lowercase bearer scheme.
		r := e.do("POST", "/v1/sterile-cells/claim", "", claim,
			"Content-Type", "application/json; charset=utf-8", "Authorization", "bearer "+tokAcme).must(t, 200)
		c := decodeAs[wire.ClaimResponse](t, r)
		// Path UUIDs in every common spelling.
		id := c.Lease.LeaseID.String()
		for _, spelling := range []string{id, strings.ToUpper(id), strings.ReplaceAll(id, "-", ""), "{" + id + "}", "urn:uuid:" + id} {
			r := e.do("GET", "/v1/sterile-cell-leases/"+spelling, tokAcme, nil).must(t, 200)
			if st := decodeAs[wire.StatusResponse](t, r).Status; st.LeaseID != c.Lease.LeaseID {
				t.Errorf("%s: status of %s", spelling, st.LeaseID)
			}
		}
		// Input timestamps with any offset; output in UTC with Z.
		at := time.Now().Add(time.Hour).Truncate(time.Second).Add(500 * time.Millisecond)
		body := with(e.prepareBody(lease.KataMicroVM), "expires_at", at.In(time.FixedZone("", 2*3600)).Format("2006-01-02T15:04:05.0Z07:00"))
		r = e.do("POST", workerPath(worker1, "/prepare"), tokWorker1, body).must(t, 200)
		if !bytes.Contains(r.body, []byte(`"expires_at":"`+at.UTC().Format("2006-01-02T15:04:05.000")+`Z"`)) {
			t.Errorf("prepared expiry: %s", r.body)
		}
		// Operators act within their tenant on tenant routes.
		e.do("GET", leasePath(c.Lease.LeaseID, ""), tokAcme, nil, wire.OperatorHeader, tokOperator).must(t, 200)
		e.do("GET", leasePath(c.Lease.LeaseID, ""), tokAcme, nil, wire.OperatorHeader, "wrong").must(t, 200)
		// Aliases.
		e.do("GET", "/sterile-cell-leases/"+id, tokAcme, nil).must(t, 200)
		e.do("GET", "/v1/healthz", "", nil).must(t, 200)
		e.do("GET", "/pools", tokAcme, nil, wire.OperatorHeader, tokOperator).must(t, 200)
	})
}

// TestAuthNotConfigured: fail closed.
func TestAuthNotConfigured(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b, func(c *Config) { c.Auth = Auth{OperatorToken: tokOperator}; c.MetricsPublic = true })
		e.do("GET", "/healthz", "", nil).must(t, 200)
		r := e.do("GET", "/readyz", "", nil).must(t, 503)
		checkSchema(t, "Health", r.body)
		if h := decodeAs[health](t, r); h.OK || !h.Database.OK || h.Auth.OK {
			t.Errorf("readyz: %s", r.body)
		}
		for _, p := range []struct{ method, path string }{
			{"POST", "/v1/sterile-cells/claim"}, {"GET", "/v1/pools"}, {"GET", "/metrics"},
			{"GET", "/v1/openapi.json"}, {"GET", "/v1/nope"}, {"DELETE", "/v1/pools"},
			{"POST", workerPath(worker1, "/prepare")},
		} {
			e.do(p.method, p.path, tokAcme, "{}").errCode(t, 500, "auth_not_configured")
		}
		if !strings.Contains(e.logs.String(), "no authentication configured") {
			t.Error("no warning logged")
		}
	})
}

// TestInsecure: unauthenticated requests act as the default tenant.
func TestInsecure(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b, func(c *Config) { c.Auth = Auth{AllowInsecureNoAuth: true, DefaultTenant: "dev"} })
		if !strings.Contains(e.logs.String(), "INSECURE") {
			t.Error("no warning logged")
		}
		e.do("GET", "/readyz", "", nil).must(t, 200)
		e.poolCell("dev", lease.KataMicroVM)
		r := e.do("POST", "/v1/sterile-cells/claim", "", e.claimBody(nil, lease.KataMicroVM)).must(t, 200)
		c := decodeAs[wire.ClaimResponse](t, r)
		if c.Lease == nil {
			t.Fatal("the insecure tenant could not claim the dev cell")
		}
		e.do("GET", leasePath(c.Lease.LeaseID, ""), "", nil).must(t, 200)
		e.do("GET", "/metrics", "", nil).must(t, 200)
		// A presented token must still be valid; there are no workers or operators.
		e.do("GET", leasePath(c.Lease.LeaseID, ""), "made-up", nil).errCode(t, 401, "unauthorized")
		e.do("GET", workerPath(worker1, "/"+c.Lease.CellID.String()), "", nil).errCode(t, 401, "unauthorized")
		e.do("GET", "/v1/pools", "", nil).errCode(t, 401, "unauthorized")
	})
}

// TestSharedToken: the shared token acts for the default tenant, next to
// tenant tokens.
func TestSharedToken(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b)
		e.prepare(worker1, tokWorker1, lease.KataMicroVM)
		if c := e.claim(tokShared, nil, lease.KataMicroVM); c.Lease != nil {
			t.Fatal("the shared token leased acme's cell")
		}
		e.poolCell("default", lease.KataMicroVM)
		if c := e.claim(tokShared, nil, lease.KataMicroVM); c.Lease == nil {
			t.Fatal("the shared token could not lease the default tenant's cell")
		}
	})
}

// TestPools: operator only; the plane's own pools, only those of the
// operator's tenant (CONTRACT §19); every member state key present; a
// failing provider's last_error.
func TestPools(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b)
		r := e.do("GET", "/v1/pools", tokAcme, nil, wire.OperatorHeader, tokOperator).must(t, 200)
		if string(r.body) != `{"ok":true,"pools":[]}` {
			t.Errorf("no pools: %s", r.body)
		}
		rel := signedRelease(t, lease.KataMicroVM)
		failing := listFailing{fake.New(fake.Config{})}
		e2 := newEnvWith(t, b, []sandboxwich.Option{sandboxwich.WithPools(
			pool.Config{Name: "p1", TenantID: "acme", Release: rel, Target: 2, Provider: fake.New(fake.Config{})},
			pool.Config{Name: "p2", TenantID: "acme", Release: rel, Target: 1, Provider: failing},
			pool.Config{Name: "g1", TenantID: "globex", Release: rel, Target: 1, Provider: fake.New(fake.Config{})},
		)})
		acmePools := func() []map[string]json.RawMessage {
			t.Helper()
			r := e2.do("GET", "/v1/pools", tokAcme, nil, wire.OperatorHeader, tokOperator).must(t, 200)
			checkSchema(t, "PoolsResponse", r.body)
			var got struct {
				Pools []map[string]json.RawMessage `json:"pools"`
			}
			if err := json.Unmarshal(r.body, &got); err != nil || len(got.Pools) != 2 ||
				string(got.Pools[0]["name"]) != `"p1"` || string(got.Pools[1]["name"]) != `"p2"` {
				t.Fatalf("acme's operator sees %s", r.body)
			}
			return got.Pools
		}
		if v := string(acmePools()[0]["last_reconcile_at"]); v != "null" {
			t.Errorf("last_reconcile_at before the first pass: %s", v)
		}
		e2.plane.Pools().Pass(context.Background())

		r = e2.do("GET", "/v1/pools", tokGlobex, nil, wire.OperatorHeader, tokOperator).must(t, 200)
		if p := decodeAs[wire.PoolsResponse](t, r).Pools; len(p) != 1 || p[0].Name != "g1" || p[0].Members["ready"] != 1 {
			t.Errorf("globex's operator sees %s", r.body)
		}
		r = e2.do("GET", "/v1/pools", tokShared, nil, wire.OperatorHeader, tokOperator).must(t, 200)
		if string(r.body) != `{"ok":true,"pools":[]}` {
			t.Errorf("the default tenant's operator sees %s", r.body)
		}
		ps := acmePools()
		want := `{"cleanup_pending":0,"destroyed":0,"leased":0,"provisioning":0,"quarantined":0,"ready":2,"stopping":0}`
		if m := string(ps[0]["members"]); m != want {
			t.Errorf("members %s, want %s", m, want)
		}
		for k, want := range map[string]string{"provider": `"dry-run"`, "mode": `"dry_run"`, "target": "2",
			"tenant_id": `"acme"`, "last_error": "null"} {
			if v := string(ps[0][k]); v != want {
				t.Errorf("p1 %s = %s, want %s", k, v, want)
			}
		}
		if v := string(ps[0]["last_reconcile_at"]); v == "null" || v == "" {
			t.Errorf("last_reconcile_at after a pass: %s", v)
		}
		if v := string(ps[1]["last_error"]); v != `"list: provider said:\nno"` {
			t.Errorf("p2 last_error = %s", v)
		}
	})
}

// listFailing is the fake provider whose List fails.
type listFailing struct{ *fake.Provider }

func (listFailing) List(context.Context) ([]driver.Object, error) {
	return nil, errors.New("provider said:\nno")
}

// TestHeaderTooLarge: a request whose header exceeds MaxHeaderBytes is 431
// request_header_too_large in the JSON envelope, on any route and before
// authentication; a header just under the limit is served.
func TestHeaderTooLarge(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b)
		big := strings.Repeat("x", 100<<10)
		e.do("GET", "/healthz", "", nil, "X-Pad", big).errCode(t, 431, "request_header_too_large")
		e.do("POST", "/v1/sterile-cells/claim", "", e.claimBody(nil, lease.KataMicroVM), "X-Pad", big).
			errCode(t, 431, "request_header_too_large")
		r := e.do("GET", "/v1/nope", tokAcme, nil, "X-Pad", strings.Repeat("y", MaxHeaderBytes))
		r.errCode(t, 431, "request_header_too_large")
		if r.header.Get(RequestIDHeader) == "" {
			t.Error("431 without x-request-id")
		}
		e.do("GET", "/healthz", "", nil, "X-Pad", strings.Repeat("z", MaxHeaderBytes-1024)).must(t, 200)
	})
}
