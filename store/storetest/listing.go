package storetest

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

var listScenarios = []scenario{
	{"ListLeases/NewestFirstInPages", testListPages},
	{"ListLeases/InsertsWhilePaging", testListConcurrentInserts},
	{"ListLeases/BindingFilters", testListFilters},
	{"ListLeases/Live", testListLive},
	{"ListLeases/Tenants", testListTenants},
	{"ListLeases/BadInput", testListBadInput},
}

func (k *tracker) ListLeases(ctx context.Context, p store.ListLeasesParams) ([]store.LeaseRecord, error) {
	recs, err := k.Store.ListLeases(ctx, p)
	if err == nil {
		for _, rec := range recs {
			k.observeRecord("ListLeases", rec)
		}
	}
	return recs, err
}

// list runs ListLeases for tenantA at e.now and fails the scenario on error.
func (e *env) list(p store.ListLeasesParams) []store.LeaseRecord {
	e.t.Helper()
	if p.TenantID == "" {
		p.TenantID = tenantA
	}
	if p.Now.IsZero() {
		p.Now = e.now
	}
	recs, err := e.s.ListLeases(e.ctx, p)
	e.wantOK(err, "ListLeases")
	for i, rec := range recs {
		if rec.Cell.Lease == nil {
			e.t.Fatalf("ListLeases returned cell %s without a lease", rec.Cell.ID)
		}
		if i > 0 && !idBefore(rec.Cell.Lease.ID, recs[i-1].Cell.Lease.ID) {
			e.t.Errorf("ListLeases: lease %s after %s, want newest (highest ID) first", rec.Cell.Lease.ID, recs[i-1].Cell.Lease.ID)
		}
	}
	return recs
}

// listAll pages through ListLeases with limit n and returns every lease ID.
func (e *env) listAll(p store.ListLeasesParams, n int) []uuid.UUID {
	e.t.Helper()
	p.Limit = n
	var ids []uuid.UUID
	for range 1000 {
		recs := e.list(p)
		if len(recs) > n {
			e.t.Fatalf("ListLeases returned %d leases, limit %d", len(recs), n)
		}
		for _, rec := range recs {
			ids = append(ids, rec.Cell.Lease.ID)
		}
		if len(recs) < n {
			return ids
		}
		p.Before = recs[len(recs)-1].Cell.Lease.ID
	}
	e.t.Fatal("ListLeases never ran out of pages")
	return nil
}

// idBefore reports whether a sorts after b in the listing: a lower ID.
func idBefore(a, b uuid.UUID) bool { return bytes.Compare(a[:], b[:]) < 0 }

// newestFirst returns the IDs of ls in listing order.
func newestFirst(ls ...lease.Lease) []uuid.UUID {
	ids := make([]uuid.UUID, len(ls))
	for i, l := range ls {
		ids[i] = l.ID
	}
	slices.SortFunc(ids, func(a, b uuid.UUID) int { return bytes.Compare(b[:], a[:]) })
	return ids
}

func (e *env) wantIDs(got, want []uuid.UUID, what string) {
	e.t.Helper()
	if !slices.Equal(got, want) {
		e.t.Errorf("%s:\n got  %v\n want %v", what, got, want)
	}
}

func ids(recs []store.LeaseRecord) []uuid.UUID {
	out := make([]uuid.UUID, len(recs))
	for i, rec := range recs {
		out[i] = rec.Cell.Lease.ID
	}
	return out
}

// binding returns a binding whose four fields end in i.
func binding(i int) lease.Binding {
	return lease.Binding{
		OrganizationID:  fmt.Sprintf("org-%d", i),
		WorkspaceID:     fmt.Sprintf("workspace-%d", i),
		ThreadID:        fmt.Sprintf("thread-%d", i),
		RunnerSessionID: fmt.Sprintf("session-%d", i),
	}
}

// testListPages: a tenant's leases, pool and prepared cells, live and
// terminal, come newest first, each exactly once across pages, each record
// equal to what Lease reads; cells never leased are not listed.
func testListPages(e *env) {
	var all []lease.Lease
	for i := range 7 {
		if i%2 == 0 {
			e.poolCell(poolA)
		} else {
			e.prepare()
		}
		all = append(all, e.mustLease(withBinding(binding(i))))
		e.advance(time.Second)
	}
	e.prepare() // never leased
	e.poolCell(poolA)
	_, err := e.destroy(all[1].CellID, all[1].ID, 2, lease.Destroyed)
	e.wantOK(err, "Destroy")
	_, err = e.release(all[2], lease.Destroyed)
	e.wantOK(err, "Release")

	want := newestFirst(all...)
	recs := e.list(store.ListLeasesParams{Limit: 1000})
	e.wantIDs(ids(recs), want, "ListLeases of every lease")
	for _, rec := range recs {
		got := e.record(rec.Cell.Lease.ID)
		e.wantCell(rec.Cell, got.Cell, "listed cell")
		switch {
		case (rec.Member == nil) != (got.Member == nil):
			e.t.Errorf("listed lease %s: member %v, Lease reads %v", rec.Cell.Lease.ID, rec.Member, got.Member)
		case rec.Member != nil:
			e.wantMember(*rec.Member, *got.Member, "listed member")
			if rec.Member.Cell == nil || !sameCell(*rec.Member.Cell, rec.Cell) {
				e.t.Errorf("listed member %s does not carry its cell", rec.Member.CellID)
			}
		}
	}
	for _, n := range []int{1, 2, 3, 7, 8} {
		e.wantIDs(e.listAll(store.ListLeasesParams{}, n), want, fmt.Sprintf("pages of %d", n))
	}
	// A page after the oldest lease, or after an ID below every lease, is
	// empty; one after an ID above every lease starts at the newest.
	e.wantIDs(ids(e.list(store.ListLeasesParams{Limit: 10, Before: want[len(want)-1]})), nil, "page after the oldest lease")
	e.wantIDs(ids(e.list(store.ListLeasesParams{Limit: 10, Before: uuid.UUID{0: 1}})), nil, "page after a low ID")
	e.wantIDs(ids(e.list(store.ListLeasesParams{Limit: 2, Before: uuid.Max})), want[:2], "page after the highest ID")
	e.wantIDs(ids(e.list(store.ListLeasesParams{Limit: 2, Before: want[2]})), want[3:5], "page after the third lease")
}

// testListConcurrentInserts: leases made while a reader pages through the
// listing never make it repeat or skip one that existed when it began.
func testListConcurrentInserts(e *env) {
	var before []lease.Lease
	for i := range 12 {
		e.prepare()
		before = append(before, e.mustLease(withBinding(binding(i))))
	}
	for range 48 {
		e.prepare()
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			p := e.claimParams(withBinding(binding(100 + i)))
			// Some new leases sort among the listed ones: lower IDs than
			// the leases that existed (a clock behind, another replica).
			if i%2 == 1 {
				p.LeaseID[0], p.LeaseID[1] = 0, byte(i)
			}
			res, err := e.s.Claim(e.ctx, p)
			if err != nil {
				e.t.Errorf("Claim while listing: %v", err)
				return
			}
			if res.Lease == nil {
				return // inventory exhausted
			}
		}
	})
	var got []uuid.UUID
	p := store.ListLeasesParams{TenantID: tenantA, Limit: 2, Now: e.now}
	for {
		recs, err := e.s.ListLeases(e.ctx, p)
		if err != nil {
			e.t.Fatalf("ListLeases: %v", err)
		}
		got = append(got, ids(recs)...)
		if len(recs) < p.Limit {
			break
		}
		p.Before = recs[len(recs)-1].Cell.Lease.ID
		// Between every two pages, one lease newer than all and one older
		// than all, besides the writer's.
		for _, low := range []bool{false, true} {
			cp := e.claimParams(withBinding(binding(200 + len(got))))
			if low {
				cp.LeaseID[0], cp.LeaseID[1] = 0, 0
			}
			if _, err := e.s.Claim(e.ctx, cp); err != nil {
				e.t.Fatalf("Claim between pages: %v", err)
			}
		}
	}
	close(stop)
	wg.Wait()

	seen := map[uuid.UUID]bool{}
	for i, id := range got {
		if seen[id] {
			e.t.Errorf("lease %s listed twice", id)
		}
		seen[id] = true
		if i > 0 && !idBefore(id, got[i-1]) {
			e.t.Errorf("lease %s listed after %s, want newest first across pages", id, got[i-1])
		}
	}
	for _, l := range before {
		if !seen[l.ID] {
			e.t.Errorf("lease %s existed before paging began and was never listed", l.ID)
		}
	}
}

// testListFilters: each binding field filters on its own and together.
func testListFilters(e *env) {
	byBinding := map[lease.Binding]lease.Lease{}
	mixed := []lease.Binding{binding(1), binding(2), binding(3)}
	mixed = append(mixed, lease.Binding{OrganizationID: "org-1", WorkspaceID: "workspace-2", ThreadID: "thread-3", RunnerSessionID: "session-1"})
	for _, b := range mixed {
		e.prepare()
		byBinding[b] = e.mustLease(withBinding(b))
	}
	match := func(f lease.Binding) []uuid.UUID {
		var ls []lease.Lease
		for b, l := range byBinding {
			if (f.OrganizationID == "" || f.OrganizationID == b.OrganizationID) &&
				(f.WorkspaceID == "" || f.WorkspaceID == b.WorkspaceID) &&
				(f.ThreadID == "" || f.ThreadID == b.ThreadID) &&
				(f.RunnerSessionID == "" || f.RunnerSessionID == b.RunnerSessionID) {
				ls = append(ls, l)
			}
		}
		return newestFirst(ls...)
	}
	for _, f := range []lease.Binding{
		{OrganizationID: "org-1"},
		{WorkspaceID: "workspace-2"},
		{ThreadID: "thread-3"},
		{RunnerSessionID: "session-1"},
		{OrganizationID: "org-1", RunnerSessionID: "session-1"},
		{OrganizationID: "org-1", WorkspaceID: "workspace-2", ThreadID: "thread-3", RunnerSessionID: "session-1"},
		{OrganizationID: "org-2", RunnerSessionID: "session-1"},
		{ThreadID: "thread-9"},
		binding(2),
	} {
		want := match(f)
		e.wantIDs(ids(e.list(store.ListLeasesParams{Binding: f, Limit: 100})), want, fmt.Sprintf("filter %+v", f))
		e.wantIDs(e.listAll(store.ListLeasesParams{Binding: f}, 1), want, fmt.Sprintf("filter %+v in pages of 1", f))
	}
}

// testListLive: live is leased and not expired at Now, a pool cell whose
// release is recorded but not yet confirmed included; an expired lease the
// sweeper has not reached is not live.
func testListLive(e *env) {
	e.prepare()
	live := e.mustLease(withBinding(binding(1)))
	e.prepare()
	short := e.mustLease(withBinding(binding(2)), leaseSeconds(30))
	e.prepare()
	destroyed := e.mustLease(withBinding(binding(3)))
	_, err := e.destroy(destroyed.CellID, destroyed.ID, 2, lease.Destroyed)
	e.wantOK(err, "Destroy")
	_, _, stopping := e.poolLease()
	_, err = e.release(stopping, lease.Destroyed)
	e.wantOK(err, "Release")

	yes, no := true, false
	at := func(now time.Time, v *bool) []uuid.UUID {
		return ids(e.list(store.ListLeasesParams{Live: v, Now: now, Limit: 100}))
	}
	e.wantIDs(at(e.now, &yes), newestFirst(live, short, stopping), "live leases")
	e.wantIDs(at(e.now, &no), newestFirst(destroyed), "leases not live")
	e.wantIDs(at(e.now, nil), newestFirst(live, short, destroyed, stopping), "every lease")
	// At the short lease's expiry, and after it, it is no longer live,
	// though its cell still reads leased (nothing swept it).
	for _, now := range []time.Time{short.ExpiresAt.Add(-time.Microsecond), short.ExpiresAt, short.ExpiresAt.Add(time.Second)} {
		wantLive, wantNot := newestFirst(live, short, stopping), newestFirst(destroyed)
		if !now.Before(short.ExpiresAt) {
			wantLive, wantNot = newestFirst(live, stopping), newestFirst(short, destroyed)
		}
		e.wantIDs(at(now, &yes), wantLive, "live leases at "+now.Sub(short.ExpiresAt).String()+" from expiry")
		e.wantIDs(at(now, &no), wantNot, "leases not live at "+now.Sub(short.ExpiresAt).String()+" from expiry")
	}
	if c := e.cell(workerA, short.CellID); c.State != lease.Leased {
		e.t.Errorf("ListLeases changed the expired cell to %s", c.State)
	}
	// Live combines with the binding filters.
	e.wantIDs(ids(e.list(store.ListLeasesParams{Live: &yes, Binding: binding(2), Limit: 100})), newestFirst(short), "live with a filter")
	e.wantIDs(ids(e.list(store.ListLeasesParams{Live: &no, Binding: binding(2), Limit: 100})), nil, "not live with a filter")
}

// testListTenants: a tenant lists only its own leases.
func testListTenants(e *env) {
	e.prepare()
	a := e.mustLease()
	e.prepare(func(p *store.PrepareParams) { p.TenantID, p.WorkerID = tenantB, workerB })
	b := e.mustLease(asTenant(tenantB))
	before := e.snapshot()
	e.wantIDs(ids(e.list(store.ListLeasesParams{Limit: 100})), []uuid.UUID{a.ID}, "tenant A's leases")
	e.wantIDs(ids(e.list(store.ListLeasesParams{TenantID: tenantB, Limit: 100})), []uuid.UUID{b.ID}, "tenant B's leases")
	e.wantIDs(ids(e.list(store.ListLeasesParams{TenantID: "tenant-c", Limit: 100})), nil, "an unknown tenant's leases")
	// Tenant A's cursor names B's lease: still only A's leases.
	e.wantIDs(ids(e.list(store.ListLeasesParams{Before: uuid.Max, Binding: binding1, Limit: 100})), []uuid.UUID{a.ID}, "tenant A filtered")
	e.unchanged(before, "ListLeases")
}

func testListBadInput(e *env) {
	e.prepare()
	e.mustLease()
	for name, p := range map[string]store.ListLeasesParams{
		"no tenant":      {Limit: 10, Now: e.now},
		"limit 0":        {TenantID: tenantA, Now: e.now},
		"negative limit": {TenantID: tenantA, Limit: -1, Now: e.now},
	} {
		_, err := e.s.ListLeases(e.ctx, p)
		e.wantErr(err, errcode.ErrInvalidRequest, "ListLeases with "+name)
	}
}
