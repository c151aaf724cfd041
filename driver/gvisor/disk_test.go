package gvisor

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/sandboxwich/sandboxwich/agent"
)

// TestDiskShares: the writable places' sizes are whole pages and make
// cell_disk_bytes together (rounded down to a page), with or without an
// image's writable root.
func TestDiskShares(t *testing.T) {
	for _, n := range []int64{MinCellDiskBytes, 64 << 20, 256 << 20, 256<<20 + 4095, 100_000_123} {
		for _, image := range []bool{false, true} {
			s := diskShares(n, image)
			var sum int64
			for place, size := range s {
				if size <= 0 || size%pageSize != 0 {
					t.Errorf("diskShares(%d, %v)[%s] = %d, want a positive number of pages", n, image, place, size)
				}
				sum += size
			}
			if want := n / pageSize * pageSize; sum != want {
				t.Errorf("diskShares(%d, %v) = %v, sum %d, want %d", n, image, s, sum, want)
			}
			if _, ok := s[diskRoot]; ok != image {
				t.Errorf("diskShares(%d, %v) = %v: a share of the root %v, want %v", n, image, s, ok, image)
			}
		}
	}
}

// TestSpecBoundsEveryWritablePlace: every tmpfs a cell writes carries a
// size= of its share; the image's root overlay its own.
func TestSpecBoundsEveryWritablePlace(t *testing.T) {
	p := &Provider{cfg: Config{Pool: "p", Installation: testInstallation, CellDiskBytes: 64 << 20},
		agent: agentBinary{path: "/cache/agent", digest: "sha256:00"}}
	want := diskShares(64<<20, false)
	seen := map[string]bool{}
	for _, m := range p.spec("cell", "nonce", "/bundle/run", nil).Mounts {
		if m.Type != "tmpfs" || m.Destination == "/dev" {
			continue
		}
		seen[m.Destination] = true
		if opt := sizeOption(want[m.Destination]); !strings.Contains(","+strings.Join(m.Options, ",")+",", ","+opt+",") {
			t.Errorf("mount %s options %v, want %s", m.Destination, m.Options, opt)
		}
	}
	for place := range want {
		if !seen[place] {
			t.Errorf("no tmpfs mount at %s", place)
		}
	}
}

// TestNewCellDisk: the default is half the memory; a value not below the
// memory, or below the minimum, stops New naming the key.
func TestNewCellDisk(t *testing.T) {
	path, _ := fakeRunsc(t, "exit 0\n")
	cfg := fakeConfig(t, path)
	cfg.MemoryLimitBytes = 256 << 20
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if p.cfg.CellDiskBytes != 128<<20 {
		t.Errorf("default CellDiskBytes = %d, want half the memory", p.cfg.CellDiskBytes)
	}
	for _, n := range []int64{256 << 20, 1 << 30, MinCellDiskBytes - 1, -1} {
		cfg.CellDiskBytes = n
		_, err := New(cfg)
		var de *CellDiskError
		if !errors.As(err, &de) || !strings.Contains(err.Error(), "cell_disk_bytes") {
			t.Errorf("New with CellDiskBytes %d: %v, want an *CellDiskError naming the key", n, err)
		}
	}
	cfg.CellDiskBytes = 256<<20 - 1
	if _, err := New(cfg); err != nil {
		t.Errorf("New with CellDiskBytes just below the memory: %v", err)
	}
}

// dfSizes runs df -k on places in the cell and returns each one's size
// in bytes.
func dfSizes(t *testing.T, c *cell, places ...string) map[string]int64 {
	t.Helper()
	res := c.run(t, append([]string{"df", "-k"}, places...)...)
	if res.ExitCode != 0 {
		t.Fatalf("df: exit %d, %q", res.ExitCode, res.Stderr)
	}
	out := map[string]int64{}
	for _, line := range strings.Split(strings.TrimSpace(string(res.Stdout)), "\n")[1:] {
		f := strings.Fields(line)
		kb, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			t.Fatalf("df line %q", line)
		}
		out[f[len(f)-1]] = kb * 1024
	}
	return out
}

// TestCellDiskFull fills a real cell's disk: df shows the limit, a write
// past it is ENOSPC in the cell (a command exits non-zero, a file write
// through the agent is CodeNoSpace), and the cell keeps answering, even
// with every writable place full at once.
func TestCellDiskFull(t *testing.T) {
	requireRunsc(t)
	t.Parallel()
	cfg := testConfig(t)
	cfg.MemoryLimitBytes = 256 << 20
	cfg.CellDiskBytes = 64 << 20
	p := newProvider(t, cfg)
	c := activate(t, p, provision(t, p))

	want := diskShares(cfg.CellDiskBytes, false)
	got := dfSizes(t, c, diskHome, diskTmp, diskVarTmp, diskShm)
	var sum int64
	for place, size := range want {
		if got[place] != size {
			t.Errorf("df of %s = %d bytes, want %d (df: %v)", place, got[place], size, got)
		}
		sum += got[place]
	}
	if sum != cfg.CellDiskBytes {
		t.Errorf("df shows %d bytes of writable storage, want cell_disk_bytes %d", sum, cfg.CellDiskBytes)
	}

	res := c.run(t, "sh", "-c", "head -c 100000000 /dev/zero > /tmp/fill")
	if res.ExitCode == 0 || !strings.Contains(string(res.Stderr), "No space left") {
		t.Errorf("filling /tmp: exit %d, stderr %q; want ENOSPC", res.ExitCode, res.Stderr)
	}
	if res := c.run(t, "echo", "alive"); string(res.Stdout) != "alive\n" {
		t.Fatalf("the cell after /tmp filled: %+v", res)
	}
	// Every place full at once, the cell still lives: the total is bounded.
	res = c.runAs(t, agent.UserRoot, "sh", "-c",
		"for d in /home/cell /var/tmp /dev/shm; do head -c 100000000 /dev/zero > $d/fill; echo $d $?; done")
	if strings.Count(string(res.Stdout), " 1\n") != 3 {
		t.Errorf("filling the other places: %q (stderr %q), want each to fail", res.Stdout, res.Stderr)
	}
	if res := c.run(t, "echo", "alive"); string(res.Stdout) != "alive\n" {
		t.Fatalf("the cell with every place full: %+v", res)
	}
	// /dev takes no size: it is read-only, its devices still usable.
	res = c.runAs(t, agent.UserRoot, "sh", "-c", "echo x > /dev/null && echo x > /dev/fill")
	if res.ExitCode == 0 || !strings.Contains(string(res.Stderr), "Read-only file system") {
		t.Errorf("root writing /dev: exit %d, stderr %q; want /dev/null writable and /dev read-only", res.ExitCode, res.Stderr)
	}
	// A file written through the agent past the space left: no space, and
	// the cell lives.
	_, err := c.conn.WriteFile(context.Background(), agent.WriteRequest{Fence: c.fence, Path: "/home/cell/big"},
		strings.NewReader(strings.Repeat("x", 1<<20)))
	if ae, ok := errors.AsType[*agent.Error](err); !ok || ae.Code != agent.CodeNoSpace {
		t.Errorf("WriteFile into a full home: %v, want %s", err, agent.CodeNoSpace)
	}
	if err := p.sandboxLost(p.containerID(c.obj.CellID)); err != nil {
		t.Fatalf("the sandbox after a full disk: %v", err)
	}
	if res := c.run(t, "sh", "-c", "rm /tmp/fill && echo freed > /tmp/f && cat /tmp/f"); string(res.Stdout) != "freed\n" {
		t.Errorf("writing after freeing space: %+v", res)
	}
}

// TestImageCellDisk: an image cell's writable root is bounded by its
// share too (runsc's --overlay2=root:memory,size=…): df shows it, and
// filling it is ENOSPC while the cell lives.
func TestImageCellDisk(t *testing.T) {
	requireRunsc(t)
	busybox := requireBusybox(t)
	t.Parallel()
	cfg, _ := imageConfig(t, newTestRegistry(t), busybox)
	cfg.MemoryLimitBytes = 256 << 20
	cfg.CellDiskBytes = 64 << 20
	p := newProvider(t, cfg)
	if err := p.PullImage(context.Background()); err != nil {
		t.Fatal(err)
	}
	c := activate(t, p, provision(t, p))
	want := diskShares(cfg.CellDiskBytes, true)
	got := dfSizes(t, c, diskRoot, diskHome, diskTmp, diskVarTmp, diskShm)
	var sum int64
	for place, size := range want {
		if got[place] != size {
			t.Errorf("df of %s = %d bytes, want %d (df: %v)", place, got[place], size, got)
		}
		sum += got[place]
	}
	if sum != cfg.CellDiskBytes {
		t.Errorf("df shows %d bytes of writable storage, want cell_disk_bytes %d", sum, cfg.CellDiskBytes)
	}
	// busybox's head says "I/O error" for any failed write; its dd names
	// the errno.
	res := c.runAs(t, agent.UserRoot, "dd", "if=/dev/zero", "of=/fill", "bs=1M", "count=100")
	if res.ExitCode == 0 || !strings.Contains(string(res.Stderr), "No space left") {
		t.Errorf("filling the root: exit %d, stderr %q; want ENOSPC", res.ExitCode, res.Stderr)
	}
	if res := c.run(t, "echo", "alive"); string(res.Stdout) != "alive\n" {
		t.Fatalf("the cell after its root filled: %+v", res)
	}
}
