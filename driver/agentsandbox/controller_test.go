package agentsandbox_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/sandboxwich/sandboxwich/driver/agentsandbox"
	"github.com/sandboxwich/sandboxwich/internal/k8stest"
)

// testImage is digest-pinned; kwok never pulls it.
const testImage = "registry.invalid/sandboxwich/cell@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// labelSandbox is the label the fake controller selects a Sandbox's Pods by.
const labelSandbox = "agents.x-k8s.io/sandbox-name-hash"

// faults are the fake controller's knobs: each makes it misbehave the way
// one of the cases needs.
type faults struct {
	// NeverBind leaves claims unbound.
	NeverBind bool
	// NoGC stops the garbage-collection emulation: a claim deleted in the
	// foreground keeps its foregroundDeletion finalizer, and its Sandbox
	// and Pod stay.
	NoGC bool
	// RuntimeClass is the Pods' spec.runtimeClassName (default "gvisor").
	RuntimeClass string
	// ExtraPod makes a second Pod that the Sandbox's selector matches.
	ExtraPod bool
	// WrongOwner makes the Pod's controller another Sandbox UID.
	WrongOwner bool
	// WrongClaimUID labels the Pod with another claim's UID.
	WrongClaimUID bool
	// Restarted reports a container restart on the Pod (a reused Pod).
	Restarted bool
}

// fakeAgentSandbox plays agent-sandbox's controllers for the claims of one
// namespace: it binds each claim to a new Sandbox (controlled by the claim)
// and a Pod (controlled by the Sandbox, labelled with the claim's UID, on
// the kwok node so it goes Running), writes the Sandbox's status.selector
// and the claim's status.sandbox.name through /status once the Pod is
// Running, and emulates the garbage collector for claims deleted in the
// foreground: it deletes the Sandbox and its Pods, then removes the
// claim's foregroundDeletion finalizer.
type fakeAgentSandbox struct {
	env *k8stest.Env
	ns  string
	dyn dynamic.Interface

	// real is set on the real node (startRealController): the Pods run
	// this image with this command, and stop within a second.
	real *realPods

	mu sync.Mutex
	f  faults
}

// realPods is what a Pod on the real node needs beyond kwok's.
type realPods struct {
	image   string
	command []string
}

// startController runs a fakeAgentSandbox until the test ends.
func startController(t *testing.T, env *k8stest.Env, ns string, f faults) *fakeAgentSandbox {
	t.Helper()
	return runController(t, &fakeAgentSandbox{env: env, ns: ns, f: f})
}

func runController(t *testing.T, c *fakeAgentSandbox) *fakeAgentSandbox {
	t.Helper()
	dyn, err := dynamic.NewForConfig(c.env.Config)
	if err != nil {
		t.Fatal(err)
	}
	c.dyn = dyn
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			c.pass(ctx, t)
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

// set changes the faults.
func (c *fakeAgentSandbox) set(fn func(*faults)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fn(&c.f)
}

func (c *fakeAgentSandbox) faults() faults {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.f
}

func (c *fakeAgentSandbox) claims() dynamic.ResourceInterface {
	return c.dyn.Resource(claimGVR).Namespace(c.ns)
}

func (c *fakeAgentSandbox) sandboxes() dynamic.ResourceInterface {
	return c.dyn.Resource(sandboxGVR).Namespace(c.ns)
}

// pass reconciles every claim once. Errors are retried on the next pass.
func (c *fakeAgentSandbox) pass(ctx context.Context, t *testing.T) {
	list, err := c.claims().List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	for i := range list.Items {
		claim := &list.Items[i]
		var err error
		if claim.GetDeletionTimestamp() != nil {
			err = c.collect(ctx, claim)
		} else {
			err = c.bind(ctx, claim)
		}
		if err != nil && ctx.Err() == nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) && !apierrors.IsAlreadyExists(err) {
			t.Logf("fake agent-sandbox: claim %s: %v", claim.GetName(), err)
		}
	}
}

func sandboxName(claim *unstructured.Unstructured) string { return "sbx-" + claim.GetName() }

func controllerRef(apiVersion, kind, name string, uid types.UID) metav1.OwnerReference {
	t := true
	return metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: name, UID: uid, Controller: &t, BlockOwnerDeletion: &t}
}

// bind binds a claim step by step, one step per pass where it must wait.
func (c *fakeAgentSandbox) bind(ctx context.Context, claim *unstructured.Unstructured) error {
	f := c.faults()
	if bound, _, _ := unstructured.NestedString(claim.Object, "status", "sandbox", "name"); bound != "" || f.NeverBind {
		return nil
	}
	name := sandboxName(claim)
	sbox, err := c.sandboxes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		sbox = &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": sandboxGVR.GroupVersion().String(),
			"kind":       "Sandbox",
			"metadata":   map[string]any{"name": name, "namespace": c.ns},
			"spec": map[string]any{"podTemplate": map[string]any{"spec": map[string]any{
				"containers": []any{map[string]any{"name": "cell", "image": testImage}},
			}}},
		}}
		sbox.SetOwnerReferences([]metav1.OwnerReference{controllerRef(claimGVR.GroupVersion().String(), "SandboxClaim", claim.GetName(), claim.GetUID())})
		sbox, err = c.sandboxes().Create(ctx, sbox, metav1.CreateOptions{})
	}
	if err != nil {
		return err
	}
	pods := []string{name}
	if f.ExtraPod {
		pods = append(pods, name+"-extra")
	}
	running := true
	for _, podName := range pods {
		pod, err := c.env.Client.CoreV1().Pods(c.ns).Get(ctx, podName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			pod, err = c.env.Client.CoreV1().Pods(c.ns).Create(ctx, c.pod(podName, sbox, claim, f), metav1.CreateOptions{})
		}
		if err != nil {
			return err
		}
		if pod.Status.Phase != corev1.PodRunning || len(pod.Status.ContainerStatuses) == 0 {
			running = false
			continue
		}
		if f.Restarted && pod.Status.ContainerStatuses[0].RestartCount == 0 {
			pod.Status.ContainerStatuses[0].RestartCount = 1
			if _, err := c.env.Client.CoreV1().Pods(c.ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
				return err
			}
			running = false
		}
	}
	if !running {
		return nil
	}
	if sel, _, _ := unstructured.NestedString(sbox.Object, "status", "selector"); sel == "" {
		if err := unstructured.SetNestedField(sbox.Object, labelSandbox+"="+name, "status", "selector"); err != nil {
			return err
		}
		if _, err := c.sandboxes().UpdateStatus(ctx, sbox, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	if err := unstructured.SetNestedField(claim.Object, name, "status", "sandbox", "name"); err != nil {
		return err
	}
	_, err = c.claims().UpdateStatus(ctx, claim, metav1.UpdateOptions{})
	return err
}

// pod is the warm Pod of a Sandbox, as agent-sandbox makes it (with the
// faults applied).
func (c *fakeAgentSandbox) pod(name string, sbox, claim *unstructured.Unstructured, f faults) *corev1.Pod {
	rc := f.RuntimeClass
	if rc == "" {
		rc = "gvisor"
	}
	claimUID, ownerUID := string(claim.GetUID()), sbox.GetUID()
	if f.WrongClaimUID {
		claimUID = uuid.NewString()
	}
	if f.WrongOwner {
		ownerUID = types.UID(uuid.NewString())
	}
	no := false
	container := corev1.Container{Name: "cell", Image: testImage}
	var grace *int64
	if c.real != nil {
		one := int64(1)
		container = corev1.Container{Name: "cell", Image: c.real.image, Command: c.real.command, ImagePullPolicy: corev1.PullNever}
		grace = &one
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:            name,
			Labels:          map[string]string{labelSandbox: sbox.GetName(), agentsandbox.LabelClaimUID: claimUID},
			OwnerReferences: []metav1.OwnerReference{controllerRef(sandboxGVR.GroupVersion().String(), "Sandbox", sbox.GetName(), ownerUID)},
		},
		Spec: corev1.PodSpec{
			RuntimeClassName:             &rc,
			NodeName:                     c.env.NodeName,
			AutomountServiceAccountToken: &no,
			RestartPolicy:                corev1.RestartPolicyNever,
			Containers:                   []corev1.Container{container},
			// PID 1 ignores SIGTERM: on the real node the kubelet waits
			// this long before it kills the container.
			TerminationGracePeriodSeconds: grace,
		},
	}
}

// collect emulates the garbage collector for a claim deleted in the
// foreground: its Sandbox and the Sandbox's Pods go first, then the
// claim's foregroundDeletion finalizer.
func (c *fakeAgentSandbox) collect(ctx context.Context, claim *unstructured.Unstructured) error {
	if c.faults().NoGC || !slices.Contains(claim.GetFinalizers(), metav1.FinalizerDeleteDependents) {
		return nil
	}
	name := sandboxName(claim)
	gone := true
	if _, err := c.sandboxes().Get(ctx, name, metav1.GetOptions{}); err == nil {
		gone = false
		if err := c.sandboxes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	} else if !apierrors.IsNotFound(err) {
		return err
	}
	pods, err := c.env.Client.CoreV1().Pods(c.ns).List(ctx, metav1.ListOptions{LabelSelector: labelSandbox + "=" + name})
	if err != nil {
		return err
	}
	for _, p := range pods.Items {
		gone = false
		if p.DeletionTimestamp == nil {
			if err := c.env.Client.CoreV1().Pods(c.ns).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
		}
	}
	if !gone {
		return nil
	}
	claim.SetFinalizers(slices.DeleteFunc(claim.GetFinalizers(), func(f string) bool { return f == metav1.FinalizerDeleteDependents }))
	_, err = c.claims().Update(ctx, claim, metav1.UpdateOptions{})
	return err
}
