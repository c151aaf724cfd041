package httpapi

import (
	"bytes"
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
	"github.com/sandboxwich/sandboxwich/wire"
)

const idemHeader = IdempotencyKeyHeader

// TestIdempotencyClaimNeverStored: a claim under an Idempotency-Key
// re-executes, whether it leased a cell or came back empty.
func TestIdempotencyClaimNeverStored(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b)
		e.prepare(worker1, tokWorker1, lease.KataMicroVM)
		e.prepare(worker1, tokWorker1, lease.KataMicroVM)
		body := e.claimBody(nil, lease.KataMicroVM)
		r1 := e.do("POST", "/v1/sterile-cells/claim", tokAcme, body, idemHeader, "claim-key").must(t, 200)
		r2 := e.do("POST", "/v1/sterile-cells/claim", tokAcme, body, idemHeader, "claim-key").must(t, 200)
		c1, c2 := decodeAs[wire.ClaimResponse](t, r1), decodeAs[wire.ClaimResponse](t, r2)
		if c1.Lease == nil || c2.Lease == nil || c1.Lease.CellID == c2.Lease.CellID {
			t.Fatalf("unfenced claims under one key were not both executed:\n%s\n%s", r1.body, r2.body)
		}
		// Empty, then inventory arrives: the same key claims it.
		if c := decodeAs[wire.ClaimResponse](t, e.do("POST", "/v1/sterile-cells/claim", tokAcme, body, idemHeader, "empty-key").must(t, 200)); c.Lease != nil {
			t.Fatal("expected an empty claim")
		}
		e.prepare(worker1, tokWorker1, lease.KataMicroVM)
		if c := decodeAs[wire.ClaimResponse](t, e.do("POST", "/v1/sterile-cells/claim", tokAcme, body, idemHeader, "empty-key").must(t, 200)); c.Lease == nil {
			t.Fatal("an empty claim response was replayed")
		}
		// Claim errors are stored and replayed.
		bad := with(body, "organization_id", "bad org")
		r1 = e.do("POST", "/v1/sterile-cells/claim", tokAcme, bad, idemHeader, "bad-key")
		r1.errCode(t, 400, "bad_request")
		r2 = e.do("POST", "/v1/sterile-cells/claim", tokAcme, bad, idemHeader, "bad-key")
		if r2.status != r1.status || !bytes.Equal(r1.body, r2.body) {
			t.Errorf("error replay: %d %s", r2.status, r2.body)
		}
		e.do("POST", "/v1/sterile-cells/claim", tokAcme, body, idemHeader, "bad-key").errCode(t, 409, "idempotency_key_reused")
	})
}

// TestIdempotencyReplay: completed responses are replayed (errors too),
// also through the unversioned alias; a different request under the key is
// reused; keys are per tenant.
func TestIdempotencyReplay(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b)
		// Release of a pool cell: replayed after the stop completed.
		cellID := e.poolCell("acme", lease.GVisorLowerRisk)
		c := e.claim(tokAcme, nil, lease.GVisorLowerRisk)
		rel := with(proofBody(c), "disposition", "destroyed")
		path := leasePath(c.Lease.LeaseID, "/release")
		r1 := e.do("POST", path, tokAcme, rel, idemHeader, "release-1").must(t, 202)
		_, err := e.st.CompleteStop(context.Background(), store.StopOutcome{CellID: cellID, StopLeaseID: c.Lease.LeaseID,
			StopGeneration: 2, Disposition: lease.Destroyed, Proven: true, Now: e.plane.Now()})
		if err != nil {
			t.Fatal(err)
		}
		e.do("POST", path, tokAcme, rel).errCode(t, 409, "conflict") // re-executed: no longer live
		r2 := e.do("POST", path, tokAcme, rel, idemHeader, "  release-1 ").must(t, 202)
		if !bytes.Equal(r1.body, r2.body) {
			t.Errorf("release replay:\n%s\n%s", r1.body, r2.body)
		}
		r3 := e.do("POST", "/sterile-cell-leases/"+c.Lease.LeaseID.String()+"/release", tokAcme, rel, idemHeader, "release-1").must(t, 202)
		if !bytes.Equal(r1.body, r3.body) {
			t.Errorf("alias replay:\n%s\n%s", r1.body, r3.body)
		}
		e.do("POST", path, tokAcme, with(rel, "disposition", "quarantined"), idemHeader, "release-1").errCode(t, 409, "idempotency_key_reused")
		e.do("POST", path, tokAcme, rel, idemHeader, "release-1", "Content-Type", "application/json; charset=utf-8").errCode(t, 409, "idempotency_key_reused")
		e.do("POST", path+"?x=1", tokAcme, rel, idemHeader, "release-1").errCode(t, 409, "idempotency_key_reused")

		// Error responses are replayed: exec on a worker's cell is 404
		// until the cell ends, then 409 — but the key replays the 404.
		e.prepare(worker1, tokWorker1, lease.KataMicroVM)
		w := e.claim(tokAcme, nil, lease.KataMicroVM)
		exec := with(proofBody(w), "argv", []string{"true"})
		execPath := leasePath(w.Lease.LeaseID, "/exec")
		first := e.do("POST", execPath, tokAcme, exec, idemHeader, "exec-1")
		first.errCode(t, 404, "not_found")
		e.do("POST", workerPath(worker1, "/"+w.Lease.CellID.String()+"/destroy"), tokWorker1,
			map[string]any{"lease_id": w.Lease.LeaseID, "generation": 2, "disposition": "destroyed"}).must(t, 200)
		e.do("POST", execPath, tokAcme, exec).errCode(t, 409, "conflict")
		again := e.do("POST", execPath, tokAcme, exec, idemHeader, "exec-1")
		if again.status != 404 || !bytes.Equal(again.body, first.body) {
			t.Errorf("error replay: %d %s", again.status, again.body)
		}
		// Keys are scoped per tenant: globex's exec-1 is a new request.
		e.do("POST", execPath, tokGlobex, exec, idemHeader, "exec-1").errCode(t, 404, "not_found")
		e.do("POST", execPath, tokGlobex, with(exec, "argv", []string{"false"}), idemHeader, "exec-1").errCode(t, 409, "idempotency_key_reused")
	})
}

// TestIdempotencyKeys: key validation, in-flight records, and principals
// that are not affected.
func TestIdempotencyKeys(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b)
		body := e.claimBody(nil, lease.KataMicroVM)
		e.do("POST", "/v1/sterile-cells/claim", tokAcme, body, idemHeader, strings.Repeat("k", 129)).errCode(t, 400, "invalid_idempotency_key")
		e.do("POST", "/v1/sterile-cells/claim", tokAcme, body, idemHeader, "ключ").errCode(t, 400, "invalid_idempotency_key")
		e.do("POST", "/v1/sterile-cells/claim", tokAcme, body, idemHeader, strings.Repeat("k", 128)).must(t, 200)
		e.do("POST", "/v1/sterile-cells/claim", tokAcme, body, idemHeader, "   ").must(t, 200)
		// Operators are not affected, not even by an invalid key.
		e.do("POST", "/v1/sterile-cells/claim", tokAcme, body, idemHeader, strings.Repeat("k", 200), wire.OperatorHeader, tokOperator).must(t, 200)
		// Routes without idempotency ignore the header.
		e.do("GET", "/v1/pools", tokAcme, nil, idemHeader, strings.Repeat("k", 200), wire.OperatorHeader, tokOperator).must(t, 200)

		// A request still in flight: 409 with Retry-After.
		raw := mustJSON(t, body)
		req := httptest.NewRequest("POST", "/sterile-cells/claim", bytes.NewReader(raw))
		req.Header.Set("Content-Type", "application/json")
		now := time.Now()
		rec, err := e.st.(store.IdempotencyStore).BeginIdempotent(context.Background(), store.IdempotencyParams{TenantID: "acme", Key: "busy",
			Fingerprint: fingerprint(req, raw), Now: now, InFlightUntil: now.Add(time.Minute)})
		if err != nil || !rec.Created {
			t.Fatalf("begin: %+v %v", rec, err)
		}
		r := e.do("POST", "/v1/sterile-cells/claim", tokAcme, raw, idemHeader, "busy")
		r.errCode(t, 409, "idempotency_in_progress")
		if r.header.Get("Retry-After") != "1" {
			t.Errorf("Retry-After %q", r.header.Get("Retry-After"))
		}
		e.do("POST", "/v1/sterile-cells/claim", tokAcme, with(body, "thread_id", "t2"), idemHeader, "busy").errCode(t, 409, "idempotency_key_reused")
	})
}

// TestIdempotencyInFlightExpiry: an in-flight record frees its key after
// two minutes (a crashed request does not hold it forever).
func TestIdempotencyInFlightExpiry(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		clock := time.Now()
		e := newEnvWith(t, b, []sandboxwich.Option{sandboxwich.WithClock(func() time.Time { return clock })})
		raw := mustJSON(t, e.claimBody(nil, lease.KataMicroVM))
		req := httptest.NewRequest("POST", "/v1/sterile-cells/claim", bytes.NewReader(raw))
		req.Header.Set("Content-Type", "application/json")
		_, err := e.st.(store.IdempotencyStore).BeginIdempotent(context.Background(), store.IdempotencyParams{TenantID: "acme", Key: "crashed",
			Fingerprint: fingerprint(req, raw), Now: clock, InFlightUntil: clock.Add(idempotencyInFlight)})
		if err != nil {
			t.Fatal(err)
		}
		e.do("POST", "/v1/sterile-cells/claim", tokAcme, raw, idemHeader, "crashed").errCode(t, 409, "idempotency_in_progress")
		clock = clock.Add(idempotencyInFlight + time.Second)
		e.do("POST", "/v1/sterile-cells/claim", tokAcme, raw, idemHeader, "crashed").must(t, 200)
	})
}

// TestStorable: what may be stored for replay.
func TestStorable(t *testing.T) {
	claim, release := &routes[0], &routes[2]
	if claim.idem != idemErrorsOnly || release.idem != idemReplay {
		t.Fatal("route table order changed")
	}
	for _, tc := range []struct {
		rt   *route
		rep  reply
		want bool
	}{
		{claim, reply{status: 200, body: []byte(`{"ok":true,"lease":null,"lease_attestation":null}`)}, false},
		{claim, reply{status: 200, body: []byte(`{"ok":true,"lease_attestation":"swla1_x"}`)}, false},
		{claim, reply{status: 409, body: []byte(`{"ok":false}`)}, true},
		{claim, reply{status: 429, body: []byte(`{"ok":false}`)}, false},
		{release, reply{status: 202, body: []byte(`{"ok":true}`)}, true},
		{release, reply{status: 404, body: []byte(`{"ok":false}`)}, true},
		{release, reply{status: 500, body: []byte(`{"ok":false}`)}, false},
		{release, reply{status: 503, body: []byte(`{"ok":false}`)}, false},
		{release, reply{status: 429, body: []byte(`{"ok":false}`)}, false},
		{release, reply{status: 200, body: []byte(`{"x":"swla1_abc"}`)}, false},
	} {
		if got := storable(tc.rt, tc.rep); got != tc.want {
			t.Errorf("storable(%s, %d %s) = %v", tc.rt.path, tc.rep.status, tc.rep.body, got)
		}
	}
}

// TestFingerprint: the /v1 prefix does not matter; every other part does.
func TestFingerprint(t *testing.T) {
	mk := func(method, target, ct string, body string) string {
		r := httptest.NewRequest(method, target, strings.NewReader(body))
		if ct != "" {
			r.Header.Set("Content-Type", ct)
		}
		return fingerprint(r, []byte(body))
	}
	base := mk("POST", "/v1/a/b", "application/json", "{}")
	if mk("POST", "/a/b", "application/json", "{}") != base {
		t.Error("the /v1 prefix changed the fingerprint")
	}
	for _, other := range []string{
		mk("PUT", "/v1/a/b", "application/json", "{}"),
		mk("POST", "/v1/a/c", "application/json", "{}"),
		mk("POST", "/v1/a/b?q=1", "application/json", "{}"),
		mk("POST", "/v1/a/b", "application/json; charset=utf-8", "{}"),
		mk("POST", "/v1/a/b", "application/json", "{ }"),
		mk("POST", "/v1/a/bapplication/json", "", "{}"), // parts are length-prefixed
	} {
		if other == base {
			t.Error("a different request has the same fingerprint")
		}
	}
}
