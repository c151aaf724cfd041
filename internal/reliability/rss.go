package reliability

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"

	"github.com/sandboxwich/sandboxwich/client"
	"github.com/sandboxwich/sandboxwich/internal/seed"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store/sqlite"
	"github.com/sandboxwich/sandboxwich/wire"
)

// RSSConfig configures the server-memory check: a server over SQLite
// holding Terminal history rows and Leases live leases of a dry-run pool,
// then a soak beside them.
type RSSConfig struct {
	Bin              string
	Leases, Terminal int
	Soak             SoakConfig // URL and Pid are filled in
}

// RSSReport is what the check measured.
type RSSReport struct {
	// Empty is the server's RSS once started on the seeded database;
	// Filled once its pool holds Leases ready cells; Leased once they are
	// all leased.
	Empty, Filled, Leased int64
	Soak                  SoakReport
}

// Passed reports the verdict: the soak's (no 5xx, memory, threads and
// goroutines stable) with the leases live throughout.
func (r RSSReport) Passed() bool { return r.Soak.Passed() }

func (r RSSReport) String() string {
	mib := func(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
	return fmt.Sprintf("RSS %s on the seeded database, %s with the pool full, %s with every cell leased; then a soak beside them: %s",
		mib(r.Empty), mib(r.Filled), mib(r.Leased), r.Soak)
}

// RunRSS seeds a SQLite database with cfg.Terminal quarantined cells,
// starts a server on it with a dry-run pool of cfg.Leases cells, leases
// them all (for longer than the soak), and soaks the server with them
// live, sampling its RSS.
func RunRSS(ctx context.Context, env *Env, cfg RSSConfig) (RSSReport, error) {
	var rep RSSReport
	path := filepath.Join(env.Dir, "rss-"+uuid.NewString()+".sqlite")
	st, err := sqlite.Open(ctx, path, sqlite.Options{})
	if err != nil {
		return rep, err
	}
	err = seed.Write(ctx, st.DB(), sqlx.QUESTION, seed.Cells{TenantID: Tenant, WorkerID: env.WorkerID.String(),
		Release: env.Release, Terminal: cfg.Terminal, Now: time.Now()})
	st.Close()
	if err != nil {
		return rep, fmt.Errorf("seeding %d terminal cells: %w", cfg.Terminal, err)
	}
	secs := uint64((cfg.Soak.Duration + 10*time.Minute).Seconds()) // the leases outlive the soak
	srv, err := env.Start(ctx, ServerSpec{Bin: cfg.Bin, Args: []string{"serve"}, DatabaseURL: "sqlite://" + path,
		LogFile: filepath.Join(env.Dir, "rss-server.log"), Extra: []string{fmt.Sprintf("SANDBOXWICH_MAX_LEASE_SECONDS=%d", secs)},
		Pool: PoolSpec{Provider: "dry-run", Target: cfg.Leases, MaxProvisioning: 64}}, "")
	if err != nil {
		return rep, err
	}
	defer srv.Stop(5 * time.Second)
	pid := srv.Pid()
	if rep.Empty, err = RSS(pid); err != nil {
		return rep, err
	}

	c, err := client.New(srv.URL, client.WithToken(env.TenantToken), client.WithOperatorToken(env.OperatorToken))
	if err != nil {
		return rep, err
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		pools, err := c.Pools(ctx)
		if err != nil {
			return rep, fmt.Errorf("pools: %w", err)
		}
		if len(pools) == 1 && pools[0].Members[string(lease.MemberReady)] >= cfg.Leases {
			break
		}
		if time.Now().After(deadline) {
			return rep, fmt.Errorf("the pool did not fill to %d ready cells within 5 minutes: %v", cfg.Leases, pools)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if rep.Filled, err = RSS(pid); err != nil {
		return rep, err
	}
	binding := lease.Binding{OrganizationID: "org-rss", WorkspaceID: "ws", ThreadID: "t", RunnerSessionID: "s"}
	for range cfg.Leases {
		res, err := c.Claim(ctx, wire.ClaimRequest{Release: env.Release, Binding: binding, LeaseSeconds: &secs})
		switch {
		case err != nil:
			return rep, fmt.Errorf("claim: %w", err)
		case res.Empty():
			return rep, fmt.Errorf("a claim of a full pool found no ready cell")
		}
	}
	if rep.Leased, err = RSS(pid); err != nil {
		return rep, err
	}
	soak := cfg.Soak
	soak.URL, soak.Pid = srv.URL, pid
	if rep.Soak, err = RunSoak(ctx, env, soak); err != nil {
		return rep, err
	}
	if srv.Exited() {
		return rep, fmt.Errorf("the server died during the soak")
	}
	return rep, nil
}
