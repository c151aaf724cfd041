package sandboxwich_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/store/sqlite"
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
	st, err := sqlite.Open(e.ctx, filepath.Join(t.TempDir(), "x.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	keys, _ := attest.NewKeyring([]byte(testKey))
	for _, n := range []uint64{0, sandboxwich.MaxLeaseSecondsLimit + 1} {
		if _, err := sandboxwich.New(st, keys, sandboxwich.WithMaxLeaseSeconds(n)); err == nil {
			t.Errorf("WithMaxLeaseSeconds(%d) accepted", n)
		}
	}
}
