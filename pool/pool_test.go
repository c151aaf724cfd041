package pool_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/internal/testenv"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
	"github.com/sandboxwich/sandboxwich/store"
)

// clock is a manual clock.
type clock = testenv.Clock

type fixture struct {
	t     *testing.T
	ctx   context.Context
	clock *clock
	prov  *fake.Provider
	st    store.Store
	plane *sandboxwich.Plane
	rel   lease.Release
	pools *pool.Reconciler
	logs  *logBuffer // the plane's and the pools' log, as text
}

func newFixture(t *testing.T, cfg pool.Config) *fixture {
	t.Helper()
	return newFixtureOn(t, testenv.SQLite(t), cfg)
}

func newFixtureOn(t *testing.T, st store.Store, cfg pool.Config) *fixture {
	t.Helper()
	keys := testenv.Keyring(t)
	rel := testenv.Release(keys, lease.GVisorLowerRisk)
	c := testenv.NewClock()
	var prov *fake.Provider
	switch p := cfg.Provider.(type) {
	case nil:
		prov = fake.New(fake.Config{Mode: "apply", Kind: "fake"})
		cfg.Provider = prov
	case *fake.Provider:
		prov = p
	case *fake.AgentProvider:
		prov = p.Provider
	case noDigest:
		prov = p.Provider
	case *imageProvider:
		prov = p.Provider
	}
	if cfg.Name == "" {
		cfg.Name = "p1"
	}
	cfg.TenantID = "acme"
	cfg.Release = rel
	logs := new(logBuffer)
	plane, err := sandboxwich.New(st, keys, sandboxwich.WithClock(c.Now), sandboxwich.WithLogger(slog.New(slog.NewTextHandler(logs, nil))), sandboxwich.WithPools(cfg),
		sandboxwich.WithPoolOptions(pool.WithVerifyInterval(time.Second), pool.WithOrphanInterval(time.Nanosecond)))
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, ctx: context.Background(), clock: c, prov: prov, st: st, plane: plane, rel: rel, pools: plane.Pools(), logs: logs}
}

// logBuffer is a goroutine-safe log sink.
type logBuffer = testenv.Buffer

// settle runs passes until nothing more is created (at most n).
func (f *fixture) settle() {
	for range 10 {
		if !f.pools.Pass(f.ctx) {
			return
		}
	}
}

func (f *fixture) counts() map[lease.MemberState]int {
	f.t.Helper()
	sts, err := f.pools.Status(f.ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	return sts[0].Members
}

// lastError is the pool's Status.LastError, what /v1/pools reports.
func (f *fixture) lastError() string {
	f.t.Helper()
	sts, err := f.pools.Status(f.ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	return sts[0].LastError
}

func (f *fixture) wantCounts(want map[lease.MemberState]int) {
	f.t.Helper()
	got := f.counts()
	for _, st := range lease.MemberStates {
		if got[st] != want[st] {
			f.t.Fatalf("members: got %v, want %v", got, want)
		}
	}
}

var binding = lease.Binding{OrganizationID: "org-1", WorkspaceID: "ws-1", ThreadID: "th-1", RunnerSessionID: "s-1"}

func (f *fixture) claim() sandboxwich.ClaimResult {
	f.t.Helper()
	res, err := f.plane.Claim(f.ctx, "acme", sandboxwich.ClaimRequest{ClaimID: uuid.Must(uuid.NewV7()), Release: f.rel, Binding: binding})
	if err != nil {
		f.t.Fatal(err)
	}
	return res
}

func proof(res sandboxwich.ClaimResult) sandboxwich.Proof {
	return sandboxwich.NewProof(res.Attestation(), 2, binding)
}

func TestFillClaimReleaseRefill(t *testing.T) {
	f := newFixture(t, pool.Config{Target: 3, MaxProvisioning: 2})
	f.settle()
	f.wantCounts(map[lease.MemberState]int{lease.MemberReady: 3})
	if f.prov.Len() != 3 {
		t.Fatalf("provider objects = %d, want 3", f.prov.Len())
	}

	res := f.claim()
	if res.Lease == nil || res.PoolName != "p1" {
		t.Fatalf("claim: %+v", res)
	}
	f.wantCounts(map[lease.MemberState]int{lease.MemberReady: 2, lease.MemberLeased: 1})

	st, err := f.plane.Release(f.ctx, "acme", res.Lease.ID, proof(res), lease.Destroyed)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != lease.Leased || st.ProviderAbsent || st.CleanupPending {
		t.Fatalf("status after release intent: %+v", st)
	}
	f.settle()
	st, err = f.plane.LeaseStatus(f.ctx, "acme", res.Lease.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != lease.Destroyed || st.Disposition != lease.Destroyed || !st.ProviderAbsent || st.ProviderMode != "apply" {
		t.Fatalf("status after stop: %+v", st)
	}
	f.wantCounts(map[lease.MemberState]int{lease.MemberReady: 3, lease.MemberDestroyed: 1})
	if f.prov.Len() != 3 {
		t.Fatalf("provider objects = %d, want 3", f.prov.Len())
	}
	// The released lease can never act again.
	if _, err := f.plane.Validate(f.ctx, "acme", res.Lease.ID, proof(res)); !errors.Is(err, errcode.ErrConflict) {
		t.Fatalf("validate after destroy: %v", err)
	}
}

func TestReadyTTLExpiryReplaces(t *testing.T) {
	f := newFixture(t, pool.Config{Target: 2, ReadyTTL: time.Minute})
	f.settle()
	f.clock.Advance(time.Minute)
	f.settle()
	f.wantCounts(map[lease.MemberState]int{lease.MemberReady: 2, lease.MemberQuarantined: 2})
	if f.prov.Len() != 2 || f.prov.Calls("destroy") != 2 {
		t.Fatalf("objects %d, destroys %d", f.prov.Len(), f.prov.Calls("destroy"))
	}
}

func TestProvisionFailureQuarantinesWithProof(t *testing.T) {
	prov := fake.New(fake.Config{Mode: "apply", Faults: fake.Faults{ProvisionFailure: 1}})
	f := newFixture(t, pool.Config{Target: 2, Provider: prov})
	f.pools.Pass(f.ctx)
	f.wantCounts(map[lease.MemberState]int{lease.MemberQuarantined: 2})
	// The stops were proven, and still the provider's error is reported.
	if got := f.lastError(); strings.Count(got, "provision failed: fake: injected fault") != 2 {
		t.Errorf("LastError after two failed provisions = %q, want both provider errors", got)
	}
	prov.SetFaults(fake.Faults{})
	f.settle()
	f.wantCounts(map[lease.MemberState]int{lease.MemberReady: 2, lease.MemberQuarantined: 2})
	if got := f.lastError(); got != "" {
		t.Errorf("LastError after a clean pass = %q", got)
	}
}

func TestUncertainDestroyKeepsCapacityUntilProven(t *testing.T) {
	prov := fake.New(fake.Config{Mode: "apply"})
	f := newFixture(t, pool.Config{Target: 2, ReadyTTL: time.Minute, Provider: prov})
	f.settle()
	prov.SetFaults(fake.Faults{DestroyUncertain: 1})
	f.clock.Advance(time.Minute)
	f.settle()
	// Both stops failed: still counted, so nothing new is provisioned.
	f.wantCounts(map[lease.MemberState]int{lease.MemberCleanupPending: 2})
	if got := f.lastError(); !strings.Contains(got, "destroy not proven: deletion not proven") {
		t.Errorf("LastError after uncertain destroys = %q, want the provider's error", got)
	}
	for range 3 {
		f.clock.Advance(time.Minute)
		f.settle()
	}
	f.wantCounts(map[lease.MemberState]int{lease.MemberCleanupPending: 2})
	members, err := f.st.Members(f.ctx, "p1", lease.MemberCleanupPending)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range members {
		if m.ProviderAbsent || m.Cell.State != lease.Quarantined || m.Attempts < 2 {
			t.Fatalf("cleanup member: %+v", m)
		}
	}
	prov.SetFaults(fake.Faults{})
	f.clock.Advance(time.Minute)
	f.settle()
	f.wantCounts(map[lease.MemberState]int{lease.MemberReady: 2, lease.MemberQuarantined: 2})
}

func TestRuntimeDriftStopsReadyMember(t *testing.T) {
	f := newFixture(t, pool.Config{Target: 1})
	f.settle()
	members, _ := f.st.Members(f.ctx, "p1", lease.MemberReady)
	f.prov.Drift(members[0].CellID, lease.KataMicroVM)
	f.clock.Advance(2 * time.Second)
	f.settle()
	f.wantCounts(map[lease.MemberState]int{lease.MemberReady: 1, lease.MemberQuarantined: 1})
	m, err := f.st.Member(f.ctx, members[0].CellID)
	if err != nil || !m.ProviderAbsent || m.Cell.State != lease.Quarantined {
		t.Fatalf("drifted member: %+v %v", m, err)
	}
}

func TestExpiredLeaseIsStopped(t *testing.T) {
	f := newFixture(t, pool.Config{Target: 1})
	f.settle()
	res := f.claim()
	f.clock.Advance(sandboxwich.DefaultLeaseSeconds * time.Second)
	f.settle()
	st, err := f.plane.LeaseStatus(f.ctx, "acme", res.Lease.ID)
	if err != nil || st.State != lease.Quarantined || !st.ProviderAbsent {
		t.Fatalf("expired lease: %+v %v", st, err)
	}
	f.wantCounts(map[lease.MemberState]int{lease.MemberReady: 1, lease.MemberQuarantined: 1})
}

func TestCrashedProvisionIsResumed(t *testing.T) {
	f := newFixture(t, pool.Config{Target: 2})
	// A previous process recorded two intents and died before acting.
	if _, err := f.st.Replenish(f.ctx, store.ReplenishParams{Pool: "p1", TenantID: "acme", Target: 2, MaxProvisioning: 2,
		NewID: func() uuid.UUID { return uuid.Must(uuid.NewV7()) }, Owner: "dead", LockUntil: f.clock.Now().Add(time.Minute),
		Now: f.clock.Now()}); err != nil {
		t.Fatal(err)
	}
	f.pools.Pass(f.ctx)
	f.wantCounts(map[lease.MemberState]int{lease.MemberProvisioning: 2}) // still locked by the dead owner
	f.clock.Advance(time.Minute)
	f.settle()
	f.wantCounts(map[lease.MemberState]int{lease.MemberReady: 2})
	if f.prov.Len() != 2 {
		t.Fatalf("objects = %d", f.prov.Len())
	}
}

func TestOrphansAreDestroyed(t *testing.T) {
	f := newFixture(t, pool.Config{Target: 1})
	f.settle()
	orphan := uuid.Must(uuid.NewV7())
	if _, err := f.prov.Provision(f.ctx, driverReq(orphan)); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(time.Second)
	f.settle()
	if f.prov.Len() != 1 {
		t.Fatalf("objects = %d, want the member's only", f.prov.Len())
	}
}

func TestTargetZeroDrains(t *testing.T) {
	f := newFixture(t, pool.Config{Target: 2})
	f.settle()
	res := f.claim()
	if err := f.pools.SetTarget("p1", 0); err != nil {
		t.Fatal(err)
	}
	f.settle()
	f.wantCounts(map[lease.MemberState]int{lease.MemberLeased: 1, lease.MemberQuarantined: 1})
	if _, err := f.plane.Release(f.ctx, "acme", res.Lease.ID, proof(res), lease.Destroyed); err != nil {
		t.Fatal(err)
	}
	f.settle()
	f.wantCounts(map[lease.MemberState]int{lease.MemberDestroyed: 1, lease.MemberQuarantined: 1})
	if f.prov.Len() != 0 {
		t.Fatalf("objects = %d after drain", f.prov.Len())
	}
}

func TestReadyFloorHoldsBack(t *testing.T) {
	f := newFixture(t, pool.Config{Target: 2, ReadyFloor: 1})
	f.settle()
	if res := f.claim(); res.Lease == nil {
		t.Fatal("first claim should lease")
	}
	if res := f.claim(); res.Lease != nil {
		t.Fatal("second claim should be held back by the ready floor")
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct {
		cfg   pool.Config
		field string
	}{
		{pool.Config{Target: -1}, "target"},
		{pool.Config{Target: 1, ReadyFloor: 2}, "ready_floor"},
		{pool.Config{Target: 2, MaxProvisioning: 3}, "max_provisioning"},
		{pool.Config{Target: 1, ReadyTTL: -time.Second}, "ready_ttl_seconds"},
	} {
		tc.cfg.Name, tc.cfg.TenantID = "p", "acme"
		tc.cfg.Release.RuntimeClass = lease.GVisorLowerRisk
		tc.cfg.Provider = fake.New(fake.Config{})
		_, err := pool.New(nil, []pool.Config{tc.cfg})
		if err == nil || !contains(err.Error(), tc.field) {
			t.Errorf("%+v: error %v does not name %s", tc.cfg, err, tc.field)
		}
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func driverReq(id uuid.UUID) driver.ProvisionRequest {
	return driver.ProvisionRequest{CellID: id, RuntimeClass: lease.GVisorLowerRisk}
}

// stalling is a fake provider whose Provision, once stall is set, waits
// for gate.
type stalling struct {
	*fake.Provider
	stall   atomic.Bool
	stalled atomic.Int32 // Provision calls waiting for gate
	gate    chan struct{}
}

func (s *stalling) Provision(ctx context.Context, req driver.ProvisionRequest) (driver.Object, error) {
	if s.stall.Load() {
		s.stalled.Add(1)
		select {
		case <-s.gate:
		case <-ctx.Done():
			return driver.Object{}, ctx.Err()
		}
	}
	return s.Provider.Provision(ctx, req)
}

// TestRunDestroysWhileProvisioning: Run does not hold a released cell's
// destroy behind another member's provisioning. With the replacement of
// one released cell stalled in Provision, a second released cell is
// destroyed, its deletion proven, meanwhile.
func TestRunDestroysWhileProvisioning(t *testing.T) {
	prov := &stalling{Provider: fake.New(fake.Config{Mode: "apply", Kind: "fake"}), gate: make(chan struct{})}
	f := newFixture(t, pool.Config{Target: 2, MaxProvisioning: 2, Provider: prov})
	f.settle()
	f.wantCounts(map[lease.MemberState]int{lease.MemberReady: 2})
	prov.stall.Store(true)
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan error, 1)
	go func() { done <- f.pools.Run(ctx) }()
	opened := false
	defer func() {
		if !opened {
			close(prov.gate)
		}
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	release := func() uuid.UUID {
		res := f.claim()
		if res.Lease == nil {
			t.Fatal("claim found no ready cell")
		}
		if _, err := f.plane.Release(f.ctx, "acme", res.Lease.ID, proof(res), lease.Destroyed); err != nil {
			t.Fatal(err)
		}
		return res.Lease.ID
	}
	absent := func(id uuid.UUID) bool {
		st, err := f.plane.LeaseStatus(f.ctx, "acme", id)
		if err != nil {
			t.Fatal(err)
		}
		return st.ProviderAbsent
	}
	first := release()
	deadline := time.Now().Add(10 * time.Second)
	for !absent(first) || prov.stalled.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the first released cell was not destroyed and replaced")
		}
		time.Sleep(5 * time.Millisecond)
	}
	second := release()
	deadline = time.Now().Add(5 * time.Second)
	for !absent(second) {
		if time.Now().After(deadline) {
			t.Fatal("the second released cell's destroy waited for the first one's replacement to provision")
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(prov.gate)
	opened = true
	deadline = time.Now().Add(10 * time.Second)
	for f.counts()[lease.MemberReady] != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the pool did not refill: %v", f.counts())
		}
		time.Sleep(5 * time.Millisecond)
	}
}
