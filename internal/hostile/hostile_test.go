package hostile

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/wire"
)

// hcase is one hostile request and the answer it must get.
type hcase struct {
	name         string
	method, path string
	token        string // bearer token, "" for none
	body         any    // nil, string or []byte (sent as is), or a value (JSON)
	hdr          []string
	raw          string // a raw HTTP/1.1 request, sent as is instead ("$HOST" is replaced)
	status       int
	// code is the error code of the envelope; "" when net/http refuses the
	// request before the handler sees it (no envelope then).
	code string
	// location is the Location of a redirect.
	location string
}

// with returns a copy of m with fields replaced.
func with(m map[string]any, kv ...any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i].(string)] = kv[i+1]
	}
	return out
}

func without(m map[string]any, keys ...string) map[string]any {
	out := with(m)
	for _, k := range keys {
		delete(out, k)
	}
	return out
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// reflected are pieces of hostile input that no answer may echo.
var reflected = []string{"passwd", "оrg", "ｗork", "\\u0000", "\\u200b", "ключ", "GVISOR_LOWER_RISK", "DESTROYED", "vм-1", "jsonx", "2026-13-01"}

// TestHostileRequests sends a table of hostile requests to the real
// binary, with a live pool lease, a ready pool cell and a ready worker cell
// in place. Each gets its status and error code, and the database (cells,
// memberships, claim fences, idempotency records) is byte-for-byte the same
// after it as before: a refused request changes nothing.
func TestHostileRequests(t *testing.T) {
	t.Parallel()
	s := newSecrets(t)
	srv := start(t, s, srvOptions{file: s.configFile()})
	srv.waitPool(2)
	id := uuid.Must(uuid.NewV7())
	lc := decode[wire.ClaimResponse](t, srv.do("POST", "/v1/sterile-cells/claim", s.acme,
		with(claimBody(s.release, &id), "lease_seconds", 300)).must(t, 200))
	if lc.Lease == nil {
		t.Fatal("no pool cell to claim")
	}
	s.addAttestation(*lc.LeaseAttestation)
	cell := srv.prepare()
	db := openDB(t, srv.dbPath)

	const claimPath = "/v1/sterile-cells/claim"
	leaseID := lc.Lease.LeaseID.String()
	leasePath := "/v1/sterile-cell-leases/" + leaseID
	w1 := "/v1/workers/" + s.workerID1.String() + "/sterile-cells"
	claim := claimBody(s.release, nil)
	relMap := map[string]any{"release_set_id": s.release.ReleaseSetID, "runtime_class": string(s.release.RuntimeClass),
		"policy_digest": s.release.PolicyDigest, "signature": s.release.Signature}
	pf := proof(lc)
	validClaimJSON := mustJSON(t, claim)
	bindingJSON := `"organization_id":"org-1","workspace_id":"workspace-1","thread_id":"thread-1","runner_session_id":"session-1"`
	relJSON := mustJSON(t, s.release)
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	prepare := map[string]any{"cell_id": uuid.NewString(), "release": s.kataRelease, "provider_cell_id": "vm-hostile", "expires_at": future}
	env65 := map[string]string{}
	for i := range 65 {
		env65[fmt.Sprint("K", i)] = "v"
	}
	manyFields := "{" + strings.Repeat(`"f":1,`, 20000) + `"g":2}`
	hugeHeader := strings.Repeat("a", 100<<10)

	cases := []hcase{
		// Sizes and framing.
		{name: "body over 1 MiB with Content-Length", method: "POST", path: claimPath, token: s.acme,
			body: `{"pad":"` + strings.Repeat("x", 2<<20) + `"}`, status: 413, code: "payload_too_large"},
		{name: "body one byte over 1 MiB", method: "POST", path: claimPath, token: s.acme,
			body: strings.Repeat(" ", 1<<20-len(validClaimJSON)+1) + validClaimJSON, status: 413, code: "payload_too_large"},
		{name: "chunked body over 1 MiB", raw: "POST " + claimPath + " HTTP/1.1\r\nHost: $HOST\r\nAuthorization: Bearer " + s.acme +
			"\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n" +
			fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", 2<<20, strings.Repeat("x", 2<<20)), status: 413, code: "payload_too_large"},
		{name: "header over 64 KiB", method: "GET", path: leasePath, token: s.acme, hdr: []string{"X-Pad", hugeHeader}, status: 431},
		{name: "thousands of headers", raw: "GET " + leasePath + " HTTP/1.1\r\nHost: $HOST\r\n" +
			strings.Repeat("X-Many: "+strings.Repeat("m", 60)+"\r\n", 2000) + "Connection: close\r\n\r\n", status: 431},
		{name: "NUL byte in a header value", raw: "GET " + leasePath + " HTTP/1.1\r\nHost: $HOST\r\nAuthorization: Bearer " + s.acme +
			"\x00\r\nConnection: close\r\n\r\n", status: 400},
		{name: "Content-Length and Transfer-Encoding (smuggling)", raw: "POST " + claimPath + " HTTP/1.1\r\nHost: $HOST\r\nAuthorization: Bearer " +
			s.acme + "\r\nContent-Type: application/json\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n" +
			"POST " + claimPath + " HTTP/1.1\r\nHost: $HOST\r\n\r\n", status: 400},
		{name: "two different Content-Lengths", raw: "POST " + claimPath + " HTTP/1.1\r\nHost: $HOST\r\nAuthorization: Bearer " + s.acme +
			"\r\nContent-Type: application/json\r\nContent-Length: 2\r\nContent-Length: 3\r\nConnection: close\r\n\r\n{}", status: 400},
		{name: "garbage request line", raw: "GARBAGE\r\n\r\n", status: 400},
		{name: "HTTP version 9.9", raw: "GET /healthz HTTP/9.9\r\nHost: $HOST\r\nConnection: close\r\n\r\n", status: 505},

		// Media type and JSON syntax.
		{name: "no Content-Type", method: "POST", path: claimPath, token: s.acme, body: claim, hdr: []string{"Content-Type", ""}, status: 415, code: "unsupported_media_type"},
		{name: "Content-Type text plain", method: "POST", path: claimPath, token: s.acme, body: claim, hdr: []string{"Content-Type", "text/plain"}, status: 415, code: "unsupported_media_type"},
		{name: "form encoded", method: "POST", path: claimPath, token: s.acme, body: "release=x",
			hdr: []string{"Content-Type", "application/x-www-form-urlencoded"}, status: 415, code: "unsupported_media_type"},
		{name: "Content-Type application jsonx", method: "POST", path: claimPath, token: s.acme, body: claim, hdr: []string{"Content-Type", "application/jsonx"}, status: 415, code: "unsupported_media_type"},
		{name: "malformed JSON", method: "POST", path: claimPath, token: s.acme, body: "{", status: 400, code: "invalid_request"},
		{name: "empty body", method: "POST", path: claimPath, token: s.acme, body: "", status: 400, code: "invalid_request"},
		{name: "array body", method: "POST", path: claimPath, token: s.acme, body: "[]", status: 422, code: "invalid_request"},
		{name: "trailing data after the object", method: "POST", path: claimPath, token: s.acme, body: validClaimJSON + " {}", status: 400, code: "invalid_request"},
		{name: "UTF-8 byte order mark", method: "POST", path: claimPath, token: s.acme, body: "\xef\xbb\xbf" + validClaimJSON, status: 400, code: "invalid_request"},
		{name: "nesting 100k deep", method: "POST", path: claimPath, token: s.acme, body: strings.Repeat("[", 100000), status: 400, code: "invalid_request"},
		{name: "raw control character in a string", method: "POST", path: claimPath, token: s.acme,
			body: strings.Replace(validClaimJSON, `"org-1"`, "\"org\x01\"", 1), status: 400, code: "invalid_request"},
		{name: "20k unknown fields, no release", method: "POST", path: claimPath, token: s.acme, body: manyFields, status: 422, code: "invalid_request"},

		// Duplicate keys: the last one counts, and decides.
		{name: "duplicate release, last not an object", method: "POST", path: claimPath, token: s.acme,
			body: `{"release":` + relJSON + `,` + bindingJSON + `,"release":"x"}`, status: 422, code: "invalid_request"},
		{name: "duplicate organization_id, last with NUL", method: "POST", path: claimPath, token: s.acme,
			body: `{"release":` + relJSON + `,` + bindingJSON + `,"organization_id":"org\u0000"}`, status: 400, code: "bad_request"},
		{name: "duplicate lease_seconds, last negative", method: "POST", path: claimPath, token: s.acme,
			body: `{"release":` + relJSON + `,` + bindingJSON + `,"lease_seconds":120,"lease_seconds":-1}`, status: 422, code: "invalid_request"},
		{name: "duplicate signature, last forged", method: "POST", path: claimPath, token: s.acme,
			body:   `{"release":` + strings.TrimSuffix(relJSON, "}") + `,"signature":"swrs1_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"},` + bindingJSON + `}`,
			status: 403, code: "authorization_denied"},

		// Wrong types and shapes.
		{name: "release is a string", method: "POST", path: claimPath, token: s.acme, body: with(claim, "release", "r"), status: 422, code: "invalid_request"},
		{name: "lease_seconds negative", method: "POST", path: claimPath, token: s.acme, body: with(claim, "lease_seconds", -1), status: 422, code: "invalid_request"},
		{name: "lease_seconds fractional", method: "POST", path: claimPath, token: s.acme, body: with(claim, "lease_seconds", 1.5), status: 422, code: "invalid_request"},
		{name: "lease_seconds a string", method: "POST", path: claimPath, token: s.acme, body: with(claim, "lease_seconds", "120"), status: 422, code: "invalid_request"},
		{name: "lease_seconds with exponent", method: "POST", path: claimPath, token: s.acme,
			body: strings.Replace(validClaimJSON, "{", `{"lease_seconds":1e2,`, 1), status: 422, code: "invalid_request"},
		{name: "lease_seconds 2^64", method: "POST", path: claimPath, token: s.acme,
			body: strings.Replace(validClaimJSON, "{", `{"lease_seconds":18446744073709551616,`, 1), status: 422, code: "invalid_request"},
		{name: "claim_id not a UUID", method: "POST", path: claimPath, token: s.acme, body: with(claim, "claim_id", "claim-1"), status: 422, code: "invalid_request"},
		{name: "claim_id the nil UUID", method: "POST", path: claimPath, token: s.acme, body: with(claim, "claim_id", uuid.Nil.String()), status: 422, code: "invalid_request"},
		{name: "runtime_class in capitals", method: "POST", path: claimPath, token: s.acme,
			body: with(claim, "release", with(relMap, "runtime_class", "GVISOR_LOWER_RISK")), status: 422, code: "invalid_request"},
		{name: "binding field missing", method: "POST", path: claimPath, token: s.acme, body: without(claim, "thread_id"), status: 422, code: "invalid_request"},
		{name: "binding field an array", method: "POST", path: claimPath, token: s.acme, body: with(claim, "workspace_id", []string{"w"}), status: 422, code: "invalid_request"},

		// Identifiers: NUL bytes, look-alikes, lengths, path characters.
		{name: "organization_id with NUL", method: "POST", path: claimPath, token: s.acme, body: with(claim, "organization_id", "org\x00-1"), status: 400, code: "bad_request"},
		{name: "organization_id with Cyrillic o", method: "POST", path: claimPath, token: s.acme, body: with(claim, "organization_id", "оrg-1"), status: 400, code: "bad_request"},
		{name: "workspace_id fullwidth", method: "POST", path: claimPath, token: s.acme, body: with(claim, "workspace_id", "ｗorkspace-1"), status: 400, code: "bad_request"},
		{name: "thread_id with zero-width space", method: "POST", path: claimPath, token: s.acme, body: with(claim, "thread_id", "thread\u200b-1"), status: 400, code: "bad_request"},
		{name: "thread_id 257 bytes", method: "POST", path: claimPath, token: s.acme, body: with(claim, "thread_id", strings.Repeat("t", 257)), status: 400, code: "bad_request"},
		{name: "runner_session_id empty", method: "POST", path: claimPath, token: s.acme, body: with(claim, "runner_session_id", ""), status: 400, code: "bad_request"},
		{name: "runner_session_id with backslash", method: "POST", path: claimPath, token: s.acme, body: with(claim, "runner_session_id", `..\..\x`), status: 400, code: "bad_request"},
		{name: "organization_id invalid UTF-8", method: "POST", path: claimPath, token: s.acme,
			body: strings.Replace(validClaimJSON, `"org-1"`, "\"org\xff\"", 1), status: 400, code: "bad_request"},
		{name: "policy_digest in capitals", method: "POST", path: claimPath, token: s.acme,
			body: with(claim, "release", with(relMap, "policy_digest", strings.ToUpper(s.policyDigest))), status: 400, code: "bad_request"},
		{name: "policy_digest 63 digits", method: "POST", path: claimPath, token: s.acme,
			body: with(claim, "release", with(relMap, "policy_digest", s.policyDigest[1:])), status: 400, code: "bad_request"},
		{name: "release_set_id with NUL", method: "POST", path: claimPath, token: s.acme,
			body: with(claim, "release", with(relMap, "release_set_id", s.relSet+"\x00")), status: 400, code: "bad_request"},
		{name: "forged signature", method: "POST", path: claimPath, token: s.acme,
			body: with(claim, "release", with(relMap, "signature", "swrs1_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")), status: 403, code: "authorization_denied"},
		{name: "signature of the other class", method: "POST", path: claimPath, token: s.acme,
			body: with(claim, "release", with(relMap, "signature", s.kataRelease.Signature)), status: 403, code: "authorization_denied"},

		// Tokens.
		{name: "no Authorization", method: "POST", path: claimPath, body: claim, status: 401, code: "unauthorized"},
		{name: "empty bearer", method: "POST", path: claimPath, body: claim, hdr: []string{"Authorization", "Bearer "}, status: 401, code: "unauthorized"},
		{name: "Basic scheme", method: "POST", path: claimPath, body: claim, hdr: []string{"Authorization", "Basic " + s.acme}, status: 401, code: "unauthorized"},
		{name: "token with a Cyrillic look-alike", method: "POST", path: claimPath, body: claim,
			hdr: []string{"Authorization", "Bearer " + strings.Replace(s.acme, "a", "а", 1)}, status: 401, code: "unauthorized"},
		{name: "token prefix", method: "POST", path: claimPath, token: s.acme[:len(s.acme)-1], body: claim, status: 401, code: "unauthorized"},
		{name: "token in capitals", method: "POST", path: claimPath, token: strings.ToUpper(s.acme), body: claim, status: 401, code: "unauthorized"},
		{name: "token and a second token", method: "POST", path: claimPath, token: s.acme + " " + s.globex, body: claim, status: 401, code: "unauthorized"},
		{name: "two Authorization headers", method: "POST", path: claimPath, body: claim,
			hdr: []string{"Authorization", "Bearer " + s.acme, "Authorization", "Bearer " + s.globex}, status: 401, code: "unauthorized"},
		{name: "worker token on claim", method: "POST", path: claimPath, token: s.worker1, body: claim, status: 401, code: "unauthorized"},
		{name: "tenant token on a worker route", method: "GET", path: w1 + "/" + cell.CellID.String(), token: s.acme, status: 401, code: "unauthorized"},
		{name: "worker on another worker's path", method: "GET", path: "/v1/workers/" + s.workerID2.String() + "/sterile-cells/" + cell.CellID.String(),
			token: s.worker1, status: 404, code: "not_found"},
		{name: "worker of another tenant on a lease", method: "POST", path: leasePath + "/validate", token: s.worker3, body: pf, status: 404, code: "not_found"},
		{name: "wrong operator token on pools", method: "GET", path: "/v1/pools", token: s.acme, hdr: []string{"x-sandboxwich-operator-token", s.operator + "x"}, status: 401, code: "unauthorized"},
		{name: "operator token as bearer", method: "GET", path: "/v1/pools", token: s.operator, status: 401, code: "unauthorized"},

		// Paths.
		{name: "lease ID not a UUID", method: "GET", path: "/v1/sterile-cell-leases/not-a-uuid", token: s.acme, status: 400, code: "invalid_request"},
		{name: "lease ID with escaped dot segments", method: "GET", path: "/v1/sterile-cell-leases/..%2F..%2Fetc%2Fpasswd", token: s.acme, status: 400, code: "invalid_request"},
		{name: "raw dot segments", raw: "GET /v1/sterile-cell-leases/../../etc/passwd HTTP/1.1\r\nHost: $HOST\r\nAuthorization: Bearer " + s.acme +
			"\r\nConnection: close\r\n\r\n", status: 404, code: "not_found"},
		{name: "dot segments back onto a lease", raw: "GET /v1/sterile-cell-leases/x/../" + leaseID + " HTTP/1.1\r\nHost: $HOST\r\nAuthorization: Bearer " + s.globex +
			"\r\nConnection: close\r\n\r\n", status: 307, location: "/v1/sterile-cell-leases/" + leaseID},
		{name: "lease ID with %00", method: "GET", path: "/v1/sterile-cell-leases/" + leaseID + "%00", token: s.acme, status: 400, code: "invalid_request"},
		{name: "lease ID with a fullwidth digit", method: "GET", path: "/v1/sterile-cell-leases/" + url.PathEscape(leaseID[:35]+"７"), token: s.acme, status: 400, code: "invalid_request"},
		{name: "lease ID 8 KiB long", method: "GET", path: "/v1/sterile-cell-leases/" + strings.Repeat("a", 8<<10), token: s.acme, status: 400, code: "invalid_request"},
		{name: "another tenant's lease", method: "GET", path: leasePath, token: s.globex, status: 404, code: "not_found"},
		{name: "another tenant's lease as urn:uuid", method: "GET", path: "/v1/sterile-cell-leases/urn:uuid:" + strings.ToUpper(leaseID), token: s.globex, status: 404, code: "not_found"},
		{name: "shared token's tenant on an acme lease", method: "GET", path: leasePath, token: s.shared, status: 404, code: "not_found"},
		{name: "trailing slash", method: "GET", path: leasePath + "/", token: s.acme, status: 404, code: "not_found"},
		{name: "double slash", raw: "POST /v1//sterile-cells/claim HTTP/1.1\r\nHost: $HOST\r\nAuthorization: Bearer " + s.acme +
			"\r\nContent-Type: application/json\r\nContent-Length: " + fmt.Sprint(len(validClaimJSON)) + "\r\nConnection: close\r\n\r\n" + validClaimJSON,
			status: 307, location: "/v1/sterile-cells/claim"},
		{name: "unknown route", method: "GET", path: "/v1/admin", token: s.acme, status: 404, code: "not_found"},
		{name: "DELETE a lease", method: "DELETE", path: leasePath, token: s.acme, status: 405, code: "method_not_allowed"},
		{name: "PUT a claim", method: "PUT", path: claimPath, token: s.acme, body: claim, status: 405, code: "method_not_allowed"},
		{name: "worker ID not a UUID", method: "GET", path: "/v1/workers/w1/sterile-cells/" + cell.CellID.String(), token: s.worker1, status: 400, code: "invalid_request"},

		// The lease fence: refused, nothing changes.
		{name: "validate with a forged attestation", method: "POST", path: leasePath + "/validate", token: s.acme,
			body: with(pf, "lease_attestation", "swla1_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"), status: 409, code: "conflict"},
		{name: "validate with the attestation and a NUL", method: "POST", path: leasePath + "/validate", token: s.acme,
			body: with(pf, "lease_attestation", *lc.LeaseAttestation+"\x00"), status: 409, code: "conflict"},
		{name: "validate with generation -1", method: "POST", path: leasePath + "/validate", token: s.acme, body: with(pf, "generation", -1), status: 422, code: "invalid_request"},
		{name: "validate with generation a string", method: "POST", path: leasePath + "/validate", token: s.acme, body: with(pf, "generation", "2"), status: 422, code: "invalid_request"},
		{name: "release with disposition in capitals", method: "POST", path: leasePath + "/release", token: s.acme, body: with(pf, "disposition", "DESTROYED"), status: 422, code: "invalid_request"},
		{name: "release with disposition ready", method: "POST", path: leasePath + "/release", token: s.acme, body: with(pf, "disposition", "ready"), status: 422, code: "invalid_request"},
		{name: "release with a forged attestation", method: "POST", path: leasePath + "/release", token: s.acme,
			body: with(pf, "disposition", "destroyed", "lease_attestation", "swla1_x"), status: 409, code: "conflict"},
		{name: "release with another organization", method: "POST", path: leasePath + "/release", token: s.acme,
			body: with(pf, "disposition", "destroyed", "organization_id", "org-2"), status: 409, code: "conflict"},
		{name: "release by another tenant", method: "POST", path: leasePath + "/release", token: s.globex, body: with(pf, "disposition", "destroyed"), status: 404, code: "not_found"},
		{name: "exec with empty argv", method: "POST", path: leasePath + "/exec", token: s.acme, body: with(pf, "argv", []string{}), status: 422, code: "invalid_request"},
		{name: "exec with a null argument", method: "POST", path: leasePath + "/exec", token: s.acme, body: with(pf, "argv", []any{nil}), status: 422, code: "invalid_request"},
		{name: "exec with stdin not base64", method: "POST", path: leasePath + "/exec", token: s.acme,
			body: with(pf, "argv", []string{"true"}, "stdin_base64", "%%%"), status: 422, code: "invalid_request"},
		{name: "exec with 65 env entries", method: "POST", path: leasePath + "/exec", token: s.acme, body: with(pf, "argv", []string{"true"}, "env", env65), status: 422, code: "invalid_request"},
		{name: "exec with negative timeout", method: "POST", path: leasePath + "/exec", token: s.acme, body: with(pf, "argv", []string{"true"}, "timeout_seconds", -1), status: 422, code: "invalid_request"},
		{name: "exec with a forged attestation", method: "POST", path: leasePath + "/exec", token: s.acme,
			body: with(pf, "argv", []string{"true"}, "lease_attestation", "swla1_x"), status: 409, code: "conflict"},

		// Worker routes.
		{name: "prepare with cell_id not a UUID", method: "POST", path: w1 + "/prepare", token: s.worker1, body: with(prepare, "cell_id", "cell-1"), status: 422, code: "invalid_request"},
		{name: "prepare with month 13", method: "POST", path: w1 + "/prepare", token: s.worker1, body: with(prepare, "expires_at", "2026-13-01T00:00:00Z"), status: 422, code: "invalid_request"},
		{name: "prepare with a numeric expiry", method: "POST", path: w1 + "/prepare", token: s.worker1, body: with(prepare, "expires_at", 1786104000), status: 422, code: "invalid_request"},
		{name: "prepare expired", method: "POST", path: w1 + "/prepare", token: s.worker1, body: with(prepare, "expires_at", "2020-01-01T00:00:00Z"), status: 400, code: "bad_request"},
		{name: "prepare with NUL in provider_cell_id", method: "POST", path: w1 + "/prepare", token: s.worker1, body: with(prepare, "provider_cell_id", "vm\x00"), status: 400, code: "bad_request"},
		{name: "prepare with a look-alike provider_cell_id", method: "POST", path: w1 + "/prepare", token: s.worker1, body: with(prepare, "provider_cell_id", "vм-1"), status: 400, code: "bad_request"},
		{name: "prepare reusing a cell_id", method: "POST", path: w1 + "/prepare", token: s.worker1, body: with(prepare, "cell_id", cell.CellID.String()), status: 409, code: "conflict"},
		{name: "prepare reusing a pool cell's ID", method: "POST", path: w1 + "/prepare", token: s.worker1, body: with(prepare, "cell_id", lc.Lease.CellID.String()), status: 409, code: "conflict"},
		{name: "prepare a class the worker may not", method: "POST", path: "/v1/workers/" + s.workerID2.String() + "/sterile-cells/prepare", token: s.worker2,
			body: prepare, status: 403, code: "authorization_denied"},
		{name: "retire with generation -1", method: "POST", path: w1 + "/" + cell.CellID.String() + "/retire", token: s.worker1, body: map[string]any{"generation": -1}, status: 422, code: "invalid_request"},
		{name: "retire with generation 2", method: "POST", path: w1 + "/" + cell.CellID.String() + "/retire", token: s.worker1, body: map[string]any{"generation": 2}, status: 409, code: "conflict"},
		{name: "retire an unknown cell", method: "POST", path: w1 + "/" + uuid.NewString() + "/retire", token: s.worker1, body: map[string]any{"generation": 1}, status: 404, code: "not_found"},
		{name: "destroy with lease_id not a UUID", method: "POST", path: w1 + "/" + cell.CellID.String() + "/destroy", token: s.worker1,
			body: map[string]any{"lease_id": "l", "generation": 2, "disposition": "destroyed"}, status: 422, code: "invalid_request"},
		{name: "destroy with a bad disposition", method: "POST", path: w1 + "/" + cell.CellID.String() + "/destroy", token: s.worker1,
			body: map[string]any{"lease_id": leaseID, "generation": 2, "disposition": "gone"}, status: 422, code: "invalid_request"},
		{name: "destroy a pool cell", method: "POST", path: w1 + "/" + lc.Lease.CellID.String() + "/destroy", token: s.worker1,
			body: map[string]any{"lease_id": leaseID, "generation": 2, "disposition": "destroyed"}, status: 404, code: "not_found"},

		// Headers.
		{name: "Idempotency-Key of 129 characters", method: "POST", path: leasePath + "/release", token: s.acme,
			body: with(pf, "disposition", "ready"), hdr: []string{"Idempotency-Key", strings.Repeat("k", 129)}, status: 400, code: "invalid_idempotency_key"},
		{name: "Idempotency-Key not ASCII", method: "POST", path: leasePath + "/release", token: s.acme,
			body: with(pf, "disposition", "ready"), hdr: []string{"Idempotency-Key", "ключ"}, status: 400, code: "invalid_idempotency_key"},
		{name: "Idempotency-Key with a tab", method: "POST", path: leasePath + "/release", token: s.acme,
			body: with(pf, "disposition", "ready"), hdr: []string{"Idempotency-Key", "a\tb"}, status: 400, code: "invalid_idempotency_key"},
		{name: "tenant header cannot change the tenant", method: "GET", path: leasePath, token: s.globex,
			hdr: []string{"X-Tenant", "acme", "X-Sandboxwich-Tenant", "acme"}, status: 404, code: "not_found"},
	}

	if len(cases) < 50 {
		t.Fatalf("only %d hostile cases", len(cases))
	}
	hostRepl := strings.NewReplacer("$HOST", srv.addr)
	for _, tc := range cases {
		before := snapshot(t, db)
		var r resp
		if tc.raw != "" {
			r = srv.raw(hostRepl.Replace(tc.raw))
		} else {
			r = srv.do(tc.method, tc.path, tc.token, tc.body, tc.hdr...)
		}
		t.Run(tc.name, func(t *testing.T) {
			if r.status != tc.status {
				t.Fatalf("status %d, want %d; body %.300s", r.status, tc.status, r.body)
			}
			if tc.location != "" && r.header.Get("Location") != tc.location {
				t.Errorf("Location %q, want %q", r.header.Get("Location"), tc.location)
			}
			if tc.code != "" {
				if code := r.envelope(t); code != tc.code {
					t.Fatalf("code %s, want %s; body %s", code, tc.code, r.body)
				}
				if r.header.Get("x-request-id") == "" {
					t.Error("no x-request-id")
				}
			}
			for _, tok := range s.tokens() {
				if strings.Contains(string(r.body), tok) {
					t.Errorf("the answer holds a token: %s", r.body)
				}
			}
			// Error messages never reflect what the client sent.
			for _, marker := range reflected {
				if strings.Contains(string(r.body), marker) {
					t.Errorf("the answer reflects %q: %.300s", marker, r.body)
				}
			}
			if after := snapshot(t, db); after != before {
				t.Fatalf("the request changed the state:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}

	// Metrics are labelled by route pattern, never by the raw path, so
	// hostile paths cannot blow up their cardinality or smuggle text.
	m := srv.do("GET", "/metrics", s.acme, nil).must(t, 200)
	for _, marker := range append(reflected, "not-a-uuid", "/v1/admin", "sterile-cell-leases/"+leaseID) {
		if strings.Contains(string(m.body), marker) {
			t.Errorf("/metrics holds %q", marker)
		}
	}

	// The server is unharmed: the lease still validates. And the snapshot
	// does see a change: a valid claim of the worker's cell.
	srv.do("POST", leasePath+"/validate", s.acme, pf).must(t, 200)
	before := snapshot(t, db)
	srv.claim(s.acme, s.kataRelease)
	if snapshot(t, db) == before {
		t.Fatal("the state snapshot does not see a claim")
	}
	t.Logf("%d hostile requests", len(cases))
}

// TestHostileSlowHeadersCutOff is a slowloris against the real binary: a
// client that sends its request headers one byte a second never gets to the
// handler; the server closes the connection at its ReadHeaderTimeout (10 s
// in serve.go) and keeps serving others meanwhile.
func TestHostileSlowHeadersCutOff(t *testing.T) {
	t.Parallel()
	s := newSecrets(t)
	srv := start(t, s, srvOptions{file: s.configFile()})
	conn, err := net.DialTimeout("tcp", srv.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	begin := time.Now()
	closed := make(chan time.Duration, 1)
	var got strings.Builder
	go func() {
		_, _ = io.Copy(&got, conn) // returns when the server closes
		closed <- time.Since(begin)
	}()
	req := "GET /healthz HTTP/1.1\r\nHost: " + srv.addr + "\r\nX-Slow: " + strings.Repeat("s", 100)
	var cut time.Duration
	ticker := time.NewTicker(time.Second)
	defer ticker.Stop()
sending:
	for i := 0; ; i++ {
		select {
		case cut = <-closed:
			break sending
		case <-ticker.C:
		}
		// A hang guard, not a measurement: 5× the 10 s header timeout,
		// and below serve.go's 60 s ReadTimeout, which would close the
		// connection if ReadHeaderTimeout were not set.
		if time.Since(begin) > 50*time.Second {
			t.Fatal("the server kept a slow-header connection open for 50 s")
		}
		_, _ = conn.Write([]byte{req[i%len(req)]})
		if i == 3 {
			// Meanwhile the server answers everyone else.
			srv.do("GET", "/healthz", "", nil).must(t, 200)
		}
	}
	// net/http may say 400 before it closes; the handler (which sets
	// x-request-id on every answer) never ran.
	if a := got.String(); a != "" && (!strings.HasPrefix(a, "HTTP/1.1 4") || strings.Contains(strings.ToLower(a), "x-request-id")) {
		t.Fatalf("the slow client got an answer from the handler: %q", a)
	}
	// Only the lower bound is timed (a loaded machine is slower, never
	// faster): the close came from the 10 s timeout, not before it.
	if cut < 9*time.Second {
		t.Fatalf("slow-header connection closed after %v, before the 10 s ReadHeaderTimeout", cut)
	}
	srv.do("GET", "/healthz", "", nil).must(t, 200)
	t.Logf("slow-header connection closed after %v", cut.Round(100*time.Millisecond))
}

// TestHostileServerTimeoutsConfigured reads cmd/sandboxwich/serve.go and
// checks that the http.Server it builds sets every protection against slow
// and oversize clients: ReadHeaderTimeout, ReadTimeout, WriteTimeout,
// IdleTimeout and MaxHeaderBytes. (The read and idle timeouts are a minute
// and more there; TestHostileSlowClients proves their effect on a server
// configured the same way with shorter values.)
func TestHostileServerTimeoutsConfigured(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, filepath.Join("..", "..", "cmd", "sandboxwich", "serve.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	ast.Inspect(f, func(n ast.Node) bool {
		lit, ok := n.(*ast.CompositeLit)
		if !ok {
			return true
		}
		sel, ok := lit.Type.(*ast.SelectorExpr)
		if !ok || sel.Sel.Name != "Server" {
			return true
		}
		if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "http" {
			return true
		}
		found++
		set := map[string]ast.Expr{}
		for _, e := range lit.Elts {
			if kv, ok := e.(*ast.KeyValueExpr); ok {
				if k, ok := kv.Key.(*ast.Ident); ok {
					set[k.Name] = kv.Value
				}
			}
		}
		for _, field := range []string{"ReadHeaderTimeout", "ReadTimeout", "WriteTimeout", "IdleTimeout", "MaxHeaderBytes"} {
			v, ok := set[field]
			if !ok {
				t.Errorf("%s: the http.Server does not set %s", fset.Position(lit.Pos()), field)
				continue
			}
			if b, ok := v.(*ast.BasicLit); ok && b.Value == "0" {
				t.Errorf("%s: %s is 0", fset.Position(lit.Pos()), field)
			}
		}
		return true
	})
	if found == 0 {
		t.Fatal("serve.go builds no http.Server")
	}
}
