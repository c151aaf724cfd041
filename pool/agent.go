package pool

import (
	"context"
	"fmt"

	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/errcode"
)

// AgentError is a failed readiness check of a cell's agent (CONTRACT §13):
// the member is stopped and its cell quarantined, code
// cell_agent_unverified.
type AgentError struct{ Reason string }

func (e *AgentError) Error() string { return string(errcode.CellAgentUnverified) + ": " + e.Reason }

// verifyAgent reads the readiness evidence of a member's agent when the
// pool's provider runs one (driver.AgentHost): the agent must be waiting,
// never activated, started for this cell, and report the build digest the
// provider read back for the object (obs.AgentDigest, which must be set).
// It runs at admission and at every periodic verification of a ready
// member — never inside a claim. The agent's word is a report: it adds
// evidence against a cell, never for its runtime, which obs proves.
func (r *Reconciler) verifyAgent(ctx context.Context, cfg Config, obj driver.Object, obs driver.Observation) error {
	host, ok := cfg.Provider.(driver.AgentHost)
	if !ok {
		return nil
	}
	err := checkAgent(ctx, host, obj, obs)
	if err != nil {
		r.opt.Logger.Warn("cell agent unverified", "pool", cfg.Name, "cell_id", obj.CellID, "error", err)
	}
	return err
}

func checkAgent(ctx context.Context, host driver.AgentHost, obj driver.Object, obs driver.Observation) error {
	if obs.AgentDigest == "" {
		return &AgentError{Reason: "the provider reports no agent in the object"}
	}
	conn, err := host.Agent(ctx, obj)
	if err != nil {
		return &AgentError{Reason: "cannot reach the agent: " + err.Error()}
	}
	st, err := conn.Status(ctx)
	switch {
	case err != nil:
		return &AgentError{Reason: "reading the agent's status: " + err.Error()}
	case st.State != agent.Waiting:
		return &AgentError{Reason: fmt.Sprintf("the agent is %q, not waiting", st.State)}
	case st.Activations != 0:
		return &AgentError{Reason: fmt.Sprintf("the agent reports %d activations", st.Activations)}
	case st.CellID != obj.CellID.String():
		return &AgentError{Reason: fmt.Sprintf("the agent names cell %q", st.CellID)}
	case st.Digest != obs.AgentDigest:
		return &AgentError{Reason: fmt.Sprintf("the agent reports build %q, the provider mounted %q", st.Digest, obs.AgentDigest)}
	}
	return nil
}
