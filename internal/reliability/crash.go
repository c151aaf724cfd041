package reliability

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/client"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/gvisor"
	"github.com/sandboxwich/sandboxwich/internal/dirprovider"
	"github.com/sandboxwich/sandboxwich/internal/testimage"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/wire"
)

// CrashConfig configures a crash-recovery loop.
type CrashConfig struct {
	// Bin is the sandboxwich binary; the loop runs it as `serve`.
	Bin string
	// Provider is "dir" or "gvisor".
	Provider        string
	Target, MaxProv int
	// Kills is the number of SIGKILLs; each comes MinUp to MaxUp after the
	// server became ready.
	Kills        int
	MinUp, MaxUp time.Duration
	Clients      int
	// Faults injects destroy faults (dir provider) until the last restart.
	Faults bool
	// Converge bounds the wait for the pool to settle after the load.
	Converge time.Duration
	// LockTTL is the executor lock TTL of the server.
	LockTTL time.Duration
	// ReadyTTL is the pool's ready TTL in seconds (default 20: short, so
	// that ready cells also expire and are stopped during the run).
	ReadyTTL int
	// DatabaseURL defaults to a SQLite file in the run directory.
	DatabaseURL string
	// SharedRoot, for the gvisor provider, is where the runsc state and
	// bundle roots are, shared with another run's server of another
	// installation (default: the run's own directory). A run with a shared
	// root destroys only its own installation's containers at the end and
	// leaves the roots to the caller (RemoveGVisorRoots).
	SharedRoot string
	// Images, for the gvisor provider, makes the pool an image class
	// (CONTRACT §21) of this many images — a static busybox and a marker
	// of its own each, on a loopback registry, pulled on demand into the
	// server's image cache — and every claim names one of them, with
	// wait_seconds (Target is then max_cells, MaxProv max_cold).
	Images int
	Seed   uint64
}

// CrashReport is what a crash loop observed.
type CrashReport struct {
	Kills, Claims, Releases, ClientErrors int
	// Interrupted counts, over all kills, the members found in each
	// transient state at the moment of the kill.
	Interrupted map[string]int
	// Snapshots, MaxLive and Leases come from the History.
	Snapshots, MaxLive, Leases int
	Final                      string // member counts after convergence
	Objects                    int    // provider objects after convergence
	ConvergeTime               time.Duration
	// ImageLeases counts the leases of an image class whose cell was
	// checked to run the image its claim named (CrashConfig.Images).
	ImageLeases int
	Violations  []string
}

func (r CrashReport) String() string {
	var parts []string
	for _, k := range []string{"provisioning", "stopping", "cleanup_pending", "leased"} {
		parts = append(parts, fmt.Sprintf("%s=%d", k, r.Interrupted[k]))
	}
	s := fmt.Sprintf("%d SIGKILLs (members caught mid-flight: %s), %d claims, %d releases, %d leases, "+
		"%d snapshots, max live %d, converged in %s to %s with %d provider objects",
		r.Kills, strings.Join(parts, " "), r.Claims, r.Releases, r.Leases, r.Snapshots, r.MaxLive,
		r.ConvergeTime.Round(100*time.Millisecond), r.Final, r.Objects)
	if r.ImageLeases > 0 {
		s += fmt.Sprintf(", %d leases each on a cell of its claim's image (canary caught)", r.ImageLeases)
	}
	if n := len(r.Violations); n > 0 {
		s += fmt.Sprintf("; %d VIOLATIONS: %s", n, strings.Join(r.Violations[:min(n, 5)], "; "))
	}
	return s
}

// crashRun is one crash loop.
type crashRun struct {
	cfg   CrashConfig
	env   *Env
	spec  ServerSpec
	addr  string
	hist  *History
	prov  driver.Lister
	stop  atomic.Bool
	mu    sync.Mutex
	rep   CrashReport
	cls   []*client.Client // load client i talks to cls[i % len]
	dirOf string
	acks  map[string]string // claim ID → lease ID of every answered claim
	codes map[string]int    // "status/code" of every 5xx answer, retries included
	refs  []string          // an image class's images (CrashConfig.Images)
	// imageOf maps the lease ID of every answered claim of an image to
	// that image.
	imageOf map[string]string
}

func newCrashRun(env *Env, cfg CrashConfig) *crashRun {
	r := &crashRun{cfg: cfg, env: env, hist: NewHistory(cfg.Target), acks: map[string]string{}, codes: map[string]int{},
		imageOf: map[string]string{}}
	r.rep.Interrupted = map[string]int{}
	return r
}

// RunCrash runs the loop: start the server, put claim and release load on
// it, SIGKILL it at random moments and restart it, checking the frozen
// state after every kill; then stop the load, let the pool converge, and
// check the final state.
func RunCrash(ctx context.Context, env *Env, cfg CrashConfig) (CrashReport, error) {
	r := newCrashRun(env, cfg)
	if cfg.DatabaseURL == "" {
		cfg.DatabaseURL = "sqlite://" + filepath.Join(env.Dir, "crash.sqlite")
		r.cfg.DatabaseURL = cfg.DatabaseURL
	}
	if cfg.ReadyTTL == 0 {
		cfg.ReadyTTL = 20
	}
	settings := map[string]string{}
	switch cfg.Provider {
	case "dir":
		r.dirOf = filepath.Join(env.Dir, "objects")
		if err := os.MkdirAll(r.dirOf, 0o700); err != nil {
			return r.rep, err
		}
		settings["path"] = r.dirOf
		settings["min_latency_ms"] = "50"
		settings["max_latency_ms"] = "200"
		r.prov = &dirprovider.Provider{Dir: r.dirOf}
	case "gvisor":
		root := env.Dir
		if cfg.SharedRoot != "" {
			root = cfg.SharedRoot
		}
		settings["state_dir"] = filepath.Join(root, "runsc-state")
		settings["bundle_dir"] = filepath.Join(root, "runsc-bundles")
		// The run lists the containers once the server has created its
		// database, which names the installation they carry.
		defer func() {
			if g, ok := r.prov.(*gvisor.Provider); ok {
				destroyAll(g)
				if cfg.SharedRoot == "" {
					RemoveGVisorRoots(root)
				}
			}
		}()
	default:
		return r.rep, fmt.Errorf("provider %q: want dir or gvisor", cfg.Provider)
	}
	r.spec = ServerSpec{Bin: cfg.Bin, Args: []string{"serve"}, DatabaseURL: cfg.DatabaseURL, SweepMillis: 100,
		LogFile: filepath.Join(env.Dir, "server.log"),
		Pool:    PoolSpec{Provider: cfg.Provider, Target: cfg.Target, MaxProvisioning: cfg.MaxProv, ReadyTTLSeconds: cfg.ReadyTTL, Settings: settings},
		Extra:   []string{"SANDBOXWICH_POOL_LOCK_TTL_MS=" + strconv.Itoa(int(cfg.LockTTL/time.Millisecond))}}
	if cfg.Images > 0 {
		if cfg.Provider != "gvisor" {
			return r.rep, errors.New("an image class needs the gvisor provider")
		}
		reg, err := r.serveImages(cfg.Images)
		if err != nil {
			return r.rep, err
		}
		defer reg.Close()
		settings["image_cache_dir"] = filepath.Join(env.Dir, "images")
		r.spec.Pool.Images = reg.Host + "/rel/*"
	}
	faults := func(on bool) {
		s := r.spec.Pool.Settings
		if on && cfg.Provider == "dir" {
			s["destroy_uncertain"], s["lost_destroy"] = "0.05", "0.05"
		} else {
			delete(s, "destroy_uncertain")
			delete(s, "lost_destroy")
		}
	}
	faults(cfg.Faults)
	var err error
	if r.addr, err = FreeAddr(); err != nil {
		return r.rep, err
	}
	db, err := OpenDB(cfg.DatabaseURL)
	if err != nil {
		return r.rep, err
	}
	defer db.Close()
	if err := r.connect(r.addr); err != nil {
		return r.rep, err
	}

	srv, err := env.Start(ctx, r.spec, r.addr)
	if err != nil {
		return r.rep, err
	}
	if cfg.Provider == "gvisor" {
		if r.prov, err = gvisorLister(ctx, db, settings); err != nil {
			srv.Kill()
			return r.rep, err
		}
	}
	var wg sync.WaitGroup
	for i := range cfg.Clients {
		wg.Go(func() { r.load(i) })
	}
	sampleCtx, stopSampling := context.WithCancel(ctx)
	wg.Go(func() { r.sample(sampleCtx, db) })

	rng := rand.New(rand.NewPCG(cfg.Seed, 7))
	for k := 0; k < cfg.Kills && ctx.Err() == nil; k++ {
		up := cfg.MinUp + time.Duration(rng.Int64N(int64(cfg.MaxUp-cfg.MinUp)))
		time.Sleep(up)
		srv.Kill()
		r.rep.Kills++
		r.frozen(ctx, db, false)
		if k == cfg.Kills-1 {
			faults(false) // the last life converges without faults
		}
		if srv, err = env.Start(ctx, r.spec, r.addr); err != nil {
			r.stop.Store(true)
			stopSampling()
			wg.Wait()
			return r.rep, fmt.Errorf("restart after kill %d: %w", k+1, err)
		}
	}
	r.stop.Store(true)
	stopSampling()
	wg.Wait()
	r.settle(ctx, db, srv.Kill)
	if g, ok := r.prov.(*gvisor.Provider); ok && cfg.SharedRoot == "" {
		// Every container destroyed, no runsc process may remain under
		// the run's state root: a sandbox whose `runsc run` a kill cut
		// short before it wrote the container's state is in no list.
		destroyAll(g)
		if procs := runscProcesses(settings["state_dir"], 5*time.Second); len(procs) > 0 {
			r.violation("runsc processes remain under the state root once every container was destroyed: %s",
				strings.Join(procs, ", "))
		}
	}
	return r.rep, nil
}

// runscProcesses returns the host processes (pid and program) run with
// --root=root that are still there after grace.
func runscProcesses(root string, grace time.Duration) []string {
	var found []string
	for deadline := time.Now().Add(grace); ; time.Sleep(100 * time.Millisecond) {
		found = found[:0]
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			if err != nil || len(raw) == 0 {
				continue
			}
			argv := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
			for i, a := range argv {
				if a == "--root="+root || (a == "--root" && i+1 < len(argv) && argv[i+1] == root) {
					found = append(found, e.Name()+" ("+filepath.Base(argv[0])+")")
					break
				}
			}
		}
		if len(found) == 0 || time.Now().After(deadline) {
			return found
		}
	}
}

// connect adds a load client of the server at addr.
func (r *crashRun) connect(addr string) error {
	hc := &http.Client{Transport: codeCounter{base: http.DefaultTransport, r: r}}
	cl, err := client.New("http://"+addr, client.WithToken(r.env.TenantToken), client.WithHTTPClient(hc),
		client.WithRetry(8, 50*time.Millisecond, time.Second))
	if err == nil {
		r.cls = append(r.cls, cl)
	}
	return err
}

// settle waits for the pool to converge once the load stopped, stops the
// servers (stop) and checks the final state: the provider's objects, and
// every lease a client was given.
func (r *crashRun) settle(ctx context.Context, db *DB, stop func()) Snapshot {
	cfg := r.cfg
	t0 := time.Now()
	settled := false
	for time.Since(t0) < cfg.Converge && ctx.Err() == nil {
		s, err := db.Snapshot(ctx)
		if err == nil {
			r.hist.Observe(s)
			objs, lerr := r.objects(ctx)
			// An image class keeps warm cells of the images claimed, not
			// a target.
			full := cfg.Images > 0 || s.Live() == cfg.Target
			if lerr == nil && full && len(CheckObjects(s, objs, true)) == 0 {
				settled = true
				break
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	r.rep.ConvergeTime = time.Since(t0)
	stop()
	final := r.frozen(ctx, db, true)
	if !settled {
		r.hist.mu.Lock()
		r.hist.violate("pool did not converge within %s: %s", cfg.Converge, final.Counts())
		r.hist.mu.Unlock()
	}
	r.checkAcknowledged(final)
	if cfg.Images > 0 {
		r.checkImages(final)
	}
	r.rep.Final = final.Counts()
	r.rep.Snapshots, r.rep.MaxLive, r.rep.Leases = r.hist.Stats()
	r.rep.Violations = append(r.rep.Violations, r.hist.Violations()...)
	return final
}

func (r *crashRun) objects(ctx context.Context) ([]string, error) {
	objs, err := r.prov.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(objs))
	for i, o := range objs {
		out[i] = o.CellID.String()
	}
	return out, nil
}

// frozen checks the state while no server runs: the snapshot and the
// provider's objects cannot change under the check.
func (r *crashRun) frozen(ctx context.Context, db *DB, settled bool) Snapshot {
	s, err := db.Snapshot(ctx)
	if err != nil {
		r.violation("snapshot after kill: %v", err)
		return s
	}
	r.hist.Observe(s)
	objs, err := r.objects(ctx)
	if err != nil {
		r.violation("provider list after kill: %v", err)
		return s
	}
	for _, v := range CheckObjects(s, objs, settled) {
		r.violation("after kill %d: %s", r.rep.Kills, v)
	}
	for _, v := range s.ReplayViolations() {
		r.violation("after kill %d: event log: %s", r.rep.Kills, v)
	}
	if settled {
		r.rep.Objects = len(objs)
	} else {
		for _, m := range s.Members {
			r.rep.Interrupted[m.State]++
		}
	}
	return s
}

func (r *crashRun) violation(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.rep.Violations) < 50 {
		r.rep.Violations = append(r.rep.Violations, fmt.Sprintf(format, args...))
	}
}

// sample snapshots the database while the server runs.
func (r *crashRun) sample(ctx context.Context, db *DB) {
	for ctx.Err() == nil {
		if s, err := db.Snapshot(ctx); err == nil {
			r.hist.Observe(s)
		}
		select {
		case <-ctx.Done():
		case <-time.After(150 * time.Millisecond):
		}
	}
}

// load claims, validates and releases cells until stopped. Errors while
// the server is down are expected; a claim that never got an answer is
// retried under the same claim ID.
func (r *crashRun) load(i int) {
	rng := rand.New(rand.NewPCG(r.cfg.Seed, uint64(100+i)))
	cl := r.cls[i%len(r.cls)]
	binding := lease.Binding{OrganizationID: "org-crash", WorkspaceID: "ws", ThreadID: fmt.Sprintf("t-%d", i), RunnerSessionID: "s"}
	var claimID uuid.UUID
	seconds := uint64(10) // below the pool's ready TTL, so that ready cells are claimable
	wait := uint64(20)
	var req wire.ClaimRequest
	for !r.stop.Load() {
		if claimID == uuid.Nil {
			// A claim's retries resend its body: its image too.
			claimID = uuid.Must(uuid.NewV7())
			req = wire.ClaimRequest{ClaimID: &claimID, Release: r.env.Release, Binding: binding, LeaseSeconds: &seconds}
			if len(r.refs) > 0 {
				req.Image, req.WaitSeconds = &r.refs[rng.IntN(len(r.refs))], &wait
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second+time.Duration(wait)*time.Second)
		c, err := cl.Claim(ctx, req)
		cancel()
		var ce *client.Error
		switch {
		case err != nil && errors.As(err, &ce) && ce.Status == http.StatusConflict:
			claimID = uuid.Nil // its lease ended while we were away
			continue
		case err != nil:
			r.count(func() { r.rep.ClientErrors++ })
			time.Sleep(100 * time.Millisecond)
			continue // same claim ID next time
		}
		claimID = uuid.Nil
		if c.Empty() {
			time.Sleep(time.Duration(20+rng.IntN(80)) * time.Millisecond)
			continue
		}
		r.count(func() { r.rep.Claims++ })
		r.hist.Claimed(c.Lease.LeaseID.String(), c.Lease.CellID.String())
		r.ack(c)
		if req.Image != nil {
			r.count(func() { r.imageOf[c.Lease.LeaseID.String()] = *req.Image })
		}
		time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
		d := lease.Destroyed
		if rng.IntN(10) == 0 {
			d = lease.Quarantined
		}
		for attempt := 0; attempt < 20 && !r.stop.Load(); attempt++ {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := cl.Release(ctx, c.Lease.LeaseID, c.Proof(), d)
			cancel()
			if err == nil || (errors.As(err, &ce) && ce.Status < 500) {
				r.count(func() { r.rep.Releases++ })
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// codeCounter counts every 5xx answer by status and wire code, each
// attempt of the client's retries on its own.
type codeCounter struct {
	base http.RoundTripper
	r    *crashRun
}

func (t codeCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if err != nil || resp.StatusCode < 500 {
		return resp, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	var e struct{ Code string }
	_ = json.Unmarshal(body, &e)
	t.r.count(func() { t.r.codes[fmt.Sprintf("%d/%s", resp.StatusCode, e.Code)]++ })
	resp.Body = io.NopCloser(bytes.NewReader(body))
	return resp, nil
}

// failures returns a copy of the counts of 5xx answers by status/code.
func (r *crashRun) failures() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.codes)
}

// claims returns the number of acknowledged claims.
func (r *crashRun) claims() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rep.Claims
}

func (r *crashRun) count(fn func()) {
	r.mu.Lock()
	fn()
	r.mu.Unlock()
}

func (r *crashRun) ack(c client.Claim) {
	r.mu.Lock()
	r.acks[c.ClaimID.String()] = c.Lease.LeaseID.String()
	r.mu.Unlock()
}

// checkAcknowledged verifies that every lease a client was given survived
// the kills: its claim fence names it and its cell holds it.
func (r *crashRun) checkAcknowledged(s Snapshot) {
	r.mu.Lock()
	acks := maps.Clone(r.acks)
	r.mu.Unlock()
	for _, v := range lostAcks(acks, s) {
		r.violation("%s", v)
	}
}

// ackCanary reports whether checkAcknowledged would catch a claim that
// was answered with a lease the database does not hold: the acknowledged
// claims plus one made up, checked against the final snapshot s.
func (r *crashRun) ackCanary(s Snapshot) bool {
	r.mu.Lock()
	acks := maps.Clone(r.acks)
	r.mu.Unlock()
	acks[uuid.NewString()] = uuid.NewString()
	return len(lostAcks(acks, s)) > 0
}

// lostAcks returns a violation for every acknowledged claim (claim ID →
// lease ID) whose fence or lease s does not hold.
func lostAcks(acks map[string]string, s Snapshot) []string {
	var out []string
	for claimID, leaseID := range acks {
		if got, ok := s.Fences[claimID]; !ok || got != leaseID {
			out = append(out, fmt.Sprintf("acknowledged claim %s (lease %s) lost: fence holds %q", claimID, leaseID, got))
		}
	}
	found := map[string]bool{}
	for _, c := range s.Cells {
		if c.Lease != "" {
			found[c.Lease] = true
		}
	}
	for _, leaseID := range acks {
		if !found[leaseID] {
			out = append(out, fmt.Sprintf("acknowledged lease %s is on no cell", leaseID))
		}
	}
	return out
}

// serveImages serves n marked busybox images (rel/img-NN) on a loopback
// registry, the images of the run's claims.
func (r *crashRun) serveImages(n int) (*testimage.Registry, error) {
	busybox, err := testimage.StaticBusybox()
	if err != nil {
		return nil, err
	}
	reg, err := testimage.Serve()
	if err != nil {
		return nil, err
	}
	for i := range n {
		img, err := testimage.Marked(busybox, strconv.Itoa(i))
		if err == nil {
			var ref string
			ref, err = reg.Push(fmt.Sprintf("rel/img-%02d", i), img)
			r.refs = append(r.refs, ref)
		}
		if err != nil {
			_ = reg.Close()
			return nil, err
		}
	}
	return reg, nil
}

// checkImages verifies, on the final snapshot s, that every lease of an
// image a client was given is on a cell of that image (the cells' image
// is written once, when they are made), and that the check is not vacuous:
// some were given, and one made to name another image is caught.
func (r *crashRun) checkImages(s Snapshot) {
	r.mu.Lock()
	imageOf := maps.Clone(r.imageOf)
	r.mu.Unlock()
	for _, v := range wrongImages(imageOf, s) {
		r.violation("%s", v)
	}
	r.rep.ImageLeases = len(imageOf)
	if len(imageOf) == 0 {
		r.violation("no claim of an image was answered with a lease")
		return
	}
	for _, c := range s.Cells {
		if image, ok := imageOf[c.Lease]; ok && c.Lease != "" {
			imageOf[c.Lease] = image + "0" // another image, as a store that mixed them up would answer
			break
		}
	}
	if len(wrongImages(imageOf, s)) == 0 {
		r.violation("canary: a lease on a cell of another image than its claim's went unnoticed")
	}
}

// wrongImages returns a violation for every lease (lease ID → the image
// its claim named) that s holds on a cell of another image.
func wrongImages(imageOf map[string]string, s Snapshot) []string {
	var out []string
	for _, c := range s.Cells {
		if want, ok := imageOf[c.Lease]; ok && c.Lease != "" && c.Image != want {
			out = append(out, fmt.Sprintf("lease %s is on cell %s of image %q; its claim named %q", c.Lease, c.ID, c.Image, want))
		}
	}
	return out
}

// gvisorLister is the gVisor driver over the server's state root, listing
// the containers of the installation db names, as the server's own does.
func gvisorLister(ctx context.Context, db *DB, settings map[string]string) (*gvisor.Provider, error) {
	installation, err := db.Installation(ctx)
	if err != nil {
		return nil, err
	}
	return gvisor.New(gvisor.Config{StateDir: settings["state_dir"], BundleDir: settings["bundle_dir"], Pool: "rel",
		Installation: driver.InstallationTag(installation), Logger: slog.New(slog.DiscardHandler)})
}

// cleanupGVisor destroys every runsc container of g's installation and
// removes the roots under root.
func cleanupGVisor(g *gvisor.Provider, root string) {
	destroyAll(g)
	RemoveGVisorRoots(root)
}

// destroyAll destroys every runsc container of g's installation.
func destroyAll(g *gvisor.Provider) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if objs, err := g.List(ctx); err == nil {
		for _, o := range objs {
			_ = g.Destroy(ctx, o)
		}
	}
}

// RemoveGVisorRoots removes the runsc state root and the bundle root under
// root, with the host directory of a cell whose destroy a stopped server
// left half done (its container deleted, its bundle not yet: the server's
// next start would finish it, but a run has no next start).
func RemoveGVisorRoots(root string) {
	_ = gvisor.RemoveStateDir(filepath.Join(root, "runsc-state"))
	bundles := filepath.Join(root, "runsc-bundles")
	if b, err := os.ReadFile("/proc/self/mounts"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) > 1 && strings.HasPrefix(f[1], bundles+"/") {
				_ = syscall.Unmount(f[1], syscall.MNT_DETACH)
			}
		}
	}
	_ = os.RemoveAll(bundles)
}
