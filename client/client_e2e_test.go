package client_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/client"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/internal/testenv/testserver"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store/sqlite"
	"github.com/sandboxwich/sandboxwich/wire"
)

const (
	tenantToken   = testserver.TenantToken
	operatorToken = testserver.OperatorToken
	workerToken   = testserver.WorkerToken
	testPool      = testserver.Pool
)

// e2e is the real server (httpapi over a Plane over SQLite) behind an
// httptest.Server, with hooks to add pool cells and complete their stops the
// way the pool reconciler would.
type e2e struct {
	*testserver.Server
	url      string
	store    *sqlite.Store
	release  wire.Release
	workerID uuid.UUID
}

func startE2E(t *testing.T) *e2e {
	t.Helper()
	// A real pool that is never reconciled here: its cells are admitted
	// through the store (addPoolCell).
	s := testserver.Start(t, fake.New(fake.Config{}), 2)
	return &e2e{Server: s, url: s.URL, store: s.Store, release: s.Release, workerID: s.WorkerID}
}

// setWrap, when wrap is not nil, has it handle requests instead of the
// real handler (which it is given), to simulate faults the real server
// cannot produce.
func (e *e2e) setWrap(wrap func(real http.Handler, w http.ResponseWriter, r *http.Request)) {
	e.Wrap(wrap)
}

// addPoolCell admits a ready pool cell, as the pool reconciler would after
// provisioning and verifying it.
func (e *e2e) addPoolCell(t *testing.T) uuid.UUID { return e.AddPoolCell(t) }

// completeStop proves the provider object of a released pool cell gone.
func (e *e2e) completeStop(t *testing.T, cellID, leaseID uuid.UUID, d lease.Disposition) {
	e.CompleteStop(t, cellID, leaseID, d)
}

func (e *e2e) client(t *testing.T, opts ...client.Option) *client.Client {
	t.Helper()
	opts = append([]client.Option{client.WithToken(tenantToken), client.WithRetry(5, time.Millisecond, 10*time.Millisecond)}, opts...)
	c, err := client.New(e.url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (e *e2e) claimRequest() wire.ClaimRequest {
	return wire.ClaimRequest{Release: e.release, Binding: wire.Binding{
		OrganizationID: "org-1", WorkspaceID: "workspace-1", ThreadID: "thread-1", RunnerSessionID: "session-1"}}
}

func TestE2EClaimValidateReleaseWait(t *testing.T) {
	e := startE2E(t)
	ctx := context.Background()
	cellID := e.addPoolCell(t)
	c := e.client(t)

	cl, err := c.Claim(ctx, e.claimRequest())
	if err != nil {
		t.Fatal(err)
	}
	if cl.Empty() || cl.Lease.CellID != cellID || cl.Lease.Generation != 2 || !strings.HasPrefix(cl.Attestation(), "swla1_") ||
		cl.ClaimID.Version() != 7 || cl.Lease.Binding != e.claimRequest().Binding || cl.Lease.Release != e.release {
		t.Fatalf("Claim = %v", cl)
	}

	// A replay of the fenced claim returns the same lease and attestation.
	req := e.claimRequest()
	req.ClaimID = &cl.ClaimID
	again, err := c.Claim(ctx, req)
	if err != nil || again.Lease.LeaseID != cl.Lease.LeaseID || again.Attestation() != cl.Attestation() {
		t.Fatalf("replayed Claim = %v, %v", again, err)
	}

	got, err := c.Validate(ctx, cl.Lease.LeaseID, cl.Proof())
	if err != nil || got.LeaseID != cl.Lease.LeaseID || got.CellID != cellID || !got.ExpiresAt.Equal(cl.Lease.ExpiresAt.Time) {
		t.Fatalf("Validate = %+v, %v", got, err)
	}

	st, err := c.Lease(ctx, cl.Lease.LeaseID)
	if err != nil || st.State != lease.Leased || st.ProviderAbsent || st.Disposition != nil {
		t.Fatalf("Lease = %+v, %v", st, err)
	}

	st, err = c.Release(ctx, cl.Lease.LeaseID, cl.Proof(), lease.Destroyed)
	if err != nil || st.LeaseID != cl.Lease.LeaseID || st.ProviderAbsent {
		t.Fatalf("Release = %+v, %v", st, err)
	}

	// The "pool" proves the deletion a little later.
	time.AfterFunc(50*time.Millisecond, func() { e.completeStop(t, cellID, cl.Lease.LeaseID, lease.Destroyed) })
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err = c.WaitProviderAbsent(wctx, cl.Lease.LeaseID, 10*time.Millisecond)
	if err != nil || !st.ProviderAbsent || st.State != lease.Destroyed || st.Disposition == nil || *st.Disposition != lease.Destroyed {
		t.Fatalf("WaitProviderAbsent = %+v, %v", st, err)
	}

	// The ended lease grants nothing any more; its fenced claim cannot
	// regenerate it.
	if _, err := c.Validate(ctx, cl.Lease.LeaseID, cl.Proof()); !errors.Is(err, errcode.ErrConflict) {
		t.Errorf("Validate after the end: %v", err)
	}
	if _, err := c.Claim(ctx, req); !errors.Is(err, errcode.ErrConflict) {
		t.Errorf("replayed Claim after the end: %v", err)
	}
}

func TestE2EEmptyClaimIsFenced(t *testing.T) {
	e := startE2E(t)
	ctx := context.Background()
	c := e.client(t)
	cl, err := c.Claim(ctx, e.claimRequest())
	if err != nil || !cl.Empty() || cl.Attestation() != "" {
		t.Fatalf("Claim = %v, %v", cl, err)
	}
	e.addPoolCell(t)
	req := e.claimRequest()
	req.ClaimID = &cl.ClaimID
	if again, err := c.Claim(ctx, req); err != nil || !again.Empty() {
		t.Errorf("replay of an empty claim = %v, %v", again, err)
	}
	// A new claim ID gets the cell.
	if fresh, err := c.Claim(ctx, e.claimRequest()); err != nil || fresh.Empty() {
		t.Errorf("new claim = %v, %v", fresh, err)
	}
}

// TestE2ELostClaimResponse drops the answer of a claim the real server has
// carried out: the client's retry, under the same claim_id, gets the same
// lease, and the second ready cell stays in inventory.
func TestE2ELostClaimResponse(t *testing.T) {
	e := startE2E(t)
	ctx := context.Background()
	first, second := e.addPoolCell(t), e.addPoolCell(t)
	var (
		mu     sync.Mutex
		bodies [][]byte
	)
	e.setWrap(func(real http.Handler, w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, body)
		n := len(bodies)
		mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
		if n <= 2 { // carried out, answer lost
			real.ServeHTTP(httptest.NewRecorder(), r)
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				_ = conn.Close()
			}
			return
		}
		real.ServeHTTP(w, r)
	})
	c := e.client(t)
	cl, err := c.Claim(ctx, e.claimRequest())
	if err != nil {
		t.Fatal(err)
	}
	e.setWrap(nil)
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) != 3 || !bytes.Equal(bodies[0], bodies[1]) || !bytes.Equal(bodies[1], bodies[2]) {
		t.Fatalf("bodies sent: %q", bodies)
	}
	if cl.Empty() || cl.Lease.CellID != first {
		t.Fatalf("Claim = %v, want the oldest cell %s", cl, first)
	}
	if _, err := c.Validate(ctx, cl.Lease.LeaseID, cl.Proof()); err != nil {
		t.Errorf("Validate: %v", err)
	}
	other, err := c.Claim(ctx, e.claimRequest())
	if err != nil || other.Empty() || other.Lease.CellID != second {
		t.Errorf("next claim = %v, %v; want the second cell, still ready", other, err)
	}
}

func TestE2EErrors(t *testing.T) {
	e := startE2E(t)
	ctx := context.Background()
	e.addPoolCell(t)
	c := e.client(t)
	cl, err := c.Claim(ctx, e.claimRequest())
	if err != nil || cl.Empty() {
		t.Fatal(cl, err)
	}

	bad := cl.Proof()
	bad.LeaseAttestation = "swla1_" + strings.Repeat("A", 43)
	_, err = c.Validate(ctx, cl.Lease.LeaseID, bad)
	if e, ok := errors.AsType[*client.Error](err); !ok || e.Status != 409 || e.Code != errcode.Conflict || e.RequestID == "" {
		t.Errorf("Validate with a wrong attestation: %#v", err)
	}
	if strings.Contains(err.Error(), cl.Attestation()) || strings.Contains(err.Error(), bad.LeaseAttestation) {
		t.Errorf("error quotes an attestation: %v", err)
	}
	if _, err := c.Lease(ctx, uuid.Must(uuid.NewV7())); !errors.Is(err, errcode.ErrNotFound) {
		t.Errorf("unknown lease: %v", err)
	}
	if _, err := e.client(t, client.WithToken("nope")).Lease(ctx, cl.Lease.LeaseID); !errors.Is(err, errcode.ErrUnauthorized) {
		t.Errorf("bad token: %v", err)
	}
	wrongRel := e.claimRequest()
	wrongRel.Release.Signature = "swrs1_" + strings.Repeat("A", 43)
	if _, err := c.Claim(ctx, wrongRel); !errors.Is(err, errcode.ErrAuthorizationDenied) {
		t.Errorf("bad release signature: %v", err)
	}
	badBinding := e.claimRequest()
	badBinding.WorkspaceID = "white space"
	if _, err := c.Claim(ctx, badBinding); !errors.Is(err, errcode.ErrBadRequest) {
		t.Errorf("bad binding: %v", err)
	}
	// The plane has no provider with exec.
	if _, err := c.Run(ctx, cl.Lease.LeaseID, cl.Proof(), client.Command{Argv: []string{"true"}}); !errors.Is(err, errcode.ErrExecUnsupported) {
		t.Errorf("exec: %v", err)
	}
	// A release with the other disposition after the first is a cleanup
	// fence mismatch.
	if _, err := c.Release(ctx, cl.Lease.LeaseID, cl.Proof(), lease.Destroyed); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Release(ctx, cl.Lease.LeaseID, cl.Proof(), lease.Quarantined); !errors.Is(err, errcode.ErrConflict) {
		t.Errorf("release with another disposition: %v", err)
	}
}

func TestE2EPools(t *testing.T) {
	e := startE2E(t)
	ctx := context.Background()
	e.addPoolCell(t)
	pools, err := e.client(t, client.WithOperatorToken(operatorToken)).Pools(ctx)
	if err != nil || len(pools) != 1 || pools[0].Name != testPool || pools[0].Members["ready"] != 1 || pools[0].Mode != "dry_run" {
		t.Fatalf("Pools = %+v, %v", pools, err)
	}
	if _, err := e.client(t).Pools(ctx); !errors.Is(err, errcode.ErrUnauthorized) {
		t.Errorf("Pools without the operator token: %v", err)
	}
	if _, err := e.client(t, client.WithOperatorToken("wrong")).Pools(ctx); !errors.Is(err, errcode.ErrUnauthorized) {
		t.Errorf("Pools with a wrong operator token: %v", err)
	}
}

func TestE2EWorker(t *testing.T) {
	e := startE2E(t)
	ctx := context.Background()
	w := e.client(t, client.WithToken(workerToken))
	cellID := uuid.Must(uuid.NewV7())
	cell, err := w.Prepare(ctx, e.workerID, wire.PrepareRequest{CellID: cellID, Release: e.release, ProviderCellID: "vm-1",
		ExpiresAt: wire.Time{Time: time.Now().Add(10 * time.Minute)}})
	if err != nil || cell.CellID != cellID || cell.State != lease.Ready || cell.Generation != 1 || cell.Disposition != nil {
		t.Fatalf("Prepare = %+v, %v", cell, err)
	}
	if _, err := w.Prepare(ctx, e.workerID, wire.PrepareRequest{CellID: cellID, Release: e.release, ProviderCellID: "vm-2",
		ExpiresAt: wire.Time{Time: time.Now().Add(10 * time.Minute)}}); !errors.Is(err, errcode.ErrConflict) {
		t.Errorf("Prepare with a reused cell ID: %v", err)
	}

	tenant := e.client(t)
	cl, err := tenant.Claim(ctx, e.claimRequest())
	if err != nil || cl.Empty() || cl.Lease.CellID != cellID {
		t.Fatalf("Claim = %v, %v", cl, err)
	}
	// A worker-prepared cell is released by its worker, not the tenant.
	if _, err := tenant.Release(ctx, cl.Lease.LeaseID, cl.Proof(), lease.Destroyed); !errors.Is(err, errcode.ErrNotFound) {
		t.Errorf("tenant release of a worker cell: %v", err)
	}

	wc, err := w.WorkerCell(ctx, e.workerID, cellID)
	if err != nil || wc.Cell.State != lease.Leased || wc.Claim == nil || wc.Claim.LeaseID != cl.Lease.LeaseID ||
		wc.Claim.ClaimID != cl.ClaimID {
		t.Fatalf("WorkerCell = %+v, %v", wc, err)
	}
	cell, err = w.Destroy(ctx, e.workerID, cellID, wire.DestroyRequest{LeaseID: cl.Lease.LeaseID, Generation: 2, Disposition: lease.Destroyed})
	if err != nil || cell.State != lease.Destroyed || cell.Disposition == nil || *cell.Disposition != lease.Destroyed {
		t.Fatalf("Destroy = %+v, %v", cell, err)
	}

	other := uuid.Must(uuid.NewV7())
	if _, err := w.Prepare(ctx, e.workerID, wire.PrepareRequest{CellID: other, Release: e.release, ProviderCellID: "vm-3",
		ExpiresAt: wire.Time{Time: time.Now().Add(time.Minute)}}); err != nil {
		t.Fatal(err)
	}
	cell, err = w.Retire(ctx, e.workerID, other, 1)
	if err != nil || cell.State != lease.Quarantined {
		t.Fatalf("Retire = %+v, %v", cell, err)
	}
	if _, err := w.WorkerCell(ctx, uuid.Must(uuid.NewV7()), other); !errors.Is(err, errcode.ErrNotFound) {
		t.Errorf("another worker's path: %v", err)
	}
}
