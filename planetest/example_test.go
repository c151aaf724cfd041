package planetest_test

import (
	"context"
	"fmt"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/planetest"
)

// A harness's test claims a cell of the kit's plane, runs a command in it
// and releases it.
func Example() {
	ctx := context.Background()
	// In a test: env := planetest.New(t, planetest.Options{Cells: 2})
	env, err := planetest.Start(ctx, planetest.Options{Cells: 2})
	if err != nil {
		fmt.Println("start:", err)
		return
	}
	defer env.Close()

	res, err := env.Plane.Claim(ctx, env.Tenant, sandboxwich.ClaimRequest{
		ClaimID: uuid.Must(uuid.NewV7()), Release: env.Release, Binding: env.Binding})
	if err != nil || res.Lease == nil {
		fmt.Println("claim:", err)
		return
	}
	out, err := env.Plane.Exec(ctx, env.Tenant, res.Lease.ID, res.Proof(), sandboxwich.ExecRequest{Argv: []string{"echo", "hello"}})
	if err != nil {
		fmt.Println("exec:", err)
		return
	}
	fmt.Printf("exit %d: %s", out.ExitCode, out.Stdout)

	st, err := env.Plane.Release(ctx, env.Tenant, res.Lease.ID, res.Proof(), lease.Destroyed)
	if err != nil {
		fmt.Println("release:", err)
		return
	}
	fmt.Println("released:", st.State)
	// Output:
	// exit 0: hello
	// released: leased
}
