package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/wire"
)

// ErrLifetimeCap ends a [KeepAlive] whose lease could be renewed no
// further: the cell's lifetime cap (CONTRACT §20) stopped its expiry from
// moving, and the lease has now ended.
var ErrLifetimeCap = errors.New("client: the lease reached its cell's lifetime cap")

// ErrLeaseExpired ends a [KeepAlive] whose lease expired while its
// renewals kept failing transiently (transport errors, 5xx, 429).
var ErrLeaseExpired = errors.New("client: the lease expired before a renewal succeeded")

// minRenewWait is the shortest wait between two renewals of a KeepAlive,
// so that a lease about to end (or a clock far from the server's) never
// makes it spin.
const minRenewWait = 100 * time.Millisecond

// KeepAlive renews one lease in the background until it is stopped; make
// it with [Client.KeepAlive]. Its methods are safe for concurrent use.
//
// It reports how it ended through Done and Err, as a context does: Done is
// closed once it has ended, and Err then says why — nil after Stop, the
// context's error when the context given to Client.KeepAlive ended, and
// otherwise the failure that ended it:
//
//   - a refused renewal (the lease was released, revoked or expired, or
//     the fence is wrong: errcode.ErrConflict; an unknown lease:
//     errcode.ErrNotFound; any other answer that no retry can change);
//   - ErrLeaseExpired (wrapping the last failure) when transient failures
//     lasted until the lease's expiry;
//   - ErrLifetimeCap once the lease ended at its cell's lifetime cap.
//
// A caller running work under the lease selects on Done to learn that
// the lease is over, and calls Stop before releasing the lease.
//
// Formatting a KeepAlive never shows the lease attestation it holds.
type KeepAlive struct {
	c            *Client
	leaseID      uuid.UUID
	proof        wire.LeaseProof
	leaseSeconds uint64

	cancel  context.CancelFunc
	done    chan struct{}
	stopped atomic.Bool

	mu        sync.Mutex
	expiresAt time.Time
	err       error
}

// KeepAlive starts renewing a live lease in the background, each renewal
// asking for leaseSeconds (as [Client.Renew]; at most the server's maximum
// lease length), until Stop is called, ctx ends or a renewal fails for
// good. expiresAt is the lease's current expiry (the claim's
// Lease.ExpiresAt); a zero one renews at once.
//
// It renews once a third of the remaining life (the last known expiry −
// now, on the local clock) has passed, so two thirds remain for retries,
// and reads the new expiry from each answer. A renewal that fails
// transiently is tried again (Renew's own retries, then again on the same
// schedule) until the lease expires; a refusal ends the keep-alive at
// once. When the cell's lifetime cap stops the expiry from moving, it
// renews no more: it waits until the lease ends and then ends with
// ErrLifetimeCap. See [KeepAlive] for how it reports its end.
//
// Call [KeepAlive.Stop] before releasing the lease: a renewal racing the
// release would be refused, and Stop waits for any renewal in flight.
func (c *Client) KeepAlive(ctx context.Context, leaseID uuid.UUID, proof wire.LeaseProof, leaseSeconds uint64, expiresAt time.Time) *KeepAlive {
	ctx, cancel := context.WithCancel(ctx)
	k := &KeepAlive{c: c, leaseID: leaseID, proof: proof, leaseSeconds: leaseSeconds,
		cancel: cancel, done: make(chan struct{}), expiresAt: expiresAt}
	go k.run(ctx)
	return k
}

// Done is closed when the keep-alive has ended; Err then says why.
func (k *KeepAlive) Done() <-chan struct{} { return k.done }

// Err is nil while the keep-alive runs and after Stop; otherwise, once
// Done is closed, what ended it (see [KeepAlive]).
func (k *KeepAlive) Err() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.err
}

// ExpiresAt is the lease's expiry as last known: the expiry given to
// Client.KeepAlive, then that of the last renewal's answer.
func (k *KeepAlive) ExpiresAt() time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.expiresAt
}

// Stop stops renewing, waits until a renewal in flight has ended, and
// returns Err: nil if the keep-alive was still running, else what had
// ended it. It is safe to call more than once.
func (k *KeepAlive) Stop() error {
	k.stopped.Store(true)
	k.cancel()
	<-k.done
	return k.Err()
}

// String describes the keep-alive without the attestation.
func (k *KeepAlive) String() string {
	return fmt.Sprintf("client.KeepAlive{lease_id=%s, lease_seconds=%d, expires_at=%s}",
		k.leaseID, k.leaseSeconds, k.ExpiresAt().UTC().Format(time.RFC3339Nano))
}

// Format writes String for every verb, so that no verb shows the
// attestation.
func (k *KeepAlive) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(k.String())) }

func (k *KeepAlive) run(ctx context.Context) {
	err := k.loop(ctx)
	if ctx.Err() != nil && k.stopped.Load() && errors.Is(err, context.Canceled) {
		err = nil
	}
	k.mu.Lock()
	k.err = err
	k.mu.Unlock()
	k.cancel()
	close(k.done)
}

// loop renews until ctx ends (its error is returned) or the keep-alive
// ends by itself (the reason is returned).
func (k *KeepAlive) loop(ctx context.Context) error {
	var lastErr error // of the last renewal, when it failed transiently
	for {
		exp := k.ExpiresAt()
		remaining := time.Until(exp)
		if lastErr != nil && remaining <= 0 {
			return fmt.Errorf("client: keep-alive of lease %s: it expired at %s: %w: %w",
				k.leaseID, exp.UTC().Format(time.RFC3339Nano), ErrLeaseExpired, lastErr)
		}
		if !exp.IsZero() {
			if err := k.c.sleep(ctx, max(remaining/3, minRenewWait)); err != nil {
				return err
			}
		}
		sent := time.Now()
		l, err := k.renew(ctx, exp)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil && (transient(err) || errors.Is(err, context.DeadlineExceeded)):
			if lastErr == nil || !errors.Is(err, context.DeadlineExceeded) {
				lastErr = err // keep the server's answer over the expiry's deadline
			}
			continue
		case err != nil:
			return fmt.Errorf("client: keep-alive of lease %s: %w", k.leaseID, err)
		}
		lastErr = nil
		got := l.ExpiresAt.Time
		k.mu.Lock()
		k.expiresAt = got // the server's word, even over a wrong expiresAt
		k.mu.Unlock()
		if got.After(exp) || got.Sub(sent) >= time.Duration(max(k.leaseSeconds, 1))*time.Second {
			continue // extended, or still longer than asked for
		}
		// The cap holds the expiry: renew no more, report when it ends.
		if err := k.c.sleep(ctx, time.Until(got)); err != nil {
			return err
		}
		return fmt.Errorf("client: keep-alive of lease %s: it ended at %s: %w",
			k.leaseID, got.UTC().Format(time.RFC3339Nano), ErrLifetimeCap)
	}
}

// renew makes one renewal (with Renew's retries), bounded by the lease's
// known expiry: after it, the lease is over whatever the answer.
func (k *KeepAlive) renew(ctx context.Context, exp time.Time) (wire.Lease, error) {
	if !exp.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, exp)
		defer cancel()
	}
	return k.c.Renew(ctx, k.leaseID, k.proof, k.leaseSeconds)
}
