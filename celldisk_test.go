package sandboxwich_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich/client"
	"github.com/sandboxwich/sandboxwich/driver/gvisor"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/httpapi"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/wire"
)

// TestFullCellDisk leases a real gVisor cell whose writable storage is
// bounded (cell_disk_bytes, CONTRACT §25) and fills it through the HTTP
// API and the Go client: a command that fills /tmp exits non-zero with
// ENOSPC, a files/write larger than the space left answers 507
// insufficient_storage, and after both the lease is still live and its
// cell still runs commands (issue 40: a full disk killed the cell).
func TestFullCellDisk(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const disk = 32 << 20 // /home/cell 12 MiB, /tmp 8 MiB
	g := startGVisorPlane(t, ctx, "disk", gvisor.Config{MemoryLimitBytes: 256 << 20, CellDiskBytes: disk})
	plane, rel := g.Plane, g.rel
	quiet := slog.New(slog.DiscardHandler)
	const token = "disk-tenant-token"
	h, err := httpapi.New(httpapi.Config{Plane: plane, Logger: quiet, Auth: httpapi.Auth{TenantTokens: map[string]string{token: "acme"}}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c, err := client.New(srv.URL, client.WithToken(token))
	if err != nil {
		t.Fatal(err)
	}

	var cl client.Claim
	for cl.Empty() {
		if ctx.Err() != nil {
			t.Fatal("no cell became ready")
		}
		if cl, err = c.Claim(ctx, wire.ClaimRequest{Release: rel, Binding: wire.Binding{
			OrganizationID: "org-1", WorkspaceID: "ws-1", ThreadID: "thread-1", RunnerSessionID: "session-1"}}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	id, proof := cl.Lease.LeaseID, cl.Proof()
	alive := func(when string) {
		t.Helper()
		res, err := c.Run(ctx, id, proof, client.Command{Argv: []string{"echo", "alive"}})
		if err != nil || string(res.Stdout) != "alive\n" {
			t.Fatalf("%s: echo = %+v, %v; want the cell to answer", when, res, err)
		}
	}

	res, err := c.Run(ctx, id, proof, client.Command{Argv: []string{"sh", "-c", "head -c 50000000 /dev/zero > /tmp/fill"}})
	if err != nil || res.ExitCode == 0 || !strings.Contains(string(res.Stderr), "No space left") {
		t.Errorf("filling /tmp: %+v, %v; want a non-zero exit with ENOSPC", res, err)
	}
	alive("after /tmp filled")

	_, err = c.WriteFile(ctx, id, proof, client.FileWrite{Path: "/home/cell/big"}, strings.NewReader(strings.Repeat("x", 20<<20)))
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != http.StatusInsufficientStorage || !errors.Is(err, errcode.ErrInsufficientStorage) {
		t.Errorf("a write larger than the space left: %v, want 507 insufficient_storage", err)
	}
	alive("after a write past the space left")
	st, err := c.Lease(ctx, id)
	if err != nil || st.State != lease.Leased || st.Disposition != nil {
		t.Errorf("lease status after a full disk: %+v, %v; want it still leased", st, err)
	}
}
