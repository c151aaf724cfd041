package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
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
		printDevHelp(env{stdout: &out}, "http://127.0.0.1:1", "/tmp/dev dir", provider, rel, uuid.Nil, "/tmp/dev dir/inspect-sandboxwich.json")
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
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, c, rel, stdout, stderr, done := startDevForTest(ctx, t, dir, provider)
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
	keys, err := attest.LoadKeyFile(filepath.Join(dir, "signing.key"))
	if err != nil {
		t.Fatal(err)
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
		out, err := exec.Command("runsc", "--root", filepath.Join(dir, "runsc-state"), "list", "-quiet").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "" {
			t.Fatalf("runsc still holds containers after Ctrl-C (%v): %q", err, out)
		}
	}
}

// startDevForTest runs dev in this process with --dir dir and returns its
// URL, a client of its tenant, the release of its pool, its output and the
// channel of dev's result; extra are more flags of dev. Cancelling ctx is
// Ctrl-C.
func startDevForTest(ctx context.Context, t *testing.T, dir, provider string, extra ...string) (string, *client.Client, lease.Release, *lockedBuffer, *lockedBuffer, chan error) {
	t.Helper()
	stdout, stderr := &lockedBuffer{}, &lockedBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- dev(ctx, env{stdout: stdout, stderr: stderr, getenv: func(string) string { return "" }},
			append([]string{"--dir", dir, "--listen", "127.0.0.1:0", "--provider", provider}, extra...))
	}()
	if provider == "gvisor" {
		stateDir := filepath.Join(dir, "runsc-state")
		t.Cleanup(func() { // never leave a sandbox behind, even on failure
			out, _ := exec.Command(gvisor.FindRunsc(), "--root", stateDir, "list", "-quiet").Output()
			for _, id := range strings.Fields(string(out)) {
				_ = exec.Command(gvisor.FindRunsc(), "--root", stateDir, "delete", "--force", id).Run()
			}
			_ = gvisor.RemoveStateDir(stateDir)
		})
	}
	// The banner is written line by line: wait for both lines read here,
	// the URL's and, further down, the release's policy digest.
	var url, digest string
	for deadline := time.Now().Add(60 * time.Second); digest == "" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		out := stdout.String()
		if m := regexp.MustCompile(`serving (http://\S+)`).FindStringSubmatch(out); m != nil {
			url = m[1]
			if m := regexp.MustCompile(`--policy-digest (\S+)`).FindStringSubmatch(out); m != nil {
				digest = m[1]
			}
		}
	}
	if digest == "" {
		t.Fatalf("dev printed no banner (or none with the release's policy digest):\n%s\n%s", stdout.String(), stderr.String())
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
	rel := lease.Release{ReleaseSetID: devReleaseSetID, RuntimeClass: lease.GVisorLowerRisk, PolicyDigest: digest}
	rel.Signature = keys.SignRelease(rel)
	return url, c, rel, stdout, stderr, done
}

// TestDevInspectConfig: dev writes the Inspect AI provider's configuration
// (the keys SandboxwichConfig reads: url, token_file, release) into its
// directory, with the token file's absolute path and never the token, and
// prints the file's path.
func TestDevInspectConfig(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "dev")
	ctx, cancel := context.WithCancel(context.Background())
	url, _, rel, stdout, stderr, done := startDevForTest(ctx, t, dir, "dry-run")
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("dev: %v\n%s", err, stderr.String())
		}
	}()
	path := filepath.Join(dir, inspectConfigName)
	if !strings.Contains(stdout.String(), "Inspect AI provider config (URL, token file, release): "+path+"\n") {
		t.Errorf("the banner does not print the config's path %s:\n%s", path, stdout.String())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]json.RawMessage
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("%s: %v\n%s", path, err, b)
	}
	keys := slices.Sorted(maps.Keys(got))
	if !slices.Equal(keys, []string{"release", "token_file", "url"}) {
		t.Errorf("keys %v, want release, token_file, url", keys)
	}
	var cfg struct {
		URL       string        `json:"url"`
		TokenFile string        `json:"token_file"`
		Release   lease.Release `json:"release"`
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.URL != url || cfg.Release != rel {
		t.Errorf("config %+v, want url %s and release %+v", cfg, url, rel)
	}
	tok, err := os.ReadFile(cfg.TokenFile)
	if err != nil || !filepath.IsAbs(cfg.TokenFile) || len(strings.TrimSpace(string(tok))) == 0 {
		t.Fatalf("token_file %q: %v", cfg.TokenFile, err)
	}
	if bytes.Contains(b, bytes.TrimSpace(tok)) {
		t.Errorf("the config holds the token inline:\n%s", b)
	}
}

// TestDevInstallsRunsc: with no runsc installed, dev (and only dev) runs
// the pinned build itself, reporting progress on its stderr, and a failed
// build stops it with the build's error; serve still refuses with the
// command to run.
func TestDevInstallsRunsc(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Setenv("SANDBOXWICH_RUNSC_CACHE", t.TempDir())
	if gvisor.FindRunsc() != "" {
		t.Fatal("runsc found with an empty PATH and cache")
	}
	errBuild := errors.New("stub build failed: go install gvisor.dev/gvisor/runsc@" + gvisor.RunscVersion)
	var calls int
	var progress any
	old := devInstallRunsc
	t.Cleanup(func() { devInstallRunsc = old })
	devInstallRunsc = func(_ context.Context, w io.Writer) (string, error) {
		calls++
		progress = w
		return "", errBuild
	}
	var stderr bytes.Buffer
	dir := filepath.Join(t.TempDir(), "dev")
	err := dev(context.Background(), env{stdout: io.Discard, stderr: &stderr, getenv: func(string) string { return "" }},
		[]string{"--dir", dir, "--listen", "127.0.0.1:0"})
	if !errors.Is(err, errBuild) || calls != 1 || progress != io.Writer(&stderr) {
		t.Fatalf("dev without runsc: %v (%d builds, progress to %T)", err, calls, progress)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a dev that could not install runsc created %s (%v)", dir, err)
	}
	_, err = newProvider(poolConfig{Name: "p", Provider: "gvisor"}, "test", nil)
	if err == nil || !strings.Contains(err.Error(), "runsc (gVisor) is not installed") || calls != 1 {
		t.Fatalf("serve's gvisor pool without runsc: %v (%d builds)", err, calls)
	}
}

// TestDevCtrlCDuringStreamedExec: Ctrl-C while a streamed exec runs in a
// leased cell ends the stream with the release's reason (killed, not a
// cell that "died"), and dev exits cleanly once every cell is proven gone
// instead of holding the HTTP grace and failing with "context deadline
// exceeded".
// requireDevGVisor skips a test that runs a dev server with gVisor cells
// in -short mode, or without runsc and root (which CI=true requires).
func requireDevGVisor(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs a dev server with gVisor cells")
	}
	if gvisor.FindRunsc() == "" || os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("runsc and root are required under CI=true")
		}
		t.Skip("needs runsc and root")
	}
}

func TestDevCtrlCDuringStreamedExec(t *testing.T) {
	requireDevGVisor(t)
	dir := filepath.Join(t.TempDir(), "dev")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, c, rel, _, stderr, done := startDevForTest(ctx, t, dir, "gvisor")
	b := lease.Binding{OrganizationID: "o", WorkspaceID: "w", ThreadID: "t", RunnerSessionID: "s"}
	var cl client.Claim
	for deadline := time.Now().Add(90 * time.Second); cl.Lease == nil; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no cell became claimable:\n%s", stderr.String())
		}
		var err error
		if cl, err = c.Claim(context.Background(), wire.ClaimRequest{Release: rel, Binding: b}); err != nil {
			t.Fatal(err)
		}
	}
	started := make(chan struct{})
	type outcome struct {
		res client.ExecResult
		err error
	}
	execDone := make(chan outcome, 1)
	go func() {
		var once bool
		res, err := c.ExecStream(context.Background(), cl.Lease.LeaseID, cl.Proof(),
			client.Command{Argv: []string{"sh", "-c", "echo started; exec sleep 600"}, Timeout: 10 * time.Minute},
			func(o client.Output) error {
				if !once && strings.Contains(string(o.Data), "started") {
					once = true
					close(started)
				}
				return nil
			})
		execDone <- outcome{res, err}
	}()
	select {
	case <-started:
	case o := <-execDone:
		t.Fatalf("the exec ended before Ctrl-C: %+v %v\n%s", o.res, o.err, stderr.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("the exec did not start:\n%s", stderr.String())
	}
	cancel() // Ctrl-C
	var runErr error
	select {
	case runErr = <-done:
	case <-time.After(5 * time.Minute):
		t.Fatalf("dev did not return:\n%s", stderr.String())
	}
	if runErr != nil {
		t.Fatalf("dev at Ctrl-C during a streamed exec: %v\n%s", runErr, stderr.String())
	}
	if !strings.Contains(stderr.String(), "every cell ended, its deletion proven") {
		t.Fatalf("drain not reported complete:\n%s", stderr.String())
	}
	o := <-execDone
	if o.err != nil || o.res.Reason != wire.ReasonKilled {
		t.Fatalf("the streamed exec at Ctrl-C: %+v, %v (want reason %s)", o.res, o.err, wire.ReasonKilled)
	}
}
