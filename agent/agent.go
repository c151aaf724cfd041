package agent

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
)

// Defaults of a Config's zero fields.
const (
	// DefaultHome is the cell user's home: an exec's default cwd and the
	// parent of the launch's output directory.
	DefaultHome = "/home/cell"
	// DefaultHelper is the executable the agent re-executes, as the
	// requesting user, for file operations and the launch.
	DefaultHelper = "/proc/self/exe"
	// DefaultMaxOutput caps each output stream of an exec whose MaxOutput
	// is zero.
	DefaultMaxOutput = 1 << 20
	// MaxOutputLimit is the largest MaxOutput an exec may ask for.
	MaxOutputLimit = 64 << 20
)

// The cell user's identity (CONTRACT §14).
const (
	CellUID = 1000
	CellGID = 1000
)

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

// Agent is the cell agent's state machine (CONTRACT §13): waiting, then
// active for exactly one fence until the activation's TTL runs out on the
// agent's monotonic clock (or Release), then ended. At the end it kills
// every process of the cell: as PID 1 of its PID namespace every other
// process there; otherwise only the processes it started and their
// descendants.
//
// An Agent implements Conn; it is safe for concurrent use.
type Agent struct {
	cfg   Config
	log   *slog.Logger
	procs *procTable

	mu       sync.Mutex
	state    State
	bound    Activation
	deadline time.Time // monotonic: activation + TTL
	timer    *time.Timer
	ended    chan struct{} // closed when the agent ends
	launch   *launch
}

// launch is the lease's one resident process.
type launch struct {
	spec   LaunchRequest // normalized, without the fence
	status LaunchStatus
}

var _ Conn = (*Agent)(nil)

// New returns a waiting agent for cfg.
func New(cfg Config) (*Agent, error) {
	if cfg.CellID == "" {
		return nil, fmt.Errorf("agent: Config.CellID is required")
	}
	if cfg.Digest == "" {
		return nil, fmt.Errorf("agent: Config.Digest is required")
	}
	if cfg.Home == "" {
		cfg.Home = DefaultHome
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
		cfg:   cfg,
		log:   log,
		procs: newProcTable(),
		state: Waiting,
		ended: make(chan struct{}),
	}, nil
}

// Status reports the agent's state; it is answered in every state.
func (a *Agent) Status(ctx context.Context) (Status, error) {
	a.expireIfDue()
	a.mu.Lock()
	defer a.mu.Unlock()
	st := Status{State: a.state, CellID: a.cfg.CellID, Digest: a.cfg.Digest}
	if a.state != Waiting {
		st.Activations = 1
	}
	return st, nil
}

// Activate binds a waiting agent to act's fence for act.TTLMillis on the
// agent's monotonic clock, or accepts an exact replay of the bound
// activation (same cell, lease, generation and expires_at; ttl_ms is then
// ignored). Another fence, or another cell: ErrFenceRefused, and nothing
// changes.
func (a *Agent) Activate(ctx context.Context, act Activation) error {
	if act.Version != ProtocolVersion {
		return Errorf(CodeInvalid, fmt.Sprintf("activation version %d is not %d", act.Version, ProtocolVersion))
	}
	if act.CellID != a.cfg.CellID {
		return Errorf(CodeFenceRefused, "the activation names another cell")
	}
	if act.LeaseID == "" || act.Generation < 1 {
		return Errorf(CodeInvalid, "an activation needs a lease_id and a generation ≥ 1")
	}
	a.expireIfDue()
	a.mu.Lock()
	defer a.mu.Unlock()
	switch a.state {
	case Waiting:
		if act.TTLMillis <= 0 {
			return Errorf(CodeInvalid, "ttl_ms must be positive")
		}
		ttl := time.Duration(act.TTLMillis) * time.Millisecond
		a.state, a.bound = Active, act
		a.deadline = time.Now().Add(ttl)
		a.timer = time.AfterFunc(ttl, a.end)
		a.log.Info("cell agent activated", "cell_id", act.CellID, "lease_id", act.LeaseID, "generation", act.Generation, "ttl", ttl)
		return nil
	default:
		b := a.bound
		if act.Fence != b.Fence || !act.ExpiresAt.Equal(b.ExpiresAt) {
			return Errorf(CodeFenceRefused, "the agent is bound to another fence")
		}
		if a.state == Ended {
			return Errorf(CodeExpired, "the lease ended")
		}
		return nil
	}
}

// Release ends the agent for its bound fence as expiry does: every process
// of the cell is killed and every later request refused. Releasing an
// ended agent again with the same fence succeeds.
func (a *Agent) Release(ctx context.Context, f Fence) error {
	a.mu.Lock()
	state, bound := a.state, a.bound.Fence
	a.mu.Unlock()
	switch {
	case state == Waiting:
		return Errorf(CodeNotActive, "the agent was never activated")
	case f != bound:
		return Errorf(CodeFenceRefused, "the agent is bound to another fence")
	}
	a.end()
	return nil
}

// Exec runs one command; see Conn.
func (a *Agent) Exec(ctx context.Context, req ExecRequest, out func(Output) error) (ExecResult, error) {
	if err := a.admit(ctx, req.Fence, req.Activation); err != nil {
		return ExecResult{}, err
	}
	spec, err := a.processSpec(req.Argv, req.Env, req.Cwd, req.User)
	if err != nil {
		return ExecResult{}, err
	}
	if len(req.Stdin) > MaxStdin {
		return ExecResult{}, Errorf(CodeTooLarge, fmt.Sprintf("stdin is larger than %d bytes", MaxStdin))
	}
	if req.TimeoutMillis < 0 {
		return ExecResult{}, Errorf(CodeInvalid, "timeout_ms is negative")
	}
	if req.MaxOutput < 0 || req.MaxOutput > MaxOutputLimit {
		return ExecResult{}, Errorf(CodeInvalid, fmt.Sprintf("max_output must be between 0 and %d", MaxOutputLimit))
	}
	maxOut := req.MaxOutput
	if maxOut == 0 {
		maxOut = DefaultMaxOutput
	}
	return a.exec(ctx, spec, req.Stdin, time.Duration(req.TimeoutMillis)*time.Millisecond, maxOut, out)
}

// Launch starts the lease's one resident process; see Conn.
func (a *Agent) Launch(ctx context.Context, req LaunchRequest) (LaunchStatus, error) {
	if err := a.admit(ctx, req.Fence, req.Activation); err != nil {
		return LaunchStatus{}, err
	}
	spec, err := a.processSpec(req.Argv, req.Env, req.Cwd, req.User)
	if err != nil {
		return LaunchStatus{}, err
	}
	norm := LaunchRequest{Argv: spec.argv, Env: req.Env, Cwd: spec.cwd, User: spec.user}
	a.mu.Lock()
	if l := a.launch; l != nil {
		defer a.mu.Unlock()
		if !sameLaunch(l.spec, norm) {
			return LaunchStatus{}, Errorf(CodeConflict, "another launch was made for this lease")
		}
		st := l.status
		st.Replay = true
		return st, nil
	}
	l := &launch{spec: norm, status: LaunchStatus{Phase: Accepted}}
	a.launch = l
	a.mu.Unlock()

	pid, exited, err := a.startLaunch(spec)
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil {
		a.launch = nil // nothing runs: a retry may start it
		return LaunchStatus{}, err
	}
	l.status.Phase, l.status.PID = Running, &pid
	go a.awaitLaunch(l, exited)
	return l.status, nil
}

// awaitLaunch records the launched process's end.
func (a *Agent) awaitLaunch(l *launch, exited <-chan exitStatus) {
	es := <-exited
	reason := Exited
	select {
	case <-a.ended:
		reason = Killed
	default:
		if es.lost {
			reason = CellLost
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	code := es.code
	l.status.Phase, l.status.ExitCode, l.status.Reason = Terminal, &code, &reason
	if es.signal != "" {
		sig := es.signal
		l.status.Signal = &sig
	}
}

// LaunchStatus reports the launched process; see Conn.
func (a *Agent) LaunchStatus(ctx context.Context, f Fence) (LaunchStatus, error) {
	if err := a.check(f); err != nil {
		return LaunchStatus{}, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.launch == nil {
		return LaunchStatus{}, Errorf(CodeNotLaunched, "nothing was launched for this lease")
	}
	return a.launch.status, nil
}

// WriteFile streams content into req.Path with req.User's rights; see
// Conn.
func (a *Agent) WriteFile(ctx context.Context, req WriteRequest, content io.Reader) (FileInfo, error) {
	if err := a.admit(ctx, req.Fence, req.Activation); err != nil {
		return FileInfo{}, err
	}
	path, err := cleanPath("path", req.Path)
	if err != nil {
		return FileInfo{}, err
	}
	if path == "/" || NamesDirectory(req.Path) {
		return FileInfo{}, Errorf(CodeInvalid, "path names a directory (it ends in /, /. or /..), not a file")
	}
	if req.Mode&^0o777 != 0 {
		return FileInfo{}, Errorf(CodeInvalid, fmt.Sprintf("mode %#o has bits beyond 0777", req.Mode))
	}
	mode := req.Mode
	if mode == 0 {
		mode = 0o644
	}
	cred, err := a.credOf(req.User)
	if err != nil {
		return FileInfo{}, err
	}
	return a.writeFile(ctx, cred, path, mode, content)
}

// ReadFile opens req.Path with req.User's rights; see Conn.
func (a *Agent) ReadFile(ctx context.Context, req ReadRequest) (io.ReadCloser, int64, error) {
	if err := a.admit(ctx, req.Fence, req.Activation); err != nil {
		return nil, 0, err
	}
	path, err := cleanPath("path", req.Path)
	if err != nil {
		return nil, 0, err
	}
	if req.MaxBytes < 0 || req.MaxBytes > MaxFileBytes {
		return nil, 0, Errorf(CodeInvalid, fmt.Sprintf("max_bytes must be between 0 and %d", MaxFileBytes))
	}
	limit := req.MaxBytes
	if limit == 0 {
		limit = MaxFileBytes
	}
	cred, err := a.credOf(req.User)
	if err != nil {
		return nil, 0, err
	}
	return a.readFile(ctx, cred, path, limit)
}

// admit activates the agent with act when a request carries one (see
// Conn), then admits the request's fence f.
func (a *Agent) admit(ctx context.Context, f Fence, act *Activation) error {
	if act != nil {
		if act.Fence != f {
			return Errorf(CodeInvalid, "the request's activation names another fence than the request")
		}
		if err := a.Activate(ctx, *act); err != nil {
			return err
		}
	}
	return a.check(f)
}

// check admits a lease operation carrying f.
func (a *Agent) check(f Fence) error {
	a.expireIfDue()
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.state == Waiting:
		return Errorf(CodeNotActive, "the agent was never activated")
	case a.state == Ended:
		return Errorf(CodeExpired, "the lease ended")
	case f != a.bound.Fence:
		return Errorf(CodeFenceRefused, "the request carries another fence than the bound one")
	}
	return nil
}

// expireIfDue ends an active agent whose deadline passed (the timer may
// not have run yet).
func (a *Agent) expireIfDue() {
	a.mu.Lock()
	due := a.state == Active && !time.Now().Before(a.deadline)
	a.mu.Unlock()
	if due {
		a.end()
	}
}

// end moves the agent to Ended (once) and kills every process of the
// cell. It returns after the kill.
func (a *Agent) end() {
	a.mu.Lock()
	if a.state == Ended {
		a.mu.Unlock()
		a.procs.wait() // another caller is killing; return after it
		return
	}
	a.state = Ended
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
	user User
	cred cred
}

// Base environment of every cell process (CONTRACT §14); the request's
// env is added to it and wins.
const basePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// processSpec validates argv, env, cwd and user and builds the spec. It
// refuses bad input with ErrInvalid or ErrUserUnsupported.
func (a *Agent) processSpec(argv []string, env map[string]string, cwd string, user User) (spec, error) {
	if len(argv) == 0 || argv[0] == "" {
		return spec{}, Errorf(CodeInvalid, "argv[0] is empty")
	}
	for i, s := range argv {
		if strings.ContainsRune(s, 0) {
			return spec{}, Errorf(CodeInvalid, fmt.Sprintf("argv[%d] contains a NUL byte", i))
		}
	}
	keys := make([]string, 0, len(env))
	for k, v := range env {
		if !validEnvKey(k) {
			return spec{}, Errorf(CodeInvalid, fmt.Sprintf("env key %q does not match [A-Za-z_][A-Za-z0-9_]*", k))
		}
		if strings.ContainsRune(v, 0) {
			return spec{}, Errorf(CodeInvalid, fmt.Sprintf("the value of env %s contains a NUL byte", k))
		}
		keys = append(keys, k)
	}
	if err := CheckArgs(argv, env); err != nil {
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
		user = UserCell
	}
	c, err := a.credOf(user)
	if err != nil {
		return spec{}, err
	}
	home := a.cfg.Home
	if user == UserRoot {
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
// cannot become, is ErrUserUnsupported.
func (a *Agent) credOf(u User) (cred, error) {
	var c cred
	switch u {
	case "", UserCell:
		c = cred{uid: CellUID, gid: CellGID}
	case UserRoot:
		c = cred{uid: 0, gid: 0}
	default:
		return cred{}, Errorf(CodeUserUnsupported, fmt.Sprintf("unknown user %q (cell or root)", u))
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
		return "", Errorf(CodeInvalid, what+" is empty")
	case len(p) > MaxPath:
		return "", Errorf(CodeInvalid, fmt.Sprintf("%s is longer than %d bytes", what, MaxPath))
	case strings.ContainsRune(p, 0):
		return "", Errorf(CodeInvalid, what+" contains a NUL byte")
	case !strings.HasPrefix(p, "/"):
		return "", Errorf(CodeInvalid, what+" is not absolute")
	}
	return filepath.Clean(p), nil
}

// NamesDirectory reports whether the path p, as sent, can only name a
// directory: it ends in "/", "/." or "/..". Cleaning would turn it into a
// file's path, so a file write refuses it first (the plane, the agent and
// the fake agent alike).
func NamesDirectory(p string) bool {
	return strings.HasSuffix(p, "/") || strings.HasSuffix(p, "/.") || strings.HasSuffix(p, "/..")
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
func sameLaunch(a, b LaunchRequest) bool {
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
