package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/internal/testenv/testserver"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
	"github.com/sandboxwich/sandboxwich/store/sqlite"
	"github.com/sandboxwich/sandboxwich/wire"
)

const (
	cliTestTenantToken   = testserver.TenantToken
	cliTestOperatorToken = testserver.OperatorToken
	cliTestWorkerToken   = testserver.WorkerToken
	cliTestPool          = testserver.Pool
)

// cliTestServer is the real server over SQLite, with hooks to add pool cells
// and complete their stops as the pool reconciler would.
type cliTestServer struct {
	*testserver.Server
	url      string
	store    *sqlite.Store
	plane    *sandboxwich.Plane
	release  wire.Release
	workerID uuid.UUID
}

func startCLITestServer(t *testing.T) *cliTestServer {
	t.Helper()
	// A real pool, reconciled only when a test runs a pass, whose provider
	// fails to list its objects (so a pass sets its last_error).
	s := testserver.Start(t, listFailing{fake.New(fake.Config{})}, 3)
	return &cliTestServer{Server: s, url: s.URL, store: s.Store, plane: s.Plane, release: s.Release, workerID: s.WorkerID}
}

// listFailing is the fake provider whose List fails.
type listFailing struct{ *fake.Provider }

func (listFailing) List(context.Context) ([]driver.Object, error) {
	return nil, errors.New("provider said:\nno")
}

func (s *cliTestServer) addPoolCell(t *testing.T) uuid.UUID { return s.AddPoolCell(t) }

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

	// exec: the plane's provider has none, exec's own failure (125).
	if code := te.run(proofArgs("exec", leaseID, attFile, "--", "echo", "hi")...); code != 125 ||
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
		{"renew", "--lease-id", uuid.NewString(), "--lease-seconds", "60"},
		{"lease"},
		{"lease", "--lease-id", uuid.NewString(), "extra"},
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
		exit := wire.ExecExit{OK: true, ExitCode: 7, Truncated: true, MaxOutputBytes: 1 << 20, DurationMS: 12, Reason: wire.ReasonExited}
		if r.Header.Get("Accept") == "text/event-stream" {
			w.Header().Set("Content-Type", "text/event-stream")
			for _, ev := range []struct{ name, data string }{{"stdout", "out\x00"}, {"stderr", "err"}, {"stdout", "raw"}} {
				b, _ := json.Marshal(wire.ExecOutput{DataBase64: base64.StdEncoding.EncodeToString([]byte(ev.data))})
				fmt.Fprintf(w, "event: %s\ndata: %s\n\n: keep-alive\n\n", ev.name, b)
			}
			b, _ := json.Marshal(exit)
			fmt.Fprintf(w, "event: exit\ndata: %s\n\n", b)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(wire.ExecResponse{ExecExit: exit,
			StdoutBase64: base64.StdEncoding.EncodeToString([]byte("out\x00raw")),
			StderrBase64: base64.StdEncoding.EncodeToString([]byte("err"))})
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
	if te.stdout.String() != "out\x00raw" || !strings.HasPrefix(te.stderr.String(), "err") || !strings.Contains(te.stderr.String(), "truncated by the server at its cap of 1048576 bytes") {
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
	// A pass provisions three cells, then fails to list the provider's
	// objects; one cell is then leased.
	ctx := context.Background()
	s.plane.Pools().Pass(ctx)
	if res, err := s.plane.Claim(ctx, "acme", sandboxwich.ClaimRequest{Release: s.release, Binding: lease.Binding{
		OrganizationID: "org-1", WorkspaceID: "ws-1", ThreadID: "th-1", RunnerSessionID: "rs-1"}}); err != nil || res.Lease == nil {
		t.Fatalf("claim: %v, %v", res, err)
	}
	if code := te.run("pools"); code != 0 {
		t.Fatalf("pools: exit %d\n%s", code, te.stderr)
	}
	lines := strings.Split(strings.TrimSpace(te.stdout.String()), "\n")
	if len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "NAME PROVIDER MODE TARGET READY LEASED STOPPING CLEANUP_PENDING LAST_ERROR" ||
		strings.Join(strings.Fields(lines[1]), " ") != "default dry-run dry_run 3 2 1 0 0 list: provider said: no" {
		t.Errorf("pools table:\n%s", te.stdout)
	}
	if code := te.run("pools", "--json"); code != 0 {
		t.Fatalf("pools --json: exit %d\n%s", code, te.stderr)
	}
	var pr wire.PoolsResponse
	if err := json.Unmarshal(te.stdout.Bytes(), &pr); err != nil || !pr.OK || len(pr.Pools) != 1 ||
		len(pr.Pools[0].Members) != len(lease.MemberStates) || pr.Pools[0].LastError == nil || *pr.Pools[0].LastError != "list: provider said:\nno" {
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

// cliEnvelope decodes stdout as the JSON error envelope, and nothing else.
func cliEnvelope(t *testing.T, te *cliTestEnv) wire.ErrorResponse {
	t.Helper()
	var got map[string]any
	if err := json.Unmarshal(te.stdout.Bytes(), &got); err != nil {
		t.Fatalf("stdout is not a JSON object: %v\n%s\nstderr: %s", err, te.stdout, te.stderr)
	}
	var env wire.ErrorResponse
	_ = json.Unmarshal(te.stdout.Bytes(), &env)
	if len(got) != 3 || got["ok"] != false || env.Code == "" || env.Message == "" {
		t.Errorf("stdout is not {ok:false, code, message}: %s", te.stdout)
	}
	return env
}

func TestCLIJSONErrors(t *testing.T) {
	s := startCLITestServer(t)
	te := newCLITestEnv(s.url)
	// An error answer of the server: its code, exit 1.
	if code := te.run("lease", "--json", "--lease-id", uuid.NewString()); code != 1 {
		t.Errorf("lease of an unknown lease: exit %d, want 1", code)
	}
	if env := cliEnvelope(t, te); env.Code != "not_found" {
		t.Errorf("code %q, want not_found", env.Code)
	}
	// Usage errors: missing flags, and a bad flag before --json.
	for _, args := range [][]string{{"validate", "--json"}, {"lease", "--bogus", "--json"}} {
		if code := te.run(args...); code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
		if env := cliEnvelope(t, te); env.Code != "usage" {
			t.Errorf("%q: code %q, want usage", args, env.Code)
		}
	}
	// exec's own failure: exit 125.
	if code := te.run("exec", "--json", "--lease-id", uuid.NewString(), "--", "true"); code != 125 {
		t.Errorf("exec without a proof: exit %d, want 125", code)
	}
	if env := cliEnvelope(t, te); env.Code != "usage" {
		t.Errorf("exec: code %q, want usage", env.Code)
	}
}

func TestCLIMissingFlagsAllAtOnce(t *testing.T) {
	te := newCLITestEnv("http://127.0.0.1:1")
	code := te.run("claim", "--org", "o", "--thread", "t")
	if code != 2 {
		t.Errorf("exit %d, want 2", code)
	}
	msg := te.stderr.String()
	if n := strings.Count(strings.TrimSpace(msg), "\n"); n > 1 {
		t.Errorf("more than one message:\n%s", msg)
	}
	for _, f := range []string{"--release-set-id", "--runtime-class", "--policy-digest", "--release-signature",
		"--workspace", "--session", "--attestation-file"} {
		if !strings.Contains(msg, f) {
			t.Errorf("message lacks %s:\n%s", f, msg)
		}
	}
	for _, f := range []string{"--org", "--thread"} {
		if strings.Contains(msg, f) {
			t.Errorf("message names %s, which was given:\n%s", f, msg)
		}
	}
}

// TestCLIExitStatuses checks usage errors exit 2 and runtime errors 1 in
// every subcommand alike, and exec's own failures 125.
func TestCLIExitStatuses(t *testing.T) {
	dir := t.TempDir()
	te := newCLITestEnv("http://127.0.0.1:1") // nothing listens there
	id := uuid.NewString()
	digest := strings.Repeat("a", 64)
	for _, c := range []struct {
		args []string
		want int
	}{
		{nil, 2},
		{[]string{"help"}, 0},
		{[]string{"nope"}, 2},
		{[]string{"serve", "--bogus"}, 2},
		{[]string{"migrate", "--bogus"}, 2},
		{[]string{"dev", "--bogus"}, 2},
		{[]string{"bench", "--bogus"}, 2},
		{[]string{"sign-release", "--bogus"}, 2},
		{[]string{"sign-release", "--key-file", filepath.Join(dir, "missing"), "--release-set-id", "r",
			"--runtime-class", "kata_microvm", "--policy-digest", digest}, 1},
		{[]string{"lease", "--bogus"}, 2},
		{[]string{"lease", "--lease-id", id, "--timeout", "300ms"}, 1},
		{[]string{"pools", "--timeout", "300ms"}, 1},
		{[]string{"cell", "--worker-id", id, "--cell-id", id, "--timeout", "300ms"}, 1},
		{[]string{"exec", "--bogus"}, 125},
		{[]string{"exec", "--lease-id", id}, 125},
		{[]string{"exec", "-h"}, 0},
		{proofArgs("exec", uuid.New(), filepath.Join(dir, "missing"), "--", "true"), 125},
	} {
		if code := te.run(c.args...); code != c.want {
			t.Errorf("%q: exit %d, want %d\n%s", c.args, code, c.want, te.stderr)
		}
	}
}

func TestCLIExecExitStatus(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "event: exit\ndata: {\"ok\":true,\"exit_code\":42,\"reason\":\"exited\"}\n\n")
	}))
	defer srv.Close()
	te := newCLITestEnv(srv.URL)
	attFile := filepath.Join(t.TempDir(), "att")
	if err := os.WriteFile(attFile, []byte("swla1_x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code := te.run(proofArgs("exec", uuid.New(), attFile, "--", "sh", "-c", "exit 42")...); code != 42 || te.stderr.Len() != 0 {
		t.Errorf("exec: exit %d, want 42\n%s", code, te.stderr)
	}
}

func TestCLIHelpOrder(t *testing.T) {
	te := newCLITestEnv("")
	if code := te.run("help"); code != 0 {
		t.Fatalf("help: exit %d", code)
	}
	var names []string
	for line := range strings.Lines(te.stdout.String()) {
		if f := strings.Fields(line); strings.HasPrefix(line, "  ") && len(f) > 1 {
			names = append(names, f[0])
		}
	}
	want := "serve migrate dev sign-release bench inventory images claim validate exec cp launch launch-status supervise lease leases evidence renew release revoke events pools prepare cell retire destroy"
	if strings.Join(names, " ") != want {
		t.Errorf("help lists %q, want %q", strings.Join(names, " "), want)
	}
	// help <command> shows its flags.
	if code := te.run("help", "lease"); code != 0 || !strings.Contains(te.stderr.String(), "-lease-id") {
		t.Errorf("help lease: exit %d\n%s", code, te.stderr)
	}
}

func TestCLIVersion(t *testing.T) {
	te := newCLITestEnv("")
	if code := te.run("--version"); code != 0 || !strings.HasPrefix(te.stdout.String(), "sandboxwich ") {
		t.Errorf("--version: exit %d\n%s%s", code, te.stdout, te.stderr)
	}
	bi := &debug.BuildInfo{Main: debug.Module{Path: "github.com/sandboxwich/sandboxwich", Version: "(devel)"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "25df8e5c0ffee"}, {Key: "vcs.modified", Value: "true"}}}
	if got, want := versionLine(bi), "sandboxwich (devel) revision 25df8e5c0ffee (modified)"; got != want {
		t.Errorf("versionLine = %q, want %q", got, want)
	}
	bi.Main.Version, bi.Settings = "v1.2.3", nil
	if got, want := versionLine(bi), "sandboxwich v1.2.3"; got != want {
		t.Errorf("versionLine = %q, want %q", got, want)
	}
}

// TestCLIClaimEgress: claim --egress sends the list (422
// egress_not_allowed from a pool without egress, nothing claimed), and
// --egress none asks for no egress, which the pool covers.
func TestCLIClaimEgress(t *testing.T) {
	s := startCLITestServer(t)
	s.addPoolCell(t)
	te := newCLITestEnv(s.url)
	dir := t.TempDir()
	if code := te.run(s.claimArgs(filepath.Join(dir, "wide.att"), "--egress", "pypi.org,files.pythonhosted.org")...); code == 0 ||
		!strings.Contains(te.stderr.String(), "egress_not_allowed") {
		t.Fatalf("claim --egress wider than the pool's: exit %d\n%s", code, te.stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "wide.att")); !os.IsNotExist(err) {
		t.Errorf("a refused claim left its attestation file: %v", err)
	}
	if code := te.run(s.claimArgs(filepath.Join(dir, "none.att"), "--json", "--egress", "none")...); code != 0 {
		t.Fatalf("claim --egress none: exit %d\n%s", code, te.stderr)
	}
	var got claimJSON
	if err := json.Unmarshal(te.stdout.Bytes(), &got); err != nil || got.Lease == nil {
		t.Fatalf("claim --egress none = %s (%v)", te.stdout, err)
	}
}
