package k8stest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilexec "k8s.io/client-go/util/exec"
)

// nodePod is a busybox Pod on the real node under runtime class rc.
func nodePod(n *Node, name, rc string, cmd ...string) *corev1.Pod {
	zero := int64(0)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			RuntimeClassName:              ptr(rc),
			NodeName:                      n.NodeName,
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  ptr(false),
			EnableServiceLinks:            ptr(false),
			TerminationGracePeriodSeconds: &zero,
			Containers: []corev1.Container{{
				Name: "c", Image: n.BusyboxImage, ImagePullPolicy: corev1.PullNever, Command: cmd,
			}},
		},
	}
}

// TestRealNode starts a real node, runs a Pod under gVisor and one under
// runc, checks the Pods' network (reachable from the control side through
// DialContext, nothing reachable from the Pods), and checks that teardown
// leaves the host as it found it.
func TestRealNode(t *testing.T) {
	needNode(t)
	nodeBin, _ := NodeBinDir()
	n, err := startNode()
	if err != nil {
		t.Fatal(err)
	}
	// The host as startNode found it, holding the host lock (after it
	// cleaned what a killed test binary may have left).
	before := n.before
	stopped := false
	defer func() {
		if !stopped {
			_ = n.Stop()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := n.Namespace(t)
	pods := n.Client.CoreV1().Pods(ns)

	// gVisor: the kernel is gVisor's, and the Pod serves HTTP on its
	// address.
	gv := nodePod(n, "gv", "gvisor", "sh", "-c", "mkdir -p /tmp/www && echo hello >/tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www")
	if _, err := pods.Create(ctx, gv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rc := nodePod(n, "rc", "runc", "sleep", "3600")
	if _, err := pods.Create(ctx, rc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	gvPod, err := n.WaitPodRunning(ctx, ns, "gv")
	if err != nil {
		t.Fatalf("gvisor pod: %v\nkubelet:\n%s", err, n.Log("kubelet"))
	}
	if _, err := n.WaitPodRunning(ctx, ns, "rc"); err != nil {
		t.Fatalf("runc pod: %v\nkubelet:\n%s", err, n.Log("kubelet"))
	}
	out, _, err := n.Exec(ctx, ns, "gv", "c", "uname", "-r")
	if err != nil || !strings.Contains(out, "gvisor") {
		t.Fatalf("uname -r under gvisor = %q, %v: not gVisor's kernel", out, err)
	}
	dmesg, _, err := n.Exec(ctx, ns, "gv", "c", "dmesg")
	if err != nil || !strings.Contains(dmesg, "gVisor") {
		t.Errorf("dmesg under gvisor = %q, %v", dmesg, err)
	}
	host, err := exec.Command("uname", "-r").Output()
	if err != nil {
		t.Fatal(err)
	}
	if out, _, err := n.Exec(ctx, ns, "rc", "c", "uname", "-r"); err != nil || out != string(host) {
		t.Errorf("uname -r under runc = %q, %v; want the host's %q", out, err, host)
	}
	// Exit codes and stderr carry through pods/exec.
	_, stderr, err := n.Exec(ctx, ns, "gv", "c", "sh", "-c", "echo oops >&2; exit 7")
	var ce utilexec.CodeExitError
	if !errors.As(err, &ce) || ce.Code != 7 || stderr != "oops\n" {
		t.Errorf("exit 7 = %v (stderr %q)", err, stderr)
	}

	// The control side reaches the Pod's port through the node's netns.
	if !strings.HasPrefix(gvPod.Status.PodIP, "10.251.0.") {
		t.Fatalf("pod IP %q not in %s", gvPod.Status.PodIP, PodCIDR)
	}
	c, err := n.DialContext(ctx, "tcp", net.JoinHostPort(gvPod.Status.PodIP, "8080"))
	if err != nil {
		t.Fatalf("dialing the pod: %v", err)
	}
	_, _ = fmt.Fprintf(c, "GET /index.html HTTP/1.0\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(time.Minute))
	body, _ := io.ReadAll(c)
	c.Close()
	if !strings.Contains(string(body), "hello") {
		t.Errorf("the pod's HTTP answer = %q", body)
	}
	// …while the host's own network namespace has no interface and no
	// route of the node's.
	if d := before.Diff(SnapshotHost(nodeBin)); strings.Contains(d, "interface") {
		t.Errorf("the node changed the host's network namespace: %s", d)
	}
	if out, err := exec.Command("ip", "route", "show", PodCIDR).Output(); err != nil || len(out) != 0 {
		t.Errorf("host route to the pod subnet: %q, %v", out, err)
	}
	// From the Pods nothing outside the Pod subnet is reachable: no route.
	for _, pod := range []string{"gv", "rc"} {
		out, _, err := n.Exec(ctx, ns, pod, "c", "ip", "route")
		if err != nil || strings.Contains(out, "default") || !strings.Contains(out, "10.251.0.0/24") {
			t.Errorf("%s: routes %q, %v", pod, out, err)
		}
		for _, addr := range []string{"192.0.2.1:80", "8.8.8.8:53", "127.0.0.1:5432"} {
			if out, _, err := n.Exec(ctx, ns, pod, "c", "nc", "-w", "2", strings.Split(addr, ":")[0], strings.Split(addr, ":")[1]); err == nil {
				t.Errorf("%s reached %s: %q", pod, addr, out)
			}
		}
	}

	stopped = true
	if err := n.Stop(); err != nil {
		t.Fatalf("teardown: %v", err)
	}
	if d := before.Diff(SnapshotHost(nodeBin)); d != "" {
		t.Fatalf("the host differs after teardown: %s", d)
	}
}
