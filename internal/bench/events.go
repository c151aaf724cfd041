package bench

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandboxwich/sandboxwich/client"
	"github.com/sandboxwich/sandboxwich/httpapi"
)

// FanoutReport is the event stream under claim load: Subscribers streams
// of GET /v1/events on one server while claims run at concurrency 8.
type FanoutReport struct {
	Subscribers int `json:"subscribers"`
	Claims      int `json:"claims"`
	// Without and With are the claims without and with the subscribers.
	Without Stats `json:"claims_without"`
	With    Stats `json:"claims_with"`
	// Latency is from an event's time (taken in its transaction, before
	// the commit) to its receipt by a subscriber, over every subscriber.
	Latency Stats `json:"delivery_latency"`
	// Ratio is the claim throughput with the subscribers over without it
	// (target ≥ 0.9).
	Ratio float64 `json:"throughput_ratio"`
}

// benchFanout measures claims at concurrency 8 without subscribers, then
// with subs subscribers following the stream, on one SQLite server.
func benchFanout(ctx context.Context, dir string, subs, claims int) (*FanoutReport, error) {
	b, err := openSQLite(ctx, dir+"/fanout")
	if err != nil {
		return nil, err
	}
	defer b.cleanup()
	if err := b.seed(ctx, 2*claims, 0); err != nil {
		return nil, err
	}
	const token = "bench-token"
	h, err := httpapi.New(httpapi.Config{Plane: b.plane, Auth: httpapi.Auth{TenantTokens: map[string]string{token: benchTenant}},
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()
	rep := &FanoutReport{Subscribers: subs, Claims: claims}
	rep.Without = measure(ctx, 8, claims, b.claim)

	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: subs + 8}}
	c, err := client.New("http://"+ln.Addr().String(), client.WithToken(token), client.WithHTTPClient(hc))
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex
	var lat []time.Duration
	var following atomic.Int32
	var done sync.WaitGroup
	for range subs {
		done.Add(1)
		go func() {
			defer done.Done()
			started := false
			got := 0
			for ev, err := range c.Events(sctx, client.EventQuery{Type: "cell."}) {
				if err != nil {
					return
				}
				if ev.Type == "cell.ready" { // a marker: the stream is following
					if !started {
						started = true
						following.Add(1)
					}
					continue
				}
				if !started || ev.Type != "cell.leased" {
					continue
				}
				d := time.Since(ev.At.Time)
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
				if got++; got == claims {
					return
				}
			}
		}()
	}
	// Markers (new ready cells) until every subscriber follows the stream.
	deadline := time.Now().Add(30 * time.Second)
	for int(following.Load()) < subs {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("only %d of %d subscribers follow the stream", following.Load(), subs)
		}
		if err := b.seed(ctx, 1, 0); err != nil {
			return nil, err
		}
		time.Sleep(50 * time.Millisecond)
	}
	rep.With = measure(ctx, 8, claims, b.claim)
	finished := make(chan struct{})
	go func() { done.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(30 * time.Second):
		cancel()
		<-finished
	}
	mu.Lock()
	rep.Latency = summarize(lat, 0, subs*claims-len(lat))
	mu.Unlock()
	rep.Ratio = ratio(rep.With.Throughput, rep.Without.Throughput)
	if rep.Latency.N == 0 {
		return rep, fmt.Errorf("no subscriber received an event")
	}
	return rep, nil
}
