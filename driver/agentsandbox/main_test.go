package agentsandbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/agentsandbox"
	"github.com/sandboxwich/sandboxwich/internal/k8stest"
	"github.com/sandboxwich/sandboxwich/lease"
)

// The package's tests share one control plane (etcd, kube-apiserver and
// kwok) with the agent-sandbox v0.5.6 CRDs of testdata/crds installed.
func TestMain(m *testing.M) { os.Exit(k8stest.Main(m)) }

// classNames maps the classes to the RuntimeClass objects k8stest creates.
var classNames = map[lease.RuntimeClass]string{lease.GVisorLowerRisk: "gvisor", lease.KataMicroVM: "kata"}

var (
	crdGVR     = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	claimGVR   = schema.GroupVersionResource{Group: agentsandbox.ExtensionsGroup, Version: agentsandbox.V1beta1, Resource: "sandboxclaims"}
	sandboxGVR = schema.GroupVersionResource{Group: agentsandbox.SandboxGroup, Version: agentsandbox.V1beta1, Resource: "sandboxes"}
)

var crds struct {
	once sync.Once
	err  error
}

// sharedEnv returns the shared control plane with the CRDs installed.
func sharedEnv(t testing.TB) *k8stest.Env {
	t.Helper()
	env := k8stest.Shared(t)
	crds.once.Do(func() { crds.err = installCRDs(env) })
	if crds.err != nil {
		t.Fatalf("installing the agent-sandbox CRDs: %v", crds.err)
	}
	return env
}

// installCRDs creates every CRD of testdata/crds and waits until each is
// established and its resources are served.
func installCRDs(env *k8stest.Env) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		return err
	}
	files, err := filepath.Glob("testdata/crds/*.yaml")
	if err != nil || len(files) != 4 {
		return fmt.Errorf("testdata/crds holds %d CRD files, want 4 (%v)", len(files), err)
	}
	var names []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(b, &u.Object); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if _, err := dyn.Resource(crdGVR).Create(ctx, u, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("%s: %w", f, err)
		}
		names = append(names, u.GetName())
	}
	for _, name := range names {
		err := wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			u, err := dyn.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			for _, c := range conds {
				m, _ := c.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("CRD %s not established: %w", name, err)
		}
	}
	// Discovery must show the resources before a provider asks.
	return wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		for _, gv := range []string{claimGVR.GroupVersion().String(), sandboxGVR.GroupVersion().String()} {
			if _, err := env.Client.Discovery().ServerResourcesForGroupVersion(gv); err != nil {
				return false, nil
			}
		}
		return true, nil
	})
}

// testInstallation is the installation tag of the tests' providers.
var testInstallation = driver.InstallationTag("agentsandbox-test")

// newProvider returns a provider for the pool in namespace ns of env.
func newProvider(t testing.TB, env *k8stest.Env, ns, pool string, edit ...func(*agentsandbox.Config)) *agentsandbox.Provider {
	t.Helper()
	cfg := agentsandbox.Config{
		RESTConfig:        env.Config,
		Namespace:         ns,
		Pool:              pool,
		Installation:      testInstallation,
		WarmPool:          "warm",
		RuntimeClassNames: classNames,
		BindTimeout:       30 * time.Second,
		DeleteTimeout:     30 * time.Second,
		Logger:            slog.New(slog.DiscardHandler),
	}
	for _, e := range edit {
		e(&cfg)
	}
	p, err := agentsandbox.New(cfg)
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

// requireEmpty fails unless the namespace holds no claims, Sandboxes or
// Pods: everything was destroyed with proof.
func requireEmpty(t testing.TB, env *k8stest.Env, ns string) {
	t.Helper()
	ctx := ctxT(t, time.Minute)
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	for _, gvr := range []schema.GroupVersionResource{claimGVR, sandboxGVR} {
		l, err := dyn.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range l.Items {
			t.Errorf("leaked %s %s (uid %s, deletion %v)", gvr.Resource, u.GetName(), u.GetUID(), u.GetDeletionTimestamp())
		}
	}
	pods, err := env.Pods(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		t.Errorf("leaked pod %s (uid %s, deletion %v)", p.Name, p.UID, p.DeletionTimestamp)
	}
}

// getClaim reads a SandboxClaim.
func getClaim(ctx context.Context, env *k8stest.Env, ns, name string) (*unstructured.Unstructured, error) {
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		return nil, err
	}
	return dyn.Resource(claimGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
}
