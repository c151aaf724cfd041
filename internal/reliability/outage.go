package reliability

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sandboxwich/sandboxwich/internal/dirprovider"
)

// OutageConfig configures an outage loop: the servers keep running while
// their database goes away and comes back.
type OutageConfig struct {
	Bin string
	// Fault is "pg-restart" (a private PostgreSQL cluster, shared by two
	// replicas, stopped and started with pg_ctl's fast and immediate
	// modes) or "disk-full" (a SQLite database on a size-limited tmpfs
	// that a filler file fills up while commits run).
	Fault   string
	Outages int
	Clients int
	// Between is the load time between outages; Hold how long the
	// database stays away (stopped, or the disk full).
	Between, Hold time.Duration
	// Recovery bounds the time from the database's return to every
	// server answering /readyz 200 and a claim succeeding again.
	Recovery time.Duration
	Converge time.Duration
	Seed     uint64
}

// OutageReport is what an outage loop observed, with the crash loop's
// counters and checks.
type OutageReport struct {
	CrashReport
	Outages int
	// Modes lists what each outage did ("restart-fast", "stop-immediate", "full", …).
	Modes []string
	// MaxRecovery is the longest time from the database's return to every
	// server ready and a claim acknowledged.
	MaxRecovery time.Duration
	// Codes counts the 5xx answers of the outages and recoveries by
	// status/code, every attempt of the clients' retries counted.
	Codes map[string]int
}

func (r OutageReport) String() string {
	var codes []string
	for k, v := range r.Codes {
		codes = append(codes, fmt.Sprintf("%s×%d", k, v))
	}
	slices.Sort(codes)
	c := r.CrashReport
	s := fmt.Sprintf("%d outages (%s), recovery max %s, 5xx answers: %s; %d claims, %d releases, %d leases, %d snapshots, "+
		"max live %d, converged in %s to %s with %d provider objects (canary: a lost acknowledged claim is caught)",
		r.Outages, strings.Join(r.Modes, " "), r.MaxRecovery.Round(10*time.Millisecond), strings.Join(codes, " "),
		c.Claims, c.Releases, c.Leases, c.Snapshots, c.MaxLive, c.ConvergeTime.Round(100*time.Millisecond), c.Final, c.Objects)
	if n := len(c.Violations); n > 0 {
		s += fmt.Sprintf("; %d VIOLATIONS: %s", n, strings.Join(c.Violations[:min(n, 5)], "; "))
	}
	return s
}

// outage is one way of taking the database away and bringing it back.
type outage interface {
	// place returns the spec replica i runs with, and the address it
	// listens on ("" for a free loopback port).
	place(i int, spec ServerSpec) (ServerSpec, string)
	// away takes the database away in the way of round k and reports what
	// it did.
	away(ctx context.Context, k int) (string, error)
	// back brings it back.
	back(ctx context.Context) error
	// gone returns the replicas whose database is away in a way their
	// /readyz must see (a stopped server, a cut link; a full disk still
	// answers reads).
	gone() []int
	// check returns a violation found in the database at the end, or "".
	check(ctx context.Context, db *DB) string
}

// RunOutage runs the loop: servers on a dir-provider pool under claim and
// release load, the database taken away and brought back cfg.Outages
// times; while it is away every /readyz must say 503 (when the database
// is stopped) and no server may die; after it returns every server must
// be ready and claims must succeed within cfg.Recovery; at the end the
// pool converges and every acknowledged claim and release is in the
// database (no answer claimed a commit that did not happen).
func RunOutage(ctx context.Context, env *Env, cfg OutageConfig) (OutageReport, error) {
	rep := OutageReport{Codes: map[string]int{}}
	crash := CrashConfig{Bin: cfg.Bin, Provider: "dir", Target: 8, MaxProv: 4, Clients: cfg.Clients,
		LockTTL: 3 * time.Second, Converge: cfg.Converge, ReadyTTL: 20, Seed: cfg.Seed}
	r := newCrashRun(env, crash)
	r.dirOf = filepath.Join(env.Dir, "objects")
	if err := os.MkdirAll(r.dirOf, 0o700); err != nil {
		return rep, err
	}
	r.prov = &dirprovider.Provider{Dir: r.dirOf}

	var (
		o        outage
		replicas int
	)
	switch cfg.Fault {
	case "pg-restart":
		c, err := StartCluster(ctx, nil, nil)
		if err != nil {
			return rep, err
		}
		defer c.Remove()
		crash.DatabaseURL, replicas = c.URL, 2
		o = &pgOutage{c: c, n: replicas}
	case "partition":
		p, err := newNetSplit(ctx, cfg.Bin, 2)
		if err != nil {
			return rep, err
		}
		defer p.remove()
		crash.DatabaseURL, replicas = p.c.URL, 2
		o = p
	case "disk-full":
		d, err := newFullDisk(filepath.Join(env.Dir, "disk"), 32<<20)
		if err != nil {
			return rep, err
		}
		defer d.remove()
		crash.DatabaseURL, replicas = "sqlite://"+filepath.Join(d.dir, "db.sqlite"), 1
		o = d
	default:
		return rep, fmt.Errorf("fault %q: want pg-restart or disk-full", cfg.Fault)
	}
	r.cfg.DatabaseURL = crash.DatabaseURL
	r.spec = ServerSpec{Bin: cfg.Bin, Args: []string{"serve"}, DatabaseURL: crash.DatabaseURL, SweepMillis: 100,
		Pool: PoolSpec{Provider: "dir", Target: crash.Target, MaxProvisioning: crash.MaxProv, ReadyTTLSeconds: crash.ReadyTTL,
			Settings: map[string]string{"path": r.dirOf, "min_latency_ms": "50", "max_latency_ms": "200"}},
		Extra: []string{"SANDBOXWICH_POOL_LOCK_TTL_MS=" + strconv.Itoa(int(crash.LockTTL/time.Millisecond))}}
	db, err := OpenDB(crash.DatabaseURL)
	if err != nil {
		return rep, err
	}
	defer db.Close()
	var servers []*Server
	stopAll := func() {
		for _, s := range servers {
			s.Kill()
		}
		servers = nil
	}
	defer func() { stopAll() }()
	for i := range replicas {
		spec, addr := o.place(i, r.spec)
		spec.LogFile = filepath.Join(env.Dir, fmt.Sprintf("server-%d.log", i))
		srv, err := env.Start(ctx, spec, addr)
		if err != nil {
			return rep, err
		}
		servers = append(servers, srv)
		if err := r.connect(srv.Addr); err != nil {
			return rep, err
		}
	}

	var wg sync.WaitGroup
	for i := range cfg.Clients {
		wg.Go(func() { r.load(i) })
	}
	sampleCtx, stopSampling := context.WithCancel(ctx)
	wg.Go(func() { r.sample(sampleCtx, db) })
	stopLoad := func() {
		r.stop.Store(true)
		stopSampling()
		wg.Wait()
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 11))
	for k := 0; k < cfg.Outages && ctx.Err() == nil; k++ {
		time.Sleep(cfg.Between/2 + time.Duration(rng.Int64N(int64(cfg.Between))))
		before := r.failures()
		mode, err := o.away(ctx, k)
		if err != nil {
			stopLoad()
			return rep, fmt.Errorf("outage %d: %w", k+1, err)
		}
		rep.Outages++
		rep.Modes = append(rep.Modes, mode)
		// A replica whose database is gone must say so.
		for _, i := range o.gone() {
			if ready(servers[i].URL) {
				r.violation("outage %d (%s): server %d answered /readyz 200 without its database", k+1, mode, i)
			}
		}
		time.Sleep(cfg.Hold)
		for i, s := range servers {
			if s.Exited() {
				r.violation("outage %d (%s): server %d died while its database was away: %s", k+1, mode, i, tail(s.log.Name()))
			}
		}
		if err := o.back(ctx); err != nil {
			stopLoad()
			return rep, fmt.Errorf("outage %d: back: %w", k+1, err)
		}
		returned := time.Now()
		claims := r.claims()
		for _, s := range servers {
			for !ready(s.URL) && time.Since(returned) < cfg.Recovery {
				time.Sleep(20 * time.Millisecond)
			}
		}
		for r.claims() == claims && time.Since(returned) < cfg.Recovery {
			time.Sleep(20 * time.Millisecond)
		}
		took := time.Since(returned)
		rep.MaxRecovery = max(rep.MaxRecovery, took)
		if took >= cfg.Recovery {
			r.violation("outage %d (%s): not recovered within %s of the database's return", k+1, mode, cfg.Recovery)
		}
		for code, n := range r.failures() {
			if d := n - before[code]; d > 0 {
				rep.Codes[code] += d
			}
		}
	}
	stopLoad()
	for code, n := range rep.Codes {
		if strings.HasPrefix(code, "500/") {
			r.violation("%d answers were %s while the database was away, not 503 store_unavailable", n, code)
		}
	}
	final := r.settle(ctx, db, stopAll)
	if v := o.check(ctx, db); v != "" {
		r.violation("%s", v)
	}
	if !r.ackCanary(final) {
		r.violation("canary: a made-up acknowledged claim was not reported lost")
	}
	rep.CrashReport = r.rep
	return rep, nil
}

// pgOutage stops and starts a private PostgreSQL cluster.
type pgOutage struct {
	c       *Cluster
	n       int // replicas
	stopped bool
}

func (p *pgOutage) place(_ int, spec ServerSpec) (ServerSpec, string) { return spec, "" }

// The rounds cycle through pg_ctl restart and stop + hold + start, each
// with the fast and the immediate shutdown mode.
var pgModes = []struct {
	restart bool
	mode    string
}{{false, "fast"}, {false, "immediate"}, {true, "fast"}, {true, "immediate"}}

func (p *pgOutage) away(ctx context.Context, k int) (string, error) {
	m := pgModes[k%len(pgModes)]
	if m.restart {
		p.stopped = false
		return "restart-" + m.mode, p.c.Restart(ctx, m.mode)
	}
	p.stopped = true
	return "stop-" + m.mode, p.c.Stop(ctx, m.mode)
}

func (p *pgOutage) back(ctx context.Context) error {
	if !p.stopped {
		return nil
	}
	p.stopped = false
	return p.c.Start(ctx)
}

func (p *pgOutage) gone() []int {
	if !p.stopped {
		return nil
	}
	all := make([]int, p.n)
	for i := range all {
		all[i] = i
	}
	return all
}

func (p *pgOutage) check(context.Context, *DB) string { return "" }

// fullDisk is a tmpfs of a fixed size holding the SQLite database, filled
// by a filler file.
type fullDisk struct{ dir string }

func newFullDisk(dir string, size int) (*fullDisk, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := syscall.Mount("sbw-rel-disk", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "size="+strconv.Itoa(size)+",mode=0700"); err != nil {
		return nil, fmt.Errorf("mount a tmpfs for the full-disk check (needs root): %w", err)
	}
	return &fullDisk{dir: dir}, nil
}

func (d *fullDisk) filler() string { return filepath.Join(d.dir, "filler") }

// away writes the filler until the file system has no space left.
func (d *fullDisk) away(context.Context, int) (string, error) {
	f, err := os.OpenFile(d.filler(), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return "", err
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return "full", nil
			}
			return "", err
		}
	}
}

func (d *fullDisk) back(context.Context) error { return os.Remove(d.filler()) }

func (d *fullDisk) place(_ int, spec ServerSpec) (ServerSpec, string) { return spec, "" }

func (d *fullDisk) gone() []int { return nil }

// check runs SQLite's integrity check on the database the full disk held.
func (d *fullDisk) check(ctx context.Context, db *DB) string {
	var res string
	if err := db.db.QueryRowContext(ctx, "PRAGMA integrity_check").Scan(&res); err != nil {
		return "integrity check: " + err.Error()
	}
	if res != "ok" {
		return "integrity check: " + res
	}
	return ""
}

func (d *fullDisk) remove() {
	_ = syscall.Unmount(d.dir, syscall.MNT_DETACH)
}
