package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/client"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/wire"
)

// claimFor claims a cell for a lease of leaseSeconds.
func (e *e2e) claimFor(t *testing.T, c *client.Client, leaseSeconds uint64) client.Claim {
	t.Helper()
	req := e.claimRequest()
	req.LeaseSeconds = &leaseSeconds
	cl, err := c.Claim(context.Background(), req)
	if err != nil || cl.Empty() {
		t.Fatalf("claim: %v %v", cl, err)
	}
	return cl
}

// prepareCellUntil registers a ready cell of the e2e worker that ends at
// expiresAt (its lifetime cap, CONTRACT §20).
func (e *e2e) prepareCellUntil(t *testing.T, expiresAt time.Time) uuid.UUID {
	t.Helper()
	w := e.client(t, client.WithToken(workerToken))
	id := uuid.Must(uuid.NewV7())
	if _, err := w.Prepare(context.Background(), e.workerID, wire.PrepareRequest{CellID: id, Release: e.release,
		ProviderCellID: "vm-" + id.String(), ExpiresAt: wire.Time{Time: expiresAt}}); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestE2ERenew: a renewal moves expires_at and nothing else, never
// shortens the lease, keeps the attestation (a fenced claim retry answers
// the same one with the current expiry); a wrong fence is a conflict, an
// unknown lease not found, a released one a conflict.
func TestE2ERenew(t *testing.T) {
	e := startE2E(t)
	ctx := context.Background()
	c := e.client(t)
	cellID := e.addPoolCell(t)
	cl := e.claimFor(t, c, 60)
	before := cl.Lease.ExpiresAt.Time

	got, err := c.Renew(ctx, cl.Lease.LeaseID, cl.Proof(), 300)
	if err != nil {
		t.Fatalf("Renew: %v", err)
	}
	if !got.ExpiresAt.After(before.Add(200*time.Second)) || got.ExpiresAt.After(time.Now().Add(301*time.Second)) {
		t.Errorf("Renew expires_at = %s, claim's %s", got.ExpiresAt.Time, before)
	}
	want := *cl.Lease
	want.ExpiresAt = got.ExpiresAt
	if got != want || got.CellID != cellID {
		t.Errorf("Renew = %+v, want the claim's lease with the new expiry %+v", got, want)
	}
	if v, err := c.Validate(ctx, cl.Lease.LeaseID, cl.Proof()); err != nil || !v.ExpiresAt.Equal(got.ExpiresAt.Time) {
		t.Errorf("Validate after Renew = %+v, %v", v, err)
	}

	// A shorter renewal never shortens the lease.
	short, err := c.Renew(ctx, cl.Lease.LeaseID, cl.Proof(), 1)
	if err != nil || !short.ExpiresAt.Equal(got.ExpiresAt.Time) {
		t.Errorf("Renew(1) = %+v, %v; want the expiry kept at %s", short, err, got.ExpiresAt.Time)
	}

	// The attestation did not change: the fenced claim retry regenerates
	// it and shows the current expiry.
	req := e.claimRequest()
	req.ClaimID = &cl.ClaimID
	lease60 := uint64(60)
	req.LeaseSeconds = &lease60
	again, err := c.Claim(ctx, req)
	if err != nil || again.Empty() || again.Attestation() != cl.Attestation() || again.Lease.LeaseID != cl.Lease.LeaseID ||
		!again.Lease.ExpiresAt.Equal(got.ExpiresAt.Time) {
		t.Errorf("fenced claim retry after Renew = %v, %v", again, err)
	}

	wrong := cl.Proof()
	wrong.ThreadID = "thread-2"
	if _, err := c.Renew(ctx, cl.Lease.LeaseID, wrong, 300); !errors.Is(err, errcode.ErrConflict) {
		t.Errorf("Renew with a wrong fence: %v", err)
	} else if e, ok := errors.AsType[*client.Error](err); !ok || e.Code != errcode.Conflict || e.Status != 409 {
		t.Errorf("Renew with a wrong fence: %#v", err)
	}
	if _, err := c.Renew(ctx, uuid.Must(uuid.NewV7()), cl.Proof(), 300); !errors.Is(err, errcode.ErrNotFound) {
		t.Errorf("Renew of an unknown lease: %v", err)
	}
	if v, err := c.Validate(ctx, cl.Lease.LeaseID, cl.Proof()); err != nil || !v.ExpiresAt.Equal(got.ExpiresAt.Time) {
		t.Errorf("refused renewals changed the lease: %+v, %v", v, err)
	}

	if _, err := c.Release(ctx, cl.Lease.LeaseID, cl.Proof(), lease.Destroyed); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Renew(ctx, cl.Lease.LeaseID, cl.Proof(), 300); !errors.Is(err, errcode.ErrConflict) {
		t.Errorf("Renew after Release: %v", err)
	}
}

// TestE2EKeepAlive runs the keep-alive against the real server with
// two-second leases (CONTRACT §20; the real clock, so the cases run in
// parallel, each on its own server).
func TestE2EKeepAlive(t *testing.T) {
	const leaseSeconds = 2
	life := time.Duration(leaseSeconds) * time.Second

	// A lease kept alive for three times its length; Stop then ends the
	// renewals, and the lease expires.
	t.Run("keeps alive, stops on Stop", func(t *testing.T) {
		t.Parallel()
		e := startE2E(t)
		ctx := context.Background()
		c := e.client(t)
		e.prepareCell(t) // ends in ten minutes
		cl := e.claimFor(t, c, leaseSeconds)
		first := cl.Lease.ExpiresAt.Time
		ka := c.KeepAlive(ctx, cl.Lease.LeaseID, cl.Proof(), leaseSeconds, first)
		if s := fmt.Sprintf("%v %+v %#v %s", ka, ka, ka, ka); strings.Contains(s, cl.Attestation()) || !strings.Contains(s, cl.Lease.LeaseID.String()) {
			t.Errorf("KeepAlive shows the attestation: %s", s)
		}
		select {
		case <-ka.Done():
			t.Fatalf("keep-alive ended: %v", ka.Err())
		case <-time.After(3 * life):
		}
		if time.Now().Before(first) {
			t.Fatal("the first expiry has not passed")
		}
		v, err := c.Validate(ctx, cl.Lease.LeaseID, cl.Proof())
		if err != nil || !v.ExpiresAt.After(first.Add(life)) || ka.Err() != nil {
			t.Fatalf("after 3 leases: Validate = %+v, %v; keep-alive: %v", v, err, ka.Err())
		}
		if !ka.ExpiresAt().After(first.Add(life)) {
			t.Errorf("ExpiresAt = %s, first expiry %s", ka.ExpiresAt(), first)
		}
		if err := ka.Stop(); err != nil {
			t.Fatalf("Stop = %v", err)
		}
		select {
		case <-ka.Done():
		default:
			t.Fatal("Done not closed after Stop")
		}
		if err := ka.Stop(); err != nil || ka.Err() != nil {
			t.Errorf("second Stop = %v, Err = %v", err, ka.Err())
		}
		// Nothing renews it any more: it expires.
		time.Sleep(time.Until(ka.ExpiresAt()) + 200*time.Millisecond)
		if _, err := c.Validate(ctx, cl.Lease.LeaseID, cl.Proof()); !errors.Is(err, errcode.ErrConflict) {
			t.Errorf("Validate after Stop and the expiry: %v", err)
		}
	})

	// A lease released by another call: the next renewal is refused, and
	// the keep-alive reports it.
	t.Run("reports a refused renewal", func(t *testing.T) {
		t.Parallel()
		e := startE2E(t)
		ctx := context.Background()
		c := e.client(t)
		e.addPoolCell(t)
		cl := e.claimFor(t, c, leaseSeconds)
		ka := c.KeepAlive(ctx, cl.Lease.LeaseID, cl.Proof(), leaseSeconds, cl.Lease.ExpiresAt.Time)
		defer ka.Stop()
		if _, err := c.Release(ctx, cl.Lease.LeaseID, cl.Proof(), lease.Destroyed); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ka.Done():
		case <-time.After(2 * life):
			t.Fatal("keep-alive still running after its lease was released")
		}
		err := ka.Err()
		if !errors.Is(err, errcode.ErrConflict) || !strings.Contains(err.Error(), cl.Lease.LeaseID.String()) {
			t.Errorf("Err = %v, want a conflict naming the lease", err)
		}
		if serr := ka.Stop(); !errors.Is(serr, errcode.ErrConflict) {
			t.Errorf("Stop after the failure = %v, want the failure", serr)
		}
	})

	// An external worker's cell ends at its prepared expires_at, the
	// lease's lifetime cap: the keep-alive renews up to it, then waits for
	// the end without renewing and reports the cap.
	t.Run("lifetime cap", func(t *testing.T) {
		t.Parallel()
		e := startE2E(t)
		ctx := context.Background()
		c := e.client(t)
		capAt := time.Now().Add(2*life + 500*time.Millisecond).Truncate(time.Millisecond)
		e.prepareCellUntil(t, capAt)
		cl := e.claimFor(t, c, leaseSeconds)
		var renewals atomic.Int32
		e.setWrap(func(real http.Handler, w http.ResponseWriter, r *http.Request) {
			if strings.HasSuffix(r.URL.Path, "/renew") {
				renewals.Add(1)
			}
			real.ServeHTTP(w, r)
		})
		ka := c.KeepAlive(ctx, cl.Lease.LeaseID, cl.Proof(), leaseSeconds, cl.Lease.ExpiresAt.Time)
		defer ka.Stop()
		select {
		case <-ka.Done():
		case <-time.After(4 * life):
			t.Fatal("keep-alive still running after the cap")
		}
		if err := ka.Err(); !errors.Is(err, client.ErrLifetimeCap) {
			t.Fatalf("Err = %v, want ErrLifetimeCap", err)
		}
		if time.Now().Before(capAt) || !ka.ExpiresAt().Equal(capAt) {
			t.Errorf("ended at %s with expiry %s, cap %s", time.Now(), ka.ExpiresAt(), capAt)
		}
		// Reaching the cap took renewals (checked above); a keep-alive that
		// kept renewing once the expiry held would make dozens: renewals
		// are a third of the remaining life apart, at least 100 ms, so no
		// load makes more.
		if n := renewals.Load(); n == 0 || n > 8 {
			t.Errorf("%d renewals", n)
		}
	})
}
