package agent

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
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
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

var testFence = Fence{CellID: testCell, LeaseID: "lease-1", Generation: 3}

// env is one scenario's agent, the Conn under test and the cell's home.
type env struct {
	t    *testing.T
	a    *Agent // the agent itself, for what only the cell can see
	c    Conn   // the agent, or a Client talking to it over HTTP
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
	if err := os.Chown(home, CellUID, CellGID); err != nil {
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
func serve(t *testing.T, a Conn) *Client {
	t.Helper()
	return serveHandler(t, NewHandler(a))
}

// serveHandler serves h on a Unix socket and returns a Client for it.
func serveHandler(t *testing.T, h http.Handler) *Client {
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
	c := NewClient(func(ctx context.Context) (net.Conn, error) {
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
					var c Conn = a
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

func activation(ttl time.Duration) Activation {
	return Activation{
		Version:   ProtocolVersion,
		Fence:     testFence,
		ExpiresAt: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC),
		TTLMillis: ttl.Milliseconds(),
	}
}

// exec runs argv with the bound fence and collected output.
func (e *env) exec(req ExecRequest) ExecResult {
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
func (e *env) stream(req ExecRequest) (<-chan Output, <-chan execAnswer) {
	req.Fence = testFence
	outs, done := make(chan Output, 1024), make(chan execAnswer, 1)
	go func() {
		res, err := e.c.Exec(e.ctx, req, func(o Output) error { outs <- o; return nil })
		close(outs)
		done <- execAnswer{res, err}
	}()
	return outs, done
}

type execAnswer struct {
	res ExecResult
	err error
}

// firstLine reads outputs until a full stdout line arrived.
func (e *env) firstLine(outs <-chan Output) string {
	e.t.Helper()
	var b []byte
	for o := range outs {
		if o.Stream == Stdout {
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
	if !IsAnswer(err) {
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

func (e *env) write(path string, user User, body io.Reader) (FileInfo, error) {
	return e.c.WriteFile(e.ctx, WriteRequest{Fence: testFence, Path: path, User: user}, body)
}

func (e *env) read(path string, user User) ([]byte, error) {
	rc, n, err := e.c.ReadFile(e.ctx, ReadRequest{Fence: testFence, Path: path, User: user})
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
		want := Status{State: Waiting, Activations: 0, CellID: testCell, Digest: "sha256:" + strings.Repeat("ab", 32)}
		if st != want {
			e.t.Fatalf("status %+v, want %+v", st, want)
		}
	}},
	{"activation_replay_and_refusals", func(e *env) {
		// Refused while waiting: nothing changes.
		other := activation(time.Minute)
		other.CellID = "cell-2"
		wantCode(e.t, "another cell", e.c.Activate(e.ctx, other), ErrFenceRefused)
		v2 := activation(time.Minute)
		v2.Version = 2
		wantCode(e.t, "version 2", e.c.Activate(e.ctx, v2), ErrInvalid)
		zero := activation(0)
		wantCode(e.t, "ttl 0", e.c.Activate(e.ctx, zero), ErrInvalid)
		if st, _ := e.c.Status(e.ctx); st.State != Waiting || st.Activations != 0 {
			e.t.Fatalf("after refusals: %+v", st)
		}

		e.activate(time.Minute)
		replay := activation(time.Second) // ttl_ms differs: ignored on replay
		if err := e.c.Activate(e.ctx, replay); err != nil {
			e.t.Fatalf("exact replay: %v", err)
		}
		for name, mut := range map[string]func(*Activation){
			"lease":      func(a *Activation) { a.LeaseID = "lease-2" },
			"generation": func(a *Activation) { a.Generation++ },
			"expires_at": func(a *Activation) { a.ExpiresAt = a.ExpiresAt.Add(time.Second) },
			"cell":       func(a *Activation) { a.CellID = "cell-2" },
		} {
			a := activation(time.Minute)
			mut(&a)
			wantCode(e.t, "second fence, other "+name, e.c.Activate(e.ctx, a), ErrFenceRefused)
		}
		st, err := e.c.Status(e.ctx)
		if err != nil || st.State != Active || st.Activations != 1 {
			e.t.Fatalf("after replay and refusals: %+v %v", st, err)
		}
		// The bound fence still works, and the 1 s TTL of the replay was
		// ignored (the agent stays active past it: checked by the exec).
		if res := e.exec(ExecRequest{Argv: []string{"true"}}); res.ExitCode != 0 {
			e.t.Fatalf("exec after replay: %+v", res)
		}
	}},
	{"activation_carried_by_a_request", func(e *env) {
		marker := filepath.Join(e.home, "carried")
		// A request whose activation names another fence: refused, nothing
		// activated or run.
		mismatched := activation(time.Minute)
		mismatched.LeaseID = "lease-2"
		_, err := e.c.Exec(e.ctx, ExecRequest{Fence: testFence, Activation: &mismatched, Argv: sh("touch " + marker)}, nil)
		wantCode(e.t, "activation of another fence", err, ErrInvalid)
		if st, _ := e.c.Status(e.ctx); st.State != Waiting || exists(marker) {
			e.t.Fatalf("after a mismatched activation: %+v, marker %v", st, exists(marker))
		}
		// The first request activates, the later ones replay (ttl_ms may
		// differ), and the activation counts once.
		act := activation(time.Minute)
		res, err := e.c.Exec(e.ctx, ExecRequest{Fence: testFence, Activation: &act, Argv: sh("touch " + marker)}, nil)
		if err != nil || res.ExitCode != 0 || !exists(marker) {
			e.t.Fatalf("exec carrying the activation: %+v %v", res, err)
		}
		replay := activation(time.Second)
		if _, err := e.c.WriteFile(e.ctx, WriteRequest{Fence: testFence, Activation: &replay, Path: marker + "2"}, strings.NewReader("x")); err != nil {
			e.t.Fatalf("write carrying the replay: %v", err)
		}
		if st, _ := e.c.Status(e.ctx); st.State != Active || st.Activations != 1 {
			e.t.Fatalf("after two carried activations: %+v", st)
		}
		// Another lease's activation on a later request is a refused fence.
		other := activation(time.Minute)
		other.LeaseID, other.Generation = "lease-2", 4
		_, err = e.c.Exec(e.ctx, ExecRequest{Fence: other.Fence, Activation: &other, Argv: []string{"true"}}, nil)
		wantCode(e.t, "another lease's activation", err, ErrFenceRefused)
	}},
	{"no_operation_before_activation", func(e *env) {
		marker := filepath.Join(e.home, "marker")
		_, err := e.c.Exec(e.ctx, ExecRequest{Fence: testFence, Argv: sh("touch " + marker)}, nil)
		wantCode(e.t, "exec", err, ErrNotActive)
		_, err = e.c.Launch(e.ctx, LaunchRequest{Fence: testFence, Argv: sh("touch " + marker)})
		wantCode(e.t, "launch", err, ErrNotActive)
		_, err = e.c.LaunchStatus(e.ctx, testFence)
		wantCode(e.t, "launch status", err, ErrNotActive)
		_, err = e.write(marker, "", strings.NewReader("x"))
		wantCode(e.t, "write", err, ErrNotActive)
		_, err = e.read("/etc/hostname", "")
		wantCode(e.t, "read", err, ErrNotActive)
		wantCode(e.t, "release", e.c.Release(e.ctx, testFence), ErrNotActive)
		if exists(marker) {
			e.t.Fatal("something ran or was written before activation")
		}
		if st, _ := e.c.Status(e.ctx); st.State != Waiting {
			e.t.Fatalf("state %s", st.State)
		}
	}},
	{"fence_refused_after_activation", func(e *env) {
		e.activate(time.Minute)
		marker := filepath.Join(e.home, "marker")
		for _, f := range []Fence{
			{CellID: testCell, LeaseID: "lease-2", Generation: testFence.Generation},
			{CellID: testCell, LeaseID: testFence.LeaseID, Generation: testFence.Generation + 1},
			{CellID: "cell-2", LeaseID: testFence.LeaseID, Generation: testFence.Generation},
			{},
		} {
			_, err := e.c.Exec(e.ctx, ExecRequest{Fence: f, Argv: sh("touch " + marker)}, nil)
			wantCode(e.t, "exec", err, ErrFenceRefused)
			_, err = e.c.Launch(e.ctx, LaunchRequest{Fence: f, Argv: sh("touch " + marker)})
			wantCode(e.t, "launch", err, ErrFenceRefused)
			_, err = e.c.LaunchStatus(e.ctx, f)
			wantCode(e.t, "launch status", err, ErrFenceRefused)
			_, err = e.c.WriteFile(e.ctx, WriteRequest{Fence: f, Path: marker}, strings.NewReader("x"))
			wantCode(e.t, "write", err, ErrFenceRefused)
			_, _, err = e.c.ReadFile(e.ctx, ReadRequest{Fence: f, Path: "/etc/hostname"})
			wantCode(e.t, "read", err, ErrFenceRefused)
			wantCode(e.t, "release", e.c.Release(e.ctx, f), ErrFenceRefused)
		}
		if exists(marker) {
			e.t.Fatal("a request with another fence ran or wrote something")
		}
		if st, _ := e.c.Status(e.ctx); st.State != Active {
			e.t.Fatalf("state %s", st.State)
		}
	}},
	{"expiry_refuses_and_kills", func(e *env) {
		e.activate(3 * time.Second)
		// A command that leaves a process in the background, and one that
		// is still running when the lease expires.
		res := e.exec(ExecRequest{Argv: sh("sleep 1000 & echo $!")})
		bg := mustPid(e.t, string(res.Stdout))
		if !alive(bg) {
			e.t.Fatalf("the background sleep %d is not running", bg)
		}
		outs, done := e.stream(ExecRequest{Argv: sh("echo $$; exec sleep 1000")})
		running := mustPid(e.t, e.firstLine(outs))
		ans := <-done // ends at expiry
		if ans.err != nil {
			e.t.Fatalf("exec across expiry: %v", ans.err)
		}
		if ans.res.Reason != Killed || ans.res.ExitCode != 137 || ans.res.Signal != "KILL" {
			e.t.Fatalf("exec across expiry: %+v, want killed 137 KILL", ans.res)
		}
		e.eventually("the background process is killed", func() bool { return !alive(bg) })
		if alive(running) {
			e.t.Fatalf("the running command %d survived", running)
		}
		st, err := e.c.Status(e.ctx)
		if err != nil || st.State != Ended || st.Activations != 1 {
			e.t.Fatalf("status after expiry: %+v %v", st, err)
		}
		_, err = e.c.Exec(e.ctx, ExecRequest{Fence: testFence, Argv: []string{"true"}}, nil)
		wantCode(e.t, "exec after expiry", err, ErrExpired)
		_, err = e.write(filepath.Join(e.home, "late"), "", strings.NewReader("x"))
		wantCode(e.t, "write after expiry", err, ErrExpired)
		wantCode(e.t, "replayed activation after expiry", e.c.Activate(e.ctx, activation(time.Minute)), ErrExpired)
		other := activation(time.Minute)
		other.LeaseID = "lease-2"
		wantCode(e.t, "new activation after expiry", e.c.Activate(e.ctx, other), ErrFenceRefused)
		if exists(filepath.Join(e.home, "late")) {
			e.t.Fatal("written after expiry")
		}
	}},
	{"release_kills_and_ends", func(e *env) {
		e.activate(time.Minute)
		fifo := e.mkfifo("never")
		st, err := e.c.Launch(e.ctx, LaunchRequest{Fence: testFence, Argv: sh("cat " + fifo)})
		if err != nil || st.Phase != Running || st.PID == nil {
			e.t.Fatalf("launch: %+v %v", st, err)
		}
		res := e.exec(ExecRequest{Argv: sh("sleep 1000 & echo $!")})
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
			return ls.Phase == Terminal && *ls.Reason == Killed && *ls.Signal == "KILL" && *ls.ExitCode == 137
		})
		if alive(*st.PID) {
			e.t.Fatalf("the launched process %d survived", *st.PID)
		}
		_, err = e.c.LaunchStatus(e.ctx, testFence)
		wantCode(e.t, "launch status after release", err, ErrExpired)
	}},
	{"exec_io_env_cwd_user", func(e *env) {
		e.activate(time.Minute)
		if res := e.exec(ExecRequest{Argv: []string{"echo", "hello", "world"}}); string(res.Stdout) != "hello world\n" || res.ExitCode != 0 || res.Reason != Exited || res.Truncated {
			e.t.Fatalf("echo: %+v", res)
		}
		if res := e.exec(ExecRequest{Argv: []string{"cat"}, Stdin: []byte("from stdin\x00\xff")}); string(res.Stdout) != "from stdin\x00\xff" {
			e.t.Fatalf("cat: %q", res.Stdout)
		}
		if res := e.exec(ExecRequest{Argv: sh("wc -c"), Stdin: bytes.Repeat([]byte{0xff}, MaxStdin)}); strings.TrimSpace(string(res.Stdout)) != strconv.Itoa(MaxStdin) {
			e.t.Fatalf("1 MiB of stdin: %q", res.Stdout)
		}
		if res := e.exec(ExecRequest{Argv: sh("echo out; echo err >&2")}); string(res.Stdout) != "out\n" || string(res.Stderr) != "err\n" {
			e.t.Fatalf("streams: %q %q", res.Stdout, res.Stderr)
		}
		// The environment is the fixed base plus the request's, nothing of
		// the agent's own.
		os.Setenv("SBW_AGENT_OWN", "leak")
		defer os.Unsetenv("SBW_AGENT_OWN")
		res := e.exec(ExecRequest{Argv: []string{"env"}, Env: map[string]string{"FOO": "bar baz", "TERM": "xterm"}})
		want := "FOO=bar baz\nHOME=" + e.home + "\nPATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\nTERM=xterm\n"
		if got := sortedLines(string(res.Stdout)); got != want {
			e.t.Fatalf("env:\n%s\nwant:\n%s", got, want)
		}
		res = e.exec(ExecRequest{Argv: []string{"env"}, User: UserRoot})
		if got := sortedLines(string(res.Stdout)); got != "HOME=/root\nPATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\nTERM=dumb\n" {
			e.t.Fatalf("root env:\n%s", got)
		}
		// cwd: the home by default, or the one asked for.
		if res := e.exec(ExecRequest{Argv: []string{"pwd"}}); string(res.Stdout) != e.home+"\n" {
			e.t.Fatalf("default cwd: %q", res.Stdout)
		}
		if res := e.exec(ExecRequest{Argv: []string{"pwd"}, Cwd: "/tmp/"}); string(res.Stdout) != "/tmp\n" {
			e.t.Fatalf("cwd /tmp: %q", res.Stdout)
		}
		// Users: cell is 1000:1000 without supplementary groups or
		// capabilities; root is 0.
		if res := e.exec(ExecRequest{Argv: sh("id -u; id -g; id -G; grep CapEff /proc/self/status")}); string(res.Stdout) != "1000\n1000\n1000\nCapEff:\t0000000000000000\n" {
			e.t.Fatalf("cell user: %q", res.Stdout)
		}
		if res := e.exec(ExecRequest{Argv: sh("id -u; id -G"), User: UserRoot}); string(res.Stdout) != "0\n0\n" {
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
			req  ExecRequest
			code int
		}{
			{"not found", ExecRequest{Argv: []string{"no-such-command-sbw"}}, 127},
			{"not found by path", ExecRequest{Argv: []string{"/no/such/program"}}, 127},
			{"not executable by the cell user", ExecRequest{Argv: []string{rootOnly}}, 126},
			{"no executable format", ExecRequest{Argv: []string{garbage}}, 126},
			{"cwd the cell user cannot enter", ExecRequest{Argv: []string{"true"}, Cwd: private}, 126},
		} {
			res := e.exec(c.req)
			if res.ExitCode != c.code || res.Reason != Exited || !strings.HasPrefix(string(res.Stderr), "sandboxwich-agent: ") || len(res.Stdout) != 0 {
				e.t.Errorf("%s: %+v %q, want %d", c.name, res, res.Stderr, c.code)
			}
		}
		if res := e.exec(ExecRequest{Argv: []string{rootOnly}, User: UserRoot}); string(res.Stdout) != "ran\n" {
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
			res := e.exec(ExecRequest{Argv: sh(c.script)})
			if res.ExitCode != c.code || res.Signal != c.signal || res.Reason != Exited {
				e.t.Errorf("%s: %+v, want %d %q exited", c.script, res, c.code, c.signal)
			}
		}
	}},
	{"timeout_kills_the_tree", func(e *env) {
		e.activate(time.Minute)
		// The grandchild leaves the command's session and group (setsid):
		// only its parent links it to the command.
		outs, done := e.stream(ExecRequest{
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
		if r := ans.res; r.Reason != TimedOut || r.ExitCode != 137 || r.Signal != "KILL" {
			e.t.Fatalf("timeout: %+v", r)
		}
		e.eventually("the grandchild that left the session is killed", func() bool { return !alive(gc) })
		// The agent stays active.
		if res := e.exec(ExecRequest{Argv: []string{"true"}}); res.ExitCode != 0 {
			e.t.Fatalf("exec after a timeout: %+v", res)
		}
	}},
	{"background_does_not_block", func(e *env) {
		e.activate(time.Minute)
		// The background sleep holds stdout and stderr; the exec still
		// ends with its direct child, and the sleep keeps running.
		res := e.exec(ExecRequest{Argv: sh("sleep 1000 & echo $!; echo done >&2")})
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
		outs, done := e.stream(ExecRequest{Argv: sh("echo a; read x < " + fifo + "; echo b; echo c >&2")})
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
			case Stdout:
				stdout = append(stdout, o.Data...)
			case Stderr:
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
		res := e.exec(ExecRequest{Argv: sh(script), MaxOutput: 1000})
		if len(res.Stdout) != 1000 || len(res.Stderr) != 1000 || !res.Truncated || res.ExitCode != 0 {
			e.t.Fatalf("collected: %d %d %+v", len(res.Stdout), len(res.Stderr), res.Truncated)
		}
		outs, done := e.stream(ExecRequest{Argv: sh(script), MaxOutput: 1000})
		n := map[Stream]int{}
		for o := range outs {
			n[o.Stream] += len(o.Data)
		}
		ans := <-done
		if ans.err != nil || !ans.res.Truncated || n[Stdout] != 1000 || n[Stderr] != 1000 {
			e.t.Fatalf("streamed: %v %+v %v", n, ans.res, ans.err)
		}
		// The default cap is 1 MiB per stream.
		res = e.exec(ExecRequest{Argv: sh("head -c 1048577 /dev/zero")})
		if len(res.Stdout) != 1<<20 || !res.Truncated {
			e.t.Fatalf("default cap: %d %v", len(res.Stdout), res.Truncated)
		}
		res = e.exec(ExecRequest{Argv: sh("head -c 1048576 /dev/zero")})
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
			if u := owner(e.t, p); u != CellUID {
				e.t.Fatalf("%s is owned by %d, not the cell user", p, u)
			}
		}
		if st, _ := os.Stat(path); st.Mode().Perm() != 0o644 {
			e.t.Fatalf("mode %v", st.Mode())
		}
		rc, n, err := e.c.ReadFile(e.ctx, ReadRequest{Fence: testFence, Path: path})
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
		if _, err := e.c.WriteFile(e.ctx, WriteRequest{Fence: testFence, Path: path, Mode: 0o600}, strings.NewReader("small")); err != nil {
			e.t.Fatal(err)
		}
		if b, err := os.ReadFile(path); err != nil || string(b) != "small" {
			e.t.Fatalf("replaced: %q %v", b, err)
		}
		if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
			e.t.Fatalf("mode %v", st.Mode())
		}
		_, _, err = e.c.ReadFile(e.ctx, ReadRequest{Fence: testFence, Path: path, MaxBytes: 4})
		wantCode(e.t, "read over max_bytes", err, ErrTooLarge)
		if names := dirNames(e.t, filepath.Dir(path)); names != "data.bin" {
			e.t.Fatalf("the directory holds %q", names)
		}
	}},
	{"file_write_over_256MiB_refused", func(e *env) {
		e.activate(time.Minute)
		path := filepath.Join(e.home, "big", "file")
		_, err := e.write(path, "", content(MaxFileBytes+1<<20, 2))
		wantCode(e.t, "257 MiB", err, ErrTooLarge)
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
		_, err := e.write(filepath.Join(dir, "x"), UserCell, strings.NewReader("x"))
		wantCode(e.t, "cell write into a root dir", err, ErrAccessDenied)
		// Refused before the content is read: the answer still arrives
		// while the client is sending a large body.
		_, err = e.write(filepath.Join(dir, "x"), UserCell, content(32<<20, 3))
		wantCode(e.t, "cell write of 32 MiB into a root dir", err, ErrAccessDenied)
		// A symlink to the root directory: the same.
		link := filepath.Join(e.home, "link-to-root-dir")
		if err := os.Symlink(dir, link); err != nil {
			e.t.Fatal(err)
		}
		_, err = e.write(filepath.Join(link, "y"), UserCell, strings.NewReader("y"))
		wantCode(e.t, "cell write through a symlinked dir", err, ErrAccessDenied)
		// A symlink to a root-only file: it cannot be read, and writing
		// its path replaces the link, never the file.
		flink := filepath.Join(e.home, "link-to-secret")
		if err := os.Symlink(secret, flink); err != nil {
			e.t.Fatal(err)
		}
		_, err = e.read(flink, UserCell)
		wantCode(e.t, "cell read through a symlink", err, ErrAccessDenied)
		_, err = e.read(secret, UserCell)
		wantCode(e.t, "cell read of a root-only file", err, ErrAccessDenied)
		if _, err := e.write(flink, UserCell, strings.NewReader("replaced")); err != nil {
			e.t.Fatalf("cell write over its own symlink: %v", err)
		}
		if b, _ := os.ReadFile(secret); string(b) != "root's" {
			e.t.Fatalf("the root file changed: %q", b)
		}
		if fi, _ := os.Lstat(flink); !fi.Mode().IsRegular() || owner(e.t, flink) != CellUID {
			e.t.Fatalf("the link was not replaced by the cell's file: %v", fi.Mode())
		}
		if names := dirNames(e.t, dir); names != "secret" {
			e.t.Fatalf("the root dir holds %q", names)
		}
		// Root may.
		if _, err := e.write(filepath.Join(dir, "z"), UserRoot, strings.NewReader("z")); err != nil {
			e.t.Fatalf("root write: %v", err)
		}
		if b, err := e.read(secret, UserRoot); err != nil || string(b) != "root's" {
			e.t.Fatalf("root read: %q %v", b, err)
		}
		if u := owner(e.t, filepath.Join(dir, "z")); u != 0 {
			e.t.Fatalf("root's file owned by %d", u)
		}
		// Errors of the file system, mapped.
		_, err = e.read(filepath.Join(e.home, "missing"), "")
		wantCode(e.t, "missing", err, ErrNotFound)
		_, err = e.read(e.home, "")
		wantCode(e.t, "a directory", err, ErrInvalid)
		_, err = e.read(filepath.Join(secret, "below-a-file"), UserRoot)
		wantCode(e.t, "below a file", err, ErrInvalid)
		_, err = e.write(e.home, "", strings.NewReader("x"))
		wantCode(e.t, "write over a directory", err, ErrInvalid)
		_, err = e.read(e.mkfifo("fifo"), "")
		wantCode(e.t, "a FIFO", err, ErrInvalid)
	}},
	{"bad_input_runs_nothing", func(e *env) {
		e.activate(time.Minute)
		marker := filepath.Join(e.home, "marker")
		touch := sh("touch " + marker)
		long := "/" + strings.Repeat("a", MaxPath)
		for _, c := range []struct {
			name string
			req  ExecRequest
			want error
			msg  string
		}{
			{"no argv", ExecRequest{}, ErrInvalid, "argv[0]"},
			{"empty argv[0]", ExecRequest{Argv: []string{"", "-c", "touch " + marker}}, ErrInvalid, "argv[0]"},
			{"NUL in argv", ExecRequest{Argv: sh("touch " + marker + "\x00")}, ErrInvalid, "NUL"},
			{"NUL in an env value", ExecRequest{Argv: touch, Env: map[string]string{"A": "x\x00"}}, ErrInvalid, "NUL"},
			{"env key with a dash", ExecRequest{Argv: touch, Env: map[string]string{"A-B": "x"}}, ErrInvalid, "env key"},
			{"env key with a digit first", ExecRequest{Argv: touch, Env: map[string]string{"1A": "x"}}, ErrInvalid, "env key"},
			{"empty env key", ExecRequest{Argv: touch, Env: map[string]string{"": "x"}}, ErrInvalid, "env key"},
			{"env key with =", ExecRequest{Argv: touch, Env: map[string]string{"A=B": "x"}}, ErrInvalid, "env key"},
			{"relative cwd", ExecRequest{Argv: touch, Cwd: "tmp"}, ErrInvalid, "absolute"},
			{"long cwd", ExecRequest{Argv: touch, Cwd: long}, ErrInvalid, "longer"},
			{"NUL in cwd", ExecRequest{Argv: touch, Cwd: "/tmp\x00"}, ErrInvalid, "NUL"},
			{"missing cwd", ExecRequest{Argv: touch, Cwd: "/no/such/dir"}, ErrInvalid, "does not exist"},
			{"cwd a file", ExecRequest{Argv: touch, Cwd: "/etc/passwd"}, ErrInvalid, "not a directory"},
			{"unknown user", ExecRequest{Argv: touch, User: "nobody"}, ErrUserUnsupported, "nobody"},
			{"stdin over 1 MiB", ExecRequest{Argv: touch, Stdin: make([]byte, MaxStdin+1)}, ErrTooLarge, "stdin"},
			{"negative timeout", ExecRequest{Argv: touch, TimeoutMillis: -1}, ErrInvalid, "timeout"},
			{"max_output over the limit", ExecRequest{Argv: touch, MaxOutput: MaxOutputLimit + 1}, ErrInvalid, "max_output"},
		} {
			c.req.Fence = testFence
			_, err := e.c.Exec(e.ctx, c.req, nil)
			wantCode(e.t, "exec: "+c.name, err, c.want)
			if !strings.Contains(err.Error(), c.msg) {
				e.t.Errorf("exec: %s: %q does not say %q", c.name, err, c.msg)
			}
			if c.req.Stdin == nil && c.req.TimeoutMillis == 0 && c.req.MaxOutput == 0 { // the launch has the rest
				_, err = e.c.Launch(e.ctx, LaunchRequest{Fence: testFence, Argv: c.req.Argv, Env: c.req.Env, Cwd: c.req.Cwd, User: c.req.User})
				wantCode(e.t, "launch: "+c.name, err, c.want)
			}
		}
		_, err := e.c.Launch(e.ctx, LaunchRequest{Fence: testFence, Argv: []string{"no-such-command-sbw"}})
		wantCode(e.t, "launch of an unknown command", err, ErrInvalid)
		_, err = e.c.LaunchStatus(e.ctx, testFence)
		wantCode(e.t, "nothing was launched", err, ErrNotLaunched)

		for _, c := range []struct {
			name string
			req  WriteRequest
			want error
		}{
			{"relative path", WriteRequest{Path: "marker"}, ErrInvalid},
			{"empty path", WriteRequest{}, ErrInvalid},
			{"NUL in path", WriteRequest{Path: marker + "\x00"}, ErrInvalid},
			{"long path", WriteRequest{Path: long}, ErrInvalid},
			{"the root", WriteRequest{Path: "/"}, ErrInvalid},
			{"mode beyond 0777", WriteRequest{Path: marker, Mode: 0o4755}, ErrInvalid},
			{"unknown user", WriteRequest{Path: marker, User: "nobody"}, ErrUserUnsupported},
		} {
			c.req.Fence = testFence
			_, err := e.c.WriteFile(e.ctx, c.req, strings.NewReader("x"))
			wantCode(e.t, "write: "+c.name, err, c.want)
			_, _, err = e.c.ReadFile(e.ctx, ReadRequest{Fence: testFence, Path: c.req.Path, User: c.req.User})
			if c.name != "the root" && c.name != "mode beyond 0777" {
				wantCode(e.t, "read: "+c.name, err, c.want)
			}
		}
		_, _, err = e.c.ReadFile(e.ctx, ReadRequest{Fence: testFence, Path: "/etc/hostname", MaxBytes: -1})
		wantCode(e.t, "read: negative max_bytes", err, ErrInvalid)
		_, _, err = e.c.ReadFile(e.ctx, ReadRequest{Fence: testFence, Path: "/etc/hostname", MaxBytes: MaxFileBytes + 1})
		wantCode(e.t, "read: max_bytes over 256 MiB", err, ErrInvalid)
		if exists(marker) {
			e.t.Fatal("bad input ran or wrote something")
		}
	}},
	{"launch_phases_replay_conflict", func(e *env) {
		e.activate(time.Minute)
		_, err := e.c.LaunchStatus(e.ctx, testFence)
		wantCode(e.t, "before the launch", err, ErrNotLaunched)
		fifo := e.mkfifo("gate")
		req := LaunchRequest{Fence: testFence, Argv: sh("echo out; id -u >&2; read x < " + fifo + "; exit 7"), Env: map[string]string{"A": "1"}}
		st, err := e.c.Launch(e.ctx, req)
		if err != nil || st.Phase != Running || st.PID == nil || st.Replay || st.ExitCode != nil || st.Reason != nil || st.Signal != nil {
			e.t.Fatalf("launch: %+v %v", st, err)
		}
		pid := *st.PID
		again, err := e.c.Launch(e.ctx, req)
		if err != nil || !again.Replay || again.PID == nil || *again.PID != pid || again.Phase != Running {
			e.t.Fatalf("replay: %+v %v", again, err)
		}
		// The defaults are part of the spec: naming them is the same launch.
		same := req
		same.Cwd, same.User = e.home, UserCell
		if again, err := e.c.Launch(e.ctx, same); err != nil || !again.Replay {
			e.t.Fatalf("replay with the defaults spelled out: %+v %v", again, err)
		}
		for name, mut := range map[string]func(*LaunchRequest){
			"argv": func(r *LaunchRequest) { r.Argv = []string{"true"} },
			"env":  func(r *LaunchRequest) { r.Env = map[string]string{"A": "2"} },
			"cwd":  func(r *LaunchRequest) { r.Cwd = "/tmp" },
			"user": func(r *LaunchRequest) { r.User = UserRoot },
		} {
			other := req
			mut(&other)
			_, err := e.c.Launch(e.ctx, other)
			wantCode(e.t, "another launch, other "+name, err, ErrConflict)
		}
		if st, err := e.c.LaunchStatus(e.ctx, testFence); err != nil || st.Phase != Running || *st.PID != pid || st.Replay {
			e.t.Fatalf("status while running: %+v %v", st, err)
		}
		release(e.t, fifo)
		e.eventually("the launch is terminal", func() bool {
			st, err := e.c.LaunchStatus(e.ctx, testFence)
			return err == nil && st.Phase == Terminal
		})
		st, _ = e.c.LaunchStatus(e.ctx, testFence)
		if *st.ExitCode != 7 || *st.Reason != Exited || st.Signal != nil || *st.PID != pid {
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
			if u := owner(e.t, p); u != CellUID {
				e.t.Fatalf("%s is owned by %d", p, u)
			}
		}
		// Terminal: a replay still reports it, anything else conflicts.
		if st, err := e.c.Launch(e.ctx, req); err != nil || !st.Replay || st.Phase != Terminal {
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

// TestClientDeadSocket: a Client whose agent cannot be reached gets an
// error that is not an answer.
func TestClientDeadSocket(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "dead.sock")
	c := NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
	ctx := context.Background()
	if _, err := c.Status(ctx); err == nil || IsAnswer(err) {
		t.Fatalf("status of a dead socket: %v", err)
	}
	if err := c.Activate(ctx, activation(time.Minute)); err == nil || IsAnswer(err) {
		t.Fatalf("activate on a dead socket: %v", err)
	}
	if _, err := c.Exec(ctx, ExecRequest{Fence: testFence, Argv: []string{"true"}}, nil); err == nil || IsAnswer(err) {
		t.Fatalf("exec on a dead socket: %v", err)
	}
}

// TestClientBrokenAnswers: an answer cut short, or an agent failure that
// is no decision, is not an *Error.
func TestClientBrokenAnswers(t *testing.T) {
	var mu sync.Mutex
	answer := func(w http.ResponseWriter, r *http.Request) {}
	srv := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		f := answer
		mu.Unlock()
		f(w, r)
	})
	c := serveHandler(t, srv)
	ctx := context.Background()
	set := func(f func(w http.ResponseWriter, r *http.Request)) {
		mu.Lock()
		answer = f
		mu.Unlock()
	}
	// An exec stream that ends without a result.
	set(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		fmt.Fprintln(w, `{"stream":"stdout","data":"YQo="}`)
	})
	var got []Output
	_, err := c.Exec(ctx, ExecRequest{Fence: testFence, Argv: []string{"x"}}, func(o Output) error { got = append(got, o); return nil })
	if err == nil || IsAnswer(err) || len(got) != 1 || string(got[0].Data) != "a\n" {
		t.Fatalf("cut stream: %v %v", err, got)
	}
	// A file read cut short of its Content-Length.
	set(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "10")
		w.WriteHeader(http.StatusOK)
		w.Write([]byte("abc"))
	})
	rc, n, err := c.ReadFile(ctx, ReadRequest{Fence: testFence, Path: "/x"})
	if err != nil || n != 10 {
		t.Fatalf("read: %v %d", err, n)
	}
	if _, err := io.ReadAll(rc); err == nil || IsAnswer(err) {
		t.Fatalf("short read: %v", err)
	}
	rc.Close()
	// An internal failure, and a refusal with an unknown code.
	for _, body := range []string{`{"code":"internal","message":"fork: resource temporarily unavailable"}`, `{"code":"whatever"}`, `not json`} {
		set(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprint(w, body)
		})
		if _, err := c.Status(ctx); err == nil || IsAnswer(err) {
			t.Fatalf("%s: %v", body, err)
		}
	}
	// A decided refusal is an *Error.
	set(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusGone)
		fmt.Fprint(w, `{"code":"expired","message":"the lease ended"}`)
	})
	if _, err := c.Status(ctx); !errors.Is(err, ErrExpired) {
		t.Fatalf("refusal: %v", err)
	}
}
