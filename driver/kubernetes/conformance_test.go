package kubernetes_test

import (
	"context"
	"testing"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/drivertest"
	"github.com/sandboxwich/sandboxwich/internal/k8stest"
	"github.com/sandboxwich/sandboxwich/lease"
)

// harness makes providers over a real kube-apiserver with kwok as the
// kubelet of a fake node.
type harness struct {
	env *k8stest.Env
	ns  string
}

// withoutExec hides the provider's Exec from the suite: kwok runs no
// containers, so pods/exec has no kubelet behind it here. Exec is tested
// in exec_test.go against a server speaking the kubelet's streaming
// protocol (see the package documentation), and the whole suite, exec
// included, runs on a real node in realnode_test.go.
type withoutExec struct {
	driver.Provider
	driver.Lister
}

func (h harness) MakeProvider(ctx context.Context, t *testing.T) (driver.Provider, error) {
	p := newProvider(t, h.env, h.ns, "conformance")
	return withoutExec{p, p}, nil
}

func (h harness) RuntimeClass() lease.RuntimeClass { return lease.GVisorLowerRisk }

// Images: kwok runs no image and reports no imageID. The Pod spec of a
// per-cell image is tested in image_test.go; the suite's Images case runs
// on the real node.
func (harness) Images(*testing.T) []drivertest.TestImage { return nil }

// TestConformance runs driver/drivertest against the real API server.
func TestConformance(t *testing.T) {
	env := k8stest.Shared(t)
	h := harness{env: env, ns: env.Namespace(t)}
	drivertest.Run(t, h)
	// Every cell the suite made was destroyed with proof: nothing is left.
	requireNoPods(t, env, h.ns)
	if t.Failed() {
		t.Logf("kwok log:\n%s", env.KwokLog())
	}
}
