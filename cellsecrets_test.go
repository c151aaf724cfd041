package sandboxwich_test

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/driver/gvisor"
	"github.com/sandboxwich/sandboxwich/internal/testenv"
	"github.com/sandboxwich/sandboxwich/lease"
)

// TestNoSecretReachesARealCell leases a real gVisor cell through the
// plane, uses every operation that reaches its agent (exec as both users,
// a file written and read, a launch), and then looks for the lease's
// secrets where a workload could find them: every message the agent
// received (recorded by the test hook), the environment and command line
// of every process in the cell (/proc/*/environ, /proc/*/cmdline, read as
// root), and the cell's writable filesystem. None may hold the raw
// attestation, its digest, any value of the binding tuple, the release
// signature or the signing key.
func TestNoSecretReachesARealCell(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	g := startGVisorPlane(t, ctx, "secrets", gvisor.Config{RecordAgentMessages: true})
	plane, prov, rel := g.Plane, g.prov, g.rel

	binding := lease.Binding{OrganizationID: "org-canary-5d1e", WorkspaceID: "ws-canary-8b2a",
		ThreadID: "thread-canary-33f0", RunnerSessionID: "session-canary-c47d"}
	res := g.claim(ctx, t, binding)
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
	}

	run := func(user sandboxwich.User, argv ...string) sandboxwich.ExecResult {
		t.Helper()
		r, err := plane.Exec(ctx, "acme", id, pr, sandboxwich.ExecRequest{Argv: argv, User: user, Timeout: time.Minute})
		if err != nil || r.ExitCode != 0 {
			t.Fatalf("%q: %+v, %v", argv, r, err)
		}
		return r
	}
	run(sandboxwich.UserCell, "sh", "-c", "echo hi; env")
	if _, err := plane.WriteFile(ctx, "acme", id, pr, sandboxwich.WriteFileRequest{Path: "/home/cell/in/data.txt"},
		strings.NewReader("ordinary content")); err != nil {
		t.Fatal(err)
	}
	rc, _, err := plane.ReadFile(ctx, "acme", id, pr, sandboxwich.ReadFileRequest{Path: "/home/cell/in/data.txt"})
	if err != nil {
		t.Fatal(err)
	}
	rc.Close()
	if _, _, err := plane.Launch(ctx, "acme", id, pr, sandboxwich.LaunchRequest{Argv: []string{"sleep", "60"}}); err != nil {
		t.Fatal(err)
	}
	// What a root workload can see: every process's environment and
	// command line (the agent's included), and every writable file.
	seen := run(sandboxwich.UserRoot, "sh", "-c",
		`for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do cat "$f" 2>/dev/null; echo; done; `+
			`find /tmp /home /root /run /dev/shm /etc -type f 2>/dev/null | while read -r f; do cat "$f" 2>/dev/null; done`)
	if !bytes.Contains(seen.Stdout, []byte("ordinary content")) {
		t.Fatalf("the scan did not read the cell's files: %.300q", seen.Stdout)
	}
	msgs, err := agentMessages(ctx, prov, res.Lease.CellID)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(msgs, []byte(id.String())) || !bytes.Contains(msgs, []byte("ordinary content")) {
		t.Fatalf("the agent's record lacks the activation or the file: %.300q", msgs)
	}
	for what, in := range map[string][]byte{"the agent's messages": msgs, "the cell (processes and files)": seen.Stdout} {
		for name, needle := range needles {
			if needle != "" && bytes.Contains(in, []byte(needle)) {
				t.Errorf("%s hold %s", what, name)
			}
		}
	}
}

// agentMessages reads the record of the agent of cell's object, found by
// the provider's own listing.
func agentMessages(ctx context.Context, prov *gvisor.Provider, cell uuid.UUID) ([]byte, error) {
	objs, err := prov.List(ctx)
	if err != nil {
		return nil, err
	}
	for _, o := range objs {
		if o.CellID == cell {
			return prov.AgentMessages(o)
		}
	}
	return nil, os.ErrNotExist
}
