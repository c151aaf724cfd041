package kubernetes_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/kubernetes"
	"github.com/sandboxwich/sandboxwich/internal/imageref"
	"github.com/sandboxwich/sandboxwich/internal/k8stest"
	"github.com/sandboxwich/sandboxwich/lease"
)

// Images of image-class cells (CONTRACT §21): pinned by digest, one with
// a display tag; neither is Config.Image.
var (
	taskDigest = "sha256:" + strings.Repeat("b", 64)
	taskImage  = "registry.invalid/swe/task-1@" + taskDigest
	taskTagged = "registry.invalid/swe/task-2:v1@sha256:" + strings.Repeat("c", 64)
	evilImage  = "registry.invalid/evil/cell@sha256:" + strings.Repeat("e", 64)
)

// cellPod reads the Pod of a cell back from the API server.
func cellPod(ctx context.Context, t testing.TB, env *k8stest.Env, ns string, cellID uuid.UUID) *corev1.Pod {
	t.Helper()
	pod, err := env.Client.CoreV1().Pods(ns).Get(ctx, kubernetes.PodName(cellID), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// requireImage fails unless the admitted Pod's cell container runs image
// and the Pod records it.
func requireImage(t testing.TB, pod *corev1.Pod, image string) {
	t.Helper()
	if len(pod.Spec.Containers) != 1 || pod.Spec.Containers[0].Name != kubernetes.ContainerName {
		t.Fatalf("containers: %+v", pod.Spec.Containers)
	}
	if got := pod.Spec.Containers[0].Image; got != image {
		t.Errorf("cell container image = %q, want %q", got, image)
	}
	if got := pod.Annotations[kubernetes.AnnotationImage]; got != image {
		t.Errorf("annotation %s = %q, want %q", kubernetes.AnnotationImage, got, image)
	}
}

// TestProvisionRequestImage: a provision that names an image yields a Pod
// whose cell container runs exactly it, and whose read-back (Provision's,
// Inspect's, a retry's) passes; the admitted digest is still the
// kubelet's. A provision without one keeps Config.Image. A retry of the
// cell for another image than its Pod runs is refused.
func TestProvisionRequestImage(t *testing.T) {
	t.Parallel()
	env := k8stest.Shared(t)
	ns := env.Namespace(t)
	ctx := ctxT(t, 2*time.Minute)
	p := newProvider(t, env, ns, "perimage")
	if !p.Capabilities().Images {
		t.Fatal("Capabilities().Images = false")
	}
	var objs []driver.Object
	for _, image := range []string{taskImage, taskTagged, ""} {
		req := provisionReq(lease.GVisorLowerRisk)
		req.Image = image
		obj, err := p.Provision(ctx, req)
		if err != nil {
			t.Fatalf("Provision(image %q): %v", image, err)
		}
		objs = append(objs, obj)
		want := image
		if want == "" {
			want = testImage
		}
		requireImage(t, cellPod(ctx, t, env, ns, req.CellID), want)
		o, err := p.Inspect(ctx, obj)
		if err != nil {
			t.Fatal(err)
		}
		if !o.Ready || o.RuntimeClass != lease.GVisorLowerRisk {
			t.Errorf("Inspect(image %q) = %+v", image, o)
		}
		if err := driver.Verify(obj, o, lease.GVisorLowerRisk); err != nil {
			t.Errorf("Verify(image %q): %v", image, err)
		}
		// A retry (a lost response) finds the same Pod and verifies it.
		again, err := p.Provision(ctx, req)
		if err != nil || again != obj {
			t.Errorf("retried Provision(image %q) = %+v, %v; want %+v", image, again, err, obj)
		}
	}

	// The admitted digest is the kubelet's, never the request's.
	first := objs[0]
	name := kubernetes.PodName(first.CellID)
	if o, err := p.Inspect(ctx, first); err != nil || o.ImageDigest != "" {
		t.Fatalf("Inspect before the kubelet reports an imageID = %+v, %v; want no digest", o, err)
	}
	setImageID(ctx, t, env, ns, name, "docker-pullable://"+taskImage)
	if o, err := p.Inspect(ctx, first); err != nil || o.ImageDigest != taskDigest || o.RuntimeClass != lease.GVisorLowerRisk {
		t.Fatalf("Inspect = %+v, %v; want image digest %s", o, err, taskDigest)
	}

	// The same cell asked again for another image than its Pod runs.
	for _, image := range []string{"", evilImage} {
		req := driver.ProvisionRequest{CellID: first.CellID, RuntimeClass: lease.GVisorLowerRisk, Image: image}
		_, err := p.Provision(ctx, req)
		requireVerifyError(t, err, "admitted runtime class is none")
		if !strings.Contains(err.Error(), taskImage) {
			t.Errorf("retry for image %q: error %v does not name the pod's image", image, err)
		}
	}

	for _, obj := range objs {
		if err := p.Destroy(ctx, obj); err != nil {
			t.Fatalf("Destroy: %v", err)
		}
	}
	requireNoPods(t, env, ns)
}

// setImage is a webhook's patch that makes the cell container run image;
// with record, the Pod's record of its image says so too.
func setImage(image string, record bool) k8stest.Mutator {
	return func(pod *corev1.Pod) []k8stest.PatchOp {
		ops := []k8stest.PatchOp{{Op: "replace", Path: "/spec/containers/0/image", Value: image}}
		if record {
			ops = append(ops, k8stest.PatchOp{Op: "add", Path: "/metadata/annotations/sandboxwich.dev~1image", Value: image})
		}
		return ops
	}
}

// dropImageRecord is a webhook's patch that removes the Pod's record of
// its image.
func dropImageRecord(pod *corev1.Pod) []k8stest.PatchOp {
	if _, ok := pod.Annotations[kubernetes.AnnotationImage]; !ok {
		return nil
	}
	return []k8stest.PatchOp{{Op: "remove", Path: "/metadata/annotations/sandboxwich.dev~1image"}}
}

// TestWebhookRewritesImage: a mutating admission webhook changes the cell
// container's image — of a requested image or of Config.Image, alone or
// together with the Pod's record of it — or drops the record. Provision
// compares the admitted Pod with what was asked and refuses it with
// runtime_class_boundary_unverified; the Pod is destroyed with proof.
func TestWebhookRewritesImage(t *testing.T) {
	t.Parallel()
	env := k8stest.Shared(t)
	for _, tc := range []struct {
		name    string
		image   string // requested; "" is Config.Image
		mutate  k8stest.Mutator
		inspect bool // Inspect (which has only the Pod's record) refuses it too
	}{
		{"requested image swapped", taskImage, setImage(evilImage, false), true},
		{"configured image swapped", "", setImage(evilImage, false), true},
		{"requested image and record swapped", taskImage, setImage(evilImage, true), false},
		{"requested image swapped for the configured one", taskImage, setImage(testImage, false), true},
		{"record dropped", taskImage, dropImageRecord, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ns := env.Namespace(t)
			wh := env.MutatingWebhook(t, ns, tc.mutate)
			p := newProvider(t, env, ns, "rewrite")
			ctx := ctxT(t, 2*time.Minute)
			req := provisionReq(lease.GVisorLowerRisk)
			req.Image = tc.image
			obj, err := p.Provision(ctx, req)
			requireVerifyError(t, err, "admitted runtime class is none")
			if wh.Requests.Load() == 0 {
				t.Fatal("the webhook saw no pod")
			}
			if obj.Identity == "" {
				t.Fatal("Provision returned no identity for the pod it created")
			}
			o, err := p.Inspect(ctx, obj)
			if err != nil {
				t.Fatal(err)
			}
			if tc.inspect && (o.RuntimeClass != "" || !strings.Contains(o.Detail, "image")) {
				t.Errorf("Inspect = %+v, want no runtime class and the image named", o)
			}
			if err := p.Destroy(ctx, obj); err != nil {
				t.Fatalf("Destroy: %v", err)
			}
			requireNoPods(t, env, ns)
		})
	}
}

// requireNothingCreated fails unless namespace ns holds no Pod, Secret or
// NetworkPolicy.
func requireNothingCreated(ctx context.Context, t testing.TB, env *k8stest.Env, ns string) {
	t.Helper()
	requireNoPods(t, env, ns)
	secrets, err := env.Client.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range secrets.Items {
		t.Errorf("secret %s created", s.Name)
	}
	nps, err := env.Client.NetworkingV1().NetworkPolicies(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, np := range nps.Items {
		t.Errorf("network policy %s created", np.Name)
	}
}

// TestProvisionRefusesUnpinnedImage: a requested image that a tag names,
// or that is malformed, is refused before anything is created — no Pod,
// no Secret (the provider runs the agent, whose Secrets come first), no
// NetworkPolicy.
func TestProvisionRefusesUnpinnedImage(t *testing.T) {
	t.Parallel()
	env := k8stest.Shared(t)
	ns := env.Namespace(t)
	ctx := ctxT(t, 2*time.Minute)
	p := newProvider(t, env, ns, "unpinned", func(c *kubernetes.Config) { c.AgentImage = testAgentImage })
	hex := strings.Repeat("a", 64)
	for _, image := range []string{
		"registry.invalid/swe/task-1:latest",             // a tag only
		"registry.invalid/swe/task-1",                    // nothing
		"registry.invalid/swe/task-1@sha256:" + hex[:63], // short
		"registry.invalid/swe/task-1@sha256:" + strings.ToUpper(hex),
		"registry.invalid/swe/task-1@sha512:" + hex + hex, // not SHA-256
		"registry.invalid/swe/task-1@@sha256:" + hex,
		"Registry.Invalid/SWE/task-1@sha256:" + hex,  // not a valid repository
		" registry.invalid/swe/task-1@sha256:" + hex, // spaces
		"registry.invalid/swe/task-1@sha256:" + hex + "\n",
	} {
		req := provisionReq(lease.GVisorLowerRisk)
		req.Image = image
		obj, err := p.Driver().Provision(ctx, req)
		var ie *imageref.Error
		if !errors.As(err, &ie) || ie.Ref != image {
			t.Errorf("Provision(image %q) = %+v, %v; want an *imageref.Error naming it", image, obj, err)
		}
		if obj.Identity != "" {
			t.Errorf("Provision(image %q) returned identity %q", image, obj.Identity)
		}
	}
	requireNothingCreated(ctx, t, env, ns)
}

// TestImageClassProvider: a provider with no image of its own
// (Config.ImageClass) makes a cell of every image a provision names, and
// refuses one that names none with kubernetes.ErrNoImage, creating
// nothing.
func TestImageClassProvider(t *testing.T) {
	t.Parallel()
	env := k8stest.Shared(t)
	ns := env.Namespace(t)
	ctx := ctxT(t, 2*time.Minute)
	p := newProvider(t, env, ns, "class", func(c *kubernetes.Config) { c.Image, c.ImageClass = "", true })
	if !p.Capabilities().Images {
		t.Fatal("Capabilities().Images = false")
	}
	obj, err := p.Provision(ctx, provisionReq(lease.GVisorLowerRisk))
	if !errors.Is(err, kubernetes.ErrNoImage) || obj.Identity != "" {
		t.Fatalf("Provision without an image = %+v, %v; want kubernetes.ErrNoImage", obj, err)
	}
	requireNothingCreated(ctx, t, env, ns)

	req := provisionReq(lease.KataMicroVM)
	req.Image = taskImage
	if obj, err = p.Provision(ctx, req); err != nil {
		t.Fatal(err)
	}
	requireImage(t, cellPod(ctx, t, env, ns, req.CellID), taskImage)
	o, err := p.Inspect(ctx, obj)
	if err != nil {
		t.Fatal(err)
	}
	if err := driver.Verify(obj, o, lease.KataMicroVM); err != nil || !o.Ready {
		t.Fatalf("Inspect = %+v, Verify: %v", o, err)
	}
	// A retry that names no image is refused before anything is read.
	if _, err := p.Provision(ctx, driver.ProvisionRequest{CellID: req.CellID, RuntimeClass: lease.KataMicroVM}); !errors.Is(err, kubernetes.ErrNoImage) {
		t.Errorf("retry without the image: %v, want kubernetes.ErrNoImage", err)
	}
	if err := p.Destroy(ctx, obj); err != nil {
		t.Fatal(err)
	}
	requireNoPods(t, env, ns)
}
