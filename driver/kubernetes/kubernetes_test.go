package kubernetes_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/kubernetes"
	"github.com/sandboxwich/sandboxwich/internal/k8stest"
	"github.com/sandboxwich/sandboxwich/lease"
)

// TestHappyPath provisions a cell on the real API server and checks the
// admitted Pod, the NetworkPolicy, Inspect, List and a proven Destroy.
func TestHappyPath(t *testing.T) {
	t.Parallel()
	env := k8stest.Shared(t)
	ns := env.Namespace(t)
	p := newProvider(t, env, ns, "happy")
	ctx := ctxT(t, 2*time.Minute)

	for _, class := range []lease.RuntimeClass{lease.GVisorLowerRisk, lease.KataMicroVM} {
		req := provisionReq(class)
		obj, err := p.Provision(ctx, req)
		if err != nil {
			t.Fatalf("Provision(%s): %v", class, err)
		}
		pod, err := env.Client.CoreV1().Pods(ns).Get(ctx, kubernetes.PodName(req.CellID), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if string(pod.UID) != obj.Identity {
			t.Errorf("identity %q, pod uid %q", obj.Identity, pod.UID)
		}
		checkHardened(t, pod, classNames[class])
		for k, v := range map[string]string{
			kubernetes.LabelManagedBy: "sandboxwich", kubernetes.LabelPool: "happy", kubernetes.LabelInstallation: testInstallation,
			kubernetes.LabelCellID: req.CellID.String(), kubernetes.LabelRuntimeClass: string(class),
		} {
			if pod.Labels[k] != v {
				t.Errorf("label %s = %q, want %q", k, pod.Labels[k], v)
			}
		}
		o, err := p.Inspect(ctx, obj)
		if err != nil {
			t.Fatal(err)
		}
		if !o.Exists || !o.Ready || o.RuntimeClass != class || o.Identity != obj.Identity {
			t.Errorf("Inspect = %+v", o)
		}
		if err := driver.Verify(obj, o, class); err != nil {
			t.Errorf("Verify: %v", err)
		}
		// The other class is not what was admitted.
		other := lease.KataMicroVM
		if class == other {
			other = lease.GVisorLowerRisk
		}
		if driver.Verify(obj, o, other) == nil {
			t.Errorf("Verify accepts %s for a pod admitted as %s", other, class)
		}
		objs, err := p.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(objs, obj) {
			t.Errorf("List = %+v, want it to hold %+v", objs, obj)
		}
		if err := p.Destroy(ctx, obj); err != nil {
			t.Fatalf("Destroy: %v", err)
		}
		if o, err := p.Inspect(ctx, obj); err != nil || o.Exists {
			t.Fatalf("Inspect after Destroy: %+v, %v", o, err)
		}
	}

	np, err := env.Client.NetworkingV1().NetworkPolicies(ns).Get(ctx, kubernetes.NetworkPolicyName("happy"), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("deny-all network policy: %v", err)
	}
	if len(np.Spec.Ingress) != 0 || len(np.Spec.Egress) != 0 || len(np.Spec.PolicyTypes) != 2 ||
		np.Spec.PodSelector.MatchLabels[kubernetes.LabelPool] != "happy" {
		t.Errorf("network policy is not deny-all for the pool: %+v", np.Spec)
	}
	requireNoPods(t, env, ns)
}

// checkHardened checks the admitted Pod's isolation settings.
func checkHardened(t *testing.T, pod *corev1.Pod, rcName string) {
	t.Helper()
	s := pod.Spec
	if s.RuntimeClassName == nil || *s.RuntimeClassName != rcName {
		t.Errorf("runtimeClassName = %v, want %q", s.RuntimeClassName, rcName)
	}
	if s.AutomountServiceAccountToken == nil || *s.AutomountServiceAccountToken {
		t.Error("service-account token is mounted")
	}
	if s.EnableServiceLinks == nil || *s.EnableServiceLinks {
		t.Error("service links are enabled")
	}
	if s.HostNetwork || s.HostPID || s.HostIPC {
		t.Error("a host namespace is shared")
	}
	if s.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("restartPolicy = %s", s.RestartPolicy)
	}
	if sc := s.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot ||
		sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod security context = %+v", sc)
	}
	if len(s.Containers) != 1 {
		t.Fatalf("%d containers", len(s.Containers))
	}
	c := s.Containers[0]
	if c.Image != testImage {
		t.Errorf("image = %q", c.Image)
	}
	sc := c.SecurityContext
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
		sc.Privileged == nil || *sc.Privileged {
		t.Errorf("container security context = %+v", sc)
	}
	if c.Resources.Limits.Cpu().String() != kubernetes.DefaultCPU || c.Resources.Limits.Memory().String() != kubernetes.DefaultMemory {
		t.Errorf("limits = %v", c.Resources.Limits)
	}
}

// TestWebhookStripsRuntimeClass: a mutating admission webhook removes
// spec.runtimeClassName. The manifest said gvisor; the admitted Pod says
// nothing, so the cell is unverified, and it is torn down with proof.
func TestWebhookStripsRuntimeClass(t *testing.T) {
	t.Parallel()
	env := k8stest.Shared(t)
	ns := env.Namespace(t)
	wh := env.MutatingWebhook(t, ns, k8stest.StripRuntimeClass)
	p := newProvider(t, env, ns, "strip")
	ctx := ctxT(t, 2*time.Minute)

	req := provisionReq(lease.GVisorLowerRisk)
	obj, err := p.Provision(ctx, req)
	requireVerifyError(t, err, "admitted runtime class is none")
	if wh.Requests.Load() == 0 {
		t.Fatal("the webhook saw no pod")
	}
	if obj.Identity == "" {
		t.Fatal("Provision returned no identity for the pod it created")
	}
	pod, err := env.Client.CoreV1().Pods(ns).Get(ctx, kubernetes.PodName(req.CellID), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Spec.RuntimeClassName != nil {
		t.Fatalf("admitted runtimeClassName = %q; the webhook did not strip it", *pod.Spec.RuntimeClassName)
	}
	o, err := p.Inspect(ctx, obj)
	if err != nil {
		t.Fatal(err)
	}
	if !o.Exists || o.RuntimeClass != "" {
		t.Fatalf("Inspect = %+v, want an existing object with no runtime class", o)
	}
	requireVerifyError(t, driver.Verify(obj, o, lease.GVisorLowerRisk), "admitted runtime class is none")
	// Exec re-verifies too.
	if _, err := p.Exec(ctx, obj, driver.ExecRequest{Argv: []string{"true"}}); !errors.As(err, new(*driver.VerifyError)) {
		t.Errorf("Exec on an unverified pod: %v, want a *driver.VerifyError", err)
	}
	if err := p.Destroy(ctx, obj); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	requireNoPods(t, env, ns)
}

// TestWebhookChangesRuntimeClass: the webhook swaps the class for another
// one — configured (kata for a gvisor request) or not (runc).
func TestWebhookChangesRuntimeClass(t *testing.T) {
	t.Parallel()
	env := k8stest.Shared(t)
	for _, tc := range []struct {
		rcName string
		want   lease.RuntimeClass
		reason string
	}{
		{"kata", lease.KataMicroVM, "admitted runtime class is kata_microvm, signed class is gvisor_lower_risk"},
		{"runc", "", "admitted runtime class is none"},
	} {
		t.Run(tc.rcName, func(t *testing.T) {
			t.Parallel()
			ns := env.Namespace(t)
			env.MutatingWebhook(t, ns, k8stest.SetRuntimeClass(tc.rcName))
			p := newProvider(t, env, ns, "swap")
			ctx := ctxT(t, 2*time.Minute)
			req := provisionReq(lease.GVisorLowerRisk)
			obj, err := p.Provision(ctx, req)
			requireVerifyError(t, err, tc.reason)
			o, err := p.Inspect(ctx, obj)
			if err != nil {
				t.Fatal(err)
			}
			if !o.Exists || o.RuntimeClass != tc.want {
				t.Fatalf("Inspect = %+v, want runtime class %q", o, tc.want)
			}
			requireVerifyError(t, driver.Verify(obj, o, lease.GVisorLowerRisk), tc.reason)
			if err := p.Destroy(ctx, obj); err != nil {
				t.Fatalf("Destroy: %v", err)
			}
			requireNoPods(t, env, ns)
		})
	}
}

// TestOutOfBandDelete: the Pod is deleted behind the driver's back, then
// a new Pod takes the same name. Inspect and Verify notice both; Destroy of
// the old object is proven by the new UID and leaves the new Pod alone.
func TestOutOfBandDelete(t *testing.T) {
	t.Parallel()
	env := k8stest.Shared(t)
	ns := env.Namespace(t)
	p := newProvider(t, env, ns, "oob")
	ctx := ctxT(t, 2*time.Minute)
	req := provisionReq(lease.GVisorLowerRisk)
	obj, err := p.Provision(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	name := kubernetes.PodName(req.CellID)
	if err := env.Client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := env.WaitPodGone(ctx, ns, name, obj.Identity); err != nil {
		t.Fatal(err)
	}
	o, err := p.Inspect(ctx, obj)
	if err != nil || o.Exists {
		t.Fatalf("Inspect after out-of-band delete = %+v, %v", o, err)
	}
	requireVerifyError(t, driver.Verify(obj, o, lease.GVisorLowerRisk), "does not exist")
	if _, err := p.Exec(ctx, obj, driver.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("Exec after out-of-band delete: %v, want driver.ErrNotFound", err)
	}

	// A new Pod under the same name (a retried Provision) is another object.
	again, err := p.Provision(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if again.Identity == obj.Identity {
		t.Fatal("a new pod has the old uid")
	}
	o, err = p.Inspect(ctx, obj)
	if err != nil {
		t.Fatal(err)
	}
	requireVerifyError(t, driver.Verify(obj, o, lease.GVisorLowerRisk), "identity changed")
	if _, err := p.Exec(ctx, obj, driver.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("Exec on the old identity: %v, want driver.ErrNotFound", err)
	}
	if err := p.Destroy(ctx, obj); err != nil {
		t.Fatalf("Destroy of the old identity: %v", err)
	}
	if o, err := p.Inspect(ctx, again); err != nil || !o.Exists || o.Identity != again.Identity {
		t.Fatalf("the new pod was touched by the old identity's Destroy: %+v, %v", o, err)
	}
	if err := p.Destroy(ctx, again); err != nil {
		t.Fatal(err)
	}
	requireNoPods(t, env, ns)
}

// TestDestroyUnconfirmed: a finalizer keeps the Pod Terminating, so the
// API server never says it is gone. Destroy reports ErrUncertain when its
// context ends, never proof; once the finalizer goes, Destroy proves it.
func TestDestroyUnconfirmed(t *testing.T) {
	t.Parallel()
	env := k8stest.Shared(t)
	ns := env.Namespace(t)
	p := newProvider(t, env, ns, "held")
	ctx := ctxT(t, 2*time.Minute)
	req := provisionReq(lease.GVisorLowerRisk)
	obj, err := p.Provision(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	name := kubernetes.PodName(req.CellID)
	addFinalizer(t, env, ns, name)
	for range 2 { // the second call finds the Pod already terminating
		short := ctxT(t, 2*time.Second)
		err = p.Destroy(short, obj)
		if !errors.Is(err, driver.ErrUncertain) {
			t.Fatalf("Destroy of a pod that cannot go away: %v, want driver.ErrUncertain", err)
		}
	}
	pod, err := env.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil || pod.DeletionTimestamp == nil {
		t.Fatalf("pod should be terminating: %v", err)
	}
	o, err := p.Inspect(ctx, obj)
	if err != nil || !o.Exists || o.Ready {
		t.Fatalf("Inspect of a terminating pod = %+v, %v", o, err)
	}
	removeFinalizer(t, env, ns, name)
	if err := p.Destroy(ctx, obj); err != nil {
		t.Fatalf("Destroy after the finalizer went: %v", err)
	}
	requireNoPods(t, env, ns)
}

// TestProvisionNotReady: without kwok's node the Pod never runs, so
// Provision gives up after ReadyTimeout, and the Pod it made can be
// destroyed.
func TestProvisionNotReady(t *testing.T) {
	t.Parallel()
	env := k8stest.Shared(t)
	ns := env.Namespace(t)
	p := newProvider(t, env, ns, "pending", func(c *kubernetes.Config) {
		c.NodeName = "no-such-node"
		c.ReadyTimeout = time.Second
	})
	ctx := ctxT(t, 2*time.Minute)
	req := provisionReq(lease.GVisorLowerRisk)
	obj, err := p.Provision(ctx, req)
	if err == nil {
		t.Fatal("Provision of a pod that never runs succeeded")
	}
	// The ready timeout ended the wait, while the test's own context still
	// ran: the mechanism, not a duration a loaded machine stretches.
	if !strings.Contains(err.Error(), "pod not ready within 1s") || ctx.Err() != nil {
		t.Errorf("Provision = %v (test context %v), want the 1 s ready timeout's error", err, ctx.Err())
	}
	if obj.Identity == "" {
		t.Error("Provision returned no identity for the pod it created")
	}
	// Nothing finalizes a Pod bound to a node that does not exist: the
	// deletion stays unproven.
	short := ctxT(t, time.Second)
	if err := p.Destroy(short, obj); !errors.Is(err, driver.ErrUncertain) {
		t.Fatalf("Destroy: %v, want driver.ErrUncertain", err)
	}
	zero := int64(0)
	if err := env.Client.CoreV1().Pods(ns).Delete(ctx, kubernetes.PodName(req.CellID), metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	if err := p.Destroy(ctx, obj); err != nil {
		t.Fatalf("Destroy after a force delete: %v", err)
	}
	requireNoPods(t, env, ns)
}

// TestExistingPodNotOurs: a Pod under the cell's name without this pool's
// labels is neither adopted, verified nor deleted.
func TestExistingPodNotOurs(t *testing.T) {
	t.Parallel()
	env := k8stest.Shared(t)
	ns := env.Namespace(t)
	p := newProvider(t, env, ns, "mine")
	ctx := ctxT(t, 2*time.Minute)
	req := provisionReq(lease.GVisorLowerRisk)
	rc := "gvisor"
	foreign := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: kubernetes.PodName(req.CellID), Labels: map[string]string{"app": "other"}},
		Spec: corev1.PodSpec{RuntimeClassName: &rc, NodeName: env.NodeName,
			Containers: []corev1.Container{{Name: kubernetes.ContainerName, Image: testImage}}},
	}
	created, err := env.Client.CoreV1().Pods(ns).Create(ctx, foreign, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Provision(ctx, req); err == nil {
		t.Fatal("Provision adopted a pod that is not the pool's")
	}
	obj := driver.Object{CellID: req.CellID, Identity: string(created.UID)}
	o, err := p.Inspect(ctx, obj)
	if err != nil || o.RuntimeClass != "" {
		t.Fatalf("Inspect of a foreign pod = %+v, %v; want no runtime class", o, err)
	}
	// Named by cell alone (as after a failed provision), the foreign Pod
	// is not deleted: the driver cannot claim it.
	if err := p.Destroy(ctx, driver.Object{CellID: req.CellID}); !errors.Is(err, driver.ErrUncertain) {
		t.Fatalf("Destroy of a foreign pod: %v, want driver.ErrUncertain", err)
	}
	if objs, err := p.List(ctx); err != nil || len(objs) != 0 {
		t.Fatalf("List = %+v, %v; want nothing", objs, err)
	}
	if err := env.Client.CoreV1().Pods(ns).Delete(ctx, created.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestAbandonedCreateIsWaitedOut: Provision gives up while its Pod create
// is in flight; Destroy must not prove the cell absent before that create
// has landed, or the Pod it makes outlives the proof.
func TestAbandonedCreateIsWaitedOut(t *testing.T) {
	t.Parallel()
	env := k8stest.Shared(t)
	ns := env.Namespace(t)
	rc, late := k8stest.LateCreates(env.Config, "pods", 500*time.Millisecond)
	p := newProvider(t, env, ns, "late", func(c *kubernetes.Config) {
		c.RESTConfig = rc
		c.NetworkPolicy = ptr(false)
	})
	late.Abandon(t, p, provisionReq(lease.GVisorLowerRisk))
	requireNoPods(t, env, ns)
}
