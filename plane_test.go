package sandboxwich_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/internal/testenv"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
	"github.com/sandboxwich/sandboxwich/store"
)

var binding = lease.Binding{OrganizationID: "org-1", WorkspaceID: "workspace-1", ThreadID: "thread-1", RunnerSessionID: "session-1"}

type env struct {
	ctx    context.Context
	st     store.Store
	plane  *sandboxwich.Plane
	keys   *attest.Keyring
	rel    lease.Release
	worker sandboxwich.Worker
	now    time.Time
}

func newEnv(t *testing.T, opts ...sandboxwich.Option) *env {
	t.Helper()
	ctx := context.Background()
	st, keys := testenv.SQLite(t), testenv.Keyring(t)
	rel := testenv.Release(keys, lease.GVisorLowerRisk)
	e := &env{ctx: ctx, st: st, keys: keys, rel: rel, now: testenv.Start,
		worker: sandboxwich.Worker{ID: uuid.New(), TenantID: "acme", RuntimeClasses: []lease.RuntimeClass{lease.GVisorLowerRisk}}}
	opts = append([]sandboxwich.Option{sandboxwich.WithClock(func() time.Time { return e.now }),
		sandboxwich.WithLogger(slog.New(slog.DiscardHandler))}, opts...)
	var err error
	if e.plane, err = sandboxwich.New(st, keys, opts...); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) prepare(t *testing.T) lease.Cell {
	t.Helper()
	c, err := e.plane.Prepare(e.ctx, e.worker, sandboxwich.PrepareRequest{CellID: uuid.New(), Release: e.rel,
		ProviderCellID: "p-" + uuid.NewString(), ExpiresAt: e.now.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func u64(v uint64) *uint64 { return &v }

func TestClaimValidationOrderAndCodes(t *testing.T) {
	e := newEnv(t)
	e.prepare(t)
	bad := func(mut func(*sandboxwich.ClaimRequest)) sandboxwich.ClaimRequest {
		r := sandboxwich.ClaimRequest{ClaimID: uuid.New(), Release: e.rel, Binding: binding}
		mut(&r)
		return r
	}
	for _, tc := range []struct {
		name string
		req  sandboxwich.ClaimRequest
		want *errcode.Error
		msg  string
	}{
		{"bad release id", bad(func(r *sandboxwich.ClaimRequest) { r.Release.ReleaseSetID = "a b" }), errcode.ErrBadRequest, "release_set_id or policy_digest is invalid"},
		{"uppercase digest", bad(func(r *sandboxwich.ClaimRequest) { r.Release.PolicyDigest = strings.Repeat("A", 64) }), errcode.ErrBadRequest, "release_set_id"},
		{"bad class", bad(func(r *sandboxwich.ClaimRequest) { r.Release.RuntimeClass = "runc" }), errcode.ErrInvalidRequest, "runtime_class"},
		{"signature", bad(func(r *sandboxwich.ClaimRequest) { r.Release.Signature += "x" }), errcode.ErrAuthorizationDenied, "signature"},
		{"other class same sig", bad(func(r *sandboxwich.ClaimRequest) { r.Release.RuntimeClass = lease.KataMicroVM }), errcode.ErrAuthorizationDenied, "signature"},
		{"release before binding", bad(func(r *sandboxwich.ClaimRequest) { r.Release.Signature = ""; r.Binding.OrganizationID = "" }), errcode.ErrAuthorizationDenied, "signature"},
		{"org", bad(func(r *sandboxwich.ClaimRequest) { r.Binding.OrganizationID = "" }), errcode.ErrBadRequest, "organization_id is invalid"},
		{"workspace", bad(func(r *sandboxwich.ClaimRequest) { r.Binding.WorkspaceID = "ws\x00" }), errcode.ErrBadRequest, "workspace_id is invalid"},
		{"thread", bad(func(r *sandboxwich.ClaimRequest) { r.Binding.ThreadID = strings.Repeat("t", 257) }), errcode.ErrBadRequest, "thread_id is invalid"},
		{"session", bad(func(r *sandboxwich.ClaimRequest) { r.Binding.RunnerSessionID = "ѕession" }), errcode.ErrBadRequest, "runner_session_id is invalid"},
		{"org before session", bad(func(r *sandboxwich.ClaimRequest) { r.Binding.OrganizationID = "!"; r.Binding.RunnerSessionID = "!" }), errcode.ErrBadRequest, "organization_id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.plane.Claim(e.ctx, "acme", tc.req)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("got %v, want %v containing %q", err, tc.want, tc.msg)
			}
		})
	}
	// Nothing was consumed by the bad requests.
	res, err := e.plane.Claim(e.ctx, "acme", sandboxwich.ClaimRequest{Release: e.rel, Binding: binding})
	if err != nil || res.Lease == nil {
		t.Fatalf("good claim after bad ones: %+v %v", res, err)
	}
}

func TestLeaseSecondsClamped(t *testing.T) {
	for _, tc := range []struct {
		req  *uint64
		want time.Duration
	}{{nil, 120 * time.Second}, {u64(0), time.Second}, {u64(1), time.Second}, {u64(300), 300 * time.Second}, {u64(1000), 300 * time.Second}} {
		e := newEnv(t)
		e.prepare(t)
		res, err := e.plane.Claim(e.ctx, "acme", sandboxwich.ClaimRequest{Release: e.rel, Binding: binding, LeaseSeconds: tc.req})
		if err != nil || res.Lease == nil {
			t.Fatal(err)
		}
		if got := res.Lease.ExpiresAt.Sub(e.now); got != tc.want {
			t.Errorf("lease_seconds %v: expiry in %v, want %v", tc.req, got, tc.want)
		}
	}
}

func TestAttestationIsVerifiableAndKeyChangeConflicts(t *testing.T) {
	e := newEnv(t)
	e.prepare(t)
	claimID := uuid.New()
	res, err := e.plane.Claim(e.ctx, "acme", sandboxwich.ClaimRequest{ClaimID: claimID, Release: e.rel, Binding: binding})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(res.Attestation(), "swla1_") || len(res.Attestation()) != 49 {
		t.Fatalf("attestation shape: %d chars", len(res.Attestation()))
	}
	// A plane with another key regenerates a different token for the
	// stored lease: the replay is refused rather than minting new authority.
	other, _ := attest.NewKeyring([]byte(strings.Repeat("k", 40)))
	p2, _ := sandboxwich.New(e.st, other, sandboxwich.WithClock(func() time.Time { return e.now }))
	rel2 := e.rel
	rel2.Signature = other.SignRelease(rel2)
	_, err = p2.Claim(e.ctx, "acme", sandboxwich.ClaimRequest{ClaimID: claimID, Release: rel2, Binding: binding})
	if !errors.Is(err, errcode.ErrConflict) {
		t.Fatalf("replay under another key: %v", err)
	}
}

func TestTenantsAreIsolated(t *testing.T) {
	e := newEnv(t)
	e.prepare(t)
	res, err := e.plane.Claim(e.ctx, "globex", sandboxwich.ClaimRequest{Release: e.rel, Binding: binding})
	if err != nil || res.Lease != nil {
		t.Fatalf("foreign tenant claimed acme's cell: %+v %v", res, err)
	}
	res, _ = e.plane.Claim(e.ctx, "acme", sandboxwich.ClaimRequest{Release: e.rel, Binding: binding})
	proof := sandboxwich.NewProof(res.Attestation(), 2, binding)
	_, errForeign := e.plane.Validate(e.ctx, "globex", res.Lease.ID, proof)
	_, errUnknown := e.plane.Validate(e.ctx, "globex", uuid.New(), proof)
	if !errors.Is(errForeign, errcode.ErrNotFound) || errForeign.Error() != errUnknown.Error() {
		t.Fatalf("foreign %v vs unknown %v", errForeign, errUnknown)
	}
}

func TestPrepareChecks(t *testing.T) {
	e := newEnv(t)
	req := func(mut func(*sandboxwich.PrepareRequest)) sandboxwich.PrepareRequest {
		r := sandboxwich.PrepareRequest{CellID: uuid.New(), Release: e.rel, ProviderCellID: "p1", ExpiresAt: e.now.Add(time.Minute)}
		mut(&r)
		return r
	}
	kata := e.rel
	kata.RuntimeClass = lease.KataMicroVM
	kata.Signature = e.keys.SignRelease(kata)
	for _, tc := range []struct {
		name string
		req  sandboxwich.PrepareRequest
		want *errcode.Error
	}{
		{"past", req(func(r *sandboxwich.PrepareRequest) { r.ExpiresAt = e.now }), errcode.ErrBadRequest},
		{"provider id", req(func(r *sandboxwich.PrepareRequest) { r.ProviderCellID = "a b" }), errcode.ErrBadRequest},
		{"class not allowed", req(func(r *sandboxwich.PrepareRequest) { r.Release = kata }), errcode.ErrAuthorizationDenied},
		{"signature", req(func(r *sandboxwich.PrepareRequest) { r.Release.Signature = "swrs1_x" }), errcode.ErrAuthorizationDenied},
		{"beyond 7 days", req(func(r *sandboxwich.PrepareRequest) {
			r.ExpiresAt = e.now.Add(sandboxwich.DefaultMaxPrepareAhead + time.Microsecond)
		}), errcode.ErrInvalidRequest},
	} {
		if _, err := e.plane.Prepare(e.ctx, e.worker, tc.req); !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
	}
	if _, err := e.plane.Prepare(e.ctx, e.worker, req(func(r *sandboxwich.PrepareRequest) {
		r.ExpiresAt = e.now.Add(sandboxwich.DefaultMaxPrepareAhead)
	})); err != nil {
		t.Errorf("exactly 7 days ahead: %v", err)
	}
	// The bound is configurable.
	e = newEnv(t, sandboxwich.WithMaxPrepareAhead(time.Hour))
	if _, err := e.plane.Prepare(e.ctx, e.worker, req(func(r *sandboxwich.PrepareRequest) {
		r.ExpiresAt = e.now.Add(2 * time.Hour)
	})); !errors.Is(err, errcode.ErrInvalidRequest) {
		t.Errorf("2 hours ahead with a 1-hour bound: %v", err)
	}
	if _, err := sandboxwich.New(e.st, e.keys, sandboxwich.WithMaxPrepareAhead(0)); err == nil {
		t.Error("New accepted a zero prepare bound")
	}
}

// execProvider adds exec to the fake provider, recording commands. A
// command "crash" reports the cell lost, as a sandbox killed by a fork
// bomb does.
type execProvider struct {
	*fake.Provider
	ran [][]string
}

func (p *execProvider) Exec(_ context.Context, _ driver.Object, req driver.ExecRequest) (driver.ExecResult, error) {
	p.ran = append(p.ran, req.Argv)
	if req.Argv[0] == "crash" {
		return driver.ExecResult{}, fmt.Errorf("sandbox gone: %w", driver.ErrCellLost)
	}
	return driver.ExecResult{ExitCode: 0, Stdout: []byte(strings.Join(req.Argv, " "))}, nil
}

// TestExecCellLostQuarantines: a cell that dies during a command ends at
// once — quarantined, its stop recorded, the lease over (409) — instead of
// answering 500 and waiting for the next verification pass.
func TestExecCellLostQuarantines(t *testing.T) {
	prov := &execProvider{Provider: fake.New(fake.Config{Mode: driver.Apply})}
	e := newEnv(t)
	e = newEnv(t, sandboxwich.WithPools(pool.Config{Name: "p1", TenantID: "acme", Release: e.rel, Target: 1, Provider: prov}))
	e.plane.Pools().Pass(e.ctx)
	res, err := e.plane.Claim(e.ctx, "acme", sandboxwich.ClaimRequest{ClaimID: uuid.New(), Release: e.rel, Binding: binding})
	if err != nil || res.Lease == nil {
		t.Fatalf("claim: %v %v", res, err)
	}
	_, err = e.plane.Exec(e.ctx, "acme", res.Lease.ID, res.Proof(), sandboxwich.ExecRequest{Argv: []string{"crash"}})
	if !errors.Is(err, errcode.ErrConflict) || !errors.Is(err, driver.ErrCellLost) {
		t.Fatalf("exec in a cell that died: %v, want a conflict wrapping driver.ErrCellLost", err)
	}
	st, _ := e.plane.LeaseStatus(e.ctx, "acme", res.Lease.ID)
	if st.State != lease.Quarantined {
		t.Fatalf("cell after it died: %+v", st)
	}
	if _, err := e.plane.Exec(e.ctx, "acme", res.Lease.ID, res.Proof(), sandboxwich.ExecRequest{Argv: []string{"id"}}); !errors.Is(err, errcode.ErrConflict) {
		t.Fatalf("exec after the cell died: %v, want a conflict", err)
	}
	e.plane.Pools().Pass(e.ctx)
	if st, _ = e.plane.LeaseStatus(e.ctx, "acme", res.Lease.ID); !st.ProviderAbsent {
		t.Fatalf("cell after the pool's pass: %+v, want proven deleted", st)
	}
	if len(prov.ran) != 1 {
		t.Fatalf("commands run: %v", prov.ran)
	}
}

func TestExecVerifiesRuntimeBeforeEveryCommand(t *testing.T) {
	prov := &execProvider{Provider: fake.New(fake.Config{Mode: driver.Apply})}
	var rel lease.Release
	e := newEnv(t)
	rel = e.rel
	e = newEnv(t, sandboxwich.WithPools(pool.Config{Name: "p1", TenantID: "acme", Release: rel, Target: 1, Provider: prov}))
	e.plane.Pools().Pass(e.ctx)
	res, err := e.plane.Claim(e.ctx, "acme", sandboxwich.ClaimRequest{ClaimID: uuid.New(), Release: e.rel, Binding: binding})
	if err != nil || res.Lease == nil {
		t.Fatalf("claim: %+v %v", res, err)
	}
	proof := sandboxwich.NewProof(res.Attestation(), 2, binding)
	out, err := e.plane.Exec(e.ctx, "acme", res.Lease.ID, proof, sandboxwich.ExecRequest{Argv: []string{"echo", "hi"}})
	if err != nil || string(out.Stdout) != "echo hi" {
		t.Fatalf("exec: %+v %v", out, err)
	}
	// Input no provider can run is refused before the provider sees it.
	for _, bad := range []sandboxwich.ExecRequest{{}, {Argv: []string{""}}, {Argv: []string{"echo", "a\x00b"}},
		{Argv: []string{"env"}, Env: map[string]string{"A=B": "c"}}, {Argv: []string{"env"}, Env: map[string]string{"A": "\x00"}}} {
		if _, err := e.plane.Exec(e.ctx, "acme", res.Lease.ID, proof, bad); !errors.Is(err, errcode.ErrInvalidRequest) {
			t.Fatalf("exec %q %q: %v", bad.Argv, bad.Env, err)
		}
	}
	// The provider re-admits the object under another class: the next exec
	// must not run, and the cell ends.
	prov.Drift(res.Lease.CellID, lease.KataMicroVM)
	_, err = e.plane.Exec(e.ctx, "acme", res.Lease.ID, proof, sandboxwich.ExecRequest{Argv: []string{"id"}})
	if !errors.Is(err, errcode.ErrRuntimeClassBoundaryUnverified) {
		t.Fatalf("exec after drift: %v", err)
	}
	if len(prov.ran) != 1 {
		t.Fatalf("commands run: %v", prov.ran)
	}
	st, _ := e.plane.LeaseStatus(e.ctx, "acme", res.Lease.ID)
	if st.State != lease.Quarantined {
		t.Fatalf("cell after unverified exec: %+v", st)
	}
	e.plane.Pools().Pass(e.ctx)
	st, _ = e.plane.LeaseStatus(e.ctx, "acme", res.Lease.ID)
	if !st.ProviderAbsent || st.State != lease.Quarantined {
		t.Fatalf("cell after stop: %+v", st)
	}
}

func TestExecOnWorkerCellAndDryRun(t *testing.T) {
	e := newEnv(t)
	e.prepare(t)
	res, _ := e.plane.Claim(e.ctx, "acme", sandboxwich.ClaimRequest{Release: e.rel, Binding: binding})
	proof := sandboxwich.NewProof(res.Attestation(), 2, binding)
	if _, err := e.plane.Exec(e.ctx, "acme", res.Lease.ID, proof, sandboxwich.ExecRequest{Argv: []string{"id"}}); !errors.Is(err, errcode.ErrNotFound) {
		t.Fatalf("exec on a worker's cell: %v", err)
	}
	e = newEnv(t, sandboxwich.WithPools(pool.Config{Name: "dry", TenantID: "acme", Release: e.rel, Target: 1, Provider: fake.New(fake.Config{})}))
	e.plane.Pools().Pass(e.ctx)
	res, _ = e.plane.Claim(e.ctx, "acme", sandboxwich.ClaimRequest{Release: e.rel, Binding: binding})
	proof = sandboxwich.NewProof(res.Attestation(), 2, binding)
	if _, err := e.plane.Exec(e.ctx, "acme", res.Lease.ID, proof, sandboxwich.ExecRequest{Argv: []string{"id"}}); !errors.Is(err, errcode.ErrExecUnsupported) {
		t.Fatalf("exec on dry-run: %v", err)
	}
	st, _ := e.plane.LeaseStatus(e.ctx, "acme", res.Lease.ID)
	if st.ProviderMode != sandboxwich.ProviderDryRun {
		t.Fatalf("provider mode: %+v", st)
	}
}

func TestPoolReleaseMustBeSigned(t *testing.T) {
	e := newEnv(t)
	rel := e.rel
	rel.Signature = "swrs1_forged"
	_, err := sandboxwich.New(e.st, e.keys, sandboxwich.WithPools(pool.Config{Name: "p", TenantID: "acme", Release: rel, Target: 1, Provider: fake.New(fake.Config{})}))
	if err == nil || !strings.Contains(err.Error(), `pool "p"`) {
		t.Fatalf("unsigned pool release accepted: %v", err)
	}
}

// TestWaitProviderAbsent: the wait returns once the pool proved the
// released cell gone, and with the last status and the context's error
// when that never happens in time.
func TestWaitProviderAbsent(t *testing.T) {
	e := newEnv(t)
	e = newEnv(t, sandboxwich.WithPools(pool.Config{Name: "p1", TenantID: "acme", Release: e.rel, Target: 1,
		Provider: fake.New(fake.Config{Mode: driver.Apply})}))
	e.plane.Pools().Pass(e.ctx)
	res, err := e.plane.Claim(e.ctx, "acme", sandboxwich.ClaimRequest{ClaimID: uuid.New(), Release: e.rel, Binding: binding})
	if err != nil || res.Lease == nil {
		t.Fatalf("claim: %v %v", res, err)
	}
	if _, err := e.plane.Release(e.ctx, "acme", res.Lease.ID, res.Proof(), lease.Destroyed); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(e.ctx, 500*time.Millisecond) // no pass runs: it must time out
	defer cancel()
	st, err := e.plane.WaitProviderAbsent(short, "acme", res.Lease.ID, 5*time.Millisecond)
	if !errors.Is(err, context.DeadlineExceeded) || st.ProviderAbsent || st.LeaseID != res.Lease.ID {
		t.Fatalf("wait without a reconcile pass = %+v, %v; want the last status and the deadline", st, err)
	}
	go e.plane.Pools().Pass(e.ctx)
	st, err = e.plane.WaitProviderAbsent(e.ctx, "acme", res.Lease.ID, 5*time.Millisecond)
	if err != nil || !st.ProviderAbsent || st.State != lease.Destroyed {
		t.Fatalf("wait = %+v, %v; want destroyed and proven absent", st, err)
	}
	if _, err := e.plane.WaitProviderAbsent(e.ctx, "acme", uuid.New(), 0); !errors.Is(err, errcode.ErrNotFound) {
		t.Fatalf("wait for an unknown lease: %v", err)
	}
}

// TestPlaneServingSurface: what a handler needs from the plane alone:
// ping, cell counts, pool status (nil without pools) and the store of
// idempotency records.
func TestPlaneServingSurface(t *testing.T) {
	e := newEnv(t)
	if err := e.plane.Ping(e.ctx); err != nil {
		t.Fatalf("ping: %v", err)
	}
	if sts, err := e.plane.PoolStatus(e.ctx); sts != nil || err != nil {
		t.Fatalf("pool status without pools: %v, %v", sts, err)
	}
	e.prepare(t)
	if n, err := e.plane.CellCounts(e.ctx); err != nil || n[lease.Ready] != 1 {
		t.Fatalf("cell counts: %v, %v", n, err)
	}
	rec, err := e.plane.BeginIdempotent(e.ctx, sandboxwich.IdempotencyParams{TenantID: "acme", Key: "k",
		Fingerprint: "f", Now: e.now, InFlightUntil: e.now.Add(time.Minute)})
	if err != nil || !rec.Created {
		t.Fatalf("begin idempotent: %+v, %v", rec, err)
	}
	if srec, err := e.st.(store.IdempotencyStore).BeginIdempotent(e.ctx, store.IdempotencyParams{TenantID: "acme", Key: "k",
		Fingerprint: "f", Now: e.now, InFlightUntil: e.now.Add(time.Minute)}); err != nil || srec.Created {
		t.Fatalf("the record is not in the plane's store: %+v, %v", srec, err)
	}

	e = newEnv(t, sandboxwich.WithPools(pool.Config{Name: "dry", TenantID: "acme", Release: e.rel, Target: 2,
		Provider: fake.New(fake.Config{})}))
	e.plane.Pools().Pass(e.ctx)
	sts, err := e.plane.PoolStatus(e.ctx)
	if err != nil || len(sts) != 1 || sts[0].Name != "dry" || sts[0].Members[lease.MemberReady] != 2 ||
		sts[0].ProviderMode != sandboxwich.ProviderDryRun || !sts[0].LastReconcile.Equal(e.now) {
		t.Fatalf("pool status: %+v, %v", sts, err)
	}
}

// TestStoreWithoutAbilities: a Store that has neither optional ability
// (store.IdempotencyStore, store.Webhooks) still makes a plane; an
// Idempotency-Key is then refused with its code and webhook deliveries
// are not found, instead of a panic or an empty answer.
func TestStoreWithoutAbilities(t *testing.T) {
	st, keys := testenv.SQLite(t), testenv.Keyring(t)
	bare := struct{ store.Store }{st} // hides every method outside store.Store
	p, err := sandboxwich.New(bare, keys, sandboxwich.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	_, err = p.BeginIdempotent(ctx, sandboxwich.IdempotencyParams{TenantID: "acme", Key: "k", Fingerprint: "f",
		Now: testenv.Start, InFlightUntil: testenv.Start.Add(time.Minute)})
	if !errors.Is(err, errcode.ErrInvalidIdempotencyKey) || !errors.Is(err, sandboxwich.ErrNoIdempotency) {
		t.Errorf("BeginIdempotent over a store without the ability: %v", err)
	}
	if _, err := p.Deliveries(ctx, sandboxwich.DeliveryQuery{TenantID: "acme"}); !errors.Is(err, sandboxwich.ErrNoDeliveries) {
		t.Errorf("Deliveries over a store without the ability: %v", err)
	}
	if _, err := st.BeginIdempotent(ctx, store.IdempotencyParams{TenantID: "acme", Key: "k", Fingerprint: "f",
		Now: testenv.Start, InFlightUntil: testenv.Start.Add(time.Minute)}); err != nil {
		t.Errorf("the shipped store has the ability: %v", err)
	}
}
