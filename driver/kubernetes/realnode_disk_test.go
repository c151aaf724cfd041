package kubernetes_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/kubernetes"
	"github.com/sandboxwich/sandboxwich/internal/k8stest"
	"github.com/sandboxwich/sandboxwich/lease"
)

// TestRealNodeCellDisk: on a real kubelet under gVisor, a cell's /tmp is
// the memory-backed emptyDir of cell_disk_bytes (df shows it), filling it
// is ENOSPC in the cell, and the cell keeps answering and stays admitted.
func TestRealNodeCellDisk(t *testing.T) {
	node := k8stest.SharedNode(t)
	ns := node.Namespace(t)
	const disk = 16 << 20
	p := newRealProvider(t, node, ns, "disk", func(c *kubernetes.Config) { c.CellDiskBytes = disk })
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
	res, err := p.Exec(ctx, obj, driver.ExecRequest{Argv: []string{"df", "-k", "/tmp"}})
	lines := strings.Split(strings.TrimSpace(string(res.Stdout)), "\n")
	if f := strings.Fields(lines[len(lines)-1]); err != nil || len(f) < 2 || f[1] != "16384" {
		t.Errorf("df -k /tmp = %q, %v; want 16384 KiB", res.Stdout, err)
	}
	// busybox's dd names the errno (its head says "I/O error" for any).
	res, err = p.Exec(ctx, obj, driver.ExecRequest{Argv: []string{"dd", "if=/dev/zero", "of=/tmp/fill", "bs=1M", "count=32"}})
	if err != nil || res.ExitCode == 0 || !strings.Contains(string(res.Stderr), "No space left") {
		t.Errorf("filling /tmp: %+v, %v; want ENOSPC", res, err)
	}
	res, err = p.Exec(ctx, obj, driver.ExecRequest{Argv: []string{"echo", "alive"}})
	if err != nil || string(res.Stdout) != "alive\n" {
		t.Fatalf("the cell after /tmp filled: %+v, %v", res, err)
	}
	o, err := p.Inspect(ctx, obj)
	if err != nil || driver.Verify(obj, o, lease.GVisorLowerRisk) != nil {
		t.Errorf("Inspect after /tmp filled = %+v, %v; want still admitted", o, err)
	}
}
