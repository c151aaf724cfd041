package cellagent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sandboxwich/sandboxwich/agent"
)

// DefaultHelper is the executable the agent re-executes, as the requesting
// user, for file operations and the launch (a Config's zero Helper).
const DefaultHelper = "/proc/self/exe"

// Config configures an Agent.
type Config struct {
	// CellID is the cell the agent serves; an activation for another cell
	// is refused. Required.
	CellID string
	// Digest is reported in Status: "sha256:<hex>" of the agent's own
	// executable. Required.
	Digest string
	// Home is the cell user's home (default DefaultHome). Tests point it
	// at a temporary directory.
	Home string
	// Helper is the executable re-executed as the requesting user to run
	// file operations and the launch (default DefaultHelper, the running
	// binary). Its main must call HelperMain first.
	Helper string
	// Logger receives the agent's own events (never request contents);
	// nil discards them.
	Logger *slog.Logger
}

// Agent is the cell agent: it applies the fence rules of an agent.Gate
// (CONTRACT §13) on its monotonic clock — waiting, then active for exactly
// one fence until the activation's TTL runs out (or Release), then ended —
// and runs the lease's processes and files. At the end it kills every
// process of the cell: as PID 1 of its PID namespace every other process
// there; otherwise only the processes it started and their descendants.
//
// An Agent implements agent.Conn; it is safe for concurrent use.
type Agent struct {
	cfg    Config
	log    *slog.Logger
	procs  *procTable
	kernel string // the kernel release the agent sees (Status.Kernel)

	mu     sync.Mutex
	gate   *agent.Gate
	over   bool // end ran: the processes are killed or being killed
	timer  *time.Timer
	ended  chan struct{} // closed when the agent ends
	launch *launch
}

// launch is the lease's one resident process.
type launch struct {
	spec   agent.LaunchRequest // normalized, without the fence
	status agent.LaunchStatus
}

var _ agent.Conn = (*Agent)(nil)

// New returns a waiting agent for cfg.
func New(cfg Config) (*Agent, error) {
	if cfg.CellID == "" {
		return nil, fmt.Errorf("agent: Config.CellID is required")
	}
	if cfg.Digest == "" {
		return nil, fmt.Errorf("agent: Config.Digest is required")
	}
	if cfg.Home == "" {
		cfg.Home = agent.DefaultHome
	}
	if !filepath.IsAbs(cfg.Home) {
		return nil, fmt.Errorf("agent: Config.Home %q is not absolute", cfg.Home)
	}
	cfg.Home = filepath.Clean(cfg.Home)
	if cfg.Helper == "" {
		cfg.Helper = DefaultHelper
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Agent{
		cfg:    cfg,
		log:    log,
		procs:  newProcTable(),
		gate:   agent.NewGate(cfg.CellID),
		kernel: kernelRelease(),
		ended:  make(chan struct{}),
	}, nil
}

// Status reports the agent's state; it is answered in every state.
func (a *Agent) Status(ctx context.Context) (agent.Status, error) {
	a.expireIfDue()
	a.mu.Lock()
	defer a.mu.Unlock()
	st := agent.Status{State: a.gate.State(time.Now()), CellID: a.cfg.CellID, Digest: a.cfg.Digest, Kernel: a.kernel}
	if st.State != agent.Waiting {
		st.Activations = 1
	}
	return st, nil
}

// Activate binds a waiting agent to act's fence for act.TTLMillis on the
// agent's monotonic clock; renews the bound fence (a later expires_at
// moves the deadline, and every process started before runs on to it); or
// accepts a replay of the bound activation; see agent.Gate.Activate.
func (a *Agent) Activate(ctx context.Context, act agent.Activation) error {
	a.expireIfDue()
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	renewal := a.gate.State(now) == agent.Active
	if moved, err := a.gate.Activate(now, act); err != nil || !moved {
		return err
	}
	ttl := a.gate.Deadline().Sub(now)
	if a.timer != nil {
		a.timer.Stop() // a renewal: the new deadline's timer replaces it
	}
	// The timer ends the agent only if its deadline has come: a renewal
	// racing an old timer moves the deadline first.
	a.timer = time.AfterFunc(ttl, a.expireIfDue)
	what := "cell agent activated"
	if renewal {
		what = "cell agent renewed"
	}
	a.log.Info(what, "cell_id", act.CellID, "lease_id", act.LeaseID, "generation", act.Generation, "ttl", ttl)
	return nil
}

// Release ends the agent for its bound fence as expiry does: every process
// of the cell is killed and every later request refused. Releasing an
// ended agent again with the same fence succeeds.
func (a *Agent) Release(ctx context.Context, f agent.Fence) error {
	a.mu.Lock()
	err := a.gate.Release(f)
	a.mu.Unlock()
	if err != nil {
		return err
	}
	a.end()
	return nil
}

// Exec runs one command; see agent.Conn.
func (a *Agent) Exec(ctx context.Context, req agent.ExecRequest, out func(agent.Output) error) (agent.ExecResult, error) {
	if err := a.admit(ctx, req.Fence, req.Activation); err != nil {
		return agent.ExecResult{}, err
	}
	spec, err := a.processSpec(req.Argv, req.Env, req.Cwd, req.User)
	if err != nil {
		return agent.ExecResult{}, err
	}
	if len(req.Stdin) > agent.MaxStdin {
		return agent.ExecResult{}, agent.Errorf(agent.CodeTooLarge, fmt.Sprintf("stdin is larger than %d bytes", agent.MaxStdin))
	}
	if req.TimeoutMillis < 0 {
		return agent.ExecResult{}, agent.Errorf(agent.CodeInvalid, "timeout_ms is negative")
	}
	if req.MaxOutput < 0 || req.MaxOutput > agent.MaxOutputLimit {
		return agent.ExecResult{}, agent.Errorf(agent.CodeInvalid, fmt.Sprintf("max_output must be between 0 and %d", agent.MaxOutputLimit))
	}
	maxOut := req.MaxOutput
	if maxOut == 0 {
		maxOut = agent.DefaultMaxOutput
	}
	return a.exec(ctx, spec, req.Stdin, time.Duration(req.TimeoutMillis)*time.Millisecond, maxOut, out)
}

// Launch starts the lease's one resident process; see agent.Conn.
func (a *Agent) Launch(ctx context.Context, req agent.LaunchRequest) (agent.LaunchStatus, error) {
	if err := a.admit(ctx, req.Fence, req.Activation); err != nil {
		return agent.LaunchStatus{}, err
	}
	spec, err := a.processSpec(req.Argv, req.Env, req.Cwd, req.User)
	if err != nil {
		return agent.LaunchStatus{}, err
	}
	norm := agent.LaunchRequest{Argv: spec.argv, Env: req.Env, Cwd: spec.cwd, User: spec.user}
	a.mu.Lock()
	if l := a.launch; l != nil {
		defer a.mu.Unlock()
		if !sameLaunch(l.spec, norm) {
			return agent.LaunchStatus{}, agent.Errorf(agent.CodeConflict, "another launch was made for this lease")
		}
		st := l.status
		st.Replay = true
		return st, nil
	}
	l := &launch{spec: norm, status: agent.LaunchStatus{Phase: agent.Accepted}}
	a.launch = l
	a.mu.Unlock()

	pid, exited, err := a.startLaunch(spec)
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil {
		a.launch = nil // nothing runs: a retry may start it
		return agent.LaunchStatus{}, err
	}
	l.status.Phase, l.status.PID = agent.Running, &pid
	go a.awaitLaunch(l, exited)
	return l.status, nil
}

// awaitLaunch records the launched process's end.
func (a *Agent) awaitLaunch(l *launch, exited <-chan exitStatus) {
	es := <-exited
	reason := agent.Exited
	select {
	case <-a.ended:
		reason = agent.Killed
	default:
		if es.lost {
			reason = agent.CellLost
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	code := es.code
	l.status.Phase, l.status.ExitCode, l.status.Reason = agent.Terminal, &code, &reason
	if es.signal != "" {
		sig := es.signal
		l.status.Signal = &sig
	}
}

// LaunchStatus reports the launched process; see agent.Conn.
func (a *Agent) LaunchStatus(ctx context.Context, f agent.Fence) (agent.LaunchStatus, error) {
	if err := a.check(f); err != nil {
		return agent.LaunchStatus{}, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.launch == nil {
		return agent.LaunchStatus{}, agent.Errorf(agent.CodeNotLaunched, "nothing was launched for this lease")
	}
	return a.launch.status, nil
}

// WriteFile streams content into req.Path with req.User's rights; see
// agent.Conn.
func (a *Agent) WriteFile(ctx context.Context, req agent.WriteRequest, content io.Reader) (agent.FileInfo, error) {
	if err := a.admit(ctx, req.Fence, req.Activation); err != nil {
		return agent.FileInfo{}, err
	}
	path, err := cleanPath("path", req.Path)
	if err != nil {
		return agent.FileInfo{}, err
	}
	if path == "/" || agent.NamesDirectory(req.Path) {
		return agent.FileInfo{}, agent.Errorf(agent.CodeInvalid, "path names a directory (it ends in /, /. or /..), not a file")
	}
	if req.Mode&^0o777 != 0 {
		return agent.FileInfo{}, agent.Errorf(agent.CodeInvalid, fmt.Sprintf("mode %#o has bits beyond 0777", req.Mode))
	}
	mode := req.Mode
	if mode == 0 {
		mode = 0o644
	}
	cred, err := a.credOf(req.User)
	if err != nil {
		return agent.FileInfo{}, err
	}
	return a.writeFile(ctx, cred, path, mode, content)
}

// ReadFile opens req.Path with req.User's rights; see agent.Conn.
func (a *Agent) ReadFile(ctx context.Context, req agent.ReadRequest) (io.ReadCloser, int64, error) {
	if err := a.admit(ctx, req.Fence, req.Activation); err != nil {
		return nil, 0, err
	}
	path, err := cleanPath("path", req.Path)
	if err != nil {
		return nil, 0, err
	}
	if req.MaxBytes < 0 || req.MaxBytes > agent.MaxFileBytes {
		return nil, 0, agent.Errorf(agent.CodeInvalid, fmt.Sprintf("max_bytes must be between 0 and %d", agent.MaxFileBytes))
	}
	limit := req.MaxBytes
	if limit == 0 {
		limit = agent.MaxFileBytes
	}
	cred, err := a.credOf(req.User)
	if err != nil {
		return nil, 0, err
	}
	return a.readFile(ctx, cred, path, limit)
}

// admit activates the agent with act when a request carries one (see
// agent.Conn), then admits the request's fence f.
func (a *Agent) admit(ctx context.Context, f agent.Fence, act *agent.Activation) error {
	if act != nil {
		if act.Fence != f {
			return agent.Errorf(agent.CodeInvalid, "the request's activation names another fence than the request")
		}
		if err := a.Activate(ctx, *act); err != nil {
			return err
		}
	}
	return a.check(f)
}

// check admits a lease operation carrying f.
func (a *Agent) check(f agent.Fence) error {
	a.expireIfDue()
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.gate.Admit(time.Now(), f)
}

// expireIfDue ends an agent whose deadline passed (the timer may not have
// run yet).
func (a *Agent) expireIfDue() {
	a.mu.Lock()
	due := !a.over && a.gate.State(time.Now()) == agent.Ended
	a.mu.Unlock()
	if due {
		a.end()
	}
}

// end ends the agent (once) and kills every process of the cell. It
// returns after the kill.
func (a *Agent) end() {
	a.mu.Lock()
	if a.over {
		a.mu.Unlock()
		a.procs.wait() // another caller is killing; return after it
		return
	}
	a.over = true
	a.gate.End()
	if a.timer != nil {
		a.timer.Stop()
	}
	close(a.ended)
	a.procs.beginEnd()
	a.mu.Unlock()
	a.log.Info("cell agent ended; killing every process of the cell", "cell_id", a.cfg.CellID)
	a.procs.killAll()
}

// Shutdown ends the agent whatever its state, killing every process of
// the cell, as at expiry. The agent binary calls it on SIGTERM.
func (a *Agent) Shutdown() { a.end() }

// spec is a validated process to start.
type spec struct {
	argv []string
	env  []string // the full environment, base first
	cwd  string
	user agent.User
	cred cred
}

// Base environment of every cell process (CONTRACT §14); the request's
// env is added to it and wins.
const basePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// processSpec validates argv, env, cwd and user and builds the spec. It
// refuses bad input with agent.ErrInvalid or agent.ErrUserUnsupported.
func (a *Agent) processSpec(argv []string, env map[string]string, cwd string, user agent.User) (spec, error) {
	if len(argv) == 0 || argv[0] == "" {
		return spec{}, agent.Errorf(agent.CodeInvalid, "argv[0] is empty")
	}
	for i, s := range argv {
		if strings.ContainsRune(s, 0) {
			return spec{}, agent.Errorf(agent.CodeInvalid, fmt.Sprintf("argv[%d] contains a NUL byte", i))
		}
	}
	keys := make([]string, 0, len(env))
	for k, v := range env {
		if !validEnvKey(k) {
			return spec{}, agent.Errorf(agent.CodeInvalid, fmt.Sprintf("env key %q does not match [A-Za-z_][A-Za-z0-9_]*", k))
		}
		if strings.ContainsRune(v, 0) {
			return spec{}, agent.Errorf(agent.CodeInvalid, fmt.Sprintf("the value of env %s contains a NUL byte", k))
		}
		keys = append(keys, k)
	}
	if err := agent.CheckArgs(argv, env); err != nil {
		return spec{}, err
	}
	if cwd == "" {
		cwd = a.cfg.Home
	}
	cwd, err := cleanPath("cwd", cwd)
	if err != nil {
		return spec{}, err
	}
	if user == "" {
		user = agent.UserCell
	}
	c, err := a.credOf(user)
	if err != nil {
		return spec{}, err
	}
	home := a.cfg.Home
	if user == agent.UserRoot {
		home = "/root"
	}
	base := map[string]string{"PATH": basePath, "HOME": home, "TERM": "dumb"}
	full := []string{"PATH=" + basePath, "HOME=" + home, "TERM=dumb"}
	slices.Sort(keys)
	for _, k := range keys {
		if _, ok := base[k]; ok {
			full = slices.DeleteFunc(full, func(kv string) bool { return strings.HasPrefix(kv, k+"=") })
		}
		full = append(full, k+"="+env[k])
	}
	return spec{argv: slices.Clone(argv), env: full, cwd: cwd, user: user, cred: c}, nil
}

// credOf maps a user to its identity; an unknown user, or one this agent
// cannot become, is agent.ErrUserUnsupported.
func (a *Agent) credOf(u agent.User) (cred, error) {
	var c cred
	switch u {
	case "", agent.UserCell:
		c = cred{uid: agent.CellUID, gid: agent.CellGID}
	case agent.UserRoot:
		c = cred{uid: 0, gid: 0}
	default:
		return cred{}, agent.Errorf(agent.CodeUserUnsupported, fmt.Sprintf("unknown user %q (cell or root)", u))
	}
	if err := canBecome(c); err != nil {
		return cred{}, err
	}
	return c, nil
}

// cred is a numeric identity a child process runs as.
type cred struct{ uid, gid uint32 }

// cleanPath checks that p (the request's field what) is an absolute path
// of at most MaxPath bytes without NUL, and returns it cleaned.
func cleanPath(what, p string) (string, error) {
	switch {
	case p == "":
		return "", agent.Errorf(agent.CodeInvalid, what+" is empty")
	case len(p) > agent.MaxPath:
		return "", agent.Errorf(agent.CodeInvalid, fmt.Sprintf("%s is longer than %d bytes", what, agent.MaxPath))
	case strings.ContainsRune(p, 0):
		return "", agent.Errorf(agent.CodeInvalid, what+" contains a NUL byte")
	case !strings.HasPrefix(p, "/"):
		return "", agent.Errorf(agent.CodeInvalid, what+" is not absolute")
	}
	return filepath.Clean(p), nil
}

// validEnvKey reports whether k matches [A-Za-z_][A-Za-z0-9_]*.
func validEnvKey(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		alpha := c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z')
		if !alpha && (i == 0 || c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// sameLaunch reports whether two normalized launch specs are equal.
func sameLaunch(a, b agent.LaunchRequest) bool {
	if a.Cwd != b.Cwd || a.User != b.User || !slices.Equal(a.Argv, b.Argv) || len(a.Env) != len(b.Env) {
		return false
	}
	for k, v := range a.Env {
		if w, ok := b.Env[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// exitStatus is how a child ended, as the reaper saw it.
type exitStatus struct {
	code   int
	signal string // "KILL", or ""
	lost   bool   // the status could not be collected
}
