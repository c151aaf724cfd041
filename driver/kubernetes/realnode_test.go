package kubernetes_test

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/drivertest"
	"github.com/sandboxwich/sandboxwich/driver/kubernetes"
	"github.com/sandboxwich/sandboxwich/internal/k8stest"
	"github.com/sandboxwich/sandboxwich/internal/testimage"
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

func (h realHarness) Images(t *testing.T) []drivertest.TestImage { return markedImages(t, h.node) }

// markedImages pushes two images to a registry of the node for the
// test: the node's busybox, each with its own marker file.
func markedImages(t *testing.T, node *k8stest.Node) []drivertest.TestImage {
	t.Helper()
	base, err := k8stest.BusyboxImage()
	if err != nil {
		t.Fatal(err)
	}
	reg := node.Registry(t)
	var out []drivertest.TestImage
	for _, task := range []string{"task-1", "task-2"} {
		marker := "image " + task + "\n"
		layer, err := testimage.Layer(testimage.Entry{Name: "etc/", Type: tar.TypeDir}, testimage.Entry{Name: "etc/marker", Body: marker})
		if err != nil {
			t.Fatal(err)
		}
		img, err := mutate.AppendLayers(base, layer)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, drivertest.TestImage{Ref: reg.Push(t, "marked/"+task, img), MarkerPath: "/etc/marker", Marker: marker})
	}
	return out
}

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

// TestRealNodeImageFromRegistry: containerd pulls the pool's digest-pinned
// image from a loopback registry (through its hosts.toml mirror), and the
// driver reads back the repo digest the kubelet reports; an image whose
// content does not match its pinned digest never makes a ready cell.
func TestRealNodeImageFromRegistry(t *testing.T) {
	node := k8stest.SharedNode(t)
	ns := node.Namespace(t)
	reg := node.Registry(t)
	img, err := k8stest.BusyboxImage()
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.Config(img, v1.Config{Env: []string{"PATH=/bin", "POOL=registry"}})
	if err != nil {
		t.Fatal(err)
	}
	ref := reg.Push(t, "cell", img)
	digest := ref[strings.Index(ref, "@")+1:]
	ctx := ctxT(t, 4*time.Minute)

	p := newRealProvider(t, node, ns, "registry", func(c *kubernetes.Config) { c.Image = ref })
	obj, err := p.Provision(ctx, provisionReq(lease.GVisorLowerRisk))
	if err != nil {
		t.Fatalf("Provision: %v\nkubelet log:\n%s", err, node.Log("kubelet"))
	}
	o, err := p.Inspect(ctx, obj)
	if err != nil {
		t.Fatal(err)
	}
	if !o.Ready || o.ImageDigest != digest {
		t.Fatalf("Inspect = %+v, want ready with image %s", o, digest)
	}
	pod, err := node.Client.CoreV1().Pods(ns).Get(ctx, kubernetes.PodName(obj.CellID), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if !strings.HasSuffix(cs.ImageID, reg.Host+"/cell@"+digest) {
			t.Errorf("imageID = %q, want the repo digest %s/cell@%s", cs.ImageID, reg.Host, digest)
		}
	}
	if err := p.Destroy(ctx, obj); err != nil {
		t.Fatalf("Destroy: %v", err)
	}

	// A second image, pinned by its digest, whose manifest the registry
	// swaps for the first image's: the runtime refuses content that does
	// not hash to the pinned digest, and the cell never becomes ready.
	other, err := mutate.Config(img, v1.Config{Env: []string{"PATH=/bin", "POOL=other"}})
	if err != nil {
		t.Fatal(err)
	}
	otherRef := reg.Push(t, "other", other)
	manifest, err := img.RawManifest()
	if err != nil {
		t.Fatal(err)
	}
	swapped := strings.Replace(otherRef, reg.Host, "/v2", 1)
	swapped = strings.Replace(swapped, "@", "/manifests/", 1)
	fault := func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != swapped {
			return false
		}
		w.Header().Set("Content-Type", string(types.OCIManifestSchema1))
		w.Header().Set("Docker-Content-Digest", otherRef[strings.Index(otherRef, "@")+1:])
		w.Header().Set("Content-Length", fmt.Sprint(len(manifest)))
		if r.Method != http.MethodHead {
			_, _ = w.Write(manifest)
		}
		return true
	}
	reg.Fault.Store(&fault)
	bad := newRealProvider(t, node, ns, "mismatch", func(c *kubernetes.Config) {
		c.Image = otherRef
		c.ReadyTimeout = 45 * time.Second
	})
	obj, err = bad.Provision(ctx, provisionReq(lease.GVisorLowerRisk))
	if err == nil {
		t.Fatal("Provision of an image whose content does not match its digest succeeded")
	}
	if obj.Identity != "" {
		if err := bad.Destroy(ctx, obj); err != nil {
			t.Fatalf("Destroy: %v", err)
		}
	}
	requireNoPods(t, node.Env, ns)
}

// TestRealNodeImagePerCell: a provider of an image class (no image of its
// own) makes each cell of the image its provision names (two images that
// differ in their configuration); containerd pulls each from the
// registry, and the driver reads back each one's repo digest from the
// kubelet.
func TestRealNodeImagePerCell(t *testing.T) {
	node := k8stest.SharedNode(t)
	ns := node.Namespace(t)
	reg := node.Registry(t)
	base, err := k8stest.BusyboxImage()
	if err != nil {
		t.Fatal(err)
	}
	p := newRealProvider(t, node, ns, "perimage", func(c *kubernetes.Config) { c.Image, c.ImageClass = "", true })
	ctx := ctxT(t, 4*time.Minute)
	for _, task := range []string{"task-1", "task-2"} {
		img, err := mutate.Config(base, v1.Config{Env: []string{"PATH=/bin", "TASK=" + task}})
		if err != nil {
			t.Fatal(err)
		}
		ref := reg.Push(t, "swe/"+task, img)
		req := provisionReq(lease.GVisorLowerRisk)
		req.Image = ref
		obj, err := p.Provision(ctx, req)
		if err != nil {
			t.Fatalf("Provision(%s): %v\nkubelet log:\n%s", ref, err, node.Log("kubelet"))
		}
		o, err := p.Inspect(ctx, obj)
		if err != nil {
			t.Fatal(err)
		}
		if want := ref[strings.Index(ref, "@")+1:]; !o.Ready || o.ImageDigest != want || driver.Verify(obj, o, lease.GVisorLowerRisk) != nil {
			t.Errorf("Inspect(%s) = %+v, want ready, verified, image digest %s", task, o, want)
		}
		if err := p.Destroy(ctx, obj); err != nil {
			t.Fatalf("Destroy: %v", err)
		}
	}
	requireNoPods(t, node.Env, ns)
}
