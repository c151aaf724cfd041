package sandboxwich

import (
	"context"
	"iter"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

// The event log (CONTRACT §16) and the webhook deliveries, in the Plane's
// words; the store's types are converted here and nowhere else.

// Event is one change of a cell, a lease or a pool member, as the log
// records it.
type Event struct {
	// ID increases strictly, per database, in commit order.
	ID       uint64
	Type     string
	At       time.Time
	TenantID string
	// Pool is "" for a cell prepared by an external worker.
	Pool   string
	CellID uuid.UUID
	// LeaseID is uuid.Nil when the cell had no lease.
	LeaseID uuid.UUID
	// MemberID is the member's cell ID for member events, uuid.Nil
	// otherwise.
	MemberID uuid.UUID
	// Generation is the cell's generation after the change (0 when no cell
	// existed yet).
	Generation uint64
	// From and To are the states before and after ("" From for a new cell
	// or member; both "" for lease events).
	From, To string
	// Disposition is a member's requested disposition, once recorded.
	Disposition    lease.Disposition
	ProviderAbsent bool
	// Reason says why (CONTRACT §16: "claimed", "expired", "cell_lost",
	// …), or "".
	Reason string
}

// EventQuery selects events of the log.
type EventQuery struct {
	// After is the id of the last event the reader has seen (0: none).
	After uint64
	// Oldest, instead of After, starts at the oldest event the log still
	// holds: a reader without a position that wants what is retained.
	Oldest bool
	// Limit is the largest number of events returned (at least 1).
	Limit int
	// TenantID keeps only the tenant's events; "" keeps every tenant's.
	TenantID string
	// Members keeps member events too; without it only cell and lease
	// events are returned.
	Members bool
	// TypePrefix keeps events whose type starts with it ("cell.",
	// "lease.released").
	TypePrefix string
	// Pool keeps events of that pool.
	Pool string
	// LeaseID, unless uuid.Nil, keeps events of that lease.
	LeaseID uuid.UUID
}

// DeliveryStatus is where a webhook delivery is.
type DeliveryStatus string

// Statuses of a webhook delivery.
const (
	DeliveryPending   DeliveryStatus = "pending"
	DeliveryDelivered DeliveryStatus = "delivered"
	DeliveryFailed    DeliveryStatus = "failed"
)

// Delivery is one event to deliver to one webhook endpoint.
type Delivery struct {
	Endpoint string
	EventID  uint64
	TenantID string
	Status   DeliveryStatus
	// Attempts counts the attempts made.
	Attempts int
	// NextAt is when the next attempt is due (pending deliveries).
	NextAt time.Time
	// LastStatus and LastError describe the last failed attempt (an HTTP
	// status, or 0 and what went wrong; never a secret or a body).
	LastStatus int
	LastError  string
	CreatedAt  time.Time
	UpdatedAt  time.Time
}

// DeliveryQuery selects webhook deliveries.
type DeliveryQuery struct {
	// TenantID keeps the tenant's deliveries; "" keeps all.
	TenantID string
	// Status keeps deliveries in that status; "" keeps all.
	Status DeliveryStatus
	// After keeps deliveries of events after this id.
	After uint64
	// Limit is the largest number returned (at least 1).
	Limit int
}

// PruneEvents deletes the events older than the plane's retention, keeping
// the newest (Run does it every few minutes). It returns how many it
// deleted; with retention 0 it deletes none.
func (p *Plane) PruneEvents(ctx context.Context) (int, error) {
	if p.retention <= 0 {
		return 0, nil
	}
	return p.store.PruneEvents(ctx, p.Now().Add(-p.retention))
}

// Events returns a page of the event log (CONTRACT §16): the events q
// selects, by increasing id, which is commit order — a read after the last
// id seen misses none. A position older than the retention kept is
// errcode.ErrEventsExpired. The caller scopes it (q.TenantID, q.Members).
func (p *Plane) Events(ctx context.Context, q EventQuery) ([]Event, error) {
	evs, err := p.store.Events(ctx, store.EventQuery(q))
	if err != nil {
		return nil, err
	}
	out := make([]Event, len(evs))
	for i, e := range evs {
		out[i] = Event(e)
	}
	return out, nil
}

// LastEventID returns the id of the newest event, 0 when the log is empty.
func (p *Plane) LastEventID(ctx context.Context) (uint64, error) {
	return p.store.LastEventID(ctx)
}

// followPoll is how often Follow reads the log once it has caught up.
const followPoll = 100 * time.Millisecond

// Follow returns the events filter selects after the id after, in order,
// as they are committed: first those already in the log, then each new
// one, until ctx ends (the sequence then stops without an error) or a
// read fails (the error is yielded once, last). It gives the guarantees of
// GET /v1/events: ids increase in commit order, so resuming with the id
// of the last event seen misses none and repeats none; a position older
// than the retention kept yields errcode.ErrEventsExpired. filter's After,
// Oldest and Limit are ignored. It polls the store (every 100 ms once
// caught up); the HTTP route's hub keeps its own copy of the log's tail.
func (p *Plane) Follow(ctx context.Context, after uint64, filter EventQuery) iter.Seq2[Event, error] {
	return func(yield func(Event, error) bool) {
		const batch = 500
		t := time.NewTicker(followPoll)
		defer t.Stop()
		q := filter
		q.Oldest, q.Limit = false, batch
		for {
			q.After = after
			// The newest id, read before the page: when the page is not full
			// every selected event up to it is in the page, so a filter
			// that selects little does not scan the others' again.
			head, err := p.store.LastEventID(ctx)
			var evs []Event
			if err == nil {
				evs, err = p.Events(ctx, q)
			}
			if err != nil {
				if ctx.Err() == nil {
					yield(Event{}, err)
				}
				return
			}
			for _, e := range evs {
				if !yield(e, nil) {
					return
				}
				after = e.ID
			}
			if len(evs) == batch {
				continue
			}
			after = max(after, head)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}
}

// ErrNoDeliveries is returned by Deliveries over a store without the
// store.Webhooks ability (such a server delivers no webhooks: cmd refuses
// to configure them).
var ErrNoDeliveries = errcode.New(errcode.NotFound, "this server's store keeps no webhook deliveries")

// Deliveries lists webhook deliveries by event id; the caller scopes them
// (q.TenantID). Over a store without the store.Webhooks ability it is
// ErrNoDeliveries.
func (p *Plane) Deliveries(ctx context.Context, q DeliveryQuery) ([]Delivery, error) {
	w, ok := p.store.(store.Webhooks)
	if !ok {
		return nil, ErrNoDeliveries
	}
	ds, err := w.Deliveries(ctx, store.DeliveryQuery{TenantID: q.TenantID, Status: string(q.Status), After: q.After, Limit: q.Limit})
	if err != nil {
		return nil, err
	}
	out := make([]Delivery, len(ds))
	for i, d := range ds {
		out[i] = Delivery{Endpoint: d.Endpoint, EventID: d.EventID, TenantID: d.TenantID, Status: DeliveryStatus(d.Status),
			Attempts: d.Attempts, NextAt: d.NextAt, LastStatus: d.LastStatus, LastError: d.LastError,
			CreatedAt: d.CreatedAt, UpdatedAt: d.UpdatedAt}
	}
	return out, nil
}
