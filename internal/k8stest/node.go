package k8stest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/sandboxwich/sandboxwich/internal/testenv"
)

// A real node: etcd and kube-apiserver (as for Shared), plus containerd
// 2.x and a kubelet running real containers under runc and gVisor. It
// needs root, the binaries scripts/k8s-binaries.sh builds into the "node"
// folder beside etcd and kube-apiserver, and busybox-static
// (scripts/install-busybox.sh).
//
// Only one real node may run on a host at a time: the kubelet and
// containerd use fixed paths (/run/containerd, /var/lib/kubelet,
// /var/log/containers), a fixed port and host sysctls. StartNode and
// SharedNode take a host-wide lock (NodeLockPath) that a second test
// process waits for.
//
// Networking: every Pod's eth0 is one end of a veth pair whose other end is
// on a bridge inside a network namespace the node creates (NodeNetNS). Pods
// reach each other and that namespace, and nothing else: no route leads out
// of the Pod subnet and nothing is added to the host's network namespace.
// The test's control side reaches Pod addresses through Node.DialContext,
// which dials from inside that namespace.

// NodeLockPath is the host-wide lock every real node holds while it runs.
const NodeLockPath = "/tmp/sandboxwich-k8stest-node.lock"

// NodeNetNS is the network namespace (under /run/netns) holding the Pods'
// bridge.
const NodeNetNS = "sbw-k8stest"

// PodCIDR is the Pods' subnet on the node's bridge; BridgeIP is the
// bridge's own address in it, the source of Node.DialContext.
const (
	PodCIDR  = "10.251.0.0/24"
	BridgeIP = "10.251.0.1"
)

// RealNodeName is the node's name. It is also its Hostname address, which
// kube-apiserver dials for pods/exec (--kubelet-preferred-address-types):
// the kubelet refuses a loopback node IP, and an address type Hostname of
// 127.0.0.1 keeps the apiserver-to-kubelet hop on loopback.
const RealNodeName = "127.0.0.1"

// BusyboxImageName is the image every real node imports: busybox-static
// with its applets, /etc/passwd and /etc/group. Node.BusyboxImage is its
// digest-pinned reference.
const BusyboxImageName = "localhost/busybox:1"

// pauseImageName is the Pods' sandbox image, containerd's sandbox_image.
const pauseImageName = "localhost/pause:1"

// The fixed kubelet ports (on 127.0.0.1).
const (
	kubeletPort        = 10250
	kubeletHealthzPort = 10248
)

// Node is a running real node: a control plane (the embedded Env, with
// NodeName set to RealNodeName) and a kubelet with containerd.
type Node struct {
	*Env
	// BusyboxImage is BusyboxImageName pinned by digest
	// (localhost/busybox@sha256:…), present in containerd: a Pod with it
	// and any pull policy starts without a registry.
	BusyboxImage string
	// NodeBin holds the node's binaries (kubelet, containerd, runsc…).
	NodeBin string

	work    string
	before  HostState
	lock    *os.File
	procs   []*nodeProc
	stopped bool
}

// NodeBinDir returns the folder of the node's binaries under BinDir, or
// an error naming what is missing.
func NodeBinDir() (string, error) {
	d, err := BinDir()
	if err != nil {
		return "", err
	}
	nb := filepath.Join(d, "node")
	for _, b := range []string{"kubelet", "containerd", "ctr", "containerd-shim-runc-v2", "containerd-shim-runsc-v1", "runsc", "runc", "pause"} {
		if _, err := os.Stat(filepath.Join(nb, b)); err != nil {
			return "", fmt.Errorf("real node binary %s: %w (bash scripts/k8s-binaries.sh builds it)", b, err)
		}
	}
	return nb, nil
}

// nodeNeeds returns why this host cannot run a real node, or nil.
func nodeNeeds() error {
	if os.Geteuid() != 0 {
		return errors.New("a real node needs root")
	}
	if _, err := NodeBinDir(); err != nil {
		return err
	}
	for _, t := range []string{"ip", "nsenter", "flock"} {
		if _, err := exec.LookPath(t); err != nil {
			return fmt.Errorf("%s: %w", t, err)
		}
	}
	if _, err := os.Stat(busyboxPath); err != nil {
		return fmt.Errorf("busybox-static: %w (scripts/install-busybox.sh installs it)", err)
	}
	return nil
}

// needNode skips tb locally and fails it under CI=true when the host
// cannot run a real node.
func needNode(tb testing.TB) {
	tb.Helper()
	testenv.Need(tb, "real-node host", nodeNeeds())
}

var sharedNode struct {
	once sync.Once
	node *Node
	err  error
}

// SharedNode returns the package's shared real node, starting it on first
// use (waiting for the host lock while another package's node runs). Main
// stops it. A package using SharedNode must not call StartNode.
func SharedNode(tb testing.TB) *Node {
	tb.Helper()
	needNode(tb)
	sharedNode.once.Do(func() { sharedNode.node, sharedNode.err = startNode() })
	if sharedNode.err != nil {
		tb.Fatalf("k8stest: starting the shared real node: %v", sharedNode.err)
	}
	return sharedNode.node
}

// StartNode starts a real node of the test's own and stops it at cleanup.
func StartNode(tb testing.TB) *Node {
	tb.Helper()
	needNode(tb)
	n, err := startNode()
	if err != nil {
		tb.Fatalf("k8stest: starting a real node: %v", err)
	}
	tb.Cleanup(func() {
		if err := n.Stop(); err != nil {
			tb.Errorf("k8stest: stopping the real node: %v", err)
		}
	})
	return n
}

// nodeProc is one long-running process of the node.
type nodeProc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

func (n *Node) spawn(name string, env []string, bin string, args ...string) (*nodeProc, error) {
	logPath := filepath.Join(n.work, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Killed with the test process: no kubelet or containerd outlives a
	// test binary that dies without tearing down (startNode then ends
	// what they leave).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p := &nodeProc{name: name, cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() { _ = cmd.Wait(); logf.Close(); close(p.done) }()
	n.procs = append(n.procs, p)
	return p, nil
}

// stop sends SIGTERM to the process and, after grace, SIGKILL.
func (p *nodeProc) stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *nodeProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// tail returns the end of a process's log, for failure messages.
func (p *nodeProc) tail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 6000 {
		b = b[len(b)-6000:]
	}
	return string(b)
}

// Log returns the end of the named process's log ("kubelet",
// "containerd"), for failure messages.
func (n *Node) Log(name string) string {
	for _, p := range n.procs {
		if p.name == name {
			return p.tail()
		}
	}
	return ""
}

func startNode() (_ *Node, err error) {
	begin := time.Now()
	nodeBin, err := NodeBinDir()
	if err != nil {
		return nil, err
	}
	binDir := filepath.Dir(nodeBin)
	lock, err := os.OpenFile(NodeLockPath, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		lock.Close()
		return nil, fmt.Errorf("host lock %s: %w", NodeLockPath, err)
	}
	waited := time.Since(begin)
	// Holding the lock, any process of the node's binaries, or the node's
	// network namespace, is what a test binary killed before its teardown
	// left: end it before taking the snapshot.
	if err := cleanStale(nodeBin, lock); err != nil {
		_ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
		lock.Close()
		return nil, fmt.Errorf("cleaning a node a dead test left: %w", err)
	}
	n := &Node{NodeBin: nodeBin, lock: lock, before: SnapshotHost(nodeBin)}
	// The lock file keeps the sysctls' values until teardown wrote them
	// back, so that the next node can restore them if this test dies.
	if err := n.before.saveSysctls(lock); err != nil {
		_ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
		lock.Close()
		return nil, fmt.Errorf("host lock %s: %w", NodeLockPath, err)
	}
	defer func() {
		if err != nil {
			if serr := n.Stop(); serr != nil {
				err = fmt.Errorf("%w (and tearing down: %v)", err, serr)
			}
		}
	}()
	if n.work, err = os.MkdirTemp("", "k8stest-node-"); err != nil {
		return nil, err
	}
	if n.Env, err = start(binDir, Options{NoKwok: true, realNode: true}); err != nil {
		return nil, err
	}
	if err := n.setupNetwork(); err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	if err := n.startContainerd(); err != nil {
		return nil, err
	}
	if err := n.importImages(); err != nil {
		return nil, fmt.Errorf("images: %w", err)
	}
	if err := n.startKubelet(); err != nil {
		return nil, err
	}
	n.NodeName = RealNodeName
	fmt.Fprintf(os.Stderr, "k8stest: real node up in %v (waited %v for the host lock)\n",
		time.Since(begin).Round(time.Millisecond), waited.Round(time.Millisecond))
	return n, nil
}

// run runs a short command and returns its error with its output.
func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// setupNetwork creates NodeNetNS with the Pods' bridge, and the CNI
// plugin and configuration containerd uses.
func (n *Node) setupNetwork() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, "ip", "netns", "add", NodeNetNS); err != nil {
		return err
	}
	in := func(args ...string) error {
		return run(ctx, "ip", append([]string{"-n", NodeNetNS}, args...)...)
	}
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		{"link", "add", "k8nbr0", "type", "bridge"},
		{"addr", "add", BridgeIP + "/24", "dev", "k8nbr0"},
		{"link", "set", "k8nbr0", "up"},
	} {
		if err := in(args...); err != nil {
			return err
		}
	}
	cniBin := filepath.Join(n.work, "cni", "bin")
	cniConf := filepath.Join(n.work, "cni", "net.d")
	for _, d := range []string{cniBin, cniConf} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	fill := strings.NewReplacer("@NETNS@", NodeNetNS, "@STATE@", filepath.Join(n.work, "cni"))
	if err := os.WriteFile(filepath.Join(cniBin, "sbwbridge"), []byte(fill.Replace(bridgePlugin)), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(cniBin, "sbwipam"), []byte(fill.Replace(ipamScript)), 0o755); err != nil {
		return err
	}
	// containerd's CRI also runs a "loopback" plugin for every Pod.
	if err := os.WriteFile(filepath.Join(cniBin, "loopback"), []byte(loopbackPlugin), 0o755); err != nil {
		return err
	}
	conf := `{"cniVersion":"1.0.0","name":"sbw-k8stest","plugins":[{"type":"sbwbridge"}]}`
	return os.WriteFile(filepath.Join(cniConf, "10-sbw.conflist"), []byte(conf), 0o644)
}

// bridgePlugin is the node's CNI plugin: it gives the Pod's network
// namespace an eth0 whose veth peer joins the bridge in @NETNS@, with the
// next free address of PodCIDR (ipamScript) and no route beyond that
// subnet. The node's neighbour entry for the address is dropped first: it
// may still name the veth of the address's last holder.
const bridgePlugin = `#!/bin/sh
set -u
conf=$(cat)
fail() { printf '{"cniVersion":"1.0.0","code":11,"msg":"sbwbridge: %s"}\n' "$1"; exit 1; }
peer=k8n$(printf %s "$CNI_CONTAINERID" | cut -c1-10)
case "$CNI_COMMAND" in
ADD)
	n=$(@STATE@/bin/sbwipam add "$CNI_CONTAINERID") || fail "no free address in the pod subnet"
	ip=10.251.0.$n
	ip -n @NETNS@ neigh del $ip dev k8nbr0 2>/dev/null
	nsenter --net="$CNI_NETNS" sh -ec "
		ip link add $CNI_IFNAME type veth peer name $peer
		ip link set $peer netns @NETNS@
		ip addr add $ip/24 dev $CNI_IFNAME
		ip link set lo up
		ip link set $CNI_IFNAME up" >&2 || fail "pod side setup failed"
	ip -n @NETNS@ link set $peer master k8nbr0 up >&2 || fail "bridge side setup failed"
	mac=$(nsenter --net="$CNI_NETNS" cat /sys/class/net/$CNI_IFNAME/address)
	printf '{"cniVersion":"1.0.0","interfaces":[{"name":"%s","mac":"%s","sandbox":"%s"}],"ips":[{"address":"%s/24","interface":0}]}\n' "$CNI_IFNAME" "$mac" "$CNI_NETNS" "$ip"
	;;
DEL)
	ip -n @NETNS@ link del "$peer" 2>/dev/null
	@STATE@/bin/sbwipam del "$CNI_CONTAINERID"
	exit 0 ;;
VERSION)
	echo '{"cniVersion":"1.0.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0"]}' ;;
*) exit 0 ;;
esac
`

// ipamScript hands out the node's Pod addresses, 10.251.0.2 to .254, in
// turn, each to one holder at a time: "add ID" records ID as the holder of
// the next free one and prints its last byte (exit 1 when none is free);
// "del ID" frees what ID holds. An address is never handed out while its
// holder's Pod lives: a second Pod with a live Pod's address would take
// its traffic on the bridge, and a connection to the first would stall
// (the turn-by-turn allocator before it did, once it wrapped around).
const ipamScript = `#!/bin/sh
set -u
state=@STATE@
exec 9>"$state/ip.lock"
flock 9
mkdir -p "$state/ips"
case "$1" in
add)
	n=$(cat "$state/ip.next" 2>/dev/null || echo 2)
	i=0
	while [ -e "$state/ips/$n" ]; do
		i=$((i + 1))
		[ $i -ge 253 ] && exit 1
		n=$((n + 1))
		[ $n -gt 254 ] && n=2
	done
	printf '%s\n' "$2" >"$state/ips/$n"
	m=$((n + 1))
	[ $m -gt 254 ] && m=2
	echo $m >"$state/ip.next"
	echo $n
	;;
del)
	for f in "$state"/ips/*; do
		[ -e "$f" ] && IFS= read -r holder <"$f" && [ "$holder" = "$2" ] && rm -f "$f"
	done
	exit 0
	;;
*)
	exit 2
	;;
esac
`

// loopbackPlugin is the CNI loopback plugin: lo up in the Pod's network
// namespace.
const loopbackPlugin = `#!/bin/sh
cat >/dev/null
case "$CNI_COMMAND" in
ADD)
	nsenter --net="$CNI_NETNS" ip link set lo up >&2 || { echo '{"cniVersion":"1.0.0","code":11,"msg":"loopback: setup failed"}'; exit 1; }
	printf '{"cniVersion":"1.0.0","interfaces":[{"name":"lo","sandbox":"%s"}],"ips":[{"address":"127.0.0.1/8","interface":0}]}\n' "$CNI_NETNS"
	;;
VERSION)
	echo '{"cniVersion":"1.0.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0"]}' ;;
*) exit 0 ;;
esac
`

// DialContext dials addr (a Pod's address) from inside NodeNetNS, the only
// place Pod addresses are reachable from.
func (n *Node) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// The socket is created in the namespace of the thread that makes
		// it: switch this locked thread, dial, and switch it back. A
		// thread that cannot be switched back stays locked, so it ends
		// with the goroutine.
		runtime.LockOSThread()
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, err}
			return
		}
		defer home.Close()
		f, err := os.Open(filepath.Join("/run/netns", NodeNetNS))
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, err}
			return
		}
		defer f.Close()
		if err := setns(int(f.Fd())); err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, fmt.Errorf("setns %s: %w", NodeNetNS, err)}
			return
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if setns(int(home.Fd())) == nil {
			runtime.UnlockOSThread()
		}
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

func setns(fd int) error {
	const nrSetns = 308 // x86_64 and the CLONE_NEWNET flag below
	const cloneNewNet = 0x40000000
	if _, _, e := syscall.RawSyscall(nrSetns, uintptr(fd), cloneNewNet, 0); e != 0 {
		return e
	}
	return nil
}

const containerdConfig = `version = 2
root = "@WORK@/containerd/root"
state = "@WORK@/containerd/state"
[grpc]
  address = "@WORK@/containerd/containerd.sock"
[ttrpc]
  address = "@WORK@/containerd/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "@WORK@/containerd/opt"
[plugins."io.containerd.nri.v1.nri"]
  disable = true
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/pause:1"
  restrict_oom_score_adj = true
  enable_cdi = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "@BIN@/runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc]
      runtime_type = "io.containerd.runsc.v1"
      sandbox_mode = "podsandbox"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc.options]
        TypeUrl = "io.containerd.runsc.v1.options"
        ConfigPath = "@WORK@/containerd/runsc.toml"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "@WORK@/cni/bin"
    conf_dir = "@WORK@/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "@WORK@/containerd/certs.d"
`

const runscConfig = `binary_name = "@BIN@/runsc"
root = "/run/containerd/runsc"
log_level = "info"
log_path = "@WORK@/logs/shim/%ID%.log"
`

func (n *Node) sock() string { return filepath.Join(n.work, "containerd", "containerd.sock") }

func (n *Node) startContainerd() error {
	r := strings.NewReplacer("@WORK@", n.work, "@BIN@", n.NodeBin)
	for _, d := range []string{"containerd/certs.d", "logs/shim"} {
		if err := os.MkdirAll(filepath.Join(n.work, d), 0o755); err != nil {
			return err
		}
	}
	cfg := filepath.Join(n.work, "containerd", "config.toml")
	if err := os.WriteFile(cfg, []byte(r.Replace(containerdConfig)), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(n.work, "containerd", "runsc.toml"), []byte(r.Replace(runscConfig)), 0o644); err != nil {
		return err
	}
	p, err := n.spawn("containerd", []string{"PATH=" + n.NodeBin + ":" + os.Getenv("PATH")},
		filepath.Join(n.NodeBin, "containerd"), "--config", cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if p.exited() {
			return false, errors.New("containerd exited")
		}
		return n.ctr(ctx, "version") == nil, nil
	})
	if err != nil {
		return fmt.Errorf("containerd not serving: %w; log:\n%s", err, p.tail())
	}
	return nil
}

// ctr runs containerd's ctr against the node's containerd in the CRI
// namespace.
func (n *Node) ctr(ctx context.Context, args ...string) error {
	return run(ctx, filepath.Join(n.NodeBin, "ctr"), append([]string{"--address", n.sock(), "--namespace", "k8s.io"}, args...)...)
}

func (n *Node) importImages() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pause, err := pauseImage(filepath.Join(n.NodeBin, "pause"))
	if err != nil {
		return err
	}
	busybox, err := BusyboxImage()
	if err != nil {
		return err
	}
	for name, img := range map[string]ociImage{pauseImageName: pause, BusyboxImageName: busybox} {
		tar := filepath.Join(n.work, strings.NewReplacer("/", "_", ":", "_").Replace(name)+".tar")
		digest, err := writeOCIArchive(tar, name, img)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if err := n.ctr(ctx, "images", "import", tar); err != nil {
			return err
		}
		// Also name it repo@digest, which a digest-pinned Pod looks up
		// and reports as its imageID.
		pinned := strings.Split(name, ":")[0] + "@" + digest
		if err := n.ctr(ctx, "images", "tag", name, pinned); err != nil {
			return err
		}
		if name == BusyboxImageName {
			n.BusyboxImage = pinned
		}
	}
	return n.ctr(ctx, "images", "label", pauseImageName, "io.cri-containerd.pinned=pinned")
}

const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: @PORT@
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: @HPORT@
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
oomScoreAdj: 0
containerRuntimeEndpoint: unix://@SOCK@
podLogsDir: @WORK@/kubelet/pod-logs
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization:
  mode: AlwaysAllow
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%", imagefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
resolvConf: /etc/resolv.conf
registerNode: true
maxPods: 64
serializeImagePulls: false
nodeStatusUpdateFrequency: 2s
syncFrequency: 5s
fileCheckFrequency: 5s
`

func (n *Node) startKubelet() error {
	user, err := n.te.AddUser(envtest.User{Name: "system:node:" + RealNodeName, Groups: []string{"system:masters", "system:nodes"}}, &rest.Config{QPS: 1000, Burst: 2000})
	if err != nil {
		return err
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return err
	}
	dir := filepath.Join(n.work, "kubelet")
	for _, d := range []string{"root", "certs", "pod-logs"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return err
		}
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, kc, 0o600); err != nil {
		return err
	}
	r := strings.NewReplacer("@WORK@", n.work, "@SOCK@", n.sock(),
		"@PORT@", fmt.Sprint(kubeletPort), "@HPORT@", fmt.Sprint(kubeletHealthzPort))
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte(r.Replace(kubeletConfig)), 0o600); err != nil {
		return err
	}
	p, err := n.spawn("kubelet", nil, filepath.Join(n.NodeBin, "kubelet"),
		"--config="+cfg,
		"--kubeconfig="+kubeconfig,
		"--root-dir="+filepath.Join(dir, "root"),
		"--cert-dir="+filepath.Join(dir, "certs"),
		"--hostname-override="+RealNodeName,
		"--v=1",
	)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err = wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if p.exited() {
			return false, errors.New("kubelet exited")
		}
		return nodeReady(ctx, n.Client, RealNodeName), nil
	})
	if err != nil {
		return fmt.Errorf("node not ready: %w; kubelet log:\n%s\ncontainerd log:\n%s", err, p.tail(), n.Log("containerd"))
	}
	return nil
}

// Stop deletes every Pod, stops the kubelet, containerd and the control
// plane, and undoes what they changed on the host (processes, mounts,
// cgroups, /run and /var state, sysctls, the network namespace), then
// checks the host against the state before StartNode and releases the host
// lock. It returns what it could not undo.
func (n *Node) Stop() error {
	if n.stopped {
		return nil
	}
	n.stopped = true
	begin := time.Now()
	defer func() {
		fmt.Fprintf(os.Stderr, "k8stest: real node torn down in %v\n", time.Since(begin).Round(time.Millisecond))
	}()
	var errs []error
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	kubelet := n.proc("kubelet")
	if n.Env != nil && kubelet != nil && !kubelet.exited() {
		errs = append(errs, n.deleteAllPods(ctx))
	}
	for _, name := range []string{"kubelet", "containerd"} {
		if p := n.proc(name); p != nil {
			p.stop(20 * time.Second)
		}
	}
	// Shims and sandboxes outlive containerd by design: end those of our
	// binaries (by PID, found by their executable), and every process left
	// in the kubelet's cgroups (which did not exist before the node).
	for range 50 {
		pids := append(nodePIDs(n.NodeBin), n.before.cgroupPIDs()...)
		if len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
	errs = append(errs, n.before.restore(n.work))
	if n.Env != nil {
		errs = append(errs, n.Env.Stop())
	}
	if n.work != "" {
		errs = append(errs, os.RemoveAll(n.work))
	}
	if diff := n.before.Diff(SnapshotHost(n.NodeBin)); diff != "" {
		errs = append(errs, fmt.Errorf("the host differs after teardown: %s", diff))
	}
	if n.lock != nil {
		_ = n.lock.Truncate(0)
		_ = syscall.Flock(int(n.lock.Fd()), syscall.LOCK_UN)
		n.lock.Close()
	}
	return errors.Join(errs...)
}

func (n *Node) proc(name string) *nodeProc {
	for _, p := range n.procs {
		if p.name == name {
			return p
		}
	}
	return nil
}

// deleteAllPods deletes every Pod at once and waits until the kubelet has
// confirmed every deletion (so it stopped their sandboxes). The grace
// period is one second, not zero: zero would remove the Pods from the API
// at once, before the kubelet stops anything.
func (n *Node) deleteAllPods(ctx context.Context) error {
	zero := int64(1)
	nss, err := n.Client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, ns := range nss.Items {
		err := n.Client.CoreV1().Pods(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		l, err := n.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, p := range l.Items {
			if len(p.Finalizers) > 0 {
				// A test's finalizer: drop it, the node is going away.
				_, _ = n.Client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, "application/merge-patch+json", []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
			}
		}
		return len(l.Items) == 0, nil
	})
}

// Exec runs argv in a container of a Pod through pods/exec (kube-apiserver,
// then the kubelet, then containerd's stream server) and returns its
// output. A non-zero exit is an error carrying the code
// (k8s.io/client-go/util/exec.CodeExitError).
func (e *Env) Exec(ctx context.Context, namespace, pod, container string, argv ...string) (stdout, stderr string, err error) {
	req := e.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace(namespace).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: container, Command: argv, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ex, err := remotecommand.NewSPDYExecutor(e.Config, "POST", req.URL())
	if err != nil {
		return "", "", err
	}
	var o, se bytes.Buffer
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &o, Stderr: &se})
	return o.String(), se.String(), err
}

// WaitPodRunning waits until the Pod is Running with every container ready
// and returns it; a Pod that ends (Succeeded or Failed) is an error.
func (e *Env) WaitPodRunning(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	var last *corev1.Pod
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		p, err := e.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = p
		switch p.Status.Phase {
		case corev1.PodSucceeded, corev1.PodFailed:
			return false, fmt.Errorf("pod %s/%s ended: %s", namespace, name, p.Status.Phase)
		case corev1.PodRunning:
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil && last != nil {
		return last, fmt.Errorf("%w; status %+v", err, last.Status)
	}
	return last, err
}
