package kubernetes_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/kubernetes"
	"github.com/sandboxwich/sandboxwich/internal/k8stest"
	"github.com/sandboxwich/sandboxwich/internal/testenv"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
	"github.com/sandboxwich/sandboxwich/store"
)

// The pool tests run the real reconciler (sandboxwich.New with a SQLite
// store) over the driver and the real API server. Time in the store is a
// manual clock; the driver's waits use real time.

type clock = testenv.Clock

type poolFixture struct {
	t     *testing.T
	ctx   context.Context
	env   *k8stest.Env
	ns    string
	clock *clock
	st    store.Store
	prov  driver.Provider
	pools *pool.Reconciler
}

func newPoolFixture(t *testing.T, env *k8stest.Env, ns string, prov driver.Provider, target int, edit ...func(*pool.Config)) *poolFixture {
	t.Helper()
	ctx := ctxT(t, 5*time.Minute)
	st, keys := testenv.SQLite(t), testenv.Keyring(t)
	rel := testenv.Release(keys, lease.GVisorLowerRisk)
	c := testenv.NewClock()
	cfg := pool.Config{Name: "k8s", TenantID: "acme", Release: rel, Target: target, Provider: prov}
	for _, e := range edit {
		e(&cfg)
	}
	plane, err := sandboxwich.New(st, keys, sandboxwich.WithClock(c.Now), sandboxwich.WithLogger(slog.New(slog.DiscardHandler)),
		sandboxwich.WithPools(cfg),
		sandboxwich.WithPoolOptions(pool.WithVerifyInterval(time.Second), pool.WithOrphanInterval(time.Nanosecond),
			pool.WithProvisionTimeout(time.Minute), pool.WithDestroyTimeout(3*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	return &poolFixture{t: t, ctx: ctx, env: env, ns: ns, clock: c, st: st, prov: prov, pools: plane.Pools()}
}

// pass advances the clock past every interval and runs passes until
// nothing more is created.
func (f *poolFixture) pass() {
	f.clock.Advance(2 * time.Second)
	for range 10 {
		if !f.pools.Pass(f.ctx) {
			return
		}
	}
}

func (f *poolFixture) counts() map[lease.MemberState]int {
	f.t.Helper()
	sts, err := f.pools.Status(f.ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	return sts[0].Members
}

func (f *poolFixture) wantCounts(want map[lease.MemberState]int) {
	f.t.Helper()
	got := f.counts()
	for _, st := range lease.MemberStates {
		if got[st] != want[st] {
			f.t.Fatalf("members: got %v, want %v", got, want)
		}
	}
}

func (f *poolFixture) members(states ...lease.MemberState) []store.Member {
	f.t.Helper()
	ms, err := f.st.Members(f.ctx, "k8s", states...)
	if err != nil {
		f.t.Fatal(err)
	}
	return ms
}

// podCount counts the namespace's Pods.
func (f *poolFixture) podCount() int {
	f.t.Helper()
	pods, err := f.env.Pods(f.ctx, f.ns)
	if err != nil {
		f.t.Fatal(err)
	}
	return len(pods)
}

// TestPoolOutOfBandDeleteReplaced: a ready member's Pod is deleted behind
// the pool's back. Re-verification notices, the member ends quarantined
// with proof of absence, and a new member replaces it.
func TestPoolOutOfBandDeleteReplaced(t *testing.T) {
	t.Parallel()
	env := k8stest.Shared(t)
	ns := env.Namespace(t)
	f := newPoolFixture(t, env, ns, newProvider(t, env, ns, "k8s"), 2)
	f.pass()
	f.wantCounts(map[lease.MemberState]int{lease.MemberReady: 2})
	if n := f.podCount(); n != 2 {
		t.Fatalf("%d pods, want 2", n)
	}
	victim := f.members(lease.MemberReady)[0]
	name := kubernetes.PodName(victim.CellID)
	if err := env.Client.CoreV1().Pods(ns).Delete(f.ctx, name, deleteNow()); err != nil {
		t.Fatal(err)
	}
	if err := env.WaitPodGone(f.ctx, ns, name, victim.Identity); err != nil {
		t.Fatal(err)
	}
	f.pass()
	f.wantCounts(map[lease.MemberState]int{lease.MemberReady: 2, lease.MemberQuarantined: 1})
	m, err := f.st.Member(f.ctx, victim.CellID)
	if err != nil {
		t.Fatal(err)
	}
	if m.State != lease.MemberQuarantined || !m.ProviderAbsent || m.Cell == nil || m.Cell.State != lease.Quarantined {
		t.Fatalf("victim member: %+v", m)
	}
	if n := f.podCount(); n != 2 {
		t.Fatalf("%d pods after replacement, want 2", n)
	}
	drain(t, f)
}

// TestPoolWebhookStripQuarantined: every Pod loses its runtimeClassName at
// admission. No cell ever becomes ready; each member is quarantined with
// proof that its Pod is gone.
func TestPoolWebhookStripQuarantined(t *testing.T) {
	t.Parallel()
	env := k8stest.Shared(t)
	ns := env.Namespace(t)
	env.MutatingWebhook(t, ns, k8stest.StripRuntimeClass)
	f := newPoolFixture(t, env, ns, newProvider(t, env, ns, "k8s"), 1)
	f.pools.Pass(f.ctx)
	f.wantCounts(map[lease.MemberState]int{lease.MemberQuarantined: 1})
	m := f.members(lease.MemberQuarantined)[0]
	if !m.ProviderAbsent || m.Cell != nil {
		t.Fatalf("quarantined member: %+v", m)
	}
	f.pools.Pass(f.ctx)
	f.wantCounts(map[lease.MemberState]int{lease.MemberQuarantined: 2})
	if n := f.podCount(); n != 0 {
		t.Fatalf("%d pods left, want 0", n)
	}
	if err := f.pools.SetTarget("k8s", 0); err != nil {
		t.Fatal(err)
	}
}

// TestPoolUncertainDestroyKeepsCapacity: a stopping member's Pod cannot be
// confirmed gone (a finalizer holds it Terminating). The member stays
// cleanup_pending with its cell quarantined, still counted against the
// target, so nothing replaces it; once the Pod goes, the retry proves it
// and the pool refills.
func TestPoolUncertainDestroyKeepsCapacity(t *testing.T) {
	t.Parallel()
	env := k8stest.Shared(t)
	ns := env.Namespace(t)
	f := newPoolFixture(t, env, ns, newProvider(t, env, ns, "k8s"), 1)
	f.pass()
	f.wantCounts(map[lease.MemberState]int{lease.MemberReady: 1})
	m := f.members(lease.MemberReady)[0]
	name := kubernetes.PodName(m.CellID)
	addFinalizer(t, env, ns, name)
	// Past the ready TTL the member is stopped; its Pod never goes away.
	f.clock.Advance(pool.DefaultReadyTTL)
	for range 3 {
		f.pass()
		f.wantCounts(map[lease.MemberState]int{lease.MemberCleanupPending: 1})
	}
	got, err := f.st.Member(f.ctx, m.CellID)
	if err != nil {
		t.Fatal(err)
	}
	if got.ProviderAbsent || got.Cell == nil || got.Cell.State != lease.Quarantined || got.Attempts < 2 {
		t.Fatalf("cleanup member: %+v", got)
	}
	if n := f.podCount(); n != 1 {
		t.Fatalf("%d pods, want only the held one", n)
	}
	removeFinalizer(t, env, ns, name)
	f.clock.Advance(time.Minute) // past the retry back-off
	f.pass()
	f.wantCounts(map[lease.MemberState]int{lease.MemberReady: 1, lease.MemberQuarantined: 1})
	got, err = f.st.Member(f.ctx, m.CellID)
	if err != nil || !got.ProviderAbsent {
		t.Fatalf("member after proof: %+v, %v", got, err)
	}
	drain(t, f)
}

// TestPoolOrphansDestroyed: a Pod with the pool's labels but no member
// (left by a crash between the provider call and its record) is found by
// List and destroyed with proof.
func TestPoolOrphansDestroyed(t *testing.T) {
	t.Parallel()
	env := k8stest.Shared(t)
	ns := env.Namespace(t)
	prov := newProvider(t, env, ns, "k8s")
	f := newPoolFixture(t, env, ns, prov, 1)
	orphan, err := prov.Provision(f.ctx, driver.ProvisionRequest{CellID: uuid.Must(uuid.NewV7()), RuntimeClass: lease.GVisorLowerRisk})
	if err != nil {
		t.Fatal(err)
	}
	f.pass()
	f.wantCounts(map[lease.MemberState]int{lease.MemberReady: 1})
	if o, err := prov.Inspect(f.ctx, orphan); err != nil || o.Exists {
		t.Fatalf("orphan after a pass: %+v, %v", o, err)
	}
	if n := f.podCount(); n != 1 {
		t.Fatalf("%d pods, want the member's only", n)
	}
	drain(t, f)
}

// drain sets the target to 0 and requires every Pod gone with proof.
func drain(t *testing.T, f *poolFixture) {
	t.Helper()
	if err := f.pools.SetTarget("k8s", 0); err != nil {
		t.Fatal(err)
	}
	f.pass()
	if n := len(f.members(lease.MemberProvisioning, lease.MemberReady, lease.MemberStopping, lease.MemberCleanupPending)); n != 0 {
		t.Fatalf("%d live members after draining: %v", n, f.counts())
	}
	if n := f.podCount(); n != 0 {
		t.Fatalf("%d pods after draining", n)
	}
}

// TestPoolTwoInstallationsOneNamespace runs two planes (two stores, two
// installations) with the same pool name in one namespace. Each provider
// lists only its own Pods; orphan passes of both (every pass, here) leave
// the other's Pods alone; draining one plane deletes only its own.
func TestPoolTwoInstallationsOneNamespace(t *testing.T) {
	t.Parallel()
	env := k8stest.Shared(t)
	ns := env.Namespace(t)
	var fs [2]*poolFixture
	for i, name := range []string{"plane-a", "plane-b"} {
		prov := newProvider(t, env, ns, "k8s", func(c *kubernetes.Config) { c.Installation = driver.InstallationTag(name) })
		fs[i] = newPoolFixture(t, env, ns, prov, 2)
	}
	for range 3 {
		for _, f := range fs {
			f.pass()
		}
	}
	for i, f := range fs {
		f.wantCounts(map[lease.MemberState]int{lease.MemberReady: 2})
		objs, err := f.prov.(driver.Lister).List(f.ctx)
		if err != nil {
			t.Fatal(err)
		}
		ready := f.members(lease.MemberReady)
		if len(objs) != 2 || !ownsAll(ready, objs) {
			t.Fatalf("plane %d lists %+v, want exactly its members %+v", i, objs, ready)
		}
	}
	if n := fs[0].podCount(); n != 4 {
		t.Fatalf("%d pods, want 2 per plane", n)
	}
	if err := fs[0].pools.SetTarget("k8s", 0); err != nil {
		t.Fatal(err)
	}
	fs[0].pass()
	fs[1].pass()
	if n := len(fs[0].members(lease.MemberProvisioning, lease.MemberReady, lease.MemberStopping, lease.MemberCleanupPending)); n != 0 {
		t.Fatalf("%d live members of plane a after draining: %v", n, fs[0].counts())
	}
	fs[1].wantCounts(map[lease.MemberState]int{lease.MemberReady: 2})
	if n := fs[1].podCount(); n != 2 {
		t.Fatalf("%d pods after plane a drained, want plane b's 2", n)
	}
	drain(t, fs[1])
}

// ownsAll reports whether objs are exactly the objects of members.
func ownsAll(members []store.Member, objs []driver.Object) bool {
	if len(members) != len(objs) {
		return false
	}
	for _, m := range members {
		found := false
		for _, o := range objs {
			found = found || (o.CellID == m.CellID && o.Identity == m.Identity)
		}
		if !found {
			return false
		}
	}
	return true
}
