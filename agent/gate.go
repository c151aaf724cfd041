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

// Activate binds a waiting gate to act's fence until now + act.TTLMillis;
// or, for the bound fence, renews it: an activation with a later
// expires_at than the bound one moves the deadline to now + act.TTLMillis
// (CONTRACT §20), and one with an equal or earlier expires_at is a replay
// that changes nothing, so operations already under way are never
// refused. It reports whether the deadline was set or moved. A malformed
// activation is ErrInvalid; one for another cell, or another fence,
// ErrFenceRefused; any activation after the end, ErrExpired.
func (g *Gate) Activate(now time.Time, act Activation) (moved bool, err error) {
	switch {
	case act.Version != ProtocolVersion:
		return false, Errorf(CodeInvalid, fmt.Sprintf("activation version %d is not %d", act.Version, ProtocolVersion))
	case act.CellID != g.cellID:
		return false, Errorf(CodeFenceRefused, "the activation names another cell")
	case act.LeaseID == "" || act.Generation < 1:
		return false, Errorf(CodeInvalid, "an activation needs a lease_id and a generation ≥ 1")
	}
	switch g.State(now) {
	case Waiting:
	case Ended:
		if act.Fence != g.bound.Fence {
			return false, Errorf(CodeFenceRefused, "the agent is bound to another fence")
		}
		return false, Errorf(CodeExpired, "the lease ended")
	default:
		if act.Fence != g.bound.Fence {
			return false, Errorf(CodeFenceRefused, "the agent is bound to another fence")
		}
		if !act.ExpiresAt.After(g.bound.ExpiresAt) {
			return false, nil // a replay: nothing changes
		}
	}
	if act.TTLMillis <= 0 {
		return false, Errorf(CodeInvalid, "ttl_ms must be positive")
	}
	g.state, g.bound = Active, act
	g.deadline = now.Add(time.Duration(act.TTLMillis) * time.Millisecond)
	return true, nil
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
