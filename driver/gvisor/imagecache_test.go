package gvisor

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/internal/imageref"
	"github.com/sandboxwich/sandboxwich/lease"
)

// digestOf is the digest a pinned reference names.
func digestOf(t *testing.T, ref string) string {
	t.Helper()
	d, ok := driver.PinnedDigest(ref)
	if !ok {
		t.Fatalf("%s is not pinned", ref)
	}
	return d
}

// dataImages pushes one image per name, "img-<name>", each of one file of
// 256 KiB unique to it: images of one size on disk.
func dataImages(t *testing.T, reg *testRegistry, names ...string) map[string]string {
	t.Helper()
	refs := map[string]string{}
	for _, n := range names {
		refs[n] = reg.push(t, "img-"+n, imageOf(t, layerOf(t, tarEntry{Name: "data", Body: strings.Repeat(n, 256<<10)})))
	}
	return refs
}

// allFetches counts the registry's blob GETs.
func (reg *testRegistry) allFetches() int {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	n := 0
	for _, v := range reg.blobs {
		n += v
	}
	return n
}

// imageBytes is what ref takes unpacked in a cache, measured in a scratch
// one.
func imageBytes(t *testing.T, ref string) int64 {
	t.Helper()
	c := testCache(t, t.TempDir(), 0, 0, "measure", "p")
	s, err := c.store(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.prepare(context.Background()); err != nil {
		t.Fatal(err)
	}
	imgs, err := c.images(context.Background())
	if err != nil || len(imgs) != 1 || imgs[0].bytes <= 0 {
		t.Fatalf("measuring %s: %+v, %v", ref, imgs, err)
	}
	return imgs[0].bytes
}

// cachedDigests lists the digests of a provider's cached images, sorted,
// and fails the test when the cache is over its budget.
func cachedDigests(t *testing.T, p *Provider) []string {
	t.Helper()
	imgs, err := p.CachedImages(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ds []string
	for _, i := range imgs {
		ds = append(ds, i.Digest)
	}
	slices.Sort(ds)
	bytes, _, err := p.CacheStats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if b := p.images.budget; b > 0 && bytes > b {
		t.Errorf("the cache holds %d bytes (%d images), over its budget of %d", bytes, len(ds), b)
	}
	return ds
}

func sorted(ds ...string) []string {
	slices.Sort(ds)
	return ds
}

// assertNoPartial fails unless the cache holds nothing of digest d: no
// image, no temporary unpack, no reservation.
func assertNoPartial(t *testing.T, cache, d string) {
	t.Helper()
	base := strings.Replace(d, ":", "-", 1)
	for _, p := range []string{base, ".tmp-" + base, filepath.Join(imagePullsDir, base)} {
		if _, err := os.Lstat(filepath.Join(cache, p)); err == nil {
			t.Errorf("the cache holds %s", p)
		}
	}
}

// TestImageCacheBudget: under a budget of two images and a half, using
// images a, b, a and c (each provision's hold released before the next)
// evicts b, the least recently used; an image held by a provision in
// flight, mounted by a container of the state root, or used by a live
// cell of another state root (its record) is never evicted, and a pull
// with no room fails with an *ImageCacheFullError, leaving nothing, until
// a cell ends.
func TestImageCacheBudget(t *testing.T) {
	t.Parallel()
	reg := newTestRegistry(t)
	refs := dataImages(t, reg, "a", "b", "c")
	one := imageBytes(t, refs["a"])
	dir := t.TempDir()
	c := testCache(t, dir, 0, 2*one+one/2, "inst", "p")
	p := &Provider{images: c}
	ctx := context.Background()
	store := func(n string) *imageStore {
		t.Helper()
		s, err := c.store(refs[n])
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	use := func(n string) {
		t.Helper()
		release, err := store(n).acquire(ctx)
		if err != nil {
			t.Fatalf("using image %s: %v", n, err)
		}
		release()
		cachedDigests(t, p)
	}
	a, b, cc := digestOf(t, refs["a"]), digestOf(t, refs["b"]), digestOf(t, refs["c"])
	use("a")
	use("b")
	use("a")
	use("c")
	if got, want := cachedDigests(t, p), sorted(a, cc); !slices.Equal(got, want) {
		t.Errorf("after a, b, a, c the cache holds %v, want a and c (b the least recently used)", got)
	}
	if _, n, _ := p.CacheStats(ctx); n != 1 {
		t.Errorf("%d evictions, want 1", n)
	}

	// a is held by a provision in flight, c used by a live cell of
	// another state root: b has no room.
	release, err := store("a").acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	otherRoot := t.TempDir()
	cellID := "sbw-other-" + uuid.NewString()
	if err := os.WriteFile(filepath.Join(dir, imageCellsDir, cellID), []byte(cc+"\n"+otherRoot+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stateFilePath(otherRoot, cellID), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	full := func(step string) {
		t.Helper()
		err := store("b").prepare(ctx)
		var fe *ImageCacheFullError
		if !errors.As(err, &fe) || fe.Image != refs["b"] || fe.Budget != c.budget || fe.Held <= c.budget-fe.Need {
			t.Fatalf("%s: pulling b = %v, want an *ImageCacheFullError", step, err)
		}
		t.Logf("%s: %v", step, err)
		assertNoPartial(t, dir, b)
		if got, want := cachedDigests(t, p), sorted(a, cc); !slices.Equal(got, want) {
			t.Errorf("%s: the cache holds %v, want a and c still", step, got)
		}
	}
	full("a held, c used by a cell of another state root")
	// The provision of a made its container, which the state root lists.
	release()
	c.inUse = func(context.Context) (map[string]bool, error) { return map[string]bool{a: true}, nil }
	full("a mounted by a container of the state root, c used by a cell of another state root")

	// The other root's cell ends without its record removed (a crash):
	// its record is stale, and c, no longer used, makes room for b.
	if err := os.Remove(stateFilePath(otherRoot, cellID)); err != nil {
		t.Fatal(err)
	}
	if err := store("b").prepare(ctx); err != nil {
		t.Fatalf("pulling b once c is free: %v", err)
	}
	if got, want := cachedDigests(t, p), sorted(a, b); !slices.Equal(got, want) {
		t.Errorf("the cache holds %v, want a (in use) and b", got)
	}
	if _, err := os.Lstat(filepath.Join(dir, imageCellsDir, cellID)); err == nil {
		t.Error("the stale record of the other root's cell is kept")
	}
	if _, n, _ := p.CacheStats(ctx); n != 2 {
		t.Errorf("%d evictions, want 2", n)
	}
}

// TestImageCacheTooSmall: an image that unpacks to more than the whole
// budget fails (driver.ErrImageCacheFull) at once the next time, without
// a download, and leaves nothing.
func TestImageCacheTooSmall(t *testing.T) {
	t.Parallel()
	reg := newTestRegistry(t)
	refs := dataImages(t, reg, "a")
	dir := t.TempDir()
	c := testCache(t, dir, 0, 64<<10, "inst", "p")
	s, err := c.store(refs["a"])
	if err != nil {
		t.Fatal(err)
	}
	var fe *ImageCacheFullError
	if err := s.prepare(context.Background()); !errors.As(err, &fe) || fe.Need <= fe.Budget || !errors.Is(err, driver.ErrImageCacheFull) {
		t.Fatalf("pulling an image larger than the budget: %v", err)
	}
	assertNoPartial(t, dir, s.digest)
	for _, d := range cachedImages(t, dir) {
		t.Errorf("the cache holds %s", d)
	}
	blobs := reg.allFetches()
	err = s.prepare(context.Background())
	if after := reg.allFetches(); !errors.As(err, &fe) || after != blobs {
		t.Errorf("the second pull = %v after %d more blob fetches, want the same error and none", err, after-blobs)
	}
}

// TestImageCacheRegistryDiesMidPull: a registry that drops a layer's
// connection halfway and answers nothing more fails the pull cleanly —
// no image, no half-unpacked directory, no reservation, the budget's
// bytes unchanged — and once it is back a later pull works.
func TestImageCacheRegistryDiesMidPull(t *testing.T) {
	t.Parallel()
	reg := newTestRegistry(t)
	big := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB
	l := layerOf(t, tarEntry{Name: "big", Body: big})
	ref := reg.push(t, "dies", imageOf(t, l))
	ld, _ := l.Digest()
	var dead, cut atomic.Bool
	cut.Store(true)
	f := func(w http.ResponseWriter, r *http.Request) bool {
		if !dead.Load() && !(cut.Load() && strings.HasSuffix(r.URL.Path, "/blobs/"+ld.String())) {
			return false
		}
		if !dead.Load() {
			rc, _ := l.Compressed()
			b, _ := io.ReadAll(rc)
			rc.Close()
			w.Header().Set("Content-Length", fmt.Sprint(len(b)))
			_, _ = w.Write(b[:len(b)/2])
			w.(http.Flusher).Flush()
			dead.Store(true)
		}
		if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
			conn.Close()
		}
		return true
	}
	reg.fault.Store(&f)
	dir := t.TempDir()
	c := testCache(t, dir, 0, 64<<20, "inst", "p")
	p := &Provider{images: c}
	ctx := context.Background()
	err := p.Prefetch(ctx, ref)
	var fe *ImageCacheFullError
	if err == nil || errors.As(err, &fe) || !dead.Load() {
		t.Fatalf("Prefetch while the registry dies = %v", err)
	}
	t.Logf("Prefetch: %v", err)
	assertNoPartial(t, dir, digestOf(t, ref))
	if got := cachedDigests(t, p); len(got) != 0 {
		t.Errorf("the cache lists %v after the failed pull", got)
	}
	if bytes, _, _ := p.CacheStats(ctx); bytes != 0 {
		t.Errorf("the cache counts %d bytes after the failed pull", bytes)
	}

	cut.Store(false)
	dead.Store(false)
	// The failure is backed off (1 s first): try until it is over.
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if err = p.Prefetch(ctx, ref); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Prefetch once the registry is back: %v", err)
		}
	}
	imgs, err := p.CachedImages(ctx)
	if err != nil || len(imgs) != 1 || imgs[0].Digest != digestOf(t, ref) || imgs[0].Reference != ref || imgs[0].Bytes <= int64(len(big)) {
		t.Errorf("CachedImages = %+v, %v; want the image", imgs, err)
	}
	s, _ := c.store(ref)
	if b, err := os.ReadFile(filepath.Join(s.rootfs(), "big")); err != nil || string(b) != big {
		t.Errorf("the unpacked layer: %d bytes, %v", len(b), err)
	}
}

// TestImageCollectLeavesImagesOnDemand: the collector of images no pool
// references removes a pool's former image, not an image used on demand:
// those are the budget's.
func TestImageCollectLeavesImagesOnDemand(t *testing.T) {
	t.Parallel()
	reg := newTestRegistry(t)
	refs := dataImages(t, reg, "p", "q", "x")
	dir := t.TempDir()
	ctx := context.Background()
	old := testStore(t, refs["p"], dir, "inst", "pool")
	onDemand, err := old.c.store(refs["x"])
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*imageStore{old, onDemand} {
		if err := s.prepare(ctx); err != nil {
			t.Fatal(err)
		}
	}
	moved := testStore(t, refs["q"], dir, "inst", "pool")
	if err := moved.prepare(ctx); err != nil {
		t.Fatal(err)
	}
	if complete(old.dir(), old.digest) {
		t.Error("the pool's former image is still cached")
	}
	if !complete(onDemand.dir(), onDemand.digest) {
		t.Error("the collector removed an image used on demand")
	}
}

// TestImageCacheDefaults: without Config.Image and ImageCacheDir the cache
// is where Config.Image's would be (its CacheID), nothing is made at New, the provider
// serves images, and a reference not pinned by digest is refused before
// runsc runs.
func TestImageCacheDefaults(t *testing.T) {
	path, log := fakeRunsc(t, "exit 0\n")
	cfg := fakeConfig(t, path)
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := filepath.Abs(imageCacheDir(p.cfg.BundleDir))
	if p.images.dir != want || p.cfg.ImageCacheDir != imageCacheDir(p.cfg.BundleDir) || p.CacheID() != want {
		t.Errorf("the image cache is %s (CacheID %s), want %s", p.images.dir, p.CacheID(), want)
	}
	if !p.Capabilities().Images {
		t.Error("Capabilities().Images is false")
	}
	_ = os.Remove(log)
	for _, bad := range []string{"registry.example/cell:latest", "registry.example/cell", "registry.example/cell@sha256:abc"} {
		_, err := p.Provision(context.Background(), driver.ProvisionRequest{CellID: uuid.New(), RuntimeClass: lease.GVisorLowerRisk, Image: bad})
		var ie *imageref.Error
		if !errors.As(err, &ie) || !strings.Contains(err.Error(), bad) {
			t.Errorf("Provision of image %q = %v, want an *imageref.Error naming it", bad, err)
		}
	}
	if b, err := os.ReadFile(log); err == nil {
		t.Errorf("refused provisions ran runsc: %s", b)
	}
	for _, cfg := range []Config{{ImageCacheBytes: -1}, {ImageMaxBytes: -1}} {
		c := fakeConfig(t, path)
		c.ImageCacheBytes, c.ImageMaxBytes = cfg.ImageCacheBytes, cfg.ImageMaxBytes
		if _, err := New(c); err == nil {
			t.Errorf("New with %+v: no error", cfg)
		}
	}
}

// markerImages pushes one image per name, "img-<name>": a static busybox
// and /etc/marker saying "marker <name>".
func markerImages(t *testing.T, reg *testRegistry, busybox string, names ...string) (map[string]string, map[string]v1.Hash) {
	t.Helper()
	bb := busyboxLayer(t, busybox)
	refs, markers := map[string]string{}, map[string]v1.Hash{}
	for _, n := range names {
		m := layerOf(t, tarEntry{Name: "etc/", Type: tar.TypeDir}, tarEntry{Name: "etc/marker", Body: "marker " + n + "\n"})
		refs[n] = reg.push(t, "img-"+n, imageOf(t, bb, m))
		d, err := m.Digest()
		if err != nil {
			t.Fatal(err)
		}
		markers[n] = d
	}
	return refs, markers
}

// provisionImage provisions a cell of image and destroys it at cleanup.
func provisionImage(t *testing.T, p *Provider, image string) (driver.Object, error) {
	t.Helper()
	cell := uuid.Must(uuid.NewV7())
	t.Cleanup(func() {
		if err := p.Destroy(context.Background(), driver.Object{CellID: cell}); err != nil {
			t.Errorf("Destroy: %v", err)
		}
	})
	return p.Provision(context.Background(), driver.ProvisionRequest{CellID: cell, RuntimeClass: lease.GVisorLowerRisk, Image: image})
}

// assertNothingMade fails when the provider holds a container or a bundle
// of cell.
func assertNothingMade(t *testing.T, p *Provider, cell uuid.UUID) {
	t.Helper()
	objs, err := p.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.CellID == cell {
			t.Errorf("a container of the refused cell exists: %+v", o)
		}
	}
	if _, err := os.Stat(p.bundlePath(p.containerID(cell))); err == nil {
		t.Error("a bundle of the refused cell exists")
	}
}

// TestImagePerCell: one provider without Config.Image runs a cell of image
// a and one of image b, each reading its own marker, each reporting the
// digest it mounted, beside a cell of the default root; a tag-only
// reference is refused with nothing made; two concurrent provisions of a
// new image pull it once.
func TestImagePerCell(t *testing.T) {
	requireRunsc(t)
	busybox := requireBusybox(t)
	t.Parallel()
	reg := newTestRegistry(t)
	refs, markers := markerImages(t, reg, busybox, "a", "b", "c")
	cfg := testConfig(t)
	cfg.ImageCacheDir = filepath.Join(filepath.Dir(cfg.StateDir), "images")
	p := newProvider(t, cfg)
	ctx := context.Background()

	cell := uuid.Must(uuid.NewV7())
	_, err := p.Provision(ctx, driver.ProvisionRequest{CellID: cell, RuntimeClass: lease.GVisorLowerRisk, Image: reg.host + "/img-a:latest"})
	if err == nil || !strings.Contains(err.Error(), "must be pinned by digest") {
		t.Errorf("Provision of a tag-only reference = %v, want it refused", err)
	}
	assertNothingMade(t, p, cell)
	if _, err := os.Stat(cfg.ImageCacheDir); err == nil {
		t.Error("the refused reference made the image cache")
	}

	for _, n := range []string{"a", "b"} {
		obj, err := provisionImage(t, p, refs[n])
		if err != nil {
			t.Fatalf("Provision of image %s: %v", n, err)
		}
		o, err := p.Inspect(ctx, obj)
		if err != nil || driver.Verify(obj, o, lease.GVisorLowerRisk) != nil || o.ImageDigest != digestOf(t, refs[n]) {
			t.Errorf("Inspect of the cell of image %s = %+v, %v; want verified with digest %s", n, o, err, digestOf(t, refs[n]))
		}
		if res := activate(t, p, obj).run(t, "cat", "/etc/marker"); string(res.Stdout) != "marker "+n+"\n" {
			t.Errorf("the cell of image %s reads %q (stderr %q)", n, res.Stdout, res.Stderr)
		}
	}
	host := provision(t, p)
	if o, err := p.Inspect(ctx, host); err != nil || o.ImageDigest != "" || driver.Verify(host, o, lease.GVisorLowerRisk) != nil {
		t.Errorf("Inspect of the default root's cell = %+v, %v", o, err)
	}
	if res := activate(t, p, host).run(t, "sh", "-c", "cat /etc/marker; cat /etc/os-release"); !strings.Contains(string(res.Stdout), "Sandboxwich cell") ||
		strings.Contains(string(res.Stdout), "marker") {
		t.Errorf("the default root's cell reads %q", res.Stdout)
	}

	var wg sync.WaitGroup
	objs, errs := make([]driver.Object, 2), make([]error, 2)
	for i := range objs {
		wg.Go(func() { objs[i], errs[i] = provisionImage(t, p, refs["c"]) })
	}
	wg.Wait()
	for i := range objs {
		if errs[i] != nil {
			t.Fatalf("concurrent Provision of image c: %v", errs[i])
		}
		if o, err := p.Inspect(ctx, objs[i]); err != nil || o.ImageDigest != digestOf(t, refs["c"]) {
			t.Errorf("Inspect of a cell of image c = %+v, %v", o, err)
		}
	}
	if n := reg.fetches(markers["c"]); n != 1 {
		t.Errorf("two concurrent provisions of image c fetched its layer %d times, want once", n)
	}
	imgs, err := p.CachedImages(ctx)
	if err != nil || len(imgs) != 3 {
		t.Fatalf("CachedImages = %+v, %v; want a, b and c", imgs, err)
	}
	for _, i := range imgs {
		if i.Digest != digestOf(t, i.Reference) || i.Bytes <= 0 || i.LastUsed.IsZero() {
			t.Errorf("cached image %+v", i)
		}
	}
}

// TestImageCacheBudgetCells: with a budget of two images and a half,
// cells of images a, b, a and c, each destroyed before the next, evict b,
// the least recently used; with live cells of a and c, a cell of b fails
// with an *ImageCacheFullError and nothing is made, until c's cell ends.
// The cache stays within its budget at every step.
func TestImageCacheBudgetCells(t *testing.T) {
	requireRunsc(t)
	busybox := requireBusybox(t)
	t.Parallel()
	reg := newTestRegistry(t)
	refs, _ := markerImages(t, reg, busybox, "a", "b", "c")
	one := imageBytes(t, refs["a"])
	cfg := testConfig(t)
	cfg.ImageCacheDir = filepath.Join(filepath.Dir(cfg.StateDir), "images")
	cfg.ImageCacheBytes = 2*one + one/2
	p := newProvider(t, cfg)
	ctx := context.Background()
	a, b, c := digestOf(t, refs["a"]), digestOf(t, refs["b"]), digestOf(t, refs["c"])
	live := func(n string) driver.Object {
		t.Helper()
		obj, err := provisionImage(t, p, refs[n])
		if err != nil {
			t.Fatalf("Provision of image %s: %v", n, err)
		}
		cachedDigests(t, p)
		return obj
	}
	once := func(n string) {
		t.Helper()
		if err := p.Destroy(ctx, live(n)); err != nil {
			t.Fatal(err)
		}
		cachedDigests(t, p)
	}
	once("a")
	once("b")
	once("a")
	once("c")
	if got, want := cachedDigests(t, p), sorted(a, c); !slices.Equal(got, want) {
		t.Errorf("after cells of a, b, a and c the cache holds %v, want a and c", got)
	}
	if _, n, _ := p.CacheStats(ctx); n != 1 {
		t.Errorf("%d evictions, want 1", n)
	}

	live("a")
	cellC := live("c")
	cell := uuid.Must(uuid.NewV7())
	_, err := p.Provision(ctx, driver.ProvisionRequest{CellID: cell, RuntimeClass: lease.GVisorLowerRisk, Image: refs["b"]})
	var fe *ImageCacheFullError
	if !errors.As(err, &fe) {
		t.Fatalf("Provision of image b beside live cells of a and c = %v, want an *ImageCacheFullError", err)
	}
	t.Logf("Provision: %v", err)
	assertNothingMade(t, p, cell)
	assertNoPartial(t, cfg.ImageCacheDir, b)
	if got, want := cachedDigests(t, p), sorted(a, c); !slices.Equal(got, want) {
		t.Errorf("the cache holds %v, want a and c (both in use)", got)
	}

	if err := p.Destroy(ctx, cellC); err != nil {
		t.Fatal(err)
	}
	live("b")
	if got, want := cachedDigests(t, p), sorted(a, b); !slices.Equal(got, want) {
		t.Errorf("once c's cell ended the cache holds %v, want a (in use) and b", got)
	}
	if _, n, _ := p.CacheStats(ctx); n != 2 {
		t.Errorf("%d evictions, want 2", n)
	}
}
