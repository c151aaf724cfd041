package hostile

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/internal/sqltest"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/wire"
)

// TestSecurityCrossTenantIndistinguishable: on every lease route, under the
// versioned path and its alias, another tenant's lease (presented with its
// exact lease fence) is answered byte for byte like a lease that does not
// exist — status, headers and body, all but the request ID and date — for
// another tenant, another tenant's worker and the shared token's tenant;
// and nothing changes.
func TestSecurityCrossTenantIndistinguishable(t *testing.T) {
	t.Parallel()
	s := newSecrets(t)
	srv := start(t, s, srvOptions{file: s.configFile()})
	srv.waitPool(2)
	lc := srv.claim(s.acme, s.release)
	db := openDB(t, srv.dbPath)
	before := snapshot(t, db)

	pf := proof(lc)
	type route struct {
		method, suffix string
		body           any
		workerToo      bool // the route admits workers of the tenant
	}
	routes := []route{
		{"GET", "", nil, false},
		{"POST", "/validate", pf, true},
		{"POST", "/release", with(pf, "disposition", "destroyed"), false},
		{"POST", "/exec", with(pf, "argv", []string{"true"}), false},
		{"POST", "/revoke", nil, false},
		{"GET", "/evidence", nil, false},
	}
	strip := func(r resp) string {
		h := r.header.Clone()
		h.Del("X-Request-Id")
		h.Del("Date")
		return fmt.Sprintf("%d %v %s", r.status, h, r.body)
	}
	checked := 0
	for _, prefix := range []string{"/v1/sterile-cell-leases/", "/sterile-cell-leases/"} {
		for _, rt := range routes {
			unknown := uuid.Must(uuid.NewV7())
			callers := []string{s.globex, s.shared}
			if rt.workerToo {
				callers = append(callers, s.worker3)
			}
			for _, tok := range callers {
				foreign := srv.do(rt.method, prefix+lc.Lease.LeaseID.String()+rt.suffix, tok, rt.body)
				missing := srv.do(rt.method, prefix+unknown.String()+rt.suffix, tok, rt.body)
				if foreign.status != 404 || foreign.envelope(t) != "not_found" {
					t.Errorf("%s %s%s by another tenant: %d %s", rt.method, prefix, rt.suffix, foreign.status, foreign.body)
				}
				if strip(foreign) != strip(missing) {
					t.Errorf("%s %s{id}%s: another tenant's lease and no lease differ:\n%s\n%s",
						rt.method, prefix, rt.suffix, strip(foreign), strip(missing))
				}
				checked++
			}
			// The owner's answer for an unknown lease is the same again.
			own := srv.do(rt.method, prefix+unknown.String()+rt.suffix, s.acme, rt.body)
			other := srv.do(rt.method, prefix+unknown.String()+rt.suffix, s.globex, rt.body)
			if strip(own) != strip(other) {
				t.Errorf("unknown lease: the owner's and another tenant's answers differ")
			}
		}
	}
	if after := snapshot(t, db); after != before {
		t.Fatalf("cross-tenant requests changed the state:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	srv.do("POST", "/v1/sterile-cell-leases/"+lc.Lease.LeaseID.String()+"/validate", s.acme, pf).must(t, 200)
	t.Logf("%d cross-tenant comparisons", checked)
}

// TestSecurityNoSecretAnywhere runs a full life cycle through the binary
// with debug logging, every token configured through a config file:
// fenced claims and their replay, validate (tenant and worker), exec,
// releases with Idempotency-Key and their replay, a worker's prepare and
// destroy, refusals that carry secrets in their bodies, pools and metrics.
// Then no token, no attestation and not the signing key appears in any log
// line, any column of any table of the database, or the server's argv or
// environment (read from /proc while it runs).
func TestSecurityNoSecretAnywhere(t *testing.T) {
	t.Parallel()
	s := newSecrets(t)
	srv := start(t, s, srvOptions{file: s.configFile()})
	srv.waitPool(2)
	lp := func(id uuid.UUID, suffix string) string { return "/v1/sterile-cell-leases/" + id.String() + suffix }

	// Fenced claim, and its exact replay.
	id := uuid.Must(uuid.NewV7())
	c1 := decode[wire.ClaimResponse](t, srv.do("POST", "/v1/sterile-cells/claim", s.acme, claimBody(s.release, &id),
		"Idempotency-Key", "claim-"+id.String()).must(t, 200))
	s.addAttestation(*c1.LeaseAttestation)
	again := decode[wire.ClaimResponse](t, srv.do("POST", "/v1/sterile-cells/claim", s.acme, claimBody(s.release, &id),
		"Idempotency-Key", "claim-"+id.String()).must(t, 200))
	if *again.LeaseAttestation != *c1.LeaseAttestation {
		t.Fatal("a fenced replay regenerated another attestation")
	}
	pf1 := proof(c1)
	srv.do("POST", lp(c1.Lease.LeaseID, "/validate"), s.acme, pf1).must(t, 200)
	srv.do("POST", lp(c1.Lease.LeaseID, "/validate"), s.worker1, pf1).must(t, 200)
	srv.do("POST", lp(c1.Lease.LeaseID, "/exec"), s.acme, with(pf1, "argv", []string{"echo", s.acme}), "Idempotency-Key", "exec-1").must(t, 501)
	// Refusals that carry secrets.
	srv.do("POST", lp(c1.Lease.LeaseID, "/validate"), s.acme, with(pf1, "organization_id", s.globex)).must(t, 409)
	srv.do("POST", lp(c1.Lease.LeaseID, "/validate"), s.globex, pf1).must(t, 404)
	srv.do("POST", lp(c1.Lease.LeaseID, "/release"), s.acme, with(pf1, "disposition", s.operator)).must(t, 422)
	srv.do("POST", "/v1/sterile-cells/claim", s.acme+"x", claimBody(s.release, nil)).must(t, 401)
	srv.do("GET", "/v1/pools", s.acme, nil, "x-sandboxwich-operator-token", s.worker2).must(t, 401)
	srv.do("POST", "/v1/sterile-cells/claim", s.acme, `{"release":"`+*c1.LeaseAttestation+`"}`).must(t, 422)
	// Release with Idempotency-Key, replayed; then wait for the proof.
	rel := with(pf1, "disposition", "destroyed")
	first := srv.do("POST", lp(c1.Lease.LeaseID, "/release"), s.acme, rel, "Idempotency-Key", "release-1").must(t, 202)
	replay := srv.do("POST", lp(c1.Lease.LeaseID, "/release"), s.acme, rel, "Idempotency-Key", "release-1").must(t, 202)
	if !bytes.Equal(first.body, replay.body) {
		t.Fatal("the idempotent release was not replayed")
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := decode[wire.StatusResponse](t, srv.do("GET", lp(c1.Lease.LeaseID, ""), s.acme, nil).must(t, 200)).Status
		if st.ProviderAbsent && st.State == "destroyed" && st.ProviderMode == "dry_run" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("release never completed: %+v", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A worker cell: prepared, claimed, looked up, destroyed.
	cell := srv.prepare()
	c2 := srv.claim(s.acme, s.kataRelease)
	if c2.Lease.CellID != cell.CellID {
		t.Fatalf("claimed %s, want the worker's cell %s", c2.Lease.CellID, cell.CellID)
	}
	w1 := "/v1/workers/" + s.workerID1.String() + "/sterile-cells/" + cell.CellID.String()
	wc := srv.do("GET", w1, s.worker1, nil).must(t, 200)
	for _, a := range s.attestations {
		if strings.Contains(string(wc.body), a) || strings.Contains(string(wc.body), digestOf(a)) {
			t.Fatal("the worker's cell view holds an attestation or its digest")
		}
	}
	srv.do("POST", w1+"/destroy", s.worker1, map[string]any{"lease_id": c2.Lease.LeaseID, "generation": 2, "disposition": "destroyed"}).must(t, 200)
	srv.do("GET", lp(c2.Lease.LeaseID, ""), s.acme, nil).must(t, 200)
	// The other principals.
	srv.do("POST", "/v1/sterile-cells/claim", s.shared, claimBody(s.release, nil)).must(t, 200)
	srv.do("GET", "/v1/pools", s.acme, nil, "x-sandboxwich-operator-token", s.operator).must(t, 200)
	srv.do("GET", "/metrics", s.globex, nil).must(t, 200)

	// argv and environment of the running server (Linux: /proc).
	var procText []string
	if runtime.GOOS == "linux" {
		pid := srv.cmd.Process.Pid
		for _, f := range []string{"cmdline", "environ"} {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, f))
			if err != nil {
				t.Fatalf("read /proc/%d/%s: %v", pid, f, err)
			}
			if len(b) == 0 {
				t.Fatalf("/proc/%d/%s is empty", pid, f)
			}
			procText = append(procText, f+":"+string(b))
		}
		if !strings.Contains(procText[1], "SANDBOXWICH_CONFIG=") {
			t.Fatal("the environment read is not the server's")
		}
	}

	srv.stop()
	logs := srv.logs.String()
	if strings.Count(logs, `msg="http request"`) < 20 || !strings.Contains(logs, "level=DEBUG") {
		t.Fatalf("the server did not log every request at debug level:\n%s", logs)
	}
	secrets := append(s.tokens(), string(s.key))
	secrets = append(secrets, s.attestations...)
	if len(s.attestations) < 2 {
		t.Fatalf("only %d attestations issued", len(s.attestations))
	}
	db := openDB(t, srv.dbPath)
	for _, sec := range secrets {
		if strings.Contains(logs, sec) {
			t.Errorf("the log holds the secret %.12s…", sec)
		}
		for _, p := range procText {
			if strings.Contains(p, sec) {
				t.Errorf("the server's %s holds the secret %.12s…", strings.SplitN(p, ":", 2)[0], sec)
			}
		}
		sqltest.CheckNoSecret(t, db, sec)
	}
	// The scan looked at the right database: the digests are there.
	for _, a := range s.attestations[:2] {
		var n int
		if err := db.QueryRow(`SELECT count(*) FROM cells WHERE attestation_digest = ?`, digestOf(a)).Scan(&n); err != nil || n != 1 {
			t.Errorf("the digest of an issued attestation is stored %d times (%v)", n, err)
		}
	}
	t.Logf("%d secrets checked in %d log bytes, the database and /proc", len(secrets), len(logs))
}

func digestOf(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// refused runs `sandboxwich serve` and expects it to refuse to start:
// a non-zero exit within 30 s, never a served address. It returns what the
// server printed.
func refused(t *testing.T, s *secrets, opts srvOptions) string {
	t.Helper()
	cmd, _ := command(t, s, t.TempDir(), opts)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() == 0 {
			t.Fatalf("serve exited with %v, want a refusal:\n%s", err, out.String())
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("serve did not refuse to start:\n%s", out.String())
	}
	if strings.Contains(out.String(), "sandboxwich serving") {
		t.Fatalf("serve started:\n%s", out.String())
	}
	return out.String()
}

// TestSecurityKeyFileRules starts the binary with bad signing keys. Each is
// refused at start-up with a message that says what is wrong (and never
// shows the key); a good key of exactly 32 bytes, read-only, and a key with
// surrounding white space (trimmed) are accepted.
func TestSecurityKeyFileRules(t *testing.T) {
	t.Parallel()
	s := newSecrets(t)
	short := []byte(strings.Repeat("k", 31))
	dir := t.TempDir()
	cases := []struct {
		name string
		opts srvOptions
		want string
	}{
		{"mode 0644", srvOptions{keyMode: 0o644}, "accessible by group or others"},
		{"mode 0640", srvOptions{keyMode: 0o640}, "chmod 600"},
		{"mode 0604", srvOptions{keyMode: 0o604}, "accessible by group or others"},
		{"mode 0660", srvOptions{keyMode: 0o660}, "accessible by group or others"},
		{"31 bytes", srvOptions{keyFile: short}, "too short"},
		{"31 bytes padded with white space", srvOptions{keyFile: append(append([]byte("  \n\t"), short...), " \r\n "...)}, "too short"},
		{"empty", srvOptions{keyFile: []byte{}}, "too short"},
		{"4097 bytes", srvOptions{keyFile: []byte(strings.Repeat("k", 4097))}, "too long"},
		{"not UTF-8", srvOptions{keyFile: append([]byte(strings.Repeat("k", 40)), 0xff, 0xfe)}, "UTF-8"},
		{"missing", srvOptions{keyPath: filepath.Join(dir, "missing.key")}, "no such file"},
		{"a directory", srvOptions{keyPath: dir}, "not a regular file"},
		{"no key file setting", srvOptions{noKey: true}, "SANDBOXWICH_STERILE_CELL_SIGNING_KEY_FILE is required"},
		{"key in an environment variable", srvOptions{noKey: true, env: map[string]string{
			"SANDBOXWICH_STERILE_CELL_SIGNING_KEY": string(s.key), "SANDBOXWICH_SIGNING_KEY": string(s.key)}},
			"SANDBOXWICH_STERILE_CELL_SIGNING_KEY_FILE is required"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.opts.file = s.configFile()
			out := refused(t, s, tc.opts)
			if !strings.Contains(out, tc.want) || !strings.Contains(out, "SIGNING_KEY_FILE") {
				t.Errorf("refusal does not say %q and name the setting:\n%s", tc.want, out)
			}
			for _, k := range [][]byte{s.key, short, tc.opts.keyFile} {
				if len(bytes.TrimSpace(k)) >= 8 && strings.Contains(out, string(bytes.TrimSpace(k))) {
					t.Errorf("the refusal shows the key:\n%s", out)
				}
			}
		})
	}
	t.Run("32 bytes, read-only", func(t *testing.T) {
		t.Parallel()
		s := withKey(t, newSecrets(t), []byte(randomHex(16))) // exactly 32 bytes
		srv := start(t, s, srvOptions{file: s.configFile(), keyMode: 0o400, keyFile: s.key})
		srv.waitPool(1)
		srv.claim(s.acme, s.release)
	})
	t.Run("surrounding white space is trimmed", func(t *testing.T) {
		t.Parallel()
		s := newSecrets(t)
		// The pool's release is signed with the trimmed key: the server
		// accepts it only if it trimmed the file the same way.
		srv := start(t, s, srvOptions{file: s.configFile(), keyFile: []byte("\n\t  " + string(s.key) + " \r\n")})
		srv.waitPool(1)
		srv.claim(s.acme, s.release)
	})
}

// withKey gives s another signing key and re-signs its releases.
func withKey(t *testing.T, s *secrets, key []byte) *secrets {
	t.Helper()
	ks, err := attest.NewKeyring(key)
	if err != nil {
		t.Fatal(err)
	}
	s.key, s.keys = key, ks
	s.release.Signature = ks.SignRelease(lease.Release{ReleaseSetID: s.release.ReleaseSetID, RuntimeClass: s.release.RuntimeClass, PolicyDigest: s.release.PolicyDigest})
	s.kataRelease.Signature = ks.SignRelease(lease.Release{ReleaseSetID: s.kataRelease.ReleaseSetID, RuntimeClass: s.kataRelease.RuntimeClass, PolicyDigest: s.kataRelease.PolicyDigest})
	return s
}

// TestSecurityConstantTimeAuth inspects the source of the code that
// compares presented secrets with configured ones: a timing test would be
// flaky, a structural one is not. In httpapi/auth.go, the functions that
// handle a presented token (authenticate, bearer, lookup, isOperator,
// tenantPrincipal) never compare it with == or != (other than with ""), never
// index a map with it, and lookup and isOperator compare digests with
// crypto/subtle; configured tokens are kept only as digests. The lease
// fence, release signatures and claim fences compare with crypto/subtle too.
func TestSecurityConstantTimeAuth(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	fset := token.NewFileSet()
	parse := func(path string) *ast.File {
		f, err := parser.ParseFile(fset, filepath.Join(root, path), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	funcs := func(f *ast.File) map[string]*ast.FuncDecl {
		out := map[string]*ast.FuncDecl{}
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok {
				out[fd.Name.Name] = fd
			}
		}
		return out
	}
	callsSubtle := func(fd *ast.FuncDecl) bool {
		found := false
		ast.Inspect(fd, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok && sel.Sel.Name == "ConstantTimeCompare" {
				if x, ok := sel.X.(*ast.Ident); ok && x.Name == "subtle" {
					found = true
				}
			}
			return true
		})
		return found
	}

	auth := parse("httpapi/auth.go")
	fs := funcs(auth)
	for _, name := range []string{"lookup", "isOperator"} {
		fd := fs[name]
		if fd == nil {
			t.Fatalf("httpapi/auth.go has no func %s", name)
		}
		if !callsSubtle(fd) {
			t.Errorf("%s does not compare with subtle.ConstantTimeCompare", name)
		}
		// No early exit on a match: the loop visits every entry.
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			if r, ok := n.(*ast.RangeStmt); ok {
				ast.Inspect(r.Body, func(m ast.Node) bool {
					if _, ok := m.(*ast.ReturnStmt); ok {
						t.Errorf("%s: %s returns from inside its loop (an early exit leaks which entry matched)", fset.Position(m.Pos()), name)
					}
					if b, ok := m.(*ast.BranchStmt); ok && b.Tok == token.BREAK {
						t.Errorf("%s: %s breaks out of its loop", fset.Position(m.Pos()), name)
					}
					return true
				})
			}
			return true
		})
	}
	secretNames := map[string]bool{"tok": true, "token": true, "v": true, "d": true, "values": true, "digest": true}
	mentions := func(e ast.Expr) bool {
		hit := false
		ast.Inspect(e, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				if id, ok := n.Fun.(*ast.Ident); ok && id.Name == "len" {
					return false // lengths are public
				}
				if sel, ok := n.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "ConstantTimeCompare" {
					return false // its result is what may be compared
				}
			case *ast.Ident:
				hit = hit || secretNames[n.Name]
			}
			return true
		})
		return hit
	}
	literal := func(e ast.Expr) bool {
		if b, ok := e.(*ast.BasicLit); ok && b.Kind == token.STRING {
			return true
		}
		id, ok := e.(*ast.Ident)
		return ok && id.Name == "nil"
	}
	for _, name := range []string{"authenticate", "bearer", "lookup", "isOperator", "tenantPrincipal"} {
		fd := fs[name]
		if fd == nil {
			t.Fatalf("httpapi/auth.go has no func %s", name)
		}
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.BinaryExpr:
				if (n.Op == token.EQL || n.Op == token.NEQ) && !literal(n.X) && !literal(n.Y) && (mentions(n.X) || mentions(n.Y)) {
					t.Errorf("%s: %s compares a presented secret with %s", fset.Position(n.Pos()), name, n.Op)
				}
			case *ast.IndexExpr:
				if mentions(n.Index) {
					t.Errorf("%s: %s indexes with a presented secret (a map lookup is not constant time)", fset.Position(n.Pos()), name)
				}
			}
			return true
		})
	}
	// Configured tokens are held as digests only.
	ast.Inspect(auth, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok || (ts.Name.Name != "tokenEntry" && ts.Name.Name != "authenticator") {
			return true
		}
		for _, fld := range ts.Type.(*ast.StructType).Fields.List {
			for _, nm := range fld.Names {
				if id, ok := fld.Type.(*ast.Ident); ok && id.Name == "string" && strings.Contains(strings.ToLower(nm.Name), "tok") {
					t.Errorf("%s.%s holds a raw token", ts.Name.Name, nm.Name)
				}
			}
		}
		return true
	})

	for _, c := range []struct{ file, fn string }{
		{"lease/proof.go", "CheckProof"},
		{"attest/attest.go", "EqualDigest"},
		{"fence/fence.go", "Decide"},
	} {
		fd := funcs(parse(c.file))[c.fn]
		if fd == nil {
			t.Errorf("%s has no func %s", c.file, c.fn)
		} else if !callsSubtle(fd) {
			t.Errorf("%s: %s does not compare with subtle.ConstantTimeCompare", c.file, c.fn)
		}
	}
	verify := funcs(parse("attest/attest.go"))["VerifyRelease"]
	if verify == nil || !strings.Contains(nodeText(fset, verify), "EqualDigest(") {
		t.Error("attest.VerifyRelease does not compare through EqualDigest")
	}
}

func nodeText(fset *token.FileSet, n ast.Node) string {
	f := fset.File(n.Pos())
	b, err := os.ReadFile(f.Name())
	if err != nil {
		return ""
	}
	return string(b[f.Offset(n.Pos()):f.Offset(n.End())])
}

// selfSigned writes a self-signed certificate for 127.0.0.1 and its key.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: "sandboxwich hostile test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// TestSecurityTLS serves HTTPS from SANDBOXWICH_TLS_CERT_FILE and _KEY_FILE:
// a client that trusts the certificate gets /healthz and a claim over TLS
// 1.2 or later; plain HTTP on the same port gets no answer from the API; a
// client that does not trust the certificate, or offers only TLS 1.1, fails
// the handshake; and a certificate without its key refuses to start.
func TestSecurityTLS(t *testing.T) {
	t.Parallel()
	s := newSecrets(t)
	certFile, keyFile, pool := selfSigned(t, t.TempDir())
	srv := start(t, s, srvOptions{file: s.configFile(), tls: true,
		env: map[string]string{"SANDBOXWICH_TLS_CERT_FILE": certFile, "SANDBOXWICH_TLS_KEY_FILE": keyFile}})
	if !strings.HasPrefix(srv.base, "https://") {
		t.Fatalf("serving %s, want https", srv.base)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	srv.client = &http.Client{Timeout: 20 * time.Second, Transport: tr}
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err := srv.client.Get(srv.base + "/readyz")
		if err == nil {
			_ = r.Body.Close()
			if r.StatusCode == 200 {
				if r.TLS == nil || r.TLS.Version < tls.VersionTLS12 {
					t.Fatalf("TLS state %+v", r.TLS)
				}
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no HTTPS answer: %v\n%s", err, srv.logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	srv.do("GET", "/healthz", "", nil).must(t, 200)
	srv.waitPool(1)
	srv.claim(s.acme, s.release)

	// Plain HTTP on the TLS port: never an API answer.
	plain := &http.Client{Timeout: 10 * time.Second}
	r, err := plain.Get("http://" + srv.addr + "/healthz")
	if err == nil {
		b := make([]byte, 512)
		n, _ := r.Body.Read(b)
		_ = r.Body.Close()
		if r.StatusCode == 200 || r.Header.Get("X-Request-Id") != "" || strings.Contains(string(b[:n]), `"ok"`) {
			t.Fatalf("plain HTTP got an API answer: %d %s", r.StatusCode, b[:n])
		}
	}
	// No trust, or only TLS 1.1: the handshake fails.
	for name, cfg := range map[string]*tls.Config{
		"untrusted": {},
		"TLS 1.1":   {RootCAs: pool, MaxVersion: tls.VersionTLS11},
	} {
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
		if r, err := c.Get(srv.base + "/healthz"); err == nil {
			_ = r.Body.Close()
			t.Errorf("%s client: got %d, want a failed handshake", name, r.StatusCode)
		}
	}

	out := refused(t, s, srvOptions{file: s.configFile(), env: map[string]string{"SANDBOXWICH_TLS_CERT_FILE": certFile}})
	if !strings.Contains(out, "TLS") {
		t.Errorf("a certificate without a key: refusal does not name TLS:\n%s", out)
	}
}
