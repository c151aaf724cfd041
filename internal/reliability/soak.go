package reliability

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/client"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/wire"
)

// SoakConfig configures a soak run against one running server.
type SoakConfig struct {
	URL      string
	Pid      int
	Clients  int
	Duration time.Duration
	// Sample is the interval of RSS and goroutine samples.
	Sample time.Duration
	Seed   uint64
}

// Sample is one measurement of the server process.
type Sample struct {
	At         time.Duration
	RSS        int64
	Threads    int
	Goroutines int // -1 when /metrics has no go_goroutines
	Requests   int64
}

// SoakReport is the outcome of a soak run.
type SoakReport struct {
	Requests, Status5xx, TransportErrors int64
	ByClass                              map[string]int64
	Throughput                           float64
	P50, P99, Max                        time.Duration
	Samples                              []Sample
	// Memory, Threads and Goroutines are "middle-third average → last-third
	// average" with the stability verdict.
	Memory, Threads, Goroutines string
	Stable                      bool
	IdempotentReplays           int64
	IdempotentMismatch          int64
	Slowest                     string
}

// Passed reports the soak's verdict: no 5xx, no transport error, every
// idempotent replay identical, memory, threads and goroutines stable.
func (r SoakReport) Passed() bool {
	return r.Status5xx == 0 && r.TransportErrors == 0 && r.IdempotentMismatch == 0 && r.Stable && r.Requests > 0
}

func (r SoakReport) String() string {
	var classes []string
	for _, k := range slices.Sorted(func(y func(string) bool) {
		for k := range r.ByClass {
			if !y(k) {
				return
			}
		}
	}) {
		classes = append(classes, fmt.Sprintf("%s=%d", k, r.ByClass[k]))
	}
	return fmt.Sprintf("%d requests (%s), %d 5xx, %d transport errors, %.0f req/s, p50 %s, p99 %s, max %s (%s), "+
		"%d idempotent replays (%d mismatched), RSS %s, threads %s, goroutines %s",
		r.Requests, strings.Join(classes, " "), r.Status5xx, r.TransportErrors, r.Throughput,
		r.P50.Round(100*time.Microsecond), r.P99.Round(100*time.Microsecond), r.Max.Round(time.Millisecond), r.Slowest,
		r.IdempotentReplays, r.IdempotentMismatch, r.Memory, r.Threads, r.Goroutines)
}

// soakRun is one soak.
type soakRun struct {
	cfg    SoakConfig
	env    *Env
	hc     *http.Client
	tenant *client.Client
	op     *client.Client
	worker *client.Client
	stop   atomic.Bool

	mu        sync.Mutex
	latencies []time.Duration
	slowest   string // the slowest request, for the report
	maxSeen   time.Duration
	byClass   map[string]int64
	requests  atomic.Int64
	fivexx    atomic.Int64
	transport atomic.Int64
	replays   atomic.Int64
	mismatch  atomic.Int64

	recentMu sync.Mutex
	recent   []held // leases other clients may read
	prepared sync.Map
	unclaim  atomic.Int64
}

type held struct {
	lease *wire.Lease
	proof wire.LeaseProof
}

// soakTransport records the status and latency of every HTTP attempt,
// retries included, so that the client's retries hide nothing.
type soakTransport struct {
	base http.RoundTripper
	r    *soakRun
}

func (t soakTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	t0 := time.Now()
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		t.r.transport.Add(1)
		t.r.requests.Add(1)
		return resp, err
	}
	// Latency to the whole answer: read the body here.
	body, rerr := io.ReadAll(resp.Body)
	resp.Body.Close()
	d := time.Since(t0)
	if rerr != nil {
		t.r.transport.Add(1)
		t.r.requests.Add(1)
		return nil, rerr
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	t.r.requests.Add(1)
	if resp.StatusCode >= 500 {
		t.r.fivexx.Add(1)
	}
	t.r.mu.Lock()
	if d > t.r.maxSeen {
		t.r.maxSeen = d
		t.r.slowest = fmt.Sprintf("%s %s %d in %s", req.Method, route(req.URL.Path), resp.StatusCode, d.Round(time.Millisecond))
	}
	t.r.latencies = append(t.r.latencies, d)
	t.r.byClass[fmt.Sprintf("%dxx", resp.StatusCode/100)]++
	if resp.StatusCode >= 400 {
		t.r.byClass[strconv.Itoa(resp.StatusCode)]++
	}
	t.r.mu.Unlock()
	return resp, nil
}

// RunSoak puts mixed load on a server at the given concurrency and samples
// its memory, threads and goroutines.
func RunSoak(ctx context.Context, env *Env, cfg SoakConfig) (SoakReport, error) {
	r := &soakRun{cfg: cfg, env: env, byClass: map[string]int64{}}
	tr := &http.Transport{MaxIdleConns: 512, MaxIdleConnsPerHost: 256, IdleConnTimeout: 30 * time.Second}
	defer tr.CloseIdleConnections()
	r.hc = &http.Client{Transport: soakTransport{base: tr, r: r}, Timeout: 30 * time.Second}
	var err error
	if r.tenant, err = client.New(cfg.URL, client.WithToken(env.TenantToken), client.WithHTTPClient(r.hc)); err != nil {
		return SoakReport{}, err
	}
	if r.op, err = client.New(cfg.URL, client.WithToken(env.TenantToken), client.WithOperatorToken(env.OperatorToken), client.WithHTTPClient(r.hc)); err != nil {
		return SoakReport{}, err
	}
	if r.worker, err = client.New(cfg.URL, client.WithToken(env.WorkerToken), client.WithHTTPClient(r.hc)); err != nil {
		return SoakReport{}, err
	}
	var samples []Sample
	start := time.Now()
	var wg sync.WaitGroup
	for i := range cfg.Clients {
		wg.Go(func() { r.client(i) })
	}
	for i := range 2 {
		wg.Go(func() { r.preparer(i) })
	}
	sample := func() {
		s := Sample{At: time.Since(start), Goroutines: -1, Requests: r.requests.Load()}
		s.RSS, _ = RSS(cfg.Pid)
		s.Threads = threads(cfg.Pid)
		s.Goroutines = goroutines(env, cfg.URL)
		samples = append(samples, s)
	}
	sample()
	t := time.NewTicker(cfg.Sample)
	deadline := time.After(cfg.Duration)
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-deadline:
			break loop
		case <-t.C:
			sample()
		}
	}
	t.Stop()
	elapsed := time.Since(start)
	r.stop.Store(true)
	wg.Wait()

	rep := SoakReport{Requests: r.requests.Load(), Status5xx: r.fivexx.Load(), TransportErrors: r.transport.Load(),
		ByClass: r.byClass, Samples: samples, IdempotentReplays: r.replays.Load(), IdempotentMismatch: r.mismatch.Load(),
		Slowest: r.slowest}
	rep.Throughput = float64(rep.Requests) / elapsed.Seconds()
	slices.Sort(r.latencies)
	if n := len(r.latencies); n > 0 {
		rep.P50, rep.P99, rep.Max = r.latencies[n/2], r.latencies[n*99/100], r.latencies[n-1]
	}
	var okMem, okThr, okGo bool
	rep.Memory, okMem = stable(samples, func(s Sample) float64 { return float64(s.RSS) / (1 << 20) }, "MiB", 8)
	rep.Threads, okThr = stable(samples, func(s Sample) float64 { return float64(s.Threads) }, "", 4)
	if samples[len(samples)-1].Goroutines < 0 {
		rep.Goroutines, okGo = "not exported (/metrics has no go_goroutines)", true
	} else {
		rep.Goroutines, okGo = stable(samples, func(s Sample) float64 { return float64(s.Goroutines) }, "", 10)
	}
	rep.Stable = okMem && okThr && okGo
	return rep, nil
}

// stable applies the stability rule to a series: the average of the last
// third of the samples may exceed the average of the middle third (the
// first third is warm-up) by at most 20% plus slack (absolute, for small
// values).
func stable(samples []Sample, f func(Sample) float64, unit string, slack float64) (string, bool) {
	n := len(samples)
	if n < 6 {
		return "too few samples", false
	}
	avg := func(ss []Sample) float64 {
		t := 0.0
		for _, s := range ss {
			t += f(s)
		}
		return t / float64(len(ss))
	}
	mid, last := avg(samples[n/3:2*n/3]), avg(samples[2*n/3:])
	ok := last <= 1.2*mid+slack
	verdict := "stable"
	if !ok {
		verdict = "GROWING"
	}
	return fmt.Sprintf("%.1f%s→%.1f%s %s", mid, unit, last, unit, verdict), ok
}

// route names a request path by its route, with IDs elided.
func route(path string) string {
	parts := strings.Split(path, "/")
	for i, p := range parts {
		if _, err := uuid.Parse(p); err == nil {
			parts[i] = "{id}"
		}
	}
	return strings.Join(parts, "/")
}

func threads(pid int) int {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "Threads:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(rest))
			return n
		}
	}
	return 0
}

// goroutines scrapes go_goroutines from /metrics, or returns -1.
func goroutines(env *Env, base string) int {
	req, _ := http.NewRequest(http.MethodGet, base+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+env.TenantToken)
	resp, err := probe.Do(req)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "go_goroutines "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err == nil {
				return int(f)
			}
		}
	}
	return -1
}

func (r *soakRun) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 30*time.Second)
}

// client runs one closed loop of mixed requests.
func (r *soakRun) client(i int) {
	rng := rand.New(rand.NewPCG(r.cfg.Seed, uint64(i)))
	binding := lease.Binding{OrganizationID: "org-soak", WorkspaceID: "ws", ThreadID: fmt.Sprintf("t-%d", i), RunnerSessionID: "s"}
	for !r.stop.Load() {
		ctx, cancel := r.ctx()
		switch x := rng.Float64(); {
		case x < 0.45:
			r.cycle(ctx, rng, binding)
		case x < 0.65:
			if h, ok := r.pickRecent(rng); ok {
				_, _ = r.tenant.Lease(ctx, h.lease.LeaseID)
			}
		case x < 0.80:
			if h, ok := r.pickRecent(rng); ok {
				_, _ = r.tenant.Validate(ctx, h.lease.LeaseID, h.proof)
			}
		case x < 0.92:
			_, _ = r.op.Pools(ctx)
		default:
			r.raw(ctx, http.MethodGet, "/healthz", "", nil, nil)
		}
		cancel()
	}
}

func (r *soakRun) pickRecent(rng *rand.Rand) (held, bool) {
	r.recentMu.Lock()
	defer r.recentMu.Unlock()
	if len(r.recent) == 0 {
		return held{}, false
	}
	return r.recent[rng.IntN(len(r.recent))], true
}

// cycle claims a cell, validates it, reads its status and ends it: a
// release (sometimes under an Idempotency-Key, sent twice) for pool cells,
// the worker's destroy for worker cells.
func (r *soakRun) cycle(ctx context.Context, rng *rand.Rand, b lease.Binding) {
	c, err := r.tenant.Claim(ctx, wire.ClaimRequest{Release: r.env.Release, Binding: b})
	if err != nil || c.Empty() {
		time.Sleep(time.Duration(5+rng.IntN(20)) * time.Millisecond)
		return
	}
	h := held{lease: c.Lease, proof: c.Proof()}
	r.recentMu.Lock()
	if len(r.recent) < 256 {
		r.recent = append(r.recent, h)
	} else {
		r.recent[rng.IntN(len(r.recent))] = h
	}
	r.recentMu.Unlock()
	_, _ = r.tenant.Validate(ctx, c.Lease.LeaseID, h.proof)
	_, _ = r.tenant.Lease(ctx, c.Lease.LeaseID)
	if _, worker := r.prepared.LoadAndDelete(c.Lease.CellID.String()); worker {
		r.unclaim.Add(-1)
		_, _ = r.worker.Destroy(ctx, r.env.WorkerID, c.Lease.CellID,
			wire.DestroyRequest{LeaseID: c.Lease.LeaseID, Generation: 2, Disposition: lease.Destroyed})
		return
	}
	if rng.Float64() < 0.3 {
		body, _ := json.Marshal(wire.ReleaseRequest{LeaseProof: h.proof, Disposition: lease.Destroyed})
		key := uuid.NewString()
		path := "/v1/sterile-cell-leases/" + c.Lease.LeaseID.String() + "/release"
		var first, second []byte
		s1 := r.raw(ctx, http.MethodPost, path, key, body, &first)
		s2 := r.raw(ctx, http.MethodPost, path, key, body, &second)
		r.replays.Add(1)
		if s1 != s2 || !bytes.Equal(first, second) {
			r.mismatch.Add(1)
		}
		return
	}
	_, _ = r.tenant.Release(ctx, c.Lease.LeaseID, h.proof, lease.Destroyed)
}

// raw sends one request with the tenant token and returns its status.
func (r *soakRun) raw(ctx context.Context, method, path, idemKey string, body []byte, out *[]byte) int {
	req, err := http.NewRequestWithContext(ctx, method, r.cfg.URL+path, bytes.NewReader(body))
	if err != nil {
		return 0
	}
	req.Header.Set("Authorization", "Bearer "+r.env.TenantToken)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if idemKey != "" {
		req.Header.Set("Idempotency-Key", idemKey)
	}
	resp, err := r.hc.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil {
		*out = b
	}
	return resp.StatusCode
}

// preparer keeps about 16 unclaimed worker cells in inventory.
func (r *soakRun) preparer(p int) {
	for n := 0; !r.stop.Load(); n++ {
		if r.unclaim.Load() >= 16 {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		cell := uuid.Must(uuid.NewV7())
		r.prepared.Store(cell.String(), true)
		r.unclaim.Add(1)
		ctx, cancel := r.ctx()
		_, err := r.worker.Prepare(ctx, r.env.WorkerID, wire.PrepareRequest{CellID: cell, Release: r.env.Release,
			ProviderCellID: fmt.Sprintf("soak-%d-%d-%d", r.cfg.Seed, p, n), ExpiresAt: wire.Time{Time: time.Now().Add(time.Hour)}})
		cancel()
		if err != nil {
			r.prepared.Delete(cell.String())
			r.unclaim.Add(-1)
			time.Sleep(50 * time.Millisecond)
		}
	}
}
