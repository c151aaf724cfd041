package client

import (
	"context"
	"errors"
	"iter"
	"net/http"
	"net/url"
	"strconv"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/wire"
)

// LeaseQuery selects the leases [Client.ListLeases] and [Client.Leases]
// return.
type LeaseQuery struct {
	// Binding filters: each non-empty field must equal the lease's.
	Binding wire.Binding
	// Live, when set, keeps the leases that are (true) or are not (false)
	// live on the server: leased and not expired, a pool cell whose
	// release or revocation is recorded but not yet proven included.
	Live *bool
	// Limit is the page size, 1 to 1000; 0 means the server's default
	// (100).
	Limit int
	// Cursor continues a listing: the NextCursor of the previous page.
	Cursor string
}

// query encodes q as the listing's query string.
func (q LeaseQuery) query() string {
	v := url.Values{}
	for _, f := range q.Binding.Fields() {
		if f.Value != "" {
			v.Set(f.Name, f.Value)
		}
	}
	if q.Live != nil {
		v.Set("live", strconv.FormatBool(*q.Live))
	}
	if q.Limit != 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	if q.Cursor != "" {
		v.Set("cursor", q.Cursor)
	}
	if len(v) == 0 {
		return ""
	}
	return "?" + v.Encode()
}

// LeasePage is one page of the tenant's leases, newest first. NextCursor
// is "" on the last page.
type LeasePage struct {
	Leases     []wire.LeaseSummary
	NextCursor string
}

// ListLeases returns one page of the tenant's leases, newest first
// (GET /v1/sterile-cell-leases); pass its NextCursor as q.Cursor for the
// next. Pages are keyset pages: leases made meanwhile never make a lease
// repeat or go missing. A bad filter, limit or cursor is an *Error with
// code invalid_request (errcode.ErrInvalidRequest). It retries like a read.
func (c *Client) ListLeases(ctx context.Context, q LeaseQuery) (LeasePage, error) {
	var resp wire.LeasesResponse
	if err := c.do(ctx, request{method: http.MethodGet, path: "/sterile-cell-leases" + q.query(), retry: true}, &resp); err != nil {
		return LeasePage{}, err
	}
	page := LeasePage{Leases: resp.Leases}
	if resp.NextCursor != nil {
		if *resp.NextCursor == "" {
			return LeasePage{}, errors.New("client: lease listing with an empty next_cursor")
		}
		page.NextCursor = *resp.NextCursor
	}
	return page, nil
}

// Leases iterates over every lease q selects, newest first, reading page
// after page from q.Cursor on. An error ends the iteration: it is yielded
// once, with a zero lease.
func (c *Client) Leases(ctx context.Context, q LeaseQuery) iter.Seq2[wire.LeaseSummary, error] {
	return func(yield func(wire.LeaseSummary, error) bool) {
		for {
			page, err := c.ListLeases(ctx, q)
			if err != nil {
				yield(wire.LeaseSummary{}, err)
				return
			}
			for _, l := range page.Leases {
				if !yield(l, nil) {
					return
				}
			}
			if page.NextCursor == "" {
				return
			}
			q.Cursor = page.NextCursor
		}
	}
}

// Revoke ends a live lease of the tenant without its attestation (POST
// /v1/sterile-cell-leases/{id}/revoke), for a harness that lost it: a pool
// cell stops as on release with disposition d ("" means quarantined, and
// sends no body), an external worker's cell is quarantined at once. It
// returns the lease status. A lease no longer live is errcode.ErrConflict;
// an unknown or foreign one errcode.ErrNotFound. Like Release, it is sent
// once and never retried: after a lost response, read [Client.Lease].
func (c *Client) Revoke(ctx context.Context, leaseID uuid.UUID, d lease.Disposition) (wire.LeaseStatus, error) {
	r := request{method: http.MethodPost, path: leasePath(leaseID, "/revoke")}
	if d != "" {
		r.body = wire.RevokeRequest{Disposition: d}
	}
	var resp wire.StatusResponse
	err := c.do(ctx, r, &resp)
	return resp.Status, err
}

// Inventory returns the tenant's inventory by release: the ready cells a
// claim could take now and the longest lease it would get
// (GET /v1/sterile-cells/inventory).
func (c *Client) Inventory(ctx context.Context) ([]wire.InventoryEntry, error) {
	var resp wire.InventoryResponse
	err := c.do(ctx, request{method: http.MethodGet, path: "/sterile-cells/inventory", retry: true}, &resp)
	return resp.Inventory, err
}

// EgressCounts returns the connections of a lease's cell by host, as its
// egress gateway counted them (CONTRACT §22): empty for a cell without
// egress.
func (c *Client) EgressCounts(ctx context.Context, leaseID uuid.UUID) ([]wire.EgressHost, error) {
	var resp wire.EgressResponse
	err := c.do(ctx, request{method: http.MethodGet, path: leasePath(leaseID, "/egress"), retry: true}, &resp)
	return resp.Hosts, err
}

// Evidence returns what the server read back from the provider and agent
// of a lease's pool cell, at admission and at its last verification
// (GET /v1/sterile-cell-leases/{id}/evidence). An external worker's cell,
// and an unknown or foreign lease, are errcode.ErrNotFound.
func (c *Client) Evidence(ctx context.Context, leaseID uuid.UUID) (wire.Evidence, error) {
	var resp wire.EvidenceResponse
	err := c.do(ctx, request{method: http.MethodGet, path: leasePath(leaseID, "/evidence"), retry: true}, &resp)
	return resp.Evidence, err
}
