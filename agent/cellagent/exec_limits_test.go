package cellagent

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich/agent"
)

// TestExecArgLimits: an argv string or an env value the kernel would
// refuse (E2BIG: 128 KiB or more) is refused as an invalid request, an
// answer, and the agent goes on serving; what is within MaxArgBytes and
// MaxArgsBytes runs, so the limits the plane shares with the agent are
// ones the kernel accepts.
func TestExecArgLimits(t *testing.T) {
	requireRoot(t)
	for _, mode := range []string{"direct", "http"} {
		t.Run(mode, func(t *testing.T) {
			a, home := newAgent(t)
			var c agent.Conn = a
			if mode == "http" {
				c = serve(t, a)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			e := &env{t: t, a: a, c: c, home: home, ctx: ctx}
			e.activate(time.Hour)

			big := strings.Repeat("x", 200<<10)
			for name, req := range map[string]agent.ExecRequest{
				"a 200 KiB argument":         {Argv: []string{"echo", big}},
				"a 200 KiB env value":        {Argv: []string{"true"}, Env: map[string]string{"BIG": big}},
				"an argument of 128 KiB":     {Argv: []string{"echo", big[:128<<10]}},
				"an env entry of 128 KiB":    {Argv: []string{"true"}, Env: map[string]string{"BIG": big[:128<<10-len("BIG=")]}},
				"argv and env beyond 1 MiB":  {Argv: slicesOf(big[:agent.MaxArgBytes], 8), Env: map[string]string{"A": big[:64<<10]}},
				"a 200 KiB argument as root": {Argv: []string{"echo", big}, User: agent.UserRoot},
			} {
				req.Fence = testFence
				_, err := c.Exec(ctx, req, nil)
				wantCode(t, name, err, agent.ErrInvalid)
				if strings.Contains(err.Error(), "xxxx") {
					t.Fatalf("%s: the refusal repeats the input: %.200s", name, err)
				}
				if _, err := c.Exec(ctx, req, func(agent.Output) error { return nil }); !agent.IsAnswer(err) {
					t.Fatalf("%s, streamed: %v, want an answer", name, err)
				}
			}
			if _, err := c.Launch(ctx, agent.LaunchRequest{Fence: testFence, Argv: []string{"echo", big}}); !agent.IsAnswer(err) {
				t.Fatalf("a launch with a 200 KiB argument: %v, want an answer", err)
			}
			if res := e.exec(agent.ExecRequest{Argv: []string{"echo", "still", "here"}}); string(res.Stdout) != "still here\n" {
				t.Fatalf("echo after the refusals: %+v", res)
			}

			// At the limits: one argument and one env entry of MaxArgBytes,
			// and argv and env of MaxArgsBytes together.
			val := big[:agent.MaxArgBytes-len("BIG=")]
			res := e.exec(agent.ExecRequest{Argv: []string{"sh", "-c", `printf '%s %s' "${#1}" "${#BIG}"`, "_", big[:agent.MaxArgBytes]},
				Env: map[string]string{"BIG": val}})
			if want := strconv.Itoa(agent.MaxArgBytes) + " " + strconv.Itoa(len(val)); string(res.Stdout) != want || res.ExitCode != 0 {
				t.Fatalf("at MaxArgBytes: %q %+v, want %q", res.Stdout, res, want)
			}
			argv := []string{"sh", "-c", `echo $#`, "_"}
			used := 0
			for _, s := range argv {
				used += len(s)
			}
			args := slicesOf(big[:agent.MaxArgBytes], 7)
			used += 7 * agent.MaxArgBytes
			fill := agent.MaxArgsBytes - used - len("FILL=")
			res = e.exec(agent.ExecRequest{Argv: append(argv, args...), Env: map[string]string{"FILL": big[:fill]}})
			if string(res.Stdout) != "7\n" || res.ExitCode != 0 {
				t.Fatalf("at MaxArgsBytes: %+v", res)
			}
		})
	}
}

func slicesOf(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}
