package agentsandbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandboxwich/sandboxwich/driver/agentsandbox"
	"github.com/sandboxwich/sandboxwich/lease"
)

// TestImageIDReadBack: the admitted digest is the repo digest of the bound
// Pod's imageID (kwok sets none; the test writes it as a pulling kubelet
// would), and none when the template's image pins another digest.
func TestImageIDReadBack(t *testing.T) {
	env, ns, _, p := setup(t, faults{})
	ctx := ctxT(t, 2*time.Minute)
	obj, err := p.Provision(ctx, provisionReq(lease.GVisorLowerRisk))
	if err != nil {
		t.Fatal(err)
	}
	podName, _, _ := strings.Cut(parts(t, obj.Identity)["pod"], "/")
	digest := testImage[strings.LastIndexByte(testImage, '@')+1:]
	setImageID := func(imageID string) {
		for {
			pod, err := env.Client.CoreV1().Pods(ns).Get(ctx, podName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for i := range pod.Status.ContainerStatuses {
				pod.Status.ContainerStatuses[i].ImageID = imageID
			}
			if _, err = env.Client.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err == nil {
				return
			} else if !apierrors.IsConflict(err) {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct{ imageID, want string }{
		{"", ""},
		{"sha256:" + strings.Repeat("4", 64), ""},
		{testImage, digest},
		{"registry.invalid/sandboxwich/cell@sha256:" + strings.Repeat("7", 64), ""}, // not the template's digest
	} {
		setImageID(tc.imageID)
		o, err := p.Inspect(ctx, obj)
		if err != nil {
			t.Fatal(err)
		}
		if o.ImageDigest != tc.want {
			t.Errorf("imageID %q: ImageDigest = %q, want %q", tc.imageID, o.ImageDigest, tc.want)
		}
	}
	if err := p.Destroy(context.Background(), obj); err != nil {
		t.Fatal(err)
	}
	requireEmpty(t, env, ns)
}

// TestProvisionRefusesImage: a cell's Pod comes from the warm pool's
// template, whose image the plane does not choose, so the provider reports
// no Images and refuses a provision that names one, creating nothing.
func TestProvisionRefusesImage(t *testing.T) {
	env, ns, _, p := setup(t, faults{})
	ctx := ctxT(t, 2*time.Minute)
	if p.Capabilities().Images {
		t.Fatal("Capabilities().Images = true")
	}
	req := provisionReq(lease.GVisorLowerRisk)
	req.Image = testImage
	obj, err := p.Provision(ctx, req)
	if !errors.Is(err, agentsandbox.ErrImageFromTemplate) || obj.Identity != "" {
		t.Fatalf("Provision with an image = %+v, %v; want agentsandbox.ErrImageFromTemplate", obj, err)
	}
	if msg := err.Error(); !strings.Contains(msg, "SandboxTemplate") || !strings.Contains(msg, "does not choose") ||
		!strings.Contains(msg, testImage) {
		t.Errorf("error %q does not say the template chooses the image, or which image was refused", msg)
	}
	requireEmpty(t, env, ns)
}
