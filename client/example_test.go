package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/client"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/wire"
)

// An evaluation harness claims a sterile cell, checks its lease, runs its
// workload, releases the cell and waits until the provider proved it gone.
func ExampleClient_Claim() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	c, err := client.New("http://127.0.0.1:3217", client.WithToken(os.Getenv("SANDBOXWICH_TOKEN")))
	if err != nil {
		log.Fatal(err)
	}
	claim, err := c.Claim(ctx, wire.ClaimRequest{
		// ClaimID left nil: Claim generates a UUIDv7 and retries lost
		// answers under it, so the claim leases at most one cell.
		Release: wire.Release{
			ReleaseSetID: "release-set-2026-08-07",
			RuntimeClass: lease.KataMicroVM,
			PolicyDigest: "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
			Signature:    "swrs1_e9tjahDQxqFMnsShzD-gJ815SbqsCNKrHlBA96hCM_0",
		},
		Binding: wire.Binding{OrganizationID: "org-1", WorkspaceID: "workspace-1", ThreadID: "thread-1", RunnerSessionID: "session-1"},
	})
	if err != nil {
		// Retrying later with claim.ClaimID in the request returns the
		// same outcome: never a second cell.
		log.Fatalf("claim %s: %v", claim.ClaimID, err)
	}
	if claim.Empty() {
		log.Fatal("no ready cell")
	}
	fmt.Println("claimed", claim) // prints no attestation

	// Anyone the harness hands the proof to can check it.
	l, err := c.Validate(ctx, claim.Lease.LeaseID, claim.Proof())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("lease valid until", l.ExpiresAt)

	// … run the workload …

	if _, err := c.Release(ctx, claim.Lease.LeaseID, claim.Proof(), lease.Destroyed); err != nil {
		log.Fatal(err)
	}
	st, err := c.WaitProviderAbsent(ctx, claim.Lease.LeaseID, time.Second)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("cell", st.CellID, "ended", *st.Disposition)
}

// A fenced claim can be repeated with its claim ID: after a crash, or when
// Claim's own retries ran out, the repeat returns the first outcome.
func ExampleClient_Claim_retryLater() {
	ctx := context.Background()
	c, err := client.New("http://127.0.0.1:3217", client.WithToken(os.Getenv("SANDBOXWICH_TOKEN")))
	if err != nil {
		log.Fatal(err)
	}
	req := wire.ClaimRequest{ /* release and binding as above */ }
	id := uuid.Must(uuid.NewV7()) // persist it before claiming
	req.ClaimID = &id
	claim, err := c.Claim(ctx, req)
	for attempt := 0; err != nil && !isFinal(err) && attempt < 10; attempt++ {
		time.Sleep(5 * time.Second)
		claim, err = c.Claim(ctx, req) // same claim_id: same lease
	}
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(claim)
}

// isFinal reports whether a claim error is an answer of the server that a
// repeat would not change.
func isFinal(err error) bool {
	var e *client.Error
	return errors.As(err, &e) && !errors.Is(err, errcode.ErrClaimContended) && e.Status < 500
}

// Exec runs a command in the leased cell; Run decodes the output streams.
func ExampleClient_Run() {
	ctx := context.Background()
	c, err := client.New("http://127.0.0.1:3217", client.WithToken(os.Getenv("SANDBOXWICH_TOKEN")))
	if err != nil {
		log.Fatal(err)
	}
	claim, err := c.Claim(ctx, wire.ClaimRequest{ /* release and binding */ })
	if err != nil || claim.Empty() {
		log.Fatal("no lease: ", err)
	}
	res, err := c.Run(ctx, claim.Lease.LeaseID, claim.Proof(), client.Command{
		Argv:    []string{"python3", "-c", "print(2 + 2)"},
		Timeout: 30 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	os.Stdout.Write(res.Stdout)
	os.Exit(res.ExitCode)
}

// Branch on the wire code with errors.Is and the errcode sentinels.
func ExampleError() {
	c, _ := client.New("http://127.0.0.1:3217", client.WithToken(os.Getenv("SANDBOXWICH_TOKEN")))
	_, err := c.Lease(context.Background(), uuid.Must(uuid.NewV7()))
	switch {
	case errors.Is(err, errcode.ErrNotFound):
		fmt.Println("no such lease")
	case err != nil:
		var e *client.Error
		if errors.As(err, &e) {
			fmt.Println(e.Code, e.RequestID)
		}
	}
}

// A harness copies its inputs into a leased cell, streams a command's
// output to its own as the command writes it, and copies a result back.
func ExampleClient_ExecStream() {
	ctx := context.Background()
	c, err := client.New("http://127.0.0.1:3217", client.WithToken(os.Getenv("SANDBOXWICH_TOKEN")))
	if err != nil {
		log.Fatal(err)
	}
	var claim client.Claim // from Client.Claim
	id, proof := claim.Lease.LeaseID, claim.Proof()

	in, err := os.Open("dataset.tar")
	if err != nil {
		log.Fatal(err)
	}
	defer in.Close()
	// Streamed as it is read, never held in memory; sent once.
	if _, err := c.WriteFile(ctx, id, proof, client.FileWrite{Path: "/home/cell/dataset.tar"}, in); err != nil {
		log.Fatal(err)
	}

	res, err := c.ExecStream(ctx, id, proof, client.Command{Argv: []string{"sh", "-c", "tar xf dataset.tar && ./run"}, Timeout: time.Minute},
		func(o client.Output) error {
			w := os.Stdout
			if o.Stream == client.Stderr {
				w = os.Stderr
			}
			_, err := w.Write(o.Data)
			return err // an error stops the command
		})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit", res.ExitCode, res.Reason)

	out, size, err := c.ReadFile(ctx, id, proof, client.FileRead{Path: "/home/cell/result.json"})
	if errors.Is(err, errcode.ErrFileNotFound) {
		log.Fatal("the run wrote no result")
	}
	if err != nil {
		log.Fatal(err)
	}
	defer out.Close()
	fmt.Println("result of", size, "bytes")
}

// A sample that runs longer than the server's maximum lease keeps its
// lease alive while it works, learns at once if a renewal failed, and
// stops the renewals before the release.
func ExampleClient_KeepAlive() {
	ctx := context.Background()
	c, err := client.New("http://127.0.0.1:3217", client.WithToken(os.Getenv("SANDBOXWICH_TOKEN")))
	if err != nil {
		log.Fatal(err)
	}
	claim, err := c.Claim(ctx, wire.ClaimRequest{ /* release and binding as above */ })
	if err != nil || claim.Empty() {
		log.Fatal("no lease: ", err)
	}
	ka := c.KeepAlive(ctx, claim.Lease.LeaseID, claim.Proof(), 300, claim.Lease.ExpiresAt.Time)

	work := make(chan error, 1)
	go func() {
		_, err := c.Run(ctx, claim.Lease.LeaseID, claim.Proof(), client.Command{Argv: []string{"make", "test"}, Timeout: time.Hour})
		work <- err
	}()
	select {
	case err = <-work:
	case <-ka.Done():
		// The lease could not be kept (released elsewhere, or its cell's
		// lifetime cap): the command ends with it.
		err = fmt.Errorf("lease lost: %w", ka.Err())
	}
	if kerr := ka.Stop(); kerr != nil && err == nil {
		err = kerr
	}
	if _, rerr := c.Release(ctx, claim.Lease.LeaseID, claim.Proof(), lease.Destroyed); rerr != nil {
		log.Print(rerr)
	}
	if err != nil {
		log.Fatal(err)
	}
}
