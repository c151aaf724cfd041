package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/wire"
)

// EventQuery selects events of the log (GET /v1/events, CONTRACT §16). A
// tenant token reads its tenant's cell and lease events; with the operator
// token, member events too.
type EventQuery struct {
	// After is the id of the last event processed. Empty: a poll starts at
	// the oldest event retained, a follow at the newest.
	After string
	// Type keeps events whose type starts with it ("cell.", "lease.").
	Type string
	// Pool keeps the events of one pool.
	Pool string
	// LeaseID, unless uuid.Nil, keeps the events of one lease.
	LeaseID uuid.UUID
	// Limit is the page size of PollEvents (default 100, at most 1000).
	Limit int
}

func (q EventQuery) query(poll bool) string {
	v := url.Values{}
	if poll {
		v.Set("format", "json")
		if q.Limit > 0 {
			v.Set("limit", strconv.Itoa(q.Limit))
		}
	}
	if q.After != "" {
		v.Set("after", q.After)
	}
	if q.Type != "" {
		v.Set("type", q.Type)
	}
	if q.Pool != "" {
		v.Set("pool", q.Pool)
	}
	if q.LeaseID != uuid.Nil {
		v.Set("lease_id", q.LeaseID.String())
	}
	if len(v) == 0 {
		return ""
	}
	return "?" + v.Encode()
}

// EventPage is one page of PollEvents.
type EventPage struct {
	Events []wire.Event
	// NextAfter is the After of the next poll.
	NextAfter string
}

// PollEvents reads one page of events after q.After
// (GET /v1/events?format=json). An After older than the log's retention is
// an *Error with code events_expired (errcode.ErrEventsExpired): resynchronise
// from state, then poll from the newest event. It retries like a read.
func (c *Client) PollEvents(ctx context.Context, q EventQuery) (EventPage, error) {
	var resp wire.EventsResponse
	if err := c.do(ctx, request{method: http.MethodGet, path: "/events" + q.query(true), retry: true}, &resp); err != nil {
		return EventPage{}, err
	}
	if resp.NextAfter == "" {
		return EventPage{}, errors.New("client: event page without next_after")
	}
	return EventPage{Events: resp.Events, NextAfter: resp.NextAfter}, nil
}

// Events follows the event log as a stream (GET /v1/events,
// text/event-stream) from q.After (the newest event when empty), yielding
// each event once, in order, until ctx ends or the loop breaks. A dropped
// connection, a server restart or a retryable answer (429, 5xx) is not an
// error: it reconnects, with backoff, after the last event it yielded
// (Last-Event-ID), so a consumer that processes each event before asking
// for the next never misses nor repeats one. An answer that no retry can
// change (401, 410 events_expired, 422) ends the iteration: it is yielded
// once, with a zero event; so is ctx's error.
func (c *Client) Events(ctx context.Context, q EventQuery) iter.Seq2[wire.Event, error] {
	return func(yield func(wire.Event, error) bool) {
		last := q.After
		failures := 0
		for {
			q.After = last
			got, err := c.followOnce(ctx, q, &last, yield)
			if errors.Is(err, errStopped) {
				return
			}
			if cerr := ctx.Err(); cerr != nil {
				yield(wire.Event{}, cerr)
				return
			}
			var apiErr *Error
			if errors.As(err, &apiErr) && !retryableStatus(apiErr) {
				yield(wire.Event{}, err)
				return
			}
			if got {
				failures = 0
			}
			failures++
			wait := c.backoff(failures)
			if apiErr != nil && apiErr.RetryAfter > 0 {
				wait = time.Duration(apiErr.RetryAfter) * time.Second
			}
			if serr := c.sleep(ctx, wait); serr != nil {
				yield(wire.Event{}, serr)
				return
			}
		}
	}
}

// errStopped: the consumer broke the loop.
var errStopped = errors.New("client: events: stopped")

// followOnce reads one connection of the stream, yielding its events and
// recording in last the id of each as it is yielded (and the position a
// stream without one starts at). It reports whether the connection
// delivered anything.
func (c *Client) followOnce(ctx context.Context, q EventQuery, last *string, yield func(wire.Event, error) bool) (bool, error) {
	r := request{method: http.MethodGet, path: "/events" + q.query(false), accept: "text/event-stream"}
	if q.After != "" {
		r.header = http.Header{wire.LastEventIDHeader: {q.After}}
	}
	resp, _, _, err := c.open(ctx, r, nil, "")
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "text/event-stream" {
		return false, fmt.Errorf("client: events: the server answered %q, not an event stream", mt)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), MaxResponseBytes)
	var id, event string
	var data []byte
	hasData, got := false, false
	for sc.Scan() {
		line := strings.TrimSuffix(sc.Text(), "\r")
		if line != "" {
			field, value, _ := strings.Cut(line, ":")
			value = strings.TrimPrefix(value, " ")
			switch field {
			case "id":
				id = value
			case "event":
				event = value
			case "data":
				if hasData {
					data = append(data, '\n')
				}
				data, hasData = append(data, value...), true
			}
			continue
		}
		name, payload, dispatch, evID := event, data, hasData, id
		event, data, hasData, id = "", nil, false, ""
		got = true
		if !dispatch {
			if evID != "" && *last == "" {
				*last = evID // where a stream without a position started
			}
			continue
		}
		if name == wire.EventError {
			var e wire.StreamError
			if err := json.Unmarshal(payload, &e); err != nil || e.Code == "" {
				return got, fmt.Errorf("client: events: an error event without a code: %s", payload)
			}
			code := errcode.Code(e.Code)
			return got, &Error{Status: code.HTTPStatus(), Code: code, Message: e.Message, RequestID: resp.Header.Get("X-Request-Id")}
		}
		var ev wire.Event
		if err := json.Unmarshal(payload, &ev); err != nil || ev.ID == "" || ev.ID != evID {
			return got, fmt.Errorf("client: events: a malformed %s event (id %q): %s", name, evID, payload)
		}
		if !yield(ev, nil) {
			return got, errStopped
		}
		*last = ev.ID
	}
	return got, sc.Err()
}
