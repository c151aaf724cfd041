package client

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/wire"
)

const testAttestation = "swla1_F0qwlTXnAMyLdjGH0WMymO7DtQAhiAqPu5fMH7SXwSk"

// recorded is one request a fake server received.
type recorded struct {
	Method, Path string
	Header       http.Header
	Body         []byte
}

// fakeServer answers each request with the next step (the last one repeats)
// and records every request.
type fakeServer struct {
	t     *testing.T
	mu    sync.Mutex
	reqs  []recorded
	steps []func(w http.ResponseWriter, r *http.Request, body []byte)
	srv   *httptest.Server
}

func newFake(t *testing.T, steps ...func(w http.ResponseWriter, r *http.Request, body []byte)) *fakeServer {
	t.Helper()
	f := &fakeServer{t: t, steps: steps}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("read request body: %v", err)
		}
		f.mu.Lock()
		n := len(f.reqs)
		f.reqs = append(f.reqs, recorded{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Body: body})
		step := f.steps[min(n, len(f.steps)-1)]
		f.mu.Unlock()
		step(w, r, body)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeServer) requests() []recorded {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]recorded(nil), f.reqs...)
}

// client returns a client of the fake server with fast retries.
func (f *fakeServer) client(opts ...Option) *Client {
	f.t.Helper()
	opts = append([]Option{WithToken("tok"), WithRetry(6, time.Millisecond, 4*time.Millisecond)}, opts...)
	c, err := New(f.srv.URL, opts...)
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Request-Id", "req-1")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func fail(status int, code errcode.Code, retryAfter string) func(http.ResponseWriter, *http.Request, []byte) {
	return func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		writeJSON(w, status, wire.ErrorResponse{Code: string(code), Message: "simulated " + string(code)})
	}
}

// drop hijacks the connection and closes it without an answer: the request
// was processed, the response is lost.
func drop(w http.ResponseWriter, _ *http.Request, _ []byte) {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err != nil {
		panic(err)
	}
	_ = conn.Close()
}

// fencedClaims is a tiny claim fence: the first claim of a claim_id leases
// a new cell; every later one returns the same answer byte for byte.
type fencedClaims struct {
	mu      sync.Mutex
	answers map[uuid.UUID][]byte
	leased  int
}

func (fc *fencedClaims) answer(t *testing.T, body []byte) []byte {
	var req wire.ClaimRequest
	if err := json.Unmarshal(body, &req); err != nil || req.ClaimID == nil {
		t.Errorf("claim body %s: claim_id missing or invalid (%v)", body, err)
		return nil
	}
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if a, ok := fc.answers[*req.ClaimID]; ok {
		return a
	}
	fc.leased++
	l := testLease()
	l.Release, l.Binding = req.Release, req.Binding
	att := testAttestation
	a, _ := json.Marshal(wire.ClaimResponse{OK: true, Lease: &l, LeaseAttestation: &att})
	fc.answers[*req.ClaimID] = a
	return a
}

// process answers a claim from the fence.
func (fc *fencedClaims) process(t *testing.T) func(http.ResponseWriter, *http.Request, []byte) {
	return func(w http.ResponseWriter, _ *http.Request, body []byte) {
		a := fc.answer(t, body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(a)
	}
}

// processThenDrop records the claim in the fence and loses the answer.
func (fc *fencedClaims) processThenDrop(t *testing.T) func(http.ResponseWriter, *http.Request, []byte) {
	return func(w http.ResponseWriter, r *http.Request, body []byte) {
		fc.answer(t, body)
		drop(w, r, body)
	}
}

func testLease() wire.Lease {
	return wire.Lease{
		LeaseID:    uuid.MustParse("01890a5d-ac96-774b-bcce-b302099a8057"),
		CellID:     uuid.MustParse("01890a5d-ac96-774b-bcce-b302099a8058"),
		Generation: 2,
		ExpiresAt:  wire.Time{Time: time.Date(2026, 8, 7, 12, 0, 0, 123456789, time.UTC)},
	}
}

func testClaimRequest() wire.ClaimRequest {
	return wire.ClaimRequest{
		Release: wire.Release{ReleaseSetID: "release-set-2026-08-07", RuntimeClass: lease.KataMicroVM,
			PolicyDigest: strings.Repeat("a", 64), Signature: "swrs1_e9tjahDQxqFMnsShzD-gJ815SbqsCNKrHlBA96hCM_0"},
		Binding: wire.Binding{OrganizationID: "org-1", WorkspaceID: "workspace-1", ThreadID: "thread-1", RunnerSessionID: "session-1"},
	}
}

// checkSameClaim asserts that every recorded claim carried byte-identical
// bodies with one valid UUIDv7 claim_id, and returns that ID.
func checkSameClaim(t *testing.T, reqs []recorded) uuid.UUID {
	t.Helper()
	if len(reqs) == 0 {
		t.Fatal("no requests")
	}
	for i, r := range reqs {
		if r.Method != http.MethodPost || r.Path != "/v1/sterile-cells/claim" {
			t.Errorf("request %d: %s %s", i, r.Method, r.Path)
		}
		if !bytes.Equal(r.Body, reqs[0].Body) {
			t.Errorf("request %d body differs:\n%s\nfirst:\n%s", i, r.Body, reqs[0].Body)
		}
	}
	var req wire.ClaimRequest
	if err := json.Unmarshal(reqs[0].Body, &req); err != nil || req.ClaimID == nil {
		t.Fatalf("claim body %s: %v", reqs[0].Body, err)
	}
	return *req.ClaimID
}

func TestClaimRetriesLostResponseWithSameClaim(t *testing.T) {
	fc := &fencedClaims{answers: map[uuid.UUID][]byte{}}
	f := newFake(t, fc.processThenDrop(t), fc.processThenDrop(t), fc.process(t))
	c := f.client()
	got, err := c.Claim(context.Background(), testClaimRequest())
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	reqs := f.requests()
	if len(reqs) != 3 {
		t.Fatalf("%d requests, want 3", len(reqs))
	}
	id := checkSameClaim(t, reqs)
	if got.ClaimID != id {
		t.Errorf("Claim.ClaimID = %s, sent %s", got.ClaimID, id)
	}
	if fc.leased != 1 {
		t.Errorf("server leased %d cells, want 1", fc.leased)
	}
	if got.Lease == nil || got.Lease.LeaseID != testLease().LeaseID || got.Attestation() != testAttestation {
		t.Errorf("Claim = %v (attestation ok: %v)", got, got.Attestation() == testAttestation)
	}
	if p := got.Proof(); p.LeaseAttestation != testAttestation || p.Generation != 2 || p.Binding != testClaimRequest().Binding {
		t.Errorf("Proof = %+v", p.Binding)
	}
}

func TestClaimRetriesUnavailableAndContended(t *testing.T) {
	for _, tc := range []struct {
		name  string
		first func(http.ResponseWriter, *http.Request, []byte)
	}{
		{"500", fail(500, errcode.Internal, "")},
		{"502 not ours", func(w http.ResponseWriter, _ *http.Request, _ []byte) {
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusBadGateway)
			_, _ = io.WriteString(w, "<html>bad gateway</html>")
		}},
		{"503", fail(503, errcode.Internal, "")},
		{"504", fail(504, errcode.Internal, "")},
		{"429", fail(429, "too_many_requests", "")},
		{"contended", fail(409, errcode.ClaimContended, "")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fc := &fencedClaims{answers: map[uuid.UUID][]byte{}}
			f := newFake(t, tc.first, tc.first, fc.process(t))
			got, err := f.client().Claim(context.Background(), testClaimRequest())
			if err != nil {
				t.Fatalf("Claim: %v", err)
			}
			reqs := f.requests()
			if len(reqs) != 3 {
				t.Fatalf("%d requests, want 3", len(reqs))
			}
			if id := checkSameClaim(t, reqs); got.ClaimID != id || got.Empty() {
				t.Errorf("Claim = %v, sent claim_id %s", got, id)
			}
		})
	}
}

func TestClaimDoesNotRetryRefusals(t *testing.T) {
	for _, tc := range []struct {
		status int
		code   errcode.Code
		is     error
	}{
		{400, errcode.BadRequest, errcode.ErrBadRequest},
		{401, errcode.Unauthorized, errcode.ErrUnauthorized},
		{403, errcode.AuthorizationDenied, errcode.ErrAuthorizationDenied},
		{409, errcode.Conflict, errcode.ErrConflict},
		{422, errcode.InvalidRequest, errcode.ErrInvalidRequest},
		{500, errcode.AuthNotConfigured, errcode.ErrAuthNotConfigured},
		{501, errcode.ExecUnsupported, errcode.ErrExecUnsupported},
	} {
		t.Run(fmt.Sprint(tc.status, tc.code), func(t *testing.T) {
			f := newFake(t, fail(tc.status, tc.code, ""))
			got, err := f.client().Claim(context.Background(), testClaimRequest())
			if n := len(f.requests()); n != 1 {
				t.Errorf("%d requests, want 1", n)
			}
			if !errors.Is(err, tc.is) {
				t.Errorf("errors.Is(%v, %v) = false", err, tc.is)
			}
			if errors.Is(err, errcode.ErrNotFound) {
				t.Errorf("%v matches ErrNotFound", err)
			}
			e, ok := errors.AsType[*Error](err)
			if !ok || e.Status != tc.status || e.Code != tc.code || e.RequestID != "req-1" || e.Message != "simulated "+string(tc.code) {
				t.Errorf("error = %#v", err)
			}
			if errcode.CodeOf(err) != tc.code {
				t.Errorf("CodeOf = %s", errcode.CodeOf(err))
			}
			if got.ClaimID == uuid.Nil || !got.Empty() {
				t.Errorf("Claim on error = %v, want the claim ID and no lease", got)
			}
		})
	}
}

func TestClaimGivesUpAfterMaxAttempts(t *testing.T) {
	f := newFake(t, fail(503, errcode.Internal, ""))
	_, err := f.client(WithRetry(3, time.Millisecond, time.Millisecond)).Claim(context.Background(), testClaimRequest())
	if n := len(f.requests()); n != 3 {
		t.Errorf("%d requests, want 3", n)
	}
	if !errors.Is(err, errcode.ErrInternal) || !strings.Contains(err.Error(), "after 3 attempts") {
		t.Errorf("err = %v", err)
	}
	checkSameClaim(t, f.requests())
}

func TestClaimTransportErrorGivesUp(t *testing.T) {
	f := newFake(t, drop)
	got, err := f.client(WithRetry(2, time.Millisecond, time.Millisecond)).Claim(context.Background(), testClaimRequest())
	if n := len(f.requests()); n != 2 {
		t.Errorf("%d requests, want 2", n)
	}
	if err == nil || got.ClaimID != checkSameClaim(t, f.requests()) {
		t.Errorf("Claim = %v, %v; want an error and the claim ID sent", got, err)
	}
	if !transient(err) {
		t.Errorf("transient(%v) = false", err)
	}
}

func TestClaimContextCancelStopsRetries(t *testing.T) {
	f := newFake(t, fail(503, errcode.Internal, ""))
	// Count the requests the client starts, at its transport: the server
	// may record a request sent before Claim returned only after it did.
	var started atomic.Int64
	hc := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		started.Add(1)
		return http.DefaultTransport.RoundTrip(r)
	})}
	c := f.client(WithRetry(1000, 5*time.Millisecond, 10*time.Millisecond), WithHTTPClient(hc))
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	// The mechanism, not a duration a loaded machine stretches: Claim ends
	// with its context's error, and its retries stop (no request starts
	// after it returned, far fewer than the 1000 allowed).
	_, err := c.Claim(ctx, testClaimRequest())
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the context's error", err)
	}
	n := started.Load()
	time.Sleep(50 * time.Millisecond)
	if m := started.Load(); n == 0 || m != n || n > 100 {
		t.Errorf("requests started: %d, then %d after return", n, m)
	}

	// A context already done sends nothing.
	done, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if _, err := c.Claim(done, testClaimRequest()); !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v", err)
	}
	if m := started.Load(); m != n {
		t.Errorf("a done context started %d requests", m-n)
	}
}

// roundTripFunc is an http.RoundTripper made of a function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestClaimCancelDuringBackoffReportsLastError(t *testing.T) {
	f := newFake(t, fail(503, errcode.Internal, ""))
	c := f.client()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c.sleep = func(ctx context.Context, _ time.Duration) error {
		cancel()
		<-ctx.Done()
		return ctx.Err()
	}
	_, err := c.Claim(ctx, testClaimRequest())
	if !errors.Is(err, context.Canceled) || !errors.Is(err, errcode.ErrInternal) {
		t.Errorf("err = %v, want the context's error and the last attempt's", err)
	}
	if n := len(f.requests()); n != 1 {
		t.Errorf("%d requests, want 1", n)
	}
}

func TestClaimCancelDuringRequest(t *testing.T) {
	release := make(chan struct{})
	f := newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	_, err := f.client().Claim(ctx, testClaimRequest())
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v", err)
	}
	if n := len(f.requests()); n != 1 {
		t.Errorf("%d requests, want 1", n)
	}
}

func TestClaimHonoursRetryAfter(t *testing.T) {
	fc := &fencedClaims{answers: map[uuid.UUID][]byte{}}
	f := newFake(t, fail(503, errcode.Internal, "1"), fc.process(t))
	start := time.Now()
	if _, err := f.client().Claim(context.Background(), testClaimRequest()); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 900*time.Millisecond {
		t.Errorf("retried after %v, want Retry-After: 1 honoured", d)
	}

	// The wait is exactly the server's, whatever the backoff says.
	fc = &fencedClaims{answers: map[uuid.UUID][]byte{}}
	f = newFake(t, fail(409, errcode.ClaimContended, "3"), fail(503, errcode.Internal, "Thu, 01 Jan 1970 00:00:00 GMT"), fc.process(t))
	c := f.client()
	var waits []time.Duration
	c.sleep = func(_ context.Context, d time.Duration) error { waits = append(waits, d); return nil }
	if _, err := c.Claim(context.Background(), testClaimRequest()); err != nil {
		t.Fatal(err)
	}
	if len(waits) != 2 || waits[0] != 3*time.Second || waits[1] > 4*time.Millisecond {
		t.Errorf("waits = %v, want [3s, backoff]", waits)
	}
	checkSameClaim(t, f.requests())
}

func TestRetryAfterParse(t *testing.T) {
	now := time.Date(2026, 8, 7, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]int{
		"":                              0,
		"0":                             0,
		"2":                             2,
		" 7 ":                           7,
		"-1":                            0,
		"86400":                         60,
		"soon":                          0,
		"Fri, 07 Aug 2026 12:00:05 GMT": 5,
		"Fri, 07 Aug 2026 11:00:00 GMT": 0,
		"Sat, 08 Aug 2026 12:00:00 GMT": 60,
	} {
		if got := retryAfter(in, now); got != want {
			t.Errorf("retryAfter(%q) = %d, want %d", in, got, want)
		}
	}
}

func TestBackoffIsBoundedFullJitter(t *testing.T) {
	c, err := New("http://x", WithRetry(10, 50*time.Millisecond, 2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for n := 1; n < 12; n++ {
		ceiling := min(50*time.Millisecond<<(n-1), 2*time.Second)
		seen := map[time.Duration]bool{}
		for range 200 {
			d := c.backoff(n)
			if d < 0 || d > ceiling {
				t.Fatalf("backoff(%d) = %v, ceiling %v", n, d, ceiling)
			}
			seen[d] = true
		}
		if len(seen) < 10 {
			t.Errorf("backoff(%d) is not jittered: %d distinct values", n, len(seen))
		}
	}
}

func TestClaimGeneratesUUIDv7AndKeepsCallers(t *testing.T) {
	fc := &fencedClaims{answers: map[uuid.UUID][]byte{}}
	f := newFake(t, fc.process(t))
	c := f.client()
	got, err := c.Claim(context.Background(), testClaimRequest())
	if err != nil {
		t.Fatal(err)
	}
	id := checkSameClaim(t, f.requests())
	if id.Version() != 7 || id.Variant() != uuid.RFC4122 || got.ClaimID != id {
		t.Errorf("generated claim_id %s: version %d, variant %v", id, id.Version(), id.Variant())
	}
	if s := string(f.requests()[0].Body); !strings.Contains(s, `"claim_id":"`+id.String()+`"`) {
		t.Errorf("body %s does not carry the lowercase hyphenated claim_id", s)
	}

	// Two claims get two IDs.
	got2, err := c.Claim(context.Background(), testClaimRequest())
	if err != nil || got2.ClaimID == got.ClaimID {
		t.Errorf("second claim: %v, %v", got2, err)
	}

	// A caller's claim ID is sent as is.
	mine := uuid.MustParse("01890a5d-ac96-774b-bcce-b302099a8000")
	req := testClaimRequest()
	req.ClaimID = &mine
	got3, err := c.Claim(context.Background(), req)
	if err != nil || got3.ClaimID != mine {
		t.Errorf("caller's claim: %v, %v", got3, err)
	}
	if *req.ClaimID != mine {
		t.Error("Claim changed the caller's request")
	}
	// A replay of the caller's claim returns the same lease.
	got4, err := c.Claim(context.Background(), req)
	if err != nil || got4.Lease.LeaseID != got3.Lease.LeaseID {
		t.Errorf("replayed claim: %v, %v", got4, err)
	}
}

func TestClaimIDSourceError(t *testing.T) {
	f := newFake(t, fail(500, errcode.Internal, ""))
	c := f.client(WithClaimIDs(func() (uuid.UUID, error) { return uuid.Nil, errors.New("no entropy") }))
	if _, err := c.Claim(context.Background(), testClaimRequest()); err == nil || len(f.requests()) != 0 {
		t.Errorf("err = %v, %d requests", err, len(f.requests()))
	}
}

func TestEmptyClaim(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		writeJSON(w, 200, wire.ClaimResponse{OK: true})
	})
	got, err := f.client().Claim(context.Background(), testClaimRequest())
	if err != nil || !got.Empty() || got.Attestation() != "" || got.ClaimID == uuid.Nil {
		t.Errorf("Claim = %v, %v", got, err)
	}
	if p := got.Proof(); p != (wire.LeaseProof{}) {
		t.Errorf("Proof of an empty claim = %+v", p.Binding)
	}
}

func TestClaimLeaseWithoutAttestationIsAnError(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		l := testLease()
		writeJSON(w, 200, wire.ClaimResponse{OK: true, Lease: &l})
	})
	if _, err := f.client().Claim(context.Background(), testClaimRequest()); err == nil {
		t.Error("no error")
	}
}

func TestClaimNeverShowsTheAttestation(t *testing.T) {
	fc := &fencedClaims{answers: map[uuid.UUID][]byte{}}
	f := newFake(t, fc.process(t))
	got, err := f.client().Claim(context.Background(), testClaimRequest())
	if err != nil || got.Attestation() != testAttestation {
		t.Fatal(got, err)
	}
	var out strings.Builder
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%T %[1]v"} {
		fmt.Fprintf(&out, verb+"\n", got)
		fmt.Fprintf(&out, verb+"\n", &got)
		fmt.Fprintf(&out, verb+"\n", []Claim{got})
		fmt.Fprintf(&out, verb+"\n", struct{ C Claim }{got})
	}
	fmt.Fprintln(&out, got.String())
	js, _ := json.Marshal(got)
	out.Write(js)
	slog.New(slog.NewJSONHandler(&out, nil)).Info("claimed", "claim", got)
	slog.New(slog.NewTextHandler(&out, nil)).Info("claimed", "claim", got)
	if strings.Contains(out.String(), testAttestation) || strings.Contains(out.String(), "F0qwlTXnAMyLdj") {
		t.Errorf("attestation leaked:\n%s", out.String())
	}
	if !strings.Contains(out.String(), got.Lease.LeaseID.String()) {
		t.Errorf("output does not describe the claim:\n%s", out.String())
	}
}

func TestErrorsDoNotQuoteRequests(t *testing.T) {
	proof := wire.LeaseProof{LeaseAttestation: testAttestation, Generation: 2}
	f := newFake(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		w.WriteHeader(http.StatusBadGateway)
		_, _ = io.WriteString(w, "upstream said: "+testAttestation)
	})
	c := f.client(WithRetry(1, 0, 0), WithOperatorToken("op-secret"))
	var errs []error
	_, err := c.Validate(context.Background(), testLease().LeaseID, proof)
	errs = append(errs, err)
	_, err = c.Release(context.Background(), testLease().LeaseID, proof, lease.Destroyed)
	errs = append(errs, err)
	_, err = c.Run(context.Background(), testLease().LeaseID, proof, Command{Argv: []string{"true"}})
	errs = append(errs, err)
	f.srv.Close() // transport errors too
	_, err = c.Validate(context.Background(), testLease().LeaseID, proof)
	errs = append(errs, err)
	for _, err := range errs {
		if err == nil {
			t.Fatal("no error")
		}
		s := fmt.Sprintf("%v %+v %#v", err, err, err)
		for _, secret := range []string{testAttestation, "op-secret", "Bearer"} {
			if strings.Contains(s, secret) {
				t.Errorf("error %q contains %q", s, secret)
			}
		}
	}
	if e, ok := errors.AsType[*Error](errs[0]); !ok || e.Code != errcode.Internal || e.Status != 502 {
		t.Errorf("err = %#v", errs[0])
	}
	if s := fmt.Sprintf("%v %#v", c, c); strings.Contains(s, "tok") || strings.Contains(s, "op-secret") {
		t.Errorf("client prints its tokens: %s", s)
	}
}

func TestHeaders(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/prefix/v1/pools":
			writeJSON(w, 200, wire.PoolsResponse{OK: true, Pools: []wire.Pool{{Name: "default"}}})
		default:
			writeJSON(w, 200, wire.ValidateResponse{OK: true, Lease: testLease()})
		}
	})
	c, err := New(f.srv.URL+"/prefix/", WithToken("tok"), WithOperatorToken("op"))
	if err != nil {
		t.Fatal(err)
	}
	pools, err := c.Pools(context.Background())
	if err != nil || len(pools) != 1 || pools[0].Name != "default" {
		t.Fatalf("Pools = %v, %v", pools, err)
	}
	if _, err := c.Validate(context.Background(), testLease().LeaseID, wire.LeaseProof{LeaseAttestation: testAttestation}); err != nil {
		t.Fatal(err)
	}
	reqs := f.requests()
	for i, r := range reqs {
		h := r.Header
		if h.Get("Accept") != "application/json" || h.Get("Authorization") != "Bearer tok" ||
			h.Get("X-Sandboxwich-Operator-Token") != "op" || !strings.HasPrefix(h.Get("User-Agent"), "sandboxwich-go/") {
			t.Errorf("request %d headers: %v", i, h)
		}
	}
	if ct := reqs[0].Header.Get("Content-Type"); ct != "" || len(reqs[0].Body) != 0 {
		t.Errorf("GET carries a body: %q %q", ct, reqs[0].Body)
	}
	if ct := reqs[1].Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("POST Content-Type = %q", ct)
	}
	if reqs[1].Path != "/prefix/v1/sterile-cell-leases/01890a5d-ac96-774b-bcce-b302099a8057/validate" {
		t.Errorf("path = %s", reqs[1].Path)
	}
	var body map[string]any
	if err := json.Unmarshal(reqs[1].Body, &body); err != nil || body["lease_attestation"] != testAttestation || body["generation"] != 0.0 {
		t.Errorf("validate body = %s", reqs[1].Body)
	}
}

func TestMutatingCallsAreSentOnce(t *testing.T) {
	id := testLease().LeaseID
	proof := wire.LeaseProof{LeaseAttestation: testAttestation, Generation: 2}
	calls := map[string]func(c *Client) error{
		"release": func(c *Client) error {
			_, err := c.Release(context.Background(), id, proof, lease.Destroyed)
			return err
		},
		"exec": func(c *Client) error {
			_, err := c.Exec(context.Background(), id, wire.ExecRequest{LeaseProof: proof, Argv: []string{"true"}})
			return err
		},
		"prepare": func(c *Client) error {
			_, err := c.Prepare(context.Background(), id, wire.PrepareRequest{CellID: id})
			return err
		},
		"retire": func(c *Client) error { _, err := c.Retire(context.Background(), id, id, 1); return err },
		"destroy": func(c *Client) error {
			_, err := c.Destroy(context.Background(), id, id, wire.DestroyRequest{})
			return err
		},
	}
	for name, call := range calls {
		for _, step := range []func(http.ResponseWriter, *http.Request, []byte){fail(503, errcode.Internal, "0"), drop} {
			f := newFake(t, step, fail(200, "", ""))
			if err := call(f.client()); err == nil {
				t.Errorf("%s: no error", name)
			}
			if n := len(f.requests()); n != 1 {
				t.Errorf("%s: %d requests, want 1", name, n)
			}
		}
	}
}

func TestReadsRetry(t *testing.T) {
	st := wire.LeaseStatus{LeaseID: testLease().LeaseID, State: lease.Leased, Generation: 2}
	f := newFake(t, drop, fail(503, errcode.Internal, ""), func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		writeJSON(w, 200, wire.StatusResponse{OK: true, Status: st})
	})
	got, err := f.client().Lease(context.Background(), st.LeaseID)
	if err != nil || got != st {
		t.Errorf("Lease = %+v, %v", got, err)
	}
	reqs := f.requests()
	if len(reqs) != 3 || reqs[2].Method != http.MethodGet || reqs[2].Path != "/v1/sterile-cell-leases/"+st.LeaseID.String() {
		t.Errorf("requests = %v", reqs)
	}

	f = newFake(t, fail(404, errcode.NotFound, ""))
	if _, err := f.client().WorkerCell(context.Background(), st.LeaseID, st.CellID); !errors.Is(err, errcode.ErrNotFound) || len(f.requests()) != 1 {
		t.Errorf("WorkerCell: %v after %d requests", err, len(f.requests()))
	}
}

func TestWaitProviderAbsent(t *testing.T) {
	id := testLease().LeaseID
	status := func(absent bool) func(http.ResponseWriter, *http.Request, []byte) {
		return func(w http.ResponseWriter, _ *http.Request, _ []byte) {
			d := lease.Destroyed
			st := wire.LeaseStatus{LeaseID: id, State: lease.Leased, Generation: 2}
			if absent {
				st.State, st.Disposition, st.ProviderAbsent = lease.Destroyed, &d, true
			}
			writeJSON(w, 200, wire.StatusResponse{OK: true, Status: st})
		}
	}
	f := newFake(t, status(false), fail(503, errcode.Internal, ""), status(false), status(true))
	st, err := f.client(WithRetry(1, 0, 0)).WaitProviderAbsent(context.Background(), id, time.Millisecond)
	if err != nil || !st.ProviderAbsent || st.State != lease.Destroyed {
		t.Errorf("WaitProviderAbsent = %+v, %v", st, err)
	}
	if n := len(f.requests()); n != 4 {
		t.Errorf("%d requests, want 4", n)
	}

	// The context bounds the wait; the last status comes back.
	f = newFake(t, status(false))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	st, err = f.client().WaitProviderAbsent(ctx, id, 5*time.Millisecond)
	if !errors.Is(err, context.DeadlineExceeded) || st.LeaseID != id || st.ProviderAbsent {
		t.Errorf("WaitProviderAbsent = %+v, %v", st, err)
	}

	// A refusal ends the wait.
	f = newFake(t, status(false), fail(404, errcode.NotFound, ""))
	st, err = f.client().WaitProviderAbsent(context.Background(), id, time.Millisecond)
	if !errors.Is(err, errcode.ErrNotFound) || st.LeaseID != id {
		t.Errorf("WaitProviderAbsent = %+v, %v", st, err)
	}
}

func TestRunDecodes(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		sig := "KILL"
		writeJSON(w, 200, wire.ExecResponse{
			ExecExit:     wire.ExecExit{OK: true, ExitCode: 137, Truncated: true, DurationMS: 1500, TimedOut: true, Signal: &sig, Reason: wire.ReasonTimedOut},
			StdoutBase64: base64.StdEncoding.EncodeToString([]byte("out\x00")), StderrBase64: base64.StdEncoding.EncodeToString([]byte("err"))})
	})
	res, err := f.client().Run(context.Background(), testLease().LeaseID, wire.LeaseProof{LeaseAttestation: testAttestation, Generation: 2},
		Command{Argv: []string{"sh", "-c", "cat"}, Stdin: []byte("in"), Env: map[string]string{"A": "b"}, Timeout: 1500 * time.Millisecond,
			Cwd: "/tmp", User: wire.UserRoot, IdempotencyKey: "run-1"})
	if err != nil {
		t.Fatal(err)
	}
	want := ExecResult{ExitCode: 137, Stdout: []byte("out\x00"), Stderr: []byte("err"), Truncated: true, TimedOut: true,
		Signal: "KILL", Reason: wire.ReasonTimedOut, Duration: 1500 * time.Millisecond}
	if !reflect.DeepEqual(res, want) {
		t.Errorf("Run = %+v, want %+v", res, want)
	}
	var req wire.ExecRequest
	if err := json.Unmarshal(f.requests()[0].Body, &req); err != nil {
		t.Fatal(err)
	}
	if req.StdinBase64 != "aW4=" || req.TimeoutSeconds == nil || *req.TimeoutSeconds != 2 || req.Env["A"] != "b" ||
		len(req.Argv) != 3 || req.LeaseAttestation != testAttestation || req.Cwd != "/tmp" || req.User != "root" {
		t.Errorf("exec request = %s", f.requests()[0].Body)
	}
	if k := f.requests()[0].Header.Get(IdempotencyKeyHeader); k != "run-1" {
		t.Errorf("Idempotency-Key %q", k)
	}
	if _, err := DecodeExec(wire.ExecResponse{StdoutBase64: "!!"}); err == nil {
		t.Error("DecodeExec accepted bad base64")
	}
}

func TestResponseTooLarge(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ok":true,"pools":[],"pad":"`)
		_, _ = w.Write(bytes.Repeat([]byte("x"), MaxResponseBytes))
		_, _ = io.WriteString(w, `"}`)
	})
	if _, err := f.client().Pools(context.Background()); err == nil || !strings.Contains(err.Error(), "larger than") || len(f.requests()) != 1 {
		t.Errorf("err = %v after %d requests", err, len(f.requests()))
	}
}

func TestNewValidates(t *testing.T) {
	for _, tc := range []struct {
		url  string
		opts []Option
	}{
		{"", nil},
		{"127.0.0.1:3217", nil},
		{"ftp://host", nil},
		{"http://", nil},
		{"http://u:p@host", nil},
		{"http://host?x=1", nil},
		{"http://host", []Option{WithRetry(0, 0, 0)}},
		{"http://host", []Option{WithRetry(3, time.Second, time.Millisecond)}},
		{"http://host", []Option{WithHTTPClient(nil)}},
		{"http://host", []Option{WithClaimIDs(nil)}},
		{"http://host", []Option{WithToken("a\nb")}},
	} {
		if _, err := New(tc.url, tc.opts...); err == nil {
			t.Errorf("New(%q) accepted", tc.url)
		}
	}
	if _, err := New("https://sandboxwich.example:443/base/", WithHTTPClient(&http.Client{})); err != nil {
		t.Error(err)
	}
}

func TestRedirectsStayOnTheServer(t *testing.T) {
	var elsewhere []recorded
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere = append(elsewhere, recorded{Header: r.Header.Clone()})
		writeJSON(w, 200, wire.StatusResponse{OK: true})
	}))
	defer other.Close()
	st := wire.LeaseStatus{LeaseID: testLease().LeaseID}
	f := newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		switch r.URL.Path {
		case "/v1/sterile-cell-leases/" + st.LeaseID.String():
			http.Redirect(w, r, "/moved", http.StatusTemporaryRedirect)
		case "/moved":
			writeJSON(w, 200, wire.StatusResponse{OK: true, Status: st})
		default:
			http.Redirect(w, r, other.URL+"/stolen", http.StatusFound)
		}
	})
	c := f.client(WithOperatorToken("op-secret"))
	if got, err := c.Lease(context.Background(), st.LeaseID); err != nil || got != st {
		t.Errorf("same-host redirect: %+v, %v", got, err)
	}
	_, err := c.Pools(context.Background())
	if e, ok := errors.AsType[*Error](err); !ok || e.Status != http.StatusFound {
		t.Errorf("cross-host redirect: %v", err)
	}
	if len(elsewhere) != 0 {
		t.Errorf("the client followed a redirect to another server with headers %v", elsewhere[0].Header)
	}
}
