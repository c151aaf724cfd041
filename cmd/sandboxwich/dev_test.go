package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/client"
	"github.com/sandboxwich/sandboxwich/driver/gvisor"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/internal/testenv"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store/sqlite"
	"github.com/sandboxwich/sandboxwich/wire"
)

// lockedBuffer is a goroutine-safe bytes.Buffer.
type lockedBuffer = testenv.Buffer

// bannerCommands returns the shell lines of a dev banner: those indented
// by two spaces, with their continuations.
func bannerCommands(banner string) string {
	var out []string
	for _, l := range strings.Split(banner, "\n") {
		if strings.HasPrefix(l, "  ") {
			out = append(out, strings.TrimPrefix(l, "  "))
		}
	}
	return strings.Join(out, "\n") + "\n"
}

// TestDevBanner: the banner says Ctrl-C ends live leases, builds the binary
// before it uses it, never assumes one on PATH, and offers exec only where
// cells can run commands.
func TestDevBanner(t *testing.T) {
	rel := lease.Release{ReleaseSetID: devReleaseSetID, RuntimeClass: lease.GVisorLowerRisk, PolicyDigest: strings.Repeat("a", 64), Signature: "swrs1_x"}
	for _, provider := range []string{"gvisor", "dry-run"} {
		var out bytes.Buffer
		printDevHelp(env{stdout: &out}, "http://127.0.0.1:1", "/tmp/dev dir", provider, rel, uuid.Nil)
		banner := out.String()
		if !strings.Contains(banner, "Ctrl-C ends every cell, live leases included") {
			t.Errorf("%s: the banner does not say Ctrl-C ends live leases:\n%s", provider, banner)
		}
		cmds := bannerCommands(banner)
		build := strings.Index(cmds, "go build -o /tmp/dev dir/sandboxwich ./cmd/sandboxwich")
		if build != 0 {
			t.Errorf("%s: the first command does not build the binary:\n%s", provider, cmds)
		}
		if regexp.MustCompile(`(?m)(^|[ ;|(])sandboxwich `).MatchString(cmds) {
			t.Errorf("%s: a command runs sandboxwich from PATH:\n%s", provider, cmds)
		}
		if hasExec := strings.Contains(cmds, "exec"); hasExec != (provider == "gvisor") {
			t.Errorf("%s: exec offered = %v:\n%s", provider, hasExec, cmds)
		}
	}
}

// TestDevCtrlCEndsEveryCell runs dev, runs its banner's commands exactly as
// printed, claims a cell for the longest lease, and cancels dev's context:
// dev must return within the bound it printed, with every cell ended, the
// live lease destroyed with proof and no longer valid, and (gVisor) no
// runsc container left.
func TestDevCtrlCEndsEveryCell(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs a dev server")
	}
	t.Run("dry-run", func(t *testing.T) { testDevCtrlC(t, "dry-run") })
	t.Run("gvisor", func(t *testing.T) {
		if _, err := exec.LookPath("runsc"); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatal("runsc is not installed under CI=true (scripts/install-runsc.sh)")
			}
			t.Skip("runsc is not installed")
		}
		testDevCtrlC(t, "gvisor")
	})
}

func testDevCtrlC(t *testing.T, provider string) {
	dir := filepath.Join(t.TempDir(), "dev")
	stdout, stderr := &lockedBuffer{}, &lockedBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- dev(ctx, env{stdout: stdout, stderr: stderr, getenv: func(string) string { return "" }},
			[]string{"--dir", dir, "--listen", "127.0.0.1:0", "--provider", provider})
	}()
	stateDir := filepath.Join(dir, "runsc-state")
	t.Cleanup(func() { // never leave a sandbox behind, even on failure
		if provider != "gvisor" {
			return
		}
		out, _ := exec.Command("runsc", "--root", stateDir, "list", "-quiet").Output()
		for _, id := range strings.Fields(string(out)) {
			_ = exec.Command("runsc", "--root", stateDir, "delete", "--force", id).Run()
		}
		// runsc keeps a network namespace mounted in its root; unmount it
		// so the directory can be removed.
		_ = gvisor.RemoveStateDir(stateDir)
	})
	url := ""
	for deadline := time.Now().Add(60 * time.Second); url == "" && time.Now().Before(deadline); {
		if m := regexp.MustCompile(`serving (http://\S+)`).FindStringSubmatch(stdout.String()); m != nil {
			url = m[1]
		}
		time.Sleep(20 * time.Millisecond)
	}
	if url == "" {
		t.Fatalf("dev printed no banner:\n%s\n%s", stdout.String(), stderr.String())
	}
	tok, _ := os.ReadFile(filepath.Join(dir, "tenant-token"))
	c, err := client.New(url, client.WithToken(strings.TrimSpace(string(tok))))
	if err != nil {
		t.Fatal(err)
	}
	keys, err := attest.LoadKeyFile(filepath.Join(dir, "signing.key"))
	if err != nil {
		t.Fatal(err)
	}
	sum := regexp.MustCompile(`--policy-digest (\S+)`).FindStringSubmatch(stdout.String())
	rel := lease.Release{ReleaseSetID: devReleaseSetID, RuntimeClass: lease.GVisorLowerRisk, PolicyDigest: sum[1]}
	rel.Signature = keys.SignRelease(rel.ReleaseSetID, string(rel.RuntimeClass), rel.PolicyDigest)
	b := lease.Binding{OrganizationID: "o", WorkspaceID: "w", ThreadID: "t", RunnerSessionID: "s"}
	claim := func() client.Claim {
		max := uint64(sandboxwich.MaxLeaseSeconds)
		for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			cl, err := c.Claim(ctx, wire.ClaimRequest{Release: rel, Binding: b, LeaseSeconds: &max})
			if err != nil {
				t.Fatal(err)
			}
			if cl.Lease != nil {
				return cl
			}
		}
		t.Fatalf("no cell became claimable for the maximum lease:\n%s", stderr.String())
		return client.Claim{}
	}
	claim() // wait for a ready cell, and leave it leased while the banner runs

	// The banner's commands, exactly as printed, from the repository root.
	script := exec.Command("bash", "-euo", "pipefail", "-c", bannerCommands(stdout.String()))
	script.Dir = filepath.Join("..", "..")
	if out, err := script.CombinedOutput(); err != nil {
		t.Fatalf("the banner's commands failed: %v\n%s\nbanner:\n%s\nlog:\n%s", err, out, stdout.String(), stderr.String())
	}

	cl := claim()
	l := cl.Lease
	cancel()
	start := time.Now()
	var runErr error
	select {
	case runErr = <-done:
	case <-time.After(5 * time.Minute):
		t.Fatalf("dev did not return:\n%s", stderr.String())
	}
	elapsed := time.Since(start)
	if runErr != nil {
		t.Fatalf("dev: %v", runErr)
	}
	logs := stderr.String()
	m := regexp.MustCompile(`exit_within=(\S+)`).FindStringSubmatch(logs)
	if m == nil {
		t.Fatalf("no shutdown bound printed:\n%s", logs)
	}
	bound, err := time.ParseDuration(m[1])
	if err != nil || elapsed > bound {
		t.Fatalf("dev returned after %v, printed bound %q (%v):\n%s", elapsed, m[1], err, logs)
	}
	if !strings.Contains(logs, "every cell ended, its deletion proven") {
		t.Fatalf("drain not reported complete:\n%s", logs)
	}

	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "sandboxwich.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rec, err := st.Lease(context.Background(), "dev", l.LeaseID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Cell.State != lease.Destroyed || rec.Member == nil || !rec.Member.ProviderAbsent {
		t.Fatalf("the live lease after Ctrl-C: cell %s, member %+v", rec.Cell.State, rec.Member)
	}
	counts, err := st.MemberCounts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for state, n := range counts["dev"] {
		if state.Live() && n > 0 {
			t.Fatalf("members left live: %v", counts)
		}
	}
	plane, err := sandboxwich.New(st, keys)
	if err != nil {
		t.Fatal(err)
	}
	pr := cl.Proof()
	_, err = plane.Validate(context.Background(), "dev", l.LeaseID,
		sandboxwich.NewProof(pr.LeaseAttestation, pr.Generation, pr.Binding))
	if !errors.Is(err, errcode.ErrConflict) || !errors.Is(err, lease.ErrNotLive) {
		t.Fatalf("validate of the ended lease: %v", err)
	}
	if provider == "gvisor" {
		out, err := exec.Command("runsc", "--root", stateDir, "list", "-quiet").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "" {
			t.Fatalf("runsc still holds containers after Ctrl-C (%v): %q", err, out)
		}
	}
}
