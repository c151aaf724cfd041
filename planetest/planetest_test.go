package planetest_test

import (
	"testing"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/planetest"
)

func TestNew(t *testing.T) {
	env := planetest.New(t, planetest.Options{Cells: 2, Tenant: "globex", RuntimeClass: lease.KataMicroVM})
	if env.Release.RuntimeClass != lease.KataMicroVM || env.Tenant != "globex" {
		t.Fatalf("env: %+v", env)
	}
	ctx := t.Context()
	// Both cells are ready when New returns: two claims lease two cells.
	cells := map[uuid.UUID]bool{}
	for i := range 2 {
		res, err := env.Plane.Claim(ctx, env.Tenant, sandboxwich.ClaimRequest{ClaimID: uuid.New(), Release: env.Release, Binding: env.Binding})
		if err != nil || res.Lease == nil {
			t.Fatalf("claim %d: %+v %v", i, res, err)
		}
		cells[res.Lease.CellID] = true
		out, err := env.Plane.Exec(ctx, env.Tenant, res.Lease.ID, res.Proof(), sandboxwich.ExecRequest{Argv: []string{"whoami"}})
		if err != nil || string(out.Stdout) != "cell\n" {
			t.Fatalf("exec: %+v %v", out, err)
		}
	}
	if len(cells) != 2 {
		t.Fatalf("two claims leased %d cells", len(cells))
	}
	if n := env.Provider.Calls("provision"); n < 2 {
		t.Fatalf("the fake provisioned %d cells, want at least 2", n)
	}
}
