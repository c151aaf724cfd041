package httpapi

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
	"github.com/sandboxwich/sandboxwich/wire"
)

// hookedProvider is the fake provider whose cells run the fake agent, with
// a hook that can replace what an agent does: the scripted answers the
// fake agent's builtins cannot give (output held until the test reads it,
// failures after output, content counted instead of kept).
type hookedProvider struct {
	*fake.AgentProvider
	mu   sync.Mutex
	hook *connHook
}

// connHook replaces some of an agent's calls; nil fields keep the fake
// agent's.
type connHook struct {
	exec  func(ctx context.Context, req agent.ExecRequest, out func(agent.Output) error) (agent.ExecResult, error)
	write func(ctx context.Context, req agent.WriteRequest, content io.Reader) (agent.FileInfo, error)
	read  func(ctx context.Context, req agent.ReadRequest) (io.ReadCloser, int64, error)
}

func (p *hookedProvider) setHook(h *connHook) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hook = h
}

func (p *hookedProvider) Agent(ctx context.Context, obj driver.Object) (agent.Conn, error) {
	c, err := p.AgentProvider.Agent(ctx, obj)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hook == nil {
		return c, nil
	}
	return hookedConn{Conn: c, h: p.hook}, nil
}

type hookedConn struct {
	agent.Conn
	h *connHook
}

func (c hookedConn) Exec(ctx context.Context, req agent.ExecRequest, out func(agent.Output) error) (agent.ExecResult, error) {
	if c.h.exec != nil {
		return c.h.exec(ctx, req, out)
	}
	return c.Conn.Exec(ctx, req, out)
}

func (c hookedConn) WriteFile(ctx context.Context, req agent.WriteRequest, content io.Reader) (agent.FileInfo, error) {
	if c.h.write != nil {
		return c.h.write(ctx, req, content)
	}
	return c.Conn.WriteFile(ctx, req, content)
}

func (c hookedConn) ReadFile(ctx context.Context, req agent.ReadRequest) (io.ReadCloser, int64, error) {
	if c.h.read != nil {
		return c.h.read(ctx, req)
	}
	return c.Conn.ReadFile(ctx, req)
}

// agentEnv is a test server whose pool p1 (tenant acme) runs the fake
// agent in every cell.
type agentEnv struct {
	*env
	prov *hookedProvider
}

// newAgentEnv starts the server with n ready pool cells.
func newAgentEnv(t *testing.T, b backend, n int, mods ...func(*Config)) *agentEnv {
	t.Helper()
	prov := &hookedProvider{AgentProvider: fake.NewWithAgent(fake.Config{Mode: driver.Apply, Kind: "fake"})}
	e := newEnvWith(t, b, []sandboxwich.Option{sandboxwich.WithPools(pool.Config{
		Name: "p1", TenantID: "acme", Release: signedRelease(t, lease.GVisorLowerRisk), Target: n, Provider: prov,
	})}, mods...)
	e.plane.Pools().Pass(context.Background())
	return &agentEnv{env: e, prov: prov}
}

// lease claims one of the pool's cells.
func (a *agentEnv) lease() wire.ClaimResponse {
	a.t.Helper()
	c := a.claim(tokAcme, nil, lease.GVisorLowerRisk)
	if c.Lease == nil {
		a.t.Fatal("no pool cell was leased")
	}
	return c
}

// ops counts the requests the agents received, by operation.
func (a *agentEnv) ops() map[string]int {
	n := map[string]int{}
	for _, m := range a.prov.Received() {
		n[m.Op]++
	}
	return n
}

func (a *agentEnv) state(c wire.ClaimResponse) lease.State {
	a.t.Helper()
	return decodeAs[wire.StatusResponse](a.t, a.do("GET", leasePath(c.Lease.LeaseID, ""), tokAcme, nil).must(a.t, 200)).Status.State
}

// open sends a request and returns the response with its body unread.
func (e *env) open(method, path, token, contentType string, body io.Reader, hdr ...string) *http.Response {
	e.t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, body)
	if err != nil {
		e.t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = res.Body.Close() })
	return res
}

// stream starts a streamed exec.
func (e *env) stream(c wire.ClaimResponse, req map[string]any, hdr ...string) *http.Response {
	e.t.Helper()
	b, err := json.Marshal(req)
	if err != nil {
		e.t.Fatal(err)
	}
	return e.open("POST", leasePath(c.Lease.LeaseID, "/exec"), tokAcme, "application/json", bytes.NewReader(b),
		append([]string{"Accept", "text/event-stream"}, hdr...)...)
}

// sse reads an event stream strictly: every event is exactly an event line
// and a data line, every comment the keep-alive line, each followed by a
// blank line.
type sse struct {
	t  *testing.T
	br *bufio.Reader
}

type sseEvent struct {
	name, data string // name "" is a keep-alive comment
}

func newSSE(t *testing.T, res *http.Response) *sse {
	t.Helper()
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "text/event-stream" || res.Header.Get("Cache-Control") != "no-store" {
		b, _ := io.ReadAll(res.Body)
		t.Fatalf("stream answer %d %v: %s", res.StatusCode, res.Header, b)
	}
	return &sse{t: t, br: bufio.NewReader(res.Body)}
}

// next returns the next event or comment; ok is false at the end of the
// stream.
func (s *sse) next() (ev sseEvent, ok bool) {
	s.t.Helper()
	line, err := s.br.ReadString('\n')
	if errors.Is(err, io.EOF) && line == "" {
		return sseEvent{}, false
	}
	if err != nil {
		s.t.Fatalf("read stream: %q %v", line, err)
	}
	if line == keepAliveComment[:len(keepAliveComment)-1] {
		s.blank()
		return sseEvent{}, true
	}
	name, ok := strings.CutPrefix(line, "event: ")
	if !ok {
		s.t.Fatalf("stream line %q, want an event or a keep-alive", line)
	}
	data, err := s.br.ReadString('\n')
	if err != nil || !strings.HasPrefix(data, "data: ") {
		s.t.Fatalf("after %q: %q %v, want a data line", line, data, err)
	}
	s.blank()
	return sseEvent{name: strings.TrimSuffix(name, "\n"), data: strings.TrimSuffix(strings.TrimPrefix(data, "data: "), "\n")}, true
}

func (s *sse) blank() {
	s.t.Helper()
	if l, err := s.br.ReadString('\n'); l != "\n" || err != nil {
		s.t.Fatalf("want a blank line, got %q %v", l, err)
	}
}

// event returns the next event, skipping keep-alives.
func (s *sse) event() sseEvent {
	s.t.Helper()
	for {
		ev, ok := s.next()
		if !ok {
			s.t.Fatal("the stream ended")
		}
		if ev.name != "" {
			return ev
		}
	}
}

// end checks that only keep-alives are left.
func (s *sse) end() {
	s.t.Helper()
	for {
		ev, ok := s.next()
		if !ok {
			return
		}
		if ev.name != "" {
			s.t.Fatalf("event %s %s after the stream's last event", ev.name, ev.data)
		}
	}
}

func outputEvent(t *testing.T, ev sseEvent, name, data string) {
	t.Helper()
	checkSchema(t, "ExecOutput", []byte(ev.data))
	want := `{"data_base64":"` + base64.StdEncoding.EncodeToString([]byte(data)) + `"}`
	if ev.name != name || ev.data != want {
		t.Fatalf("event %s %s, want %s %s", ev.name, ev.data, name, want)
	}
}

// step is a point a scripted agent waits at until the test lets it go.
type step chan struct{}

func (s step) wait(ctx context.Context) error {
	select {
	case <-s:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(20 * time.Second):
		return errors.New("timed out waiting for the other side (was the output flushed, the content streamed?)")
	}
}

// TestExecV2: the JSON exec's new fields reach the agent (cwd, user) and
// come back (timed_out, signal, reason); 1 MiB of stdin fits in the 2 MiB
// body; Idempotency-Key replays without running the command again.
func TestExecV2(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		a := newAgentEnv(t, b, 1)
		c := a.lease()
		path := leasePath(c.Lease.LeaseID, "/exec")
		exec := func(kv ...any) wire.ExecResponse {
			r := a.do("POST", path, tokAcme, with(proofBody(c), kv...)).must(t, 200)
			checkSchema(t, "ExecResponse", r.body)
			return decodeAs[wire.ExecResponse](t, r)
		}
		out := func(r wire.ExecResponse) string {
			res, err := base64.StdEncoding.DecodeString(r.StdoutBase64)
			if err != nil {
				t.Fatal(err)
			}
			return string(res)
		}
		if r := exec("argv", []string{"pwd"}, "cwd", "/srv/work"); out(r) != "/srv/work\n" || r.Reason != "exited" || r.Signal != nil || r.TimedOut {
			t.Errorf("pwd in /srv/work: %+v", r)
		}
		if r := exec("argv", []string{"whoami"}, "user", "root"); out(r) != "root\n" {
			t.Errorf("whoami as root: %q", out(r))
		}
		if r := exec("argv", []string{"exit", "3"}); r.ExitCode != 3 || r.Reason != "exited" {
			t.Errorf("exit 3: %+v", r)
		}
		r := exec("argv", []string{"sleep", "30"}, "timeout_seconds", 1)
		if r.ExitCode != 137 || !r.TimedOut || r.Signal == nil || *r.Signal != "KILL" || r.Reason != "timed_out" {
			t.Errorf("sleep past its timeout: %+v", r)
		}

		stdin := bytes.Repeat([]byte{0xa5, 'x', 0}, (1<<20)/3)
		stdin = append(stdin, make([]byte, 1<<20-len(stdin))...)
		if r := exec("argv", []string{"cat"}, "stdin_base64", base64.StdEncoding.EncodeToString(stdin)); out(r) != string(stdin) || r.Truncated {
			t.Errorf("1 MiB of stdin: %d bytes back, truncated %v", len(out(r)), r.Truncated)
		}
		big := with(proofBody(c), "argv", []string{"cat"}, "pad", strings.Repeat("x", MaxExecBodyBytes))
		a.do("POST", path, tokAcme, big).errCode(t, 413, "payload_too_large")

		for name, body := range map[string]map[string]any{
			"unknown user":  with(proofBody(c), "argv", []string{"id"}, "user", "admin"),
			"relative cwd":  with(proofBody(c), "argv", []string{"id"}, "cwd", "tmp"),
			"cwd with NUL":  with(proofBody(c), "argv", []string{"id"}, "cwd", "/tmp\x00"),
			"cwd not text":  with(proofBody(c), "argv", []string{"id"}, "cwd", 7),
			"empty argv[0]": with(proofBody(c), "argv", []string{""}),
		} {
			t.Run(name, func(t *testing.T) { a.do("POST", path, tokAcme, body).errCode(t, 422, "invalid_request") })
		}

		// A replay answers the stored answer; the agent ran the command once.
		before := a.ops()["exec"]
		body := with(proofBody(c), "argv", []string{"echo", "once"})
		r1 := a.do("POST", path, tokAcme, body, idemHeader, "exec-v2").must(t, 200)
		r2 := a.do("POST", path, tokAcme, body, idemHeader, "exec-v2").must(t, 200)
		if !bytes.Equal(r1.body, r2.body) || a.ops()["exec"] != before+1 {
			t.Errorf("replay %s vs %s; the agent ran %d execs", r1.body, r2.body, a.ops()["exec"]-before)
		}
	})
}

// TestExecStoredAnswerCapped: an idempotency record keeps at most 1 MiB of
// each stream, marked truncated; the answer itself is whole.
func TestExecStoredAnswerCapped(t *testing.T) {
	res := sandboxwich.ExecResult{ExitCode: 0, Stdout: bytes.Repeat([]byte("o"), maxStoredExecStream+5), Stderr: []byte("e"), Reason: sandboxwich.ReasonExited}
	if (execAnswer{res: res, outCap: 2 << 20}).storedForm() == nil {
		t.Fatal("an answer over the cap is stored whole")
	}
	stored := execAnswer{res: res, outCap: 2 << 20}.storedForm().(wire.ExecResponse)
	out, _ := base64.StdEncoding.DecodeString(stored.StdoutBase64)
	if len(out) != maxStoredExecStream || !stored.Truncated || stored.StderrBase64 != "ZQ==" {
		t.Errorf("stored stdout %d bytes, truncated %v, stderr %s", len(out), stored.Truncated, stored.StderrBase64)
	}
	whole, err := json.Marshal(execAnswer{res: res, outCap: 2 << 20})
	if err != nil || !bytes.Contains(whole, []byte(base64.StdEncoding.EncodeToString(res.Stdout))) || bytes.Contains(whole, []byte(`"truncated":true`)) {
		t.Errorf("the answer itself was cut: %v", err)
	}
	small := sandboxwich.ExecResult{Stdout: []byte("x")}
	if (execAnswer{res: small, outCap: 1 << 20}).storedForm() != nil {
		t.Error("an answer under the cap is not stored as sent")
	}
}

// TestExecStreamFraming: output events come in the order produced, each
// flushed before the next is produced, then exactly one exit event whose
// data is the answer without output.
func TestExecStreamFraming(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		a := newAgentEnv(t, b, 1)
		c := a.lease()
		acks := []step{make(step), make(step), make(step)}
		chunks := []agent.Output{{Stream: agent.Stdout, Data: []byte("one\n")}, {Stream: agent.Stderr, Data: []byte("two\x00")},
			{Stream: agent.Stdout, Data: []byte("three")}}
		a.prov.setHook(&connHook{exec: func(ctx context.Context, req agent.ExecRequest, out func(agent.Output) error) (agent.ExecResult, error) {
			for i, o := range chunks {
				if err := out(o); err != nil {
					return agent.ExecResult{}, err
				}
				if err := acks[i].wait(ctx); err != nil {
					return agent.ExecResult{}, err
				}
			}
			return agent.ExecResult{ExitCode: 5, Reason: agent.Exited, Truncated: true, DurationMillis: 42}, nil
		}})
		s := newSSE(t, a.stream(c, with(proofBody(c), "argv", []string{"anything"})))
		for i, o := range chunks {
			outputEvent(t, s.event(), string(o.Stream), string(o.Data))
			close(acks[i]) // the agent produces the next chunk only now
		}
		ev := s.event()
		checkSchema(t, "ExecExit", []byte(ev.data))
		want := `{"ok":true,"exit_code":5,"truncated":true,"max_output_bytes":1048576,"duration_ms":42,"timed_out":false,"signal":null,"reason":"exited"}`
		if ev.name != "exit" || ev.data != want {
			t.Errorf("last event %s %s, want exit %s", ev.name, ev.data, want)
		}
		s.end()
		mustNotContain(t, "logs", a.logs.String(), *c.LeaseAttestation)
	})
}

// TestExecStreamKeepAlive: a command that produces nothing still gets
// keep-alive comments at the configured interval, and the stream is
// committed by the first one.
func TestExecStreamKeepAlive(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		a := newAgentEnv(t, b, 1, func(cfg *Config) { cfg.StreamKeepAlive = 10 * time.Millisecond })
		c := a.lease()
		goOn := make(step)
		a.prov.setHook(&connHook{exec: func(ctx context.Context, req agent.ExecRequest, out func(agent.Output) error) (agent.ExecResult, error) {
			if err := goOn.wait(ctx); err != nil {
				return agent.ExecResult{}, err
			}
			return agent.ExecResult{ExitCode: 0, Reason: agent.Exited}, out(agent.Output{Stream: agent.Stdout, Data: []byte("late")})
		}})
		s := newSSE(t, a.stream(c, with(proofBody(c), "argv", []string{"quiet"})))
		for range 2 {
			if ev, ok := s.next(); !ok || ev.name != "" {
				t.Fatalf("before any output: %+v %v, want keep-alives", ev, ok)
			}
		}
		close(goOn)
		outputEvent(t, s.event(), "stdout", "late")
		if ev := s.event(); ev.name != "exit" {
			t.Fatalf("event %s %s, want exit", ev.name, ev.data)
		}
		s.end()
	})
}

// TestExecStreamFailures: a failure before the stream is committed is an
// ordinary JSON error; one after the command started is an error event
// and no exit, a cell that died included.
func TestExecStreamFailures(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		a := newAgentEnv(t, b, 3)
		c := a.lease()
		jsonError := func(res *http.Response, status int, code string) {
			t.Helper()
			body, _ := io.ReadAll(res.Body)
			resp{status: res.StatusCode, header: res.Header, body: body}.errCode(t, status, code)
		}
		jsonError(a.stream(c, with(proofBody(c), "argv", []string{""})), 422, "invalid_request")
		jsonError(a.stream(c, with(proofBody(c), "argv", []string{"id"}, "lease_attestation", "swla1_wrong")), 409, "conflict")
		other := c
		other.Lease = &wire.Lease{LeaseID: uuid.Must(uuid.NewV7())}
		jsonError(a.stream(other, with(proofBody(c), "argv", []string{"id"})), 404, "not_found")

		// The agent refuses the fence after the command produced output:
		// an error event, the cell ended.
		a.prov.setHook(&connHook{exec: func(ctx context.Context, req agent.ExecRequest, out func(agent.Output) error) (agent.ExecResult, error) {
			if err := out(agent.Output{Stream: agent.Stdout, Data: []byte("partial")}); err != nil {
				return agent.ExecResult{}, err
			}
			return agent.ExecResult{}, agent.Errorf(agent.CodeFenceRefused, "another fence")
		}})
		s := newSSE(t, a.stream(c, with(proofBody(c), "argv", []string{"id"})))
		outputEvent(t, s.event(), "stdout", "partial")
		ev := s.event()
		checkSchema(t, "StreamError", []byte(ev.data))
		var se wire.StreamError
		if err := json.Unmarshal([]byte(ev.data), &se); err != nil || ev.name != "error" || se.Code != "cell_agent_unverified" || se.Message == "" {
			t.Fatalf("event %s %s, want an error event cell_agent_unverified", ev.name, ev.data)
		}
		s.end()
		if st := a.state(c); st != lease.Quarantined {
			t.Errorf("the cell is %s after its agent refused the fence", st)
		}

		// A cell whose agent stops answering mid-command is lost: an error
		// event (conflict: the lease is over), the cell quarantined.
		c2 := a.lease()
		a.prov.setHook(&connHook{exec: func(ctx context.Context, req agent.ExecRequest, out func(agent.Output) error) (agent.ExecResult, error) {
			if out != nil {
				if err := out(agent.Output{Stream: agent.Stderr, Data: []byte("dying")}); err != nil {
					return agent.ExecResult{}, err
				}
			}
			return agent.ExecResult{}, errors.New("the channel broke")
		}})
		s = newSSE(t, a.stream(c2, with(proofBody(c2), "argv", []string{"id"})))
		outputEvent(t, s.event(), "stderr", "dying")
		if ev := s.event(); ev.name != "error" || !strings.HasPrefix(ev.data, `{"code":"conflict","message":"the cell died`) {
			t.Fatalf("event %s %s, want an error event conflict", ev.name, ev.data)
		}
		s.end()
		if st := a.state(c2); st != lease.Quarantined {
			t.Errorf("the lost cell is %s", st)
		}
		// The same as a JSON answer.
		c3 := a.lease()
		a.do("POST", leasePath(c3.Lease.LeaseID, "/exec"), tokAcme, with(proofBody(c3), "argv", []string{"id"})).errCode(t, 409, "conflict")
		if st := a.state(c3); st != lease.Quarantined {
			t.Errorf("the lost cell is %s", st)
		}
	})
}

// TestIdempotencyKeyRefusedOnStreams: a streamed exec and the file routes
// refuse an Idempotency-Key, from every principal, before anything reaches
// the cell; a blank one counts as absent.
func TestIdempotencyKeyRefusedOnStreams(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		a := newAgentEnv(t, b, 1)
		c := a.lease()
		before := a.ops()
		exec := with(proofBody(c), "argv", []string{"echo", "x"})
		for _, hdr := range [][]string{{idemHeader, "k1"}, {idemHeader, "k2", wire.OperatorHeader, tokOperator}, {idemHeader, strings.Repeat("k", 200)}} {
			res := a.stream(c, exec, hdr...)
			body, _ := io.ReadAll(res.Body)
			resp{status: res.StatusCode, header: res.Header, body: body}.errCode(t, 400, "invalid_idempotency_key")
			a.do("POST", leasePath(c.Lease.LeaseID, "/files/read"), tokAcme, with(proofBody(c), "path", "/x"), hdr...).
				errCode(t, 400, "invalid_idempotency_key")
			w := a.upload(c, map[string]any{"path": "/x"}, strings.NewReader("data"), hdr...)
			w.errCode(t, 400, "invalid_idempotency_key")
		}
		after := a.ops()
		for _, op := range []string{"exec", "read_file", "write_file"} {
			if after[op] != before[op] {
				t.Errorf("%s reached the agent %d times", op, after[op]-before[op])
			}
		}
		s := newSSE(t, a.stream(c, exec, idemHeader, "  "))
		outputEvent(t, s.event(), "stdout", "x\n")
	})
}

// TestLaunch: 202 the first time, 200 with the status for an exact replay,
// 409 for another spec; the status route follows the workload to its end;
// its output is readable as a file; an Idempotency-Key replays the 202.
func TestLaunch(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		a := newAgentEnv(t, b, 2)
		c := a.lease()
		path := leasePath(c.Lease.LeaseID, "/launch")
		a.do("GET", path, tokAcme, nil).errCode(t, 404, "not_found")
		spec := with(proofBody(c), "argv", []string{"echo", "resident"}, "cwd", "/srv", "env", map[string]string{"A": "1"})
		r := a.do("POST", path, tokAcme, spec).must(t, 202)
		checkSchema(t, "LaunchResponse", r.body)
		var l wire.Launch
		for deadline := time.Now().Add(10 * time.Second); ; {
			r := a.do("GET", path, tokAcme, nil).must(t, 200)
			checkSchema(t, "LaunchResponse", r.body)
			if l = decodeAs[wire.LaunchResponse](t, r).Launch; l.Phase == "terminal" || time.Now().After(deadline) {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		if l.Phase != "terminal" || l.ExitCode == nil || *l.ExitCode != 0 || l.Reason == nil || *l.Reason != "exited" || l.Signal != nil || l.PID == nil {
			t.Fatalf("launch status %+v", l)
		}
		replay := a.do("POST", path, tokAcme, spec).must(t, 200)
		if got := decodeAs[wire.LaunchResponse](t, replay).Launch; got.Phase != "terminal" || *got.ExitCode != 0 {
			t.Errorf("replay answered %s", replay.body)
		}
		a.do("POST", path, tokAcme, with(spec, "argv", []string{"echo", "other"})).errCode(t, 409, "conflict")
		a.do("POST", path, tokAcme, with(spec, "user", "nobody")).errCode(t, 422, "invalid_request")
		a.do("POST", path, tokAcme, without(spec, "argv")).errCode(t, 422, "invalid_request")
		a.do("GET", path, tokGlobex, nil).errCode(t, 404, "not_found")
		rd := a.do("POST", leasePath(c.Lease.LeaseID, "/files/read"), tokAcme, with(proofBody(c), "path", "/home/cell/.launch/stdout")).must(t, 200)
		if string(rd.body) != "resident\n" {
			t.Errorf("the launch's stdout file holds %q", rd.body)
		}

		c2 := a.lease()
		before := a.ops()["launch"]
		spec2 := with(proofBody(c2), "argv", []string{"sleep", "0"})
		r1 := a.do("POST", leasePath(c2.Lease.LeaseID, "/launch"), tokAcme, spec2, idemHeader, "launch-1").must(t, 202)
		r2 := a.do("POST", leasePath(c2.Lease.LeaseID, "/launch"), tokAcme, spec2, idemHeader, "launch-1").must(t, 202)
		if !bytes.Equal(r1.body, r2.body) || a.ops()["launch"] != before+1 {
			t.Errorf("Idempotency-Key replay %s vs %s, %d launches reached the agent", r1.body, r2.body, a.ops()["launch"]-before)
		}
	})
}

// upload sends a file write: a proof part with the lease fence and extra
// fields, then the content part.
func (a *agentEnv) upload(c wire.ClaimResponse, proof map[string]any, content io.Reader, hdr ...string) resp {
	a.t.Helper()
	body, ct := multipartBody(a.t, with(proofBody(c), flatten(proof)...), content)
	res := a.open("POST", leasePath(c.Lease.LeaseID, "/files/write"), tokAcme, ct, body, hdr...)
	b, err := io.ReadAll(res.Body)
	if err != nil {
		a.t.Fatal(err)
	}
	return resp{status: res.StatusCode, header: res.Header, body: b}
}

func flatten(m map[string]any) []any {
	var kv []any
	for k, v := range m {
		kv = append(kv, k, v)
	}
	return kv
}

// multipartBody streams a file write body through a pipe: the proof part,
// then content as it is read.
func multipartBody(t *testing.T, proof map[string]any, content io.Reader) (io.Reader, string) {
	t.Helper()
	pj, err := json.Marshal(proof)
	if err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		w, err := mw.CreatePart(textproto.MIMEHeader{"Content-Disposition": {`form-data; name="proof"`}, "Content-Type": {"application/json"}})
		if err == nil {
			_, err = w.Write(pj)
		}
		if err == nil {
			w, err = mw.CreateFormFile("content", "f")
		}
		if err == nil {
			_, err = io.Copy(w, content)
		}
		if err == nil {
			err = mw.Close()
		}
		pw.CloseWithError(err)
	}()
	return pr, mw.FormDataContentType()
}

// TestFiles: a file written through multipart reads back byte for byte
// with its Content-Length; mode and user reach the agent.
func TestFiles(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		a := newAgentEnv(t, b, 1)
		c := a.lease()
		data := make([]byte, 300<<10)
		for i := range data {
			data[i] = byte(i*7 + i>>9)
		}
		r := a.upload(c, map[string]any{"path": "/srv/data/blob.bin", "mode": "0755", "user": "root"}, bytes.NewReader(data)).must(t, 200)
		checkSchema(t, "FileWriteResponse", r.body)
		sum := sha256.Sum256(data)
		want := `{"ok":true,"path":"/srv/data/blob.bin","size":` + strconv.Itoa(len(data)) + `,"sha256":"` + hex.EncodeToString(sum[:]) + `"}`
		if string(r.body) != want {
			t.Errorf("write answered %s, want %s", r.body, want)
		}
		var got agent.WriteRequest
		for _, m := range a.prov.Received() {
			if m.Op == "write_file" {
				_ = json.Unmarshal(m.Body, &got)
			}
		}
		if got.Mode != 0o755 || got.User != agent.UserRoot || got.Path != "/srv/data/blob.bin" {
			t.Errorf("the agent was asked to write %+v", got)
		}
		a.upload(c, map[string]any{"path": "/srv/default"}, strings.NewReader("x")).must(t, 200)
		for _, m := range a.prov.Received() {
			if m.Op == "write_file" {
				_ = json.Unmarshal(m.Body, &got)
			}
		}
		if got.Mode != 0o644 {
			t.Errorf("default mode %o, want 0644", got.Mode)
		}

		res := a.open("POST", leasePath(c.Lease.LeaseID, "/files/read"), tokAcme, "application/json",
			bytes.NewReader(mustJSON(t, with(proofBody(c), "path", "/srv/data/blob.bin"))))
		body, err := io.ReadAll(res.Body)
		if err != nil || res.StatusCode != 200 || !bytes.Equal(body, data) {
			t.Fatalf("read %d: %d bytes, %v", res.StatusCode, len(body), err)
		}
		if res.ContentLength != int64(len(data)) || res.Header.Get("Content-Type") != "application/octet-stream" {
			t.Errorf("read headers %v", res.Header)
		}
		rd := func(kv ...any) resp {
			return a.do("POST", leasePath(c.Lease.LeaseID, "/files/read"), tokAcme, with(proofBody(c), kv...))
		}
		rd("path", "/srv/data/blob.bin", "max_bytes", len(data)).must(t, 200)
		rd("path", "/srv/data/blob.bin", "max_bytes", len(data)-1).errCode(t, 413, "payload_too_large")
		rd("path", "/srv/data/blob.bin", "max_bytes", MaxFileBytes).must(t, 200)
		rd("path", "/srv/data/blob.bin", "max_bytes", MaxFileBytes+1).errCode(t, 422, "invalid_request")
		rd("path", "/srv/data/blob.bin", "max_bytes", 0).errCode(t, 422, "invalid_request")
		rd("path", "/srv/none").errCode(t, 404, "file_not_found")
		rd("path", "relative").errCode(t, 422, "invalid_request")
		rd().errCode(t, 422, "invalid_request")
		a.do("POST", leasePath(c.Lease.LeaseID, "/files/read"), tokAcme, with(proofBody(c), "path", "/srv/data/blob.bin"),
			"Content-Type", "text/plain").errCode(t, 415, "unsupported_media_type")
	})
}

// TestFileWriteRefusals: a body that is not the two parts of a file write
// is refused before anything reaches the cell.
func TestFileWriteRefusals(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		a := newAgentEnv(t, b, 1)
		c := a.lease()
		path := leasePath(c.Lease.LeaseID, "/files/write")
		send := func(ct string, body string) resp {
			res := a.open("POST", path, tokAcme, ct, strings.NewReader(body))
			b, _ := io.ReadAll(res.Body)
			return resp{status: res.StatusCode, header: res.Header, body: b}
		}
		proof := string(mustJSON(t, with(proofBody(c), "path", "/x")))
		part := func(name, ct, data string) string {
			h := "--B\r\nContent-Disposition: form-data; name=\"" + name + "\"\r\n"
			if ct != "" {
				h += "Content-Type: " + ct + "\r\n"
			}
			return h + "\r\n" + data + "\r\n"
		}
		const end = "--B--\r\n"
		mp := "multipart/form-data; boundary=B"
		send(mp, part("proof", "application/json", proof)+part("content", "", "data")+end).must(t, 200)
		send("application/json", proof).errCode(t, 415, "unsupported_media_type")
		send("multipart/form-data", part("proof", "application/json", proof)).errCode(t, 415, "unsupported_media_type")
		send(mp, part("proof", "", proof)+part("content", "", "d")+end).errCode(t, 415, "unsupported_media_type")
		send(mp, part("content", "", "d")+part("proof", "application/json", proof)+end).errCode(t, 422, "invalid_request")
		send(mp, part("proof", "application/json", proof)+end).errCode(t, 422, "invalid_request")
		send(mp, part("proof", "application/json", "{")+part("content", "", "d")+end).errCode(t, 400, "invalid_request")
		send(mp, "garbage").errCode(t, 400, "invalid_request")
		send(mp, part("proof", "application/json", `{"pad":"`+strings.Repeat("x", MaxBodyBytes)+`"}`)+end).errCode(t, 413, "payload_too_large")
		for _, mode := range []string{"999", "0000", "644x", "07777", "1", "-644"} {
			m := string(mustJSON(t, with(proofBody(c), "path", "/x", "mode", mode)))
			send(mp, part("proof", "application/json", m)+part("content", "", "d")+end).errCode(t, 422, "invalid_request")
		}
		rel := string(mustJSON(t, with(proofBody(c), "path", "x")))
		send(mp, part("proof", "application/json", rel)+part("content", "", "d")+end).errCode(t, 422, "invalid_request")
		bad := string(mustJSON(t, with(proofBody(c), "path", "/x", "lease_attestation", "swla1_wrong")))
		send(mp, part("proof", "application/json", bad)+part("content", "", "d")+end).errCode(t, 409, "conflict")
		if n := a.ops()["write_file"]; n != 1 {
			t.Errorf("%d writes reached the agent, want the one valid write", n)
		}
	})
}

// TestFileWriteStreamsContent: the content reaches the cell while the
// client is still sending it — the client holds back the rest of the body
// until the agent has consumed the first part of the content.
func TestFileWriteStreamsContent(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		a := newAgentEnv(t, b, 1)
		c := a.lease()
		const first, rest = 64 << 10, 4 << 20
		consumed := make(step)
		a.prov.setHook(&connHook{write: func(ctx context.Context, req agent.WriteRequest, content io.Reader) (agent.FileInfo, error) {
			h := sha256.New()
			n, err := io.CopyN(h, content, first)
			if err != nil {
				return agent.FileInfo{}, err
			}
			close(consumed)
			m, err := io.Copy(h, content)
			if err != nil {
				return agent.FileInfo{}, err
			}
			return agent.FileInfo{Path: req.Path, Size: n + m, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
		}})
		data := bytes.Repeat([]byte("0123456789abcdef"), (first+rest)/16)
		// The client sends a little more than the agent waits for (room for
		// the multipart reader's look-ahead), then nothing until the agent
		// has it.
		const sent = first + 4096
		content := io.MultiReader(bytes.NewReader(data[:sent]), readerFunc(func(p []byte) (int, error) {
			if err := consumed.wait(context.Background()); err != nil {
				return 0, err // the handler held the content back
			}
			return 0, io.EOF
		}), bytes.NewReader(data[sent:]))
		r := a.upload(c, map[string]any{"path": "/big"}, content).must(t, 200)
		sum := sha256.Sum256(data)
		if got := decodeAs[wire.FileWriteResponse](t, r); got.Size != int64(len(data)) || got.SHA256 != hex.EncodeToString(sum[:]) {
			t.Errorf("write answered %s", r.body)
		}
	})
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// zeros yields n zero bytes without holding them.
type zeros struct{ n int64 }

func (z *zeros) Read(p []byte) (int, error) {
	if z.n <= 0 {
		return 0, io.EOF
	}
	k := min(int64(len(p)), z.n)
	clear(p[:k])
	z.n -= k
	return int(k), nil
}

// TestFileWriteTooLarge: content over 256 MiB is 413, and the cell's
// content reader fails before its end, so an agent that commits only a
// complete file writes nothing; a Content-Length that cannot fit is
// refused before the body is read.
func TestFileWriteTooLarge(t *testing.T) {
	t.Parallel()
	a := newAgentEnv(t, backends[0], 1)
	c := a.lease()
	var mu sync.Mutex
	var got int64
	var readErr error
	a.prov.setHook(&connHook{write: func(ctx context.Context, req agent.WriteRequest, content io.Reader) (agent.FileInfo, error) {
		n, err := io.Copy(io.Discard, content) // counted, never kept
		mu.Lock()
		got, readErr = n, err
		mu.Unlock()
		if err != nil {
			return agent.FileInfo{}, err // the temporary file is dropped
		}
		return agent.FileInfo{Path: req.Path, Size: n}, nil
	}})
	a.upload(c, map[string]any{"path": "/huge"}, &zeros{n: MaxFileBytes + 1}).errCode(t, 413, "payload_too_large")
	mu.Lock()
	if got != MaxFileBytes || readErr == nil {
		t.Errorf("the cell read %d bytes and then %v; want %d and an error", got, readErr, MaxFileBytes)
	}
	mu.Unlock()
	a.upload(c, map[string]any{"path": "/exact"}, &zeros{n: MaxFileBytes}).must(t, 200)

	// A declared length over the bound: 413 with nothing read.
	conn, err := net.Dial("tcp", a.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: multipart/form-data; boundary=B\r\nContent-Length: %d\r\n\r\n",
		leasePath(c.Lease.LeaseID, "/files/write"), tokAcme, 2*MaxFileBytes)
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	resp{status: res.StatusCode, header: res.Header, body: body}.errCode(t, 413, "payload_too_large")
}

// TestFileReadCutShort: a cell that stops sending before the end of the
// file aborts the response short of its Content-Length (64 KiB of 1 MiB:
// more than the server buffers, so the header has gone out).
func TestFileReadCutShort(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		a := newAgentEnv(t, b, 1)
		c := a.lease()
		a.prov.setHook(&connHook{read: func(ctx context.Context, req agent.ReadRequest) (io.ReadCloser, int64, error) {
			return io.NopCloser(strings.NewReader(strings.Repeat("x", 64<<10))), 1 << 20, nil
		}})
		req, err := http.NewRequest("POST", a.srv.URL+leasePath(c.Lease.LeaseID, "/files/read"), bytes.NewReader(mustJSON(t, with(proofBody(c), "path", "/f"))))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+tokAcme)
		res, err := a.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		if res.StatusCode != 200 || res.ContentLength != 1<<20 || err == nil || len(body) >= 1<<20 {
			t.Errorf("read: %d, Content-Length %d, %d bytes, %v; want an error short of 1 MiB", res.StatusCode, res.ContentLength, len(body), err)
		}
	})
}

// TestAgentErrorCodes: each refusal of the cell's agent is answered with
// its code and status on every route that reaches the agent.
func TestAgentErrorCodes(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		a := newAgentEnv(t, b, 1)
		c := a.lease()
		routes := map[string]func() resp{
			"exec": func() resp {
				return a.do("POST", leasePath(c.Lease.LeaseID, "/exec"), tokAcme, with(proofBody(c), "argv", []string{"id"}))
			},
			"stream": func() resp {
				res := a.stream(c, with(proofBody(c), "argv", []string{"id"}))
				body, _ := io.ReadAll(res.Body)
				return resp{status: res.StatusCode, header: res.Header, body: body}
			},
			"launch": func() resp {
				return a.do("POST", leasePath(c.Lease.LeaseID, "/launch"), tokAcme, with(proofBody(c), "argv", []string{"id"}))
			},
			"write": func() resp { return a.upload(c, map[string]any{"path": "/f"}, strings.NewReader("x")) },
			"read": func() resp {
				return a.do("POST", leasePath(c.Lease.LeaseID, "/files/read"), tokAcme, with(proofBody(c), "path", "/f"))
			},
		}
		for _, tc := range []struct {
			code   agent.Code
			status int
			wire   string
		}{
			{agent.CodeInvalid, 422, "invalid_request"},
			{agent.CodeUserUnsupported, 422, "user_unsupported"},
			{agent.CodeNotFound, 404, "file_not_found"},
			{agent.CodeAccessDenied, 403, "file_access_denied"},
			{agent.CodeTooLarge, 413, "payload_too_large"},
			{agent.CodeNoSpace, 507, "insufficient_storage"},
		} {
			a.prov.SetAgentFaults(fake.AgentFaults{Answer: agent.Errorf(tc.code, "refused")})
			for name, send := range routes {
				t.Run(string(tc.code)+"/"+name, func(t *testing.T) { send().errCode(t, tc.status, tc.wire) })
			}
		}
		a.prov.SetAgentFaults(fake.AgentFaults{})
		if st := a.state(c); st != lease.Leased {
			t.Fatalf("refusals of the request ended the cell: %s", st)
		}
		// A refused fence ends the cell.
		a.prov.SetAgentFaults(fake.AgentFaults{RefuseFence: true})
		routes["read"]().errCode(t, 409, "cell_agent_unverified")
		if st := a.state(c); st != lease.Quarantined {
			t.Errorf("the cell is %s after its agent refused the fence", st)
		}
	})
}

// TestAgentRoutesWithoutAgent: a provider whose cells run no agent answers
// launch and files with 501 exec_unsupported.
func TestAgentRoutesWithoutAgent(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnvWith(t, b, []sandboxwich.Option{sandboxwich.WithPools(pool.Config{
			Name: "p1", TenantID: "acme", Release: signedRelease(t, lease.GVisorLowerRisk), Target: 1, Provider: fake.New(fake.Config{}),
		})})
		e.plane.Pools().Pass(context.Background())
		c := e.claim(tokAcme, nil, lease.GVisorLowerRisk)
		a := &agentEnv{env: e}
		id := c.Lease.LeaseID
		e.do("POST", leasePath(id, "/launch"), tokAcme, with(proofBody(c), "argv", []string{"id"})).errCode(t, 501, "exec_unsupported")
		e.do("GET", leasePath(id, "/launch"), tokAcme, nil).errCode(t, 501, "exec_unsupported")
		e.do("POST", leasePath(id, "/files/read"), tokAcme, with(proofBody(c), "path", "/f")).errCode(t, 501, "exec_unsupported")
		a.upload(c, map[string]any{"path": "/f"}, strings.NewReader("x")).errCode(t, 501, "exec_unsupported")
	})
}

func TestAcceptsEventStream(t *testing.T) {
	for accept, want := range map[string]bool{
		"text/event-stream":                    true,
		"application/json, text/event-stream":  true,
		"text/event-stream;q=0.5":              true,
		"TEXT/EVENT-STREAM":                    true,
		"text/event-stream;q=0":                false,
		"application/json":                     false,
		"*/*":                                  false,
		"text/*":                               false,
		"":                                     false,
		"text/event-stream-ish, text/plain":    false,
		"application/json;q=1,text/event-stre": false,
	} {
		if got := acceptsEventStream([]string{accept}); got != want {
			t.Errorf("Accept %q: streams %v, want %v", accept, got, want)
		}
	}
}

func TestParseMode(t *testing.T) {
	for s, want := range map[string]int{"": 0o644, "0644": 0o644, "644": 0o644, "0755": 0o755, "0777": 0o777, "0001": 1, "400": 0o400} {
		if got, err := parseMode(s); err != nil || int(got) != want {
			t.Errorf("parseMode(%q) = %o, %v; want %o", s, got, err, want)
		}
	}
	for _, s := range []string{"0000", "000", "1000", "4755", "0o644", "+644", "64", "08", "0x1ff", " 644"} {
		if _, err := parseMode(s); err == nil {
			t.Errorf("parseMode(%q) accepted", s)
		}
	}
}
