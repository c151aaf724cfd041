// Package sandboxwich is a control plane for sterile cells: single-use
// sandboxes for AI-agent evaluation.
//
// Start with [New]. It returns a [Plane] over a [store.Store] — store/sqlite
// for one process, store/postgres for replicas that share a database — and
// the [attest.Keyring] that signs releases and lease attestations. Options
// set its clock, logger and limits; [WithPools] gives it pools of cells
// that [Plane.Run], called once in its own goroutine, keeps warm through
// each pool's driver.Provider. The Plane runs the tenant and worker
// operations of the contract (the package Example takes a worker's cell
// through a claim, its replay, validation and destruction):
//
//   - [Plane.Claim] atomically leases one never-exposed ready cell under a
//     client-chosen claim ID fence and returns an HMAC lease attestation
//     bound to the caller's organization, workspace, thread and runner
//     session. A retry with the same claim ID and request returns the same
//     lease and a byte-identical attestation; it never leases twice.
//   - [Plane.Validate] checks a presented attestation against the live lease.
//   - [Plane.Release] records the tenant's stop of a pool cell;
//     [Plane.LeaseStatus] reports it, and [Plane.WaitProviderAbsent] waits,
//     until the provider proved deletion.
//   - [Plane.Exec], [Plane.ExecStream], [Plane.Launch],
//     [Plane.LaunchStatusOf], [Plane.WriteFile] and [Plane.ReadFile] act
//     inside a leased cell, through its cell agent when the provider runs
//     one (package agent): each checks the lease fence, reads the runtime
//     back from the provider and activates the agent with a sanitized
//     activation before the agent sees the operation.
//   - [Plane.ListLeases], [Plane.Revoke], [Plane.Inventory] and
//     [Plane.Evidence] need no attestation: a tenant's leases, the end of one
//     whose attestation was lost, the ready inventory, and what the plane
//     read back from a lease's cell.
//   - [Plane.Prefetch] and [Plane.Images] pull images a tenant's pool
//     allows into its provider's image cache ahead of the claims, and list
//     them (CONTRACT §21).
//   - [Plane.Prepare], [Plane.Retire] and [Plane.Destroy] are the operations
//     of external workers that manage their own provider.
//
// A cell never returns to inventory: every state change is a compare-and-set
// inside one store transaction, and the schema refuses the rest.
//
// To serve a Plane over HTTP, mount the handler httpapi.New returns; a
// harness that uses a remote plane speaks to it with package client
// instead. A custom driver implements driver.Provider and proves it with
// driver/drivertest; a custom store implements store.Store and proves it
// with store/storetest.
//
// The Plane speaks its own words. The nouns it shares with the store, the
// pool and the wire — cells, leases, states, dispositions, bindings,
// releases — are package lease's; every other type of its API (ExecResult,
// Reason, User, Output, LaunchStatus, FileInfo, Event, Delivery,
// ClaimInfo, PoolStatus, …) is declared here and converted at the
// boundary, never aliased from the agent, the drivers or the store, so a
// harness that runs commands or follows the event log ([Plane.Follow])
// imports this package and lease alone.
//
// Errors are *errcode.Error values whose Code is the wire error code; test
// them with errors.Is against the errcode sentinels (errcode.ErrNotFound,
// errcode.ErrConflict, …).
package sandboxwich

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sync/errgroup"

	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/egress"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/fence"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
	"github.com/sandboxwich/sandboxwich/store"
)

// Lease durations (CONTRACT §5): a requested lease_seconds is clamped into
// [MinLeaseSeconds, the plane's maximum], never rejected. The maximum is
// MaxLeaseSeconds unless WithMaxLeaseSeconds raises it, up to
// MaxLeaseSecondsLimit (CONTRACT §14 "Lease length").
const (
	DefaultLeaseSeconds  = 120
	MinLeaseSeconds      = 1
	MaxLeaseSeconds      = 300
	MaxLeaseSecondsLimit = 86400
)

// Plane runs sterile-cell operations. It is safe for concurrent use.
type Plane struct {
	store  store.Store
	keys   *attest.Keyring
	now    func() time.Time
	newID  func() uuid.UUID
	log    *slog.Logger
	floors map[string]int
	// maxLease is the clamp's upper bound, in seconds.
	maxLease uint64

	pools    *pool.Reconciler // nil without pools
	poolCfgs []pool.Config
	poolOpts []pool.Option
	sweep    time.Duration // 0 disables the expiry sweeper

	maxPrepare time.Duration // how far ahead a prepared cell may expire
	maxOutput  int           // cap of each exec output stream, in bytes
	// maxOutputCeiling is the largest cap an exec may ask for (0 until
	// New: DefaultExecMaxOutputCeiling, or maxOutput when that is more).
	maxOutputCeiling int

	waits    waits      // claims waiting for a cell (wait.go)
	prefetch prefetcher // images pulled ahead of claims (prefetch.go)

	clockEvery time.Duration // 0: Now is the plane's own clock
	clock      clockOffset   // from the database's clock (clock.go)
	retention  time.Duration // how long events are kept; 0 keeps them
	pruneEach  time.Duration // how often Run prunes the event log
}

// DefaultEventRetention is how long the event log keeps an event (CONTRACT
// §16) unless WithEventRetention says otherwise.
const DefaultEventRetention = 7 * 24 * time.Hour

// WithEventRetention sets how long the event log keeps events (default
// DefaultEventRetention); Run prunes older ones in the background. 0 keeps
// every event.
func WithEventRetention(d time.Duration) Option { return func(p *Plane) { p.retention = d } }

// Option configures a Plane.
type Option func(*Plane)

// WithClock sets the clock (default time.Now). Times are truncated to whole
// microseconds, the precision every store keeps.
func WithClock(now func() time.Time) Option { return func(p *Plane) { p.now = now } }

// WithIDs sets the source of new lease IDs (default UUIDv7). Every ID it
// returns must be new: the SQLite store refuses a repeat only within a
// tenant.
func WithIDs(newID func() uuid.UUID) Option { return func(p *Plane) { p.newID = newID } }

// WithLogger sets the structured logger (default slog.Default). Secrets are
// never logged.
func WithLogger(l *slog.Logger) Option { return func(p *Plane) { p.log = l } }

// WithPools configures pools the plane keeps warm (CONTRACT §8). Each
// pool's release must be signed by the plane's key.
func WithPools(pools ...pool.Config) Option {
	return func(p *Plane) { p.poolCfgs = append(p.poolCfgs, pools...) }
}

// WithPoolOptions tunes the pool reconciler with the pool package's own
// options (pool.WithInterval, pool.WithLockTTL, …). Its clock, ID source,
// logger and maximum lease are the plane's unless an option sets them.
func WithPoolOptions(opts ...pool.Option) Option {
	return func(p *Plane) { p.poolOpts = append(p.poolOpts, opts...) }
}

// WithSweepInterval sets how often Run quarantines expired cells of
// external workers (default 1 s); 0 disables the expiry sweeper.
func WithSweepInterval(d time.Duration) Option { return func(p *Plane) { p.sweep = d } }

// WithMaxLeaseSeconds sets the longest lease a claim gets (default
// MaxLeaseSeconds); it must be in [MinLeaseSeconds, MaxLeaseSecondsLimit].
// A pool's default ready TTL follows it (pool.Config.ReadyTTL).
func WithMaxLeaseSeconds(n uint64) Option { return func(p *Plane) { p.maxLease = n } }

// New returns a Plane over st, signing and verifying with keys.
func New(st store.Store, keys *attest.Keyring, opts ...Option) (*Plane, error) {
	if st == nil || keys == nil {
		return nil, errors.New("sandboxwich: New needs a store and a keyring")
	}
	p := &Plane{
		store:      st,
		keys:       keys,
		now:        time.Now,
		newID:      func() uuid.UUID { return uuid.Must(uuid.NewV7()) },
		log:        slog.Default(),
		floors:     map[string]int{},
		sweep:      time.Second,
		maxLease:   MaxLeaseSeconds,
		maxPrepare: DefaultMaxPrepareAhead,
		maxOutput:  MaxExecOutput,
		clockEvery: DefaultClockSyncInterval,
		retention:  DefaultEventRetention,
		pruneEach:  5 * time.Minute,
	}
	for _, o := range opts {
		o(p)
	}
	if p.maxLease < MinLeaseSeconds || p.maxLease > MaxLeaseSecondsLimit {
		return nil, fmt.Errorf("sandboxwich: the maximum lease must be %d to %d seconds, not %d",
			MinLeaseSeconds, MaxLeaseSecondsLimit, p.maxLease)
	}
	if p.maxPrepare <= 0 {
		return nil, errors.New("sandboxwich: WithMaxPrepareAhead needs a positive duration")
	}
	if p.retention < 0 {
		return nil, errors.New("sandboxwich: WithEventRetention needs a duration of 0 or more")
	}
	if p.maxOutput < 1 || p.maxOutput > MaxExecOutputLimit {
		return nil, fmt.Errorf("sandboxwich: the exec output cap must be 1 to %d bytes, not %d", MaxExecOutputLimit, p.maxOutput)
	}
	if p.maxOutputCeiling == 0 {
		p.maxOutputCeiling = max(DefaultExecMaxOutputCeiling, p.maxOutput)
	}
	if p.maxOutputCeiling < p.maxOutput || p.maxOutputCeiling > MaxExecOutputLimit {
		return nil, fmt.Errorf("sandboxwich: the exec output ceiling must be %d (the default cap) to %d bytes, not %d",
			p.maxOutput, MaxExecOutputLimit, p.maxOutputCeiling)
	}
	if len(p.poolCfgs) == 0 {
		return p, nil
	}
	for _, c := range p.poolCfgs {
		if err := p.checkRelease(c.Release); err != nil {
			return nil, fmt.Errorf("pool %q: release: %w", c.Name, err)
		}
		if c.ReadyFloor > 0 {
			p.floors[c.Name] = c.ReadyFloor
		}
	}
	poolOpts := append([]pool.Option{pool.WithClock(p.Now), pool.WithIDs(p.newID), pool.WithLogger(p.log),
		pool.WithMaxLease(time.Duration(p.maxLease) * time.Second)}, p.poolOpts...)
	poolOpts = append(poolOpts, pool.WithOnReady(func(string) { p.waits.wake() }))
	r, err := pool.New(p.store, p.poolCfgs, poolOpts...)
	if err != nil {
		return nil, err
	}
	p.pools = r
	return p, nil
}

// Run keeps the pools warm, sweeps expired cells, keeps the plane's clock in
// step with the database's (SyncClock) and prunes the event log until ctx
// ends. Call it once, in its own goroutine; claims work without it, but
// pools are neither refilled nor stopped.
func (p *Plane) Run(ctx context.Context) error {
	if _, _, synced := p.ClockOffset(); !synced {
		if err := p.SyncClock(ctx); err != nil && ctx.Err() == nil {
			p.log.Warn("clock sync", "error", err)
		}
	}
	g, ctx := errgroup.WithContext(ctx)
	if _, ok := p.store.(store.Clock); ok && p.clockEvery > 0 {
		g.Go(func() error { p.syncClock(ctx); return nil })
	}
	if p.retention > 0 {
		g.Go(func() error {
			t := time.NewTicker(p.pruneEach)
			defer t.Stop()
			for {
				if n, err := p.PruneEvents(ctx); err != nil && ctx.Err() == nil {
					p.log.Warn("event log prune", "error", err)
				} else if n > 0 {
					p.log.Info("events pruned", "count", n)
				}
				select {
				case <-ctx.Done():
					return nil
				case <-t.C:
				}
			}
		})
	}
	if p.pools != nil {
		g.Go(func() error { return p.pools.Run(ctx) })
	}
	if p.sweep > 0 {
		g.Go(func() error {
			t := time.NewTicker(p.sweep)
			defer t.Stop()
			for {
				if n, err := p.SweepExpired(ctx); err != nil && ctx.Err() == nil {
					p.log.Warn("expiry sweep", "error", err)
				} else if n > 0 {
					p.log.Info("expired cells quarantined", "count", n)
				}
				select {
				case <-ctx.Done():
					return nil
				case <-t.C:
				}
			}
		})
	}
	return g.Wait()
}

// MaxLeaseSeconds returns the longest lease a claim gets.
func (p *Plane) MaxLeaseSeconds() uint64 { return p.maxLease }

// Pools returns the pool reconciler, or nil when the plane has no pools.
func (p *Plane) Pools() *pool.Reconciler { return p.pools }

// Ping reports whether the plane's store is reachable and migrated.
func (p *Plane) Ping(ctx context.Context) error { return p.store.Ping(ctx) }

// CellCounts returns the number of cells by state.
func (p *Plane) CellCounts(ctx context.Context) (map[lease.State]int, error) {
	return p.store.CellCounts(ctx)
}

// Now returns the plane's current time, truncated to microseconds: its clock
// (WithClock) plus its measured offset from the database's (SyncClock).
func (p *Plane) Now() time.Time {
	return p.now().Add(time.Duration(p.clock.offset.Load())).UTC().Truncate(time.Microsecond)
}

// ClaimRequest asks for one cell.
type ClaimRequest struct {
	// ClaimID fences the claim: a retry with the same ID and request
	// returns the same outcome. uuid.Nil makes a legacy unfenced claim,
	// where every request is a new claim.
	ClaimID uuid.UUID
	Release lease.Release
	Binding lease.Binding
	// LeaseSeconds is the requested lease duration; nil means the default.
	// It is clamped into [MinLeaseSeconds, Plane.MaxLeaseSeconds()].
	LeaseSeconds *uint64
	// Image, when not "", asks for a cell of that image, pinned by digest
	// (CONTRACT §21): one of the tenant's pools of the release must run it
	// (a fixed pool's Image) or allow its repository (an image class),
	// else errcode.ErrImageNotAllowed, as for a reference with a tag and
	// no digest. Only cells of that image serve it; with WaitSeconds, the
	// first image class that allows it (in configuration order) makes one
	// for it. "" is Part I: image classes never serve it.
	Image string
	// WaitSeconds is how long the claim may wait for a cell when none is
	// claimable (CONTRACT §21): 0 (the default) answers at once, as Part
	// I; at most MaxWaitSeconds. Waiting claims of one inventory are
	// served first come first served; one that waited in vain answers
	// empty with EmptyWaitElapsed, and a fenced one records that outcome.
	WaitSeconds uint64
	// Egress, when not nil, narrows the egress policy of the cell the
	// claim leases (CONTRACT §22; build it with egress.Parse): only cells
	// of the tenant's pools of the release whose policy covers it serve
	// the claim, else errcode.ErrEgressNotAllowed; the lease's policy is
	// then this one. &egress.None asks for no egress, which every pool
	// covers. nil keeps the policy of the pool that serves the claim.
	Egress *egress.Policy
}

// ClaimResult is a claim's outcome. Lease is nil when no cell was available.
//
// The lease attestation is a secret for the claimer alone, kept in an
// unexported field: read it with [ClaimResult.Attestation], or present it
// with [ClaimResult.Proof]. Printing the result with fmt (any verb, %#v
// included) or log/slog never shows it; it is never stored, only its
// digest.
type ClaimResult struct {
	Lease *lease.Lease
	// Replayed reports a fenced retry that returned an earlier outcome.
	Replayed bool
	// PoolName is the pool the leased cell came from, if any.
	PoolName string
	// EmptyReason says why a claim that was not replayed found no cell;
	// "" otherwise.
	EmptyReason EmptyReason

	attestation string
}

// Attestation returns the raw lease attestation ("swla1_…"), or "" for an
// empty claim. It is the only accessor of the secret: hand it to the
// claimer and nowhere else.
func (r ClaimResult) Attestation() string { return r.attestation }

// Proof returns the lease fence that acts on the lease: its attestation,
// generation and binding. It is the zero Proof for an empty claim.
func (r ClaimResult) Proof() Proof {
	if r.Lease == nil {
		return Proof{}
	}
	return Proof{Generation: r.Lease.Generation, Binding: r.Lease.Binding, attestation: r.attestation}
}

// String describes the result without its attestation.
func (r ClaimResult) String() string {
	if r.Lease == nil {
		return fmt.Sprintf("sandboxwich.ClaimResult{empty, replayed=%t}", r.Replayed)
	}
	return fmt.Sprintf("sandboxwich.ClaimResult{lease_id=%s, cell_id=%s, generation=%d, pool=%q, replayed=%t, attestation=REDACTED}",
		r.Lease.ID, r.Lease.CellID, r.Lease.Generation, r.PoolName, r.Replayed)
}

// Format prints String for every verb, so no verb (%v, %+v, %#v, %s, %q,
// …) shows the attestation.
func (r ClaimResult) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(r.String())) }

// LogValue keeps the attestation out of logs.
func (r ClaimResult) LogValue() slog.Value {
	if r.Lease == nil {
		return slog.GroupValue(slog.Bool("empty", true), slog.Bool("replayed", r.Replayed))
	}
	return slog.GroupValue(slog.String("lease_id", r.Lease.ID.String()),
		slog.String("cell_id", r.Lease.CellID.String()), slog.Bool("replayed", r.Replayed))
}

// EmptyReason says why a claim found no cell.
type EmptyReason string

// Reasons of an empty claim.
const (
	// EmptyNoInventory: the tenant has no ready cell of the release.
	EmptyNoInventory EmptyReason = "no_inventory"
	// EmptyExpiresTooSoon: ready cells of the release exist, but none
	// outlives the requested lease (a pool's ready TTL shorter than the
	// lease, or cells near the end of their TTL).
	EmptyExpiresTooSoon EmptyReason = "expires_too_soon"
	// EmptyHeldBack: ready cells that outlive the lease exist, but a ready
	// floor held them back, or concurrent claims took them.
	EmptyHeldBack EmptyReason = "held_back"
)

// Claim leases one ready cell of the tenant's inventory that matches the
// request's release exactly (CONTRACT §5).
func (p *Plane) Claim(ctx context.Context, tenantID string, req ClaimRequest) (ClaimResult, error) {
	if err := p.checkRelease(req.Release); err != nil {
		return ClaimResult{}, err
	}
	if err := checkBinding(req.Binding); err != nil {
		return ClaimResult{}, err
	}
	if tenantID == "" {
		return ClaimResult{}, errcode.New(errcode.InvalidRequest, "tenant is required")
	}
	if req.WaitSeconds > MaxWaitSeconds {
		return ClaimResult{}, errcode.New(errcode.InvalidRequest, "wait_seconds must be 0 to "+strconv.Itoa(MaxWaitSeconds))
	}
	image, maker, err := p.imagePools(tenantID, req)
	if err != nil {
		return ClaimResult{}, err
	}
	pools, err := p.egressPools(tenantID, req, image)
	if err != nil {
		return ClaimResult{}, err
	}
	r, b := req.Release, req.Binding
	// signed is the last token Sign made: a new lease's, since the store
	// signs each lease it tries just before writing it.
	var signed string
	params := store.ClaimParams{
		TenantID:     tenantID,
		ClaimID:      req.ClaimID,
		Release:      r,
		Binding:      b,
		LeaseSeconds: p.clampLeaseSeconds(req.LeaseSeconds),
		LeaseID:      p.newID(),
		Now:          p.Now(),
		ReadyFloors:  p.floors,
		Image:        image,
		Pools:        pools,
		Sign: func(l lease.Lease) string {
			signed = p.token(l)
			return attest.Digest(signed)
		},
	}
	if req.ClaimID != uuid.Nil {
		fr := fence.ClaimRequestOf(r, b, req.LeaseSeconds)
		fr.Image, fr.WaitSeconds = req.Image, req.WaitSeconds
		if req.Egress != nil {
			s := req.Egress.FenceString()
			fr.Egress = &s
		}
		params.Digest = fence.Digest(fr)
	}
	if req.Egress != nil {
		params.Egress = req.Egress.Canonical()
	}
	if image != "" {
		// A claim of an image answers empty with a reason, recorded with
		// its fence (CONTRACT §21); the cells of one image are its
		// inventory.
		params.EmptyReason = string(EmptyNoInventory)
	}
	var res store.ClaimResult
	if req.WaitSeconds > 0 {
		res, err = p.claimWaiting(ctx, params, time.Duration(req.WaitSeconds)*time.Second, maker)
	} else {
		res, err = p.store.Claim(ctx, params)
	}
	if maker != "" {
		p.pools.Claimed(maker, image) // the image stays warm
	}
	if err != nil {
		return ClaimResult{}, err
	}
	if req.Egress != nil && res.Lease != nil {
		// A replay sets it again: the first answer may have been lost
		// with the process before it was set.
		if err := p.setEgress(ctx, res.PoolName, res.Lease.CellID, *req.Egress); err != nil {
			return ClaimResult{}, err
		}
	}
	out := ClaimResult{Lease: res.Lease, Replayed: res.Replayed, PoolName: res.PoolName, EmptyReason: EmptyReason(res.EmptyReason)}
	if res.Lease == nil {
		if !res.Replayed && out.EmptyReason == "" {
			out.EmptyReason = p.emptyReason(ctx, tenantID, &params)
		}
		return out, nil
	}
	out.attestation = signed
	if res.Replayed {
		// The token is a pure function of the stored lease and the key: an
		// exact retry regenerates it byte for byte, unless the key changed.
		out.attestation = p.token(*res.Lease)
	}
	if !attest.EqualDigest(attest.Digest(out.attestation), res.Lease.AttestationDigest) {
		return ClaimResult{}, errcode.New(errcode.Conflict, "the lease attestation cannot be regenerated (the signing key changed)")
	}
	if p.log.Enabled(ctx, slog.LevelDebug) { // the attributes cost an allocation on every claim
		p.log.LogAttrs(ctx, slog.LevelDebug, "claim", slog.String("tenant", tenantID), slog.Any("result", out))
	}
	if !out.Replayed && p.pools != nil && out.PoolName != "" {
		p.pools.Trigger()
	}
	return out, nil
}

// clampLeaseSeconds returns the lease duration a request gets.
func (p *Plane) clampLeaseSeconds(requested *uint64) uint64 {
	if requested == nil {
		return min(DefaultLeaseSeconds, p.maxLease)
	}
	return min(max(*requested, MinLeaseSeconds), p.maxLease)
}

// emptyReason finds out, and logs, why a claim found no cell. It reads the
// store once more, so it runs only after an empty claim; when that read
// fails, the claim's answer stands and the reason is "".
func (p *Plane) emptyReason(ctx context.Context, tenantID string, params *store.ClaimParams) EmptyReason {
	n, err := p.store.CountReady(ctx, store.CountReadyParams{TenantID: tenantID, Release: params.Release,
		After: params.Now.Add(time.Duration(params.LeaseSeconds) * time.Second)})
	if err != nil {
		p.log.Warn("claim empty; counting ready cells failed", "tenant", tenantID, "error", err)
		return ""
	}
	reason := EmptyHeldBack
	switch {
	case n.Ready == 0:
		reason = EmptyNoInventory
	case n.Lasting == 0:
		reason = EmptyExpiresTooSoon
	}
	p.log.LogAttrs(ctx, slog.LevelInfo, "claim empty", slog.String("tenant", tenantID),
		slog.String("reason", string(reason)), slog.Uint64("lease_seconds", params.LeaseSeconds),
		slog.String("release_set_id", params.Release.ReleaseSetID), slog.Int("ready", n.Ready))
	return reason
}

// token computes the attestation of a lease.
func (p *Plane) token(l lease.Lease) string {
	return p.keys.LeaseToken(attest.ClaimsOf(l))
}

// checkRelease validates a release's shape (400), class (422) and
// signature (403), in that order.
func (p *Plane) checkRelease(r lease.Release) error {
	if !lease.ValidIdentifier(r.ReleaseSetID) || !lease.ValidPolicyDigest(r.PolicyDigest) {
		return errcode.New(errcode.BadRequest, "release_set_id or policy_digest is invalid")
	}
	if !r.RuntimeClass.Valid() {
		return errcode.New(errcode.InvalidRequest, "runtime_class must be kata_microvm or gvisor_lower_risk")
	}
	if !p.keys.VerifyRelease(r) {
		return errcode.New(errcode.AuthorizationDenied, "release signature is invalid")
	}
	return nil
}

func checkBinding(b lease.Binding) error {
	for _, f := range b.Fields() {
		if !lease.ValidIdentifier(f.Value) {
			return errcode.New(errcode.BadRequest, f.Name+" is invalid")
		}
	}
	return nil
}

// Proof is what a tenant presents to act on a lease (the lease fence): the
// lease's attestation, generation and binding. A claimer gets it from
// [ClaimResult.Proof]; a server that received the fence fields builds it
// with [NewProof]. The attestation inside is unexported and never printed
// (fmt, any verb, or log/slog), and no method returns it.
type Proof struct {
	Generation uint64
	Binding    lease.Binding

	attestation string
}

// NewProof returns the lease fence made of a raw attestation ("swla1_…"),
// a generation and a binding.
func NewProof(attestation string, generation uint64, binding lease.Binding) Proof {
	return Proof{Generation: generation, Binding: binding, attestation: attestation}
}

// String describes the proof without its attestation.
func (pr Proof) String() string {
	return fmt.Sprintf("sandboxwich.Proof{generation=%d, binding=%+v, attestation=REDACTED}", pr.Generation, pr.Binding)
}

// Format prints String for every verb, so no verb shows the attestation.
func (pr Proof) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(pr.String())) }

// LogValue keeps the attestation out of logs.
func (pr Proof) LogValue() slog.Value {
	return slog.GroupValue(slog.Uint64("generation", pr.Generation))
}

func (p *Plane) check(tenantID string, leaseID uuid.UUID, pr Proof) store.LeaseCheck {
	return store.LeaseCheck{
		TenantID: tenantID,
		LeaseID:  leaseID,
		Proof: lease.Proof{
			Generation:        pr.Generation,
			Binding:           pr.Binding,
			AttestationDigest: attest.Digest(pr.attestation),
		},
		Now: p.Now(),
	}
}

// Validate checks a presented lease fence and returns the live lease. A
// lease found expired is quarantined and reported as a conflict.
func (p *Plane) Validate(ctx context.Context, tenantID string, leaseID uuid.UUID, pr Proof) (lease.Lease, error) {
	rec, err := p.store.CheckLease(ctx, p.check(tenantID, leaseID, pr))
	if err != nil {
		return lease.Lease{}, err
	}
	return *rec.Cell.Lease, nil
}

// LeaseStatus is the state of a lease and its cell as the tenant sees it.
type LeaseStatus struct {
	LeaseID    uuid.UUID
	CellID     uuid.UUID
	Generation uint64
	State      lease.State
	// Disposition is the terminal state, or "" while the cell is live.
	Disposition lease.Disposition
	// ProviderAbsent is true once the provider proved the object gone under
	// the exact recorded fence.
	ProviderAbsent bool
	// CleanupPending is true while a failed or uncertain stop is retried.
	CleanupPending bool
	// PoolName is the pool of the cell, "" for cells of external workers.
	PoolName string
	// ProviderMode is the pool provider's mode (apply or dry_run), "" for
	// cells of external workers.
	ProviderMode ProviderMode
}

func (p *Plane) statusOf(rec store.LeaseRecord) LeaseStatus {
	c := rec.Cell
	s := LeaseStatus{
		LeaseID:     c.Lease.ID,
		CellID:      c.ID,
		Generation:  c.Generation,
		State:       c.State,
		Disposition: c.Disposition(),
		PoolName:    c.PoolName,
	}
	if m := rec.Member; m != nil {
		s.ProviderAbsent = m.ProviderAbsent
		s.CleanupPending = m.State == lease.MemberCleanupPending
		if p.pools != nil {
			if cfg, ok := p.pools.Pool(m.Pool); ok {
				s.ProviderMode = ProviderMode(cfg.Provider.Capabilities().Mode)
			}
		}
	}
	return s
}

// LeaseStatus returns the status of a lease of the tenant.
func (p *Plane) LeaseStatus(ctx context.Context, tenantID string, leaseID uuid.UUID) (LeaseStatus, error) {
	rec, err := p.store.Lease(ctx, tenantID, leaseID)
	if err != nil {
		return LeaseStatus{}, err
	}
	return p.statusOf(rec), nil
}

// Release records the tenant's stop of a pool cell under the lease fence;
// the pool then destroys the cell and proves it (CONTRACT §6).
func (p *Plane) Release(ctx context.Context, tenantID string, leaseID uuid.UUID, pr Proof, d lease.Disposition) (LeaseStatus, error) {
	if !lease.ValidDisposition(d) {
		return LeaseStatus{}, errcode.New(errcode.InvalidRequest, "disposition must be destroyed or quarantined")
	}
	rec, err := p.store.Release(ctx, store.ReleaseParams{LeaseCheck: p.check(tenantID, leaseID, pr), Disposition: d})
	if err != nil {
		return LeaseStatus{}, err
	}
	if p.pools != nil {
		p.pools.Trigger()
	}
	return p.statusOf(rec), nil
}

// DefaultPoll is how often [Plane.WaitProviderAbsent] reads a lease's
// status when it is given no interval.
const DefaultPoll = 100 * time.Millisecond

// WaitProviderAbsent reads the status of a lease every poll (DefaultPoll
// when poll <= 0) until its provider proved the cell gone
// (ProviderAbsent), and returns that status: what a harness waits for
// after Release before it counts the cell's capacity free. Any error ends
// it; when ctx ends first it returns the last status it read and an error
// wrapping ctx.Err(). Cells of external workers are never proven absent
// here: their worker records the outcome.
func (p *Plane) WaitProviderAbsent(ctx context.Context, tenantID string, leaseID uuid.UUID, poll time.Duration) (LeaseStatus, error) {
	if poll <= 0 {
		poll = DefaultPoll
	}
	t := time.NewTicker(poll)
	defer t.Stop()
	var last LeaseStatus
	for {
		st, err := p.LeaseStatus(ctx, tenantID, leaseID)
		switch {
		case err != nil && ctx.Err() == nil:
			return last, err
		case err == nil && st.ProviderAbsent:
			return st, nil
		case err == nil:
			last = st
		}
		select {
		case <-ctx.Done():
			return last, fmt.Errorf("sandboxwich: waiting for lease %s to be proven deleted: %w", leaseID, ctx.Err())
		case <-t.C:
		}
	}
}

// SweepExpired quarantines expired cells of external workers and drops
// expired idempotency records. It returns the number of cells quarantined.
func (p *Plane) SweepExpired(ctx context.Context) (int, error) {
	return p.store.ExpireUnmanaged(ctx, p.Now())
}
