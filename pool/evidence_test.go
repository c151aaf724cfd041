package pool_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/internal/testenv"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
	"github.com/sandboxwich/sandboxwich/store/sqlite"
)

// agentProvider is a fake provider whose objects report a cell agent.
type agentProvider struct {
	*fake.Provider
	digest string
}

func (p agentProvider) Inspect(ctx context.Context, obj driver.Object) (driver.Observation, error) {
	o, err := p.Provider.Inspect(ctx, obj)
	if o.Exists {
		o.AgentDigest = p.digest
	}
	return o, err
}

// newAgentFixture is newFixture with a provider whose objects report an
// agent of the given digest (newFixture keeps a plain fake).
func newAgentFixture(t *testing.T, cfg pool.Config, digest string) *fixture {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "pool.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	keys := testenv.Keyring(t)
	rel := testenv.Release(keys, lease.GVisorLowerRisk)
	prov := fake.New(fake.Config{Mode: driver.Apply, Kind: "fake"})
	cfg.Name, cfg.TenantID, cfg.Release, cfg.Provider = "p1", "acme", rel, agentProvider{Provider: prov, digest: digest}
	c := testenv.NewClock()
	plane, err := sandboxwich.New(st, keys, sandboxwich.WithClock(c.Now), sandboxwich.WithLogger(slog.New(slog.DiscardHandler)),
		sandboxwich.WithPools(cfg), sandboxwich.WithPoolOptions(pool.WithVerifyInterval(time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, ctx: t.Context(), clock: c, prov: prov, st: st, plane: plane, rel: rel, pools: plane.Pools()}
}

// TestEvidenceRecordedAtAdmissionAndVerification: the pool records what it
// read back when it admits a member, and again at each periodic
// verification of a ready member; the lease's evidence shows both times.
func TestEvidenceRecordedAtAdmissionAndVerification(t *testing.T) {
	const digest = "sha256:00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
	f := newAgentFixture(t, pool.Config{Target: 2}, digest)
	admitted := f.clock.Now()
	f.pools.Pass(f.ctx) // admits both; verifications start at the next pass
	f.wantCounts(map[lease.MemberState]int{lease.MemberReady: 2})

	first := f.claim()
	ev, err := f.plane.Evidence(f.ctx, "acme", first.Lease.ID)
	if err != nil {
		t.Fatal(err)
	}
	if ev.CellID != first.Lease.CellID || ev.Pool != "p1" || ev.Provider != "fake" || ev.ProviderMode != sandboxwich.ProviderApply ||
		ev.RuntimeClass != f.rel.RuntimeClass || ev.AgentDigest != digest || ev.ImageDigest != "" ||
		!ev.AdmittedAt.Equal(admitted) || !ev.LastVerifiedAt.Equal(admitted) {
		t.Fatalf("evidence after admission = %+v, want admitted and verified at %s", ev, admitted)
	}

	f.clock.Advance(5 * time.Second) // past VerifyInterval
	verified := f.clock.Now()
	f.pools.Pass(f.ctx)
	second := f.claim()
	ev, err = f.plane.Evidence(f.ctx, "acme", second.Lease.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !ev.AdmittedAt.Equal(admitted) || !ev.LastVerifiedAt.Equal(verified) || ev.AgentDigest != digest {
		t.Fatalf("evidence after a verification = %+v, want admitted at %s, verified at %s", ev, admitted, verified)
	}
	// The leased member is not verified again: its evidence stays.
	f.clock.Advance(5 * time.Second)
	f.pools.Pass(f.ctx)
	if again, _ := f.plane.Evidence(f.ctx, "acme", second.Lease.ID); again != ev {
		t.Fatalf("evidence of a leased member changed: %+v, was %+v", again, ev)
	}
}
