package agentsandbox

import (
	"context"
	"fmt"
	"strings"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/internal/kubeconf"
	"github.com/sandboxwich/sandboxwich/lease"
)

// chain is what a cell's claim resolves to, read afresh from the API
// server: claim → status.sandbox.name → Sandbox → status.selector → Pod.
type chain struct {
	claim   *unstructured.Unstructured // nil: no claim under the cell's name
	sandbox *unstructured.Unstructured
	pod     *corev1.Pod
	id      identity
	class   lease.RuntimeClass // the class whose RuntimeClass name the Pod was admitted with
	// problems make the chain unverifiable for good: it is not (or no
	// longer) the claim's own fresh Pod with the configured RuntimeClass.
	problems []string
	// pending says why the chain is not whole yet (agent-sandbox may
	// still be binding); "" when it is.
	pending string
}

// resolve follows the chain of the cell's claim. An error means the API
// server could not be asked; what it answered is in the chain.
func (p *Provider) resolve(ctx context.Context, cellID uuid.UUID) (*chain, error) {
	claimGVR, sboxGVR, err := p.versions()
	if err != nil {
		return nil, err
	}
	c := &chain{}
	name := ClaimName(cellID)
	claim, err := p.claims(claimGVR).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		c.pending = "no claim " + name
		return c, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading claim %s: %w", name, err)
	}
	c.claim = claim
	c.id.Claim = claim.GetUID()
	if err := p.owned(claim, cellID); err != nil {
		c.problems = append(c.problems, err.Error())
	}
	if claim.GetDeletionTimestamp() != nil {
		c.problems = append(c.problems, "claim is being deleted")
	}
	sboxName, _, _ := unstructured.NestedString(claim.Object, "status", "sandbox", "name")
	if sboxName == "" {
		c.pending = "claim not bound yet (no status.sandbox.name)"
		return c, nil
	}
	sbox, err := p.dyn.Resource(sboxGVR).Namespace(p.cfg.Namespace).Get(ctx, sboxName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		c.pending = "sandbox " + sboxName + " not found"
		return c, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading sandbox %s: %w", sboxName, err)
	}
	c.sandbox = sbox
	c.id.Sandbox = ref{Name: sbox.GetName(), UID: sbox.GetUID()}
	if sbox.GetDeletionTimestamp() != nil {
		c.problems = append(c.problems, "sandbox "+sboxName+" is being deleted")
	}
	if o := metav1.GetControllerOfNoCopy(sbox); o != nil && o.Kind == "SandboxClaim" && o.UID != c.id.Claim {
		c.problems = append(c.problems, fmt.Sprintf("sandbox %s is controlled by another claim (uid %s)", sboxName, o.UID))
	}
	selStr, _, _ := unstructured.NestedString(sbox.Object, "status", "selector")
	if strings.TrimSpace(selStr) == "" {
		c.pending = "sandbox " + sboxName + " has no status.selector yet"
		return c, nil
	}
	sel, err := labels.Parse(selStr)
	if err != nil || sel.Empty() {
		c.problems = append(c.problems, fmt.Sprintf("sandbox %s has an unusable status.selector %q", sboxName, selStr))
		return c, nil
	}
	list, err := p.podClient().List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, fmt.Errorf("listing the pods of sandbox %s: %w", sboxName, err)
	}
	switch n := len(list.Items); {
	case n == 0:
		c.pending = fmt.Sprintf("no pod matches the selector %q of sandbox %s", selStr, sboxName)
		return c, nil
	case n > 1:
		names := make([]string, 0, n)
		for _, pod := range list.Items {
			names = append(names, pod.Name+"/"+string(pod.UID))
		}
		c.problems = append(c.problems, fmt.Sprintf("%d pods match the selector %q of sandbox %s: %s", n, selStr, sboxName, strings.Join(names, ", ")))
		return c, nil
	}
	pod := &list.Items[0]
	c.pod = pod
	c.id.Pod = ref{Name: pod.Name, UID: pod.UID}
	c.checkPod()
	c.verifyClass(p)
	return c, nil
}

// checkPod adds what is wrong with the selected Pod to problems (for good)
// or pending (not yet).
func (c *chain) checkPod() {
	pod := c.pod
	if o := metav1.GetControllerOfNoCopy(pod); o == nil {
		c.problems = append(c.problems, "pod "+pod.Name+" has no controller owner reference")
	} else if o.UID != c.id.Sandbox.UID || o.Kind != "Sandbox" {
		c.problems = append(c.problems, fmt.Sprintf("pod %s is controlled by %s %s (uid %s), not sandbox %s", pod.Name, o.Kind, o.Name, o.UID, c.id.Sandbox))
	}
	switch v, ok := pod.Labels[LabelClaimUID]; {
	case !ok:
		c.pending = "pod " + pod.Name + " has no " + LabelClaimUID + " label yet"
	case v != string(c.id.Claim):
		c.problems = append(c.problems, fmt.Sprintf("pod %s carries %s=%s, not the claim's uid %s", pod.Name, LabelClaimUID, v, c.id.Claim))
	}
	if pod.DeletionTimestamp != nil {
		c.problems = append(c.problems, "pod "+pod.Name+" is being deleted")
	}
	if r := restarts(pod); r > 0 {
		c.problems = append(c.problems, fmt.Sprintf("pod %s has run before: %d container restarts", pod.Name, r))
	}
	switch pod.Status.Phase {
	case corev1.PodRunning:
	case corev1.PodFailed, corev1.PodSucceeded:
		c.problems = append(c.problems, fmt.Sprintf("pod %s has finished (phase %s)", pod.Name, pod.Status.Phase))
	default:
		if c.pending == "" {
			c.pending = fmt.Sprintf("pod %s is %s, not Running", pod.Name, pod.Status.Phase)
		}
	}
}

// restarts sums the restart counts of every container of the Pod. A warm
// Pod handed to a claim must never have run a workload before.
func restarts(pod *corev1.Pod) int32 {
	var n int32
	for _, list := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses, pod.Status.EphemeralContainerStatuses} {
		for _, cs := range list {
			n += cs.RestartCount
		}
	}
	if len(pod.Spec.EphemeralContainers) > 0 {
		// Someone attached to the Pod: treat it as used.
		n++
	}
	return n
}

// verifyClass checks the Pod's admitted spec.runtimeClassName against the
// name configured for the class the claim was made for, setting c.class
// when it matches.
func (c *chain) verifyClass(p *Provider) {
	if c.pod == nil || c.claim == nil {
		return
	}
	want := lease.RuntimeClass(c.claim.GetLabels()[LabelRuntimeClass])
	wantName, ok := p.cfg.RuntimeClassNames[want]
	got := ""
	if c.pod.Spec.RuntimeClassName != nil {
		got = *c.pod.Spec.RuntimeClassName
	}
	switch {
	case !ok:
		c.problems = append(c.problems, fmt.Sprintf("claim was made for class %q, which is not configured", want))
	case got == "":
		c.problems = append(c.problems, "admitted pod "+c.pod.Name+" has no runtimeClassName")
	case got != wantName:
		c.problems = append(c.problems, fmt.Sprintf("admitted pod %s has runtimeClassName %q, configured for %s is %q", c.pod.Name, got, want, wantName))
	default:
		c.class = p.byName[got]
	}
}

// ready reports a whole, consistent chain whose Pod is Running and ready.
func (c *chain) ready() bool {
	return c.claim != nil && c.pod != nil && len(c.problems) == 0 && c.pending == "" && c.class != "" && kubeconf.PodReady(c.pod)
}

// detail explains the chain for logs and errors.
func (c *chain) detail() string {
	if c.claim == nil {
		return c.pending
	}
	s := "chain " + c.id.String()
	if c.pod != nil {
		rc := ""
		if c.pod.Spec.RuntimeClassName != nil {
			rc = *c.pod.Spec.RuntimeClassName
		}
		s += fmt.Sprintf(" (pod phase %s, runtimeClassName %q, ready %v)", c.pod.Status.Phase, rc, kubeconf.PodReady(c.pod))
	}
	if len(c.problems) > 0 {
		s += ": " + strings.Join(c.problems, "; ")
	}
	if c.pending != "" {
		s += ": " + c.pending
	}
	return s
}

// observe turns the chain into an Observation of obj.
func (c *chain) observe(obj driver.Object) driver.Observation {
	o := driver.Observation{Exists: c.claim != nil, Identity: c.id.String(), Detail: c.detail()}
	if !o.Exists {
		return o
	}
	o.ImageDigest = podImage(c.pod)
	switch {
	case obj.Identity != "" && obj.Identity != o.Identity:
		o.Detail += "; not the recorded chain " + obj.Identity
	case !c.id.complete() || len(c.problems) > 0 || c.pending != "" || c.pod == nil || c.pod.Status.Phase != corev1.PodRunning:
	default:
		o.RuntimeClass = c.class
		o.Ready = c.ready()
	}
	return o
}

// podImage is the admitted image of the bound Pod's first container (the
// template's main container): the repo digest the kubelet reports in its
// imageID, provided the container's image, as the template set it, is
// pinned by no other digest; "" when the kubelet reports no repo digest.
// The plane compares it with the pool's pinned digest (CONTRACT §15).
func podImage(pod *corev1.Pod) string {
	if pod == nil || len(pod.Spec.Containers) == 0 {
		return ""
	}
	main := pod.Spec.Containers[0]
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name != main.Name {
			continue
		}
		d := driver.RepoDigest(cs.ImageID)
		if spec, ok := driver.PinnedDigest(main.Image); ok && spec != d {
			return ""
		}
		return d
	}
	return ""
}
