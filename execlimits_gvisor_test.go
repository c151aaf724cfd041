package sandboxwich_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/driver/gvisor"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
)

// TestExecLimitsInARealCell checks the exec limits and end reasons against
// a real gVisor cell, through the plane and, for the agent's own checks,
// straight to the cell's agent:
//
//   - an argument or env value of 200 KiB (which the cell's kernel refuses
//     with E2BIG) is 422 invalid_request from the plane, an invalid-request
//     answer from the agent itself, and the lease stays usable;
//   - an argument and an env entry of MaxExecArgBytes, and argv and env of
//     MaxExecArgsBytes together, run in the cell: the shared limits are
//     ones the cell's kernel accepts;
//   - 3 MiB of output with a cap of 4 MiB comes back whole, and cut at the
//     default 1 MiB without one;
//   - a release (JSON exec) or revocation (streamed exec) during a command
//     answers reason killed, and the cell ends destroyed, not quarantined.
func TestExecLimitsInARealCell(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var logs logBuffer
	g := startGVisorPlane(t, ctx, "limits", gvisor.Config{}, sandboxwich.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	plane, prov := g.Plane, g.prov
	claim := func() sandboxwich.ClaimResult { t.Helper(); return g.claim(ctx, t, binding) }

	res := claim()
	pr, id := res.Proof(), res.Lease.ID
	exec := func(req sandboxwich.ExecRequest) (sandboxwich.ExecResult, error) {
		req.Timeout = time.Minute
		return plane.Exec(ctx, "acme", id, pr, req)
	}
	big := strings.Repeat("x", 200<<10)
	for name, req := range map[string]sandboxwich.ExecRequest{
		"a 200 KiB argument":  {Argv: []string{"echo", big}},
		"a 200 KiB env value": {Argv: []string{"true"}, Env: map[string]string{"BIG": big}},
	} {
		if _, err := exec(req); !errors.Is(err, errcode.ErrInvalidRequest) || errcode.CodeOf(err).HTTPStatus() != 422 {
			t.Fatalf("%s through the plane: %v, want 422 invalid_request", name, err)
		}
	}
	// The agent in the cell refuses them itself, as an answer.
	conn := cellAgent(ctx, t, prov, res.Lease.CellID)
	fence := agent.Fence{CellID: res.Lease.CellID.String(), LeaseID: id.String(), Generation: int64(res.Lease.Generation)}
	if _, err := exec(sandboxwich.ExecRequest{Argv: []string{"true"}}); err != nil { // activates the agent
		t.Fatal(err)
	}
	for name, req := range map[string]agent.ExecRequest{
		"a 200 KiB argument":  {Fence: fence, Argv: []string{"echo", big}},
		"a 200 KiB env value": {Fence: fence, Argv: []string{"true"}, Env: map[string]string{"BIG": big}},
	} {
		if _, err := conn.Exec(ctx, req, nil); !errors.Is(err, agent.ErrInvalid) || !agent.IsAnswer(err) {
			t.Fatalf("%s straight to the cell's agent: %v, want its invalid_request answer", name, err)
		}
	}
	// At the limits: they run in the cell.
	val := big[:sandboxwich.MaxExecArgBytes-len("BIG=")]
	r, err := exec(sandboxwich.ExecRequest{Argv: []string{"sh", "-c", `printf '%s %s' "${#1}" "${#BIG}"`, "_", big[:sandboxwich.MaxExecArgBytes]},
		Env: map[string]string{"BIG": val}})
	if want := strconv.Itoa(sandboxwich.MaxExecArgBytes) + " " + strconv.Itoa(len(val)); err != nil || string(r.Stdout) != want {
		t.Fatalf("at MaxExecArgBytes: %q %+v %v, want %q", r.Stdout, r, err, want)
	}
	argv := []string{"sh", "-c", `echo $#`, "_"}
	used := len("sh") + len("-c") + len(`echo $#`) + len("_") + 7*sandboxwich.MaxExecArgBytes
	for range 7 {
		argv = append(argv, big[:sandboxwich.MaxExecArgBytes])
	}
	r, err = exec(sandboxwich.ExecRequest{Argv: argv, Env: map[string]string{"FILL": big[:sandboxwich.MaxExecArgsBytes-used-len("FILL=")]}})
	if err != nil || string(r.Stdout) != "7\n" {
		t.Fatalf("at MaxExecArgsBytes: %q %v", r.Stdout, err)
	}
	// The output cap.
	three := sandboxwich.ExecRequest{Argv: []string{"head", "-c", "3145728", "/dev/zero"}}
	three.MaxOutput = 4 << 20
	if r, err := exec(three); err != nil || len(r.Stdout) != 3<<20 || r.Truncated {
		t.Fatalf("3 MiB with a cap of 4 MiB: %d bytes, truncated %v, %v", len(r.Stdout), r.Truncated, err)
	}
	three.MaxOutput = 0
	if r, err := exec(three); err != nil || len(r.Stdout) != 1<<20 || !r.Truncated {
		t.Fatalf("3 MiB with the default cap: %d bytes, truncated %v, %v", len(r.Stdout), r.Truncated, err)
	}
	if r, err := exec(sandboxwich.ExecRequest{Argv: []string{"echo", "still", "here"}}); err != nil || string(r.Stdout) != "still here\n" {
		t.Fatalf("echo after it all: %q %v", r.Stdout, err)
	}
	if st, _ := plane.LeaseStatus(ctx, "acme", id); st.State != lease.Leased {
		t.Fatalf("the lease after it all: %+v", st)
	}

	// A release, then a revocation, during a command.
	for _, how := range []string{"release", "revoke"} {
		if how == "revoke" {
			res = claim()
			pr, id = res.Proof(), res.Lease.ID
		}
		type answer struct {
			res sandboxwich.ExecResult
			err error
		}
		ans := make(chan answer, 1)
		started := make(chan struct{})
		go func() {
			req := sandboxwich.ExecRequest{Argv: []string{"sh", "-c", "echo started; touch /tmp/started; sleep 60"}, Timeout: 2 * time.Minute}
			var r sandboxwich.ExecResult
			var err error
			if how == "release" {
				go func() { // a second exec sees the first one run
					for ctx.Err() == nil {
						if r, err := plane.Exec(ctx, "acme", id, pr, sandboxwich.ExecRequest{Argv: []string{"test", "-f", "/tmp/started"}}); err == nil && r.ExitCode == 0 {
							close(started)
							return
						}
						time.Sleep(20 * time.Millisecond)
					}
				}()
				r, err = plane.Exec(ctx, "acme", id, pr, req)
			} else {
				once := false
				r, err = plane.ExecStream(ctx, "acme", id, pr, req, func(o sandboxwich.Output) error {
					if !once && bytes.Contains(o.Data, []byte("started")) {
						once = true
						close(started)
					}
					return nil
				})
			}
			ans <- answer{r, err}
		}()
		select {
		case <-started:
		case a := <-ans:
			t.Fatalf("the command ended before the %s: %+v %v", how, a.res, a.err)
		}
		if how == "release" {
			_, err = plane.Release(ctx, "acme", id, pr, lease.Destroyed)
		} else {
			_, err = plane.Revoke(ctx, "acme", id, lease.Destroyed)
		}
		if err != nil {
			t.Fatal(err)
		}
		a := <-ans
		if a.err != nil || a.res.Reason != sandboxwich.ReasonKilled || a.res.ExitCode != 137 || a.res.Signal != "KILL" {
			t.Fatalf("exec during a %s: %+v %v, want reason killed", how, a.res, a.err)
		}
		st, err := plane.WaitProviderAbsent(ctx, "acme", id, 50*time.Millisecond)
		if err != nil || st.State != lease.Destroyed {
			t.Fatalf("the cell after the %s: %+v %v, want destroyed", how, st, err)
		}
	}
	if strings.Contains(logs.String(), "cell lost") {
		t.Fatalf("a release or revocation logged a lost cell:\n%s", logs.String())
	}
}

// cellAgent returns a connection to the agent of cell's object, found by
// the provider's own listing.
func cellAgent(ctx context.Context, t *testing.T, prov *gvisor.Provider, cell uuid.UUID) agent.Conn {
	t.Helper()
	objs, err := prov.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.CellID == cell {
			c, err := prov.Agent(ctx, o)
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
	}
	t.Fatalf("no object for cell %s", cell)
	return nil
}
