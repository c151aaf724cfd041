package kubernetes_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/drivertest"
	"github.com/sandboxwich/sandboxwich/driver/kubernetes"
	"github.com/sandboxwich/sandboxwich/internal/k8stest"
	"github.com/sandboxwich/sandboxwich/lease"
)

// The real-node tests run the driver against a kubelet with containerd,
// where Pods are real containers under gVisor (internal/k8stest.SharedNode).
// Exec goes through pods/exec; realConfigure is where the suite switches
// to another exec path (the cell agent) once the driver has one.

// realConfigure edits every real-node provider's configuration.
var realConfigure = func(*kubernetes.Config) {}

// newRealProvider returns a provider for the pool in namespace ns of the
// real node: the node's digest-pinned busybox image, small requests (the
// node has 2 CPUs and the suite runs cells in parallel).
func newRealProvider(t testing.TB, node *k8stest.Node, ns, pool string, edit ...func(*kubernetes.Config)) *kubernetes.Provider {
	t.Helper()
	return newProvider(t, node.Env, ns, pool, append([]func(*kubernetes.Config){func(c *kubernetes.Config) {
		c.Image = node.BusyboxImage
		c.NodeName = node.NodeName
		c.CPU = "50m"
		c.Memory = "256Mi"
		c.ReadyTimeout = 2 * time.Minute
		c.TerminationGracePeriod = time.Second
		realConfigure(c)
	}}, edit...)...)
}

// realHarness makes providers on the real node, Exec included.
type realHarness struct {
	node *k8stest.Node
	ns   string
}

func (h realHarness) MakeProvider(ctx context.Context, t *testing.T) (driver.Provider, error) {
	return newRealProvider(t, h.node, h.ns, "real"), nil
}

func (h realHarness) RuntimeClass() lease.RuntimeClass { return lease.GVisorLowerRisk }

// TestRealNodeConformance runs all of driver/drivertest, exec included, on
// the real node.
func TestRealNodeConformance(t *testing.T) {
	node := k8stest.SharedNode(t)
	h := realHarness{node: node, ns: node.Namespace(t)}
	drivertest.Run(t, h)
	requireNoPods(t, node.Env, h.ns)
	if t.Failed() {
		t.Logf("kubelet log:\n%s", node.Log("kubelet"))
	}
}

// TestRealNodeGVisor: a cell of class gvisor_lower_risk really runs under
// gVisor (its kernel is gVisor's), and the driver reads back the image
// digest the runtime reports.
func TestRealNodeGVisor(t *testing.T) {
	node := k8stest.SharedNode(t)
	ns := node.Namespace(t)
	p := newRealProvider(t, node, ns, "gvisor")
	ctx := ctxT(t, 3*time.Minute)
	obj, err := p.Provision(ctx, provisionReq(lease.GVisorLowerRisk))
	if err != nil {
		t.Fatalf("Provision: %v\nkubelet log:\n%s", err, node.Log("kubelet"))
	}
	defer func() {
		if err := p.Destroy(ctx, obj); err != nil {
			t.Errorf("Destroy: %v", err)
		}
		requireNoPods(t, node.Env, ns)
	}()
	res, err := p.Exec(ctx, obj, driver.ExecRequest{Argv: []string{"uname", "-r"}})
	if err != nil || res.ExitCode != 0 || !strings.Contains(string(res.Stdout), "gvisor") {
		t.Fatalf("uname -r = %q (exit %d), %v: not gVisor's kernel", res.Stdout, res.ExitCode, err)
	}
	res, err = p.Exec(ctx, obj, driver.ExecRequest{Argv: []string{"dmesg"}})
	if err != nil || !strings.Contains(string(res.Stdout), "gVisor") {
		t.Errorf("dmesg = %q, %v", res.Stdout, err)
	}
	o, err := p.Inspect(ctx, obj)
	if err != nil {
		t.Fatal(err)
	}
	want := node.BusyboxImage[strings.Index(node.BusyboxImage, "@")+1:]
	if !o.Ready || o.RuntimeClass != lease.GVisorLowerRisk || o.ImageDigest != want {
		t.Fatalf("Inspect = %+v, want ready, gvisor, image %s", o, want)
	}
	if err := driver.Verify(obj, o, lease.GVisorLowerRisk); err != nil {
		t.Fatal(err)
	}
}

// TestRealNodeWebhookStripsRuntimeClass: on the real node too, a Pod whose
// runtimeClassName a webhook stripped is never taken for a cell: Provision
// refuses it, Exec refuses it, and Destroy removes it with proof.
func TestRealNodeWebhookStripsRuntimeClass(t *testing.T) {
	node := k8stest.SharedNode(t)
	ns := node.Namespace(t)
	wh := node.MutatingWebhook(t, ns, k8stest.StripRuntimeClass)
	p := newRealProvider(t, node, ns, "strip")
	ctx := ctxT(t, 3*time.Minute)
	req := provisionReq(lease.GVisorLowerRisk)
	obj, err := p.Provision(ctx, req)
	requireVerifyError(t, err, "admitted runtime class is none")
	if wh.Requests.Load() == 0 {
		t.Fatal("the webhook saw no pod")
	}
	pod, err := node.Client.CoreV1().Pods(ns).Get(ctx, kubernetes.PodName(req.CellID), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Spec.RuntimeClassName != nil {
		t.Fatalf("admitted runtimeClassName = %q; the webhook did not strip it", *pod.Spec.RuntimeClassName)
	}
	if _, err := p.Exec(ctx, obj, driver.ExecRequest{Argv: []string{"true"}}); !errors.As(err, new(*driver.VerifyError)) {
		t.Errorf("Exec on an unverified pod: %v, want a *driver.VerifyError", err)
	}
	if err := p.Destroy(ctx, obj); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	requireNoPods(t, node.Env, ns)
}
