package gvisor

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/lease"
)

// testAgent is the agent binary the tests mount: built once per test
// binary, the way a Provider with an empty AgentPath builds it (from the
// module's source, found from the package's directory).
var testAgent = sync.OnceValues(func() (agentBinary, error) {
	return resolveAgent("", agentCacheDir(os.TempDir()), slog.New(slog.DiscardHandler))
})

// testAgentPath returns the cached agent binary, failing the test if it
// cannot be built.
func testAgentPath(t *testing.T) string {
	t.Helper()
	a, err := testAgent()
	if err != nil {
		t.Fatalf("building the cell agent: %v", err)
	}
	return a.path
}

// requireBusybox returns Debian's static busybox, skipping the test when
// it is not installed, except under CI=true, where its absence fails it.
func requireBusybox(t *testing.T) string {
	t.Helper()
	const path = "/bin/busybox"
	if err := checkStatic(path); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("a static busybox is required under CI=true (run scripts/install-busybox.sh): %s: %v", path, err)
		}
		t.Skipf("no static busybox (apt-get install busybox-static, or scripts/install-busybox.sh): %s: %v", path, err)
	}
	return path
}

// busyboxRootFS lays out a root filesystem of a static busybox alone: no
// C library, no /usr, no /etc.
func busyboxRootFS(t *testing.T, busybox string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "rootfs")
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(busybox)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		t.Fatalf("busybox --list: %v", err)
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet != "busybox" {
			if err := os.Symlink("busybox", filepath.Join(dir, "bin", applet)); err != nil {
				t.Fatal(err)
			}
		}
	}
	return dir
}

// TestAgentOnBusyboxRootFS runs a cell whose operator root filesystem is a
// static busybox alone: the agent, a static binary mounted into it, serves
// exec, files and launch there, and runsc makes the agent's mount points
// on that read-only root.
func TestAgentOnBusyboxRootFS(t *testing.T) {
	requireRunsc(t)
	busybox := requireBusybox(t)
	t.Parallel()
	cfg := testConfig(t)
	cfg.RootFS = busyboxRootFS(t, busybox)
	p := newProvider(t, cfg)
	obj := provision(t, p)
	o, err := p.Inspect(context.Background(), obj)
	if err != nil || driver.Verify(obj, o, lease.GVisorLowerRisk) != nil || o.AgentDigest != p.agent.digest {
		t.Fatalf("Inspect = %+v, %v; want verified with the agent's digest", o, err)
	}
	c := activate(t, p, obj)
	if res := c.runAs(t, agent.UserRoot, "sh", "-c", "ls /; test -e /usr || test -e /lib || echo no-libc"); !strings.Contains(string(res.Stdout), "no-libc") {
		t.Errorf("the busybox root: %q (stderr %q)", res.Stdout, res.Stderr)
	}
	if res := c.run(t, "id", "-u"); string(res.Stdout) != "1000\n" {
		t.Errorf("id -u = %q (stderr %q)", res.Stdout, res.Stderr)
	}
	if res := c.runAs(t, agent.UserRoot, "id", "-u"); string(res.Stdout) != "0\n" {
		t.Errorf("id -u as root = %q (stderr %q)", res.Stdout, res.Stderr)
	}
	ctx := context.Background()
	if _, err := c.conn.WriteFile(ctx, agent.WriteRequest{Fence: c.fence, Path: "/tmp/in/file"}, strings.NewReader("content\n")); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	if res := c.run(t, "cat", "/tmp/in/file"); string(res.Stdout) != "content\n" {
		t.Errorf("cat of the written file = %q (stderr %q)", res.Stdout, res.Stderr)
	}
	st, err := c.conn.Launch(ctx, agent.LaunchRequest{Fence: c.fence, Argv: []string{"sh", "-c", "echo resident; exit 4"}})
	if err != nil {
		t.Fatalf("Launch: %v", err)
	}
	for deadline := time.Now().Add(time.Minute); st.Phase != agent.Terminal && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		if st, err = c.conn.LaunchStatus(ctx, c.fence); err != nil {
			t.Fatalf("LaunchStatus: %v", err)
		}
	}
	if st.Phase != agent.Terminal || st.ExitCode == nil || *st.ExitCode != 4 {
		t.Fatalf("launch = %+v, want terminal with exit 4", st)
	}
	r, _, err := c.conn.ReadFile(ctx, agent.ReadRequest{Fence: c.fence, Path: "/home/cell/.launch/stdout"})
	if err != nil {
		t.Fatalf("reading the launch's output: %v", err)
	}
	out, _ := io.ReadAll(r)
	r.Close()
	if string(out) != "resident\n" {
		t.Errorf("the launch's output = %q", out)
	}
}

// TestAgentAfterRestart: a second Provider over the same directories (a
// restarted server, another replica) reaches the agent of a cell the first
// one created, bound to the same fence.
func TestAgentAfterRestart(t *testing.T) {
	requireRunsc(t)
	t.Parallel()
	cfg := testConfig(t)
	a := newProvider(t, cfg)
	obj := provision(t, a)
	first := activate(t, a, obj)
	if res := first.run(t, "sh", "-c", "echo before > /tmp/mark"); res.ExitCode != 0 {
		t.Fatalf("exec through the first provider: %+v", res)
	}

	b := newProvider(t, cfg)
	conn, err := b.Agent(context.Background(), obj)
	if err != nil {
		t.Fatalf("Agent through the second provider: %v", err)
	}
	st, err := conn.Status(context.Background())
	if err != nil || st.State != agent.Active || st.Activations != 1 || st.CellID != obj.CellID.String() {
		t.Fatalf("Status through the second provider = %+v, %v; want the active agent", st, err)
	}
	second := &cell{p: b, obj: obj, conn: conn, fence: first.fence}
	if res := second.run(t, "cat", "/tmp/mark"); string(res.Stdout) != "before\n" {
		t.Errorf("exec through the second provider: %q (stderr %q)", res.Stdout, res.Stderr)
	}
}

// TestAgentDigestReadBack: Inspect reports the digest recorded in the
// container's spec, read back from runsc, not the provider's own: a
// provider mounting another agent binary reports the first one's digest
// for the first one's cell.
func TestAgentDigestReadBack(t *testing.T) {
	requireRunsc(t)
	busybox := requireBusybox(t)
	t.Parallel()
	cfg := testConfig(t)
	a := newProvider(t, cfg)
	obj := provision(t, a)
	sum, err := fileDigest(a.agent.path)
	if err != nil || a.agent.digest != "sha256:"+sum {
		t.Fatalf("the provider's agent digest %q, the mounted file's sha256 %s (%v)", a.agent.digest, sum, err)
	}
	st, err := a.r.state(context.Background(), a.containerID(obj.CellID))
	if err != nil || st == nil || st.Annotations[agentDigestAnnotation] != a.agent.digest {
		t.Fatalf("runsc state annotations = %+v, %v; want %s = %s", st, err, agentDigestAnnotation, a.agent.digest)
	}

	other := cfg
	other.AgentPath = busybox // any static executable: only its digest matters here
	b := newProvider(t, other)
	if b.agent.digest == a.agent.digest {
		t.Fatal("two binaries with one digest")
	}
	for _, p := range []*Provider{a, b} {
		o, err := p.Inspect(context.Background(), obj)
		if err != nil || o.AgentDigest != a.agent.digest {
			t.Errorf("Inspect = %+v, %v; want agent digest %s", o, err, a.agent.digest)
		}
	}
	conn, err := a.Agent(context.Background(), obj)
	if err != nil {
		t.Fatal(err)
	}
	if s, err := conn.Status(context.Background()); err != nil || s.Digest != a.agent.digest {
		t.Errorf("the agent reports %+v, %v; want digest %s", s, err, a.agent.digest)
	}
}

// TestAgentProtectedFromCellUser: a cell-user workload can neither signal
// nor trace the agent, nor reach its socket; the agent keeps answering.
func TestAgentProtectedFromCellUser(t *testing.T) {
	requireRunsc(t)
	t.Parallel()
	p := newProvider(t, testConfig(t))
	c := activate(t, p, provision(t, p))
	for _, sig := range []string{"KILL", "TERM", "ABRT", "STOP"} {
		if res := c.run(t, "kill", "-"+sig, "1"); res.ExitCode == 0 {
			t.Errorf("the cell user sent SIG%s to the agent", sig)
		}
	}
	tracer := buildHelper(t, "ptrace")
	f, err := os.Open(tracer)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := c.conn.WriteFile(context.Background(), agent.WriteRequest{Fence: c.fence, Path: "/tmp/ptrace", Mode: 0o755}, f); err != nil {
		t.Fatalf("writing the tracer: %v", err)
	}
	res := c.run(t, "/tmp/ptrace", "1")
	if res.ExitCode != 0 || string(res.Stdout) != "attach: operation not permitted\n" {
		t.Errorf("ptrace(PTRACE_ATTACH, 1) as the cell user: exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	if res := c.run(t, "sh", "-c", "cat /proc/1/environ || ls /proc/1/fd || ls /run/sandboxwich"); res.ExitCode == 0 {
		t.Errorf("the cell user reads the agent's process or directory: %q", res.Stdout)
	}
	st, err := c.conn.Status(context.Background())
	if err != nil || st.State != agent.Active {
		t.Fatalf("the agent after the attempts: %+v, %v", st, err)
	}
	if res := c.run(t, "echo", "alive"); string(res.Stdout) != "alive\n" {
		t.Errorf("exec after the attempts: %q", res.Stdout)
	}
}

// TestHostDirBounded: the cell's host directory is a small tmpfs of its
// own, so a root workload cannot fill the host's disk through it.
func TestHostDirBounded(t *testing.T) {
	requireRunsc(t)
	t.Parallel()
	p := newProvider(t, testConfig(t))
	c := activate(t, p, provision(t, p))
	var fs syscall.Statfs_t
	if err := syscall.Statfs(p.hostDir(p.containerID(c.obj.CellID)), &fs); err != nil || fs.Type != tmpfsMagic {
		t.Errorf("the host directory: statfs type %#x, %v; want a tmpfs", fs.Type, err)
	}
	res := c.runAs(t, agent.UserRoot, "sh", "-c", "head -c 1048576 /dev/zero > /run/sandboxwich/fill")
	if res.ExitCode == 0 {
		t.Error("a root workload wrote 1 MiB into the host directory")
	}
	res = c.runAs(t, agent.UserRoot, "sh", "-c", "rm -f /run/sandboxwich/fill; i=0; while [ $i -lt 64 ]; do : > /run/sandboxwich/f$i || exit 1; i=$((i+1)); done")
	if res.ExitCode == 0 {
		t.Error("a root workload made 64 files in the host directory")
	}
	if st, err := c.conn.Status(context.Background()); err != nil || st.State != agent.Active {
		t.Errorf("the agent after the attempts: %+v, %v", st, err)
	}
}

// tmpfsMagic is statfs's f_type of a tmpfs.
const tmpfsMagic = 0x01021994

// buildHelper builds testdata/<name> as a static binary.
func buildHelper(t *testing.T, name string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), name)
	cmd := exec.Command("go", "build", "-o", out, "./testdata/"+name)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./testdata/%s: %v\n%s", name, err, b)
	}
	return out
}

// requireLost checks that a cell whose agent died is lost for every
// caller: the connection, a new one, Inspect (not ready, no runtime
// class), and that Destroy proves it gone.
func requireLost(t *testing.T, c *cell, callErr error) {
	t.Helper()
	ctx := context.Background()
	if !errors.Is(callErr, driver.ErrCellLost) {
		t.Errorf("the call during which the agent died: %v, want driver.ErrCellLost", callErr)
	}
	if _, err := c.conn.Status(ctx); !errors.Is(err, driver.ErrCellLost) {
		t.Errorf("Status on the old connection: %v, want driver.ErrCellLost", err)
	}
	// Agent itself may not know yet (runsc's state file says running until
	// the sandbox has stopped); the connection's first call does.
	if conn, err := c.p.Agent(ctx, c.obj); err == nil {
		if _, err := conn.Status(ctx); !errors.Is(err, driver.ErrCellLost) {
			t.Errorf("Status on a new connection: %v, want driver.ErrCellLost", err)
		}
	} else if !errors.Is(err, driver.ErrCellLost) {
		t.Errorf("Agent: %v, want driver.ErrCellLost", err)
	}
	o, err := c.p.Inspect(ctx, c.obj)
	if err != nil || o.Ready || o.RuntimeClass != "" || driver.Verify(c.obj, o, lease.GVisorLowerRisk) == nil {
		t.Errorf("Inspect of the lost cell = %+v, %v; want it neither ready nor verified", o, err)
	}
	if err := c.p.Destroy(ctx, c.obj); err != nil {
		t.Fatalf("Destroy of the lost cell: %v", err)
	}
	if st, err := c.p.r.state(ctx, c.p.containerID(c.obj.CellID)); err != nil || st != nil {
		t.Errorf("runsc state after Destroy = %+v, %v; want absent", st, err)
	}
	if _, err := os.Stat(c.p.bundlePath(c.p.containerID(c.obj.CellID))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the bundle and host directory after Destroy: %v, want gone", err)
	}
}

// TestRootKillsAgent: a root workload can kill the agent; that ends the
// cell, and every caller learns it is lost.
func TestRootKillsAgent(t *testing.T) {
	requireRunsc(t)
	t.Parallel()
	p := newProvider(t, testConfig(t))
	c := activate(t, p, provision(t, p))
	res, err := c.exec(agent.UserRoot, "kill", "-KILL", "1")
	if err == nil {
		t.Logf("the exec answered after killing the agent: %+v", res)
	}
	requireLost(t, c, err)
}

// TestAgentCrash: an agent that crashes (a Go runtime abort, sent from the
// host) ends the cell like a killed one.
func TestAgentCrash(t *testing.T) {
	requireRunsc(t)
	t.Parallel()
	p := newProvider(t, testConfig(t))
	c := activate(t, p, provision(t, p))
	if _, err := p.r.run(context.Background(), "kill", p.containerID(c.obj.CellID), "ABRT"); err != nil {
		t.Fatalf("runsc kill ABRT: %v", err)
	}
	_, err := c.exec(agent.UserCell, "true")
	requireLost(t, c, err)
}

// TestLargeFileRoundTrip writes 64 MiB into a cell and reads it back, in
// its home: the largest of its writable places (96 MiB of the default
// cell_disk_bytes; /tmp holds exactly 64 MiB, see "Disk").
func TestLargeFileRoundTrip(t *testing.T) {
	requireRunsc(t)
	t.Parallel()
	p := newProvider(t, testConfig(t))
	c := activate(t, p, provision(t, p))
	content := make([]byte, 64<<20)
	if _, err := rand.Read(content); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(content)
	ctx := context.Background()
	info, err := c.conn.WriteFile(ctx, agent.WriteRequest{Fence: c.fence, Path: "/home/cell/big"}, bytes.NewReader(content))
	if err != nil || info.Size != int64(len(content)) || info.SHA256 != hex.EncodeToString(sum[:]) {
		t.Fatalf("WriteFile = %+v, %v; want %d bytes, sha256 %x", info, err, len(content), sum)
	}
	r, n, err := c.conn.ReadFile(ctx, agent.ReadRequest{Fence: c.fence, Path: "/home/cell/big"})
	if err != nil {
		t.Fatalf("ReadFile: %v", err)
	}
	defer r.Close()
	got, err := io.ReadAll(r)
	if err != nil || n != int64(len(content)) || !bytes.Equal(got, content) {
		t.Fatalf("ReadFile: %d bytes of size %d, %v; want the %d bytes written", len(got), n, err, len(content))
	}
	if res := c.run(t, "sha256sum", "/home/cell/big"); !strings.HasPrefix(string(res.Stdout), hex.EncodeToString(sum[:])) {
		t.Errorf("sha256sum in the cell = %q", res.Stdout)
	}
}

// TestRecordAgentMessages: with RecordAgentMessages every message the
// agent received is in the cell's record, until the cell is destroyed;
// without it there is no record.
func TestRecordAgentMessages(t *testing.T) {
	requireRunsc(t)
	t.Parallel()
	cfg := testConfig(t)
	cfg.RecordAgentMessages = true
	p := newProvider(t, cfg)
	obj := provision(t, p)
	c := activate(t, p, obj)
	const marker = "recorded-7f3a91"
	res, err := c.conn.Exec(context.Background(), agent.ExecRequest{Fence: c.fence, Argv: []string{"true"},
		Env: map[string]string{"MARKER": marker}}, nil)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %+v, %v", res, err)
	}
	rec, err := p.AgentMessages(obj)
	if err != nil {
		t.Fatalf("AgentMessages: %v", err)
	}
	if !bytes.Contains(rec, []byte(marker)) || !bytes.Contains(rec, []byte(c.fence.LeaseID)) {
		t.Errorf("the record lacks the exec or the activation: %.500q", rec)
	}
	if fi, err := os.Stat(filepath.Join(p.hostDir(p.containerID(obj.CellID)), agentRecord)); err != nil || fi.Mode().Perm()&0o077 != 0 {
		t.Errorf("the record file: %v, %v; want it private", fi, err)
	}

	plain := newProvider(t, testConfig(t))
	if _, err := plain.AgentMessages(obj); err == nil {
		t.Error("AgentMessages without RecordAgentMessages: no error")
	}
	// The spec of a recording cell passes -record; another's does not.
	for _, tc := range []struct {
		p    *Provider
		want bool
	}{{p, true}, {plain, false}} {
		b, err := json.Marshal(tc.p.spec(obj.CellID.String(), "n", "/x", nil))
		if err != nil {
			t.Fatal(err)
		}
		if got := bytes.Contains(b, []byte(`"-record"`)); got != tc.want {
			t.Errorf("RecordAgentMessages %v: the spec passes -record: %v", tc.p.cfg.RecordAgentMessages, got)
		}
	}
}

// TestAgentSpec checks the agent's process: root, exactly the documented
// capabilities, no_new_privs, and its two mounts.
func TestAgentSpec(t *testing.T) {
	p := &Provider{cfg: Config{Pool: "p", Installation: testInstallation}, agent: agentBinary{path: "/cache/agent", digest: "sha256:00"}}
	s := p.spec("cell", "nonce", "/bundle/run", nil)
	pr := s.Process
	if pr.User.UID != 0 || !pr.NoNewPrivileges || pr.Args[0] != agentInCell {
		t.Errorf("agent process = %+v", pr)
	}
	want := []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_KILL", "CAP_SETGID", "CAP_SETUID"}
	for _, set := range [][]string{pr.Capabilities.Bounding, pr.Capabilities.Effective, pr.Capabilities.Permitted} {
		if strings.Join(set, ",") != strings.Join(want, ",") {
			t.Errorf("capability set %v, want %v", set, want)
		}
	}
	if len(pr.Capabilities.Inheritable) != 0 || len(pr.Capabilities.Ambient) != 0 {
		t.Errorf("inheritable %v, ambient %v; want none", pr.Capabilities.Inheritable, pr.Capabilities.Ambient)
	}
	mounts := map[string]ociMount{}
	for _, m := range s.Mounts {
		mounts[m.Destination] = m
	}
	if m := mounts[agentInCell]; m.Source != "/cache/agent" || !strings.Contains(strings.Join(m.Options, ","), "ro") {
		t.Errorf("agent mount = %+v", m)
	}
	if m := mounts[agentDirInCell]; m.Source != "/bundle/run" || !strings.Contains(strings.Join(m.Options, ","), "noexec") {
		t.Errorf("host directory mount = %+v", m)
	}
	if s.Annotations[agentDigestAnnotation] != "sha256:00" {
		t.Errorf("annotations = %v", s.Annotations)
	}
}

// TestResolveAgent covers finding and caching the agent binary.
func TestResolveAgent(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	built := testAgentPath(t)
	cache := t.TempDir()

	a, err := resolveAgent(built, cache, log)
	if err != nil {
		t.Fatalf("resolveAgent(%s): %v", built, err)
	}
	sum, _ := fileDigest(built)
	if a.digest != "sha256:"+sum || a.path != filepath.Join(cache, "sha256-"+sum, agentBinaryName) {
		t.Errorf("resolveAgent = %+v, want the copy under sha256-%s", a, sum)
	}
	if fi, err := os.Stat(a.path); err != nil || fi.Mode().Perm() != 0o555 {
		t.Errorf("cached agent: %v, %v; want mode 0555", fi, err)
	}
	// A damaged copy is replaced.
	if err := os.Chmod(a.path, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(a.path, []byte("damaged"), 0o755); err != nil {
		t.Fatal(err)
	}
	if again, err := resolveAgent(built, cache, log); err != nil || again != a {
		t.Errorf("resolveAgent over a damaged copy = %+v, %v", again, err)
	}
	if got, _ := fileDigest(a.path); got != sum {
		t.Error("the damaged copy was not replaced")
	}

	// A sandboxwich-agent next to the running executable comes first.
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	next := filepath.Join(filepath.Dir(exe), agentBinaryName)
	other := append(readFile(t, built), 0) // another digest, still a static executable
	if err := os.WriteFile(next, other, 0o755); err != nil {
		t.Logf("cannot place an agent next to the test binary (%v); that case is not covered", err)
	} else {
		got, err := resolveAgent("", cache, log)
		_ = os.Remove(next)
		if want := sha256.Sum256(other); err != nil || got.digest != "sha256:"+hex.EncodeToString(want[:]) {
			t.Errorf("resolveAgent with %s = %+v, %v; want that file's digest", next, got, err)
		}
	}

	// Not a static executable: refused, nothing cached.
	script := filepath.Join(t.TempDir(), "agent.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{script, "/no/such/agent"} {
		if _, err := resolveAgent(bad, cache, log); err == nil {
			t.Errorf("resolveAgent(%s): no error", bad)
		}
	}
	if dynamic, err := exec.LookPath("ls"); err == nil && checkStatic(dynamic) == nil {
		t.Logf("%s is static here; the dynamic case is not covered", dynamic)
	} else if err == nil {
		if _, err := resolveAgent(dynamic, cache, log); err == nil || !strings.Contains(err.Error(), "dynamically linked") {
			t.Errorf("resolveAgent of a dynamic executable: %v", err)
		}
	}

	// No agent anywhere and no Go toolchain: the error says what to do.
	t.Setenv("PATH", t.TempDir())
	_, err = resolveAgent("", cache, log)
	if err == nil || !strings.Contains(err.Error(), "agent_path") || !strings.Contains(err.Error(), "go build") {
		t.Errorf("resolveAgent without a toolchain: %v", err)
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Benchmarks of the first output of `echo hi`: through the cell's agent
// (one HTTP request over the cell's Unix socket) and through runsc exec
// (a runsc process start per command).
func BenchmarkEchoAgent(b *testing.B) {
	p, obj := benchCell(b)
	conn, err := p.Agent(context.Background(), obj)
	if err != nil {
		b.Fatal(err)
	}
	f := agent.Fence{CellID: obj.CellID.String(), LeaseID: "bench", Generation: 1}
	if err := conn.Activate(context.Background(), agent.Activation{Version: agent.ProtocolVersion, Fence: f,
		ExpiresAt: time.Now().Add(time.Hour), TTLMillis: time.Hour.Milliseconds()}); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	var toFirst time.Duration
	for range b.N {
		start, first := time.Now(), time.Duration(0)
		_, err := conn.Exec(context.Background(), agent.ExecRequest{Fence: f, Argv: []string{"echo", "hi"}}, func(o agent.Output) error {
			if first == 0 && len(o.Data) > 0 {
				first = time.Since(start)
			}
			return nil
		})
		if err != nil || first == 0 {
			b.Fatalf("exec: %v, output after %v", err, first)
		}
		toFirst += first
	}
	b.ReportMetric(float64(toFirst.Microseconds())/float64(b.N)/1000, "ms-to-first-output/op")
}

// BenchmarkAgentStatus measures the channel alone: one status request.
func BenchmarkAgentStatus(b *testing.B) {
	p, obj := benchCell(b)
	conn, err := p.Agent(context.Background(), obj)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		if _, err := conn.Status(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEchoRunscExec(b *testing.B) {
	p, obj := benchCell(b)
	id := p.containerID(obj.CellID)
	b.ResetTimer()
	for range b.N {
		out, code, err := p.runInside(context.Background(), id, "echo", "hi")
		if err != nil || code != 0 || string(out) != "hi\n" {
			b.Fatalf("runsc exec: %q, %d, %v", out, code, err)
		}
	}
}

func benchCell(b *testing.B) (*Provider, driver.Object) {
	if FindRunsc() == "" || os.Geteuid() != 0 {
		b.Skip("needs runsc and root")
	}
	a, err := testAgent()
	if err != nil {
		b.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "sbw-gvisor-bench-")
	if err != nil {
		b.Fatal(err)
	}
	cfg := Config{StateDir: filepath.Join(dir, "state"), BundleDir: filepath.Join(dir, "bundles"), Pool: "bench",
		Installation: testInstallation, AgentPath: a.path, Logger: slog.New(slog.DiscardHandler)}
	p, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	obj, err := p.Provision(context.Background(), driver.ProvisionRequest{CellID: uuid.Must(uuid.NewV7()), RuntimeClass: lease.GVisorLowerRisk})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = p.Destroy(context.Background(), obj)
		_ = RemoveStateDir(cfg.StateDir)
		_ = os.RemoveAll(dir)
	})
	return p, obj
}
