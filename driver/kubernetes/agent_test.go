package kubernetes_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/agent/cellagent"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/kubernetes"
	"github.com/sandboxwich/sandboxwich/internal/k8stest"
	"github.com/sandboxwich/sandboxwich/lease"
)

// testAgentImage is the agent image the agent tests pin; kwok never pulls
// it.
const testAgentImage = "registry.invalid/sandboxwich/agent@sha256:fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"

var testAgentDigest = testAgentImage[strings.LastIndexByte(testAgentImage, '@')+1:]

func withAgent(port int) func(*kubernetes.Config) {
	return func(c *kubernetes.Config) { c.AgentImage, c.AgentPort = testAgentImage, port }
}

func getSecret(ctx context.Context, t testing.TB, env *k8stest.Env, ns, name string) *corev1.Secret {
	t.Helper()
	s, err := env.Client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("secret %s: %v", name, err)
	}
	return s
}

func requireSecretsGone(ctx context.Context, t testing.TB, env *k8stest.Env, ns string, cellID uuid.UUID) {
	t.Helper()
	for _, name := range []string{kubernetes.AgentSecretName(cellID), kubernetes.ControlSecretName(cellID)} {
		if _, err := env.Client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("secret %s after Destroy: %v, want NotFound", name, err)
		}
	}
}

// setInitImageID writes the agent init container's imageID, as a kubelet
// would after running it (kwok sets none).
func setInitImageID(ctx context.Context, t testing.TB, env *k8stest.Env, ns, name, imageID string) {
	t.Helper()
	updateStatus(ctx, t, env, ns, name, func(pod *corev1.Pod) {
		for i := range pod.Status.InitContainerStatuses {
			if pod.Status.InitContainerStatuses[i].Name == kubernetes.AgentInitContainerName {
				pod.Status.InitContainerStatuses[i].ImageID = imageID
				return
			}
		}
		pod.Status.InitContainerStatuses = append(pod.Status.InitContainerStatuses, corev1.ContainerStatus{
			Name: kubernetes.AgentInitContainerName, Image: testAgentImage, ImageID: imageID,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Completed"}}})
	})
}

func updateStatus(ctx context.Context, t testing.TB, env *k8stest.Env, ns, name string, edit func(*corev1.Pod)) {
	t.Helper()
	for {
		pod, err := env.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		edit(pod)
		_, err = env.Client.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
		if err == nil {
			return
		}
		if !apierrors.IsConflict(err) {
			t.Fatal(err)
		}
	}
}

// TestAgentConfig: the agent image must be pinned, the port a port, the
// cell's user the agent's; settings carry both keys; without an agent
// image the plane gets a Provider without the agent.
func TestAgentConfig(t *testing.T) {
	env := k8stest.Shared(t)
	base := func(edit func(*kubernetes.Config)) error {
		cfg := kubernetes.Config{RESTConfig: env.Config, Namespace: "ns", Pool: "p", Installation: testInstallation,
			RuntimeClassNames: classNames, Image: testImage}
		edit(&cfg)
		_, err := kubernetes.New(cfg)
		return err
	}
	for name, edit := range map[string]func(*kubernetes.Config){
		"a tag":          func(c *kubernetes.Config) { c.AgentImage = "registry.invalid/agent:v1" },
		"port 70000":     func(c *kubernetes.Config) { c.AgentImage, c.AgentPort = testAgentImage, 70000 },
		"another uid":    func(c *kubernetes.Config) { c.AgentImage, c.RunAsUser = testAgentImage, 65532 },
		"negative port":  func(c *kubernetes.Config) { c.AgentImage, c.AgentPort = testAgentImage, -1 },
		"digest garbage": func(c *kubernetes.Config) { c.AgentImage = "registry.invalid/agent@sha256:xyz" },
	} {
		if err := base(edit); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	p := newProvider(t, env, "ns", "p")
	if _, ok := p.Driver().(driver.AgentHost); ok {
		t.Error("without agent_image the driver is an AgentHost")
	}
	if _, ok := newProvider(t, env, "ns", "p", withAgent(0)).Driver().(driver.AgentHost); !ok {
		t.Error("with agent_image the driver is no AgentHost")
	}
	kc := t.TempDir() + "/kubeconfig"
	if err := os.WriteFile(kc, []byte("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\n"+
		"users:\n- name: u\n  user: {}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := map[string]string{"kubeconfig": kc, "namespace": "ns", "image": testImage, "runtime_class_gvisor_lower_risk": "gvisor",
		"agent_image": testAgentImage, "agent_port": "9443"}
	cfg, err := kubernetes.ConfigFromSettings("p", s)
	if err != nil || cfg.AgentImage != testAgentImage || cfg.AgentPort != 9443 {
		t.Fatalf("settings: %+v %v", cfg, err)
	}
	s["agent_port"] = "http"
	if _, err := kubernetes.ConfigFromSettings("p", s); err == nil || !strings.Contains(err.Error(), "agent_port") {
		t.Fatalf("a bad agent_port: %v", err)
	}
}

// TestAgentPodSpec: with the agent, the Pod runs the agent from a
// digest-pinned init container as the cell container's entrypoint, mounts
// the agent Secret (server leaf and CA certificate only) and the agent
// binary read-only, mounts the control Secret nowhere, and carries no
// credential in an env or an argument. The agent digest is read back from
// the init container's imageID, never from the request.
func TestAgentPodSpec(t *testing.T) {
	t.Parallel()
	env := k8stest.Shared(t)
	ns := env.Namespace(t)
	ctx := ctxT(t, 2*time.Minute)
	p := newProvider(t, env, ns, "agent-spec", withAgent(0))
	obj, err := p.Provision(ctx, provisionReq(lease.GVisorLowerRisk))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Destroy(context.Background(), obj) })
	pod, err := env.Client.CoreV1().Pods(ns).Get(ctx, kubernetes.PodName(obj.CellID), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	agentSecret := getSecret(ctx, t, env, ns, kubernetes.AgentSecretName(obj.CellID))
	control := getSecret(ctx, t, env, ns, kubernetes.ControlSecretName(obj.CellID))
	for _, s := range []*corev1.Secret{agentSecret, control} {
		if s.Immutable == nil || !*s.Immutable {
			t.Errorf("secret %s is not immutable", s.Name)
		}
		if s.Labels[kubernetes.LabelPool] != "agent-spec" || s.Labels[kubernetes.LabelCellID] != obj.CellID.String() ||
			s.Labels[kubernetes.LabelInstallation] != testInstallation {
			t.Errorf("secret %s labels %v", s.Name, s.Labels)
		}
	}
	if _, ok := agentSecret.Data[kubernetes.SecretCAKey]; ok || len(agentSecret.Data) != 3 {
		t.Errorf("the mounted secret holds %d keys, the CA key among them: %v", len(agentSecret.Data), keys(agentSecret.Data))
	}
	if len(control.Data[kubernetes.SecretCAKey]) == 0 || !bytes.Equal(control.Data[kubernetes.SecretCACert], agentSecret.Data[kubernetes.SecretCACert]) {
		t.Error("the control secret lacks the CA key, or holds another CA")
	}

	s := pod.Spec
	if len(s.InitContainers) != 1 || s.InitContainers[0].Name != kubernetes.AgentInitContainerName || s.InitContainers[0].Image != testAgentImage {
		t.Fatalf("init containers %+v", s.InitContainers)
	}
	cell := s.Containers[0]
	args := strings.Join(cell.Command, " ")
	for _, want := range []string{"-listen tcp:0.0.0.0:" + strconv.Itoa(kubernetes.DefaultAgentPort), "-cell-id " + obj.CellID.String(), "-digest " + testAgentDigest, "-tls-client-ca "} {
		if !strings.Contains(args, want) {
			t.Errorf("the cell's command %q lacks %q", args, want)
		}
	}
	if *s.SecurityContext.RunAsUser != agent.CellUID {
		t.Errorf("runAsUser %d, want the cell user", *s.SecurityContext.RunAsUser)
	}
	secretVolumes := map[string]string{}
	for _, v := range s.Volumes {
		if v.Secret != nil {
			secretVolumes[v.Name] = v.Secret.SecretName
		}
		if v.Projected != nil || v.CSI != nil {
			t.Errorf("volume %s is projected or CSI", v.Name)
		}
	}
	if len(secretVolumes) != 1 || !containsValue(secretVolumes, kubernetes.AgentSecretName(obj.CellID)) {
		t.Errorf("secret volumes %v, want only the agent secret", secretVolumes)
	}
	for _, c := range append(s.InitContainers, s.Containers...) {
		if len(c.Env) > 0 || len(c.EnvFrom) > 0 {
			t.Errorf("container %s has env %v %v", c.Name, c.Env, c.EnvFrom)
		}
		for _, a := range append(c.Command, c.Args...) {
			for _, secret := range [][]byte{control.Data[kubernetes.SecretCAKey], control.Data[kubernetes.SecretTLSKey], agentSecret.Data[kubernetes.SecretTLSKey]} {
				if strings.Contains(a, "PRIVATE") || bytes.Contains(secret, []byte(a)) && len(a) > 16 {
					t.Errorf("container %s argument %q carries key material", c.Name, a)
				}
			}
		}
		for _, m := range c.VolumeMounts {
			if _, ok := secretVolumes[m.Name]; ok && !m.ReadOnly {
				t.Errorf("container %s mounts the secret volume %s writable", c.Name, m.Name)
			}
			if m.Name == "sbw-agent-bin" && c.Name == kubernetes.ContainerName && !m.ReadOnly {
				t.Error("the cell container mounts the agent binary writable")
			}
		}
	}

	// The agent digest: none until the kubelet reports the init
	// container's image, then what it reports.
	o, err := p.Inspect(ctx, obj)
	if err != nil || o.AgentDigest != "" {
		t.Fatalf("before an imageID: AgentDigest %q, %v", o.AgentDigest, err)
	}
	other := "sha256:" + strings.Repeat("7", 64)
	for _, tc := range []struct{ imageID, want string }{
		{testAgentImage, testAgentDigest},
		{"registry.invalid/sandboxwich/agent@" + other, other},
		{"sha256:" + strings.Repeat("4", 64), ""},
	} {
		setInitImageID(ctx, t, env, ns, pod.Name, tc.imageID)
		if o, err = p.Inspect(ctx, obj); err != nil || o.AgentDigest != tc.want {
			t.Errorf("imageID %q: AgentDigest %q, want %q (%v)", tc.imageID, o.AgentDigest, tc.want, err)
		}
		if err := driver.Verify(obj, o, lease.GVisorLowerRisk); err != nil {
			t.Errorf("imageID %q: %v", tc.imageID, err)
		}
	}
	if err := p.Destroy(ctx, obj); err != nil {
		t.Fatal(err)
	}
	requireSecretsGone(ctx, t, env, ns, obj.CellID)
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func containsValue(m map[string]string, v string) bool {
	for _, x := range m {
		if x == v {
			return true
		}
	}
	return false
}

// TestAgentSecretLifecycle: a retried Provision adopts the cell's CA
// (also when only the control Secret survived), Destroy deletes both
// Secrets and their absence is part of its proof, and List finds a cell
// whose Secrets outlived its Pod.
func TestAgentSecretLifecycle(t *testing.T) {
	t.Parallel()
	env := k8stest.Shared(t)
	ns := env.Namespace(t)
	ctx := ctxT(t, 3*time.Minute)
	p := newProvider(t, env, ns, "agent-life", withAgent(0))
	req := provisionReq(lease.GVisorLowerRisk)
	obj, err := p.Provision(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Destroy(context.Background(), driver.Object{CellID: req.CellID}) })
	ctlName, agName := kubernetes.ControlSecretName(req.CellID), kubernetes.AgentSecretName(req.CellID)
	ctl0, ag0 := getSecret(ctx, t, env, ns, ctlName), getSecret(ctx, t, env, ns, agName)

	// A lost answer: the same call again adopts everything.
	again, err := p.Provision(ctx, req)
	if err != nil || again != obj {
		t.Fatalf("retry: %+v %v, want %+v", again, err, obj)
	}
	if ctl, ag := getSecret(ctx, t, env, ns, ctlName), getSecret(ctx, t, env, ns, agName); ctl.UID != ctl0.UID || ag.UID != ag0.UID {
		t.Fatal("the retry replaced a secret")
	}

	// Only the control Secret left (the Pod and the agent Secret gone, as
	// after a crash between the two creations): the CA is adopted, the
	// agent's leaf issued again from its key.
	if err := env.Client.CoreV1().Pods(ns).Delete(ctx, kubernetes.PodName(req.CellID), deleteNow()); err != nil {
		t.Fatal(err)
	}
	if err := env.WaitPodGone(ctx, ns, kubernetes.PodName(req.CellID), obj.Identity); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.CoreV1().Secrets(ns).Delete(ctx, agName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	obj2, err := p.Provision(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	ctl, ag := getSecret(ctx, t, env, ns, ctlName), getSecret(ctx, t, env, ns, agName)
	if ctl.UID != ctl0.UID || !bytes.Equal(ag.Data[kubernetes.SecretCACert], ctl0.Data[kubernetes.SecretCACert]) {
		t.Fatal("the CA was not adopted")
	}
	if bytes.Equal(ag.Data[kubernetes.SecretTLSCert], ag0.Data[kubernetes.SecretTLSCert]) {
		t.Fatal("the agent leaf was not issued again")
	}
	block := ag.Data[kubernetes.SecretTLSCert]
	leaf, err := tls.X509KeyPair(block, ag.Data[kubernetes.SecretTLSKey])
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(leaf.Certificate[0])
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ctl0.Data[kubernetes.SecretCACert])
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil || cert.URIs[0].String() != agent.AgentURI(req.CellID.String()) {
		t.Fatalf("reissued agent leaf: %v %v", cert.URIs, err)
	}

	// A Secret whose deletion cannot be confirmed keeps Destroy uncertain.
	patch := []byte(`{"metadata":{"finalizers":["k8stest.sandboxwich.dev/hold"]}}`)
	if _, err := env.Client.CoreV1().Secrets(ns).Patch(ctx, ctlName, "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	err = p.Destroy(dctx, obj2)
	cancel()
	if !errors.Is(err, driver.ErrUncertain) {
		t.Fatalf("Destroy with a secret held: %v, want ErrUncertain", err)
	}
	if _, err := env.Client.CoreV1().Secrets(ns).Patch(ctx, ctlName, "application/merge-patch+json", []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := p.Destroy(ctx, obj2); err != nil {
		t.Fatal(err)
	}
	requireSecretsGone(ctx, t, env, ns, req.CellID)
	requireNoPods(t, env, ns)

	// Secrets that outlived their Pod are listed, and Destroy removes them.
	req2 := provisionReq(lease.GVisorLowerRisk)
	obj3, err := p.Provision(ctx, req2)
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Client.CoreV1().Pods(ns).Delete(ctx, kubernetes.PodName(req2.CellID), deleteNow()); err != nil {
		t.Fatal(err)
	}
	if err := env.WaitPodGone(ctx, ns, kubernetes.PodName(req2.CellID), obj3.Identity); err != nil {
		t.Fatal(err)
	}
	objs, err := p.List(ctx)
	if err != nil || len(objs) != 1 || objs[0] != (driver.Object{CellID: req2.CellID}) {
		t.Fatalf("List: %+v %v, want the cell of the secrets", objs, err)
	}
	if err := p.Destroy(ctx, objs[0]); err != nil {
		t.Fatal(err)
	}
	requireSecretsGone(ctx, t, env, ns, req2.CellID)
	if objs, err := p.List(ctx); err != nil || len(objs) != 0 {
		t.Fatalf("List after Destroy: %+v %v", objs, err)
	}
}

// TestAgentChannel: the plane reaches the cell's agent at the Pod's IP
// over TLS 1.3 with the cell's control leaf, read back from the API server
// (a restarted driver too), and verifies the agent by its leaf: exec goes
// through it. An agent serving another cell's leaf is refused. The agent
// here runs in the test process with the Secret's leaf (kwok runs no
// container); the real node's tests run it in the Pod.
func TestAgentChannel(t *testing.T) {
	t.Parallel()
	env := k8stest.Shared(t)
	ns := env.Namespace(t)
	ctx := ctxT(t, 2*time.Minute)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	p := newProvider(t, env, ns, "agent-chan", withAgent(port))
	obj, err := p.Provision(ctx, provisionReq(lease.GVisorLowerRisk))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Destroy(context.Background(), obj) })
	cellID := obj.CellID.String()
	s := getSecret(ctx, t, env, ns, kubernetes.AgentSecretName(obj.CellID))
	pki := &agent.CellPKI{CACert: s.Data[kubernetes.SecretCACert], ServerCert: s.Data[kubernetes.SecretTLSCert], ServerKey: s.Data[kubernetes.SecretTLSKey]}
	srvCfg, err := pki.ServerConfig(cellID)
	if err != nil {
		t.Fatal(err)
	}
	a, err := cellagent.New(cellagent.Config{CellID: cellID, Digest: testAgentDigest, Home: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Shutdown)
	srv := &http.Server{Handler: agent.NewHandler(a), ErrorLog: log.New(io.Discard, "", 0)}
	go srv.Serve(tls.NewListener(ln, srvCfg))
	t.Cleanup(func() { srv.Close() })
	updateStatus(ctx, t, env, ns, kubernetes.PodName(obj.CellID), func(pod *corev1.Pod) {
		pod.Status.PodIP, pod.Status.PodIPs = "127.0.0.1", []corev1.PodIP{{IP: "127.0.0.1"}}
	})

	host := p.Driver().(driver.AgentHost)
	conn, err := host.Agent(ctx, obj)
	if err != nil {
		t.Fatal(err)
	}
	st, err := conn.Status(ctx)
	if err != nil || st.CellID != cellID || st.State != agent.Waiting || st.Digest != testAgentDigest {
		t.Fatalf("status %+v %v", st, err)
	}
	f := agent.Fence{CellID: cellID, LeaseID: uuid.NewString(), Generation: 1}
	act := &agent.Activation{Version: agent.ProtocolVersion, Fence: f, ExpiresAt: time.Now().Add(time.Minute), TTLMillis: time.Minute.Milliseconds()}
	res, err := conn.Exec(ctx, agent.ExecRequest{Fence: f, Activation: act, Argv: []string{"echo", "through the agent"}, User: agent.UserRoot}, nil)
	if err != nil || res.ExitCode != 0 || string(res.Stdout) != "through the agent\n" {
		t.Fatalf("exec: %+v %v", res, err)
	}

	// A restarted plane: a new driver reads the control Secret back.
	p2 := newProvider(t, env, ns, "agent-chan", withAgent(port))
	conn2, err := p2.Driver().(driver.AgentHost).Agent(ctx, obj)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := conn2.Status(ctx); err != nil || st.State != agent.Active {
		t.Fatalf("status through a restarted driver: %+v %v", st, err)
	}

	// Another cell's agent on that address: refused by its leaf.
	other := provisionReq(lease.GVisorLowerRisk)
	otherPKI, err := agent.NewCellPKI(other.CellID.String(), time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ln2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	otherCfg, _ := otherPKI.ServerConfig(other.CellID.String())
	srv2 := &http.Server{Handler: agent.NewHandler(a), ErrorLog: log.New(io.Discard, "", 0)}
	go srv2.Serve(tls.NewListener(ln2, otherCfg))
	t.Cleanup(func() { srv2.Close() })
	p3 := newProvider(t, env, ns, "agent-chan", withAgent(ln2.Addr().(*net.TCPAddr).Port))
	conn3, err := p3.Driver().(driver.AgentHost).Agent(ctx, obj)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := conn3.Status(ctx); err == nil {
		t.Fatalf("an agent with another cell's leaf answered: %+v", st)
	}

	if err := p.Destroy(ctx, obj); err != nil {
		t.Fatal(err)
	}
	if _, err := host.Agent(ctx, obj); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("Agent after Destroy: %v, want ErrNotFound", err)
	}
	requireSecretsGone(ctx, t, env, ns, obj.CellID)
}

// TestAgentProvisionWaitsForAgent: through Driver, Provision returns only
// once the cell's agent answers; one that never does fails it within
// ReadyTimeout, and the pool's Destroy then removes Pod and Secrets.
func TestAgentProvisionWaitsForAgent(t *testing.T) {
	t.Parallel()
	env := k8stest.Shared(t)
	ns := env.Namespace(t)
	ctx := ctxT(t, time.Minute)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close() // nothing listens: the agent never answers
	p := newProvider(t, env, ns, "agent-wait", withAgent(port), func(c *kubernetes.Config) { c.ReadyTimeout = 2 * time.Second })
	req := provisionReq(lease.GVisorLowerRisk)
	obj, err := p.Driver().Provision(ctx, req)
	if err == nil || !strings.Contains(err.Error(), "agent did not answer") {
		t.Fatalf("Provision with no agent answering: %+v %v", obj, err)
	}
	if err := p.Driver().Destroy(ctx, driver.Object{CellID: req.CellID}); err != nil {
		t.Fatal(err)
	}
	requireNoPods(t, env, ns)
	requireSecretsGone(ctx, t, env, ns, req.CellID)
}

// TestAgentSecretsForeign: a Secret under a cell's name that lacks the
// pool's labels is neither adopted nor deleted (Destroy stays uncertain),
// and an agent Secret of another CA is never paired with the cell's
// control Secret.
func TestAgentSecretsForeign(t *testing.T) {
	t.Parallel()
	env := k8stest.Shared(t)
	ns := env.Namespace(t)
	ctx := ctxT(t, time.Minute)
	p := newProvider(t, env, ns, "agent-foreign", withAgent(0))
	secrets := env.Client.CoreV1().Secrets(ns)

	req := provisionReq(lease.GVisorLowerRisk)
	foreign := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: kubernetes.ControlSecretName(req.CellID)}, Data: map[string][]byte{"x": []byte("y")}}
	if _, err := secrets.Create(ctx, foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Provision(ctx, req); err == nil || !strings.Contains(err.Error(), "ownership labels") {
		t.Fatalf("Provision over a foreign control secret: %v", err)
	}
	if err := p.Destroy(ctx, driver.Object{CellID: req.CellID}); !errors.Is(err, driver.ErrUncertain) {
		t.Fatalf("Destroy with a foreign secret: %v, want ErrUncertain", err)
	}
	if _, err := secrets.Get(ctx, foreign.Name, metav1.GetOptions{}); err != nil {
		t.Fatalf("the foreign secret was deleted: %v", err)
	}

	req2 := provisionReq(lease.GVisorLowerRisk)
	otherCA, err := agent.NewCellPKI(req2.CellID.String(), time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{kubernetes.LabelManagedBy: kubernetes.ManagedByValue, kubernetes.LabelPool: "agent-foreign",
		kubernetes.LabelInstallation: testInstallation, kubernetes.LabelCellID: req2.CellID.String()}
	stale := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: kubernetes.AgentSecretName(req2.CellID), Labels: labels},
		Data: map[string][]byte{kubernetes.SecretCACert: otherCA.CACert, kubernetes.SecretTLSCert: otherCA.ServerCert, kubernetes.SecretTLSKey: otherCA.ServerKey}}
	if _, err := secrets.Create(ctx, stale, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Provision(ctx, req2); err == nil || !strings.Contains(err.Error(), "another CA") {
		t.Fatalf("Provision over an agent secret of another CA: %v", err)
	}
	if err := p.Destroy(ctx, driver.Object{CellID: req2.CellID}); err != nil {
		t.Fatal(err)
	}
	requireSecretsGone(ctx, t, env, ns, req2.CellID)
	requireNoPods(t, env, ns)
}
