// Package pool keeps pools of sterile cells warm: the reconciler of
// CONTRACT §8.
//
// Every provider action follows intent → act → complete under fence: the
// intent is recorded in the store (a provisioning member, a stopping member
// with its fence), the provider is called outside any transaction, and the
// outcome is recorded only if the fence still matches. A crash at any point
// leaves a record the next pass resumes from. An executor lock on each
// member makes one process at a time act on its provider object, so several
// replicas can reconcile one database.
package pool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sync/errgroup"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/egress"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

// Config is one pool.
type Config struct {
	Name     string
	TenantID string
	// Release is the signed trust class of every cell of the pool.
	Release lease.Release
	// Target is the number of live members to keep (provisioning, ready,
	// leased, stopping and cleanup_pending all count). For an image class
	// it is max_cells: the most live members, of all images together.
	Target int
	// ReadyFloor holds back the pool's last ReadyFloor ready cells from
	// claims (default 0, at most Target).
	ReadyFloor int
	// MaxProvisioning bounds concurrent provisions (default Target). For
	// an image class it is max_cold.
	MaxProvisioning int
	// ReadyTTL is how long a ready cell may wait for a claim. A claim takes
	// only a cell that outlives the lease it asks for, so a pool serves
	// leases up to ReadyTTL only in a cell's first moments. The default is
	// three times the maximum lease (WithMaxLease), and at least DefaultReadyTTL (15 min),
	// so the longest lease is claimable for two thirds of a cell's life.
	ReadyTTL time.Duration
	// MaxCell bounds the life of a lease of the pool's cells, counted from
	// its claim: no renewal moves its expiry past claim time + MaxCell
	// (CONTRACT §20; pool key max_cell_seconds). Default DefaultMaxCell;
	// at least the maximum lease. After the claim, ReadyTTL no longer
	// bounds the cell.
	MaxCell time.Duration
	// Provider creates the pool's cells.
	Provider driver.Provider
	// Image is the OCI reference of the pool's cell image, pinned by
	// digest ("host/repo@sha256:<hex>"), or "" when the provider's own
	// root filesystem serves. Every verification requires the provider to
	// report exactly that digest as admitted (driver.Observation.ImageDigest).
	Image string
	// Images makes the pool an image class (CONTRACT §21; pool key
	// images): the repositories whose images, pinned by digest, its cells
	// are made of, per image, on demand — "host/repo", or "host/prefix/*"
	// for every repository under a prefix. An image class has no Image and
	// no ReadyFloor; its provider must provision per-cell images
	// (driver.Capabilities.Images). Only claims that name an image take
	// its cells.
	Images []string
	// WarmPerImage is the most ready cells an image class keeps of each
	// image claimed (or waited for) within WarmIdle (default
	// DefaultWarmPerImage), within Target: as many as the most of the
	// image's cells in use at once (leased or waited for) lately, at least
	// one.
	WarmPerImage int
	// WarmIdle is how long an image stays warm after its last claim or
	// wait (default DefaultWarmIdle); then its ready cells beyond the
	// claims waiting for it are stopped.
	WarmIdle time.Duration
	// Egress is the egress policy of the pool's cells (CONTRACT §22; pool
	// key egress): egress.None, the default, is loopback only; an
	// allow-list needs a provider that enforces one
	// (driver.Capabilities.Egress). A claim may narrow it, never widen it.
	Egress egress.Policy
}

// imageDigest is the digest c.Image is pinned by, or "" without an image.
func (c Config) imageDigest() string {
	d, _ := driver.PinnedDigest(c.Image)
	return d
}

// DefaultReadyTTL is the least default ready TTL: three times the default
// maximum lease of five minutes (CONTRACT §5). It deliberately differs from
// the contract's default of 300 s, which no claim for the maximum lease
// could ever be served under.
const DefaultReadyTTL = 15 * time.Minute

// DefaultMaxCell is the default of Config.MaxCell: a day (CONTRACT §20).
const DefaultMaxCell = 24 * time.Hour

// withDefaults fills defaults and validates, naming the offending field.
// maxLease is the reconciler's maximum lease.
func (c Config) withDefaults(maxLease time.Duration) (Config, error) {
	if c.MaxProvisioning == 0 {
		c.MaxProvisioning = c.Target
	}
	if c.ReadyTTL == 0 {
		c.ReadyTTL = max(DefaultReadyTTL, 3*maxLease)
	}
	if c.MaxCell == 0 {
		c.MaxCell = DefaultMaxCell
	}
	if c.WarmPerImage == 0 {
		c.WarmPerImage = DefaultWarmPerImage
	}
	if c.WarmIdle == 0 {
		c.WarmIdle = DefaultWarmIdle
	}
	if c.ImageClass() {
		if err := c.checkImageClass(); err != nil {
			return c, fmt.Errorf("pool %q: %w", c.Name, err)
		}
	}
	bad := func(field, rule string) (Config, error) {
		return c, fmt.Errorf("pool %q: %s %s", c.Name, field, rule)
	}
	switch {
	case !lease.ValidIdentifier(c.Name):
		return bad("name", "must be 1–256 characters of [A-Za-z0-9-_.:/]")
	case !lease.ValidIdentifier(c.TenantID):
		return bad("tenant_id", "must be 1–256 characters of [A-Za-z0-9-_.:/]")
	case c.Target < 0:
		return bad("target", "must not be negative")
	case c.ReadyFloor < 0 || c.ReadyFloor > c.Target:
		return bad("ready_floor", "must be between 0 and target")
	case c.Target > 0 && (c.MaxProvisioning < 1 || c.MaxProvisioning > c.Target):
		return bad("max_provisioning", "must be between 1 and target")
	case c.ReadyTTL <= 0:
		return bad("ready_ttl_seconds", "must be positive")
	case c.MaxCell < maxLease:
		return bad("max_cell_seconds", fmt.Sprintf("must be at least the maximum lease (%d s)", int64(maxLease/time.Second)))
	case c.Provider == nil:
		return bad("provider", "is required")
	case c.Image != "" && c.imageDigest() == "":
		return bad("image", "must be pinned by digest (host/repo@sha256:<64 hex digits>)")
	case c.Provider.Capabilities().Egress && !implementsEgress(c.Provider):
		return bad("provider", fmt.Sprintf("%s reports egress but cannot set a cell's (driver.EgressEnforcer)", c.Provider.Capabilities().Kind))
	case !c.Egress.IsNone() && !c.Provider.Capabilities().Egress:
		return bad("egress", fmt.Sprintf("allows hosts, but provider %s enforces no egress allow-list (only none)",
			c.Provider.Capabilities().Kind))
	case !slices.Contains(c.Provider.Capabilities().RuntimeClasses, c.Release.RuntimeClass):
		return bad("release.runtime_class", fmt.Sprintf("%q is not served by provider %s",
			c.Release.RuntimeClass, c.Provider.Capabilities().Kind))
	}
	return c, nil
}

// options are a Reconciler's settings, which Options set.
type options struct {
	Owner                            string
	Interval                         time.Duration
	Parallelism                      int
	LockTTL                          time.Duration
	ProvisionTimeout, DestroyTimeout time.Duration
	VerifyInterval                   time.Duration
	OrphanInterval                   time.Duration
	MaxLease                         time.Duration
	Now                              func() time.Time
	NewID                            func() uuid.UUID
	Logger                           *slog.Logger
	OnReady                          func(pool string)
}

// Option tunes a Reconciler. A zero or negative duration or count, a nil
// function and an empty owner keep the default.
type Option func(*options)

// WithOwner names this process in executor locks (default host:pid:random).
func WithOwner(owner string) Option { return func(o *options) { o.Owner = owner } }

// WithInterval sets the time between passes (default 1 s).
func WithInterval(d time.Duration) Option { return func(o *options) { o.Interval = d } }

// WithParallelism bounds concurrent stops and verifications (default 8).
func WithParallelism(n int) Option { return func(o *options) { o.Parallelism = n } }

// WithLockTTL bounds how long a crashed executor blocks a member (default
// 15 s). A live executor renews its lock every LockTTL/3 while a provider
// call runs, so calls may take longer than the TTL.
func WithLockTTL(d time.Duration) Option { return func(o *options) { o.LockTTL = d } }

// WithProvisionTimeout bounds a provision and its verification (default
// 2 min).
func WithProvisionTimeout(d time.Duration) Option { return func(o *options) { o.ProvisionTimeout = d } }

// WithDestroyTimeout bounds a destroy (default 1 min).
func WithDestroyTimeout(d time.Duration) Option { return func(o *options) { o.DestroyTimeout = d } }

// WithVerifyInterval sets how often ready members are re-verified
// (default 10 s).
func WithVerifyInterval(d time.Duration) Option { return func(o *options) { o.VerifyInterval = d } }

// WithOrphanInterval sets how often listing providers are searched for
// objects without a live member (default 30 s).
func WithOrphanInterval(d time.Duration) Option { return func(o *options) { o.OrphanInterval = d } }

// WithMaxLease sets the longest lease a claim may ask for (default five
// minutes; a Plane passes its own). It sets the default ready TTL, and New
// warns about each pool whose ready TTL does not exceed it: a claim for
// the longest lease finds none of its cells.
func WithMaxLease(d time.Duration) Option { return func(o *options) { o.MaxLease = d } }

// WithClock sets the clock (default time.Now; a Plane passes its own).
func WithClock(now func() time.Time) Option { return func(o *options) { o.Now = now } }

// WithIDs sets the source of new member IDs (default UUIDv7; a Plane
// passes its own).
func WithIDs(newID func() uuid.UUID) Option { return func(o *options) { o.NewID = newID } }

// WithLogger sets the logger (default slog.Default; a Plane passes its
// own).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.Logger = l } }

// WithOnReady sets a function called, with the pool's name, each time
// this reconciler admits a cell as ready (a Plane passes its own, to wake
// the claims waiting for one). It must not block.
func WithOnReady(fn func(pool string)) Option { return func(o *options) { o.OnReady = fn } }

func (o options) withDefaults() options {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.Interval, time.Second)
	def(&o.LockTTL, 15*time.Second)
	def(&o.ProvisionTimeout, 2*time.Minute)
	def(&o.DestroyTimeout, time.Minute)
	def(&o.VerifyInterval, 10*time.Second)
	def(&o.OrphanInterval, 30*time.Second)
	def(&o.MaxLease, 5*time.Minute)
	if o.Parallelism <= 0 {
		o.Parallelism = 8
	}
	if o.Owner == "" {
		host, _ := os.Hostname()
		o.Owner = fmt.Sprintf("%s:%d:%08x", host, os.Getpid(), rand.Uint32())
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.NewID == nil {
		o.NewID = func() uuid.UUID { return uuid.Must(uuid.NewV7()) }
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Reconciler runs the pools. It is safe for concurrent use.
type Reconciler struct {
	store   store.Pools
	opt     options
	trigger chan struct{}
	slots   chan struct{} // one per member action in flight (Parallelism)

	mu    sync.Mutex
	pools map[string]*poolState
	order []string
	busy  map[uuid.UUID]struct{} // members with a job in flight
}

type poolState struct {
	cfg           Config
	caps          driver.Capabilities
	lastReconcile time.Time
	lastError     string
	prepareError  string
	lastOrphans   time.Time
	verified      map[uuid.UUID]time.Time
	jobErrs       []error // of jobs ended since the last pass
	// demand is an image class's demand by image (demand.go), and images
	// and starved what its last pass planned, under the reconciler's mu.
	demand  map[string]*imageDemand
	images  []ImageStatus
	starved map[string]bool // images a waiting claim found no room for (Starved)
}

// New returns a Reconciler for the pools over st, the pools' role of a
// store (every store.Store is one). Pool names must be unique.
func New(st store.Pools, pools []Config, opts ...Option) (*Reconciler, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	r := &Reconciler{store: st, opt: o.withDefaults(), trigger: make(chan struct{}, 1), pools: map[string]*poolState{},
		busy: map[uuid.UUID]struct{}{}}
	r.slots = make(chan struct{}, r.opt.Parallelism)
	for _, c := range pools {
		c, err := c.withDefaults(r.opt.MaxLease)
		if err != nil {
			return nil, err
		}
		if _, dup := r.pools[c.Name]; dup {
			return nil, fmt.Errorf("pool %q: name is used twice", c.Name)
		}
		if c.ReadyTTL <= r.opt.MaxLease {
			r.opt.Logger.Warn("pool ready TTL cannot serve the maximum lease: a claim for it finds none of the pool's cells",
				"pool", c.Name, "ready_ttl", c.ReadyTTL, "max_lease", r.opt.MaxLease)
		}
		r.pools[c.Name] = &poolState{cfg: c, caps: c.Provider.Capabilities(), verified: map[uuid.UUID]time.Time{}}
		r.order = append(r.order, c.Name)
	}
	return r, nil
}

// Pool returns a pool's configuration.
func (r *Reconciler) Pool(name string) (Config, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ps, ok := r.pools[name]
	if !ok {
		return Config{}, false
	}
	return ps.cfg, true
}

// Names returns the pool names in configuration order.
func (r *Reconciler) Names() []string { return slices.Clone(r.order) }

// SetTarget changes a pool's target; 0 drains it. The change takes effect
// at the next pass.
func (r *Reconciler) SetTarget(name string, target int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	ps, ok := r.pools[name]
	if !ok {
		return fmt.Errorf("pool %q: not configured", name)
	}
	c := ps.cfg
	c.Target = target
	c.ReadyFloor = min(c.ReadyFloor, target)
	c.MaxProvisioning = max(min(c.MaxProvisioning, target), min(1, target))
	c, err := c.withDefaults(r.opt.MaxLease)
	if err != nil {
		return err
	}
	ps.cfg = c
	r.Trigger()
	return nil
}

// Trigger asks for a pass as soon as possible (after a claim, for example).
// It never blocks.
func (r *Reconciler) Trigger() {
	select {
	case r.trigger <- struct{}{}:
	default:
	}
}

// Run reconciles every Interval and on Trigger until ctx ends. A pass
// starts what members need (a stop, a destroy, a verification) and the
// provisioning of new ones as jobs, and does not wait for them: a job that
// ends asks for another pass, so a cell released while others provision is
// destroyed at once, and its replacement provisioned as soon as its
// deletion is proven. A member with a job in flight is left to it. A pass
// that started provisions is followed at once by another, so a pool
// refills at the pace of its provider. Run returns once ctx ended and its
// jobs did.
func (r *Reconciler) Run(ctx context.Context) error {
	t := time.NewTicker(r.opt.Interval)
	defer t.Stop()
	var jobs sync.WaitGroup
	defer jobs.Wait()
	for {
		progressed := r.pass(ctx, &jobs, false)
		if ctx.Err() != nil {
			return nil
		}
		if progressed {
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-r.trigger:
		}
	}
}

// Pass runs one reconciliation of every pool, waiting for the jobs it
// starts, and reports whether it created members. Errors are recorded per
// pool (Status) and logged.
func (r *Reconciler) Pass(ctx context.Context) (created bool) {
	var jobs sync.WaitGroup
	return r.pass(ctx, &jobs, true)
}

// pass reconciles every pool, adding the jobs it starts to jobs; with
// wait, each pool's jobs end before the next pool (reconcile). A pool's
// recorded error is the pass's and that of every job ended since the
// last.
func (r *Reconciler) pass(ctx context.Context, jobs *sync.WaitGroup, wait bool) (created bool) {
	for _, name := range r.order {
		r.mu.Lock()
		ps := r.pools[name]
		cfg := ps.cfg
		r.mu.Unlock()
		n, err := r.reconcile(ctx, ps, cfg, jobs, wait)
		created = created || n > 0
		r.mu.Lock()
		err = errors.Join(append([]error{err}, ps.jobErrs...)...)
		ps.jobErrs = nil
		ps.lastReconcile = r.opt.Now().UTC()
		ps.lastError = ""
		if err != nil && ctx.Err() == nil {
			ps.lastError = err.Error()
			r.opt.Logger.Warn("pool reconcile", "pool", name, "error", err)
		}
		r.mu.Unlock()
	}
	return created
}

// liveStates are the member states that count against a pool's target.
var liveStates = []lease.MemberState{lease.MemberProvisioning, lease.MemberReady, lease.MemberLeased,
	lease.MemberStopping, lease.MemberCleanupPending}

// reconcile starts, as jobs, what the pool's members need and the
// provisioning of the members it creates, and returns how many it created.
// With wait, it returns once its jobs ended, and the members' jobs end
// before it creates any, so a member stopped in this pass is replaced in
// it.
func (r *Reconciler) reconcile(ctx context.Context, ps *poolState, cfg Config, jobs *sync.WaitGroup, wait bool) (int, error) {
	members, err := r.store.Members(ctx, cfg.Name, liveStates...)
	if err != nil {
		return 0, err
	}
	now := r.opt.Now()
	var errs errList
	excess := len(members) - cfg.Target
	var plan imagePlan
	if cfg.ImageClass() {
		plan = r.planImages(ps, cfg, members, now)
	}
	for _, m := range members {
		if r.isBusy(m.CellID) {
			continue
		}
		act := r.decide(ps, cfg, m, now, &excess)
		if why := plan.stop[m.CellID]; why != "" && m.State == lease.MemberReady {
			act = func(ctx context.Context) error {
				return r.stop(ctx, cfg, m, m.State, lease.Quarantined, why, "")
			}
		}
		if act == nil {
			continue
		}
		// At most Parallelism member actions at once.
		select {
		case r.slots <- struct{}{}:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		r.start(ps, m.CellID, jobs, func() error {
			defer func() { <-r.slots }()
			return r.locked(ctx, m.CellID, func() error { return act(ctx) })
		})
	}
	if wait {
		jobs.Wait()
	}

	prepared := true
	if prep, ok := cfg.Provider.(driver.Preparer); ok && cfg.Target > 0 {
		err := prep.Prepare(ctx)
		r.mu.Lock()
		ps.prepareError = ""
		if err != nil && ctx.Err() == nil {
			ps.prepareError = err.Error()
		}
		r.mu.Unlock()
		if err != nil {
			// No member is created before the provider can serve one (its
			// image pulled): the error is the pool's last_error.
			errs.add(fmt.Errorf("provider not prepared: %w", err))
			prepared = false
		}
	}
	var created []store.Member
	if prepared && (!cfg.ImageClass() || len(plan.create) > 0) {
		created, err = r.store.Replenish(ctx, store.ReplenishParams{
			Pool: cfg.Name, TenantID: cfg.TenantID, Target: cfg.Target, MaxProvisioning: cfg.MaxProvisioning,
			Images: plan.create, NewID: r.opt.NewID, Owner: r.opt.Owner, LockUntil: now.Add(r.opt.LockTTL), Now: now,
		})
		if err != nil {
			errs.add(err)
		}
	}
	for _, m := range created {
		r.start(ps, m.CellID, jobs, func() error {
			defer r.hold(ctx, m.CellID)()
			return r.provision(ctx, cfg, m)
		})
	}
	if wait {
		jobs.Wait()
	}

	if lister, ok := cfg.Provider.(driver.Lister); ok && now.Sub(ps.lastOrphans) >= r.opt.OrphanInterval {
		ps.lastOrphans = now
		errs.add(r.destroyOrphans(ctx, cfg, lister))
	}
	return len(created), errs.err()
}

// isBusy reports whether member id has a job in flight.
func (r *Reconciler) isBusy(id uuid.UUID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.busy[id]
	return ok
}

// start runs job for member id on a goroutine of its own, the member busy
// until it ends; its error goes to the pool's next recorded error, and
// its end asks for another pass.
func (r *Reconciler) start(ps *poolState, id uuid.UUID, jobs *sync.WaitGroup, job func() error) {
	r.mu.Lock()
	r.busy[id] = struct{}{}
	r.mu.Unlock()
	jobs.Add(1)
	go func() {
		defer jobs.Done()
		err := job()
		r.mu.Lock()
		delete(r.busy, id)
		if err != nil {
			ps.jobErrs = append(ps.jobErrs, err)
		}
		r.mu.Unlock()
		r.Trigger()
	}()
}

// decide returns what a member needs now, or nil.
func (r *Reconciler) decide(ps *poolState, cfg Config, m store.Member, now time.Time, excess *int) func(context.Context) error {
	stop := func(reason, code string) func(context.Context) error {
		return func(ctx context.Context) error {
			return r.stop(ctx, cfg, m, m.State, lease.Quarantined, reason, code)
		}
	}
	switch m.State {
	case lease.MemberProvisioning:
		// Ours are busy until their job ends, so one found here was left
		// by a crash (its lock will have expired) or belongs to another
		// replica (its lock holds, and locked skips it).
		return func(ctx context.Context) error { return r.provision(ctx, cfg, m) }
	case lease.MemberReady:
		c := m.Cell
		switch {
		case c == nil || c.State != lease.Ready:
			return stop("cell is no longer ready", "")
		case !now.Before(c.ExpiresAt):
			return stop("ready TTL expired", store.ReasonReadyTTL)
		case *excess > 0:
			*excess--
			return stop("pool is above its target", "")
		}
		r.mu.Lock()
		due := now.Sub(ps.verified[m.CellID]) >= r.opt.VerifyInterval
		r.mu.Unlock()
		if !due {
			return nil
		}
		return func(ctx context.Context) error {
			obs, err := r.verify(ctx, cfg, m)
			if err != nil {
				return r.stop(ctx, cfg, m, m.State, lease.Quarantined, err.Error(), unverified(err))
			}
			r.mu.Lock()
			ps.verified[m.CellID] = now
			r.mu.Unlock()
			return r.store.RecordVerification(ctx, store.VerificationParams{CellID: m.CellID,
				RuntimeClass: obs.RuntimeClass, AgentDigest: obs.AgentDigest, ImageDigest: obs.ImageDigest, Now: r.opt.Now()})
		}
	case lease.MemberLeased:
		c := m.Cell
		// After the claim the ready deadline no longer bounds the cell
		// (CONTRACT §20): its lease does, which a renewal may move up to
		// the pool's MaxCell.
		if c == nil || c.State != lease.Leased || c.Lease == nil || !now.Before(c.Lease.ExpiresAt) {
			// A cell still leased ends with its lease (lease.expired); one
			// already quarantined had its event when it was.
			code := ""
			if c != nil && c.State == lease.Leased {
				code = store.ReasonExpired
			}
			return stop("lease expired or cell quarantined", code)
		}
	case lease.MemberStopping:
		return func(ctx context.Context) error { return r.destroy(ctx, cfg, m) }
	case lease.MemberCleanupPending:
		// Back off: 1 s, 2 s, 4 s … up to a minute between attempts.
		wait := time.Second << min(m.Attempts, 6)
		if now.Sub(m.UpdatedAt) < min(wait, time.Minute) {
			return nil
		}
		return func(ctx context.Context) error { return r.destroy(ctx, cfg, m) }
	}
	return nil
}

// Drain ends every live member of every pool, leased ones included, and
// returns nil once the provider proved each object gone, or an error when
// ctx ends first. It sets every target to 0 first, so nothing is created
// again. Each stop is recorded before the provider is called, with
// disposition destroyed under the cell's current fence, so a drain cut
// short, by ctx or a crash, is resumed by the next pass of any reconciler.
// A leased cell stays leased until its deletion is proven, then ends
// destroyed: its lease is no longer live, and validating it fails.
//
// Drain is for shutdown: call it after Run returned, so that this process
// acts alone on its members. It leaves members locked by another process
// to that process and waits for them until ctx ends.
func (r *Reconciler) Drain(ctx context.Context) error {
	for _, name := range r.order {
		if err := r.SetTarget(name, 0); err != nil {
			return err
		}
	}
	errs := new(errList)
	for round := 0; ; round++ {
		type job struct {
			cfg Config
			m   store.Member
		}
		var jobs []job
		for _, name := range r.order {
			cfg, _ := r.Pool(name)
			members, err := r.store.Members(ctx, name, liveStates...)
			if err != nil {
				return fmt.Errorf("pools not drained: %w", errors.Join(err, errs.err()))
			}
			for _, m := range members {
				jobs = append(jobs, job{cfg, m})
			}
		}
		if len(jobs) == 0 {
			return nil
		}
		if round > 0 { // left locked elsewhere, or a failed stop: retry later
			select {
			case <-ctx.Done():
				return fmt.Errorf("pools not drained: %w", errors.Join(ctx.Err(), errs.err()))
			case <-time.After(r.opt.Interval):
			}
		}
		errs = new(errList)
		g := new(errgroup.Group)
		g.SetLimit(r.opt.Parallelism)
		for _, j := range jobs {
			g.Go(func() error {
				errs.add(r.locked(ctx, j.m.CellID, func() error {
					if j.m.State == lease.MemberStopping || j.m.State == lease.MemberCleanupPending {
						return r.destroy(ctx, j.cfg, j.m)
					}
					return r.stop(ctx, j.cfg, j.m, j.m.State, lease.Destroyed, "pool drained at shutdown", "")
				}))
				return nil
			})
		}
		_ = g.Wait()
	}
}

// locked runs fn holding the member's executor lock; a member locked by
// another owner is skipped.
func (r *Reconciler) locked(ctx context.Context, cellID uuid.UUID, fn func() error) error {
	now := r.opt.Now()
	ok, err := r.store.LockMember(ctx, cellID, r.opt.Owner, now.Add(r.opt.LockTTL), now)
	if err != nil || !ok {
		return err
	}
	defer r.hold(ctx, cellID)()
	return fn()
}

// hold renews this owner's lock on a member every LockTTL/3 until the
// returned function is called, which also releases the lock.
func (r *Reconciler) hold(ctx context.Context, cellID uuid.UUID) (release func()) {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(r.opt.LockTTL / 3)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				now := r.opt.Now()
				if _, err := r.store.LockMember(ctx, cellID, r.opt.Owner, now.Add(r.opt.LockTTL), now); err != nil && ctx.Err() == nil {
					r.opt.Logger.Warn("renewing member lock", "cell_id", cellID, "error", err)
				}
			}
		}
	}()
	return func() {
		close(stop)
		<-done
		_ = r.store.UnlockMember(context.WithoutCancel(ctx), cellID, r.opt.Owner)
	}
}

// provision creates, verifies and admits a provisioning member, or records
// its stop when any step fails.
func (r *Reconciler) provision(ctx context.Context, cfg Config, m store.Member) error {
	pctx, cancel := context.WithTimeout(ctx, r.opt.ProvisionTimeout)
	obj, err := cfg.Provider.Provision(pctx, driver.ProvisionRequest{CellID: m.CellID, RuntimeClass: cfg.Release.RuntimeClass,
		Image: m.Image, Egress: cfg.Egress})
	var obs driver.Observation
	if err == nil {
		m.Identity = obj.Identity
		obs, err = r.verify(pctx, cfg, m)
	}
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil // shutting down: the member stays provisioning and is resumed
		}
		// The pool's recorded error (Status.LastError) reports the
		// provider's error even when the stop that follows succeeds.
		r.opt.Logger.Warn("provision failed", "pool", cfg.Name, "cell_id", m.CellID, "error", err)
		return errors.Join(fmt.Errorf("cell %s: provision failed: %w", m.CellID, err),
			r.stop(ctx, cfg, m, lease.MemberProvisioning, lease.Quarantined, "provision failed: "+err.Error(),
				store.ReasonProvisionFailed))
	}
	now := r.opt.Now()
	_, err = r.store.AdmitMember(ctx, store.AdmitParams{
		CellID: m.CellID, Pool: cfg.Name, WorkerID: cfg.Provider.Capabilities().Identity,
		ProviderCellID: m.CellID.String(), Identity: obj.Identity, Release: cfg.Release,
		ReadyDeadline: now.Add(cfg.ReadyTTL), Now: now,
		AdmittedClass: obs.RuntimeClass, AgentDigest: obs.AgentDigest, ImageDigest: obs.ImageDigest,
		Image: cfg.cellImage(m), Egress: cfg.Egress.Canonical(),
	})
	if err == nil {
		r.opt.Logger.Info("cell ready", "pool", cfg.Name, "cell_id", m.CellID, "image", m.Image)
		if r.opt.OnReady != nil {
			r.opt.OnReady(cfg.Name)
		}
	}
	return err
}

// verify reads the member's object back and checks it against the pool's
// signed runtime class and pinned image, then its agent's readiness
// evidence. It returns what it read: the member's evidence once verified.
func (r *Reconciler) verify(ctx context.Context, cfg Config, m store.Member) (driver.Observation, error) {
	obj := driver.Object{CellID: m.CellID, Identity: m.Identity}
	obs, err := cfg.Provider.Inspect(ctx, obj)
	if err != nil {
		return obs, fmt.Errorf("inspect: %w", err)
	}
	if err := driver.Verify(obj, obs, cfg.Release.RuntimeClass); err != nil {
		return obs, err
	}
	if err := VerifyImage(cfg, m, obs); err != nil {
		r.opt.Logger.Warn("cell image unverified", "pool", cfg.Name, "cell_id", m.CellID, "error", err)
		return obs, err
	}
	return obs, r.verifyAgent(ctx, cfg, obj, obs)
}

// unverified is the event reason of a failed verification.
func unverified(err error) string {
	if _, ok := errors.AsType[*AgentError](err); ok {
		return store.ReasonAgentUnverified
	}
	if _, ok := errors.AsType[*ImageError](err); ok {
		return store.ReasonImageUnverified
	}
	return store.ReasonRuntimeUnverified
}

// stop records a member's stop intent, with its event reason code, and
// destroys its object.
func (r *Reconciler) stop(ctx context.Context, cfg Config, m store.Member, from lease.MemberState, d lease.Disposition, reason, code string) error {
	m, err := r.store.BeginStop(ctx, store.StopIntent{CellID: m.CellID, From: []lease.MemberState{from},
		Disposition: d, Reason: reason, EventReason: code, Now: r.opt.Now()})
	if errors.Is(err, errcode.ErrConflict) {
		return nil // the member moved on (claimed, or stopped by someone else)
	}
	if err != nil {
		return err
	}
	r.opt.Logger.Info("cell stopping", "pool", cfg.Name, "cell_id", m.CellID, "reason", reason)
	return r.destroy(ctx, cfg, m)
}

// destroy calls the provider under the member's recorded fence and records
// the outcome: proof frees the slot, anything else is retried.
func (r *Reconciler) destroy(ctx context.Context, cfg Config, m store.Member) error {
	dctx, cancel := context.WithTimeout(ctx, r.opt.DestroyTimeout)
	err := cfg.Provider.Destroy(dctx, driver.Object{CellID: m.CellID, Identity: m.Identity})
	cancel()
	if err != nil && ctx.Err() != nil {
		return nil // shutting down: the stop stays recorded and is resumed
	}
	out := store.StopOutcome{CellID: m.CellID, StopLeaseID: m.StopLeaseID, StopGeneration: m.StopGeneration,
		Disposition: m.RequestedDisposition, Proven: err == nil, Now: r.opt.Now()}
	if err != nil {
		out.Error = err.Error()
	}
	done, cerr := r.store.CompleteStop(ctx, out)
	if cerr != nil {
		return cerr
	}
	if err != nil {
		r.opt.Logger.Warn("cell cleanup pending", "pool", cfg.Name, "cell_id", m.CellID, "attempts", done.Attempts, "error", err)
		return fmt.Errorf("cell %s: destroy not proven: %w", m.CellID, err)
	}
	r.opt.Logger.Info("cell gone", "pool", cfg.Name, "cell_id", m.CellID, "state", done.State, "provider_absent", done.ProviderAbsent)
	return nil
}

// destroyOrphans destroys provider objects that have no live member: left
// by a crash between a provider call and its record, or by an operator.
func (r *Reconciler) destroyOrphans(ctx context.Context, cfg Config, l driver.Lister) error {
	objs, err := l.List(ctx)
	if err != nil {
		return fmt.Errorf("list: %w", err)
	}
	var errs errList
	for _, obj := range objs {
		m, err := r.store.Member(ctx, obj.CellID)
		switch {
		case errors.Is(err, errcode.ErrNotFound), err == nil && m.State.Terminal():
			dctx, cancel := context.WithTimeout(ctx, r.opt.DestroyTimeout)
			err := cfg.Provider.Destroy(dctx, obj)
			cancel()
			if err != nil {
				errs.add(fmt.Errorf("orphan %s: %w", obj.CellID, err))
				continue
			}
			r.opt.Logger.Warn("orphan destroyed", "pool", cfg.Name, "cell_id", obj.CellID)
		case err != nil:
			errs.add(err)
		}
	}
	return errs.err()
}

// Status is a pool's configuration and state, without secrets.
type Status struct {
	Config        Config
	Capabilities  driver.Capabilities
	Members       map[lease.MemberState]int
	LastReconcile time.Time // zero before the first pass
	LastError     string
	// PrepareError is the provider's last failed Prepare (driver.Preparer),
	// such as an image that cannot be pulled; "" once it succeeded, or for
	// a provider that prepares nothing. While it is set the pool creates
	// no member.
	PrepareError string
	// Images are an image class's images as of its last pass, by image;
	// nil for a fixed pool.
	Images []ImageStatus
}

// Status reports every pool, in configuration order.
func (r *Reconciler) Status(ctx context.Context) ([]Status, error) {
	counts, err := r.store.MemberCounts(ctx)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Status, 0, len(r.order))
	for _, name := range r.order {
		ps := r.pools[name]
		members := map[lease.MemberState]int{}
		for _, st := range lease.MemberStates {
			members[st] = counts[name][st]
		}
		out = append(out, Status{Config: ps.cfg, Capabilities: ps.caps, Members: members,
			LastReconcile: ps.lastReconcile, LastError: ps.lastError, PrepareError: ps.prepareError,
			Images: slices.Clone(ps.images)})
	}
	return out, nil
}

// errList collects errors from concurrent actions.
type errList struct {
	mu   sync.Mutex
	errs []error
}

func (e *errList) add(err error) {
	if err == nil {
		return
	}
	e.mu.Lock()
	e.errs = append(e.errs, err)
	e.mu.Unlock()
}

func (e *errList) err() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return errors.Join(e.errs...)
}

func implementsEgress(p driver.Provider) bool {
	_, ok := p.(driver.EgressEnforcer)
	return ok
}
