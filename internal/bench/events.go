package bench

import (
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
	"github.com/sandboxwich/sandboxwich/wire"
)

// FanoutReport is the event stream under claim load: Subscribers streams
// of GET /v1/events on one server while claims come over HTTP at
// concurrency 8. One stream is the Go client's follower, decoding every
// event (the delivery latency is its); the others read every frame without
// decoding it, since subscribers' own work would otherwise run on the two
// cores the server runs on.
type FanoutReport struct {
	Subscribers int `json:"subscribers"`
	// Decoding is how many of them decode every event (one).
	Decoding int `json:"decoding_subscribers"`
	// Claims is the length of each series.
	Claims int `json:"claims"`
	// Without and With are the series of claims without and with the
	// subscribers, in turns: Without[r] and Without[r+1] bracket With[r],
	// so that the machine's drift (this disk's fsync, other work) cancels
	// within a round.
	Without []Stats `json:"claims_without"`
	With    []Stats `json:"claims_with"`
	// Latency is from an event's time (taken in its transaction, before
	// the commit) to its receipt by the decoding subscriber, over every
	// round.
	Latency Stats `json:"delivery_latency"`
	// RoundRatios are each round's claim throughput with the subscribers
	// over the mean of the two series without that bracket it; Ratio is
	// their median (target ≥ 0.9).
	RoundRatios []float64 `json:"round_ratios"`
	Ratio       float64   `json:"throughput_ratio"`
}

// benchFanout measures rounds of claims at concurrency 8 without and then
// with subs subscribers following the stream, on one SQLite server. Each
// series is claims long: a few hundred claims last a fraction of a second
// here, and one slow fsync (tens of milliseconds) moves such a series by a
// tenth, so the ratio is the median of the rounds.
func benchFanout(ctx context.Context, dir string, subs, claims, rounds int) (*FanoutReport, error) {
	b, err := openSQLite(ctx, dir+"/fanout")
	if err != nil {
		return nil, err
	}
	defer b.cleanup()
	if err := b.seed(ctx, (2*rounds+1)*claims, 0); err != nil {
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
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: subs + 8}}
	base := "http://" + ln.Addr().String()
	c, err := client.New(base, client.WithToken(token), client.WithHTTPClient(hc))
	if err != nil {
		return nil, err
	}
	rep := &FanoutReport{Subscribers: subs, Decoding: 1, Claims: claims}
	// The claims come to the server the way a harness's do: over HTTP,
	// through the Go client.
	claim := func(ctx context.Context, _ int) error {
		res, err := c.Claim(ctx, wire.ClaimRequest{Release: b.rel, Binding: benchBinding})
		if err == nil && res.Empty() {
			err = fmt.Errorf("fan-out: claim found no ready cell")
		}
		return err
	}
	var lat []time.Duration
	missed := 0
	rep.Without = append(rep.Without, measure(ctx, 8, claims, claim))
	for r := range rounds {
		f, err := follow(ctx, b, c, hc, base, token, subs, claims)
		if err != nil {
			return nil, err
		}
		rep.With = append(rep.With, measure(ctx, 8, claims, claim))
		l, m := f.stop()
		lat, missed = append(lat, l...), missed+m
		rep.Without = append(rep.Without, measure(ctx, 8, claims, claim))
		rep.RoundRatios = append(rep.RoundRatios,
			ratio(rep.With[r].Throughput, (rep.Without[r].Throughput+rep.Without[r+1].Throughput)/2))
	}
	rep.Latency = summarize(lat, 0, missed)
	rep.Ratio = median(rep.RoundRatios)
	if rep.Latency.N == 0 {
		return rep, fmt.Errorf("no subscriber received an event")
	}
	return rep, nil
}

// followers are the subscribers of one round.
type followers struct {
	cancel   context.CancelFunc
	finished chan struct{}
	mu       sync.Mutex
	lat      []time.Duration
	missed   atomic.Int64 // cell.leased frames the streams did not get
}

// follow connects subs subscribers to GET /v1/events?type=cell. and
// returns once every one follows the stream (it seeds ready cells, whose
// cell.ready events mark that, until they all do). Each ends after claims
// cell.leased events.
func follow(ctx context.Context, b *backend, c *client.Client, hc *http.Client, base, token string, subs, claims int) (*followers, error) {
	sctx, cancel := context.WithCancel(ctx)
	f := &followers{cancel: cancel, finished: make(chan struct{})}
	var following atomic.Int32
	var done sync.WaitGroup
	for i := range subs {
		done.Add(1)
		if i != 0 {
			// All streams but one read their frames without decoding the
			// events: a subscriber's own work is not the server's, and
			// here it would run on the server's two cores.
			go func() {
				defer done.Done()
				f.missed.Add(int64(claims - rawStream(sctx, hc, base, token, claims, &following)))
			}()
			continue
		}
		go func() {
			defer done.Done()
			started := false
			got := 0
			for ev, err := range c.Events(sctx, client.EventQuery{Type: "cell."}) {
				if err != nil {
					break
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
				f.mu.Lock()
				f.lat = append(f.lat, d)
				f.mu.Unlock()
				if got++; got == claims {
					return
				}
			}
			f.missed.Add(int64(claims - got))
		}()
	}
	go func() { done.Wait(); close(f.finished) }()
	// Markers (new ready cells) until every subscriber follows the stream.
	deadline := time.Now().Add(30 * time.Second)
	for int(following.Load()) < subs {
		err := ctx.Err()
		if err == nil && time.Now().After(deadline) {
			err = fmt.Errorf("only %d of %d subscribers follow the stream", following.Load(), subs)
		}
		if err == nil {
			err = b.seed(ctx, 1, 0)
		}
		if err != nil {
			f.stop()
			return nil, err
		}
		time.Sleep(50 * time.Millisecond)
	}
	return f, nil
}

// stop waits (at most 30 s) for the subscribers to receive the round's
// events, ends them, and returns their latencies and the events they
// missed.
func (f *followers) stop() ([]time.Duration, int) {
	select {
	case <-f.finished:
	case <-time.After(30 * time.Second):
	}
	f.cancel()
	<-f.finished
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lat, int(f.missed.Load())
}

// rawStream follows GET /v1/events?type=cell. as a subscriber that reads
// every frame without decoding it, as cheaply as a reader can: it counts
// the frames' event lines in what each read returns. It counts itself
// following at the first cell.ready frame and ends after claims cell.leased
// frames, or with ctx. It returns the cell.leased frames it read.
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
	ready, leased := []byte("\nevent: cell.ready\n"), []byte("\nevent: cell.leased\n")
	// A line a read cut in two is whole in the next read's buffer: the
	// last len(leased)-1 bytes are kept, too few to hold a cell.leased line
	// counted already.
	keep := len(leased) - 1
	buf := make([]byte, 64<<10)
	started, held := false, 0
	for {
		n, err := resp.Body.Read(buf[held:])
		data := buf[:held+n]
		if !started {
			if i := bytes.Index(data, ready); i >= 0 {
				started = true
				following.Add(1)
				data = data[i:]
			}
		}
		if started {
			if got += bytes.Count(data, leased); got >= claims {
				return claims
			}
		}
		if err != nil {
			return got
		}
		held = copy(buf, data[len(data)-min(keep, len(data)):])
	}
}
