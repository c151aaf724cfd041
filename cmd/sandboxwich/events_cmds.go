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
	"text/tabwriter"

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
	follow := f.fs.Bool("follow", false, "follow the stream until interrupted, reconnecting by itself (--json: one event per line)")
	count := f.fs.Int("count", 0, "with --follow: stop after this many events")
	if err := f.parse(args, false); err != nil {
		return err
	}
	if *follow {
		return followEvents(ctx, f, q, *count)
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

// followEvents prints each event as it comes, until ctx ends (an
// interrupt: exit 0) or count events were printed. --timeout bounds it
// only when given.
func followEvents(ctx context.Context, f *cliFlags, q client.EventQuery, count int) error {
	c, err := f.client()
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
