package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/internal/testenv"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
	"github.com/sandboxwich/sandboxwich/wire"
)

// Principals of the test server.
const (
	tokAcme     = "tok-acme-4f1d9c2e7b"
	tokGlobex   = "tok-globex-8a3e61d0c5"
	tokShared   = "tok-shared-2b7c90e4f1"
	tokOperator = "op-secret-5d8e2a1f93"
	tokWorker1  = "sbw_wtok_worker1-6c2f8e0a4d"
	tokWorker2  = "sbw_wtok_worker2-9e1b3d7c5a"
	tokWorker3  = "sbw_wtok_worker3-1a4c6e8b0d"
)

var (
	worker1 = sandboxwich.Worker{ID: uuid.MustParse("01890a5d-ac96-774b-bcce-000000000001"), TenantID: "acme",
		RuntimeClasses: []lease.RuntimeClass{lease.KataMicroVM, lease.GVisorLowerRisk}}
	worker2 = sandboxwich.Worker{ID: uuid.MustParse("01890a5d-ac96-774b-bcce-000000000002"), TenantID: "acme",
		RuntimeClasses: []lease.RuntimeClass{lease.GVisorLowerRisk}}
	worker3 = sandboxwich.Worker{ID: uuid.MustParse("01890a5d-ac96-774b-bcce-000000000003"), TenantID: "globex",
		RuntimeClasses: []lease.RuntimeClass{lease.KataMicroVM, lease.GVisorLowerRisk}}
	allSecrets = []string{tokAcme, tokGlobex, tokShared, tokOperator, tokWorker1, tokWorker2, tokWorker3}
)

// testAuth is the full token configuration of the test server.
func testAuth() Auth {
	return Auth{
		TenantTokens:  map[string]string{tokAcme: "acme", tokGlobex: "globex"},
		SharedToken:   tokShared,
		OperatorToken: tokOperator,
		Workers:       map[string]sandboxwich.Worker{tokWorker1: worker1, tokWorker2: worker2, tokWorker3: worker3},
	}
}

// backend opens a real store.
type backend struct {
	name string
	open func(t *testing.T) store.Store
}

var backends = []backend{
	{"sqlite", func(t *testing.T) store.Store { return testenv.SQLite(t) }},
	{"postgres", func(t *testing.T) store.Store { return testenv.Postgres(t) }},
}

// eachBackend runs fn once per store backend, in parallel.
func eachBackend(t *testing.T, fn func(t *testing.T, b backend)) {
	t.Helper()
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			fn(t, b)
		})
	}
}

// syncBuffer is a goroutine-safe log sink.
type syncBuffer = testenv.Buffer

// env is a running test server over a real store and plane.
type env struct {
	t     *testing.T
	srv   *httptest.Server
	st    store.Store
	plane *sandboxwich.Plane
	keys  *attest.Keyring
	reg   *prometheus.Registry
	logs  *syncBuffer
}

// newEnv starts a server over a fresh store of backend b. mods adjust the
// configuration (the default has every token of testAuth).
func newEnv(t *testing.T, b backend, mods ...func(*Config)) *env {
	t.Helper()
	return newEnvWith(t, b, nil, mods...)
}

// newEnvWith is newEnv with options for the plane.
func newEnvWith(t *testing.T, b backend, opts []sandboxwich.Option, mods ...func(*Config)) *env {
	t.Helper()
	keys := testenv.Keyring(t)
	var err error
	e := &env{t: t, st: b.open(t), keys: keys, reg: prometheus.NewRegistry(), logs: &syncBuffer{}}
	log := slog.New(slog.NewJSONHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if e.plane, err = sandboxwich.New(e.st, keys, append([]sandboxwich.Option{sandboxwich.WithLogger(log)}, opts...)...); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Plane: e.plane, Auth: testAuth(), Logger: log, Registry: e.reg}
	for _, m := range mods {
		m(&cfg)
	}
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.srv = httptest.NewServer(h)
	t.Cleanup(e.srv.Close)
	return e
}

// resp is a finished response.
type resp struct {
	status int
	header http.Header
	body   []byte
}

// do sends a request. body may be nil, a string or []byte (sent as is) or
// any value (JSON-encoded); a body gets Content-Type application/json unless
// hdr sets one. hdr holds header name/value pairs.
func (e *env) do(method, path, token string, body any, hdr ...string) resp {
	e.t.Helper()
	var rd io.Reader
	var raw []byte
	switch v := body.(type) {
	case nil:
	case string:
		raw = []byte(v)
	case []byte:
		raw = v
	default:
		var err error
		if raw, err = json.Marshal(v); err != nil {
			e.t.Fatal(err)
		}
	}
	if body != nil {
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, e.srv.URL+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp{status: res.StatusCode, header: res.Header, body: b}
}

// must checks the status of a response.
func (r resp) must(t *testing.T, status int) resp {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d; body %s", r.status, status, r.body)
	}
	return r
}

// errCode checks an error response's status, envelope and code.
func (r resp) errCode(t *testing.T, status int, code string) {
	t.Helper()
	r.must(t, status)
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("error body %s: %v", r.body, err)
	}
	if m["ok"] != false || m["code"] != code || m["message"] == "" || len(m) != 3 {
		t.Fatalf("error body %s, want code %s", r.body, code)
	}
}

// decodeAs decodes a response body.
func decodeAs[T any](t *testing.T, r resp) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
	return v
}

// release returns the signed release of a class.
func (e *env) release(class lease.RuntimeClass) wire.Release { return signedRelease(e.t, class) }

// signedRelease returns a release of class signed with the test key.
func signedRelease(t *testing.T, class lease.RuntimeClass) wire.Release {
	t.Helper()
	return testenv.Release(testenv.Keyring(t), class)
}

// prepare registers a ready cell of worker w through the worker route.
func (e *env) prepare(w sandboxwich.Worker, token string, class lease.RuntimeClass) wire.Cell {
	e.t.Helper()
	r := e.do("POST", "/v1/workers/"+w.ID.String()+"/sterile-cells/prepare", token, e.prepareBody(class)).must(e.t, 200)
	return decodeAs[wire.CellResponse](e.t, r).Cell
}

func (e *env) prepareBody(class lease.RuntimeClass) map[string]any {
	return map[string]any{
		"cell_id":          uuid.Must(uuid.NewV7()).String(),
		"release":          e.release(class),
		"provider_cell_id": "provider/" + uuid.NewString(),
		"expires_at":       time.Now().Add(10 * time.Minute).Format(time.RFC3339Nano),
	}
}

// poolCell admits a ready cell of pool "p1" for tenant through the store.
func (e *env) poolCell(tenant string, class lease.RuntimeClass) uuid.UUID {
	e.t.Helper()
	ctx, id, now := context.Background(), uuid.Must(uuid.NewV7()), e.plane.Now()
	if _, err := e.st.CreateMember(ctx, store.CreateMemberParams{CellID: id, Pool: "p1", TenantID: tenant, Now: now}); err != nil {
		e.t.Fatal(err)
	}
	_, err := e.st.AdmitMember(ctx, store.AdmitParams{CellID: id, Pool: "p1", WorkerID: "pool:p1",
		ProviderCellID: id.String(), Identity: "uid-" + id.String(), Release: e.release(class),
		ReadyDeadline: now.Add(10 * time.Minute), Now: now})
	if err != nil {
		e.t.Fatal(err)
	}
	return id
}

// claimBody is a claim request; claimID may be nil (unfenced).
func (e *env) claimBody(claimID *uuid.UUID, class lease.RuntimeClass) map[string]any {
	b := map[string]any{
		"release":           e.release(class),
		"organization_id":   "org-1",
		"workspace_id":      "workspace-1",
		"thread_id":         "thread-1",
		"runner_session_id": "session-1",
	}
	if claimID != nil {
		b["claim_id"] = claimID.String()
	}
	return b
}

// claim leases a cell for token and returns the response.
func (e *env) claim(token string, claimID *uuid.UUID, class lease.RuntimeClass) wire.ClaimResponse {
	e.t.Helper()
	r := e.do("POST", "/v1/sterile-cells/claim", token, e.claimBody(claimID, class)).must(e.t, 200)
	return decodeAs[wire.ClaimResponse](e.t, r)
}

// proofBody is the lease fence of a claim response.
func proofBody(c wire.ClaimResponse) map[string]any {
	return map[string]any{
		"lease_attestation": *c.LeaseAttestation,
		"generation":        c.Lease.Generation,
		"organization_id":   c.Lease.OrganizationID,
		"workspace_id":      c.Lease.WorkspaceID,
		"thread_id":         c.Lease.ThreadID,
		"runner_session_id": c.Lease.RunnerSessionID,
	}
}

// with returns a copy of m with extra fields.
func with(m map[string]any, kv ...any) map[string]any {
	out := make(map[string]any, len(m)+len(kv)/2)
	for k, v := range m {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i].(string)] = kv[i+1]
	}
	return out
}

// without returns a copy of m without the given fields.
func without(m map[string]any, keys ...string) map[string]any {
	out := with(m)
	for _, k := range keys {
		delete(out, k)
	}
	return out
}

func workerPath(w sandboxwich.Worker, rest string) string {
	return "/v1/workers/" + w.ID.String() + "/sterile-cells" + rest
}

func leasePath(id uuid.UUID, rest string) string {
	return "/v1/sterile-cell-leases/" + id.String() + rest
}

func mustNotContain(t *testing.T, what, s string, secrets ...string) {
	t.Helper()
	for _, sec := range secrets {
		if sec != "" && strings.Contains(s, sec) {
			t.Errorf("%s contains the secret %q", what, sec)
		}
	}
}
