package httpapi

import (
	"bytes"
	"context"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
	"github.com/sandboxwich/sandboxwich/wire"
)

// execProvider is the fake provider with an exec that echoes: stdout is
// stdin, stderr the argv, exit code 3.
type execProvider struct{ *fake.Provider }

func (execProvider) Exec(_ context.Context, _ driver.Object, req driver.ExecRequest) (driver.ExecResult, error) {
	return driver.ExecResult{ExitCode: 3, Stdout: req.Stdin, Stderr: []byte(strings.Join(req.Argv, " ")),
		Duration: 5 * time.Millisecond}, nil
}

// TestPoolExec: a real pool (fake dry-run provider): exec, its idempotent
// replay, runtime drift, release and proven deletion.
func TestPoolExec(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		prov := execProvider{fake.New(fake.Config{})}
		rel := signedRelease(t, lease.GVisorLowerRisk)
		e := newEnvWith(t, b, []sandboxwich.Option{sandboxwich.WithPools(pool.Config{
			Name: "p1", TenantID: "acme", Release: rel, Target: 2, Provider: prov,
		})})
		ctx := context.Background()
		e.plane.Pools().Pass(ctx)

		c := e.claim(tokAcme, nil, lease.GVisorLowerRisk)
		if c.Lease == nil {
			t.Fatal("no pool cell was leased")
		}
		r := e.do("GET", leasePath(c.Lease.LeaseID, ""), tokAcme, nil).must(t, 200)
		if st := decodeAs[wire.StatusResponse](t, r).Status; st.ProviderMode != "dry_run" {
			t.Errorf("provider_mode from the plane: %s", r.body)
		}

		exec := with(proofBody(c), "argv", []string{"echo", "hi"}, "stdin_base64", base64.StdEncoding.EncodeToString([]byte("hello")))
		r1 := e.do("POST", leasePath(c.Lease.LeaseID, "/exec"), tokAcme, exec, idemHeader, "exec-ok").must(t, 200)
		checkSchema(t, "ExecResponse", r1.body)
		want := `{"ok":true,"exit_code":3,"truncated":false,"max_output_bytes":1048576,"duration_ms":5,"timed_out":false,"signal":null,"reason":"exited",` +
			`"stdout_base64":"aGVsbG8=","stderr_base64":"` + base64.StdEncoding.EncodeToString([]byte("echo hi")) + `"}`
		if string(r1.body) != want {
			t.Errorf("exec\n got %s\nwant %s", r1.body, want)
		}
		r2 := e.do("POST", leasePath(c.Lease.LeaseID, "/exec"), tokAcme, exec, idemHeader, "exec-ok").must(t, 200)
		if !bytes.Equal(r1.body, r2.body) {
			t.Errorf("exec replay differs: %s", r2.body)
		}

		// Runtime drift ends the cell.
		c2 := e.claim(tokAcme, nil, lease.GVisorLowerRisk)
		prov.Drift(c2.Lease.CellID, lease.KataMicroVM)
		e.do("POST", leasePath(c2.Lease.LeaseID, "/exec"), tokAcme, with(proofBody(c2), "argv", []string{"id"})).
			errCode(t, 409, "runtime_class_boundary_unverified")
		if st := decodeAs[wire.StatusResponse](t, e.do("GET", leasePath(c2.Lease.LeaseID, ""), tokAcme, nil).must(t, 200)).Status; st.State != lease.Quarantined {
			t.Errorf("drifted cell is %s", st.State)
		}

		// Release, then the pool proves deletion.
		e.do("POST", leasePath(c.Lease.LeaseID, "/release"), tokAcme, with(proofBody(c), "disposition", "destroyed")).must(t, 202)
		e.plane.Pools().Pass(ctx)
		r = e.do("GET", leasePath(c.Lease.LeaseID, ""), tokAcme, nil).must(t, 200)
		want = `{"ok":true,"status":{"lease_id":"` + c.Lease.LeaseID.String() + `","cell_id":"` + c.Lease.CellID.String() +
			`","generation":2,"state":"destroyed","disposition":"destroyed","provider_absent":true,"cleanup_pending":false,"provider_mode":"dry_run"}}`
		if string(r.body) != want {
			t.Errorf("status after deletion\n got %s\nwant %s", r.body, want)
		}
		e.do("POST", leasePath(c.Lease.LeaseID, "/release"), tokAcme, with(proofBody(c), "disposition", "destroyed")).errCode(t, 409, "conflict")
	})
}
