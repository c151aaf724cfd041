package gvisor

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/drivertest"
	"github.com/sandboxwich/sandboxwich/egress"
	"github.com/sandboxwich/sandboxwich/lease"
)

// stragglerEnv makes the test binary sleep instead of running tests: it
// stands in for a host process left by a half-created sandbox.
const stragglerEnv = "SANDBOXWICH_GVISOR_TEST_STRAGGLER"

func TestMain(m *testing.M) {
	if os.Getenv(stragglerEnv) == "1" {
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// requireRunsc skips the test when runsc is not installed, except under
// CI=true, where a missing runsc fails it: CI must never pass without
// running the real thing.
func requireRunsc(t *testing.T) {
	t.Helper()
	if FindRunsc() == "" {
		err := errors.New("no runsc: neither the pinned build nor one in PATH")
		if os.Getenv("CI") == "true" {
			t.Fatalf("runsc is required under CI=true (run scripts/install-runsc.sh): %v", err)
		}
		t.Skipf("runsc is not installed (%s, or scripts/install-runsc.sh)", InstallCommand)
	}
	requireRoot(t)
}

// requireRoot skips the test when it does not run as root, except under
// CI=true, where it fails.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("the gVisor driver tests need root under CI=true")
		}
		t.Skip("the gVisor driver tests need root")
	}
}

// testConfig returns a configuration with private directories under a
// short temporary directory, and fails the test at cleanup when runsc still
// holds a container or a host process under its state root.
func testConfig(t *testing.T) Config {
	t.Helper()
	dir, err := os.MkdirTemp("", "sbw-gvisor-test-")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		StateDir:     filepath.Join(dir, "state"),
		BundleDir:    filepath.Join(dir, "bundles"),
		Pool:         "test",
		Installation: testInstallation,
		AgentPath:    testAgentPath(t),
	}
	t.Cleanup(func() {
		checkNoLeak(t, cfg.StateDir)
		if err := RemoveStateDir(cfg.StateDir); err != nil {
			t.Errorf("removing the state root: %v", err)
		}
		_ = os.RemoveAll(dir)
	})
	return cfg
}

// checkNoLeak fails the test if runsc lists any container under state, or
// any host process runs with that state root.
func checkNoLeak(t *testing.T, state string) {
	t.Helper()
	r := &runsc{path: "runsc", root: state, network: "none"}
	cs, err := r.list(context.Background())
	if err != nil {
		t.Errorf("runsc list: %v", err)
	}
	for _, c := range cs {
		t.Errorf("leaked runsc container %s (%s); deleting it", c.ID, c.Status)
		_, _ = r.run(context.Background(), "delete", "--force", c.ID)
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(raw, []byte("--root="+state+"\x00")) {
			t.Errorf("leaked host process %s: %q", e.Name(), bytes.ReplaceAll(raw, []byte{0}, []byte{' '}))
		}
	}
}

// testInstallation is the installation tag of the tests' providers.
var testInstallation = driver.InstallationTag("gvisor-test")

func newProvider(t *testing.T, cfg Config) *Provider {
	t.Helper()
	p, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return p
}

type harness struct{ cfg Config }

func (h harness) MakeProvider(context.Context, *testing.T) (driver.Provider, error) {
	return New(h.cfg)
}

func (h harness) RuntimeClass() lease.RuntimeClass { return lease.GVisorLowerRisk }

// Images pushes two marked busybox images to a loopback registry of the
// test (drivertest's Images case).
func (h harness) Images(t *testing.T) []drivertest.TestImage {
	busybox := requireBusybox(t)
	refs, _ := markerImages(t, newTestRegistry(t), busybox, "x", "y")
	return []drivertest.TestImage{
		{Ref: refs["x"], MarkerPath: "/etc/marker", Marker: "marker x\n"},
		{Ref: refs["y"], MarkerPath: "/etc/marker", Marker: "marker y\n"},
	}
}

// CellProcesses counts the cell's processes with runsc ps, past the agent.
func (h harness) CellProcesses(ctx context.Context, p driver.Provider, obj driver.Object) (int, error) {
	g := p.(*Provider)
	id, _ := g.objectID(obj)
	ps, err := g.r.ps(ctx, id)
	return len(ps), err
}

var _ drivertest.ProcessCounter = harness{}

func TestConformance(t *testing.T) {
	requireRunsc(t)
	t.Parallel()
	drivertest.Run(t, harness{cfg: testConfig(t)})
}

// provision provisions one cell and destroys it at cleanup.
func provision(t *testing.T, p *Provider) driver.Object {
	t.Helper()
	cell := uuid.Must(uuid.NewV7())
	t.Cleanup(func() {
		if err := p.Destroy(context.Background(), driver.Object{CellID: cell}); err != nil {
			t.Errorf("Destroy: %v", err)
		}
	})
	obj, err := p.Provision(context.Background(), driver.ProvisionRequest{CellID: cell, RuntimeClass: lease.GVisorLowerRisk})
	if err != nil {
		t.Fatalf("Provision: %v", err)
	}
	return obj
}

// cell is a provisioned cell whose agent the test activated.
type cell struct {
	p     *Provider
	obj   driver.Object
	conn  agent.Conn
	fence agent.Fence
}

// activate activates obj's agent for an hour with a fence of its own.
func activate(t *testing.T, p *Provider, obj driver.Object) *cell {
	t.Helper()
	conn, err := p.Agent(context.Background(), obj)
	if err != nil {
		t.Fatalf("Agent: %v", err)
	}
	act := agent.Activation{Version: agent.ProtocolVersion,
		Fence:     agent.Fence{CellID: obj.CellID.String(), LeaseID: uuid.NewString(), Generation: 1},
		ExpiresAt: time.Now().Add(time.Hour), TTLMillis: time.Hour.Milliseconds()}
	if err := conn.Activate(context.Background(), act); err != nil {
		t.Fatalf("Activate: %v", err)
	}
	return &cell{p: p, obj: obj, conn: conn, fence: act.Fence}
}

// exec runs argv in the cell as user through its agent.
func (c *cell) exec(user agent.User, argv ...string) (agent.ExecResult, error) {
	return c.conn.Exec(context.Background(), agent.ExecRequest{Fence: c.fence, Argv: argv, User: user,
		TimeoutMillis: time.Minute.Milliseconds()}, nil)
}

// run runs argv as the cell user and fails the test on an error.
func (c *cell) run(t *testing.T, argv ...string) agent.ExecResult {
	t.Helper()
	return c.runAs(t, agent.UserCell, argv...)
}

// runAs runs argv as user and fails the test on an error.
func (c *cell) runAs(t *testing.T, user agent.User, argv ...string) agent.ExecResult {
	t.Helper()
	res, err := c.exec(user, argv...)
	if err != nil {
		t.Fatalf("exec %q as %s: %v", argv, user, err)
	}
	return res
}

// TestCellSeesNothingOfTheHost checks the default root filesystem against
// the package documentation: exactly the listed top-level entries, a
// synthetic /etc, no host secrets, no working tree, no host environment,
// and no host environment in runsc's own processes either.
func TestCellSeesNothingOfTheHost(t *testing.T) {
	requireRunsc(t)
	const secret = "do-not-leak-5b0c1d"
	t.Setenv("SANDBOXWICH_TEST_SECRET", secret)
	p := newProvider(t, testConfig(t))
	obj := provision(t, p)
	c := activate(t, p, obj)

	// Top level: exactly the documented entries.
	res := c.run(t, "sh", "-c", "for f in /* /.[!.]*; do [ -e \"$f\" ] && echo \"$f\"; done")
	want := []string{"/.sandboxwich", "/bin", "/dev", "/etc", "/home", "/proc", "/root", "/run", "/sbin", "/sys", "/tmp", "/usr", "/var"}
	for _, d := range []string{"lib", "lib32", "lib64", "libx32"} {
		if _, err := os.Lstat("/" + d); err == nil {
			want = append(want, "/"+d)
		}
	}
	slices.Sort(want)
	got := strings.Fields(string(res.Stdout))
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("top-level entries = %v, want %v", got, want)
	}

	// /etc is the synthetic one.
	res = c.run(t, "sh", "-c", "for f in /etc/* /etc/.[!.]*; do [ -e \"$f\" ] && echo \"$f\"; done")
	var wantEtc []string
	for name := range syntheticEtc {
		wantEtc = append(wantEtc, "/etc/"+name)
	}
	slices.Sort(wantEtc)
	if got := strings.Fields(string(res.Stdout)); !slices.Equal(got, wantEtc) {
		t.Errorf("/etc holds %v, want %v", got, wantEtc)
	}
	if res := c.run(t, "cat", "/etc/passwd"); string(res.Stdout) != syntheticEtc["passwd"] {
		t.Errorf("/etc/passwd = %q", res.Stdout)
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/etc/shadow", "/root/.bashrc", "/root/.ssh", filepath.Join(wd, "gvisor_test.go"), wd, "/work", "/var/lib", "/var/log", "/run/user", "/srv", "/opt", "/mnt", p.cfg.StateDir, p.cfg.BundleDir} {
		if res := c.runAs(t, agent.UserRoot, "test", "-e", path); res.ExitCode == 0 {
			t.Errorf("the cell sees %s", path)
		}
	}
	// /var holds the private /var/tmp alone, empty.
	if res := c.runAs(t, agent.UserRoot, "sh", "-c", "ls -a /var /var/tmp"); string(res.Stdout) != "/var:\n.\n..\ntmp\n\n/var/tmp:\n.\n..\n" {
		t.Errorf("/var holds %q (stderr %q)", res.Stdout, res.Stderr)
	}
	// /.sandboxwich holds the agent alone, /run the cell's host directory
	// alone, which the cell user cannot enter.
	if res := c.runAs(t, agent.UserRoot, "sh", "-c", "ls -a /.sandboxwich /run"); string(res.Stdout) != "/.sandboxwich:\n.\n..\nagent\n\n/run:\n.\n..\nsandboxwich\n" {
		t.Errorf("/.sandboxwich and /run hold %q (stderr %q)", res.Stdout, res.Stderr)
	}
	if res := c.run(t, "ls", "/run/sandboxwich"); res.ExitCode == 0 {
		t.Errorf("the cell user lists the agent's directory: %q", res.Stdout)
	}
	// The skeleton's /root, which is what the cell gets, is empty.
	if entries, err := os.ReadDir(filepath.Join(p.rootfs, "root")); err != nil || len(entries) != 0 {
		t.Errorf("the cell's /root holds %v (%v)", entries, err)
	}
	// Home, /tmp and /var/tmp are private and writable; the rest is read-only.
	res = c.run(t, "sh", "-c", "echo x > /home/cell/f && echo x > /tmp/f && echo x > /var/tmp/f && cat /home/cell/f /tmp/f /var/tmp/f; echo x > /usr/f; echo x > /etc/f; echo x > /f")
	if string(res.Stdout) != "x\nx\nx\n" || strings.Count(string(res.Stderr), "cannot create") != 3 {
		t.Errorf("write checks: stdout %q, stderr %q", res.Stdout, res.Stderr)
	}
	// The agent, the cell's init, is not dumpable: no workload, root
	// included, reads its environment or file descriptors. Seen from the
	// host (runsc exec with CAP_SYS_PTRACE), it holds no host file (runsc
	// create's stdio) and has exactly the fixed environment.
	for _, f := range []string{"/proc/1/environ", "/proc/1/fd", "/proc/1/mem"} {
		if res := c.runAs(t, agent.UserRoot, "sh", "-c", "ls -l "+f+" && cat "+f); res.ExitCode == 0 {
			t.Errorf("a root workload reads %s: %.200q", f, res.Stdout)
		}
	}
	id := p.containerID(obj.CellID)
	out, err := p.r.run(context.Background(), "exec", "--user=0:0", "--cap=CAP_SYS_PTRACE", id, "readlink", "/proc/1/fd/0", "/proc/1/fd/1", "/proc/1/fd/2")
	if err != nil || string(out) != "/dev/null\n/dev/null\n/dev/null\n" {
		t.Errorf("the agent's stdio: %q, %v; want /dev/null", out, err)
	}
	out, err = p.r.run(context.Background(), "exec", "--user=0:0", "--cap=CAP_SYS_PTRACE", id, "cat", "/proc/1/environ")
	env := strings.Split(strings.TrimRight(string(out), "\x00"), "\x00")
	slices.Sort(env)
	if err != nil || !slices.Equal(env, slices.Sorted(slices.Values(cellEnv))) {
		t.Errorf("the agent's environment = %q, %v; want %q", env, err, cellEnv)
	}
	if res := c.run(t, "id", "-u"); strings.TrimSpace(string(res.Stdout)) != "1000" {
		t.Errorf("cell processes run as uid %q, want 1000", res.Stdout)
	}

	// Nothing of the host's environment reaches a command (cat is exec'd
	// directly, no shell adds anything).
	res = c.run(t, "cat", "/proc/self/environ")
	if bytes.Contains(res.Stdout, []byte(secret)) || bytes.Contains(res.Stdout, []byte("SANDBOXWICH_")) {
		t.Errorf("a command's environment holds the host's: %q", res.Stdout)
	}

	// runsc and its sandbox and gofer run without the host environment.
	state, err := p.r.state(context.Background(), p.containerID(obj.CellID))
	if err != nil || state == nil {
		t.Fatalf("runsc state: %v", err)
	}
	procs, err := containerProcesses("/proc", p.r.root, state.ID, p.bundlePath(state.ID))
	if err != nil || len(procs) < 2 {
		t.Fatalf("host processes of the container: %v, %v", procs, err)
	}
	for _, pr := range procs {
		raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pr.pid), "environ"))
		if err != nil {
			continue // exited meanwhile
		}
		if bytes.Contains(raw, []byte(secret)) || bytes.Contains(raw, []byte("SANDBOXWICH_")) {
			t.Errorf("host process %d (%s) inherited the driver's environment", pr.pid, pr.argv[0])
		}
		for _, kv := range strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00") {
			if kv != "" && !strings.HasPrefix(kv, "PATH=") {
				t.Errorf("host process %d (%s) has environment variable %q", pr.pid, pr.argv[0], kv)
			}
		}
		if slices.ContainsFunc(pr.argv, func(a string) bool { return strings.Contains(a, secret) }) {
			t.Errorf("host process %d has the secret in its argv", pr.pid)
		}
	}
}

func TestNetworkNone(t *testing.T) {
	requireRunsc(t)
	t.Parallel()
	p := newProvider(t, testConfig(t))
	c := activate(t, p, provision(t, p))
	res := c.run(t, "cat", "/proc/net/dev")
	var ifaces []string
	for _, line := range strings.Split(string(res.Stdout), "\n") {
		if name, _, ok := strings.Cut(line, ":"); ok && !strings.Contains(name, "|") {
			ifaces = append(ifaces, strings.TrimSpace(name))
		}
	}
	if !slices.Equal(ifaces, []string{"lo"}) {
		t.Errorf("interfaces = %v, want only lo\n%s", ifaces, res.Stdout)
	}
}

func TestMemoryLimit(t *testing.T) {
	requireRunsc(t)
	t.Parallel()
	cfg := testConfig(t)
	cfg.MemoryLimitBytes = 256 << 20
	p := newProvider(t, cfg)
	c := activate(t, p, provision(t, p))
	res := c.run(t, "sh", "-c", "head -n 1 /proc/meminfo")
	if p.r.ignoreCgroups.Load() {
		t.Skipf("cgroups unavailable here; the guest sees %q", res.Stdout)
	}
	if f := strings.Fields(string(res.Stdout)); len(f) < 2 || f[1] != "262144" {
		t.Errorf("guest MemTotal = %q, want 262144 kB", res.Stdout)
	}
}

func TestSandboxedKernel(t *testing.T) {
	for _, tc := range []struct {
		host, guest string
		want        bool
	}{
		{"6.1.0-18-amd64", "4.4.0\n", true},
		{"6.1.0-18-amd64", "4.4.0", true},
		{"6.1.0-18-amd64", "6.1.0-18-amd64\n", false},
		{"6.1.0-18-amd64", "  6.1.0-18-amd64 ", false},
		{"6.1.0-18-amd64", "", false},
		{"6.1.0-18-amd64", "\n", false},
		{"", "4.4.0", false},
	} {
		if got, why := sandboxedKernel(tc.host, tc.guest); got != tc.want {
			t.Errorf("sandboxedKernel(%q, %q) = %v (%s), want %v", tc.host, tc.guest, got, why, tc.want)
		}
	}
}

// TestInspectRefusesHostKernel makes the guest kernel look like the host's:
// Inspect must then not report the runtime class.
func TestInspectRefusesHostKernel(t *testing.T) {
	requireRunsc(t)
	t.Parallel()
	cfg := testConfig(t)
	p := newProvider(t, cfg)
	obj := provision(t, p)
	// Provision judged the kernel release the cell's agent reported: the
	// provider trusts the identity it verified, without an exec.
	o, err := p.Inspect(context.Background(), obj)
	if err != nil || o.RuntimeClass != lease.GVisorLowerRisk || !strings.Contains(o.Detail, "verified from inside earlier") {
		t.Fatalf("Inspect after Provision = %+v, %v; want the identity verified at Provision", o, err)
	}
	// A restarted provider has verified nothing yet: it checks from
	// inside again, and refuses when the kernels match.
	release, code, err := p.runInside(context.Background(), p.containerID(obj.CellID), "uname", "-r")
	if err != nil || code != 0 {
		t.Fatalf("uname -r: exit %d, %v", code, err)
	}
	p = newProvider(t, cfg)
	p.hostKernel = strings.TrimSpace(string(release)) // what gVisor reports
	o, err = p.Inspect(context.Background(), obj)
	if err != nil {
		t.Fatal(err)
	}
	if !o.Exists || o.RuntimeClass != "" || !strings.Contains(o.Detail, "host's kernel") {
		t.Errorf("Inspect with an equal kernel = %+v", o)
	}
	if driver.Verify(obj, o, lease.GVisorLowerRisk) == nil {
		t.Error("Verify accepts an unverified observation")
	}
	// The agent's release is judged as an exec's is: a cell provisioned
	// by that provider is not verified at Provision either.
	obj = provision(t, p)
	if o, err = p.Inspect(context.Background(), obj); err != nil || o.RuntimeClass != "" || !strings.Contains(o.Detail, "host's kernel") {
		t.Errorf("Inspect of a cell provisioned with an equal kernel = %+v, %v", o, err)
	}
}

func TestListAfterRestart(t *testing.T) {
	requireRunsc(t)
	t.Parallel()
	cfg := testConfig(t)
	a := newProvider(t, cfg)
	obj := provision(t, a)

	b := newProvider(t, cfg) // the process "restarted"
	objs, err := b.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(objs, obj) {
		t.Fatalf("List after restart = %v, want it to hold %v", objs, obj)
	}
	other := cfg
	other.Pool = "other"
	objs, err = newProvider(t, other).List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 0 {
		t.Errorf("another pool's List = %v, want nothing", objs)
	}
	if err := b.Destroy(context.Background(), obj); err != nil {
		t.Fatalf("Destroy through the new provider: %v", err)
	}
	if objs, _ := a.List(context.Background()); len(objs) != 0 {
		t.Errorf("List after Destroy = %v", objs)
	}
}

// TestDestroyLeavesANewerObject: Destroy of an old identity must not touch
// a container created later under the same cell ID.
func TestDestroyLeavesANewerObject(t *testing.T) {
	requireRunsc(t)
	t.Parallel()
	p := newProvider(t, testConfig(t))
	obj := provision(t, p)
	stale := driver.Object{CellID: obj.CellID, Identity: p.containerID(obj.CellID) + "@0000"}
	if err := p.Destroy(context.Background(), stale); err != nil {
		t.Fatalf("Destroy of a stale identity: %v", err)
	}
	o, err := p.Inspect(context.Background(), obj)
	if err != nil || !o.Exists || o.Identity != obj.Identity {
		t.Errorf("the current object after destroying a stale one: %+v, %v", o, err)
	}
	if _, err := p.Agent(context.Background(), stale); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("Agent with a stale identity: %v, want ErrNotFound", err)
	}
}

// fakeRunsc writes a shell script standing in for runsc, for faults real
// runsc cannot be made to produce. It logs every invocation to the
// returned file.
func fakeRunsc(t *testing.T, body string) (path, log string) {
	t.Helper()
	dir := t.TempDir()
	path, log = filepath.Join(dir, "runsc"), filepath.Join(dir, "calls")
	script := "#!/bin/sh\necho \"$*\" >> " + log + "\n" +
		"case \"$*\" in *--version*) echo 'runsc version fake'; exit 0;; esac\n" + body
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path, log
}

func fakeConfig(t *testing.T, runscPath string) Config {
	dir := t.TempDir()
	return Config{RunscPath: runscPath, StateDir: filepath.Join(dir, "s"), BundleDir: filepath.Join(dir, "b"), Pool: "fake",
		Installation: testInstallation, AgentPath: testAgentPath(t)}
}

func TestDestroyUncertainWhenStateStillReportsIt(t *testing.T) {
	cell := uuid.Must(uuid.NewV7())
	path, _ := fakeRunsc(t, `for a; do id=$a; done
case "$*" in
*" state "*) printf '{"id":"%s","status":"running","pid":1,"annotations":{"dev.sandboxwich.nonce":"n"}}' "$id";;
esac
exit 0
`)
	p := newProvider(t, fakeConfig(t, path))
	err := p.Destroy(context.Background(), driver.Object{CellID: cell, Identity: p.containerID(cell) + "@n"})
	if !errors.Is(err, driver.ErrUncertain) {
		t.Fatalf("Destroy = %v, want ErrUncertain", err)
	}
	if !strings.Contains(err.Error(), "still reports") {
		t.Errorf("error does not say what was observed: %v", err)
	}
}

func TestDestroyUncertainWhenRunscFails(t *testing.T) {
	path, _ := fakeRunsc(t, "echo 'something broke' >&2; exit 1\n")
	p := newProvider(t, fakeConfig(t, path))
	err := p.Destroy(context.Background(), driver.Object{CellID: uuid.Must(uuid.NewV7())})
	if !errors.Is(err, driver.ErrUncertain) {
		t.Fatalf("Destroy = %v, want ErrUncertain", err)
	}
}

// TestDestroyKillsStragglers: runsc says the container is gone but a host
// process of it remains (as after a runsc run killed half-way); Destroy
// kills it and proves absence.
func TestDestroyKillsStragglers(t *testing.T) {
	path, _ := fakeRunsc(t, `case "$*" in *" state "*) echo 'loading container: file does not exist' >&2; exit 128;; esac
exit 0
`)
	p := newProvider(t, fakeConfig(t, path))
	cell := uuid.Must(uuid.NewV7())
	id := p.containerID(cell)
	// A process whose command line names the state root and the container,
	// like a sandbox's: this test binary, sleeping (see TestMain).
	straggler := exec.Command(os.Args[0], "--root="+p.r.root, "boot", id)
	straggler.Env = []string{stragglerEnv + "=1"}
	if err := straggler.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = straggler.Wait(); close(exited) }()
	t.Cleanup(func() { _ = straggler.Process.Kill(); <-exited })

	if err := p.Destroy(context.Background(), driver.Object{CellID: cell}); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	select {
	case <-exited:
	case <-time.After(30 * time.Second): // a hang guard: it sleeps a minute unless killed
		t.Fatal("the straggler still runs after Destroy returned nil")
	}
	// Destroy killed it (after one grace), rather than waiting until it
	// exited by itself a minute later: the mechanism, which no load moves,
	// instead of how long Destroy took.
	if ws, ok := straggler.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Errorf("the straggler ended %v, want killed by SIGKILL", straggler.ProcessState)
	}
}

// TestCgroupFallback: when runsc cannot use cgroups, the provider retries
// once with --ignore-cgroups and keeps that flag. The fake runsc runs the
// real agent on the host for the created cell.
func TestCgroupFallback(t *testing.T) {
	path, log := fakeRunsc(t, `for a; do id=$a; done
state=$(dirname "$0")/state
case "$*" in
*--ignore-cgroups*" run "*)
  # Created and started: the real agent serves the cell's socket, on the host.
  prev=; for a; do [ "$prev" = --bundle ] && bundle=$a; prev=$a; done
  cp "$bundle/config.json" "$state"
  agent=$(sed -n 's/.*"source": "\(.*sandboxwich-agent\)".*/\1/p' "$state")
  (cd "$bundle/run" && exec "$agent" -listen agent.sock -cell-id x) </dev/null >/dev/null 2>&1 &
  echo $! > "$state.pid"; exit 0;;
*" run "*) echo 'cannot set up cgroup for root: permission denied' >&2; exit 128;;
*" state "*)
  [ -f "$state" ] || { echo 'loading container: file does not exist' >&2; exit 128; }
  nonce=$(sed -n 's/.*"dev.sandboxwich.nonce": "\([0-9a-f]*\)".*/\1/p' "$state")
  printf '{"id":"%s","status":"running","pid":1,"annotations":{"dev.sandboxwich.nonce":"%s"}}' "$id" "$nonce";;
*" delete "*) [ -f "$state.pid" ] && kill "$(cat "$state.pid")"; rm -f "$state" "$state.pid";;
esac
exit 0
`)
	requireRoot(t) // the cell's host directory is a tmpfs mount
	p := newProvider(t, fakeConfig(t, path))
	obj, err := p.Provision(context.Background(), driver.ProvisionRequest{CellID: uuid.Must(uuid.NewV7()), RuntimeClass: lease.GVisorLowerRisk})
	if err != nil {
		t.Fatalf("Provision: %v", err)
	}
	if !p.r.ignoreCgroups.Load() {
		t.Error("the provider did not switch to --ignore-cgroups")
	}
	if err := p.Destroy(context.Background(), obj); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	calls, _ := os.ReadFile(log)
	var runs []string
	for _, line := range strings.Split(string(calls), "\n") {
		if strings.Contains(line, " run ") {
			runs = append(runs, line)
		}
	}
	if len(runs) != 2 || strings.Contains(runs[0], "--ignore-cgroups") || !strings.Contains(runs[1], "--ignore-cgroups") {
		t.Errorf("run calls = %q, want one without and one with --ignore-cgroups", runs)
	}
}

func TestNewErrors(t *testing.T) {
	dir := t.TempDir()
	base := Config{StateDir: filepath.Join(dir, "s"), BundleDir: filepath.Join(dir, "b"), Installation: testInstallation,
		AgentPath: testAgentPath(t)}

	cfg := base
	cfg.RunscPath = filepath.Join(dir, "no-such-runsc")
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "go install gvisor.dev/gvisor/runsc@"+RunscVersion) {
		t.Errorf("New with a missing runsc: %v, want the install command", err)
	}
	path, _ := fakeRunsc(t, "exit 0\n")
	for name, mutate := range map[string]func(*Config){
		"pool":            func(c *Config) { c.Pool = "bad pool/name" },
		"no installation": func(c *Config) { c.Installation = "" },
		"installation":    func(c *Config) { c.Installation = "ABCDEF012345" },
		"network":         func(c *Config) { c.Network = "host" },
		"platform":        func(c *Config) { c.Platform = "magic" },
		"memory":          func(c *Config) { c.MemoryLimitBytes = -1 },
		"pids":            func(c *Config) { c.PidsLimit = MinPidsLimit - 1 },
		"pids < 0":        func(c *Config) { c.PidsLimit = -1 },
		"rootfs /":        func(c *Config) { c.RootFS = "/" },
		"rootfs symlink to /": func(c *Config) {
			link := filepath.Join(dir, "root-link")
			_ = os.Symlink("/", link)
			c.RootFS = link
		},
		"rootfs missing": func(c *Config) { c.RootFS = filepath.Join(dir, "nope") },
		"agent missing":  func(c *Config) { c.AgentPath = filepath.Join(dir, "no-agent") },
	} {
		cfg := base
		cfg.RunscPath = path
		mutate(&cfg)
		if _, err := New(cfg); err == nil {
			t.Errorf("New with a bad %s: no error", name)
		}
	}
	cfg = base
	cfg.RunscPath = path
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{p.cfg.StateDir, p.cfg.BundleDir} {
		if fi, err := os.Stat(d); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v, %v; want mode 0700", d, fi.Mode(), err)
		}
	}
	if c := p.Capabilities(); c.Kind != "gvisor" || c.Mode != driver.Apply || !strings.HasPrefix(c.Identity, "gvisor:") ||
		!slices.Equal(c.RuntimeClasses, []lease.RuntimeClass{lease.GVisorLowerRisk}) {
		t.Errorf("Capabilities = %+v", c)
	}
	if _, err := p.Provision(context.Background(), driver.ProvisionRequest{CellID: uuid.New(), RuntimeClass: lease.KataMicroVM}); err == nil {
		t.Error("Provision of kata_microvm: no error")
	}
}

func TestContainerIDRoundTrip(t *testing.T) {
	p := &Provider{cfg: Config{Pool: "my-pool.1", Installation: testInstallation}}
	cell := uuid.Must(uuid.NewV7())
	id := p.containerID(cell)
	if id != "sbw-"+testInstallation+"-"+cell.String() {
		t.Errorf("containerID = %q", id)
	}
	st := func(id, pool string) *containerState {
		return &containerState{ID: id, Annotations: map[string]string{poolAnnotation: pool}}
	}
	if got, ok := p.cellOf(st(id, "my-pool.1")); !ok || got != cell {
		t.Errorf("cellOf(%q) = %v, %v", id, got, ok)
	}
	other := &Provider{cfg: Config{Pool: "my-pool.1", Installation: driver.InstallationTag("other")}}
	for _, c := range []*containerState{
		st("sbw-"+testInstallation+"-"+strings.ToUpper(cell.String()), "my-pool.1"),
		st(id+"x", "my-pool.1"),
		st(id, "other-pool"), // another pool of this installation
		st(id, ""),           // no pool recorded
		st("sbw-my-pool.1-"+cell.String(), "my-pool.1"), // provisioned before installation tags
		st(cell.String(), "my-pool.1"),
	} {
		if _, ok := p.cellOf(c); ok {
			t.Errorf("cellOf(%q, pool %q) accepted", c.ID, c.Annotations[poolAnnotation])
		}
	}
	if _, ok := other.cellOf(st(id, "my-pool.1")); ok {
		t.Errorf("installation %q claims %q", other.cfg.Installation, id)
	}
}

func TestObjectID(t *testing.T) {
	p := &Provider{cfg: Config{Pool: "p", Installation: testInstallation}}
	cell := uuid.Must(uuid.NewV7())
	legacy := "sbw-p-" + cell.String()
	for _, tc := range []struct {
		identity, want string
	}{
		{"", p.containerID(cell)},
		{p.containerID(cell) + "@n1", p.containerID(cell)},
		{legacy + "@n2", legacy},
		{"sbw-" + driver.InstallationTag("other") + "-" + cell.String() + "@n3", "sbw-" + driver.InstallationTag("other") + "-" + cell.String()},
	} {
		if got, ok := p.objectID(driver.Object{CellID: cell, Identity: tc.identity}); !ok || got != tc.want {
			t.Errorf("objectID(%q) = %q, %v; want %q", tc.identity, got, ok, tc.want)
		}
	}
	for _, identity := range []string{
		"no-at-sign",
		"sbw-p-" + uuid.Must(uuid.NewV7()).String() + "@n", // another cell's container
		"other-" + cell.String() + "@n",
		"sbw-../../x-" + cell.String() + "@n",
		"sbw-a/b-" + cell.String() + "@n",
	} {
		if got, ok := p.objectID(driver.Object{CellID: cell, Identity: identity}); ok {
			t.Errorf("objectID(%q) = %q, want none", identity, got)
		}
	}
}

func TestBelongs(t *testing.T) {
	const root, id, bundle = "/s", "sbw-p-x", "/b/sbw-p-x"
	for _, tc := range []struct {
		argv []string
		want bool
	}{
		{[]string{"runsc-sandbox", "--root=/s", "--network=none", "boot", "--bundle=/b/sbw-p-x", id}, true},
		{[]string{"runsc-gofer", "--root=/s", "gofer", "--bundle", bundle, "--spec-fd=3"}, true},
		{[]string{"runsc", "--root=/s", "exec", "--process=/b/exec-1/process.json", id}, true},
		{[]string{"runsc", "--root=/other", "exec", id}, false},
		{[]string{"runsc", "--root=/s", "exec", "sbw-p-y"}, false},
		{[]string{"runsc", "--root=/s", "list"}, false},
		{[]string{id, "--root=/s"}, false},
	} {
		if got := belongs(tc.argv, root, id, bundle); got != tc.want {
			t.Errorf("belongs(%q) = %v, want %v", tc.argv, got, tc.want)
		}
	}
}

func TestDefaultRootFSSkeleton(t *testing.T) {
	host := t.TempDir()
	for _, d := range []string{"usr/bin", "usr/lib", "lib32"} {
		if err := os.MkdirAll(filepath.Join(host, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{"bin": "usr/bin", "lib": "/usr/lib", "sbin": "/elsewhere/sbin"} {
		if err := os.Symlink(target, filepath.Join(host, link)); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(t.TempDir(), "rootfs")
	for i := 0; i < 2; i++ { // idempotent
		mounts, err := buildDefaultRootFS(dir, host)
		if err != nil {
			t.Fatal(err)
		}
		var dests []string
		for _, m := range mounts {
			dests = append(dests, m.Destination)
			if !slices.Contains(m.Options, "ro") {
				t.Errorf("mount %s is not read-only", m.Destination)
			}
		}
		if !slices.Equal(dests, []string{"/usr", "/lib32"}) {
			t.Errorf("bind mounts = %v, want /usr and /lib32", dests)
		}
	}
	if l, err := os.Readlink(filepath.Join(dir, "bin")); err != nil || l != "usr/bin" {
		t.Errorf("bin -> %q, %v", l, err)
	}
	if l, err := os.Readlink(filepath.Join(dir, "lib")); err != nil || l != "/usr/lib" {
		t.Errorf("lib -> %q, %v", l, err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "sbin")); !os.IsNotExist(err) {
		t.Errorf("a symlink out of /usr was recreated: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "etc", "hostname")); err != nil || string(b) != "cell\n" {
		t.Errorf("etc/hostname = %q, %v", b, err)
	}
}

func TestParsePS(t *testing.T) {
	out := "UID       PID       PPID      PGID      C         TTY       STIME     TIME       CMD\n" +
		"1000      1         0         1         0         ?         17:09     10ms       sh\n" +
		"1000      7         1         5         0         ?         17:09     0s         sleep\n"
	ps, err := parsePS("c", []byte(out))
	if err != nil || !slices.Equal(ps, []guestProcess{{1, 0, 1}, {7, 1, 5}}) {
		t.Errorf("parsePS = %v, %v", ps, err)
	}
	// An older runsc without the PGID column.
	ps, err = parsePS("c", []byte("UID PID PPID C TTY STIME TIME CMD\n0 1 0 0 ? 17:09 0s sh\n"))
	if err != nil || !slices.Equal(ps, []guestProcess{{1, 0, 0}}) {
		t.Errorf("parsePS without PGID = %v, %v", ps, err)
	}
	if _, err := parsePS("c", []byte("UID PID PPID PGID\n0 x 0 1\n")); err == nil {
		t.Error("parsePS accepted a bad PID")
	}
}

// TestInstallationsShareStateRoot runs two installations and a pool with
// a 64-character name under one state root: each List returns only its
// own installation's and pool's containers, a container named as before
// installation tags is still inspected, run in and destroyed through its
// recorded identity, and the longest pool name fits runsc's control socket.
func TestInstallationsShareStateRoot(t *testing.T) {
	requireRunsc(t)
	t.Parallel()
	ctx := context.Background()
	cfg := testConfig(t)
	a := newProvider(t, cfg)
	cfg.Installation = driver.InstallationTag("another plane")
	b := newProvider(t, cfg)
	cfg.Pool = strings.Repeat("p", 64)
	long := newProvider(t, cfg)

	objA, objB, objLong := provision(t, a), provision(t, b), provision(t, long)
	for _, tc := range []struct {
		p    *Provider
		want driver.Object
	}{{a, objA}, {b, objB}, {long, objLong}} {
		got, err := tc.p.List(ctx)
		if err != nil || len(got) != 1 || got[0] != tc.want {
			t.Errorf("List of installation %s pool %s = %+v, %v; want only %+v", tc.p.cfg.Installation, tc.p.cfg.Pool, got, err, tc.want)
		}
	}
	if res, err := activate(t, long, objLong).exec(agent.UserCell, "true"); err != nil || res.ExitCode != 0 {
		t.Errorf("exec in the 64-character pool's cell = %+v, %v", res, err)
	}

	cell := uuid.Must(uuid.NewV7())
	legacyID := "sbw-" + a.cfg.Pool + "-" + cell.String()
	legacy, err := a.create(ctx, cell, legacyID, a.image, egress.None)
	if err != nil {
		_ = a.destroyContainer(ctx, legacyID)
		t.Fatalf("creating a container under the old name: %v", err)
	}
	if got, err := a.List(ctx); err != nil || slices.Contains(got, legacy) {
		t.Errorf("List = %+v, %v; lists the container provisioned before installation tags", got, err)
	}
	o, err := a.Inspect(ctx, legacy)
	if err != nil || driver.Verify(legacy, o, lease.GVisorLowerRisk) != nil {
		t.Errorf("Inspect of the old container = %+v, %v; want it verified", o, err)
	}
	if res, err := activate(t, a, legacy).exec(agent.UserCell, "true"); err != nil || res.ExitCode != 0 {
		t.Errorf("exec in the old container = %+v, %v", res, err)
	}
	if err := a.Destroy(ctx, legacy); err != nil {
		t.Fatalf("Destroy of the old container: %v", err)
	}
	if st, err := a.r.state(ctx, legacyID); err != nil || st != nil {
		t.Errorf("runsc state %s after Destroy = %+v, %v; want it gone", legacyID, st, err)
	}
}

// TestCellRunscCalls: a cell's whole life — Provision, the admission's
// Inspect, Destroy — starts runsc three times: run --detach (create and
// start), delete and the state that proves the container gone. The kernel
// is checked from inside with the release the agent reports when it first
// answers (no exec), every other look at the container reads runsc's own
// state file (Provider.state), and `runsc state` answers absence.
func TestCellRunscCalls(t *testing.T) {
	requireRunsc(t)
	t.Parallel()
	dir := t.TempDir()
	log, wrapper := filepath.Join(dir, "calls"), filepath.Join(dir, "runsc")
	script := "#!/bin/sh\necho \"$*\" >> " + log + "\nexec " + FindRunsc() + " \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	cfg.RunscPath = wrapper
	p := newProvider(t, cfg)
	if err := os.Remove(log); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	ctx := context.Background()
	cell := uuid.Must(uuid.NewV7())
	calls := func() []string {
		t.Helper()
		raw, err := os.ReadFile(log)
		if err != nil {
			t.Fatal(err)
		}
		verbs := map[string]bool{"create": true, "start": true, "run": true, "state": true, "exec": true, "kill": true, "delete": true, "list": true, "ps": true}
		var got []string
		for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
			for _, f := range strings.Fields(line) {
				if verbs[f] {
					got = append(got, f)
					break
				}
			}
		}
		return got
	}
	obj, err := p.Provision(ctx, driver.ProvisionRequest{CellID: cell, RuntimeClass: lease.GVisorLowerRisk})
	if err != nil {
		t.Fatalf("Provision: %v", err)
	}
	if got, want := calls(), []string{"run"}; !slices.Equal(got, want) {
		t.Errorf("Provision started runsc for %q, want %q", got, want)
	}
	o, err := p.Inspect(ctx, obj)
	if err != nil || !o.Ready || o.RuntimeClass != lease.GVisorLowerRisk {
		t.Fatalf("Inspect = %+v, %v", o, err)
	}
	if err := p.Destroy(ctx, obj); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if got, want := calls(), []string{"run", "delete", "state"}; !slices.Equal(got, want) {
		t.Errorf("runsc was started for %q, want %q", got, want)
	}
}
