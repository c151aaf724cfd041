package client_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/internal/testenv/fakecache"
	"github.com/sandboxwich/sandboxwich/internal/testenv/testserver"
	"github.com/sandboxwich/sandboxwich/wire"
)

// TestE2EPrefetchImages: against the real server with an image class
// over a fake image cache, Prefetch answers each distinct image queued
// and is retried after a lost answer without pulling an image twice;
// Images then lists them cached; refusals carry their codes.
func TestE2EPrefetchImages(t *testing.T) {
	prov := fakecache.New(fakecache.NewCache("images"))
	s := testserver.StartImageClass(t, prov, 2, "registry.test/swe/*")
	e := &e2e{Server: s, url: s.URL, store: s.Store, release: s.Release, workerID: s.WorkerID}
	c := e.client(t)
	ctx := context.Background()
	a := "registry.test/swe/task-a@sha256:" + strings.Repeat("a", 64)
	b := "registry.test/swe/task-b:v2@sha256:" + strings.Repeat("b", 64)

	release := prov.Hold()
	var lost atomic.Bool
	e.setWrap(func(real http.Handler, w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/images/prefetch" && lost.CompareAndSwap(false, true) {
			real.ServeHTTP(httptest.NewRecorder(), r) // carried out, answer lost
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		real.ServeHTTP(w, r)
	})
	sts, err := c.Prefetch(ctx, testPool, []string{a, b, a})
	e.setWrap(nil)
	if err != nil || !lost.Load() {
		t.Fatalf("Prefetch = %v (answer lost: %v)", err, lost.Load())
	}
	bCanonical := "registry.test/swe/task-b@sha256:" + strings.Repeat("b", 64)
	if len(sts) != 2 || sts[0].Image != a || sts[1].Image != bCanonical || sts[0].State == wire.ImageFailed {
		t.Errorf("Prefetch = %+v, want a and b (canonical) in flight", sts)
	}
	release()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		imgs, err := c.Images(ctx, testPool)
		if err != nil {
			t.Fatal(err)
		}
		if len(imgs) == 2 && imgs[0].State == wire.ImageCached && imgs[1].State == wire.ImageCached {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Images = %+v, want both cached", imgs)
		}
	}
	if calls, _ := prov.Calls(); calls[a] != 1 || calls[bCanonical] != 1 {
		t.Errorf("prefetches %v: the retry pulled an image again", calls)
	}

	if _, err := c.Prefetch(ctx, testPool, []string{"registry.test/other/x@sha256:" + strings.Repeat("c", 64)}); !errors.Is(err, errcode.ErrImageNotAllowed) {
		t.Errorf("Prefetch of an image the pool does not allow: %v", err)
	}
	if _, err := c.Prefetch(ctx, "nope", []string{a}); !errors.Is(err, errcode.ErrNotFound) {
		t.Errorf("Prefetch into an unknown pool: %v", err)
	}
	if _, err := c.Prefetch(ctx, testPool, nil); !errors.Is(err, errcode.ErrInvalidRequest) {
		t.Errorf("Prefetch of no image: %v", err)
	}
	if _, err := c.Images(ctx, "nope"); !errors.Is(err, errcode.ErrNotFound) {
		t.Errorf("Images of an unknown pool: %v", err)
	}
	if _, err := c.Images(ctx, "a b&pool=x"); !errors.Is(err, errcode.ErrNotFound) {
		t.Errorf("Images of a pool whose name needs escaping: %v", err)
	}
}
