// Package testenv holds the fixtures the project's tests share, so that
// each lives in one place: the signing key of CONTRACT.md's test vectors
// and the releases it signs, a manual clock, a goroutine-safe buffer, and
// real stores in a test's own directory or PostgreSQL schema.
//
// It imports no package that serves HTTP, so that every package's own
// tests, httpapi's included, can use it; the real server behind an
// httptest.Server is [github.com/sandboxwich/sandboxwich/internal/testenv/testserver].
package testenv

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/internal/testpg"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store/postgres"
	"github.com/sandboxwich/sandboxwich/store/sqlite"
)

// Key is the signing key of CONTRACT.md's test vectors (§3.6).
const Key = "sandboxwich-test-sterile-cell-signing-key-32-bytes-minimum"

// ReleaseSetID is the release set of the releases Release signs.
const ReleaseSetID = "release-set-2026-08-07"

// PolicyDigest is the policy digest of the releases Release signs.
var PolicyDigest = strings.Repeat("a", 64)

// Start is the instant a Clock starts from, on a whole second.
var Start = time.Date(2026, 8, 7, 12, 0, 0, 0, time.UTC)

// Keyring returns a keyring of Key.
func Keyring(tb testing.TB) *attest.Keyring {
	tb.Helper()
	keys, err := attest.NewKeyring([]byte(Key))
	if err != nil {
		tb.Fatal(err)
	}
	return keys
}

// Release returns the release of class in ReleaseSetID with PolicyDigest,
// signed by keys.
func Release(keys *attest.Keyring, class lease.RuntimeClass) lease.Release {
	r := lease.Release{ReleaseSetID: ReleaseSetID, RuntimeClass: class, PolicyDigest: PolicyDigest}
	r.Signature = keys.SignRelease(r)
	return r
}

// Clock is a manual clock, safe for concurrent use. It stands still until
// Advance moves it.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a Clock at Start.
func NewClock() *Clock { return &Clock{now: Start} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// Buffer is a bytes.Buffer safe for concurrent use: a log sink, or a
// process's output.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// SQLite opens a migrated SQLite store in a new file of the test's
// directory, closed when the test ends.
func SQLite(tb testing.TB) *sqlite.Store {
	tb.Helper()
	st, err := sqlite.Open(tb.Context(), filepath.Join(tb.TempDir(), "sandboxwich.db"), sqlite.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = st.Close() })
	return st
}

// Postgres opens a migrated PostgreSQL store in a new schema (testpg.Schema:
// skipped without a server, failed under CI=true), closed when the test
// ends.
func Postgres(tb testing.TB) *postgres.Store {
	tb.Helper()
	st, err := postgres.Open(tb.Context(), testpg.Schema(tb), postgres.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = st.Close() })
	return st
}

// Need skips the test locally, and fails it under CI=true, when err says
// a part of the real environment (a binary, a service) is missing.
func Need(tb testing.TB, what string, err error) {
	tb.Helper()
	if err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("%s is required under CI=true: %v", what, err)
		}
		tb.Skipf("no %s: %v", what, err)
	}
}
