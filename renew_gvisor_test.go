package sandboxwich_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/client"
	"github.com/sandboxwich/sandboxwich/driver/gvisor"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/httpapi"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/wire"
)

// renewMaxLease is the plane's maximum lease length in the renewal tests
// on real gVisor cells (issue 42: at most 10 s).
const renewMaxLease = 10

// renewCell is a lease on a real gVisor cell, claimed through the HTTP API
// with the Go client, of a plane whose maximum lease is renewMaxLease.
type renewCell struct {
	c     *client.Client
	id    uuid.UUID
	proof wire.LeaseProof
	// expires is the expiry the claim granted.
	expires time.Time
}

// claimRenewCell starts a gVisor plane named name with a maximum lease of
// renewMaxLease seconds, serves it over HTTP and claims one of its cells
// for leaseSeconds through the Go client.
func claimRenewCell(ctx context.Context, t *testing.T, name string, leaseSeconds uint64) renewCell {
	t.Helper()
	g := startGVisorPlane(t, ctx, name, gvisor.Config{}, sandboxwich.WithMaxLeaseSeconds(renewMaxLease))
	const token = "renew-tenant-token"
	h, err := httpapi.New(httpapi.Config{Plane: g.Plane, Logger: slog.New(slog.DiscardHandler),
		Auth: httpapi.Auth{TenantTokens: map[string]string{token: "acme"}}})
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
		if cl, err = c.Claim(ctx, wire.ClaimRequest{Release: g.rel, LeaseSeconds: &leaseSeconds, Binding: wire.Binding{
			OrganizationID: "org-1", WorkspaceID: "ws-1", ThreadID: "thread-1", RunnerSessionID: "session-1"}}); err != nil {
			t.Fatal(err)
		}
		if cl.Empty() {
			time.Sleep(50 * time.Millisecond)
		}
	}
	return renewCell{c: c, id: cl.Lease.LeaseID, proof: cl.Proof(), expires: cl.Lease.ExpiresAt.Time}
}

// releaseAndProveGone stops k (which must still be running), releases
// the lease and waits until its provider proved the cell deleted.
func (r renewCell) releaseAndProveGone(ctx context.Context, t *testing.T, k *client.KeepAlive) {
	t.Helper()
	if err := k.Stop(); err != nil {
		t.Fatalf("the keep-alive ended by itself: %v", err)
	}
	if _, err := r.c.Release(ctx, r.id, r.proof, lease.Destroyed); err != nil {
		t.Fatalf("release: %v", err)
	}
	st, err := r.c.WaitProviderAbsent(ctx, r.id, 100*time.Millisecond)
	if err != nil || st.State != lease.Destroyed || !st.ProviderAbsent {
		t.Fatalf("the cell after the release: %+v %v, want destroyed and provider_absent", st, err)
	}
	if _, err := r.c.Renew(ctx, r.id, r.proof, renewMaxLease); !errors.Is(err, errcode.ErrConflict) {
		t.Fatalf("a renewal after the release: %v, want 409 conflict", err)
	}
}

// TestRenewKeepsARealCellAlive (issue 42): a real gVisor cell whose plane
// grants leases of at most 10 s is kept alive by the Go keep-alive for
// three times that, while one launched process (sleep 30) runs from
// before the first renewal to its end and exits 0, not killed (and a
// streamed exec started then: a renewal moves the expiry that bounds it in
// the cell, CONTRACT §20). Then the keep-alive
// stops, the lease is released and the cell proven deleted.
func TestRenewKeepsARealCellAlive(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := claimRenewCell(ctx, t, "renewlive", renewMaxLease)
	claimed := time.Now()
	if got := time.Until(r.expires); got > renewMaxLease*time.Second {
		t.Fatalf("the claim granted %v, more than the maximum lease", got)
	}

	// Both start before the first renewal (a third of the 10 s).
	if _, err := r.c.Launch(ctx, r.id, r.proof, client.LaunchSpec{Argv: []string{"sh", "-c", "sleep 30; echo done"}}); err != nil {
		t.Fatalf("launch: %v", err)
	}
	type answer struct {
		res client.ExecResult
		out string
		err error
	}
	streamed := make(chan answer, 1)
	started := make(chan struct{})
	go func() {
		var mu sync.Mutex
		var out bytes.Buffer
		once := sync.OnceFunc(func() { close(started) })
		res, err := r.c.ExecStream(ctx, r.id, r.proof, client.Command{
			Argv: []string{"sh", "-c", "echo started; sleep 25; echo done"}, Timeout: time.Minute,
		}, func(o client.Output) error {
			mu.Lock()
			defer mu.Unlock()
			out.Write(o.Data)
			if strings.Contains(out.String(), "started") {
				once()
			}
			return nil
		})
		once()
		mu.Lock()
		defer mu.Unlock()
		streamed <- answer{res, out.String(), err}
	}()
	<-started
	k := r.c.KeepAlive(ctx, r.id, r.proof, renewMaxLease, r.expires)
	if time.Until(r.expires) < 2*renewMaxLease*time.Second/3 {
		t.Logf("the first renewal may have come before both processes started (%v left)", time.Until(r.expires))
	}

	st, err := r.c.WaitLaunch(ctx, r.id, 200*time.Millisecond)
	if err != nil || st.Reason == nil || *st.Reason != wire.ReasonExited || st.ExitCode == nil || *st.ExitCode != 0 {
		t.Errorf("the launched sleep 30: %+v %v, want exited 0 (not killed)", st, err)
	}
	a := <-streamed
	if a.err != nil || a.res.Reason != wire.ReasonExited || a.res.ExitCode != 0 || a.out != "started\ndone\n" {
		t.Errorf("the streamed sleep 25: %+v output %q %v, want exited 0 with started and done", a.res, a.out, a.err)
	}
	if lived := time.Since(claimed); lived < 3*renewMaxLease*time.Second {
		t.Fatalf("the launch ended after %v, before three maximum leases", lived)
	}
	select {
	case <-k.Done():
		t.Fatalf("the keep-alive ended: %v", k.Err())
	default:
	}
	if !k.ExpiresAt().After(r.expires.Add(2 * renewMaxLease * time.Second)) {
		t.Errorf("the lease expires at %v, want past claim expiry %v + 20 s", k.ExpiresAt(), r.expires)
	}
	body, _, err := r.c.ReadFile(ctx, r.id, r.proof, client.FileRead{Path: "/home/cell/.launch/stdout"})
	if err != nil {
		t.Fatalf("read the launch's stdout: %v", err)
	}
	out, err := io.ReadAll(body)
	body.Close()
	if err != nil || string(out) != "done\n" {
		t.Errorf("the launch's stdout: %q %v, want done", out, err)
	}
	res, err := r.c.Run(ctx, r.id, r.proof, client.Command{Argv: []string{"echo", "alive"}})
	if err != nil || string(res.Stdout) != "alive\n" {
		t.Fatalf("echo after 30 s: %+v %v", res, err)
	}
	r.releaseAndProveGone(ctx, t, k)
}

// TestRenewBeforeTheFirstExec (issue 42): a cell whose agent was never
// activated is renewed first (the keep-alive from the claim on); its
// first exec comes after the claim's expiry has passed and runs, and so
// do a later launch and exec. Then the lease is released and the cell
// proven deleted.
func TestRenewBeforeTheFirstExec(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := claimRenewCell(ctx, t, "renewfirst", renewMaxLease)
	k := r.c.KeepAlive(ctx, r.id, r.proof, renewMaxLease, r.expires)
	// Past the claim's expiry, with nothing sent to the cell but renewals.
	select {
	case <-time.After(time.Until(r.expires) + time.Second):
	case <-k.Done():
		t.Fatalf("the keep-alive ended: %v", k.Err())
	}
	if !k.ExpiresAt().After(r.expires) {
		t.Fatalf("the lease expires at %v, not after the claim's %v", k.ExpiresAt(), r.expires)
	}
	res, err := r.c.Run(ctx, r.id, r.proof, client.Command{Argv: []string{"sh", "-c", "echo first"}})
	if err != nil || res.Reason != wire.ReasonExited || string(res.Stdout) != "first\n" {
		t.Fatalf("the first exec, after the claim's expiry: %+v %v", res, err)
	}
	// The agent now has the renewed expiry and takes later ones.
	if _, err := r.c.Launch(ctx, r.id, r.proof, client.LaunchSpec{Argv: []string{"sleep", "6"}}); err != nil {
		t.Fatalf("launch: %v", err)
	}
	st, err := r.c.WaitLaunch(ctx, r.id, 200*time.Millisecond)
	if err != nil || st.Reason == nil || *st.Reason != wire.ReasonExited || st.ExitCode == nil || *st.ExitCode != 0 {
		t.Errorf("the launched sleep 6: %+v %v, want exited 0", st, err)
	}
	if res, err := r.c.Run(ctx, r.id, r.proof, client.Command{Argv: []string{"echo", "again"}}); err != nil || string(res.Stdout) != "again\n" {
		t.Fatalf("exec after the launch: %+v %v", res, err)
	}
	r.releaseAndProveGone(ctx, t, k)
}

// TestUnrenewedLeaseKillsItsCommand (issue 42): a lease that is not
// renewed ends at its expiry, and a command running across it answers
// reason killed (its agent activated by an earlier exec); the cell is
// then deleted. (ExecResult carries no message saying the lease expired
// in this branch: only the reason is checked.)
func TestUnrenewedLeaseKillsItsCommand(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const short = 5
	r := claimRenewCell(ctx, t, "renewnot", short)
	// An earlier command activates the cell's agent, as in a real sample.
	if res, err := r.c.Run(ctx, r.id, r.proof, client.Command{Argv: []string{"true"}}); err != nil || res.ExitCode != 0 {
		t.Fatalf("a first exec: %+v %v", res, err)
	}
	var out bytes.Buffer
	res, err := r.c.ExecStream(ctx, r.id, r.proof, client.Command{
		Argv: []string{"sh", "-c", "echo started; sleep 30; echo done"}, Timeout: time.Minute,
	}, func(o client.Output) error { out.Write(o.Data); return nil })
	if err != nil || res.Reason != wire.ReasonKilled || out.String() != "started\n" || !strings.Contains(res.Message, "lease expired") {
		t.Errorf("a command across the expiry: %+v output %q %v, want reason killed saying the lease expired", res, out.String(), err)
	}
	// Not before the expiry (load only delays the answer), and long before
	// the command's own end (sleep 30): a hang guard, not a timing bound.
	if late := time.Since(r.expires); late < -time.Second || late > 20*time.Second {
		t.Errorf("the command ended %v after the lease's expiry", late)
	}
	if _, err := r.c.Renew(ctx, r.id, r.proof, short); !errors.Is(err, errcode.ErrConflict) {
		t.Errorf("renewing the expired lease: %v, want 409 conflict", err)
	}
	st, err := r.c.WaitProviderAbsent(ctx, r.id, 100*time.Millisecond)
	if err != nil || st.State == lease.Leased || !st.ProviderAbsent {
		t.Fatalf("the cell after the expiry: %+v %v, want it ended and provider_absent", st, err)
	}
}
