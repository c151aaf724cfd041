package sandboxwich_test

import (
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
)

func bindingN(i int) lease.Binding {
	return lease.Binding{OrganizationID: fmt.Sprintf("org-%d", i), WorkspaceID: "workspace-1",
		ThreadID: fmt.Sprintf("thread-%d", i%2), RunnerSessionID: fmt.Sprintf("session-%d", i)}
}

func (e *env) claimAs(t *testing.T, tenant string, b lease.Binding, seconds uint64) sandboxwich.ClaimResult {
	t.Helper()
	res, err := e.plane.Claim(e.ctx, tenant, sandboxwich.ClaimRequest{ClaimID: uuid.New(), Release: e.rel, Binding: b, LeaseSeconds: &seconds})
	if err != nil || res.Lease == nil {
		t.Fatalf("claim: %v, %v", res, err)
	}
	return res
}

func leaseIDs(ls []sandboxwich.LeaseSummary) []uuid.UUID {
	out := make([]uuid.UUID, len(ls))
	for i, l := range ls {
		out[i] = l.LeaseID
	}
	return out
}

// TestListLeasesPages: newest first, limit+1 decides the cursor (no empty
// last page), every item carries its binding, expiry and release set.
func TestListLeasesPages(t *testing.T) {
	e := newEnv(t)
	var want []uuid.UUID
	for i := range 4 {
		e.prepare(t)
		want = append([]uuid.UUID{e.claimAs(t, "acme", bindingN(i), 120).Lease.ID}, want...)
	}
	page, err := e.plane.ListLeases(e.ctx, "acme", sandboxwich.LeaseQuery{})
	if err != nil || !slices.Equal(leaseIDs(page.Leases), want) || page.NextCursor != "" {
		t.Fatalf("one page of every lease = %+v, %v; want %v and no cursor", page, err, want)
	}
	l := page.Leases[0]
	if l.Binding != bindingN(3) || l.ReleaseSetID != e.rel.ReleaseSetID || !l.ExpiresAt.Equal(e.now.Add(120*time.Second)) ||
		l.State != lease.Leased || l.Generation != 2 || l.Disposition != "" {
		t.Fatalf("listed lease = %+v", l)
	}
	var got []uuid.UUID
	q := sandboxwich.LeaseQuery{Limit: 2}
	for n := 0; ; n++ {
		page, err := e.plane.ListLeases(e.ctx, "acme", q)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, leaseIDs(page.Leases)...)
		if page.NextCursor == "" {
			if n != 1 || len(page.Leases) != 2 {
				t.Fatalf("pages of 2 over 4 leases ended at page %d with %d leases, want 2 full pages", n+1, len(page.Leases))
			}
			break
		}
		q.Cursor = page.NextCursor
	}
	if !slices.Equal(got, want) {
		t.Fatalf("pages = %v, want %v", got, want)
	}
	page, err = e.plane.ListLeases(e.ctx, "acme", sandboxwich.LeaseQuery{Binding: lease.Binding{ThreadID: "thread-1"}})
	if err != nil || !slices.Equal(leaseIDs(page.Leases), []uuid.UUID{want[0], want[2]}) {
		t.Fatalf("thread filter = %v, %v", leaseIDs(page.Leases), err)
	}
}

func TestListLeasesBadQuery(t *testing.T) {
	e := newEnv(t)
	for range 2 {
		e.prepare(t)
		e.claimAs(t, "acme", binding, 120)
	}
	page, err := e.plane.ListLeases(e.ctx, "acme", sandboxwich.LeaseQuery{Limit: 1})
	if err != nil || page.NextCursor == "" || len(page.Leases) != 1 {
		t.Fatalf("page = %+v, %v", page, err)
	}
	c := page.NextCursor
	// The format is the plane's business; these spell a version-1 cursor
	// of the nil UUID, one of version 0, and one of the lowest lease ID.
	nilCursor, v0 := "AQ"+strings.Repeat("A", 21), strings.Repeat("A", 23)
	low := base64.RawURLEncoding.EncodeToString([]byte{1, 15: 0, 16: 1})
	for name, tc := range map[string]struct {
		q   sandboxwich.LeaseQuery
		msg string
	}{
		"limit 1001":       {sandboxwich.LeaseQuery{Limit: 1001}, "limit must be from 1 to 1000"},
		"negative limit":   {sandboxwich.LeaseQuery{Limit: -1}, "limit"},
		"cursor garbage":   {sandboxwich.LeaseQuery{Cursor: "not a cursor"}, "cursor is invalid"},
		"cursor truncated": {sandboxwich.LeaseQuery{Cursor: c[:len(c)-1]}, "cursor is invalid"},
		"cursor extended":  {sandboxwich.LeaseQuery{Cursor: c + "A"}, "cursor is invalid"},
		"cursor padded":    {sandboxwich.LeaseQuery{Cursor: c + "="}, "cursor is invalid"},
		"cursor wrapped":   {sandboxwich.LeaseQuery{Cursor: c[:10] + "\n" + c[10:]}, "cursor is invalid"},
		"cursor version":   {sandboxwich.LeaseQuery{Cursor: v0}, "cursor is invalid"},
		"cursor of nil":    {sandboxwich.LeaseQuery{Cursor: nilCursor}, "cursor is invalid"},
		"bad session":      {sandboxwich.LeaseQuery{Binding: lease.Binding{RunnerSessionID: "a b"}}, "runner_session_id is invalid"},
		"bad organization": {sandboxwich.LeaseQuery{Binding: lease.Binding{OrganizationID: strings.Repeat("o", 257)}}, "organization_id is invalid"},
	} {
		_, err := e.plane.ListLeases(e.ctx, "acme", tc.q)
		if !errors.Is(err, errcode.ErrInvalidRequest) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want invalid_request %q", name, err, tc.msg)
		}
	}
	page, err = e.plane.ListLeases(e.ctx, "acme", sandboxwich.LeaseQuery{Cursor: c})
	if err != nil || len(page.Leases) != 1 || page.NextCursor != "" {
		t.Fatalf("second page = %+v, %v", page, err)
	}
	// A well-formed cursor is a position, whatever lease it names.
	page, err = e.plane.ListLeases(e.ctx, "acme", sandboxwich.LeaseQuery{Cursor: low})
	if err != nil || len(page.Leases) != 0 {
		t.Fatalf("page after the lowest position = %+v, %v", page, err)
	}
}

// TestListLeasesLive: a lease past its expiry that nothing swept is not
// live, though its cell still reads leased.
func TestListLeasesLive(t *testing.T) {
	e := newEnv(t)
	e.prepare(t)
	short := e.claimAs(t, "acme", bindingN(1), 30).Lease
	e.prepare(t)
	long := e.claimAs(t, "acme", bindingN(2), 300).Lease
	yes, no := true, false
	list := func(live *bool) []uuid.UUID {
		t.Helper()
		page, err := e.plane.ListLeases(e.ctx, "acme", sandboxwich.LeaseQuery{Live: live})
		if err != nil {
			t.Fatal(err)
		}
		return leaseIDs(page.Leases)
	}
	if got := list(&yes); !slices.Equal(got, []uuid.UUID{long.ID, short.ID}) {
		t.Fatalf("live = %v", got)
	}
	e.now = short.ExpiresAt
	if got := list(&yes); !slices.Equal(got, []uuid.UUID{long.ID}) {
		t.Fatalf("live at the short lease's expiry = %v", got)
	}
	if got := list(&no); !slices.Equal(got, []uuid.UUID{short.ID}) {
		t.Fatalf("not live at the short lease's expiry = %v", got)
	}
	if st, _ := e.plane.LeaseStatus(e.ctx, "acme", short.ID); st.State != lease.Leased {
		t.Fatalf("the expired lease's cell = %+v, want still leased (not swept)", st)
	}
}

// TestRevokeWorkerCell: an external worker's cell is quarantined at once;
// a repeat is 409, a foreign lease 404, and the holder's proof no longer
// validates.
func TestRevokeWorkerCell(t *testing.T) {
	e := newEnv(t)
	c := e.prepare(t)
	res := e.claimAs(t, "acme", binding, 120)
	if _, err := e.plane.Revoke(e.ctx, "globex", res.Lease.ID, ""); !errors.Is(err, errcode.ErrNotFound) {
		t.Fatalf("revoke of a foreign lease: %v", err)
	}
	if _, err := e.plane.Revoke(e.ctx, "acme", res.Lease.ID, "ready"); !errors.Is(err, errcode.ErrInvalidRequest) {
		t.Fatalf("revoke with a bad disposition: %v", err)
	}
	st, err := e.plane.Revoke(e.ctx, "acme", res.Lease.ID, lease.Destroyed)
	if err != nil || st.State != lease.Quarantined || st.Disposition != lease.Quarantined || st.PoolName != "" {
		t.Fatalf("revoke = %+v, %v; want quarantined", st, err)
	}
	cell, _, err := e.plane.WorkerCell(e.ctx, e.worker, c.ID)
	if err != nil || cell.State != lease.Quarantined {
		t.Fatalf("the worker sees %+v, %v", cell, err)
	}
	if _, err := e.plane.Validate(e.ctx, "acme", res.Lease.ID, res.Proof()); !errors.Is(err, lease.ErrNotLive) {
		t.Fatalf("validate after revoke: %v", err)
	}
	if _, err := e.plane.Revoke(e.ctx, "acme", res.Lease.ID, ""); !errors.Is(err, errcode.ErrConflict) || !errors.Is(err, lease.ErrNotLive) {
		t.Fatalf("second revoke: %v", err)
	}
}

// TestRevokePoolCellThenRelease: a revoked pool lease stops as on release
// (quarantined by default); the holder's release then conflicts, and once
// the pool proved the cell gone the lease is over.
func TestRevokePoolCellThenRelease(t *testing.T) {
	e := newEnv(t)
	e = newEnv(t, sandboxwich.WithPools(pool.Config{Name: "p1", TenantID: "acme", Release: e.rel, Target: 1,
		Provider: fake.New(fake.Config{Mode: driver.Apply})}))
	e.plane.Pools().Pass(e.ctx)
	res := e.claimAs(t, "acme", binding, 120)
	st, err := e.plane.Revoke(e.ctx, "acme", res.Lease.ID, "")
	if err != nil || st.State != lease.Leased || st.PoolName != "p1" {
		t.Fatalf("revoke = %+v, %v; want the stop recorded, the cell leased until proven", st, err)
	}
	if _, err := e.plane.Release(e.ctx, "acme", res.Lease.ID, res.Proof(), lease.Destroyed); !errors.Is(err, errcode.ErrConflict) {
		t.Fatalf("release after revoke: %v, want 409", err)
	}
	e.now = e.now.Add(time.Minute) // past the cleanup retry's backoff
	e.plane.Pools().Pass(e.ctx)
	st, err = e.plane.LeaseStatus(e.ctx, "acme", res.Lease.ID)
	if err != nil || st.State != lease.Quarantined || !st.ProviderAbsent {
		t.Fatalf("status after the pool's pass = %+v, %v; want quarantined and proven absent", st, err)
	}
	for _, d := range []lease.Disposition{lease.Destroyed, lease.Quarantined} {
		if _, err := e.plane.Release(e.ctx, "acme", res.Lease.ID, res.Proof(), d); !errors.Is(err, lease.ErrNotLive) {
			t.Fatalf("release (%s) after the revoked stop completed: %v", d, err)
		}
	}
	if _, err := e.plane.Revoke(e.ctx, "acme", res.Lease.ID, ""); !errors.Is(err, lease.ErrNotLive) {
		t.Fatalf("revoke after the stop completed: %v", err)
	}
}

// TestRevokeDestroyedDisposition: a pool cell revoked with destroyed ends
// destroyed once proven.
func TestRevokeDestroyedDisposition(t *testing.T) {
	e := newEnv(t)
	e = newEnv(t, sandboxwich.WithPools(pool.Config{Name: "p1", TenantID: "acme", Release: e.rel, Target: 1,
		Provider: fake.New(fake.Config{Mode: driver.Apply})}))
	e.plane.Pools().Pass(e.ctx)
	res := e.claimAs(t, "acme", binding, 120)
	if _, err := e.plane.Revoke(e.ctx, "acme", res.Lease.ID, lease.Destroyed); err != nil {
		t.Fatal(err)
	}
	e.plane.Pools().Pass(e.ctx)
	if st, err := e.plane.LeaseStatus(e.ctx, "acme", res.Lease.ID); err != nil || st.State != lease.Destroyed || !st.ProviderAbsent {
		t.Fatalf("status = %+v, %v; want destroyed, proven absent", st, err)
	}
}

// TestInventory: ready cells by release with the longest lease a claim
// finds now; a pool's release with nothing ready shows 0; other tenants'
// cells never.
func TestInventory(t *testing.T) {
	e := newEnv(t)
	other := lease.Release{ReleaseSetID: "release-set-0", RuntimeClass: lease.GVisorLowerRisk, PolicyDigest: strings.Repeat("b", 64)}
	other.Signature = e.keys.SignRelease(other)
	e = newEnv(t, sandboxwich.WithPools(pool.Config{Name: "p1", TenantID: "acme", Release: other, Target: 0,
		Provider: fake.New(fake.Config{})}), sandboxwich.WithMaxLeaseSeconds(600))
	prep := func(tenant string, in time.Duration) {
		w := e.worker
		w.TenantID = tenant
		if _, err := e.plane.Prepare(e.ctx, w, sandboxwich.PrepareRequest{CellID: uuid.New(), Release: e.rel,
			ProviderCellID: "p-" + uuid.NewString(), ExpiresAt: e.now.Add(in)}); err != nil {
			t.Fatal(err)
		}
	}
	prep("acme", 100*time.Second+500*time.Millisecond)
	prep("acme", 200*time.Second)
	prep("acme", time.Second) // outlives no lease
	prep("globex", time.Hour)
	inv, err := e.plane.Inventory(e.ctx, "acme")
	want := []sandboxwich.InventoryEntry{
		{ReleaseSetID: "release-set-0", RuntimeClass: lease.GVisorLowerRisk, PolicyDigest: other.PolicyDigest},
		{ReleaseSetID: e.rel.ReleaseSetID, RuntimeClass: e.rel.RuntimeClass, PolicyDigest: e.rel.PolicyDigest, Ready: 2, MaxLeaseSeconds: 199},
	}
	if err != nil || !slices.Equal(inv, want) {
		t.Fatalf("inventory = %+v, %v\nwant %+v", inv, err, want)
	}
	// The claim of the longest lease the inventory names succeeds; one
	// second more finds nothing.
	long, err := e.plane.Claim(e.ctx, "acme", sandboxwich.ClaimRequest{Release: e.rel, Binding: binding, LeaseSeconds: u64(200)})
	if err != nil || long.Lease != nil {
		t.Fatalf("claim of 200 s = %v, %v; want empty", long, err)
	}
	long, err = e.plane.Claim(e.ctx, "acme", sandboxwich.ClaimRequest{Release: e.rel, Binding: binding, LeaseSeconds: u64(199)})
	if err != nil || long.Lease == nil {
		t.Fatalf("claim of 199 s = %v, %v; want a lease", long, err)
	}
	inv, _ = e.plane.Inventory(e.ctx, "acme")
	if inv[1].Ready != 1 || inv[1].MaxLeaseSeconds != 100 {
		t.Fatalf("inventory after the claim = %+v", inv)
	}
	prep("acme", 2*time.Hour)
	if inv, _ = e.plane.Inventory(e.ctx, "acme"); inv[1].Ready != 2 || inv[1].MaxLeaseSeconds != 600 {
		t.Fatalf("inventory with a long-lived cell = %+v, want the plane's maximum lease", inv)
	}
	if inv, err := e.plane.Inventory(e.ctx, "initech"); err != nil || len(inv) != 0 {
		t.Fatalf("inventory of a tenant with nothing = %+v, %v", inv, err)
	}
}

// TestEvidenceOfWorkerCellAndUnknown: nothing was read back from an
// external worker's provider, so its lease has no evidence (404), like an
// unknown or foreign lease.
func TestEvidenceOfWorkerCellAndUnknown(t *testing.T) {
	e := newEnv(t)
	e.prepare(t)
	res := e.claimAs(t, "acme", binding, 120)
	for _, tc := range []struct {
		tenant string
		id     uuid.UUID
	}{{"acme", res.Lease.ID}, {"globex", res.Lease.ID}, {"acme", uuid.New()}} {
		if _, err := e.plane.Evidence(e.ctx, tc.tenant, tc.id); !errors.Is(err, errcode.ErrNotFound) {
			t.Errorf("evidence of %s as %s: %v, want not found", tc.id, tc.tenant, err)
		}
	}
}
