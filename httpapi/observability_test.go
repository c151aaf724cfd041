package httpapi

import (
	"bufio"
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/wire"
)

// TestRequestID: x-request-id is echoed when usable, generated otherwise,
// on every response.
func TestRequestID(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b)
		generated := func(r resp) {
			t.Helper()
			id, err := uuid.Parse(r.header.Get(RequestIDHeader))
			if err != nil || id.Version() != 7 {
				t.Errorf("x-request-id %q is not a UUIDv7", r.header.Get(RequestIDHeader))
			}
		}
		for _, tc := range []struct{ method, path, token string }{
			{"GET", "/healthz", ""},
			{"GET", "/v1/nope", ""},
			{"DELETE", "/v1/pools", ""},
			{"POST", "/v1/sterile-cells/claim", ""},
			{"GET", "/v1/pools", tokAcme},
		} {
			r := e.do(tc.method, tc.path, tc.token, nil, RequestIDHeader, "req-42 from client")
			if got := r.header.Get(RequestIDHeader); got != "req-42 from client" {
				t.Errorf("%s %s: x-request-id %q", tc.method, tc.path, got)
			}
			generated(e.do(tc.method, tc.path, tc.token, nil))
		}
		generated(e.do("GET", "/healthz", "", nil, RequestIDHeader, "   "))
		generated(e.do("GET", "/healthz", "", nil, RequestIDHeader, strings.Repeat("r", 129)))
		generated(e.do("GET", "/healthz", "", nil, RequestIDHeader, "é"))
		if got := e.do("GET", "/healthz", "", nil, RequestIDHeader, " padded ").header.Get(RequestIDHeader); got != "padded" {
			t.Errorf("trimmed request ID %q", got)
		}
	})
}

// TestTraceparent: a valid traceparent is echoed, an invalid one is not.
func TestTraceparent(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b)
		const valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		for _, path := range []string{"/healthz", "/v1/nope"} {
			if got := e.do("GET", path, "", nil, TraceparentHeader, valid).header.Get(TraceparentHeader); got != valid {
				t.Errorf("%s: traceparent %q", path, got)
			}
		}
		for _, bad := range []string{
			"00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",
			"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
			"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
			"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
			"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
			"garbage",
		} {
			if got := e.do("GET", "/healthz", "", nil, TraceparentHeader, bad).header.Get(TraceparentHeader); got != "" {
				t.Errorf("invalid traceparent %q echoed as %q", bad, got)
			}
		}
		future := "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more"
		if got := e.do("GET", "/healthz", "", nil, TraceparentHeader, future).header.Get(TraceparentHeader); got != future {
			t.Errorf("future-version traceparent %q", got)
		}
	})
}

// TestMetrics: the exposition, and who may read it.
func TestMetrics(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b)
		e.prepare(worker1, tokWorker1, lease.KataMicroVM)
		e.claim(tokAcme, nil, lease.KataMicroVM)
		e.claim(tokAcme, nil, lease.KataMicroVM)
		e.do("GET", "/v1/nope", "", nil)
		e.do("GET", "/metrics", "", nil).errCode(t, 401, "unauthorized")
		e.do("GET", "/metrics", tokAcme, nil, wire.OperatorHeader, tokOperator).must(t, 200)
		r := e.do("GET", "/metrics", tokGlobex, nil).must(t, 200)
		if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
			t.Errorf("Content-Type %q", ct)
		}
		body := string(r.body)
		for _, want := range []string{
			`sandboxwich_http_requests_total{code="200",route="POST /v1/sterile-cells/claim"} 2`,
			`sandboxwich_http_requests_total{code="200",route="POST /v1/workers/{worker_id}/sterile-cells/prepare"} 1`,
			`sandboxwich_http_requests_total{code="404",route="unmatched"} 1`,
			`sandboxwich_http_requests_total{code="401",route="GET /metrics"} 1`,
			`sandboxwich_http_request_duration_seconds_bucket{code="200",route="POST /v1/sterile-cells/claim",le="+Inf"} 2`,
			`sandboxwich_claims_total{outcome="leased"} 1`,
			`sandboxwich_claims_total{outcome="empty"} 1`,
			`sandboxwich_claims_total{outcome="contended"} 0`,
			`sandboxwich_cells{state="leased"} 1`,
			`sandboxwich_cells{state="ready"} 0`,
			`sandboxwich_build_info{`,
		} {
			if !strings.Contains(body, want) {
				t.Errorf("metrics lack %s", want)
			}
		}
		pub := newEnv(t, b, func(c *Config) { c.MetricsPublic = true })
		pub.do("GET", "/metrics", "", nil).must(t, 200)
		pub.do("GET", "/v1/metrics", "", nil).must(t, 200)
	})
}

// TestReadyz: store reachable and auth configured.
func TestReadyz(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b)
		r := e.do("GET", "/readyz", "", nil).must(t, 200)
		checkSchema(t, "Health", r.body)
		// checked_at is the time of the check (TestHealthCheckedAt).
		checkedAt := regexp.MustCompile(`,"checked_at":"[0-9T:.Z-]+"`)
		if got := checkedAt.ReplaceAllString(string(r.body), ""); got != `{"ok":true,"service":"sandboxwich","database":{"ok":true,"message":null},"auth":{"ok":true,"message":null}}` {
			t.Errorf("readyz: %s", r.body)
		}
		if got := checkedAt.ReplaceAllString(string(e.do("GET", "/healthz", "", nil).must(t, 200).body), ""); got != `{"ok":true,"service":"sandboxwich"}` {
			t.Errorf("healthz body %s", got)
		}
		if err := e.st.Close(); err != nil {
			t.Fatal(err)
		}
		e.do("GET", "/readyz", "", nil).must(t, 503)
		e.do("GET", "/healthz", "", nil).must(t, 200)
		// A store failure on a route is a 500 internal without internals.
		r = e.do("GET", leasePath(uuid.New(), ""), tokAcme, nil)
		r.errCode(t, 500, "internal")
		if !strings.Contains(string(r.body), internalMessage) {
			t.Errorf("internal error body %s", r.body)
		}
	})
}

// TestLogsHoldNoSecrets: a claim, validate and release at Debug level log
// one line per request and never a token, the operator token or the
// attestation.
func TestLogsHoldNoSecrets(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b)
		e.prepare(worker1, tokWorker1, lease.KataMicroVM)
		c := e.claim(tokAcme, nil, lease.KataMicroVM)
		e.do("POST", leasePath(c.Lease.LeaseID, "/validate"), tokAcme, proofBody(c), wire.OperatorHeader, tokOperator).must(t, 200)
		e.do("POST", leasePath(c.Lease.LeaseID, "/validate"), tokWorker1, proofBody(c)).must(t, 200)
		e.do("POST", leasePath(c.Lease.LeaseID, "/release"), tokAcme, with(proofBody(c), "disposition", "destroyed"), idemHeader, "k1").errCode(t, 404, "not_found")
		e.do("POST", leasePath(c.Lease.LeaseID, "/validate"), tokGlobex, proofBody(c)).errCode(t, 404, "not_found")
		e.do("GET", "/v1/pools", tokShared, nil, wire.OperatorHeader, "wrong-operator-guess").errCode(t, 401, "unauthorized")
		logs := e.logs.String()
		secrets := append([]string{*c.LeaseAttestation, attest.Digest(*c.LeaseAttestation), "wrong-operator-guess"}, allSecrets...)
		mustNotContain(t, "logs", logs, secrets...)
		requests := 0
		sc := bufio.NewScanner(strings.NewReader(logs))
		for sc.Scan() {
			var line map[string]any
			if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
				t.Fatalf("log line %q: %v", sc.Text(), err)
			}
			if line["msg"] == "http request" {
				requests++
				for _, k := range []string{"method", "route", "status", "duration", "request_id"} {
					if _, ok := line[k]; !ok {
						t.Errorf("request log line lacks %s: %s", k, sc.Text())
					}
				}
			}
		}
		if requests != 7 {
			t.Errorf("%d request log lines, want 7:\n%s", requests, logs)
		}
	})
}
