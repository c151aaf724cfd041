package httpapi

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/wire"
)

// The event log (CONTRACT §16): GET /v1/events as an event stream, or
// polled with ?format=json.

// DefaultEventPoll is the default of Config.EventPoll.
const DefaultEventPoll = 100 * time.Millisecond

// eventsQuery is a parsed GET /v1/events.
type eventsQuery struct {
	json     bool
	after    uint64
	hasAfter bool
	limit    int
	q        sandboxwich.EventQuery
}

// eventsQueryOf reads the query parameters (each at most once, never
// empty) and, for a stream, the Last-Event-ID header, which wins over
// ?after=: a browser's EventSource reconnects to the URL it started with,
// sending the last id it received.
func eventsQueryOf(r *http.Request) (eventsQuery, error) {
	var eq eventsQuery
	get, err := queryParams(r.URL.RawQuery)
	if err != nil {
		return eq, err
	}
	if v, ok, err := get("format"); err != nil {
		return eq, err
	} else if ok {
		if v != "json" {
			return eq, invalid("format must be json (or absent, for an event stream)")
		}
		eq.json = true
	}
	parseID := func(what, v string) (uint64, error) {
		n, err := strconv.ParseUint(v, 10, 63)
		if err != nil {
			return 0, invalid(what + " must be an event id (a decimal integer)")
		}
		return n, nil
	}
	if v, ok, err := get("after"); err != nil {
		return eq, err
	} else if ok {
		if eq.after, err = parseID("after", v); err != nil {
			return eq, err
		}
		eq.hasAfter = true
	}
	if v := r.Header.Get(wire.LastEventIDHeader); v != "" && !eq.json {
		if eq.after, err = parseID(wire.LastEventIDHeader, v); err != nil {
			return eq, err
		}
		eq.hasAfter = true
	}
	eq.limit = wire.DefaultEventLimit
	if v, ok, err := get("limit"); err != nil {
		return eq, err
	} else if ok {
		n, perr := strconv.ParseUint(v, 10, 16)
		if perr != nil || n < 1 || n > wire.MaxEventLimit || !eq.json {
			return eq, invalid("limit must be an integer from 1 to " + strconv.Itoa(wire.MaxEventLimit) + ", with format=json")
		}
		eq.limit = int(n)
	}
	if v, ok, err := get("type"); err != nil {
		return eq, err
	} else if ok {
		if !validTypePrefix(v) {
			return eq, invalid("type must be an event type or its prefix (cell., member., lease.…)")
		}
		eq.q.TypePrefix = v
	}
	if v, ok, err := get("pool"); err != nil {
		return eq, err
	} else if ok {
		if len(v) > 128 {
			return eq, invalid("pool must be a pool name")
		}
		eq.q.Pool = v
	}
	if v, ok, err := get("lease_id"); err != nil {
		return eq, err
	} else if ok {
		id, perr := uuid.Parse(v)
		if perr != nil || id == uuid.Nil {
			return eq, invalid("lease_id must be a UUID")
		}
		eq.q.LeaseID = id
	}
	return eq, nil
}

// validTypePrefix accepts lowercase letters, '_' and '.', at most 64.
func validTypePrefix(v string) bool {
	if len(v) > 64 {
		return false
	}
	for _, c := range []byte(v) {
		if (c < 'a' || c > 'z') && c != '_' && c != '.' {
			return false
		}
	}
	return true
}

// page reads the events after after that q selects, at most limit, and
// where the next read starts. When the page is not full, that is the
// newest id of the log read before the page: ids commit in order (see
// Plane.Events), so the page holds every selected event up to it,
// and a reader of a tenant whose events are rare does not scan the
// others' again.
func (h *handler) page(ctx context.Context, q sandboxwich.EventQuery, after uint64, oldest bool, limit int) ([]sandboxwich.Event, uint64, error) {
	head, err := h.plane.LastEventID(ctx)
	if err != nil {
		return nil, 0, err
	}
	q.After, q.Oldest, q.Limit = after, oldest, limit
	evs, err := h.plane.Events(ctx, q)
	if err != nil {
		return nil, 0, err
	}
	next := after
	if len(evs) > 0 {
		next = evs[len(evs)-1].ID
	}
	if len(evs) < limit && head > next {
		next = head
	}
	return evs, next, nil
}

// events serves GET /v1/events: the tenant's cell and lease events, and
// with the operator header its member events too (CONTRACT §16, §10.1).
func (h *handler) events(c *call, w http.ResponseWriter) {
	eq, err := eventsQueryOf(c.r)
	if err != nil {
		h.writeError(w, c.r, err)
		return
	}
	eq.q.TenantID = c.p.tenant
	eq.q.Members = c.p.kind == kindOperator
	if eq.json {
		h.pollEvents(c, w, eq)
		return
	}
	h.streamEvents(c, w, eq)
}

func (h *handler) pollEvents(c *call, w http.ResponseWriter, eq eventsQuery) {
	evs, next, err := h.page(c.ctx(), eq.q, eq.after, !eq.hasAfter, eq.limit)
	if err != nil {
		h.writeError(w, c.r, err)
		return
	}
	resp := wire.EventsResponse{OK: true, Events: make([]wire.Event, 0, len(evs)), NextAfter: strconv.FormatUint(next, 10)}
	for _, e := range evs {
		resp.Events = append(resp.Events, wire.LogEvent(e).Wire())
	}
	rep, err := jsonReply(http.StatusOK, resp)
	if err != nil {
		h.writeError(w, c.r, err)
		return
	}
	h.write(w, rep)
}

// streamEvents follows the log: a stream without a position starts at its
// newest event. The first read happens before the stream is committed, so
// an after older than retention is an ordinary 410.
func (h *handler) streamEvents(c *call, w http.ResponseWriter, eq eventsQuery) {
	ctx := c.ctx()
	cursor := eq.after
	if !eq.hasAfter {
		head, err := h.plane.LastEventID(ctx)
		if err != nil {
			h.writeError(w, c.r, err)
			return
		}
		cursor = head
	}
	defer h.hub.subscribe()()
	// A stream outlives the server's write timeout, which bounds the
	// other answers.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Time{})
	var s *eventStream
	defer func() {
		if s != nil {
			s.stop()
		}
	}()
	const batch = 500
	for {
		wake := h.hub.changed(cursor)
		// The hub's copy of the log's tail serves a stream that is not
		// behind it; one behind it reads the store.
		frames, next, fromHub := h.hub.since(cursor, eq.q)
		var evs []sandboxwich.Event
		var err error
		if !fromHub {
			evs, next, err = h.page(ctx, eq.q, cursor, false, batch)
		}
		switch {
		case err != nil && s == nil:
			h.writeError(w, c.r, err)
			return
		case err != nil:
			if ctx.Err() == nil {
				_, code, msg := h.wireError(c.r, err)
				_ = s.send(wire.EventError, wire.StreamError{Code: string(code), Message: msg})
			}
			return
		case s == nil:
			s = newEventStream(w, h.keepAlive)
			// A stream without a position first tells the client where it
			// started (an id field alone sets an EventSource's last event
			// ID without dispatching an event), so that a reconnect before
			// any event resumes there.
			if err := s.writeLines(fmt.Sprintf("id: %d\n\n", cursor), !eq.hasAfter); err != nil {
				return
			}
		}
		for _, e := range evs {
			f, err := frameOf(e)
			if err != nil {
				return
			}
			frames = append(frames, f)
		}
		if err := s.sendFrames(frames); err != nil {
			return
		}
		cursor = next
		if !fromHub && len(evs) == batch {
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-h.streamsDone:
			return
		case <-wake:
		}
	}
}

// eventHub keeps, for the streams of one handler, a copy of the log's
// tail: while any stream is open, one goroutine reads the events after the
// last it holds every interval — one query however many streams — and wakes
// the streams, which filter the copy for themselves (the first to send an
// event renders its frame for all).
// Its copy holds every event in (start, end]: the store hands out events in
// commit order (Plane.Events), so a read after end misses none. A
// stream whose cursor is below start reads the store instead.
type eventHub struct {
	plane    eventSource
	interval time.Duration

	mu      sync.Mutex
	init    bool
	start   uint64
	end     uint64
	tail    []hubEvent
	grown   chan struct{} // closed when end grows, then replaced
	subs    int
	running bool
}

// eventSource is what the hub reads.
type eventSource interface {
	Events(ctx context.Context, q sandboxwich.EventQuery) ([]sandboxwich.Event, error)
	LastEventID(ctx context.Context) (uint64, error)
}

// hubEvent is an event of the hub's copy: what streams filter it by, and
// its frame once a stream has sent it.
type hubEvent struct {
	e     sandboxwich.Event
	frame []byte
}

// frameOf renders an event as the frame a stream sends: its id, type and
// wire JSON (one line: JSON has no raw newline). The hub renders each
// event once, however many streams send it.
func frameOf(e sandboxwich.Event) ([]byte, error) {
	data, err := json.Marshal(wire.LogEvent(e).Wire())
	if err != nil {
		return nil, err
	}
	return fmt.Appendf(make([]byte, 0, len(data)+64), "id: %d\nevent: %s\ndata: %s\n\n", e.ID, e.Type, data), nil
}

// hubTail is the least the hub's copy holds once it is full; it holds
// at most twice that. A stream that keeps up is at most a poll or two
// behind the copy's end (about 700 events a poll at 7,000 claims a
// second); one further behind reads the store. An event costs the copy
// about 0.8 KiB with its frame, and a larger copy slows the claims a
// server takes while it streams: 8,192 gave the fan-out bench's F about
// 0.02–0.03 less than 2,048, at the same delivery latency
// (docs/performance-history.md).
const hubTail = 2048

func newEventHub(src eventSource, interval time.Duration) *eventHub {
	return &eventHub{plane: src, interval: interval, grown: make(chan struct{})}
}

// subscribe counts a stream, starting the poller if needed; the returned
// function uncounts it.
func (hb *eventHub) subscribe() func() {
	hb.mu.Lock()
	hb.subs++
	if !hb.running {
		hb.running = true
		go hb.poll()
	}
	hb.mu.Unlock()
	return func() {
		hb.mu.Lock()
		hb.subs--
		hb.mu.Unlock()
	}
}

// changed returns a channel that is closed once the hub holds events
// after after (already closed if it does).
func (hb *eventHub) changed(after uint64) <-chan struct{} {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	if hb.init && hb.end > after {
		c := make(chan struct{})
		close(c)
		return c
	}
	return hb.grown
}

// since returns the frames of the copy's events after cursor that q
// selects, and end, where the stream's next read starts; false when the
// copy does not reach back to cursor. An event's frame is rendered once,
// by the first stream that sends it: a stream of cell events does not pay
// for the member events it skips.
func (hb *eventHub) since(cursor uint64, q sandboxwich.EventQuery) ([][]byte, uint64, bool) {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	if !hb.init || cursor < hb.start {
		return nil, 0, false
	}
	i, _ := slices.BinarySearchFunc(hb.tail, cursor+1, func(e hubEvent, id uint64) int { return cmp.Compare(e.e.ID, id) })
	var out [][]byte
	for j := range hb.tail[i:] {
		e := &hb.tail[i+j]
		if !matches(q, e.e) {
			continue
		}
		if e.frame == nil { // the first stream to send it renders it
			f, err := frameOf(e.e)
			if err != nil {
				return nil, 0, false // the stream's own read meets the error
			}
			e.frame = f
		}
		if out == nil {
			out = make([][]byte, 0, len(hb.tail)-i-j)
		}
		out = append(out, e.frame)
	}
	return out, max(hb.end, cursor), true
}

// matches is the selection of Plane.Events, on one event.
func matches(q sandboxwich.EventQuery, e sandboxwich.Event) bool {
	switch {
	case q.TenantID != "" && e.TenantID != q.TenantID,
		!q.Members && strings.HasPrefix(e.Type, "member."),
		q.TypePrefix != "" && !strings.HasPrefix(e.Type, q.TypePrefix),
		q.Pool != "" && e.Pool != q.Pool,
		q.LeaseID != uuid.Nil && e.LeaseID != q.LeaseID:
		return false
	}
	return true
}

func (hb *eventHub) poll() {
	t := time.NewTicker(hb.interval)
	defer t.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*hb.interval+time.Second)
		hb.read(ctx)
		cancel()
		hb.mu.Lock()
		if hb.subs == 0 {
			hb.running = false
			hb.mu.Unlock()
			return
		}
		hb.mu.Unlock()
		<-t.C
	}
}

// read brings the copy up to the log's end.
func (hb *eventHub) read(ctx context.Context) {
	hb.mu.Lock()
	init, end := hb.init, hb.end
	hb.mu.Unlock()
	if !init {
		head, err := hb.plane.LastEventID(ctx)
		if err != nil {
			return
		}
		hb.mu.Lock()
		hb.init, hb.start, hb.end, hb.tail = true, head, head, nil
		close(hb.grown)
		hb.grown = make(chan struct{})
		hb.mu.Unlock()
		return
	}
	for {
		evs, err := hb.plane.Events(ctx, sandboxwich.EventQuery{After: end, Members: true, Limit: 1000})
		if err != nil {
			if errcode.CodeOf(err) == errcode.EventsExpired {
				hb.mu.Lock()
				hb.init = false // behind retention: start again at the end
				hb.mu.Unlock()
			}
			return
		}
		if len(evs) == 0 {
			return
		}
		end = evs[len(evs)-1].ID
		hb.mu.Lock()
		for _, e := range evs {
			hb.tail = append(hb.tail, hubEvent{e: e})
		}
		// The copy keeps hubTail to 2×hubTail events: trimming at twice
		// the bound copies each event once, where trimming to it at every
		// read copied the whole copy.
		if drop := len(hb.tail) - hubTail; len(hb.tail) > 2*hubTail {
			hb.start = hb.tail[drop-1].e.ID
			hb.tail = slices.Clone(hb.tail[drop:])
		}
		hb.end = end
		close(hb.grown)
		hb.grown = make(chan struct{})
		hb.mu.Unlock()
		if len(evs) < 1000 {
			return
		}
	}
}

// sendFrames writes rendered frames (frameOf), with one flush.
func (s *eventStream) sendFrames(frames [][]byte) error {
	if len(frames) == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.write(frames...)
}

// writeLines commits the stream and, if send, writes the raw lines.
func (s *eventStream) writeLines(lines string, send bool) error {
	if !send {
		return s.commit()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.write([]byte(lines))
}

// webhookDeliveries serves GET /v1/webhooks/deliveries (operator): the
// webhook deliveries of the operator's tenant, by event id, filtered by
// status (CONTRACT §16: failed ones are how an operator sees what was not
// delivered).
func (h *handler) webhookDeliveries(c *call) (int, any, error) {
	vals, err := url.ParseQuery(c.r.URL.RawQuery)
	if err != nil {
		return 0, nil, malformed("the query string is malformed")
	}
	q := sandboxwich.DeliveryQuery{TenantID: c.p.tenant, Limit: wire.DefaultEventLimit}
	for name, vs := range vals {
		if len(vs) != 1 || vs[0] == "" {
			return 0, nil, invalid(name + " must be given once and not be empty")
		}
		v := vs[0]
		switch name {
		case "status":
			q.Status = sandboxwich.DeliveryStatus(v)
			if q.Status != sandboxwich.DeliveryPending && q.Status != sandboxwich.DeliveryDelivered && q.Status != sandboxwich.DeliveryFailed {
				return 0, nil, invalid("status must be pending, delivered or failed")
			}
		case "after":
			if q.After, err = strconv.ParseUint(v, 10, 63); err != nil {
				return 0, nil, invalid("after must be an event id")
			}
		case "limit":
			n, err := strconv.ParseUint(v, 10, 16)
			if err != nil || n < 1 || n > wire.MaxEventLimit {
				return 0, nil, invalid("limit must be an integer from 1 to " + strconv.Itoa(wire.MaxEventLimit))
			}
			q.Limit = int(n)
		}
	}
	ds, err := h.plane.Deliveries(c.ctx(), q)
	if err != nil {
		return 0, nil, err
	}
	resp := wire.DeliveriesResponse{OK: true, Deliveries: make([]wire.WebhookDelivery, 0, len(ds)), NextAfter: strconv.FormatUint(q.After, 10)}
	for _, d := range ds {
		w := wire.WebhookDelivery{Endpoint: d.Endpoint, EventID: strconv.FormatUint(d.EventID, 10), Status: string(d.Status),
			Attempts: d.Attempts, LastStatus: d.LastStatus, LastError: d.LastError,
			CreatedAt: wire.Time{Time: d.CreatedAt}, UpdatedAt: wire.Time{Time: d.UpdatedAt}}
		if d.Status == sandboxwich.DeliveryPending {
			w.NextAt = &wire.Time{Time: d.NextAt}
		}
		resp.Deliveries = append(resp.Deliveries, w)
		resp.NextAfter = w.EventID
	}
	return http.StatusOK, resp, nil
}
