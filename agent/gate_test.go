package agent_test

import (
	"errors"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich/agent"
)

// TestGate walks the fence rules (CONTRACT §13) step by step: each row
// applies one call to the gate left by the rows before it, at its time,
// and states the answer and the state after it.
func TestGate(t *testing.T) {
	t0 := time.Date(2026, 8, 7, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	f := agent.Fence{CellID: "cell-1", LeaseID: "lease-1", Generation: 3}
	expires := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	act := agent.Activation{Version: agent.ProtocolVersion, Fence: f, ExpiresAt: expires, TTLMillis: time.Minute.Milliseconds()}
	with := func(edit func(*agent.Activation)) agent.Activation { a := act; edit(&a); return a }
	other := agent.Fence{CellID: "cell-1", LeaseID: "lease-2", Generation: 3}
	nextGen := agent.Fence{CellID: "cell-1", LeaseID: "lease-1", Generation: 4}

	type step struct {
		name  string
		at    time.Duration
		call  func(g *agent.Gate, now time.Time) error
		want  error // nil: accepted
		state agent.State
	}
	activate := func(a agent.Activation, wantBound bool) func(*agent.Gate, time.Time) error {
		return func(g *agent.Gate, now time.Time) error {
			bound, err := g.Activate(now, a)
			if bound != wantBound {
				return errors.New("bound mismatch")
			}
			return err
		}
	}
	admit := func(f agent.Fence) func(*agent.Gate, time.Time) error {
		return func(g *agent.Gate, now time.Time) error { return g.Admit(now, f) }
	}
	release := func(f agent.Fence) func(*agent.Gate, time.Time) error {
		return func(g *agent.Gate, now time.Time) error { return g.Release(f) }
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"waiting refuses everything but an activation", []step{
			{"admit", 0, admit(f), agent.ErrNotActive, agent.Waiting},
			{"release", 0, release(f), agent.ErrNotActive, agent.Waiting},
			{"version 2", 0, activate(with(func(a *agent.Activation) { a.Version = 2 }), false), agent.ErrInvalid, agent.Waiting},
			{"no lease", 0, activate(with(func(a *agent.Activation) { a.LeaseID = "" }), false), agent.ErrInvalid, agent.Waiting},
			{"generation 0", 0, activate(with(func(a *agent.Activation) { a.Generation = 0 }), false), agent.ErrInvalid, agent.Waiting},
			{"ttl 0", 0, activate(with(func(a *agent.Activation) { a.TTLMillis = 0 }), false), agent.ErrInvalid, agent.Waiting},
			{"another cell", 0, activate(with(func(a *agent.Activation) { a.CellID = "cell-2" }), false), agent.ErrFenceRefused, agent.Waiting},
			{"activate", 0, activate(act, true), nil, agent.Active},
		}},
		{"active for one fence until the deadline", []step{
			{"activate", 0, activate(act, true), nil, agent.Active},
			{"admit the fence", time.Second, admit(f), nil, agent.Active},
			{"admit another lease", time.Second, admit(other), agent.ErrFenceRefused, agent.Active},
			{"admit another generation", time.Second, admit(nextGen), agent.ErrFenceRefused, agent.Active},
			{"replay, less ttl left", 2 * time.Second, activate(with(func(a *agent.Activation) { a.TTLMillis = 1 }), false), nil, agent.Active},
			{"replay, ttl 0 ignored", 2 * time.Second, activate(with(func(a *agent.Activation) { a.TTLMillis = 0 }), false), nil, agent.Active},
			{"replay as another time zone", 2 * time.Second, activate(with(func(a *agent.Activation) { a.ExpiresAt = expires.In(time.FixedZone("x", 3600)) }), false), nil, agent.Active},
			{"same fence, earlier expiry: a replay", 3 * time.Second, activate(with(func(a *agent.Activation) { a.ExpiresAt = expires.Add(-time.Hour) }), false), nil, agent.Active},
			{"another fence", 3 * time.Second, activate(with(func(a *agent.Activation) { a.Fence = other }), false), agent.ErrFenceRefused, agent.Active},
			{"another cell", 3 * time.Second, activate(with(func(a *agent.Activation) { a.CellID = "cell-2" }), false), agent.ErrFenceRefused, agent.Active},
			{"release another fence", 3 * time.Second, release(other), agent.ErrFenceRefused, agent.Active},
			{"admit just before the deadline", time.Minute - time.Nanosecond, admit(f), nil, agent.Active},
			{"admit at the deadline", time.Minute, admit(f), agent.ErrExpired, agent.Ended},
			{"admit another fence after it", time.Minute, admit(other), agent.ErrExpired, agent.Ended},
			{"replay after it", time.Minute, activate(act, false), agent.ErrExpired, agent.Ended},
			{"another fence after it", time.Minute, activate(with(func(a *agent.Activation) { a.Fence = other }), false), agent.ErrFenceRefused, agent.Ended},
			{"release after it", time.Minute, release(f), nil, agent.Ended},
			{"release another fence after it", time.Minute, release(other), agent.ErrFenceRefused, agent.Ended},
		}},
		{"a later expiry moves the deadline (renewal)", []step{
			{"activate", 0, activate(act, true), nil, agent.Active},
			{"renew", 30 * time.Second, activate(with(func(a *agent.Activation) { a.ExpiresAt = expires.Add(time.Hour) }), true), nil, agent.Active},
			{"admit past the first deadline", time.Minute, admit(f), nil, agent.Active},
			{"the first activation again: a replay", 61 * time.Second, activate(act, false), nil, agent.Active},
			{"the renewal again, ttl 1: a replay", 61 * time.Second, activate(with(func(a *agent.Activation) { a.ExpiresAt = expires.Add(time.Hour); a.TTLMillis = 1 }), false), nil, agent.Active},
			{"another fence, later expiry", 61 * time.Second, activate(with(func(a *agent.Activation) { a.Fence = other; a.ExpiresAt = expires.Add(2 * time.Hour) }), false), agent.ErrFenceRefused, agent.Active},
			{"admit just before the new deadline", 90*time.Second - time.Nanosecond, admit(f), nil, agent.Active},
			{"admit at the new deadline", 90 * time.Second, admit(f), agent.ErrExpired, agent.Ended},
			{"renew after the end", 90 * time.Second, activate(with(func(a *agent.Activation) { a.ExpiresAt = expires.Add(3 * time.Hour) }), false), agent.ErrExpired, agent.Ended},
		}},
		{"release ends it", []step{
			{"activate", 0, activate(act, true), nil, agent.Active},
			{"release", time.Second, release(f), nil, agent.Ended},
			{"admit", time.Second, admit(f), agent.ErrExpired, agent.Ended},
			{"release again", time.Second, release(f), nil, agent.Ended},
			{"replay", time.Second, activate(act, false), agent.ErrExpired, agent.Ended},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := agent.NewGate("cell-1")
			if g.State(t0) != agent.Waiting || !g.Deadline().IsZero() {
				t.Fatalf("a new gate is %s until %v", g.State(t0), g.Deadline())
			}
			for _, s := range tc.steps {
				err := s.call(g, at(s.at))
				if s.want == nil && err != nil || s.want != nil && !errors.Is(err, s.want) {
					t.Fatalf("%s: %v, want %v", s.name, err, s.want)
				}
				if st := g.State(at(s.at)); st != s.state {
					t.Fatalf("%s: state %s, want %s", s.name, st, s.state)
				}
			}
		})
	}
}

// TestGateDeadline: the deadline is the activation's time plus its TTL, and
// a replay does not move it.
func TestGateDeadline(t *testing.T) {
	t0 := time.Date(2026, 8, 7, 12, 0, 0, 0, time.UTC)
	g := agent.NewGate("c")
	act := agent.Activation{Version: agent.ProtocolVersion, Fence: agent.Fence{CellID: "c", LeaseID: "l", Generation: 1}, TTLMillis: 1500}
	if bound, err := g.Activate(t0, act); !bound || err != nil {
		t.Fatal(bound, err)
	}
	act.TTLMillis = 10_000
	if bound, err := g.Activate(t0.Add(time.Second), act); bound || err != nil {
		t.Fatal(bound, err)
	}
	if want := t0.Add(1500 * time.Millisecond); !g.Deadline().Equal(want) {
		t.Fatalf("deadline %v, want %v", g.Deadline(), want)
	}
}

// TestGateEnd: End ends the gate in any state; a shut-down gate refuses a
// first activation as another fence's.
func TestGateEnd(t *testing.T) {
	t0 := time.Now()
	g := agent.NewGate("c")
	g.End()
	if g.State(t0) != agent.Ended {
		t.Fatal(g.State(t0))
	}
	act := agent.Activation{Version: agent.ProtocolVersion, Fence: agent.Fence{CellID: "c", LeaseID: "l", Generation: 1}, TTLMillis: 1}
	if _, err := g.Activate(t0, act); !errors.Is(err, agent.ErrFenceRefused) {
		t.Fatal(err)
	}
	if err := g.Admit(t0, act.Fence); !errors.Is(err, agent.ErrExpired) {
		t.Fatal(err)
	}
}
