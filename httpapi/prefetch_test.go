package httpapi

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/internal/testenv/fakecache"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
	"github.com/sandboxwich/sandboxwich/wire"
)

// testImage is an image of registry.test/swe pinned by a digest of c.
func testImage(name string, c byte) string {
	return "registry.test/swe/" + name + "@sha256:" + strings.Repeat(string(c), 64)
}

// imagesEnv is a server whose plane has acme's image class "swe"
// (registry.test/swe/*, max_cells 3, max_cold 2) and globex's image class
// "theirs" (registry.test/theirs/*) over fakecache providers sharing one
// cache, and acme's fixed pool "fixed" on a provider without an image
// cache. The prefetch routes read no store, so one backend serves.
func imagesEnv(t *testing.T) (*env, *fakecache.Provider, *fakecache.Provider) {
	t.Helper()
	rel := signedRelease(t, lease.GVisorLowerRisk)
	cache := fakecache.NewCache("images")
	swe, theirs := fakecache.New(cache), fakecache.New(cache)
	e := newEnvWith(t, backends[0], []sandboxwich.Option{sandboxwich.WithPools(
		pool.Config{Name: "swe", TenantID: "acme", Release: rel, Target: 3, MaxProvisioning: 2, Provider: swe,
			Images: []string{"registry.test/swe/*"}},
		pool.Config{Name: "theirs", TenantID: "globex", Release: rel, Target: 1, Provider: theirs,
			Images: []string{"registry.test/theirs/*"}},
		pool.Config{Name: "fixed", TenantID: "acme", Release: rel, Target: 1, Provider: fake.New(fake.Config{})},
	)})
	return e, swe, theirs
}

// images lists a pool's images through GET /v1/images, checking the
// answer's schema.
func (e *env) images(token, poolName string) map[string]wire.ImageState {
	e.t.Helper()
	r := e.do("GET", "/v1/images?pool="+poolName, token, nil).must(e.t, 200)
	checkSchema(e.t, "ImagesResponse", r.body)
	resp := decodeAs[wire.ImagesResponse](e.t, r)
	if !resp.OK || resp.Pool != poolName {
		e.t.Fatalf("GET /v1/images: %s", r.body)
	}
	out := map[string]wire.ImageState{}
	for _, st := range resp.Images {
		out[st.Image] = st
	}
	return out
}

// waitUntil polls cond for up to 30 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 30 s", what)
		}
	}
}

// TestPrefetchRoute: POST /v1/images/prefetch answers 202 at once with
// each distinct image queued (null code, message and bytes); GET
// /v1/images then lists them cached with their bytes; failures carry
// their codes; an image evicted since is no longer listed.
func TestPrefetchRoute(t *testing.T) {
	e, swe, _ := imagesEnv(t)
	release := swe.Hold()
	a, b, c := testImage("task-a", 'a'), testImage("task-b", 'b'), testImage("task-c", 'c')
	r := e.do("POST", "/v1/images/prefetch", tokAcme, map[string]any{"pool": "swe",
		"images": []string{a, b, c, "registry.test/swe/task-a:v1@sha256:" + strings.Repeat("a", 64)}}).must(t, 202)
	checkSchema(t, "ImagesResponse", r.body)
	want := `{"ok":true,"pool":"swe","images":[` +
		`{"image":"` + a + `","state":"queued","code":null,"message":null,"bytes":null},` +
		`{"image":"` + b + `","state":"queued","code":null,"message":null,"bytes":null},` +
		`{"image":"` + c + `","state":"queued","code":null,"message":null,"bytes":null}]}`
	if string(r.body) != want {
		t.Errorf("prefetch\n got %s\nwant %s", r.body, want)
	}
	release()
	waitUntil(t, "three images cached", func() bool {
		st := e.images(tokAcme, "swe")
		return len(st) == 3 && st[a].State == wire.ImageCached && st[b].State == wire.ImageCached && st[c].State == wire.ImageCached
	})
	if st := e.images(tokAcme, "swe")[a]; st.Bytes == nil || *st.Bytes != 100 || st.Code != nil || st.Message != nil {
		t.Errorf("a cached image: %+v", st)
	}
	if calls, most := swe.Calls(); len(calls) != 3 || most > 2 {
		t.Errorf("prefetches %v, %d at once (max_cold 2)", calls, most)
	}

	full, missing := testImage("task-full", 'f'), testImage("task-missing", 'e')
	swe.Fail(full, fmt.Errorf("gvisor: prefetch: %w", driver.ErrImageCacheFull))
	swe.Fail(missing, errors.New("MANIFEST_UNKNOWN"))
	e.do("POST", "/v1/images/prefetch", tokAcme, map[string]any{"pool": "swe", "images": []string{full, missing}}).must(t, 202)
	waitUntil(t, "two failures", func() bool {
		st := e.images(tokAcme, "swe")
		return st[full].State == wire.ImageFailed && st[missing].State == wire.ImageFailed
	})
	st := e.images(tokAcme, "swe")
	if f := st[full]; f.Code == nil || *f.Code != "insufficient_storage" || f.Message == nil || f.Bytes != nil {
		t.Errorf("an image the cache has no room for: %+v", f)
	}
	if f := st[missing]; f.Code == nil || *f.Code != "image_pull_failed" || f.Message == nil || strings.Contains(*f.Message, "MANIFEST") {
		t.Errorf("an image that could not be pulled: %+v", f)
	}
	swe.Cache().Remove(b)
	if _, ok := e.images(tokAcme, "swe")[b]; ok {
		t.Error("an evicted image is still listed")
	}
}

// TestPrefetchRouteRefusals: bad bodies and queries, unknown and foreign
// pools, a pool without an image cache, and images the pool does not
// allow are the API's typed errors, and start nothing; each tenant lists
// only its pool's images, though the pools share a cache.
func TestPrefetchRouteRefusals(t *testing.T) {
	e, swe, theirs := imagesEnv(t)
	a := testImage("task-a", 'a')
	many := make([]string, sandboxwich.MaxPrefetchImages+1)
	for i := range many {
		many[i] = a
	}
	post := func(body any) resp { return e.do("POST", "/v1/images/prefetch", tokAcme, body) }
	post("{").errCode(t, 400, "invalid_request")
	post("[]").errCode(t, 422, "invalid_request")
	post(map[string]any{"images": []string{a}}).errCode(t, 422, "invalid_request")
	post(map[string]any{"pool": "", "images": []string{a}}).errCode(t, 422, "invalid_request")
	post(map[string]any{"pool": 7, "images": []string{a}}).errCode(t, 422, "invalid_request")
	post(map[string]any{"pool": "swe"}).errCode(t, 422, "invalid_request")
	post(map[string]any{"pool": "swe", "images": a}).errCode(t, 422, "invalid_request")
	post(map[string]any{"pool": "swe", "images": []any{a, 1}}).errCode(t, 422, "invalid_request")
	post(map[string]any{"pool": "swe", "images": []any{a, nil}}).errCode(t, 422, "invalid_request")
	post(map[string]any{"pool": "swe", "images": []string{}}).errCode(t, 422, "invalid_request")
	post(map[string]any{"pool": "swe", "images": many}).errCode(t, 422, "invalid_request")
	post(map[string]any{"pool": "nope", "images": []string{a}}).errCode(t, 404, "not_found")
	post(map[string]any{"pool": "theirs", "images": []string{"registry.test/theirs/x@sha256:" + strings.Repeat("1", 64)}}).
		errCode(t, 404, "not_found")
	post(map[string]any{"pool": "fixed", "images": []string{a}}).errCode(t, 422, "invalid_request")
	post(map[string]any{"pool": "swe", "images": []string{a, "registry.test/theirs/x@sha256:" + strings.Repeat("1", 64)}}).
		errCode(t, 422, "image_not_allowed")
	post(map[string]any{"pool": "swe", "images": []string{a, "registry.test/swe/task-a:latest"}}).errCode(t, 422, "image_not_allowed")
	e.do("POST", "/v1/images/prefetch", tokAcme, `{"pool":"swe","images":["`+a+`"]}`, "Content-Type", "text/plain").
		errCode(t, 415, "unsupported_media_type")
	e.do("POST", "/v1/images/prefetch", "", map[string]any{"pool": "swe", "images": []string{a}}).errCode(t, 401, "unauthorized")
	e.do("POST", "/v1/images/prefetch", tokWorker1, map[string]any{"pool": "swe", "images": []string{a}}).errCode(t, 401, "unauthorized")
	if calls, _ := swe.Calls(); len(calls) != 0 {
		t.Errorf("refused prefetches started %v", calls)
	}

	e.do("GET", "/v1/images", tokAcme, nil).errCode(t, 422, "invalid_request")
	e.do("GET", "/v1/images?pool=", tokAcme, nil).errCode(t, 422, "invalid_request")
	e.do("GET", "/v1/images?pool=swe&pool=swe", tokAcme, nil).errCode(t, 422, "invalid_request")
	e.do("GET", "/v1/images?pool=nope", tokAcme, nil).errCode(t, 404, "not_found")
	e.do("GET", "/v1/images?pool=theirs", tokAcme, nil).errCode(t, 404, "not_found")
	e.do("GET", "/v1/images?pool=fixed", tokAcme, nil).errCode(t, 422, "invalid_request")
	if st := e.images(tokAcme, "swe"); len(st) != 0 {
		t.Errorf("after refused prefetches swe lists %v", st)
	}

	// The pools share a cache: each lists only the images it allows.
	swe.Cache().Put(a, 10)
	theirs.Cache().Put("registry.test/theirs/x@sha256:"+strings.Repeat("1", 64), 20)
	if st := e.images(tokAcme, "swe"); len(st) != 1 || st[a].State != wire.ImageCached {
		t.Errorf("swe lists %v, want its one image", st)
	}
	if st := e.images(tokGlobex, "theirs"); len(st) != 1 {
		t.Errorf("theirs lists %v, want its one image", st)
	}
	// The alias serves the same.
	e.do("GET", "/images?pool=swe", tokAcme, nil).must(t, 200)
}

// TestImageCacheMetricsAndInventory: /metrics reports the shared cache's
// bytes once and the providers' evictions; the inventory entry of the
// image class's release adds its fields, and another tenant's does not
// show them.
func TestImageCacheMetricsAndInventory(t *testing.T) {
	e, swe, theirs := imagesEnv(t)
	swe.Cache().Put(testImage("task-a", 'a'), 1000)
	swe.Cache().Put("registry.test/theirs/x@sha256:"+strings.Repeat("1", 64), 234)
	swe.SetEvictions(2)
	theirs.SetEvictions(3)
	metrics := string(e.do("GET", "/metrics", tokAcme, nil).must(t, 200).body)
	for _, line := range []string{"sandboxwich_image_cache_bytes 1234\n", "sandboxwich_image_cache_evictions_total 5\n",
		"# TYPE sandboxwich_image_cache_evictions_total counter\n", "# TYPE sandboxwich_image_cache_bytes gauge\n"} {
		if !strings.Contains(metrics, line) {
			t.Errorf("metrics lack %q", line)
		}
	}

	r := e.do("GET", "/v1/sterile-cells/inventory", tokAcme, nil).must(t, 200)
	checkSchema(t, "InventoryResponse", r.body)
	rel := signedRelease(t, lease.GVisorLowerRisk)
	want := `{"ok":true,"inventory":[{"release_set_id":"` + rel.ReleaseSetID + `","runtime_class":"gvisor_lower_risk","policy_digest":"` +
		rel.PolicyDigest + `","ready":0,"max_lease_seconds":0,"images":["registry.test/swe/*"],"cached":1,"max_cells":3,"max_cold":2,"warm_per_image":1}]}`
	if string(r.body) != want {
		t.Errorf("inventory\n got %s\nwant %s", r.body, want)
	}
	r = e.do("GET", "/v1/sterile-cells/inventory", tokGlobex, nil).must(t, 200)
	if !strings.Contains(string(r.body), `"images":["registry.test/theirs/*"],"cached":1,`) || strings.Contains(string(r.body), "swe") {
		t.Errorf("globex's inventory: %s", r.body)
	}
}

// TestImageCacheMetricsWithoutCaches: a server whose pools keep no image
// cache reports no image cache metrics.
func TestImageCacheMetricsWithoutCaches(t *testing.T) {
	e := newEnvWith(t, backends[0], []sandboxwich.Option{sandboxwich.WithPools(pool.Config{Name: "p1", TenantID: "acme",
		Release: signedRelease(t, lease.GVisorLowerRisk), Target: 1, Provider: fake.New(fake.Config{})})})
	if m := string(e.do("GET", "/metrics", tokAcme, nil).must(t, 200).body); strings.Contains(m, "sandboxwich_image_cache") {
		t.Errorf("metrics report an image cache:\n%s", m)
	}
}

// TestImageClassMetrics: /metrics reports each pool's live members by
// state, and for an image class how many images have a warm cell and how
// many claims wait (per-image figures stay on /v1/pools).
func TestImageClassMetrics(t *testing.T) {
	e, swe, _ := imagesEnv(t)
	ctx := t.Context()
	a := testImage("task-a", 'a')
	swe.Cache().Put(a, 10)
	sts, err := e.plane.PoolStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A claim of a that finds no cell marks it warm; a pass makes its cell.
	res, err := e.plane.Claim(ctx, "acme", sandboxwich.ClaimRequest{Release: sts[0].Release, Image: a,
		Binding: lease.Binding{OrganizationID: "o", WorkspaceID: "w", ThreadID: "t", RunnerSessionID: "s"}})
	if err != nil || res.Lease != nil {
		t.Fatalf("the first claim of %s: %v %v, want empty", a, res, err)
	}
	e.plane.Pools().Pass(ctx)
	e.plane.Pools().Pass(ctx) // the image figures are those its last pass planned with
	metrics := string(e.do("GET", "/metrics", tokAcme, nil).must(t, 200).body)
	for _, line := range []string{
		`sandboxwich_pool_members{pool="swe",state="ready"} 1` + "\n",
		`sandboxwich_pool_members{pool="swe",state="provisioning"} 0` + "\n",
		`sandboxwich_pool_members{pool="fixed",state="ready"} 1` + "\n",
		`sandboxwich_image_class_warm_images{pool="swe"} 1` + "\n",
		`sandboxwich_image_class_claims_waiting{pool="swe"} 0` + "\n",
		`sandboxwich_image_class_warm_images{pool="theirs"} 0` + "\n",
	} {
		if !strings.Contains(metrics, line) {
			t.Errorf("metrics lack %q", line)
		}
	}
	if strings.Contains(metrics, `sandboxwich_image_class_warm_images{pool="fixed"}`) {
		t.Error("a fixed pool reports image-class figures")
	}
}
