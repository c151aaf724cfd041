package kubernetes_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	nodev1 "k8s.io/api/node/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/kubernetes"
	"github.com/sandboxwich/sandboxwich/internal/k8stest"
	"github.com/sandboxwich/sandboxwich/lease"
)

// TestRBAC runs the driver as the ServiceAccount of
// deploy/kubernetes/rbac.yaml, holding exactly that file's Role, in a
// namespace that enforces the "restricted" Pod Security Standard: the
// manifest grants enough, and the cells' Pods pass the standard.
func TestRBAC(t *testing.T) {
	t.Parallel()
	env := k8stest.Shared(t)
	ns := env.Namespace(t)
	ctx := ctxT(t, 2*time.Minute)

	nsObj, err := env.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nsObj.Labels["pod-security.kubernetes.io/enforce"] = "restricted"
	if _, err := env.Client.CoreV1().Namespaces().Update(ctx, nsObj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	role, binding := rbacManifest(t)
	role.Namespace, binding.Namespace = ns, ns
	if _, err := env.Client.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.RbacV1().RoleBindings(ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sa := binding.Subjects[0]
	cfg, err := env.UserConfig("system:serviceaccount:"+sa.Namespace+":"+sa.Name,
		"system:serviceaccounts", "system:serviceaccounts:"+sa.Namespace, "system:authenticated")
	if err != nil {
		t.Fatal(err)
	}
	asSA, err := k8s.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The identity is what the binding names, and it has nothing beyond
	// the Role: not in another namespace, not cluster-wide, no verb the
	// Role does not name.
	other := env.Namespace(t)
	if _, err := asSA.CoreV1().Secrets(other).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("listing secrets of another namespace as the service account: %v, want Forbidden", err)
	}
	if _, err := asSA.CoreV1().Pods(other).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("listing pods of another namespace: %v, want Forbidden", err)
	}
	if _, err := asSA.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("listing configmaps: %v, want Forbidden", err)
	}
	if _, err := asSA.CoreV1().Services(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("listing services: %v, want Forbidden", err)
	}
	if _, err := asSA.CoreV1().Secrets(ns).Watch(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("watching secrets: %v, want Forbidden", err)
	}
	if _, err := asSA.CoreV1().Secrets(ns).Patch(ctx, "any", "application/merge-patch+json", []byte(`{}`), metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("patching a secret: %v, want Forbidden", err)
	}
	wantRules := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"create", "get", "list", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"pods/exec"}, Verbs: []string{"create", "get"}},
		{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: []string{"create", "get"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create", "get", "list", "delete"}},
	}
	if fmt.Sprint(role.Rules) != fmt.Sprint(wantRules) {
		t.Fatalf("the Role grants %+v, want exactly %+v", role.Rules, wantRules)
	}

	p := newProvider(t, env, ns, "rbac", func(c *kubernetes.Config) { c.RESTConfig = cfg })
	req := provisionReq(lease.KataMicroVM)
	obj, err := p.Provision(ctx, req)
	if err != nil {
		t.Fatalf("Provision under the manifest's RBAC: %v", err)
	}
	o, err := p.Inspect(ctx, obj)
	if err != nil || driver.Verify(obj, o, lease.KataMicroVM) != nil {
		t.Fatalf("Inspect under the manifest's RBAC: %+v, %v", o, err)
	}
	if objs, err := p.List(ctx); err != nil || len(objs) != 1 {
		t.Fatalf("List under the manifest's RBAC: %+v, %v", objs, err)
	}
	// pods/exec is authorized; it then fails only because kwok's node has
	// no kubelet to stream from (the API server dials 127.0.0.1).
	short := ctxT(t, 30*time.Second)
	_, err = p.Exec(short, obj, driver.ExecRequest{Argv: []string{"true"}, Timeout: 10 * time.Second})
	if err == nil {
		t.Fatal("Exec succeeded with no kubelet behind the node")
	}
	if apierrors.IsForbidden(err) || strings.Contains(err.Error(), "forbidden") {
		t.Fatalf("Exec is not authorized by the manifest's Role: %v", err)
	}
	t.Logf("exec without a kubelet fails as expected: %v", err)
	if err := p.Destroy(ctx, obj); err != nil {
		t.Fatalf("Destroy under the manifest's RBAC: %v", err)
	}
	requireNoPods(t, env, ns)

	// With the agent: the cell's Secrets are created, read back by a
	// restarted driver, listed and deleted under the same Role, and the
	// Pod with its init container passes the restricted standard.
	pa := newProvider(t, env, ns, "rbac-agent", withAgent(0), func(c *kubernetes.Config) { c.RESTConfig = cfg })
	objA, err := pa.Provision(ctx, provisionReq(lease.GVisorLowerRisk))
	if err != nil {
		t.Fatalf("Provision with the agent under the manifest's RBAC: %v", err)
	}
	if _, err := pa.Provision(ctx, driver.ProvisionRequest{CellID: objA.CellID, RuntimeClass: lease.GVisorLowerRisk}); err != nil {
		t.Fatalf("a retried Provision (adopting the secrets) under the manifest's RBAC: %v", err)
	}
	updateStatus(ctx, t, env, ns, kubernetes.PodName(objA.CellID), func(pod *corev1.Pod) { pod.Status.PodIP = "127.0.0.1" })
	restarted := newProvider(t, env, ns, "rbac-agent", withAgent(0), func(c *kubernetes.Config) { c.RESTConfig = cfg })
	if _, err := restarted.Driver().(driver.AgentHost).Agent(ctx, objA); err != nil {
		t.Fatalf("reading the control secret back under the manifest's RBAC: %v", err)
	}
	if objs, err := pa.List(ctx); err != nil || len(objs) != 1 {
		t.Fatalf("List with the agent under the manifest's RBAC: %+v, %v", objs, err)
	}
	if err := pa.Destroy(ctx, objA); err != nil {
		t.Fatalf("Destroy with the agent under the manifest's RBAC: %v", err)
	}
	requireSecretsGone(ctx, t, env, ns, objA.CellID)
	requireNoPods(t, env, ns)

	// The Role grants nothing that Pod Security would let a Pod abuse: a
	// privileged Pod is refused in this namespace even for an admin.
	priv := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "privileged"},
		Spec: corev1.PodSpec{RuntimeClassName: ptr("gvisor"), Containers: []corev1.Container{{
			Name: "c", Image: testImage, SecurityContext: &corev1.SecurityContext{Privileged: ptr(true)},
		}}},
	}
	if _, err := env.Client.CoreV1().Pods(ns).Create(ctx, priv, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("privileged pod in a restricted namespace: %v, want Forbidden", err)
	}
}

// rbacManifest reads the Role and RoleBinding of deploy/kubernetes/rbac.yaml.
func rbacManifest(t *testing.T) (*rbacv1.Role, *rbacv1.RoleBinding) {
	t.Helper()
	b, err := os.ReadFile("../../deploy/kubernetes/rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var role *rbacv1.Role
	var binding *rbacv1.RoleBinding
	for _, doc := range bytes.Split(b, []byte("\n---\n")) {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatal(err)
		}
		switch meta.Kind {
		case "Role":
			role = new(rbacv1.Role)
			err = yaml.UnmarshalStrict(doc, role)
		case "RoleBinding":
			binding = new(rbacv1.RoleBinding)
			err = yaml.UnmarshalStrict(doc, binding)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if role == nil || binding == nil || len(binding.Subjects) != 1 || binding.RoleRef.Name != role.Name {
		t.Fatal(errors.New("rbac.yaml must hold one Role and one RoleBinding of it to one subject"))
	}
	return role, binding
}

func ptr[T any](v T) *T { return &v }

// manifestDocs reads the YAML documents of a deploy/kubernetes file.
func manifestDocs(t *testing.T, name string) [][]byte {
	t.Helper()
	b, err := os.ReadFile("../../deploy/kubernetes/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Split(b, []byte("\n---\n"))
}

// TestDeployManifests: the NetworkPolicy admits only the agent port, only
// from the server's Pods, into the cells' Pods, and the API server accepts
// it; the RuntimeClasses name the handlers; the supervisor Pod runs outside
// the cells' namespace and any RuntimeClass, without API credentials, its
// attestation on stdin, and passes the restricted Pod Security Standard.
func TestDeployManifests(t *testing.T) {
	t.Parallel()
	env := k8stest.Shared(t)
	ctx := ctxT(t, time.Minute)

	docs := manifestDocs(t, "networkpolicy.yaml")
	var np networkingv1.NetworkPolicy
	if len(docs) != 1 || yaml.UnmarshalStrict(docs[0], &np) != nil {
		t.Fatalf("networkpolicy.yaml must hold one NetworkPolicy")
	}
	if np.Namespace != "sandboxwich-cells" || np.Spec.PodSelector.MatchLabels[kubernetes.LabelManagedBy] != kubernetes.ManagedByValue ||
		len(np.Spec.PolicyTypes) != 1 || np.Spec.PolicyTypes[0] != networkingv1.PolicyTypeIngress || len(np.Spec.Egress) != 0 || len(np.Spec.Ingress) != 1 {
		t.Fatalf("network policy %+v", np.Spec)
	}
	in := np.Spec.Ingress[0]
	if len(in.Ports) != 1 || in.Ports[0].Port.IntValue() != kubernetes.DefaultAgentPort || *in.Ports[0].Protocol != corev1.ProtocolTCP {
		t.Errorf("ports %+v, want only TCP %d", in.Ports, kubernetes.DefaultAgentPort)
	}
	if len(in.From) != 1 || in.From[0].IPBlock != nil || in.From[0].PodSelector == nil || in.From[0].NamespaceSelector == nil ||
		in.From[0].PodSelector.MatchLabels["app.kubernetes.io/name"] != "sandboxwich" ||
		in.From[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "sandboxwich" {
		t.Errorf("from %+v, want only the server's Pods of namespace sandboxwich", in.From)
	}
	ns := env.Namespace(t)
	np.Namespace = ns
	if _, err := env.Client.NetworkingV1().NetworkPolicies(ns).Create(ctx, &np, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the API server refuses networkpolicy.yaml: %v", err)
	}

	handlers := map[string]string{}
	for _, doc := range manifestDocs(t, "runtimeclass.yaml") {
		var rc nodev1.RuntimeClass
		if err := yaml.UnmarshalStrict(doc, &rc); err != nil {
			t.Fatal(err)
		}
		handlers[rc.Name] = rc.Handler
	}
	if len(handlers) != 2 || handlers["gvisor"] != "runsc" || handlers["kata"] != "kata" {
		t.Errorf("runtime classes %v", handlers)
	}

	docs = manifestDocs(t, "supervisor.yaml")
	var pod corev1.Pod
	if len(docs) != 1 || yaml.UnmarshalStrict(docs[0], &pod) != nil {
		t.Fatal("supervisor.yaml must hold one Pod")
	}
	s := pod.Spec
	c := s.Containers[0]
	args := strings.Join(c.Args, " ")
	switch {
	case pod.Namespace == "sandboxwich-cells" || s.RuntimeClassName != nil:
		t.Errorf("the supervisor runs in %q under runtime class %v", pod.Namespace, s.RuntimeClassName)
	case s.AutomountServiceAccountToken == nil || *s.AutomountServiceAccountToken:
		t.Error("the supervisor mounts a service-account token")
	case len(c.Env) > 0 || len(c.EnvFrom) > 0:
		t.Errorf("the supervisor has env %v %v", c.Env, c.EnvFrom)
	case !c.Stdin || !c.StdinOnce || !strings.HasPrefix(args, "supervise ") || !strings.Contains(args, "--attestation-file=- ") || !strings.Contains(args, "--token-file="):
		t.Errorf("the supervisor's args %q (stdin %v)", args, c.Stdin)
	}
	// Restricted Pod Security admits it.
	nsObj, err := env.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nsObj.Labels["pod-security.kubernetes.io/enforce"] = "restricted"
	if _, err := env.Client.CoreV1().Namespaces().Update(ctx, nsObj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod.Namespace, pod.Name = ns, "supervise"
	if _, err := env.Client.CoreV1().Pods(ns).Create(ctx, &pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Fatalf("the supervisor Pod in a restricted namespace: %v", err)
	}
}
