package main

// The events command: the tenant's event log (CONTRACT §16), polled page
// by page up to its newest event, or followed (--follow) until interrupted.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/client"
	"github.com/sandboxwich/sandboxwich/wire"
)

func cliEvents(ctx context.Context, e env, args []string) error {
	f := newCLIFlags(e, "events")
	var q client.EventQuery
	f.fs.StringVar(&q.After, "after", "", "the id of the last event processed (default: the oldest retained; with --follow, the newest)")
	f.fs.StringVar(&q.Type, "type", "", "only events whose type starts with this (cell., lease., member. with the operator token)")
	f.fs.StringVar(&q.Pool, "pool", "", "only events of this pool")
	f.fs.Func("lease-id", "only events of this lease", func(v string) error {
		id, err := uuid.Parse(v)
		if err != nil {
			return errors.New("must be a UUID")
		}
		q.LeaseID = id
		return nil
	})
	f.fs.IntVar(&q.Limit, "limit", 0, "events per page, 1 to 1000 (server default 100)")
	follow := f.fs.Bool("follow", false, "follow the stream until interrupted, reconnecting by itself with back-off (--json: one event per line)")
	count := f.fs.Int("count", 0, "with --follow: stop after this many events")
	giveUp := f.fs.Duration("give-up-after", defaultGiveUpAfter, "with --follow: exit 1 once the server has been unreachable this long (0: never give up)")
	if err := f.parse(args, false); err != nil {
		return err
	}
	if *giveUp < 0 {
		return fmt.Errorf("%w: --give-up-after must not be negative", errUsage)
	}
	if *follow {
		return followEvents(ctx, f, q, *count, *giveUp)
	}
	page, err := call(ctx, f, func(ctx context.Context, c *client.Client) (client.EventPage, error) {
		var out client.EventPage
		for {
			p, err := c.PollEvents(ctx, q)
			if err != nil {
				return out, err
			}
			out.Events, out.NextAfter = append(out.Events, p.Events...), p.NextAfter
			if len(p.Events) == 0 || p.NextAfter == q.After {
				return out, nil
			}
			q.After = p.NextAfter
		}
	})
	if err != nil {
		return err
	}
	if f.json {
		resp := wire.EventsResponse{OK: true, Events: page.Events, NextAfter: page.NextAfter}
		if resp.Events == nil {
			resp.Events = []wire.Event{}
		}
		return cliJSON(e.stdout, resp)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTYPE\tAT\tCELL_ID\tLEASE_ID\tFROM\tTO\tREASON")
	for _, ev := range page.Events {
		printEvent(tw, ev)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(e.stderr, "sandboxwich events: next: --after %s\n", page.NextAfter)
	return nil
}

// Reconnection of events --follow: the back-off doubles from
// followRetryBase up to followRetryMax (full jitter), and the command gives
// up after defaultGiveUpAfter of failures unless --give-up-after says
// otherwise.
const (
	followRetryBase    = 250 * time.Millisecond
	followRetryMax     = 15 * time.Second
	defaultGiveUpAfter = 5 * time.Minute
)

// errGaveUp ends a follow whose server stayed unreachable for
// --give-up-after.
var errGaveUp = errors.New("the server stayed unreachable")

// followWatch is the transport of events --follow: it sees every
// (re)connection, says on stderr when the server stops answering and when
// it answers again, and cancels the follow with errGaveUp once the server
// has been unreachable for giveUp (0: never).
type followWatch struct {
	next   http.RoundTripper
	stderr io.Writer
	server string
	giveUp time.Duration
	cancel context.CancelCauseFunc

	mu      sync.Mutex
	failing bool
	timer   *time.Timer
}

func (w *followWatch) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := w.next.RoundTrip(req)
	switch {
	case err != nil:
		if req.Context().Err() == nil {
			w.failed(err.Error())
		}
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		w.failed(resp.Status)
	default:
		w.answered()
	}
	return resp, err
}

func (w *followWatch) failed(why string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.failing {
		return
	}
	w.failing = true
	bound := "until interrupted"
	if w.giveUp > 0 {
		bound = "giving up after " + w.giveUp.String() + " (--give-up-after)"
		w.timer = time.AfterFunc(w.giveUp, func() { w.cancel(errGaveUp) })
	}
	fmt.Fprintf(w.stderr, "sandboxwich events: the server at %s does not answer (%s); reconnecting with back-off, %s\n", w.server, why, bound)
}

func (w *followWatch) answered() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.failing {
		return
	}
	w.failing = false
	if w.timer != nil {
		w.timer.Stop()
		w.timer = nil
	}
	fmt.Fprintf(w.stderr, "sandboxwich events: reconnected to %s\n", w.server)
}

// followEvents prints each event as it comes, until ctx ends (an
// interrupt: exit 0) or count events were printed. --timeout bounds it
// only when given. A server that stops answering is reported on stderr,
// retried with back-off, and given up (an error) after giveUp.
func followEvents(ctx context.Context, f *cliFlags, q client.EventQuery, count int, giveUp time.Duration) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	watch := &followWatch{stderr: f.e.stderr, server: f.server, giveUp: giveUp, cancel: cancel}
	defer func() {
		watch.mu.Lock()
		if watch.timer != nil {
			watch.timer.Stop()
		}
		watch.mu.Unlock()
	}()
	c, err := f.clientWith(func(next http.RoundTripper) http.RoundTripper { watch.next = next; return watch },
		client.WithRetry(client.DefaultMaxAttempts, followRetryBase, followRetryMax))
	if err != nil {
		return err
	}
	timed := false
	f.fs.Visit(func(fl *flag.Flag) { timed = timed || fl.Name == "timeout" })
	if timed && f.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, f.timeout)
		defer cancel()
	}
	n := 0
	for ev, err := range c.Events(ctx, q) {
		if err != nil {
			if errors.Is(context.Cause(ctx), errGaveUp) {
				return fmt.Errorf("%w for %s; giving up (--give-up-after)", errGaveUp, giveUp)
			}
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if err := writeEvent(f.e.stdout, f.json, ev); err != nil {
			return err
		}
		if n++; count > 0 && n >= count {
			return nil
		}
	}
	return nil
}

func writeEvent(w io.Writer, asJSON bool, ev wire.Event) error {
	if asJSON {
		b, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	printEvent(tw, ev)
	return tw.Flush()
}

func printEvent(w io.Writer, ev wire.Event) {
	or := func(s *string) string {
		if s == nil {
			return "-"
		}
		return *s
	}
	lid := "-"
	if ev.LeaseID != nil {
		lid = ev.LeaseID.String()
	}
	fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", ev.ID, ev.Type, cliTime(ev.At), ev.CellID, lid, or(ev.From), or(ev.To), or(ev.Reason))
}
