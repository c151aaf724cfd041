package kubernetes_test

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/kubernetes"
	"github.com/sandboxwich/sandboxwich/internal/k8stest"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
)

// setImageID writes the cell container's status.containerStatuses[].imageID
// as a kubelet would after pulling (kwok sets none).
func setImageID(ctx context.Context, t testing.TB, env *k8stest.Env, ns, name, imageID string) {
	t.Helper()
	for {
		pod, err := env.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for i := range pod.Status.ContainerStatuses {
			if pod.Status.ContainerStatuses[i].Name == kubernetes.ContainerName {
				pod.Status.ContainerStatuses[i].ImageID, found = imageID, true
			}
		}
		if !found {
			t.Fatalf("pod %s has no status of container %s", name, kubernetes.ContainerName)
		}
		_, err = env.Client.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
		if err == nil {
			return
		}
		if !apierrors.IsConflict(err) {
			t.Fatal(err)
		}
	}
}

// testDigest is the digest testImage is pinned by.
var testDigest = testImage[strings.LastIndexByte(testImage, '@')+1:]

// TestImageIDReadBack: the admitted digest is the repo digest of the
// kubelet's imageID, never the requested image: none before the kubelet
// reports one, none for a local image ID, and whatever digest it reports.
func TestImageIDReadBack(t *testing.T) {
	t.Parallel()
	env := k8stest.Shared(t)
	ns := env.Namespace(t)
	ctx := ctxT(t, 2*time.Minute)
	p := newProvider(t, env, ns, "img")
	obj, err := p.Provision(ctx, provisionReq(lease.GVisorLowerRisk))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Destroy(context.Background(), obj) })
	name := kubernetes.PodName(obj.CellID)
	other := "sha256:" + strings.Repeat("9", 64)
	for _, tc := range []struct{ imageID, want string }{
		{"", ""},
		{"sha256:" + strings.Repeat("4", 64), ""}, // a locally imported image: no repo digest
		{testImage, testDigest},
		{"docker-pullable://registry.invalid/sandboxwich/cell@" + testDigest, testDigest},
		{"registry.invalid/sandboxwich/cell@" + other, other},
	} {
		setImageID(ctx, t, env, ns, name, tc.imageID)
		o, err := p.Inspect(ctx, obj)
		if err != nil {
			t.Fatal(err)
		}
		if o.ImageDigest != tc.want {
			t.Errorf("imageID %q: ImageDigest = %q, want %q", tc.imageID, o.ImageDigest, tc.want)
		}
		if err := driver.Verify(obj, o, lease.GVisorLowerRisk); err != nil {
			t.Errorf("imageID %q: the runtime check changed: %v", tc.imageID, err)
		}
	}
	if err := p.Destroy(ctx, obj); err != nil {
		t.Fatal(err)
	}
}

// kubeletPull is the provider of a node whose kubelet reports imageID
// after the Pod started, as containerd does for an image it pulled.
type kubeletPull struct {
	*kubernetes.Provider
	t       testing.TB
	env     *k8stest.Env
	ns      string
	imageID string
}

func (k kubeletPull) Provision(ctx context.Context, req driver.ProvisionRequest) (driver.Object, error) {
	obj, err := k.Provider.Provision(ctx, req)
	if err == nil && k.imageID != "" {
		setImageID(ctx, k.t, k.env, k.ns, kubernetes.PodName(obj.CellID), k.imageID)
	}
	return obj, err
}

// TestPoolImageDigestRequired: a pool pinning an image admits a Pod only
// when the kubelet reports that digest; otherwise the member is
// quarantined with image_digest_unverified and its Pod proven deleted.
func TestPoolImageDigestRequired(t *testing.T) {
	t.Parallel()
	env := k8stest.Shared(t)
	for _, tc := range []struct {
		name, imageID string
		ready         bool
	}{
		{"pulled", testImage, true},
		{"no imageID", "", false},
		{"another digest", "registry.invalid/sandboxwich/cell@sha256:" + strings.Repeat("8", 64), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := env.Namespace(t)
			prov := kubeletPull{newProvider(t, env, ns, "k8s"), t, env, ns, tc.imageID}
			f := newPoolFixture(t, env, ns, prov, 1, func(c *pool.Config) { c.Image = testImage })
			f.clock.Advance(2 * time.Second)
			f.pools.Pass(f.ctx)
			if tc.ready {
				f.wantCounts(map[lease.MemberState]int{lease.MemberReady: 1})
				drain(t, f)
				return
			}
			ms := f.members(lease.MemberQuarantined)
			if len(ms) != 1 || !ms[0].ProviderAbsent || f.counts()[lease.MemberReady] != 0 {
				t.Fatalf("members: %+v", f.counts())
			}
			if n := f.podCount(); n != 0 {
				t.Fatalf("%d pods left", n)
			}
		})
	}
}
