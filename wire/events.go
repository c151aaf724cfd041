package wire

import (
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/lease"
)

// The bodies of the event log (CONTRACT §16): GET /v1/events, and the body
// of a webhook delivery. None carries an attestation, a digest, a token, a
// provider locator or provider error text.

// Event is one entry of the event log: a change of state of a cell (type
// "cell.<to>") or a pool member ("member.<to>"), or the end of a lease
// ("lease.released", "lease.revoked", "lease.expired"), or its renewal
// ("lease.renewed"). Fields that do
// not apply are null.
type Event struct {
	// ID is a decimal string that increases strictly per database.
	ID       string     `json:"id"`
	Type     string     `json:"type"`
	At       Time       `json:"at"`
	TenantID string     `json:"tenant_id"`
	Pool     *string    `json:"pool"`
	CellID   uuid.UUID  `json:"cell_id"`
	LeaseID  *uuid.UUID `json:"lease_id"`
	// MemberID is the member's cell ID, on member events only.
	MemberID   *uuid.UUID `json:"member_id"`
	Generation *uint64    `json:"generation"`
	// From and To are the states before and after a cell or member
	// change; From is null for a new cell or member.
	From           *string `json:"from"`
	To             *string `json:"to"`
	Disposition    *string `json:"disposition"`
	ProviderAbsent bool    `json:"provider_absent"`
	// Reason is a reason code of §16, never free text.
	Reason *string `json:"reason"`
}

// LogEvent is one event of the log in plain fields, as the store and the
// plane hold it (their event types convert to it). Its Wire method is the
// one conversion to the wire form, shared by the webhook deliverer and
// GET /v1/events.
type LogEvent struct {
	ID             uint64
	Type           string
	At             time.Time
	TenantID       string
	Pool           string
	CellID         uuid.UUID
	LeaseID        uuid.UUID
	MemberID       uuid.UUID
	Generation     uint64
	From, To       string
	Disposition    lease.Disposition
	ProviderAbsent bool
	Reason         string
}

// Wire returns the wire form of e: "", uuid.Nil and a zero generation are
// null.
func (e LogEvent) Wire() Event {
	w := Event{ID: strconv.FormatUint(e.ID, 10), Type: e.Type, At: Time{Time: e.At}, TenantID: e.TenantID,
		CellID: e.CellID, ProviderAbsent: e.ProviderAbsent}
	str := func(s string) *string {
		if s == "" {
			return nil
		}
		return &s
	}
	id := func(u uuid.UUID) *uuid.UUID {
		if u == uuid.Nil {
			return nil
		}
		return &u
	}
	w.Pool, w.From, w.To, w.Reason = str(e.Pool), str(e.From), str(e.To), str(e.Reason)
	w.Disposition = str(string(e.Disposition))
	w.LeaseID, w.MemberID = id(e.LeaseID), id(e.MemberID)
	if e.Generation != 0 {
		g := e.Generation
		w.Generation = &g
	}
	return w
}

// EventsResponse is the polling answer of GET /v1/events?format=json: the
// events after the request's after, oldest first, and where the next poll
// starts.
type EventsResponse struct {
	OK     bool    `json:"ok"`
	Events []Event `json:"events"`
	// NextAfter is the after of the next poll: the id of the last event
	// returned, or the request's after when none was.
	NextAfter string `json:"next_after"`
}

// Event stream and polling limits.
const (
	// DefaultEventLimit and MaxEventLimit bound the limit of a poll.
	DefaultEventLimit = 100
	MaxEventLimit     = 1000
	// LastEventIDHeader is the header an event-stream client resumes
	// with.
	LastEventIDHeader = "Last-Event-ID"
)

// WebhookDelivery is one delivery of an event to a webhook endpoint, as
// GET /v1/webhooks/deliveries lists it.
type WebhookDelivery struct {
	// Endpoint names the endpoint (a hash of its tenant and URL, never
	// the URL).
	Endpoint string `json:"endpoint"`
	EventID  string `json:"event_id"`
	// Status is pending, delivered or failed.
	Status   string `json:"status"`
	Attempts int    `json:"attempts"`
	// NextAt is when a pending delivery is next attempted.
	NextAt *Time `json:"next_at"`
	// LastStatus and LastError describe the last failed attempt: the HTTP
	// status (0 without an answer) and what went wrong.
	LastStatus int    `json:"last_status"`
	LastError  string `json:"last_error"`
	CreatedAt  Time   `json:"created_at"`
	UpdatedAt  Time   `json:"updated_at"`
}

// DeliveriesResponse is the answer of GET /v1/webhooks/deliveries.
type DeliveriesResponse struct {
	OK         bool              `json:"ok"`
	Deliveries []WebhookDelivery `json:"deliveries"`
	// NextAfter is the after of the next page.
	NextAfter string `json:"next_after"`
}
