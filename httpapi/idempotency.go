package httpapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/errcode"
)

// Idempotency-Key handling (CONTRACT §10.4).
const (
	IdempotencyKeyHeader = "Idempotency-Key"
	maxIdempotencyKeyLen = 128
	// idempotencyInFlight bounds how long an unfinished request holds its
	// key (a crashed request frees it after this).
	idempotencyInFlight = 2 * time.Minute
	// idempotencyTTL is how long a completed response is replayed.
	idempotencyTTL = 24 * time.Hour
	// attestationPrefix starts every lease attestation: a body that holds
	// one is never stored.
	attestationPrefix = "swla1_"
)

var (
	errIdemKey = errcode.New(errcode.InvalidIdempotencyKey,
		"Idempotency-Key must be 1 to 128 printable ASCII characters")
	errIdemReused = errcode.New(errcode.IdempotencyKeyReused,
		"Idempotency-Key was already used for a different request")
	errIdemInProgress = errcode.New(errcode.IdempotencyInProgress,
		"a request with this Idempotency-Key is still in progress; retry later")
	errIdemRefused = errcode.New(errcode.InvalidIdempotencyKey,
		"Idempotency-Key is not accepted here: a streamed exec and file transfers are never replayed")
)

// idempotencyKey returns the request's trimmed Idempotency-Key; ok is false
// when the header is absent or blank.
func idempotencyKey(r *http.Request) (key string, ok bool, err error) {
	key = strings.TrimSpace(r.Header.Get(IdempotencyKeyHeader))
	switch {
	case key == "":
		return "", false, nil
	case len(key) > maxIdempotencyKeyLen || !printableASCII(key):
		return "", false, errIdemKey
	}
	return key, true, nil
}

// fingerprint is the lowercase hex SHA-256 of the method, the path without
// its /v1 prefix, the raw query, the content type and the body, each
// prefixed by its length.
func fingerprint(r *http.Request, body []byte) string {
	h := sha256.New()
	parts := [][]byte{
		[]byte(r.Method), []byte(unversioned(r.URL.Path)), []byte(r.URL.RawQuery),
		[]byte(r.Header.Get("Content-Type")), body,
	}
	for _, p := range parts {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(p)))
		h.Write(n[:])
		h.Write(p)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// idempotent answers a request that carries an Idempotency-Key: it replays
// a completed response, refuses a reused or in-flight key, or runs the route
// and stores or drops its response.
func (h *handler) idempotent(rt *route, c *call, key string) reply {
	fp := fingerprint(c.r, c.body)
	now := h.plane.Now()
	rec, err := h.plane.BeginIdempotent(c.ctx(), sandboxwich.IdempotencyParams{
		TenantID: c.p.tenant, Key: key, Fingerprint: fp, Now: now, InFlightUntil: now.Add(idempotencyInFlight),
	})
	if err != nil {
		return h.errorReply(c.r, err)
	}
	if !rec.Created {
		return h.replay(c.r, rec, fp)
	}
	settled := false
	defer func() {
		if !settled { // the route panicked: free the key
			h.dropIdempotent(c, key)
		}
	}()
	rep := h.invoke(rt, c)
	h.settle(rt, c, key, rep)
	settled = true
	return rep
}

// replay answers from an existing record.
func (h *handler) replay(r *http.Request, rec sandboxwich.IdempotencyRecord, fp string) reply {
	switch {
	case rec.Fingerprint != fp:
		return h.errorReply(r, errIdemReused)
	case !rec.Done:
		rep := h.errorReply(r, errIdemInProgress)
		rep.header = http.Header{"Retry-After": {"1"}}
		return rep
	}
	return reply{status: rec.Status, body: rec.Body}
}

// storable reports whether a response may be stored for replay.
func storable(rt *route, rep reply) bool {
	switch {
	case rep.status == http.StatusTooManyRequests || rep.status >= 500:
		return false
	case rt.idem == idemErrorsOnly && rep.status < 300:
		return false
	case bytes.Contains(rep.body, []byte(attestationPrefix)):
		return false
	}
	return true
}

// settle stores the response of an in-flight record, or drops the record.
func (h *handler) settle(rt *route, c *call, key string, rep reply) {
	if !storable(rt, rep) {
		h.dropIdempotent(c, key)
		return
	}
	body := rep.body
	if rep.stored != nil {
		body = rep.stored
	}
	err := h.plane.FinishIdempotent(context.WithoutCancel(c.ctx()), sandboxwich.IdempotencyResult{
		TenantID: c.p.tenant, Key: key, Status: rep.status, Body: body,
		ExpiresAt: h.plane.Now().Add(idempotencyTTL),
	})
	if err != nil {
		h.logIdempotency(c, "finish", err)
		h.dropIdempotent(c, key)
	}
}

func (h *handler) dropIdempotent(c *call, key string) {
	if err := h.plane.DropIdempotent(context.WithoutCancel(c.ctx()), c.p.tenant, key); err != nil {
		h.logIdempotency(c, "drop", err)
	}
}

func (h *handler) logIdempotency(c *call, op string, err error) {
	h.log.LogAttrs(c.ctx(), slog.LevelWarn, "httpapi: idempotency record",
		slog.String("op", op), slog.String("request_id", requestIDOf(c.ctx())), slog.String("error", err.Error()))
}
