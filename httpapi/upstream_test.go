package httpapi

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/wire"
)

// The routes and fields the Rust implementation serves and this project
// serves as it does (CONTRACT §12).

// TestHealthCheckedAt: /healthz and /readyz (both paths, up or not ready)
// carry checked_at, an RFC 3339 UTC timestamp of the check.
func TestHealthCheckedAt(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		check := func(e *env, path string, status int) {
			t.Helper()
			before := time.Now().Add(-time.Second)
			r := e.do("GET", path, "", nil).must(t, status)
			checkSchema(t, "Health", r.body)
			var body struct {
				CheckedAt *string `json:"checked_at"`
			}
			if err := json.Unmarshal(r.body, &body); err != nil || body.CheckedAt == nil {
				t.Fatalf("%s: no checked_at in %s (%v)", path, r.body, err)
			}
			at, err := time.Parse(time.RFC3339Nano, *body.CheckedAt)
			if err != nil || at.Location() != time.UTC || (*body.CheckedAt)[len(*body.CheckedAt)-1] != 'Z' {
				t.Fatalf("%s: checked_at %q is not RFC 3339 UTC (%v)", path, *body.CheckedAt, err)
			}
			if at.Before(before) || at.After(time.Now().Add(time.Second)) {
				t.Errorf("%s: checked_at %s is not the time of the check", path, at)
			}
		}
		e := newEnv(t, b)
		for _, p := range []string{"/healthz", "/v1/healthz", "/readyz", "/v1/readyz"} {
			check(e, p, 200)
		}
		// Fail closed (no authentication configured): /readyz answers 503,
		// still with checked_at.
		closed := newEnv(t, b, func(c *Config) { c.Auth = Auth{} })
		check(closed, "/healthz", 200)
		check(closed, "/readyz", 503)
	})
}

// TestWorkerPoolRelease: the Rust implementation's worker pool-release
// route. A configured worker never owns a pool cell, so after the cell
// lookup (404) and the state check (409) it answers as the Rust
// implementation does for a cell without membership: 404. Nothing changes.
func TestWorkerPoolRelease(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b)
		releasePath := func(cell uuid.UUID) string { return workerPath(worker1, "/"+cell.String()+"/release") }
		body := func(leaseID uuid.UUID, gen uint64, d string) map[string]any {
			return map[string]any{"lease_id": leaseID, "generation": gen, "disposition": d}
		}
		lookup := func(cell uuid.UUID) wire.WorkerCellResponse {
			t.Helper()
			return decodeAs[wire.WorkerCellResponse](t, e.do("GET", workerPath(worker1, "/"+cell.String()), tokWorker1, nil).must(t, 200))
		}

		// An unknown cell: 404.
		e.do("POST", releasePath(uuid.New()), tokWorker1, body(uuid.New(), 2, "destroyed")).errCode(t, 404, "not_found")

		// Another worker's cell (same tenant), a pool cell: 404.
		other := e.prepare(worker2, tokWorker2, lease.GVisorLowerRisk)
		e.do("POST", releasePath(other.CellID), tokWorker1, body(uuid.New(), 1, "destroyed")).errCode(t, 404, "not_found")
		pc := e.poolCell("acme", lease.GVisorLowerRisk)
		e.do("POST", releasePath(pc), tokWorker1, body(uuid.New(), 1, "destroyed")).errCode(t, 404, "not_found")
		// The token's worker must be the path's.
		e.do("POST", workerPath(worker2, "/"+other.CellID.String()+"/release"), tokWorker1, body(uuid.New(), 1, "destroyed")).errCode(t, 404, "not_found")

		// A ready cell of the worker: 409, unchanged.
		ready := e.prepare(worker1, tokWorker1, lease.KataMicroVM)
		r := e.do("POST", releasePath(ready.CellID), tokWorker1, body(uuid.New(), 1, "destroyed"))
		r.errCode(t, 409, "conflict")
		if msg := decodeAs[wire.ErrorResponse](t, r).Message; msg != "only a live leased pool cell can be released" {
			t.Errorf("409 message %q", msg)
		}
		if got := lookup(ready.CellID); got.Cell.State != lease.Ready || got.Cell.Generation != 1 {
			t.Errorf("release of a ready cell changed it: %+v", got.Cell)
		}

		// A leased cell of the worker: it has no pool membership → 404,
		// with the live lease's fence and with a wrong one; unchanged.
		c := e.claim(tokAcme, nil, lease.KataMicroVM)
		if c.Lease == nil || c.Lease.CellID != ready.CellID {
			t.Fatalf("claim did not lease the worker's cell: %+v", c.Lease)
		}
		for _, d := range []string{"destroyed", "quarantined"} {
			e.do("POST", releasePath(ready.CellID), tokWorker1, body(c.Lease.LeaseID, 2, d)).errCode(t, 404, "not_found")
		}
		e.do("POST", releasePath(ready.CellID), tokWorker1, body(uuid.New(), 7, "destroyed")).errCode(t, 404, "not_found")
		if got := lookup(ready.CellID); got.Cell.State != lease.Leased || got.Cell.Generation != 2 || got.Cell.Disposition != nil {
			t.Errorf("release of a leased cell without membership changed it: %+v", got.Cell)
		}
		// Also at the unversioned alias.
		e.do("POST", "/workers/"+worker1.ID.String()+"/sterile-cells/"+ready.CellID.String()+"/release", tokWorker1,
			body(c.Lease.LeaseID, 2, "destroyed")).errCode(t, 404, "not_found")
		// The lease is still live for its tenant.
		e.do("POST", leasePath(c.Lease.LeaseID, "/validate"), tokAcme, proofBody(c)).must(t, 200)

		// A terminal cell of the worker: 409.
		e.do("POST", workerPath(worker1, "/"+ready.CellID.String()+"/destroy"), tokWorker1, body(c.Lease.LeaseID, 2, "destroyed")).must(t, 200)
		e.do("POST", releasePath(ready.CellID), tokWorker1, body(c.Lease.LeaseID, 2, "destroyed")).errCode(t, 409, "conflict")

		// Bad input, as on the other worker routes: nothing changes.
		leased := e.prepare(worker1, tokWorker1, lease.GVisorLowerRisk)
		for _, tc := range []struct {
			name   string
			path   string
			body   any
			hdr    []string
			status int
			code   string
		}{
			{"bad path UUID", workerPath(worker1, "/not-a-uuid/release"), body(uuid.New(), 2, "destroyed"), nil, 400, "invalid_request"},
			{"malformed JSON", releasePath(leased.CellID), `{"lease_id":`, nil, 400, "invalid_request"},
			{"bad disposition", releasePath(leased.CellID), body(uuid.New(), 2, "deleted"), nil, 422, "invalid_request"},
			{"bad lease_id", releasePath(leased.CellID), map[string]any{"lease_id": "x", "generation": 2, "disposition": "destroyed"}, nil, 422, "invalid_request"},
			{"negative generation", releasePath(leased.CellID), map[string]any{"lease_id": uuid.New(), "generation": -1, "disposition": "destroyed"}, nil, 422, "invalid_request"},
			{"missing disposition", releasePath(leased.CellID), map[string]any{"lease_id": uuid.New(), "generation": 2}, nil, 422, "invalid_request"},
			{"not JSON", releasePath(leased.CellID), `{}`, []string{"Content-Type", "text/plain"}, 415, "unsupported_media_type"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				e.t = t
				e.do("POST", tc.path, tokWorker1, tc.body, tc.hdr...).errCode(t, tc.status, tc.code)
			})
		}
		e.t = t
		if got := lookup(leased.CellID); got.Cell.State != lease.Ready {
			t.Errorf("bad input changed the cell: %+v", got.Cell)
		}
		// Tenants and operators may not use the route.
		e.do("POST", releasePath(leased.CellID), tokAcme, body(uuid.New(), 2, "destroyed")).errCode(t, 401, "unauthorized")
	})
}
