package main

import (
	"bytes"
	"context"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/gvisor"
	"github.com/sandboxwich/sandboxwich/httpapi"
	"github.com/sandboxwich/sandboxwich/internal/testenv"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
	"github.com/sandboxwich/sandboxwich/wire"
)

// superviseServer is the real server over SQLite with a pool of real
// cells whose agents record every message they receive.
type superviseServer struct {
	url    string
	plane  *sandboxwich.Plane
	rel    wire.Release
	offset atomic.Int64 // added to the plane's clock
	// cells lists the pool's objects; record reads what an object's agent
	// received.
	cells  driver.Lister
	record func(ctx context.Context, obj driver.Object) ([]byte, error)
	// held is the pool's provider, whose destroys the test may hold.
	held *heldProvider
	// scanUser is the user the attestation scan of a cell runs as; more
	// is what else of a cell the provider holds (a Pod's spec, its
	// Secrets), by name.
	scanUser agent.User
	more     func(t *testing.T, cell uuid.UUID) map[string][]byte
}

// agentProvider is a provider of cells with the agent.
type agentProvider interface {
	driver.Provider
	driver.Lister
	driver.AgentHost
}

// heldProvider is a pool's provider whose Destroy waits while it is held:
// a test reads a stopped cell's agent record before the cell is gone (a
// Pod's record goes with the Pod).
type heldProvider struct {
	agentProvider
	held atomic.Bool
}

func (h *heldProvider) Destroy(ctx context.Context, obj driver.Object) error {
	for h.held.Load() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return h.agentProvider.Destroy(ctx, obj)
}

// startSuperviseServer serves a plane whose pool of cells lives on prov;
// stop ends what the provider leaves after the pool's drain.
func startSuperviseServer(t *testing.T, prov agentProvider, cells int, s *superviseServer, stop func()) {
	t.Helper()
	s.held = &heldProvider{agentProvider: prov}
	quiet := slog.New(slog.DiscardHandler)
	st, keys := testenv.SQLite(t), testenv.Keyring(t)
	s.rel = testenv.Release(keys, lease.GVisorLowerRisk)
	now := func() time.Time { return time.Now().Add(time.Duration(s.offset.Load())) }
	var err error
	if s.plane, err = sandboxwich.New(st, keys, sandboxwich.WithLogger(quiet), sandboxwich.WithClock(now),
		sandboxwich.WithPools(pool.Config{Name: cliTestPool, TenantID: "acme", Release: s.rel, Target: cells, Provider: s.held}),
		sandboxwich.WithPoolOptions(pool.WithInterval(50*time.Millisecond))); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.plane.Run(ctx) }()
	t.Cleanup(func() {
		s.held.held.Store(false)
		_ = s.plane.Pools().SetTarget(cliTestPool, 0)
		dctx, dcancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer dcancel()
		if err := s.plane.Pools().Drain(dctx); err != nil {
			t.Errorf("draining the pool: %v", err)
		}
		cancel()
		<-done
		stop()
	})
	h, err := httpapi.New(httpapi.Config{Plane: s.plane, Logger: quiet, Auth: httpapi.Auth{TenantTokens: map[string]string{cliTestTenantToken: "acme"}}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	s.url = srv.URL
}

// startGVisorTestServer: the pool's cells are real gVisor sandboxes.
func startGVisorTestServer(t *testing.T, cells int) *superviseServer {
	t.Helper()
	if gvisor.FindRunsc() == "" || os.Geteuid() != 0 {
		testenv.Need(t, "runsc and root (scripts/install-runsc.sh)", os.ErrNotExist)
	}
	if testing.Short() {
		t.Skip("starts real gVisor sandboxes")
	}
	dir, err := os.MkdirTemp("", "sbw-supervise-")
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	prov, err := gvisor.New(gvisor.Config{StateDir: state, BundleDir: filepath.Join(dir, "bundles"), Pool: cliTestPool,
		Installation: driver.InstallationTag(dir), RecordAgentMessages: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	s := &superviseServer{cells: prov, scanUser: agent.UserRoot,
		record: func(_ context.Context, o driver.Object) ([]byte, error) { return prov.AgentMessages(o) }}
	startSuperviseServer(t, prov, cells, s, func() {
		_ = gvisor.RemoveStateDir(state)
		_ = os.RemoveAll(dir)
	})
	return s
}

// lease claims a ready cell, waiting for one.
func (s *superviseServer) lease(t *testing.T) sandboxwich.ClaimResult {
	t.Helper()
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		res, err := s.plane.Claim(context.Background(), "acme", sandboxwich.ClaimRequest{ClaimID: uuid.Must(uuid.NewV7()), Release: s.rel,
			Binding: lease.Binding{OrganizationID: "org-1", WorkspaceID: "workspace-1", ThreadID: "thread-1", RunnerSessionID: "session-1"}})
		if err != nil {
			t.Fatal(err)
		}
		if res.Lease != nil {
			return res
		}
	}
	t.Fatal("no cell became ready")
	return sandboxwich.ClaimResult{}
}

// messages is everything the agent of a cell was sent.
func (s *superviseServer) messages(t *testing.T, cell uuid.UUID) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	objs, err := s.cells.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.CellID == cell {
			b, err := s.record(ctx, o)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
	t.Fatalf("no object of cell %s", cell)
	return nil
}

func superviseArgs(leaseID uuid.UUID, attFile, tokenFile string, extra ...string) []string {
	return append([]string{"supervise", "--lease-id", leaseID.String(), "--attestation-file", attFile, "--token-file", tokenFile,
		"--org", "org-1", "--workspace", "workspace-1", "--thread", "thread-1", "--session", "session-1", "--poll", "10ms"}, extra...)
}

func writeFile(t *testing.T, name, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestSupervise runs `sandboxwich supervise` against a server of real
// gVisor cells: the workload's exit code reaches the supervisor; the
// attestation reaches neither the cell (its agent's messages, its
// processes' environments and command lines, its files) nor the
// supervisor's output; a loose attestation file, a second supervisor with
// another lease's attestation and a lease revoked or expired between the
// supervisor's validation and its launch start nothing.
func TestSupervise(t *testing.T) { testSupervise(t, startGVisorTestServer(t, 3)) }

func testSupervise(t *testing.T, s *superviseServer) {
	token := writeFile(t, "token", cliTestTenantToken+"\n", 0o600)
	te := newCLITestEnv(s.url)
	delete(te.vars, "SANDBOXWICH_TOKEN") // the token comes from its file

	res := s.lease(t)
	id, att := res.Lease.ID, res.Attestation()
	attFile := writeFile(t, "lease.att", att, 0o600)
	noLaunch := func(what string, cell uuid.UUID) {
		t.Helper()
		if m := s.messages(t, cell); bytes.Contains(m, []byte("/v1/launch")) {
			t.Errorf("%s: the agent was sent a launch:\n%.400s", what, m)
		}
	}
	checkOutput := func(what string) {
		t.Helper()
		for _, out := range []string{te.stdout.String(), te.stderr.String()} {
			if strings.Contains(out, att) || strings.Contains(out, att[6:20]) {
				t.Errorf("%s: the output shows the attestation:\n%s", what, out)
			}
		}
	}

	// Refused before anything is sent: a loose file, no token file.
	loose := writeFile(t, "loose.att", att, 0o640)
	if code := te.run(superviseArgs(id, loose, token, "--", "true")...); code != 125 || !strings.Contains(te.stderr.String(), "mode 0640") {
		t.Errorf("a 0640 attestation file: exit %d\n%s", code, te.stderr)
	}
	if code := te.run(superviseArgs(id, attFile, "", "--", "true")...); code != 125 || !strings.Contains(te.stderr.String(), "--token-file") {
		t.Errorf("no --token-file: exit %d\n%s", code, te.stderr)
	}
	// A second supervisor presenting another lease's attestation.
	other := s.lease(t)
	otherFile := writeFile(t, "other.att", other.Attestation(), 0o600)
	if code := te.run(superviseArgs(id, otherFile, token, "--", "true")...); code != 125 || !strings.Contains(te.stderr.String(), "validating the lease") {
		t.Errorf("another lease's attestation: exit %d\n%s", code, te.stderr)
	}
	noLaunch("refused supervisors", res.Lease.CellID)

	// The workload's exit code, the attestation read from stdin.
	te.stdin.WriteString(att + "\n")
	code := te.run(superviseArgs(id, "-", token, "--", "sh", "-c", "echo resident; exit 7")...)
	if code != 7 || !strings.Contains(te.stdout.String(), "terminal") {
		t.Fatalf("supervise: exit %d, want 7\n%s%s", code, te.stdout, te.stderr)
	}
	checkOutput("supervise")
	t.Logf("supervise:\n%s%s", te.stdout, te.stderr)
	// A second supervisor of the same lease with another workload: the
	// lease launches once.
	if code := te.run(superviseArgs(id, attFile, token, "--", "sh", "-c", "exit 0")...); code != 125 || !strings.Contains(te.stderr.String(), "conflict") {
		t.Errorf("a second supervisor of the lease: exit %d\n%s", code, te.stderr)
	}
	// The same supervisor again (a restarted sidecar): the replay reports
	// the same exit.
	if code := te.run(superviseArgs(id, attFile, token, "--", "sh", "-c", "echo resident; exit 7")...); code != 7 {
		t.Errorf("a replayed supervise: exit %d, want 7\n%s", code, te.stderr)
	}
	// A lost answer: the first launch reaches the server, its answer is
	// cut; the supervisor retries the same request, the server answers the
	// replay, and one workload ran.
	lost := s.lease(t)
	lostFile := writeFile(t, "lost.att", lost.Attestation(), 0o600)
	te.vars["SANDBOXWICH_URL"] = cutFirstLaunchAnswer(t, s.url)
	code = te.run(superviseArgs(lost.Lease.ID, lostFile, token, "--", "sh", "-c", "echo once >> /home/cell/runs; exit 3")...)
	te.vars["SANDBOXWICH_URL"] = s.url
	if code != 3 {
		t.Fatalf("supervise with a lost answer: exit %d, want 3\n%s", code, te.stderr)
	}
	if m := s.messages(t, lost.Lease.CellID); bytes.Count(m, []byte("POST /v1/launch\n")) < 2 {
		t.Errorf("the agent saw %d launch requests, want the first and its replay", bytes.Count(m, []byte("POST /v1/launch\n")))
	}
	runs, err := s.plane.Exec(context.Background(), "acme", lost.Lease.ID, lost.Proof(), sandboxwich.ExecRequest{Argv: []string{"cat", "/home/cell/runs"}, Timeout: time.Minute})
	if err != nil || string(runs.Stdout) != "once\n" {
		t.Errorf("the workload ran %q times (%v), want once", runs.Stdout, err)
	}

	// The attestation is nowhere in the cell.
	pr := res.Proof()
	ctx := context.Background()
	seen, err := s.plane.Exec(ctx, "acme", id, pr, sandboxwich.ExecRequest{User: sandboxwich.User(s.scanUser), Timeout: time.Minute, Argv: []string{"sh", "-c",
		`for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do cat "$f" 2>/dev/null; echo; done; ` +
			`find /tmp /home /root /run /dev/shm /etc -type f 2>/dev/null | while read -r f; do cat "$f" 2>/dev/null; done`}})
	if err != nil || !bytes.Contains(seen.Stdout, []byte("resident")) {
		t.Fatalf("scanning the cell: %v\n%.300q", err, seen.Stdout)
	}
	msgs := s.messages(t, res.Lease.CellID)
	if !bytes.Contains(msgs, []byte("/v1/launch")) {
		t.Fatalf("the agent's record lacks the launch: %.300q", msgs)
	}
	places := map[string][]byte{"the agent's messages": msgs, "the cell": seen.Stdout}
	if s.more != nil {
		maps.Copy(places, s.more(t, res.Lease.CellID))
	}
	for what, in := range places {
		for _, needle := range []string{att, strings.TrimPrefix(att, "swla1_"), attest.Digest(att)} {
			if bytes.Contains(in, []byte(needle)) {
				t.Errorf("%s holds the attestation (or its digest)", what)
			}
		}
	}

	// Revoked between the validation and the launch: nothing starts. The
	// cells these cases stop are destroyed only after their agents' records
	// are read.
	s.held.held.Store(true)
	otherID := other.Lease.ID
	superviseValidated = func() {
		if _, err := s.plane.Revoke(ctx, "acme", otherID, ""); err != nil {
			t.Errorf("revoke: %v", err)
		}
	}
	t.Cleanup(func() { superviseValidated = nil })
	if code := te.run(superviseArgs(otherID, otherFile, token, "--", "true")...); code != 125 || !strings.Contains(te.stderr.String(), "launching") {
		t.Errorf("revoked after validation: exit %d\n%s", code, te.stderr)
	}
	t.Logf("revoked after validation:\n%s", te.stderr)
	noLaunch("revoked after validation", other.Lease.CellID)
	s.held.held.Store(false)

	// Expired between the validation and the launch: nothing starts.
	third := s.lease(t) // the revoked cell's replacement
	thirdFile := writeFile(t, "third.att", third.Attestation(), 0o600)
	s.held.held.Store(true)
	superviseValidated = func() { s.offset.Store(int64(time.Until(third.Lease.ExpiresAt) + time.Second)) }
	code = te.run(superviseArgs(third.Lease.ID, thirdFile, token, "--", "true")...)
	if code != 125 || !strings.Contains(te.stderr.String(), "launching") {
		t.Errorf("expired after validation: exit %d\n%s", code, te.stderr)
	}
	t.Logf("expired after validation:\n%s", te.stderr)
	noLaunch("expired after validation", third.Lease.CellID)
	s.offset.Store(0)
	s.held.held.Store(false)
}

// cutFirstLaunchAnswer is a proxy to url that forwards every request but
// drops the connection instead of the answer of the first launch: a lost
// answer the server acted on.
func cutFirstLaunchAnswer(t *testing.T, target string) string {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(u)
	var cut atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/launch") && cut.CompareAndSwap(false, true) {
			proxy.ServeHTTP(httptest.NewRecorder(), r)
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestSuperviseAttestationFile: stdin or a regular file only its owner
// may access; empty and oversized ones are refused.
func TestSuperviseAttestationFile(t *testing.T) {
	if got, err := superviseAttestation(strings.NewReader(" swla1_x\n"), "-"); err != nil || got != "swla1_x" {
		t.Fatalf("stdin: %q %v", got, err)
	}
	for _, mode := range []os.FileMode{0o600, 0o400} {
		if got, err := superviseAttestation(nil, writeFile(t, "a", "swla1_y", mode)); err != nil || got != "swla1_y" {
			t.Errorf("mode %v: %q %v", mode, got, err)
		}
	}
	for name, path := range map[string]string{
		"group-readable": writeFile(t, "g", "swla1_z", 0o640),
		"world-readable": writeFile(t, "w", "swla1_z", 0o604),
		"empty":          writeFile(t, "e", "  \n", 0o600),
		"oversized":      writeFile(t, "o", strings.Repeat("x", cliMaxSecretFile+1), 0o600),
		"a directory":    t.TempDir(),
		"missing":        filepath.Join(t.TempDir(), "none"),
	} {
		if got, err := superviseAttestation(nil, path); err == nil {
			t.Errorf("%s: accepted %q", name, got)
		}
	}
	if _, err := superviseAttestation(strings.NewReader(""), "-"); err == nil {
		t.Error("empty stdin accepted")
	}
}
