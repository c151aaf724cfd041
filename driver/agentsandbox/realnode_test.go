package agentsandbox_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/agentsandbox"
	"github.com/sandboxwich/sandboxwich/driver/drivertest"
	"github.com/sandboxwich/sandboxwich/internal/k8stest"
	"github.com/sandboxwich/sandboxwich/lease"
)

// The real-node tests run the driver against a kubelet with containerd
// (internal/k8stest.SharedNode): the fake agent-sandbox controller's Pods
// are real busybox containers under gVisor, and exec goes through
// pods/exec.

var realCRDs struct {
	once sync.Once
	err  error
}

// realNode returns the shared real node with the agent-sandbox CRDs
// installed.
func realNode(t testing.TB) *k8stest.Node {
	t.Helper()
	node := k8stest.SharedNode(t)
	realCRDs.once.Do(func() { realCRDs.err = installCRDs(node.Env) })
	if realCRDs.err != nil {
		t.Fatalf("installing the agent-sandbox CRDs on the real node: %v", realCRDs.err)
	}
	return node
}

// startRealController runs the fake agent-sandbox controller for ns on the
// real node.
func startRealController(t *testing.T, node *k8stest.Node, ns string) *fakeAgentSandbox {
	t.Helper()
	return runController(t, &fakeAgentSandbox{env: node.Env, ns: ns,
		real: &realPods{image: node.BusyboxImage, command: []string{"sleep", "infinity"}}})
}

// realHarness makes providers on the real node, Exec included.
type realHarness struct {
	node *k8stest.Node
	ns   string
}

func (h realHarness) MakeProvider(ctx context.Context, t *testing.T) (driver.Provider, error) {
	return newProvider(t, h.node.Env, h.ns, "real", realTimeouts), nil
}

func (h realHarness) RuntimeClass() lease.RuntimeClass { return lease.GVisorLowerRisk }

// realTimeouts leaves room for real Pods on a loaded machine.
func realTimeouts(c *agentsandbox.Config) {
	c.BindTimeout = 2 * time.Minute
	c.DeleteTimeout = 2 * time.Minute
}

// TestRealNodeConformance runs all of driver/drivertest, exec included, on
// the real node.
func TestRealNodeConformance(t *testing.T) {
	node := realNode(t)
	h := realHarness{node: node, ns: node.Namespace(t)}
	startRealController(t, node, h.ns)
	drivertest.Run(t, h)
	requireEmpty(t, node.Env, h.ns)
	if t.Failed() {
		t.Logf("kubelet log:\n%s", node.Log("kubelet"))
	}
}

// TestRealNodeGVisor: the claimed Pod really runs under gVisor.
func TestRealNodeGVisor(t *testing.T) {
	node := realNode(t)
	ns := node.Namespace(t)
	startRealController(t, node, ns)
	p := newProvider(t, node.Env, ns, "gvisor", realTimeouts)
	ctx := ctxT(t, 3*time.Minute)
	obj, err := p.Provision(ctx, provisionReq(lease.GVisorLowerRisk))
	if err != nil {
		t.Fatalf("Provision: %v", err)
	}
	defer func() {
		if err := p.Destroy(ctx, obj); err != nil {
			t.Errorf("Destroy: %v", err)
		}
		requireEmpty(t, node.Env, ns)
	}()
	res, err := p.Exec(ctx, obj, driver.ExecRequest{Argv: []string{"uname", "-r"}})
	if err != nil || res.ExitCode != 0 || !strings.Contains(string(res.Stdout), "gvisor") {
		t.Fatalf("uname -r = %q (exit %d), %v: not gVisor's kernel", res.Stdout, res.ExitCode, err)
	}
	o, err := p.Inspect(ctx, obj)
	if err != nil {
		t.Fatal(err)
	}
	want := node.BusyboxImage[strings.Index(node.BusyboxImage, "@")+1:]
	if !o.Ready || o.RuntimeClass != lease.GVisorLowerRisk || o.ImageDigest != want {
		t.Fatalf("Inspect = %+v, want ready, gvisor, image %s", o, want)
	}
}
