package k8stest

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/rest"
)

// LateCreates returns a copy of cfg whose creates of resource (the last
// segment of the collection's path: "pods", "sandboxclaims") are held for
// hold before they are sent. A create whose caller gives up first is sent
// anyway, hold after it was made, and its answer thrown away: the way a
// request the API server took lands after the client hung up, which a real
// server does not do on cue.
func LateCreates(cfg *rest.Config, resource string, hold time.Duration) (*rest.Config, *Late) {
	l := &Late{}
	c := rest.CopyConfig(cfg)
	c.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return lateCreates{rt, "/" + resource, hold, l} }
	return c, l
}

// Late counts the creates of a LateCreates config and waits for those
// sent after their caller gave up.
type Late struct {
	n    atomic.Int32
	sent sync.WaitGroup
}

// Creates is the number of creates made.
func (l *Late) Creates() int { return int(l.n.Load()) }

// Wait returns once every create sent after its caller gave up has been
// answered.
func (l *Late) Wait() { l.sent.Wait() }

type lateCreates struct {
	rt     http.RoundTripper
	suffix string
	hold   time.Duration
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
	case <-time.After(l.hold):
		return l.rt.RoundTrip(with(r.Clone(r.Context())))
	case <-r.Context().Done():
		late := with(r.Clone(context.WithoutCancel(r.Context())))
		l.l.sent.Go(func() {
			time.Sleep(l.hold)
			if res, err := l.rt.RoundTrip(late); err == nil {
				res.Body.Close()
			}
		})
		return nil, r.Context().Err()
	}
}
