package fake

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"path"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/driver"
)

// AgentDigest is the build digest every fake agent reports, and the one
// the fake's Inspect reads back for an object that runs one.
const AgentDigest = "sha256:a018173cf37e8c7b43c6cc6425a7c1c03c7ad007396a0e5b4bc936837d8c1c75"

// AgentProvider is a Provider whose objects each run an in-memory cell
// agent: it implements driver.AgentHost as well. The agent applies the
// real agent's fence rules (an agent.Gate) by the Config.Now clock —
// waiting, active for one fence and its exact replays, ended at its
// activation's TTL or release — runs a few builtin commands and keeps
// files in memory:
//
//   - echo ARG…   writes the arguments to stdout, one chunk each
//   - cat         copies stdin to stdout
//   - emit N      writes N bytes ("x") to stdout, in chunks of 32 KiB
//   - exit N      exits with code N
//   - sleep SECS  waits (real time) until its timeout kills it
//
// A command that ends after the activation's TTL passed (by Config.Now)
// or its release is answered killed, as the real agent kills it then.
//   - pwd, whoami write the request's cwd and user
//
// Any other command exits 127. A launched workload runs the same builtins
// in the background, its output in /home/cell/.launch/stdout and …/stderr.
type AgentProvider struct{ *Provider }

// NewWithAgent returns a provider whose objects run the fake agent.
func NewWithAgent(cfg Config) *AgentProvider {
	p := New(cfg)
	p.agents = true
	return &AgentProvider{p}
}

var _ driver.AgentHost = (*AgentProvider)(nil)

// Agent implements driver.AgentHost. A missing object is
// driver.ErrNotFound.
func (p *AgentProvider) Agent(ctx context.Context, obj driver.Object) (agent.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	o, ok := p.objects[obj.CellID]
	if !ok || (obj.Identity != "" && o.identity != obj.Identity) {
		return nil, fmt.Errorf("fake: cell %s: %w", obj.CellID, driver.ErrNotFound)
	}
	return o.agent, nil
}

// AgentFaults are the misbehaviours of every agent of a provider.
type AgentFaults struct {
	// Status rewrites every status report (a wrong state, digest or cell).
	Status func(agent.Status) agent.Status
	// Delay holds every answer this long, or until the call's context
	// ends.
	Delay time.Duration
	// RefuseFence refuses every activation with agent.ErrFenceRefused.
	RefuseFence bool
	// Answer, when set, is the answer to every fenced request (exec,
	// launch, files) instead of serving it.
	Answer error
}

// SetAgentFaults replaces the agents' faults from now on.
func (p *AgentProvider) SetAgentFaults(f AgentFaults) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.agentFaults = f
}

// Message is one request sent to an agent, recorded as it arrived —
// before any fault, the agent's death or its fence check: Body is the
// request as JSON, Data its stdin or file content.
type Message struct {
	CellID uuid.UUID
	Op     string // "status", "activate", "exec", "launch", "launch_status", "write_file", "read_file", "release"
	Body   []byte
	Data   []byte
}

// Received returns every request sent to the provider's agents, in
// order, including those of objects destroyed since.
func (p *AgentProvider) Received() []Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Message(nil), p.received...)
}

// cellAgent is one object's agent. It implements agent.Conn.
type cellAgent struct {
	p      *Provider
	cellID uuid.UUID
	dead   chan struct{} // closed when the object dies

	mu     sync.Mutex
	gate   *agent.Gate // the fence rules, by p.cfg.Now
	files  map[string][]byte
	launch *launched
}

type launched struct {
	spec   []byte // the request as JSON
	status agent.LaunchStatus
}

func newCellAgent(p *Provider, cellID uuid.UUID) *cellAgent {
	return &cellAgent{p: p, cellID: cellID, dead: make(chan struct{}), gate: agent.NewGate(cellID.String()), files: map[string][]byte{}}
}

var errLost = fmt.Errorf("fake: the cell agent is gone: %w", driver.ErrCellLost)

// receive records a request, then waits out the Delay fault; it fails
// without an answer once the object died.
func (a *cellAgent) receive(ctx context.Context, op string, req any, data []byte) (AgentFaults, error) {
	body, _ := json.Marshal(req)
	a.p.mu.Lock()
	a.p.received = append(a.p.received, Message{CellID: a.cellID, Op: op, Body: body, Data: bytes.Clone(data)})
	f := a.p.agentFaults
	a.p.mu.Unlock()
	var delay <-chan time.Time
	if f.Delay > 0 {
		t := time.NewTimer(f.Delay)
		defer t.Stop()
		delay = t.C
	}
	select {
	case <-a.dead:
		return f, errLost
	case <-ctx.Done():
		return f, ctx.Err()
	default:
	}
	if delay != nil {
		select {
		case <-a.dead:
			return f, errLost
		case <-ctx.Done():
			return f, ctx.Err()
		case <-delay:
		}
	}
	return f, nil
}

// state is the agent's state now; at the end (the TTL passed) the
// launched workload is killed. The caller holds a.mu.
func (a *cellAgent) state() agent.State {
	st := a.gate.State(a.p.cfg.Now())
	if st == agent.Ended {
		a.end()
	}
	return st
}

// end kills the launched workload, if it still runs; the caller holds
// a.mu.
func (a *cellAgent) end() {
	if l := a.launch; l != nil && l.status.Phase != agent.Terminal {
		l.status = terminal(137, "KILL", agent.Killed, l.status.PID)
	}
}

// Release implements agent.Conn: it ends the agent as expiry does; again
// with the same fence it succeeds.
func (a *cellAgent) Release(ctx context.Context, fence agent.Fence) error {
	f, err := a.receive(ctx, "release", fence, nil)
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.state() == agent.Active && a.gate.Admit(a.p.cfg.Now(), fence) == nil && f.Answer != nil {
		return f.Answer // the fault, as for every fenced request
	}
	if err := a.gate.Release(fence); err != nil {
		return err
	}
	a.end()
	return nil
}

// fenced admits a fenced request by the gate, then answers the Answer
// fault; the caller holds a.mu.
func (a *cellAgent) fenced(f AgentFaults, fence agent.Fence) error {
	a.state()
	if err := a.gate.Admit(a.p.cfg.Now(), fence); err != nil {
		return err
	}
	return f.Answer
}

// Status implements agent.Conn.
func (a *cellAgent) Status(ctx context.Context) (agent.Status, error) {
	f, err := a.receive(ctx, "status", struct{}{}, nil)
	if err != nil {
		return agent.Status{}, err
	}
	a.mu.Lock()
	st := agent.Status{State: a.state(), CellID: a.cellID.String(), Digest: AgentDigest}
	a.mu.Unlock()
	if st.State != agent.Waiting {
		st.Activations = 1
	}
	if f.Status != nil {
		st = f.Status(st)
	}
	return st, nil
}

// activateWith activates the agent with the activation a request carries
// (agent.Conn), which Received shows as an "activate" message of its own.
func (a *cellAgent) activateWith(ctx context.Context, fence agent.Fence, act *agent.Activation) error {
	switch {
	case act == nil:
		return nil
	case act.Fence != fence:
		return agent.Errorf(agent.CodeInvalid, "the activation names another fence than the request")
	}
	return a.Activate(ctx, *act)
}

// Activate implements agent.Conn.
func (a *cellAgent) Activate(ctx context.Context, act agent.Activation) error {
	f, err := a.receive(ctx, "activate", act, nil)
	if err != nil {
		return err
	}
	if f.RefuseFence {
		return agent.Errorf(agent.CodeFenceRefused, "bound to another fence")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.state()
	_, err = a.gate.Activate(a.p.cfg.Now(), act)
	return err
}

// Exec implements agent.Conn.
func (a *cellAgent) Exec(ctx context.Context, req agent.ExecRequest, out func(agent.Output) error) (agent.ExecResult, error) {
	if err := a.activateWith(ctx, req.Fence, req.Activation); err != nil {
		return agent.ExecResult{}, err
	}
	f, err := a.receive(ctx, "exec", req, req.Stdin)
	if err != nil {
		return agent.ExecResult{}, err
	}
	a.mu.Lock()
	err = a.fenced(f, req.Fence)
	a.mu.Unlock()
	if err != nil {
		return agent.ExecResult{}, err
	}
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return agent.ExecResult{}, agent.Errorf(agent.CodeInvalid, "empty argv")
	}
	maxOut := req.MaxOutput
	if maxOut <= 0 {
		maxOut = agent.DefaultMaxOutput
	}
	var res agent.ExecResult
	left := map[agent.Stream]int{agent.Stdout: maxOut, agent.Stderr: maxOut}
	emit := func(s agent.Stream, b []byte) error {
		if len(b) > left[s] {
			b, res.Truncated = b[:left[s]], true
		}
		left[s] -= len(b)
		switch {
		case len(b) == 0:
		case out != nil:
			return out(agent.Output{Stream: s, Data: b})
		case s == agent.Stdout:
			res.Stdout = append(res.Stdout, b...)
		default:
			res.Stderr = append(res.Stderr, b...)
		}
		return nil
	}
	start := time.Now()
	res.ExitCode, res.Signal, res.Reason, err = a.run(ctx, req.Argv, req.Stdin, req.Cwd, req.User,
		time.Duration(req.TimeoutMillis)*time.Millisecond, emit)
	res.DurationMillis = time.Since(start).Milliseconds()
	a.mu.Lock()
	if err == nil && a.state() == agent.Ended {
		// The activation's TTL passed (or it was released) while the
		// command ran: the real agent kills it then.
		res.ExitCode, res.Signal, res.Reason = 137, "KILL", agent.Killed
	}
	a.mu.Unlock()
	return res, err
}

// run runs a builtin, writing its output with emit. A zero timeout means
// none.
func (a *cellAgent) run(ctx context.Context, argv []string, stdin []byte, cwd string, user agent.User, timeout time.Duration,
	emit func(agent.Stream, []byte) error) (code int, signal string, reason agent.Reason, err error) {
	switch argv[0] {
	case "echo":
		for i, s := range argv[1:] {
			sep := " "
			if i == len(argv)-2 {
				sep = "\n"
			}
			if err := emit(agent.Stdout, []byte(s+sep)); err != nil {
				return 0, "", "", err
			}
		}
	case "cat":
		err = emit(agent.Stdout, stdin)
	case "emit":
		n := 0
		if len(argv) > 1 {
			n, _ = strconv.Atoi(argv[1])
		}
		for ; n > 0 && err == nil; n -= 32 << 10 {
			err = emit(agent.Stdout, bytes.Repeat([]byte("x"), min(n, 32<<10)))
		}
	case "pwd":
		err = emit(agent.Stdout, []byte(cmp.Or(cwd, "/home/cell")+"\n"))
	case "whoami":
		err = emit(agent.Stdout, []byte(string(cmp.Or(user, agent.UserCell))+"\n"))
	case "exit":
		if len(argv) > 1 {
			code, _ = strconv.Atoi(argv[1])
		}
	case "sleep":
		secs := 0.0
		if len(argv) > 1 {
			secs, _ = strconv.ParseFloat(argv[1], 64)
		}
		d := time.Duration(secs * float64(time.Second))
		timedOut := timeout > 0 && timeout < d
		if timedOut {
			d = timeout
		}
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-a.dead:
			return 0, "", "", errLost
		case <-ctx.Done():
			return 0, "", "", ctx.Err()
		case <-t.C:
		}
		if timedOut {
			return 137, "KILL", agent.TimedOut, nil
		}
	default:
		code, err = 127, emit(agent.Stderr, []byte(argv[0]+": command not found\n"))
	}
	if err != nil {
		return 0, "", "", err
	}
	return code, "", agent.Exited, nil
}

func terminal(code int, signal string, reason agent.Reason, pid *int) agent.LaunchStatus {
	st := agent.LaunchStatus{Phase: agent.Terminal, PID: pid, ExitCode: &code, Reason: &reason}
	if signal != "" {
		st.Signal = &signal
	}
	return st
}

// Launch implements agent.Conn.
func (a *cellAgent) Launch(ctx context.Context, req agent.LaunchRequest) (agent.LaunchStatus, error) {
	if err := a.activateWith(ctx, req.Fence, req.Activation); err != nil {
		return agent.LaunchStatus{}, err
	}
	f, err := a.receive(ctx, "launch", req, nil)
	if err != nil {
		return agent.LaunchStatus{}, err
	}
	spec, _ := json.Marshal(agent.LaunchRequest{Fence: req.Fence, Argv: req.Argv, Env: req.Env, Cwd: req.Cwd, User: req.User}) // the activation is not the spec
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.fenced(f, req.Fence); err != nil {
		return agent.LaunchStatus{}, err
	}
	if l := a.launch; l != nil {
		if !bytes.Equal(l.spec, spec) {
			return agent.LaunchStatus{}, agent.Errorf(agent.CodeConflict, "a different launch was made")
		}
		st := l.status
		st.Replay = true
		return st, nil
	}
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return agent.LaunchStatus{}, agent.Errorf(agent.CodeInvalid, "empty argv")
	}
	pid := 2
	a.launch = &launched{spec: spec, status: agent.LaunchStatus{Phase: agent.Running, PID: &pid}}
	go func() {
		var stdout, stderr []byte
		code, signal, reason, err := a.run(context.Background(), req.Argv, nil, req.Cwd, req.User, 0,
			func(s agent.Stream, b []byte) error {
				if s == agent.Stdout {
					stdout = append(stdout, b...)
				} else {
					stderr = append(stderr, b...)
				}
				return nil
			})
		a.mu.Lock()
		defer a.mu.Unlock()
		a.files["/home/cell/.launch/stdout"], a.files["/home/cell/.launch/stderr"] = stdout, stderr
		if a.launch.status.Phase == agent.Terminal {
			return // killed at expiry
		}
		if err != nil { // the object died
			code, signal, reason = 137, "KILL", agent.Killed
		}
		a.launch.status = terminal(code, signal, reason, &pid)
	}()
	return a.launch.status, nil
}

// LaunchStatus implements agent.Conn.
func (a *cellAgent) LaunchStatus(ctx context.Context, fence agent.Fence) (agent.LaunchStatus, error) {
	f, err := a.receive(ctx, "launch_status", fence, nil)
	if err != nil {
		return agent.LaunchStatus{}, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.fenced(f, fence); err != nil {
		return agent.LaunchStatus{}, err
	}
	if a.launch == nil {
		return agent.LaunchStatus{}, agent.Errorf(agent.CodeNotLaunched, "nothing launched")
	}
	return a.launch.status, nil
}

// WriteFile implements agent.Conn.
func (a *cellAgent) WriteFile(ctx context.Context, req agent.WriteRequest, content io.Reader) (agent.FileInfo, error) {
	if err := a.activateWith(ctx, req.Fence, req.Activation); err != nil {
		return agent.FileInfo{}, err
	}
	// As the real agent: the file is replaced only when content ends with
	// io.EOF; any other error (a body cut short) writes nothing.
	data, err := io.ReadAll(io.LimitReader(content, agent.MaxFileBytes+1))
	if err != nil {
		return agent.FileInfo{}, fmt.Errorf("fake: reading the content: %w", err)
	}
	f, err := a.receive(ctx, "write_file", req, data)
	if err != nil {
		return agent.FileInfo{}, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.fenced(f, req.Fence); err != nil {
		return agent.FileInfo{}, err
	}
	switch {
	case !path.IsAbs(req.Path) || agent.NamesDirectory(req.Path):
		return agent.FileInfo{}, agent.Errorf(agent.CodeInvalid, "not an absolute file path")
	case len(data) > agent.MaxFileBytes:
		return agent.FileInfo{}, agent.Errorf(agent.CodeTooLarge, "more than 256 MiB")
	}
	a.files[req.Path] = data
	sum := sha256.Sum256(data)
	return agent.FileInfo{Path: req.Path, Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}, nil
}

// ReadFile implements agent.Conn.
func (a *cellAgent) ReadFile(ctx context.Context, req agent.ReadRequest) (io.ReadCloser, int64, error) {
	if err := a.activateWith(ctx, req.Fence, req.Activation); err != nil {
		return nil, 0, err
	}
	f, err := a.receive(ctx, "read_file", req, nil)
	if err != nil {
		return nil, 0, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.fenced(f, req.Fence); err != nil {
		return nil, 0, err
	}
	data, ok := a.files[req.Path]
	limit := req.MaxBytes
	if limit <= 0 {
		limit = agent.MaxFileBytes
	}
	switch {
	case !path.IsAbs(req.Path):
		return nil, 0, agent.Errorf(agent.CodeInvalid, "not an absolute path")
	case !ok:
		return nil, 0, agent.Errorf(agent.CodeNotFound, "no such file")
	case int64(len(data)) > limit:
		return nil, 0, agent.Errorf(agent.CodeTooLarge, "larger than max_bytes")
	}
	return io.NopCloser(bytes.NewReader(data)), int64(len(data)), nil
}
