package client_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich/client"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/wire"
)

// dropAfter is a ResponseWriter that aborts its connection once it has
// written n events.
type dropAfter struct {
	http.ResponseWriter
	n int
}

func (d *dropAfter) Write(b []byte) (int, error) {
	// Frame by frame: the server may write several events at once.
	n := len(b)
	for len(b) > 0 {
		frame, rest, ok := bytes.Cut(b, []byte("\n\n"))
		if ok {
			frame = b[:len(frame)+2]
		}
		if bytes.Contains(frame, []byte("event: ")) {
			if d.n <= 0 {
				if f, ok := d.ResponseWriter.(http.Flusher); ok {
					f.Flush()
				}
				panic(http.ErrAbortHandler) // the connection drops mid-stream
			}
			d.n--
		}
		if _, err := d.ResponseWriter.Write(frame); err != nil {
			return 0, err
		}
		b = rest
		if !ok {
			break
		}
	}
	return n, nil
}

func (d *dropAfter) Unwrap() http.ResponseWriter { return d.ResponseWriter }

// onWrite is a ResponseWriter that calls f before each write.
type onWrite struct {
	http.ResponseWriter
	f func()
}

func (o *onWrite) Write(b []byte) (int, error) {
	o.f()
	return o.ResponseWriter.Write(b)
}

func (o *onWrite) Unwrap() http.ResponseWriter { return o.ResponseWriter }

// TestE2EEvents: polling, and a follow that resumes by itself, event by
// event, over connections the server drops after each event (and, once,
// with a 503): every event once, in order.
func TestE2EEvents(t *testing.T) {
	e := startE2E(t)
	ctx := context.Background()
	c := e.client(t, client.WithOperatorToken(operatorToken))
	for range 3 {
		e.addPoolCell(t)
		cl, err := c.Claim(ctx, e.claimRequest())
		if err != nil || cl.Empty() {
			t.Fatalf("Claim: %v", err)
		}
		if _, err := c.Release(ctx, cl.Lease.LeaseID, cl.Proof(), "destroyed"); err != nil {
			t.Fatal(err)
		}
	}
	var polled []wire.Event
	q := client.EventQuery{Limit: 4}
	for {
		page, err := c.PollEvents(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		polled = append(polled, page.Events...)
		if len(page.Events) < q.Limit {
			break
		}
		q.After = page.NextAfter
	}
	if len(polled) != 3*7 {
		t.Fatalf("polled %d events, want 21", len(polled))
	}

	var conns, failed atomic.Int32
	e.setWrap(func(real http.Handler, w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/events" {
			real.ServeHTTP(w, r)
			return
		}
		if conns.Add(1) == 3 && failed.Add(1) == 1 {
			http.Error(w, `{"ok":false,"code":"internal","message":"try again"}`, http.StatusServiceUnavailable)
			return
		}
		real.ServeHTTP(&dropAfter{ResponseWriter: w, n: 1}, r)
	})
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var got []string
	for ev, err := range c.Events(fctx, client.EventQuery{After: "0"}) {
		if err != nil {
			t.Fatalf("after %d events: %v", len(got), err)
		}
		got = append(got, ev.ID)
		if len(got) == len(polled) {
			break
		}
	}
	var want []string
	for _, ev := range polled {
		want = append(want, ev.ID)
	}
	if !slices.Equal(got, want) {
		t.Errorf("followed %v\nwant     %v", got, want)
	}
	if n := conns.Load(); n < int32(len(polled)) {
		t.Errorf("%d connections for %d events: the server did not drop them", n, len(polled))
	}

	// A follow without a position starts at the newest event, and resumes
	// there if dropped before any event.
	// The new cell is added once the server wrote the stream's first frame
	// (its position), not after a fixed sleep a loaded machine can outrun:
	// added before the follow had its position, the cell's event would be
	// the newest and never followed.
	positioned := make(chan struct{})
	var once sync.Once
	e.setWrap(func(real http.Handler, w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/events" {
			w = &onWrite{ResponseWriter: w, f: func() { once.Do(func() { close(positioned) }) }}
		}
		real.ServeHTTP(w, r)
	})
	newest := polled[len(polled)-1].ID
	fctx2, cancel2 := context.WithTimeout(ctx, 30*time.Second)
	defer cancel2()
	evs := c.Events(fctx2, client.EventQuery{Type: "cell.ready"})
	go func() {
		select {
		case <-positioned:
			e.addPoolCell(t)
		case <-fctx2.Done():
		}
	}()
	for ev, err := range evs {
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type != "cell.ready" || ev.ID <= newest && len(ev.ID) <= len(newest) {
			t.Errorf("a follow from the newest event yielded %+v (newest %s)", ev, newest)
		}
		break
	}

	// An after older than retention ends the follow with events_expired.
	if _, err := e.Store.PruneEvents(ctx, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	for _, err := range c.Events(ctx, client.EventQuery{After: "1"}) {
		if !errors.Is(err, errcode.ErrEventsExpired) {
			t.Errorf("follow after a pruned id: %v, want events_expired", err)
		}
		break
	}
	if _, err := c.PollEvents(ctx, client.EventQuery{After: "1"}); !errors.Is(err, errcode.ErrEventsExpired) {
		t.Errorf("poll after a pruned id: %v, want events_expired", err)
	}
}
