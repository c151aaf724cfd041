package cloudflare_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/internal/testenv"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
)

// TestPlaneNoSecretReachesTheCell runs the real plane (a SQLite store,
// the pool reconciler) over the driver, the bridge in a local workerd and
// the real agent: the pool admits a Cloudflare cell (its agent's status
// and digest verified through the bridge), a claim leases it, and every
// operation that reaches the agent runs through the plane. Then it looks
// for the lease's secrets where a workload, the container or the bridge
// could hold them: every request the agent received (its -record file),
// every process's environment and command line and the cell's private
// /tmp and /home (read as root in the cell), and the bridge's log. None may hold
// the raw attestation, its digest, any value of the binding tuple, the
// release signature, the signing key or either token.
func TestPlaneNoSecretReachesTheCell(t *testing.T) {
	env := startBridge(t)
	api := newFakeAPI(t)
	prov := newProvider(t, config(t, env, api, "plane"))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	keys := testenv.Keyring(t)
	rel := testenv.Release(keys, testClass)
	plane, err := sandboxwich.New(testenv.SQLite(t), keys, sandboxwich.WithLogger(slog.New(slog.DiscardHandler)),
		sandboxwich.WithPools(pool.Config{Name: "cf", TenantID: "acme", Release: rel, Target: 1, Provider: prov}),
		sandboxwich.WithPoolOptions(pool.WithInterval(50*time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = plane.Run(runCtx) }()
	t.Cleanup(func() {
		_ = plane.Pools().SetTarget("cf", 0)
		dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
		defer dcancel()
		_ = plane.Pools().Drain(dctx)
		stop()
		<-done
		left, err := prov.List(dctx)
		if err != nil || len(left) != 0 {
			t.Errorf("cells left after the drain: %v %v", left, err)
		}
	})

	binding := lease.Binding{OrganizationID: "org-canary-9c1f", WorkspaceID: "ws-canary-4e7a",
		ThreadID: "thread-canary-0b2d", RunnerSessionID: "session-canary-a6e3"}
	var res sandboxwich.ClaimResult
	for res.Lease == nil {
		if ctx.Err() != nil {
			t.Fatal("no Cloudflare cell became ready")
		}
		if res, err = plane.Claim(ctx, "acme", sandboxwich.ClaimRequest{ClaimID: uuid.Must(uuid.NewV7()), Release: rel, Binding: binding}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	pr, id := res.Proof(), res.Lease.ID
	att := res.Attestation()
	needles := map[string]string{
		"the attestation":          att,
		"the attestation's body":   strings.TrimPrefix(att, "swla1_"),
		"the attestation's digest": attest.Digest(att),
		"the release signature":    rel.Signature,
		"the signing key":          testenv.Key,
		"the organization":         binding.OrganizationID,
		"the workspace":            binding.WorkspaceID,
		"the thread":               binding.ThreadID,
		"the session":              binding.RunnerSessionID,
		"the bridge token":         testToken,
		"the API token":            testAPITok,
	}

	run := func(user agent.User, argv ...string) sandboxwich.ExecResult {
		t.Helper()
		r, err := plane.Exec(ctx, "acme", id, pr, sandboxwich.ExecRequest{Argv: argv, User: sandboxwich.User(user), Timeout: time.Minute})
		if err != nil || r.ExitCode != 0 {
			t.Fatalf("%q: %+v, %v", argv, r, err)
		}
		return r
	}
	if out := run(agent.UserCell, "sh", "-c", "echo hi; env"); !bytes.HasPrefix(out.Stdout, []byte("hi\n")) {
		t.Fatalf("exec through the plane: %q", out.Stdout)
	}
	if _, err := plane.WriteFile(ctx, "acme", id, pr, sandboxwich.WriteFileRequest{Path: "/home/cell/in/data.txt"},
		strings.NewReader("ordinary content")); err != nil {
		t.Fatal(err)
	}
	rc, _, err := plane.ReadFile(ctx, "acme", id, pr, sandboxwich.ReadFileRequest{Path: "/home/cell/in/data.txt"})
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(rc); string(b) != "ordinary content" {
		t.Fatalf("read back %q", b)
	}
	rc.Close()
	if _, _, err := plane.Launch(ctx, "acme", id, pr, sandboxwich.LaunchRequest{Argv: []string{"sleep", "60"}}); err != nil {
		t.Fatal(err)
	}
	seen := run(agent.UserRoot, "sh", "-c",
		`for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do cat "$f" 2>/dev/null; echo; done; `+
			// The loopback container's own writable places (the rest of
			// its filesystem is the test host's).
			`find /tmp /home -type f 2>/dev/null | while read -r f; do cat "$f" 2>/dev/null; done`)
	if !bytes.Contains(seen.Stdout, []byte("ordinary content")) {
		t.Fatalf("the scan did not read the cell's files: %.300q", seen.Stdout)
	}
	resp, err := http.Get(env.Manager + "/containers/" + res.Lease.CellID.String() + "/record")
	if err != nil {
		t.Fatal(err)
	}
	msgs, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Contains(msgs, []byte(id.String())) || !bytes.Contains(msgs, []byte("ordinary content")) {
		t.Fatalf("the agent's record lacks the activation or the file: %.300q", msgs)
	}
	for what, in := range map[string][]byte{"the agent's messages": msgs, "the cell (processes and files)": seen.Stdout,
		"the bridge's log": []byte(env.stderr.String())} {
		for name, needle := range needles {
			if needle != "" && bytes.Contains(in, []byte(needle)) {
				t.Errorf("%s hold %s", what, name)
			}
		}
	}
}

// TestPlaneUnprovenDeploymentNotAdmitted: when the read-back does not
// prove the deployment (here the container application runs another
// image), the pool admits no cell: each is stopped as
// runtime_class_boundary_unverified and destroyed with proof, and a claim
// finds nothing.
func TestPlaneUnprovenDeploymentNotAdmitted(t *testing.T) {
	env := startBridge(t)
	api := newFakeAPI(t)
	api.set(func(f *fakeAPI) {
		f.app["configuration"] = map[string]any{"image": "registry.example/other@sha256:" + strings.Repeat("9", 64), "instance_type": "basic"}
	})
	prov := newProvider(t, config(t, env, api, "unproven"))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	keys := testenv.Keyring(t)
	rel := testenv.Release(keys, testClass)
	st := testenv.SQLite(t)
	logs := &testenv.Buffer{}
	plane, err := sandboxwich.New(st, keys, sandboxwich.WithLogger(slog.New(slog.NewTextHandler(logs, nil))),
		sandboxwich.WithPools(pool.Config{Name: "cf", TenantID: "acme", Release: rel, Target: 1, Provider: prov}),
		sandboxwich.WithPoolOptions(pool.WithProvisionTimeout(time.Minute), pool.WithDestroyTimeout(30*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		plane.Pools().Pass(ctx)
	}
	ms, err := st.Members(ctx, "cf")
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) == 0 {
		t.Fatal("the pool provisioned nothing")
	}
	for _, m := range ms {
		if m.State == lease.MemberReady || m.State == lease.MemberLeased {
			t.Fatalf("member %s admitted (%s) on an unproven deployment", m.CellID, m.State)
		}
		stopped := false
		for _, line := range strings.Split(logs.String(), "\n") {
			stopped = stopped || strings.Contains(line, "cell stopping") && strings.Contains(line, m.CellID.String()) &&
				strings.Contains(line, "runtime class boundary unverified")
		}
		if m.State != lease.MemberQuarantined || !stopped {
			t.Errorf("member %s: %s, want quarantined with the boundary unverified; logs:\n%s", m.CellID, m.State, logs.String())
		}
	}
	res, err := plane.Claim(ctx, "acme", sandboxwich.ClaimRequest{ClaimID: uuid.Must(uuid.NewV7()), Release: rel,
		Binding: lease.Binding{OrganizationID: "o", WorkspaceID: "w", ThreadID: "t", RunnerSessionID: "s"}})
	if err != nil || res.Lease != nil {
		t.Fatalf("claim on an unproven deployment: %+v, %v", res.Lease, err)
	}
	_ = plane.Pools().SetTarget("cf", 0)
	if err := plane.Pools().Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if left, err := prov.List(ctx); err != nil || len(left) != 0 {
		t.Fatalf("cells left: %v %v", left, err)
	}
}
