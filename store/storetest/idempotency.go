package storetest

import (
	"bytes"
	"time"

	"github.com/sandboxwich/sandboxwich/store"
)

var idempotencyScenarios = []scenario{
	{"Idempotency/BeginFinish", testIdemBeginFinish},
	{"Idempotency/Drop", testIdemDrop},
	{"Idempotency/Expired", testIdemExpired},
	{"Idempotency/TenantScope", testIdemTenants},
	{"Concurrency/Idempotency", testConcurrentIdempotency},
	{"ExpireUnmanaged/IdempotencyRecords", testExpireIdempotency},
}

func (e *env) begin(tenant, key, fp string, now time.Time) store.IdempotencyRecord {
	e.t.Helper()
	rec, err := e.s.BeginIdempotent(e.ctx, store.IdempotencyParams{TenantID: tenant, Key: key, Fingerprint: fp,
		Now: now, InFlightUntil: now.Add(30 * time.Second)})
	e.wantOK(err, "BeginIdempotent")
	return rec
}

func (e *env) finish(tenant, key string, status int, body string, expires time.Time) {
	e.t.Helper()
	e.wantOK(e.s.FinishIdempotent(e.ctx, store.IdempotencyResult{TenantID: tenant, Key: key, Status: status,
		Body: []byte(body), ExpiresAt: expires}), "FinishIdempotent")
}

func (e *env) wantIdem(got store.IdempotencyRecord, want store.IdempotencyRecord, what string) {
	e.t.Helper()
	if got.Fingerprint != want.Fingerprint || got.Created != want.Created || got.Done != want.Done ||
		got.Status != want.Status || !bytes.Equal(got.Body, want.Body) {
		e.t.Errorf("%s: BeginIdempotent = %+v (body %q), want %+v (body %q)", what, got, got.Body, want, want.Body)
	}
}

func testIdemBeginFinish(e *env) {
	e.wantIdem(e.begin(tenantA, "key-1", "fp-1", e.now), store.IdempotencyRecord{Fingerprint: "fp-1", Created: true}, "first Begin")
	e.advance(time.Second)
	// In flight: the stored fingerprint comes back, whatever this one is.
	e.wantIdem(e.begin(tenantA, "key-1", "fp-2", e.now), store.IdempotencyRecord{Fingerprint: "fp-1"}, "Begin while in flight")
	e.wantIdem(e.begin(tenantA, "key-1", "fp-1", e.now), store.IdempotencyRecord{Fingerprint: "fp-1"}, "same Begin while in flight")

	body := `{"ok":false,"code":"conflict","message":"…"}`
	e.finish(tenantA, "key-1", 409, body, e.now.Add(24*time.Hour))
	done := store.IdempotencyRecord{Fingerprint: "fp-1", Done: true, Status: 409, Body: []byte(body)}
	e.advance(time.Minute) // past the in-flight deadline: a stored response lives on
	e.wantIdem(e.begin(tenantA, "key-1", "fp-1", e.now), done, "Begin after Finish")
	e.wantIdem(e.begin(tenantA, "key-1", "fp-9", e.now), done, "Begin with another fingerprint after Finish")
	e.now = base.Add(24*time.Hour - time.Microsecond)
	e.wantIdem(e.begin(tenantA, "key-1", "fp-1", e.now), done, "Begin just before the record expires")
}

func testIdemDrop(e *env) {
	e.begin(tenantA, "key-1", "fp-1", e.now)
	e.wantOK(e.s.DropIdempotent(e.ctx, tenantA, "key-1"), "DropIdempotent")
	e.wantIdem(e.begin(tenantA, "key-1", "fp-2", e.now), store.IdempotencyRecord{Fingerprint: "fp-2", Created: true}, "Begin after Drop")

	// A stored response is not dropped.
	e.finish(tenantA, "key-1", 404, `{"ok":false}`, e.now.Add(time.Hour))
	e.wantOK(e.s.DropIdempotent(e.ctx, tenantA, "key-1"), "DropIdempotent of a done record")
	e.wantIdem(e.begin(tenantA, "key-1", "fp-3", e.now),
		store.IdempotencyRecord{Fingerprint: "fp-2", Done: true, Status: 404, Body: []byte(`{"ok":false}`)}, "Begin after dropping a done record")
	// Dropping an unknown key is fine.
	e.wantOK(e.s.DropIdempotent(e.ctx, tenantA, "unknown"), "DropIdempotent of an unknown key")
}

func testIdemExpired(e *env) {
	// An in-flight entry expires at InFlightUntil.
	e.begin(tenantA, "key-1", "fp-1", e.now)
	e.wantIdem(e.begin(tenantA, "key-1", "fp-2", e.now.Add(30*time.Second-time.Microsecond)),
		store.IdempotencyRecord{Fingerprint: "fp-1"}, "Begin just before the in-flight deadline")
	e.advance(30 * time.Second)
	e.wantIdem(e.begin(tenantA, "key-1", "fp-2", e.now), store.IdempotencyRecord{Fingerprint: "fp-2", Created: true}, "Begin at the in-flight deadline")
	// The new entry is in flight in its turn, then done, then expires.
	e.wantIdem(e.begin(tenantA, "key-1", "fp-3", e.now), store.IdempotencyRecord{Fingerprint: "fp-2"}, "Begin of the new entry")
	e.finish(tenantA, "key-1", 400, `{"ok":false}`, e.now.Add(time.Hour))
	e.advance(time.Hour)
	e.wantIdem(e.begin(tenantA, "key-1", "fp-3", e.now), store.IdempotencyRecord{Fingerprint: "fp-3", Created: true}, "Begin after the record expired")
	e.wantIdem(e.begin(tenantA, "key-1", "fp-4", e.now), store.IdempotencyRecord{Fingerprint: "fp-3"}, "Begin of the replacing entry")
}

func testIdemTenants(e *env) {
	e.begin(tenantA, "key-1", "fp-a", e.now)
	e.wantIdem(e.begin(tenantB, "key-1", "fp-b", e.now), store.IdempotencyRecord{Fingerprint: "fp-b", Created: true}, "Begin of another tenant")
	e.finish(tenantB, "key-1", 409, `{"b":1}`, e.now.Add(time.Hour))
	e.wantIdem(e.begin(tenantA, "key-1", "fp-x", e.now), store.IdempotencyRecord{Fingerprint: "fp-a"}, "tenant A still in flight")
	e.wantOK(e.s.DropIdempotent(e.ctx, tenantA, "key-1"), "DropIdempotent")
	e.wantIdem(e.begin(tenantB, "key-1", "fp-y", e.now),
		store.IdempotencyRecord{Fingerprint: "fp-b", Done: true, Status: 409, Body: []byte(`{"b":1}`)}, "tenant B unaffected")
	// Finish of another tenant's key does nothing to this one.
	e.begin(tenantA, "key-2", "fp-a2", e.now)
	e.finish(tenantB, "key-2", 500, `{}`, e.now.Add(time.Hour))
	e.wantIdem(e.begin(tenantA, "key-2", "fp-a3", e.now), store.IdempotencyRecord{Fingerprint: "fp-a2"}, "tenant A after tenant B's Finish")
}
