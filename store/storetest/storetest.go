// Package storetest is the conformance suite of store.Store: every rule of
// CONTRACT.md that lives in the store (cells, claims and their fences, the
// lease fence, worker routes, pool memberships, executor locks, the event
// log, expiry, webhook deliveries and idempotency records), checked through
// the interfaces alone.
//
// A backend runs it from its own tests:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) store.Store {
//			s, err := mystore.Open(t.Context(), …)
//			if err != nil {
//				t.Fatal(err)
//			}
//			return s
//		})
//	}
//
// Run runs the scenarios of every role of store.Store and those of each
// optional ability the store implements (the others are skipped). Each role
// and ability also has a suite of its own — [RunLeases], [RunWorkers],
// [RunPools], [RunEventLog], [RunWebhooks], [RunIdempotency] — which takes
// a fresh store and the implementation of the role under test: the store
// itself, or a decorator of one of its roles (Example_customStore), while
// the store's other roles set each scenario up.
//
// Every scenario is a subtest of its own with a fresh store from newStore,
// and the subtests run in parallel (t.Parallel; Run returns after all of
// them): newStore must return stores that share nothing (a new SQLite
// file, a new Postgres schema), as the shipped backends' tests do.
//
// Time is injected: every scenario starts from a fixed instant and moves it
// explicitly, so expiry is tested without sleeping. Besides the assertions of
// each scenario, the suite watches every cell and membership the store
// returns and fails the test if a cell ever reads ready again after leaving
// ready, a terminal cell or membership changes, a lease ID moves to another
// cell, or a recorded stop fence changes.
//
// Beside Run, [CheckReopen] and [CheckTwoStores] check a backend over a
// database it opens more than once, [ClaimWithToken] hands a backend's own
// test the raw attestation it must never persist, and [BenchmarkClaim]
// measures claims. Nothing here knows a schema: a backend checks its own
// storage (the shipped SQL stores run the repository's internal SQL kit
// too).
package storetest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/fence"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

// Run runs the conformance suite against stores made by newStore: the
// scenarios of every role, and those of each optional ability
// (store.Webhooks, store.IdempotencyStore) the store implements. Each
// subtest calls newStore for a fresh, empty, migrated store (the store is
// closed by the suite via t.Cleanup).
func Run(t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Helper()
	groups := slices.Concat(leasesSuite, workersSuite, membersSuite, eventLogSuite,
		[][]scenario{concurrencyScenarios, badInputScenarios},
		ability(webhooksSuite, "store.Webhooks", func(k *tracker) bool { return k.Webhooks != nil }),
		ability(idempotencySuite, "store.IdempotencyStore", func(k *tracker) bool { return k.IdempotencyStore != nil }))
	run(t, "Conformance", groups, func(t *testing.T) *env { return newEnv(t, newStore(t)) }, func(t *testing.T) {
		checkInstallation(t, newStore)
	})
}

// The scenarios of each role and ability.
var (
	leasesSuite = [][]scenario{claimScenarios, fencedScenarios, floorScenarios, leaseScenarios, releaseScenarios,
		listScenarios, revokeScenarios, renewScenarios, inventoryScenarios, expireScenarios}
	workersSuite     = [][]scenario{basicScenarios, workerScenarios}
	membersSuite     = [][]scenario{memberScenarios, replenishScenarios, stopScenarios, lockScenarios, imageScenarios, egressScenarios}
	eventLogSuite    = [][]scenario{eventScenarios}
	webhooksSuite    = [][]scenario{deliveryScenarios}
	idempotencySuite = [][]scenario{idempotencyScenarios}
)

// RunLeases runs the scenarios of the store.Leases role. newStore returns
// a fresh store, whose other roles set each scenario up, and the Leases
// under test: the store itself, or a decorator of its Leases.
func RunLeases(t *testing.T, newStore func(t *testing.T) (store.Store, store.Leases)) {
	t.Helper()
	runRole(t, "Leases", leasesSuite, newStore, func(c *roles, r store.Leases) { c.Leases = r })
}

// RunWorkers runs the scenarios of the store.Workers role, as RunLeases
// runs those of Leases.
func RunWorkers(t *testing.T, newStore func(t *testing.T) (store.Store, store.Workers)) {
	t.Helper()
	runRole(t, "Workers", workersSuite, newStore, func(c *roles, r store.Workers) { c.Workers = r })
}

// RunPools runs the scenarios of the store.Pools role, as RunLeases
// runs those of Leases.
func RunPools(t *testing.T, newStore func(t *testing.T) (store.Store, store.Pools)) {
	t.Helper()
	runRole(t, "Pools", membersSuite, newStore, func(c *roles, r store.Pools) { c.Pools = r })
}

// RunEventLog runs the scenarios of the store.EventLog role, as RunLeases
// runs those of Leases.
func RunEventLog(t *testing.T, newStore func(t *testing.T) (store.Store, store.EventLog)) {
	t.Helper()
	runRole(t, "EventLog", eventLogSuite, newStore, func(c *roles, r store.EventLog) { c.EventLog = r })
}

// RunWebhooks runs the scenarios of the optional store.Webhooks ability:
// newStore returns a fresh store and the Webhooks under test (the store
// itself, or a decorator of it).
func RunWebhooks(t *testing.T, newStore func(t *testing.T) (store.Store, store.Webhooks)) {
	t.Helper()
	run(t, "Webhooks", webhooksSuite, func(t *testing.T) *env {
		s, w := newStore(t)
		e := newEnv(t, s)
		e.s.Webhooks = w
		return e
	}, nil)
}

// RunIdempotency runs the scenarios of the optional store.IdempotencyStore
// ability, as RunWebhooks runs those of Webhooks.
func RunIdempotency(t *testing.T, newStore func(t *testing.T) (store.Store, store.IdempotencyStore)) {
	t.Helper()
	run(t, "Idempotency", idempotencySuite, func(t *testing.T) *env {
		s, i := newStore(t)
		e := newEnv(t, s)
		e.s.IdempotencyStore = i
		return e
	}, nil)
}

// runRole runs suite over fresh stores, each with the role under test set
// in place of the store's own by set.
func runRole[R any](t *testing.T, name string, suite [][]scenario, newStore func(t *testing.T) (store.Store, R), set func(*roles, R)) {
	t.Helper()
	run(t, name, suite, func(t *testing.T) *env {
		s, r := newStore(t)
		c := split(s)
		set(c, r)
		return newEnv(t, c)
	}, nil)
}

// run runs every scenario of groups as a parallel subtest of one subtest
// named name (so that it returns only after them), each over a fresh
// environment from open, and extra beside them.
func run(t *testing.T, name string, groups [][]scenario, open func(t *testing.T) *env, extra func(t *testing.T)) {
	t.Helper()
	t.Run(name, func(t *testing.T) {
		for _, group := range groups {
			for _, sc := range group {
				t.Run(sc.name, func(t *testing.T) {
					t.Parallel()
					sc.run(open(t))
				})
			}
		}
		if extra != nil {
			t.Run("installation", func(t *testing.T) {
				t.Parallel()
				extra(t)
			})
		}
	})
}

// ability is groups, each scenario skipped over a store without the
// optional ability (has reports it).
func ability(groups [][]scenario, name string, has func(*tracker) bool) [][]scenario {
	var out [][]scenario
	for _, g := range groups {
		var og []scenario
		for _, sc := range g {
			og = append(og, scenario{sc.name, func(e *env) {
				if !has(e.s) {
					e.t.Skipf("the store does not implement %s", name)
				}
				sc.run(e)
			}})
		}
		out = append(out, og)
	}
	return out
}

// storeBase is what a Store is beside its roles.
type storeBase interface {
	Ping(ctx context.Context) error
	Installation(ctx context.Context) (string, error)
	Close() error
	CellCounts(ctx context.Context) (map[lease.State]int, error)
}

// roles is a Store assembled from its parts, so that a role suite can put
// the role under test beside the store's others.
type roles struct {
	storeBase
	store.Leases
	store.Workers
	store.Pools
	store.EventLog
}

// split is s as its parts.
func split(s store.Store) *roles { return &roles{s, s, s, s, s} }

// scenario is one independent subtest.
type scenario struct {
	name string
	run  func(e *env)
}

// Fixtures: the key and release of CONTRACT.md 3.6.
const (
	testKey      = "sandboxwich-test-sterile-cell-signing-key-32-bytes-minimum"
	releaseSetID = "release-set-2026-08-07"

	tenantA = "tenant-a"
	tenantB = "tenant-b"

	// Worker IDs are UUIDs (CONTRACT.md section 11).
	workerA = "0190f0e0-0000-7000-8000-00000000000a"
	workerB = "0190f0e0-0000-7000-8000-00000000000b"

	poolA = "pool-a"
	poolB = "pool-b"
)

var (
	policyDigest = strings.Repeat("a", 64)
	binding1     = lease.Binding{
		OrganizationID:  "org-1",
		WorkspaceID:     "workspace-1",
		ThreadID:        "thread-1",
		RunnerSessionID: "session-1",
	}
	// base is the fixed start of every scenario, on a whole microsecond.
	base = time.Date(2026, 8, 7, 12, 0, 0, 123456000, time.UTC)
)

// poolWorker is the worker ID of a pool's cells.
func poolWorker(pool string) string { return "pool:" + pool }

// env is the state of one scenario.
type env struct {
	t    *testing.T
	ctx  context.Context
	s    *tracker
	kr   *attest.Keyring
	now  time.Time
	kata lease.Release
	gvis lease.Release
	seq  int
}

func newEnv(t *testing.T, inner store.Store) *env {
	t.Helper()
	if inner == nil {
		t.Fatal("newStore returned nil")
	}
	t.Cleanup(func() {
		if err := inner.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	e := envOver(t, inner)
	// Registered after Close, so it runs before it.
	t.Cleanup(func() { e.s.verify(context.Background()) })
	return e
}

// envOver is a scenario over a store the caller owns.
func envOver(t *testing.T, inner store.Store) *env {
	t.Helper()
	kr, err := attest.NewKeyring([]byte(testKey))
	if err != nil {
		t.Fatal(err)
	}
	return &env{
		t:    t,
		ctx:  t.Context(),
		s:    newTracker(t, inner),
		kr:   kr,
		now:  base,
		kata: releaseFor(kr, releaseSetID, lease.KataMicroVM, policyDigest),
		gvis: releaseFor(kr, releaseSetID, lease.GVisorLowerRisk, policyDigest),
	}
}

func releaseFor(kr *attest.Keyring, setID string, class lease.RuntimeClass, digest string) lease.Release {
	return lease.Release{
		ReleaseSetID: setID,
		RuntimeClass: class,
		PolicyDigest: digest,
		Signature:    kr.SignRelease(lease.Release{ReleaseSetID: setID, RuntimeClass: class, PolicyDigest: digest}),
	}
}

// sign is the ClaimParams.Sign of the suite: the digest of the real token.
func (e *env) sign(l lease.Lease) string { return attest.Digest(e.kr.LeaseToken(attest.ClaimsOf(l))) }

func newID() uuid.UUID { return uuid.Must(uuid.NewV7()) }

// advance moves the scenario's clock.
func (e *env) advance(d time.Duration) { e.now = e.now.Add(d) }

// prepare inserts a ready cell for workerA of tenantA with the kata release,
// expiring in an hour; opts adjust the parameters first.
func (e *env) prepare(opts ...func(*store.PrepareParams)) lease.Cell {
	e.t.Helper()
	p := e.prepareParams(opts...)
	c, err := e.s.Prepare(e.ctx, p)
	if err != nil {
		e.t.Fatalf("Prepare(%s): %v", p.CellID, err)
	}
	return c
}

func (e *env) prepareParams(opts ...func(*store.PrepareParams)) store.PrepareParams {
	e.seq++
	p := store.PrepareParams{
		CellID:         newID(),
		TenantID:       tenantA,
		WorkerID:       workerA,
		ProviderCellID: fmt.Sprintf("provider-cell-%d", e.seq),
		Release:        e.kata,
		ExpiresAt:      e.now.Add(time.Hour),
		Now:            e.now,
	}
	for _, o := range opts {
		o(&p)
	}
	return p
}

// claimParams returns an unfenced claim of tenantA for the kata release and
// binding1 with lease_seconds 120 at e.now; opts adjust it, and Digest is
// computed last from the final fields.
func (e *env) claimParams(opts ...func(*store.ClaimParams)) store.ClaimParams {
	p := store.ClaimParams{
		TenantID:     tenantA,
		Release:      e.kata,
		Binding:      binding1,
		LeaseSeconds: 120,
		LeaseID:      newID(),
		Now:          e.now,
		Sign:         e.sign,
	}
	for _, o := range opts {
		o(&p)
	}
	p.Digest = claimDigest(p)
	return p
}

func claimDigest(p store.ClaimParams) string {
	ls := p.LeaseSeconds
	return fence.DigestOf(p.Release, p.Binding, &ls)
}

// Claim options.
func fenced(id uuid.UUID) func(*store.ClaimParams) {
	return func(p *store.ClaimParams) { p.ClaimID = id }
}

func leaseSeconds(n uint64) func(*store.ClaimParams) {
	return func(p *store.ClaimParams) { p.LeaseSeconds = n }
}

func withRelease(r lease.Release) func(*store.ClaimParams) {
	return func(p *store.ClaimParams) { p.Release = r }
}

func withBinding(b lease.Binding) func(*store.ClaimParams) {
	return func(p *store.ClaimParams) { p.Binding = b }
}

func asTenant(tenant string) func(*store.ClaimParams) {
	return func(p *store.ClaimParams) { p.TenantID = tenant }
}

func floors(m map[string]int) func(*store.ClaimParams) {
	return func(p *store.ClaimParams) { p.ReadyFloors = m }
}

// claim runs a claim and fails the scenario on error.
func (e *env) claim(opts ...func(*store.ClaimParams)) store.ClaimResult {
	e.t.Helper()
	p := e.claimParams(opts...)
	res, err := e.s.Claim(e.ctx, p)
	if err != nil {
		e.t.Fatalf("Claim: %v", err)
	}
	return res
}

// mustLease runs a claim that must lease a cell.
func (e *env) mustLease(opts ...func(*store.ClaimParams)) lease.Lease {
	e.t.Helper()
	res := e.claim(opts...)
	if res.Lease == nil {
		e.t.Fatal("Claim leased nothing, want a lease")
	}
	return *res.Lease
}

// mustEmpty runs a claim that must lease nothing.
func (e *env) mustEmpty(opts ...func(*store.ClaimParams)) store.ClaimResult {
	e.t.Helper()
	res := e.claim(opts...)
	if res.Lease != nil {
		e.t.Fatalf("Claim leased %s (cell %s), want empty", res.Lease.ID, res.Lease.CellID)
	}
	return res
}

// cell reads a cell through its worker.
func (e *env) cell(worker string, id uuid.UUID) lease.Cell {
	e.t.Helper()
	c, _, err := e.s.WorkerCell(e.ctx, worker, id)
	if err != nil {
		e.t.Fatalf("WorkerCell(%s, %s): %v", worker, id, err)
	}
	return c
}

// member reads a membership, and checks that its Cell is the cell of that
// ID as the pool's worker reads it (none before admission).
func (e *env) member(id uuid.UUID) store.Member {
	e.t.Helper()
	m, err := e.s.Member(e.ctx, id)
	if err != nil {
		e.t.Fatalf("Member(%s): %v", id, err)
	}
	c, _, err := e.s.WorkerCell(e.ctx, poolWorker(m.Pool), id)
	switch {
	case err == nil:
		e.wantMemberCell(m, &c, "Member")
	case errors.Is(err, errcode.ErrNotFound):
		e.wantMemberCell(m, nil, "Member of a pool without an admitted cell")
	default:
		e.t.Fatalf("WorkerCell(%s): %v", id, err)
	}
	return m
}

// record reads a lease record of tenantA.
func (e *env) record(leaseID uuid.UUID) store.LeaseRecord {
	e.t.Helper()
	rec, err := e.s.Lease(e.ctx, tenantA, leaseID)
	if err != nil {
		e.t.Fatalf("Lease(%s): %v", leaseID, err)
	}
	return rec
}

// createMember records a provisioning member of tenantA in pool.
func (e *env) createMember(pool string) store.Member {
	e.t.Helper()
	m, err := e.s.CreateMember(e.ctx, store.CreateMemberParams{CellID: newID(), Pool: pool, TenantID: tenantA, Now: e.now})
	if err != nil {
		e.t.Fatalf("CreateMember: %v", err)
	}
	return m
}

func (e *env) admitParams(m store.Member) store.AdmitParams {
	return store.AdmitParams{
		CellID:         m.CellID,
		Pool:           m.Pool,
		WorkerID:       poolWorker(m.Pool),
		ProviderCellID: m.CellID.String(),
		Identity:       "uid-" + m.CellID.String(),
		Release:        e.kata,
		ReadyDeadline:  e.now.Add(time.Hour),
		Now:            e.now,
	}
}

// poolCell creates and admits a ready member of pool with the kata release.
func (e *env) poolCell(pool string) (store.Member, lease.Cell) {
	e.t.Helper()
	m := e.createMember(pool)
	c, err := e.s.AdmitMember(e.ctx, e.admitParams(m))
	if err != nil {
		e.t.Fatalf("AdmitMember: %v", err)
	}
	return e.member(m.CellID), c
}

// proofOf is the lease fence a tenant holding l presents.
func proofOf(l lease.Lease) lease.Proof {
	return lease.Proof{Generation: l.Generation, Binding: l.Binding, AttestationDigest: l.AttestationDigest}
}

func (e *env) check(l lease.Lease) store.LeaseCheck {
	return store.LeaseCheck{TenantID: tenantA, LeaseID: l.ID, Proof: proofOf(l), Now: e.now}
}

// wantErr fails unless err matches target under errors.Is.
func (e *env) wantErr(err, target error, what string) {
	e.t.Helper()
	if !errors.Is(err, target) {
		e.t.Errorf("%s: error = %v, want %s", what, err, describe(target))
	}
}

// wantOK fails the scenario on err.
func (e *env) wantOK(err error, what string) {
	e.t.Helper()
	if err != nil {
		e.t.Fatalf("%s: %v", what, err)
	}
}

func describe(target error) string {
	if c, ok := target.(*errcode.Error); ok {
		return "code " + string(c.Code)
	}
	return fmt.Sprintf("%q", target)
}

// wantCell compares a whole cell.
func (e *env) wantCell(got, want lease.Cell, what string) {
	e.t.Helper()
	if !sameCell(got, want) {
		e.t.Errorf("%s:\n got  %s\n want %s", what, showCell(got), showCell(want))
	}
}

// wantLease compares a whole lease.
func (e *env) wantLease(got *lease.Lease, want lease.Lease, what string) {
	e.t.Helper()
	if got == nil {
		e.t.Errorf("%s: no lease, want %+v", what, want)
		return
	}
	if !reflect.DeepEqual(normLease(*got), normLease(want)) {
		e.t.Errorf("%s:\n got  %+v\n want %+v", what, *got, want)
	}
}

// wantMember compares a whole membership but its Cell, which e.member
// checks against the cell as its worker reads it.
func (e *env) wantMember(got, want store.Member, what string) {
	e.t.Helper()
	got.Cell, want.Cell = nil, nil
	if !reflect.DeepEqual(normMember(got), normMember(want)) {
		e.t.Errorf("%s:\n got  %+v\n want %+v", what, got, want)
	}
}

// wantMemberCell checks the Cell of a membership.
func (e *env) wantMemberCell(m store.Member, want *lease.Cell, what string) {
	e.t.Helper()
	switch {
	case m.Cell == nil && want == nil:
	case m.Cell == nil:
		e.t.Errorf("%s: member %s has no cell, want %s", what, m.CellID, showCell(*want))
	case want == nil:
		e.t.Errorf("%s: member %s has cell %s, want none", what, m.CellID, showCell(*m.Cell))
	default:
		e.wantCell(*m.Cell, *want, what+": member cell")
	}
}

// wantCellCounts compares CellCounts, a missing state counting as 0.
func (e *env) wantCellCounts(want map[lease.State]int) {
	e.t.Helper()
	got, err := e.s.CellCounts(e.ctx)
	e.wantOK(err, "CellCounts")
	for _, st := range []lease.State{lease.Ready, lease.Leased, lease.Destroyed, lease.Quarantined} {
		if got[st] != want[st] {
			e.t.Errorf("CellCounts = %v, want %v", got, want)
			return
		}
	}
	for st, n := range got {
		if !st.Valid() && n != 0 {
			e.t.Errorf("CellCounts has unknown state %q: %v", st, got)
		}
	}
}

func nt(t time.Time) time.Time { return t.UTC().Round(0) }

func normLease(l lease.Lease) lease.Lease {
	l.ExpiresAt = nt(l.ExpiresAt)
	return l
}

func normCell(c lease.Cell) lease.Cell {
	c.ExpiresAt, c.CreatedAt = nt(c.ExpiresAt), nt(c.CreatedAt)
	if c.Lease != nil {
		l := normLease(*c.Lease)
		c.Lease = &l
	}
	return c
}

func normMember(m store.Member) store.Member {
	m.CreatedAt, m.UpdatedAt = nt(m.CreatedAt), nt(m.UpdatedAt)
	if m.Cell != nil {
		c := normCell(*m.Cell)
		m.Cell = &c
	}
	return m
}

func showMember(m store.Member) string {
	c := m.Cell
	m.Cell = nil
	if c == nil {
		return fmt.Sprintf("%+v", m)
	}
	return fmt.Sprintf("%+v with cell %s", m, showCell(*c))
}

func sameCell(a, b lease.Cell) bool { return reflect.DeepEqual(normCell(a), normCell(b)) }

func showCell(c lease.Cell) string {
	l := c.Lease
	c.Lease = nil
	if l == nil {
		return fmt.Sprintf("%+v", c)
	}
	return fmt.Sprintf("%+v with lease %+v", c, *l)
}

// leasedCell is what a ready cell looks like once l leased it.
func leasedCell(c lease.Cell, l lease.Lease) lease.Cell {
	c.State, c.Generation, c.Lease = lease.Leased, lease.GenerationLeased, &l
	return c
}

// withState returns c in another state.
func withState(c lease.Cell, s lease.State) lease.Cell {
	c.State = s
	return c
}
