package k8stest

import (
	"context"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

// TestShared checks the shared control plane: RuntimeClasses, the kwok
// node, a Pod becoming Running, graceful deletion, and a webhook that
// applies.
func TestShared(t *testing.T) {
	env := Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for name := range RuntimeClasses {
		if _, err := env.Client.NodeV1().RuntimeClasses().Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Errorf("runtime class %s: %v", name, err)
		}
	}
	ns := env.Namespace(t)
	wh := env.MutatingWebhook(t, ns, StripRuntimeClass)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p"},
		Spec: corev1.PodSpec{RuntimeClassName: ptr("gvisor"), NodeName: env.NodeName,
			Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/x:1"}}},
	}
	created, err := env.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if created.Spec.RuntimeClassName != nil || wh.Requests.Load() != 1 {
		t.Fatalf("webhook did not strip the runtime class: %v, %d requests", created.Spec.RuntimeClassName, wh.Requests.Load())
	}
	for {
		p, err := env.Client.CoreV1().Pods(ns).Get(ctx, "p", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Status.Phase == corev1.PodRunning {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("pod never ran: %+v\n%s", p.Status, env.KwokLog())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := env.Client.CoreV1().Pods(ns).Delete(ctx, "p", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := env.WaitPodGone(ctx, ns, "p", string(created.UID)); err != nil {
		t.Fatalf("graceful delete never finalized: %v", err)
	}
}

// TestRestart checks that a restarted API server keeps its address,
// certificates and data.
func TestRestart(t *testing.T) {
	env := Start(t, Options{NoKwok: true})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := env.Namespace(t)
	if err := env.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err == nil {
		t.Fatal("the API server answers while stopped")
	}
	if err := env.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err != nil {
		t.Fatalf("after restart: %v", err)
	}
}
