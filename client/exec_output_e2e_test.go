package client_test

import (
	"context"
	"errors"
	"testing"

	"github.com/sandboxwich/sandboxwich/client"
	"github.com/sandboxwich/sandboxwich/errcode"
)

// TestE2EExecMaxOutputBytes: Command.MaxOutputBytes reaches the server
// (Run and ExecStream), the answer states the cap that applied, the
// server's refusals reach the caller as their codes, and zero keeps the
// server's default.
func TestE2EExecMaxOutputBytes(t *testing.T) {
	e := startAgentE2E(t, 1)
	ctx := context.Background()
	c := e.client(t)
	cl := e.claim(t, c)
	id, proof := cl.Lease.LeaseID, cl.Proof()
	emit := []string{"emit", "3145728"}

	r, err := c.Run(ctx, id, proof, client.Command{Argv: emit, MaxOutputBytes: 4 << 20})
	if err != nil || len(r.Stdout) != 3<<20 || r.Truncated || r.MaxOutputBytes != 4<<20 {
		t.Fatalf("Run with 4 MiB: %d bytes, truncated %v, cap %d, %v", len(r.Stdout), r.Truncated, r.MaxOutputBytes, err)
	}
	n := 0
	s, err := c.ExecStream(ctx, id, proof, client.Command{Argv: emit, MaxOutputBytes: 4 << 20}, func(o client.Output) error {
		n += len(o.Data)
		return nil
	})
	if err != nil || n != 3<<20 || s.Truncated || s.MaxOutputBytes != 4<<20 {
		t.Fatalf("ExecStream with 4 MiB: %d bytes, %+v, %v", n, s, err)
	}
	r, err = c.Run(ctx, id, proof, client.Command{Argv: emit})
	if err != nil || len(r.Stdout) != 1<<20 || !r.Truncated || r.MaxOutputBytes != 1<<20 {
		t.Fatalf("Run with the default cap: %d bytes, truncated %v, cap %d, %v", len(r.Stdout), r.Truncated, r.MaxOutputBytes, err)
	}
	if _, err := c.Run(ctx, id, proof, client.Command{Argv: emit, MaxOutputBytes: 16<<20 + 1}); !errors.Is(err, errcode.ErrInvalidRequest) {
		t.Fatalf("above the ceiling: %v", err)
	}
	if _, err := c.Run(ctx, id, proof, client.Command{Argv: emit, MaxOutputBytes: 2 << 20, IdempotencyKey: "k"}); !errors.Is(err, errcode.ErrInvalidIdempotencyKey) {
		t.Fatalf("2 MiB with a key: %v", err)
	}
	if _, err := c.Run(ctx, id, proof, client.Command{Argv: emit, MaxOutputBytes: -1}); err == nil {
		t.Fatal("a negative cap was sent")
	}
}
