// Command reliability runs one check of the reliability proof and prints
// one line: "PASS <check>: <figures>" or "FAIL <check>: <reason>". Its exit
// status is 0 only when the check passed. scripts/reliability.sh runs every
// check; see docs/reliability.md.
//
//	reliability [flags] <check>
//
// Checks:
//
//	lin-sqlite-worker  linearizability, SQLite, inventory prepared by an external worker
//	lin-sqlite-pool    linearizability, SQLite, a dry-run pool
//	lin-postgres       linearizability, PostgreSQL, two servers sharing the database, worker and pool inventory
//	lin-partition      lin-postgres with the servers in network namespaces whose links to PostgreSQL are cut and healed
//	crash-dir          SIGKILL loop, SQLite, a pool on a file-backed provider that outlives the process
//	crash-gvisor       SIGKILL loop, SQLite, a pool of real runsc (gVisor) cells
//	crash-gvisor-images crash-gvisor with an image class: claims of marked images, pulled on demand
//	crash-two-gvisor   two crash-gvisor loops of two installations sharing one runsc state root
//	soak               mixed load at concurrency 64: 5xx, throughput, latency, memory, goroutines
//	rss                the server's RSS with 100,000 terminal rows and 1,000 live leases, then a soak beside them
//	pg-restart         PostgreSQL stopped, started and restarted (fast and immediate) under two replicas' load
//	disk-full          SQLite's disk fills up during commits, then space returns
//	partition          two replicas in network namespaces; one's link to PostgreSQL is cut and healed
//	agent-fence        real gVisor cells: sterile, exec and files only under the lease's fence, one agent digest
//	clock-skew         two replicas on PostgreSQL with clocks 5 s fast and 5 s slow: expiries follow the database's clock
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/gvisor"
	"github.com/sandboxwich/sandboxwich/internal/reliability"
	"github.com/sandboxwich/sandboxwich/lease"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}

type options struct {
	bin, dir, postgres string
	quick              bool
	seed               uint64
	clients            int
	duration           time.Duration
	kills              int
}

func run(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("reliability", flag.ContinueOnError)
	var o options
	fs.StringVar(&o.bin, "bin", "", "the sandboxwich binary (go build -o … ./cmd/sandboxwich)")
	fs.StringVar(&o.dir, "dir", "", "scratch and artifact directory (default: a new temporary directory)")
	fs.StringVar(&o.postgres, "postgres", os.Getenv("SANDBOXWICH_RELIABILITY_POSTGRES"), "admin URL of a PostgreSQL server (databases are created and dropped)")
	fs.BoolVar(&o.quick, "quick", false, "shortened form")
	fs.Uint64Var(&o.seed, "seed", uint64(time.Now().UnixNano()), "random seed")
	fs.IntVar(&o.clients, "clients", 64, "concurrent clients")
	fs.DurationVar(&o.duration, "duration", 0, "load duration (default: per check, shorter with -quick)")
	fs.IntVar(&o.kills, "kills", 0, "SIGKILLs of the crash checks (default 10 quick, 50 full)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: reliability [flags] <check>")
		return 2
	}
	check := fs.Arg(0)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if o.dir == "" {
		d, err := os.MkdirTemp("", "sbw-reliability-")
		if err != nil {
			fmt.Println("FAIL", check+":", err)
			return 1
		}
		o.dir = d
	}
	o.dir, _ = filepath.Abs(o.dir)
	dir := filepath.Join(o.dir, check)
	env, err := reliability.NewEnv(dir, log)
	if err != nil {
		fmt.Println("FAIL", check+":", err)
		return 1
	}
	start := time.Now()
	ok, line := dispatch(ctx, env, check, o)
	verdict := "PASS"
	if !ok {
		verdict = "FAIL"
	}
	fmt.Printf("%s %s: %s [%s]\n", verdict, check, line, time.Since(start).Round(100*time.Millisecond))
	if ok {
		return 0
	}
	return 1
}

func (o options) dur(quick, full time.Duration) time.Duration {
	switch {
	case o.duration > 0:
		return o.duration
	case o.quick:
		return quick
	}
	return full
}

func dispatch(ctx context.Context, env *reliability.Env, check string, o options) (bool, string) {
	switch check {
	case "lin-sqlite-worker", "lin-sqlite-pool", "lin-postgres", "lin-partition":
		return lin(ctx, env, check, o)
	case "crash-dir", "crash-gvisor", "crash-gvisor-images":
		return crash(ctx, env, check, o)
	case "crash-two-gvisor":
		return crashTwo(ctx, env, o)
	case "soak":
		return soak(ctx, env, o)
	case "rss":
		return rss(ctx, env, o)
	case "pg-restart", "disk-full", "partition":
		return outage(ctx, env, check, o)
	case "clock-skew":
		return skew(ctx, env, o)
	case "agent-fence":
		return agentFence(ctx, env, o)
	}
	return false, "unknown check (see -h)"
}

const minDrop = 0.10

func lin(ctx context.Context, env *reliability.Env, check string, o options) (bool, string) {
	if o.bin == "" {
		return false, "-bin is required"
	}
	cfg := reliability.LinConfig{Name: check, Clients: o.clients, Duration: o.dur(15*time.Second, 90*time.Second),
		DropRate: 0.15, Seed: o.seed, Artifacts: env.Dir}
	spec := reliability.ServerSpec{Bin: o.bin, Args: []string{"serve"}}
	servers := 1
	switch check {
	case "lin-sqlite-worker":
		cfg.Worker = true
	case "lin-sqlite-pool":
		cfg.Pool = true
	case "lin-postgres", "lin-partition":
		cfg.Worker, cfg.Pool = true, true
		servers = 2
	}
	if cfg.Pool {
		spec.Pool = reliability.PoolSpec{Provider: "dry-run", Target: 24, MaxProvisioning: 8,
			Settings: map[string]string{"latency_ms": "20"}}
	}
	if check == "lin-partition" {
		rep, cuts, err := reliability.RunLinPartition(ctx, env, cfg, spec)
		if err != nil {
			return false, err.Error()
		}
		return rep.Passed(minDrop), fmt.Sprintf("%d clients, 2 servers, %d database links cut, %s", cfg.Clients, cuts, rep)
	}
	if servers == 2 {
		if o.postgres == "" {
			return false, "-postgres (or SANDBOXWICH_RELIABILITY_POSTGRES) is required"
		}
		pg, err := reliability.CreatePostgres(ctx, o.postgres)
		if err != nil {
			return false, err.Error()
		}
		defer pg.Drop()
		spec.DatabaseURL = pg.URL
	} else {
		spec.DatabaseURL = "sqlite://" + filepath.Join(env.Dir, "db.sqlite")
	}
	for i := range servers {
		spec.LogFile = filepath.Join(env.Dir, fmt.Sprintf("server-%d.log", i))
		srv, err := env.Start(ctx, spec, "")
		if err != nil {
			return false, err.Error()
		}
		defer srv.Stop(5 * time.Second)
		cfg.Backends = append(cfg.Backends, srv.URL)
	}
	rep, err := reliability.RunLinearizability(ctx, env, cfg)
	if err != nil {
		return false, err.Error()
	}
	return rep.Passed(minDrop), fmt.Sprintf("%d clients, %d server(s), %s", cfg.Clients, servers, rep)
}

func crash(ctx context.Context, env *reliability.Env, check string, o options) (bool, string) {
	if o.bin == "" {
		return false, "-bin is required"
	}
	kills := o.kills
	cfg := reliability.CrashConfig{Bin: o.bin, Seed: o.seed, Faults: true}
	switch check {
	case "crash-dir":
		if kills == 0 {
			kills = map[bool]int{true: 10, false: 50}[o.quick]
		}
		cfg.Provider, cfg.Target, cfg.MaxProv, cfg.Clients = "dir", 8, 4, 12
		cfg.MinUp, cfg.MaxUp, cfg.LockTTL, cfg.Converge = 200*time.Millisecond, 2*time.Second, 3*time.Second, 60*time.Second
	case "crash-gvisor", "crash-gvisor-images":
		if _, err := exec.LookPath("runsc"); err != nil {
			return false, "runsc is not installed (scripts/install-runsc.sh)"
		}
		if kills == 0 {
			kills = map[bool]int{true: 3, false: 12}[o.quick]
		}
		cfg.Provider, cfg.Target, cfg.MaxProv, cfg.Clients, cfg.ReadyTTL = "gvisor", 2, 2, 2, 60
		cfg.MinUp, cfg.MaxUp, cfg.LockTTL, cfg.Converge = 500*time.Millisecond, 8*time.Second, 10*time.Second, 3*time.Minute
		if check == "crash-gvisor-images" {
			// Three images in three cells: claims wait while cells of
			// their image are made, and a full class evicts.
			cfg.Images, cfg.Target = 3, 3
		}
	}
	cfg.Kills = kills
	rep, err := reliability.RunCrash(ctx, env, cfg)
	if err != nil {
		return false, err.Error()
	}
	return len(rep.Violations) == 0, rep.String()
}

func soak(ctx context.Context, env *reliability.Env, o options) (bool, string) {
	if o.bin == "" {
		return false, "-bin is required"
	}
	spec := reliability.ServerSpec{Bin: o.bin, Args: []string{"serve"},
		DatabaseURL: "sqlite://" + filepath.Join(env.Dir, "soak.sqlite"), LogFile: filepath.Join(env.Dir, "server.log"),
		Pool: reliability.PoolSpec{Provider: "dry-run", Target: 64, MaxProvisioning: 16, Settings: map[string]string{"latency_ms": "10"}}}
	srv, err := env.Start(ctx, spec, "")
	if err != nil {
		return false, err.Error()
	}
	defer srv.Stop(5 * time.Second)
	d := o.dur(60*time.Second, 10*time.Minute)
	rep, err := reliability.RunSoak(ctx, env, reliability.SoakConfig{URL: srv.URL, Pid: srv.Pid(), Clients: o.clients,
		Duration: d, Sample: max(d/60, time.Second), Seed: o.seed})
	if err != nil {
		return false, err.Error()
	}
	if srv.Exited() {
		return false, "the server died during the soak: " + rep.String()
	}
	return rep.Passed(), fmt.Sprintf("%d clients for %s: %s", o.clients, d, rep)
}

func rss(ctx context.Context, env *reliability.Env, o options) (bool, string) {
	if o.bin == "" {
		return false, "-bin is required"
	}
	d := o.dur(30*time.Second, 10*time.Minute)
	rep, err := reliability.RunRSS(ctx, env, reliability.RSSConfig{Bin: o.bin, Leases: 1000, Terminal: 100000,
		Soak: reliability.SoakConfig{Clients: 16, Duration: d, Sample: max(d/60, time.Second), Seed: o.seed}})
	if err != nil {
		return false, err.Error()
	}
	return rep.Passed(), fmt.Sprintf("16 clients for %s: %s", d, rep)
}

func outage(ctx context.Context, env *reliability.Env, check string, o options) (bool, string) {
	if o.bin == "" {
		return false, "-bin is required"
	}
	cfg := reliability.OutageConfig{Bin: o.bin, Fault: check, Clients: 12, Between: 2 * time.Second, Hold: 2 * time.Second,
		Recovery: 15 * time.Second, Converge: 60 * time.Second, Seed: o.seed, Outages: o.kills}
	if cfg.Outages == 0 {
		cfg.Outages = map[bool]int{true: 4, false: 16}[o.quick]
	}
	rep, err := reliability.RunOutage(ctx, env, cfg)
	if err != nil {
		return false, err.Error()
	}
	return len(rep.Violations) == 0, rep.String()
}

func skew(ctx context.Context, env *reliability.Env, o options) (bool, string) {
	if o.postgres == "" {
		return false, "-postgres (or SANDBOXWICH_RELIABILITY_POSTGRES) is required"
	}
	cfg := reliability.SkewConfig{Postgres: o.postgres, Skew: 5 * time.Second, Leases: 40, Parallel: 8, LeaseSeconds: 2,
		Bound: 100 * time.Millisecond, Canary: 4}
	if !o.quick {
		cfg.Leases = 400
	}
	rep, err := reliability.RunSkew(ctx, env, cfg)
	if err != nil {
		return false, err.Error()
	}
	return rep.Passed(), fmt.Sprintf("bound ±%s: %s", cfg.Bound, rep)
}

func agentFence(ctx context.Context, env *reliability.Env, o options) (bool, string) {
	if o.bin == "" {
		return false, "-bin is required"
	}
	if _, err := exec.LookPath("runsc"); err != nil {
		return false, "runsc is not installed (scripts/install-runsc.sh)"
	}
	rep, err := reliability.RunAgentFence(ctx, env, reliability.AgentFenceConfig{Bin: o.bin, Clients: 2,
		Duration: o.dur(20*time.Second, 3*time.Minute)})
	if err != nil {
		return false, err.Error()
	}
	return rep.Passed(), rep.String()
}

// crashTwo runs two crash-gvisor loops at once, each its own installation
// (database, key, tokens) with its own pool, on one runsc state and bundle
// root, beside a bystander cell of a third installation: each loop's checks
// (every non-terminal member has its container, every container a member,
// every acknowledged lease its cell) would fail if either plane took the
// other's containers for its orphans, and the bystander must survive both.
func crashTwo(ctx context.Context, env *reliability.Env, o options) (bool, string) {
	if o.bin == "" {
		return false, "-bin is required"
	}
	if _, err := exec.LookPath("runsc"); err != nil {
		return false, "runsc is not installed (scripts/install-runsc.sh)"
	}
	shared := filepath.Join(env.Dir, "shared")
	defer reliability.RemoveGVisorRoots(shared)
	// A bystander: a cell of a third installation on the same roots, which
	// neither plane may touch. Listing it through its own installation
	// before the loops is the check's positive control.
	by, err := gvisor.New(gvisor.Config{StateDir: filepath.Join(shared, "runsc-state"), BundleDir: filepath.Join(shared, "runsc-bundles"),
		Pool: "rel", Installation: driver.InstallationTag(uuid.NewString()), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return false, err.Error()
	}
	cell, err := by.Provision(ctx, driver.ProvisionRequest{CellID: uuid.Must(uuid.NewV7()), RuntimeClass: lease.GVisorLowerRisk})
	if err != nil {
		return false, "the bystander cell: " + err.Error()
	}
	defer func() { _ = by.Destroy(context.Background(), cell) }()
	bystander := func() bool {
		objs, err := by.List(ctx)
		return err == nil && len(objs) == 1 && objs[0].CellID == cell.CellID
	}
	if !bystander() {
		return false, "the bystander cell is not listed through its own installation"
	}
	kills := o.kills
	if kills == 0 {
		kills = map[bool]int{true: 3, false: 12}[o.quick]
	}
	type result struct {
		rep reliability.CrashReport
		err error
	}
	results := make([]result, 2)
	var wg sync.WaitGroup
	for i := range results {
		sub, err := reliability.NewEnv(filepath.Join(env.Dir, fmt.Sprintf("plane-%d", i)), env.Log)
		if err != nil {
			return false, err.Error()
		}
		cfg := reliability.CrashConfig{Bin: o.bin, Seed: o.seed + uint64(i), Faults: true, Provider: "gvisor", Target: 2, MaxProv: 2,
			Clients: 2, ReadyTTL: 60, Kills: kills, MinUp: 500 * time.Millisecond, MaxUp: 8 * time.Second,
			LockTTL: 10 * time.Second, Converge: 3 * time.Minute, SharedRoot: shared}
		wg.Go(func() { results[i].rep, results[i].err = reliability.RunCrash(ctx, sub, cfg) })
	}
	wg.Wait()
	ok, lines := true, make([]string, 3)
	lines[2] = "the bystander of a third installation survived both"
	if !bystander() {
		ok, lines[2] = false, "VIOLATION: the bystander cell of a third installation is gone"
	}
	for i, r := range results {
		switch {
		case r.err != nil:
			ok, lines[i] = false, fmt.Sprintf("plane %d: %v", i, r.err)
		default:
			ok = ok && len(r.rep.Violations) == 0
			lines[i] = fmt.Sprintf("plane %d: %s", i, r.rep)
		}
	}
	return ok, strings.Join(lines, "; ")
}
