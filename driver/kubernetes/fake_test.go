package kubernetes

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/internal/kubeconf"
	"github.com/sandboxwich/sandboxwich/lease"
)

// Fault cases a real API server cannot be made to produce on demand run
// against client-go's fake clientset.

// fakeInstallation is the installation tag of the package's own tests.
var fakeInstallation = driver.InstallationTag("kubernetes-test")

const fakeImage = "registry.invalid/cell@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func fakeProvider(t *testing.T, cs *fake.Clientset) *Provider {
	t.Helper()
	p, err := New(Config{
		Client:            cs,
		Namespace:         "cells",
		Pool:              "p",
		Installation:      fakeInstallation,
		RuntimeClassNames: map[lease.RuntimeClass]string{lease.GVisorLowerRisk: "gvisor", lease.KataMicroVM: "kata"},
		Image:             fakeImage,
		Logger:            slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// readyPod is the Pod a cell would have once admitted and running.
func readyPod(p *Provider, cellID uuid.UUID, uid string) *corev1.Pod {
	pod := p.podSpec(cellID, lease.GVisorLowerRisk, "gvisor", fakeImage)
	pod.UID = types.UID(uid)
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning,
		ContainerStatuses: []corev1.ContainerStatus{{Name: ContainerName, Ready: true}}}
	return pod
}

var podsGVR = schema.GroupVersionResource{Version: "v1", Resource: "pods"}

// TestDestroyAcceptedButNotConfirmed: the API server accepts the delete
// and keeps returning the same Pod. Destroy returns ErrUncertain when its
// context ends — never proof.
func TestDestroyAcceptedButNotConfirmed(t *testing.T) {
	id := uuid.Must(uuid.NewV7())
	cs := fake.NewClientset()
	p := fakeProvider(t, cs)
	pod := readyPod(p, id, "uid-1")
	if err := cs.Tracker().Add(pod); err != nil {
		t.Fatal(err)
	}
	var deletes int
	var sawUID types.UID
	cs.PrependReactor("delete", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		deletes++
		if opts := a.(k8stesting.DeleteActionImpl).DeleteOptions; opts.Preconditions != nil && opts.Preconditions.UID != nil {
			sawUID = *opts.Preconditions.UID
		}
		return true, nil, nil // accepted, nothing happens
	})
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	err := p.Destroy(ctx, driver.Object{CellID: id, Identity: "uid-1"})
	if !errors.Is(err, driver.ErrUncertain) {
		t.Fatalf("Destroy = %v, want driver.ErrUncertain", err)
	}
	// Its context ended the wait (the mechanism, not a duration a loaded
	// machine stretches; a Destroy that ignored it would never return).
	if ctx.Err() == nil || !strings.Contains(err.Error(), context.DeadlineExceeded.Error()) {
		t.Errorf("Destroy = %v, want it ended by its context (%v)", err, ctx.Err())
	}
	if deletes != 1 || sawUID != "uid-1" {
		t.Errorf("deletes = %d with UID precondition %q; want 1 with uid-1", deletes, sawUID)
	}
	if !strings.Contains(err.Error(), "absence of uid uid-1 not confirmed") {
		t.Errorf("error does not say what was not confirmed: %v", err)
	}
}

// TestDestroyErrorsAreUncertain: any error on the way is uncertain.
func TestDestroyErrorsAreUncertain(t *testing.T) {
	for _, tc := range []struct {
		verb string
		err  error
	}{
		{"get", apierrors.NewInternalError(errors.New("etcd unavailable"))},
		{"get", apierrors.NewTimeoutError("slow", 1)},
		{"delete", apierrors.NewServiceUnavailable("overloaded")},
		{"delete", apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "x", errors.New("rbac"))},
	} {
		t.Run(tc.verb+"/"+string(apierrors.ReasonForError(tc.err)), func(t *testing.T) {
			id := uuid.Must(uuid.NewV7())
			cs := fake.NewClientset()
			p := fakeProvider(t, cs)
			if err := cs.Tracker().Add(readyPod(p, id, "uid-1")); err != nil {
				t.Fatal(err)
			}
			cs.PrependReactor(tc.verb, "pods", func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, tc.err })
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			if err := p.Destroy(ctx, driver.Object{CellID: id, Identity: "uid-1"}); !errors.Is(err, driver.ErrUncertain) {
				t.Fatalf("Destroy = %v, want driver.ErrUncertain", err)
			}
		})
	}
}

// TestDestroyConflictThenOtherUID: the UID precondition fails because the
// name belongs to a new Pod; that is proof the old one is gone, and the
// new one is not deleted.
func TestDestroyConflictThenOtherUID(t *testing.T) {
	id := uuid.Must(uuid.NewV7())
	cs := fake.NewClientset()
	p := fakeProvider(t, cs)
	if err := cs.Tracker().Add(readyPod(p, id, "uid-new")); err != nil {
		t.Fatal(err)
	}
	deleted := false
	cs.PrependReactor("delete", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		deleted = true
		return true, nil, nil
	})
	// Old identity: proven absent without a delete.
	if err := p.Destroy(context.Background(), driver.Object{CellID: id, Identity: "uid-old"}); err != nil {
		t.Fatal(err)
	}
	if deleted {
		t.Fatal("Destroy of an old identity deleted the new pod")
	}
	// A race: the Get still saw the old UID, the delete hit the new Pod's
	// precondition, and the read after it finds the new UID.
	gets := 0
	cs.PrependReactor("get", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		gets++
		if gets == 1 {
			return true, readyPod(p, id, "uid-old"), nil
		}
		return false, nil, nil
	})
	cs.PrependReactor("delete", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "pods"}, PodName(id), errors.New("uid precondition"))
	})
	if err := p.Destroy(context.Background(), driver.Object{CellID: id, Identity: "uid-old"}); err != nil {
		t.Fatalf("Destroy after a precondition conflict: %v", err)
	}
}

// TestInspectAPIError: an unreachable API server is an error, never "does
// not exist".
func TestInspectAPIError(t *testing.T) {
	cs := fake.NewClientset()
	p := fakeProvider(t, cs)
	cs.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewServiceUnavailable("down")
	})
	if o, err := p.Inspect(context.Background(), driver.Object{CellID: uuid.Must(uuid.NewV7())}); err == nil {
		t.Fatalf("Inspect = %+v, want an error", o)
	}
}

// TestObserveWeakenedPod: admission that weakens the Pod's isolation makes
// the runtime class unverifiable even when runtimeClassName is right.
func TestObserveWeakenedPod(t *testing.T) {
	p := fakeProvider(t, fake.NewClientset())
	id := uuid.Must(uuid.NewV7())
	for name, mutate := range map[string]func(*corev1.Pod){
		"hostPID":     func(pod *corev1.Pod) { pod.Spec.HostPID = true },
		"hostNetwork": func(pod *corev1.Pod) { pod.Spec.HostNetwork = true },
		"privileged":  func(pod *corev1.Pod) { pod.Spec.Containers[0].SecurityContext.Privileged = ptr(true) },
		"escalation":  func(pod *corev1.Pod) { pod.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = ptr(true) },
		"image":       func(pod *corev1.Pod) { pod.Spec.Containers[0].Image = "evil.invalid/x:latest" },
		"token":       func(pod *corev1.Pod) { pod.Spec.AutomountServiceAccountToken = nil },
		"sidecar": func(pod *corev1.Pod) {
			pod.Spec.InitContainers = []corev1.Container{{Name: "s", SecurityContext: &corev1.SecurityContext{Privileged: ptr(true)}}}
		},
		"labels":       func(pod *corev1.Pod) { pod.Labels[LabelPool] = "other" },
		"no container": func(pod *corev1.Pod) { pod.Spec.Containers[0].Name = "renamed" },
		"image record": func(pod *corev1.Pod) { pod.Annotations[AnnotationImage] = otherImage },
		"image record not pinned": func(pod *corev1.Pod) {
			pod.Annotations[AnnotationImage] = "evil.invalid/x:latest"
			pod.Spec.Containers[0].Image = "evil.invalid/x:latest"
		},
		"image and record other than configured, record dropped": func(pod *corev1.Pod) {
			delete(pod.Annotations, AnnotationImage)
			pod.Spec.Containers[0].Image = otherImage
		},
	} {
		pod := readyPod(p, id, "uid-1")
		if o := p.observe(pod, ""); o.RuntimeClass != lease.GVisorLowerRisk || !o.Ready {
			t.Fatalf("unmodified pod: %+v", o)
		}
		mutate(pod)
		if o := p.observe(pod, ""); o.RuntimeClass != "" {
			t.Errorf("%s: runtime class %q, want none (%s)", name, o.RuntimeClass, o.Detail)
		}
	}
}

// otherImage is a digest-pinned image other than fakeImage.
const otherImage = "registry.invalid/task@sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"

// TestObserveImage: the admitted cell container must run the image its
// Pod records (AnnotationImage), and, when the caller names the image it
// asked for, that one; a Pod created before the record expects
// Config.Image, which a provider of an image class does not have.
func TestObserveImage(t *testing.T) {
	p := fakeProvider(t, fake.NewClientset())
	id := uuid.Must(uuid.NewV7())
	verified := func(o driver.Observation) bool { return o.RuntimeClass == lease.GVisorLowerRisk }

	pod := p.podSpec(id, lease.GVisorLowerRisk, "gvisor", otherImage)
	pod.UID = "uid"
	if pod.Spec.Containers[0].Image != otherImage || pod.Annotations[AnnotationImage] != otherImage {
		t.Fatalf("pod spec: image %q, annotations %v", pod.Spec.Containers[0].Image, pod.Annotations)
	}
	if o := p.observe(pod, ""); !verified(o) {
		t.Errorf("as recorded: %s", o.Detail)
	}
	if o := p.observe(pod, otherImage); !verified(o) {
		t.Errorf("as asked: %s", o.Detail)
	}
	if o := p.observe(pod, fakeImage); verified(o) || !strings.Contains(o.Detail, "not the requested") {
		t.Errorf("another image asked: %+v", o)
	}

	// Created before the record: Config.Image is expected.
	legacy := readyPod(p, id, "uid")
	delete(legacy.Annotations, AnnotationImage)
	if o := p.observe(legacy, ""); !verified(o) {
		t.Errorf("legacy pod of the configured image: %s", o.Detail)
	}
	legacy.Spec.Containers[0].Image = otherImage
	if o := p.observe(legacy, ""); verified(o) {
		t.Errorf("legacy pod of another image: %+v", o)
	}

	class, err := New(Config{Client: fake.NewClientset(), Namespace: "cells", Pool: "p", Installation: fakeInstallation,
		RuntimeClassNames: map[lease.RuntimeClass]string{lease.GVisorLowerRisk: "gvisor"}, ImageClass: true,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	pod = class.podSpec(id, lease.GVisorLowerRisk, "gvisor", otherImage)
	if o := class.observe(pod, ""); !verified(o) {
		t.Errorf("image class pod: %s", o.Detail)
	}
	delete(pod.Annotations, AnnotationImage)
	if o := class.observe(pod, ""); verified(o) || !strings.Contains(o.Detail, "records no image") {
		t.Errorf("image class pod without its record: %+v", o)
	}
}

// TestPodReady covers the readiness rule.
func TestPodReady(t *testing.T) {
	p := fakeProvider(t, fake.NewClientset())
	id := uuid.Must(uuid.NewV7())
	for name, tc := range map[string]struct {
		mutate func(*corev1.Pod)
		want   bool
	}{
		"running":     {func(*corev1.Pod) {}, true},
		"pending":     {func(pod *corev1.Pod) { pod.Status.Phase = corev1.PodPending }, false},
		"not ready":   {func(pod *corev1.Pod) { pod.Status.ContainerStatuses[0].Ready = false }, false},
		"no statuses": {func(pod *corev1.Pod) { pod.Status.ContainerStatuses = nil }, false},
		"terminating": {func(pod *corev1.Pod) { pod.DeletionTimestamp = &metav1.Time{Time: time.Now()} }, false},
	} {
		pod := readyPod(p, id, "uid")
		tc.mutate(pod)
		if got := kubeconf.PodReady(pod); got != tc.want {
			t.Errorf("%s: ready = %v, want %v", name, got, tc.want)
		}
	}
}

// TestProvisionIdempotentOnLostResponse: the create reached the server but
// its response was lost; the retry finds the Pod and returns its UID.
func TestProvisionIdempotentOnLostResponse(t *testing.T) {
	id := uuid.Must(uuid.NewV7())
	cs := fake.NewClientset()
	p := fakeProvider(t, cs)
	if err := cs.Tracker().Add(readyPod(p, id, "uid-1")); err != nil {
		t.Fatal(err)
	}
	obj, err := p.Provision(context.Background(), driver.ProvisionRequest{CellID: id, RuntimeClass: lease.GVisorLowerRisk})
	if err != nil {
		t.Fatal(err)
	}
	if obj.Identity != "uid-1" {
		t.Fatalf("identity %q, want the existing pod's", obj.Identity)
	}
	// The existing Pod is the other class's: verification refuses it.
	if _, err := p.Provision(context.Background(), driver.ProvisionRequest{CellID: id, RuntimeClass: lease.KataMicroVM}); !errors.As(err, new(*driver.VerifyError)) {
		t.Fatalf("Provision of the same cell for another class: %v, want a *driver.VerifyError", err)
	}
}

// TestProvisionRefusesOpenNetworkPolicy: an existing policy of the same
// name that allows traffic stops provisioning.
func TestProvisionRefusesOpenNetworkPolicy(t *testing.T) {
	cs := fake.NewClientset()
	p := fakeProvider(t, cs)
	np := p.networkPolicy()
	np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{}} // allow all egress
	if err := cs.Tracker().Add(np); err != nil {
		t.Fatal(err)
	}
	_, err := p.Provision(context.Background(), driver.ProvisionRequest{CellID: uuid.Must(uuid.NewV7()), RuntimeClass: lease.GVisorLowerRisk})
	if err == nil || !strings.Contains(err.Error(), "allows traffic") {
		t.Fatalf("Provision with an open network policy: %v", err)
	}
	if pods, _ := cs.CoreV1().Pods("cells").List(context.Background(), metav1.ListOptions{}); len(pods.Items) != 0 {
		t.Fatal("a pod was created behind an open network policy")
	}
}

// TestNewValidates names the bad field.
func TestNewValidates(t *testing.T) {
	good := func() Config {
		return Config{Client: fake.NewClientset(), Namespace: "cells", Pool: "p", Installation: fakeInstallation,
			RuntimeClassNames: map[lease.RuntimeClass]string{lease.GVisorLowerRisk: "gvisor"}, Image: fakeImage}
	}
	if _, err := New(good()); err != nil {
		t.Fatal(err)
	}
	for field, edit := range map[string]func(*Config){
		"image":               func(c *Config) { c.Image = "registry.invalid/cell:latest" },
		"namespace":           func(c *Config) { c.Namespace = "" },
		"pool":                func(c *Config) { c.Pool = "a/b" },
		"installation":        func(c *Config) { c.Installation = "" },
		"runtime_class_names": func(c *Config) { c.RuntimeClassNames = nil },
		"rest_config":         func(c *Config) { c.Client = nil },
		"memory":              func(c *Config) { c.Memory = "lots" },
		"cpu":                 func(c *Config) { c.CPU = "-1" },
	} {
		c := good()
		edit(&c)
		if _, err := New(c); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: New error %v does not name the field", field, err)
		}
	}
	for name, tc := range map[string]struct {
		image, want string
		class       bool
	}{
		"no image":                 {"", "image is required", false},
		"an image class's image":   {fakeImage, "must be empty with image_class", true},
		"an image class, no image": {"", "", true},
	} {
		c := good()
		c.Image, c.ImageClass = tc.image, tc.class
		_, err := New(c)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: New = %v, want %q", name, err, tc.want)
		}
	}
	dup := good()
	dup.RuntimeClassNames = map[lease.RuntimeClass]string{lease.GVisorLowerRisk: "same", lease.KataMicroVM: "same"}
	if _, err := New(dup); err == nil {
		t.Error("New accepted two classes mapped to one RuntimeClass name")
	}
}

// TestConfigFromSettings maps the binary's settings.
func TestConfigFromSettings(t *testing.T) {
	kc := t.TempDir() + "/kubeconfig"
	if err := writeKubeconfig(kc); err != nil {
		t.Fatal(err)
	}
	cfg, err := ConfigFromSettings("team:a/pool", map[string]string{
		"kubeconfig": kc, "namespace": "cells", "image": fakeImage,
		"runtime_class_gvisor_lower_risk": "gvisor", "cpu": "2", "network_policy": "false",
		"ready_timeout_ms": "1500", "command": "sleep 3600",
	})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Pool != "team-a-pool" || cfg.RuntimeClassNames[lease.GVisorLowerRisk] != "gvisor" || cfg.CPU != "2" ||
		cfg.NetworkPolicy == nil || *cfg.NetworkPolicy || cfg.ReadyTimeout != 1500*time.Millisecond ||
		strings.Join(cfg.Command, " ") != "sleep 3600" || cfg.RESTConfig.Host != "https://127.0.0.1:6443" {
		t.Fatalf("config: %+v", cfg)
	}
	cfg.Installation = fakeInstallation // the binary adds the store's
	if _, err := New(cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := ConfigFromSettings("p", map[string]string{"kubeconfig": kc, "namspace": "x"}); err == nil || !strings.Contains(err.Error(), "namspace") {
		t.Fatalf("unknown setting: %v", err)
	}
	cfg, err = ConfigFromSettings("p", map[string]string{"kubeconfig": kc, "namespace": "cells", "image_class": "true",
		"runtime_class_gvisor_lower_risk": "gvisor"})
	if err != nil || !cfg.ImageClass || cfg.Image != "" {
		t.Fatalf("image_class: %+v, %v", cfg, err)
	}
	cfg.Installation = fakeInstallation
	if _, err := New(cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := ConfigFromSettings("p", map[string]string{"kubeconfig": kc, "image_class": "yes please"}); err == nil ||
		!strings.Contains(err.Error(), "image_class") {
		t.Fatalf("bad image_class: %v", err)
	}
}

func writeKubeconfig(path string) error {
	const kc = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://127.0.0.1:6443
users:
- name: u
  user:
    token: not-a-secret
contexts:
- name: x
  context:
    cluster: c
    user: u
current-context: x
`
	return os.WriteFile(path, []byte(kc), 0o600)
}
