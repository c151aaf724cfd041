package client_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/client"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/httpapi"
	"github.com/sandboxwich/sandboxwich/internal/testenv"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
	"github.com/sandboxwich/sandboxwich/wire"
)

// agentE2E is the real server over SQLite whose pool's cells run the fake
// cell agent, with leases claimed through the client.
type agentE2E struct {
	url  string
	prov *fake.AgentProvider
	rel  wire.Release
	// dropLaunches, while positive, loses the answer of that many launches
	// after the server carried them out.
	dropLaunches atomic.Int32
}

func startAgentE2E(t *testing.T, cells int) *agentE2E {
	t.Helper()
	st, keys := testenv.SQLite(t), testenv.Keyring(t)
	quiet := slog.New(slog.DiscardHandler)
	e := &agentE2E{prov: fake.NewWithAgent(fake.Config{Mode: driver.Apply, Kind: "fake"})}
	e.rel = testenv.Release(keys, lease.GVisorLowerRisk)
	plane, err := sandboxwich.New(st, keys, sandboxwich.WithLogger(quiet), sandboxwich.WithPools(pool.Config{
		Name: testPool, TenantID: "acme", Release: e.rel, Target: cells, Provider: e.prov}))
	if err != nil {
		t.Fatal(err)
	}
	plane.Pools().Pass(t.Context())
	h, err := httpapi.New(httpapi.Config{Plane: plane, Logger: quiet, Auth: httpapi.Auth{TenantTokens: map[string]string{tenantToken: "acme"}}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/launch") && e.dropLaunches.Add(-1) >= 0 {
			h.ServeHTTP(httptest.NewRecorder(), r) // carried out, answer lost
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				_ = conn.Close()
			}
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	e.url = srv.URL
	return e
}

func (e *agentE2E) claim(t *testing.T, c *client.Client) client.Claim {
	t.Helper()
	cl, err := c.Claim(context.Background(), wire.ClaimRequest{Release: e.rel, Binding: wire.Binding{
		OrganizationID: "org-1", WorkspaceID: "workspace-1", ThreadID: "thread-1", RunnerSessionID: "session-1"}})
	if err != nil || cl.Empty() {
		t.Fatalf("claim: %v %v", cl, err)
	}
	return cl
}

func (e *agentE2E) client(t *testing.T) *client.Client {
	t.Helper()
	c, err := client.New(e.url, client.WithToken(tenantToken), client.WithRetry(5, time.Millisecond, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (e *agentE2E) ops(op string) int {
	n := 0
	for _, m := range e.prov.Received() {
		if m.Op == op {
			n++
		}
	}
	return n
}

// TestE2EExecStreamAndRun: output streamed chunk by chunk in order, exit
// codes, cwd and user, and an idempotent Run that the cell runs once.
func TestE2EExecStreamAndRun(t *testing.T) {
	e := startAgentE2E(t, 1)
	ctx := context.Background()
	c := e.client(t)
	cl := e.claim(t, c)
	id, proof := cl.Lease.LeaseID, cl.Proof()

	var chunks []string
	res, err := c.ExecStream(ctx, id, proof, client.Command{Argv: []string{"echo", "a", "b", "c"}}, func(o client.Output) error {
		chunks = append(chunks, string(o.Stream)+":"+string(o.Data))
		return nil
	})
	if err != nil || res.ExitCode != 0 || res.Reason != wire.ReasonExited || res.Stdout != nil {
		t.Fatalf("ExecStream = %+v, %v", res, err)
	}
	if strings.Join(chunks, "|") != "stdout:a |stdout:b |stdout:c\n" {
		t.Errorf("chunks %q", chunks)
	}
	var stderr bytes.Buffer
	res, err = c.ExecStream(ctx, id, proof, client.Command{Argv: []string{"nope"}}, func(o client.Output) error {
		if o.Stream == client.Stderr {
			stderr.Write(o.Data)
		}
		return nil
	})
	if err != nil || res.ExitCode != 127 || !strings.Contains(stderr.String(), "not found") {
		t.Errorf("a missing command: %+v %v %q", res, err, stderr.String())
	}
	stop := errors.New("stop")
	if _, err := c.ExecStream(ctx, id, proof, client.Command{Argv: []string{"echo", "x"}}, func(client.Output) error { return stop }); !errors.Is(err, stop) {
		t.Errorf("a callback's error: %v", err)
	}

	r, err := c.Run(ctx, id, proof, client.Command{Argv: []string{"pwd"}, Cwd: "/opt", User: wire.UserRoot})
	if err != nil || string(r.Stdout) != "/opt\n" {
		t.Errorf("Run pwd = %+v %v", r, err)
	}
	before := e.ops("exec")
	cmd := client.Command{Argv: []string{"cat"}, Stdin: []byte("once"), IdempotencyKey: "run-once"}
	r1, err1 := c.Run(ctx, id, proof, cmd)
	r2, err2 := c.Run(ctx, id, proof, cmd)
	if err1 != nil || err2 != nil || string(r1.Stdout) != "once" || string(r2.Stdout) != "once" || e.ops("exec") != before+1 {
		t.Errorf("idempotent Run: %q %v, %q %v; the cell ran %d", r1.Stdout, err1, r2.Stdout, err2, e.ops("exec")-before)
	}
}

// TestE2EFiles: WriteFile from a plain reader and ReadFile back, byte for
// byte; the new codes reach the caller as their sentinels.
func TestE2EFiles(t *testing.T) {
	e := startAgentE2E(t, 1)
	ctx := context.Background()
	c := e.client(t)
	cl := e.claim(t, c)
	id, proof := cl.Lease.LeaseID, cl.Proof()

	data := make([]byte, 3<<20+17)
	for i := range data {
		data[i] = byte(i ^ i>>11)
	}
	info, err := c.WriteFile(ctx, id, proof, client.FileWrite{Path: "/data/in.bin", Mode: 0o600}, io.MultiReader(bytes.NewReader(data[:5]), bytes.NewReader(data[5:])))
	sum := sha256.Sum256(data)
	if err != nil || info.Size != int64(len(data)) || info.SHA256 != hex.EncodeToString(sum[:]) || info.Path != "/data/in.bin" {
		t.Fatalf("WriteFile = %+v, %v", info, err)
	}
	rc, size, err := c.ReadFile(ctx, id, proof, client.FileRead{Path: "/data/in.bin"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	_ = rc.Close()
	if err != nil || size != int64(len(data)) || !bytes.Equal(got, data) {
		t.Errorf("ReadFile: %d of %d bytes, %v", len(got), size, err)
	}
	if _, _, err := c.ReadFile(ctx, id, proof, client.FileRead{Path: "/data/in.bin", MaxBytes: 10}); !errors.Is(err, errcode.ErrPayloadTooLarge) {
		t.Errorf("over MaxBytes: %v", err)
	}
	if _, _, err := c.ReadFile(ctx, id, proof, client.FileRead{Path: "/missing"}); !errors.Is(err, errcode.ErrFileNotFound) {
		t.Errorf("a missing file: %v", err)
	}
	bad := proof
	bad.LeaseAttestation += "x"
	if _, err := c.WriteFile(ctx, id, bad, client.FileWrite{Path: "/x"}, strings.NewReader("x")); !errors.Is(err, errcode.ErrConflict) {
		t.Errorf("a wrong fence: %v", err)
	}
	e.prov.SetAgentFaults(fake.AgentFaults{Answer: agent.Errorf(agent.CodeNoSpace, "no space left")})
	if _, err := c.WriteFile(ctx, id, proof, client.FileWrite{Path: "/x"}, strings.NewReader("x")); !errors.Is(err, errcode.ErrInsufficientStorage) {
		t.Errorf("a full cell: %v", err)
	}
}

// TestE2ELaunch: a lost launch answer is retried into the same launch;
// WaitLaunch follows it to its exit; another spec is a conflict.
func TestE2ELaunch(t *testing.T) {
	e := startAgentE2E(t, 1)
	ctx := context.Background()
	c := e.client(t)
	cl := e.claim(t, c)
	id, proof := cl.Lease.LeaseID, cl.Proof()
	if _, err := c.LaunchStatus(ctx, id); !errors.Is(err, errcode.ErrNotFound) {
		t.Errorf("status before a launch: %v", err)
	}
	e.dropLaunches.Store(1)
	spec := client.LaunchSpec{Argv: []string{"exit", "6"}}
	l, err := c.Launch(ctx, id, proof, spec)
	if err != nil || l.PID == nil {
		t.Fatalf("Launch after a lost answer = %+v, %v", l, err)
	}
	if n := e.ops("launch"); n != 2 {
		t.Errorf("%d launch requests reached the cell, want the first and its replay", n)
	}
	l, err = c.WaitLaunch(ctx, id, time.Millisecond)
	if err != nil || l.Phase != wire.PhaseTerminal || l.ExitCode == nil || *l.ExitCode != 6 || *l.Reason != wire.ReasonExited {
		t.Errorf("WaitLaunch = %+v, %v", l, err)
	}
	if _, err := c.Launch(ctx, id, proof, client.LaunchSpec{Argv: []string{"exit", "7"}}); !errors.Is(err, errcode.ErrConflict) {
		t.Errorf("another spec: %v", err)
	}
}
