package httpapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/internal/testenv"
	"github.com/sandboxwich/sandboxwich/internal/testpg"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
	"github.com/sandboxwich/sandboxwich/store/postgres"
	"github.com/sandboxwich/sandboxwich/wire"
)

// pollEvents reads one page of GET /v1/events?format=json.
func (e *env) pollEvents(token, query string, hdr ...string) wire.EventsResponse {
	e.t.Helper()
	r := e.do("GET", "/v1/events?format=json"+query, token, nil, hdr...).must(e.t, 200)
	checkSchema(e.t, "EventsResponse", r.body)
	return decodeAs[wire.EventsResponse](e.t, r)
}

func eventTypes(evs []wire.Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.Type
	}
	return out
}

// TestEventsPoll: polling pages, scopes, filters and bad input.
func TestEventsPoll(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b)
		pc := e.poolCell("acme", lease.KataMicroVM)
		c := e.claim(tokAcme, nil, lease.KataMicroVM)
		if c.Lease == nil || c.Lease.CellID != pc {
			t.Fatalf("claim leased %+v, want the pool cell %s", c.Lease, pc)
		}
		e.do("POST", leasePath(c.Lease.LeaseID, "/release"), tokAcme, with(proofBody(c), "disposition", "destroyed")).must(t, 202)
		e.prepare(worker3, tokWorker3, lease.KataMicroVM)

		tenant := e.pollEvents(tokAcme, "")
		want := "cell.ready cell.leased lease.released"
		if got := strings.Join(eventTypes(tenant.Events), " "); got != want {
			t.Errorf("acme's events: %s, want %s", got, want)
		}
		op := e.pollEvents(tokAcme, "", wire.OperatorHeader, tokOperator)
		want = "member.provisioning cell.ready member.ready cell.leased member.leased member.stopping lease.released"
		if got := strings.Join(eventTypes(op.Events), " "); got != want {
			t.Errorf("acme's operator's events: %s, want %s", got, want)
		}
		if g := e.pollEvents(tokGlobex, ""); len(g.Events) != 1 || g.Events[0].TenantID != "globex" {
			t.Errorf("globex's events: %+v, want its one cell.ready", g.Events)
		}
		for _, ev := range op.Events {
			if ev.TenantID != "acme" || ev.CellID != pc || ev.Pool == nil || *ev.Pool != "p1" {
				t.Errorf("event %+v: not of acme's pool cell", ev)
			}
		}
		leased := op.Events[3]
		if leased.LeaseID == nil || *leased.LeaseID != c.Lease.LeaseID || leased.Reason == nil || *leased.Reason != "claimed" ||
			leased.From == nil || *leased.From != "ready" || leased.Generation == nil || *leased.Generation != 2 || leased.MemberID != nil {
			t.Errorf("cell.leased = %+v", leased)
		}

		// Pages: next_after continues; the last page's passes nothing.
		p1 := e.pollEvents(tokAcme, "&limit=2", wire.OperatorHeader, tokOperator)
		if len(p1.Events) != 2 || p1.NextAfter != p1.Events[1].ID {
			t.Fatalf("page 1: %+v", p1)
		}
		p2 := e.pollEvents(tokAcme, "&limit=1000&after="+p1.NextAfter, wire.OperatorHeader, tokOperator)
		if len(p2.Events) != 5 || p2.Events[0].ID == p1.Events[1].ID {
			t.Fatalf("page 2: %v", eventTypes(p2.Events))
		}
		empty := e.pollEvents(tokAcme, "&after="+p2.NextAfter)
		if len(empty.Events) != 0 || empty.NextAfter != p2.NextAfter && empty.NextAfter < p2.NextAfter {
			t.Errorf("after the last page: %+v", empty)
		}
		// A tenant's page that is not full may pass others' events.
		g := e.pollEvents(tokGlobex, "")
		last, _ := strconv.ParseUint(g.Events[0].ID, 10, 64)
		if next, _ := strconv.ParseUint(g.NextAfter, 10, 64); next < last {
			t.Errorf("globex next_after %d, before its own event %d", next, last)
		}

		// Filters.
		if f := e.pollEvents(tokAcme, "&type=lease."); strings.Join(eventTypes(f.Events), " ") != "lease.released" {
			t.Errorf("type=lease.: %v", eventTypes(f.Events))
		}
		if f := e.pollEvents(tokAcme, "&pool=p2"); len(f.Events) != 0 {
			t.Errorf("pool=p2: %v", eventTypes(f.Events))
		}
		if f := e.pollEvents(tokAcme, "&lease_id="+c.Lease.LeaseID.String(), wire.OperatorHeader, tokOperator); len(f.Events) != 4 {
			t.Errorf("lease_id: %v, want its 4 events", eventTypes(f.Events))
		}

		for _, q := range []string{"format=xml", "format=json&after=x", "format=json&after=-1", "format=json&limit=0",
			"format=json&limit=1001", "limit=5", "format=json&type=CELL", "format=json&lease_id=nope",
			"format=json&pool=", "format=json&after=1&after=2"} {
			e.do("GET", "/v1/events?"+q, tokAcme, nil).errCode(t, 422, "invalid_request")
		}
		e.do("GET", "/v1/events?format=json", tokAcme, nil, idemHeader, "k1").errCode(t, 400, "invalid_idempotency_key")
		e.do("GET", "/v1/events?format=json", "", nil).errCode(t, 401, "unauthorized")

		// Pruned: an after older than retention is 410.
		if _, err := e.st.PruneEvents(context.Background(), time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		e.do("GET", "/v1/events?format=json&after=1", tokAcme, nil).errCode(t, 410, "events_expired")
		e.do("GET", "/v1/events?after=1", tokAcme, nil).errCode(t, 410, "events_expired")
		if kept := e.pollEvents(tokGlobex, ""); len(kept.Events) != 1 {
			t.Errorf("after pruning, the newest event stays: %v", eventTypes(kept.Events))
		}

		var all strings.Builder
		for _, r := range []wire.EventsResponse{tenant, op, p1, p2} {
			b, _ := json.Marshal(r)
			all.Write(b)
		}
		secrets := append(allSecrets, *c.LeaseAttestation, attest.Digest(*c.LeaseAttestation),
			e.release(lease.KataMicroVM).Signature, e.release(lease.KataMicroVM).PolicyDigest)
		mustNotContain(t, "event bodies", all.String(), secrets...)
		mustNotContain(t, "the server's log", e.logs.String(), secrets...)
	})
}

// logEvent is one event of a stream as read.
type logEvent struct {
	id, event, data string
	comment         bool
}

// openStream opens GET /v1/events as an event stream and returns its
// events on a channel, closed when the stream ends; cancel ends it.
func (e *env) openStream(query, token string, hdr ...string) (<-chan logEvent, *http.Response, context.CancelFunc) {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "GET", e.srv.URL+"/v1/events"+query, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Accept", "text/event-stream")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := e.srv.Client().Do(req)
	if err != nil {
		cancel()
		e.t.Fatal(err)
	}
	ch := make(chan logEvent, 64)
	go func() {
		defer close(ch)
		defer res.Body.Close()
		sc := bufio.NewScanner(res.Body)
		var cur logEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if cur != (logEvent{}) {
					ch <- cur
				}
				cur = logEvent{}
			case strings.HasPrefix(line, ":"):
				cur.comment = true
			case strings.HasPrefix(line, "id: "):
				cur.id = strings.TrimPrefix(line, "id: ")
			case strings.HasPrefix(line, "event: "):
				cur.event = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				cur.data = strings.TrimPrefix(line, "data: ")
			}
		}
	}()
	e.t.Cleanup(cancel)
	return ch, res, cancel
}

// next returns the next event of a stream that is not a comment.
func next(t *testing.T, ch <-chan logEvent) logEvent {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatal("the stream ended")
			}
			if !ev.comment && ev.event != "" {
				return ev
			}
		case <-timeout:
			t.Fatal("no event within 10 s")
		}
	}
}

func last(t *testing.T, e *env) string {
	t.Helper()
	id, err := e.plane.LastEventID(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return strconv.FormatUint(id, 10)
}

// TestEventsStream: follow, keep-alive, resume by Last-Event-ID and by
// after, and a stream without a position starting at the newest event.
func TestEventsStream(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b, func(c *Config) { c.StreamKeepAlive = 50 * time.Millisecond; c.EventPoll = 10 * time.Millisecond })
		e.prepare(worker1, tokWorker1, lease.KataMicroVM)

		ch, res, cancel := e.openStream("?after=0", tokAcme)
		if ct := res.Header.Get("Content-Type"); res.StatusCode != 200 || ct != "text/event-stream" {
			t.Fatalf("stream: %d %s", res.StatusCode, ct)
		}
		first := next(t, ch)
		if first.event != "cell.ready" || first.id == "" {
			t.Fatalf("first event %+v", first)
		}
		var ev wire.Event
		if err := json.Unmarshal([]byte(first.data), &ev); err != nil || ev.ID != first.id || ev.Type != first.event {
			t.Fatalf("data %s (%v) does not match id %s event %s", first.data, err, first.id, first.event)
		}
		checkSchema(t, "Event", []byte(first.data))
		c := e.claim(tokAcme, nil, lease.KataMicroVM)
		leased := next(t, ch)
		if leased.event != "cell.leased" {
			t.Fatalf("after a claim: %+v", leased)
		}
		// Keep-alive comments while nothing happens.
		deadline := time.After(5 * time.Second)
	comments:
		for {
			select {
			case ev := <-ch:
				if ev.comment {
					break comments
				}
				t.Fatalf("unexpected event %+v", ev)
			case <-deadline:
				t.Fatal("no keep-alive comment")
			}
		}
		cancel()

		// Meanwhile: a revocation. The reconnect resumes after the last id.
		e.do("POST", leasePath(c.Lease.LeaseID, "/revoke"), tokAcme, nil).must(t, 200)
		ch2, _, cancel2 := e.openStream("?after=0", tokAcme, wire.LastEventIDHeader, leased.id)
		for _, want := range []string{"cell.quarantined", "lease.revoked"} {
			if got := next(t, ch2); got.event != want {
				t.Fatalf("resumed stream: %+v, want %s", got, want)
			}
		}
		cancel2()
		ch3, _, cancel3 := e.openStream("?after="+leased.id, tokAcme)
		if got := next(t, ch3); got.event != "cell.quarantined" {
			t.Fatalf("stream after %s: %+v", leased.id, got)
		}
		cancel3()

		// Without a position: only new events.
		ch4, _, cancel4 := e.openStream("", tokAcme)
		defer cancel4()
		if start := <-ch4; start.event != "" || start.id != last(t, e) {
			t.Fatalf("a stream without a position starts with %+v, want the id %s alone", start, last(t, e))
		}
		time.Sleep(50 * time.Millisecond)
		cell := e.prepare(worker1, tokWorker1, lease.KataMicroVM)
		got := next(t, ch4)
		if err := json.Unmarshal([]byte(got.data), &ev); err != nil || got.event != "cell.ready" || ev.CellID != cell.CellID {
			t.Fatalf("new stream: %+v, want the new cell %s", got, cell.CellID)
		}
		// Another tenant's stream sees none of it.
		ch5, _, cancel5 := e.openStream("?after=0", tokGlobex)
		defer cancel5()
		other := e.prepare(worker3, tokWorker3, lease.KataMicroVM)
		got = next(t, ch5)
		if err := json.Unmarshal([]byte(got.data), &ev); err != nil || ev.CellID != other.CellID || ev.TenantID != "globex" {
			t.Fatalf("globex's stream: %+v", got)
		}
		e.do("GET", "/v1/events", tokAcme, nil, wire.LastEventIDHeader, "x").errCode(t, 422, "invalid_request")
		_ = uuid.Nil
	})
}

// TestWebhookDeliveriesRoute: the operator lists its tenant's deliveries
// by status; a tenant without the operator header cannot.
func TestWebhookDeliveriesRoute(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		e.prepare(worker1, tokWorker1, lease.KataMicroVM)
		e.prepare(worker3, tokWorker3, lease.KataMicroVM)
		for _, tenant := range []string{"acme", "globex"} {
			if _, err := e.st.(store.Webhooks).EnqueueDeliveries(ctx, store.DeliveryEnqueue{Endpoint: "wh-" + tenant, TenantID: tenant, Limit: 10, Now: time.Now()}); err != nil {
				t.Fatal(err)
			}
		}
		now := time.Now()
		ds, err := e.st.(store.Webhooks).LeaseDeliveries(ctx, store.DeliveryLease{Owner: "o", Now: now, Until: now.Add(time.Minute), Limit: 10})
		if err != nil || len(ds) != 2 {
			t.Fatalf("LeaseDeliveries = %d, %v", len(ds), err)
		}
		for _, d := range ds {
			if d.TenantID == "acme" {
				if err := e.st.(store.Webhooks).FinishDelivery(ctx, store.DeliveryOutcome{Endpoint: d.Endpoint, EventID: d.EventID, Owner: "o",
					Status: store.DeliveryFailed, HTTPStatus: 500, Error: "HTTP 500", Now: now}); err != nil {
					t.Fatal(err)
				}
			}
		}
		r := e.do("GET", "/v1/webhooks/deliveries?status=failed", tokAcme, nil, wire.OperatorHeader, tokOperator).must(t, 200)
		checkSchema(t, "DeliveriesResponse", r.body)
		got := decodeAs[wire.DeliveriesResponse](t, r)
		if len(got.Deliveries) != 1 || got.Deliveries[0].Endpoint != "wh-acme" || got.Deliveries[0].LastStatus != 500 ||
			got.Deliveries[0].Attempts != 1 || got.Deliveries[0].NextAt != nil {
			t.Errorf("failed deliveries: %s", r.body)
		}
		if g := decodeAs[wire.DeliveriesResponse](t, e.do("GET", "/v1/webhooks/deliveries", tokGlobex, nil, wire.OperatorHeader, tokOperator).must(t, 200)); len(g.Deliveries) != 1 || g.Deliveries[0].Status != "pending" {
			t.Errorf("globex's deliveries: %+v", g)
		}
		e.do("GET", "/v1/webhooks/deliveries", tokAcme, nil).errCode(t, 401, "unauthorized")
		e.do("GET", "/v1/webhooks/deliveries?status=lost", tokAcme, nil, wire.OperatorHeader, tokOperator).errCode(t, 422, "invalid_request")
	})
}

// TestHubMatchesStore: the hub's filter selects what the store's does.
func TestHubMatchesStore(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		e.poolCell("acme", lease.KataMicroVM)
		c := e.claim(tokAcme, nil, lease.KataMicroVM)
		e.do("POST", leasePath(c.Lease.LeaseID, "/release"), tokAcme, with(proofBody(c), "disposition", "destroyed")).must(t, 202)
		e.prepare(worker3, tokWorker3, lease.KataMicroVM)
		all, err := e.st.Events(ctx, store.EventQuery{Members: true, Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range []store.EventQuery{{}, {Members: true}, {TenantID: "acme"}, {TenantID: "globex", Members: true},
			{TypePrefix: "cell."}, {TypePrefix: "lease.released", Members: true}, {Pool: "p1", Members: true}, {Pool: "p2"},
			{LeaseID: c.Lease.LeaseID, Members: true}, {LeaseID: c.Lease.LeaseID}} {
			q.Limit = 1000
			want, err := e.st.Events(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			var got []store.Event
			for _, ev := range all {
				if matches(sandboxwich.EventQuery(q), sandboxwich.Event(ev)) {
					got = append(got, ev)
				}
			}
			if len(got) != len(want) {
				t.Errorf("%+v: the hub selects %d events, the store %d", q, len(got), len(want))
			}
		}
	})
}

// TestEventsTwoPlanesOnePostgres: two planes (two replicas) on one
// Postgres database claim at once; a stream from one of them reads every
// event of the log, in order, each once — no event of the other replica
// skipped while its transaction was in flight.
func TestEventsTwoPlanesOnePostgres(t *testing.T) {
	t.Parallel()
	dsn := testpg.Schema(t)
	keys := testenv.Keyring(t)
	var planes [2]*sandboxwich.Plane
	for i := range planes {
		st, err := postgres.Open(t.Context(), dsn, postgres.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		if planes[i], err = sandboxwich.New(st, keys, sandboxwich.WithLogger(slog.New(slog.DiscardHandler))); err != nil {
			t.Fatal(err)
		}
	}
	h, err := New(Config{Plane: planes[0], Auth: testAuth(), EventPoll: 5 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	e := &env{t: t, srv: srv, plane: planes[0]}
	ctx := context.Background()
	rel := testenv.Release(keys, lease.KataMicroVM)
	const n = 60
	for range n {
		if _, err := planes[1].Prepare(ctx, worker1, sandboxwich.PrepareRequest{CellID: uuid.Must(uuid.NewV7()), Release: rel,
			ProviderCellID: "vm-" + uuid.NewString(), ExpiresAt: time.Now().Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	start := last(t, e)
	ch, _, cancel := e.openStream("?after="+start, tokAcme, wire.OperatorHeader, tokOperator)
	defer cancel()
	var wg sync.WaitGroup
	for _, p := range planes {
		for range 4 {
			wg.Go(func() {
				for {
					res, err := p.Claim(ctx, "acme", sandboxwich.ClaimRequest{ClaimID: uuid.Must(uuid.NewV7()), Release: rel,
						Binding: lease.Binding{OrganizationID: "o", WorkspaceID: "w", ThreadID: "t", RunnerSessionID: "s"}})
					if err != nil {
						t.Errorf("claim: %v", err)
						return
					}
					if res.Lease == nil {
						return
					}
				}
			})
		}
	}
	wg.Wait()
	var got []string
	for len(got) < n {
		ev := next(t, ch)
		got = append(got, ev.id)
	}
	after, _ := strconv.ParseUint(start, 10, 64)
	log, err := planes[1].Events(ctx, sandboxwich.EventQuery{After: after, TenantID: "acme", Members: true, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, ev := range log {
		want = append(want, strconv.FormatUint(ev.ID, 10))
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("the stream read\n%v\nthe log holds\n%v", got, want)
	}
}

// logSource is an event log in memory for the hub to read.
type logSource struct{ evs []sandboxwich.Event }

func (l *logSource) Events(_ context.Context, q sandboxwich.EventQuery) ([]sandboxwich.Event, error) {
	var out []sandboxwich.Event
	for _, e := range l.evs {
		if e.ID > q.After && len(out) < q.Limit {
			out = append(out, e)
		}
	}
	return out, nil
}

func (l *logSource) LastEventID(context.Context) (uint64, error) {
	if len(l.evs) == 0 {
		return 0, nil
	}
	return l.evs[len(l.evs)-1].ID, nil
}

// TestHubCopy: the hub's copy holds every event in (start, end] and at
// most twice hubTail of them; a stream behind start is sent to the store;
// a stream's frames are the events it selects, in order, rendered once,
// and an event no stream selected is not rendered.
func TestHubCopy(t *testing.T) {
	src := &logSource{}
	hb := newEventHub(src, time.Hour)
	ctx := context.Background()
	hb.read(ctx) // starts at the log's end
	for i := range 5 * hubTail {
		typ := "cell.leased"
		if i%2 == 1 {
			typ = "member.leased"
		}
		src.evs = append(src.evs, sandboxwich.Event{ID: uint64(i + 1), Type: typ, TenantID: "acme", At: time.Unix(int64(i), 0).UTC()})
		if i%700 == 0 {
			hb.read(ctx)
		}
	}
	hb.read(ctx)
	if n := len(hb.tail); n < hubTail || n > 2*hubTail || hb.end != uint64(5*hubTail) || hb.start != hb.tail[0].e.ID-1 {
		t.Fatalf("the copy holds %d events, (%d, %d]", n, hb.start, hb.end)
	}
	if _, _, ok := hb.since(hb.start-1, sandboxwich.EventQuery{}); ok {
		t.Fatal("a stream behind the copy's start was served from it")
	}
	cursor := hb.start + 100
	frames, next, ok := hb.since(cursor, sandboxwich.EventQuery{TypePrefix: "cell."})
	if !ok || next != hb.end {
		t.Fatalf("since: ok %v next %d, want %d", ok, next, hb.end)
	}
	var want [][]byte
	for _, e := range src.evs {
		if e.ID > cursor && e.Type == "cell.leased" {
			f, err := frameOf(e)
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, f)
		}
	}
	if len(frames) != len(want) {
		t.Fatalf("%d frames, want %d", len(frames), len(want))
	}
	for i := range want {
		if !bytes.Equal(frames[i], want[i]) {
			t.Fatalf("frame %d: %q, want %q", i, frames[i], want[i])
		}
	}
	again, _, _ := hb.since(cursor, sandboxwich.EventQuery{TypePrefix: "cell."})
	for _, e := range hb.tail {
		if rendered := e.frame != nil; rendered != (e.e.ID > cursor && e.e.Type == "cell.leased") {
			t.Fatalf("event %d (%s) rendered: %v", e.e.ID, e.e.Type, rendered)
		}
	}
	if &again[0][0] != &frames[0][0] {
		t.Fatal("a second stream's frame was rendered again")
	}
}
