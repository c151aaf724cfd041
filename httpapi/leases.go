package httpapi

import (
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/wire"
)

// The tenant routes of lease listing, revocation and inventory (CONTRACT
// §14) and of evidence (§15).

// listLeases serves GET /v1/sterile-cell-leases: a page of the tenant's
// leases, newest first.
func (h *handler) listLeases(c *call) (int, any, error) {
	q, err := leaseQueryOf(c.r.URL.RawQuery)
	if err != nil {
		return 0, nil, err
	}
	page, err := h.plane.ListLeases(c.ctx(), c.p.tenant, q)
	if err != nil {
		return 0, nil, err
	}
	resp := wire.LeasesResponse{OK: true, Leases: make([]wire.LeaseSummary, 0, len(page.Leases))}
	for _, l := range page.Leases {
		resp.Leases = append(resp.Leases, wire.LeaseSummary{
			LeaseID: l.LeaseID, CellID: l.CellID, Generation: l.Generation, State: l.State,
			Disposition: wire.DispositionOf(l.State), ProviderAbsent: l.ProviderAbsent, CleanupPending: l.CleanupPending,
			Binding: l.Binding, ExpiresAt: wire.Time{Time: l.ExpiresAt}, ReleaseSetID: l.ReleaseSetID,
		})
	}
	if page.NextCursor != "" {
		resp.NextCursor = &page.NextCursor
	}
	return http.StatusOK, resp, nil
}

// queryParams parses a query string and returns its reader: each
// parameter at most once and never empty (an error otherwise); ok is false
// when it is absent.
func queryParams(raw string) (get func(name string) (value string, ok bool, err error), err error) {
	vals, err := url.ParseQuery(raw)
	if err != nil {
		return nil, malformed("the query string is malformed")
	}
	return func(name string) (string, bool, error) {
		vs, ok := vals[name]
		switch {
		case !ok:
			return "", false, nil
		case len(vs) != 1:
			return "", false, invalid(name + " must be given at most once")
		case vs[0] == "":
			return "", false, invalid(name + " must not be empty")
		}
		return vs[0], true, nil
	}, nil
}

// leaseQueryOf reads the listing's query parameters: each at most once and
// never empty. Unknown parameters are ignored, as unknown body fields are.
// The plane checks the filters' and the cursor's values.
func leaseQueryOf(raw string) (sandboxwich.LeaseQuery, error) {
	var q sandboxwich.LeaseQuery
	get, err := queryParams(raw)
	if err != nil {
		return q, err
	}
	for _, f := range []struct {
		name string
		dst  *string
	}{
		{"organization_id", &q.Binding.OrganizationID}, {"workspace_id", &q.Binding.WorkspaceID},
		{"thread_id", &q.Binding.ThreadID}, {"runner_session_id", &q.Binding.RunnerSessionID},
		{"cursor", &q.Cursor},
	} {
		if *f.dst, _, err = get(f.name); err != nil {
			return q, err
		}
	}
	if v, ok, err := get("live"); err != nil {
		return q, err
	} else if ok {
		if v != "true" && v != "false" {
			return q, invalid("live must be true or false")
		}
		live := v == "true"
		q.Live = &live
	}
	if v, ok, err := get("limit"); err != nil {
		return q, err
	} else if ok {
		n, perr := strconv.ParseUint(v, 10, 16)
		if perr != nil || n < 1 || n > sandboxwich.MaxListLimit {
			return q, invalid("limit must be an integer from 1 to " + strconv.Itoa(sandboxwich.MaxListLimit))
		}
		q.Limit = int(n)
	}
	return q, nil
}

// revoke serves POST /v1/sterile-cell-leases/{lease_id}/revoke: 202 with
// the status once a pool cell's stop is recorded, 200 when an external
// worker's cell was quarantined at once.
func (h *handler) revoke(c *call) (int, any, error) {
	id, err := pathUUID(c.r, "lease_id")
	if err != nil {
		return 0, nil, err
	}
	var req wire.RevokeRequest
	if len(c.body) > 0 {
		if req, err = decodeBody(c.body, readRevoke); err != nil {
			return 0, nil, err
		}
	}
	st, err := h.plane.Revoke(c.ctx(), c.p.tenant, id, req.Disposition)
	if err != nil {
		return 0, nil, err
	}
	status := http.StatusAccepted
	if st.PoolName == "" {
		status = http.StatusOK
	}
	return status, wire.StatusResponse{OK: true, Status: wireStatus(st)}, nil
}

// readRevoke reads the optional disposition of a revoke.
func readRevoke(o *object) wire.RevokeRequest {
	var r wire.RevokeRequest
	if _, ok := o.value("disposition"); ok {
		r.Disposition = lease.Disposition(o.enum("disposition", dispositions...))
	}
	return r
}

// inventory serves GET /v1/sterile-cells/inventory; the entry of an image
// class's release adds the class's fields (CONTRACT §21).
func (h *handler) inventory(c *call) (int, any, error) {
	inv, err := h.plane.Inventory(c.ctx(), c.p.tenant)
	if err != nil {
		return 0, nil, err
	}
	resp := wire.InventoryResponse{OK: true, Inventory: make([]wire.InventoryEntry, 0, len(inv))}
	for _, e := range inv {
		w := wire.InventoryEntry{ReleaseSetID: e.ReleaseSetID, RuntimeClass: e.RuntimeClass, PolicyDigest: e.PolicyDigest,
			Ready: e.Ready, MaxLeaseSeconds: e.MaxLeaseSeconds}
		if ic := e.ImageClass; ic != nil {
			w.Images, w.Cached, w.MaxCells, w.MaxCold, w.WarmPerImage = ic.Images, ic.Cached, ic.MaxCells, ic.MaxCold, ic.WarmPerImage
		}
		resp.Inventory = append(resp.Inventory, w)
	}
	return http.StatusOK, resp, nil
}

// evidence serves GET /v1/sterile-cell-leases/{lease_id}/evidence.
func (h *handler) evidence(c *call) (int, any, error) {
	id, err := pathUUID(c.r, "lease_id")
	if err != nil {
		return 0, nil, err
	}
	ev, err := h.plane.Evidence(c.ctx(), c.p.tenant, id)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.EvidenceResponse{OK: true, Evidence: wire.Evidence{
		CellID:         ev.CellID,
		Pool:           ev.Pool,
		Provider:       nonEmpty(ev.Provider),
		ProviderMode:   nonEmpty(string(ev.ProviderMode)),
		RuntimeClass:   nonEmpty(ev.RuntimeClass),
		ImageDigest:    nonEmpty(ev.ImageDigest),
		AgentDigest:    nonEmpty(ev.AgentDigest),
		Egress:         ev.Egress,
		EgressDigest:   ev.EgressDigest,
		AdmittedAt:     wireTimeOrNil(ev.AdmittedAt),
		LastVerifiedAt: wireTimeOrNil(ev.LastVerifiedAt),
	}}, nil
}

// egressCounts serves GET /v1/sterile-cell-leases/{lease_id}/egress.
func (h *handler) egressCounts(c *call) (int, any, error) {
	id, err := pathUUID(c.r, "lease_id")
	if err != nil {
		return 0, nil, err
	}
	hosts, err := h.plane.EgressCounts(c.ctx(), c.p.tenant, id)
	if err != nil {
		return 0, nil, err
	}
	resp := wire.EgressResponse{OK: true, Hosts: make([]wire.EgressHost, 0, len(hosts))}
	for _, e := range hosts {
		resp.Hosts = append(resp.Hosts, wire.EgressHost{Host: e.Host, Allowed: e.Allowed, Refused: e.Refused})
	}
	return http.StatusOK, resp, nil
}

// nonEmpty is nil for "", else a pointer to s: null on the wire.
func nonEmpty[S ~string](s S) *S {
	if s == "" {
		return nil
	}
	return &s
}

// wireTimeOrNil is nil for the zero time: null on the wire.
func wireTimeOrNil(t time.Time) *wire.Time {
	if t.IsZero() {
		return nil
	}
	return &wire.Time{Time: t}
}
