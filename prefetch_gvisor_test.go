package sandboxwich_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/gvisor"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/internal/testenv"
	"github.com/sandboxwich/sandboxwich/internal/testimage"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
)

// requireGVisor fails the test under CI=true without runsc and root, and
// skips it otherwise (or with -short).
func requireGVisor(t *testing.T) {
	t.Helper()
	if gvisor.FindRunsc() == "" || os.Geteuid() != 0 {
		testenv.Need(t, "runsc and root (scripts/install-runsc.sh)", errors.New("not found"))
	}
	if testing.Short() {
		t.Skip("starts real gVisor sandboxes")
	}
}

// gvisorCacheConfig is the configuration of a gVisor provider of pool
// name whose state and bundles are under dir and whose image cache is
// cache, within budget.
func gvisorCacheConfig(dir, name, cache string, budget int64) gvisor.Config {
	return gvisor.Config{StateDir: filepath.Join(dir, name, "state"), BundleDir: filepath.Join(dir, name, "bundles"),
		Pool: name, Installation: driver.InstallationTag(dir), ImageCacheDir: cache, ImageCacheBytes: budget,
		Logger: slog.New(slog.DiscardHandler)}
}

// cachedBytes prefetches each image into a scratch image cache and returns
// what each takes there.
func cachedBytes(t *testing.T, refs ...string) []int64 {
	t.Helper()
	dir := t.TempDir()
	prov, err := gvisor.New(gvisorCacheConfig(dir, "measure", filepath.Join(dir, "images"), 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gvisor.RemoveStateDir(filepath.Join(dir, "measure", "state")) })
	var out []int64
	for _, ref := range refs {
		if err := prov.Prefetch(context.Background(), ref); err != nil {
			t.Fatal(err)
		}
		imgs, err := prov.CachedImages(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		d, _ := driver.PinnedDigest(ref)
		i := slices.IndexFunc(imgs, func(c driver.CachedImage) bool { return c.Digest == d })
		if i < 0 || imgs[i].Bytes <= 0 {
			t.Fatalf("measuring %s: %+v", ref, imgs)
		}
		out = append(out, imgs[i].Bytes)
	}
	return out
}

// TestPrefetchGVisor: over real gVisor providers, two pools (acme's image
// class and globex's) sharing one image cache with a budget, and images
// on a loopback registry: a prefetch of three allowed images caches them;
// an image the pool does not allow is image_not_allowed and nothing is
// pulled; a digest the registry lacks fails (image_pull_failed); the
// listing shows the pool's images only; with a live cell of an image, an
// image the budget has no room for fails with insufficient_storage and
// the live cell's image stays (its cell still runs); the cache's stats
// count the shared cache once, with the evictions.
func TestPrefetchGVisor(t *testing.T) {
	requireGVisor(t)
	busybox, err := testimage.StaticBusybox()
	testenv.Need(t, "a static busybox", err)
	reg, err := testimage.Serve()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Close() })
	push := func(repo string, img v1.Image, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		ref, err := reg.Push(repo, img)
		if err != nil {
			t.Fatal(err)
		}
		return ref
	}
	liveImg, err := testimage.Marked(busybox, "live")
	live := push("swe/live", liveImg, err)
	var data []string
	for _, n := range []string{"1", "2", "3"} {
		img, err := testimage.Data("data-"+n, 256<<10)
		data = append(data, push("swe/data-"+n, img, err))
	}
	bigImg, err := testimage.Data("big", 2<<20)
	big := push("swe/big", bigImg, err)
	otherImg, err := testimage.Data("x", 64<<10)
	other := push("other/x", otherImg, err)
	missing := reg.Host + "/swe/missing@sha256:" + strings.Repeat("0", 64)

	sizes := cachedBytes(t, live, data[0], big)
	m, d, b := sizes[0], sizes[1], sizes[2]
	// Room for the live image, the three data images and half one more:
	// the big image does not fit beside the live one, even once
	// everything else is evicted.
	budget := m + 3*d + d/2
	if b <= budget-m || b > budget {
		t.Fatalf("image sizes %v do not make the case (budget %d)", sizes, budget)
	}

	dir, err := os.MkdirTemp("", "sbw-prefetch-")
	if err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(dir, "images")
	swe, err := gvisor.New(gvisorCacheConfig(dir, "swe", cache, budget))
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := gvisor.New(gvisorCacheConfig(dir, "other", cache, budget))
	if err != nil {
		t.Fatal(err)
	}
	keys := testenv.Keyring(t)
	rel := testenv.Release(keys, lease.GVisorLowerRisk)
	plane, err := sandboxwich.New(testenv.SQLite(t), keys, sandboxwich.WithLogger(slog.New(slog.DiscardHandler)),
		sandboxwich.WithPools(
			pool.Config{Name: "swe", TenantID: "acme", Release: rel, Target: 2, MaxProvisioning: 2, Provider: swe,
				Images: []string{reg.Host + "/swe/*"}},
			pool.Config{Name: "other", TenantID: "globex", Release: rel, Target: 1, Provider: theirs,
				Images: []string{reg.Host + "/other/*"}}),
		sandboxwich.WithPoolOptions(pool.WithInterval(50*time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = plane.Run(ctx) }()
	t.Cleanup(func() {
		for _, name := range []string{"swe", "other"} {
			_ = plane.Pools().SetTarget(name, 0)
		}
		dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
		defer dcancel()
		_ = plane.Pools().Drain(dctx)
		stop()
		<-done
		for _, name := range []string{"swe", "other"} {
			_ = gvisor.RemoveStateDir(filepath.Join(dir, name, "state"))
		}
		_ = os.RemoveAll(dir)
	})
	e := &env{ctx: ctx, plane: plane}
	states := func(tenant, poolName string) map[string]sandboxwich.ImageState {
		return e.imagesOf(t, tenant, poolName)
	}
	cachedDigests := func() []string {
		imgs, err := swe.CachedImages(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ds []string
		for _, i := range imgs {
			ds = append(ds, i.Digest)
		}
		return ds
	}
	digest := func(ref string) string { d, _ := driver.PinnedDigest(ref); return d }

	// Three allowed images.
	sts, err := plane.Prefetch(ctx, "acme", "swe", data)
	if err != nil {
		t.Fatal(err)
	}
	for i, st := range sts {
		if st.Image != data[i] || st.State != sandboxwich.ImageQueued {
			t.Errorf("prefetch answered %+v for %s, want queued", st, data[i])
		}
	}
	waitFor(t, "three images cached", func() bool {
		st := states("acme", "swe")
		for _, ref := range data {
			if st[ref].State != sandboxwich.ImageCached {
				return false
			}
		}
		return len(st) == 3
	})

	// An image the pool does not allow: nothing pulled.
	if _, err := plane.Prefetch(ctx, "acme", "swe", []string{data[0], other}); !errors.Is(err, errcode.ErrImageNotAllowed) {
		t.Errorf("prefetch of %s into swe: %v, want image_not_allowed", other, err)
	}
	if slices.Contains(cachedDigests(), digest(other)) {
		t.Error("the refused image was pulled")
	}

	// Another tenant's pool, sharing the cache: each lists its own.
	if _, err := plane.Prefetch(ctx, "globex", "other", []string{other}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "globex's image cached", func() bool { return states("globex", "other")[other].State == sandboxwich.ImageCached })
	if st := states("globex", "other"); len(st) != 1 {
		t.Errorf("globex's pool lists %v, want its one image", st)
	}
	if _, ok := states("acme", "swe")[other]; ok {
		t.Error("acme's pool lists globex's image")
	}

	// A digest the registry lacks.
	if _, err := plane.Prefetch(ctx, "acme", "swe", []string{missing}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the missing image failed", func() bool { return states("acme", "swe")[missing].State == sandboxwich.ImageFailed })
	if st := states("acme", "swe")[missing]; st.Code != sandboxwich.ImageCodePullFailed {
		t.Errorf("the missing image: %+v, want code image_pull_failed", st)
	}

	// A live cell of an image, then an image the budget has no room for
	// beside it.
	res, err := plane.Claim(ctx, "acme", sandboxwich.ClaimRequest{ClaimID: uuid.New(), Release: rel, Binding: binding,
		Image: live, WaitSeconds: 120})
	if err != nil || res.Lease == nil {
		t.Fatalf("claim of %s: %v, %v", live, res, err)
	}
	if _, err := plane.Prefetch(ctx, "acme", "swe", []string{big}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the big image failed", func() bool { return states("acme", "swe")[big].State == sandboxwich.ImageFailed })
	if st := states("acme", "swe")[big]; st.Code != sandboxwich.ImageCodeCacheFull {
		t.Errorf("the image the budget has no room for: %+v, want code insufficient_storage", st)
	}
	if ds := cachedDigests(); !slices.Contains(ds, digest(live)) || slices.Contains(ds, digest(big)) {
		t.Errorf("the cache holds %v: want the live cell's image, and nothing of the big one", ds)
	}
	if st := states("acme", "swe")[live]; st.State != sandboxwich.ImageCached {
		t.Errorf("the live cell's image is listed %+v", st)
	}
	out, err := plane.Exec(ctx, "acme", res.Lease.ID, res.Proof(), sandboxwich.ExecRequest{Argv: []string{"cat", "/etc/marker"}})
	if err != nil || string(out.Stdout) != "marker live\n" {
		t.Errorf("the live cell after the refused prefetch: %q, %v", out.Stdout, err)
	}

	// The cache's stats: one cache, as its listing counts it, and the
	// evictions the refused pull made room with.
	stats, err := plane.ImageCacheStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	imgs, err := theirs.CachedImages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, i := range imgs {
		total += i.Bytes
	}
	t.Logf("image cache: %+v", stats)
	if stats.Caches != 1 || stats.Bytes != total || stats.Bytes > budget || stats.Evictions == 0 {
		t.Errorf("ImageCacheStats %+v, want one cache of %d bytes (budget %d) and its evictions", stats, total, budget)
	}
}
