package storetest

import (
	"sync"
	"time"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/store"
)

var deliveryScenarios = []scenario{
	{"Deliveries/Enqueue", testDeliveriesEnqueue},
	{"Deliveries/LeaseOnce", testDeliveriesLeaseOnce},
	{"Deliveries/RetryAndFail", testDeliveriesRetry},
	{"Deliveries/ConcurrentLeases", testDeliveriesConcurrent},
	{"Deliveries/BadInput", testDeliveriesBadInput},
}

func (e *env) enqueue(endpoint string, start uint64, types ...string) int {
	e.t.Helper()
	n, err := e.s.EnqueueDeliveries(e.ctx, store.DeliveryEnqueue{Endpoint: endpoint, TenantID: tenantA, Types: types,
		Start: start, Limit: 3, Now: e.now})
	if err != nil {
		e.t.Fatalf("EnqueueDeliveries: %v", err)
	}
	return n
}

// enqueueAll enqueues until the endpoint's cursor has passed every event
// of the log: passes of 3 events each.
func (e *env) enqueueAll(endpoint string, start uint64, types ...string) int {
	e.t.Helper()
	total := 0
	for range int(e.lastEvent())/3 + 2 {
		total += e.enqueue(endpoint, start, types...)
	}
	return total
}

func (e *env) leaseDeliveries(owner string, until time.Duration) []store.Delivery {
	e.t.Helper()
	ds, err := e.s.LeaseDeliveries(e.ctx, store.DeliveryLease{Owner: owner, Until: e.now.Add(until), Now: e.now, Limit: 100})
	if err != nil {
		e.t.Fatalf("LeaseDeliveries: %v", err)
	}
	return ds
}

// testDeliveriesEnqueue: an endpoint follows the log from its start, its
// tenant's events of its types only, each once.
func testDeliveriesEnqueue(e *env) {
	for range 3 {
		e.prepare()
	}
	e.prepare(func(p *store.PrepareParams) { p.TenantID = tenantB })
	e.mustLease()
	if n := e.enqueueAll("all", 0); n != 4 {
		t := e.t
		t.Errorf("an endpoint from the start recorded %d deliveries, want tenant A's 4 events", n)
	}
	if n := e.enqueueAll("all", 0); n != 0 {
		e.t.Errorf("a second pass recorded %d, want none", n)
	}
	if n := e.enqueueAll("leased", 0, "cell.leased", "lease."); n != 1 {
		e.t.Errorf("a cell.leased endpoint recorded %d, want 1", n)
	}
	// A new endpoint starting at the newest event sees only what follows.
	start := e.lastEvent()
	if n := e.enqueueAll("new", start); n != 0 {
		e.t.Errorf("a new endpoint recorded %d old events", n)
	}
	e.mustLease()
	if n := e.enqueueAll("new", start); n != 1 {
		e.t.Errorf("a new endpoint recorded %d deliveries of one new event", n)
	}
	ds, err := e.s.Deliveries(e.ctx, store.DeliveryQuery{Status: store.DeliveryPending, Limit: 100})
	e.wantOK(err, "Deliveries")
	if len(ds) != 4+1+1 {
		e.t.Errorf("%d pending deliveries, want 6", len(ds))
	}
	for _, d := range ds {
		if d.TenantID != tenantA || d.Attempts != 0 || !d.NextAt.Equal(e.now) || d.Event != nil {
			e.t.Errorf("listed delivery %+v", d)
		}
	}
	counts, err := e.s.DeliveryCounts(e.ctx)
	e.wantOK(err, "DeliveryCounts")
	if counts["all"][store.DeliveryPending] != 4 || counts["new"][store.DeliveryPending] != 1 {
		t := e.t
		t.Errorf("DeliveryCounts = %v", counts)
	}
}

// testDeliveriesLeaseOnce: a leased delivery goes to one deliverer until
// its lease expires; only the lease's owner records its outcome.
func testDeliveriesLeaseOnce(e *env) {
	c := e.prepare()
	e.enqueueAll("ep", 0)
	got := e.leaseDeliveries("one", 10*time.Second)
	if len(got) != 1 || got[0].Event == nil || got[0].Event.CellID != c.ID || got[0].Event.Type != "cell.ready" {
		e.t.Fatalf("LeaseDeliveries = %+v, want the cell.ready of %s with its event", got, c.ID)
	}
	if other := e.leaseDeliveries("two", 10*time.Second); len(other) != 0 {
		e.t.Fatalf("a leased delivery went to a second deliverer: %+v", other)
	}
	e.advance(10 * time.Second)
	again := e.leaseDeliveries("two", 10*time.Second)
	if len(again) != 1 || again[0].EventID != got[0].EventID {
		e.t.Fatalf("after the lease expired: %+v", again)
	}
	err := e.s.FinishDelivery(e.ctx, store.DeliveryOutcome{Endpoint: "ep", EventID: got[0].EventID, Owner: "one",
		Status: store.DeliveryDelivered, Now: e.now})
	e.wantErr(err, errcode.ErrConflict, "FinishDelivery by a former owner")
	e.wantOK(e.s.FinishDelivery(e.ctx, store.DeliveryOutcome{Endpoint: "ep", EventID: got[0].EventID, Owner: "two",
		Status: store.DeliveryDelivered, HTTPStatus: 204, Now: e.now}), "FinishDelivery")
	e.advance(time.Minute)
	if left := e.leaseDeliveries("three", time.Minute); len(left) != 0 {
		e.t.Errorf("a delivered delivery was leased again: %+v", left)
	}
	ds, err := e.s.Deliveries(e.ctx, store.DeliveryQuery{Status: store.DeliveryDelivered, TenantID: tenantA, Limit: 10})
	e.wantOK(err, "Deliveries")
	if len(ds) != 1 || ds[0].Attempts != 1 || ds[0].Status != store.DeliveryDelivered {
		e.t.Errorf("delivered: %+v", ds)
	}
	if ds, _ := e.s.Deliveries(e.ctx, store.DeliveryQuery{TenantID: tenantB, Limit: 10}); len(ds) != 0 {
		e.t.Errorf("tenant B lists %+v", ds)
	}
}

// testDeliveriesRetry: a failed attempt is due again at its next time; the
// last one fails the delivery, which keeps why.
func testDeliveriesRetry(e *env) {
	e.prepare()
	e.enqueueAll("ep", 0)
	d := e.leaseDeliveries("d", time.Minute)
	if len(d) != 1 {
		e.t.Fatalf("leased %d", len(d))
	}
	e.wantOK(e.s.FinishDelivery(e.ctx, store.DeliveryOutcome{Endpoint: "ep", EventID: d[0].EventID, Owner: "d",
		Status: store.DeliveryPending, Next: e.now.Add(30 * time.Second), HTTPStatus: 500, Error: "500 Internal Server Error", Now: e.now}),
		"FinishDelivery (retry)")
	if got := e.leaseDeliveries("d", time.Minute); len(got) != 0 {
		e.t.Fatalf("a delivery due in 30 s was leased now: %+v", got)
	}
	e.advance(30 * time.Second)
	got := e.leaseDeliveries("d", time.Minute)
	if len(got) != 1 || got[0].Attempts != 1 || got[0].LastStatus != 500 {
		e.t.Fatalf("the retry: %+v", got)
	}
	e.wantOK(e.s.FinishDelivery(e.ctx, store.DeliveryOutcome{Endpoint: "ep", EventID: d[0].EventID, Owner: "d",
		Status: store.DeliveryFailed, Error: "timeout", Now: e.now}), "FinishDelivery (failed)")
	e.advance(time.Hour)
	if got := e.leaseDeliveries("d", time.Minute); len(got) != 0 {
		e.t.Fatalf("a failed delivery was leased: %+v", got)
	}
	failed, err := e.s.Deliveries(e.ctx, store.DeliveryQuery{Status: store.DeliveryFailed, Limit: 10})
	e.wantOK(err, "Deliveries")
	if len(failed) != 1 || failed[0].Attempts != 2 || failed[0].LastError != "timeout" {
		e.t.Errorf("failed: %+v", failed)
	}
	// Pruning the event prunes its deliveries.
	e.prepare()
	if _, err := e.s.PruneEvents(e.ctx, e.now); err != nil {
		e.t.Fatal(err)
	}
	if ds, err := e.s.Deliveries(e.ctx, store.DeliveryQuery{Limit: 10}); err != nil || len(ds) != 0 {
		e.t.Errorf("deliveries of pruned events: %+v %v", ds, err)
	}
}

// testDeliveriesConcurrent: deliverers leasing at once take disjoint
// deliveries, and together all of them.
func testDeliveriesConcurrent(e *env) {
	for range 12 {
		e.prepare()
	}
	e.enqueueAll("ep", 0)
	var mu sync.Mutex
	seen := map[uint64]int{}
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			for {
				ds, err := e.s.LeaseDeliveries(e.ctx, store.DeliveryLease{Owner: string(rune('a' + i)), Until: e.now.Add(time.Minute),
					Now: e.now, Limit: 2})
				if err != nil {
					e.t.Errorf("LeaseDeliveries: %v", err)
					return
				}
				if len(ds) == 0 {
					return
				}
				mu.Lock()
				for _, d := range ds {
					seen[d.EventID]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(seen) != 12 {
		e.t.Errorf("leased %d distinct deliveries of 12", len(seen))
	}
	for id, n := range seen {
		if n != 1 {
			e.t.Errorf("delivery %d leased %d times", id, n)
		}
	}
}

func testDeliveriesBadInput(e *env) {
	_, err := e.s.EnqueueDeliveries(e.ctx, store.DeliveryEnqueue{Endpoint: "ep", TenantID: tenantA, Now: e.now})
	e.wantErr(err, errcode.ErrInvalidRequest, "EnqueueDeliveries without a limit")
	_, err = e.s.LeaseDeliveries(e.ctx, store.DeliveryLease{Owner: "o", Now: e.now, Until: e.now, Limit: 1})
	e.wantErr(err, errcode.ErrInvalidRequest, "LeaseDeliveries with an expired lease")
	err = e.s.FinishDelivery(e.ctx, store.DeliveryOutcome{Endpoint: "ep", EventID: 1, Owner: "o", Status: "lost", Now: e.now})
	e.wantErr(err, errcode.ErrInvalidRequest, "FinishDelivery with an unknown status")
	_, err = e.s.Deliveries(e.ctx, store.DeliveryQuery{})
	e.wantErr(err, errcode.ErrInvalidRequest, "Deliveries without a limit")
}
