package sandboxwich

import (
	"context"
	"time"

	"github.com/sandboxwich/sandboxwich/store"
)

// The records of idempotent HTTP requests (CONTRACT §15), kept in the
// plane's own store: what the HTTP API's Idempotency-Key needs, in the
// Plane's words.

// IdempotencyParams begins an idempotent request.
type IdempotencyParams struct {
	TenantID      string
	Key           string
	Fingerprint   string
	Now           time.Time
	InFlightUntil time.Time
}

// IdempotencyRecord is a stored idempotent request.
type IdempotencyRecord struct {
	Fingerprint string
	// Created is true when this call recorded a new in-flight entry.
	Created bool
	// Done is true when a response is stored.
	Done   bool
	Status int
	Body   []byte
}

// IdempotencyResult stores the response of an idempotent request.
type IdempotencyResult struct {
	TenantID  string
	Key       string
	Status    int
	Body      []byte
	ExpiresAt time.Time
}

// BeginIdempotent looks up (tenant, key). When absent or expired it records
// a new in-flight entry that expires at ip.InFlightUntil and returns it
// with Created set; otherwise it returns the stored record.
func (p *Plane) BeginIdempotent(ctx context.Context, ip IdempotencyParams) (IdempotencyRecord, error) {
	rec, err := p.store.BeginIdempotent(ctx, store.IdempotencyParams(ip))
	return IdempotencyRecord(rec), err
}

// FinishIdempotent stores the response of an in-flight entry, keeping it
// until r.ExpiresAt.
func (p *Plane) FinishIdempotent(ctx context.Context, r IdempotencyResult) error {
	return p.store.FinishIdempotent(ctx, store.IdempotencyResult(r))
}

// DropIdempotent removes an in-flight entry whose response must not be
// stored (successful claims, 429 and 5xx).
func (p *Plane) DropIdempotent(ctx context.Context, tenantID, key string) error {
	return p.store.DropIdempotent(ctx, tenantID, key)
}
