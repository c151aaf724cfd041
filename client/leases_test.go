package client

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/wire"
)

// TestListLeasesQuery: the filters, live, limit and cursor go in the query
// string, each once, and the iterator follows next_cursor to the end.
func TestListLeasesQuery(t *testing.T) {
	ids := []uuid.UUID{uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())}
	var mu sync.Mutex // the handler runs on the server's goroutines
	var queries []url.Values
	page := func(next *string, ls ...uuid.UUID) func(http.ResponseWriter, *http.Request, []byte) {
		return func(w http.ResponseWriter, r *http.Request, _ []byte) {
			mu.Lock()
			queries = append(queries, r.URL.Query())
			mu.Unlock()
			resp := wire.LeasesResponse{OK: true, Leases: []wire.LeaseSummary{}, NextCursor: next}
			for _, id := range ls {
				resp.Leases = append(resp.Leases, wire.LeaseSummary{LeaseID: id})
			}
			writeJSON(w, 200, resp)
		}
	}
	recordedQueries := func() []url.Values {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(queries)
	}
	c1, c2 := "cursor-1", "cursor-2"
	f := newFake(t, page(&c1, ids[0]), page(&c2, ids[1]), page(nil, ids[2]))
	live := false
	q := LeaseQuery{Binding: wire.Binding{RunnerSessionID: "s/1", ThreadID: "t 1"}, Live: &live, Limit: 1}
	var got []uuid.UUID
	for l, err := range f.client().Leases(context.Background(), q) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, l.LeaseID)
	}
	if len(got) != 3 || got[0] != ids[0] || got[2] != ids[2] {
		t.Fatalf("leases = %v, want %v", got, ids)
	}
	want := url.Values{"runner_session_id": {"s/1"}, "thread_id": {"t 1"}, "live": {"false"}, "limit": {"1"}}
	seen := recordedQueries()
	for i, cur := range []string{"", c1, c2} {
		w := url.Values{}
		for k, v := range want {
			w[k] = v
		}
		if cur != "" {
			w.Set("cursor", cur)
		}
		if seen[i].Encode() != w.Encode() {
			t.Errorf("page %d query = %v, want %v", i+1, seen[i], w)
		}
	}
	if reqs := f.requests(); reqs[0].Path != "/v1/sterile-cell-leases" || reqs[0].Method != http.MethodGet {
		t.Errorf("request = %s %s", reqs[0].Method, reqs[0].Path)
	}

	// An empty query sends none; stopping early reads no further page.
	mu.Lock()
	queries = nil
	mu.Unlock()
	f = newFake(t, page(&c1, ids[0], ids[1]), page(nil, ids[2]))
	for l, err := range f.client().Leases(context.Background(), LeaseQuery{}) {
		if err != nil || l.LeaseID != ids[0] {
			t.Fatalf("first lease = %v, %v", l, err)
		}
		break
	}
	if seen := recordedQueries(); len(f.requests()) != 1 || len(seen[0]) != 0 {
		t.Errorf("early stop made %d requests, first query %v", len(f.requests()), seen[0])
	}
}

// TestLeasesYieldsTheError: an error ends the iteration after the leases
// already read, typed as the server's code.
func TestLeasesYieldsTheError(t *testing.T) {
	next := "c"
	f := newFake(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		writeJSON(w, 200, wire.LeasesResponse{OK: true, Leases: []wire.LeaseSummary{{LeaseID: uuid.Must(uuid.NewV7())}}, NextCursor: &next})
	}, fail(422, errcode.InvalidRequest, ""))
	var n int
	var last error
	for _, err := range f.client().Leases(context.Background(), LeaseQuery{}) {
		n++
		last = err
	}
	if n != 2 || !errors.Is(last, errcode.ErrInvalidRequest) {
		t.Fatalf("%d yields, last error %v", n, last)
	}
	if e, ok := errors.AsType[*Error](last); !ok || e.Status != 422 {
		t.Fatalf("error = %#v", last)
	}
}

// TestRevokeBody: without a disposition no body (nor Content-Type) is
// sent; with one, {"disposition":…}. Revoke is sent once.
func TestRevokeBody(t *testing.T) {
	id := uuid.Must(uuid.NewV7())
	st := wire.LeaseStatus{LeaseID: id, State: lease.Quarantined, Generation: 2}
	ok := func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		writeJSON(w, 200, wire.StatusResponse{OK: true, Status: st})
	}
	f := newFake(t, ok)
	if got, err := f.client().Revoke(context.Background(), id, ""); err != nil || got != st {
		t.Fatalf("Revoke = %+v, %v", got, err)
	}
	if _, err := f.client().Revoke(context.Background(), id, lease.Destroyed); err != nil {
		t.Fatal(err)
	}
	reqs := f.requests()
	if r := reqs[0]; r.Method != http.MethodPost || r.Path != "/v1/sterile-cell-leases/"+id.String()+"/revoke" ||
		len(r.Body) != 0 || r.Header.Get("Content-Type") != "" {
		t.Errorf("revoke without a disposition = %s %s %q (Content-Type %q)", r.Method, r.Path, r.Body, r.Header.Get("Content-Type"))
	}
	if r := reqs[1]; string(r.Body) != `{"disposition":"destroyed"}` || r.Header.Get("Content-Type") != "application/json" {
		t.Errorf("revoke with a disposition sent %q", r.Body)
	}
	for _, step := range []func(http.ResponseWriter, *http.Request, []byte){fail(503, errcode.Internal, "0"), drop} {
		f := newFake(t, step, ok)
		if _, err := f.client().Revoke(context.Background(), id, ""); err == nil || len(f.requests()) != 1 {
			t.Errorf("revoke after a failure: %v, %d requests; want the error and one request", err, len(f.requests()))
		}
	}
}
