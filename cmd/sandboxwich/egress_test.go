package main

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich/client"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/egress"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store/sqlite"
	"github.com/sandboxwich/sandboxwich/wire"
)

// egressProbe prints, in a cell, what DNS and connections give: one line
// each.
const egressProbe = `
import socket, urllib.request
def line(f):
    try:
        print(f())
    except Exception as e:
        print("error:", type(e).__name__)
line(lambda: socket.gethostbyname("pkgs.test"))
line(lambda: socket.gethostbyname("other.test"))
line(lambda: urllib.request.urlopen("http://pkgs.test/", timeout=10).status)
def connect(addr):
    s = socket.socket()
    s.settimeout(5)
    return s.connect_ex(addr)
line(lambda: connect(("10.0.0.1", 80)))
`

// TestDevEgress: dev --egress gives the dev pool an allow-list enforced by
// the egress gateway on real gVisor cells. A claim narrowing it to
// pkgs.test:80 gets a cell where pkgs.test resolves to the gateway, the
// name the claim left out does not resolve, the gateway refuses pkgs.test
// (it resolves nowhere from this host), and no other address is routed; the
// evidence carries the narrowed policy; a wider claim is 422
// egress_not_allowed. At Ctrl-C no namespace of a cell is left.
func TestDevEgress(t *testing.T) {
	requireDevGVisor(t)
	dir := filepath.Join(t.TempDir(), "dev")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, c, rel, _, stderr, done := startDevForTest(ctx, t, dir, "gvisor", "--target", "1", "--egress", "pkgs.test,other.test:8443")
	b := lease.Binding{OrganizationID: "o", WorkspaceID: "w", ThreadID: "t", RunnerSessionID: "s"}
	wide := []string{"evil.test"}
	if _, err := c.Claim(ctx, wire.ClaimRequest{Release: rel, Binding: b, Egress: &wide}); !errors.Is(err, errcode.ErrEgressNotAllowed) {
		t.Fatalf("a claim wider than the pool's egress: %v, want egress_not_allowed", err)
	}
	narrow, wait := []string{"pkgs.test:80"}, uint64(90)
	cl, err := c.Claim(ctx, wire.ClaimRequest{Release: rel, Binding: b, Egress: &narrow, WaitSeconds: &wait})
	if err != nil || cl.Lease == nil {
		t.Fatalf("a narrowing claim: %+v %v\n%s", cl, err, stderr.String())
	}
	res, err := c.Run(ctx, cl.Lease.LeaseID, cl.Proof(), client.Command{Argv: []string{"python3", "-c", egressProbe}})
	if err != nil {
		t.Fatalf("the probe: %v", err)
	}
	want := "100.64.0.1|error: gaierror|error: RemoteDisconnected|101"
	if got := strings.Join(strings.Split(strings.TrimSpace(string(res.Stdout)), "\n"), "|"); got != want {
		t.Errorf("the cell's probe: %q (stderr %q), want %q", got, res.Stderr, want)
	}
	ev, err := c.Evidence(ctx, cl.Lease.LeaseID)
	if err != nil || ev.Egress != "pkgs.test:80" || ev.EgressDigest != egress.DigestOf("pkgs.test:80") {
		t.Errorf("evidence: %+v %v, want egress pkgs.test:80", ev, err)
	}
	hosts, err := c.EgressCounts(ctx, cl.Lease.LeaseID)
	if err != nil || len(hosts) != 1 || hosts[0] != (wire.EgressHost{Host: "pkgs.test", Refused: 1}) {
		t.Errorf("the lease's egress counts: %+v %v, want pkgs.test refused once (it resolves nowhere from this host)", hosts, err)
	}
	cancel() // Ctrl-C: every cell ends, with proof
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("dev: %v", err)
		}
	case <-time.After(90 * time.Second):
		t.Fatal("dev did not end")
	}
	// dev ended every cell, then removed its egress net: no namespace of
	// its installation is left.
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "sandboxwich.db"), sqlite.Options{SkipMigrate: true})
	if err != nil {
		t.Fatal(err)
	}
	installation, err := st.Installation(context.Background())
	st.Close()
	if err != nil {
		t.Fatal(err)
	}
	tag := driver.InstallationTag(installation)
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil || strings.Contains(string(out), "sbw-"+tag+"-") {
		t.Errorf("namespaces of installation %s after Ctrl-C (%v): %s", tag, err, out)
	}
}
