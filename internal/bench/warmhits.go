package bench

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/gvisor"
	"github.com/sandboxwich/sandboxwich/internal/ctxsleep"
	"github.com/sandboxwich/sandboxwich/internal/testimage"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
)

// WarmHitReport is R15 (CONTRACT §21): how many claims of a replayed,
// benchmark-shaped trace an image class serves from warm cells, with its
// live cells and its image cache within their budgets throughout.
type WarmHitReport struct {
	// Provider is the pool's driver kind.
	Provider string `json:"provider"`
	// Claims claims of Images images, drawn by a Zipf law of exponent ZipfS
	// (the image of rank k with weight k^-ZipfS) with a fixed seed, replayed
	// in order by Concurrency workers: each claims its next image with
	// wait_seconds, runs `true` in the cell through the plane, holds the
	// cell for the claim's task time (uniform between half and one and a
	// half HoldMS) and releases the lease. Distinct is how many images the
	// trace names.
	Claims      int     `json:"claims"`
	Images      int     `json:"images"`
	Distinct    int     `json:"distinct_images"`
	ZipfS       float64 `json:"zipf_s"`
	Concurrency int     `json:"concurrency"`
	HoldMS      int     `json:"mean_task_ms"`
	// MaxCells, MaxCold and WarmPerImage are the image class's settings
	// (warm_idle its default, 10 min, longer than the run); CacheBudget is
	// the image cache's (image_cache_bytes).
	MaxCells     int   `json:"max_cells"`
	MaxCold      int   `json:"max_cold"`
	WarmPerImage int   `json:"warm_per_image"`
	CacheBudget  int64 `json:"cache_budget_bytes"`
	// Hits counts the claims served from a warm cell: the cell leased to
	// the claim was admitted (ready) before the claim was made, so the
	// claim took it without waiting for a cell to be made. Every other
	// claim waited for a cell made for it, or made while it waited.
	Hits int `json:"warm_hits"`
	// Ratio is R15: Hits ÷ Claims (target ≥ 0.8).
	Ratio float64 `json:"ratio"`
	// Hit and Miss are the claim calls' own latencies, served warm and
	// not.
	Hit  Stats `json:"warm_claim"`
	Miss Stats `json:"waited_claim"`
	// PeakLive and PeakCacheBytes are the most live cells and cache bytes
	// any of Samples readings (every 20 ms and once at the end) found; a
	// reading past max_cells or the budget fails the run.
	PeakLive       int    `json:"peak_live_cells"`
	PeakCacheBytes int64  `json:"peak_cache_bytes"`
	Samples        int    `json:"samples"`
	Evictions      uint64 `json:"cache_evictions"`
	// TookMS is the replay's wall time.
	TookMS float64 `json:"took_ms"`
}

// warmHitSeed is the trace's fixed seed.
const warmHitSeed = 15

// traceClaim is one claim of a trace: the image it names and how long its
// task holds the cell.
type traceClaim struct {
	image int
	hold  time.Duration
}

// zipfTrace returns claims claims of images in [0, images) drawn by a
// Zipf law of exponent s (> 1) — image k-1 has weight k^-s — each holding
// its cell for a task time drawn uniformly from [hold/2, 3·hold/2].
func zipfTrace(claims, images int, s float64, hold time.Duration, seed uint64) []traceClaim {
	rng := rand.New(rand.NewPCG(seed, seed))
	z := rand.NewZipf(rng, s, 1, uint64(images-1))
	out := make([]traceClaim, claims)
	for i := range out {
		out[i] = traceClaim{image: int(z.Uint64()), hold: hold/2 + time.Duration(rng.Int64N(int64(hold)+1))}
	}
	return out
}

// replayTrace runs r's trace on plane: r.Concurrency workers, each taking
// the trace's next claim in order, claiming refs[image] with wait_seconds,
// running argv in the cell, holding it for the claim's task time and
// releasing the lease. It fills r's hits, its
// latencies and its wall time; any claim that fails, answers empty or
// whose command fails is its error.
func replayTrace(ctx context.Context, plane *sandboxwich.Plane, rel lease.Release, refs []string, trace []traceClaim, argv []string, r *WarmHitReport) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		next       atomic.Int64
		mu         sync.Mutex
		hits, miss []time.Duration
		wg         sync.WaitGroup
	)
	one := func(ref string, hold time.Duration) error {
		start, t0 := plane.Now(), time.Now()
		res, err := plane.Claim(ctx, benchTenant, sandboxwich.ClaimRequest{ClaimID: uuid.Must(uuid.NewV7()), Release: rel,
			Binding: benchBinding, Image: ref, WaitSeconds: 120})
		took := time.Since(t0)
		if err != nil || res.Lease == nil {
			return fmt.Errorf("claim of %s: %v %v", ref, res, err)
		}
		proof := res.Proof()
		out, err := plane.Exec(ctx, benchTenant, res.Lease.ID, proof, sandboxwich.ExecRequest{Argv: argv})
		if err == nil && out.ExitCode != 0 {
			err = fmt.Errorf("%q exited %d", argv, out.ExitCode)
		}
		var at time.Time
		if err == nil {
			at, err = admitted(ctx, plane, res, ref)
		}
		if err == nil {
			err = ctxsleep.Sleep(ctx, hold) // the task
		}
		// Released whatever happened, so no lease outlives the run.
		if _, rerr := plane.Release(context.WithoutCancel(ctx), benchTenant, res.Lease.ID, proof, lease.Destroyed); err == nil {
			err = rerr
		}
		if err != nil {
			return err
		}
		mu.Lock()
		if at.Before(start) {
			hits = append(hits, took)
		} else {
			miss = append(miss, took)
		}
		mu.Unlock()
		return nil
	}
	t0 := time.Now()
	for range r.Concurrency {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= len(trace) {
					return
				}
				if err := one(refs[trace[i].image], trace[i].hold); err != nil {
					cancel(fmt.Errorf("claim %d of the trace: %w", i, err))
				}
			}
		})
	}
	wg.Wait()
	r.TookMS = ms(time.Since(t0))
	if err := context.Cause(ctx); err != nil {
		return err
	}
	r.Hits = len(hits)
	r.Hit, r.Miss = summarize(hits, 0, 0), summarize(miss, 0, 0)
	r.Ratio = ratio(float64(r.Hits), float64(r.Claims))
	return nil
}

// newWarmHitReport is the trace's shape.
func newWarmHitReport() *WarmHitReport {
	r := &WarmHitReport{Claims: 500, Images: 50, ZipfS: 1.1, Concurrency: 8, HoldMS: 2000, MaxCold: 4, WarmPerImage: 3}
	// Room for one warm cell of every image, beside the trace's leases, the
	// provisions in flight (max_cold) and the stops of released cells (one
	// a worker at most). The most claimed images keep up to warm_per_image
	// warm cells (as many as were in use at once), evicting the least
	// recently used images' when the class is full.
	r.MaxCells = r.Images + 2*r.Concurrency + r.MaxCold
	return r
}

// distinct counts the different images of a trace.
func distinct(trace []traceClaim) int {
	seen := map[int]bool{}
	for _, c := range trace {
		seen[c.image] = true
	}
	return len(seen)
}

// benchWarmHits measures R15 on gVisor cells when a static busybox is
// installed (scripts/install-busybox.sh); nil without one. The trace's
// images are served by a loopback registry and pulled on demand into an
// image cache with room for every one of them and max_cold pulls in
// flight.
func benchWarmHits(ctx context.Context, dir string) (*WarmHitReport, error) {
	if _, err := os.Stat(busybox); err != nil {
		return nil, nil
	}
	r := newWarmHitReport()
	r.Provider = "gvisor"
	reg, err := testimage.Serve()
	if err != nil {
		return nil, err
	}
	defer reg.Close()
	refs, err := markedImages(reg, "bench/trace", r.Images)
	if err != nil {
		return nil, err
	}
	probe := filepath.Join(dir, "images-trace-probe")
	size, err := prefetchInto(ctx, dir, probe, refs[0])
	if err != nil {
		return nil, err
	}
	_ = os.RemoveAll(probe)
	r.CacheBudget = int64(r.Images+r.MaxCold) * size
	stateDir := filepath.Join(dir, "runsc-trace-"+uuid.NewString()[:8])
	defer func() { _ = gvisor.RemoveStateDir(stateDir) }()
	prov, err := gvisor.New(gvisor.Config{StateDir: stateDir, BundleDir: filepath.Join(dir, "bundles-trace"), Pool: "trace",
		ImageCacheDir: filepath.Join(dir, "images-trace"), ImageCacheBytes: r.CacheBudget,
		Installation: driver.InstallationTag(stateDir), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	err = replayOn(ctx, dir, r, prov, reg.Host+"/bench/trace/*", refs, []string{"true"}, func(ctx context.Context) (int64, error) {
		n, _, err := prov.CacheStats(ctx)
		return n, err
	})
	if err != nil {
		return nil, err
	}
	_, r.Evictions, _ = prov.CacheStats(ctx)
	return r, nil
}

// replayOn replays r's trace on an image class of prov allowing pattern
// (refs are its images), running argv in each cell, with its live cells —
// and, when cacheBytes is set, the image cache — sampled against their
// budgets throughout: a reading past one is its error.
func replayOn(ctx context.Context, dir string, r *WarmHitReport, prov driver.Provider, pattern string, refs, argv []string,
	cacheBytes func(context.Context) (int64, error)) error {
	plane, _, rel, stop, err := runPool(ctx, dir, pool.Config{Name: "trace", Target: r.MaxCells, MaxProvisioning: r.MaxCold,
		WarmPerImage: r.WarmPerImage, Images: []string{pattern}, Provider: prov})
	if err != nil {
		return err
	}
	defer stop()
	trace := zipfTrace(r.Claims, r.Images, r.ZipfS, time.Duration(r.HoldMS)*time.Millisecond, warmHitSeed)
	r.Distinct = distinct(trace)
	b := &bounds{plane: plane, maxCells: r.MaxCells, budget: r.CacheBudget, cacheBytes: cacheBytes}
	done := b.watch(ctx, 20*time.Millisecond)
	err = replayTrace(ctx, plane, rel, refs, trace, argv, r)
	if berr := done(); err == nil {
		err = berr
	}
	r.Samples, r.PeakLive, r.PeakCacheBytes = b.samples, b.peakLive, b.peakBytes
	return err
}
