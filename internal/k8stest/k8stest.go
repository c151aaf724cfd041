// Package k8stest runs a real Kubernetes control plane for tests: etcd and
// kube-apiserver through controller-runtime's envtest, plus kwok, which
// plays the kubelet of a fake node (Pods with that nodeName become Running
// and ready, and graceful deletions are finalized) without running any
// container.
//
// The binaries come from KUBEBUILDER_ASSETS, or else from the cache that
// scripts/k8s-binaries.sh fills (it builds them from Go modules). When they
// are missing a test is skipped locally and fails under CI=true: CI must
// never count a Kubernetes test as passed without running it.
//
// A package shares one control plane through Shared and Main:
//
//	func TestMain(m *testing.M) { os.Exit(k8stest.Main(m)) }
//
//	func TestX(t *testing.T) {
//		env := k8stest.Shared(t)
//		ns := env.Namespace(t)
//		…
//	}
//
// A test that disturbs the control plane (RestartAPIServer) starts its own
// with Start.
//
// A real node (SharedNode, StartNode; see node.go) adds containerd 2.x and
// a kubelet to a control plane of its own: Pods run as real containers
// under the RuntimeClasses gvisor (runsc) and runc, from images imported
// into containerd or pulled from a loopback Registry. One real node runs
// per host at a time (a host-wide lock), and its teardown puts the host
// back as it found it.
package k8stest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/sandboxwich/sandboxwich/internal/testenv"
)

// Versions of the binaries scripts/k8s-binaries.sh builds; keep in step
// with that script.
const (
	KubernetesVersion = "v1.37.2"
	EtcdVersion       = "v3.6.16"
	KwokVersion       = "v0.8.0"
)

// RuntimeClass objects every control plane has, by name, with their
// handlers. A Pod naming a RuntimeClass that does not exist is refused at
// admission.
var RuntimeClasses = map[string]string{"gvisor": "runsc", "kata": "kata", "runc": "runc"}

// NodeName is the kwok node of every control plane started with kwok.
const NodeName = "kwok-node-0"

// EnvAssets is the variable naming a folder that holds etcd,
// kube-apiserver and kwok.
const EnvAssets = "KUBEBUILDER_ASSETS"

// Options tune Start.
type Options struct {
	// NoKwok starts no kwok: Pods stay Pending, and a Pod with a nodeName
	// stays Terminating after deletion until something finalizes it.
	NoKwok bool

	// realNode configures the API server for a real kubelet (StartNode).
	realNode bool
}

// Env is a running control plane.
type Env struct {
	// Config reaches the API server as a cluster admin (system:masters).
	Config *rest.Config
	// Client is a clientset for Config.
	Client kubernetes.Interface
	// BinDir holds the binaries.
	BinDir string
	// NodeName is the kwok node Pods can be bound to ("" without kwok).
	NodeName string

	te     *envtest.Environment
	dir    string
	kwok   *exec.Cmd
	kwokCh chan struct{}
	mu     sync.Mutex
}

// BinDir returns the folder holding etcd, kube-apiserver and kwok: $KUBEBUILDER_ASSETS,
// or the folder scripts/k8s-binaries.sh built for this Go version (any Go
// version when this one has none).
func BinDir() (string, error) {
	if d := os.Getenv(EnvAssets); d != "" {
		for _, b := range []string{"etcd", "kube-apiserver"} {
			if _, err := os.Stat(filepath.Join(d, b)); err != nil {
				return "", fmt.Errorf("%s=%s: %w", EnvAssets, d, err)
			}
		}
		return d, nil
	}
	root := os.Getenv("SANDBOXWICH_K8S_CACHE")
	if root == "" {
		base := os.Getenv("XDG_CACHE_HOME")
		if base == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				return "", err
			}
			base = filepath.Join(home, ".cache")
		}
		root = filepath.Join(base, "sandboxwich-k8s")
	}
	prefix := fmt.Sprintf("k8s-%s_etcd-%s_kwok-%s_", KubernetesVersion, EtcdVersion, KwokVersion)
	want := filepath.Join(root, prefix+runtime.Version())
	if _, err := os.Stat(filepath.Join(want, ".complete")); err == nil {
		return want, nil
	}
	found, _ := filepath.Glob(filepath.Join(root, prefix+"*", ".complete"))
	if len(found) > 0 {
		slices.Sort(found)
		return filepath.Dir(found[len(found)-1]), nil
	}
	return "", fmt.Errorf("no Kubernetes test binaries: set %s or run `bash scripts/k8s-binaries.sh` (looked in %s)", EnvAssets, want)
}

// binDirOrSkip returns BinDir, skipping tb locally and failing it under
// CI=true when the binaries are missing.
func binDirOrSkip(tb testing.TB) string {
	tb.Helper()
	d, err := BinDir()
	testenv.Need(tb, "Kubernetes test binaries", err)
	return d
}

var shared struct {
	once sync.Once
	env  *Env
	err  error
}

// Shared returns the package's shared control plane (with kwok), starting
// it on first use. Main stops it.
func Shared(tb testing.TB) *Env {
	tb.Helper()
	dir := binDirOrSkip(tb)
	shared.once.Do(func() { shared.env, shared.err = start(dir, Options{}) })
	if shared.err != nil {
		tb.Fatalf("k8stest: starting the shared control plane: %v", shared.err)
	}
	return shared.env
}

// Main runs the tests and then stops the shared control plane, if one was
// started. Use it from TestMain.
func Main(m *testing.M) int {
	code := m.Run()
	if sharedNode.node != nil {
		if err := sharedNode.node.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "k8stest: stopping the shared real node:", err)
			if code == 0 {
				code = 1
			}
		}
	}
	if shared.env != nil {
		if err := shared.env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "k8stest: stopping the shared control plane:", err)
		}
	}
	return code
}

// Start starts a control plane of the test's own and stops it at cleanup.
func Start(tb testing.TB, opt Options) *Env {
	tb.Helper()
	dir := binDirOrSkip(tb)
	e, err := start(dir, opt)
	if err != nil {
		tb.Fatalf("k8stest: starting a control plane: %v", err)
	}
	tb.Cleanup(func() {
		if err := e.Stop(); err != nil {
			tb.Errorf("k8stest: stopping the control plane: %v", err)
		}
	})
	return e
}

func start(binDir string, opt Options) (_ *Env, err error) {
	begin := time.Now()
	dir, err := os.MkdirTemp("", "k8stest-")
	if err != nil {
		return nil, err
	}
	certDir := filepath.Join(dir, "apiserver")
	if err := os.Mkdir(certDir, 0o700); err != nil {
		return nil, err
	}
	// The certificate folder is ours, so envtest keeps it (and the
	// serving and client CAs) across RestartAPIServer.
	api := &envtest.APIServer{CertDir: certDir}
	args := api.Configure()
	// A loopback-only host: no interface to advertise, no endpoint
	// reconciliation for the kubernetes Service.
	args.Set("advertise-address", "127.0.0.1")
	args.Set("endpoint-reconciler-type", "none")
	// On SIGTERM, end watches (kwok holds some) within a second instead of
	// waiting up to a minute for them: StopAPIServer stays quick.
	args.Set("shutdown-watch-termination-grace-period", "1s")
	if opt.realNode {
		// pods/exec dials the node's Hostname address, RealNodeName
		// (127.0.0.1): the kubelet refuses a loopback InternalIP.
		args.Set("kubelet-preferred-address-types", "Hostname")
	}
	te := &envtest.Environment{
		BinaryAssetsDirectory:    binDir,
		ControlPlaneStartTimeout: 3 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
		ControlPlane:             envtest.ControlPlane{APIServer: api},
	}
	if os.Getenv("K8STEST_VERBOSE") != "" {
		te.AttachControlPlaneOutput = true
	}
	cfg, err := te.Start()
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("envtest: %w", err)
	}
	e := &Env{Config: cfg, BinDir: binDir, te: te, dir: dir}
	defer func() {
		if err != nil {
			_ = e.Stop()
		}
	}()
	if e.Client, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for name, handler := range RuntimeClasses {
		rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Handler: handler}
		if _, err := e.Client.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("runtime class %s: %w", name, err)
		}
	}
	if !opt.NoKwok {
		if err := e.startKwok(ctx); err != nil {
			return nil, err
		}
	}
	fmt.Fprintf(os.Stderr, "k8stest: control plane up in %v (kube-apiserver %s, kwok %v)\n",
		time.Since(begin).Round(time.Millisecond), KubernetesVersion, !opt.NoKwok)
	return e, nil
}

// startKwok starts kwok against the API server and registers a fake node
// it manages, waiting until the node is Ready.
func (e *Env) startKwok(ctx context.Context) error {
	bin := filepath.Join(e.BinDir, "kwok")
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("kwok: %w (scripts/k8s-binaries.sh builds it)", err)
	}
	user, err := e.te.AddUser(envtest.User{Name: "kwok", Groups: []string{"system:masters"}}, &rest.Config{QPS: 1000, Burst: 2000})
	if err != nil {
		return err
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return err
	}
	home := filepath.Join(e.dir, "kwok-home")
	kubeconfig := filepath.Join(e.dir, "kwok.kubeconfig")
	if err := os.MkdirAll(home, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(kubeconfig, kc, 0o600); err != nil {
		return err
	}
	logf, err := os.Create(filepath.Join(e.dir, "kwok.log"))
	if err != nil {
		return err
	}
	stages := filepath.Join(e.BinDir, "kwok-stages.yaml")
	if _, err := os.Stat(stages); err != nil {
		return fmt.Errorf("kwok stages: %w (scripts/k8s-binaries.sh writes them beside the binaries)", err)
	}
	cmd := exec.Command(bin,
		"--config="+stages,
		"--kubeconfig="+kubeconfig,
		"--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
		// Every address kwok reports stays on loopback: the API server
		// dials the node's InternalIP for pods/exec, and fake Pod IPs
		// must never name another host.
		"--node-ip=127.0.0.1",
		"--cidr=127.10.0.0/16",
	)
	// kwok keeps its state under the home folder: not the user's.
	cmd.Env = append(os.Environ(), "HOME="+home, "KWOK_WORKDIR="+home)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("kwok: %w", err)
	}
	e.kwok, e.kwokCh = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(e.kwokCh) }()

	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:        NodeName,
		Annotations: map[string]string{"kwok.x-k8s.io/node": "fake"},
		Labels:      map[string]string{"type": "kwok", "kubernetes.io/hostname": NodeName},
	}}
	if _, err := e.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("kwok node: %w", err)
	}
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		select {
		case <-e.kwokCh:
			return false, errors.New("kwok exited")
		default:
		}
		return nodeReady(ctx, e.Client, NodeName), nil
	})
	if err != nil {
		return fmt.Errorf("kwok node not ready: %w; kwok log:\n%s", err, e.KwokLog())
	}
	e.NodeName = NodeName
	return nil
}

// KwokLog returns the end of kwok's log, for failure messages.
func (e *Env) KwokLog() string {
	b, _ := os.ReadFile(filepath.Join(e.dir, "kwok.log"))
	if len(b) > 8000 {
		b = b[len(b)-8000:]
	}
	return string(b)
}

// Stop stops kwok and the control plane and removes their files.
func (e *Env) Stop() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	var errs []error
	if e.kwok != nil && e.kwok.Process != nil {
		_ = syscall.Kill(-e.kwok.Process.Pid, syscall.SIGTERM)
		select {
		case <-e.kwokCh:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-e.kwok.Process.Pid, syscall.SIGKILL)
			<-e.kwokCh
		}
		e.kwok = nil
	}
	if e.te != nil {
		errs = append(errs, e.te.Stop())
		e.te = nil
	}
	if e.dir != "" {
		errs = append(errs, os.RemoveAll(e.dir))
		e.dir = ""
	}
	return errors.Join(errs...)
}

// StopAPIServer stops kube-apiserver, leaving etcd and kwok running; the
// server's address, certificates and users stay valid for StartAPIServer.
func (e *Env) StopAPIServer() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.te.ControlPlane.GetAPIServer().Stop()
}

// StartAPIServer starts kube-apiserver again after StopAPIServer, on the
// same address with the same certificates, and waits until it serves.
func (e *Env) StartAPIServer() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.te.ControlPlane.GetAPIServer().Start(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		_, err := e.Client.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
}

// RestartAPIServer stops and starts kube-apiserver.
func (e *Env) RestartAPIServer() error {
	if err := e.StopAPIServer(); err != nil {
		return err
	}
	return e.StartAPIServer()
}

// Namespace creates a namespace with a unique name for the test. It is
// not deleted: without a controller-manager a deleted namespace would stay
// Terminating forever, and the control plane goes away with the package.
func (e *Env) Namespace(tb testing.TB) string {
	tb.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := strings.ToLower(strings.Trim(strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, tb.Name()), "-"))
	if len(name) > 40 {
		name = name[:40]
	}
	name = strings.Trim(name, "-") + "-" + hex.EncodeToString(b)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := e.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		tb.Fatalf("k8stest: namespace %s: %v", name, err)
	}
	return name
}

// UserConfig returns a rest.Config that authenticates as the named user
// (with the groups given) by client certificate, for RBAC tests. A
// ServiceAccount is the user "system:serviceaccount:<namespace>:<name>"
// in the groups "system:serviceaccounts" and
// "system:serviceaccounts:<namespace>".
func (e *Env) UserConfig(name string, groups ...string) (*rest.Config, error) {
	u, err := e.te.AddUser(envtest.User{Name: name, Groups: groups}, &rest.Config{QPS: 1000, Burst: 2000})
	if err != nil {
		return nil, err
	}
	return u.Config(), nil
}

// Pods lists the Pods of a namespace, for leak checks.
func (e *Env) Pods(ctx context.Context, namespace string) ([]corev1.Pod, error) {
	l, err := e.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

// WaitPodGone waits until the Pod is absent (or has another UID).
func (e *Env) WaitPodGone(ctx context.Context, namespace, name string, uid string) error {
	return wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		p, err := e.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return err == nil && string(p.UID) != uid, nil
	})
}

// nodeReady reports whether the node named name has condition Ready; an
// error reading it (the API server starting) counts as not ready yet.
func nodeReady(ctx context.Context, c kubernetes.Interface, name string) bool {
	n, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return false
	}
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}
