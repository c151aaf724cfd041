package httpapi

import (
	"crypto/sha256"
	"net/http"
	"strings"
	"sync"

	"github.com/sandboxwich/sandboxwich/errcode"
)

// inflight counts the requests in flight per bearer token and refuses one
// beyond its limit (CONTRACT §25, SANDBOXWICH_MAX_REQUESTS_PER_PRINCIPAL),
// so that no caller can hold every connection of the server. Tokens are
// kept only as their SHA-256 digests, and only while a request of theirs
// is in flight.
type inflight struct {
	limit int

	mu sync.Mutex
	n  map[[sha256.Size]byte]int
}

func newInflight(limit int) *inflight {
	return &inflight{limit: limit, n: map[[sha256.Size]byte]int{}}
}

// errTooManyRequests is the answer to a request beyond the cap.
var errTooManyRequests = errcode.New(errcode.TooManyRequests,
	"this token has too many requests in flight; retry after one of them has finished")

// acquire counts a request of r's bearer token. It returns the release
// function, or false when the token already has limit requests in
// flight. A request without a bearer token is not counted (probes, or
// the local-only insecure mode).
func (f *inflight) acquire(r *http.Request) (release func(), ok bool) {
	token, found := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if f == nil || !found || token == "" {
		return func() {}, true
	}
	key := sha256.Sum256([]byte(token))
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n[key] >= f.limit {
		return nil, false
	}
	f.n[key]++
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.n[key]--; f.n[key] <= 0 {
			delete(f.n, key)
		}
	}, true
}
