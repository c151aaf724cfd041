package agentsandbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/agentsandbox"
	"github.com/sandboxwich/sandboxwich/driver/drivertest"
	"github.com/sandboxwich/sandboxwich/internal/k8stest"
	"github.com/sandboxwich/sandboxwich/lease"
)

// harness makes providers over a real kube-apiserver, with the fake
// agent-sandbox controller binding claims and kwok running the Pods.
type harness struct {
	env *k8stest.Env
	ns  string
}

// withoutExec hides the provider's Exec from the suite: kwok runs no
// containers, so pods/exec has no kubelet behind it here. The whole
// suite, exec included, runs on a real node in realnode_test.go.
type withoutExec struct {
	driver.Provider
	driver.Lister
}

func (h harness) MakeProvider(ctx context.Context, t *testing.T) (driver.Provider, error) {
	p := newProvider(t, h.env, h.ns, "conformance")
	return withoutExec{p, p}, nil
}

func (h harness) RuntimeClass() lease.RuntimeClass { return lease.GVisorLowerRisk }

// TestConformance runs driver/drivertest against the real API server.
func TestConformance(t *testing.T) {
	env := sharedEnv(t)
	h := harness{env: env, ns: env.Namespace(t)}
	startController(t, env, h.ns, faults{})
	drivertest.Run(t, h)
	requireEmpty(t, env, h.ns)
}

// setup starts a namespace with a fake agent-sandbox controller.
func setup(t *testing.T, f faults, edit ...func(*agentsandbox.Config)) (*k8stest.Env, string, *fakeAgentSandbox, *agentsandbox.Provider) {
	t.Helper()
	env := sharedEnv(t)
	ns := env.Namespace(t)
	c := startController(t, env, ns, f)
	return env, ns, c, newProvider(t, env, ns, "p", edit...)
}

// parts splits an identity into its claim, sandbox and pod parts.
func parts(t *testing.T, identity string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, kv := range strings.Split(identity, ",") {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	if len(m) != 3 || m["claim"] == "" || m["sandbox"] == "" || m["pod"] == "" {
		t.Fatalf("identity %q does not name claim, sandbox and pod", identity)
	}
	return m
}

// TestHappyPath: a claim bound to a fresh Running Pod with the configured
// RuntimeClass is verified, listed, refused exec only when gone, and
// destroyed with proof that claim, Sandbox and Pod are all absent.
func TestHappyPath(t *testing.T) {
	env, ns, _, p := setup(t, faults{})
	ctx := ctxT(t, 2*time.Minute)
	req := provisionReq(lease.GVisorLowerRisk)
	start := time.Now()
	obj, err := p.Provision(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("bound in %v: %s", time.Since(start).Round(time.Millisecond), obj.Identity)
	id := parts(t, obj.Identity)

	claim, err := getClaim(ctx, env, ns, agentsandbox.ClaimName(req.CellID))
	if err != nil {
		t.Fatal(err)
	}
	if string(claim.GetUID()) != id["claim"] {
		t.Errorf("identity claim %s, API server has %s", id["claim"], claim.GetUID())
	}
	for k, want := range map[string]string{
		agentsandbox.LabelManagedBy: agentsandbox.ManagedByValue, agentsandbox.LabelPool: "p", agentsandbox.LabelInstallation: testInstallation,
		agentsandbox.LabelCellID: req.CellID.String(), agentsandbox.LabelRuntimeClass: string(req.RuntimeClass),
	} {
		if got := claim.GetLabels()[k]; got != want {
			t.Errorf("claim label %s = %q, want %q", k, got, want)
		}
	}
	if wp, _, _ := unstructured.NestedString(claim.Object, "spec", "warmPoolRef", "name"); wp != "warm" {
		t.Errorf("claim spec.warmPoolRef.name = %q, want warm", wp)
	}
	podName, podUID, _ := strings.Cut(id["pod"], "/")
	pod, err := env.Client.CoreV1().Pods(ns).Get(ctx, podName, metav1.GetOptions{})
	if err != nil || string(pod.UID) != podUID {
		t.Fatalf("bound pod %s: %v (uid %v)", id["pod"], err, pod)
	}

	o, err := p.Inspect(ctx, obj)
	if err != nil {
		t.Fatal(err)
	}
	if err := driver.Verify(obj, o, lease.GVisorLowerRisk); err != nil || !o.Ready {
		t.Fatalf("Verify: %v (ready %v, %s)", err, o.Ready, o.Detail)
	}
	if driver.Verify(obj, o, lease.KataMicroVM) == nil {
		t.Error("Verify accepts another class")
	}
	// A provider made afterwards lists it with the same identity.
	list, err := newProvider(t, env, ns, "p").List(ctx)
	if err != nil || len(list) != 1 || list[0] != obj {
		t.Fatalf("List = %+v, %v; want [%+v]", list, err, obj)
	}
	if other, err := newProvider(t, env, ns, "other").List(ctx); err != nil || len(other) != 0 {
		t.Errorf("another pool's List = %+v, %v; want none", other, err)
	}

	start = time.Now()
	if err := p.Destroy(ctx, obj); err != nil {
		t.Fatal(err)
	}
	t.Logf("destroyed in %v", time.Since(start).Round(time.Millisecond))
	if o, err := p.Inspect(ctx, obj); err != nil || o.Exists {
		t.Errorf("Inspect after Destroy: %+v, %v", o, err)
	}
	if _, err := p.Exec(ctx, obj, driver.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("Exec after Destroy: %v, want driver.ErrNotFound", err)
	}
	requireEmpty(t, env, ns)
}

// requireRefused provisions with the controller's faults and requires a
// *driver.VerifyError containing want; the claim and everything bound to
// it is then destroyed with proof.
func requireRefused(t *testing.T, f faults, class lease.RuntimeClass, want string, prepare ...func(*k8stest.Env, string)) {
	t.Helper()
	env := sharedEnv(t)
	ns := env.Namespace(t)
	for _, fn := range prepare {
		fn(env, ns)
	}
	startController(t, env, ns, f)
	p := newProvider(t, env, ns, "p")
	ctx := ctxT(t, 2*time.Minute)
	obj, err := p.Provision(ctx, provisionReq(class))
	requireVerifyError(t, err, want)
	t.Logf("refused: %v", err)
	if o, err := p.Inspect(ctx, obj); err != nil || !o.Exists || o.RuntimeClass != "" {
		t.Errorf("Inspect of the refused chain = %+v, %v; want it to exist without a runtime class", o, err)
	}
	if err := p.Destroy(ctx, obj); err != nil {
		t.Fatalf("Destroy of the refused chain: %v", err)
	}
	requireEmpty(t, env, ns)
}

// TestRuntimeClassStripped: a mutating webhook removes the warm Pod's
// runtimeClassName at admission.
func TestRuntimeClassStripped(t *testing.T) {
	requireRefused(t, faults{}, lease.GVisorLowerRisk, "has no runtimeClassName", func(env *k8stest.Env, ns string) {
		env.MutatingWebhook(t, ns, k8stest.StripRuntimeClass)
	})
}

// TestOtherRuntimeClass: the warm pool's Pods run another RuntimeClass
// than the one configured for the requested class.
func TestOtherRuntimeClass(t *testing.T) {
	requireRefused(t, faults{RuntimeClass: "kata"}, lease.GVisorLowerRisk, `runtimeClassName "kata"`)
}

// TestTwoPods: the Sandbox's selector matches two Pods.
func TestTwoPods(t *testing.T) {
	requireRefused(t, faults{ExtraPod: true}, lease.GVisorLowerRisk, "2 pods match")
}

// TestOwnerMismatch: the Pod is controlled by another Sandbox UID.
func TestOwnerMismatch(t *testing.T) {
	requireRefused(t, faults{WrongOwner: true}, lease.GVisorLowerRisk, "is controlled by Sandbox")
}

// TestClaimUIDMismatch: the Pod carries another claim's UID.
func TestClaimUIDMismatch(t *testing.T) {
	requireRefused(t, faults{WrongClaimUID: true}, lease.GVisorLowerRisk, "not the claim's uid")
}

// TestRestartedPod: the Pod has run before (a container restarted).
func TestRestartedPod(t *testing.T) {
	requireRefused(t, faults{Restarted: true}, lease.GVisorLowerRisk, "has run before")
}

// TestDeletionNeverConfirmed: while the garbage collector does not finish
// the foreground deletion, Destroy is uncertain (the plane quarantines
// and retries); once it does, a retried Destroy proves absence.
func TestDeletionNeverConfirmed(t *testing.T) {
	env, ns, c, p := setup(t, faults{}, func(cfg *agentsandbox.Config) { cfg.DeleteTimeout = 2 * time.Second })
	ctx := ctxT(t, 2*time.Minute)
	obj, err := p.Provision(ctx, provisionReq(lease.GVisorLowerRisk))
	if err != nil {
		t.Fatal(err)
	}
	c.set(func(f *faults) { f.NoGC = true })
	start := time.Now()
	err = p.Destroy(ctx, obj)
	if !errors.Is(err, driver.ErrUncertain) {
		t.Fatalf("Destroy without garbage collection: %v, want driver.ErrUncertain", err)
	}
	t.Logf("uncertain after %v: %v", time.Since(start).Round(time.Millisecond), err)
	for _, part := range []string{"claim", "sandbox", "pod"} {
		if !strings.Contains(err.Error(), part+" ") {
			t.Errorf("error does not report the %s still present: %v", part, err)
		}
	}
	// The claim is terminating, held by foregroundDeletion: it exists,
	// and nothing may use it.
	if o, err := p.Inspect(ctx, obj); err != nil || !o.Exists || o.RuntimeClass != "" {
		t.Errorf("Inspect of a terminating claim = %+v, %v", o, err)
	}
	if _, err := p.Exec(ctx, obj, driver.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("Exec on a terminating claim: %v, want driver.ErrNotFound", err)
	}
	// Retried with the recorded identity (as the pool does), again uncertain.
	if err := p.Destroy(ctx, obj); !errors.Is(err, driver.ErrUncertain) {
		t.Fatalf("second Destroy without garbage collection: %v", err)
	}
	c.set(func(f *faults) { f.NoGC = false })
	if err := p.Destroy(ctx, obj); err != nil {
		t.Fatalf("Destroy once the collector runs: %v", err)
	}
	requireEmpty(t, env, ns)
}

// TestNeverBound: a claim agent-sandbox never binds fails Provision after
// BindTimeout (not as a verification failure) and is destroyed with proof.
func TestNeverBound(t *testing.T) {
	env, ns, _, p := setup(t, faults{NeverBind: true}, func(cfg *agentsandbox.Config) { cfg.BindTimeout = time.Second })
	ctx := ctxT(t, 2*time.Minute)
	start := time.Now()
	obj, err := p.Provision(ctx, provisionReq(lease.GVisorLowerRisk))
	took := time.Since(start)
	var ve *driver.VerifyError
	// The bind timeout ended the wait, not the test's context (whose end
	// would be context.DeadlineExceeded): the mechanism, not a duration a
	// loaded machine stretches. Only the lower bound is timed — it proves
	// Provision waited the second, and a loaded machine is slower, never
	// faster.
	if err == nil || errors.As(err, &ve) || errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil ||
		!strings.Contains(err.Error(), "not bound to a ready pod within 1s") {
		t.Fatalf("Provision of a never-bound claim: %v", err)
	}
	if took < time.Second {
		t.Errorf("Provision gave up after %v, before the 1s bind timeout", took)
	}
	if !strings.HasPrefix(obj.Identity, "claim=") || strings.Contains(obj.Identity, ",") {
		t.Errorf("identity of an unbound claim = %q, want only the claim", obj.Identity)
	}
	if err := p.Destroy(ctx, obj); err != nil {
		t.Fatal(err)
	}
	requireEmpty(t, env, ns)
}

// TestExecVerifiesFirst: Exec re-follows and re-verifies the chain before
// it opens a stream: a claim-uid label changed after binding, or a Pod
// replaced under the same name, is refused without reaching pods/exec.
func TestExecVerifiesFirst(t *testing.T) {
	env, ns, _, p := setup(t, faults{})
	ctx := ctxT(t, 2*time.Minute)
	obj, err := p.Provision(ctx, provisionReq(lease.GVisorLowerRisk))
	if err != nil {
		t.Fatal(err)
	}
	podName, _, _ := strings.Cut(parts(t, obj.Identity)["pod"], "/")
	patch := fmt.Appendf(nil, `{"metadata":{"labels":{%q:"someone-else"}}}`, agentsandbox.LabelClaimUID)
	if _, err := env.Client.CoreV1().Pods(ns).Patch(ctx, podName, "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err = p.Exec(ctx, obj, driver.ExecRequest{Argv: []string{"true"}})
	requireVerifyError(t, err, "not the claim's uid")
	if o, err := p.Inspect(ctx, obj); err != nil || o.RuntimeClass != "" || driver.Verify(obj, o, lease.GVisorLowerRisk) == nil {
		t.Errorf("Inspect after relabelling = %+v, %v; want it unverifiable", o, err)
	}
	if err := p.Destroy(ctx, obj); err != nil {
		t.Fatal(err)
	}
	requireEmpty(t, env, ns)
}

// TestDestroyWithoutIdentity: a provision that failed before returning an
// identity (empty Object.Identity) is cleaned up through the cell's claim,
// and a claim without this pool's labels is never deleted.
func TestDestroyWithoutIdentity(t *testing.T) {
	env, ns, _, p := setup(t, faults{})
	ctx := ctxT(t, 2*time.Minute)
	obj, err := p.Provision(ctx, provisionReq(lease.GVisorLowerRisk))
	if err != nil {
		t.Fatal(err)
	}
	other := newProvider(t, env, ns, "other")
	if err := other.Destroy(ctx, driver.Object{CellID: obj.CellID}); !errors.Is(err, driver.ErrUncertain) {
		t.Fatalf("another pool's Destroy of the claim: %v, want driver.ErrUncertain", err)
	}
	if err := p.Destroy(ctx, driver.Object{CellID: obj.CellID}); err != nil {
		t.Fatal(err)
	}
	requireEmpty(t, env, ns)
	if _, err := getClaim(ctx, env, ns, agentsandbox.ClaimName(obj.CellID)); !apierrors.IsNotFound(err) {
		t.Errorf("claim after Destroy: %v", err)
	}
}

// TestAbandonedCreateIsWaitedOut: Provision gives up while its claim create
// is in flight; Destroy must not prove the cell absent before that create
// has landed, or the claim it makes outlives the proof.
func TestAbandonedCreateIsWaitedOut(t *testing.T) {
	env := sharedEnv(t)
	ns := env.Namespace(t)
	startController(t, env, ns, faults{})
	rc, late := k8stest.LateCreates(env.Config, "sandboxclaims", 500*time.Millisecond)
	p := newProvider(t, env, ns, "late", func(c *agentsandbox.Config) { c.RESTConfig = rc })
	if _, err := p.List(ctxT(t, time.Minute)); err != nil { // resolves the API versions first
		t.Fatal(err)
	}
	late.Abandon(t, p, provisionReq(lease.GVisorLowerRisk))
	requireEmpty(t, env, ns)
}
