package gvisor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/docker/cli/cli/config"
	"github.com/docker/cli/cli/config/types"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	gcrtypes "github.com/google/go-containerregistry/pkg/v1/types"
)

// Cell images (see "Cell images" in the package documentation).
const (
	// imageDigestAnnotation records the digest of the image a container's
	// root was made from; Inspect compares it with the digest recorded in
	// the cache directory the container's spec mounts.
	imageDigestAnnotation = "dev.sandboxwich.image-digest"
	// imageRootFS and imageDigestFile are the unpacked root filesystem
	// and the digest it was unpacked from, inside an image's cache
	// directory <cache>/sha256-<hex>. imageSizeFile holds the bytes the
	// directory takes on disk, imageRefFile the reference it was pulled
	// by; both are written before the digest file.
	imageRootFS     = "rootfs"
	imageDigestFile = "digest"
	imageSizeFile   = "size"
	imageRefFile    = "reference"
	// imageRetryMin and imageRetryMax bound the back-off between failed
	// pulls.
	imageRetryMin = time.Second
	imageRetryMax = 5 * time.Minute
)

// DefaultImageMaxBytes is Config.ImageMaxBytes's default: 16 GiB, above
// the largest evaluation images in common use (SWE-bench's are a few GiB
// unpacked).
const DefaultImageMaxBytes int64 = 16 << 30

// imageCacheDir is the default content-addressed image cache:
// os.UserCacheDir()/sandboxwich/images, or, without a user cache
// directory, image-cache under the bundle directory (as the agent's).
func imageCacheDir(bundleDir string) string {
	dir, err := os.UserCacheDir()
	if err != nil {
		return filepath.Join(bundleDir, "image-cache")
	}
	return filepath.Join(dir, "sandboxwich", "images")
}

// imageStore is the state of one image reference pinned by digest in a
// provider's cache (imageCache.stores): it pulls the image into the shared
// cache, keeps it unpacked, and paces retries after a failure. The pool's
// image (Config.Image) is the entry marked pool; every other entry is an
// image used on demand (ProvisionRequest.Image, Prefetch). It is safe for
// concurrent use.
type imageStore struct {
	c      *imageCache
	ref    name.Digest
	digest string // "sha256:<hex>", the reference's
	// pool marks Config.Image's entry, recorded in refs; an entry used on
	// demand is not, and carries a last-used stamp instead.
	pool bool

	// pulling is set while a background pull (start) runs.
	pulling atomic.Bool
	// sem is held (one token) by the caller preparing the image: callers
	// in this process wait for one pull, within their own contexts.
	sem chan struct{}

	// Guarded by sem.
	ready   bool
	lastErr error
	retryAt time.Time
	backoff time.Duration
	// need is the bytes the image is expected to take in the cache: its
	// layers' compressed size, or what its last unpack measured when that
	// did not fit (the budget's estimate before a pull).
	need int64
	// pulls counts completed pulls (for tests).
	pulls int
}

// dir is the image's cache directory.
func (s *imageStore) dir() string { return s.c.path(s.digest) }

// rootfs is the image's unpacked root filesystem.
func (s *imageStore) rootfs() string { return filepath.Join(s.dir(), imageRootFS) }

// lock takes sem, or returns ctx's error.
func (s *imageStore) lock(ctx context.Context) (func(), error) {
	select {
	case s.sem <- struct{}{}:
		return func() { <-s.sem }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// prepare makes sure the image is unpacked in the cache, pulling it when
// it is not, within ctx, and paces retries after a failure: during the
// back-off it returns the last error at once. A pull the budget has no
// room for (*ImageCacheFullError) is not backed off: room is made by
// cells that end, not by waiting.
func (s *imageStore) prepare(ctx context.Context) error {
	unlock, err := s.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	if s.ready && complete(s.dir(), s.digest) {
		return nil
	}
	s.ready = false
	if s.lastErr != nil && time.Now().Before(s.retryAt) {
		return s.lastErr
	}
	err = s.ensure(ctx)
	var full *ImageCacheFullError
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return err // cut short, not failed: no back-off
	case errors.As(err, &full):
		s.c.log.Warn("cell image does not fit the image cache", "image", s.ref.String(), "error", err)
		return err
	default:
		s.backoff = min(max(2*s.backoff, imageRetryMin), imageRetryMax)
		s.retryAt = time.Now().Add(s.backoff)
		s.lastErr = fmt.Errorf("image %s: %w (next attempt in %s)", s.ref.String(), err, s.backoff)
		s.c.log.Warn("cell image not available", "image", s.ref.String(), "error", err, "retry_in", s.backoff)
		return s.lastErr
	}
	s.ready, s.lastErr, s.backoff = true, nil, 0
	if s.pool {
		if err := s.c.collect(ctx); err != nil {
			s.c.log.Warn("image cache: collecting unreferenced images", "error", err)
		}
	}
	return nil
}

// acquireAttempts bounds how often acquire pulls an image again that was
// evicted between its pull and the provision's lock.
const acquireAttempts = 3

// acquire makes sure the image is unpacked (prepare) and holds it for a
// provision until the returned function runs: a shared lock of its
// digest, which an eviction or a collection never takes from under it
// (they take the lock exclusively, and skip an image they cannot lock).
// An image used on demand gets its last-used stamp.
func (s *imageStore) acquire(ctx context.Context) (func(), error) {
	for attempt := 1; ; attempt++ {
		if err := s.prepare(ctx); err != nil {
			return nil, err
		}
		unlock, err := flockFile(ctx, s.dir()+".lock", syscall.LOCK_SH)
		if err != nil {
			return nil, err
		}
		if complete(s.dir(), s.digest) {
			if !s.pool {
				s.c.touch(s.digest)
			}
			return unlock, nil
		}
		unlock()
		if attempt == acquireAttempts {
			return nil, fmt.Errorf("image %s: evicted from the image cache right after each of %d pulls: the cache is too busy for its budget",
				s.ref.String(), attempt)
		}
	}
}

// imagePullTimeout bounds a background pull.
const imagePullTimeout = time.Hour

// start is prepare without waiting: when the image is ready it returns
// nil, during a back-off the last error; otherwise it starts a pull in the
// background (one at a time) and reports that the image is being pulled.
// The reconciler's pass never waits for a pull, so other pools and
// cleanups go on meanwhile.
func (s *imageStore) start() error {
	if !s.pulling.CompareAndSwap(false, true) {
		return fmt.Errorf("image %s is being pulled", s.ref.String())
	}
	select {
	case s.sem <- struct{}{}:
		ready := s.ready && complete(s.dir(), s.digest)
		backoff := s.lastErr != nil && time.Now().Before(s.retryAt)
		lastErr := s.lastErr
		<-s.sem
		switch {
		case ready:
			s.pulling.Store(false)
			return nil
		case backoff:
			s.pulling.Store(false)
			return lastErr
		}
	default:
	}
	go func() {
		defer s.pulling.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), imagePullTimeout)
		defer cancel()
		_ = s.prepare(ctx)
	}()
	return fmt.Errorf("image %s is being pulled", s.ref.String())
}

// complete reports whether dir is a completed unpack of digest d: only a
// renamed directory holding its digest file counts.
func complete(dir, d string) bool {
	b, err := os.ReadFile(filepath.Join(dir, imageDigestFile))
	return err == nil && strings.TrimSpace(string(b)) == d
}

// ensure pulls and unpacks the image unless a completed copy is cached.
// It holds the digest's file lock throughout, so concurrent providers, in
// this process or another, produce one copy; a crash leaves only a
// temporary directory, which the next attempt removes. Under a budget
// (Config.ImageCacheBytes) it makes room before the pull and admits the
// unpacked image only when it fits (imageCache.reserve, admit): an image
// that cannot fit leaves nothing behind.
func (s *imageStore) ensure(ctx context.Context) error {
	final := s.dir()
	if complete(final, s.digest) {
		// Cached: no need to wait for the lock, which provisions of the
		// image hold shared. (Should it be removed meanwhile, acquire
		// finds it incomplete under its own lock and pulls it again.)
		if !s.pool {
			s.c.touch(s.digest)
		}
		return nil
	}
	unlock, err := lockFile(ctx, final+".lock")
	if err != nil {
		return err
	}
	defer unlock()
	if !s.pool {
		// Stamped before it can be complete: the collector of
		// unreferenced images never takes an image used on demand.
		s.c.touch(s.digest)
	}
	if complete(final, s.digest) {
		return nil
	}
	// A directory without its digest file is not an image: left by
	// something else than a completed rename. Remove it.
	if err := os.RemoveAll(final); err != nil {
		return err
	}
	tmp := filepath.Join(s.c.dir, ".tmp-"+filepath.Base(final))
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	// Verified blobs of an interrupted pull are kept here and reused.
	blobs := filepath.Join(s.c.dir, ".blobs-"+filepath.Base(final))
	start := time.Now()
	var img v1.Image
	var layers []v1.Layer
	if s.c.budget > 0 {
		if s.need == 0 {
			var compressed int64
			if img, layers, compressed, err = s.fetch(ctx); err != nil {
				return err
			}
			s.need = max(compressed, 1)
		}
		release, err := s.c.reserve(ctx, s, s.need)
		if err != nil {
			return err
		}
		defer release()
	}
	if img == nil {
		if img, layers, _, err = s.fetch(ctx); err != nil {
			return err
		}
	}
	if err := s.unpack(ctx, img, layers, tmp, blobs); err != nil {
		_ = os.RemoveAll(tmp)
		if full := s.c.budgetExceeded(s, err); full != nil {
			_ = os.RemoveAll(blobs)
			return full
		}
		return err
	}
	if err := s.c.admit(ctx, s, tmp, final); err != nil {
		_ = os.RemoveAll(tmp)
		var full *ImageCacheFullError
		if errors.As(err, &full) {
			_ = os.RemoveAll(blobs)
		}
		return err
	}
	_ = os.RemoveAll(blobs)
	s.pulls++
	s.c.log.Info("cell image pulled and unpacked", "image", s.ref.String(), "duration", time.Since(start))
	return nil
}

// Layer media types the driver unpacks: tar archives, plain, gzip or
// zstd compressed.
var layerTypes = []gcrtypes.MediaType{
	gcrtypes.OCILayer, gcrtypes.OCIUncompressedLayer, gcrtypes.OCILayerZStd,
	gcrtypes.DockerLayer, gcrtypes.DockerUncompressedLayer,
}

// fetch reads the image by digest: the manifest (and, for an index, the
// linux manifest of this architecture) verified against the reference's
// digest, and the configuration. It returns the image, its layers and
// their compressed size, which the manifest states and image_max_bytes
// bounds before any layer is fetched.
func (s *imageStore) fetch(ctx context.Context) (v1.Image, []v1.Layer, int64, error) {
	img, err := remote.Image(s.ref, remote.WithContext(ctx), remote.WithAuthFromKeychain(s.c.keys),
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}))
	if err != nil {
		return nil, nil, 0, fmt.Errorf("fetching the manifest: %w", err)
	}
	// remote.Image checked the manifest (or index) against the reference's
	// digest; an index's child was checked against the index's entry.
	layers, err := img.Layers()
	if err != nil {
		return nil, nil, 0, fmt.Errorf("reading the layers: %w", err)
	}
	if _, err := img.RawConfigFile(); err != nil { // fetched and verified by digest
		return nil, nil, 0, fmt.Errorf("fetching the image configuration: %w", err)
	}
	// The manifest's sizes bound the download before any of it starts
	// (each blob is read up to its size alone), and the unpack's budget
	// bounds what the blobs expand to.
	var compressed int64
	for i, l := range layers {
		n, err := l.Size()
		if err != nil {
			return nil, nil, 0, fmt.Errorf("layer %d: %w", i, err)
		}
		if compressed += n; n < 0 || compressed > s.c.maxBytes {
			return nil, nil, 0, fmt.Errorf("the image's layers are more than image_max_bytes (%d bytes) compressed: refused", s.c.maxBytes)
		}
	}
	return img, layers, compressed, nil
}

// unpack fetches every layer blob of img into blobs, verified against its
// digest in the manifest before it is unpacked, unpacks the layers into
// dir/rootfs, and writes the manifest and the reference beside it. The
// directory is not complete until admit writes its digest file. What the
// layers unpack to is bounded by image_max_bytes, and by the cache's
// budget when that is smaller.
func (s *imageStore) unpack(ctx context.Context, img v1.Image, layers []v1.Layer, dir, blobs string) error {
	manifest, err := img.RawManifest()
	if err != nil {
		return fmt.Errorf("reading the manifest: %w", err)
	}
	if err := os.MkdirAll(blobs, 0o700); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(dir, imageRootFS), 0o755); err != nil {
		return err
	}
	if err := os.Chmod(filepath.Join(dir, imageRootFS), 0o755); err != nil {
		return err
	}
	unpacked := &budget{left: s.c.maxBytes, max: s.c.maxBytes}
	if b := s.c.budget; b > 0 && b < s.c.maxBytes {
		unpacked = &budget{left: b, max: b, setting: imageCacheBytesSetting}
	}
	for i, l := range layers {
		mt, err := l.MediaType()
		if err != nil {
			return fmt.Errorf("layer %d: %w", i, err)
		}
		if !slices.Contains(layerTypes, mt) {
			return fmt.Errorf("layer %d: media type %q is not a tar layer this driver unpacks", i, mt)
		}
		h, err := l.Digest()
		if err != nil {
			return fmt.Errorf("layer %d: %w", i, err)
		}
		path, err := fetchBlob(ctx, l, h, blobs)
		if err != nil {
			return fmt.Errorf("layer %d (%s): %w", i, h, err)
		}
		if err := unpackLayer(path, filepath.Join(dir, imageRootFS), unpacked); err != nil {
			return fmt.Errorf("layer %d (%s): %w", i, h, err)
		}
	}
	if err := addMountPoints(filepath.Join(dir, imageRootFS)); err != nil {
		return fmt.Errorf("adding the cells' mount points: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "manifest.json"), manifest, 0o444); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, imageRefFile), []byte(s.ref.String()+"\n"), 0o444)
}

// Mount points of every cell's spec, made in an unpacked image before it
// is complete: runsc would otherwise create the missing ones of bind
// mounts in the shared directory itself, under running cells.
var (
	mountPointDirs  = []string{"proc", "dev", "sys", "tmp", "var/tmp", "home/cell", "run/sandboxwich", ".sandboxwich"}
	mountPointFiles = []string{".sandboxwich/agent"}
)

// addMountPoints creates the missing mount points in root. What the image
// has at a mount point's path (a directory, or a symlink such as /run ->
// /var/run) is left as it is.
func addMountPoints(root string) error {
	mk := func(rel string, dir bool) error {
		target, err := resolve(root, rel, true)
		if err != nil {
			return nil // behind a symlink of the image: left to runsc
		}
		if _, err := os.Lstat(target); err == nil {
			return nil
		}
		if dir {
			return os.Mkdir(target, 0o755)
		}
		return os.WriteFile(target, nil, 0o444)
	}
	for _, d := range mountPointDirs {
		if err := mk(d, true); err != nil {
			return err
		}
	}
	for _, f := range mountPointFiles {
		if err := mk(f, false); err != nil {
			return err
		}
	}
	return nil
}

// fetchBlob downloads a layer's compressed blob into blobs unless a
// verified copy is there, hashing what it writes: a blob whose SHA-256 is
// not its digest is refused and nothing of it kept.
func fetchBlob(ctx context.Context, l v1.Layer, h v1.Hash, blobs string) (string, error) {
	if h.Algorithm != "sha256" || len(h.Hex) != 64 {
		return "", fmt.Errorf("digest %s is not SHA-256", h)
	}
	path := filepath.Join(blobs, "sha256-"+h.Hex)
	if got, err := fileDigest(path); err == nil && got == h.Hex {
		return path, nil
	}
	// go-containerregistry reads at most the manifest's size of a blob
	// (and verifies its digest), so a registry cannot make this copy
	// longer than the pull's budget allowed.
	rc, err := l.Compressed()
	if err != nil {
		return "", fmt.Errorf("fetching: %w", err)
	}
	defer rc.Close()
	f, err := os.CreateTemp(blobs, ".part-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	sum := sha256.New()
	_, err = io.Copy(io.MultiWriter(f, sum), ctxReader{ctx, rc})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("fetching: %w", err)
	}
	if got := hex.EncodeToString(sum.Sum(nil)); got != h.Hex {
		return "", fmt.Errorf("the registry served a blob of digest sha256:%s: refused", got)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return "", err
	}
	return path, nil
}

// ctxReader stops a copy when ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// unpackLayer applies a verified layer blob to root: first its whiteouts
// (which remove what lower layers put there), then its entries.
func unpackLayer(blob, root string, b *budget) error {
	layer, err := tarball.LayerFromFile(blob)
	if err != nil {
		return err
	}
	open := func() (io.ReadCloser, error) { return layer.Uncompressed() }
	return applyLayer(open, root, b)
}

// syncDir fsyncs a directory, making a rename in it durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// writeSynced writes a world-readable file and fsyncs it.
func writeSynced(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o444)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if serr := f.Sync(); err == nil {
		err = serr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// lockFile takes an exclusive flock on path, created if needed, polling
// until ctx ends. The lock is released when the returned function runs or
// the process dies.
func lockFile(ctx context.Context, path string) (func(), error) {
	return flockFile(ctx, path, syscall.LOCK_EX)
}

// flockFile takes a flock of kind how (syscall.LOCK_EX or LOCK_SH) on
// path, as lockFile does.
func flockFile(ctx context.Context, path string, how int) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB)
		if err == nil {
			return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// tryLockFile takes the exclusive lock only when it is free: no other
// holder, exclusive or shared.
func tryLockFile(path string) (func(), bool) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, false
	}
	if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
		f.Close()
		return nil, false
	}
	return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, true
}

// mountedImage reads back the image a running container's root really is:
// the mount table of the container's gofer (the runsc process that serves
// the root to the sandbox), whose root mount must be a read-only mount of
// an unpacked image, <cache>/sha256-<hex>/rootfs. That digest must be
// the one annotated at creation and, in this provider's cache, the one
// the directory records as unpacked. It returns "" and why otherwise.
func (p *Provider) mountedImage(st *containerState) (string, string) {
	want := st.Annotations[imageDigestAnnotation]
	if want == "" {
		return "", ""
	}
	if st.Status != statusRunning {
		return "", "the container is not running"
	}
	pid, ok := p.goferOf(st)
	if !ok {
		return "", "no gofer process of the container"
	}
	raw, err := os.ReadFile(filepath.Join(p.procRoot, strconv.Itoa(pid), "mountinfo"))
	if err != nil {
		return "", "the gofer's mount table cannot be read"
	}
	got, why := rootImage(raw)
	switch {
	case why != "":
		return "", why
	case got != want:
		return "", "the container's root is another image than it was created with"
	}
	if !complete(p.images.path(got), got) {
		return "", "the mounted image directory does not record its digest"
	}
	return got, ""
}

// rootImage finds the root mount ("/") in a mountinfo table and returns the
// digest of the unpacked image it mounts, which must be mounted
// read-only.
func rootImage(mountinfo []byte) (string, string) {
	for _, line := range strings.Split(string(mountinfo), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || f[4] != "/" {
			continue
		}
		src := unescapeMount(f[3])
		if filepath.Base(src) != imageRootFS {
			return "", "the container's root is not an unpacked image"
		}
		base, ok := strings.CutPrefix(filepath.Base(filepath.Dir(src)), "sha256-")
		if !ok || len(base) != 64 || strings.Trim(base, "0123456789abcdef") != "" {
			return "", "the container's root is not an unpacked image"
		}
		if !slices.Contains(strings.Split(f[5], ","), "ro") {
			return "", "the container's image is mounted writable"
		}
		return "sha256:" + base, ""
	}
	return "", "the gofer's mount table has no root mount"
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// goferOf returns the host pid of a container's gofer, remembered per
// container identity and checked again at each use.
func (p *Provider) goferOf(st *containerState) (int, bool) {
	identity := identityOf(st)
	bundle := p.bundlePath(st.ID)
	isGofer := func(argv []string) bool {
		return len(argv) > 0 && filepath.Base(argv[0]) == "runsc-gofer" && belongs(argv, p.r.root, st.ID, bundle)
	}
	if v, ok := p.gofers.Load(identity); ok {
		pid := v.(int)
		raw, err := os.ReadFile(filepath.Join(p.procRoot, strconv.Itoa(pid), "cmdline"))
		if err == nil && isGofer(strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")) {
			return pid, true
		}
		p.gofers.Delete(identity)
	}
	procs, err := containerProcesses(p.procRoot, p.r.root, st.ID, bundle)
	if err != nil {
		return 0, false
	}
	for _, pr := range procs {
		if isGofer(pr.argv) {
			p.gofers.Store(identity, pr.pid)
			return pr.pid, true
		}
	}
	return 0, false
}

// imageDetail is what an observation's detail says of an image read-back
// that failed.
func imageDetail(why string) string {
	if why == "" {
		return ""
	}
	return "; no admitted image: " + why
}

// anonymous is the keychain without a credentials file.
type anonymous struct{}

func (anonymous) Resolve(authn.Resource) (authn.Authenticator, error) { return authn.Anonymous, nil }

// fileKeychain reads registry credentials from a Docker config.json
// (setting registry_auth_file). The file is read at each pull, so a
// rotated credential is used without a restart; its content is never
// logged, and never reaches a cell.
func fileKeychain(path string) (authn.Keychain, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	kc := &configKeychain{path: abs}
	if _, err := kc.load(); err != nil {
		return nil, err
	}
	return kc, nil
}

type configKeychain struct{ path string }

func (k *configKeychain) load() (map[string]types.AuthConfig, error) {
	f, err := os.Open(k.path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cf, err := config.LoadFromReader(f)
	if err != nil {
		return nil, fmt.Errorf("%s is not a Docker config file: %w", k.path, err)
	}
	return cf.GetAuthConfigs(), nil
}

// Resolve implements authn.Keychain: the credentials of the registry's
// entry in the file's auths (credential helpers are not run).
func (k *configKeychain) Resolve(target authn.Resource) (authn.Authenticator, error) {
	auths, err := k.load()
	if err != nil {
		return nil, err
	}
	for _, key := range []string{target.String(), target.RegistryStr(), "https://" + target.RegistryStr()} {
		if key == name.DefaultRegistry {
			key = authn.DefaultAuthKey
		}
		if c, ok := auths[key]; ok && (c.Auth != "" || c.Username != "" || c.IdentityToken != "" || c.RegistryToken != "") {
			return authn.FromConfig(authn.AuthConfig{Username: c.Username, Password: c.Password, Auth: c.Auth,
				IdentityToken: c.IdentityToken, RegistryToken: c.RegistryToken}), nil
		}
	}
	return authn.Anonymous, nil
}
