// Package fakecache is the fake provider (driver/fake) made a
// driver.ImageCache over an image cache in memory, for the tests of
// prefetch, image listing, the inventory and the cache metrics where the
// driver's behaviour is not the point (driver/gvisor's tests, and the
// plane's over real gVisor providers, prove the real cache).
package fakecache

import (
	"context"
	"sync"
	"time"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/fake"
)

// Cache is an image cache in memory, which Providers of one ID share. It
// is safe for concurrent use.
type Cache struct {
	id     string
	mu     sync.Mutex
	images map[string]driver.CachedImage // by digest
}

// NewCache returns an empty cache whose CacheID is id.
func NewCache(id string) *Cache { return &Cache{id: id, images: map[string]driver.CachedImage{}} }

// Put caches ref, pinned by digest, as taking bytes, as if a pull had.
func (c *Cache) Put(ref string, bytes int64) {
	d, _ := driver.PinnedDigest(ref)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.images[d] = driver.CachedImage{Digest: d, Reference: ref, Bytes: bytes, LastUsed: time.Now()}
}

// Remove drops the image of ref's digest, as an eviction would.
func (c *Cache) Remove(ref string) {
	d, _ := driver.PinnedDigest(ref)
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.images, d)
}

// Provider is a fake provider (fake.New with driver.Apply: it serves
// image classes) whose image cache is a Cache. A prefetch "pulls" an image
// at once, taking Bytes, unless Fail says it fails or Hold holds it; it
// counts the prefetches of each image and the most that ran at once.
type Provider struct {
	*fake.Provider
	cache *Cache
	// Bytes is what a prefetched image takes (default 100).
	Bytes int64

	mu        sync.Mutex
	gate      chan struct{} // nil: no wait
	fails     map[string]error
	calls     map[string]int
	pulling   int
	most      int
	evictions uint64
}

var _ driver.ImageCache = (*Provider)(nil)

// New returns a Provider over cache.
func New(cache *Cache) *Provider {
	return &Provider{Provider: fake.New(fake.Config{Mode: driver.Apply}), cache: cache, Bytes: 100,
		fails: map[string]error{}, calls: map[string]int{}}
}

// Cache returns the provider's cache.
func (p *Provider) Cache() *Cache { return p.cache }

// Hold makes the prefetches that start from now on wait until release
// is called (or their context ends).
func (p *Provider) Hold() (release func()) {
	gate := make(chan struct{})
	p.mu.Lock()
	p.gate = gate
	p.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			p.mu.Lock()
			if p.gate == gate {
				p.gate = nil
			}
			p.mu.Unlock()
			close(gate)
		})
	}
}

// Fail makes the prefetches of image fail with err; nil lets them succeed.
func (p *Provider) Fail(image string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err == nil {
		delete(p.fails, image)
	} else {
		p.fails[image] = err
	}
}

// SetEvictions sets what CacheStats reports as the provider's evictions.
func (p *Provider) SetEvictions(n uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.evictions = n
}

// Calls returns the prefetches of each image so far and the most that
// ran at once.
func (p *Provider) Calls() (map[string]int, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	calls := make(map[string]int, len(p.calls))
	for k, v := range p.calls {
		calls[k] = v
	}
	return calls, p.most
}

// Prefetch implements driver.ImageCache.
func (p *Provider) Prefetch(ctx context.Context, image string) error {
	p.mu.Lock()
	p.calls[image]++
	p.pulling++
	p.most = max(p.most, p.pulling)
	gate := p.gate
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.pulling--
		p.mu.Unlock()
	}()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	p.mu.Lock()
	err, bytes := p.fails[image], p.Bytes
	p.mu.Unlock()
	if err != nil {
		return err
	}
	p.cache.Put(image, bytes)
	return nil
}

// CachedImages implements driver.ImageCache.
func (p *Provider) CachedImages(context.Context) ([]driver.CachedImage, error) {
	p.cache.mu.Lock()
	defer p.cache.mu.Unlock()
	out := make([]driver.CachedImage, 0, len(p.cache.images))
	for _, i := range p.cache.images {
		out = append(out, i)
	}
	return out, nil
}

// CacheStats implements driver.ImageCache: the cache's bytes and the
// evictions SetEvictions set.
func (p *Provider) CacheStats(ctx context.Context) (int64, uint64, error) {
	imgs, _ := p.CachedImages(ctx)
	var n int64
	for _, i := range imgs {
		n += i.Bytes
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return n, p.evictions, nil
}

// CacheID implements driver.ImageCache.
func (p *Provider) CacheID() string { return p.cache.id }
