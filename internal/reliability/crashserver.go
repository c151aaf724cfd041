package reliability

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/gvisor"
	"github.com/sandboxwich/sandboxwich/httpapi"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
	"github.com/sandboxwich/sandboxwich/store"
	"github.com/sandboxwich/sandboxwich/store/postgres"
	"github.com/sandboxwich/sandboxwich/store/sqlite"
)

// ServeCrash is the server of the crash checks: the same wiring as
// `sandboxwich serve` (store, plane with one pool, reconciler, HTTP
// handler), configured through the same SANDBOXWICH_* variables, but with
// a pool provider whose objects outlive the process, so that they can be
// compared with the pool's members after every SIGKILL:
//
//   - SANDBOXWICH_STERILE_POOL_PROVIDER=dir: a DirProvider in
//     SANDBOXWICH_DIR_PATH with latency SANDBOXWICH_DIR_MIN_LATENCY_MS to
//     SANDBOXWICH_DIR_MAX_LATENCY_MS and destroy faults
//     SANDBOXWICH_DIR_DESTROY_UNCERTAIN and SANDBOXWICH_DIR_LOST_DESTROY
//     (probabilities);
//   - SANDBOXWICH_STERILE_POOL_PROVIDER=gvisor: the real gVisor driver with
//     SANDBOXWICH_GVISOR_STATE_DIR and SANDBOXWICH_GVISOR_BUNDLE_DIR.
//
// SANDBOXWICH_RELIABILITY_LOCK_TTL_MS sets the reconciler's executor lock
// TTL (the time a killed process keeps a member locked).
func ServeCrash(ctx context.Context, log *slog.Logger) error {
	get := os.Getenv
	num := func(k string, def float64) float64 {
		v, err := strconv.ParseFloat(get(k), 64)
		if err != nil {
			return def
		}
		return v
	}
	ms := func(k string, def float64) time.Duration { return time.Duration(num(k, def)) * time.Millisecond }

	keys, err := attest.LoadKeyFile(get("SANDBOXWICH_STERILE_CELL_SIGNING_KEY_FILE"))
	if err != nil {
		return err
	}
	st, err := openStore(ctx, get("SANDBOXWICH_DATABASE_URL"))
	if err != nil {
		return err
	}
	defer st.Close()
	installation, err := installationTag(ctx, st)
	if err != nil {
		return err
	}
	var prov driver.Provider
	switch kind := get("SANDBOXWICH_STERILE_POOL_PROVIDER"); kind {
	case "dir":
		prov = &DirProvider{Dir: get("SANDBOXWICH_DIR_PATH"),
			MinLatency: ms("SANDBOXWICH_DIR_MIN_LATENCY_MS", 50), MaxLatency: ms("SANDBOXWICH_DIR_MAX_LATENCY_MS", 200),
			DestroyUncertain: num("SANDBOXWICH_DIR_DESTROY_UNCERTAIN", 0), LostDestroy: num("SANDBOXWICH_DIR_LOST_DESTROY", 0)}
	case "gvisor":
		if prov, err = gvisor.New(gvisor.Config{StateDir: get("SANDBOXWICH_GVISOR_STATE_DIR"),
			BundleDir: get("SANDBOXWICH_GVISOR_BUNDLE_DIR"), Pool: "rel", Installation: installation, Logger: log}); err != nil {
			return err
		}
	default:
		return fmt.Errorf("SANDBOXWICH_STERILE_POOL_PROVIDER %q: want dir or gvisor", kind)
	}
	cfg := pool.Config{Name: "rel", TenantID: Tenant, Provider: prov,
		Target: int(num("SANDBOXWICH_STERILE_POOL_TARGET", 8)), MaxProvisioning: int(num("SANDBOXWICH_STERILE_POOL_MAX_PROVISIONING", 0)),
		ReadyTTL: time.Duration(num("SANDBOXWICH_STERILE_POOL_READY_TTL_SECONDS", 300)) * time.Second,
		Release: lease.Release{ReleaseSetID: get("SANDBOXWICH_STERILE_POOL_RELEASE_SET_ID"),
			RuntimeClass: lease.RuntimeClass(get("SANDBOXWICH_STERILE_POOL_RUNTIME_CLASS")),
			PolicyDigest: get("SANDBOXWICH_STERILE_POOL_POLICY_DIGEST"), Signature: get("SANDBOXWICH_STERILE_POOL_RELEASE_SIGNATURE")}}

	sweep := ms("SANDBOXWICH_SWEEP_INTERVAL_MS", 200)
	plane, err := sandboxwich.New(st, keys, sandboxwich.WithLogger(log), sandboxwich.WithPools(cfg),
		sandboxwich.WithPoolOptions(pool.WithInterval(sweep), pool.WithLockTTL(ms("SANDBOXWICH_RELIABILITY_LOCK_TTL_MS", 5000)),
			pool.WithVerifyInterval(2*time.Second), pool.WithOrphanInterval(2*time.Second)),
		sandboxwich.WithSweepInterval(sweep))
	if err != nil {
		return err
	}
	tenant, token, _ := strings.Cut(get("SANDBOXWICH_TENANT_TOKENS"), "=")
	h, err := httpapi.New(httpapi.Config{Plane: plane, Logger: log,
		Auth: httpapi.Auth{TenantTokens: map[string]string{token: tenant}, OperatorToken: get("SANDBOXWICH_OPERATOR_TOKEN")}})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", get("SANDBOXWICH_LISTEN"))
	if err != nil {
		return err
	}
	go func() { _ = plane.Run(ctx) }()
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// openStore opens the store a database URL names (sqlite:// or
// postgres://), migrating it.
func openStore(ctx context.Context, u string) (store.Store, error) {
	switch {
	case strings.HasPrefix(u, "sqlite://"):
		return sqlite.Open(ctx, strings.TrimPrefix(u, "sqlite://"), sqlite.Options{})
	case strings.HasPrefix(u, "postgres://"):
		return postgres.Open(ctx, u, postgres.Options{})
	}
	return nil, errors.New("SANDBOXWICH_DATABASE_URL: want sqlite:// or postgres://")
}

// installationTag is the installation tag of st's plane: what its gVisor
// provider names containers after.
func installationTag(ctx context.Context, st store.Store) (string, error) {
	id, err := st.Installation(ctx)
	if err != nil {
		return "", err
	}
	return driver.InstallationTag(id), nil
}
