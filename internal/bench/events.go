package bench

import (
	"bufio"
	"bytes"
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
// of GET /v1/events on one server while claims run at concurrency 8. One
// stream in ten is the Go client's follower, decoding every event (the
// delivery latency is theirs); the others read the frames without
// decoding them, since subscribers' own work would otherwise run on the
// two cores the server's claims run on.
type FanoutReport struct {
	Subscribers int `json:"subscribers"`
	// Decoding is how many of them decode every event (one in ten).
	Decoding int `json:"decoding_subscribers"`
	Claims   int `json:"claims"`
	// Without and With are the claims without and with the subscribers:
	// Without before the subscribers connect, After once they left.
	Without Stats `json:"claims_without"`
	With    Stats `json:"claims_with"`
	After   Stats `json:"claims_without_after"`
	// Latency is from an event's time (taken in its transaction, before
	// the commit) to its receipt by a subscriber, over every subscriber.
	Latency Stats `json:"delivery_latency"`
	// Ratio is the claim throughput with the subscribers over the mean of
	// the two series without, which bracket it so that the machine's drift
	// (this disk's fsync, other work) cancels (target ≥ 0.9).
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
	if err := b.seed(ctx, 3*claims, 0); err != nil {
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
	base := "http://" + ln.Addr().String()
	c, err := client.New(base, client.WithToken(token), client.WithHTTPClient(hc))
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex
	var lat []time.Duration
	var following atomic.Int32
	var missed atomic.Int64 // cell.leased frames the raw streams did not get
	decoders := (subs + 9) / 10
	rep.Decoding = decoders
	var done sync.WaitGroup
	for i := range subs {
		done.Add(1)
		if i%10 != 0 {
			// Nine streams in ten read their frames without decoding the
			// events: a subscriber's own work is not the server's, and
			// here it would run on the server's two cores.
			go func() {
				defer done.Done()
				missed.Add(int64(claims - rawStream(sctx, hc, base, token, claims, &following)))
			}()
			continue
		}
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
	rep.Latency = summarize(lat, 0, decoders*claims-len(lat)+int(missed.Load()))
	mu.Unlock()
	cancel() // every stream ends before the second series without them
	<-finished
	rep.After = measure(ctx, 8, claims, b.claim)
	rep.Ratio = ratio(rep.With.Throughput, (rep.Without.Throughput+rep.After.Throughput)/2)
	if rep.Latency.N == 0 {
		return rep, fmt.Errorf("no subscriber received an event")
	}
	return rep, nil
}

// rawStream follows GET /v1/events?type=cell. as a subscriber that reads
// frames without decoding them: it counts itself following at the first
// cell.ready frame and ends after claims cell.leased frames, or with ctx.
// It returns the cell.leased frames it read.
func rawStream(ctx context.Context, hc *http.Client, base, token string, claims int, following *atomic.Int32) (got int) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/events?type=cell.", nil)
	if err != nil {
		return 0
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := hc.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	started := false
	for sc.Scan() {
		switch line := sc.Bytes(); {
		case !started && bytes.Equal(line, []byte("event: cell.ready")):
			started = true
			following.Add(1)
		case started && bytes.Equal(line, []byte("event: cell.leased")):
			if got++; got == claims {
				return got
			}
		}
	}
	return got
}
