package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/internal/testenv"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
)

// TestZipfTrace: the trace is a pure function of its seed; its images lie
// in range, the first is the most claimed (Zipf's law ranks them), and
// every task time lies within half and one and a half the mean.
func TestZipfTrace(t *testing.T) {
	const claims, images, hold = 500, 50, 2 * time.Second
	a, b := zipfTrace(claims, images, 1.1, hold, warmHitSeed), zipfTrace(claims, images, 1.1, hold, warmHitSeed)
	if !slices.Equal(a, b) {
		t.Fatal("two traces of one seed differ")
	}
	if c := zipfTrace(claims, images, 1.1, hold, warmHitSeed+1); slices.Equal(a, c) {
		t.Fatal("traces of two seeds are equal")
	}
	count := make([]int, images)
	for _, c := range a {
		if c.image < 0 || c.image >= images || c.hold < hold/2 || c.hold > 3*hold/2 {
			t.Fatalf("claim %+v out of range", c)
		}
		count[c.image]++
	}
	if top := slices.Max(count); count[0] != top || count[0] <= count[images-1] {
		t.Fatalf("claims by image %v: the first is not the most claimed", count)
	}
	if n := distinct(a); n < 2 || n > images {
		t.Fatalf("%d distinct images", n)
	}
}

// TestReplayTrace: R15's replay runs a small trace end to end on the
// fake provider: every claim is counted once, served warm or not, and the
// live cells stay within max_cells. How many were warm is the bench's
// figure (it depends on timing), not asserted here.
func TestReplayTrace(t *testing.T) {
	r := &WarmHitReport{Claims: 40, Images: 6, ZipfS: 1.1, Concurrency: 4, HoldMS: 20, MaxCold: 2, WarmPerImage: 2}
	r.MaxCells = r.Images + r.Concurrency + r.MaxCold
	refs := make([]string, r.Images)
	for i := range refs {
		refs[i] = fmt.Sprintf("registry.bench/trace/img-%02d@sha256:%064x", i, i+1)
	}
	prov := fake.NewWithAgent(fake.Config{Mode: driver.Apply, Latency: 10 * time.Millisecond})
	if err := replayOn(t.Context(), t.TempDir(), r, prov, "registry.bench/trace/*", refs, []string{"exit", "0"}, nil); err != nil {
		t.Fatal(err)
	}
	switch {
	case r.Hit.N+r.Miss.N != r.Claims || r.Hits != r.Hit.N:
		t.Fatalf("%d warm and %d waiting claims (hits %d) of %d", r.Hit.N, r.Miss.N, r.Hits, r.Claims)
	case !(r.Ratio >= 0 && r.Ratio <= 1):
		t.Fatalf("ratio %v", r.Ratio)
	case r.Samples == 0 || r.PeakLive == 0 || r.PeakLive > r.MaxCells:
		t.Fatalf("%d samples, live cells peaked at %d of %d", r.Samples, r.PeakLive, r.MaxCells)
	case r.Distinct < 1 || r.Distinct > r.Images:
		t.Fatalf("%d distinct images of %d", r.Distinct, r.Images)
	}
	t.Logf("%d of %d claims warm", r.Hits, r.Claims)
}

// TestBoundsFail: a reading past max_cells, or past the image cache's
// budget, is the watcher's error (the bench run fails with it).
func TestBoundsFail(t *testing.T) {
	ctx := t.Context()
	prov := fake.NewWithAgent(fake.Config{Mode: driver.Apply})
	plane, _, rel, stop, err := runPool(ctx, t.TempDir(), pool.Config{Name: "bounds", Target: 2, Images: []string{"registry.bench/b/*"}, Provider: prov})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	ref := "registry.bench/b/img@sha256:" + strings.Repeat("b", 64)
	res, err := plane.Claim(ctx, benchTenant, sandboxwich.ClaimRequest{ClaimID: uuid.Must(uuid.NewV7()), Release: rel,
		Binding: benchBinding, Image: ref, WaitSeconds: 60})
	if err != nil || res.Lease == nil {
		t.Fatalf("claim: %v %v", res, err)
	}
	defer func() { _, _ = plane.Release(ctx, benchTenant, res.Lease.ID, res.Proof(), lease.Destroyed) }()
	for _, c := range []struct {
		b    *bounds
		want string
	}{
		{&bounds{maxCells: 2}, ""},
		{&bounds{maxCells: 0}, "past max_cells 0"},
		{&bounds{maxCells: 2, budget: 10, cacheBytes: func(context.Context) (int64, error) { return 10, nil }}, ""},
		{&bounds{maxCells: 2, budget: 10, cacheBytes: func(context.Context) (int64, error) { return 11, nil }}, "past its budget of 10"},
	} {
		c.b.plane = plane
		err := c.b.watch(ctx, time.Hour)()
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("max_cells %d, budget %d: %v, want %q", c.b.maxCells, c.b.budget, err, c.want)
		}
	}
}

// TestColdClaim runs R14 on real gVisor cells and checks what no other
// work on the machine can move: both series were measured, every round's
// image was evicted from the cache once it was the one before last (the
// budget holds two and a half), and no reading passed a bound (the run
// fails otherwise). The ratio is the bench's figure.
func TestColdClaim(t *testing.T) {
	if _, err := exec.LookPath("runsc"); err != nil || os.Geteuid() != 0 {
		testenv.Need(t, "runsc and root (scripts/install-runsc.sh)", os.ErrNotExist)
	}
	if _, err := os.Stat(busybox); err != nil {
		testenv.Need(t, "a static busybox (scripts/install-busybox.sh)", err)
	}
	if testing.Short() {
		t.Skip("starts real gVisor sandboxes")
	}
	rep, err := benchColdClaim(t.Context(), t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cold claim p50 %.1f ms, bare p50 %.1f ms (×%.3f); cache peak %d of %d bytes, %d evictions, %d samples",
		rep.Claim.P50MS, rep.Bare.P50MS, rep.Ratio, rep.PeakCacheBytes, rep.CacheBudget, rep.Evictions, rep.Samples)
	switch {
	case rep.Claim.N != 4 || rep.Bare.N != 4 || !(rep.Ratio > 0):
		t.Fatalf("series not measured: %+v", rep)
	case rep.Evictions != 3:
		t.Fatalf("%d evictions of 5 images through room for two and a half, want 3", rep.Evictions)
	case rep.Samples == 0 || rep.PeakLive != 1 || rep.PeakCacheBytes > rep.CacheBudget:
		t.Fatalf("bounds: %+v", rep)
	}
}
