package pool_test

// Provider-fault tests: a pool over a real store (SQLite, and PostgreSQL
// when SANDBOXWICH_TEST_POSTGRES_URL is set) and the fake provider failing
// 30 % of provisions, destroys (uncertain results and timeouts) and
// responses (the provider acted, the answer was lost), with runtime-class
// drift and objects vanishing out of band, driven by many claims, releases,
// execs and expiries on a manual clock. After every pass the invariants of
// CONTRACT §4 and §8 are checked; then the faults are cleared and the pool
// must converge: every affected cell quarantined or proven destroyed, and
// the provider holding exactly the objects of the live members.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sort"
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

// faultClock is a manual clock.
type faultClock = testenv.Clock

// execFake is the fake provider with exec, so that the plane re-verifies the
// runtime before each command.
type execFake struct{ *fake.Provider }

func (execFake) Exec(context.Context, driver.Object, driver.ExecRequest) (driver.ExecResult, error) {
	return driver.ExecResult{ExitCode: 0, Stdout: []byte("ok")}, nil
}

var _ driver.Execer = execFake{}

const (
	faultPool   = "faulty"
	faultTarget = 6
)

// faultRig is one pool under fault injection.
type faultRig struct {
	t     *testing.T
	ctx   context.Context
	st    store.Store
	clock *faultClock
	prov  *fake.Provider
	plane *sandboxwich.Plane
	pools *pool.Reconciler
	rel   lease.Release
	rng   *rand.Rand

	// cellLease records the one lease each cell was ever given.
	cellLease map[uuid.UUID]uuid.UUID
	// claims records what each claim ID returned (uuid.Nil: empty).
	claims map[uuid.UUID]uuid.UUID
	held   []*heldLease
	// requested is the disposition a tenant release recorded per cell.
	requested map[uuid.UUID]lease.Disposition
	// drifted cells had their runtime class drift or their object vanish.
	drifted map[uuid.UUID]bool
	passes  int
}

type heldLease struct {
	claimID uuid.UUID
	req     sandboxwich.ClaimRequest
	res     sandboxwich.ClaimResult
	done    bool // released, expired or ended: no longer acted on
}

func openFaultSQLite(t *testing.T) store.Store { return testenv.SQLite(t) }

func openFaultPostgres(t *testing.T) store.Store { return testenv.Postgres(t) }

func newFaultRig(t *testing.T, st store.Store, seed uint64, faults fake.Faults) *faultRig {
	t.Helper()
	keys := testenv.Keyring(t)
	rel := lease.Release{ReleaseSetID: "release-faults", RuntimeClass: lease.GVisorLowerRisk, PolicyDigest: fmt.Sprintf("%064x", seed)}
	rel.Signature = keys.SignRelease(rel)
	c := testenv.NewClock()
	prov := fake.New(fake.Config{Mode: driver.Apply, Kind: "fake", Faults: faults, Seed: seed})
	cfg := pool.Config{Name: faultPool, TenantID: "acme", Release: rel, Target: faultTarget, MaxProvisioning: 3,
		ReadyTTL: 5 * time.Minute, Provider: execFake{prov}}
	plane, err := sandboxwich.New(st, keys, sandboxwich.WithClock(c.Now), sandboxwich.WithLogger(slog.New(slog.DiscardHandler)),
		sandboxwich.WithPools(cfg), sandboxwich.WithPoolOptions(
			pool.WithVerifyInterval(time.Second), pool.WithOrphanInterval(time.Nanosecond),
			pool.WithDestroyTimeout(20*time.Millisecond), pool.WithProvisionTimeout(5*time.Second),
		))
	if err != nil {
		t.Fatal(err)
	}
	return &faultRig{t: t, ctx: context.Background(), st: st, clock: c, prov: prov, plane: plane, pools: plane.Pools(),
		rel: rel, rng: rand.New(rand.NewPCG(seed, 0x5eed)), cellLease: map[uuid.UUID]uuid.UUID{},
		claims: map[uuid.UUID]uuid.UUID{}, requested: map[uuid.UUID]lease.Disposition{}, drifted: map[uuid.UUID]bool{}}
}

func (r *faultRig) members(states ...lease.MemberState) []store.Member {
	r.t.Helper()
	ms, err := r.st.Members(r.ctx, faultPool, states...)
	if err != nil {
		r.t.Fatal(err)
	}
	return ms
}

// objects returns the cell IDs the provider holds objects for.
func (r *faultRig) objects() map[uuid.UUID]bool {
	r.t.Helper()
	objs, err := r.prov.List(r.ctx)
	if err != nil {
		r.t.Fatal(err)
	}
	out := map[uuid.UUID]bool{}
	for _, o := range objs {
		out[o.CellID] = true
	}
	return out
}

// pass runs one reconciler pass and checks the invariants after it.
func (r *faultRig) pass() {
	r.t.Helper()
	r.pools.Pass(r.ctx)
	r.passes++
	r.checkInvariants()
}

// checkInvariants holds after every pass, faults or not.
func (r *faultRig) checkInvariants() {
	t := r.t
	t.Helper()
	ms := r.members()
	objs := r.objects()
	live := 0
	for _, m := range ms {
		if !m.State.Valid() {
			t.Fatalf("pass %d: member %s in unknown state %q", r.passes, m.CellID, m.State)
		}
		if m.State.Live() {
			live++
		}
		c := m.Cell
		switch m.State {
		case lease.MemberProvisioning:
			if c != nil {
				t.Fatalf("pass %d: provisioning member %s already has a cell", r.passes, m.CellID)
			}
		case lease.MemberReady:
			if c == nil || c.State != lease.Ready || c.Generation != lease.GenerationReady || c.Lease != nil {
				t.Fatalf("pass %d: ready member %s with cell %+v", r.passes, m.CellID, c)
			}
		case lease.MemberLeased:
			if c == nil || c.State != lease.Leased || c.Generation != lease.GenerationLeased || c.Lease == nil {
				t.Fatalf("pass %d: leased member %s with cell %+v", r.passes, m.CellID, c)
			}
		case lease.MemberStopping:
			// A ready cell is quarantined when its stop is recorded, so it
			// can never be claimed while its object is being destroyed.
			if c != nil && c.State == lease.Ready {
				t.Fatalf("pass %d: stopping member %s with a ready cell", r.passes, m.CellID)
			}
		case lease.MemberCleanupPending:
			// A failed, uncertain or mismatched stop quarantines the cell.
			if c != nil && c.State != lease.Quarantined {
				t.Fatalf("pass %d: cleanup_pending member %s with cell in %s", r.passes, m.CellID, c.State)
			}
		}
		if m.ProviderAbsent != m.State.Terminal() {
			// The store reaches a terminal member only through a proven
			// stop, and provider_absent only there.
			t.Fatalf("pass %d: member %s %s with provider_absent %v", r.passes, m.CellID, m.State, m.ProviderAbsent)
		}
		if m.State.Terminal() {
			r.checkTerminal(m)
			if objs[m.CellID] {
				t.Fatalf("pass %d: member %s proven absent (%s) but the provider still holds its object", r.passes, m.CellID, m.State)
			}
		}
		if c != nil && c.Lease != nil {
			if prev, ok := r.cellLease[c.ID]; ok && prev != c.Lease.ID {
				t.Fatalf("cell %s leased twice: %s and %s", c.ID, prev, c.Lease.ID)
			}
		}
	}
	if live > faultTarget {
		t.Fatalf("pass %d: %d live members, above the target %d", r.passes, live, faultTarget)
	}
	counts, err := r.st.CellCounts(r.ctx)
	if err != nil {
		t.Fatal(err)
	}
	mc := map[lease.MemberState]int{}
	for _, m := range ms {
		mc[m.State]++
	}
	if counts[lease.Ready] != mc[lease.MemberReady] {
		t.Fatalf("pass %d: %d ready cells but %d ready members", r.passes, counts[lease.Ready], mc[lease.MemberReady])
	}
}

// checkTerminal checks a terminal member against CONTRACT §4.2: its stop
// completed under the exact recorded fence (the cell's lease and
// generation as they were when the stop was recorded, which never change
// afterwards), and its final state follows the requested disposition
// (quarantined stays quarantined; destroyed only for a leased cell whose
// stop asked for it).
func (r *faultRig) checkTerminal(m store.Member) {
	t := r.t
	t.Helper()
	c := m.Cell
	if !lease.ValidDisposition(m.RequestedDisposition) {
		t.Fatalf("terminal member %s without a requested disposition", m.CellID)
	}
	if c == nil {
		if m.StopLeaseID != uuid.Nil || m.StopGeneration != 0 || lease.State(m.State) != m.RequestedDisposition {
			t.Fatalf("member %s without a cell ended %s under fence %s/%d (requested %s)",
				m.CellID, m.State, m.StopLeaseID, m.StopGeneration, m.RequestedDisposition)
		}
		return
	}
	wantLease := uuid.Nil
	if c.Lease != nil {
		wantLease = c.Lease.ID
	}
	if m.StopLeaseID != wantLease || m.StopGeneration != c.Generation {
		t.Fatalf("member %s provider_absent under fence %s/%d, cell holds %s/%d",
			m.CellID, m.StopLeaseID, m.StopGeneration, wantLease, c.Generation)
	}
	if lease.State(m.State) != c.State {
		t.Fatalf("member %s ended %s but its cell is %s", m.CellID, m.State, c.State)
	}
	switch {
	case m.RequestedDisposition == lease.Quarantined && m.State != lease.MemberQuarantined:
		t.Fatalf("member %s: quarantine requested, ended %s", m.CellID, m.State)
	case m.State == lease.MemberDestroyed && (c.Lease == nil || m.RequestedDisposition != lease.Destroyed):
		t.Fatalf("member %s destroyed without a leased stop that asked for it (requested %s)", m.CellID, m.RequestedDisposition)
	}
	if d, ok := r.requested[c.ID]; ok && d != m.RequestedDisposition {
		t.Fatalf("member %s: the tenant requested %s, the stop recorded %s", m.CellID, d, m.RequestedDisposition)
	}
}

var faultBindings = []lease.Binding{
	{OrganizationID: "org-1", WorkspaceID: "ws-1", ThreadID: "th-1", RunnerSessionID: "s-1"},
	{OrganizationID: "org-2", WorkspaceID: "ws/2", ThreadID: "th:2", RunnerSessionID: "s.2"},
}

// claim makes one fenced claim and records its outcome.
func (r *faultRig) claim() {
	t := r.t
	t.Helper()
	var secs *uint64
	switch r.rng.IntN(4) {
	case 0:
		v := uint64(5) // expires within a round or two
		secs = &v
	case 1:
		v := uint64(300)
		secs = &v
	case 2:
		v := uint64(0) // clamped to 1
		secs = &v
	}
	req := sandboxwich.ClaimRequest{ClaimID: uuid.Must(uuid.NewV7()), Release: r.rel,
		Binding: faultBindings[r.rng.IntN(len(faultBindings))], LeaseSeconds: secs}
	res, err := r.plane.Claim(r.ctx, "acme", req)
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	r.recordClaim(req.ClaimID, res)
	if res.Lease != nil {
		r.held = append(r.held, &heldLease{claimID: req.ClaimID, req: req, res: res})
	}
}

func (r *faultRig) recordClaim(claimID uuid.UUID, res sandboxwich.ClaimResult) {
	t := r.t
	t.Helper()
	got := uuid.Nil
	if res.Lease != nil {
		got = res.Lease.ID
		if res.Lease.Generation != lease.GenerationLeased || res.Lease.Release != r.rel {
			t.Fatalf("lease %+v", res.Lease)
		}
		if prev, ok := r.cellLease[res.Lease.CellID]; ok && prev != got {
			t.Fatalf("cell %s leased twice: %s then %s", res.Lease.CellID, prev, got)
		}
		r.cellLease[res.Lease.CellID] = got
	}
	if prev, ok := r.claims[claimID]; ok && prev != got {
		t.Fatalf("claim %s returned %s, then %s", claimID, prev, got)
	}
	r.claims[claimID] = got
}

// replay retries an earlier fenced claim: the same lease while it is live,
// a conflict once it is not; never another cell.
func (r *faultRig) replay(h *heldLease) {
	t := r.t
	t.Helper()
	res, err := r.plane.Claim(r.ctx, "acme", h.req)
	switch {
	case errors.Is(err, errcode.ErrConflict):
		return // no longer live
	case err != nil:
		t.Fatalf("replay: %v", err)
	case !res.Replayed || res.Lease == nil || res.Attestation() != h.res.Attestation():
		t.Fatalf("replay of a live claim: %+v (replayed %v)", res.Lease, res.Replayed)
	}
	r.recordClaim(h.claimID, res)
}

func proofOf(h *heldLease) sandboxwich.Proof {
	return sandboxwich.NewProof(h.res.Attestation(), lease.GenerationLeased, h.req.Binding)
}

// release releases a held lease with a random disposition, sometimes twice,
// and sometimes retries it with the other disposition (a cleanup fence
// mismatch).
func (r *faultRig) release(h *heldLease) {
	t := r.t
	t.Helper()
	d := lease.Destroyed
	if r.rng.IntN(3) == 0 {
		d = lease.Quarantined
	}
	cellID := h.res.Lease.CellID
	st, err := r.plane.Release(r.ctx, "acme", h.res.Lease.ID, proofOf(h), d)
	switch {
	case errors.Is(err, errcode.ErrConflict):
		h.done = true // expired, or ended by drift
		return
	case err != nil:
		t.Fatalf("release: %v", err)
	case st.ProviderAbsent || st.CleanupPending || st.State != lease.Leased:
		// The stop is recorded; the provider has not been called yet.
		t.Fatalf("status right after the release intent: %+v", st)
	}
	r.requested[cellID] = d
	h.done = true
	switch r.rng.IntN(4) {
	case 0: // exact retry while stopping: nothing changes
		if _, err := r.plane.Release(r.ctx, "acme", h.res.Lease.ID, proofOf(h), d); err != nil {
			t.Fatalf("exact release retry: %v", err)
		}
	case 1: // retry with the other disposition: cleanup fence mismatch
		other := lease.Quarantined
		if d == lease.Quarantined {
			other = lease.Destroyed
		}
		if _, err := r.plane.Release(r.ctx, "acme", h.res.Lease.ID, proofOf(h), other); !errors.Is(err, errcode.ErrConflict) {
			t.Fatalf("release retry with another disposition: %v, want conflict", err)
		}
		m, err := r.st.Member(r.ctx, cellID)
		if err != nil {
			t.Fatal(err)
		}
		if m.State != lease.MemberCleanupPending || m.ProviderAbsent || m.RequestedDisposition != d || m.Cell.State != lease.Quarantined {
			t.Fatalf("after a disposition mismatch: %s provider_absent %v requested %s cell %s",
				m.State, m.ProviderAbsent, m.RequestedDisposition, m.Cell.State)
		}
	}
}

// exec runs a command in a held lease's cell: it succeeds on a verified
// cell and ends a drifted one.
func (r *faultRig) exec(h *heldLease, drift bool) {
	t := r.t
	t.Helper()
	cellID := h.res.Lease.CellID
	if drift {
		r.prov.Drift(cellID, lease.KataMicroVM)
	}
	_, err := r.plane.Exec(r.ctx, "acme", h.res.Lease.ID, proofOf(h), sandboxwich.ExecRequest{Argv: []string{"true"}})
	switch {
	case errors.Is(err, errcode.ErrConflict) && !errors.Is(err, errcode.ErrRuntimeClassBoundaryUnverified):
		h.done = true // the lease is no longer live
	case drift && errors.Is(err, errcode.ErrRuntimeClassBoundaryUnverified):
		r.drifted[cellID] = true
		h.done = true
		m, merr := r.st.Member(r.ctx, cellID)
		if merr != nil {
			t.Fatal(merr)
		}
		if m.Cell.State != lease.Quarantined || m.State != lease.MemberStopping || m.RequestedDisposition != lease.Quarantined {
			t.Fatalf("after an unverified exec: member %s, requested %s, cell %s", m.State, m.RequestedDisposition, m.Cell.State)
		}
	case drift:
		t.Fatalf("exec on a drifted cell: %v, want runtime_class_boundary_unverified", err)
	case err != nil:
		t.Fatalf("exec on a verified cell: %v", err)
	}
}

// driftReady makes a ready member's runtime drift, or its object vanish.
func (r *faultRig) driftReady() {
	ready := r.members(lease.MemberReady)
	if len(ready) == 0 {
		return
	}
	m := ready[r.rng.IntN(len(ready))]
	if r.rng.IntN(2) == 0 {
		r.prov.Drift(m.CellID, lease.KataMicroVM)
	} else {
		r.prov.Vanish(m.CellID)
	}
	r.drifted[m.CellID] = true
}

func (r *faultRig) liveHeld() []*heldLease {
	var out []*heldLease
	for _, h := range r.held {
		if !h.done {
			out = append(out, h)
		}
	}
	return out
}

// chaos drives the pool for rounds passes under faults.
func (r *faultRig) chaos(rounds int) {
	for range rounds {
		r.clock.Advance(time.Duration(1+r.rng.IntN(20)) * time.Second)
		for range r.rng.IntN(3) {
			r.claim()
		}
		if hs := r.liveHeld(); len(hs) > 0 {
			h := hs[r.rng.IntN(len(hs))]
			switch r.rng.IntN(6) {
			case 0, 1:
				r.release(h)
			case 2:
				r.replay(h)
			case 3:
				r.exec(h, false)
			case 4:
				r.exec(h, true)
			}
		}
		if r.rng.IntN(5) == 0 {
			r.driftReady()
		}
		r.pass()
	}
}

// converge clears the faults, ends every lease, and runs passes until the
// pool is back at its target with nothing in flight: first with the clock
// moving past every cleanup back-off (at most a minute), then with the
// clock still, so that no ready cell expires while the pool refills.
func (r *faultRig) converge() {
	t := r.t
	t.Helper()
	r.prov.SetFaults(fake.Faults{})
	for _, h := range r.liveHeld() {
		r.release(h)
	}
	for i := 0; i < 20 && r.inFlight() > 0; i++ {
		r.clock.Advance(61 * time.Second)
		r.pass()
	}
	for range 10 {
		if r.converged() {
			return
		}
		r.pass()
	}
	counts := map[lease.MemberState]int{}
	for _, m := range r.members() {
		counts[m.State]++
	}
	t.Fatalf("the pool did not converge after the faults cleared: members %v, provider objects %d", counts, len(r.objects()))
}

// inFlight counts members whose provider action is not finished.
func (r *faultRig) inFlight() int {
	n := 0
	for _, m := range r.members() {
		if m.State != lease.MemberReady && m.State.Live() {
			n++
		}
	}
	return n
}

func (r *faultRig) converged() bool {
	objs := r.objects()
	ready := 0
	for _, m := range r.members() {
		switch {
		case m.State == lease.MemberReady:
			ready++
			if !objs[m.CellID] {
				return false
			}
		case !m.State.Terminal():
			return false
		}
	}
	return ready == faultTarget && len(objs) == faultTarget
}

// checkConverged checks the end state.
func (r *faultRig) checkConverged() {
	t := r.t
	t.Helper()
	objs := r.objects()
	var liveIDs, objIDs []string
	terminal := 0
	for _, m := range r.members() {
		switch {
		case m.State.Terminal():
			terminal++
			if !m.ProviderAbsent {
				t.Errorf("terminal member %s without provider_absent", m.CellID)
			}
			if r.drifted[m.CellID] && (m.State != lease.MemberQuarantined || (m.Cell != nil && m.Cell.State != lease.Quarantined)) {
				t.Errorf("drifted cell %s ended %s", m.CellID, m.State)
			}
		case m.State == lease.MemberReady:
			liveIDs = append(liveIDs, m.CellID.String())
		default:
			t.Errorf("member %s still %s after convergence", m.CellID, m.State)
		}
		if r.drifted[m.CellID] && !m.State.Terminal() {
			t.Errorf("drifted cell %s is still %s", m.CellID, m.State)
		}
	}
	for id := range objs {
		objIDs = append(objIDs, id.String())
	}
	sort.Strings(liveIDs)
	sort.Strings(objIDs)
	if fmt.Sprint(liveIDs) != fmt.Sprint(objIDs) {
		t.Errorf("provider objects %v != live members %v", objIDs, liveIDs)
	}
	// Every lease ever handed out is over, proven gone, and never
	// regenerates authority.
	for _, h := range r.held {
		st, err := r.plane.LeaseStatus(r.ctx, "acme", h.res.Lease.ID)
		if err != nil {
			t.Fatal(err)
		}
		if !st.State.Terminal() || !st.ProviderAbsent || st.CleanupPending || st.Disposition != st.State {
			t.Errorf("lease %s after convergence: %+v", h.res.Lease.ID, st)
		}
		if d, ok := r.requested[h.res.Lease.CellID]; ok && d == lease.Quarantined && st.State != lease.Quarantined {
			t.Errorf("lease %s: quarantine requested, ended %s", h.res.Lease.ID, st.State)
		}
		if _, err := r.plane.Validate(r.ctx, "acme", h.res.Lease.ID, proofOf(h)); !errors.Is(err, errcode.ErrConflict) {
			t.Errorf("validate of ended lease %s: %v", h.res.Lease.ID, err)
		}
		if _, err := r.plane.Claim(r.ctx, "acme", h.req); !errors.Is(err, errcode.ErrConflict) {
			t.Errorf("replay of ended claim %s: %v, want conflict", h.claimID, err)
		}
	}
	// The faults did happen: some stops failed and were retried, some
	// provisions failed.
	var retried, failedProvision int
	for _, m := range r.members() {
		if m.Attempts > 1 {
			retried++
		}
		if m.Cell == nil {
			failedProvision++
		}
	}
	if retried == 0 || failedProvision == 0 || terminal == 0 || len(r.held) == 0 {
		t.Errorf("the run exercised too little: %d retried stops, %d failed provisions, %d terminal members, %d leases",
			retried, failedProvision, terminal, len(r.held))
	}
	t.Logf("%d passes, %d leases, %d terminal members (%d retried stops, %d failed provisions), %d drifted cells, provider calls: %d provisions, %d destroys",
		r.passes, len(r.held), terminal, retried, failedProvision, len(r.drifted), r.prov.Calls("provision"), r.prov.Calls("destroy"))
}

var thirtyPercent = fake.Faults{ProvisionFailure: 0.3, DestroyUncertain: 0.3, DestroyTimeout: 0.3, LostResponse: 0.3}

func runProviderFaults(t *testing.T, open func(*testing.T) store.Store) {
	for _, seed := range []uint64{1, 2} {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			t.Parallel()
			r := newFaultRig(t, open(t), seed, thirtyPercent)
			r.chaos(40)
			r.converge()
			r.checkConverged()
		})
	}
}

// TestProviderFaultsConvergeSQLite runs the fault scenario on SQLite.
func TestProviderFaultsConvergeSQLite(t *testing.T) {
	t.Parallel()
	runProviderFaults(t, openFaultSQLite)
}

// TestProviderFaultsConvergePostgres runs the fault scenario on PostgreSQL.
func TestProviderFaultsConvergePostgres(t *testing.T) {
	t.Parallel()
	runProviderFaults(t, openFaultPostgres)
}

// TestProviderFaultStaleOutcomeNeverProvesAbsence: a stop outcome that
// does not carry the recorded fence — a lost response answered late, an
// executor that read the member before a later stop — never sets
// provider_absent, whatever it claims; nor does an unproven one. The member
// goes to cleanup_pending with its cell quarantined, and the next pass
// completes the stop under the exact fence.
func TestProviderFaultStaleOutcomeNeverProvesAbsence(t *testing.T) {
	t.Parallel()
	for _, b := range []struct {
		name string
		open func(*testing.T) store.Store
	}{{"sqlite", openFaultSQLite}, {"postgres", openFaultPostgres}} {
		t.Run(b.name, func(t *testing.T) {
			r := newFaultRig(t, b.open(t), 7, fake.Faults{})
			r.pass()
			r.claim()
			for len(r.held) == 0 {
				r.pass()
				r.claim()
			}
			h := r.held[0]
			cellID, leaseID := h.res.Lease.CellID, h.res.Lease.ID
			if _, err := r.plane.Release(r.ctx, "acme", leaseID, proofOf(h), lease.Destroyed); err != nil {
				t.Fatal(err)
			}
			stale := []store.StopOutcome{
				{StopLeaseID: uuid.Nil, StopGeneration: 1, Disposition: lease.Destroyed, Proven: true},      // the ready-time fence
				{StopLeaseID: uuid.New(), StopGeneration: 2, Disposition: lease.Destroyed, Proven: true},    // another lease
				{StopLeaseID: leaseID, StopGeneration: 2, Disposition: lease.Quarantined, Proven: true},     // another disposition
				{StopLeaseID: leaseID, StopGeneration: 2, Disposition: lease.Destroyed, Error: "uncertain"}, // the fence, unproven
			}
			for i, out := range stale {
				out.CellID, out.Now = cellID, r.clock.Now()
				_, _ = r.st.CompleteStop(r.ctx, out)
				m, err := r.st.Member(r.ctx, cellID)
				if err != nil {
					t.Fatal(err)
				}
				if m.ProviderAbsent || m.State != lease.MemberCleanupPending || m.Cell.State != lease.Quarantined ||
					m.RequestedDisposition != lease.Destroyed || m.StopLeaseID != leaseID || m.StopGeneration != 2 {
					t.Fatalf("outcome %d %+v: member %s provider_absent %v cell %s fence %s/%d requested %s", i, out,
						m.State, m.ProviderAbsent, m.Cell.State, m.StopLeaseID, m.StopGeneration, m.RequestedDisposition)
				}
			}
			st, err := r.plane.LeaseStatus(r.ctx, "acme", leaseID)
			if err != nil || st.ProviderAbsent || !st.CleanupPending || st.State != lease.Quarantined {
				t.Fatalf("status while cleanup is pending: %+v %v", st, err)
			}
			r.clock.Advance(2 * time.Minute)
			r.pass()
			m, err := r.st.Member(r.ctx, cellID)
			if err != nil {
				t.Fatal(err)
			}
			// Proven now, under the recorded fence; the cell stays
			// quarantined although destroyed was requested.
			if !m.ProviderAbsent || m.State != lease.MemberQuarantined || m.Cell.State != lease.Quarantined || r.objects()[cellID] {
				t.Fatalf("after the retry: member %s provider_absent %v cell %s", m.State, m.ProviderAbsent, m.Cell.State)
			}
		})
	}
}
