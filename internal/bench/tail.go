package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/client"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/httpapi"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
	"github.com/sandboxwich/sandboxwich/wire"
)

// TailReport is R13: the claim's latency spread under the reliability
// soak's tenant mix, from many clients at once over HTTP.
type TailReport struct {
	Clients int `json:"clients"`
	// Claims times whole client.Claim calls, the client's own retries
	// included: what a harness waits.
	Claims Stats `json:"claims"`
	// Empty counts claims that found no ready cell: 64 clients outrun the
	// pool's turnover, so most do. They are not in Claims.
	Empty int `json:"empty_claims"`
	// Requests is every request of the mix, claims included.
	Requests Stats `json:"requests"`
	// Ratio is Claims' p99 over its p50.
	Ratio float64 `json:"p99_over_p50"`
}

// tailMix is the soak's tenant mix (internal/reliability soak.go), without
// its worker cells: of every 100 requests a client makes, 45 are a whole
// cycle (claim, validate, status, release; 30% of releases under an
// Idempotency-Key, sent twice; a claim that finds no ready cell waits 5 to
// 25 ms), 20 a status read and 15 a validation of a recent lease, 12 a
// pool listing and 8 a health check.
const (
	tailCycle    = 0.45
	tailStatus   = 0.65
	tailValidate = 0.80
	tailPools    = 0.92
)

// serve runs plane's HTTP API on loopback for tenant benchTenant (token
// "bench-token", operator token "bench-operator") and returns its base URL,
// an HTTP client for it and the function that stops it.
func serve(plane *sandboxwich.Plane, conns int) (string, *http.Client, func(), error) {
	h, err := httpapi.New(httpapi.Config{Plane: plane,
		Auth:   httpapi.Auth{TenantTokens: map[string]string{benchToken: benchTenant}, OperatorToken: benchOperator},
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return "", nil, nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	tr := &http.Transport{MaxIdleConns: conns, MaxIdleConnsPerHost: conns}
	stop := func() { srv.Close(); tr.CloseIdleConnections() }
	return "http://" + ln.Addr().String(), &http.Client{Transport: tr}, stop, nil
}

const (
	benchToken    = "bench-token"
	benchOperator = "bench-operator"
)

// benchTail runs clients closed loops of the soak's mix until they have
// leased claims cells, against a plane over b's store (a fresh database)
// that runs, as the soak's server does, one pool of instant fake cells
// with its reconciler, destroyer and sweeps: four ready cells per client,
// refilled as releases destroy them.
func benchTail(ctx context.Context, b *backend, clients, claims int) (*TailReport, error) {
	target := 4 * clients
	plane, err := sandboxwich.New(b.st, b.keys, sandboxwich.WithLogger(slog.New(slog.DiscardHandler)),
		sandboxwich.WithPools(pool.Config{Name: "tail", TenantID: benchTenant, Release: b.rel, Target: target,
			MaxProvisioning: target, Provider: fake.New(fake.Config{Mode: driver.Apply})}),
		sandboxwich.WithPoolOptions(pool.WithInterval(20*time.Millisecond)))
	if err != nil {
		return nil, err
	}
	defer run(ctx, plane)()
	waitReady(ctx, plane, target)
	base, hc, stop, err := serve(plane, 2*clients)
	if err != nil {
		return nil, err
	}
	defer stop()
	c, err := client.New(base, client.WithToken(benchToken), client.WithOperatorToken(benchOperator), client.WithHTTPClient(hc))
	if err != nil {
		return nil, err
	}

	type held struct {
		lease wire.Lease
		proof wire.LeaseProof
	}
	var (
		left, empty    atomic.Int64
		claimErrs, rqE atomic.Int64
		mu             sync.Mutex
		claimLat, reqs []time.Duration
		recent         []held
	)
	left.Store(int64(claims))
	// timed times a request of the mix other than a claim. A 4xx is an
	// answer (validating a lease another client released is refused), as
	// the soak counts it; a 5xx or a transport error is an error.
	timed := func(fn func() error) {
		t0 := time.Now()
		err := fn()
		d := time.Since(t0)
		if !answered(err) {
			rqE.Add(1)
			return
		}
		mu.Lock()
		reqs = append(reqs, d)
		mu.Unlock()
	}
	pick := func(rng *rand.Rand) (held, bool) {
		mu.Lock()
		defer mu.Unlock()
		if len(recent) == 0 {
			return held{}, false
		}
		return recent[rng.IntN(len(recent))], true
	}
	cycle := func(ctx context.Context, rng *rand.Rand) {
		t0 := time.Now()
		res, err := c.Claim(ctx, wire.ClaimRequest{Release: b.rel, Binding: benchBinding})
		d := time.Since(t0)
		switch {
		case err != nil:
			claimErrs.Add(1)
			return
		case res.Empty():
			// As the soak's clients do: wait a little for the refill.
			empty.Add(1)
			time.Sleep(time.Duration(5+rng.IntN(20)) * time.Millisecond)
			return
		}
		if left.Add(-1) < 0 {
			return // one too many: the others made the count
		}
		mu.Lock()
		claimLat = append(claimLat, d)
		reqs = append(reqs, d)
		mu.Unlock()
		h := held{*res.Lease, res.Proof()}
		mu.Lock()
		if len(recent) < 256 {
			recent = append(recent, h)
		} else {
			recent[rng.IntN(len(recent))] = h
		}
		mu.Unlock()
		timed(func() error { _, err := c.Validate(ctx, h.lease.LeaseID, h.proof); return err })
		timed(func() error { _, err := c.Lease(ctx, h.lease.LeaseID); return err })
		if rng.Float64() < 0.3 {
			body, _ := json.Marshal(wire.ReleaseRequest{LeaseProof: h.proof, Disposition: lease.Destroyed})
			path := base + "/v1/sterile-cell-leases/" + h.lease.LeaseID.String() + "/release"
			key := uuid.NewString()
			for range 2 {
				timed(func() error { return post(ctx, hc, path, key, body) })
			}
			return
		}
		timed(func() error { _, err := c.Release(ctx, h.lease.LeaseID, h.proof, lease.Destroyed); return err })
	}
	health := func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/healthz", nil)
		return do(hc, req)
	}

	start := time.Now()
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(23, uint64(i)))
			for ctx.Err() == nil {
				switch x := rng.Float64(); {
				case x < tailCycle:
					if left.Load() <= 0 {
						return
					}
					cycle(ctx, rng)
				case x < tailStatus:
					if h, ok := pick(rng); ok {
						timed(func() error { _, err := c.Lease(ctx, h.lease.LeaseID); return err })
					}
				case x < tailValidate:
					if h, ok := pick(rng); ok {
						timed(func() error { _, err := c.Validate(ctx, h.lease.LeaseID, h.proof); return err })
					}
				case x < tailPools:
					timed(func() error { _, err := c.Pools(ctx); return err })
				default:
					timed(func() error { return health(ctx) })
				}
			}
		})
	}
	wg.Wait()
	wall := time.Since(start)
	r := &TailReport{Clients: clients, Empty: int(empty.Load()),
		Claims:   summarize(claimLat, wall, int(claimErrs.Load())),
		Requests: summarize(reqs, wall, int(claimErrs.Load()+rqE.Load()))}
	r.Ratio = ratio(r.Claims.P99MS, r.Claims.P50MS)
	return r, nil
}

// post sends body as a tenant under an Idempotency-Key.
func post(ctx context.Context, hc *http.Client, url, key string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+benchToken)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(client.IdempotencyKeyHeader, key)
	return do(hc, req)
}

// do sends req, reads the whole answer and fails on a status other than
// 2xx.
func do(hc *http.Client, req *http.Request) error {
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	if cerr := resp.Body.Close(); err == nil {
		err = cerr
	}
	if err == nil && resp.StatusCode/100 != 2 {
		err = &client.Error{Status: resp.StatusCode, Message: req.Method + " " + req.URL.Path + ": " + resp.Status}
	}
	return err
}

// answered reports whether err is nil or the server's 4xx answer.
func answered(err error) bool {
	ce, ok := errors.AsType[*client.Error](err)
	return err == nil || ok && ce.Status < 500
}
