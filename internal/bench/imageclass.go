package bench

import (
	"archive/tar"
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/gvisor"
	"github.com/sandboxwich/sandboxwich/internal/testimage"
)

// The image class figures (R14, R15) run cells of images served by a
// loopback registry (internal/testimage): each image is the static busybox
// layer and a layer of its own /etc/marker, so every image has a digest
// of its own and the same size.

// markedImages pushes n images to reg as repo/img-00, repo/img-01, … and
// returns their references, pinned by digest.
func markedImages(reg *testimage.Registry, repo string, n int) ([]string, error) {
	bb, err := testimage.Busybox(busybox)
	if err != nil {
		return nil, err
	}
	refs := make([]string, n)
	for i := range n {
		m, err := testimage.Layer(testimage.Entry{Name: "etc/", Type: tar.TypeDir},
			testimage.Entry{Name: "etc/marker", Body: "marker " + strconv.Itoa(i) + "\n"})
		if err != nil {
			return nil, err
		}
		img, err := testimage.Image(bb, m)
		if err != nil {
			return nil, err
		}
		if refs[i], err = reg.Push(fmt.Sprintf("%s/img-%02d", repo, i), img); err != nil {
			return nil, err
		}
	}
	return refs, nil
}

// prefetchInto pulls refs into the image cache cacheDir with a provider
// of its own (no budget) and returns the bytes the cache then takes, as
// the budget counts them (CacheStats).
func prefetchInto(ctx context.Context, dir, cacheDir string, refs ...string) (int64, error) {
	state := filepath.Join(dir, "runsc-probe-"+uuid.NewString()[:8])
	defer func() { _ = gvisor.RemoveStateDir(state) }()
	p, err := gvisor.New(gvisor.Config{StateDir: state, BundleDir: filepath.Join(dir, "bundles-probe"), Pool: "probe",
		ImageCacheDir: cacheDir, Installation: driver.InstallationTag(state), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return 0, err
	}
	for _, ref := range refs {
		if err := p.Prefetch(ctx, ref); err != nil {
			return 0, err
		}
	}
	n, _, err := p.CacheStats(ctx)
	return n, err
}

// bounds samples an image class while it runs: its live members (every
// state that counts against max_cells) against maxCells, and, when
// cacheBytes is set, the image cache's bytes against budget. The first
// reading past a bound is its error.
type bounds struct {
	plane    *sandboxwich.Plane
	maxCells int
	// cacheBytes reads the image cache's bytes (gvisor.Provider.CacheStats);
	// nil for a provider without a cache.
	cacheBytes func(context.Context) (int64, error)
	budget     int64

	mu        sync.Mutex
	samples   int
	peakLive  int
	peakBytes int64
	err       error
}

// sample reads both once.
func (b *bounds) sample(ctx context.Context) {
	sts, err := b.plane.PoolStatus(ctx)
	live := 0
	if err == nil {
		for st, n := range sts[0].Members {
			if st.Live() {
				live += n
			}
		}
	}
	var bytes int64
	if err == nil && b.cacheBytes != nil {
		bytes, err = b.cacheBytes(ctx)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil && b.err == nil {
			b.err = fmt.Errorf("sampling the bounds: %w", err)
		}
		return
	}
	b.samples++
	b.peakLive, b.peakBytes = max(b.peakLive, live), max(b.peakBytes, bytes)
	switch {
	case b.err != nil:
	case live > b.maxCells:
		b.err = fmt.Errorf("%d live cells, past max_cells %d", live, b.maxCells)
	case b.cacheBytes != nil && bytes > b.budget:
		b.err = fmt.Errorf("the image cache takes %d bytes, past its budget of %d", bytes, b.budget)
	}
}

// watch samples every interval until the returned stop is called, which
// samples once more and returns the first violation.
func (b *bounds) watch(ctx context.Context, interval time.Duration) (stop func() error) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			b.sample(ctx)
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-time.After(interval):
			}
		}
	})
	return func() error {
		close(done)
		wg.Wait()
		b.sample(ctx)
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.err
	}
}

// admitted returns when the cell of a claimed lease was admitted (became
// ready; its evidence's AdmittedAt, by the plane's clock), after checking
// that the cell runs the image claimed: its admitted digest is ref's.
func admitted(ctx context.Context, plane *sandboxwich.Plane, res sandboxwich.ClaimResult, ref string) (time.Time, error) {
	ev, err := plane.Evidence(ctx, benchTenant, res.Lease.ID)
	if err != nil {
		return time.Time{}, fmt.Errorf("evidence: %w", err)
	}
	if want, _ := driver.PinnedDigest(ref); ev.ImageDigest != want {
		return time.Time{}, fmt.Errorf("lease %s runs image %q, want %q", res.Lease.ID, ev.ImageDigest, want)
	}
	if ev.AdmittedAt.IsZero() {
		return time.Time{}, fmt.Errorf("lease %s: its cell's admission time was not recorded", res.Lease.ID)
	}
	return ev.AdmittedAt, nil
}

// settledEmpty waits until the pool has no live member: no cell ready,
// leased, provisioning or being stopped.
func settledEmpty(ctx context.Context, plane *sandboxwich.Plane) error {
	deadline := time.Now().Add(time.Minute)
	for {
		sts, err := plane.PoolStatus(ctx)
		if err != nil {
			return err
		}
		live := 0
		for st, n := range sts[0].Members {
			if st.Live() {
				live += n
			}
		}
		if live == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the pool still has %d live cells after a minute: %v", live, sts[0].Members)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(5 * time.Millisecond)
	}
}
