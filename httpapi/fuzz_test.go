package httpapi_test

// Fuzz targets for the request decoders, path parameters and headers of the
// handler. Each runs requests through the real handler over a real SQLite
// store and plane (no mocks), and checks what a client relies on:
//
//   - no input makes the server answer 5xx (the one exception is 501
//     exec_unsupported, the documented answer of exec on a provider without
//     exec);
//   - every error is the envelope {"ok":false,"code":…,"message":…} with a
//     known code and the status of that code;
//   - every success is {"ok":true,…} and decodes into the wire types the Go
//     client uses;
//   - no answer ever holds a configured token.

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/httpapi"
	"github.com/sandboxwich/sandboxwich/internal/testenv"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
	"github.com/sandboxwich/sandboxwich/wire"
)

const (
	fzTokAcme     = "fz-tok-acme-1c9e4b7a"
	fzTokGlobex   = "fz-tok-globex-5d2f8e03"
	fzTokOperator = "fz-op-6a0b3c9d"
	fzTokWorker   = "sbw_wtok_fz-worker-7e1a2b"
)

var (
	fzWorker = sandboxwich.Worker{ID: uuid.MustParse("01890a5d-ac96-774b-bcce-00000000f001"), TenantID: "acme",
		RuntimeClasses: []lease.RuntimeClass{lease.KataMicroVM, lease.GVisorLowerRisk}}
	fzTokens = []string{fzTokAcme, fzTokGlobex, fzTokOperator, fzTokWorker}
)

// knownCodes are the codes of CONTRACT §10.2.
var knownCodes = map[errcode.Code]bool{
	errcode.BadRequest: true, errcode.InvalidRequest: true, errcode.Unauthorized: true,
	errcode.AuthorizationDenied: true, errcode.NotFound: true, errcode.MethodNotAllowed: true,
	errcode.Conflict: true, errcode.ClaimContended: true, errcode.RuntimeClassBoundaryUnverified: true,
	errcode.PayloadTooLarge: true, errcode.UnsupportedMediaType: true, errcode.Internal: true,
	errcode.AuthNotConfigured: true, errcode.InvalidIdempotencyKey: true, errcode.IdempotencyKeyReused: true,
	errcode.IdempotencyInProgress: true, errcode.ExecUnsupported: true, errcode.RequestHeaderTooLarge: true,
}

// fuzzEnv is the handler over a real SQLite store, with ready pool cells
// and one live lease of tenant acme.
type fuzzEnv struct {
	h       http.Handler
	st      store.Store
	plane   *sandboxwich.Plane
	rel     wire.Release
	lease   wire.Lease
	att     string
	release string // the JSON of rel
}

func newFuzzEnv(f *testing.F) *fuzzEnv {
	f.Helper()
	ctx := context.Background()
	st, keys := testenv.SQLite(f), testenv.Keyring(f)
	quiet := slog.New(slog.DiscardHandler)
	plane, err := sandboxwich.New(st, keys, sandboxwich.WithLogger(quiet))
	if err != nil {
		f.Fatal(err)
	}
	h, err := httpapi.New(httpapi.Config{Plane: plane, Logger: quiet, Auth: httpapi.Auth{
		TenantTokens:  map[string]string{fzTokAcme: "acme", fzTokGlobex: "globex"},
		OperatorToken: fzTokOperator,
		Workers:       map[string]sandboxwich.Worker{fzTokWorker: fzWorker},
	}})
	if err != nil {
		f.Fatal(err)
	}
	e := &fuzzEnv{h: h, st: st, plane: plane}
	e.rel = testenv.Release(keys, lease.KataMicroVM)
	b, _ := json.Marshal(e.rel)
	e.release = string(b)
	for range 4 {
		e.poolCell(f)
	}
	res, err := plane.Claim(ctx, "acme", sandboxwich.ClaimRequest{ClaimID: uuid.Must(uuid.NewV7()), Release: e.rel,
		Binding: lease.Binding{OrganizationID: "org-1", WorkspaceID: "workspace-1", ThreadID: "thread-1", RunnerSessionID: "session-1"}})
	if err != nil || res.Lease == nil {
		f.Fatalf("claim: %+v %v", res, err)
	}
	e.lease, e.att = *wire.LeaseOf(res.Lease), res.Attestation()
	return e
}

// poolCell admits a ready cell of pool "p1" for acme through the store.
func (e *fuzzEnv) poolCell(f *testing.F) {
	ctx, id, now := context.Background(), uuid.Must(uuid.NewV7()), e.plane.Now()
	if _, err := e.st.CreateMember(ctx, store.CreateMemberParams{CellID: id, Pool: "p1", TenantID: "acme", Now: now}); err != nil {
		f.Fatal(err)
	}
	if _, err := e.st.AdmitMember(ctx, store.AdmitParams{CellID: id, Pool: "p1", WorkerID: "pool:p1",
		ProviderCellID: id.String(), Identity: "uid-" + id.String(), Release: e.rel,
		ReadyDeadline: now.Add(time.Hour), Now: now}); err != nil {
		f.Fatal(err)
	}
}

// expand replaces the placeholders of a fuzzed body: $REL (the signed
// release object), $ATT (the live lease's attestation), $LEASE (its ID) and
// $FUTURE (a timestamp an hour ahead), so that the fuzzer starts next to
// valid requests.
func (e *fuzzEnv) expand(b []byte) []byte {
	r := strings.NewReplacer("$REL", e.release, "$ATT", e.att, "$LEASE", e.lease.LeaseID.String(),
		"$FUTURE", time.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano))
	return []byte(r.Replace(string(b)))
}

// serve sends one request to the handler. hdr holds name/value pairs.
func (e *fuzzEnv) serve(method, target, token string, body []byte, hdr ...string) *httptest.ResponseRecorder {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req := httptest.NewRequest(method, target, rd)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	e.h.ServeHTTP(w, req)
	return w
}

// checkAnswer checks the properties every answer has, and returns the
// error code ("" for a success).
func checkAnswer(t *testing.T, w *httptest.ResponseRecorder, allow501 bool) errcode.Code {
	t.Helper()
	body := w.Body.Bytes()
	if w.Code >= 500 && !(allow501 && w.Code == http.StatusNotImplemented) {
		t.Fatalf("status %d: %s", w.Code, body)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q", ct)
	}
	if w.Header().Get("x-request-id") == "" {
		t.Fatal("no x-request-id")
	}
	for _, tok := range fzTokens {
		if bytes.Contains(body, []byte(tok)) {
			t.Fatalf("the answer holds a token: %s", body)
		}
	}
	if w.Code < 300 {
		var ok struct {
			OK *bool `json:"ok"`
		}
		if err := json.Unmarshal(body, &ok); err != nil || ok.OK == nil || !*ok.OK {
			t.Fatalf("success %d without ok:true: %s", w.Code, body)
		}
		return ""
	}
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("error body is not JSON: %q", body)
	}
	code, _ := m["code"].(string)
	msg, _ := m["message"].(string)
	if len(m) != 3 || m["ok"] != false || msg == "" || !knownCodes[errcode.Code(code)] {
		t.Fatalf("status %d: not the error envelope with a known code: %s", w.Code, body)
	}
	c := errcode.Code(code)
	if want := c.HTTPStatus(); w.Code != want && !(c == errcode.InvalidRequest && w.Code == http.StatusBadRequest) {
		t.Fatalf("code %s answered with status %d, want %d", c, w.Code, want)
	}
	return c
}

// bodySeeds are request bodies shared by the body fuzzers.
var bodySeeds = []string{
	``, `{`, `[]`, `null`, `"x"`, `{}`, `{} {}`, `{"a":1}`, "\xef\xbb\xbf{}", `{"release":"$REL"}`,
	`{"generation":-1}`, `{"generation":1.5}`, `{"generation":1e2}`, `{"generation":"2"}`,
	`{"generation":18446744073709551616}`, `{"claim_id":"00000000-0000-0000-0000-000000000000"}`,
	`{"organization_id":"org\u0000"}`, `{"organization_id":"оrg-1"}`, `{"organization_id":"\xff"}`,
	strings.Repeat("[", 20000), `{"a":` + strings.Repeat(`{"a":`, 200) + `1` + strings.Repeat("}", 201),
}

func addSeeds(f *testing.F, extra ...string) {
	for _, s := range append(extra, bodySeeds...) {
		f.Add([]byte(s))
	}
}

// FuzzClaimBody posts fuzzed claim bodies as tenant acme. Beyond the
// properties of every answer: a 200 is either empty (lease and attestation
// null) or a lease with a 49-character swla1_ attestation, bound to the
// tenant's request.
func FuzzClaimBody(f *testing.F) {
	e := newFuzzEnv(f)
	const binding = `"organization_id":"org-1","workspace_id":"workspace-1","thread_id":"thread-1","runner_session_id":"session-1"`
	addSeeds(f,
		`{"release":$REL,`+binding+`}`,
		`{"claim_id":"01890a5d-ac96-774b-bcce-b302099a8057","release":$REL,`+binding+`,"lease_seconds":120}`,
		`{"claim_id":"{01890A5D-AC96-774B-BCCE-B302099A8057}","release":$REL,`+binding+`,"lease_seconds":0}`,
		`{"claim_id":null,"release":$REL,`+binding+`,"lease_seconds":null,"unknown":[1,2]}`,
		`{"release":$REL,"release":"x",`+binding+`}`,
		`{"release":$REL,`+binding+`,"organization_id":"org\u0000"}`,
		`{"release":{"release_set_id":"r","runtime_class":"KATA_MICROVM","policy_digest":"`+testenv.PolicyDigest+`","signature":"s"},`+binding+`}`,
		`{"release":{"release_set_id":"r","runtime_class":"kata_microvm","policy_digest":"`+strings.ToUpper(testenv.PolicyDigest)+`","signature":"s"},`+binding+`}`,
		`{"release":$REL,`+binding+`,"lease_seconds":-1}`,
		`{"release":$REL,`+binding+`,"lease_seconds":99999999999999999999}`,
	)
	f.Fuzz(func(t *testing.T, body []byte) {
		w := e.serve("POST", "/v1/sterile-cells/claim", fzTokAcme, e.expand(body))
		if checkAnswer(t, w, false) != "" || w.Code != http.StatusOK {
			return
		}
		var resp wire.ClaimResponse
		if err := json.Unmarshal(w.Body.Bytes(), &resp); err != nil {
			t.Fatalf("claim answer does not decode: %v", err)
		}
		if (resp.Lease == nil) != (resp.LeaseAttestation == nil) {
			t.Fatalf("lease and attestation disagree: %s", w.Body.Bytes())
		}
		if resp.Lease != nil {
			if a := *resp.LeaseAttestation; len(a) != 49 || !strings.HasPrefix(a, "swla1_") {
				t.Fatalf("attestation %q", a)
			}
			if resp.Lease.Generation != 2 || resp.Lease.Release != e.rel {
				t.Fatalf("lease %+v does not match the request", resp.Lease)
			}
		}
	})
}

// FuzzReleaseBody posts fuzzed release bodies for the live lease. A 202
// answers a body that presented the exact lease fence and a valid
// disposition; the status it carries is the lease's.
func FuzzReleaseBody(f *testing.F) {
	e := newFuzzEnv(f)
	const proof = `"lease_attestation":"$ATT","generation":2,"organization_id":"org-1","workspace_id":"workspace-1","thread_id":"thread-1","runner_session_id":"session-1"`
	addSeeds(f,
		`{`+proof+`,"disposition":"destroyed"}`,
		`{`+proof+`,"disposition":"quarantined"}`,
		`{`+proof+`,"disposition":"DESTROYED"}`,
		`{`+proof+`,"disposition":"ready"}`,
		`{`+proof+`,"disposition":null}`,
		`{`+proof+`,"generation":1,"disposition":"destroyed"}`,
		`{`+proof+`,"lease_attestation":"$ATT\u0000","disposition":"destroyed"}`,
		`{`+proof+`,"disposition":"destroyed","disposition":"quarantined"}`,
	)
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, path := range []string{"/v1/sterile-cell-leases/$LEASE/release", "/sterile-cell-leases/" + uuid.NewString() + "/release"} {
			w := e.serve("POST", string(e.expand([]byte(path))), fzTokAcme, e.expand(body))
			if checkAnswer(t, w, false) != "" {
				continue
			}
			if w.Code != http.StatusAccepted {
				t.Fatalf("release answered %d", w.Code)
			}
			var resp wire.StatusResponse
			if err := json.Unmarshal(w.Body.Bytes(), &resp); err != nil || resp.Status.LeaseID != e.lease.LeaseID {
				t.Fatalf("release answer %s: %v", w.Body.Bytes(), err)
			}
		}
	})
}

// FuzzExecBody posts fuzzed exec bodies for the live lease. The plane has
// no provider with exec, so the most a body can reach is 501
// exec_unsupported, after the lease fence.
func FuzzExecBody(f *testing.F) {
	e := newFuzzEnv(f)
	const proof = `"lease_attestation":"$ATT","generation":2,"organization_id":"org-1","workspace_id":"workspace-1","thread_id":"thread-1","runner_session_id":"session-1"`
	addSeeds(f,
		`{`+proof+`,"argv":["true"]}`,
		`{`+proof+`,"argv":[]}`,
		`{`+proof+`,"argv":[null]}`,
		`{`+proof+`,"argv":["sh","-c","id"],"stdin_base64":"aGk=","env":{"A":"b"},"timeout_seconds":5}`,
		`{`+proof+`,"argv":["x"],"stdin_base64":"not base64!"}`,
		`{`+proof+`,"argv":["x"],"env":{"A":null}}`,
		`{`+proof+`,"argv":["x"],"timeout_seconds":-1}`,
		`{`+proof+`,"argv":["x"],"timeout_seconds":18446744073709551615}`,
	)
	f.Fuzz(func(t *testing.T, body []byte) {
		w := e.serve("POST", string(e.expand([]byte("/v1/sterile-cell-leases/$LEASE/exec"))), fzTokAcme, e.expand(body))
		code := checkAnswer(t, w, true)
		if w.Code == http.StatusNotImplemented && code != errcode.ExecUnsupported {
			t.Fatalf("501 with code %s", code)
		}
		if code == "" {
			t.Fatalf("exec succeeded without a provider: %s", w.Body.Bytes())
		}
	})
}

// FuzzPrepareBody posts fuzzed prepare bodies as the worker. A 200 carries
// a ready generation-1 cell that decodes into the wire types, with an
// expires_at the Go client can read back.
func FuzzPrepareBody(f *testing.F) {
	e := newFuzzEnv(f)
	addSeeds(f,
		`{"cell_id":"01890a5d-ac96-774b-bcce-b302099a0001","release":$REL,"provider_cell_id":"vm-1","expires_at":"$FUTURE"}`,
		`{"cell_id":"01890a5d-ac96-774b-bcce-b302099a0002","release":$REL,"provider_cell_id":"vm\u0000","expires_at":"$FUTURE"}`,
		`{"cell_id":"01890a5d-ac96-774b-bcce-b302099a0003","release":$REL,"provider_cell_id":"vm-3","expires_at":"2020-01-01T00:00:00Z"}`,
		`{"cell_id":"01890a5d-ac96-774b-bcce-b302099a0004","release":$REL,"provider_cell_id":"vm-4","expires_at":"9999-12-31T23:59:59-23:59"}`,
		`{"cell_id":"01890a5d-ac96-774b-bcce-b302099a0005","release":$REL,"provider_cell_id":"vm-5","expires_at":1786104000}`,
		`{"cell_id":"not-a-uuid","release":$REL,"provider_cell_id":"vm-6","expires_at":"$FUTURE"}`,
		`{"cell_id":"01890a5d-ac96-774b-bcce-b302099a0007","release":$REL,"provider_cell_id":"оvm","expires_at":"$FUTURE"}`,
	)
	f.Fuzz(func(t *testing.T, body []byte) {
		w := e.serve("POST", "/v1/workers/"+fzWorker.ID.String()+"/sterile-cells/prepare", fzTokWorker, e.expand(body))
		if checkAnswer(t, w, false) != "" {
			return
		}
		var resp wire.CellResponse
		if err := json.Unmarshal(w.Body.Bytes(), &resp); err != nil {
			t.Fatalf("prepare answer %s does not decode: %v", w.Body.Bytes(), err)
		}
		c := resp.Cell
		if c.State != lease.Ready || c.Generation != 1 || c.Disposition != nil || c.Release != e.rel ||
			!lease.ValidIdentifier(c.ProviderCellID) || !c.ExpiresAt.After(time.Now().Add(-time.Minute)) {
			t.Fatalf("prepared cell %+v", c)
		}
	})
}

// FuzzUUIDPath puts a fuzzed path segment where the lease ID and the cell
// ID go. A segment that uuid.Parse accepts (any common spelling) is looked
// up: 200 for the live lease (reported lowercase and hyphenated), 404
// not_found otherwise (another tenant's lease included); any other segment
// is 400 invalid_request (one with an escaped slash may also miss the route:
// 404). Nothing is ever a 5xx.
func FuzzUUIDPath(f *testing.F) {
	e := newFuzzEnv(f)
	for _, s := range []string{
		"$LEASE", "01890a5d-ac96-774b-bcce-b302099a8057", "01890A5DAC96774BBCCEB302099A8057",
		"{01890a5d-ac96-774b-bcce-b302099a8057}", "urn:uuid:01890a5d-ac96-774b-bcce-b302099a8057",
		"00000000-0000-0000-0000-000000000000", "not-a-uuid", "../../etc/passwd", "..", ".", "%00",
		"01890a5d-ac96-774b-bcce-b302099a805７", "01890a5d-ac96-774b-bcce-b302099a8057\x00", " ",
		strings.Repeat("a", 4096),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, seg string) {
		seg = string(e.expand([]byte(seg)))
		if seg == "" || seg == "." || seg == ".." {
			return // not a segment: another path (covered by the hostile table)
		}
		id, perr := uuid.Parse(seg)
		checks := []struct {
			target, token string
			live          bool
		}{
			{"/v1/sterile-cell-leases/" + url.PathEscape(seg), fzTokAcme, id == e.lease.LeaseID},
			{"/sterile-cell-leases/" + url.PathEscape(seg), fzTokGlobex, false},
			{"/v1/workers/" + fzWorker.ID.String() + "/sterile-cells/" + url.PathEscape(seg), fzTokWorker, id == e.lease.CellID},
		}
		for _, c := range checks {
			w := e.serve("GET", c.target, c.token, nil)
			code := checkAnswer(t, w, false)
			switch {
			case perr != nil && strings.Contains(seg, "/"):
				// An escaped slash: the mux may not match the route at
				// all (404) or hand over a segment that is no UUID (400).
				if code != errcode.NotFound && code != errcode.InvalidRequest {
					t.Fatalf("GET %s: %d %s, want 400 or 404", c.target, w.Code, code)
				}
			case perr != nil && (w.Code != http.StatusBadRequest || code != errcode.InvalidRequest):
				t.Fatalf("GET %s: %d %s, want 400 invalid_request", c.target, w.Code, code)
			case perr == nil && c.live && w.Code != http.StatusOK:
				t.Fatalf("GET %s: %d, want 200", c.target, w.Code)
			case perr == nil && !c.live && (w.Code != http.StatusNotFound || code != errcode.NotFound):
				t.Fatalf("GET %s: %d %s, want 404 not_found", c.target, w.Code, code)
			}
			if w.Code == http.StatusOK && !bytes.Contains(w.Body.Bytes(), []byte(id.String())) {
				t.Fatalf("answer does not spell the ID canonically: %s", w.Body.Bytes())
			}
		}
	})
}

// FuzzBearerToken sends fuzzed Authorization headers to a tenant route.
// Only "Bearer <configured tenant token>" (scheme in any case, surrounding
// white space trimmed) authenticates; everything else is 401 unauthorized:
// a worker token on a tenant route, a prefix, a look-alike or a case
// variant of a token, two tokens, another scheme.
func FuzzBearerToken(f *testing.F) {
	e := newFuzzEnv(f)
	for _, s := range []string{
		"Bearer " + fzTokAcme, "bearer " + fzTokAcme, "BEARER  " + fzTokAcme + " ", "Bearer " + strings.ToUpper(fzTokAcme),
		"Bearer " + fzTokAcme[:len(fzTokAcme)-1], "Bearer " + fzTokAcme + "x", "Bearer " + fzTokAcme + "\x00",
		"Bearer " + strings.Replace(fzTokAcme, "a", "а", 1), "Bearer " + fzTokWorker, "Bearer " + fzTokOperator,
		"Basic " + fzTokAcme, fzTokAcme, "Bearer", "Bearer ", "Bearer\t" + fzTokAcme, "Bearer " + fzTokAcme + " " + fzTokGlobex,
		"", " ", "Bearer " + fzTokGlobex,
	} {
		f.Add(s)
	}
	tenants := map[string]bool{fzTokAcme: true, fzTokGlobex: true}
	unknown := "/v1/sterile-cell-leases/" + uuid.NewString()
	f.Fuzz(func(t *testing.T, h string) {
		w := e.serve("GET", unknown, "", nil, "Authorization", h)
		code := checkAnswer(t, w, false)
		v := strings.TrimSpace(h)
		scheme, tok, _ := strings.Cut(v, " ")
		want := strings.EqualFold(scheme, "Bearer") && tenants[strings.TrimSpace(tok)]
		switch {
		case want && code != errcode.NotFound:
			t.Fatalf("Authorization %q: %d %s, want 404 (authenticated)", h, w.Code, code)
		case !want && code != errcode.Unauthorized:
			t.Fatalf("Authorization %q: %d %s, want 401 unauthorized", h, w.Code, code)
		}
	})
}

// FuzzIdempotencyKey sends fuzzed Idempotency-Key headers with a release of
// an unknown lease. A blank key is absent (the route answers 404); a
// trimmed key of 1–128 printable ASCII characters is used: the 404 is
// stored and replayed byte for byte, and the same key with another body is
// 409 idempotency_key_reused; any other key is 400 invalid_idempotency_key.
func FuzzIdempotencyKey(f *testing.F) {
	e := newFuzzEnv(f)
	for _, s := range []string{
		"key-1", " key-1 ", "", " ", strings.Repeat("k", 128), strings.Repeat("k", 129), "ключ", "k\x00", "k\x7f",
		"k\tk", "\tk", "k e y", "01890a5d-ac96-774b-bcce-b302099a8057",
	} {
		f.Add(s)
	}
	target := "/v1/sterile-cell-leases/" + uuid.NewString() + "/release"
	body := []byte(`{"lease_attestation":"swla1_x","generation":2,"organization_id":"o","workspace_id":"w","thread_id":"t","runner_session_id":"s","disposition":"destroyed"}`)
	other := bytes.Replace(body, []byte(`"destroyed"`), []byte(`"quarantined"`), 1)
	f.Fuzz(func(t *testing.T, key string) {
		w := e.serve("POST", target, fzTokAcme, body, "Idempotency-Key", key)
		code := checkAnswer(t, w, false)
		k := strings.TrimSpace(key)
		valid := len(k) <= 128
		for i := 0; i < len(k); i++ {
			valid = valid && k[i] >= 0x20 && k[i] <= 0x7e
		}
		switch {
		case k == "" || valid:
			if code != errcode.NotFound {
				t.Fatalf("key %q: %d %s, want 404", key, w.Code, code)
			}
		default:
			if w.Code != http.StatusBadRequest || code != errcode.InvalidIdempotencyKey {
				t.Fatalf("key %q: %d %s, want 400 invalid_idempotency_key", key, w.Code, code)
			}
			return
		}
		if k == "" {
			return
		}
		again := e.serve("POST", target, fzTokAcme, body, "Idempotency-Key", key)
		if again.Code != w.Code || !bytes.Equal(again.Body.Bytes(), w.Body.Bytes()) {
			t.Fatalf("key %q: replay %d %s differs from %d %s", key, again.Code, again.Body.Bytes(), w.Code, w.Body.Bytes())
		}
		reused := e.serve("POST", target, fzTokAcme, other, "Idempotency-Key", key)
		if c := checkAnswer(t, reused, false); c != errcode.IdempotencyKeyReused {
			t.Fatalf("key %q with another body: %d %s, want idempotency_key_reused", key, reused.Code, c)
		}
	})
}
