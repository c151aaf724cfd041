package fake_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/lease"
)

// manual is a clock the test moves.
type manual struct {
	mu  sync.Mutex
	now time.Time
}

func (m *manual) Now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.now
}

func (m *manual) Advance(d time.Duration) {
	m.mu.Lock()
	m.now = m.now.Add(d)
	m.mu.Unlock()
}

// cell provisions one object and returns it and its agent.
func cell(t *testing.T, p *fake.AgentProvider) (driver.Object, agent.Conn) {
	t.Helper()
	obj, err := p.Provision(context.Background(), driver.ProvisionRequest{CellID: uuid.New(), RuntimeClass: lease.GVisorLowerRisk})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := p.Agent(context.Background(), obj)
	if err != nil {
		t.Fatal(err)
	}
	return obj, conn
}

func activation(obj driver.Object, leaseID string, ttl time.Duration) agent.Activation {
	return agent.Activation{Version: agent.ProtocolVersion, Fence: agent.Fence{CellID: obj.CellID.String(), LeaseID: leaseID, Generation: 2},
		ExpiresAt: time.Unix(0, 0), TTLMillis: ttl.Milliseconds()}
}

// TestAgentStates: waiting → active under one fence (exact replays
// accepted, another fence refused) → ended at the TTL by the provider's
// clock.
func TestAgentStates(t *testing.T) {
	ctx := context.Background()
	clock := &manual{now: time.Date(2026, 8, 7, 12, 0, 0, 0, time.UTC)}
	p := fake.NewWithAgent(fake.Config{Mode: driver.Apply, Now: clock.Now})
	obj, conn := cell(t, p)
	if obs, _ := p.Inspect(ctx, obj); obs.AgentDigest != fake.AgentDigest {
		t.Fatalf("inspect: %+v", obs)
	}
	st, err := conn.Status(ctx)
	want := agent.Status{State: agent.Waiting, CellID: obj.CellID.String(), Digest: fake.AgentDigest}
	if err != nil || st != want {
		t.Fatalf("status %+v %v, want %+v", st, err, want)
	}
	act := activation(obj, uuid.NewString(), time.Minute)
	if _, err := conn.Exec(ctx, agent.ExecRequest{Fence: act.Fence, Argv: []string{"echo"}}, nil); !errors.Is(err, agent.ErrNotActive) {
		t.Fatalf("exec before activation: %v", err)
	}
	for _, bad := range []agent.Activation{
		func() agent.Activation { a := act; a.Version = 2; return a }(),
		func() agent.Activation { a := act; a.Generation = 0; return a }(),
		func() agent.Activation { a := act; a.TTLMillis = 0; return a }(),
	} {
		if err := conn.Activate(ctx, bad); !errors.Is(err, agent.ErrInvalid) {
			t.Fatalf("activation %+v: %v", bad, err)
		}
	}
	if err := conn.Activate(ctx, activation(driver.Object{CellID: uuid.New()}, act.LeaseID, time.Minute)); !errors.Is(err, agent.ErrFenceRefused) {
		t.Fatalf("activation for another cell: %v", err)
	}
	if err := conn.Activate(ctx, act); err != nil {
		t.Fatal(err)
	}
	replay := act
	replay.TTLMillis = 1 // a later replay carries less remaining life
	if err := conn.Activate(ctx, replay); err != nil {
		t.Fatalf("exact replay: %v", err)
	}
	other := activation(obj, uuid.NewString(), time.Minute)
	if err := conn.Activate(ctx, other); !errors.Is(err, agent.ErrFenceRefused) {
		t.Fatalf("another fence: %v", err)
	}
	later := act
	later.ExpiresAt = act.ExpiresAt.Add(time.Hour)
	if err := conn.Activate(ctx, later); err != nil {
		t.Fatalf("the fence with a later expiry (a renewal): %v", err)
	}
	if _, err := conn.Exec(ctx, agent.ExecRequest{Fence: other.Fence, Argv: []string{"echo"}}, nil); !errors.Is(err, agent.ErrFenceRefused) {
		t.Fatalf("exec under another fence: %v", err)
	}
	if st, _ := conn.Status(ctx); st.State != agent.Active || st.Activations != 1 {
		t.Fatalf("status after activation: %+v", st)
	}
	if _, err := conn.Launch(ctx, agent.LaunchRequest{Fence: act.Fence, Argv: []string{"sleep", "3600"}}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Minute)
	if _, err := conn.Exec(ctx, agent.ExecRequest{Fence: act.Fence, Argv: []string{"echo"}}, nil); !errors.Is(err, agent.ErrExpired) {
		t.Fatalf("exec after the TTL: %v", err)
	}
	if st, _ := conn.Status(ctx); st.State != agent.Ended {
		t.Fatalf("status after the TTL: %+v", st)
	}
	if err := conn.Activate(ctx, act); !errors.Is(err, agent.ErrExpired) {
		t.Fatalf("replay after the TTL: %v", err)
	}
}

// TestAgentCommandsAndFiles: the builtins, the output cap, files and
// launch.
func TestAgentCommandsAndFiles(t *testing.T) {
	ctx := context.Background()
	p := fake.NewWithAgent(fake.Config{Mode: driver.Apply})
	obj, conn := cell(t, p)
	act := activation(obj, uuid.NewString(), time.Hour)
	if err := conn.Activate(ctx, act); err != nil {
		t.Fatal(err)
	}
	run := func(req agent.ExecRequest) agent.ExecResult {
		t.Helper()
		req.Fence = act.Fence
		res, err := conn.Exec(ctx, req, nil)
		if err != nil {
			t.Fatalf("exec %q: %v", req.Argv, err)
		}
		return res
	}
	if res := run(agent.ExecRequest{Argv: []string{"cat"}, Stdin: []byte("in")}); string(res.Stdout) != "in" || res.Reason != agent.Exited {
		t.Fatalf("cat: %+v", res)
	}
	if res := run(agent.ExecRequest{Argv: []string{"exit", "7"}}); res.ExitCode != 7 {
		t.Fatalf("exit 7: %+v", res)
	}
	if res := run(agent.ExecRequest{Argv: []string{"nope"}}); res.ExitCode != 127 || len(res.Stderr) == 0 {
		t.Fatalf("unknown command: %+v", res)
	}
	if res := run(agent.ExecRequest{Argv: []string{"whoami"}, User: agent.UserRoot}); string(res.Stdout) != "root\n" {
		t.Fatalf("whoami: %+v", res)
	}
	if res := run(agent.ExecRequest{Argv: []string{"echo", "abc", "def"}, MaxOutput: 5}); string(res.Stdout) != "abc d" || !res.Truncated {
		t.Fatalf("echo over the cap: %+v", res)
	}
	if res := run(agent.ExecRequest{Argv: []string{"sleep", "10"}, TimeoutMillis: 5}); res.Reason != agent.TimedOut || res.ExitCode != 137 || res.Signal != "KILL" {
		t.Fatalf("sleep past its timeout: %+v", res)
	}
	var chunks []string
	if _, err := conn.Exec(ctx, agent.ExecRequest{Fence: act.Fence, Argv: []string{"echo", "a", "b"}}, func(o agent.Output) error {
		chunks = append(chunks, string(o.Data))
		return nil
	}); err != nil || strings.Join(chunks, "|") != "a |b\n" {
		t.Fatalf("streamed echo: %q %v", chunks, err)
	}

	info, err := conn.WriteFile(ctx, agent.WriteRequest{Fence: act.Fence, Path: "/home/cell/x"}, strings.NewReader("hello"))
	if err != nil || info.Size != 5 || info.SHA256 != "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824" {
		t.Fatalf("write: %+v %v", info, err)
	}
	rc, n, err := conn.ReadFile(ctx, agent.ReadRequest{Fence: act.Fence, Path: "/home/cell/x"})
	if err != nil || n != 5 {
		t.Fatalf("read: %d %v", n, err)
	}
	if b, _ := io.ReadAll(rc); string(b) != "hello" {
		t.Fatalf("read %q", b)
	}
	if _, _, err := conn.ReadFile(ctx, agent.ReadRequest{Fence: act.Fence, Path: "/home/cell/x", MaxBytes: 4}); !errors.Is(err, agent.ErrTooLarge) {
		t.Fatalf("read over max_bytes: %v", err)
	}
	if _, _, err := conn.ReadFile(ctx, agent.ReadRequest{Fence: act.Fence, Path: "/missing"}); !errors.Is(err, agent.ErrNotFound) {
		t.Fatalf("read a missing file: %v", err)
	}
	if _, err := conn.LaunchStatus(ctx, act.Fence); !errors.Is(err, agent.ErrNotLaunched) {
		t.Fatalf("status before a launch: %v", err)
	}
	spec := agent.LaunchRequest{Fence: act.Fence, Argv: []string{"exit", "4"}}
	if st, err := conn.Launch(ctx, spec); err != nil || st.Replay || st.Phase != agent.Running || st.PID == nil {
		t.Fatalf("launch: %+v %v", st, err)
	}
	if st, err := conn.Launch(ctx, spec); err != nil || !st.Replay {
		t.Fatalf("launch replay: %+v %v", st, err)
	}
	if _, err := conn.Launch(ctx, agent.LaunchRequest{Fence: act.Fence, Argv: []string{"exit", "5"}}); !errors.Is(err, agent.ErrConflict) {
		t.Fatalf("another launch: %v", err)
	}
	for {
		st, err := conn.LaunchStatus(ctx, act.Fence)
		if err != nil {
			t.Fatal(err)
		}
		if st.Phase == agent.Terminal {
			if *st.ExitCode != 4 || *st.Reason != agent.Exited {
				t.Fatalf("launch ended: %+v", st)
			}
			break
		}
		time.Sleep(time.Millisecond)
	}
	// Release joins agent.Conn with the agent's implementation.
	releaser := conn.(interface {
		Release(context.Context, agent.Fence) error
	})
	if err := releaser.Release(ctx, agent.Fence{CellID: obj.CellID.String(), LeaseID: "other", Generation: 2}); !errors.Is(err, agent.ErrFenceRefused) {
		t.Fatalf("release under another fence: %v", err)
	}
	for range 2 {
		if err := releaser.Release(ctx, act.Fence); err != nil {
			t.Fatalf("release: %v", err)
		}
	}
	if _, err := conn.Exec(ctx, agent.ExecRequest{Fence: act.Fence, Argv: []string{"echo"}}, nil); !errors.Is(err, agent.ErrExpired) {
		t.Fatalf("exec after release: %v", err)
	}
	if st, _ := conn.Status(ctx); st.State != agent.Ended {
		t.Fatalf("status after release: %+v", st)
	}
}

// TestAgentFaults: a vanished object's agent fails without an answer, a
// command running included; slow answers wait for the delay or the
// context; status and answers can be rewritten; every request is
// recorded.
func TestAgentFaults(t *testing.T) {
	ctx := context.Background()
	p := fake.NewWithAgent(fake.Config{Mode: driver.Apply})
	obj, conn := cell(t, p)
	act := activation(obj, uuid.NewString(), time.Hour)
	if err := conn.Activate(ctx, act); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.WriteFile(ctx, agent.WriteRequest{Fence: act.Fence, Path: "/f"}, strings.NewReader("file-content")); err != nil {
		t.Fatal(err)
	}
	p.SetAgentFaults(fake.AgentFaults{Answer: agent.ErrNoSpace, Status: func(s agent.Status) agent.Status { s.Digest = "x"; return s }})
	if _, err := conn.Exec(ctx, agent.ExecRequest{Fence: act.Fence, Argv: []string{"echo"}}, nil); !errors.Is(err, agent.ErrNoSpace) {
		t.Fatalf("exec with an injected answer: %v", err)
	}
	if st, _ := conn.Status(ctx); st.Digest != "x" {
		t.Fatalf("rewritten status: %+v", st)
	}
	p.SetAgentFaults(fake.AgentFaults{Delay: time.Hour})
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if _, err := conn.Status(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("slow status: %v", err)
	}
	p.SetAgentFaults(fake.AgentFaults{RefuseFence: true})
	if err := conn.Activate(ctx, act); !errors.Is(err, agent.ErrFenceRefused) {
		t.Fatalf("refused replay: %v", err)
	}
	p.SetAgentFaults(fake.AgentFaults{})

	done := make(chan error, 1)
	go func() {
		_, err := conn.Exec(ctx, agent.ExecRequest{Fence: act.Fence, Argv: []string{"sleep", "60"}, Stdin: []byte("stdin-bytes")}, nil)
		done <- err
	}()
	for len(p.Received()) == 0 || p.Received()[len(p.Received())-1].Op != "exec" {
		time.Sleep(time.Millisecond)
	}
	p.Vanish(obj.CellID)
	if err := <-done; !errors.Is(err, driver.ErrCellLost) || agent.IsAnswer(err) {
		t.Fatalf("exec when the object died: %v", err)
	}
	if _, err := conn.Status(ctx); !errors.Is(err, driver.ErrCellLost) || agent.IsAnswer(err) {
		t.Fatalf("status of a dead agent: %v", err)
	}
	if _, err := p.Agent(ctx, obj); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("agent of a vanished object: %v", err)
	}
	if obs, _ := p.Inspect(ctx, obj); obs.Exists {
		t.Fatalf("inspect after vanish: %+v", obs)
	}
	var ops []string
	var data [][]byte
	for _, m := range p.Received() {
		if m.CellID != obj.CellID {
			t.Fatalf("message of another cell: %+v", m)
		}
		ops = append(ops, m.Op)
		if len(m.Data) > 0 {
			data = append(data, m.Data)
		}
	}
	if got := strings.Join(ops, ","); got != "activate,write_file,exec,status,status,activate,exec,status" {
		t.Fatalf("received %s", got)
	}
	if len(data) != 2 || !bytes.Equal(data[0], []byte("file-content")) || !bytes.Equal(data[1], []byte("stdin-bytes")) {
		t.Fatalf("recorded data %q", data)
	}
}

// TestNewHasNoAgent: the plain provider (the binary's dry-run) runs no
// agent and has no exec.
func TestNewHasNoAgent(t *testing.T) {
	var p driver.Provider = fake.New(fake.Config{})
	if _, ok := p.(driver.AgentHost); ok {
		t.Fatal("fake.New is a driver.AgentHost")
	}
	if _, ok := p.(driver.Execer); ok {
		t.Fatal("fake.New is a driver.Execer")
	}
	obj, _ := p.Provision(context.Background(), driver.ProvisionRequest{CellID: uuid.New(), RuntimeClass: lease.GVisorLowerRisk})
	if obs, _ := p.Inspect(context.Background(), obj); obs.AgentDigest != "" {
		t.Fatalf("inspect: %+v", obs)
	}
}
