package agentsandbox_test

import (
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/agentsandbox"
	"github.com/sandboxwich/sandboxwich/internal/testenv"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
)

// TestTwoInstallationsOneNamespace gives two planes (two installations)
// the same pool name in one namespace. Each provider lists only its own
// claim. The orphan pass of plane a, whose store knows neither cell,
// destroys a's claim and leaves b's bound and verified.
func TestTwoInstallationsOneNamespace(t *testing.T) {
	env, ns, _, _ := setup(t, faults{})
	ctx := ctxT(t, 3*time.Minute)
	installation := func(name string) func(*agentsandbox.Config) {
		return func(c *agentsandbox.Config) { c.Installation = driver.InstallationTag(name) }
	}
	a := newProvider(t, env, ns, "p", installation("plane-a"))
	b := newProvider(t, env, ns, "p", installation("plane-b"))
	objA, err := a.Provision(ctx, provisionReq(lease.GVisorLowerRisk))
	if err != nil {
		t.Fatal(err)
	}
	objB, err := b.Provision(ctx, provisionReq(lease.GVisorLowerRisk))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		p    *agentsandbox.Provider
		want driver.Object
	}{{"a", a, objA}, {"b", b, objB}} {
		if got, err := tc.p.List(ctx); err != nil || !slices.Equal(got, []driver.Object{tc.want}) {
			t.Fatalf("plane %s lists %+v, %v; want only [%+v]", tc.name, got, err, tc.want)
		}
	}

	// Plane a's reconciler, with an empty store and a pool of target 0:
	// its orphan pass destroys whatever a lists.
	st, keys := testenv.SQLite(t), testenv.Keyring(t)
	rel := testenv.Release(keys, lease.GVisorLowerRisk)
	plane, err := sandboxwich.New(st, keys, sandboxwich.WithLogger(slog.New(slog.DiscardHandler)),
		sandboxwich.WithPools(pool.Config{Name: "p", TenantID: "acme", Release: rel, Target: 0, Provider: a}),
		sandboxwich.WithPoolOptions(pool.WithOrphanInterval(time.Nanosecond), pool.WithDestroyTimeout(30*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		plane.Pools().Pass(ctx)
	}
	if got, err := a.List(ctx); err != nil || len(got) != 0 {
		t.Errorf("plane a lists %+v, %v after its orphan passes; want its orphan gone", got, err)
	}
	if got, err := b.List(ctx); err != nil || !slices.Equal(got, []driver.Object{objB}) {
		t.Fatalf("plane b lists %+v, %v after plane a's orphan passes; want [%+v]", got, err, objB)
	}
	o, err := b.Inspect(ctx, objB)
	if err != nil || driver.Verify(objB, o, lease.GVisorLowerRisk) != nil {
		t.Fatalf("plane b's cell after plane a's orphan passes: %+v, %v", o, err)
	}
	if err := b.Destroy(ctx, objB); err != nil {
		t.Fatal(err)
	}
	requireEmpty(t, env, ns)
}
