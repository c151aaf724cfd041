package reliability

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// DropProxy is a loopback HTTP proxy in front of one or more servers. It
// forwards every request to a backend (chosen at random), reads the whole
// answer, and then, for a chosen fraction of requests, discards it and
// closes the client's connection: the server has committed, the client
// never learns it. Clients then retry as they would after any lost
// response.
type DropProxy struct {
	URL string

	backends []string
	rate     float64
	hc       *http.Client
	srv      *http.Server
	ln       net.Listener

	mu  sync.Mutex
	rng *rand.Rand

	requests, dropped, status5xx, errors atomic.Int64
}

// NewDropProxy listens on a free loopback port and forwards to backends
// (base URLs), dropping answers with probability rate.
func NewDropProxy(backends []string, rate float64, seed uint64) (*DropProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	tr := &http.Transport{MaxIdleConns: 512, MaxIdleConnsPerHost: 256, IdleConnTimeout: 30 * time.Second}
	p := &DropProxy{URL: "http://" + ln.Addr().String(), backends: backends, rate: rate,
		hc: &http.Client{Transport: tr, Timeout: 60 * time.Second}, ln: ln, rng: rand.New(rand.NewPCG(seed, seed+1))}
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = p.srv.Serve(ln) }()
	return p, nil
}

// Close stops the proxy.
func (p *DropProxy) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = p.srv.Shutdown(ctx)
	p.hc.CloseIdleConnections()
}

// Stats returns the number of requests forwarded, answers dropped, 5xx
// answers from the servers, and requests the servers never answered.
func (p *DropProxy) Stats() (requests, dropped, status5xx, errs int64) {
	return p.requests.Load(), p.dropped.Load(), p.status5xx.Load(), p.errors.Load()
}

func (p *DropProxy) draw() (backend string, drop bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.backends[p.rng.IntN(len(p.backends))], p.rng.Float64() < p.rate
}

// hopHeaders are not forwarded.
var hopHeaders = map[string]bool{"Connection": true, "Keep-Alive": true, "Proxy-Connection": true,
	"Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true}

// ServeHTTP implements http.Handler.
func (p *DropProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.requests.Add(1)
	body, err := io.ReadAll(io.LimitReader(r.Body, 4<<20))
	if err != nil {
		p.errors.Add(1)
		http.Error(w, "proxy: read request", http.StatusBadGateway)
		return
	}
	backend, drop := p.draw()
	out, err := http.NewRequestWithContext(context.WithoutCancel(r.Context()), r.Method, backend+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		p.errors.Add(1)
		http.Error(w, "proxy: build request", http.StatusBadGateway)
		return
	}
	for k, v := range r.Header {
		if !hopHeaders[k] {
			out.Header[k] = v
		}
	}
	resp, err := p.hc.Do(out)
	if err != nil {
		// The server did not answer: close the connection, as a lost
		// answer would.
		p.errors.Add(1)
		hangUp(w)
		return
	}
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		p.errors.Add(1)
		hangUp(w)
		return
	}
	if resp.StatusCode >= 500 {
		p.status5xx.Add(1)
	}
	if drop {
		p.dropped.Add(1)
		hangUp(w)
		return
	}
	for k, v := range resp.Header {
		if !hopHeaders[k] {
			w.Header()[k] = v
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(data)
}

// hangUp closes the client's connection without an answer.
func hangUp(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic(http.ErrAbortHandler)
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0) // reset, like a crashed peer
	}
	_ = conn.Close()
}
