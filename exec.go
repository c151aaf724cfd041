package sandboxwich

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/errcode"
)

// Exec limits (CONTRACT §6, §14).
const (
	MaxExecArgs        = 256
	MaxExecStdin       = agent.MaxStdin
	MaxExecEnv         = 64
	DefaultExecTimeout = driver.DefaultExecTimeout
	// MaxExecArgBytes is the longest argv string, and the longest env
	// entry written KEY=value, in bytes; MaxExecArgsBytes bounds all of
	// them together. They are the cell agent's own limits (agent.CheckArgs),
	// below what the kernel refuses with E2BIG.
	MaxExecArgBytes  = agent.MaxArgBytes
	MaxExecArgsBytes = agent.MaxArgsBytes
	// MaxExecOutput is the default cap of each of stdout and stderr;
	// longer output is cut and reported as truncated. WithExecMaxOutput
	// changes it, up to MaxExecOutputLimit (the most the cell agent
	// takes).
	MaxExecOutput      = 1 << 20
	MaxExecOutputLimit = agent.MaxOutputLimit
	// DefaultExecMaxOutputCeiling is the largest cap an exec may ask for
	// (ExecRequest.MaxOutput) unless WithExecMaxOutputCeiling says
	// otherwise (CONTRACT §25).
	DefaultExecMaxOutputCeiling = 16 << 20
	// MaxPath is the longest cwd or file path, in bytes.
	MaxPath = agent.MaxPath
	// MaxFileBytes is the largest file written or read, in bytes.
	MaxFileBytes = agent.MaxFileBytes
)

// WithExecMaxOutput sets the cap of each of an exec's stdout and stderr, in
// bytes, for an exec that asks for none (default MaxExecOutput); New
// refuses a cap outside 1 to MaxExecOutputLimit.
func WithExecMaxOutput(n int) Option { return func(p *Plane) { p.maxOutput = n } }

// WithExecMaxOutputCeiling sets the largest cap an exec may ask for with
// ExecRequest.MaxOutput, in bytes (default DefaultExecMaxOutputCeiling, or
// the WithExecMaxOutput cap when that is more); New refuses a ceiling
// below the default cap or above MaxExecOutputLimit.
func WithExecMaxOutputCeiling(n int) Option { return func(p *Plane) { p.maxOutputCeiling = n } }

// ExecMaxOutput returns the cap of each of an exec's stdout and stderr, in
// bytes, for an exec that asks for none.
func (p *Plane) ExecMaxOutput() int { return p.maxOutput }

// ExecMaxOutputCeiling returns the largest cap an exec may ask for, in
// bytes.
func (p *Plane) ExecMaxOutputCeiling() int { return p.maxOutputCeiling }

// ExecOutputCap returns the cap of each output stream that applies to req:
// req.MaxOutput, or the plane's default (ExecMaxOutput) when it is zero.
// It does not check req against the ceiling; Exec does.
func (p *Plane) ExecOutputCap(req ExecRequest) int {
	if req.MaxOutput > 0 {
		return req.MaxOutput
	}
	return p.maxOutput
}

// ExecRequest is one command to run in a leased cell.
type ExecRequest struct {
	Argv  []string
	Stdin []byte
	Env   map[string]string
	// Cwd is the absolute working directory; "" means the cell's home.
	Cwd string
	// User is who runs the command: UserCell ("" too) or UserRoot.
	User User
	// Timeout bounds the command; zero means DefaultExecTimeout. The lease
	// bounds it too: at the lease's expiry, which a renewal moves, the cell
	// kills every process (ReasonKilled, with a Message saying so).
	Timeout time.Duration
	// MaxOutput caps each of stdout and stderr, in bytes; zero means the
	// plane's default (ExecMaxOutput). More than ExecMaxOutputCeiling is
	// refused.
	MaxOutput int
}

// Exec runs a command in the cell of a live lease and returns its
// collected output, each stream cut at the request's cap
// (ExecOutputCap).
//
// Order of checks: the request itself (errcode.ErrInvalidRequest: argv of
// 1 to 256 strings with a non-empty argv[0], no NUL byte in any argv
// string, env key or value, or cwd; env keys matching
// [A-Za-z_][A-Za-z0-9_]*; argv strings and env entries within
// MaxExecArgBytes and MaxExecArgsBytes; cwd absolute and at most MaxPath
// bytes; user cell or root; MaxOutput 0 to ExecMaxOutputCeiling; the
// limits above), then the lease fence (not found,
// conflict), then a cell of an external worker (not found: there is no
// provider here), then a provider with neither an agent nor exec
// (errcode.ErrExecUnsupported). Then the plane reads the admitted runtime
// back from the provider; if it no longer matches the signed runtime
// class, the cell is quarantined, its stop recorded, and
// errcode.ErrRuntimeClassBoundaryUnverified returned. Then, when the
// provider runs the cell agent (driver.AgentHost), the agent is activated
// and runs the command (see the package's agent operations); otherwise the
// provider's own exec (driver.Execer) runs it, which knows no cwd and no
// user: a cwd is refused there with errcode.ErrInvalidRequest and user
// root with errcode.ErrUserUnsupported.
//
// A command whose lease ends during it (a release or revoke stops the
// cell; expiry ends the agent) answers ReasonKilled, exit code 137
// and signal KILL (ExecStream has handed out the output produced until
// then; Exec may return none). Otherwise a cell that dies
// during the command, or whose agent cannot be reached, is quarantined
// with its stop recorded, and the answer is errcode.ErrConflict wrapping
// driver.ErrCellLost: the lease is over (the wire's "cell_lost"). An
// answer of the agent never quarantines the cell unless it is one a
// sterile cell's agent never gives (see agentError). When ctx ends first
// the error is ctx's and the cell is left as it is.
func (p *Plane) Exec(ctx context.Context, tenantID string, leaseID uuid.UUID, pr Proof, req ExecRequest) (ExecResult, error) {
	return p.exec(ctx, tenantID, leaseID, pr, req, nil)
}

// ExecStream runs a command like Exec and hands its output to out as it is
// produced, in order, each stream cut at the request's cap; the result then
// carries no output. An error from out stops the command and is returned
// as it is (the cell is not blamed for it). A provider without the agent
// runs the command with its own exec, so its output arrives, stdout then
// stderr, once the command ended. A nil out is Exec.
func (p *Plane) ExecStream(ctx context.Context, tenantID string, leaseID uuid.UUID, pr Proof, req ExecRequest, out func(Output) error) (ExecResult, error) {
	return p.exec(ctx, tenantID, leaseID, pr, req, out)
}

func (p *Plane) exec(ctx context.Context, tenantID string, leaseID uuid.UUID, pr Proof, req ExecRequest, out func(Output) error) (ExecResult, error) {
	if err := checkExec(req); err != nil {
		return ExecResult{}, err
	}
	if req.MaxOutput < 0 || req.MaxOutput > p.maxOutputCeiling {
		return ExecResult{}, errcode.New(errcode.InvalidRequest,
			"max_output_bytes must be 1 to "+strconv.Itoa(p.maxOutputCeiling)+" (the server's ceiling)")
	}
	req.MaxOutput = p.ExecOutputCap(req)
	rec, err := p.store.CheckLease(ctx, p.check(tenantID, leaseID, pr))
	if err != nil {
		return ExecResult{}, err
	}
	c, err := p.open(ctx, rec, true)
	if err != nil {
		return ExecResult{}, err
	}
	timeout := req.Timeout
	if timeout == 0 {
		timeout = DefaultExecTimeout
	}
	if c.conn == nil {
		// Without the agent nothing in the cell holds the lease's expiry:
		// the command's timeout does.
		if timeout = min(timeout, c.lease.ExpiresAt.Sub(p.Now())); timeout < time.Millisecond {
			return ExecResult{}, errNotLive()
		}
		return p.providerExec(ctx, c, req, timeout, out)
	}
	// The agent kills every process of the cell at the lease's expiry,
	// which a renewal moves (CONTRACT §20): a command's timeout is its
	// own, and a command the expiry cuts short is killed, and says so.
	res, err := p.agentExec(ctx, c, req, timeout, out)
	if err == nil && res.Reason == ReasonKilled {
		// The agent's deadline runs on its own clock: a second's slack.
		switch ended, expired := p.leaseEnd(ctx, c.member, time.Second); {
		case !ended:
		case expired.IsZero():
			res.Message = "the lease was released or revoked: its cell ended the command"
		default:
			res.Message = "the lease expired at " + expired.UTC().Format(time.RFC3339) +
				": its cell ended the command (renew a lease to keep it past its expiry)"
		}
	}
	return res, err
}

// providerExec runs a command with the exec of a provider without the
// agent.
func (p *Plane) providerExec(ctx context.Context, c *leaseCell, req ExecRequest, timeout time.Duration, out func(Output) error) (ExecResult, error) {
	switch {
	case req.Cwd != "":
		return ExecResult{}, errcode.New(errcode.InvalidRequest, "the cell's provider runs commands in the cell's home only (it has no cell agent)")
	case req.User == UserRoot:
		return ExecResult{}, errcode.New(errcode.UserUnsupported, "the cell's provider cannot run commands as root (it has no cell agent)")
	}
	start := time.Now()
	dres, err := c.execer.Exec(ctx, c.obj, driver.ExecRequest{
		Argv: req.Argv, Stdin: req.Stdin, Env: req.Env, Timeout: timeout, MaxOutput: req.MaxOutput,
	})
	if err != nil {
		switch {
		case ctx.Err() != nil:
			return ExecResult{}, err
		case errors.Is(err, driver.ErrCellLost):
			if p.leaseEnded(ctx, c.member) {
				return killedResult(start), nil
			}
			return ExecResult{}, p.cellLost(ctx, c.member, err)
		}
		return ExecResult{}, errcode.Wrap(errcode.Internal, "exec failed", err)
	}
	res := execResultOfDriver(dres)
	if res.Reason == "" {
		res.Reason = ReasonExited
		if res.TimedOut {
			res.Reason = ReasonTimedOut
		}
	}
	if out != nil {
		for _, o := range []Output{{Stream: Stdout, Data: res.Stdout}, {Stream: Stderr, Data: res.Stderr}} {
			if len(o.Data) == 0 {
				continue
			}
			if err := out(o); err != nil {
				return ExecResult{}, err
			}
		}
		res.Stdout, res.Stderr = nil, nil
	}
	return res, nil
}

// agentExec runs a command through the cell's agent. The agent kills the
// command at its timeout; one that has not answered agentGrace later is
// taken for lost.
func (p *Plane) agentExec(ctx context.Context, c *leaseCell, req ExecRequest, timeout time.Duration, out func(Output) error) (ExecResult, error) {
	actx, cancel := context.WithTimeout(ctx, timeout+agentGrace)
	defer cancel()
	var sink func(agent.Output) error
	var outErr error
	cut := false
	if out != nil {
		// The agent's output is tenant-influenced: the cap holds here too.
		left := map[agent.Stream]int{agent.Stdout: req.MaxOutput, agent.Stderr: req.MaxOutput}
		sink = func(o agent.Output) error {
			n, ok := left[o.Stream]
			if !ok {
				outErr = p.agentUnverified(ctx, c.member, fmt.Errorf("output on an unknown stream %q", o.Stream))
				return outErr
			}
			if len(o.Data) > n {
				o.Data, cut = o.Data[:n], true
			}
			left[o.Stream] = n - len(o.Data)
			if len(o.Data) == 0 {
				return nil
			}
			outErr = out(outputOf(o))
			return outErr
		}
	}
	start := time.Now()
	ar, err := c.conn.Exec(actx, agent.ExecRequest{
		Fence: c.fence, Activation: c.activation, Argv: req.Argv, Env: req.Env, Cwd: req.Cwd, User: req.User.agent(), Stdin: req.Stdin,
		TimeoutMillis: timeout.Milliseconds(), MaxOutput: req.MaxOutput,
	}, sink)
	switch {
	case outErr != nil:
		return ExecResult{}, outErr
	case err != nil && ctx.Err() == nil && !agent.IsAnswer(err) && p.leaseEnded(ctx, c.member):
		// The lease's release or revocation stopped the cell under the
		// command: the command was killed, as at expiry.
		res := killedResult(start)
		res.Truncated = cut
		return res, nil
	case err != nil:
		return ExecResult{}, p.agentError(ctx, c.member, err)
	}
	switch ar.Reason {
	case agent.Exited, agent.TimedOut, agent.Killed:
	default:
		return ExecResult{}, p.agentUnverified(ctx, c.member, fmt.Errorf("exec answered reason %q", ar.Reason))
	}
	res := execResultOfAgent(ar)
	res.Truncated = res.Truncated || cut
	if out != nil { // streamed: the result carries none, whatever the agent says
		res.Stdout, res.Stderr = nil, nil
	}
	for _, b := range []*[]byte{&res.Stdout, &res.Stderr} {
		if len(*b) > req.MaxOutput {
			*b, res.Truncated = (*b)[:req.MaxOutput], true
		}
	}
	return res, nil
}

// killedResult is the answer to a command whose lease ended under it
// (released, revoked or expired), the cell stopped before the agent could
// say so itself: killed, as the agent reports a command it killed at the
// lease's end.
func killedResult(start time.Time) ExecResult {
	return ExecResult{ExitCode: 137, Signal: "KILL", Reason: ReasonKilled, Duration: time.Since(start)}
}

// checkExec refuses, with InvalidRequest and before anything reaches the
// store or the provider, input no provider can run as given (CONTRACT §6,
// §14). Messages never repeat the input.
func checkExec(req ExecRequest) error {
	if err := checkCommand(req.Argv, req.Env, req.Cwd, req.User); err != nil {
		return err
	}
	switch {
	case len(req.Stdin) > MaxExecStdin:
		return errcode.New(errcode.InvalidRequest, "stdin is larger than 1 MiB")
	case req.Timeout < 0:
		return errcode.New(errcode.InvalidRequest, "timeout_seconds must not be negative")
	}
	return nil
}

// checkCommand checks what exec and launch share: argv, env, cwd and user.
// The sizes of argv and env are the cell agent's own limits
// (agent.CheckArgs), so what passes here the agent runs.
func checkCommand(argv []string, env map[string]string, cwd string, user User) error {
	switch {
	case len(argv) == 0 || len(argv) > MaxExecArgs:
		return errcode.New(errcode.InvalidRequest, "argv must hold 1 to 256 strings")
	case argv[0] == "":
		return errcode.New(errcode.InvalidRequest, "argv[0] must not be empty")
	case len(env) > MaxExecEnv:
		return errcode.New(errcode.InvalidRequest, "env holds more than 64 entries")
	}
	for i, a := range argv {
		if strings.IndexByte(a, 0) >= 0 {
			return errcode.New(errcode.InvalidRequest, "argv["+strconv.Itoa(i)+"] contains a NUL byte")
		}
	}
	for k, v := range env {
		if !validEnvKey(k) {
			return errcode.New(errcode.InvalidRequest, "an env key does not match [A-Za-z_][A-Za-z0-9_]*")
		}
		if strings.IndexByte(v, 0) >= 0 {
			return errcode.New(errcode.InvalidRequest, "an env value contains a NUL byte")
		}
	}
	if err := agent.CheckArgs(argv, env); err != nil {
		ae, _ := errors.AsType[*agent.Error](err)
		return errcode.Wrap(errcode.InvalidRequest, ae.Message, err)
	}
	if cwd != "" {
		if err := checkPath("cwd", cwd); err != nil {
			return err
		}
	}
	return checkUser(user)
}

// checkPath refuses a path that is not absolute, longer than MaxPath bytes
// or holds a NUL byte; name is the field's wire name.
func checkPath(name, p string) error {
	switch {
	case !path.IsAbs(p):
		return errcode.New(errcode.InvalidRequest, name+" must be an absolute path")
	case len(p) > MaxPath:
		return errcode.New(errcode.InvalidRequest, name+" is longer than 4096 bytes")
	case strings.IndexByte(p, 0) >= 0:
		return errcode.New(errcode.InvalidRequest, name+" contains a NUL byte")
	}
	return nil
}

// checkUser refuses a user other than cell ("" too) and root.
func checkUser(u User) error {
	if u != "" && u != UserCell && u != UserRoot {
		return errcode.New(errcode.InvalidRequest, "user must be cell or root")
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
