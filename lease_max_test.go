package sandboxwich_test

import (
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/internal/testenv"
)

// TestMaxLeaseSecondsOption: WithMaxLeaseSeconds raises the clamp, within
// [1, MaxLeaseSecondsLimit].
func TestMaxLeaseSecondsOption(t *testing.T) {
	e := newEnv(t, sandboxwich.WithMaxLeaseSeconds(1800))
	e.prepare(t) // ready for an hour
	res, err := e.plane.Claim(e.ctx, "acme", sandboxwich.ClaimRequest{Release: e.rel, Binding: binding, LeaseSeconds: u64(5000)})
	if err != nil || res.Lease == nil {
		t.Fatalf("claim: %+v %v", res, err)
	}
	if got := res.Lease.ExpiresAt.Sub(e.now); got != 30*time.Minute {
		t.Fatalf("lease of %v, want 1800 s (clamped)", got)
	}
	if e.plane.MaxLeaseSeconds() != 1800 {
		t.Fatalf("MaxLeaseSeconds() = %d", e.plane.MaxLeaseSeconds())
	}
	st, keys := testenv.SQLite(t), testenv.Keyring(t)
	for _, n := range []uint64{0, sandboxwich.MaxLeaseSecondsLimit + 1} {
		if _, err := sandboxwich.New(st, keys, sandboxwich.WithMaxLeaseSeconds(n)); err == nil {
			t.Errorf("WithMaxLeaseSeconds(%d) accepted", n)
		}
	}
}
