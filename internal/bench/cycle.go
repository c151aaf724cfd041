package bench

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/gvisor"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
)

// CycleReport is R10: how many sterile cells a gVisor pool turns over
// per minute under continuous churn, against runsc's own loop at the same
// parallelism on the same root filesystem.
type CycleReport struct {
	// Parallelism is the pool's target and max_provisioning, the number
	// of tenants claiming, and the number of bare loops.
	Parallelism int `json:"parallelism"`
	// CellsPerMin counts whole sterile cycles — claim, `true` through the
	// agent, release, proven deletion — while the pool provisions and
	// admits each replacement (read back, its runtime checked from inside,
	// its agent's evidence read).
	CellsPerMin float64 `json:"cells_per_minute"`
	// BarePerMin counts `runsc create`, `start`, `exec true`, `kill` and
	// `delete` loops of a container of the cells' spec.
	BarePerMin float64 `json:"bare_runsc_loops_per_minute"`
	// Ratio is CellsPerMin ÷ BarePerMin (target ≥ 0.8).
	Ratio float64 `json:"ratio"`
}

// benchCycle measures R10. Each side runs for a window after a warm-up of
// Parallelism completions (the pool starts full; a loop's first round
// starts cold), counting completions in the window.
func benchCycle(ctx context.Context, dir string, quick bool) (*CycleReport, error) {
	par, window := 4, 30*time.Second
	if quick {
		par, window = 2, 8*time.Second
	}
	stateDir := filepath.Join(dir, "runsc-cycle-"+uuid.NewString()[:8])
	defer func() { _ = gvisor.RemoveStateDir(stateDir) }()
	bundles := filepath.Join(dir, "bundles-cycle")
	prov, err := gvisor.New(gvisor.Config{StateDir: stateDir, BundleDir: bundles, Pool: "cycle",
		Installation: driver.InstallationTag(stateDir), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	plane, st, rel, stop, err := runPool(ctx, dir, pool.Config{Name: "cycle", Target: par, MaxProvisioning: par, Provider: prov})
	if err != nil {
		return nil, err
	}
	defer stop()
	waitReady(ctx, plane, par)

	// A ready cell's bundle is the spec the bare loops copy.
	ready, err := st.Members(ctx, "cycle", lease.MemberReady)
	if err != nil || len(ready) == 0 {
		return nil, fmt.Errorf("no ready cell: %v", err)
	}
	id, _, _ := strings.Cut(ready[0].Identity, "@")
	b, err := newBare(stateDir, filepath.Join(bundles, id), "", filepath.Join(dir, "bare-cycle"), []string{"sleep", "100000"})
	if err != nil {
		return nil, err
	}
	defer b.close()

	cell := func(ctx context.Context) error {
		res, err := plane.Claim(ctx, benchTenant, sandboxwich.ClaimRequest{ClaimID: uuid.Must(uuid.NewV7()), Release: rel, Binding: benchBinding})
		if err != nil {
			return err
		}
		if res.Lease == nil {
			return errEmpty
		}
		proof := res.Proof()
		out, err := plane.Exec(ctx, benchTenant, res.Lease.ID, proof, sandboxwich.ExecRequest{Argv: []string{"true"}})
		if err == nil && out.ExitCode != 0 {
			err = fmt.Errorf("true exited %d", out.ExitCode)
		}
		// Released even when the window closed meanwhile, so no lease
		// outlives the run.
		if _, rerr := plane.Release(context.WithoutCancel(ctx), benchTenant, res.Lease.ID, proof, lease.Destroyed); err == nil {
			err = rerr
		}
		if err != nil {
			return err
		}
		st, err := plane.WaitProviderAbsent(ctx, benchTenant, res.Lease.ID, 5*time.Millisecond)
		if err == nil && !st.ProviderAbsent {
			err = fmt.Errorf("lease %s ended without proven deletion", res.Lease.ID)
		}
		return err
	}
	loop := func(ctx context.Context) error {
		id := "bare-" + uuid.NewString()[:8]
		err := b.start(ctx, id)
		if err == nil {
			err = b.runsc(ctx, "exec", id, "true")
		}
		// Killed and deleted even when the window closed meanwhile, so no
		// container outlives the run.
		cleanup := context.WithoutCancel(ctx)
		if kerr := b.runsc(cleanup, "kill", id, "KILL"); err == nil && ctx.Err() == nil {
			err = kerr
		}
		if derr := b.runsc(cleanup, "delete", "--force", id); err == nil {
			err = derr
		}
		return err
	}
	rep := &CycleReport{Parallelism: par}
	if rep.CellsPerMin, err = perMinute(ctx, par, window, cell); err != nil {
		return nil, fmt.Errorf("sterile cycle: %w", err)
	}
	if rep.BarePerMin, err = perMinute(ctx, par, window, loop); err != nil {
		return nil, fmt.Errorf("bare runsc loop: %w", err)
	}
	rep.Ratio = ratio(rep.CellsPerMin, rep.BarePerMin)
	return rep, nil
}

// errEmpty is an empty claim: the pool had no ready cell yet.
var errEmpty = fmt.Errorf("empty claim")

// perMinute runs par workers calling fn until par completions and then a
// window more have passed, and returns the completions per minute of the
// window. An empty claim is retried after 2 ms; any other error ends it.
func perMinute(ctx context.Context, par int, window time.Duration, fn func(context.Context) error) (float64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu    sync.Mutex
		done  []time.Time
		first error
		wg    sync.WaitGroup
	)
	end := time.Time{}
	for range par {
		wg.Go(func() {
			for ctx.Err() == nil {
				err := fn(ctx)
				if err == errEmpty {
					time.Sleep(2 * time.Millisecond)
					continue
				}
				mu.Lock()
				if err != nil && ctx.Err() == nil && first == nil {
					first = err
					cancel()
				}
				if err == nil {
					done = append(done, time.Now())
					if len(done) == par {
						end = time.Now().Add(window)
					}
					if !end.IsZero() && time.Now().After(end) {
						cancel()
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if first != nil {
		return 0, first
	}
	if len(done) <= par {
		return 0, fmt.Errorf("%d completions, none after the warm-up", len(done))
	}
	slices.SortFunc(done, func(a, b time.Time) int { return a.Compare(b) })
	from, last := done[par-1], done[len(done)-1]
	return float64(len(done)-par) / last.Sub(from).Minutes(), nil
}
