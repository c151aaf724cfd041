package sandboxwich_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store/sqlite"
)

// This example runs the whole life of a sterile cell prepared by an external
// worker: prepare → claim → validate → destroy, on an embedded SQLite store.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "sandboxwich-example")
	defer os.RemoveAll(dir)

	st, err := sqlite.Open(ctx, filepath.Join(dir, "cells.db"), sqlite.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	keys, _ := attest.NewKeyring([]byte("sandboxwich-test-sterile-cell-signing-key-32-bytes-minimum"))
	plane, err := sandboxwich.New(st, keys)
	if err != nil {
		log.Fatal(err)
	}

	// The operator signs a release: the trust class cells are prepared for.
	rel := lease.Release{
		ReleaseSetID: "release-set-2026-08-07",
		RuntimeClass: lease.GVisorLowerRisk,
		PolicyDigest: "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
	}
	rel.Signature = keys.SignRelease(rel)

	// A worker registers a cell it prepared on its own provider.
	worker := sandboxwich.Worker{ID: uuid.New(), TenantID: "acme", RuntimeClasses: []lease.RuntimeClass{lease.GVisorLowerRisk}}
	cell, err := plane.Prepare(ctx, worker, sandboxwich.PrepareRequest{
		CellID: uuid.New(), Release: rel, ProviderCellID: "sandbox-17", ExpiresAt: time.Now().Add(time.Hour),
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("prepared:", cell.State, "generation", cell.Generation)

	// An eval harness claims it under a claim ID fence.
	binding := lease.Binding{OrganizationID: "org-1", WorkspaceID: "workspace-1", ThreadID: "thread-1", RunnerSessionID: "session-1"}
	claimID := uuid.Must(uuid.NewV7())
	res, err := plane.Claim(ctx, "acme", sandboxwich.ClaimRequest{ClaimID: claimID, Release: rel, Binding: binding})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("leased:", res.Lease.CellID == cell.ID, "generation", res.Lease.Generation)

	// A retry after a lost response returns the same lease and attestation.
	again, _ := plane.Claim(ctx, "acme", sandboxwich.ClaimRequest{ClaimID: claimID, Release: rel, Binding: binding})
	fmt.Println("replayed:", again.Replayed, again.Lease.ID == res.Lease.ID, again.Attestation() == res.Attestation())

	// Anyone holding the attestation can prove the lease is live.
	proof := res.Proof()
	if _, err := plane.Validate(ctx, "acme", res.Lease.ID, proof); err != nil {
		log.Fatal(err)
	}
	fmt.Println("validated")

	// The worker tears the cell down and records it destroyed: never reused.
	done, err := plane.Destroy(ctx, worker, cell.ID, sandboxwich.DestroyRequest{
		LeaseID: res.Lease.ID, Generation: 2, Disposition: lease.Destroyed,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("destroyed:", done.State)
	_, err = plane.Validate(ctx, "acme", res.Lease.ID, proof)
	fmt.Println("validate after destroy:", err)
	// Output:
	// prepared: ready generation 1
	// leased: true generation 2
	// replayed: true true true
	// validated
	// destroyed: destroyed
	// validate after destroy: conflict: lease is no longer live
}
