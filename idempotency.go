package sandboxwich

import (
	"context"
	"time"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/store"
)

// The records of idempotent HTTP requests (CONTRACT §10.4), kept in the
// plane's own store when it has the store.IdempotencyStore ability (both
// shipped stores do): what the HTTP API's Idempotency-Key needs, in the
// Plane's words.

// ErrNoIdempotency is returned by BeginIdempotent over a store without the
// store.IdempotencyStore ability: the HTTP API then refuses every
// Idempotency-Key (400 invalid_idempotency_key) rather than ignore it.
var ErrNoIdempotency = errcode.New(errcode.InvalidIdempotencyKey,
	"this server's store keeps no Idempotency-Key records; retry without the header")

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
	s, ok := p.store.(store.IdempotencyStore)
	if !ok {
		return IdempotencyRecord{}, ErrNoIdempotency
	}
	rec, err := s.BeginIdempotent(ctx, store.IdempotencyParams(ip))
	return IdempotencyRecord(rec), err
}

// FinishIdempotent stores the response of an in-flight entry, keeping it
// until r.ExpiresAt.
func (p *Plane) FinishIdempotent(ctx context.Context, r IdempotencyResult) error {
	s, ok := p.store.(store.IdempotencyStore)
	if !ok {
		return ErrNoIdempotency
	}
	return s.FinishIdempotent(ctx, store.IdempotencyResult(r))
}

// DropIdempotent removes an in-flight entry whose response must not be
// stored (successful claims, 429 and 5xx).
func (p *Plane) DropIdempotent(ctx context.Context, tenantID, key string) error {
	s, ok := p.store.(store.IdempotencyStore)
	if !ok {
		return ErrNoIdempotency
	}
	return s.DropIdempotent(ctx, tenantID, key)
}
