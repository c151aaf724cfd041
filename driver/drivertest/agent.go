package drivertest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/driver"
)

// ProcessCounter is an optional interface of a Harness whose provider can
// count a cell's processes without asking the cell's agent (for gVisor,
// runsc ps). The agent cases then prove that the agent's expiry kills what
// a command left running in the background; without it they prove the
// agent's refusals only.
type ProcessCounter interface {
	// CellProcesses returns how many processes run in obj's cell, the
	// agent included.
	CellProcesses(ctx context.Context, p driver.Provider, obj driver.Object) (int, error)
}

// agentTTL is the life of the activations the agent cases make, except
// the expiry case's.
const agentTTL = time.Hour

// agentHost returns p as a driver.AgentHost or skips the test.
func agentHost(t *testing.T, p driver.Provider) driver.AgentHost {
	t.Helper()
	h, ok := p.(driver.AgentHost)
	if !ok {
		t.Skip("provider is not a driver.AgentHost")
	}
	return h
}

// connect returns a connection to obj's agent, failing the test if there
// is none.
func connect(t *testing.T, h driver.AgentHost, obj driver.Object) agent.Conn {
	t.Helper()
	c, err := h.Agent(ctx(t), obj)
	if err != nil {
		t.Fatalf("Agent(%s): %v", obj.CellID, err)
	}
	return c
}

// activation returns a fresh activation of obj's cell for a random lease.
func activation(obj driver.Object, ttl time.Duration) agent.Activation {
	return agent.Activation{
		Version:   agent.ProtocolVersion,
		Fence:     agent.Fence{CellID: obj.CellID.String(), LeaseID: uuid.NewString(), Generation: 1},
		ExpiresAt: time.Now().Add(ttl).UTC().Truncate(time.Millisecond),
		TTLMillis: ttl.Milliseconds(),
	}
}

// agentRun runs req through c and fails the test on an error.
func agentRun(t *testing.T, c agent.Conn, req agent.ExecRequest) agent.ExecResult {
	t.Helper()
	if req.TimeoutMillis == 0 {
		req.TimeoutMillis = time.Minute.Milliseconds()
	}
	res, err := c.Exec(ctx(t), req, nil)
	if err != nil {
		t.Fatalf("agent Exec(%q): %v", req.Argv, err)
	}
	return res
}

func (s *suite) testAgent(t *testing.T) {
	p := s.provider(t)
	h := agentHost(t, p)
	t.Run("Lifecycle", func(t *testing.T) {
		t.Parallel()
		s.testAgentLifecycle(t, p, h)
	})
	t.Run("Expiry", func(t *testing.T) {
		t.Parallel()
		s.testAgentExpiry(t, p, h)
	})
	t.Run("Destroy", func(t *testing.T) {
		t.Parallel()
		s.testAgentDestroy(t, p, h)
	})
}

// testAgentLifecycle walks one cell's agent from waiting through every
// lease operation. The subtests share the cell and run in order.
func (s *suite) testAgentLifecycle(t *testing.T, p driver.Provider, h driver.AgentHost) {
	obj := s.provision(t, p)
	c := connect(t, h, obj)
	act := activation(obj, agentTTL)
	f := act.Fence

	t.Run("StatusWaiting", func(t *testing.T) {
		st, err := c.Status(ctx(t))
		if err != nil {
			t.Fatalf("Status: %v", err)
		}
		o, err := p.Inspect(ctx(t), obj)
		if err != nil {
			t.Fatalf("Inspect: %v", err)
		}
		if st.State != agent.Waiting || st.Activations != 0 || st.CellID != obj.CellID.String() {
			t.Errorf("Status = %+v, want waiting, 0 activations, cell %s", st, obj.CellID)
		}
		if !strings.HasPrefix(st.Digest, "sha256:") || len(st.Digest) != len("sha256:")+64 {
			t.Errorf("agent digest %q, want sha256:<64 hex>", st.Digest)
		}
		if o.AgentDigest != st.Digest {
			t.Errorf("Observation.AgentDigest = %q, the agent reports %q", o.AgentDigest, st.Digest)
		}
	})
	t.Run("NothingBeforeActivation", func(t *testing.T) {
		_, err := c.Exec(ctx(t), agent.ExecRequest{Fence: f, Argv: []string{"true"}}, nil)
		if !errors.Is(err, agent.ErrNotActive) {
			t.Errorf("Exec before activation: %v, want ErrNotActive", err)
		}
		if _, err := c.WriteFile(ctx(t), agent.WriteRequest{Fence: f, Path: "/tmp/x"}, strings.NewReader("x")); !errors.Is(err, agent.ErrNotActive) {
			t.Errorf("WriteFile before activation: %v, want ErrNotActive", err)
		}
		if _, err := c.Launch(ctx(t), agent.LaunchRequest{Fence: f, Argv: []string{"true"}}); !errors.Is(err, agent.ErrNotActive) {
			t.Errorf("Launch before activation: %v, want ErrNotActive", err)
		}
	})
	t.Run("Activate", func(t *testing.T) {
		if err := c.Activate(ctx(t), act); err != nil {
			t.Fatalf("Activate: %v", err)
		}
		if err := c.Activate(ctx(t), act); err != nil {
			t.Errorf("exact replay of the activation: %v", err)
		}
		other := activation(obj, agentTTL)
		if err := c.Activate(ctx(t), other); !errors.Is(err, agent.ErrFenceRefused) {
			t.Errorf("a second fence: %v, want ErrFenceRefused", err)
		}
		st, err := c.Status(ctx(t))
		if err != nil || st.State != agent.Active || st.Activations != 1 {
			t.Errorf("Status after activation = %+v, %v; want active, 1 activation", st, err)
		}
		_, err = c.Exec(ctx(t), agent.ExecRequest{Fence: other.Fence, Argv: []string{"true"}}, nil)
		if !errors.Is(err, agent.ErrFenceRefused) {
			t.Errorf("Exec with another fence: %v, want ErrFenceRefused", err)
		}
	})
	t.Run("Exec", func(t *testing.T) {
		s.needsShell(t)
		res := agentRun(t, c, agent.ExecRequest{Fence: f, Argv: []string{"echo", "hi"}})
		if res.ExitCode != 0 || string(res.Stdout) != "hi\n" || res.Reason != agent.Exited {
			t.Errorf("echo hi = exit %d, stdout %q, reason %q; want 0, \"hi\\n\", exited", res.ExitCode, res.Stdout, res.Reason)
		}
		res = agentRun(t, c, agent.ExecRequest{Fence: f, Argv: sh("echo out; echo err >&2; exit 7")})
		if res.ExitCode != 7 || string(res.Stdout) != "out\n" || string(res.Stderr) != "err\n" {
			t.Errorf("exit 7: exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout, res.Stderr)
		}
		var streamed bytes.Buffer
		res, err := c.Exec(ctx(t), agent.ExecRequest{Fence: f, Argv: []string{"echo", "streamed"}}, func(o agent.Output) error {
			if o.Stream == agent.Stdout {
				streamed.Write(o.Data)
			}
			return nil
		})
		if err != nil || streamed.String() != "streamed\n" || len(res.Stdout) != 0 {
			t.Errorf("streamed exec: %v, streamed %q, collected %q", err, streamed.String(), res.Stdout)
		}
	})
	t.Run("CwdAndUser", func(t *testing.T) {
		s.needsShell(t)
		if res := agentRun(t, c, agent.ExecRequest{Fence: f, Argv: []string{"pwd"}}); string(res.Stdout) != "/home/cell\n" {
			t.Errorf("default cwd %q, want /home/cell", res.Stdout)
		}
		if res := agentRun(t, c, agent.ExecRequest{Fence: f, Argv: []string{"pwd"}, Cwd: "/tmp"}); string(res.Stdout) != "/tmp\n" {
			t.Errorf("cwd /tmp: %q", res.Stdout)
		}
		for user, want := range map[agent.User]string{"": "1000\n", agent.UserCell: "1000\n", agent.UserRoot: "0\n"} {
			res, err := c.Exec(ctx(t), agent.ExecRequest{Fence: f, Argv: []string{"id", "-u"}, User: user}, nil)
			switch {
			case user == agent.UserRoot && errors.Is(err, agent.ErrUserUnsupported):
				t.Log("the provider's cells cannot run as root (user_unsupported)")
			case err != nil:
				t.Errorf("id -u as %q: %v", user, err)
			case string(res.Stdout) != want:
				t.Errorf("id -u as %q = %q (stderr %q), want %q", user, res.Stdout, res.Stderr, want)
			}
		}
	})
	t.Run("Files", func(t *testing.T) {
		s.needsShell(t)
		content := make([]byte, 1<<20+7)
		for i := range content {
			content[i] = byte(rand.IntN(256))
		}
		sum := sha256.Sum256(content)
		path := "/home/cell/drivertest/sub/file.bin"
		info, err := c.WriteFile(ctx(t), agent.WriteRequest{Fence: f, Path: path, Mode: 0o600}, bytes.NewReader(content))
		if err != nil {
			t.Fatalf("WriteFile: %v", err)
		}
		if info.Size != int64(len(content)) || info.SHA256 != hex.EncodeToString(sum[:]) {
			t.Errorf("WriteFile = %+v, want size %d, sha256 %x", info, len(content), sum)
		}
		r, n, err := c.ReadFile(ctx(t), agent.ReadRequest{Fence: f, Path: path})
		if err != nil {
			t.Fatalf("ReadFile: %v", err)
		}
		got, err := io.ReadAll(r)
		r.Close()
		if err != nil || n != int64(len(content)) || !bytes.Equal(got, content) {
			t.Errorf("ReadFile: %d bytes (size %d), err %v; want the %d bytes written", len(got), n, err, len(content))
		}
		if res := agentRun(t, c, agent.ExecRequest{Fence: f, Argv: []string{"stat", "-c", "%u %a", path}}); string(res.Stdout) != "1000 600\n" {
			t.Errorf("the cell user's file: stat = %q (stderr %q), want \"1000 600\"", res.Stdout, res.Stderr)
		}
		if _, _, err := c.ReadFile(ctx(t), agent.ReadRequest{Fence: f, Path: "/home/cell/drivertest/missing"}); !errors.Is(err, agent.ErrNotFound) {
			t.Errorf("ReadFile of a missing file: %v, want ErrNotFound", err)
		}
		if _, _, err := c.ReadFile(ctx(t), agent.ReadRequest{Fence: f, Path: path, MaxBytes: 10}); !errors.Is(err, agent.ErrTooLarge) {
			t.Errorf("ReadFile over max_bytes: %v, want ErrTooLarge", err)
		}
		// The cell user cannot write where root owns the directory.
		if _, err := c.WriteFile(ctx(t), agent.WriteRequest{Fence: f, Path: "/root/x"}, strings.NewReader("x")); !errors.Is(err, agent.ErrAccessDenied) {
			t.Errorf("the cell user writing /root/x: %v, want ErrAccessDenied", err)
		}
		// Content that fails part-way writes nothing: the file keeps what
		// it held (issue 40).
		cut := io.MultiReader(bytes.NewReader(make([]byte, 2<<20)), errReader{io.ErrUnexpectedEOF})
		if _, err := c.WriteFile(ctx(t), agent.WriteRequest{Fence: f, Path: path, Mode: 0o600}, cut); err == nil {
			t.Error("WriteFile whose content failed part-way succeeded")
		}
		if res := agentRun(t, c, agent.ExecRequest{Fence: f, Argv: []string{"sha256sum", path}}); !strings.HasPrefix(string(res.Stdout), hex.EncodeToString(sum[:])) {
			t.Errorf("after a write cut short the file's sha256sum is %q, want the old %x", res.Stdout, sum)
		}
		// A path ending in / names no file.
		if _, err := c.WriteFile(ctx(t), agent.WriteRequest{Fence: f, Path: "/home/cell/drivertest/dir/"}, strings.NewReader("x")); !errors.Is(err, agent.ErrInvalid) {
			t.Errorf("WriteFile to a path ending in /: %v, want ErrInvalid", err)
		}
		// A pseudo file whose size the kernel reports as 0 is read to its
		// end; a FIFO is refused without blocking.
		if r, n, err := c.ReadFile(ctx(t), agent.ReadRequest{Fence: f, Path: "/proc/self/status"}); err != nil {
			t.Errorf("ReadFile /proc/self/status: %v", err)
		} else {
			got, err := io.ReadAll(r)
			r.Close()
			if err != nil || n == 0 || int64(len(got)) != n {
				t.Errorf("ReadFile /proc/self/status: %d bytes (size %d), err %v; want its content", len(got), n, err)
			}
		}
		fifo := "/home/cell/drivertest/fifo"
		agentRun(t, c, agent.ExecRequest{Fence: f, Argv: []string{"mkfifo", fifo}})
		if _, _, err := c.ReadFile(ctx(t), agent.ReadRequest{Fence: f, Path: fifo}); !errors.Is(err, agent.ErrInvalid) {
			t.Errorf("ReadFile of a FIFO: %v, want ErrInvalid", err)
		}
	})
	t.Run("Launch", func(t *testing.T) {
		s.needsShell(t)
		if _, err := c.LaunchStatus(ctx(t), f); !errors.Is(err, agent.ErrNotLaunched) {
			t.Errorf("LaunchStatus before a launch: %v, want ErrNotLaunched", err)
		}
		req := agent.LaunchRequest{Fence: f, Argv: sh("echo launched; exit 3")}
		st, err := c.Launch(ctx(t), req)
		if err != nil {
			t.Fatalf("Launch: %v", err)
		}
		if st.Phase == agent.Accepted || st.Replay {
			t.Errorf("Launch = %+v, want running or terminal, no replay", st)
		}
		if again, err := c.Launch(ctx(t), req); err != nil || !again.Replay || (st.PID != nil && (again.PID == nil || *again.PID != *st.PID)) {
			t.Errorf("replayed Launch = %+v, %v; want a replay of pid %v", again, err, st.PID)
		}
		if _, err := c.Launch(ctx(t), agent.LaunchRequest{Fence: f, Argv: []string{"true"}}); !errors.Is(err, agent.ErrConflict) {
			t.Errorf("a different launch: %v, want ErrConflict", err)
		}
		deadline := time.Now().Add(time.Minute)
		for st.Phase != agent.Terminal && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
			if st, err = c.LaunchStatus(ctx(t), f); err != nil {
				t.Fatalf("LaunchStatus: %v", err)
			}
		}
		if st.Phase != agent.Terminal || st.ExitCode == nil || *st.ExitCode != 3 || st.Reason == nil || *st.Reason != agent.Exited {
			t.Fatalf("launch status = %+v, want terminal, exit 3, exited", st)
		}
		r, _, err := c.ReadFile(ctx(t), agent.ReadRequest{Fence: f, Path: "/home/cell/.launch/stdout"})
		if err != nil {
			t.Fatalf("reading the launch's stdout: %v", err)
		}
		out, _ := io.ReadAll(r)
		r.Close()
		if string(out) != "launched\n" {
			t.Errorf("the launch's stdout = %q, want \"launched\\n\"", out)
		}
	})
	t.Run("Release", func(t *testing.T) {
		if err := c.Release(ctx(t), activation(obj, agentTTL).Fence); !errors.Is(err, agent.ErrFenceRefused) {
			t.Errorf("Release with another fence: %v, want ErrFenceRefused", err)
		}
		if err := c.Release(ctx(t), f); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if _, err := c.Exec(ctx(t), agent.ExecRequest{Fence: f, Argv: []string{"true"}}, nil); !errors.Is(err, agent.ErrExpired) {
			t.Errorf("Exec after Release: %v, want ErrExpired", err)
		}
		if err := c.Release(ctx(t), f); err != nil {
			t.Errorf("a second Release: %v", err)
		}
		if st, err := c.Status(ctx(t)); err != nil || st.State != agent.Ended {
			t.Errorf("Status after Release = %+v, %v; want ended", st, err)
		}
	})
}

// testAgentExpiry activates a cell's agent for a few seconds: at expiry it
// ends, refuses every request, and (where the harness can count) kills
// what a command left running.
func (s *suite) testAgentExpiry(t *testing.T, p driver.Provider, h driver.AgentHost) {
	s.needsShell(t)
	obj := s.provision(t, p)
	c := connect(t, h, obj)
	counter, counts := s.h.(ProcessCounter)
	count := func() int {
		t.Helper()
		n, err := counter.CellProcesses(ctx(t), p, obj)
		if err != nil {
			t.Fatalf("CellProcesses: %v", err)
		}
		return n
	}
	idle := 0
	if counts {
		idle = count()
	}
	act := activation(obj, 5*time.Second)
	if err := c.Activate(ctx(t), act); err != nil {
		t.Fatalf("Activate: %v", err)
	}
	res, err := c.Exec(ctx(t), agent.ExecRequest{Fence: act.Fence, Argv: sh("sleep 600 </dev/null >/dev/null 2>&1 &")}, nil)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("starting a background process (the activation lives 5 s): %+v, %v", res, err)
	}
	if counts {
		if n := count(); n <= idle {
			t.Fatalf("%d processes in the cell with one in the background, %d before", n, idle)
		}
	}
	deadline := time.Now().Add(2 * time.Minute)
	var st agent.Status
	for {
		if st, err = c.Status(ctx(t)); err != nil {
			t.Fatalf("Status: %v", err)
		}
		if st.State == agent.Ended || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if st.State != agent.Ended {
		t.Fatalf("Status long after expiry = %+v, want ended", st)
	}
	if _, err := c.Exec(ctx(t), agent.ExecRequest{Fence: act.Fence, Argv: []string{"true"}}, nil); !errors.Is(err, agent.ErrExpired) {
		t.Errorf("Exec after expiry: %v, want ErrExpired", err)
	}
	if _, _, err := c.ReadFile(ctx(t), agent.ReadRequest{Fence: act.Fence, Path: "/etc/hostname"}); !errors.Is(err, agent.ErrExpired) {
		t.Errorf("ReadFile after expiry: %v, want ErrExpired", err)
	}
	if err := c.Activate(ctx(t), activation(obj, agentTTL)); err == nil {
		t.Error("an ended agent accepted a new activation")
	}
	if counts {
		// The agent kills before it reports ended; allow the kernel a
		// moment to take the processes away.
		n := count()
		for deadline := time.Now().Add(10 * time.Second); n > 1 && time.Now().Before(deadline); n = count() {
			time.Sleep(100 * time.Millisecond)
		}
		if n != 1 {
			t.Errorf("%d processes in the cell after expiry, want the agent alone", n)
		}
	}
}

// testAgentDestroy: after Destroy the cell's agent is unreachable and the
// provider says the object is gone.
func (s *suite) testAgentDestroy(t *testing.T, p driver.Provider, h driver.AgentHost) {
	obj := s.provision(t, p)
	c := connect(t, h, obj)
	if _, err := c.Status(ctx(t)); err != nil {
		t.Fatalf("Status: %v", err)
	}
	if err := p.Destroy(ctx(t), obj); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	requireAbsent(t, p, obj)
	if _, err := h.Agent(ctx(t), obj); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("Agent after Destroy: %v, want driver.ErrNotFound", err)
	}
	if st, err := c.Status(ctx(t)); err == nil {
		t.Errorf("a connection made before Destroy still answers: %+v", st)
	}
}

// agentExecer runs the suite's Exec cases through a provider's cell agent,
// for a provider that is an AgentHost but not an Execer: each object's
// agent is activated once, for an hour, with a fence of its own.
type agentExecer struct {
	h    driver.AgentHost
	mu   sync.Mutex
	acts map[driver.Object]agent.Activation
}

func (e *agentExecer) Exec(ctx context.Context, obj driver.Object, req driver.ExecRequest) (driver.ExecResult, error) {
	c, err := e.h.Agent(ctx, obj)
	if err != nil {
		return driver.ExecResult{}, err
	}
	e.mu.Lock()
	act, ok := e.acts[obj]
	if !ok {
		act = activation(obj, agentTTL)
		e.acts[obj] = act
	}
	e.mu.Unlock()
	if err := c.Activate(ctx, act); err != nil { // the first time, or an exact replay
		return driver.ExecResult{}, err
	}
	timeout, maxOut := req.Limits()
	start := time.Now()
	res, err := c.Exec(ctx, agent.ExecRequest{Fence: act.Fence, Argv: req.Argv, Env: req.Env, Stdin: req.Stdin,
		TimeoutMillis: timeout.Milliseconds(), MaxOutput: maxOut}, nil)
	if err != nil {
		return driver.ExecResult{}, err
	}
	return driver.ExecResult{
		ExitCode: res.ExitCode, Stdout: res.Stdout, Stderr: res.Stderr, Truncated: res.Truncated,
		TimedOut: res.Reason == agent.TimedOut, Signal: res.Signal, Reason: res.Reason,
		// The agent counts whole milliseconds; a quick command is 0.
		Duration: max(time.Duration(res.DurationMillis)*time.Millisecond, time.Since(start)),
	}, nil
}

// needsShell skips a case that runs real commands (sh, id, stat) for a
// NoShell harness.
func (s *suite) needsShell(t *testing.T) {
	t.Helper()
	if _, ok := s.h.(NoShell); ok {
		t.Skip("the harness's cells run no shell")
	}
}

// errReader fails every read with err.
type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }
