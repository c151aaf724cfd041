package kubernetes_test

import (
	"errors"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/internal/k8stest"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
)

// TestAPIServerRestart stops kube-apiserver mid-flight (etcd and kwok keep
// running): every call fails — Destroy as uncertain, never as proof — and
// after the restart the same objects are found, verified and destroyed
// with proof, with nothing leaked.
func TestAPIServerRestart(t *testing.T) {
	env := k8stest.Start(t, k8stest.Options{})
	ns := env.Namespace(t)
	p := newProvider(t, env, ns, "restart")
	ctx := ctxT(t, 3*time.Minute)

	before, err := p.Provision(ctx, provisionReq(lease.GVisorLowerRisk))
	if err != nil {
		t.Fatal(err)
	}
	if err := env.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	call := ctxT(t, 3*time.Second)
	during := provisionReq(lease.GVisorLowerRisk)
	if _, err := p.Provision(call, during); err == nil {
		t.Error("Provision succeeded with the API server down")
	}
	if _, err := p.Inspect(ctxT(t, 3*time.Second), before); err == nil {
		t.Error("Inspect succeeded with the API server down")
	}
	if _, err := p.List(ctxT(t, 3*time.Second)); err == nil {
		t.Error("List succeeded with the API server down")
	}
	if err := p.Destroy(ctxT(t, 3*time.Second), before); !errors.Is(err, driver.ErrUncertain) {
		t.Errorf("Destroy with the API server down: %v, want driver.ErrUncertain", err)
	}

	if err := env.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	o, err := p.Inspect(ctx, before)
	if err != nil {
		t.Fatalf("Inspect after restart: %v", err)
	}
	if err := driver.Verify(before, o, lease.GVisorLowerRisk); err != nil {
		t.Fatalf("Verify after restart: %v (%s)", err, o.Detail)
	}
	// The provision attempted while the server was down is retried, and
	// the cell works.
	during2, err := p.Provision(ctx, during)
	if err != nil {
		t.Fatalf("Provision after restart: %v", err)
	}
	objs, err := p.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 2 {
		t.Fatalf("List after restart = %+v, want 2 objects", objs)
	}
	for _, obj := range []driver.Object{before, during2} {
		if err := p.Destroy(ctx, obj); err != nil {
			t.Fatalf("Destroy after restart: %v", err)
		}
	}
	requireNoPods(t, env, ns)

	// The pool reconciler over the same kind of outage: members stopped
	// while the API server is down cannot be proven gone, so they wait in
	// cleanup_pending, still counted (nothing new is provisioned); after
	// the restart they are proven gone, the pool refills, and no Pod is
	// left over.
	t.Run("Pool", func(t *testing.T) {
		ns := env.Namespace(t)
		f := newPoolFixture(t, env, ns, newProvider(t, env, ns, "k8s"), 2)
		f.pass()
		f.wantCounts(map[lease.MemberState]int{lease.MemberReady: 2})
		if err := env.StopAPIServer(); err != nil {
			t.Fatal(err)
		}
		// Ready members past their TTL are stopped; destroys fail.
		f.clock.Advance(pool.DefaultReadyTTL)
		f.pass()
		f.wantCounts(map[lease.MemberState]int{lease.MemberCleanupPending: 2})
		if err := env.StartAPIServer(); err != nil {
			t.Fatal(err)
		}
		// kwok and the provider's client reconnect to the restarted server
		// in their own time, seconds on a loaded machine, and a destroy
		// that cannot prove deletion within its timeout stays pending: the
		// reconciler retries it, a minute apart at most, until it can.
		for deadline := time.Now().Add(90 * time.Second); ; {
			f.clock.Advance(time.Minute)
			f.pass()
			if f.counts()[lease.MemberCleanupPending] == 0 || time.Now().After(deadline) {
				break
			}
		}
		f.wantCounts(map[lease.MemberState]int{lease.MemberReady: 2, lease.MemberQuarantined: 2})
		for _, m := range f.members(lease.MemberQuarantined) {
			if !m.ProviderAbsent {
				t.Errorf("member %s quarantined without proof", m.CellID)
			}
		}
		if n := f.podCount(); n != 2 {
			t.Fatalf("%d pods, want the 2 new members'", n)
		}
		drain(t, f)
	})
}
