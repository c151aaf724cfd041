package sandboxwich

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/pool"
)

// Images on demand, ahead of the claims (CONTRACT §21 "Prefetch"): a
// tenant names images its pool allows, the plane pulls them into the pool
// provider's image cache (driver.ImageCache) in the background, and the
// tenant reads each image's state. The cache is the truth of what is
// cached; the plane keeps only the states of its own recent prefetches,
// in memory, per replica.

// MaxPrefetchImages bounds the references of one prefetch, and the images
// a pool may have queued or pulling at once on one replica.
const MaxPrefetchImages = 1000

// PrefetchTimeout bounds one image's background pull.
const PrefetchTimeout = time.Hour

// prefetchForget is how long the plane remembers a finished prefetch
// (cached or failed); at most MaxPrefetchImages finished ones per pool are
// kept, the oldest forgotten first.
const prefetchForget = time.Hour

// ImagePhase is the state of an image of a prefetch or a listing.
type ImagePhase string

// Image states.
const (
	// ImageQueued: waiting for a pull slot (the pool's max_cold pulls run
	// at a time).
	ImageQueued ImagePhase = "queued"
	// ImagePulling: being pulled into the cache.
	ImagePulling ImagePhase = "pulling"
	// ImageCached: in the cache now.
	ImageCached ImagePhase = "cached"
	// ImageFailed: the last prefetch failed; Code says why.
	ImageFailed ImagePhase = "failed"
)

// Codes of a failed image (ImageState.Code).
const (
	// ImageCodeCacheFull: the image cache's budget has no room for the
	// image; the rest holds images in use by live cells, referenced by
	// pools or being pulled (driver.ErrImageCacheFull). Nothing was
	// evicted that a live cell uses.
	ImageCodeCacheFull = string(errcode.InsufficientStorage)
	// ImageCodePullFailed: the image could not be pulled (the registry
	// lacks it, refuses the server, or served content that failed
	// verification or exceeded the provider's limits; the server's log
	// says which).
	ImageCodePullFailed = "image_pull_failed"
)

// ErrNoImageCache is the cause (errors.Is) of the errcode.ErrInvalidRequest
// that Prefetch and Images return for a pool whose provider keeps no image
// cache (it is not a driver.ImageCache: a kubelet pulls a Kubernetes
// pool's images).
var ErrNoImageCache = errors.New("the pool's provider keeps no image cache")

// ImageState is one image of a prefetch or a listing of a pool's images.
type ImageState struct {
	// Image is the reference in canonical form, host/repo@sha256:<hex>
	// (pool.CanonicalImage).
	Image string
	State ImagePhase
	// Code and Message say why a failed image failed (ImageCodeCacheFull,
	// ImageCodePullFailed); "" otherwise.
	Code, Message string
	// Bytes is what a cached image takes in the cache; 0 otherwise.
	Bytes int64
}

// prefetcher holds the plane's prefetches, per pool.
type prefetcher struct {
	mu    sync.Mutex
	pools map[string]*prefetchPool
}

// prefetchPool is one pool's prefetches: its queue, its pulls in flight
// (running workers, at most the pool's max_cold) and the entries by image.
type prefetchPool struct {
	queue   []*prefetchEntry
	running int
	entries map[string]*prefetchEntry
}

// prefetchEntry is one image's latest prefetch.
type prefetchEntry struct {
	image         string
	digest        string
	state         ImagePhase
	code, message string
	done          time.Time // when it finished (cached or failed)
}

// poolOf returns the prefetches of a pool, made on first use; p.mu is
// held.
func (pf *prefetcher) poolOf(name string) *prefetchPool {
	if pf.pools == nil {
		pf.pools = map[string]*prefetchPool{}
	}
	pp := pf.pools[name]
	if pp == nil {
		pp = &prefetchPool{entries: map[string]*prefetchEntry{}}
		pf.pools[name] = pp
	}
	return pp
}

// forget drops the finished entries older than prefetchForget, and the
// oldest finished ones beyond MaxPrefetchImages; the prefetcher's mu is
// held.
func (pp *prefetchPool) forget(now time.Time) {
	var finished []*prefetchEntry
	for img, e := range pp.entries {
		switch {
		case e.state != ImageCached && e.state != ImageFailed:
		case now.Sub(e.done) > prefetchForget:
			delete(pp.entries, img)
		default:
			finished = append(finished, e)
		}
	}
	if len(finished) <= MaxPrefetchImages {
		return
	}
	slices.SortFunc(finished, func(a, b *prefetchEntry) int { return a.done.Compare(b.done) })
	for _, e := range finished[:len(finished)-MaxPrefetchImages] {
		delete(pp.entries, e.image)
	}
}

// inFlight counts the pool's images queued or pulling.
func (pp *prefetchPool) inFlight() int {
	n := 0
	for _, e := range pp.entries {
		if e.state == ImageQueued || e.state == ImagePulling {
			n++
		}
	}
	return n
}

// imageCachePool returns a pool of the tenant and its provider's image
// cache: an unknown or foreign pool is errcode.ErrNotFound, one whose
// provider keeps no image cache errcode.ErrInvalidRequest (ErrNoImageCache).
func (p *Plane) imageCachePool(tenantID, name string) (pool.Config, driver.ImageCache, error) {
	switch {
	case tenantID == "":
		return pool.Config{}, nil, errcode.New(errcode.InvalidRequest, "tenant is required")
	case name == "":
		return pool.Config{}, nil, errcode.New(errcode.InvalidRequest, "pool is required")
	}
	var cfg pool.Config
	found := false
	if p.pools != nil {
		cfg, found = p.pools.Pool(name)
	}
	if !found || cfg.TenantID != tenantID {
		return pool.Config{}, nil, errcode.New(errcode.NotFound, fmt.Sprintf("pool %q is not a pool of this tenant", name))
	}
	cache, ok := cfg.Provider.(driver.ImageCache)
	if !ok {
		return pool.Config{}, nil, errcode.Wrap(errcode.InvalidRequest, fmt.Sprintf(
			"pool %q has no image cache to prefetch into: its %s provider does not keep one (the gvisor driver does)",
			name, cfg.Provider.Capabilities().Kind), ErrNoImageCache)
	}
	return cfg, cache, nil
}

// cachedDigests reads an image cache: the bytes of each digest it holds.
func cachedDigests(ctx context.Context, cache driver.ImageCache) (map[string]int64, []driver.CachedImage, error) {
	imgs, err := cache.CachedImages(ctx)
	if err != nil {
		return nil, nil, err
	}
	byDigest := make(map[string]int64, len(imgs))
	for _, i := range imgs {
		byDigest[i.Digest] = i.Bytes
	}
	return byDigest, imgs, nil
}

// stateOf is an entry's state as a tenant sees it: cached whenever the
// cache holds its digest, whatever the entry says; an entry that cached
// its image, which was since evicted, is not shown (ok false).
func stateOf(e *prefetchEntry, cached map[string]int64) (ImageState, bool) {
	if n, ok := cached[e.digest]; ok {
		return ImageState{Image: e.image, State: ImageCached, Bytes: n}, true
	}
	if e.state == ImageCached {
		return ImageState{}, false
	}
	return ImageState{Image: e.image, State: e.state, Code: e.code, Message: e.message}, true
}

// Prefetch pulls images into the image cache of the tenant's pool in the
// background (CONTRACT §21 "Prefetch") and returns each image's state at
// once: one per distinct image, in canonical form (a tag beside the
// digest is dropped), in the order first named — cached when the cache
// holds its digest, else queued (or the state of a prefetch of it already
// in flight, which is not started twice). A cached image is prefetched
// too, which only marks it used now, so that the cache's budget evicts it
// last.
//
// The pool must be the tenant's (else errcode.ErrNotFound) and its
// provider a driver.ImageCache (else errcode.ErrInvalidRequest wrapping
// ErrNoImageCache); images lists 1 to MaxPrefetchImages references, each
// pinned by digest and allowed by the pool (pool.Config.Serves: an image
// class's images, or a fixed pool's own image), else
// errcode.ErrInvalidRequest or errcode.ErrImageNotAllowed, and nothing is
// started. A pool with MaxPrefetchImages images queued or pulling on this
// replica refuses more (errcode.ErrTooManyRequests).
//
// At most the pool's MaxProvisioning (an image class's max_cold) pulls
// run at a time. Each is the provider's Prefetch, bounded by
// PrefetchTimeout: it never exceeds the cache's budget and never evicts an
// image a live cell uses; an image it has no room for fails with
// ImageCodeCacheFull, any other failure with ImageCodePullFailed (the
// cause is logged). The states live in this replica's memory: finished
// ones are forgotten after an hour, or beyond MaxPrefetchImages per pool.
func (p *Plane) Prefetch(ctx context.Context, tenantID, poolName string, images []string) ([]ImageState, error) {
	if len(images) == 0 || len(images) > MaxPrefetchImages {
		return nil, errcode.New(errcode.InvalidRequest, "images must list 1 to "+strconv.Itoa(MaxPrefetchImages)+" references")
	}
	cfg, cache, err := p.imageCachePool(tenantID, poolName)
	if err != nil {
		return nil, err
	}
	var order []string
	digests := map[string]string{}
	for _, ref := range images {
		canonical, _, err := pool.CanonicalImage(ref)
		if err != nil {
			return nil, err
		}
		if !cfg.Serves(canonical) {
			return nil, errcode.New(errcode.ImageNotAllowed, fmt.Sprintf("pool %q does not allow the image %s", poolName, canonical))
		}
		if _, dup := digests[canonical]; !dup {
			d, _ := driver.PinnedDigest(canonical)
			digests[canonical] = d
			order = append(order, canonical)
		}
	}
	cached, _, err := cachedDigests(ctx, cache)
	if err != nil {
		return nil, errcode.Wrap(errcode.Internal, "read the image cache", err)
	}

	pf := &p.prefetch
	pf.mu.Lock()
	defer pf.mu.Unlock()
	pp := pf.poolOf(poolName)
	pp.forget(time.Now())
	fresh := 0
	for _, img := range order {
		if e := pp.entries[img]; e == nil || e.state == ImageCached || e.state == ImageFailed {
			fresh++
		}
	}
	if n := pp.inFlight(); n+fresh > MaxPrefetchImages {
		return nil, errcode.New(errcode.TooManyRequests, fmt.Sprintf(
			"pool %q has %d images queued or being pulled; at most %d at a time: wait for some to finish", poolName, n, MaxPrefetchImages))
	}
	out := make([]ImageState, 0, len(order))
	for _, img := range order {
		e := pp.entries[img]
		if e == nil || e.state == ImageCached || e.state == ImageFailed {
			e = &prefetchEntry{image: img, digest: digests[img], state: ImageQueued}
			pp.entries[img] = e
			pp.queue = append(pp.queue, e)
		}
		st, _ := stateOf(e, cached)
		out = append(out, st)
	}
	for limit := max(cfg.MaxProvisioning, 1); pp.running < limit && pp.running < len(pp.queue); pp.running++ {
		go p.prefetchWorker(poolName, pp, cache)
	}
	p.log.Info("images prefetch", "tenant", tenantID, "pool", poolName, "images", len(order), "queued", len(pp.queue))
	return out, nil
}

// prefetchWorker pulls the pool's queued images, one at a time, until its
// queue is empty.
func (p *Plane) prefetchWorker(poolName string, pp *prefetchPool, cache driver.ImageCache) {
	pf := &p.prefetch
	for {
		pf.mu.Lock()
		if len(pp.queue) == 0 {
			pp.running--
			pf.mu.Unlock()
			return
		}
		e := pp.queue[0]
		pp.queue[0] = nil
		pp.queue = pp.queue[1:]
		e.state = ImagePulling
		pf.mu.Unlock()

		ctx, cancel := context.WithTimeout(context.Background(), PrefetchTimeout)
		err := cache.Prefetch(ctx, e.image)
		cancel()

		pf.mu.Lock()
		e.done = time.Now()
		switch {
		case err == nil:
			e.state = ImageCached
		case errors.Is(err, driver.ErrImageCacheFull):
			e.state, e.code = ImageFailed, ImageCodeCacheFull
			e.message = "the image cache's budget has no room for the image: the rest holds images in use by live cells, " +
				"referenced by pools or being pulled (nothing a live cell uses is evicted); try again once cells have ended"
		default:
			e.state, e.code = ImageFailed, ImageCodePullFailed
			e.message = "the image could not be pulled: check that its registry serves it by this digest to the server " +
				"(the server's log says why)"
		}
		pf.mu.Unlock()
		if err != nil {
			p.log.Warn("image prefetch failed", "pool", poolName, "image", e.image, "code", e.code, "error", err)
		} else {
			p.log.Info("image prefetched", "pool", poolName, "image", e.image)
		}
	}
}

// Images lists the images of the tenant's pool (CONTRACT §21): the images
// of its provider's image cache that the pool allows (pool.Config.Serves;
// never another image, so never another tenant's unless the pool allows
// it), cached, and the images of this replica's recent prefetches for the
// pool that are not cached (queued, pulling or failed), sorted by image.
// The pool is checked as Prefetch checks it.
func (p *Plane) Images(ctx context.Context, tenantID, poolName string) ([]ImageState, error) {
	cfg, cache, err := p.imageCachePool(tenantID, poolName)
	if err != nil {
		return nil, err
	}
	cached, imgs, err := cachedDigests(ctx, cache)
	if err != nil {
		return nil, errcode.Wrap(errcode.Internal, "read the image cache", err)
	}
	states := map[string]ImageState{}
	for _, i := range imgs {
		canonical, _, err := pool.CanonicalImage(i.Reference)
		if err == nil && cfg.Serves(canonical) {
			states[canonical] = ImageState{Image: canonical, State: ImageCached, Bytes: i.Bytes}
		}
	}
	pf := &p.prefetch
	pf.mu.Lock()
	pp := pf.poolOf(poolName)
	pp.forget(time.Now())
	for img, e := range pp.entries {
		if st, ok := stateOf(e, cached); ok {
			states[img] = st
		}
	}
	pf.mu.Unlock()
	out := make([]ImageState, 0, len(states))
	for _, st := range states {
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b ImageState) int { return cmp.Compare(a.Image, b.Image) })
	return out, nil
}

// ImageCacheStats describes the image caches of the plane's pools
// (driver.ImageCache), installation-wide: every pool, of every tenant.
type ImageCacheStats struct {
	// Caches counts the distinct caches (driver.ImageCache.CacheID); 0
	// when no pool's provider keeps one.
	Caches int
	// Bytes is what the caches' images take, each cache counted once
	// however many pools share it.
	Bytes int64
	// Evictions counts the images the plane's providers evicted to keep
	// their caches within budget, since they were made; each provider is
	// counted once, however many pools share it.
	Evictions uint64
}

// ImageCacheStats reads the image caches of the plane's pools' providers
// (the sandboxwich_image_cache_* metrics).
func (p *Plane) ImageCacheStats(ctx context.Context) (ImageCacheStats, error) {
	var out ImageCacheStats
	if p.pools == nil {
		return out, nil
	}
	var seen []driver.ImageCache
	counted := map[string]bool{}
	for _, name := range p.pools.Names() {
		cfg, _ := p.pools.Pool(name)
		cache, ok := cfg.Provider.(driver.ImageCache)
		if !ok || slices.ContainsFunc(seen, func(c driver.ImageCache) bool { return sameProvider(c, cache) }) {
			continue
		}
		seen = append(seen, cache)
		bytes, evictions, err := cache.CacheStats(ctx)
		if err != nil {
			return ImageCacheStats{}, fmt.Errorf("pool %q: %w", name, err)
		}
		out.Evictions += evictions
		if id := cache.CacheID(); !counted[id] {
			counted[id] = true
			out.Caches++
			out.Bytes += bytes
		}
	}
	return out, nil
}

// sameProvider reports whether a and b are one provider: equal, where
// their type can be compared at all.
func sameProvider(a, b driver.ImageCache) bool {
	ta, tb := reflect.TypeOf(a), reflect.TypeOf(b)
	return ta == tb && ta.Comparable() && a == b
}
