package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"debug/elf"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/internal/testenv"
)

// TestStandardLibraryOnly: the agent links the standard library and
// packages agent and agent/cellagent, nothing else (no client-go, no
// store).
func TestStandardLibraryOnly(t *testing.T) {
	goBin, err := exec.LookPath("go")
	testenv.Need(t, "go command", err)
	out, err := exec.Command(goBin, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	got := strings.Fields(string(out))
	want := []string{"github.com/sandboxwich/sandboxwich/agent", "github.com/sandboxwich/sandboxwich/agent/cellagent", "github.com/sandboxwich/sandboxwich/cmd/sandboxwich-agent"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("non-standard dependencies %q, want only %q", got, want)
	}
}

// build builds the agent with CGO_ENABLED=0 and checks that the result
// is static: no interpreter, no shared library.
func build(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	testenv.Need(t, "go command", err)
	bin := filepath.Join(t.TempDir(), "sandboxwich-agent")
	cmd := exec.Command(goBin, "build", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Fatalf("the agent is not static: it has a %v program header", p.Type)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Fatalf("the agent links %q", libs)
	}
	// The helper runs as the cell user: it must be able to execute it.
	if err := os.Chmod(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

func TestStaticBuild(t *testing.T) { build(t) }

// TestAsPID1 runs the binary as PID 1 of its own PID namespace (unshare
// --pid --mount-proc), as in a cell: it reaps orphans, and release kills
// every other process of the namespace — one that left the command's
// session and lost its parent included. The -record file holds everything
// the agent was sent, file content included.
func TestAsPID1(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Need(t, "root", os.ErrPermission)
	}
	unshare, err := exec.LookPath("unshare")
	testenv.Need(t, "unshare", err)
	if err := exec.Command(unshare, "--pid", "--fork", "--mount-proc", "true").Run(); err != nil {
		testenv.Need(t, "PID namespaces (unshare --pid)", err)
	}
	bin := build(t)
	dir, err := os.MkdirTemp("", "sbw-pid1-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	home := filepath.Join(dir, "home")
	if err := os.Mkdir(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, agent.CellUID, agent.CellGID); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	sock, record := filepath.Join(dir, "agent.sock"), filepath.Join(dir, "record")
	cmd := exec.Command(unshare, "--pid", "--fork", "--mount-proc", "--kill-child", bin, "-listen", sock, "-cell-id", "cell-9", "-home", home, "-record", record)
	logs, err := os.Create(filepath.Join(dir, "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		if t.Failed() {
			b, _ := os.ReadFile(logs.Name())
			t.Logf("agent log:\n%s", b)
		}
	})

	c := unixClient(sock)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var st agent.Status
	eventually(t, "the agent serves", func() bool {
		st, err = c.Status(ctx)
		return err == nil
	})
	sum, _ := fileSHA256(bin)
	if st.State != agent.Waiting || st.Activations != 0 || st.CellID != "cell-9" || st.Digest != "sha256:"+sum {
		t.Fatalf("status %+v, want waiting cell-9 sha256:%s", st, sum)
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket: %v %v", fi.Mode(), err)
	}
	pid1 := nsInit(t, cmd.Process.Pid)
	ns := nsOf(pid1)

	f := agent.Fence{CellID: "cell-9", LeaseID: "lease-9", Generation: 1}
	if err := c.Activate(ctx, agent.Activation{Version: 1, Fence: f, ExpiresAt: time.Now().Add(time.Hour), TTLMillis: time.Hour.Milliseconds()}); err != nil {
		t.Fatal(err)
	}
	// An orphan that left the session: reparented to the agent.
	res, err := c.Exec(ctx, agent.ExecRequest{Fence: f, Argv: []string{"sh", "-c", "(setsid sleep 1000 &); echo $$"}, Env: map[string]string{"CANARY_ENV": "canary-env-4711"}}, nil)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %+v %v", res, err)
	}
	if pid, _ := strconv.Atoi(strings.TrimSpace(string(res.Stdout))); pid <= 1 {
		t.Fatalf("the command's pid in the namespace is %q", res.Stdout)
	}
	eventually(t, "the orphan runs under the agent", func() bool { return len(inNS(ns)) == 2 })
	// Orphans that exit are reaped by the agent: no zombie stays.
	if _, err := c.Exec(ctx, agent.ExecRequest{Fence: f, Argv: []string{"sh", "-c", "(sleep 0.1 &); true"}}, nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the exited orphan is reaped", func() bool { return len(inNS(ns)) == 2 })
	if _, err := c.WriteFile(ctx, agent.WriteRequest{Fence: f, Path: filepath.Join(home, "f")}, strings.NewReader("canary-content-4711")); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, f); err != nil {
		t.Fatal(err)
	}
	eventually(t, "release killed every other process of the namespace", func() bool {
		ps := inNS(ns)
		return len(ps) == 1 && ps[0] == pid1
	})
	rec, err := os.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"POST /v1/activate", "lease-9", "canary-env-4711", "POST /v1/files/write", "canary-content-4711", "POST /v1/release"} {
		if !bytes.Contains(rec, []byte(want)) {
			t.Errorf("the record lacks %q", want)
		}
	}
	// SIGTERM ends the agent.
	if err := syscall.Kill(pid1, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Fatal("the agent did not exit at SIGTERM")
	}
	exited <- nil // for the cleanup
}

func fileSHA256(p string) (string, error) {
	b, err := os.ReadFile(p)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), err
}

// nsInit is the host pid of the agent: the child unshare forked.
func nsInit(t *testing.T, unsharePID int) int {
	t.Helper()
	var pid int
	eventually(t, "unshare's child", func() bool {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(unsharePID) + "/task/" + strconv.Itoa(unsharePID) + "/children")
		if err != nil {
			return false
		}
		f := strings.Fields(string(b))
		if len(f) != 1 {
			return false
		}
		pid, _ = strconv.Atoi(f[0])
		return pid > 0
	})
	return pid
}

func nsOf(pid int) string {
	l, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/pid")
	return l
}

// inNS lists the host pids of the live processes of PID namespace ns.
func inNS(ns string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || nsOf(pid) != ns {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		if i := bytes.LastIndexByte(b, ')'); i > 0 && len(b) > i+2 && b[i+2] == 'Z' {
			pids = append(pids, -pid) // a zombie counts, and never matches pid1
			continue
		}
		pids = append(pids, pid)
	}
	return pids
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("%s: still not the case after 30s", what)
}

// TestListenTCP: -listen tcp:<host>:<port> serves the protocol on TCP (a
// Cloudflare Container's port), and the agent logs the address it bound.
func TestListenTCP(t *testing.T) {
	bin := build(t)
	a := startLogged(t, bin, "-listen", "tcp:127.0.0.1:0", "-cell-id", "cell-tcp", "-home", t.TempDir())
	if !strings.HasPrefix(a, "127.0.0.1:") || strings.HasSuffix(a, ":0") {
		t.Fatalf("listen address %q", a)
	}
	c := agent.NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", a)
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != agent.Waiting || st.CellID != "cell-tcp" {
		t.Fatalf("status %+v", st)
	}
}

// startLogged starts bin with args and returns the address it logs it
// listens on.
func startLogged(t *testing.T, bin string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addr := make(chan string, 1)
	go func() {
		var seen []byte
		buf := make([]byte, 4096)
		for {
			n, err := stderr.Read(buf)
			seen = append(seen, buf[:n]...)
			if _, rest, ok := bytes.Cut(seen, []byte("listen=")); ok {
				if a, _, ok := bytes.Cut(rest, []byte(" ")); ok {
					addr <- string(a)
					io.Copy(io.Discard, stderr)
					return
				}
			}
			if err != nil {
				close(addr)
				return
			}
		}
	}()
	select {
	case a, ok := <-addr:
		if !ok {
			t.Fatal("the agent exited without listening")
		}
		return a
	case <-time.After(time.Minute):
		t.Fatal("the agent logged no listen address")
	}
	return ""
}

// TestListenTLS: with the TLS flags the agent serves TLS 1.3 only, to the
// control leaf of its own cell only, and reports the -digest it was given.
// The flags go together, with a tcp: listener, and a malformed -digest is
// refused.
func TestListenTLS(t *testing.T) {
	bin := build(t)
	const cell = "3f2a1b0c-1111-4222-8333-944455556666"
	pki, err := agent.NewCellPKI(cell, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files := map[string][]byte{"tls.crt": pki.ServerCert, "tls.key": pki.ServerKey, "ca.crt": pki.CACert}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o400); err != nil {
			t.Fatal(err)
		}
	}
	digest := "sha256:" + strings.Repeat("5e", 32)
	tlsArgs := []string{"-tls-cert", filepath.Join(dir, "tls.crt"), "-tls-key", filepath.Join(dir, "tls.key"), "-tls-client-ca", filepath.Join(dir, "ca.crt")}
	a := startLogged(t, bin, append([]string{"-listen", "tcp:127.0.0.1:0", "-cell-id", cell, "-home", t.TempDir(), "-digest", digest}, tlsArgs...)...)
	dial := func(cfg *tls.Config) *agent.Client {
		return agent.NewClient(func(ctx context.Context) (net.Conn, error) {
			d := tls.Dialer{Config: cfg}
			return d.DialContext(ctx, "tcp", a)
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	good, err := pki.ClientConfig(cell)
	if err != nil {
		t.Fatal(err)
	}
	st, err := dial(good).Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != agent.Waiting || st.CellID != cell || st.Digest != digest {
		t.Fatalf("status %+v, want waiting %s %s", st, cell, digest)
	}
	other, err := agent.NewCellPKI("another-cell", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := tls.X509KeyPair(other.ClientCert, other.ClientKey)
	ca := x509.NewCertPool()
	ca.AppendCertsFromPEM(pki.CACert)
	if st, err := dial(agent.ClientTLS(cert, ca, cell)).Status(ctx); err == nil {
		t.Fatalf("another cell's control leaf got %+v", st)
	}
	var plain net.Dialer
	plainClient := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return plain.DialContext(ctx, "tcp", a) })
	if st, err := plainClient.Status(ctx); err == nil {
		t.Fatalf("plain HTTP got %+v", st)
	}

	for name, args := range map[string][]string{
		"cert without key and CA": {"-listen", "tcp:127.0.0.1:0", "-cell-id", cell, "-tls-cert", tlsArgs[1]},
		"TLS on a Unix socket":    append([]string{"-listen", filepath.Join(dir, "s.sock"), "-cell-id", cell}, tlsArgs...),
		"a malformed digest":      {"-listen", "tcp:127.0.0.1:0", "-cell-id", cell, "-digest", "sha256:xyz"},
		"a CA file without PEM":   {"-listen", "tcp:127.0.0.1:0", "-cell-id", cell, "-tls-cert", tlsArgs[1], "-tls-key", tlsArgs[3], "-tls-client-ca", tlsArgs[3]},
	} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err == nil {
			t.Errorf("%s: the agent started", name)
		} else if !strings.Contains(string(out), "sandboxwich-agent:") {
			t.Errorf("%s: %v %s", name, err, out)
		}
	}
}

// TestInstall: -install copies the agent, byte for byte and executable,
// and exits.
func TestInstall(t *testing.T) {
	bin := build(t)
	dst := filepath.Join(t.TempDir(), "sandboxwich-agent")
	if out, err := exec.Command(bin, "-install", dst).CombinedOutput(); err != nil {
		t.Fatalf("-install: %v %s", err, out)
	}
	want, _ := fileSHA256(bin)
	got, err := fileSHA256(dst)
	if err != nil || got != want {
		t.Fatalf("copy sha256 %s, want %s (%v)", got, want, err)
	}
	if fi, _ := os.Stat(dst); fi.Mode().Perm() != 0o555 {
		t.Fatalf("mode %v", fi.Mode())
	}
}

// TestReleasesIdlePages: an agent without a request in flight for
// idleRelease gives back the resident pages of its executable's read-only
// mappings, and serves the next request as before.
func TestReleasesIdlePages(t *testing.T) {
	bin := build(t)
	sock := filepath.Join(t.TempDir(), "agent.sock")
	cmd := exec.Command(bin, "-listen", sock, "-cell-id", "cell-idle", "-home", t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	c := unixClient(sock)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	status := func() {
		t.Helper()
		if st, err := c.Status(ctx); err != nil || st.CellID != "cell-idle" {
			t.Fatalf("status %+v, %v", st, err)
		}
	}
	eventually(t, "the agent answers", func() bool { _, err := c.Status(ctx); return err == nil })
	status()
	busy := exeResidentKiB(t, cmd.Process.Pid, bin)
	if busy < 2048 {
		t.Fatalf("%d KiB of the executable resident after a request: the measurement is wrong", busy)
	}
	var idle int
	eventually(t, "the idle agent releases its executable's pages, to under a quarter", func() bool {
		idle = exeResidentKiB(t, cmd.Process.Pid, bin)
		return idle*4 < busy
	})
	t.Logf("executable resident: %d KiB after a request, %d KiB idle", busy, idle)
	status()
}

// exeResidentKiB sums the Rss of pid's mappings of the file bin.
func exeResidentKiB(t *testing.T, pid int, bin string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps")
	if err != nil {
		t.Fatal(err)
	}
	total, ofBin := 0, false
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		switch {
		case len(f) >= 5 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":"):
			ofBin = len(f) == 6 && f[5] == bin
		case ofBin && len(f) == 3 && f[0] == "Rss:":
			n, _ := strconv.Atoi(f[1])
			total += n
		}
	}
	return total
}

// TestWhenIdle: release runs once the handler has had no request in
// flight for the quiet time, never while one is in flight, and again after
// the next.
func TestWhenIdle(t *testing.T) {
	const quiet = 20 * time.Millisecond
	var mu sync.Mutex
	released := 0
	count := func() int { mu.Lock(); defer mu.Unlock(); return released }
	hold := make(chan struct{})
	h := whenIdle(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-hold }), quiet,
		func() { mu.Lock(); released++; mu.Unlock() })
	eventually(t, "released at start", func() bool { return count() == 1 })

	done := make(chan struct{}, 2)
	for range 2 {
		go func() { h.ServeHTTP(nil, nil); done <- struct{}{} }()
	}
	time.Sleep(10 * quiet)
	if n := count(); n != 1 {
		t.Fatalf("released %d times with requests in flight", n)
	}
	hold <- struct{}{}
	<-done
	time.Sleep(10 * quiet)
	if n := count(); n != 1 {
		t.Fatalf("released %d times with a request still in flight", n)
	}
	close(hold)
	eventually(t, "released after the requests", func() bool { return count() == 2 })
}

// unixClient is an agent client of the agent serving on the Unix socket
// sock.
func unixClient(sock string) *agent.Client {
	return agent.NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
}
