package kubernetes_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandboxwich/sandboxwich/agent/cellagent"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/kubernetes"
	"github.com/sandboxwich/sandboxwich/internal/k8stest"
	"github.com/sandboxwich/sandboxwich/lease"
)

// The package's tests share one control plane (etcd, kube-apiserver and
// kwok); TestAPIServerRestart starts its own.
// The in-process cell agents of the agent tests re-execute the test
// binary as their helper.
func TestMain(m *testing.M) {
	cellagent.HelperMain()
	os.Exit(k8stest.Main(m))
}

// testImage is digest-pinned; kwok never pulls it.
const testImage = "registry.invalid/sandboxwich/cell@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// classNames maps the classes to the RuntimeClass objects k8stest creates.
var classNames = map[lease.RuntimeClass]string{lease.GVisorLowerRisk: "gvisor", lease.KataMicroVM: "kata"}

// testInstallation is the installation tag of the tests' providers.
var testInstallation = driver.InstallationTag("kubernetes-test")

// newProvider returns a provider for the pool in namespace ns of env,
// bound to the kwok node.
func newProvider(t testing.TB, env *k8stest.Env, ns, pool string, edit ...func(*kubernetes.Config)) *kubernetes.Provider {
	t.Helper()
	cfg := kubernetes.Config{
		RESTConfig:        env.Config,
		Namespace:         ns,
		Pool:              pool,
		Installation:      testInstallation,
		RuntimeClassNames: classNames,
		Image:             testImage,
		NodeName:          env.NodeName,
		ReadyTimeout:      time.Minute,
		Logger:            slog.New(slog.DiscardHandler),
	}
	for _, e := range edit {
		e(&cfg)
	}
	p, err := kubernetes.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func provisionReq(class lease.RuntimeClass) driver.ProvisionRequest {
	return driver.ProvisionRequest{CellID: uuid.Must(uuid.NewV7()), RuntimeClass: class}
}

// requireNoPods fails unless the namespace holds no Pods (after Destroy
// proved every one gone).
func requireNoPods(t testing.TB, env *k8stest.Env, ns string) {
	t.Helper()
	pods, err := env.Pods(ctxT(t, time.Minute), ns)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		t.Errorf("leaked pod %s (uid %s, deletion %v)", p.Name, p.UID, p.DeletionTimestamp)
	}
}

// requireVerifyError fails unless err carries a *driver.VerifyError whose
// reason contains want.
func requireVerifyError(t testing.TB, err error, want string) {
	t.Helper()
	var ve *driver.VerifyError
	if !errors.As(err, &ve) {
		t.Fatalf("error %v is not a *driver.VerifyError", err)
	}
	if !strings.Contains(ve.Reason, want) {
		t.Fatalf("verify reason %q does not contain %q", ve.Reason, want)
	}
}

// addFinalizer makes the Pod's deletion unconfirmable until
// removeFinalizer: the API server keeps it Terminating.
func addFinalizer(t testing.TB, env *k8stest.Env, ns, name string) {
	t.Helper()
	patch := []byte(`{"metadata":{"finalizers":["k8stest.sandboxwich.dev/hold"]}}`)
	if _, err := env.Client.CoreV1().Pods(ns).Patch(ctxT(t, time.Minute), name, "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

func removeFinalizer(t testing.TB, env *k8stest.Env, ns, name string) {
	t.Helper()
	patch := []byte(`{"metadata":{"finalizers":null}}`)
	if _, err := env.Client.CoreV1().Pods(ns).Patch(ctxT(t, time.Minute), name, "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// deleteNow is an ordinary (graceful) delete; kwok finalizes it.
func deleteNow() metav1.DeleteOptions { return metav1.DeleteOptions{} }
