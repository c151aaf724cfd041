package hostile

// The harness: build the real binary once, start it as `sandboxwich serve`
// configured through a key file, a config file and a few environment
// variables, talk to it over HTTP (or raw TCP), and read its SQLite
// database to snapshot the state.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/internal/testenv"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/wire"

	_ "modernc.org/sqlite" // reads the server's database
)

// binDir holds the binary built for this test run.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sandboxwich-hostile-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
)

// binary builds cmd/sandboxwich once per test run (with -race when the
// tests run with it, so that the build cache of the tests is reused).
func binary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		goBin, err := exec.LookPath("go")
		if err != nil {
			buildErr = err
			return
		}
		buildPath = filepath.Join(binDir, "sandboxwich")
		args := []string{"build"}
		if raceBuild {
			args = append(args, "-race")
		}
		args = append(args, "-o", buildPath, "github.com/sandboxwich/sandboxwich/cmd/sandboxwich")
		cmd := exec.Command(goBin, args...)
		cmd.Dir = filepath.Join("..", "..")
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildPath
}

// syncBuffer collects the server's output.
type syncBuffer = testenv.Buffer

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// secrets are the credentials of one server, fresh for each.
type secrets struct {
	key                             []byte
	acme, globex, operator, shared  string
	worker1, worker2, worker3       string
	workerID1, workerID2, workerID3 uuid.UUID
	release                         wire.Release // the pool's release (gvisor_lower_risk)
	kataRelease                     wire.Release // a kata release for worker cells
	keys                            *attest.Keyring
	policyDigest, relSet            string
	attestations                    []string // every attestation the test was given
	attestationsMu                  sync.Mutex
}

func newSecrets(t *testing.T) *secrets {
	t.Helper()
	s := &secrets{
		key:       []byte("hostile-signing-key-" + randomHex(24)),
		acme:      "tok-acme-" + randomHex(12),
		globex:    "tok-globex-" + randomHex(12),
		operator:  "op-" + randomHex(12),
		shared:    "tok-shared-" + randomHex(12),
		worker1:   "sbw_wtok_w1-" + randomHex(12),
		worker2:   "sbw_wtok_w2-" + randomHex(12),
		worker3:   "sbw_wtok_w3-" + randomHex(12),
		workerID1: uuid.Must(uuid.NewV7()),
		workerID2: uuid.Must(uuid.NewV7()),
		workerID3: uuid.Must(uuid.NewV7()),
		relSet:    "release-hostile-1",
	}
	keys, err := attest.NewKeyring(s.key)
	if err != nil {
		t.Fatal(err)
	}
	s.keys = keys
	sum := sha256.Sum256([]byte("hostile policy"))
	s.policyDigest = hex.EncodeToString(sum[:])
	s.release = wire.Release{ReleaseSetID: s.relSet, RuntimeClass: lease.GVisorLowerRisk, PolicyDigest: s.policyDigest,
		Signature: keys.SignRelease(lease.Release{ReleaseSetID: s.relSet, RuntimeClass: lease.GVisorLowerRisk, PolicyDigest: s.policyDigest})}
	s.kataRelease = wire.Release{ReleaseSetID: s.relSet, RuntimeClass: lease.KataMicroVM, PolicyDigest: s.policyDigest,
		Signature: keys.SignRelease(lease.Release{ReleaseSetID: s.relSet, RuntimeClass: lease.KataMicroVM, PolicyDigest: s.policyDigest})}
	return s
}

// tokens lists every bearer and operator token.
func (s *secrets) tokens() []string {
	return []string{s.acme, s.globex, s.operator, s.shared, s.worker1, s.worker2, s.worker3}
}

func (s *secrets) addAttestation(a string) {
	s.attestationsMu.Lock()
	s.attestations = append(s.attestations, a)
	s.attestationsMu.Unlock()
}

// configFile is the JSON config file of a server: every token, and a
// dry-run pool of two cells for acme.
func (s *secrets) configFile() map[string]any {
	workers := strings.Join([]string{
		s.workerID1.String() + "@acme:kata_microvm|gvisor_lower_risk=" + s.worker1,
		s.workerID2.String() + "@acme:gvisor_lower_risk=" + s.worker2,
		s.workerID3.String() + "@globex:kata_microvm|gvisor_lower_risk=" + s.worker3,
	}, ",")
	return map[string]any{
		"tenant_tokens":  "acme=" + s.acme + ",globex=" + s.globex,
		"api_token":      s.shared,
		"default_tenant": "shared",
		"operator_token": s.operator,
		"worker_tokens":  workers,
		"pools": []map[string]any{{
			"name": "dry", "provider": "dry-run", "tenant_id": "acme", "target": 2, "ready_ttl_seconds": 3600,
			"release": s.release, "settings": map[string]string{},
		}},
	}
}

// srvOptions configure one start of the binary.
type srvOptions struct {
	keyFile []byte      // content of the key file (default s.key)
	keyMode os.FileMode // default 0600
	noKey   bool        // no key file setting at all
	keyPath string      // use this key path instead of writing one
	file    map[string]any
	env     map[string]string
	tls     bool // the config has TLS files: start does not probe /readyz
}

// server is a running `sandboxwich serve`.
type server struct {
	t      *testing.T
	cmd    *exec.Cmd
	base   string
	addr   string
	dbPath string
	logs   *syncBuffer
	exited chan struct{}
	client *http.Client
	s      *secrets
}

var servingLine = regexp.MustCompile(`url=(https?)://([0-9.]+:[0-9]+)`)

// command returns the serve command for opts, with its files written in
// dir, and the database path.
func command(t *testing.T, s *secrets, dir string, opts srvOptions) (*exec.Cmd, string) {
	t.Helper()
	env := map[string]string{
		"PATH":                          os.Getenv("PATH"),
		"SANDBOXWICH_LISTEN":            "127.0.0.1:0",
		"SANDBOXWICH_LOG_LEVEL":         "debug",
		"SANDBOXWICH_SWEEP_INTERVAL_MS": "100",
	}
	db := filepath.Join(dir, "sandboxwich.db")
	env["SANDBOXWICH_DATABASE_URL"] = "sqlite://" + db
	if !opts.noKey {
		path := opts.keyPath
		if path == "" {
			path = filepath.Join(dir, "signing.key")
			content, mode := opts.keyFile, opts.keyMode
			if content == nil {
				content = append(append([]byte{}, s.key...), '\n')
			}
			if mode == 0 {
				mode = 0o600
			}
			if err := os.WriteFile(path, content, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, mode); err != nil {
				t.Fatal(err)
			}
		}
		env["SANDBOXWICH_STERILE_CELL_SIGNING_KEY_FILE"] = path
	}
	if opts.file != nil {
		b, err := json.Marshal(opts.file)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, "config.json")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		env["SANDBOXWICH_CONFIG"] = path
	}
	for k, v := range opts.env {
		env[k] = v
	}
	cmd := exec.Command(binary(t), "serve")
	cmd.Dir = dir
	dieWithTest(cmd)
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	return cmd, db
}

// start runs the binary and waits until it serves and is ready.
func start(t *testing.T, s *secrets, opts srvOptions) *server {
	t.Helper()
	dir := t.TempDir()
	cmd, db := command(t, s, dir, opts)
	logs := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	srv := &server{t: t, cmd: cmd, dbPath: db, logs: logs, exited: make(chan struct{}), s: s}
	go func() {
		_ = cmd.Wait()
		close(srv.exited)
	}()
	t.Cleanup(srv.stop)
	deadline := time.Now().Add(60 * time.Second)
	for {
		if m := servingLine.FindStringSubmatch(logs.String()); m != nil {
			srv.base, srv.addr = m[1]+"://"+m[2], m[2]
			break
		}
		select {
		case <-srv.exited:
			t.Fatalf("the server exited at start-up:\n%s", logs.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server did not start:\n%s", logs.String())
		}
	}
	srv.client = &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{},
		// Redirects are answers to check, not to follow.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	if opts.tls {
		return srv // the caller brings a client that trusts the certificate
	}
	for {
		r, err := srv.client.Get(srv.base + "/readyz")
		if err == nil {
			_ = r.Body.Close()
			if r.StatusCode == 200 {
				return srv
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server is not ready: %v\n%s", err, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop ends the server with SIGTERM (a kill after 15 s).
func (srv *server) stop() {
	select {
	case <-srv.exited:
		return
	default:
	}
	_ = srv.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-srv.exited:
	case <-time.After(15 * time.Second):
		_ = srv.cmd.Process.Kill()
		<-srv.exited
		srv.t.Errorf("the server did not stop at SIGTERM within 15 s")
	}
}

// resp is a finished response.
type resp struct {
	status int
	header http.Header
	body   []byte
}

// do sends a request. body: nil, string, []byte (sent as is) or a value
// (JSON-encoded); a body gets Content-Type application/json unless hdr
// sets one ("" removes it). hdr holds name/value pairs.
func (srv *server) do(method, path, token string, body any, hdr ...string) resp {
	srv.t.Helper()
	var raw []byte
	switch v := body.(type) {
	case nil:
	case string:
		raw = []byte(v)
	case []byte:
		raw = v
	default:
		var err error
		if raw, err = json.Marshal(v); err != nil {
			srv.t.Fatal(err)
		}
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, srv.base+path, rd)
	if err != nil {
		srv.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	// The first value given for a header replaces the harness's own (a
	// Content-Type, say); later ones for the same name are added.
	seen := map[string]bool{}
	for i := 0; i+1 < len(hdr); i += 2 {
		name := http.CanonicalHeaderKey(hdr[i])
		switch {
		case hdr[i+1] == "":
			req.Header.Del(name)
		case seen[name]:
			req.Header.Add(name, hdr[i+1])
		default:
			req.Header.Set(name, hdr[i+1])
		}
		seen[name] = true
	}
	r, err := srv.client.Do(req)
	if err != nil {
		srv.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		srv.t.Fatal(err)
	}
	return resp{status: r.StatusCode, header: r.Header, body: b}
}

// raw sends bytes as they are over a new TCP connection and reads one
// response (status 0 when the server closed the connection without one).
func (srv *server) raw(payload string) resp {
	srv.t.Helper()
	conn, err := net.DialTimeout("tcp", srv.addr, 5*time.Second)
	if err != nil {
		srv.t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(conn, payload); err != nil && !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
		srv.t.Fatal(err)
	}
	r, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return resp{}
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return resp{status: r.StatusCode, header: r.Header, body: b}
}

// must checks a response's status.
func (r resp) must(t *testing.T, status int) resp {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d; body %s", r.status, status, r.body)
	}
	return r
}

// envelope returns the code of an error envelope, failing t when the body
// is not exactly {"ok":false,"code":…,"message":…}.
func (r resp) envelope(t *testing.T) string {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("error body %q: %v", r.body, err)
	}
	code, _ := m["code"].(string)
	if msg, _ := m["message"].(string); m["ok"] != false || code == "" || msg == "" || len(m) != 3 {
		t.Fatalf("not the error envelope: %s", r.body)
	}
	return code
}

func decode[T any](t *testing.T, r resp) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
	return v
}

// waitPool waits until the pool has n ready members.
func (srv *server) waitPool(n int) {
	srv.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := srv.do("GET", "/v1/pools", srv.s.acme, nil, "x-sandboxwich-operator-token", srv.s.operator).must(srv.t, 200)
		ps := decode[wire.PoolsResponse](srv.t, r)
		if len(ps.Pools) == 1 && ps.Pools[0].Members["ready"] >= n {
			return
		}
		if time.Now().After(deadline) {
			srv.t.Fatalf("the pool did not fill: %s", r.body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// binding is the tenant binding of the claims of these tests.
var binding = map[string]any{"organization_id": "org-1", "workspace_id": "workspace-1", "thread_id": "thread-1", "runner_session_id": "session-1"}

// claimBody is a valid claim of release rel.
func claimBody(rel wire.Release, claimID *uuid.UUID) map[string]any {
	b := map[string]any{"release": rel}
	for k, v := range binding {
		b[k] = v
	}
	if claimID != nil {
		b["claim_id"] = claimID.String()
	}
	return b
}

// claim leases a cell for token and records the attestation.
func (srv *server) claim(token string, rel wire.Release) wire.ClaimResponse {
	srv.t.Helper()
	id := uuid.Must(uuid.NewV7())
	c := decode[wire.ClaimResponse](srv.t, srv.do("POST", "/v1/sterile-cells/claim", token, claimBody(rel, &id)).must(srv.t, 200))
	if c.Lease == nil || c.LeaseAttestation == nil {
		srv.t.Fatalf("claim found no cell")
	}
	srv.s.addAttestation(*c.LeaseAttestation)
	return c
}

// proof is the lease fence of a claim.
func proof(c wire.ClaimResponse) map[string]any {
	return map[string]any{"lease_attestation": *c.LeaseAttestation, "generation": c.Lease.Generation,
		"organization_id": c.Lease.OrganizationID, "workspace_id": c.Lease.WorkspaceID,
		"thread_id": c.Lease.ThreadID, "runner_session_id": c.Lease.RunnerSessionID}
}

// prepare registers a ready kata cell of worker 1.
func (srv *server) prepare() wire.Cell {
	srv.t.Helper()
	body := map[string]any{"cell_id": uuid.Must(uuid.NewV7()).String(), "release": srv.s.kataRelease,
		"provider_cell_id": "vm-" + uuid.NewString(), "expires_at": time.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano)}
	r := srv.do("POST", "/v1/workers/"+srv.s.workerID1.String()+"/sterile-cells/prepare", srv.s.worker1, body).must(srv.t, 200)
	return decode[wire.CellResponse](srv.t, r).Cell
}

// openDB opens the server's database read-only.
func openDB(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro&_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// snapshot is the server's state that a request could change: every cell
// (state, generation, lease), pool membership (state, stop, attempts),
// claim fence and idempotency record. The executor-lock columns the
// reconciler renews are left out.
func snapshot(t *testing.T, db *sql.DB) string {
	t.Helper()
	var b strings.Builder
	for _, q := range []string{
		`SELECT id, tenant_id, state, generation, COALESCE(lease_id, ''), COALESCE(attestation_digest, ''), updated_us FROM cells ORDER BY id`,
		`SELECT cell_id, state, provider_absent, COALESCE(requested_disposition, ''), attempts, updated_us FROM pool_members ORDER BY cell_id`,
		`SELECT tenant_id, claim_id, request_digest, COALESCE(lease_id, '') FROM claim_fences ORDER BY tenant_id, claim_id`,
		`SELECT tenant_id, idem_key, fingerprint, done, status FROM idempotency_records ORDER BY tenant_id, idem_key`,
	} {
		rows, err := db.QueryContext(context.Background(), q)
		if err != nil {
			t.Fatalf("snapshot: %v", err)
		}
		cols, _ := rows.Columns()
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		for rows.Next() {
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			for _, v := range vals {
				if bs, ok := v.([]byte); ok {
					v = string(bs)
				}
				fmt.Fprintf(&b, "%v|", v)
			}
			b.WriteByte('\n')
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		_ = rows.Close()
		b.WriteString("--\n")
	}
	return b.String()
}
