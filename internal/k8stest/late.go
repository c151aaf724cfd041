package k8stest

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/sandboxwich/sandboxwich/driver"
)

// LateCreates returns a copy of cfg whose creates of resource (the last
// segment of the collection's path: "pods", "sandboxclaims") are held for
// hold before they are sent. A create whose caller gives up first is sent
// anyway, hold after it was made, and its answer thrown away: the way a
// request the API server took lands after the client hung up, which a real
// server does not do on cue.
func LateCreates(cfg *rest.Config, resource string, hold time.Duration) (*rest.Config, *Late) {
	l := &Late{hold: hold}
	c := rest.CopyConfig(cfg)
	c.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return lateCreates{rt, "/" + resource, l} }
	return c, l
}

// Late is the fault of a LateCreates config.
type Late struct {
	hold time.Duration
	n    atomic.Int32
	sent sync.WaitGroup
}

// Abandon has p, whose creates go through l, provision req with a 50 ms
// deadline (shorter than l's hold, so it gives up while its one create is
// in flight), destroys the cell, and returns once every create sent after
// its caller gave up has landed: the caller then checks that nothing of
// the cell is left.
func (l *Late) Abandon(t testing.TB, p driver.Provider, req driver.ProvisionRequest) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := p.Provision(ctx, req); err == nil {
		t.Fatalf("Provision within 50 ms succeeded through a create held for %v", l.hold)
	}
	if n := l.n.Load(); n != 1 {
		t.Fatalf("Provision sent %d creates, want 1", n)
	}
	dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
	defer dcancel()
	if err := p.Destroy(dctx, driver.Object{CellID: req.CellID}); err != nil {
		t.Fatalf("Destroy after the abandoned Provision: %v", err)
	}
	l.sent.Wait()
}

type lateCreates struct {
	rt     http.RoundTripper
	suffix string
	l      *Late
}

func (l lateCreates) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, l.suffix) {
		return l.rt.RoundTrip(r)
	}
	l.l.n.Add(1)
	// The body is read now: the caller may close it once it has given up.
	var body []byte
	if r.Body != nil {
		var err error
		body, err = io.ReadAll(r.Body)
		r.Body.Close()
		if err != nil {
			return nil, err
		}
	}
	with := func(r *http.Request) *http.Request {
		r.Body = io.NopCloser(bytes.NewReader(body))
		return r
	}
	select {
	case <-time.After(l.l.hold):
		return l.rt.RoundTrip(with(r.Clone(r.Context())))
	case <-r.Context().Done():
		late := with(r.Clone(context.WithoutCancel(r.Context())))
		l.l.sent.Go(func() {
			time.Sleep(l.l.hold)
			if res, err := l.rt.RoundTrip(late); err == nil {
				res.Body.Close()
			}
		})
		return nil, r.Context().Err()
	}
}
