package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/httpapi"
	"github.com/sandboxwich/sandboxwich/internal/testenv"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
	"github.com/sandboxwich/sandboxwich/wire"
)

// cellTestServer is the real server over SQLite whose pool's cells run the
// fake cell agent.
type cellTestServer struct {
	url   string
	plane *sandboxwich.Plane
	prov  *fake.AgentProvider
	rel   wire.Release
}

func startCellTestServer(t *testing.T, cells int) *cellTestServer {
	t.Helper()
	st, keys := testenv.SQLite(t), testenv.Keyring(t)
	quiet := slog.New(slog.DiscardHandler)
	s := &cellTestServer{prov: fake.NewWithAgent(fake.Config{Mode: driver.Apply, Kind: "fake"})}
	s.rel = testenv.Release(keys, lease.GVisorLowerRisk)
	var err error
	if s.plane, err = sandboxwich.New(st, keys, sandboxwich.WithLogger(quiet), sandboxwich.WithPools(pool.Config{
		Name: cliTestPool, TenantID: "acme", Release: s.rel, Target: cells, Provider: s.prov})); err != nil {
		t.Fatal(err)
	}
	s.plane.Pools().Pass(t.Context())
	h, err := httpapi.New(httpapi.Config{Plane: s.plane, Logger: quiet, Auth: httpapi.Auth{TenantTokens: map[string]string{cliTestTenantToken: "acme"}}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

// lease claims a cell and writes its attestation to a 0600 file.
func (s *cellTestServer) lease(t *testing.T) (uuid.UUID, string) {
	t.Helper()
	res, err := s.plane.Claim(context.Background(), "acme", sandboxwich.ClaimRequest{ClaimID: uuid.New(), Release: s.rel,
		Binding: lease.Binding{OrganizationID: "org-1", WorkspaceID: "workspace-1", ThreadID: "thread-1", RunnerSessionID: "session-1"}})
	if err != nil || res.Lease == nil {
		t.Fatalf("claim: %v", err)
	}
	att := filepath.Join(t.TempDir(), "lease.att")
	if err := os.WriteFile(att, []byte(res.Attestation()), 0o600); err != nil {
		t.Fatal(err)
	}
	return res.Lease.ID, att
}

// writes records every Write separately.
type writes struct {
	mu  sync.Mutex
	all []string
}

func (w *writes) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.all = append(w.all, string(p))
	return len(p), nil
}

// TestCLIExecFromCell: exec writes each chunk of output as the cell
// produces it, stdout and stderr apart, and exits with the command's
// status; --json keeps the buffered wire answer.
func TestCLIExecFromCell(t *testing.T) {
	s := startCellTestServer(t, 1)
	id, att := s.lease(t)
	te := newCLITestEnv(s.url)

	var out, errOut writes
	e := te.env()
	e.stdout, e.stderr = &out, &errOut
	e.inv = &invocation{}
	if err := cliExec(context.Background(), e, proofArgs("exec", id, att, "--", "echo", "a", "b", "c")[1:]); err != nil {
		t.Fatal(err)
	}
	if strings.Join(out.all, "|") != "a |b |c\n" || len(errOut.all) != 0 {
		t.Errorf("stdout writes %q, stderr writes %q: want one write per chunk", out.all, errOut.all)
	}

	for _, c := range []struct {
		args           []string
		code           int
		stdout, stderr string
	}{
		{[]string{"--", "exit", "9"}, 9, "", ""},
		{[]string{"--", "nope"}, 127, "", "nope: command not found\n"},
		{[]string{"--cwd", "/srv", "--", "pwd"}, 0, "/srv\n", ""},
		{[]string{"--user", "root", "--", "whoami"}, 0, "root\n", ""},
		{[]string{"--stdin-file", "-", "--", "cat"}, 0, "from stdin", ""},
		{[]string{"--timeout-seconds", "1", "--", "sleep", "30"}, 137, "", "sandboxwich exec: the command timed out and was killed\n"},
		{[]string{"--user", "admin", "--", "id"}, 125, "", "sandboxwich exec: invalid value \"admin\" for flag -user: want cell or root (run `sandboxwich exec -h`)\n"},
		{[]string{"--cwd", "relative", "--", "pwd"}, 125, "", ""},
	} {
		te.stdin.Reset()
		te.stdin.WriteString("from stdin")
		code := te.run(proofArgs("exec", id, att, c.args...)...)
		if code != c.code || te.stdout.String() != c.stdout || (c.stderr != "" && te.stderr.String() != c.stderr) {
			t.Errorf("exec %q: exit %d, stdout %q, stderr %q; want %d, %q, %q", c.args, code, te.stdout, te.stderr, c.code, c.stdout, c.stderr)
		}
	}
	if !strings.Contains(te.stderr.String(), "invalid_request") {
		t.Errorf("a relative cwd: %s", te.stderr)
	}

	if code := te.run(proofArgs("exec", id, att, "--json", "--", "echo", "j")...); code != 0 {
		t.Fatalf("exec --json: exit %d\n%s", code, te.stderr)
	}
	var resp wire.ExecResponse
	if err := json.Unmarshal(te.stdout.Bytes(), &resp); err != nil || resp.StdoutBase64 != base64.StdEncoding.EncodeToString([]byte("j\n")) || resp.Reason != "exited" {
		t.Errorf("exec --json = %s (%v)", te.stdout, err)
	}
}

// TestCLICp: files go into the cell and come back byte for byte, through
// files, directories and stdin/stdout; a failed copy leaves no local file.
func TestCLICp(t *testing.T) {
	s := startCellTestServer(t, 1)
	id, att := s.lease(t)
	te := newCLITestEnv(s.url)
	dir := t.TempDir()
	data := make([]byte, 1<<20+333)
	for i := range data {
		data[i] = byte(i*31 + i>>8)
	}
	local := filepath.Join(dir, "input.bin")
	if err := os.WriteFile(local, data, 0o640); err != nil {
		t.Fatal(err)
	}
	cp := func(args ...string) int { return te.run(proofArgs("cp", id, att, args...)...) }

	if code := cp(local, "cell:/srv/in.bin"); code != 0 {
		t.Fatalf("cp into the cell: exit %d\n%s", code, te.stderr)
	}
	if out := te.stdout.String(); !strings.Contains(out, "/srv/in.bin") || !strings.Contains(out, "1048909") {
		t.Errorf("cp into the cell printed %q", out)
	}
	var mode uint32
	for _, m := range s.prov.Received() {
		if m.Op == "write_file" {
			var req agent.WriteRequest
			_ = json.Unmarshal(m.Body, &req)
			mode = req.Mode
		}
	}
	if mode != 0o640 {
		t.Errorf("the file was written with mode %o, want the local file's 0640", mode)
	}

	back := filepath.Join(dir, "back.bin")
	if code := cp("cell:/srv/in.bin", back); code != 0 {
		t.Fatalf("cp out of the cell: exit %d\n%s", code, te.stderr)
	}
	checkFile(t, back, data, 0o644)
	if code := cp("--mode", "0600", "cell:/srv/in.bin", filepath.Join(dir, "private.bin")); code != 0 {
		t.Fatalf("cp --mode: exit %d\n%s", code, te.stderr)
	}
	checkFile(t, filepath.Join(dir, "private.bin"), data, 0o600)

	// A cell path ending in / and an existing local directory keep the
	// file's name.
	if code := cp(local, "cell:/srv/dir/"); code != 0 {
		t.Fatalf("cp into a cell directory: exit %d\n%s", code, te.stderr)
	}
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if code := cp("cell:/srv/dir/input.bin", sub); code != 0 {
		t.Fatalf("cp into a local directory: exit %d\n%s", code, te.stderr)
	}
	checkFile(t, filepath.Join(sub, "input.bin"), data, 0o644)

	// stdin to the cell, the cell to stdout.
	te.stdin.Reset()
	te.stdin.Write(data[:1000])
	if code := cp("--json", "-", "cell:/srv/stdin"); code != 0 {
		t.Fatalf("cp - : exit %d\n%s", code, te.stderr)
	}
	var fr wire.FileWriteResponse
	if err := json.Unmarshal(te.stdout.Bytes(), &fr); err != nil || !fr.OK || fr.Size != 1000 || fr.Path != "/srv/stdin" {
		t.Errorf("cp --json = %s (%v)", te.stdout, err)
	}
	if code := cp("cell:/srv/stdin", "-"); code != 0 || !bytes.Equal(te.stdout.Bytes(), data[:1000]) {
		t.Errorf("cp to stdout: exit %d, %d bytes\n%s", code, te.stdout.Len(), te.stderr)
	}

	missing := filepath.Join(dir, "missing.bin")
	if code := cp("cell:/srv/none", missing); code != 1 || !strings.Contains(te.stderr.String(), "file_not_found") {
		t.Errorf("cp of a missing file: exit %d\n%s", code, te.stderr)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != "back.bin input.bin private.bin sub" {
		t.Errorf("the copies left %q (a temporary file, or the failed copy?)", names)
	}
	for _, args := range [][]string{
		{local, filepath.Join(dir, "x")},
		{"cell:/a", "cell:/b"},
		{local, "cell:relative"},
		{"cell:/srv/stdin"},
		{"-", "cell:/srv/dir/"},
		{"--json", "cell:/srv/stdin", "-"},
		{"--mode", "0999", local, "cell:/x"},
	} {
		if code := cp(args...); code != 2 {
			t.Errorf("cp %q: exit %d, want 2\n%s", args, code, te.stderr)
		}
	}
}

func checkFile(t *testing.T, path string, data []byte, mode os.FileMode) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("%s: %d bytes, %v; want %d bytes, the same", path, len(got), err, len(data))
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != mode {
		t.Errorf("%s: mode %v, want %v", path, fi.Mode().Perm(), mode)
	}
}

// TestCLILaunch: launch starts the workload and prints its status;
// launch-status --wait and launch --wait exit with the workload's status;
// its output is readable with cp.
func TestCLILaunch(t *testing.T) {
	s := startCellTestServer(t, 2)
	id, att := s.lease(t)
	te := newCLITestEnv(s.url)
	if code := te.run("launch-status", "--lease-id", id.String()); code != 125 || !strings.Contains(te.stderr.String(), "not_found") {
		t.Errorf("launch-status before a launch: exit %d\n%s", code, te.stderr)
	}
	if code := te.run(proofArgs("launch", id, att, "--", "echo", "resident")...); code != 0 || !strings.Contains(te.stdout.String(), "phase") {
		t.Fatalf("launch: exit %d\n%s%s", code, te.stdout, te.stderr)
	}
	if code := te.run("launch-status", "--lease-id", id.String(), "--wait", "--poll", "5ms", "--json"); code != 0 {
		t.Fatalf("launch-status --wait: exit %d\n%s", code, te.stderr)
	}
	var lr wire.LaunchResponse
	if err := json.Unmarshal(te.stdout.Bytes(), &lr); err != nil || lr.Launch.Phase != "terminal" || *lr.Launch.ExitCode != 0 {
		t.Errorf("launch-status --json = %s (%v)", te.stdout, err)
	}
	if code := te.run(proofArgs("launch", id, att, "--", "echo", "other")...); code != 125 || !strings.Contains(te.stderr.String(), "conflict") {
		t.Errorf("a second, different launch: exit %d\n%s", code, te.stderr)
	}
	if code := te.run(proofArgs("cp", id, att, "cell:/home/cell/.launch/stdout", "-")...); code != 0 || te.stdout.String() != "resident\n" {
		t.Errorf("the launch's stdout: exit %d, %q\n%s", code, te.stdout, te.stderr)
	}

	id2, att2 := s.lease(t)
	if code := te.run(proofArgs("launch", id2, att2, "--wait", "--poll", "5ms", "--", "exit", "5")...); code != 5 ||
		!strings.Contains(te.stdout.String(), "terminal") {
		t.Errorf("launch --wait: exit %d, want 5\n%s%s", code, te.stdout, te.stderr)
	}
	if code := te.run(proofArgs("launch", id2, att2)...); code != 125 {
		t.Errorf("launch without a workload: exit %d, want 125 (a usage error of a workload command)", code)
	}
}
