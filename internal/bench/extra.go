package bench

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/driver/gvisor"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
	"github.com/sandboxwich/sandboxwich/store/sqlite"
)

// AttestReport is the cost of the attestation path, in microseconds.
type AttestReport struct {
	SignUS   float64 `json:"sign_us"`
	VerifyUS float64 `json:"verify_release_us"`
	RoundUS  float64 `json:"sign_digest_verify_us"`
}

func benchAttest(n int) AttestReport {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	k, _ := attest.NewKeyring(key)
	digest := strings.Repeat("a", 64)
	rel := lease.Release{ReleaseSetID: "bench", RuntimeClass: lease.GVisorLowerRisk, PolicyDigest: digest}
	sig := k.SignRelease(rel)
	rel.Signature = sig
	c := attest.LeaseClaims{LeaseID: uuid.NewString(), CellID: uuid.NewString(), Generation: 2, ReleaseSetID: "bench",
		RuntimeClass: "gvisor_lower_risk", PolicyDigest: digest, OrganizationID: "o", WorkspaceID: "w", ThreadID: "t",
		RunnerSessionID: "s", ExpiresAt: time.Now(), ReleaseSignature: sig}
	per := func(fn func()) float64 {
		t0 := time.Now()
		for range n {
			fn()
		}
		return float64(time.Since(t0).Nanoseconds()) / float64(n) / 1000
	}
	return AttestReport{
		SignUS:   per(func() { k.LeaseToken(c) }),
		VerifyUS: per(func() { k.VerifyRelease(rel) }),
		RoundUS: per(func() {
			attest.EqualDigest(attest.Digest(k.LeaseToken(c)), "x")
			k.VerifyRelease(rel)
		}),
	}
}

// RefillReport is a pool refilling from empty against the ideal
// ⌈N/P⌉·L of a provider with latency L and P concurrent provisions.
type RefillReport struct {
	Cells           int           `json:"cells"`
	MaxProvisioning int           `json:"max_provisioning"`
	Latency         time.Duration `json:"latency_ns"`
	Took            time.Duration `json:"took_ns"`
	Ideal           time.Duration `json:"ideal_ns"`
	Overhead        float64       `json:"overhead"`
}

// poolPlane returns a plane over a fresh SQLite file in dir with the one
// pool cfg, for the bench tenant and a release signed with a fresh key.
func poolPlane(ctx context.Context, dir string, cfg pool.Config, opts ...sandboxwich.Option) (*sandboxwich.Plane, *sqlite.Store, lease.Release, error) {
	st, err := sqlite.Open(ctx, filepath.Join(dir, cfg.Name+"-"+uuid.NewString()+".db"), sqlite.Options{})
	if err != nil {
		return nil, nil, lease.Release{}, err
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	keys, _ := attest.NewKeyring(key)
	rel := lease.Release{ReleaseSetID: "bench", RuntimeClass: lease.GVisorLowerRisk, PolicyDigest: strings.Repeat("c", 64)}
	rel.Signature = keys.SignRelease(rel)
	cfg.TenantID, cfg.Release = benchTenant, rel
	plane, err := sandboxwich.New(st, keys, append([]sandboxwich.Option{sandboxwich.WithLogger(slog.New(slog.DiscardHandler)),
		sandboxwich.WithSweepInterval(0), sandboxwich.WithPools(cfg)}, opts...)...)
	if err != nil {
		st.Close()
		return nil, nil, lease.Release{}, err
	}
	return plane, st, rel, nil
}

// runPool runs a plane of the one pool cfg (poolPlane), reconciling every
// 20 ms; stop drains the pool (target 0, every member ended), stops the
// plane and closes its store.
func runPool(ctx context.Context, dir string, cfg pool.Config) (*sandboxwich.Plane, *sqlite.Store, lease.Release, func(), error) {
	plane, st, rel, err := poolPlane(ctx, dir, cfg, sandboxwich.WithPoolOptions(pool.WithInterval(20*time.Millisecond)))
	if err != nil {
		return nil, nil, rel, nil, err
	}
	stopRun := run(ctx, plane)
	return plane, st, rel, func() {
		_ = plane.Pools().SetTarget(cfg.Name, 0)
		waitLive(ctx, plane, 0)
		stopRun()
		st.Close()
	}, nil
}

// run runs plane's pools until the returned stop is called.
func run(ctx context.Context, plane *sandboxwich.Plane) (stop func()) {
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- plane.Run(runCtx) }()
	return func() { cancel(); <-done }
}

func benchRefill(ctx context.Context, dir string, quick bool) (*RefillReport, error) {
	r := &RefillReport{Cells: 16, MaxProvisioning: 4, Latency: 500 * time.Millisecond}
	if quick {
		r.Latency = 250 * time.Millisecond
	}
	plane, st, _, err := poolPlane(ctx, dir, pool.Config{Name: "refill", Target: r.Cells, MaxProvisioning: r.MaxProvisioning,
		Provider: fake.New(fake.Config{Mode: driver.Apply, Latency: r.Latency})})
	if err != nil {
		return nil, err
	}
	defer st.Close()
	start := time.Now()
	defer run(ctx, plane)()
	for {
		sts, err := plane.Pools().Status(ctx)
		if err != nil {
			return nil, err
		}
		if sts[0].Members[lease.MemberReady] >= r.Cells {
			break
		}
		if time.Since(start) > 20*r.Latency*time.Duration(r.Cells) {
			return nil, fmt.Errorf("refill: pool did not fill")
		}
		time.Sleep(time.Millisecond)
	}
	r.Took = time.Since(start)
	r.Ideal = time.Duration((r.Cells+r.MaxProvisioning-1)/r.MaxProvisioning) * r.Latency
	r.Overhead = ratio(float64(r.Took), float64(r.Ideal))
	return r, nil
}

// GVisorReport compares a warm claim's first command output with what
// runsc itself needs.
type GVisorReport struct {
	// Warm is a claim of a ready cell and the first output of a streamed
	// exec through the plane and the cell's agent, from before the claim.
	Warm Stats `json:"warm_claim_first_output"`
	// Bare is a runsc exec of the same command into a running cell.
	Bare Stats `json:"bare_runsc_exec"`
	Cold Stats `json:"cold_create_start_exec"`
	// Ratio is R7: Warm over Bare at p50.
	Ratio float64 `json:"ratio"`
	// Files is R8: a 64 MiB upload into a cell against the same upload
	// into a host tmpfs file.
	Files *FileReport `json:"files,omitempty"`
}

func benchGVisor(ctx context.Context, dir string, quick bool) (*GVisorReport, error) {
	n := 30
	if quick {
		n = 10
	}
	stateDir := filepath.Join(dir, "runsc-"+uuid.NewString()[:8])
	// The state root is this run's alone, so any installation tag scopes
	// it; the store is made after the provider.
	// The file bench replaces a 64 MiB file in /tmp, which holds the old
	// and the new file at once: these cells get 1 GiB of disk (/tmp a
	// quarter of it) instead of the default half of 512 MiB.
	prov, err := gvisor.New(gvisor.Config{StateDir: stateDir, BundleDir: filepath.Join(dir, "bundles"), Pool: "bench",
		MemoryLimitBytes: 2 << 30, CellDiskBytes: 1 << 30,
		Installation: driver.InstallationTag(stateDir), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	plane, st, rel, stop, err := runPool(ctx, dir, pool.Config{Name: "bench", Target: 2, Provider: prov})
	if err != nil {
		return nil, err
	}
	defer func() {
		stop()
		_ = gvisor.RemoveStateDir(stateDir)
	}()

	// Warm and bare take turns, each pair starting with both pool cells
	// ready (no refill running): a bare runsc exec into the newer cell,
	// then a claim of the older one and the same command through the plane.
	rep := &GVisorReport{}
	argv := []string{"echo", "first-output"}
	var warm, bare []time.Duration
	for range n {
		waitReady(ctx, plane, 2)
		ready, err := st.Members(ctx, "bench", lease.MemberReady)
		if err != nil || len(ready) < 2 {
			return nil, fmt.Errorf("no ready gvisor cell: %v", err)
		}
		id, _, _ := strings.Cut(ready[len(ready)-1].Identity, "@") // the driver's container ID
		t0 := time.Now()
		out, err := exec.CommandContext(ctx, "runsc", "--root", stateDir, "--network=none", "--host-uds=create", "exec", id, argv[0], argv[1]).Output()
		if err != nil || !strings.Contains(string(out), "first-output") {
			return nil, fmt.Errorf("bare runsc exec: %v", err)
		}
		bare = append(bare, time.Since(t0))

		t0 = time.Now()
		res, err := plane.Claim(ctx, benchTenant, sandboxwich.ClaimRequest{ClaimID: uuid.Must(uuid.NewV7()), Release: rel, Binding: benchBinding})
		if err != nil || res.Lease == nil {
			return nil, fmt.Errorf("gvisor claim: %v", err)
		}
		proof := res.Proof()
		var first time.Duration
		_, err = plane.ExecStream(ctx, benchTenant, res.Lease.ID, proof, sandboxwich.ExecRequest{Argv: argv}, func(o sandboxwich.Output) error {
			if first == 0 && len(o.Data) > 0 {
				first = time.Since(t0)
			}
			return nil
		})
		if err != nil || first == 0 {
			return nil, fmt.Errorf("gvisor exec: %v (first output after %v)", err, first)
		}
		warm = append(warm, first)
		_, _ = plane.Release(ctx, benchTenant, res.Lease.ID, proof, lease.Destroyed)
	}
	rep.Warm, rep.Bare = summarize(warm, 0, 0), summarize(bare, 0, 0)
	waitReady(ctx, plane, 1)
	if rep.Files, err = benchFiles(ctx, plane, rel, quick); err != nil {
		return nil, err
	}

	// Cold: a new container created, started and asked for output.
	var cold []time.Duration
	for range max(n/3, 2) {
		obj := driver.Object{CellID: uuid.Must(uuid.NewV7())}
		t0 := time.Now()
		o, err := prov.Provision(ctx, driver.ProvisionRequest{CellID: obj.CellID, RuntimeClass: lease.GVisorLowerRisk})
		if err == nil {
			err = agentEcho(ctx, prov, o, argv)
		}
		cold = append(cold, time.Since(t0))
		_ = prov.Destroy(ctx, obj)
		if err != nil {
			return nil, fmt.Errorf("cold start: %w", err)
		}
	}
	rep.Cold = summarize(cold, 0, 0)
	rep.Ratio = ratio(rep.Warm.P50MS, rep.Bare.P50MS)
	return rep, nil
}

// agentEcho activates a fresh cell's agent and runs argv through it, as
// the plane's first command in a cell does.
func agentEcho(ctx context.Context, prov *gvisor.Provider, obj driver.Object, argv []string) error {
	conn, err := prov.Agent(ctx, obj)
	if err != nil {
		return err
	}
	f := agent.Fence{CellID: obj.CellID.String(), LeaseID: uuid.NewString(), Generation: 1}
	if err := conn.Activate(ctx, agent.Activation{Version: agent.ProtocolVersion, Fence: f,
		ExpiresAt: time.Now().Add(time.Minute), TTLMillis: time.Minute.Milliseconds()}); err != nil {
		return err
	}
	res, err := conn.Exec(ctx, agent.ExecRequest{Fence: f, Argv: argv, MaxOutput: 1024}, nil)
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("%q exited %d", argv, res.ExitCode)
	}
	return err
}

func waitReady(ctx context.Context, plane *sandboxwich.Plane, n int) {
	for ctx.Err() == nil {
		sts, err := plane.Pools().Status(ctx)
		if err == nil && sts[0].Members[lease.MemberReady] >= n {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func waitLive(ctx context.Context, plane *sandboxwich.Plane, n int) {
	deadline := time.Now().Add(time.Minute)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		sts, err := plane.Pools().Status(ctx)
		live := 0
		for st, k := range sts[0].Members {
			if st.Live() {
				live += k
			}
		}
		if err == nil && live <= n {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
