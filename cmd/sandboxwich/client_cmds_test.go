package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/httpapi"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
	"github.com/sandboxwich/sandboxwich/store/sqlite"
	"github.com/sandboxwich/sandboxwich/wire"
)

const (
	cliTestTenantToken   = "tok"
	cliTestOperatorToken = "op-token"
	cliTestWorkerToken   = "sbw_wtok_x"
	cliTestPool          = "default"
)

// cliTestServer is the real server over SQLite, with hooks to add pool cells
// and complete their stops as the pool reconciler would.
type cliTestServer struct {
	url      string
	store    *sqlite.Store
	release  wire.Release
	workerID uuid.UUID
}

func startCLITestServer(t *testing.T) *cliTestServer {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	keys, err := attest.NewKeyring([]byte("sandboxwich-test-sterile-cell-signing-key-32-bytes-minimum"))
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	plane, err := sandboxwich.New(st, keys, sandboxwich.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	digest := strings.Repeat("a", 64)
	rel := wire.Release{ReleaseSetID: "release-set-2026-08-07", RuntimeClass: lease.KataMicroVM, PolicyDigest: digest,
		Signature: keys.SignRelease("release-set-2026-08-07", string(lease.KataMicroVM), digest)}
	s := &cliTestServer{store: st, release: rel, workerID: uuid.Must(uuid.NewV7())}
	lastErr := "provider said:\nno"
	h, err := httpapi.New(httpapi.Config{
		Plane:  plane,
		Logger: quiet,
		Auth: httpapi.Auth{
			TenantTokens:  map[string]string{cliTestTenantToken: "acme"},
			OperatorToken: cliTestOperatorToken,
			Workers: map[string]sandboxwich.Worker{cliTestWorkerToken: {
				ID: s.workerID, TenantID: "acme", RuntimeClasses: []lease.RuntimeClass{lease.KataMicroVM}}},
		},
		Pools: func(context.Context) ([]wire.Pool, error) {
			return []wire.Pool{{Name: cliTestPool, Provider: "dry-run", Mode: "dry_run", TenantID: "acme", Release: rel, Target: 3,
				Members:   map[string]int{"provisioning": 0, "ready": 1, "leased": 1, "stopping": 0, "cleanup_pending": 1, "destroyed": 4, "quarantined": 0},
				LastError: &lastErr}}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

func (s *cliTestServer) addPoolCell(t *testing.T) uuid.UUID {
	t.Helper()
	ctx, now := context.Background(), time.Now()
	id := uuid.Must(uuid.NewV7())
	if _, err := s.store.CreateMember(ctx, store.CreateMemberParams{CellID: id, Pool: cliTestPool, TenantID: "acme", Now: now}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.store.AdmitMember(ctx, store.AdmitParams{CellID: id, Pool: cliTestPool, WorkerID: "pool:" + cliTestPool,
		ProviderCellID: id.String(), Identity: "test", Release: s.release, ReadyDeadline: now.Add(10 * time.Minute), Now: now}); err != nil {
		t.Fatal(err)
	}
	return id
}

// cliTestEnv is a command environment with buffers and a map environment.
type cliTestEnv struct {
	stdin          *bytes.Buffer
	stdout, stderr *bytes.Buffer
	vars           map[string]string
}

func newCLITestEnv(url string) *cliTestEnv {
	return &cliTestEnv{stdin: new(bytes.Buffer), stdout: new(bytes.Buffer), stderr: new(bytes.Buffer),
		vars: map[string]string{"SANDBOXWICH_URL": url, "SANDBOXWICH_TOKEN": cliTestTenantToken}}
}

func (te *cliTestEnv) env() env {
	return env{stdin: te.stdin, stdout: te.stdout, stderr: te.stderr, getenv: func(k string) string { return te.vars[k] }}
}

// run runs a command through the registry and returns its exit status.
func (te *cliTestEnv) run(args ...string) int {
	te.stdout.Reset()
	te.stderr.Reset()
	return run(context.Background(), te.env(), args)
}

func (s *cliTestServer) claimArgs(attFile string, extra ...string) []string {
	return append([]string{"claim", "--release-set-id", s.release.ReleaseSetID, "--runtime-class", string(s.release.RuntimeClass),
		"--policy-digest", s.release.PolicyDigest, "--release-signature", s.release.Signature,
		"--org", "org-1", "--workspace", "workspace-1", "--thread", "thread-1", "--session", "session-1",
		"--attestation-file", attFile}, extra...)
}

func proofArgs(cmd string, leaseID uuid.UUID, attFile string, extra ...string) []string {
	return append([]string{cmd, "--lease-id", leaseID.String(), "--attestation-file", attFile,
		"--org", "org-1", "--workspace", "workspace-1", "--thread", "thread-1", "--session", "session-1"}, extra...)
}

// checkAttestationFile asserts a 0600 file holding an attestation that
// stdout and stderr do not show, and returns it.
func checkAttestationFile(t *testing.T, te *cliTestEnv, path string) string {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("attestation file mode %v, want 0600", fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	att := string(b)
	if !strings.HasPrefix(att, "swla1_") || len(att) != 49 {
		t.Fatalf("attestation file holds %d bytes, not an attestation", len(att))
	}
	for name, out := range map[string]string{"stdout": te.stdout.String(), "stderr": te.stderr.String()} {
		if strings.Contains(out, att) || strings.Contains(out, att[6:20]) {
			t.Errorf("%s shows the attestation:\n%s", name, out)
		}
	}
	return att
}

func TestCLIClaimValidateRelease(t *testing.T) {
	s := startCLITestServer(t)
	cellID := s.addPoolCell(t)
	te := newCLITestEnv(s.url)
	attFile := filepath.Join(t.TempDir(), "lease.att")

	if code := te.run(s.claimArgs(attFile)...); code != 0 {
		t.Fatalf("claim: exit %d\n%s", code, te.stderr)
	}
	checkAttestationFile(t, te, attFile)
	out := te.stdout.String()
	for _, want := range []string{"lease_id", "cell_id", cellID.String(), "generation", "expires_at", "claim_id", "written to " + attFile} {
		if !strings.Contains(out, want) {
			t.Errorf("claim output lacks %q:\n%s", want, out)
		}
	}
	var leaseID uuid.UUID
	for line := range strings.Lines(out) {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "lease_id" {
			leaseID = uuid.MustParse(f[1])
		}
	}

	// validate, human and --json
	if code := te.run(proofArgs("validate", leaseID, attFile)...); code != 0 || !strings.Contains(te.stdout.String(), "valid") {
		t.Fatalf("validate: exit %d\n%s%s", code, te.stdout, te.stderr)
	}
	if code := te.run(proofArgs("validate", leaseID, attFile, "--json")...); code != 0 {
		t.Fatalf("validate --json: exit %d\n%s", code, te.stderr)
	}
	var vr wire.ValidateResponse
	if err := json.Unmarshal(te.stdout.Bytes(), &vr); err != nil || !vr.OK || vr.Lease.LeaseID != leaseID || vr.Lease.CellID != cellID {
		t.Fatalf("validate --json = %s (%v)", te.stdout, err)
	}

	// A wrong binding fails the fence: the server's code and message.
	if code := te.run(proofArgs("validate", leaseID, attFile, "--org", "org-2")...); code != 1 ||
		!strings.Contains(te.stderr.String(), "sandboxwich validate: conflict: ") {
		t.Errorf("validate with a wrong binding: exit %d\n%s", code, te.stderr)
	}

	// lease --json
	if code := te.run("lease", "--lease-id", leaseID.String(), "--json"); code != 0 {
		t.Fatalf("lease: exit %d\n%s", code, te.stderr)
	}
	var sr wire.StatusResponse
	if err := json.Unmarshal(te.stdout.Bytes(), &sr); err != nil || sr.Status.State != lease.Leased {
		t.Fatalf("lease --json = %s (%v)", te.stdout, err)
	}

	// exec: the plane's provider has none.
	if code := te.run(proofArgs("exec", leaseID, attFile, "--", "echo", "hi")...); code != 1 ||
		!strings.Contains(te.stderr.String(), "exec_unsupported: ") {
		t.Errorf("exec: exit %d\n%s", code, te.stderr)
	}

	// release --wait, while the "pool" proves the deletion.
	time.AfterFunc(100*time.Millisecond, func() {
		if _, err := s.store.CompleteStop(context.Background(), store.StopOutcome{CellID: cellID, StopLeaseID: leaseID,
			StopGeneration: 2, Disposition: lease.Destroyed, Proven: true, Now: time.Now()}); err != nil {
			t.Error(err)
		}
	})
	if code := te.run(proofArgs("release", leaseID, attFile, "--wait", "--poll", "10ms", "--json")...); code != 0 {
		t.Fatalf("release: exit %d\n%s", code, te.stderr)
	}
	sr = wire.StatusResponse{}
	if err := json.Unmarshal(te.stdout.Bytes(), &sr); err != nil || !sr.Status.ProviderAbsent || sr.Status.State != lease.Destroyed {
		t.Fatalf("release --wait --json = %s (%v)", te.stdout, err)
	}
	if code := te.run("lease", "--lease-id", leaseID.String()); code != 0 || !strings.Contains(te.stdout.String(), "provider_absent  true") {
		t.Errorf("lease: exit %d\n%s%s", code, te.stdout, te.stderr)
	}
}

func TestCLIClaimJSON(t *testing.T) {
	s := startCLITestServer(t)
	s.addPoolCell(t)
	te := newCLITestEnv(s.url)
	attFile := filepath.Join(t.TempDir(), "lease.att")
	claimID := uuid.Must(uuid.NewV7())
	if code := te.run(s.claimArgs(attFile, "--json", "--claim-id", claimID.String(), "--lease-seconds", "60")...); code != 0 {
		t.Fatalf("claim --json: exit %d\n%s", code, te.stderr)
	}
	checkAttestationFile(t, te, attFile)
	var out map[string]json.RawMessage
	if err := json.Unmarshal(te.stdout.Bytes(), &out); err != nil {
		t.Fatalf("claim --json = %s: %v", te.stdout, err)
	}
	if _, ok := out["lease_attestation"]; ok {
		t.Error("claim --json has lease_attestation")
	}
	var got claimJSON
	if err := json.Unmarshal(te.stdout.Bytes(), &got); err != nil || !got.OK || got.Lease == nil || got.ClaimID != claimID ||
		got.AttestationFile == nil || *got.AttestationFile != attFile {
		t.Fatalf("claim --json = %s (%v)", te.stdout, err)
	}
	if d := time.Until(got.Lease.ExpiresAt.Time); d > 61*time.Second || d < 30*time.Second {
		t.Errorf("lease expires in %v, want about 60 s", d)
	}

	// The same claim ID into a new file: the same lease, the same secret.
	att := checkAttestationFile(t, te, attFile)
	again := filepath.Join(t.TempDir(), "again.att")
	if code := te.run(s.claimArgs(again, "--json", "--claim-id", claimID.String(), "--lease-seconds", "60")...); code != 0 {
		t.Fatalf("repeated claim: exit %d\n%s", code, te.stderr)
	}
	var got2 claimJSON
	if err := json.Unmarshal(te.stdout.Bytes(), &got2); err != nil || got2.Lease == nil || got2.Lease.LeaseID != got.Lease.LeaseID {
		t.Fatalf("repeated claim = %s (%v)", te.stdout, err)
	}
	if checkAttestationFile(t, te, again) != att {
		t.Error("the repeated claim wrote another attestation")
	}
}

func TestCLIClaimRefusesExistingFileAndConsumesNothing(t *testing.T) {
	s := startCLITestServer(t)
	cellID := s.addPoolCell(t) // the only cell
	te := newCLITestEnv(s.url)
	dir := t.TempDir()
	existing := filepath.Join(dir, "taken")
	if err := os.WriteFile(existing, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	code := te.run(s.claimArgs(existing)...)
	if code == 0 || !strings.Contains(te.stderr.String(), "already exists") || !strings.Contains(te.stderr.String(), "nothing was claimed") {
		t.Errorf("claim into an existing file: exit %d\n%s", code, te.stderr)
	}
	if b, _ := os.ReadFile(existing); string(b) != "keep me" {
		t.Errorf("existing file changed to %q", b)
	}
	// A path in a missing directory is refused the same way.
	if code := te.run(s.claimArgs(filepath.Join(dir, "missing", "att"))...); code == 0 || !strings.Contains(te.stderr.String(), "nothing was claimed") {
		t.Errorf("claim into a missing directory: exit %d\n%s", code, te.stderr)
	}
	// The one cell is still there.
	fresh := filepath.Join(dir, "fresh")
	if code := te.run(s.claimArgs(fresh, "--json")...); code != 0 {
		t.Fatalf("claim: exit %d\n%s", code, te.stderr)
	}
	var got claimJSON
	if err := json.Unmarshal(te.stdout.Bytes(), &got); err != nil || got.Lease == nil || got.Lease.CellID != cellID {
		t.Fatalf("claim = %s (%v)", te.stdout, err)
	}
	checkAttestationFile(t, te, fresh)

	// No cell left: exit 3, and no file is left behind.
	empty := filepath.Join(dir, "empty")
	te.stdout.Reset()
	te.stderr.Reset()
	err := cliClaim(context.Background(), te.env(), s.claimArgs(empty)[1:])
	if ec, ok := errors.AsType[exitCode](err); !ok || ec != 3 || !strings.Contains(te.stderr.String(), "no ready cell") {
		t.Errorf("empty claim: %v\n%s", err, te.stderr)
	}
	if _, err := os.Stat(empty); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("empty claim left %s: %v", empty, err)
	}
	// A refused claim leaves no file either.
	refused := filepath.Join(dir, "refused")
	if code := te.run(s.claimArgs(refused, "--release-signature", "swrs1_"+strings.Repeat("A", 43))...); code != 1 ||
		!strings.Contains(te.stderr.String(), "authorization_denied: ") {
		t.Errorf("refused claim: exit %d\n%s", code, te.stderr)
	}
	if _, err := os.Stat(refused); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("refused claim left %s: %v", refused, err)
	}
}

func TestCLITokens(t *testing.T) {
	s := startCLITestServer(t)
	te := newCLITestEnv(s.url)
	id := uuid.Must(uuid.NewV7()).String()

	// No --token flag exists: tokens never come from argv.
	if code := te.run("lease", "--lease-id", id, "--token", cliTestTenantToken); code != 2 {
		t.Errorf("--token: exit %d\n%s", code, te.stderr)
	}
	// From a file.
	delete(te.vars, "SANDBOXWICH_TOKEN")
	tokFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokFile, []byte(cliTestTenantToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code := te.run("lease", "--lease-id", id, "--token-file", tokFile); code != 1 || !strings.Contains(te.stderr.String(), "not_found: ") {
		t.Errorf("lease with --token-file: exit %d\n%s", code, te.stderr)
	}
	// None at all: the server's answer and a hint.
	if code := te.run("lease", "--lease-id", id); code != 1 || !strings.Contains(te.stderr.String(), "unauthorized: ") ||
		!strings.Contains(te.stderr.String(), "SANDBOXWICH_TOKEN") {
		t.Errorf("lease without a token: exit %d\n%s", code, te.stderr)
	}
	if strings.Contains(te.stderr.String(), cliTestTenantToken+"\n") {
		t.Error("a token was printed")
	}
}

func TestCLIUsage(t *testing.T) {
	te := newCLITestEnv("http://127.0.0.1:1")
	for _, args := range [][]string{
		{"claim", "--org", "o"},
		{"claim", "--release-set-id", "r", "--runtime-class", "kata_microvm", "--policy-digest", "d", "--release-signature", "s",
			"--org", "o", "--workspace", "w", "--thread", "t", "--session", "s"}, // no --attestation-file
		{"claim", "--runtime-class", "vm"},
		{"validate", "--lease-id", "nope"},
		{"validate", "--lease-id", uuid.NewString()},
		{"release", "--disposition", "gone"},
		{"lease"},
		{"lease", "--lease-id", uuid.NewString(), "extra"},
		{"exec", "--lease-id", uuid.NewString()},
		{"cell", "--cell-id", uuid.NewString()},
		{"lease", "--server", "ftp://x", "--lease-id", uuid.NewString()},
	} {
		if code := te.run(args...); code != 2 {
			t.Errorf("%q: exit %d, want 2\n%s", args, code, te.stderr)
		}
	}
	if code := te.run("claim", "-h"); code != 0 || !strings.Contains(te.stderr.String(), "-attestation-file") {
		t.Errorf("claim -h: exit %d\n%s", code, te.stderr)
	}
}

func TestCLIExecStreamsAndExitCode(t *testing.T) {
	var got wire.ExecRequest
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+cliTestTenantToken {
			w.WriteHeader(401)
			return
		}
		if err := json.NewDecoder(r.Body).Decode(&got); err != nil {
			t.Error(err)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(wire.ExecResponse{OK: true, ExitCode: 7,
			StdoutBase64: base64.StdEncoding.EncodeToString([]byte("out\x00raw")),
			StderrBase64: base64.StdEncoding.EncodeToString([]byte("err")), Truncated: true, DurationMS: 12})
	}))
	defer srv.Close()
	te := newCLITestEnv(srv.URL)
	te.vars["SECRET_FROM_ENV"] = "v2"
	attFile := filepath.Join(t.TempDir(), "att")
	if err := os.WriteFile(attFile, []byte("swla1_x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	leaseID := uuid.Must(uuid.NewV7())
	te.stdin.WriteString("input")
	args := proofArgs("exec", leaseID, attFile, "--stdin-file", "-", "--env", "A=1", "--env", "SECRET_FROM_ENV",
		"--timeout-seconds", "5", "--", "sh", "-c", "exit 7")
	err := cliExec(context.Background(), te.env(), args[1:])
	if ec, ok := errors.AsType[exitCode](err); !ok || ec != 7 {
		t.Fatalf("exec returned %v, want exit status 7", err)
	}
	if te.stdout.String() != "out\x00raw" || !strings.HasPrefix(te.stderr.String(), "err") || !strings.Contains(te.stderr.String(), "truncated") {
		t.Errorf("stdout %q, stderr %q", te.stdout, te.stderr)
	}
	if strings.Join(got.Argv, " ") != "sh -c exit 7" || got.StdinBase64 != base64.StdEncoding.EncodeToString([]byte("input")) ||
		got.Env["A"] != "1" || got.Env["SECRET_FROM_ENV"] != "v2" || got.TimeoutSeconds == nil || *got.TimeoutSeconds != 5 ||
		got.LeaseAttestation != "swla1_x" || got.Generation != 2 || got.OrganizationID != "org-1" {
		t.Errorf("exec request = %+v", got)
	}

	// --json prints the wire answer and keeps the exit status.
	te.stdout.Reset()
	te.stderr.Reset()
	err = cliExec(context.Background(), te.env(), proofArgs("exec", leaseID, attFile, "--json", "--", "true")[1:])
	if ec, ok := errors.AsType[exitCode](err); !ok || ec != 7 {
		t.Fatalf("exec --json returned %v", err)
	}
	var resp wire.ExecResponse
	if err := json.Unmarshal(te.stdout.Bytes(), &resp); err != nil || resp.ExitCode != 7 || !resp.Truncated {
		t.Errorf("exec --json = %s (%v)", te.stdout, err)
	}
}

func TestCLIPools(t *testing.T) {
	s := startCLITestServer(t)
	te := newCLITestEnv(s.url)
	if code := te.run("pools"); code != 1 || !strings.Contains(te.stderr.String(), "unauthorized: ") ||
		!strings.Contains(te.stderr.String(), "SANDBOXWICH_OPERATOR_TOKEN") {
		t.Errorf("pools without the operator token: exit %d\n%s", code, te.stderr)
	}
	te.vars["SANDBOXWICH_OPERATOR_TOKEN"] = cliTestOperatorToken
	if code := te.run("pools"); code != 0 {
		t.Fatalf("pools: exit %d\n%s", code, te.stderr)
	}
	lines := strings.Split(strings.TrimSpace(te.stdout.String()), "\n")
	if len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "NAME PROVIDER MODE TARGET READY LEASED STOPPING CLEANUP_PENDING LAST_ERROR" ||
		strings.Join(strings.Fields(lines[1]), " ") != "default dry-run dry_run 3 1 1 0 1 provider said: no" {
		t.Errorf("pools table:\n%s", te.stdout)
	}
	if code := te.run("pools", "--json"); code != 0 {
		t.Fatalf("pools --json: exit %d\n%s", code, te.stderr)
	}
	var pr wire.PoolsResponse
	if err := json.Unmarshal(te.stdout.Bytes(), &pr); err != nil || !pr.OK || len(pr.Pools) != 1 || pr.Pools[0].Members["destroyed"] != 4 {
		t.Errorf("pools --json = %s (%v)", te.stdout, err)
	}
}

func TestCLIWorker(t *testing.T) {
	s := startCLITestServer(t)
	w := newCLITestEnv(s.url)
	w.vars["SANDBOXWICH_TOKEN"] = cliTestWorkerToken
	w.vars["SANDBOXWICH_WORKER_ID"] = s.workerID.String()
	cellID := uuid.Must(uuid.NewV7())
	if code := w.run("prepare", "--cell-id", cellID.String(), "--provider-cell-id", "vm-1",
		"--release-set-id", s.release.ReleaseSetID, "--runtime-class", string(s.release.RuntimeClass),
		"--policy-digest", s.release.PolicyDigest, "--release-signature", s.release.Signature, "--json"); code != 0 {
		t.Fatalf("prepare: exit %d\n%s", code, w.stderr)
	}
	var cr wire.CellResponse
	if err := json.Unmarshal(w.stdout.Bytes(), &cr); err != nil || cr.Cell.CellID != cellID || cr.Cell.State != lease.Ready {
		t.Fatalf("prepare --json = %s (%v)", w.stdout, err)
	}

	// The tenant claims it.
	te := newCLITestEnv(s.url)
	attFile := filepath.Join(t.TempDir(), "att")
	if code := te.run(s.claimArgs(attFile, "--json")...); code != 0 {
		t.Fatalf("claim: exit %d\n%s", code, te.stderr)
	}
	var claimed claimJSON
	if err := json.Unmarshal(te.stdout.Bytes(), &claimed); err != nil || claimed.Lease == nil || claimed.Lease.CellID != cellID {
		t.Fatalf("claim = %s (%v)", te.stdout, err)
	}

	if code := w.run("cell", "--cell-id", cellID.String()); code != 0 ||
		!strings.Contains(w.stdout.String(), claimed.ClaimID.String()) || !strings.Contains(w.stdout.String(), "leased") {
		t.Errorf("cell: exit %d\n%s%s", code, w.stdout, w.stderr)
	}
	if code := w.run("destroy", "--cell-id", cellID.String(), "--lease-id", claimed.Lease.LeaseID.String(), "--json"); code != 0 {
		t.Fatalf("destroy: exit %d\n%s", code, w.stderr)
	}
	if err := json.Unmarshal(w.stdout.Bytes(), &cr); err != nil || cr.Cell.State != lease.Destroyed {
		t.Errorf("destroy --json = %s (%v)", w.stdout, err)
	}
	if code := w.run("retire", "--cell-id", cellID.String()); code != 1 || !strings.Contains(w.stderr.String(), "conflict: ") {
		t.Errorf("retire of a destroyed cell: exit %d\n%s", code, w.stderr)
	}
}
