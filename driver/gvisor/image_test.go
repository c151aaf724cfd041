package gvisor

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/drivertest"
	"github.com/sandboxwich/sandboxwich/internal/testimage"
	"github.com/sandboxwich/sandboxwich/lease"
)

// testRegistry is go-containerregistry's registry served on loopback, the
// OCI distribution API a real pull speaks, with faults a test injects at
// the HTTP level (a wrong or truncated blob) and a count of blob fetches.
type testRegistry struct {
	srv  *httptest.Server
	host string
	// fault, when set, may answer a request itself (returning true).
	fault atomic.Pointer[func(w http.ResponseWriter, r *http.Request) bool]
	mu    sync.Mutex
	blobs map[string]int // GETs per blob digest
}

func newTestRegistry(t *testing.T) *testRegistry {
	t.Helper()
	reg := &testRegistry{blobs: map[string]int{}}
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	reg.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if i := strings.Index(r.URL.Path, "/blobs/sha256:"); i >= 0 && r.Method == http.MethodGet {
			reg.mu.Lock()
			reg.blobs[r.URL.Path[i+len("/blobs/"):]]++
			reg.mu.Unlock()
		}
		if f := reg.fault.Load(); f != nil && (*f)(w, r) {
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(reg.srv.Close)
	reg.host = strings.TrimPrefix(reg.srv.URL, "http://")
	return reg
}

func (reg *testRegistry) fetches(d v1.Hash) int {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	return reg.blobs[d.String()]
}

// push writes img as repo:latest and returns its pinned reference.
func (reg *testRegistry) push(t *testing.T, repo string, img v1.Image) string {
	t.Helper()
	tag, err := name.NewTag(reg.host + "/" + repo + ":latest")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tag, img); err != nil {
		t.Fatalf("pushing %s: %v", tag, err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return reg.host + "/" + repo + "@" + d.String()
}

// tarEntry is one entry of a layer a test builds.
type tarEntry = testimage.Entry

// layerOf builds a gzip layer of the entries.
func layerOf(t *testing.T, entries ...tarEntry) v1.Layer {
	t.Helper()
	l, err := testimage.Layer(entries...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// busyboxLayer is a layer of a static busybox alone (testimage.Busybox).
func busyboxLayer(t *testing.T, busybox string) v1.Layer {
	t.Helper()
	l, err := testimage.Busybox(busybox)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func imageOf(t *testing.T, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := testimage.Image(layers...)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// testCache is an image cache on dir, as a provider of installation and
// pool makes it, with the given image_max_bytes and image_cache_bytes.
func testCache(t *testing.T, dir string, maxBytes, budget int64, installation, pool string) *imageCache {
	t.Helper()
	c, err := newImageCache(dir, "", maxBytes, budget, installation+"-"+pool, filepath.Join(dir, "no-state-root"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("newImageCache: %v", err)
	}
	return c
}

// testStore is the entry of a pool's image ref (Config.Image) in a new
// cache on dir.
func testStore(t *testing.T, ref, cache, installation, pool string) *imageStore {
	t.Helper()
	s, err := testCache(t, cache, 0, 0, installation, pool).pin(ref)
	if err != nil {
		t.Fatalf("pin: %v", err)
	}
	return s
}

// cachedImages lists the completed and temporary image directories of a
// cache.
func cachedImages(t *testing.T, cache string) []string {
	t.Helper()
	entries, err := os.ReadDir(cache)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		switch e.Name() {
		case imageRefsDir, imageUsedDir, imageCellsDir, imagePullsDir:
			continue
		}
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out
}

// tree lists every path under root with its mode and size.
func tree(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.Walk(root, func(path string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if strings.HasPrefix(path, filepath.Join(root, "bin")+"/") {
			return nil // the applet links
		}
		fmt.Fprintf(&b, "%s %v %d; ", strings.TrimPrefix(path, root), fi.Mode(), fi.Size())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

func TestImagePullUnpacksOnceAndVerifies(t *testing.T) {
	t.Parallel()
	reg := newTestRegistry(t)
	img := imageOf(t, layerOf(t, tarEntry{Name: "etc/", Type: tar.TypeDir}, tarEntry{Name: "etc/hello", Body: "hi\n"}))
	ref := reg.push(t, "cell", img)
	cache := t.TempDir()
	ctx := context.Background()

	// Two pools of two installations, in parallel, on one cache: one
	// pull, one copy.
	a, b := testStore(t, ref, cache, "inst1", "a"), testStore(t, ref, cache, "inst2", "b")
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, s := range []*imageStore{a, b} {
		wg.Go(func() { errs[i] = s.prepare(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("prepare: %v", err)
	}
	if a.pulls+b.pulls != 1 {
		t.Errorf("%d pulls of one digest, want 1", a.pulls+b.pulls)
	}
	if got := cachedImages(t, cache); len(got) != 1 || got[0] != "sha256-"+strings.TrimPrefix(a.digest, "sha256:") {
		t.Errorf("cache holds %q, want the one image", got)
	}
	if b, err := os.ReadFile(filepath.Join(a.rootfs(), "etc", "hello")); err != nil || string(b) != "hi\n" {
		t.Errorf("unpacked etc/hello = %q, %v", b, err)
	}
	if a.rootfs() != b.rootfs() || inode(t, a.rootfs()) != inode(t, b.rootfs()) {
		t.Errorf("the two pools' roots differ: %s, %s", a.rootfs(), b.rootfs())
	}
	// A restarted provider finds it: no pull.
	c := testStore(t, ref, cache, "inst1", "a")
	if err := c.prepare(ctx); err != nil || c.pulls != 0 {
		t.Errorf("prepare after a restart: %v, %d pulls", err, c.pulls)
	}
}

func TestImageWrongBlobIsRefused(t *testing.T) {
	t.Parallel()
	reg := newTestRegistry(t)
	l := layerOf(t, tarEntry{Name: "file", Body: "the real content\n"})
	ref := reg.push(t, "cell", imageOf(t, l))
	ld, _ := l.Digest()
	rc, _ := l.Compressed()
	evil, _ := io.ReadAll(rc)
	rc.Close()
	evil[len(evil)/2] ^= 0xff // same size, another digest
	f := func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.HasSuffix(r.URL.Path, "/blobs/"+ld.String()) {
			return false
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", fmt.Sprint(len(evil)))
		_, _ = w.Write(evil)
		return true
	}
	reg.fault.Store(&f)
	cache := t.TempDir()
	s := testStore(t, ref, cache, "inst", "p")
	err := s.prepare(context.Background())
	if err == nil {
		t.Fatal("prepare accepted a blob whose digest is not the manifest's")
	}
	t.Logf("prepare: %v", err)
	assertNothingCached(t, cache)
	// During the back-off the same error comes back without a pull.
	before := reg.fetches(ld)
	if err2 := s.prepare(context.Background()); err2 == nil || reg.fetches(ld) != before {
		t.Errorf("prepare during the back-off: %v, %d more fetches", err2, reg.fetches(ld)-before)
	}
}

// assertNothingCached fails unless the cache holds no image and no blob.
func assertNothingCached(t *testing.T, cache string) {
	t.Helper()
	for _, d := range cachedImages(t, cache) {
		if strings.HasPrefix(d, "sha256-") || strings.HasPrefix(d, ".tmp-") {
			t.Errorf("cache holds %s after a refused pull", d)
		}
		if strings.HasPrefix(d, ".blobs-") {
			entries, _ := os.ReadDir(filepath.Join(cache, d))
			for _, e := range entries {
				t.Errorf("cache keeps blob %s after a refused pull", e.Name())
			}
		}
	}
}

func TestImageMissingDigest(t *testing.T) {
	t.Parallel()
	reg := newTestRegistry(t)
	reg.push(t, "cell", imageOf(t, layerOf(t, tarEntry{Name: "file", Body: "x"})))
	ref := reg.host + "/cell@sha256:" + strings.Repeat("ab", 32)
	cache := t.TempDir()
	s := testStore(t, ref, cache, "inst", "p")
	err := s.prepare(context.Background())
	if err == nil || !strings.Contains(err.Error(), "MANIFEST_UNKNOWN") && !strings.Contains(err.Error(), "manifest unknown") {
		t.Errorf("prepare of a digest the registry lacks: %v", err)
	}
	assertNothingCached(t, cache)
}

// TestImagePullResumesAfterRestart: a pull cut off in the middle of its
// second layer leaves no image; a new store (a restarted provider)
// completes it without fetching the verified first layer again.
func TestImagePullResumesAfterRestart(t *testing.T) {
	t.Parallel()
	reg := newTestRegistry(t)
	big := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB
	l1 := layerOf(t, tarEntry{Name: "one", Body: "first layer\n"})
	l2 := layerOf(t, tarEntry{Name: "two", Body: big})
	ref := reg.push(t, "cell", imageOf(t, l1, l2))
	d1, _ := l1.Digest()
	d2, _ := l2.Digest()
	var cut atomic.Bool
	cut.Store(true)
	f := func(w http.ResponseWriter, r *http.Request) bool {
		if !cut.Load() || !strings.HasSuffix(r.URL.Path, "/blobs/"+d2.String()) {
			return false
		}
		rc, _ := l2.Compressed()
		defer rc.Close()
		b, _ := io.ReadAll(rc)
		w.Header().Set("Content-Length", fmt.Sprint(len(b)))
		_, _ = w.Write(b[:len(b)/2])
		w.(http.Flusher).Flush()
		// Drop the connection halfway: the client sees a short body.
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
		return true
	}
	reg.fault.Store(&f)
	cache := t.TempDir()
	s := testStore(t, ref, cache, "inst", "p")
	if err := s.prepare(context.Background()); err == nil {
		t.Fatal("prepare succeeded over a cut connection")
	}
	for _, d := range cachedImages(t, cache) {
		if strings.HasPrefix(d, "sha256-") {
			t.Fatalf("an interrupted pull left image %s", d)
		}
	}
	cut.Store(false)
	restarted := testStore(t, ref, cache, "inst", "p")
	if err := restarted.prepare(context.Background()); err != nil {
		t.Fatalf("prepare after the restart: %v", err)
	}
	if got := reg.fetches(d1); got != 1 {
		t.Errorf("the verified first layer was fetched %d times, want once", got)
	}
	if b, err := os.ReadFile(filepath.Join(restarted.rootfs(), "two")); err != nil || string(b) != big {
		t.Errorf("the second layer after the resumed pull: %d bytes, %v", len(b), err)
	}
	for _, d := range cachedImages(t, cache) {
		if !strings.HasPrefix(d, "sha256-") {
			t.Errorf("the completed pull left %s behind", d)
		}
	}
}

// TestImageCollect: an image no installation references is removed once
// a pool moved on; one another installation references stays.
func TestImageCollect(t *testing.T) {
	t.Parallel()
	reg := newTestRegistry(t)
	ref1 := reg.push(t, "one", imageOf(t, layerOf(t, tarEntry{Name: "v", Body: "1"})))
	ref2 := reg.push(t, "two", imageOf(t, layerOf(t, tarEntry{Name: "v", Body: "2"})))
	ref3 := reg.push(t, "three", imageOf(t, layerOf(t, tarEntry{Name: "v", Body: "3"})))
	cache := t.TempDir()
	ctx := context.Background()
	old := testStore(t, ref1, cache, "inst", "p")
	other := testStore(t, ref2, cache, "inst2", "q") // another installation
	for _, s := range []*imageStore{old, other} {
		if err := s.prepare(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The pool is reconfigured to image three.
	moved := testStore(t, ref3, cache, "inst", "p")
	if err := moved.prepare(ctx); err != nil {
		t.Fatal(err)
	}
	if complete(old.dir(), old.digest) {
		t.Error("the image no pool references any more is still cached")
	}
	if !complete(other.dir(), other.digest) || !complete(moved.dir(), moved.digest) {
		t.Error("a referenced image was removed")
	}
	for _, d := range cachedImages(t, cache) {
		if strings.HasPrefix(d, ".trash-") {
			t.Errorf("collection left %s", d)
		}
	}
	// What a crashed pull of an unreferenced digest left goes too; that
	// of a referenced one stays (its pull resumes from it).
	gone := filepath.Join(cache, ".blobs-sha256-"+strings.Repeat("e", 64))
	kept := filepath.Join(cache, ".blobs-"+filepath.Base(other.dir()))
	for _, d := range []string{gone, kept} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := moved.c.collect(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(gone); err == nil {
		t.Error("the blobs of an unreferenced crashed pull were kept")
	}
	if _, err := os.Stat(kept); err != nil {
		t.Errorf("the blobs of a referenced image were removed: %v", err)
	}
	if fi, err := os.Stat(cache); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the cache is %v (%v), want 0700: it holds the images' set-id programs", fi.Mode(), err)
	}
}

func TestApplyLayerWhiteoutsAndEscapes(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	apply := func(l v1.Layer) error {
		return applyLayer(func() (io.ReadCloser, error) { return l.Uncompressed() }, root, &budget{left: DefaultImageMaxBytes, max: DefaultImageMaxBytes})
	}
	if err := apply(layerOf(t,
		tarEntry{Name: "a/", Type: tar.TypeDir}, tarEntry{Name: "a/keep", Body: "k"}, tarEntry{Name: "a/gone", Body: "g"},
		tarEntry{Name: "o/", Type: tar.TypeDir}, tarEntry{Name: "o/lower", Body: "l"},
		tarEntry{Name: "link", Type: tar.TypeSymlink, Link: "/etc"},
		tarEntry{Name: "hard", Type: tar.TypeLink, Link: "a/keep"})); err != nil {
		t.Fatalf("lower layer: %v", err)
	}
	if err := apply(layerOf(t,
		tarEntry{Name: "a/.wh.gone"},
		tarEntry{Name: "o/new", Body: "n"}, tarEntry{Name: "o/.wh..wh..opq"})); err != nil {
		t.Fatalf("upper layer: %v", err)
	}
	for path, want := range map[string]bool{"a/keep": true, "a/gone": false, "o/lower": false, "o/new": true, "o/.wh..wh..opq": false, "hard": true} {
		if _, err := os.Lstat(filepath.Join(root, path)); (err == nil) != want {
			t.Errorf("%s exists: %v, want %v", path, err == nil, want)
		}
	}
	outside := t.TempDir()
	for name, l := range map[string]v1.Layer{
		"dot-dot":          layerOf(t, tarEntry{Name: "../escape", Body: "x"}),
		"deep dot-dot":     layerOf(t, tarEntry{Name: "a/../../escape", Body: "x"}),
		"through symlink":  layerOf(t, tarEntry{Name: "link/passwd", Body: "x"}),
		"hard link out":    layerOf(t, tarEntry{Name: "h", Type: tar.TypeLink, Link: "../../etc/passwd"}),
		"symlink to outer": layerOf(t, tarEntry{Name: "out", Type: tar.TypeSymlink, Link: outside}, tarEntry{Name: "out/f", Body: "x"}),
	} {
		if err := apply(l); err == nil {
			t.Errorf("%s: applied", name)
		}
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("a layer wrote outside the root: %v", entries)
	}
	if _, err := os.Lstat(filepath.Join(filepath.Dir(root), "escape")); err == nil {
		t.Error("a layer wrote next to the root")
	}
}

// imageConfig is a test configuration whose cells run a busybox-static
// image pulled from a loopback registry into a private cache.
func imageConfig(t *testing.T, reg *testRegistry, busybox string) (Config, string) {
	t.Helper()
	cfg := testConfig(t)
	ref := reg.push(t, "busybox", imageOf(t, busyboxLayer(t, busybox)))
	cfg.Image, cfg.ImageCacheDir = ref, filepath.Join(filepath.Dir(cfg.StateDir), "images")
	d, _ := driver.PinnedDigest(ref)
	return cfg, d
}

// TestImageCells runs cells of a busybox-static image: the agent is their
// PID 1, the admitted digest is read back from what was mounted, each
// cell writes to its own layer in memory over the one shared copy, and
// another pool of the same image adds no copy.
func TestImageCells(t *testing.T) {
	requireRunsc(t)
	busybox := requireBusybox(t)
	t.Parallel()
	reg := newTestRegistry(t)
	cfg, digest := imageConfig(t, reg, busybox)
	p := newProvider(t, cfg)
	ctx := context.Background()
	// Prepare never waits: it starts the pull and says so, until done.
	if err := p.Prepare(ctx); err == nil || !strings.Contains(err.Error(), "is being pulled") {
		t.Fatalf("the first Prepare = %v, want the pull started", err)
	}
	for deadline := time.Now().Add(time.Minute); p.Prepare(ctx) != nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Prepare after a minute: %v", p.Prepare(ctx))
		}
	}
	lower := p.image.rootfs()
	lowerIno := inode(t, lower)
	before := tree(t, lower)
	a, b := provision(t, p), provision(t, p)
	for _, obj := range []driver.Object{a, b} {
		o, err := p.Inspect(ctx, obj)
		if err != nil || driver.Verify(obj, o, lease.GVisorLowerRisk) != nil || o.ImageDigest != digest {
			t.Fatalf("Inspect = %+v, %v; want verified with image %s", o, err, digest)
		}
	}
	ca, cb := activate(t, p, a), activate(t, p, b)
	if res := ca.run(t, "cat", "/proc/1/cmdline"); !strings.HasPrefix(string(res.Stdout), agentInCell+"\x00") {
		t.Errorf("PID 1 of the image's cell is %q, want the agent", res.Stdout)
	}
	if res := ca.run(t, "cat", "/etc/image-release"); string(res.Stdout) != "busybox test image\n" {
		t.Errorf("the image's file in the cell: %q (stderr %q)", res.Stdout, res.Stderr)
	}
	if res := ca.runAs(t, agent.UserRoot, "sh", "-c", "echo mine > /etc/written && rm /etc/image-release && cat /etc/written"); string(res.Stdout) != "mine\n" {
		t.Errorf("writing over the image as root: %q (stderr %q)", res.Stdout, res.Stderr)
	}
	if res := cb.run(t, "sh", "-c", "cat /etc/image-release; test -e /etc/written && echo leaked"); string(res.Stdout) != "busybox test image\n" {
		t.Errorf("the other cell sees %q (stderr %q), want the image untouched", res.Stdout, res.Stderr)
	}
	if _, err := os.Stat(filepath.Join(lower, "etc", "written")); err == nil {
		t.Error("a cell's write reached the shared image")
	}
	if _, err := os.Stat(filepath.Join(lower, "etc", "image-release")); err != nil {
		t.Errorf("a cell's delete reached the shared image: %v", err)
	}
	if after := tree(t, lower); after != before {
		t.Errorf("the shared image changed under its cells:\nbefore %s\nafter  %s", before, after)
	}

	// Another pool of the same image: no pull, no second copy.
	other := cfg
	other.Pool = "test-other"
	q := newProvider(t, other)
	if err := q.PullImage(ctx); err != nil || q.image.pulls != 0 {
		t.Fatalf("Prepare of a second pool: %v, %d pulls", err, q.image.pulls)
	}
	if q.image.rootfs() != lower || inode(t, q.image.rootfs()) != lowerIno {
		t.Errorf("the second pool mounts %s, not the one copy %s", q.image.rootfs(), lower)
	}
	provision(t, q)
	if got := cachedImages(t, cfg.ImageCacheDir); len(got) != 1 {
		t.Errorf("the cache holds %q after cells of two pools, want one image", got)
	}

	// The admitted digest is read back from the mounted directory: when
	// it no longer records the digest the cell was created with, the
	// provider reports none.
	df := filepath.Join(filepath.Dir(lower), imageDigestFile)
	if err := os.WriteFile(df, []byte("sha256:"+strings.Repeat("0", 64)+"\n"), 0o444); err != nil {
		t.Fatal(err)
	}
	o, err := p.Inspect(ctx, a)
	if err != nil || o.ImageDigest != "" {
		t.Errorf("Inspect of a cell whose mounted image records another digest = %+v, %v; want no image digest", o, err)
	}
	if err := os.WriteFile(df, []byte(digest+"\n"), 0o444); err != nil {
		t.Fatal(err)
	}
}

func TestImageConformance(t *testing.T) {
	requireRunsc(t)
	busybox := requireBusybox(t)
	t.Parallel()
	reg := newTestRegistry(t)
	cfg, _ := imageConfig(t, reg, busybox)
	drivertest.Run(t, harness{cfg: cfg})
}

// TestImageUnavailable: a provider whose image cannot be pulled fails
// Prepare and Provision, naming the image, and creates no container.
func TestImageUnavailable(t *testing.T) {
	requireRunsc(t)
	t.Parallel()
	reg := newTestRegistry(t)
	cfg := testConfig(t)
	cfg.Image = reg.host + "/absent@sha256:" + strings.Repeat("cd", 32)
	cfg.ImageCacheDir = filepath.Join(filepath.Dir(cfg.StateDir), "images")
	p := newProvider(t, cfg)
	if err := p.PullImage(context.Background()); err == nil || !strings.Contains(err.Error(), cfg.Image) {
		t.Errorf("PullImage = %v, want an error naming the image", err)
	}
	if err := p.Prepare(context.Background()); err == nil || !strings.Contains(err.Error(), "fetching the manifest") {
		t.Errorf("Prepare during the back-off = %v, want the pull's error", err)
	}
	_, err := p.Provision(context.Background(), driver.ProvisionRequest{CellID: uuid.Must(uuid.NewV7()), RuntimeClass: lease.GVisorLowerRisk})
	if err == nil {
		t.Error("Provision succeeded without the image")
	}
}

func TestImageConfigErrors(t *testing.T) {
	t.Parallel()
	for want, cfg := range map[string]Config{
		"setting image: image \"registry.example/cell:latest\" must be pinned by digest": {Image: "registry.example/cell:latest"},
		"settings image and rootfs exclude each other":                                   {Image: "registry.example/cell@sha256:" + strings.Repeat("ab", 32), RootFS: "/srv"},
		"setting registry_auth_file":                                                     {Image: "registry.example/cell@sha256:" + strings.Repeat("ab", 32), RegistryAuthFile: "/nonexistent/config.json"},
	} {
		cfg.StateDir, cfg.BundleDir = filepath.Join(t.TempDir(), "s"), filepath.Join(t.TempDir(), "b")
		cfg.Installation, cfg.AgentPath, cfg.ImageCacheDir = testInstallation, "/nonexistent-agent", t.TempDir()
		cfg.RunscPath = "/bin/true"
		if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("New = %v, want an error saying %q", err, want)
		}
	}
}

func TestRootImage(t *testing.T) {
	t.Parallel()
	hex := strings.Repeat("ab", 32)
	line := func(src, point, opts string) string {
		return "158 152 254:0 " + src + " " + point + " " + opts + " - ext4 /dev/vda rw\n"
	}
	agent := line("/root/.cache/sandboxwich/agent/sha256-"+strings.Repeat("0", 64)+"/sandboxwich-agent", "/.sandboxwich/agent", "ro,nosuid")
	for _, tc := range []struct {
		table, want string
		ok          bool
	}{
		{line("/var/cache/images/sha256-"+hex+"/rootfs", "/", "ro,nosuid,nodev,relatime") + agent, "sha256:" + hex, true},
		{line("/srv/my\\040cache/sha256-"+hex+"/rootfs", "/", "ro"), "sha256:" + hex, true},
		{line("/var/cache/images/sha256-"+hex+"/rootfs", "/", "rw,nosuid"), "", false},
		{line("/srv/rootfs", "/", "ro"), "", false},
		{line("/var/cache/images/sha256-"+hex[:10]+"/rootfs", "/", "ro"), "", false},
		{agent, "", false},
	} {
		got, why := rootImage([]byte(tc.table))
		if got != tc.want || (why == "") != tc.ok {
			t.Errorf("rootImage(%q) = %q, %q; want %q", tc.table, got, why, tc.want)
		}
	}
}

// TestImageIndexAndCrashedUnpack: a reference naming an index pulls the
// linux manifest of this architecture (the admitted digest stays the
// index's), and what a crash left (a half-unpacked temporary directory, a
// directory without its digest file) is never used: the pull redoes it.
func TestImageIndexAndCrashedUnpack(t *testing.T) {
	t.Parallel()
	reg := newTestRegistry(t)
	img := imageOf(t, layerOf(t, tarEntry{Name: "arch", Body: runtime.GOARCH}))
	other := imageOf(t, layerOf(t, tarEntry{Name: "arch", Body: "other"}))
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: other, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "riscv64"}}},
		mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: runtime.GOARCH}}})
	tag, err := name.NewTag(reg.host + "/multi:latest")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(tag, idx); err != nil {
		t.Fatal(err)
	}
	d, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	ref := reg.host + "/multi@" + d.String()
	cache := t.TempDir()
	s := testStore(t, ref, cache, "inst", "p")
	final := s.dir()
	// What a crash left: a half-unpacked temporary directory, and a
	// directory renamed without its digest file.
	for _, junk := range []string{filepath.Join(cache, ".tmp-"+filepath.Base(final), "rootfs", "arch"), filepath.Join(final, "rootfs", "arch")} {
		if err := os.MkdirAll(filepath.Dir(junk), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(junk, []byte("partial"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if complete(final, s.digest) {
		t.Fatal("a directory without its digest file counts as complete")
	}
	if err := s.prepare(context.Background()); err != nil {
		t.Fatalf("prepare of an index: %v", err)
	}
	if s.digest != d.String() {
		t.Errorf("admitted digest %s, want the index's %s", s.digest, d)
	}
	if b, err := os.ReadFile(filepath.Join(s.rootfs(), "arch")); err != nil || string(b) != runtime.GOARCH {
		t.Errorf("unpacked %q, %v; want this architecture's image", b, err)
	}
	for _, e := range cachedImages(t, cache) {
		if strings.HasPrefix(e, ".tmp-") {
			t.Errorf("the crashed unpack's %s is left", e)
		}
	}
}

// TestImageSizeCap: image_max_bytes bounds a pull's download by the
// manifest's sizes before it starts, holds each blob to its manifest
// size, and bounds what the layers unpack to (a decompression bomb); a
// refused pull leaves no image behind.
func TestImageSizeCap(t *testing.T) {
	t.Parallel()
	reg := newTestRegistry(t)
	bomb := layerOf(t, tarEntry{Name: "zeros", Body: strings.Repeat("\x00", 4<<20)})
	bombRef := reg.push(t, "bomb", imageOf(t, bomb))
	compressed, _ := bomb.Size()
	if compressed > 64<<10 {
		t.Fatalf("the bomb layer is %d bytes compressed", compressed)
	}
	store := func(ref string, max int64) (*imageStore, string) {
		cache := t.TempDir()
		s, err := testCache(t, cache, max, 0, "inst", "p").pin(ref)
		if err != nil {
			t.Fatal(err)
		}
		return s, cache
	}
	noImage := func(cache string) {
		t.Helper()
		for _, d := range cachedImages(t, cache) {
			if strings.HasPrefix(d, "sha256-") || strings.HasPrefix(d, ".tmp-") {
				t.Errorf("cache holds %s after a refused pull", d)
			}
		}
	}

	s, cache := store(bombRef, 1<<20) // far above the blob, far below what it unpacks to
	if err := s.ensure(context.Background()); err == nil || !strings.Contains(err.Error(), "unpacks to more than image_max_bytes") {
		t.Errorf("pull of a layer unpacking to 4 MiB under a 1 MiB cap: %v", err)
	}
	noImage(cache)
	s, _ = store(bombRef, 8<<20)
	if err := s.ensure(context.Background()); err != nil {
		t.Errorf("the same image under an 8 MiB cap: %v", err)
	}
	if !complete(s.dir(), s.digest) {
		t.Error("the image under an 8 MiB cap is not cached")
	}

	ld, _ := bomb.Digest()
	before := reg.fetches(ld)
	s, cache = store(bombRef, compressed-1)
	if err := s.ensure(context.Background()); err == nil || !strings.Contains(err.Error(), "compressed") {
		t.Errorf("pull of layers larger than the cap compressed: %v", err)
	}
	if n := reg.fetches(ld) - before; n != 0 {
		t.Errorf("the blob was fetched %d times although the manifest's size was over the cap", n)
	}
	noImage(cache)

	// A registry sending more than the manifest's size for a blob: only
	// the manifest's size is read (go-containerregistry stops there and
	// verifies the digest), so it cannot outgrow the budget.
	l := layerOf(t, tarEntry{Name: "file", Body: "content\n"})
	ref := reg.push(t, "long", imageOf(t, l))
	d, _ := l.Digest()
	rc, _ := l.Compressed()
	body, _ := io.ReadAll(rc)
	rc.Close()
	long := append(body, make([]byte, 1<<20)...)
	f := func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.HasSuffix(r.URL.Path, "/blobs/"+d.String()) {
			return false
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write(long)
		return true
	}
	reg.fault.Store(&f)
	s, _ = store(ref, 0)
	if err := s.ensure(context.Background()); err != nil {
		t.Fatalf("pull of a blob served with 1 MiB more than its manifest size: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(s.rootfs(), "file")); err != nil || string(b) != "content\n" {
		t.Errorf("unpacked %q, %v", b, err)
	}

	if _, err := newImageCache(t.TempDir(), "", -1, 0, "inst-p", "/s", slog.New(slog.DiscardHandler)); err == nil {
		t.Error("a negative image_max_bytes was accepted")
	}
	if _, err := newImageCache(t.TempDir(), "", 0, -1, "inst-p", "/s", slog.New(slog.DiscardHandler)); err == nil {
		t.Error("a negative image_cache_bytes was accepted")
	}
}

// hostPythonLayer is testimage.HostPython's layer. It fails the test
// under CI=true when the host has no python3 at /usr/bin.
func hostPythonLayer(t *testing.T) v1.Layer {
	t.Helper()
	l, err := testimage.HostPython()
	switch {
	case errors.Is(err, testimage.ErrNoPython) && os.Getenv("CI") != "true":
		t.Skip(err)
	case err != nil:
		t.Fatal(err)
	}
	return l
}

// TestImagePython runs a cell of an image of two layers, busybox-static
// and the host's python3 with its C library and standard library: a
// dynamically linked interpreter works in an image cell, under the agent.
func TestImagePython(t *testing.T) {
	requireRunsc(t)
	busybox := requireBusybox(t)
	t.Parallel()
	reg := newTestRegistry(t)
	cfg := testConfig(t)
	cfg.Image = reg.push(t, "python", imageOf(t, busyboxLayer(t, busybox), hostPythonLayer(t)))
	cfg.ImageCacheDir = filepath.Join(filepath.Dir(cfg.StateDir), "images")
	p := newProvider(t, cfg)
	if err := p.PullImage(context.Background()); err != nil {
		t.Fatal(err)
	}
	c := activate(t, p, provision(t, p))
	res := c.run(t, "python3", "-c", "import json, sys; print(json.dumps({'major': sys.version_info[0], 'prefix': sys.prefix}))")
	if res.ExitCode != 0 || strings.TrimSpace(string(res.Stdout)) != `{"major": 3, "prefix": "/usr"}` {
		t.Errorf("python3 in the image's cell: exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
}
