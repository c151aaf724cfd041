// Package planetest gives a test a working [sandboxwich.Plane] in one call:
// an embedded SQLite store in a temporary directory of its own, a signing
// keyring, a release it signed, and a pool of ready cells on the in-memory
// fake provider ([fake.NewWithAgent]), whose cells run a simulated cell
// agent so that exec, files and launch work. The plane runs (its pools are
// refilled and its expired leases swept) until the test ends.
//
// It is for harness authors who want to test their code against the real
// plane without a server, a container runtime or a network ([Start] and
// Close do the same outside a test):
//
//	env := planetest.New(t, planetest.Options{Cells: 2})
//	res, err := env.Plane.Claim(ctx, env.Tenant, sandboxwich.ClaimRequest{
//		ClaimID: uuid.New(), Release: env.Release, Binding: env.Binding})
//
// Each Env signs with a new random key. The fake's cells isolate nothing:
// never use it outside tests.
package planetest

import (
	"context"
	"crypto/rand"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
	"github.com/sandboxwich/sandboxwich/store/sqlite"
)

// Options configures New. The zero value is one ready gVisor-class cell
// for the tenant "acme".
type Options struct {
	// Cells is the pool's target: how many ready cells it keeps (at least
	// one; 0 means 1). Each claim takes one; the running plane replaces it.
	Cells int
	// Tenant is the tenant the pool serves; "" means "acme".
	Tenant string
	// RuntimeClass is the signed release's runtime class; "" means
	// lease.GVisorLowerRisk.
	RuntimeClass lease.RuntimeClass
	// PlaneOptions are passed to sandboxwich.New after the kit's own (a
	// logger that discards, the pool), so they can override them.
	PlaneOptions []sandboxwich.Option
}

// Env is a running plane and what a test needs to claim from it.
type Env struct {
	// Plane is the running plane.
	Plane *sandboxwich.Plane
	// Keyring signed Release and signs the plane's attestations.
	Keyring *attest.Keyring
	// Release is the signed release the pool's cells are prepared for: a
	// claim must name it.
	Release lease.Release
	// Tenant is the tenant the pool serves.
	Tenant string
	// Binding is a valid binding to claim under.
	Binding lease.Binding
	// Provider is the pool's fake provider, for fault injection
	// (SetFaults, Drift, Vanish) and inspection (Received, Calls).
	Provider *fake.AgentProvider

	store *sqlite.Store
	dir   string
	stop  func()
}

// New is Start for a test: it fails the test if the plane cannot start,
// and closes the Env when the test ends.
func New(t testing.TB, opts Options) *Env {
	t.Helper()
	e, err := Start(context.Background(), opts)
	if err != nil {
		t.Fatalf("planetest: %v", err)
	}
	t.Cleanup(e.Close)
	return e
}

// Start returns a running plane over a new SQLite file in a temporary
// directory, whose pool holds opts.Cells ready cells when Start returns.
// Close stops it and removes the directory.
func Start(ctx context.Context, opts Options) (*Env, error) {
	if opts.Cells <= 0 {
		opts.Cells = 1
	}
	if opts.Tenant == "" {
		opts.Tenant = "acme"
	}
	if opts.RuntimeClass == "" {
		opts.RuntimeClass = lease.GVisorLowerRisk
	}
	keys, err := attest.NewKeyring([]byte(rand.Text() + rand.Text()))
	if err != nil {
		return nil, err
	}
	rel := lease.Release{ReleaseSetID: "planetest", RuntimeClass: opts.RuntimeClass, PolicyDigest: strings.Repeat("a", 64)}
	rel.Signature = keys.SignRelease(rel)
	dir, err := os.MkdirTemp("", "planetest-")
	if err != nil {
		return nil, err
	}
	e := &Env{
		Keyring:  keys,
		Release:  rel,
		Tenant:   opts.Tenant,
		Binding:  lease.Binding{OrganizationID: "org-1", WorkspaceID: "ws-1", ThreadID: "th-1", RunnerSessionID: "s-1"},
		Provider: fake.NewWithAgent(fake.Config{Mode: driver.Apply, Kind: "fake"}),
		dir:      dir,
		stop:     func() {},
	}
	if e.store, err = sqlite.Open(ctx, filepath.Join(dir, "sandboxwich.db"), sqlite.Options{}); err != nil {
		e.Close()
		return nil, err
	}
	planeOpts := append([]sandboxwich.Option{
		sandboxwich.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))),
		sandboxwich.WithPools(pool.Config{Name: "planetest", TenantID: e.Tenant, Release: e.Release,
			Target: opts.Cells, Provider: e.Provider}),
	}, opts.PlaneOptions...)
	if e.Plane, err = sandboxwich.New(e.store, keys, planeOpts...); err != nil {
		e.Close()
		return nil, err
	}
	// One pass fills the pool before Start returns; Run keeps it filled.
	e.Plane.Pools().Pass(ctx)
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() { defer close(done); _ = e.Plane.Run(runCtx) }()
	e.stop = func() { cancel(); <-done }
	return e, nil
}

// Close stops the plane, closes its store and removes its directory.
func (e *Env) Close() {
	e.stop()
	if e.store != nil {
		_ = e.store.Close()
	}
	_ = os.RemoveAll(e.dir)
}
