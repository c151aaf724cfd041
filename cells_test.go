package sandboxwich_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/internal/testenv"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
)

// agentBinding has values found nowhere else, so that a scan of what the
// agent received finds them only if they leaked.
var agentBinding = lease.Binding{OrganizationID: "org-zx81-distinct", WorkspaceID: "ws-qq42-distinct",
	ThreadID: "thread-pp17-distinct", RunnerSessionID: "session-kk09-distinct"}

// agentEnv is a plane with one pool of one cell on a fake provider whose
// cells run the fake agent, and a lease of that cell.
type agentEnv struct {
	*env
	prov  *fake.AgentProvider
	claim sandboxwich.ClaimResult
	id    uuid.UUID // the lease ID
	cell  uuid.UUID
	// skew puts the agents' clock ahead of the plane's.
	skew time.Duration
}

func newAgentEnv(t *testing.T, opts ...sandboxwich.Option) *agentEnv {
	t.Helper()
	return newAgentEnvWith(t, nil, opts...)
}

// newAgentEnvWith is newAgentEnv with the pool's provider made by wrap
// from the fake one (nil: the fake itself).
func newAgentEnvWith(t *testing.T, wrap func(*fake.AgentProvider) driver.Provider, opts ...sandboxwich.Option) *agentEnv {
	t.Helper()
	a := &agentEnv{}
	a.env = newEnv(t)
	a.prov = fake.NewWithAgent(fake.Config{Mode: driver.Apply, Kind: "fake", Now: func() time.Time { return a.now.Add(a.skew) }})
	var prov driver.Provider = a.prov
	if wrap != nil {
		prov = wrap(a.prov)
	}
	a.env = newEnv(t, append([]sandboxwich.Option{sandboxwich.WithPools(pool.Config{Name: "p1", TenantID: "acme",
		Release: a.rel, Target: 1, Provider: prov})}, opts...)...)
	a.plane.Pools().Pass(a.ctx)
	res, err := a.plane.Claim(a.ctx, "acme", sandboxwich.ClaimRequest{ClaimID: uuid.New(), Release: a.rel, Binding: agentBinding})
	if err != nil || res.Lease == nil {
		t.Fatalf("claim: %v %v", res, err)
	}
	a.claim, a.id, a.cell = res, res.Lease.ID, res.Lease.CellID
	return a
}

func (a *agentEnv) exec(argv ...string) (sandboxwich.ExecResult, error) {
	return a.plane.Exec(a.ctx, "acme", a.id, a.claim.Proof(), sandboxwich.ExecRequest{Argv: argv})
}

// ops counts the requests the fake agent received, by operation.
func (a *agentEnv) ops() map[string]int {
	n := map[string]int{}
	for _, m := range a.prov.Received() {
		n[m.Op]++
	}
	return n
}

// requireEnded checks that the lease's cell is quarantined, and proven
// deleted after the pool's next pass.
func (a *agentEnv) requireEnded(t *testing.T) {
	t.Helper()
	st, err := a.plane.LeaseStatus(a.ctx, "acme", a.id)
	if err != nil || st.State != lease.Quarantined {
		t.Fatalf("cell: %+v %v, want quarantined", st, err)
	}
	a.plane.Pools().Pass(a.ctx)
	if st, _ = a.plane.LeaseStatus(a.ctx, "acme", a.id); !st.ProviderAbsent {
		t.Fatalf("cell after the pool's pass: %+v, want proven deleted", st)
	}
	if obs, err := a.prov.Inspect(a.ctx, driver.Object{CellID: a.cell}); err != nil || obs.Exists {
		t.Fatalf("the cell's object after the pool's pass: %+v %v", obs, err)
	}
}

func TestAgentExecFilesLaunch(t *testing.T) {
	a := newAgentEnv(t)
	out, err := a.plane.Exec(a.ctx, "acme", a.id, a.claim.Proof(), sandboxwich.ExecRequest{Argv: []string{"cat"}, Stdin: []byte("hello")})
	if err != nil || string(out.Stdout) != "hello" || out.Reason != sandboxwich.ReasonExited || out.ExitCode != 0 {
		t.Fatalf("exec cat: %+v %v", out, err)
	}
	if out, err = a.exec("exit", "3"); err != nil || out.ExitCode != 3 || out.Reason != sandboxwich.ReasonExited {
		t.Fatalf("exec exit 3: %+v %v", out, err)
	}
	out, err = a.plane.Exec(a.ctx, "acme", a.id, a.claim.Proof(), sandboxwich.ExecRequest{Argv: []string{"pwd"}, Cwd: "/tmp", User: sandboxwich.UserRoot})
	if err != nil || string(out.Stdout) != "/tmp\n" {
		t.Fatalf("exec pwd: %+v %v", out, err)
	}
	info, err := a.plane.WriteFile(a.ctx, "acme", a.id, a.claim.Proof(), sandboxwich.WriteFileRequest{Path: "/home/cell/in.txt", Mode: 0o600},
		strings.NewReader("data"))
	if err != nil || info.Size != 4 || info.Path != "/home/cell/in.txt" {
		t.Fatalf("write: %+v %v", info, err)
	}
	rc, size, err := a.plane.ReadFile(a.ctx, "acme", a.id, a.claim.Proof(), sandboxwich.ReadFileRequest{Path: "/home/cell/in.txt"})
	if err != nil || size != 4 {
		t.Fatalf("read: %d %v", size, err)
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || string(b) != "data" {
		t.Fatalf("read content %q %v", b, err)
	}
	st, created, err := a.plane.Launch(a.ctx, "acme", a.id, a.claim.Proof(), sandboxwich.LaunchRequest{Argv: []string{"echo", "up"}})
	if err != nil || !created || st.Phase == "" {
		t.Fatalf("launch: %+v %v %v", st, created, err)
	}
	if _, created, err = a.plane.Launch(a.ctx, "acme", a.id, a.claim.Proof(), sandboxwich.LaunchRequest{Argv: []string{"echo", "up"}}); err != nil || created {
		t.Fatalf("launch replay: created %v %v", created, err)
	}
	if _, _, err = a.plane.Launch(a.ctx, "acme", a.id, a.claim.Proof(), sandboxwich.LaunchRequest{Argv: []string{"echo", "other"}}); !errors.Is(err, errcode.ErrConflict) {
		t.Fatalf("a different launch: %v", err)
	}
	for st.Phase != sandboxwich.LaunchTerminal {
		if st, err = a.plane.LaunchStatusOf(a.ctx, "acme", a.id); err != nil {
			t.Fatalf("launch status: %v", err)
		}
	}
	if *st.ExitCode != 0 || *st.Reason != sandboxwich.ReasonExited {
		t.Fatalf("launch ended: %+v", st)
	}
	rc, _, err = a.plane.ReadFile(a.ctx, "acme", a.id, a.claim.Proof(), sandboxwich.ReadFileRequest{Path: "/home/cell/.launch/stdout"})
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(rc)
	if string(b) != "up\n" {
		t.Fatalf("launch stdout %q", b)
	}
	n := a.ops()
	if ops := n["exec"] + n["write_file"] + n["read_file"] + n["launch"] + n["launch_status"]; n["activate"] != ops || ops < 10 {
		t.Fatalf("requests received: %v, want one activation before each operation", n)
	}
	if st, _ := a.plane.LeaseStatus(a.ctx, "acme", a.id); st.State != lease.Leased {
		t.Fatalf("cell after the operations: %+v", st)
	}
}

// everyOp runs each agent operation once with the lease's proof and
// returns their errors.
func (a *agentEnv) everyOp(pr sandboxwich.Proof) map[string]error {
	errs := map[string]error{}
	_, errs["exec"] = a.plane.Exec(a.ctx, "acme", a.id, pr, sandboxwich.ExecRequest{Argv: []string{"cat"},
		Stdin: []byte("stdin"), Env: map[string]string{"K": "v"}, Cwd: "/tmp"})
	_, errs["exec_stream"] = a.plane.ExecStream(a.ctx, "acme", a.id, pr, sandboxwich.ExecRequest{Argv: []string{"echo", "x"}},
		func(sandboxwich.Output) error { return nil })
	_, errs["write"] = a.plane.WriteFile(a.ctx, "acme", a.id, pr, sandboxwich.WriteFileRequest{Path: "/home/cell/f"}, strings.NewReader("content"))
	rc, _, err := a.plane.ReadFile(a.ctx, "acme", a.id, pr, sandboxwich.ReadFileRequest{Path: "/home/cell/f"})
	if err == nil {
		rc.Close()
	}
	errs["read"] = err
	_, _, errs["launch"] = a.plane.Launch(a.ctx, "acme", a.id, pr, sandboxwich.LaunchRequest{Argv: []string{"sleep", "1"}})
	return errs
}

// TestAgentReceivesNoSecret: everything the agent received — activations,
// requests, stdin and file content — holds no attestation, no attestation
// digest, no binding value, no release signature and no key; and each
// activation is exactly the sanitized one, its TTL the lease's remaining
// life by the plane's clock.
func TestAgentReceivesNoSecret(t *testing.T) {
	a := newAgentEnv(t)
	a.now = a.now.Add(7 * time.Second)
	for op, err := range a.everyOp(a.claim.Proof()) {
		if err != nil {
			t.Fatalf("%s: %v", op, err)
		}
	}
	if _, err := a.plane.LaunchStatusOf(a.ctx, "acme", a.id); err != nil {
		t.Fatal(err)
	}
	att := a.claim.Attestation()
	secrets := []string{att, strings.TrimPrefix(att, "swla1_"), "swla1_", attest.Digest(att), a.claim.Lease.AttestationDigest,
		agentBinding.OrganizationID, agentBinding.WorkspaceID, agentBinding.ThreadID, agentBinding.RunnerSessionID,
		a.rel.Signature, testenv.Key}
	msgs := a.prov.Received()
	activations := 0
	for _, m := range msgs {
		for _, s := range secrets {
			if bytes.Contains(m.Body, []byte(s)) || bytes.Contains(m.Data, []byte(s)) {
				t.Fatalf("the agent received %q in %s: %s", s, m.Op, m.Body)
			}
		}
		if m.Op != "activate" {
			continue
		}
		activations++
		var got map[string]any
		if err := json.Unmarshal(m.Body, &got); err != nil {
			t.Fatal(err)
		}
		remaining := a.claim.Lease.ExpiresAt.Sub(a.now).Milliseconds()
		want := map[string]any{"version": 1.0, "cell_id": a.cell.String(), "lease_id": a.id.String(),
			"generation": float64(a.claim.Lease.Generation), "expires_at": a.claim.Lease.ExpiresAt.Format(time.RFC3339Nano),
			"ttl_ms": float64(remaining)}
		if !maps.Equal(got, want) {
			t.Fatalf("activation %v, want exactly %v", got, want)
		}
	}
	if activations != 6 {
		t.Fatalf("%d activations, want one before each of the 6 operations", activations)
	}
}

// TestAgentFenceCheckedFirst: a request with a wrong proof fails the lease
// fence and reaches neither the provider's agent nor the provider.
func TestAgentFenceCheckedFirst(t *testing.T) {
	a := newAgentEnv(t)
	other := agentBinding
	other.RunnerSessionID = "session-other"
	before := len(a.prov.Received())
	inspects := a.prov.Calls("inspect")
	for name, pr := range map[string]sandboxwich.Proof{
		"attestation": sandboxwich.NewProof(a.claim.Attestation()+"x", a.claim.Lease.Generation, agentBinding),
		"generation":  sandboxwich.NewProof(a.claim.Attestation(), a.claim.Lease.Generation+1, agentBinding),
		"binding":     sandboxwich.NewProof(a.claim.Attestation(), a.claim.Lease.Generation, other),
	} {
		for op, err := range a.everyOp(pr) {
			if !errors.Is(err, errcode.ErrConflict) {
				t.Errorf("%s with a wrong %s: %v, want a fence conflict", op, name, err)
			}
		}
	}
	if _, err := a.plane.LaunchStatusOf(a.ctx, "globex", a.id); !errors.Is(err, errcode.ErrNotFound) {
		t.Errorf("launch status of a foreign lease: %v", err)
	}
	if got := a.prov.Received()[before:]; len(got) != 0 {
		t.Fatalf("the agent received %d requests with a wrong proof: first %s", len(got), got[0].Op)
	}
	if n := a.prov.Calls("inspect"); n != inspects {
		t.Fatalf("the provider was inspected %d times with a wrong proof", n-inspects)
	}
	if st, _ := a.plane.LeaseStatus(a.ctx, "acme", a.id); st.State != lease.Leased {
		t.Fatalf("lease after wrong proofs: %+v", st)
	}
}

// TestAgentRequestValidation: input no cell can act on is refused with
// 422 before the store, the provider or the agent sees it.
func TestAgentRequestValidation(t *testing.T) {
	a := newAgentEnv(t)
	pr := a.claim.Proof()
	before := len(a.prov.Received())
	inspects := a.prov.Calls("inspect")
	long := "/" + strings.Repeat("a", sandboxwich.MaxPath)
	exec := func(r sandboxwich.ExecRequest) error {
		_, err := a.plane.Exec(a.ctx, "acme", a.id, pr, r)
		return err
	}
	launch := func(r sandboxwich.LaunchRequest) error {
		_, _, err := a.plane.Launch(a.ctx, "acme", a.id, pr, r)
		return err
	}
	write := func(r sandboxwich.WriteFileRequest) error {
		_, err := a.plane.WriteFile(a.ctx, "acme", a.id, pr, r, strings.NewReader("x"))
		return err
	}
	read := func(r sandboxwich.ReadFileRequest) error {
		_, _, err := a.plane.ReadFile(a.ctx, "acme", a.id, pr, r)
		return err
	}
	for name, err := range map[string]error{
		"exec NUL in cwd":       exec(sandboxwich.ExecRequest{Argv: []string{"pwd"}, Cwd: "/tmp\x00x"}),
		"exec relative cwd":     exec(sandboxwich.ExecRequest{Argv: []string{"pwd"}, Cwd: "tmp"}),
		"exec long cwd":         exec(sandboxwich.ExecRequest{Argv: []string{"pwd"}, Cwd: long}),
		"exec unknown user":     exec(sandboxwich.ExecRequest{Argv: []string{"id"}, User: "admin"}),
		"exec empty argv":       exec(sandboxwich.ExecRequest{}),
		"exec NUL in argv":      exec(sandboxwich.ExecRequest{Argv: []string{"echo", "a\x00"}}),
		"exec bad env key":      exec(sandboxwich.ExecRequest{Argv: []string{"env"}, Env: map[string]string{"1A": "x"}}),
		"exec stdin too large":  exec(sandboxwich.ExecRequest{Argv: []string{"cat"}, Stdin: make([]byte, sandboxwich.MaxExecStdin+1)}),
		"exec negative timeout": exec(sandboxwich.ExecRequest{Argv: []string{"id"}, Timeout: -time.Second}),
		"launch relative cwd":   launch(sandboxwich.LaunchRequest{Argv: []string{"id"}, Cwd: "home"}),
		"launch unknown user":   launch(sandboxwich.LaunchRequest{Argv: []string{"id"}, User: "nobody"}),
		"launch empty argv0":    launch(sandboxwich.LaunchRequest{Argv: []string{""}}),
		"write relative path":   write(sandboxwich.WriteFileRequest{Path: "etc/passwd"}),
		"write NUL in path":     write(sandboxwich.WriteFileRequest{Path: "/tmp/a\x00b"}),
		"write long path":       write(sandboxwich.WriteFileRequest{Path: long}),
		"write setuid mode":     write(sandboxwich.WriteFileRequest{Path: "/tmp/a", Mode: fs.ModeSetuid | 0o755}),
		"write directory mode":  write(sandboxwich.WriteFileRequest{Path: "/tmp/a", Mode: fs.ModeDir | 0o755}),
		"write unknown user":    write(sandboxwich.WriteFileRequest{Path: "/tmp/a", User: "daemon"}),
		"read relative path":    read(sandboxwich.ReadFileRequest{Path: "a"}),
		"read empty path":       read(sandboxwich.ReadFileRequest{}),
		"read negative max":     read(sandboxwich.ReadFileRequest{Path: "/a", MaxBytes: -1}),
		"read max over 256 MiB": read(sandboxwich.ReadFileRequest{Path: "/a", MaxBytes: agent.MaxFileBytes + 1}),
		"read unknown user":     read(sandboxwich.ReadFileRequest{Path: "/a", User: "x"}),
	} {
		if !errors.Is(err, errcode.ErrInvalidRequest) {
			t.Errorf("%s: %v, want invalid_request", name, err)
		}
	}
	if got := a.prov.Received()[before:]; len(got) != 0 {
		t.Fatalf("the agent received %d invalid requests", len(got))
	}
	if n := a.prov.Calls("inspect"); n != inspects {
		t.Fatalf("the provider was inspected %d times for invalid requests", n-inspects)
	}
	// Exactly at the limits is accepted.
	if _, err := a.plane.Exec(a.ctx, "acme", a.id, pr, sandboxwich.ExecRequest{Argv: []string{"pwd"}, Cwd: long[:sandboxwich.MaxPath]}); err != nil {
		t.Fatalf("exec with a cwd of 4096 bytes: %v", err)
	}
	if _, err := a.plane.WriteFile(a.ctx, "acme", a.id, pr, sandboxwich.WriteFileRequest{Path: "/tmp/x", Mode: 0o777, User: sandboxwich.UserRoot},
		strings.NewReader("x")); err != nil {
		t.Fatalf("write with mode 0777 as root: %v", err)
	}
}

// TestAgentSecondFenceEndsCell: an agent already bound to another fence
// refuses the lease's activation; so does one that refuses any fence, or
// refuses the fence at the operation, or forgot its activation. Each time
// the cell is quarantined with cell_agent_unverified (409), nothing runs,
// and the provider proves the object deleted.
func TestAgentSecondFenceEndsCell(t *testing.T) {
	for _, tc := range []struct {
		name string
		// atActivation: the activation is refused, so no operation may
		// reach the agent.
		atActivation bool
		setup        func(t *testing.T, a *agentEnv)
	}{
		{"bound to another fence", true, func(t *testing.T, a *agentEnv) {
			conn, err := a.prov.Agent(a.ctx, driver.Object{CellID: a.cell})
			if err != nil {
				t.Fatal(err)
			}
			if err := conn.Activate(a.ctx, agent.Activation{Version: 1, Fence: agent.Fence{CellID: a.cell.String(),
				LeaseID: uuid.NewString(), Generation: 2}, ExpiresAt: a.now.Add(time.Hour), TTLMillis: 3600_000}); err != nil {
				t.Fatal(err)
			}
		}},
		{"refuses every fence", true, func(t *testing.T, a *agentEnv) { a.prov.SetAgentFaults(fake.AgentFaults{RefuseFence: true}) }},
		{"refuses the fence at the operation", false, func(t *testing.T, a *agentEnv) {
			a.prov.SetAgentFaults(fake.AgentFaults{Answer: agent.ErrFenceRefused})
		}},
		{"not active after activation", false, func(t *testing.T, a *agentEnv) {
			a.prov.SetAgentFaults(fake.AgentFaults{Answer: agent.Errorf(agent.CodeNotActive, "forgot")})
		}},
		{"an unknown code", false, func(t *testing.T, a *agentEnv) {
			a.prov.SetAgentFaults(fake.AgentFaults{Answer: agent.Errorf("made_up", "?")})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newAgentEnv(t)
			tc.setup(t, a)
			_, err := a.exec("echo", "must not run")
			if !errors.Is(err, errcode.ErrCellAgentUnverified) || errcode.CodeOf(err).HTTPStatus() != 409 {
				t.Fatalf("exec: %v, want cell_agent_unverified", err)
			}
			if n := a.ops()["exec"]; tc.atActivation && n != 0 {
				t.Fatalf("%d execs reached the agent after its activation was refused", n)
			}
			a.requireEnded(t)
			before := len(a.prov.Received())
			if _, err := a.exec("echo"); !errors.Is(err, errcode.ErrConflict) {
				t.Fatalf("exec after the cell ended: %v", err)
			}
			if n := len(a.prov.Received()) - before; n != 0 {
				t.Fatalf("%d requests reached the agent of an ended cell", n)
			}
		})
	}
}

// TestAgentAnswersMapped: the agent's refusals of a request answer with
// their codes and leave the lease live; an agent that reports the lease
// expired is a conflict.
func TestAgentAnswersMapped(t *testing.T) {
	a := newAgentEnv(t)
	for _, tc := range []struct {
		answer error
		want   *errcode.Error
		status int
	}{
		{agent.ErrNotFound, errcode.ErrFileNotFound, 404},
		{agent.ErrAccessDenied, errcode.ErrFileAccessDenied, 403},
		{agent.ErrNoSpace, errcode.ErrInsufficientStorage, 507},
		{agent.ErrTooLarge, errcode.ErrPayloadTooLarge, 413},
		{agent.ErrInvalid, errcode.ErrInvalidRequest, 422},
		{agent.ErrUserUnsupported, errcode.ErrUserUnsupported, 422},
		{agent.ErrExpired, errcode.ErrConflict, 409},
	} {
		a.prov.SetAgentFaults(fake.AgentFaults{Answer: agent.Errorf(tc.answer.(*agent.Error).Code, "a\nmessage")})
		for op, err := range a.everyOp(a.claim.Proof()) {
			if !errors.Is(err, tc.want) || errcode.CodeOf(err).HTTPStatus() != tc.status || !errors.Is(err, tc.answer) {
				t.Errorf("%s answered %v: %v, want %s", op, tc.answer, err, tc.want.Code)
			}
		}
	}
	a.prov.SetAgentFaults(fake.AgentFaults{})
	if _, _, err := a.plane.ReadFile(a.ctx, "acme", a.id, a.claim.Proof(), sandboxwich.ReadFileRequest{Path: "/nope"}); !errors.Is(err, errcode.ErrFileNotFound) {
		t.Fatalf("reading a missing file: %v", err)
	}
	if _, err := a.plane.LaunchStatusOf(a.ctx, "acme", a.id); !errors.Is(err, errcode.ErrNotFound) {
		t.Fatalf("launch status before a launch: %v", err)
	}
	if _, err := a.plane.WriteFile(a.ctx, "acme", a.id, a.claim.Proof(), sandboxwich.WriteFileRequest{Path: "/big"},
		strings.NewReader("12345")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.plane.ReadFile(a.ctx, "acme", a.id, a.claim.Proof(), sandboxwich.ReadFileRequest{Path: "/big", MaxBytes: 4}); !errors.Is(err, errcode.ErrPayloadTooLarge) {
		t.Fatalf("reading 5 bytes with max_bytes 4: %v", err)
	}
	if st, _ := a.plane.LeaseStatus(a.ctx, "acme", a.id); st.State != lease.Leased {
		t.Fatalf("the agent's refusals ended the lease: %+v", st)
	}
}

// TestAgentExpiry: after the lease's expiry by the plane's clock, no
// operation reaches the agent; an agent whose own clock ran out first
// refuses, and the answer is a conflict.
func TestAgentExpiry(t *testing.T) {
	a := newAgentEnv(t)
	if _, err := a.exec("echo", "live"); err != nil {
		t.Fatal(err)
	}
	a.skew = a.claim.Lease.ExpiresAt.Sub(a.now) // the agent's TTL ran out, the plane's not yet
	if _, err := a.exec("echo", "late"); !errors.Is(err, errcode.ErrConflict) || !errors.Is(err, agent.ErrExpired) {
		t.Fatalf("exec the agent finds expired: %v", err)
	}
	a.skew = 0
	a.now = a.claim.Lease.ExpiresAt
	before := len(a.prov.Received())
	for op, err := range a.everyOp(a.claim.Proof()) {
		if !errors.Is(err, errcode.ErrConflict) {
			t.Errorf("%s after expiry: %v, want conflict", op, err)
		}
	}
	if _, err := a.plane.LaunchStatusOf(a.ctx, "acme", a.id); !errors.Is(err, errcode.ErrConflict) {
		t.Errorf("launch status after expiry: %v, want conflict", err)
	}
	if got := a.prov.Received()[before:]; len(got) != 0 {
		t.Fatalf("the agent received %d requests after expiry", len(got))
	}
}

// TestAgentAfterRelease: once the tenant released the lease, no
// operation reaches the cell while it stops.
func TestAgentAfterRelease(t *testing.T) {
	a := newAgentEnv(t)
	if _, err := a.plane.Release(a.ctx, "acme", a.id, a.claim.Proof(), lease.Destroyed); err != nil {
		t.Fatal(err)
	}
	before := len(a.prov.Received())
	for op, err := range a.everyOp(a.claim.Proof()) {
		if !errors.Is(err, errcode.ErrConflict) {
			t.Errorf("%s after release: %v, want conflict", op, err)
		}
	}
	if _, err := a.plane.LaunchStatusOf(a.ctx, "acme", a.id); !errors.Is(err, errcode.ErrConflict) {
		t.Errorf("launch status after release: %v, want conflict", err)
	}
	if got := a.prov.Received()[before:]; len(got) != 0 {
		t.Fatalf("the agent received %d requests after release", len(got))
	}
}

// TestAgentExecTimeoutOwn: the command's timeout sent to the agent is the
// request's own, even past the lease's remaining life: the agent kills
// every process at the lease's expiry, which a renewal moves (CONTRACT
// §20), so the plane no longer cuts the timeout to the expiry known when
// the command started.
func TestAgentExecTimeoutOwn(t *testing.T) {
	a := newAgentEnv(t)
	a.now = a.claim.Lease.ExpiresAt.Add(-50 * time.Millisecond)
	res, err := a.plane.Exec(a.ctx, "acme", a.id, a.claim.Proof(), sandboxwich.ExecRequest{Argv: []string{"sleep", "0.01"}, Timeout: time.Hour})
	if err != nil || res.TimedOut || res.Reason != sandboxwich.ReasonExited || res.Message != "" {
		t.Fatalf("exec near the lease's expiry: %+v %v", res, err)
	}
	var req agent.ExecRequest
	msgs := a.prov.Received()
	if err := json.Unmarshal(msgs[len(msgs)-1].Body, &req); err != nil || req.TimeoutMillis != time.Hour.Milliseconds() {
		t.Fatalf("timeout sent: %d ms %v, want the request's hour", req.TimeoutMillis, err)
	}
}

// TestAgentCrashEndsCell: a cell whose agent dies during a command ends:
// the exec answers a conflict wrapping driver.ErrCellLost, the cell is
// quarantined and its deletion proven.
func TestAgentCrashEndsCell(t *testing.T) {
	a := newAgentEnv(t)
	done := make(chan error, 1)
	go func() {
		_, err := a.exec("sleep", "60")
		done <- err
	}()
	for !slices.ContainsFunc(a.prov.Received(), func(m fake.Message) bool { return m.Op == "exec" }) {
		time.Sleep(time.Millisecond)
	}
	a.prov.Vanish(a.cell)
	err := <-done
	if !errors.Is(err, errcode.ErrConflict) || !errors.Is(err, driver.ErrCellLost) {
		t.Fatalf("exec in a cell that crashed: %v", err)
	}
	a.requireEnded(t)
}

// TestAgentSlowAnswerLeftToCaller: a caller that gives up on a slow agent
// gets its context's error, and the cell is not blamed.
func TestAgentSlowAnswerLeftToCaller(t *testing.T) {
	a := newAgentEnv(t)
	a.prov.SetAgentFaults(fake.AgentFaults{Delay: time.Hour})
	ctx, cancel := context.WithTimeout(a.ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := a.plane.Exec(ctx, "acme", a.id, a.claim.Proof(), sandboxwich.ExecRequest{Argv: []string{"echo"}}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("exec given up: %v", err)
	}
	if st, _ := a.plane.LeaseStatus(a.ctx, "acme", a.id); st.State != lease.Leased {
		t.Fatalf("a caller's timeout ended the cell: %+v", st)
	}
	a.prov.SetAgentFaults(fake.AgentFaults{Delay: time.Millisecond})
	if res, err := a.exec("echo", "slow"); err != nil || string(res.Stdout) != "slow\n" {
		t.Fatalf("exec on a slow agent: %+v %v", res, err)
	}
}

// TestExecStream: output arrives in chunks, in order, before the result,
// which carries none; the output cap holds per stream; an error from the
// receiver stops the command, is returned as it is, and leaves the cell
// alone.
func TestExecStream(t *testing.T) {
	a := newAgentEnv(t, sandboxwich.WithExecMaxOutput(5))
	var chunks []string
	returned := false
	res, err := a.plane.ExecStream(a.ctx, "acme", a.id, a.claim.Proof(), sandboxwich.ExecRequest{Argv: []string{"echo", "ab", "cd", "ef"}},
		func(o sandboxwich.Output) error {
			if returned || o.Stream != sandboxwich.Stdout {
				t.Errorf("chunk %+v after the result", o)
			}
			chunks = append(chunks, string(o.Data))
			return nil
		})
	returned = true
	if err != nil || res.Stdout != nil || res.Reason != sandboxwich.ReasonExited || !res.Truncated {
		t.Fatalf("stream: %+v %v", res, err)
	}
	if !slices.Equal(chunks, []string{"ab ", "cd"}) {
		t.Fatalf("chunks %q, want the first 5 bytes in 2 chunks", chunks)
	}
	if res, err := a.exec("echo", "abcdefgh"); err != nil || string(res.Stdout) != "abcde" || !res.Truncated {
		t.Fatalf("collected output over the cap: %+v %v", res, err)
	}
	stop := errors.New("receiver gone")
	_, err = a.plane.ExecStream(a.ctx, "acme", a.id, a.claim.Proof(), sandboxwich.ExecRequest{Argv: []string{"echo", "a", "b"}},
		func(sandboxwich.Output) error { return stop })
	if err != stop {
		t.Fatalf("stream whose receiver failed: %v, want its error", err)
	}
	if st, _ := a.plane.LeaseStatus(a.ctx, "acme", a.id); st.State != lease.Leased {
		t.Fatalf("a receiver's error ended the cell: %+v", st)
	}
	if _, err := sandboxwich.New(a.st, a.keys, sandboxwich.WithExecMaxOutput(sandboxwich.MaxExecOutputLimit+1)); err == nil {
		t.Fatal("New accepted an output cap over 64 MiB")
	}
	if _, err := sandboxwich.New(a.st, a.keys, sandboxwich.WithExecMaxOutput(0)); err == nil {
		t.Fatal("New accepted an output cap of 0")
	}
}

// TestWithoutAgent: a provider with neither agent nor exec (dry-run)
// answers every agent operation with exec_unsupported (501); one with
// its own exec runs commands, streamed once they ended, but neither files,
// launch, a cwd nor root.
func TestWithoutAgent(t *testing.T) {
	e := newEnv(t)
	e = newEnv(t, sandboxwich.WithPools(pool.Config{Name: "dry", TenantID: "acme", Release: e.rel, Target: 1, Provider: fake.New(fake.Config{})}))
	e.plane.Pools().Pass(e.ctx)
	res, _ := e.plane.Claim(e.ctx, "acme", sandboxwich.ClaimRequest{Release: e.rel, Binding: agentBinding})
	a := &agentEnv{env: e, claim: res, id: res.Lease.ID, cell: res.Lease.CellID}
	for op, err := range a.everyOp(res.Proof()) {
		if !errors.Is(err, errcode.ErrExecUnsupported) || errcode.CodeOf(err).HTTPStatus() != 501 {
			t.Errorf("%s on dry-run: %v, want exec_unsupported", op, err)
		}
	}
	if _, err := e.plane.LaunchStatusOf(e.ctx, "acme", a.id); !errors.Is(err, errcode.ErrExecUnsupported) {
		t.Errorf("launch status on dry-run: %v", err)
	}

	prov := &execProvider{Provider: fake.New(fake.Config{Mode: driver.Apply})}
	e = newEnv(t, sandboxwich.WithPools(pool.Config{Name: "p1", TenantID: "acme", Release: e.rel, Target: 1, Provider: prov}))
	e.plane.Pools().Pass(e.ctx)
	res, _ = e.plane.Claim(e.ctx, "acme", sandboxwich.ClaimRequest{Release: e.rel, Binding: agentBinding})
	var chunks []sandboxwich.Output
	out, err := e.plane.ExecStream(e.ctx, "acme", res.Lease.ID, res.Proof(), sandboxwich.ExecRequest{Argv: []string{"echo", "hi"}},
		func(o sandboxwich.Output) error { chunks = append(chunks, o); return nil })
	if err != nil || out.Stdout != nil || out.Reason != sandboxwich.ReasonExited || len(chunks) != 1 || string(chunks[0].Data) != "echo hi" {
		t.Fatalf("stream through the provider's exec: %+v %v %+v", out, err, chunks)
	}
	if _, err := e.plane.Exec(e.ctx, "acme", res.Lease.ID, res.Proof(), sandboxwich.ExecRequest{Argv: []string{"pwd"}, Cwd: "/tmp"}); !errors.Is(err, errcode.ErrInvalidRequest) {
		t.Errorf("cwd without an agent: %v", err)
	}
	if _, err := e.plane.Exec(e.ctx, "acme", res.Lease.ID, res.Proof(), sandboxwich.ExecRequest{Argv: []string{"id"}, User: sandboxwich.UserRoot}); !errors.Is(err, errcode.ErrUserUnsupported) {
		t.Errorf("root without an agent: %v", err)
	}
	if _, _, err := e.plane.Launch(e.ctx, "acme", res.Lease.ID, res.Proof(), sandboxwich.LaunchRequest{Argv: []string{"id"}}); !errors.Is(err, errcode.ErrExecUnsupported) {
		t.Errorf("launch without an agent: %v", err)
	}
	if len(prov.ran) != 1 {
		t.Fatalf("commands run: %v", prov.ran)
	}
}

// liarHost hands out its fake agents wrapped in a liar.
type liarHost struct {
	*fake.AgentProvider
	l *liar
}

func (h liarHost) Agent(ctx context.Context, obj driver.Object) (agent.Conn, error) {
	c, err := h.AgentProvider.Agent(ctx, obj)
	if err != nil {
		return nil, err
	}
	h.l.Conn = c
	return h.l, nil
}

// liar is an agent that serves requests but misreports them, as a
// subverted agent may.
type liar struct {
	agent.Conn
	reason  agent.Reason // reported for every exec, if set
	stdout  []byte       // reported for every exec, if set
	padSize int64        // added to every read's size
	phase   agent.Phase  // reported for every launch status, if set
}

func (l *liar) Exec(ctx context.Context, req agent.ExecRequest, out func(agent.Output) error) (agent.ExecResult, error) {
	if out != nil && l.stdout != nil {
		if err := out(agent.Output{Stream: agent.Stdout, Data: l.stdout}); err != nil {
			return agent.ExecResult{}, err
		}
	}
	res, err := l.Conn.Exec(ctx, req, out)
	if l.reason != "" {
		res.Reason = l.reason
	}
	if l.stdout != nil {
		res.Stdout = l.stdout
	}
	return res, err
}

func (l *liar) ReadFile(ctx context.Context, req agent.ReadRequest) (io.ReadCloser, int64, error) {
	rc, n, err := l.Conn.ReadFile(ctx, req)
	return rc, n + l.padSize, err
}

func (l *liar) LaunchStatus(ctx context.Context, f agent.Fence) (agent.LaunchStatus, error) {
	st, err := l.Conn.LaunchStatus(ctx, f)
	if l.phase != "" {
		st.Phase = l.phase
	}
	return st, err
}

// TestAgentReportsAreNotTrusted: what an agent answers is checked as
// tenant-influenced data. Output beyond the cap is cut, a read yields
// exactly the size announced (and fails when the agent sends less), and
// an answer no agent gives — an exec ended by cell_lost, a read larger
// than asked, a launch in an unknown phase — ends the cell with
// cell_agent_unverified.
func TestAgentReportsAreNotTrusted(t *testing.T) {
	newLiar := func(t *testing.T, l *liar) *agentEnv {
		return newAgentEnvWith(t, func(p *fake.AgentProvider) driver.Provider { return liarHost{p, l} }, sandboxwich.WithExecMaxOutput(4))
	}
	a := newLiar(t, &liar{stdout: []byte("0123456789")})
	if res, err := a.exec("echo"); err != nil || string(res.Stdout) != "0123" || !res.Truncated {
		t.Fatalf("exec with more output than the cap: %+v %v", res, err)
	}
	var streamed []byte
	res, err := a.plane.ExecStream(a.ctx, "acme", a.id, a.claim.Proof(), sandboxwich.ExecRequest{Argv: []string{"echo"}},
		func(o sandboxwich.Output) error { streamed = append(streamed, o.Data...); return nil })
	if err != nil || string(streamed) != "0123" || !res.Truncated || res.Stdout != nil {
		t.Fatalf("stream with more output than the cap: %q %+v %v", streamed, res, err)
	}

	a = newLiar(t, &liar{padSize: 3})
	if _, err := a.plane.WriteFile(a.ctx, "acme", a.id, a.claim.Proof(), sandboxwich.WriteFileRequest{Path: "/f"}, strings.NewReader("abcd")); err != nil {
		t.Fatal(err)
	}
	rc, size, err := a.plane.ReadFile(a.ctx, "acme", a.id, a.claim.Proof(), sandboxwich.ReadFileRequest{Path: "/f"})
	if err != nil || size != 7 {
		t.Fatalf("read: %d %v", size, err)
	}
	if b, err := io.ReadAll(rc); string(b) != "abcd" || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("read of a file shorter than announced: %q %v", b, err)
	}
	if _, _, err := a.plane.ReadFile(a.ctx, "acme", a.id, a.claim.Proof(), sandboxwich.ReadFileRequest{Path: "/f", MaxBytes: 5}); !errors.Is(err, errcode.ErrCellAgentUnverified) {
		t.Fatalf("read announced larger than max_bytes: %v", err)
	}
	a.requireEnded(t)

	a = newLiar(t, &liar{reason: agent.CellLost})
	if _, err := a.exec("echo"); !errors.Is(err, errcode.ErrCellAgentUnverified) {
		t.Fatalf("exec reported cell_lost by the agent: %v", err)
	}
	a.requireEnded(t)

	a = newLiar(t, &liar{phase: "paused"})
	if _, _, err := a.plane.Launch(a.ctx, "acme", a.id, a.claim.Proof(), sandboxwich.LaunchRequest{Argv: []string{"sleep", "1"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.plane.LaunchStatusOf(a.ctx, "acme", a.id); !errors.Is(err, errcode.ErrCellAgentUnverified) {
		t.Fatalf("launch status in an unknown phase: %v", err)
	}
	a.requireEnded(t)
}
