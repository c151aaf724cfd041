package sandboxwich_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/internal/testenv"
	"github.com/sandboxwich/sandboxwich/internal/testenv/fakecache"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
)

// prefetchEnv is a plane with an image class "swe" of tenant acme
// (registry.test/swe/*, max_cold 2) over a fakecache.Provider; an image class
// "theirs" of tenant globex allowing the same repositories; and an image
// class "plain" of acme whose provider keeps no image cache.
func prefetchEnv(t *testing.T) (*env, *fakecache.Provider) {
	t.Helper()
	rel := newEnv(t).rel
	prov := fakecache.New(fakecache.NewCache("cache-1"))
	e := newEnv(t, sandboxwich.WithPools(
		pool.Config{Name: "swe", TenantID: "acme", Release: rel, Target: 4, MaxProvisioning: 2, Provider: prov,
			Images: []string{"registry.test/swe/*"}},
		pool.Config{Name: "theirs", TenantID: "globex", Release: rel, Target: 1, Provider: fakecache.New(fakecache.NewCache("cache-2")),
			Images: []string{"registry.test/swe/*"}},
		pool.Config{Name: "plain", TenantID: "acme", Release: rel, Target: 1, Provider: fake.New(fake.Config{Mode: driver.Apply}),
			Images: []string{"registry.test/plain/*"}}))
	return e, prov
}

// imagesOf lists a pool's images by image.
func (e *env) imagesOf(t *testing.T, tenant, poolName string) map[string]sandboxwich.ImageState {
	t.Helper()
	sts, err := e.plane.Images(e.ctx, tenant, poolName)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]sandboxwich.ImageState{}
	for _, st := range sts {
		out[st.Image] = st
	}
	return out
}

// TestPrefetchRefusals: a prefetch of no image or of more than 1000, to
// an unknown pool or another tenant's, to a pool whose provider keeps no
// image cache, or naming a tag or an image the pool does not allow, is
// refused with its code and starts nothing; listing refuses the same
// pools.
func TestPrefetchRefusals(t *testing.T) {
	e, prov := prefetchEnv(t)
	a, other := img("task-a", 'a'), "registry.test/other/x@sha256:"+strings.Repeat("1", 64)
	many := make([]string, sandboxwich.MaxPrefetchImages+1)
	for i := range many {
		many[i] = a
	}
	for _, tc := range []struct {
		name, tenant, pool string
		images             []string
		want               error
	}{
		{"no images", "acme", "swe", nil, errcode.ErrInvalidRequest},
		{"over 1000", "acme", "swe", many, errcode.ErrInvalidRequest},
		{"no pool", "acme", "", []string{a}, errcode.ErrInvalidRequest},
		{"unknown pool", "acme", "nope", []string{a}, errcode.ErrNotFound},
		{"another tenant's pool", "acme", "theirs", []string{a}, errcode.ErrNotFound},
		{"no image cache", "acme", "plain", []string{"registry.test/plain/x@sha256:" + strings.Repeat("2", 64)}, sandboxwich.ErrNoImageCache},
		{"an image the pool does not allow", "acme", "swe", []string{a, other}, errcode.ErrImageNotAllowed},
		{"a tag", "acme", "swe", []string{a, "registry.test/swe/task-a:latest"}, errcode.ErrImageNotAllowed},
		{"a malformed reference", "acme", "swe", []string{"swe/task-a@sha256:" + strings.Repeat("a", 64)}, errcode.ErrImageNotAllowed},
	} {
		_, err := e.plane.Prefetch(e.ctx, tc.tenant, tc.pool, tc.images)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if _, err := e.plane.Prefetch(e.ctx, "acme", "plain", []string{a}); !errors.Is(err, errcode.ErrInvalidRequest) {
		t.Errorf("no image cache: %v, want invalid_request", err)
	}
	for _, name := range []string{"nope", "theirs", "plain"} {
		if _, err := e.plane.Images(e.ctx, "acme", name); err == nil {
			t.Errorf("listing pool %s of acme: no error", name)
		}
	}
	if calls, _ := prov.Calls(); len(calls) != 0 {
		t.Errorf("refused prefetches started %v", calls)
	}
	if got := e.imagesOf(t, "acme", "swe"); len(got) != 0 {
		t.Errorf("after refused prefetches the pool lists %v", got)
	}
}

// TestPrefetchStates: a prefetch answers at once with one state per
// distinct image (canonical: a tag beside the digest is dropped), queued;
// at most max_cold pulls run at a time; an image in flight is not pulled
// twice; each image goes to cached. A full cache fails with
// insufficient_storage, any other failure with image_pull_failed, and a
// failed image is pulled again by the next prefetch. An image already
// cached answers cached at once. The listing shows the pool's images only.
func TestPrefetchStates(t *testing.T) {
	e, prov := prefetchEnv(t)
	release := prov.Hold()
	a, b, c := img("task-a", 'a'), img("task-b", 'b'), img("task-c", 'c')
	aTagged := "registry.test/swe/task-a:v1@sha256:" + strings.Repeat("a", 64)
	sts, err := e.plane.Prefetch(e.ctx, "acme", "swe", []string{a, b, c, aTagged})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, st := range sts {
		got = append(got, st.Image+" "+string(st.State))
	}
	if want := []string{a + " queued", b + " queued", c + " queued"}; !slices.Equal(got, want) {
		t.Errorf("prefetch answered %v, want %v", got, want)
	}
	waitFor(t, "two pulls", func() bool {
		n := 0
		for _, st := range e.imagesOf(t, "acme", "swe") {
			if st.State == sandboxwich.ImagePulling {
				n++
			}
		}
		return n == 2
	})
	if st := e.imagesOf(t, "acme", "swe"); len(st) != 3 {
		t.Errorf("while pulling the pool lists %v", st)
	}
	again, err := e.plane.Prefetch(e.ctx, "acme", "swe", []string{b})
	if err != nil || len(again) != 1 || again[0].State == sandboxwich.ImageCached || again[0].State == sandboxwich.ImageFailed {
		t.Errorf("prefetch of an image in flight: %+v, %v", again, err)
	}
	release()
	waitFor(t, "every image cached", func() bool {
		st := e.imagesOf(t, "acme", "swe")
		return len(st) == 3 && st[a].State == sandboxwich.ImageCached && st[b].State == sandboxwich.ImageCached &&
			st[c].State == sandboxwich.ImageCached
	})
	calls, most := prov.Calls()
	if most != 2 {
		t.Errorf("%d pulls ran at once, want max_cold (2)", most)
	}
	for _, ref := range []string{a, b, c} {
		if calls[ref] != 1 {
			t.Errorf("%s was pulled %d times, want once", ref, calls[ref])
		}
	}
	if st := e.imagesOf(t, "acme", "swe")[a]; st.Bytes != 100 || st.Code != "" {
		t.Errorf("cached image %+v", st)
	}

	// Failures, and a retry.
	full, missing := img("task-full", 'f'), img("task-missing", 'e')
	prov.Fail(full, fmt.Errorf("gvisor: prefetch: %w", driver.ErrImageCacheFull))
	prov.Fail(missing, errors.New("MANIFEST_UNKNOWN: manifest unknown"))
	sts, err = e.plane.Prefetch(e.ctx, "acme", "swe", []string{full, missing, a})
	if err != nil {
		t.Fatal(err)
	}
	if sts[2].State != sandboxwich.ImageCached || sts[2].Bytes != 100 {
		t.Errorf("prefetch of a cached image answered %+v, want cached", sts[2])
	}
	waitFor(t, "two failures", func() bool {
		st := e.imagesOf(t, "acme", "swe")
		return st[full].State == sandboxwich.ImageFailed && st[missing].State == sandboxwich.ImageFailed
	})
	st := e.imagesOf(t, "acme", "swe")
	if st[full].Code != "insufficient_storage" || st[full].Message == "" {
		t.Errorf("a full cache: %+v", st[full])
	}
	if st[missing].Code != sandboxwich.ImageCodePullFailed || strings.Contains(st[missing].Message, "MANIFEST") {
		t.Errorf("a failed pull: %+v (its cause is for the log only)", st[missing])
	}
	prov.Fail(missing, nil)
	if sts, err := e.plane.Prefetch(e.ctx, "acme", "swe", []string{missing}); err != nil || sts[0].State != sandboxwich.ImageQueued {
		t.Errorf("prefetch of a failed image: %+v, %v", sts, err)
	}
	waitFor(t, "the failed image cached on its retry", func() bool {
		return e.imagesOf(t, "acme", "swe")[missing].State == sandboxwich.ImageCached
	})

	// The listing shows only images the pool allows.
	prov.Cache().Put("registry.test/other/secret@sha256:"+strings.Repeat("9", 64), 7)
	for img := range e.imagesOf(t, "acme", "swe") {
		if !strings.HasPrefix(img, "registry.test/swe/") {
			t.Errorf("the pool lists %s, which it does not allow", img)
		}
	}
	if theirs := e.imagesOf(t, "globex", "theirs"); len(theirs) != 0 {
		t.Errorf("globex's pool (another cache) lists %v", theirs)
	}
}

// TestPrefetchQueueBound: a pool holds at most 1000 images queued or
// pulling; a prefetch beyond is too_many_requests and starts nothing.
func TestPrefetchQueueBound(t *testing.T) {
	e, prov := prefetchEnv(t)
	defer prov.Hold()()
	refs := make([]string, sandboxwich.MaxPrefetchImages)
	for i := range refs {
		refs[i] = fmt.Sprintf("registry.test/swe/t%d@sha256:%064x", i, i)
	}
	if _, err := e.plane.Prefetch(e.ctx, "acme", "swe", refs); err != nil {
		t.Fatal(err)
	}
	more := fmt.Sprintf("registry.test/swe/more@sha256:%064x", 5000)
	if _, err := e.plane.Prefetch(e.ctx, "acme", "swe", []string{more}); !errors.Is(err, errcode.ErrTooManyRequests) {
		t.Errorf("a prefetch beyond 1000 in flight: %v, want too_many_requests", err)
	}
	if _, ok := e.imagesOf(t, "acme", "swe")[more]; ok {
		t.Error("the refused image is listed")
	}
	// Images already in flight are no more.
	if _, err := e.plane.Prefetch(e.ctx, "acme", "swe", refs[:10]); err != nil {
		t.Errorf("a prefetch of images in flight: %v", err)
	}
}

// TestInventoryImageClass: the inventory entry of an image class's release
// adds its allowed repositories, the cached images it allows (never
// another), max_cells, max_cold and warm_per_image; a release without an
// image class adds nothing; an image class whose provider keeps no image
// cache has no cached count; another tenant sees none of it.
func TestInventoryImageClass(t *testing.T) {
	keys := testenv.Keyring(t)
	rel := testenv.Release(keys, lease.GVisorLowerRisk)
	signed := func(id string) lease.Release {
		r := rel
		r.ReleaseSetID = id
		r.Signature = keys.SignRelease(r)
		return r
	}
	other, plainRel := signed("other-release"), signed("plain-release")
	prov := fakecache.New(fakecache.NewCache("cache-1"))
	prov.Cache().Put(img("task-a", 'a'), 10)
	prov.Cache().Put("registry.test/swe/task-a2:v1@sha256:"+strings.Repeat("a", 64), 10) // the same digest
	prov.Cache().Put(img("task-b", 'b'), 10)
	prov.Cache().Put("registry.test/other/x@sha256:"+strings.Repeat("c", 64), 10)
	e := newEnv(t, sandboxwich.WithPools(
		pool.Config{Name: "swe", TenantID: "acme", Release: rel, Target: 4, MaxProvisioning: 2, WarmPerImage: 2,
			Provider: prov, Images: []string{"registry.test/swe/*"}},
		pool.Config{Name: "fixed", TenantID: "acme", Release: other, Target: 1, Provider: fake.New(fake.Config{})},
		pool.Config{Name: "plain", TenantID: "acme", Release: plainRel, Target: 3, Provider: fake.New(fake.Config{Mode: driver.Apply}),
			Images: []string{"registry.test/plain/*"}}))
	inv, err := e.plane.Inventory(e.ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	byRelease := map[string]sandboxwich.InventoryEntry{}
	for _, en := range inv {
		byRelease[en.ReleaseSetID] = en
	}
	if len(inv) != 3 {
		t.Fatalf("inventory %+v, want three releases", inv)
	}
	ic := byRelease[rel.ReleaseSetID].ImageClass
	if ic == nil || !slices.Equal(ic.Images, []string{"registry.test/swe/*"}) || ic.Cached == nil || *ic.Cached != 2 ||
		ic.MaxCells != 4 || ic.MaxCold != 2 || ic.WarmPerImage != 2 {
		t.Errorf("the image class's entry adds %+v, want its images, 2 cached, max_cells 4, max_cold 2, warm_per_image 2", ic)
	}
	if ic := byRelease[other.ReleaseSetID].ImageClass; ic != nil {
		t.Errorf("a fixed pool's release adds %+v", ic)
	}
	if ic := byRelease[plainRel.ReleaseSetID].ImageClass; ic == nil || ic.Cached != nil || ic.MaxCells != 3 || ic.MaxCold != 3 || ic.WarmPerImage != 1 {
		t.Errorf("an image class without an image cache adds %+v, want no cached count", ic)
	}
	inv, err = e.plane.Inventory(e.ctx, "globex")
	if err != nil || len(inv) != 0 {
		t.Errorf("globex's inventory: %+v, %v", inv, err)
	}
}

// TestImageCacheStats: the image caches' bytes count each cache once,
// however many pools' providers share it, and evictions count each
// provider once, however many pools it serves.
func TestImageCacheStats(t *testing.T) {
	rel := newEnv(t).rel
	shared, own := fakecache.NewCache("dir-1"), fakecache.NewCache("dir-2")
	shared.Put(img("task-a", 'a'), 1000)
	shared.Put(img("task-b", 'b'), 200)
	own.Put(img("task-c", 'c'), 30)
	p1, p2, p3 := fakecache.New(shared), fakecache.New(shared), fakecache.New(own)
	p1.SetEvictions(1)
	p2.SetEvictions(2)
	p3.SetEvictions(4)
	class := func(name string, prov driver.Provider) pool.Config {
		return pool.Config{Name: name, TenantID: "acme", Release: rel, Target: 1, Provider: prov, Images: []string{"registry.test/swe/*"}}
	}
	e := newEnv(t, sandboxwich.WithPools(class("a", p1), class("b", p2), class("c", p1), class("d", p3),
		pool.Config{Name: "fixed", TenantID: "acme", Release: rel, Target: 1, Provider: fake.New(fake.Config{})}))
	st, err := e.plane.ImageCacheStats(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := (sandboxwich.ImageCacheStats{Caches: 2, Bytes: 1230, Evictions: 7}); st != want {
		t.Errorf("ImageCacheStats %+v, want %+v", st, want)
	}
	none, err := newEnv(t).plane.ImageCacheStats(e.ctx)
	if err != nil || none != (sandboxwich.ImageCacheStats{}) {
		t.Errorf("a plane without pools: %+v, %v", none, err)
	}
}
