package bench

import (
	"context"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Stats summarizes one measured series.
type Stats struct {
	N          int     `json:"n"`
	P50MS      float64 `json:"p50_ms"`
	P99MS      float64 `json:"p99_ms"`
	Throughput float64 `json:"throughput_per_s"`
	Errors     int     `json:"errors"`
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// summarize computes percentiles of latencies over a wall time.
func summarize(lat []time.Duration, wall time.Duration, errs int) Stats {
	slices.Sort(lat)
	s := Stats{N: len(lat), Errors: errs}
	if len(lat) == 0 {
		return s
	}
	at := func(q float64) time.Duration { return lat[min(len(lat)-1, int(math.Ceil(q*float64(len(lat))))-1)] }
	s.P50MS, s.P99MS = ms(at(0.50)), ms(at(0.99))
	if wall > 0 {
		s.Throughput = float64(len(lat)) / wall.Seconds()
	}
	return s
}

// measure runs fn total times from conc goroutines and times each call.
// Errors are counted, not timed.
func measure(ctx context.Context, conc, total int, fn func(ctx context.Context, i int) error) Stats {
	var next, errs atomic.Int64
	lats := make([][]time.Duration, conc)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= total || ctx.Err() != nil {
					return
				}
				t0 := time.Now()
				if err := fn(ctx, i); err != nil {
					errs.Add(1)
					continue
				}
				lats[w] = append(lats[w], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	return summarize(slices.Concat(lats...), time.Since(start), int(errs.Load()))
}

// measureTurns runs each of fns total times from one goroutine, taking
// turns in a rotating order (a b c, then b c a, …), so that every series
// sees the same machine from moment to moment: on a shared machine that is
// what makes their ratios mean something. Throughput is per series, over
// its own time.
func measureTurns(ctx context.Context, total int, fns ...func(ctx context.Context, i int) error) []Stats {
	n := len(fns)
	lat := make([][]time.Duration, n)
	busy := make([]time.Duration, n)
	errs := make([]int, n)
	for i := 0; i < total && ctx.Err() == nil; i++ {
		for k := range n {
			j := (i + k) % n
			t0 := time.Now()
			err := fns[j](ctx, i)
			d := time.Since(t0)
			busy[j] += d
			if err != nil {
				errs[j]++
				continue
			}
			lat[j] = append(lat[j], d)
		}
	}
	out := make([]Stats, n)
	for j := range n {
		out[j] = summarize(lat[j], busy[j], errs[j])
	}
	return out
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return math.Round(a/b*1000) / 1000
}
