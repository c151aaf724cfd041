package sandboxwich_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
)

// TestExecArgLimits: an argument or env value the kernel would refuse
// (128 KiB or more) is an invalid request refused by the plane, before
// anything reaches the cell, with the agent's own limits; the lease stays
// usable. Launch shares the limits.
func TestExecArgLimits(t *testing.T) {
	a := newAgentEnv(t)
	big := strings.Repeat("x", 200<<10)
	for name, req := range map[string]sandboxwich.ExecRequest{
		"a 200 KiB argument":          {Argv: []string{"echo", big}},
		"a 200 KiB env value":         {Argv: []string{"echo"}, Env: map[string]string{"BIG": big}},
		"an argument of 128 KiB":      {Argv: []string{"echo", big[:128<<10]}},
		"an env entry of 128 KiB":     {Argv: []string{"echo"}, Env: map[string]string{"BIG": big[:sandboxwich.MaxExecArgBytes-len("BIG")]}},
		"argv and env beyond the sum": {Argv: slices.Repeat([]string{big[:sandboxwich.MaxExecArgBytes]}, 8), Env: map[string]string{"A": big[:9]}},
	} {
		_, err := a.plane.Exec(a.ctx, "acme", a.id, a.claim.Proof(), req)
		if !errors.Is(err, errcode.ErrInvalidRequest) || errcode.CodeOf(err).HTTPStatus() != 422 {
			t.Fatalf("%s: %v, want 422 invalid_request", name, err)
		}
		if strings.Contains(err.Error(), "xxxx") {
			t.Fatalf("%s: the refusal repeats the input: %.200s", name, err)
		}
		if _, err := a.plane.ExecStream(a.ctx, "acme", a.id, a.claim.Proof(), req, func(sandboxwich.Output) error { return nil }); !errors.Is(err, errcode.ErrInvalidRequest) {
			t.Fatalf("%s, streamed: %v, want invalid_request", name, err)
		}
	}
	if _, _, err := a.plane.Launch(a.ctx, "acme", a.id, a.claim.Proof(), sandboxwich.LaunchRequest{Argv: []string{"echo", big}}); !errors.Is(err, errcode.ErrInvalidRequest) {
		t.Fatalf("launch with a 200 KiB argument: %v", err)
	}
	if n := a.ops()["exec"] + a.ops()["launch"]; n != 0 {
		t.Fatalf("%d refused requests reached the agent", n)
	}
	// At the limits the request goes through.
	at := big[:sandboxwich.MaxExecArgBytes]
	if res, err := a.exec("echo", at); err != nil || len(res.Stdout) != len(at)+1 {
		t.Fatalf("an argument of MaxExecArgBytes: %d bytes, %v", len(res.Stdout), err)
	}
	if res, err := a.exec("echo", "still", "here"); err != nil || string(res.Stdout) != "still here\n" {
		t.Fatalf("echo after the refusals: %+v %v", res, err)
	}
	if st, _ := a.plane.LeaseStatus(a.ctx, "acme", a.id); st.State != lease.Leased {
		t.Fatalf("the refusals ended the lease: %+v", st)
	}
}

// TestExecMaxOutput: an exec may ask for a cap of its own up to the
// ceiling; without one the plane's default holds.
func TestExecMaxOutput(t *testing.T) {
	a := newAgentEnv(t)
	if a.plane.ExecMaxOutput() != 1<<20 || a.plane.ExecMaxOutputCeiling() != 16<<20 {
		t.Fatalf("defaults: cap %d, ceiling %d", a.plane.ExecMaxOutput(), a.plane.ExecMaxOutputCeiling())
	}
	run := func(req sandboxwich.ExecRequest) (sandboxwich.ExecResult, int, error) {
		res, err := a.plane.Exec(a.ctx, "acme", a.id, a.claim.Proof(), req)
		var streamed int
		if err == nil {
			var sres sandboxwich.ExecResult
			sres, err = a.plane.ExecStream(a.ctx, "acme", a.id, a.claim.Proof(), req, func(o sandboxwich.Output) error {
				streamed += len(o.Data)
				return nil
			})
			if sres.Truncated != res.Truncated {
				t.Fatalf("truncated: collected %v, streamed %v", res.Truncated, sres.Truncated)
			}
		}
		return res, streamed, err
	}
	res, streamed, err := run(sandboxwich.ExecRequest{Argv: []string{"emit", "3145728"}, MaxOutput: 4 << 20})
	if err != nil || len(res.Stdout) != 3<<20 || streamed != 3<<20 || res.Truncated || bytes.Count(res.Stdout, []byte("x")) != 3<<20 {
		t.Fatalf("3 MiB with a cap of 4 MiB: %d bytes collected, %d streamed, truncated %v, %v", len(res.Stdout), streamed, res.Truncated, err)
	}
	res, streamed, err = run(sandboxwich.ExecRequest{Argv: []string{"emit", "3145728"}})
	if err != nil || len(res.Stdout) != 1<<20 || streamed != 1<<20 || !res.Truncated {
		t.Fatalf("3 MiB with the default cap: %d bytes collected, %d streamed, truncated %v, %v", len(res.Stdout), streamed, res.Truncated, err)
	}
	if got := a.plane.ExecOutputCap(sandboxwich.ExecRequest{}); got != 1<<20 {
		t.Fatalf("the cap without max_output_bytes: %d", got)
	}
	before := a.ops()["exec"]
	for _, n := range []int{16<<20 + 1, -1} {
		_, err := a.plane.Exec(a.ctx, "acme", a.id, a.claim.Proof(), sandboxwich.ExecRequest{Argv: []string{"echo"}, MaxOutput: n})
		if !errors.Is(err, errcode.ErrInvalidRequest) || errcode.CodeOf(err).HTTPStatus() != 422 || !strings.Contains(err.Error(), "16777216") {
			t.Fatalf("a cap of %d: %v, want 422 naming the ceiling", n, err)
		}
	}
	if a.ops()["exec"] != before {
		t.Fatal("a refused cap reached the agent")
	}
	// The agent was asked for the cap that applies.
	var asked []int
	for _, m := range a.prov.Received() {
		if m.Op == "exec" {
			asked = append(asked, maxOutputOf(t, m))
		}
	}
	if !slices.Equal(asked, []int{4 << 20, 4 << 20, 1 << 20, 1 << 20}) {
		t.Fatalf("caps sent to the agent: %v", asked)
	}
}

func maxOutputOf(t *testing.T, m fake.Message) int {
	t.Helper()
	var req agent.ExecRequest
	if err := json.Unmarshal(m.Body, &req); err != nil {
		t.Fatal(err)
	}
	return req.MaxOutput
}

// TestExecOutputCeilingOptions: the ceiling is at least the default cap,
// and at most what the agent takes.
func TestExecOutputCeilingOptions(t *testing.T) {
	e := newEnv(t, sandboxwich.WithExecMaxOutput(32<<20))
	if got := e.plane.ExecMaxOutputCeiling(); got != 32<<20 {
		t.Fatalf("the ceiling below a larger default cap: %d, want the cap", got)
	}
	e = newEnv(t, sandboxwich.WithExecMaxOutputCeiling(8<<20))
	if got := e.plane.ExecMaxOutputCeiling(); got != 8<<20 {
		t.Fatalf("ceiling: %d", got)
	}
	for _, opts := range [][]sandboxwich.Option{
		{sandboxwich.WithExecMaxOutputCeiling(1 << 10)},
		{sandboxwich.WithExecMaxOutputCeiling(-1)},
		{sandboxwich.WithExecMaxOutputCeiling(sandboxwich.MaxExecOutputLimit + 1)},
		{sandboxwich.WithExecMaxOutput(4 << 20), sandboxwich.WithExecMaxOutputCeiling(2 << 20)},
	} {
		if _, err := sandboxwich.New(e.st, e.keys, opts...); err == nil {
			t.Fatal("New accepted a ceiling out of bounds")
		}
	}
}

// logBuffer is a slog handler's destination safe for concurrent use.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestExecEndedByLeaseEnd: a release or revocation during an exec stops
// the cell under the command; the exec answers killed (exit 137, KILL),
// as at expiry, JSON and streamed, and the cell ends as the release asked
// — never quarantined as lost, and no cell_lost is logged.
func TestExecEndedByLeaseEnd(t *testing.T) {
	for _, how := range []string{"release", "revoke"} {
		for _, streamed := range []bool{false, true} {
			name := how
			if streamed {
				name += "/streamed"
			}
			t.Run(name, func(t *testing.T) {
				var logs logBuffer
				a := newAgentEnv(t, sandboxwich.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
				type answer struct {
					res sandboxwich.ExecResult
					err error
				}
				done := make(chan answer, 1)
				go func() {
					req := sandboxwich.ExecRequest{Argv: []string{"sleep", "60"}}
					var res sandboxwich.ExecResult
					var err error
					if streamed {
						res, err = a.plane.ExecStream(a.ctx, "acme", a.id, a.claim.Proof(), req, func(sandboxwich.Output) error {
							return nil
						})
					} else {
						res, err = a.plane.Exec(a.ctx, "acme", a.id, a.claim.Proof(), req)
					}
					done <- answer{res, err}
				}()
				for !slices.ContainsFunc(a.prov.Received(), func(m fake.Message) bool { return m.Op == "exec" }) {
					time.Sleep(time.Millisecond)
				}
				var err error
				if how == "release" {
					_, err = a.plane.Release(a.ctx, "acme", a.id, a.claim.Proof(), lease.Destroyed)
				} else {
					_, err = a.plane.Revoke(a.ctx, "acme", a.id, lease.Destroyed)
				}
				if err != nil {
					t.Fatal(err)
				}
				a.plane.Pools().Pass(a.ctx) // destroys the cell under the command
				ans := <-done
				if ans.err != nil || ans.res.Reason != sandboxwich.ReasonKilled || ans.res.ExitCode != 137 || ans.res.Signal != "KILL" || ans.res.TimedOut {
					t.Fatalf("exec during a %s: %+v %v, want reason killed", how, ans.res, ans.err)
				}
				a.plane.Pools().Pass(a.ctx)
				st, err := a.plane.LeaseStatus(a.ctx, "acme", a.id)
				if err != nil || st.State != lease.Destroyed || !st.ProviderAbsent {
					t.Fatalf("the cell after the %s: %+v %v, want destroyed", how, st, err)
				}
				if strings.Contains(logs.String(), "cell lost") || strings.Contains(logs.String(), "cell_lost") {
					t.Fatalf("a %s logged a lost cell:\n%s", how, logs.String())
				}
			})
		}
	}
}
