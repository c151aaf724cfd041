package sandboxwich_test

import (
	"archive/tar"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sync/errgroup"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/gvisor"
	"github.com/sandboxwich/sandboxwich/internal/testimage"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
)

// markedImages serves n images on a loopback registry, each a static
// busybox with its own /etc/marker, and returns their pinned references
// and markers, and the registry.
func markedImages(t *testing.T, n int) (refs, markers []string, reg *testimage.Registry) {
	t.Helper()
	const busybox = "/bin/busybox"
	if _, err := os.Stat(busybox); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("a static busybox is required under CI=true (scripts/install-busybox.sh): %v", err)
		}
		t.Skip("no static busybox")
	}
	reg, err := testimage.Serve()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Close() })
	bb, err := testimage.Busybox(busybox)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		marker := "marker " + strconv.Itoa(i) + "\n"
		m, err := testimage.Layer(testimage.Entry{Name: "etc/", Type: tar.TypeDir}, testimage.Entry{Name: "etc/marker", Body: marker})
		if err != nil {
			t.Fatal(err)
		}
		img, err := testimage.Image(bb, m)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := reg.Push(fmt.Sprintf("swe/task-%02d", i), img)
		if err != nil {
			t.Fatal(err)
		}
		refs, markers = append(refs, ref), append(markers, marker)
	}
	return refs, markers, reg
}

// imageBytes is what one image of refs takes in an image cache: measured
// by a prefetch into a cache of its own.
func imageBytes(t *testing.T, ref string) int64 {
	t.Helper()
	dir := t.TempDir()
	p, err := gvisor.New(gvisor.Config{StateDir: filepath.Join(dir, "state"), BundleDir: filepath.Join(dir, "bundles"),
		ImageCacheDir: filepath.Join(dir, "images"), Pool: "probe", Installation: driver.InstallationTag(dir),
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Prefetch(context.Background(), ref); err != nil {
		t.Fatal(err)
	}
	n, _, err := p.CacheStats(context.Background())
	if err != nil || n <= 0 {
		t.Fatalf("the cache of one image: %d bytes, %v", n, err)
	}
	return n
}

// TestImageClassGVisor: an image class of real gVisor cells over a
// loopback registry of 20 images, each with its own marker. Claims with
// wait_seconds, 8 at a time, across the images (SANDBOXWICH_IMAGE_CLAIMS,
// default 40; the reliability profile runs 200): every lease runs exactly
// its image — its marker read through the cell agent, its digest on the
// evidence route —, no cell serves two leases, and live cells never
// exceed max_cells nor the image cache its budget (room for 8 of the 20
// images), which it keeps by evicting. After the drain nothing is left.
func TestImageClassGVisor(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real gVisor sandboxes")
	}
	claims := 40
	if v := os.Getenv("SANDBOXWICH_IMAGE_CLAIMS"); v != "" {
		claims, _ = strconv.Atoi(v)
	}
	const images, maxCells, workers = 20, 6, 8
	refs, markers, _ := markedImages(t, images)
	budget := 8 * imageBytes(t, refs[0])
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	g := startGVisorPool(t, ctx, "swe", gvisor.Config{ImageCacheDir: t.TempDir(), ImageCacheBytes: budget}, func(c *pool.Config) {
		c.Target, c.MaxProvisioning, c.Images = maxCells, 3, []string{hostOf(refs[0]) + "/swe/*"}
	})

	// A watcher samples the bounds the whole time.
	var watch errgroup.Group
	stop := make(chan struct{})
	var worst struct {
		sync.Mutex
		live  int
		bytes int64
	}
	watch.Go(func() error {
		for {
			sts, err := g.PoolStatus(ctx)
			if err == nil {
				live := 0
				for st, n := range sts[0].Members {
					if st.Live() {
						live += n
					}
				}
				bytes, _, _ := g.prov.CacheStats(ctx)
				worst.Lock()
				worst.live, worst.bytes = max(worst.live, live), max(worst.bytes, bytes)
				worst.Unlock()
			}
			select {
			case <-stop:
				return nil
			case <-time.After(20 * time.Millisecond):
			}
		}
	})

	rng := rand.New(rand.NewPCG(43, 21))
	order := make([]int, claims)
	for i := range order {
		order[i] = rng.IntN(images)
	}
	var mu sync.Mutex
	leased := map[uuid.UUID]int{} // cell → claim
	var run errgroup.Group
	run.SetLimit(workers)
	for i, im := range order {
		run.Go(func() error {
			res, err := g.Claim(ctx, "acme", sandboxwich.ClaimRequest{ClaimID: uuid.Must(uuid.NewV7()), Release: g.rel,
				Binding: binding, Image: refs[im], WaitSeconds: 240})
			if err != nil || res.Lease == nil {
				return fmt.Errorf("claim %d of image %d: %v %v", i, im, res, err)
			}
			mu.Lock()
			if j, dup := leased[res.Lease.CellID]; dup {
				mu.Unlock()
				return fmt.Errorf("cell %s served claim %d and claim %d", res.Lease.CellID, j, i)
			}
			leased[res.Lease.CellID] = i
			mu.Unlock()
			proof := res.Proof()
			out, err := g.Exec(ctx, "acme", res.Lease.ID, proof, sandboxwich.ExecRequest{Argv: []string{"cat", "/etc/marker"}})
			if err != nil || string(out.Stdout) != markers[im] {
				return fmt.Errorf("claim %d of image %d reads %q (%+v, %v), want %q", i, im, out.Stdout, out, err, markers[im])
			}
			ev, err := g.Evidence(ctx, "acme", res.Lease.ID)
			if want, _ := driver.PinnedDigest(refs[im]); err != nil || ev.ImageDigest != want {
				return fmt.Errorf("claim %d: evidence image digest %q (%v), want %q", i, ev.ImageDigest, err, want)
			}
			_, err = g.Release(ctx, "acme", res.Lease.ID, proof, lease.Destroyed)
			return err
		})
	}
	err := run.Wait()
	close(stop)
	_ = watch.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if worst.live > maxCells || worst.bytes > budget {
		t.Errorf("live cells peaked at %d (max_cells %d), the image cache at %d bytes (budget %d)", worst.live, maxCells, worst.bytes, budget)
	}
	distinct := map[int]bool{}
	for _, im := range order {
		distinct[im] = true
	}
	bytes, evictions, _ := g.prov.CacheStats(ctx)
	cached, _ := g.prov.CachedImages(ctx)
	t.Logf("%d claims of %d images; the cache peaked at %d of %d bytes, holds %d images (%d bytes), evicted %d; live cells peaked at %d",
		claims, len(distinct), worst.bytes, budget, len(cached), bytes, evictions, worst.live)
	if len(distinct) > 8 && evictions == 0 {
		t.Errorf("no image was evicted serving %d images within room for 8", len(distinct))
	}
	_ = g.Pools().SetTarget("swe", 0)
	dctx, dcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer dcancel()
	if err := g.Pools().Drain(dctx); err != nil {
		t.Fatal(err)
	}
	if objs, err := g.prov.List(ctx); err != nil || len(objs) != 0 {
		t.Errorf("after the drain the provider holds %d cells (%v), want none", len(objs), err)
	}
}

// hostOf is the registry host of a reference.
func hostOf(ref string) string { host, _, _ := strings.Cut(ref, "/"); return host }

// TestProviderFaultImagePull: on real gVisor, a claim of an image whose
// pull fails — a digest the registry lacks, or a registry that cuts every
// download — waits in vain (wait_elapsed), its cells stopped as
// provision_failed, and leaves no cell and nothing half-unpacked; once the
// registry serves again, a claim of the image gets a cell of it.
func TestProviderFaultImagePull(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real gVisor sandboxes")
	}
	refs, markers, reg := markedImages(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	g := startGVisorPool(t, ctx, "swe", gvisor.Config{ImageCacheDir: t.TempDir()}, func(c *pool.Config) {
		c.Target, c.MaxProvisioning, c.Images = 2, 1, []string{hostOf(refs[0]) + "/swe/*"}
	})
	claim := func(image string, wait uint64) sandboxwich.ClaimResult {
		t.Helper()
		res, err := g.Claim(ctx, "acme", sandboxwich.ClaimRequest{ClaimID: uuid.Must(uuid.NewV7()), Release: g.rel,
			Binding: binding, Image: image, WaitSeconds: wait})
		if err != nil {
			t.Fatalf("claim of %s: %v", image, err)
		}
		return res
	}
	nothingLeft := func(what, image string) {
		t.Helper()
		if objs, err := g.prov.List(ctx); err != nil || len(objs) != 0 {
			t.Errorf("%s: the provider holds %d cells (%v), want none", what, len(objs), err)
		}
		want, _ := driver.PinnedDigest(image)
		cached, err := g.prov.CachedImages(ctx)
		for _, c := range cached {
			if c.Digest == want {
				t.Errorf("%s: the image is in the cache (%+v)", what, c)
			}
		}
		if err != nil {
			t.Error(err)
		}
	}
	// failed counts the members stopped because their provision failed.
	failed := func() int {
		evs, err := g.Events(ctx, sandboxwich.EventQuery{Oldest: true, Limit: 1000, Members: true})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, ev := range evs {
			if ev.Reason == "provision_failed" {
				n++
			}
		}
		return n
	}

	missing := hostOf(refs[0]) + "/swe/task-00@sha256:" + strings.Repeat("d", 64)
	if res := claim(missing, 3); res.Lease != nil || res.EmptyReason != sandboxwich.EmptyWaitElapsed {
		t.Fatalf("a claim of a digest the registry lacks: %v, want empty (wait_elapsed)", res)
	}
	if n := failed(); n == 0 {
		t.Error("no member was stopped with reason provision_failed")
	}
	nothingLeft("after a digest the registry lacks", missing)

	restore := reg.DropBlobs()
	if res := claim(refs[1], 3); res.Lease != nil || res.EmptyReason != sandboxwich.EmptyWaitElapsed {
		t.Fatalf("a claim while the registry cuts every download: %v, want empty (wait_elapsed)", res)
	}
	nothingLeft("after downloads cut mid-pull", refs[1])
	restore()
	res := claim(refs[1], 120)
	if res.Lease == nil {
		t.Fatalf("a claim once the registry serves again: %v, want a cell", res)
	}
	out, err := g.Exec(ctx, "acme", res.Lease.ID, res.Proof(), sandboxwich.ExecRequest{Argv: []string{"cat", "/etc/marker"}})
	if err != nil || string(out.Stdout) != markers[1] {
		t.Fatalf("the cell reads %q (%v), want %q", out.Stdout, err, markers[1])
	}
	if _, err := g.Release(ctx, "acme", res.Lease.ID, res.Proof(), lease.Destroyed); err != nil {
		t.Fatal(err)
	}
}
