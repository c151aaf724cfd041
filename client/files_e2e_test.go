package client_test

import (
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/client"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/httpapi"
	"github.com/sandboxwich/sandboxwich/internal/testenv"
	"github.com/sandboxwich/sandboxwich/internal/testenv/agentproto"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
)

// zeroes yields n zero bytes without holding them, then fails with err
// (io.EOF: a clean end).
type zeroes struct {
	n   int64
	err error
}

func (z *zeroes) Read(p []byte) (int, error) {
	if z.n <= 0 {
		return 0, z.err
	}
	k := min(int64(len(p)), z.n)
	clear(p[:k])
	z.n -= k
	return int(k), nil
}

// TestE2EFileWriteRefusedWritesNothing: through the Go client and the
// real agent protocol, a write over 256 MiB (413), one whose content
// fails part-way and one to a directory path each leave the cell's old
// file as it was (issue 40).
func TestE2EFileWriteRefusedWritesNothing(t *testing.T) {
	st, keys := testenv.SQLite(t), testenv.Keyring(t)
	quiet := slog.New(slog.DiscardHandler)
	prov := agentproto.New(t, fake.NewWithAgent(fake.Config{Mode: driver.Apply, Kind: "fake"}))
	e := &agentE2E{rel: testenv.Release(keys, lease.GVisorLowerRisk)}
	plane, err := sandboxwich.New(st, keys, sandboxwich.WithLogger(quiet), sandboxwich.WithPools(pool.Config{
		Name: testPool, TenantID: "acme", Release: e.rel, Target: 1, Provider: prov}))
	if err != nil {
		t.Fatal(err)
	}
	plane.Pools().Pass(t.Context())
	h, err := httpapi.New(httpapi.Config{Plane: plane, Logger: quiet, Auth: httpapi.Auth{TenantTokens: map[string]string{tenantToken: "acme"}}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	e.url = srv.URL
	ctx := t.Context()
	c := e.client(t)
	cl := e.claim(t, c)
	id, proof := cl.Lease.LeaseID, cl.Proof()
	read := func(path string) string {
		t.Helper()
		rc, _, err := c.ReadFile(ctx, id, proof, client.FileRead{Path: path})
		if err != nil {
			t.Fatalf("ReadFile %s: %v", path, err)
		}
		defer rc.Close()
		b, err := io.ReadAll(rc)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	const path = "/data/f"
	if _, err := c.WriteFile(ctx, id, proof, client.FileWrite{Path: path}, strings.NewReader("old")); err != nil {
		t.Fatal(err)
	}

	if _, err := c.WriteFile(ctx, id, proof, client.FileWrite{Path: path}, &zeroes{n: httpapi.MaxFileBytes + 1, err: io.EOF}); !errors.Is(err, errcode.ErrPayloadTooLarge) {
		t.Errorf("257 MiB: %v, want payload_too_large", err)
	}
	if fi, ok := prov.Large(path); ok || read(path) != "old" {
		t.Errorf("after a 413 the cell holds %+v", fi)
	}

	broken := errors.New("the source failed")
	if _, err := c.WriteFile(ctx, id, proof, client.FileWrite{Path: path}, &zeroes{n: 300 << 10, err: broken}); err == nil {
		t.Error("a write whose content failed succeeded")
	}
	if got := read(path); got != "old" {
		t.Errorf("after a failed content the file holds %d bytes, want the old content", len(got))
	}

	if _, err := c.WriteFile(ctx, id, proof, client.FileWrite{Path: "/data/"}, strings.NewReader("x")); !errors.Is(err, errcode.ErrInvalidRequest) {
		t.Errorf("a directory path: %v, want invalid_request", err)
	}
}
