package cellagent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich/agent"
)

// The agent's tests run real processes as root on the host: the agent is
// then not PID 1, so it kills only what it started (and their
// descendants). Every scenario runs twice: against the Agent itself and
// through NewHandler + Client over a real Unix socket.

func TestMain(m *testing.M) {
	HelperMain() // the Agent re-executes this test binary as its helper
	os.Exit(m.Run())
}

const testCell = "cell-1"

var testFence = agent.Fence{CellID: testCell, LeaseID: "lease-1", Generation: 3}

// env is one scenario's agent, the Conn under test and the cell's home.
type env struct {
	t    *testing.T
	a    *Agent     // the agent itself, for what only the cell can see
	c    agent.Conn // the agent, or a Client talking to it over HTTP
	home string
	ctx  context.Context
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("the agent's tests run processes as other users: they need root under CI=true")
		}
		t.Skip("the agent's tests need root")
	}
}

// newHome is a cell home the cell user owns, reachable by it (a
// t.TempDir is under a 0700 directory).
func newHome(t *testing.T) string {
	t.Helper()
	home, err := os.MkdirTemp("", "sbw-agent-home-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(home) })
	if err := os.Chmod(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, agent.CellUID, agent.CellGID); err != nil {
		t.Fatal(err)
	}
	return home
}

func newAgent(t *testing.T) (*Agent, string) {
	t.Helper()
	home := newHome(t)
	a, err := New(Config{CellID: testCell, Digest: "sha256:" + strings.Repeat("ab", 32), Home: home})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Shutdown) // kills whatever a scenario left running
	return a, home
}

// serve serves a over HTTP on a Unix socket and returns a Client for it.
func serve(t *testing.T, a agent.Conn) *agent.Client {
	t.Helper()
	return serveHandler(t, agent.NewHandler(a))
}

// serveHandler serves h on a Unix socket and returns a Client for it.
func serveHandler(t *testing.T, h http.Handler) *agent.Client {
	t.Helper()
	dir, err := os.MkdirTemp("", "sbw-sock-") // short: a socket path has ≤ 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	c := agent.NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
	t.Cleanup(c.CloseIdleConnections)
	return c
}

type scenario struct {
	name string
	run  func(e *env)
}

// TestScenarios runs the scenario table against the Agent and through
// Handler + Client.
func TestScenarios(t *testing.T) {
	requireRoot(t)
	for _, mode := range []string{"direct", "http"} {
		t.Run(mode, func(t *testing.T) {
			for _, sc := range scenarios {
				t.Run(sc.name, func(t *testing.T) {
					t.Parallel()
					a, home := newAgent(t)
					var c agent.Conn = a
					if mode == "http" {
						c = serve(t, a)
					}
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
					defer cancel()
					sc.run(&env{t: t, a: a, c: c, home: home, ctx: ctx})
				})
			}
		})
	}
}

func (e *env) activate(ttl time.Duration) {
	e.t.Helper()
	if err := e.c.Activate(e.ctx, activation(ttl)); err != nil {
		e.t.Fatalf("Activate: %v", err)
	}
}

func activation(ttl time.Duration) agent.Activation {
	return agent.Activation{
		Version:   agent.ProtocolVersion,
		Fence:     testFence,
		ExpiresAt: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC),
		TTLMillis: ttl.Milliseconds(),
	}
}

// exec runs argv with the bound fence and collected output.
func (e *env) exec(req agent.ExecRequest) agent.ExecResult {
	e.t.Helper()
	req.Fence = testFence
	res, err := e.c.Exec(e.ctx, req, nil)
	if err != nil {
		e.t.Fatalf("Exec %q: %v", req.Argv, err)
	}
	return res
}

func sh(script string) []string { return []string{"sh", "-c", script} }

// stream runs req with an output callback that sends every chunk to the
// returned channel; the result arrives on the other.
func (e *env) stream(req agent.ExecRequest) (<-chan agent.Output, <-chan execAnswer) {
	req.Fence = testFence
	outs, done := make(chan agent.Output, 1024), make(chan execAnswer, 1)
	go func() {
		res, err := e.c.Exec(e.ctx, req, func(o agent.Output) error { outs <- o; return nil })
		close(outs)
		done <- execAnswer{res, err}
	}()
	return outs, done
}

type execAnswer struct {
	res agent.ExecResult
	err error
}

// firstLine reads outputs until a full stdout line arrived.
func (e *env) firstLine(outs <-chan agent.Output) string {
	e.t.Helper()
	var b []byte
	for o := range outs {
		if o.Stream == agent.Stdout {
			b = append(b, o.Data...)
		}
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			return string(b[:i])
		}
	}
	e.t.Fatalf("the output ended before a full line: %q", b)
	return ""
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	p, ok := parseStat(pid, b)
	return ok && !p.zombie
}

// eventually polls cond until it holds, failing after a generous bound.
// It asserts an outcome, never a speed.
func (e *env) eventually(what string, cond func() bool) {
	e.t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return
		}
	}
	e.t.Fatalf("%s: still not the case after 30s", what)
}

func wantCode(t *testing.T, what string, err error, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: got %v, want %v", what, err, want)
	}
	if !agent.IsAnswer(err) {
		t.Fatalf("%s: %v is not an answer", what, err)
	}
}

func mustPid(t *testing.T, s string) int {
	t.Helper()
	pid, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || pid <= 1 {
		t.Fatalf("not a pid: %q", s)
	}
	return pid
}

// mkfifo makes a FIFO the cell user can open; a command blocks reading it
// until the test writes, which orders events without timing.
func (e *env) mkfifo(name string) string {
	e.t.Helper()
	p := filepath.Join(e.home, name)
	if err := syscall.Mkfifo(p, 0o666); err != nil {
		e.t.Fatal(err)
	}
	if err := os.Chmod(p, 0o666); err != nil {
		e.t.Fatal(err)
	}
	return p
}

func release(t *testing.T, fifo string) {
	t.Helper()
	f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("go\n"))
	f.Close()
}

// content is n deterministic pseudo-random bytes, produced as read.
func content(n int64, seed uint64) io.Reader {
	return io.LimitReader(rand.NewChaCha8([32]byte{byte(seed)}), n)
}

func sha(r io.Reader) (string, int64) {
	h := sha256.New()
	n, _ := io.Copy(h, r)
	return hex.EncodeToString(h.Sum(nil)), n
}

func (e *env) write(path string, user agent.User, body io.Reader) (agent.FileInfo, error) {
	return e.c.WriteFile(e.ctx, agent.WriteRequest{Fence: testFence, Path: path, User: user}, body)
}

func (e *env) read(path string, user agent.User) ([]byte, error) {
	rc, n, err := e.c.ReadFile(e.ctx, agent.ReadRequest{Fence: testFence, Path: path, User: user})
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err == nil && int64(len(b)) != n {
		err = fmt.Errorf("read %d bytes, announced %d", len(b), n)
	}
	return b, err
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// owner is the uid owning p.
func owner(t *testing.T, p string) uint32 {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Uid
}

// rootDir makes a root-owned directory (mode 0755) in the home, with a
// root-only file in it.
func (e *env) rootDir() (dir, secret string) {
	e.t.Helper()
	dir = filepath.Join(e.home, "rootonly")
	if err := os.Mkdir(dir, 0o755); err != nil {
		e.t.Fatal(err)
	}
	secret = filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("root's"), 0o600); err != nil {
		e.t.Fatal(err)
	}
	return dir, secret
}

var scenarios = []scenario{
	{"status_waiting", func(e *env) {
		st, err := e.c.Status(e.ctx)
		if err != nil {
			e.t.Fatal(err)
		}
		want := agent.Status{State: agent.Waiting, Activations: 0, CellID: testCell, Digest: "sha256:" + strings.Repeat("ab", 32),
			Kernel: kernelRelease()}
		if st != want || (runtime.GOOS == "linux" && st.Kernel == "") {
			e.t.Fatalf("status %+v, want %+v", st, want)
		}
	}},
	{"activation_replay_and_refusals", func(e *env) {
		// Refused while waiting: nothing changes.
		other := activation(time.Minute)
		other.CellID = "cell-2"
		wantCode(e.t, "another cell", e.c.Activate(e.ctx, other), agent.ErrFenceRefused)
		v2 := activation(time.Minute)
		v2.Version = 2
		wantCode(e.t, "version 2", e.c.Activate(e.ctx, v2), agent.ErrInvalid)
		zero := activation(0)
		wantCode(e.t, "ttl 0", e.c.Activate(e.ctx, zero), agent.ErrInvalid)
		if st, _ := e.c.Status(e.ctx); st.State != agent.Waiting || st.Activations != 0 {
			e.t.Fatalf("after refusals: %+v", st)
		}

		e.activate(time.Minute)
		replay := activation(time.Second) // ttl_ms differs: ignored on replay
		if err := e.c.Activate(e.ctx, replay); err != nil {
			e.t.Fatalf("exact replay: %v", err)
		}
		for name, mut := range map[string]func(*agent.Activation){
			"lease":      func(a *agent.Activation) { a.LeaseID = "lease-2" },
			"generation": func(a *agent.Activation) { a.Generation++ },
			"cell":       func(a *agent.Activation) { a.CellID = "cell-2" },
		} {
			a := activation(time.Minute)
			mut(&a)
			wantCode(e.t, "second fence, other "+name, e.c.Activate(e.ctx, a), agent.ErrFenceRefused)
		}
		earlier := activation(time.Hour)
		earlier.ExpiresAt = earlier.ExpiresAt.Add(-time.Second) // a replay: nothing moves
		if err := e.c.Activate(e.ctx, earlier); err != nil {
			e.t.Fatalf("the bound fence with an earlier expiry: %v", err)
		}
		st, err := e.c.Status(e.ctx)
		if err != nil || st.State != agent.Active || st.Activations != 1 {
			e.t.Fatalf("after replay and refusals: %+v %v", st, err)
		}
		// The bound fence still works, and the 1 s TTL of the replay was
		// ignored (the agent stays active past it: checked by the exec).
		if res := e.exec(agent.ExecRequest{Argv: []string{"true"}}); res.ExitCode != 0 {
			e.t.Fatalf("exec after replay: %+v", res)
		}
	}},
	{"activation_carried_by_a_request", func(e *env) {
		marker := filepath.Join(e.home, "carried")
		// A request whose activation names another fence: refused, nothing
		// activated or run.
		mismatched := activation(time.Minute)
		mismatched.LeaseID = "lease-2"
		_, err := e.c.Exec(e.ctx, agent.ExecRequest{Fence: testFence, Activation: &mismatched, Argv: sh("touch " + marker)}, nil)
		wantCode(e.t, "activation of another fence", err, agent.ErrInvalid)
		if st, _ := e.c.Status(e.ctx); st.State != agent.Waiting || exists(marker) {
			e.t.Fatalf("after a mismatched activation: %+v, marker %v", st, exists(marker))
		}
		// The first request activates, the later ones replay (ttl_ms may
		// differ), and the activation counts once.
		act := activation(time.Minute)
		res, err := e.c.Exec(e.ctx, agent.ExecRequest{Fence: testFence, Activation: &act, Argv: sh("touch " + marker)}, nil)
		if err != nil || res.ExitCode != 0 || !exists(marker) {
			e.t.Fatalf("exec carrying the activation: %+v %v", res, err)
		}
		replay := activation(time.Second)
		if _, err := e.c.WriteFile(e.ctx, agent.WriteRequest{Fence: testFence, Activation: &replay, Path: marker + "2"}, strings.NewReader("x")); err != nil {
			e.t.Fatalf("write carrying the replay: %v", err)
		}
		if st, _ := e.c.Status(e.ctx); st.State != agent.Active || st.Activations != 1 {
			e.t.Fatalf("after two carried activations: %+v", st)
		}
		// Another lease's activation on a later request is a refused fence.
		other := activation(time.Minute)
		other.LeaseID, other.Generation = "lease-2", 4
		_, err = e.c.Exec(e.ctx, agent.ExecRequest{Fence: other.Fence, Activation: &other, Argv: []string{"true"}}, nil)
		wantCode(e.t, "another lease's activation", err, agent.ErrFenceRefused)
	}},
	{"no_operation_before_activation", func(e *env) {
		marker := filepath.Join(e.home, "marker")
		_, err := e.c.Exec(e.ctx, agent.ExecRequest{Fence: testFence, Argv: sh("touch " + marker)}, nil)
		wantCode(e.t, "exec", err, agent.ErrNotActive)
		_, err = e.c.Launch(e.ctx, agent.LaunchRequest{Fence: testFence, Argv: sh("touch " + marker)})
		wantCode(e.t, "launch", err, agent.ErrNotActive)
		_, err = e.c.LaunchStatus(e.ctx, testFence)
		wantCode(e.t, "launch status", err, agent.ErrNotActive)
		_, err = e.write(marker, "", strings.NewReader("x"))
		wantCode(e.t, "write", err, agent.ErrNotActive)
		_, err = e.read("/etc/hostname", "")
		wantCode(e.t, "read", err, agent.ErrNotActive)
		wantCode(e.t, "release", e.c.Release(e.ctx, testFence), agent.ErrNotActive)
		if exists(marker) {
			e.t.Fatal("something ran or was written before activation")
		}
		if st, _ := e.c.Status(e.ctx); st.State != agent.Waiting {
			e.t.Fatalf("state %s", st.State)
		}
	}},
	{"fence_refused_after_activation", func(e *env) {
		e.activate(time.Minute)
		marker := filepath.Join(e.home, "marker")
		for _, f := range []agent.Fence{
			{CellID: testCell, LeaseID: "lease-2", Generation: testFence.Generation},
			{CellID: testCell, LeaseID: testFence.LeaseID, Generation: testFence.Generation + 1},
			{CellID: "cell-2", LeaseID: testFence.LeaseID, Generation: testFence.Generation},
			{},
		} {
			_, err := e.c.Exec(e.ctx, agent.ExecRequest{Fence: f, Argv: sh("touch " + marker)}, nil)
			wantCode(e.t, "exec", err, agent.ErrFenceRefused)
			_, err = e.c.Launch(e.ctx, agent.LaunchRequest{Fence: f, Argv: sh("touch " + marker)})
			wantCode(e.t, "launch", err, agent.ErrFenceRefused)
			_, err = e.c.LaunchStatus(e.ctx, f)
			wantCode(e.t, "launch status", err, agent.ErrFenceRefused)
			_, err = e.c.WriteFile(e.ctx, agent.WriteRequest{Fence: f, Path: marker}, strings.NewReader("x"))
			wantCode(e.t, "write", err, agent.ErrFenceRefused)
			_, _, err = e.c.ReadFile(e.ctx, agent.ReadRequest{Fence: f, Path: "/etc/hostname"})
			wantCode(e.t, "read", err, agent.ErrFenceRefused)
			wantCode(e.t, "release", e.c.Release(e.ctx, f), agent.ErrFenceRefused)
		}
		if exists(marker) {
			e.t.Fatal("a request with another fence ran or wrote something")
		}
		if st, _ := e.c.Status(e.ctx); st.State != agent.Active {
			e.t.Fatalf("state %s", st.State)
		}
	}},
	{"expiry_refuses_and_kills", func(e *env) {
		e.activate(3 * time.Second)
		// A command that leaves a process in the background, and one that
		// is still running when the lease expires.
		res := e.exec(agent.ExecRequest{Argv: sh("sleep 1000 & echo $!")})
		bg := mustPid(e.t, string(res.Stdout))
		if !alive(bg) {
			e.t.Fatalf("the background sleep %d is not running", bg)
		}
		outs, done := e.stream(agent.ExecRequest{Argv: sh("echo $$; exec sleep 1000")})
		running := mustPid(e.t, e.firstLine(outs))
		ans := <-done // ends at expiry
		if ans.err != nil {
			e.t.Fatalf("exec across expiry: %v", ans.err)
		}
		if ans.res.Reason != agent.Killed || ans.res.ExitCode != 137 || ans.res.Signal != "KILL" {
			e.t.Fatalf("exec across expiry: %+v, want killed 137 KILL", ans.res)
		}
		e.eventually("the background process is killed", func() bool { return !alive(bg) })
		if alive(running) {
			e.t.Fatalf("the running command %d survived", running)
		}
		st, err := e.c.Status(e.ctx)
		if err != nil || st.State != agent.Ended || st.Activations != 1 {
			e.t.Fatalf("status after expiry: %+v %v", st, err)
		}
		_, err = e.c.Exec(e.ctx, agent.ExecRequest{Fence: testFence, Argv: []string{"true"}}, nil)
		wantCode(e.t, "exec after expiry", err, agent.ErrExpired)
		_, err = e.write(filepath.Join(e.home, "late"), "", strings.NewReader("x"))
		wantCode(e.t, "write after expiry", err, agent.ErrExpired)
		wantCode(e.t, "replayed activation after expiry", e.c.Activate(e.ctx, activation(time.Minute)), agent.ErrExpired)
		other := activation(time.Minute)
		other.LeaseID = "lease-2"
		wantCode(e.t, "new activation after expiry", e.c.Activate(e.ctx, other), agent.ErrFenceRefused)
		if exists(filepath.Join(e.home, "late")) {
			e.t.Fatal("written after expiry")
		}
	}},
	{"renewal_moves_the_deadline", func(e *env) {
		// A 2 s activation renewed to 4 s from its renewal: a command
		// started before the renewal runs on past the first deadline, to
		// its end; the agent then ends at the renewed deadline.
		e.activate(2 * time.Second)
		outs, done := e.stream(agent.ExecRequest{Argv: sh("echo started; sleep 3; echo done")})
		e.firstLine(outs)
		renewed := activation(4 * time.Second)
		renewed.ExpiresAt = renewed.ExpiresAt.Add(time.Hour)
		if err := e.c.Activate(e.ctx, renewed); err != nil {
			e.t.Fatalf("renewal: %v", err)
		}
		ans := <-done
		if ans.err != nil || ans.res.Reason != agent.Exited || ans.res.ExitCode != 0 {
			e.t.Fatalf("a command across the first deadline: %+v %v, want exited 0", ans.res, ans.err)
		}
		if st, err := e.c.Status(e.ctx); err != nil || st.State != agent.Active || st.Activations != 1 {
			e.t.Fatalf("status after the first deadline: %+v %v", st, err)
		}
		e.eventually("the agent ends at the renewed deadline", func() bool {
			st, err := e.c.Status(e.ctx)
			return err == nil && st.State == agent.Ended
		})
		wantCode(e.t, "renewal after the end", e.c.Activate(e.ctx, renewed), agent.ErrExpired)
	}},
	{"release_kills_and_ends", func(e *env) {
		e.activate(time.Minute)
		fifo := e.mkfifo("never")
		st, err := e.c.Launch(e.ctx, agent.LaunchRequest{Fence: testFence, Argv: sh("cat " + fifo)})
		if err != nil || st.Phase != agent.Running || st.PID == nil {
			e.t.Fatalf("launch: %+v %v", st, err)
		}
		res := e.exec(agent.ExecRequest{Argv: sh("sleep 1000 & echo $!")})
		bg := mustPid(e.t, string(res.Stdout))
		if err := e.c.Release(e.ctx, testFence); err != nil {
			e.t.Fatalf("release: %v", err)
		}
		if err := e.c.Release(e.ctx, testFence); err != nil {
			e.t.Fatalf("release again: %v", err)
		}
		e.eventually("the background process is killed", func() bool { return !alive(bg) })
		e.eventually("the launch is terminal (killed)", func() bool {
			e.a.mu.Lock()
			defer e.a.mu.Unlock()
			ls := e.a.launch.status
			return ls.Phase == agent.Terminal && *ls.Reason == agent.Killed && *ls.Signal == "KILL" && *ls.ExitCode == 137
		})
		if alive(*st.PID) {
			e.t.Fatalf("the launched process %d survived", *st.PID)
		}
		_, err = e.c.LaunchStatus(e.ctx, testFence)
		wantCode(e.t, "launch status after release", err, agent.ErrExpired)
	}},
	{"exec_io_env_cwd_user", func(e *env) {
		e.activate(time.Minute)
		if res := e.exec(agent.ExecRequest{Argv: []string{"echo", "hello", "world"}}); string(res.Stdout) != "hello world\n" || res.ExitCode != 0 || res.Reason != agent.Exited || res.Truncated {
			e.t.Fatalf("echo: %+v", res)
		}
		if res := e.exec(agent.ExecRequest{Argv: []string{"cat"}, Stdin: []byte("from stdin\x00\xff")}); string(res.Stdout) != "from stdin\x00\xff" {
			e.t.Fatalf("cat: %q", res.Stdout)
		}
		if res := e.exec(agent.ExecRequest{Argv: sh("wc -c"), Stdin: bytes.Repeat([]byte{0xff}, agent.MaxStdin)}); strings.TrimSpace(string(res.Stdout)) != strconv.Itoa(agent.MaxStdin) {
			e.t.Fatalf("1 MiB of stdin: %q", res.Stdout)
		}
		if res := e.exec(agent.ExecRequest{Argv: sh("echo out; echo err >&2")}); string(res.Stdout) != "out\n" || string(res.Stderr) != "err\n" {
			e.t.Fatalf("streams: %q %q", res.Stdout, res.Stderr)
		}
		// The environment is the fixed base plus the request's, nothing of
		// the agent's own.
		os.Setenv("SBW_AGENT_OWN", "leak")
		defer os.Unsetenv("SBW_AGENT_OWN")
		res := e.exec(agent.ExecRequest{Argv: []string{"env"}, Env: map[string]string{"FOO": "bar baz", "TERM": "xterm"}})
		want := "FOO=bar baz\nHOME=" + e.home + "\nPATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\nTERM=xterm\n"
		if got := sortedLines(string(res.Stdout)); got != want {
			e.t.Fatalf("env:\n%s\nwant:\n%s", got, want)
		}
		res = e.exec(agent.ExecRequest{Argv: []string{"env"}, User: agent.UserRoot})
		if got := sortedLines(string(res.Stdout)); got != "HOME=/root\nPATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\nTERM=dumb\n" {
			e.t.Fatalf("root env:\n%s", got)
		}
		// cwd: the home by default, or the one asked for.
		if res := e.exec(agent.ExecRequest{Argv: []string{"pwd"}}); string(res.Stdout) != e.home+"\n" {
			e.t.Fatalf("default cwd: %q", res.Stdout)
		}
		if res := e.exec(agent.ExecRequest{Argv: []string{"pwd"}, Cwd: "/tmp/"}); string(res.Stdout) != "/tmp\n" {
			e.t.Fatalf("cwd /tmp: %q", res.Stdout)
		}
		// Users: cell is 1000:1000 without supplementary groups or
		// capabilities; root is 0.
		if res := e.exec(agent.ExecRequest{Argv: sh("id -u; id -g; id -G; grep CapEff /proc/self/status")}); string(res.Stdout) != "1000\n1000\n1000\nCapEff:\t0000000000000000\n" {
			e.t.Fatalf("cell user: %q", res.Stdout)
		}
		if res := e.exec(agent.ExecRequest{Argv: sh("id -u; id -G"), User: agent.UserRoot}); string(res.Stdout) != "0\n0\n" {
			e.t.Fatalf("root: %q", res.Stdout)
		}
	}},
	{"exec_that_cannot_start", func(e *env) {
		e.activate(time.Minute)
		dir, _ := e.rootDir()
		rootOnly := filepath.Join(dir, "root-only.sh")
		garbage := filepath.Join(e.home, "garbage")
		private := filepath.Join(dir, "private")
		for p, b := range map[string]string{rootOnly: "#!/bin/sh\necho ran\n", garbage: "\x01\x02 not a program"} {
			if err := os.WriteFile(p, []byte(b), 0o755); err != nil {
				e.t.Fatal(err)
			}
		}
		if err := os.Chmod(rootOnly, 0o700); err != nil {
			e.t.Fatal(err)
		}
		if err := os.Mkdir(private, 0o700); err != nil {
			e.t.Fatal(err)
		}
		for _, c := range []struct {
			name string
			req  agent.ExecRequest
			code int
		}{
			{"not found", agent.ExecRequest{Argv: []string{"no-such-command-sbw"}}, 127},
			{"not found by path", agent.ExecRequest{Argv: []string{"/no/such/program"}}, 127},
			{"not executable by the cell user", agent.ExecRequest{Argv: []string{rootOnly}}, 126},
			{"no executable format", agent.ExecRequest{Argv: []string{garbage}}, 126},
			{"cwd the cell user cannot enter", agent.ExecRequest{Argv: []string{"true"}, Cwd: private}, 126},
		} {
			res := e.exec(c.req)
			if res.ExitCode != c.code || res.Reason != agent.Exited || !strings.HasPrefix(string(res.Stderr), "sandboxwich-agent: ") || len(res.Stdout) != 0 {
				e.t.Errorf("%s: %+v %q, want %d", c.name, res, res.Stderr, c.code)
			}
		}
		if res := e.exec(agent.ExecRequest{Argv: []string{rootOnly}, User: agent.UserRoot}); string(res.Stdout) != "ran\n" {
			e.t.Fatalf("root runs its own script: %+v", res)
		}
	}},
	{"exit_codes_and_signals", func(e *env) {
		e.activate(time.Minute)
		for _, c := range []struct {
			script string
			code   int
			signal string
		}{
			{"exit 0", 0, ""},
			{"exit 3", 3, ""},
			{"exit 255", 255, ""},
			{"kill -TERM $$", 143, "TERM"},
			{"kill -KILL $$", 137, "KILL"},
			{"kill -SEGV $$", 139, "SEGV"},
		} {
			res := e.exec(agent.ExecRequest{Argv: sh(c.script)})
			if res.ExitCode != c.code || res.Signal != c.signal || res.Reason != agent.Exited {
				e.t.Errorf("%s: %+v, want %d %q exited", c.script, res, c.code, c.signal)
			}
		}
	}},
	{"timeout_kills_the_tree", func(e *env) {
		e.activate(time.Minute)
		// The grandchild leaves the command's session and group (setsid):
		// only its parent links it to the command.
		outs, done := e.stream(agent.ExecRequest{
			Argv:          sh(`setsid sh -c 'echo $$; exec sleep 1000' & sleep 1000`),
			TimeoutMillis: 1500,
		})
		gc := mustPid(e.t, e.firstLine(outs))
		b, err := os.ReadFile("/proc/" + strconv.Itoa(gc) + "/stat")
		if err != nil {
			e.t.Fatal(err)
		}
		if p, _ := parseStat(gc, b); p.sid != gc {
			e.t.Fatalf("the grandchild did not leave the session: %+v", p)
		}
		ans := <-done
		if ans.err != nil {
			e.t.Fatal(ans.err)
		}
		if r := ans.res; r.Reason != agent.TimedOut || r.ExitCode != 137 || r.Signal != "KILL" {
			e.t.Fatalf("timeout: %+v", r)
		}
		e.eventually("the grandchild that left the session is killed", func() bool { return !alive(gc) })
		// The agent stays active.
		if res := e.exec(agent.ExecRequest{Argv: []string{"true"}}); res.ExitCode != 0 {
			e.t.Fatalf("exec after a timeout: %+v", res)
		}
	}},
	{"background_does_not_block", func(e *env) {
		e.activate(time.Minute)
		// The background sleep holds stdout and stderr; the exec still
		// ends with its direct child, and the sleep keeps running.
		res := e.exec(agent.ExecRequest{Argv: sh("sleep 1000 & echo $!; echo done >&2")})
		bg := mustPid(e.t, string(res.Stdout))
		if string(res.Stderr) != "done\n" || res.ExitCode != 0 {
			e.t.Fatalf("%+v %q", res, res.Stderr)
		}
		if !alive(bg) {
			e.t.Fatal("the background process did not keep running")
		}
	}},
	{"streaming_in_order", func(e *env) {
		e.activate(time.Minute)
		// The command cannot end before the test opens the FIFO, which it
		// does only after the first line arrived: the order is proven
		// without timing.
		fifo := e.mkfifo("gate")
		outs, done := e.stream(agent.ExecRequest{Argv: sh("echo a; read x < " + fifo + "; echo b; echo c >&2")})
		if l := e.firstLine(outs); l != "a" {
			e.t.Fatalf("first line %q", l)
		}
		select {
		case ans := <-done:
			e.t.Fatalf("the exec ended before the gate opened: %+v", ans)
		default:
		}
		release(e.t, fifo)
		var stdout, stderr []byte
		for o := range outs {
			switch o.Stream {
			case agent.Stdout:
				stdout = append(stdout, o.Data...)
			case agent.Stderr:
				stderr = append(stderr, o.Data...)
			}
		}
		ans := <-done
		if ans.err != nil || ans.res.ExitCode != 0 || ans.res.Stdout != nil || ans.res.Stderr != nil {
			e.t.Fatalf("streamed result: %+v %v", ans.res, ans.err)
		}
		if string(stdout) != "b\n" || string(stderr) != "c\n" {
			e.t.Fatalf("after the first line: %q %q", stdout, stderr)
		}
	}},
	{"output_caps", func(e *env) {
		e.activate(time.Minute)
		script := "head -c 3000000 /dev/zero; head -c 5000 /dev/zero >&2"
		res := e.exec(agent.ExecRequest{Argv: sh(script), MaxOutput: 1000})
		if len(res.Stdout) != 1000 || len(res.Stderr) != 1000 || !res.Truncated || res.ExitCode != 0 {
			e.t.Fatalf("collected: %d %d %+v", len(res.Stdout), len(res.Stderr), res.Truncated)
		}
		outs, done := e.stream(agent.ExecRequest{Argv: sh(script), MaxOutput: 1000})
		n := map[agent.Stream]int{}
		for o := range outs {
			n[o.Stream] += len(o.Data)
		}
		ans := <-done
		if ans.err != nil || !ans.res.Truncated || n[agent.Stdout] != 1000 || n[agent.Stderr] != 1000 {
			e.t.Fatalf("streamed: %v %+v %v", n, ans.res, ans.err)
		}
		// The default cap is 1 MiB per stream.
		res = e.exec(agent.ExecRequest{Argv: sh("head -c 1048577 /dev/zero")})
		if len(res.Stdout) != 1<<20 || !res.Truncated {
			e.t.Fatalf("default cap: %d %v", len(res.Stdout), res.Truncated)
		}
		res = e.exec(agent.ExecRequest{Argv: sh("head -c 1048576 /dev/zero")})
		if len(res.Stdout) != 1<<20 || res.Truncated {
			e.t.Fatalf("exactly the cap: %d %v", len(res.Stdout), res.Truncated)
		}
	}},
	{"file_round_trip_64MiB", func(e *env) {
		e.activate(time.Minute)
		const size = 64 << 20
		want, _ := sha(content(size, 1))
		path := filepath.Join(e.home, "deep", "er", "data.bin")
		fi, err := e.write(path, "", content(size, 1))
		if err != nil {
			e.t.Fatal(err)
		}
		if fi.Size != size || fi.SHA256 != want || fi.Path != path {
			e.t.Fatalf("written %+v, want %d %s", fi, size, want)
		}
		for _, p := range []string{path, filepath.Dir(path), filepath.Dir(filepath.Dir(path))} {
			if u := owner(e.t, p); u != agent.CellUID {
				e.t.Fatalf("%s is owned by %d, not the cell user", p, u)
			}
		}
		if st, _ := os.Stat(path); st.Mode().Perm() != 0o644 {
			e.t.Fatalf("mode %v", st.Mode())
		}
		rc, n, err := e.c.ReadFile(e.ctx, agent.ReadRequest{Fence: testFence, Path: path})
		if err != nil {
			e.t.Fatal(err)
		}
		got, m := sha(rc)
		rc.Close()
		if n != size || m != size || got != want {
			e.t.Fatalf("read back %d/%d bytes, sha256 %s, want %s", n, m, got, want)
		}
		// A replacement is atomic and takes the mode asked for; a small
		// limit refuses the large file.
		if _, err := e.c.WriteFile(e.ctx, agent.WriteRequest{Fence: testFence, Path: path, Mode: 0o600}, strings.NewReader("small")); err != nil {
			e.t.Fatal(err)
		}
		if b, err := os.ReadFile(path); err != nil || string(b) != "small" {
			e.t.Fatalf("replaced: %q %v", b, err)
		}
		if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
			e.t.Fatalf("mode %v", st.Mode())
		}
		_, _, err = e.c.ReadFile(e.ctx, agent.ReadRequest{Fence: testFence, Path: path, MaxBytes: 4})
		wantCode(e.t, "read over max_bytes", err, agent.ErrTooLarge)
		if names := dirNames(e.t, filepath.Dir(path)); names != "data.bin" {
			e.t.Fatalf("the directory holds %q", names)
		}
	}},
	{"file_write_over_256MiB_refused", func(e *env) {
		e.activate(time.Minute)
		path := filepath.Join(e.home, "big", "file")
		_, err := e.write(path, "", content(agent.MaxFileBytes+1<<20, 2))
		wantCode(e.t, "257 MiB", err, agent.ErrTooLarge)
		if exists(path) {
			e.t.Fatal("the refused file exists")
		}
		if names := dirNames(e.t, filepath.Dir(path)); names != "" {
			e.t.Fatalf("left behind: %q", names)
		}
	}},
	{"file_permissions", func(e *env) {
		e.activate(time.Minute)
		dir, secret := e.rootDir()
		// A root-owned directory: the cell user cannot write into it.
		_, err := e.write(filepath.Join(dir, "x"), agent.UserCell, strings.NewReader("x"))
		wantCode(e.t, "cell write into a root dir", err, agent.ErrAccessDenied)
		// Refused before the content is read: the answer still arrives
		// while the client is sending a large body.
		_, err = e.write(filepath.Join(dir, "x"), agent.UserCell, content(32<<20, 3))
		wantCode(e.t, "cell write of 32 MiB into a root dir", err, agent.ErrAccessDenied)
		// A symlink to the root directory: the same.
		link := filepath.Join(e.home, "link-to-root-dir")
		if err := os.Symlink(dir, link); err != nil {
			e.t.Fatal(err)
		}
		_, err = e.write(filepath.Join(link, "y"), agent.UserCell, strings.NewReader("y"))
		wantCode(e.t, "cell write through a symlinked dir", err, agent.ErrAccessDenied)
		// A symlink to a root-only file: it cannot be read, and writing
		// its path replaces the link, never the file.
		flink := filepath.Join(e.home, "link-to-secret")
		if err := os.Symlink(secret, flink); err != nil {
			e.t.Fatal(err)
		}
		_, err = e.read(flink, agent.UserCell)
		wantCode(e.t, "cell read through a symlink", err, agent.ErrAccessDenied)
		_, err = e.read(secret, agent.UserCell)
		wantCode(e.t, "cell read of a root-only file", err, agent.ErrAccessDenied)
		if _, err := e.write(flink, agent.UserCell, strings.NewReader("replaced")); err != nil {
			e.t.Fatalf("cell write over its own symlink: %v", err)
		}
		if b, _ := os.ReadFile(secret); string(b) != "root's" {
			e.t.Fatalf("the root file changed: %q", b)
		}
		if fi, _ := os.Lstat(flink); !fi.Mode().IsRegular() || owner(e.t, flink) != agent.CellUID {
			e.t.Fatalf("the link was not replaced by the cell's file: %v", fi.Mode())
		}
		if names := dirNames(e.t, dir); names != "secret" {
			e.t.Fatalf("the root dir holds %q", names)
		}
		// Root may.
		if _, err := e.write(filepath.Join(dir, "z"), agent.UserRoot, strings.NewReader("z")); err != nil {
			e.t.Fatalf("root write: %v", err)
		}
		if b, err := e.read(secret, agent.UserRoot); err != nil || string(b) != "root's" {
			e.t.Fatalf("root read: %q %v", b, err)
		}
		if u := owner(e.t, filepath.Join(dir, "z")); u != 0 {
			e.t.Fatalf("root's file owned by %d", u)
		}
		// Errors of the file system, mapped.
		_, err = e.read(filepath.Join(e.home, "missing"), "")
		wantCode(e.t, "missing", err, agent.ErrNotFound)
		_, err = e.read(e.home, "")
		wantCode(e.t, "a directory", err, agent.ErrInvalid)
		_, err = e.read(filepath.Join(secret, "below-a-file"), agent.UserRoot)
		wantCode(e.t, "below a file", err, agent.ErrInvalid)
		_, err = e.write(e.home, "", strings.NewReader("x"))
		wantCode(e.t, "write over a directory", err, agent.ErrInvalid)
		_, err = e.read(e.mkfifo("fifo"), "")
		wantCode(e.t, "a FIFO", err, agent.ErrInvalid)
	}},
	{"bad_input_runs_nothing", func(e *env) {
		e.activate(time.Minute)
		marker := filepath.Join(e.home, "marker")
		touch := sh("touch " + marker)
		long := "/" + strings.Repeat("a", agent.MaxPath)
		for _, c := range []struct {
			name string
			req  agent.ExecRequest
			want error
			msg  string
		}{
			{"no argv", agent.ExecRequest{}, agent.ErrInvalid, "argv[0]"},
			{"empty argv[0]", agent.ExecRequest{Argv: []string{"", "-c", "touch " + marker}}, agent.ErrInvalid, "argv[0]"},
			{"NUL in argv", agent.ExecRequest{Argv: sh("touch " + marker + "\x00")}, agent.ErrInvalid, "NUL"},
			{"NUL in an env value", agent.ExecRequest{Argv: touch, Env: map[string]string{"A": "x\x00"}}, agent.ErrInvalid, "NUL"},
			{"env key with a dash", agent.ExecRequest{Argv: touch, Env: map[string]string{"A-B": "x"}}, agent.ErrInvalid, "env key"},
			{"env key with a digit first", agent.ExecRequest{Argv: touch, Env: map[string]string{"1A": "x"}}, agent.ErrInvalid, "env key"},
			{"empty env key", agent.ExecRequest{Argv: touch, Env: map[string]string{"": "x"}}, agent.ErrInvalid, "env key"},
			{"env key with =", agent.ExecRequest{Argv: touch, Env: map[string]string{"A=B": "x"}}, agent.ErrInvalid, "env key"},
			{"relative cwd", agent.ExecRequest{Argv: touch, Cwd: "tmp"}, agent.ErrInvalid, "absolute"},
			{"long cwd", agent.ExecRequest{Argv: touch, Cwd: long}, agent.ErrInvalid, "longer"},
			{"NUL in cwd", agent.ExecRequest{Argv: touch, Cwd: "/tmp\x00"}, agent.ErrInvalid, "NUL"},
			{"missing cwd", agent.ExecRequest{Argv: touch, Cwd: "/no/such/dir"}, agent.ErrInvalid, "does not exist"},
			{"cwd a file", agent.ExecRequest{Argv: touch, Cwd: "/etc/passwd"}, agent.ErrInvalid, "not a directory"},
			{"unknown user", agent.ExecRequest{Argv: touch, User: "nobody"}, agent.ErrUserUnsupported, "nobody"},
			{"stdin over 1 MiB", agent.ExecRequest{Argv: touch, Stdin: make([]byte, agent.MaxStdin+1)}, agent.ErrTooLarge, "stdin"},
			{"negative timeout", agent.ExecRequest{Argv: touch, TimeoutMillis: -1}, agent.ErrInvalid, "timeout"},
			{"max_output over the limit", agent.ExecRequest{Argv: touch, MaxOutput: agent.MaxOutputLimit + 1}, agent.ErrInvalid, "max_output"},
		} {
			c.req.Fence = testFence
			_, err := e.c.Exec(e.ctx, c.req, nil)
			wantCode(e.t, "exec: "+c.name, err, c.want)
			if !strings.Contains(err.Error(), c.msg) {
				e.t.Errorf("exec: %s: %q does not say %q", c.name, err, c.msg)
			}
			if c.req.Stdin == nil && c.req.TimeoutMillis == 0 && c.req.MaxOutput == 0 { // the launch has the rest
				_, err = e.c.Launch(e.ctx, agent.LaunchRequest{Fence: testFence, Argv: c.req.Argv, Env: c.req.Env, Cwd: c.req.Cwd, User: c.req.User})
				wantCode(e.t, "launch: "+c.name, err, c.want)
			}
		}
		_, err := e.c.Launch(e.ctx, agent.LaunchRequest{Fence: testFence, Argv: []string{"no-such-command-sbw"}})
		wantCode(e.t, "launch of an unknown command", err, agent.ErrInvalid)
		_, err = e.c.LaunchStatus(e.ctx, testFence)
		wantCode(e.t, "nothing was launched", err, agent.ErrNotLaunched)

		for _, c := range []struct {
			name string
			req  agent.WriteRequest
			want error
		}{
			{"relative path", agent.WriteRequest{Path: "marker"}, agent.ErrInvalid},
			{"empty path", agent.WriteRequest{}, agent.ErrInvalid},
			{"NUL in path", agent.WriteRequest{Path: marker + "\x00"}, agent.ErrInvalid},
			{"long path", agent.WriteRequest{Path: long}, agent.ErrInvalid},
			{"the root", agent.WriteRequest{Path: "/"}, agent.ErrInvalid},
			{"mode beyond 0777", agent.WriteRequest{Path: marker, Mode: 0o4755}, agent.ErrInvalid},
			{"unknown user", agent.WriteRequest{Path: marker, User: "nobody"}, agent.ErrUserUnsupported},
		} {
			c.req.Fence = testFence
			_, err := e.c.WriteFile(e.ctx, c.req, strings.NewReader("x"))
			wantCode(e.t, "write: "+c.name, err, c.want)
			_, _, err = e.c.ReadFile(e.ctx, agent.ReadRequest{Fence: testFence, Path: c.req.Path, User: c.req.User})
			if c.name != "the root" && c.name != "mode beyond 0777" {
				wantCode(e.t, "read: "+c.name, err, c.want)
			}
		}
		_, _, err = e.c.ReadFile(e.ctx, agent.ReadRequest{Fence: testFence, Path: "/etc/hostname", MaxBytes: -1})
		wantCode(e.t, "read: negative max_bytes", err, agent.ErrInvalid)
		_, _, err = e.c.ReadFile(e.ctx, agent.ReadRequest{Fence: testFence, Path: "/etc/hostname", MaxBytes: agent.MaxFileBytes + 1})
		wantCode(e.t, "read: max_bytes over 256 MiB", err, agent.ErrInvalid)
		if exists(marker) {
			e.t.Fatal("bad input ran or wrote something")
		}
	}},
	{"launch_phases_replay_conflict", func(e *env) {
		e.activate(time.Minute)
		_, err := e.c.LaunchStatus(e.ctx, testFence)
		wantCode(e.t, "before the launch", err, agent.ErrNotLaunched)
		fifo := e.mkfifo("gate")
		req := agent.LaunchRequest{Fence: testFence, Argv: sh("echo out; id -u >&2; read x < " + fifo + "; exit 7"), Env: map[string]string{"A": "1"}}
		st, err := e.c.Launch(e.ctx, req)
		if err != nil || st.Phase != agent.Running || st.PID == nil || st.Replay || st.ExitCode != nil || st.Reason != nil || st.Signal != nil {
			e.t.Fatalf("launch: %+v %v", st, err)
		}
		pid := *st.PID
		again, err := e.c.Launch(e.ctx, req)
		if err != nil || !again.Replay || again.PID == nil || *again.PID != pid || again.Phase != agent.Running {
			e.t.Fatalf("replay: %+v %v", again, err)
		}
		// The defaults are part of the spec: naming them is the same launch.
		same := req
		same.Cwd, same.User = e.home, agent.UserCell
		if again, err := e.c.Launch(e.ctx, same); err != nil || !again.Replay {
			e.t.Fatalf("replay with the defaults spelled out: %+v %v", again, err)
		}
		for name, mut := range map[string]func(*agent.LaunchRequest){
			"argv": func(r *agent.LaunchRequest) { r.Argv = []string{"true"} },
			"env":  func(r *agent.LaunchRequest) { r.Env = map[string]string{"A": "2"} },
			"cwd":  func(r *agent.LaunchRequest) { r.Cwd = "/tmp" },
			"user": func(r *agent.LaunchRequest) { r.User = agent.UserRoot },
		} {
			other := req
			mut(&other)
			_, err := e.c.Launch(e.ctx, other)
			wantCode(e.t, "another launch, other "+name, err, agent.ErrConflict)
		}
		if st, err := e.c.LaunchStatus(e.ctx, testFence); err != nil || st.Phase != agent.Running || *st.PID != pid || st.Replay {
			e.t.Fatalf("status while running: %+v %v", st, err)
		}
		release(e.t, fifo)
		e.eventually("the launch is terminal", func() bool {
			st, err := e.c.LaunchStatus(e.ctx, testFence)
			return err == nil && st.Phase == agent.Terminal
		})
		st, _ = e.c.LaunchStatus(e.ctx, testFence)
		if *st.ExitCode != 7 || *st.Reason != agent.Exited || st.Signal != nil || *st.PID != pid {
			e.t.Fatalf("terminal: %+v", st)
		}
		out := filepath.Join(e.home, ".launch")
		if b, _ := os.ReadFile(filepath.Join(out, "stdout")); string(b) != "out\n" {
			e.t.Fatalf("stdout %q", b)
		}
		if b, _ := os.ReadFile(filepath.Join(out, "stderr")); string(b) != "1000\n" {
			e.t.Fatalf("stderr %q", b)
		}
		for _, p := range []string{out, filepath.Join(out, "stdout")} {
			if u := owner(e.t, p); u != agent.CellUID {
				e.t.Fatalf("%s is owned by %d", p, u)
			}
		}
		// Terminal: a replay still reports it, anything else conflicts.
		if st, err := e.c.Launch(e.ctx, req); err != nil || !st.Replay || st.Phase != agent.Terminal {
			e.t.Fatalf("replay after the end: %+v %v", st, err)
		}
	}},
}

func sortedLines(s string) string {
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	slices.Sort(lines)
	return strings.Join(lines, "\n") + "\n"
}

func dirNames(t *testing.T, dir string) string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return strings.Join(names, ",")
}
