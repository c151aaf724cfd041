package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/gvisor"
	"github.com/sandboxwich/sandboxwich/internal/testimage"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
	"github.com/sandboxwich/sandboxwich/store/sqlite"
)

// ColdClaimReport is R14 (CONTRACT §21): a claim with wait_seconds of a
// cached image of which no cell exists, through the first output of a
// command in the cell made for it, against runsc creating, starting and
// running the same command in a container of the same image and spec.
type ColdClaimReport struct {
	// Claim is, from before the claim, the claim (wait_seconds 60) of an
	// image on an image class with no live cell at all, the cell the
	// class makes for it (created, started, its agent answering, read
	// back and admitted), its lease, and the first streamed output of
	// `echo first-output` through the plane and the cell's agent.
	Claim Stats `json:"cold_claim_first_output"`
	// Bare is `runsc create` and `start` of a container of that cell's own
	// spec (the same cached image, runsc flags and mounts, `sleep` as its
	// process, the agent's mounts removed) and `runsc exec` of the same
	// echo, through its output.
	Bare Stats `json:"bare_create_start_exec"`
	// Ratio is R14: Claim over Bare at p50 (target ≤ 1.3).
	Ratio float64 `json:"ratio"`
	// ImageBytes is what one image takes in the image cache, CacheBudget
	// the cache's budget (image_cache_bytes): room for two and a half.
	// Each round's image is prefetched before the round, evicting the
	// image before last; PeakCacheBytes and PeakLive are the most any of
	// Samples readings found (every 20 ms and once at the end), and a
	// reading past the budget or max_cells fails the run.
	ImageBytes     int64  `json:"image_bytes"`
	CacheBudget    int64  `json:"cache_budget_bytes"`
	PeakCacheBytes int64  `json:"peak_cache_bytes"`
	Evictions      uint64 `json:"cache_evictions"`
	MaxCells       int    `json:"max_cells"`
	PeakLive       int    `json:"peak_live_cells"`
	Samples        int    `json:"samples"`
}

// benchColdClaim measures R14 when a static busybox is installed
// (scripts/install-busybox.sh); nil without one.
//
// Each round claims an image of its own, never claimed before, so no warm
// cell of it can exist; it is prefetched into the cache (untimed) after
// the pool settled, so the claim finds it cached. The image class has
// max_cells 1, so no second cell (a warm one of the image, which a pass
// would start while the claim still waits beside its admitted cell) runs
// beside the claim's, and warm_idle 1 ms, so an image stops being warm as
// soon as its claim is answered and no warm cell follows the release.
// Every round — a claim, then a bare run of the same image, after one
// warm-up pair — starts on a settled, empty pool (no live cell, no
// provision or destroy in flight). The bare container of a round is made
// from that round's cell's bundle.
func benchColdClaim(ctx context.Context, dir string, quick bool) (*ColdClaimReport, error) {
	if _, err := os.Stat(busybox); err != nil {
		return nil, nil
	}
	n := 10
	if quick {
		n = 4
	}
	reg, err := testimage.Serve()
	if err != nil {
		return nil, err
	}
	defer reg.Close()
	refs, err := markedImages(reg, "bench/cold", n+1)
	if err != nil {
		return nil, err
	}
	rep := &ColdClaimReport{MaxCells: 1}
	probe := filepath.Join(dir, "images-cold-probe")
	if rep.ImageBytes, err = prefetchInto(ctx, dir, probe, refs[0]); err != nil {
		return nil, err
	}
	_ = os.RemoveAll(probe)
	rep.CacheBudget = 2*rep.ImageBytes + rep.ImageBytes/2

	stateDir := filepath.Join(dir, "runsc-cold-"+uuid.NewString()[:8])
	defer func() { _ = gvisor.RemoveStateDir(stateDir) }()
	bundles := filepath.Join(dir, "bundles-cold")
	prov, err := gvisor.New(gvisor.Config{StateDir: stateDir, BundleDir: bundles, Pool: "cold",
		ImageCacheDir: filepath.Join(dir, "images-cold"), ImageCacheBytes: rep.CacheBudget,
		Installation: driver.InstallationTag(stateDir), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	plane, st, rel, stop, err := runPool(ctx, dir, pool.Config{Name: "cold", Target: rep.MaxCells, MaxProvisioning: 1,
		Images: []string{reg.Host + "/bench/cold/*"}, WarmPerImage: 1, WarmIdle: time.Millisecond, Provider: prov})
	if err != nil {
		return nil, err
	}
	defer stop()
	bd := &bounds{plane: plane, maxCells: rep.MaxCells, budget: rep.CacheBudget, cacheBytes: func(ctx context.Context) (int64, error) {
		n, _, err := prov.CacheStats(ctx)
		return n, err
	}}
	done := bd.watch(ctx, 20*time.Millisecond)
	rep.Claim, rep.Bare, err = coldTurns(ctx, plane, st, rel, prov, refs, stateDir, bundles, filepath.Join(dir, "bare-cold"), n)
	if berr := done(); err == nil {
		err = berr
	}
	if err != nil {
		return nil, err
	}
	rep.Ratio = ratio(rep.Claim.P50MS, rep.Bare.P50MS)
	rep.Samples, rep.PeakLive, rep.PeakCacheBytes = bd.samples, bd.peakLive, bd.peakBytes
	_, rep.Evictions, _ = prov.CacheStats(ctx)
	return rep, nil
}

// coldTurns runs R14's n+1 rounds, round i of refs[i]: a claim, then a
// bare run of the same image.
func coldTurns(ctx context.Context, plane *sandboxwich.Plane, st *sqlite.Store, rel lease.Release, prov *gvisor.Provider,
	refs []string, stateDir, bundles, bareBundles string, n int) (claims, bares Stats, err error) {
	argv := []string{"echo", "first-output"}
	var (
		round   int
		overlay string
		b       *bare // the current round's, made from its cell's bundle
	)
	defer func() {
		if b != nil {
			b.close()
		}
	}()
	claimRun := func() (time.Duration, error) {
		ref := refs[round]
		round++
		if err := settledEmpty(ctx, plane); err != nil {
			return 0, err
		}
		if err := prov.Prefetch(ctx, ref); err != nil {
			return 0, err
		}
		start, t0 := plane.Now(), time.Now()
		res, err := plane.Claim(ctx, benchTenant, sandboxwich.ClaimRequest{ClaimID: uuid.Must(uuid.NewV7()), Release: rel,
			Binding: benchBinding, Image: ref, WaitSeconds: 60})
		if err != nil || res.Lease == nil {
			return 0, fmt.Errorf("claim: %v %v", res, err)
		}
		proof := res.Proof()
		defer func() {
			_, _ = plane.Release(context.WithoutCancel(ctx), benchTenant, res.Lease.ID, proof, lease.Destroyed)
		}()
		var first time.Duration
		_, err = plane.ExecStream(ctx, benchTenant, res.Lease.ID, proof, sandboxwich.ExecRequest{Argv: argv}, func(o sandboxwich.Output) error {
			if first == 0 && len(o.Data) > 0 {
				first = time.Since(t0)
			}
			return nil
		})
		if err != nil || first == 0 {
			return 0, fmt.Errorf("exec: %v (first output after %v)", err, first)
		}
		at, err := admitted(ctx, plane, res, ref)
		if err != nil {
			return 0, err
		}
		if at.Before(start) {
			return 0, fmt.Errorf("the claim found a cell admitted before it (%v before): a warm cell", start.Sub(at))
		}
		// The bare container of this round copies the cell's spec.
		m, err := st.Member(ctx, res.Lease.CellID)
		if err != nil {
			return 0, err
		}
		id, _, _ := strings.Cut(m.Identity, "@") // the driver's container ID
		if overlay == "" {
			if overlay, err = sandboxFlag(id, "--overlay2"); err != nil {
				return 0, err
			}
		}
		if b != nil {
			b.close()
		}
		if b, err = newBare(stateDir, filepath.Join(bundles, id), overlay, bareBundles, []string{"sleep", "100000"}); err != nil {
			return 0, err
		}
		return first, nil
	}
	bareRun := func() (time.Duration, error) {
		if err := settledEmpty(ctx, plane); err != nil {
			return 0, err
		}
		id := "bare-" + uuid.NewString()[:8]
		t0 := time.Now()
		err := b.start(ctx, id)
		var out []byte
		if err == nil {
			out, err = b.output(ctx, append([]string{"exec", id}, argv...)...)
		}
		took := time.Since(t0)
		cleanup := context.WithoutCancel(ctx)
		_ = b.runsc(cleanup, "kill", id, "KILL")
		if derr := b.runsc(cleanup, "delete", "--force", id); err == nil {
			err = derr
		}
		if err == nil && !strings.Contains(string(out), "first-output") {
			err = fmt.Errorf("runsc exec printed %q", out)
		}
		if err != nil {
			return 0, fmt.Errorf("bare runsc: %w", err)
		}
		return took, nil
	}
	t, err := inTurns(n, claimRun, bareRun)
	if err != nil {
		return Stats{}, Stats{}, err
	}
	return summarize(t[0], 0, 0), summarize(t[1], 0, 0), nil
}
