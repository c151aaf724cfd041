package sandboxwich

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
	"github.com/sandboxwich/sandboxwich/store"
)

// The lease-operation gate: before any operation inside a leased cell
// (exec, launch, files) the plane checks the lease fence, reads the
// admitted runtime back from the provider and verifies it, and prepares
// the sanitized activation the operation carries; a cell that fails the
// gate, or whose agent answers what a sterile cell's never does, is
// quarantined here.

// openFenced checks the lease fence and opens the lease's cell for an
// operation only the agent serves.
func (p *Plane) openFenced(ctx context.Context, tenantID string, leaseID uuid.UUID, pr Proof) (*leaseCell, error) {
	rec, err := p.store.CheckLease(ctx, p.check(tenantID, leaseID, pr))
	if err != nil {
		return nil, err
	}
	return p.open(ctx, rec, false)
}

// leaseEnded reports, after a call to m's cell failed without an answer,
// whether the lease the call was made under has ended meanwhile: its stop
// was recorded (a release or revocation, whose pool stop then destroyed
// the cell, or a quarantine of another operation), or it expired by the
// plane's clock. Cells are single-use, so a member that is no longer
// leased has no live lease. A store that cannot answer is taken for "no":
// the caller then treats the cell as lost, as before.
func (p *Plane) leaseEnded(ctx context.Context, m *store.Member) bool {
	ended, _ := p.leaseEnd(ctx, m, 0)
	return ended
}

// leaseEnd reads from the store whether m's lease has ended: its expiry
// is within slack of now (then expired is that expiry), or its stop was
// recorded (expired is zero). Expiry is looked at first: the sweep that
// quarantines an expired lease may already have recorded its stop. A
// store that cannot answer is taken for "no".
func (p *Plane) leaseEnd(ctx context.Context, m *store.Member, slack time.Duration) (ended bool, expired time.Time) {
	now, err := p.store.Member(ctx, m.CellID)
	switch {
	case err != nil:
		return false, time.Time{}
	case now.Cell != nil && now.Cell.Lease != nil && !p.Now().Add(slack).Before(now.Cell.Lease.ExpiresAt):
		return true, now.Cell.Lease.ExpiresAt
	case now.State != lease.MemberLeased:
		return true, time.Time{}
	}
	return false, time.Time{}
}

// activation is the sanitized activation of lease l in m's cell until
// expires (CONTRACT §13): never the attestation, its digest, the binding
// or a token.
func activation(m *store.Member, l *lease.Lease, expires, now time.Time) agent.Activation {
	f := agent.Fence{CellID: m.CellID.String(), LeaseID: l.ID.String(), Generation: int64(l.Generation)}
	return agent.Activation{Version: agent.ProtocolVersion, Fence: f, ExpiresAt: expires, TTLMillis: expires.Sub(now).Milliseconds()}
}

// How long the plane waits for its cell's agent beyond what the request
// itself may take. An agent that has not answered by then is taken for
// lost: the cell is quarantined.
const (
	agentGrace   = 10 * time.Second // after an exec's timeout
	agentTimeout = 30 * time.Second // for activation and launch
)

// errNotLive answers an operation on a lease whose life ended while it was
// checked.
func errNotLive() error { return errcode.New(errcode.Conflict, "the lease is no longer live") }

// leaseCell is the cell of a live lease, its runtime verified and, for a
// provider with the agent, its agent reached: what a lease operation acts
// on.
type leaseCell struct {
	member *store.Member
	lease  *lease.Lease
	obj    driver.Object
	// conn is the cell's agent; nil when the provider has none, and
	// execer runs commands instead. Every request to it carries fence and
	// the sanitized activation.
	conn       agent.Conn
	fence      agent.Fence
	activation *agent.Activation
	execer     driver.Execer
}

// open takes a lease record that passed its fence to the cell: a cell of
// an external worker is errcode.ErrNotFound, a released one (stopping)
// errcode.ErrConflict, a provider without the agent
// errcode.ErrExecUnsupported (unless execOK and the provider has its own
// exec); then the admitted runtime is read back and verified, and the
// sanitized activation — never the attestation, its digest, the binding or
// a token — made ready for the operation to carry.
//
// The activation goes with every operation (agent.Conn), in the same
// request: the first activates the agent, the later ones are exact
// replays it accepts, so the plane keeps no record of which cells it
// activated, restarted planes and replicas need none, and no operation
// costs a round trip more.
func (p *Plane) open(ctx context.Context, rec store.LeaseRecord, execOK bool) (*leaseCell, error) {
	m, l := rec.Member, rec.Cell.Lease
	if m == nil {
		return nil, errcode.New(errcode.NotFound, "cell was prepared by an external worker; act on it through its worker")
	}
	if m.State != lease.MemberLeased {
		return nil, errcode.New(errcode.Conflict, "the lease was released; its cell is stopping")
	}
	prov := p.provider(m.Pool)
	host, _ := prov.(driver.AgentHost)
	execer, _ := prov.(driver.Execer)
	if host == nil && (!execOK || execer == nil) {
		what := "files and launch"
		if execOK {
			what = "exec"
		}
		return nil, errcode.New(errcode.ExecUnsupported, "the cell's provider does not support "+what)
	}
	c := &leaseCell{member: m, lease: l, obj: driver.Object{CellID: m.CellID, Identity: m.Identity}}
	obs, err := prov.Inspect(ctx, c.obj)
	if err == nil {
		err = driver.Verify(c.obj, obs, l.Release.RuntimeClass)
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, p.quarantine(ctx, m, "runtime unverified before a lease operation", store.ReasonRuntimeUnverified, err, errcode.Wrap(errcode.RuntimeClassBoundaryUnverified,
			"the cell's runtime class could not be verified; the cell is quarantined", err))
	}
	if cfg, ok := p.pools.Pool(m.Pool); ok { // p.pools is set: prov is the pool's
		if err := pool.VerifyImage(cfg, *m, obs); err != nil {
			return nil, p.quarantine(ctx, m, string(errcode.ImageDigestUnverified), store.ReasonImageUnverified, err, errcode.Wrap(errcode.ImageDigestUnverified,
				"the cell's admitted image is not the one its pool pins; the cell is quarantined", err))
		}
	}
	if host == nil {
		c.execer = execer
		return c, nil
	}
	now := p.Now()
	if l.ExpiresAt.Sub(now) < time.Millisecond {
		return nil, errNotLive()
	}
	act := activation(m, l, l.ExpiresAt, now)
	c.fence, c.activation = act.Fence, &act
	actx, cancel := context.WithTimeout(ctx, agentTimeout)
	defer cancel()
	conn, err := host.Agent(actx, c.obj)
	if err != nil {
		return nil, p.agentError(ctx, m, err)
	}
	c.conn = conn
	return c, nil
}

// provider returns the provider of a pool, or nil when the plane does not
// run that pool.
func (p *Plane) provider(poolName string) driver.Provider {
	if p.pools == nil {
		return nil
	}
	cfg, ok := p.pools.Pool(poolName)
	if !ok {
		return nil
	}
	return cfg.Provider
}

// agentError maps a failed call of a cell's agent to the answer. A call cut
// short by ctx returns ctx's error and leaves the cell alone. A call the
// agent did not answer means the cell is lost — unless the lease ended
// meanwhile (leaseEnded): its stop destroyed the cell, which is not a
// loss, and the answer is errcode.ErrConflict, the lease no longer live.
// The agent's refusals of the request are reported to the tenant with the
// matching code and never end the cell; anything else it answers (a
// refused fence, "not active" after the activation, an unknown code)
// means the agent is not the one a sterile cell runs: the cell is
// quarantined as agent_unverified, never reported as cell_lost.
func (p *Plane) agentError(ctx context.Context, m *store.Member, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	ae, ok := errors.AsType[*agent.Error](err)
	if !ok {
		if p.leaseEnded(ctx, m) {
			return errcode.Wrap(errcode.Conflict, "the lease ended during the request; its cell is stopping", err)
		}
		return p.cellLost(ctx, m, err)
	}
	msg := "the cell refused the request: " + detail(ae.Message)
	var code errcode.Code
	switch ae.Code {
	case agent.CodeExpired:
		return errcode.Wrap(errcode.Conflict, "the lease has expired in the cell", err)
	case agent.CodeInvalid:
		code = errcode.InvalidRequest
	case agent.CodeUserUnsupported:
		code = errcode.UserUnsupported
	case agent.CodeNotFound:
		code = errcode.FileNotFound
	case agent.CodeAccessDenied:
		code = errcode.FileAccessDenied
	case agent.CodeTooLarge:
		code = errcode.PayloadTooLarge
	case agent.CodeNoSpace:
		code = errcode.InsufficientStorage
	case agent.CodeConflict:
		code, msg = errcode.Conflict, "the lease already launched a different workload"
	case agent.CodeNotLaunched:
		code, msg = errcode.NotFound, "the lease has launched no workload"
	default:
		return p.agentUnverified(ctx, m, err)
	}
	return errcode.Wrap(code, msg, err)
}

// detail returns an agent's message fit for the tenant's answer: valid
// UTF-8, one line, at most 200 bytes. It is the tenant's own cell's word.
func detail(msg string) string {
	msg = strings.ToValidUTF8(strings.Join(strings.Fields(msg), " "), "?")
	if len(msg) > 200 {
		msg = strings.ToValidUTF8(msg[:200], "") + "…"
	}
	return msg
}

// cellLost ends a cell that died or whose agent cannot be reached.
func (p *Plane) cellLost(ctx context.Context, m *store.Member, cause error) error {
	return p.quarantine(ctx, m, "cell lost", store.ReasonCellLost, cause, errcode.Wrap(errcode.Conflict,
		"the cell died or its agent cannot be reached; it is quarantined and the lease is over",
		fmt.Errorf("%w: %w", driver.ErrCellLost, cause)))
}

// agentUnverified ends a cell whose agent answered what a sterile cell's
// agent never does.
func (p *Plane) agentUnverified(ctx context.Context, m *store.Member, cause error) error {
	return p.quarantine(ctx, m, string(errcode.CellAgentUnverified), store.ReasonAgentUnverified, cause, errcode.Wrap(errcode.CellAgentUnverified,
		"the cell's agent answered what a sterile cell's agent never does; the cell is quarantined", cause))
}

// quarantine ends a leased cell that cannot be trusted or used any more,
// for what (logged with cause; code is the event reason): the cell is
// quarantined and its stop recorded in one transaction, and the pool
// destroys it. It returns answer, or the store's error when the stop could
// not be recorded.
func (p *Plane) quarantine(ctx context.Context, m *store.Member, what, code string, cause, answer error) error {
	p.log.Warn(what, "pool", m.Pool, "cell_id", m.CellID, "error", cause)
	_, err := p.store.BeginStop(ctx, store.StopIntent{
		CellID: m.CellID, From: []lease.MemberState{lease.MemberLeased}, Disposition: lease.Quarantined,
		Quarantine: true, Reason: what + ": " + cause.Error(), EventReason: code, Now: p.Now(),
	})
	if err != nil && !errors.Is(err, errcode.ErrConflict) {
		return err
	}
	p.pools.Trigger()
	return answer
}
