package httpapi

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/internal/testenv/agentproto"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
	"github.com/sandboxwich/sandboxwich/wire"
)

// The hostile-input findings on file writes (issue 40): a write lands
// only when the whole content part arrived, within the cap; otherwise the
// old file is untouched. The cells' agents are reached through the real
// agent protocol (agentproto), as the gVisor and Kubernetes drivers reach
// theirs.

// newProtoEnv is a server whose one pool cell's fake agent is reached
// over the agent protocol.
func newProtoEnv(t *testing.T, mods ...func(*Config)) (*agentEnv, *agentproto.Provider) {
	t.Helper()
	prov := agentproto.New(t, fake.NewWithAgent(fake.Config{Mode: driver.Apply, Kind: "fake"}))
	e := newEnvWith(t, backends[0], []sandboxwich.Option{sandboxwich.WithPools(pool.Config{
		Name: "p1", TenantID: "acme", Release: signedRelease(t, lease.GVisorLowerRisk), Target: 1, Provider: prov,
	})}, mods...)
	e.plane.Pools().Pass(t.Context())
	return &agentEnv{env: e}, prov
}

// readBack reads path of the lease's cell through the API.
func (a *agentEnv) readBack(c wire.ClaimResponse, path string) string {
	a.t.Helper()
	r := a.do("POST", leasePath(c.Lease.LeaseID, "/files/read"), tokAcme, with(proofBody(c), "path", path)).must(a.t, 200)
	return string(r.body)
}

// rawWrite sends a file write as raw HTTP: header lines (after the
// request line, Host, Authorization and Content-Type) and body exactly as
// given; halfClose closes the connection's write side after the body, and
// the answer is read after that.
func (a *agentEnv) rawWrite(c wire.ClaimResponse, headers, body string, halfClose bool) resp {
	a.t.Helper()
	conn, err := net.Dial("tcp", a.srv.Listener.Addr().String())
	if err != nil {
		a.t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: multipart/form-data; boundary=B\r\n%s\r\n%s",
		leasePath(c.Lease.LeaseID, "/files/write"), tokAcme, headers, body)
	if halfClose {
		_ = conn.(*net.TCPConn).CloseWrite()
	}
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		a.t.Fatalf("reading the answer: %v", err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return resp{status: res.StatusCode, header: res.Header, body: b}
}

// TestFileWriteCutShortWritesNothing: a multipart body without its closing
// boundary, one whose Content-Length is short, a chunked body ended by a
// half-close, content over 256 MiB — each is refused and the file keeps
// its old content; a complete body replaces it.
func TestFileWriteCutShortWritesNothing(t *testing.T) {
	a, prov := newProtoEnv(t)
	c := a.lease()
	const path = "/srv/f"
	a.upload(c, map[string]any{"path": path}, strings.NewReader("old")).must(t, 200)

	proof := string(mustJSON(t, with(proofBody(c), "path", path)))
	head := "--B\r\nContent-Disposition: form-data; name=\"proof\"\r\nContent-Type: application/json\r\n\r\n" + proof + "\r\n" +
		"--B\r\nContent-Disposition: form-data; name=\"content\"; filename=\"f\"\r\n\r\n"
	content := strings.Repeat("new!", 64<<10) // 256 KiB: more than one read of every layer
	whole := head + content + "\r\n--B--\r\n"
	sized := func(body string, length int) string { return fmt.Sprintf("Content-Length: %d\r\n", length) }

	for _, tc := range []struct {
		name, headers, body string
		halfClose           bool
	}{
		{"no boundary after the content", sized("", len(head+content)), head + content, false},
		{"no closing boundary", sized("", len(head+content+"\r\n--B")), head + content + "\r\n--B", false},
		{"a short Content-Length", sized("", len(whole)-len("--B--\r\n")-1), whole, false},
		{"a chunked body ended by a half-close", "Transfer-Encoding: chunked\r\n", fmt.Sprintf("%x\r\n%s\r\n", len(head+content), head+content), true},
		{"a chunked body cut in a chunk", "Transfer-Encoding: chunked\r\n", fmt.Sprintf("%x\r\n%s", len(whole), head+content), true},
	} {
		r := a.rawWrite(c, tc.headers, tc.body, tc.halfClose)
		if r.status != 400 {
			t.Errorf("%s: answered %d %s, want 400", tc.name, r.status, r.body)
		}
		if got := a.readBack(c, path); got != "old" {
			t.Errorf("%s: the file now holds %d bytes, want the old content", tc.name, len(got))
		}
	}

	// Over the cap: 413, and the old file stays.
	const big = "/srv/big"
	a.upload(c, map[string]any{"path": big}, strings.NewReader("old")).must(t, 200)
	a.upload(c, map[string]any{"path": big}, &zeros{n: MaxFileBytes + 1}).errCode(t, 413, "payload_too_large")
	if fi, ok := prov.Large(big); ok || a.readBack(c, big) != "old" {
		t.Errorf("after a 413 the cell holds %+v", fi)
	}

	// A complete body replaces the file.
	a.rawWrite(c, sized("", len(whole)), whole, false).must(t, 200)
	if got := a.readBack(c, path); got != content {
		t.Errorf("a complete write left %d bytes, want %d", len(got), len(content))
	}
}

// TestFileWriteDirectoryPath: a path ending in "/" (or "/.", "/..") names
// no file: 422 and nothing reaches the cell.
func TestFileWriteDirectoryPath(t *testing.T) {
	a := newAgentEnv(t, backends[0], 1)
	c := a.lease()
	before := a.ops()["write_file"]
	for _, p := range []string{"/srv/dir/", "/srv/dir/.", "/srv/dir/..", "//"} {
		a.upload(c, map[string]any{"path": p}, strings.NewReader("x")).errCode(t, 422, "invalid_request")
	}
	if n := a.ops()["write_file"] - before; n != 0 {
		t.Errorf("%d writes to a directory path reached the agent", n)
	}
}

// closedWithin reads conn until the server closes it, failing when it is
// still open after limit (a bound on an outcome, not a speed).
func closedWithin(t *testing.T, conn net.Conn, limit time.Duration) string {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(limit))
	b, err := io.ReadAll(conn)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the server kept the connection open for %v", limit)
	}
	return string(b)
}

// TestFileWriteStalledUploadCutOff: once the proof is checked and the
// lease found, an upload whose content stops arriving is cut off after
// the upload idle timeout, and nothing is written.
func TestFileWriteStalledUploadCutOff(t *testing.T) {
	a, _ := newProtoEnv(t, func(c *Config) { c.UploadIdleTimeout = 200 * time.Millisecond })
	c := a.lease()
	const path = "/srv/f"
	a.upload(c, map[string]any{"path": path}, strings.NewReader("old")).must(t, 200)
	proof := string(mustJSON(t, with(proofBody(c), "path", path)))
	body := "--B\r\nContent-Disposition: form-data; name=\"proof\"\r\nContent-Type: application/json\r\n\r\n" + proof + "\r\n" +
		"--B\r\nContent-Disposition: form-data; name=\"content\"; filename=\"f\"\r\n\r\n" + strings.Repeat("x", 100<<10)
	conn, err := net.Dial("tcp", a.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: multipart/form-data; boundary=B\r\nContent-Length: %d\r\n\r\n%s",
		leasePath(c.Lease.LeaseID, "/files/write"), tokAcme, len(body)+1<<20, body)
	got := closedWithin(t, conn, 30*time.Second) // then nothing more is sent
	if got != "" && !strings.HasPrefix(got, "HTTP/1.1 400") {
		t.Errorf("a stalled upload was answered %q", got)
	}
	if got := a.readBack(c, path); got != "old" {
		t.Errorf("after a stalled upload the file holds %d bytes, want the old content", len(got))
	}
}
