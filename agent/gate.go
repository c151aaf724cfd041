package agent

import (
	"fmt"
	"time"
)

// Gate is the fence rules a cell agent applies (CONTRACT §13), without
// the agent: waiting, then active for exactly one fence until its
// deadline (activation + TTL), then ended. It decides; the agent acts
// (starts its timer, kills the cell's processes at the end).
//
// A Gate is pure: the time is a parameter (a cell agent passes its
// monotonic clock's reading, a fake its test clock), it starts no
// goroutine and does no I/O. It is not safe for concurrent use: its
// agent guards it with its own lock.
type Gate struct {
	cellID   string
	state    State
	bound    Activation
	deadline time.Time
}

// NewGate returns a waiting gate for the agent of cellID.
func NewGate(cellID string) *Gate { return &Gate{cellID: cellID, state: Waiting} }

// State reports the gate's state at now. An active gate whose deadline
// is not after now has ended, and stays ended.
func (g *Gate) State(now time.Time) State {
	if g.state == Active && !now.Before(g.deadline) {
		g.state = Ended
	}
	return g.state
}

// Deadline is the bound activation's deadline (its TTL from its
// activation); zero while waiting.
func (g *Gate) Deadline() time.Time { return g.deadline }

// Activate binds a waiting gate to act's fence until now + act.TTLMillis,
// and reports true; or accepts a replay of the bound activation (see
// replay), reporting false and changing nothing. A malformed activation
// is ErrInvalid; one for another cell, or another fence, ErrFenceRefused;
// a replay after the end, ErrExpired.
func (g *Gate) Activate(now time.Time, act Activation) (bound bool, err error) {
	switch {
	case act.Version != ProtocolVersion:
		return false, Errorf(CodeInvalid, fmt.Sprintf("activation version %d is not %d", act.Version, ProtocolVersion))
	case act.CellID != g.cellID:
		return false, Errorf(CodeFenceRefused, "the activation names another cell")
	case act.LeaseID == "" || act.Generation < 1:
		return false, Errorf(CodeInvalid, "an activation needs a lease_id and a generation ≥ 1")
	}
	if g.State(now) != Waiting {
		if !g.replay(act) {
			return false, Errorf(CodeFenceRefused, "the agent is bound to another fence")
		}
		if g.state == Ended {
			return false, Errorf(CodeExpired, "the lease ended")
		}
		return false, nil
	}
	if act.TTLMillis <= 0 {
		return false, Errorf(CodeInvalid, "ttl_ms must be positive")
	}
	g.state, g.bound = Active, act
	g.deadline = now.Add(time.Duration(act.TTLMillis) * time.Millisecond)
	return true, nil
}

// replay reports whether act, arriving after the gate was bound, repeats
// the bound activation: the same fence and the same expires_at (its
// ttl_ms is ignored). Anything else is another fence.
func (g *Gate) replay(act Activation) bool {
	return act.Fence == g.bound.Fence && act.ExpiresAt.Equal(g.bound.ExpiresAt)
}

// Admit admits a fenced request carrying f at now: only the bound fence,
// only while active. Before any activation it is ErrNotActive; after the
// end, ErrExpired; with another fence, ErrFenceRefused.
func (g *Gate) Admit(now time.Time, f Fence) error {
	switch {
	case g.State(now) == Waiting:
		return Errorf(CodeNotActive, "the agent was never activated")
	case g.state == Ended:
		return Errorf(CodeExpired, "the lease ended")
	case f != g.bound.Fence:
		return Errorf(CodeFenceRefused, "the request carries another fence than the bound one")
	}
	return nil
}

// Release ends the gate for its bound fence f, as expiry does; releasing
// an ended gate again with that fence succeeds. Before any activation it
// is ErrNotActive; with another fence, ErrFenceRefused, and nothing
// changes.
func (g *Gate) Release(f Fence) error {
	switch {
	case g.state == Waiting:
		return Errorf(CodeNotActive, "the agent was never activated")
	case f != g.bound.Fence:
		return Errorf(CodeFenceRefused, "the agent is bound to another fence")
	}
	g.state = Ended
	return nil
}

// End ends the gate whatever its state (the agent shuts down).
func (g *Gate) End() { g.state = Ended }
