package client_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich/client"
	"github.com/sandboxwich/sandboxwich/errcode"
)

// TestE2EClaimWaits: over HTTP, a claim with wait_seconds is held until a
// cell is admitted (here through the store, which wakes no one: the wait
// polls) and answered with it; one that waits in vain answers empty with
// empty_reason wait_elapsed, which a Part I empty answer never carries;
// wait_seconds above 300 is 422 invalid_request.
func TestE2EClaimWaits(t *testing.T) {
	e := startE2E(t)
	ctx := context.Background()
	c := e.client(t)

	req := e.claimRequest()
	wait := uint64(60)
	req.WaitSeconds = &wait
	type outcome struct {
		cl  client.Claim
		err error
	}
	got := make(chan outcome, 1)
	go func() {
		cl, err := c.Claim(ctx, req)
		got <- outcome{cl, err}
	}()
	for deadline := time.Now().Add(30 * time.Second); e.Plane.WaitingClaims() != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the claim is not waiting after 30 s")
		}
	}
	cellID := e.addPoolCell(t)
	out := <-got
	if out.err != nil || out.cl.Empty() || out.cl.Lease.CellID != cellID || out.cl.EmptyReason != "" {
		t.Fatalf("the waiting claim: %v %v, want cell %s", out.cl, out.err, cellID)
	}

	one := uint64(1)
	req = e.claimRequest()
	req.WaitSeconds = &one
	cl, err := c.Claim(ctx, req)
	if err != nil || !cl.Empty() || cl.EmptyReason != "wait_elapsed" {
		t.Fatalf("a wait in vain: %v %v, want empty with wait_elapsed", cl, err)
	}

	post := func(body string) (int, []byte) {
		t.Helper()
		r, _ := http.NewRequest(http.MethodPost, e.url+"/v1/sterile-cells/claim", bytes.NewReader([]byte(body)))
		r.Header.Set("Authorization", "Bearer "+tenantToken)
		r.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	rel := e.release
	body := func(extra string) string {
		return `{"release":{"release_set_id":"` + rel.ReleaseSetID + `","runtime_class":"` + string(rel.RuntimeClass) +
			`","policy_digest":"` + rel.PolicyDigest + `","signature":"` + rel.Signature + `"},` +
			`"organization_id":"org-1","workspace_id":"workspace-1","thread_id":"thread-1","runner_session_id":"session-1"` + extra + `}`
	}
	if code, b := post(body("")); code != http.StatusOK || bytes.Contains(b, []byte("empty_reason")) {
		t.Errorf("a Part I empty claim: %d %s, want 200 without empty_reason", code, b)
	}
	if code, b := post(body(`,"wait_seconds":0`)); code != http.StatusOK || bytes.Contains(b, []byte("empty_reason")) {
		t.Errorf("wait_seconds 0: %d %s, want a Part I answer", code, b)
	}
	if code, b := post(body(`,"wait_seconds":301`)); code != http.StatusUnprocessableEntity || !bytes.Contains(b, []byte(`"invalid_request"`)) {
		t.Errorf("wait_seconds 301: %d %s, want 422 invalid_request", code, b)
	}
	big := uint64(301)
	req.WaitSeconds = &big
	if _, err := c.Claim(ctx, req); !errors.Is(err, errcode.ErrInvalidRequest) {
		t.Errorf("the client with wait_seconds 301: %v, want invalid_request", err)
	}
}
