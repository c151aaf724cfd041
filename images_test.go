package sandboxwich_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
)

func img(name string, c byte) string {
	return "registry.test/swe/" + name + "@sha256:" + strings.Repeat(string(c), 64)
}

// classEnv is a plane with an image class "swe" allowing
// registry.test/swe/* (max_cells cells, max_cold 2, edited by edit) and a
// fixed pool "fixed" pinning one image, on fake providers that record each
// cell's image.
func classEnv(t *testing.T, maxCells int, edit ...func(*pool.Config)) (*env, *fake.Provider) {
	t.Helper()
	rel := newEnv(t).rel
	prov := fake.New(fake.Config{Mode: driver.Apply})
	fixed := "registry.test/base/fixed:v1@sha256:" + strings.Repeat("f", 64)
	class := pool.Config{Name: "swe", TenantID: "acme", Release: rel, Target: maxCells, MaxProvisioning: 2, Provider: prov,
		Images: []string{"registry.test/swe/*"}}
	for _, f := range edit {
		f(&class)
	}
	e := newEnv(t, sandboxwich.WithPools(
		pool.Config{Name: "fixed", TenantID: "acme", Release: rel, Target: 1, Image: fixed,
			Provider: fake.New(fake.Config{Mode: driver.Apply, Image: fixed})}, class))
	return e, prov
}

// cellsByImage counts the provider's cells by image.
func cellsByImage(ctx context.Context, prov *fake.Provider) map[string]int {
	out := map[string]int{}
	objs, _ := prov.List(ctx)
	for _, o := range objs {
		out[prov.Image(o.CellID)]++
	}
	return out
}

// claimWaiting makes n claims of image at once, each waiting, runs a pass
// that makes their cells, and returns their leases.
func (e *env) claimWaiting(t *testing.T, image string, n int) []sandboxwich.ClaimResult {
	t.Helper()
	outs := make([]<-chan claimOutcome, n)
	for i := range outs {
		outs[i] = e.claimAsync(e.ctx, sandboxwich.ClaimRequest{ClaimID: uuid.New(), Release: e.rel, Binding: binding, Image: image, WaitSeconds: 60})
	}
	waitFor(t, "the claims wait", func() bool { return e.plane.WaitingClaims() == n })
	e.passes(1)
	res := make([]sandboxwich.ClaimResult, n)
	for i, ch := range outs {
		out := <-ch
		if out.err != nil || out.res.Lease == nil {
			t.Fatalf("claim of %s: %v %v", image, out.res, out.err)
		}
		res[i] = out.res
	}
	return res
}

// pass runs reconciler passes until one changes nothing more (a stop
// frees room only once its destroy is proven).
func (e *env) passes(n int) {
	for range n {
		e.plane.Pools().Pass(e.ctx)
	}
}

// TestImageClassClaims: a claim of an image that no cell runs waits while
// the image class makes one for it, and leases it; the cell runs exactly
// that image; the image then stays warm (a ready cell of it, which the
// next claim of it takes at once); a claim of the fixed pool's image takes
// its cell; a Part I claim never takes an image class's cell; an image
// outside every pool, or a tag, is image_not_allowed and records nothing.
func TestImageClassClaims(t *testing.T) {
	e, prov := classEnv(t, 4)
	e.passes(1) // the fixed pool's cell
	a := img("task-a", 'a')
	got := e.claimAsync(e.ctx, sandboxwich.ClaimRequest{ClaimID: uuid.New(), Release: e.rel, Binding: binding,
		Image: a, WaitSeconds: 60})
	waitFor(t, "the claim waits", func() bool { return e.plane.WaitingClaims() == 1 })
	e.passes(1)
	out := <-got
	if out.err != nil || out.res.Lease == nil || out.res.PoolName != "swe" {
		t.Fatalf("the claim of %s: %v %v, want a cell of the image class", a, out.res, out.err)
	}
	if got := prov.Image(out.res.Lease.CellID); got != a {
		t.Fatalf("the cell runs %q, want %q", got, a)
	}
	e.passes(1) // the image is warm: one ready cell of it
	sts, err := e.plane.PoolStatus(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range sts {
		if st.Name == "swe" && st.Members[lease.MemberReady] != 1 {
			t.Errorf("image class after a claim of %s: %d ready cells, want the 1 warm cell of it", a, st.Members[lease.MemberReady])
		}
		if st.Name == "swe" && (len(st.ImageClass) != 1 || st.WarmPerImage != 1 || len(st.Images) != 1 || st.Images[0].Image != a) {
			t.Errorf("image class status: %+v, want its pattern, warm_per_image 1 and image %s", st, a)
		}
	}
	// The fixed pool's image, named without its tag, takes its cell; then
	// a Part I claim finds none: the warm cell of a is not Part I
	// inventory.
	res, err := e.plane.Claim(e.ctx, "acme", sandboxwich.ClaimRequest{ClaimID: uuid.New(), Release: e.rel, Binding: binding,
		Image: "registry.test/base/fixed@sha256:" + strings.Repeat("f", 64)})
	if err != nil || res.Lease == nil || res.PoolName != "fixed" {
		t.Fatalf("a claim of the fixed pool's image: %v %v, want its cell", res, err)
	}
	res, err = e.plane.Claim(e.ctx, "acme", sandboxwich.ClaimRequest{ClaimID: uuid.New(), Release: e.rel, Binding: binding})
	if err != nil || res.Lease != nil {
		t.Fatalf("a Part I claim: %v %v, want empty (the image class's cell is not Part I inventory)", res, err)
	}
	// The warm cell serves the next claim of a at once.
	res, err = e.plane.Claim(e.ctx, "acme", sandboxwich.ClaimRequest{ClaimID: uuid.New(), Release: e.rel, Binding: binding, Image: a})
	if err != nil || res.Lease == nil || prov.Image(res.Lease.CellID) != a {
		t.Fatalf("a claim of warm %s: %v %v, want its warm cell", a, res, err)
	}

	claimID := uuid.New()
	for _, bad := range []string{"registry.other/x/y@sha256:" + strings.Repeat("c", 64), "registry.test/swe/task-a:latest",
		"registry.test/swe/task-a", "registry.test/swe/task-a@sha256:abc"} {
		_, err := e.plane.Claim(e.ctx, "acme", sandboxwich.ClaimRequest{ClaimID: claimID, Release: e.rel, Binding: binding, Image: bad, WaitSeconds: 5})
		if !errors.Is(err, errcode.ErrImageNotAllowed) {
			t.Errorf("image %q: %v, want image_not_allowed", bad, err)
		}
	}
	res, err = e.plane.Claim(e.ctx, "acme", sandboxwich.ClaimRequest{ClaimID: claimID, Release: e.rel, Binding: binding})
	if err != nil || res.Replayed {
		t.Fatalf("the refused claim_id reused: %v %v, want a new claim (the refusals recorded nothing)", res, err)
	}
}

// TestImageClassEvictsForAWait: a full image class (max_cells 2, both
// cells warm cells of other images) evicts the least recently used warm
// cell for a claim that waits for a third image, and then makes its cell;
// a claim that waited in vain leaves its late cell as warm inventory.
func TestImageClassEvictsForAWait(t *testing.T) {
	e, prov := classEnv(t, 2)
	a, b, c := img("task-a", 'a'), img("task-b", 'b'), img("task-c", 'c')
	for _, im := range []string{a, b} { // one claim each: each image warm, one ready cell each
		e.release(t, e.claimWaiting(t, im, 1)...)
		e.now = e.now.Add(time.Second)
		e.passes(3) // the released cell destroyed, the warm cell made
	}
	ready := func() map[string]int { return cellsByImage(e.ctx, prov) }
	if got := ready(); got[a] != 1 || got[b] != 1 {
		t.Fatalf("cells by image before the wait: %v, want one warm cell of %s and of %s", got, a, b)
	}
	got := e.claimAsync(e.ctx, sandboxwich.ClaimRequest{ClaimID: uuid.New(), Release: e.rel, Binding: binding, Image: c, WaitSeconds: 60})
	waitFor(t, "the claim waits", func() bool { return e.plane.WaitingClaims() == 1 })
	e.passes(3) // evict, destroy, make
	out := <-got
	if out.err != nil || out.res.Lease == nil || prov.Image(out.res.Lease.CellID) != c {
		t.Fatalf("the claim of %s in a full class: %v %v, want a cell of it", c, out.res, out.err)
	}
	if got := ready(); got[a] != 0 || got[b] != 1 || got[c] != 1 {
		t.Errorf("cells by image after the wait: %v, want %s (least recently used) evicted, %s kept, %s made", got, a, b, c)
	}
}

// release releases leases, their cells destroyed.
func (e *env) release(t *testing.T, leases ...sandboxwich.ClaimResult) {
	t.Helper()
	for _, res := range leases {
		if _, err := e.plane.Release(e.ctx, "acme", res.Lease.ID, res.Proof(), lease.Destroyed); err != nil {
			t.Fatal(err)
		}
	}
}

// TestImageClassWarmFollowsDemand: an image keeps as many warm cells as
// the most of its cells in use at once lately, up to warm_per_image; in a
// full class, a more recently used image's warm cell evicts a less
// recently used image's, never the other way round.
func TestImageClassWarmFollowsDemand(t *testing.T) {
	e, prov := classEnv(t, 3, func(c *pool.Config) { c.WarmPerImage = 2 })
	cold, hot := img("task-cold", 'c'), img("task-hot", 'e')
	e.release(t, e.claimWaiting(t, cold, 1)...)
	e.passes(3) // the released cell destroyed, the warm cell made
	if got := cellsByImage(e.ctx, prov); got[cold] != 1 || len(got) != 1 {
		t.Fatalf("cells by image after one claim of %s: %v, want its one warm cell", cold, got)
	}
	e.now = e.now.Add(time.Second)
	hots := e.claimWaiting(t, hot, 2) // two cells of hot in use at once: the class is full
	e.passes(3)                       // cold's warm cell evicted, destroyed; a warm cell of hot made
	if got := cellsByImage(e.ctx, prov); got[cold] != 0 || got[hot] != 3 {
		t.Fatalf("cells by image with 2 of %s leased in a full class: %v, want %s's warm cell evicted for a warm cell of %s", hot, got, cold, hot)
	}
	e.release(t, hots...)
	e.passes(4)
	if got := cellsByImage(e.ctx, prov); got[hot] != 2 || got[cold] != 1 {
		t.Fatalf("cells by image after the release: %v, want 2 warm cells of %s (2 were in use at once) and 1 of %s", got, hot, cold)
	}
}

// TestImageClassCapacity: a wait that ends while the class has no room
// for a cell of its image (max_cells 1, the one cell leased) answers
// empty_reason capacity, durably; once the class has room, a claim of the
// image gets its cell.
func TestImageClassCapacity(t *testing.T) {
	e, prov := classEnv(t, 1, func(c *pool.Config) { c.MaxProvisioning = 1 })
	a, b := img("task-a", 'a'), img("task-b", 'b')
	held := e.claimWaiting(t, a, 1)
	req := sandboxwich.ClaimRequest{ClaimID: uuid.New(), Release: e.rel, Binding: binding, Image: b, WaitSeconds: 1}
	got := e.claimAsync(e.ctx, req)
	waitFor(t, "the claim waits", func() bool { return e.plane.WaitingClaims() == 1 })
	e.passes(1) // no room: the class's one cell is leased
	out := <-got
	if out.err != nil || out.res.Lease != nil || out.res.EmptyReason != sandboxwich.EmptyCapacity {
		t.Fatalf("a wait in a full class: %v %v, want empty (capacity)", out.res, out.err)
	}
	if res, err := e.plane.Claim(e.ctx, "acme", req); err != nil || !res.Replayed || res.EmptyReason != sandboxwich.EmptyCapacity {
		t.Fatalf("its retry: %v %v, want the capacity answer replayed", res, err)
	}
	e.release(t, held...)
	e.passes(3) // a's cell destroyed, and a warm cell of a made
	got = e.claimAsync(e.ctx, sandboxwich.ClaimRequest{ClaimID: uuid.New(), Release: e.rel, Binding: binding, Image: b, WaitSeconds: 60})
	waitFor(t, "the claim waits", func() bool { return e.plane.WaitingClaims() == 1 })
	e.passes(3) // a's warm cell evicted, destroyed; b's made
	if out := <-got; out.err != nil || out.res.Lease == nil || prov.Image(out.res.Lease.CellID) != b {
		t.Fatalf("the claim of %s once the class has room: %v %v, want a cell of it", b, out.res, out.err)
	}
}

// slowClass is a plane on the real clock with an image class whose
// provider takes latency to provision, edited by edit; the reconciler
// runs in the background.
func slowClass(t *testing.T, latency time.Duration, edit ...func(*pool.Config)) (*env, *fake.Provider) {
	t.Helper()
	rel := newEnv(t).rel
	prov := fake.New(fake.Config{Mode: driver.Apply, Latency: latency})
	cfg := pool.Config{Name: "swe", TenantID: "acme", Release: rel, Target: 4, MaxProvisioning: 2, Provider: prov,
		Images: []string{"registry.test/swe/*"}}
	for _, f := range edit {
		f(&cfg)
	}
	// The real clock: warm images decay in real time.
	e := newEnv(t, sandboxwich.WithPools(cfg), sandboxwich.WithPoolOptions(pool.WithInterval(10*time.Millisecond)),
		sandboxwich.WithClock(time.Now))
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = e.plane.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return e, prov
}

// TestProviderFaultImageWaitElapses: a claim whose wait ends before its
// image's cell is made answers empty (wait_elapsed), durably: its retry
// replays it. The late cell is warm inventory of its image, which the
// next claim of the image takes without waiting.
func TestProviderFaultImageWaitElapses(t *testing.T) {
	e, prov := slowClass(t, 2*time.Second)
	a := img("task-a", 'a')
	req := sandboxwich.ClaimRequest{ClaimID: uuid.New(), Release: e.rel, Binding: binding, Image: a, WaitSeconds: 1}
	res, err := e.plane.Claim(e.ctx, "acme", req)
	if err != nil || res.Lease != nil || res.EmptyReason != sandboxwich.EmptyWaitElapsed {
		t.Fatalf("a wait shorter than the provision: %v %v, want empty (wait_elapsed)", res, err)
	}
	waitFor(t, "the late cell is ready", func() bool {
		sts, err := e.plane.PoolStatus(e.ctx)
		return err == nil && sts[0].Members[lease.MemberReady] == 1
	})
	if n := prov.Calls("provision"); n != 1 {
		t.Errorf("%d provisions, want the one the wait asked for", n)
	}
	if res, err := e.plane.Claim(e.ctx, "acme", req); err != nil || !res.Replayed || res.Lease != nil || res.EmptyReason != sandboxwich.EmptyWaitElapsed {
		t.Fatalf("the retry: %v %v, want the empty outcome replayed", res, err)
	}
	res, err = e.plane.Claim(e.ctx, "acme", sandboxwich.ClaimRequest{ClaimID: uuid.New(), Release: e.rel, Binding: binding, Image: a})
	if err != nil || res.Lease == nil || prov.Image(res.Lease.CellID) != a {
		t.Fatalf("a claim of %s after the late cell came: %v %v, want it without waiting", a, res, err)
	}
}

// TestProviderFaultImageRetryJoins: retries of a fenced claim during its
// wait for a cell of its image join it: one cell is provisioned, and
// every answer is its lease. (The image stays warm for an instant only,
// so that no warm cell follows the claim.)
func TestProviderFaultImageRetryJoins(t *testing.T) {
	e, prov := slowClass(t, 500*time.Millisecond, func(c *pool.Config) { c.WarmIdle = time.Nanosecond })
	req := sandboxwich.ClaimRequest{ClaimID: uuid.New(), Release: e.rel, Binding: binding, Image: img("task-b", 'b'), WaitSeconds: 60}
	outs := make([]<-chan claimOutcome, 4)
	for i := range outs {
		outs[i] = e.claimAsync(e.ctx, req)
	}
	var leaseID uuid.UUID
	for i, ch := range outs {
		out := <-ch
		if out.err != nil || out.res.Lease == nil {
			t.Fatalf("answer %d: %v %v, want the lease", i, out.res, out.err)
		}
		if leaseID == uuid.Nil {
			leaseID = out.res.Lease.ID
		} else if out.res.Lease.ID != leaseID {
			t.Fatalf("answer %d leased %s, another answer %s", i, out.res.Lease.ID, leaseID)
		}
	}
	if n := prov.Calls("provision"); n != 1 {
		t.Errorf("%d provisions for one waiting claim and its retries, want 1", n)
	}
}
