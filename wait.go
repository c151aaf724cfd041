package sandboxwich

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/pool"
	"github.com/sandboxwich/sandboxwich/store"
)

// MaxWaitSeconds is the longest a claim may wait for a cell (CONTRACT §21).
const MaxWaitSeconds = 300

const (
	// EmptyWaitElapsed: the claim waited wait_seconds and no cell came.
	EmptyWaitElapsed EmptyReason = "wait_elapsed"
	// EmptyCapacity: the claim waited wait_seconds and no cell came, and
	// its image class had no room to make one: max_cells of cells in use,
	// waited for, or of images used more recently (CONTRACT §21). Raising
	// max_cells is the remedy.
	EmptyCapacity EmptyReason = "capacity"
)

// waitPoll is how often the claim at the head of a wait queue tries again
// without being woken: cells admitted by another replica's reconciler, or
// freed by a concurrent claim's rollback, wake no one here.
const waitPoll = 250 * time.Millisecond

// waits holds the claims waiting for a cell in this process (CONTRACT §21):
// a queue per inventory, served first come first served (only the queue's
// head tries to claim), and the fenced waits in flight, which a retry of
// the same claim joins instead of waiting beside them.
type waits struct {
	mu      sync.Mutex
	changed chan struct{} // closed, and replaced, on every wake-up
	queues  map[string][]*waiter
	calls   map[string]*waitCall
}

// waiter is one claim in a queue.
type waiter struct{ key string }

// waitCall is a fenced wait in flight: the first request's, which its
// retries join.
type waitCall struct {
	digest string
	done   chan struct{}
	res    store.ClaimResult
	err    error
}

// wake wakes every waiting claim: a cell may be claimable.
func (w *waits) wake() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.wakeLocked()
}

func (w *waits) wakeLocked() {
	if w.changed != nil {
		close(w.changed)
	}
	w.changed = make(chan struct{})
}

// enqueue appends a waiter to the queue of key.
func (w *waits) enqueue(key string) *waiter {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.queues == nil {
		w.queues = map[string][]*waiter{}
	}
	wt := &waiter{key: key}
	w.queues[key] = append(w.queues[key], wt)
	return wt
}

// leave takes wt out of its queue and wakes the others: the next in line
// may be the head now.
func (w *waits) leave(wt *waiter) {
	w.mu.Lock()
	defer w.mu.Unlock()
	q := w.queues[wt.key]
	for i, o := range q {
		if o == wt {
			q = append(q[:i:i], q[i+1:]...)
			break
		}
	}
	if len(q) == 0 {
		delete(w.queues, wt.key)
	} else {
		w.queues[wt.key] = q
	}
	w.wakeLocked()
}

// turn reports whether wt heads its queue, and the channel the next
// wake-up closes.
func (w *waits) turn(wt *waiter) (head bool, changed <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.changed == nil {
		w.changed = make(chan struct{})
	}
	return w.queues[wt.key][0] == wt, w.changed
}

// WaitingClaims returns how many claims wait for a cell in this process
// (ClaimRequest.WaitSeconds).
func (p *Plane) WaitingClaims() int { return p.waits.count() }

// count returns how many claims wait.
func (w *waits) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, q := range w.queues {
		n += len(q)
	}
	return n
}

// join returns the fenced wait in flight under key, or registers a new one
// that run runs in its own goroutine; first reports which. A wait in
// flight under key with another digest is a conflict, as the fence row
// would be.
func (w *waits) join(key, digest string, run func() (store.ClaimResult, error)) (c *waitCall, first bool, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if c := w.calls[key]; c != nil {
		if c.digest != digest {
			return nil, false, errcode.New(errcode.Conflict, "claim_id was already used for a different claim")
		}
		return c, false, nil
	}
	if w.calls == nil {
		w.calls = map[string]*waitCall{}
	}
	c = &waitCall{digest: digest, done: make(chan struct{})}
	w.calls[key] = c
	go func() {
		c.res, c.err = run()
		w.mu.Lock()
		delete(w.calls, key)
		w.mu.Unlock()
		close(c.done)
	}()
	return c, true, nil
}

// claimWaiting runs a claim that may wait up to d for a cell (CONTRACT
// §21). A fenced one runs detached from ctx, bounded by d: its outcome is
// recorded whether or not its caller still listens, and a retry of it
// (same tenant, claim_id and digest) joins it and answers it as a replay.
// An unfenced one ends with ctx.
func (p *Plane) claimWaiting(ctx context.Context, params store.ClaimParams, d time.Duration, maker string) (store.ClaimResult, error) {
	if params.ClaimID == uuid.Nil {
		return p.wait(ctx, params, d, maker)
	}
	key := params.TenantID + "\x00" + params.ClaimID.String()
	c, first, err := p.waits.join(key, params.Digest, func() (store.ClaimResult, error) {
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d+time.Minute)
		defer cancel()
		return p.wait(wctx, params, d, maker)
	})
	if err != nil {
		return store.ClaimResult{}, err
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		return store.ClaimResult{}, ctx.Err()
	}
	res := c.res
	if !first {
		res.Replayed = true
	}
	return res, c.err
}

// wait is the wait itself: the claim queues behind the earlier waiting
// claims of its inventory; at the head it tries whenever it is woken (a
// cell admitted, a waiter gone) or waitPoll passed, recording nothing while
// it finds no cell; after d it tries once more, and records an empty
// outcome (wait_elapsed) if that finds none. d is measured on the
// monotonic clock, not the plane's (WithClock). While it waits, the image
// class maker (if any) keeps a cell of the claim's image coming for it.
func (p *Plane) wait(ctx context.Context, params store.ClaimParams, d time.Duration, maker string) (store.ClaimResult, error) {
	r := params.Release
	// The cells a claim may take are its inventory: tenant, release, image
	// and, for a claim that narrows egress, the pools that cover it.
	wt := p.waits.enqueue(strings.Join(append([]string{params.TenantID, r.ReleaseSetID, string(r.RuntimeClass), r.PolicyDigest,
		params.Image}, params.Pools...), "\x00"))
	defer p.waits.leave(wt)
	if maker != "" {
		defer p.pools.Want(maker, params.Image)()
	}
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	poll := time.NewTimer(0)
	defer poll.Stop()
	params.Waiting = true
	for {
		head, changed := p.waits.turn(wt)
		if head {
			params.Now = p.Now()
			res, err := p.store.Claim(ctx, params)
			if err != nil || res.Lease != nil || res.Replayed {
				return res, err
			}
			poll.Reset(waitPoll)
		}
		select {
		case <-changed:
		case <-poll.C:
		case <-deadline.C:
			params.Waiting, params.EmptyReason, params.Now = false, string(EmptyWaitElapsed), p.Now()
			if maker != "" && p.pools.Starved(maker, params.Image) {
				params.EmptyReason = string(EmptyCapacity)
			}
			return p.store.Claim(ctx, params)
		case <-ctx.Done():
			return store.ClaimResult{}, ctx.Err()
		}
	}
}

// imagePools checks the image a claim names (CONTRACT §21) and returns it
// in canonical form, with the image class that makes cells of it for
// waiting claims: the first of the tenant's pools of the release that
// serves the image, when that pool is an image class ("" otherwise). A
// claim without an image returns "", "". An image no such pool serves, or
// one not pinned by digest, is errcode.ErrImageNotAllowed.
func (p *Plane) imagePools(tenantID string, req ClaimRequest) (image, maker string, err error) {
	if req.Image == "" {
		return "", "", nil
	}
	image, _, err = pool.CanonicalImage(req.Image)
	if err != nil {
		return "", "", err
	}
	if p.pools != nil {
		for _, name := range p.pools.Names() {
			cfg, _ := p.pools.Pool(name)
			if cfg.TenantID == tenantID && cfg.Release == req.Release && cfg.Serves(image) {
				if cfg.ImageClass() {
					maker = name
				}
				return image, maker, nil
			}
		}
	}
	return "", "", errcode.New(errcode.ImageNotAllowed, "no pool of this release allows the image "+image)
}
