package sandboxwich

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

// Exec limits (CONTRACT §6).
const (
	MaxExecArgs        = 256
	MaxExecStdin       = 1 << 20
	MaxExecEnv         = 64
	DefaultExecTimeout = driver.DefaultExecTimeout
	// MaxExecOutput caps each of stdout and stderr; longer output is cut
	// and reported as truncated.
	MaxExecOutput = 1 << 20
)

// ExecRequest is one command to run in a leased cell.
type ExecRequest struct {
	Argv  []string
	Stdin []byte
	Env   map[string]string
	// Cwd is the absolute working directory; "" means the cell's home.
	Cwd string
	// User is who runs the command: agent.UserCell ("" too) or
	// agent.UserRoot.
	User agent.User
	// Timeout bounds the command; zero means DefaultExecTimeout. It is
	// capped at the lease's remaining life.
	Timeout time.Duration
}

// ExecResult is a finished command.
type ExecResult = driver.ExecResult

// Exec runs a command in the cell of a live lease. Order of checks: the
// request itself (errcode.ErrInvalidRequest: argv of 1 to 256 strings with
// a non-empty argv[0], no NUL byte in any argv string, env key or value,
// env keys matching [A-Za-z_][A-Za-z0-9_]*, the limits above), then the
// lease fence (not found, conflict), then a cell of an external worker (not
// found: there is no provider here), then a provider without exec
// (errcode.ErrExecUnsupported). Before the command runs, the plane reads the
// admitted runtime back from the provider; if it no longer matches the
// signed runtime class, the cell is quarantined, its stop recorded, and
// errcode.ErrRuntimeClassBoundaryUnverified returned.
func (p *Plane) Exec(ctx context.Context, tenantID string, leaseID uuid.UUID, pr Proof, req ExecRequest) (ExecResult, error) {
	if err := checkExec(req); err != nil {
		return ExecResult{}, err
	}
	rec, err := p.store.CheckLease(ctx, p.check(tenantID, leaseID, pr))
	if err != nil {
		return ExecResult{}, err
	}
	m := rec.Member
	if m == nil {
		return ExecResult{}, errcode.New(errcode.NotFound, "cell was prepared by an external worker; exec through its worker")
	}
	var prov driver.Provider
	if p.pools != nil {
		if cfg, ok := p.pools.Pool(m.Pool); ok {
			prov = cfg.Provider
		}
	}
	execer, ok := prov.(driver.Execer)
	if !ok {
		return ExecResult{}, errcode.New(errcode.ExecUnsupported, "the cell's provider does not support exec")
	}
	obj := driver.Object{CellID: m.CellID, Identity: m.Identity}
	l := rec.Cell.Lease
	obs, err := prov.Inspect(ctx, obj)
	if err == nil {
		err = driver.Verify(obj, obs, l.Release.RuntimeClass)
	}
	if err != nil {
		return ExecResult{}, p.quarantine(ctx, m, "runtime unverified before exec", err, errcode.Wrap(errcode.RuntimeClassBoundaryUnverified,
			"the cell's runtime class could not be verified; the cell is quarantined", err))
	}
	timeout := req.Timeout
	if timeout == 0 {
		timeout = DefaultExecTimeout
	}
	timeout = min(timeout, l.ExpiresAt.Sub(p.Now()))
	res, err := execer.Exec(ctx, obj, driver.ExecRequest{
		Argv: req.Argv, Stdin: req.Stdin, Env: req.Env, Timeout: timeout, MaxOutput: MaxExecOutput,
	})
	if err != nil {
		switch {
		case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
			return ExecResult{}, err
		case errors.Is(err, driver.ErrCellLost):
			return ExecResult{}, p.quarantine(ctx, m, "cell lost during exec", err, errcode.Wrap(errcode.Conflict,
				"the cell died during the command; it is quarantined and the lease is over", err))
		}
		return ExecResult{}, errcode.Wrap(errcode.Internal, "exec failed", err)
	}
	return res, nil
}

// quarantine ends a leased cell that cannot be trusted or used any more,
// for what (logged with cause): the cell is quarantined and its stop
// recorded in one transaction, and the pool destroys it. It returns
// answer, or the store's error when the stop could not be recorded.
func (p *Plane) quarantine(ctx context.Context, m *store.Member, what string, cause, answer error) error {
	p.log.Warn(what, "pool", m.Pool, "cell_id", m.CellID, "error", cause)
	_, err := p.store.BeginStop(ctx, store.StopIntent{
		CellID: m.CellID, From: []lease.MemberState{lease.MemberLeased}, Disposition: lease.Quarantined,
		Quarantine: true, Reason: what + ": " + cause.Error(), Now: p.Now(),
	})
	if err != nil && !errors.Is(err, errcode.ErrConflict) {
		return err
	}
	p.pools.Trigger()
	return answer
}

// checkExec refuses, with InvalidRequest and before anything reaches the
// store or the provider, input no provider can run as given (CONTRACT §6,
// §14). Messages never repeat the input.
func checkExec(req ExecRequest) error {
	switch {
	case len(req.Argv) == 0 || len(req.Argv) > MaxExecArgs:
		return errcode.New(errcode.InvalidRequest, "argv must hold 1 to 256 strings")
	case req.Argv[0] == "":
		return errcode.New(errcode.InvalidRequest, "argv[0] must not be empty")
	case len(req.Stdin) > MaxExecStdin:
		return errcode.New(errcode.InvalidRequest, "stdin is larger than 1 MiB")
	case len(req.Env) > MaxExecEnv:
		return errcode.New(errcode.InvalidRequest, "env holds more than 64 entries")
	case req.Timeout < 0:
		return errcode.New(errcode.InvalidRequest, "timeout_seconds must not be negative")
	}
	for i, a := range req.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			return errcode.New(errcode.InvalidRequest, "argv["+strconv.Itoa(i)+"] contains a NUL byte")
		}
	}
	for k, v := range req.Env {
		if !validEnvKey(k) {
			return errcode.New(errcode.InvalidRequest, "an env key does not match [A-Za-z_][A-Za-z0-9_]*")
		}
		if strings.IndexByte(v, 0) >= 0 {
			return errcode.New(errcode.InvalidRequest, "an env value contains a NUL byte")
		}
	}
	return nil
}

// validEnvKey reports whether k matches [A-Za-z_][A-Za-z0-9_]*.
func validEnvKey(k string) bool {
	for i := 0; i < len(k); i++ {
		c := k[i]
		if c != '_' && (c < 'A' || c > 'Z') && (c < 'a' || c > 'z') && (i == 0 || c < '0' || c > '9') {
			return false
		}
	}
	return k != ""
}
