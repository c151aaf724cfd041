// Command evalharness runs one evaluation step the way a harness embedding
// Sandboxwich in-process would: a SQLite store and a pool of one gVisor cell
// in a temporary directory, a fenced claim, one command in the cell, a
// release, and a wait until the provider proved the cell gone. The pool is
// then drained with proof, so no sandbox is left running.
//
//	go run ./examples/evalharness -- uname -r
//
// It prints one JSON object and exits non-zero if any step fails.
package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/gvisor"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
	"github.com/sandboxwich/sandboxwich/store/sqlite"
)

// result is the one JSON object the harness prints.
type result struct {
	LeaseID        string `json:"lease_id,omitempty"`
	CellID         string `json:"cell_id,omitempty"`
	ExitCode       int    `json:"exit_code"`
	Stdout         string `json:"stdout"`
	Stderr         string `json:"stderr"`
	State          string `json:"state,omitempty"`
	ProviderAbsent bool   `json:"provider_absent"`
	Drained        bool   `json:"drained"`
	Error          string `json:"error,omitempty"`
}

func main() {
	timeout := flag.Duration("timeout", 2*time.Minute, "bound on the whole run")
	flag.Parse()
	argv := flag.Args()
	if len(argv) == 0 {
		argv = []string{"uname", "-r"}
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	res, err := run(ctx, argv)
	if err != nil {
		res.Error = err.Error()
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	_ = enc.Encode(res)
	if err != nil || !res.ProviderAbsent || !res.Drained {
		os.Exit(1)
	}
}

func run(ctx context.Context, argv []string) (res result, err error) {
	dir, err := os.MkdirTemp("", "evalharness-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	defer gvisor.RemoveStateDir(filepath.Join(dir, "runsc")) // runsc pins a mount in its root
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	st, err := sqlite.Open(ctx, filepath.Join(dir, "cells.db"), sqlite.Options{})
	if err != nil {
		return res, err
	}
	defer st.Close()
	// An in-process harness may hold its key in memory; the server reads
	// it from a file.
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	keys, err := attest.NewKeyring(key)
	if err != nil {
		return res, err
	}
	// Providers name their objects after the store's installation, so
	// that planes sharing a host never take each other's cells.
	installation, err := st.Installation(ctx)
	if err != nil {
		return res, err
	}
	prov, err := gvisor.New(gvisor.Config{StateDir: filepath.Join(dir, "runsc"), BundleDir: filepath.Join(dir, "bundles"),
		Pool: "evalharness", Installation: driver.InstallationTag(installation), Logger: log})
	if err != nil {
		return res, err
	}
	rel := lease.Release{ReleaseSetID: "evalharness", RuntimeClass: lease.GVisorLowerRisk, PolicyDigest: strings.Repeat("0", 64)}
	rel.Signature = keys.SignRelease(rel)
	plane, err := sandboxwich.New(st, keys, sandboxwich.WithLogger(log),
		sandboxwich.WithPools(pool.Config{Name: "eval", TenantID: "harness", Release: rel, Target: 1, Provider: prov}),
		sandboxwich.WithPoolOptions(pool.WithInterval(100*time.Millisecond)))
	if err != nil {
		return res, err
	}
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- plane.Run(runCtx) }()
	defer func() {
		// Stop the reconciler, then end every cell this harness made, each
		// with proof of deletion.
		stop()
		<-done
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		res.Drained = plane.Pools().Drain(dctx) == nil
	}()

	// 1. Claim under a fence; a retry with the same claim ID could never
	// lease a second cell.
	binding := lease.Binding{OrganizationID: "org-1", WorkspaceID: "ws-1", ThreadID: "thread-1", RunnerSessionID: "run-1"}
	req := sandboxwich.ClaimRequest{ClaimID: uuid.Must(uuid.NewV7()), Release: rel, Binding: binding}
	var claim sandboxwich.ClaimResult
	for claim.Lease == nil {
		// An empty claim is durable for its claim ID: wait with a new one.
		if claim, err = plane.Claim(ctx, "harness", req); err != nil {
			return res, fmt.Errorf("claim: %w", err)
		}
		if claim.Lease == nil {
			req.ClaimID = uuid.Must(uuid.NewV7())
			select {
			case <-ctx.Done():
				return res, fmt.Errorf("no cell became ready: %w", ctx.Err())
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	res.LeaseID, res.CellID = claim.Lease.ID.String(), claim.Lease.CellID.String()
	proof := claim.Proof()

	// 2. Run the command; the plane re-verifies the gVisor boundary first.
	out, err := plane.Exec(ctx, "harness", claim.Lease.ID, proof, sandboxwich.ExecRequest{Argv: argv})
	if err != nil {
		return res, fmt.Errorf("exec: %w", err)
	}
	res.ExitCode, res.Stdout, res.Stderr = out.ExitCode, string(out.Stdout), string(out.Stderr)

	// 3. Release, and wait for proven deletion.
	if _, err := plane.Release(ctx, "harness", claim.Lease.ID, proof, lease.Destroyed); err != nil {
		return res, fmt.Errorf("release: %w", err)
	}
	s, err := plane.WaitProviderAbsent(ctx, "harness", claim.Lease.ID, 0)
	res.State, res.ProviderAbsent = string(s.State), s.ProviderAbsent
	if err != nil {
		return res, fmt.Errorf("deletion not proven: %w", err)
	}
	if out.ExitCode != 0 {
		return res, fmt.Errorf("command exited %d", out.ExitCode)
	}
	return res, nil
}
