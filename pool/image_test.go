package pool_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/internal/testenv"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
)

const (
	pinnedDigest = "sha256:" + "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a"
	otherDigest  = "sha256:" + "a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5"
	pinnedImage  = "registry.example/evals/cell@" + pinnedDigest
)

// imageProvider is a fake agent provider whose read-back reports an
// admitted image digest the test sets, and whose Prepare fails while the
// test says so: the faults a real registry and runtime are made to produce
// in the gvisor driver's tests.
type imageProvider struct {
	*fake.AgentProvider
	mu         sync.Mutex
	digest     string
	prepareErr error
	prepares   int
}

func newImageProvider(digest string) *imageProvider {
	return &imageProvider{AgentProvider: fake.NewWithAgent(fake.Config{Mode: driver.Apply, Kind: "fake"}), digest: digest}
}

func (p *imageProvider) set(digest string, prepareErr error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.digest, p.prepareErr = digest, prepareErr
}

func (p *imageProvider) Inspect(ctx context.Context, obj driver.Object) (driver.Observation, error) {
	o, err := p.AgentProvider.Inspect(ctx, obj)
	p.mu.Lock()
	defer p.mu.Unlock()
	if o.Exists {
		o.ImageDigest = p.digest
	}
	return o, err
}

func (p *imageProvider) Prepare(context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.prepares++
	return p.prepareErr
}

// TestImageDigestVerifiedAtAdmission: a cell whose provider reports
// another image than the pool pins (or none) is never admitted: the
// member is quarantined with image_digest_unverified and its object
// proven deleted.
func TestImageDigestVerifiedAtAdmission(t *testing.T) {
	for _, reported := range []string{otherDigest, ""} {
		prov := newImageProvider(reported)
		f := newFixture(t, pool.Config{Target: 1, Provider: prov, Image: pinnedImage})
		f.pools.Pass(f.ctx)
		ms := f.members()
		if len(ms) != 1 || ms[0].State != lease.MemberQuarantined || !ms[0].ProviderAbsent {
			t.Fatalf("reported %q: members after admission: %+v", reported, ms)
		}
		f.wantStopReason(ms[0].CellID, "provision failed: image_digest_unverified: ")
		if res := f.claim(); res.Lease != nil {
			t.Fatalf("claimed a cell of an unverified image")
		}
		if f.prov.Len() != 0 {
			t.Fatalf("%d provider objects left", f.prov.Len())
		}
	}
}

// TestImageDigestVerifiedBeforeLeaseOperations: the admitted digest is
// recorded as evidence; a ready cell whose digest changes is stopped at
// its next verification, and a leased one at its next exec, which answers
// image_digest_unverified, quarantines the cell and proves it deleted.
func TestImageDigestVerifiedBeforeLeaseOperations(t *testing.T) {
	prov := newImageProvider(pinnedDigest)
	f := newFixture(t, pool.Config{Target: 2, Provider: prov, Image: pinnedImage})
	f.pools.Pass(f.ctx)
	f.wantCounts(map[lease.MemberState]int{lease.MemberReady: 2})
	res := f.claim()
	ev, err := f.plane.Evidence(f.ctx, "acme", res.Lease.ID)
	if err != nil || ev.ImageDigest != pinnedDigest {
		t.Fatalf("evidence = %+v, %v; want image digest %s", ev, err, pinnedDigest)
	}
	if _, err := f.plane.Exec(f.ctx, "acme", res.Lease.ID, proof(res), sandboxwich.ExecRequest{Argv: []string{"true"}}); err != nil {
		t.Fatalf("exec in a verified cell: %v", err)
	}

	prov.set(otherDigest, nil)
	_, err = f.plane.Exec(f.ctx, "acme", res.Lease.ID, proof(res), sandboxwich.ExecRequest{Argv: []string{"true"}})
	if !errors.Is(err, errcode.ErrImageDigestUnverified) {
		t.Fatalf("exec after the admitted image changed: %v, want image_digest_unverified", err)
	}
	f.clock.Advance(2 * time.Second)
	f.settle()
	m, err := f.st.Member(f.ctx, res.Lease.CellID)
	if err != nil || m.State != lease.MemberQuarantined || !m.ProviderAbsent {
		t.Fatalf("the leased member after the mismatch: %+v, %v", m, err)
	}
	// The ready cell was stopped at its next verification, and no cell
	// of the other image was admitted since.
	if c := f.counts(); c[lease.MemberReady] != 0 || c[lease.MemberQuarantined] < 2 {
		t.Fatalf("members after the image changed: %v, want none ready", c)
	}
}

// TestPrepareFailureCreatesNoMember: while a provider cannot prepare (its
// image cannot be pulled) the pool creates no member and reports the
// error; once it can, the pool fills.
func TestPrepareFailureCreatesNoMember(t *testing.T) {
	prov := newImageProvider(pinnedDigest)
	prov.set(pinnedDigest, errors.New("image registry.example/evals/cell: MANIFEST_UNKNOWN"))
	f := newFixture(t, pool.Config{Target: 2, Provider: prov, Image: pinnedImage})
	f.pools.Pass(f.ctx)
	f.wantCounts(map[lease.MemberState]int{})
	if e := f.lastError(); !strings.Contains(e, "MANIFEST_UNKNOWN") {
		t.Fatalf("last_error = %q, want the pull's error", e)
	}
	if sts, _ := f.pools.Status(f.ctx); sts[0].PrepareError == "" {
		t.Fatalf("status while Prepare fails: %+v", sts[0])
	}
	prov.set(pinnedDigest, nil)
	f.pools.Pass(f.ctx)
	f.wantCounts(map[lease.MemberState]int{lease.MemberReady: 2})
	if e := f.lastError(); e != "" {
		t.Fatalf("last_error = %q after a good pass", e)
	}
	if sts, _ := f.pools.Status(f.ctx); sts[0].PrepareError != "" {
		t.Fatalf("status once prepared: %+v", sts[0])
	}
}

func TestImageMustBePinned(t *testing.T) {
	st := testenv.SQLite(t)
	keys := testenv.Keyring(t)
	cfg := pool.Config{Name: "p1", TenantID: "acme", Release: testenv.Release(keys, lease.GVisorLowerRisk), Target: 1,
		Provider: newImageProvider(""), Image: "registry.example/evals/cell:latest"}
	if _, err := pool.New(st, []pool.Config{cfg}); err == nil || !strings.Contains(err.Error(), `pool "p1": image`) {
		t.Fatalf("pool.New with a tag-only image: %v", err)
	}
}
