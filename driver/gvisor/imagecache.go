package gvisor

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/internal/imageref"
)

// The image cache's bookkeeping, beside the images (see "Cell images" in
// the package documentation).
const (
	// imageRefsDir holds one file per installation and pool naming the
	// digest of its Config.Image; neither the collector nor the budget
	// removes what one names.
	imageRefsDir = "refs"
	// imageUsedDir holds the last-used stamp of each image used on demand
	// (ProvisionRequest.Image, Prefetch): an empty file whose mtime is the
	// image's last use. The collector of unreferenced images leaves
	// stamped images to the budget.
	imageUsedDir = "used"
	// imageCellsDir holds one record per cell of an image, named by its
	// container ID and holding the digest and the cell's runsc state
	// root: written before the container is created, removed once its
	// deletion is proven. A record whose container has no state file is
	// what a crash left, removed when found.
	imageCellsDir = "cells"
	// imagePullsDir holds the bytes each pull in flight reserved under a
	// budget, valid while the puller holds the digest's lock.
	imagePullsDir = "pulls"
	// imageBudgetLock serializes the budget's decisions (eviction,
	// reservation, admission) across the processes sharing the cache.
	imageBudgetLock = "budget.lock"
	// imageCacheBytesSetting names Config.ImageCacheBytes in messages.
	imageCacheBytesSetting = "image_cache_bytes"
)

// imageCache is a provider's content-addressed image cache
// (Config.ImageCacheDir), shared on disk with every provider of any
// process and installation that names the same directory, and the state
// of each image reference this provider used (stores). It is safe for
// concurrent use.
type imageCache struct {
	dir string // absolute
	// refKey is this installation and pool's file in refs.
	refKey string
	// stateRoot is the runsc --root of this provider's containers, which
	// its cells' records name.
	stateRoot string
	keys      authn.Keychain
	// maxBytes bounds a pull's compressed blobs and its unpacked files,
	// each in total (Config.ImageMaxBytes).
	maxBytes int64
	// budget bounds the unpacked images together (Config.ImageCacheBytes);
	// 0 is unbounded.
	budget int64
	log    *slog.Logger
	// inUse lists the image digests of the containers under this
	// provider's state root, of any installation: what a running cell
	// mounts is never removed.
	inUse func(context.Context) (map[string]bool, error)
	// evictions counts the images this provider evicted for the budget.
	evictions atomic.Uint64

	mu     sync.Mutex
	opened bool
	// stores holds one entry per pinned reference, created on first use.
	stores map[string]*imageStore
	// pool is the entry of Config.Image, nil without it.
	pool *imageStore
}

// newImageCache checks the settings of an image cache. It touches no file:
// the directory is made when an image is first used (open).
func newImageCache(dir, authFile string, maxBytes, budget int64, refKey, stateRoot string, log *slog.Logger) (*imageCache, error) {
	switch {
	case maxBytes == 0:
		maxBytes = DefaultImageMaxBytes
	case maxBytes < 0:
		return nil, fmt.Errorf("gvisor: setting image_max_bytes: %d is negative", maxBytes)
	}
	if budget < 0 {
		return nil, fmt.Errorf("gvisor: setting %s: %d is negative", imageCacheBytesSetting, budget)
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("gvisor: image cache: %w", err)
	}
	keys := authn.Keychain(anonymous{})
	if authFile != "" {
		kc, err := fileKeychain(authFile)
		if err != nil {
			return nil, fmt.Errorf("gvisor: setting registry_auth_file: %w", err)
		}
		keys = kc
	}
	return &imageCache{dir: dir, refKey: refKey, stateRoot: stateRoot, keys: keys, maxBytes: maxBytes, budget: budget,
		log: log, stores: map[string]*imageStore{}}, nil
}

// openLocked makes the cache's directories, once; c.mu is held.
func (c *imageCache) openLocked() error {
	if c.opened {
		return nil
	}
	for _, d := range []string{imageRefsDir, imageUsedDir, imageCellsDir, imagePullsDir} {
		if err := os.MkdirAll(filepath.Join(c.dir, d), 0o700); err != nil {
			return err
		}
	}
	// Unpacked images keep their owners and modes, set-id programs
	// included: only the owner (root, as runsc needs) may enter the cache.
	if err := os.Chmod(c.dir, 0o700); err != nil {
		return err
	}
	c.opened = true
	return nil
}

// path is the cache directory of digest d ("sha256:<hex>").
func (c *imageCache) path(d string) string {
	return filepath.Join(c.dir, strings.Replace(d, ":", "-", 1))
}

// digestOfName returns the digest a cache entry's name ("sha256-<hex>")
// stands for.
func digestOfName(name string) (string, bool) {
	base, ok := strings.CutPrefix(name, "sha256-")
	if !ok || len(base) != 64 || strings.Trim(base, "0123456789abcdef") != "" {
		return "", false
	}
	return "sha256:" + base, true
}

// store returns the entry of ref, an image reference pinned by digest,
// creating it (and the cache's directories) on first use. A reference not
// pinned by digest is an *imageref.Error, and nothing is created.
func (c *imageCache) store(ref string) (*imageStore, error) {
	d, err := imageref.Parse(ref)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.stores[ref]; s != nil {
		return s, nil
	}
	if err := c.openLocked(); err != nil {
		return nil, fmt.Errorf("image cache: %w", err)
	}
	s := &imageStore{c: c, ref: d, digest: d.DigestStr(), sem: make(chan struct{}, 1)}
	c.stores[ref] = s
	return s, nil
}

// pin makes ref the pool's image (Config.Image) and records it in refs,
// so that no other installation's collector or budget removes it. It
// pulls nothing.
func (c *imageCache) pin(ref string) (*imageStore, error) {
	s, err := c.store(ref)
	if err != nil {
		return nil, fmt.Errorf("gvisor: setting image: %w", err)
	}
	c.mu.Lock()
	s.pool, c.pool = true, s
	c.mu.Unlock()
	if err := writeIfChanged(filepath.Join(c.dir, imageRefsDir, c.refKey), []byte(s.digest+"\n")); err != nil {
		return nil, fmt.Errorf("gvisor: image cache: recording the pool's image: %w", err)
	}
	return s, nil
}

// forget drops the entries of an evicted digest used on demand: the map
// holds only images that are or were recently cached.
func (c *imageCache) forget(d string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for ref, s := range c.stores {
		if s.digest == d && !s.pool {
			delete(c.stores, ref)
		}
	}
}

// touch stamps digest d as used now (its file in used).
func (c *imageCache) touch(d string) {
	path := filepath.Join(c.dir, imageUsedDir, filepath.Base(c.path(d)))
	now := time.Now()
	err := os.Chtimes(path, now, now)
	if errors.Is(err, fs.ErrNotExist) {
		var f *os.File
		if f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o600); err == nil {
			f.Close()
			err = os.Chtimes(path, now, now)
		}
	}
	if err != nil {
		c.log.Warn("image cache: stamping an image's last use", "digest", d, "error", err)
	}
}

// stamped reports whether digest d carries a last-used stamp: an image
// used on demand.
func (c *imageCache) stamped(d string) bool {
	_, err := os.Lstat(filepath.Join(c.dir, imageUsedDir, filepath.Base(c.path(d))))
	return err == nil
}

// lastUsed is digest d's last use: its stamp, else when it was unpacked.
func (c *imageCache) lastUsed(d string) time.Time {
	if fi, err := os.Stat(filepath.Join(c.dir, imageUsedDir, filepath.Base(c.path(d)))); err == nil {
		return fi.ModTime()
	}
	if fi, err := os.Stat(filepath.Join(c.path(d), imageDigestFile)); err == nil {
		return fi.ModTime()
	}
	return time.Time{}
}

// record notes that container id, under this provider's state root, is
// being made of image d; it is written before the container is created.
func (c *imageCache) record(id, d string) error {
	return writeIfChanged(filepath.Join(c.dir, imageCellsDir, id), []byte(d+"\n"+c.stateRoot+"\n"))
}

// unrecord removes container id's record, once its deletion is proven.
func (c *imageCache) unrecord(id string) error {
	err := os.Remove(filepath.Join(c.dir, imageCellsDir, id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// liveCells reports whether a cell of any installation or state root
// sharing the cache uses digest d: a record of d whose container still
// has a runsc state file. Records of d whose container has none are what
// a crash left, and are removed. The caller holds d's lock exclusively,
// so no provision of d is between its record and its container.
func (c *imageCache) liveCells(d string) (bool, error) {
	dir := filepath.Join(c.dir, imageCellsDir)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	live := false
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return false, err
		}
		f := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(f) != 2 || f[0] != d {
			continue
		}
		_, err = os.Lstat(stateFilePath(f[1], e.Name()))
		if !errors.Is(err, fs.ErrNotExist) {
			live = true // a container, or a state root that cannot be read: kept
			continue
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return false, err
		}
	}
	return live, nil
}

// references reads every installation and pool's recorded digest.
func (c *imageCache) references() (map[string]bool, error) {
	dir := filepath.Join(c.dir, imageRefsDir)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]bool{}, nil
	}
	if err != nil {
		return nil, err
	}
	refs := map[string]bool{}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Fields(string(b)) {
			refs[line] = true
		}
	}
	return refs, nil
}

// cachedEntry is one complete image of the cache.
type cachedEntry struct {
	digest, ref string
	bytes       int64
	used        time.Time
}

// images lists the complete images of the cache. An image unpacked before
// sizes were recorded is measured, and its size recorded.
func (c *imageCache) images(ctx context.Context) ([]cachedEntry, error) {
	entries, err := os.ReadDir(c.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []cachedEntry
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		d, ok := digestOfName(e.Name())
		if !ok || !e.IsDir() || !complete(c.path(d), d) {
			continue
		}
		n, err := c.size(c.path(d))
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed meanwhile
		}
		if err != nil {
			return nil, err
		}
		ref, _ := os.ReadFile(filepath.Join(c.path(d), imageRefFile))
		out = append(out, cachedEntry{digest: d, ref: strings.TrimSpace(string(ref)), bytes: n, used: c.lastUsed(d)})
	}
	return out, nil
}

// size returns the bytes an image directory takes on disk, as recorded
// when it was unpacked, or measured now (and recorded) for one unpacked
// before sizes were.
func (c *imageCache) size(dir string) (int64, error) {
	if b, err := os.ReadFile(filepath.Join(dir, imageSizeFile)); err == nil {
		if n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && n >= 0 {
			return n, nil
		}
	}
	n, err := diskUsage(dir)
	if err != nil {
		return 0, err
	}
	if err := writeIfChanged(filepath.Join(dir, imageSizeFile), []byte(strconv.FormatInt(n, 10)+"\n")); err != nil {
		c.log.Warn("image cache: recording an image's size", "dir", dir, "error", err)
	}
	return n, nil
}

// diskUsage is what the tree under root takes on disk: its blocks, each
// hard-linked file once.
func diskUsage(root string) (int64, error) {
	seen := map[[2]uint64]bool{}
	var n int64
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			n += fi.Size()
			return nil
		}
		if !fi.IsDir() && st.Nlink > 1 {
			k := [2]uint64{uint64(st.Dev), st.Ino}
			if seen[k] {
				return nil
			}
			seen[k] = true
		}
		n += st.Blocks * 512
		return nil
	})
	return n, err
}

// reserved is the bytes the pulls in flight other than exclude's reserved.
// A reservation whose digest lock is free is what a crashed pull left,
// and is removed.
func (c *imageCache) reserved(exclude string) (int64, error) {
	dir := filepath.Join(c.dir, imagePullsDir)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var n int64
	for _, e := range entries {
		d, ok := digestOfName(e.Name())
		if !ok || d == exclude {
			continue
		}
		path := filepath.Join(dir, e.Name())
		if unlock, ok := tryLockFile(c.path(d) + ".lock"); ok {
			err := os.Remove(path)
			unlock()
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return 0, err
			}
			continue
		}
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, err
		}
		if v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && v > 0 {
			n += v
		}
	}
	return n, nil
}

// ImageCacheFullError is the error of a pull that the image cache's
// budget (Config.ImageCacheBytes) has no room for, even after evicting
// every image it may evict: the rest is held by images that live cells
// use or pools reference (Config.Image), and by other pulls in flight.
// Nothing of the image is left in the cache. Provision, PullImage and
// Prefetch return it wrapped (errors.As finds it, and errors.Is matches
// driver.ErrImageCacheFull); it is not backed off
// like a registry failure, since room is made by cells that end. The
// pool reconciler records it as any failed provision (the pool's
// last_error, the member stopped provision_failed); a prefetch route
// reports it as failed with insufficient_storage.
type ImageCacheFullError struct {
	// Image is the reference that was to be pulled.
	Image string
	// Need is what the image needs in the cache, in bytes: its layers'
	// compressed size before its pull, what it unpacked to after (at
	// least Budget+1 when its unpack outgrew the whole budget).
	Need int64
	// Budget is Config.ImageCacheBytes.
	Budget int64
	// Held is the bytes of the cache that could not be evicted.
	Held int64
}

// Is makes the error match driver.ErrImageCacheFull.
func (e *ImageCacheFullError) Is(target error) bool { return target == driver.ErrImageCacheFull }

func (e *ImageCacheFullError) Error() string {
	if e.Need > e.Budget {
		return fmt.Sprintf("image %s needs more than the image cache's whole budget (%s %d bytes): not cached",
			e.Image, imageCacheBytesSetting, e.Budget)
	}
	return fmt.Sprintf("image %s needs %d bytes of the image cache, but %d of its %d bytes (%s) hold images in use by live cells, "+
		"referenced by pools or being pulled: not cached", e.Image, e.Need, e.Held, e.Budget, imageCacheBytesSetting)
}

// fullFor completes a budget's *ImageCacheFullError in err with the image
// and what it needs.
func fullFor(err error, s *imageStore, need int64) error {
	var full *ImageCacheFullError
	if errors.As(err, &full) {
		full.Image, full.Need = s.ref.String(), need
	}
	return err
}

// budgetExceeded returns the *ImageCacheFullError of an unpack that
// outgrew the whole budget, or nil for any other error.
func (c *imageCache) budgetExceeded(s *imageStore, err error) *ImageCacheFullError {
	var le *unpackLimitError
	if !errors.As(err, &le) || le.setting != imageCacheBytesSetting {
		return nil
	}
	s.need = c.budget + 1
	return &ImageCacheFullError{Image: s.ref.String(), Need: s.need, Budget: c.budget}
}

// evict removes the least recently used images until the cache's images
// and the other pulls' reservations take at most target bytes. It never
// removes exclude, an image a container under this state root mounts, a
// pool references or a live cell of any state root uses (remove checks
// the last two again under the image's lock), nor one it cannot lock
// (being pulled, or held by a provision). It returns an
// *ImageCacheFullError when the rest does not fit. The caller holds the
// budget lock.
func (c *imageCache) evict(ctx context.Context, target int64, exclude string) error {
	imgs, err := c.images(ctx)
	if err != nil {
		return err
	}
	total, err := c.reserved(exclude)
	if err != nil {
		return err
	}
	for _, e := range imgs {
		total += e.bytes
	}
	if total <= target {
		return nil
	}
	var inUse map[string]bool
	if c.inUse != nil {
		if inUse, err = c.inUse(ctx); err != nil {
			return fmt.Errorf("listing the images in use: %w", err)
		}
	}
	refs, err := c.references()
	if err != nil {
		return err
	}
	slices.SortFunc(imgs, func(a, b cachedEntry) int {
		return cmp.Or(a.used.Compare(b.used), strings.Compare(a.digest, b.digest))
	})
	var errs []error
	for _, e := range imgs {
		if total <= target {
			break
		}
		if e.digest == exclude || inUse[e.digest] || refs[e.digest] {
			continue
		}
		removed, err := c.remove(e.digest, inUse, "evicted for the budget: least recently used")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if removed {
			total -= e.bytes
			c.evictions.Add(1)
			c.forget(e.digest)
		}
	}
	if total > target {
		errs = append(errs, &ImageCacheFullError{Budget: c.budget, Held: total})
	}
	return errors.Join(errs...)
}

// reserve makes room for a pull of s expected to need need bytes and
// reserves them until the returned function runs (or admit completes the
// image).
func (c *imageCache) reserve(ctx context.Context, s *imageStore, need int64) (func(), error) {
	if need > c.budget {
		return nil, &ImageCacheFullError{Image: s.ref.String(), Need: need, Budget: c.budget}
	}
	unlock, err := lockFile(ctx, filepath.Join(c.dir, imageBudgetLock))
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := c.evict(ctx, c.budget-need, s.digest); err != nil {
		return nil, fullFor(err, s, need)
	}
	path := filepath.Join(c.dir, imagePullsDir, filepath.Base(s.dir()))
	if err := writeIfChanged(path, []byte(strconv.FormatInt(need, 10)+"\n")); err != nil {
		return nil, err
	}
	return func() { _ = os.Remove(path) }, nil
}

// admit completes an unpacked image in tmp and renames it into place at
// final: under a budget only when it fits, after evicting what it must
// (its size then replaces its reservation, under the budget lock). The
// digest file is written last: it marks the directory complete.
func (c *imageCache) admit(ctx context.Context, s *imageStore, tmp, final string) error {
	size, err := diskUsage(tmp)
	if err != nil {
		return err
	}
	if c.budget > 0 {
		if size > c.budget {
			s.need = size
			return &ImageCacheFullError{Image: s.ref.String(), Need: size, Budget: c.budget}
		}
		unlock, err := lockFile(ctx, filepath.Join(c.dir, imageBudgetLock))
		if err != nil {
			return err
		}
		defer unlock()
		if err := c.evict(ctx, c.budget-size, s.digest); err != nil {
			var full *ImageCacheFullError
			if errors.As(err, &full) {
				s.need = size
			}
			return fullFor(err, s, size)
		}
	}
	if err := writeSynced(filepath.Join(tmp, imageSizeFile), []byte(strconv.FormatInt(size, 10)+"\n")); err != nil {
		return err
	}
	if err := writeSynced(filepath.Join(tmp, imageDigestFile), []byte(s.digest+"\n")); err != nil {
		return err
	}
	if err := syncDir(tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, final); err != nil {
		return err
	}
	if err := syncDir(c.dir); err != nil {
		return err
	}
	if c.budget > 0 {
		_ = os.Remove(filepath.Join(c.dir, imagePullsDir, filepath.Base(final)))
	}
	return nil
}

// collect removes the cached images no installation and pool on the host
// references (refs), no live cell uses and no container of this state
// root mounts, except the images used on demand (stamped), which are the
// budget's to evict. Each removal holds the digest's lock and reads the
// references again under it, so an image a provider is about to use (its
// reference is written before it takes the lock) is never removed; the
// directory is renamed away first, so a half-removed image is never
// mistaken for a complete one.
func (c *imageCache) collect(ctx context.Context) error {
	entries, err := os.ReadDir(c.dir)
	if err != nil {
		return err
	}
	var inUse map[string]bool
	if c.inUse != nil {
		if inUse, err = c.inUse(ctx); err != nil {
			return err
		}
	}
	// An image's directory, or what a crashed pull or removal left of it.
	digests := map[string]bool{}
	for _, e := range entries {
		n := e.Name()
		for _, prefix := range []string{".tmp-", ".blobs-", ".trash-"} {
			n = strings.TrimPrefix(n, prefix)
		}
		if d, ok := digestOfName(n); ok && e.IsDir() {
			digests[d] = true
		}
	}
	var errs []error
	for d := range digests {
		if (c.pool != nil && d == c.pool.digest) || inUse[d] || (c.stamped(d) && complete(c.path(d), d)) {
			continue
		}
		if _, err := c.remove(d, inUse, "no pool references it"); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// remove deletes one image, and what crashed pulls left of it, under its
// lock, unless a pool references it, a container of this state root
// mounts it (inUse) or a live cell uses it. It reports whether a complete
// image was removed.
func (c *imageCache) remove(d string, inUse map[string]bool, why string) (bool, error) {
	dir := c.path(d)
	unlock, ok := tryLockFile(dir + ".lock")
	if !ok {
		return false, nil // being pulled, removed or provisioned from: not now
	}
	defer unlock()
	refs, err := c.references()
	if err != nil || refs[d] || inUse[d] {
		return false, err
	}
	if live, err := c.liveCells(d); err != nil || live {
		return false, err
	}
	base := filepath.Base(dir)
	trash := filepath.Join(c.dir, ".trash-"+base)
	if err := os.RemoveAll(trash); err != nil {
		return false, err
	}
	removed := false
	if err := os.Rename(dir, trash); err == nil {
		removed = true
		c.log.Info("image cache: removed an image", "digest", d, "reason", why)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return false, err
	}
	var errs []error
	for _, p := range []string{trash, filepath.Join(c.dir, ".tmp-"+base), filepath.Join(c.dir, ".blobs-"+base)} {
		errs = append(errs, os.RemoveAll(p))
	}
	for _, p := range []string{filepath.Join(c.dir, imageUsedDir, base), filepath.Join(c.dir, imagePullsDir, base)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return removed, errors.Join(errs...)
}

// Prefetch pulls image, an OCI reference pinned by digest, into the image
// cache without provisioning a cell (for POST /v1/images/prefetch, CONTRACT
// §21), within ctx, under the rules of a provision's pull: the budget
// (an *ImageCacheFullError when the image cannot fit; an image a live cell
// uses is never evicted), the back-off after a failed pull, and the image
// stamped as used now. A cached image is not pulled again; a reference not
// pinned by digest is refused before anything is pulled.
func (p *Provider) Prefetch(ctx context.Context, image string) error {
	s, err := p.images.store(image)
	if err != nil {
		return fmt.Errorf("gvisor: prefetch: %w", err)
	}
	if err := s.prepare(ctx); err != nil {
		return fmt.Errorf("gvisor: prefetch: %w", err)
	}
	if !s.pool {
		p.images.touch(s.digest)
	}
	return nil
}

// CachedImages lists the unpacked images of the image cache, of every
// installation and pool sharing it, the most recently used first. An
// image's Bytes is what it takes on disk, as measured when it was
// unpacked (what Config.ImageCacheBytes counts); its LastUsed is its last
// provision or prefetch on demand, else (a pool's Config.Image) when it
// was unpacked.
func (p *Provider) CachedImages(ctx context.Context) ([]driver.CachedImage, error) {
	imgs, err := p.images.images(ctx)
	if err != nil {
		return nil, fmt.Errorf("gvisor: image cache: %w", err)
	}
	out := make([]driver.CachedImage, len(imgs))
	for i, e := range imgs {
		out[i] = driver.CachedImage{Digest: e.digest, Reference: e.ref, Bytes: e.bytes, LastUsed: e.used}
	}
	slices.SortFunc(out, func(a, b driver.CachedImage) int {
		return cmp.Or(b.LastUsed.Compare(a.LastUsed), strings.Compare(a.Digest, b.Digest))
	})
	return out, nil
}

// CacheStats reports the bytes the image cache's unpacked images take (as
// driver.CachedImage.Bytes counts them, installation-wide) and how many images
// this provider evicted for the budget since it was made.
func (p *Provider) CacheStats(ctx context.Context) (bytes int64, evictions uint64, err error) {
	imgs, err := p.images.images(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("gvisor: image cache: %w", err)
	}
	for _, e := range imgs {
		bytes += e.bytes
	}
	return bytes, p.images.evictions.Load(), nil
}

// CacheID names the image cache: its absolute directory
// (Config.ImageCacheDir), which every provider sharing it names.
func (p *Provider) CacheID() string { return p.images.dir }
