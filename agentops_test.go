package sandboxwich_test

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/errcode"
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
}

func newAgentEnv(t *testing.T, opts ...sandboxwich.Option) *agentEnv {
	t.Helper()
	a := &agentEnv{}
	a.env = newEnv(t)
	a.prov = fake.NewWithAgent(fake.Config{Mode: driver.Apply, Kind: "fake", Now: func() time.Time { return a.now }})
	a.env = newEnv(t, append([]sandboxwich.Option{sandboxwich.WithPools(pool.Config{Name: "p1", TenantID: "acme",
		Release: a.rel, Target: 1, Provider: a.prov})}, opts...)...)
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
	if a.prov.Len() != 0 {
		t.Fatalf("%d provider objects left", a.prov.Len())
	}
}

func TestAgentExecFilesLaunch(t *testing.T) {
	a := newAgentEnv(t)
	out, err := a.plane.Exec(a.ctx, "acme", a.id, a.claim.Proof(), sandboxwich.ExecRequest{Argv: []string{"cat"}, Stdin: []byte("hello")})
	if err != nil || string(out.Stdout) != "hello" || out.Reason != agent.Exited || out.ExitCode != 0 {
		t.Fatalf("exec cat: %+v %v", out, err)
	}
	if out, err = a.exec("exit", "3"); err != nil || out.ExitCode != 3 || out.Reason != agent.Exited {
		t.Fatalf("exec exit 3: %+v %v", out, err)
	}
	out, err = a.plane.Exec(a.ctx, "acme", a.id, a.claim.Proof(), sandboxwich.ExecRequest{Argv: []string{"pwd"}, Cwd: "/tmp", User: agent.UserRoot})
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
	for st.Phase != agent.Terminal {
		if st, err = a.plane.LaunchStatusOf(a.ctx, "acme", a.id); err != nil {
			t.Fatalf("launch status: %v", err)
		}
	}
	if *st.ExitCode != 0 || *st.Reason != agent.Exited {
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
