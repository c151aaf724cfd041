package sandboxwich

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/errcode"
)

// Exec limits (CONTRACT §6).
const (
	MaxExecArgs        = 256
	MaxExecStdin       = 1 << 20
	MaxExecEnv         = 64
	DefaultExecTimeout = 60 * time.Second
)

// ExecRequest is one command to run in a leased cell.
type ExecRequest struct {
	Argv  []string
	Stdin []byte
	Env   map[string]string
	// Timeout bounds the command; zero means DefaultExecTimeout. It is
	// capped at the lease's remaining life.
	Timeout time.Duration
}

// ExecResult is a finished command.
type ExecResult struct {
	ExitCode       int
	Stdout, Stderr []byte
	// Truncated reports that an output stream hit its cap.
	Truncated bool
	Duration  time.Duration
}

// Exec runs a command in the cell of a live lease. Order of checks: the lease
// fence (not found, conflict), then a cell of an external worker (not found:
// there is no provider here), then a provider without exec
// (errcode.ErrExecUnsupported).
func (p *Plane) Exec(ctx context.Context, tenantID string, leaseID uuid.UUID, pr Proof, req ExecRequest) (ExecResult, error) {
	if err := checkExec(req); err != nil {
		return ExecResult{}, err
	}
	rec, err := p.store.CheckLease(ctx, p.check(tenantID, leaseID, pr))
	if err != nil {
		return ExecResult{}, err
	}
	if rec.Member == nil {
		return ExecResult{}, errcode.New(errcode.NotFound, "cell was prepared by an external worker; exec through its worker")
	}
	return ExecResult{}, errcode.New(errcode.ExecUnsupported, "the cell's provider does not support exec")
}

func checkExec(req ExecRequest) error {
	switch {
	case len(req.Argv) == 0 || len(req.Argv) > MaxExecArgs:
		return errcode.New(errcode.InvalidRequest, "argv must hold 1 to 256 strings")
	case len(req.Stdin) > MaxExecStdin:
		return errcode.New(errcode.InvalidRequest, "stdin is larger than 1 MiB")
	case len(req.Env) > MaxExecEnv:
		return errcode.New(errcode.InvalidRequest, "env holds more than 64 entries")
	case req.Timeout < 0:
		return errcode.New(errcode.InvalidRequest, "timeout_seconds must not be negative")
	}
	return nil
}
