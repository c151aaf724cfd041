package sandboxwich_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/gvisor"
	"github.com/sandboxwich/sandboxwich/internal/testenv"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
)

// gvisorPlane is a running plane over a temporary SQLite store with one
// pool (target 1, tenant "acme") of real gVisor cells.
type gvisorPlane struct {
	*sandboxwich.Plane
	prov *gvisor.Provider
	keys *attest.Keyring
	rel  lease.Release
}

// claim claims a cell of the pool for binding, waiting until one is
// ready or ctx ends.
func (g gvisorPlane) claim(ctx context.Context, t *testing.T, binding lease.Binding) sandboxwich.ClaimResult {
	t.Helper()
	for {
		if ctx.Err() != nil {
			t.Fatal("no cell became ready")
		}
		res, err := g.Claim(ctx, "acme", sandboxwich.ClaimRequest{ClaimID: uuid.Must(uuid.NewV7()), Release: g.rel, Binding: binding})
		if err != nil {
			t.Fatal(err)
		}
		if res.Lease != nil {
			return res
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startGVisorPlane starts a gvisorPlane whose provider is cfg with its
// state, bundles, pool name and installation filled in; it fails the test
// under CI=true without runsc and root (skips it otherwise, or with
// -short). When the test ends the pool is drained (every cell proven
// gone) and the state removed.
func startGVisorPlane(t *testing.T, ctx context.Context, name string, cfg gvisor.Config, opts ...sandboxwich.Option) gvisorPlane {
	t.Helper()
	return startGVisorPool(t, ctx, name, cfg, nil, opts...)
}

// startGVisorPool is startGVisorPlane with its pool's configuration edited
// by edit (when not nil).
func startGVisorPool(t *testing.T, ctx context.Context, name string, cfg gvisor.Config, edit func(*pool.Config), opts ...sandboxwich.Option) gvisorPlane {
	t.Helper()
	if gvisor.FindRunsc() == "" || os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("runsc and root are required under CI=true (scripts/install-runsc.sh)")
		}
		t.Skip("needs runsc and root")
	}
	if testing.Short() {
		t.Skip("starts real gVisor sandboxes")
	}
	dir, err := os.MkdirTemp("", "sbw-"+name+"-")
	if err != nil {
		t.Fatal(err)
	}
	cfg.StateDir, cfg.BundleDir = filepath.Join(dir, "state"), filepath.Join(dir, "bundles")
	cfg.Pool, cfg.Installation = name, driver.InstallationTag(dir)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	prov, err := gvisor.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	keys := testenv.Keyring(t)
	rel := testenv.Release(keys, lease.GVisorLowerRisk)
	opts = append([]sandboxwich.Option{sandboxwich.WithLogger(slog.New(slog.DiscardHandler))}, opts...)
	pc := pool.Config{Name: name, TenantID: "acme", Release: rel, Target: 1, Provider: prov}
	if edit != nil {
		edit(&pc)
	}
	opts = append(opts, sandboxwich.WithPools(pc), sandboxwich.WithPoolOptions(pool.WithInterval(50*time.Millisecond)))
	plane, err := sandboxwich.New(testenv.SQLite(t), keys, opts...)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = plane.Run(runCtx) }()
	t.Cleanup(func() {
		_ = plane.Pools().SetTarget(name, 0)
		dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
		defer dcancel()
		_ = plane.Pools().Drain(dctx)
		stop()
		<-done
		_ = gvisor.RemoveStateDir(cfg.StateDir)
		_ = os.RemoveAll(dir)
	})
	return gvisorPlane{Plane: plane, prov: prov, keys: keys, rel: rel}
}
