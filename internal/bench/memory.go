package bench

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/gvisor"
	"github.com/sandboxwich/sandboxwich/internal/ctxsleep"
	"github.com/sandboxwich/sandboxwich/lease"
)

// MemoryReport is the host memory of warm gVisor cells: what one costs
// against runsc running the same spec bare, and what a further cell of the
// same image adds. Memory is PSS (proportional set size, from
// /proc/<pid>/smaps_rollup) summed over every host process of a container
// — runsc's sandbox (the sentry, which holds the agent and the workload),
// its gofer and the platform's stub processes, each address space once —
// so pages two processes or two cells share are counted once, split
// between them. RSS alone would count runsc's own text once per process.
type MemoryReport struct {
	// CellKiB is one warm cell (created, started, its agent answering and
	// waiting), median over the cells measured; BareKiB is a bare runsc
	// container of the same spec whose process is `sleep` instead of the
	// agent, created and started the same way on the same root.
	CellKiB int64 `json:"cell_pss_kib"`
	BareKiB int64 `json:"bare_runsc_sleep_pss_kib"`
	// CellRSSKiB is CellKiB's RSS sum, for reference.
	CellRSSKiB int64 `json:"cell_rss_kib"`
	// Ratio is CellKiB ÷ BareKiB (target ≤ 1.15).
	Ratio float64 `json:"ratio"`
	// PoolCellKiB is what a cell costs in a warm pool: the PSS of PoolCells
	// cells running at once, divided by PoolCells. Their agent binary and
	// runsc's text are the same files, whose pages the cells share.
	PoolCellKiB int64 `json:"pool_cell_pss_kib"`
	PoolCells   int   `json:"pool_cells"`
	// PoolRatio is PoolCellKiB ÷ CellKiB: at most about 1, a cell costing
	// no more in a pool than alone. A comparison of readings taken at
	// different moments, which other work on the machine moves: a figure
	// of the bench, never a test's assertion.
	PoolRatio float64 `json:"pool_cell_ratio"`
	// ImageFirstKiB is the PSS of the cells of one image when one runs;
	// ImageAddedKiB is what the total grows by when a second cell of the
	// same image starts (its lower layer is shared on disk and in the
	// host's page cache; its writes live in its own memory).
	ImageFirstKiB int64 `json:"image_first_cell_pss_kib,omitempty"`
	ImageAddedKiB int64 `json:"image_added_cell_pss_kib,omitempty"`
}

// benchMemory measures MemoryReport: n cells and n bare containers taking
// turns on one state root, then, when a static busybox is installed, two
// cells of a busybox image served by a loopback registry.
func benchMemory(ctx context.Context, dir string, quick bool) (*MemoryReport, error) {
	n := 5
	if quick {
		n = 3 // an odd count: the median of two would be the larger
	}
	stateDir := filepath.Join(dir, "runsc-mem-"+uuid.NewString()[:8])
	defer func() { _ = gvisor.RemoveStateDir(stateDir) }()
	base := gvisor.Config{StateDir: stateDir, BundleDir: filepath.Join(dir, "bundles-mem"), Pool: "mem",
		Installation: driver.InstallationTag(stateDir), Logger: slog.New(slog.DiscardHandler)}
	prov, err := gvisor.New(base)
	if err != nil {
		return nil, err
	}
	rep := &MemoryReport{}
	var cells, bares, rss []int64
	for range n {
		obj, id, err := provisionFor(ctx, prov)
		if err != nil {
			return nil, err
		}
		cell, bare, err := besideBare(ctx, id, stateDir, filepath.Join(base.BundleDir, id), filepath.Join(dir, "bare"))
		if err == nil {
			cells, rss, bares = append(cells, cell.pss), append(rss, cell.rss), append(bares, bare.pss)
		}
		if derr := prov.Destroy(ctx, obj); err == nil {
			err = derr
		}
		if err != nil {
			return nil, err
		}
	}
	rep.CellKiB, rep.BareKiB, rep.CellRSSKiB = median(cells), median(bares), median(rss)
	rep.Ratio = ratio(float64(rep.CellKiB), float64(rep.BareKiB))
	pool, err := warmTotals(ctx, prov, n)
	if err != nil {
		return nil, err
	}
	rep.PoolCellKiB, rep.PoolCells = pool[n-1]/int64(n), n
	rep.PoolRatio = ratio(float64(rep.PoolCellKiB), float64(rep.CellKiB))

	if _, err := os.Stat(busybox); err != nil {
		return rep, nil
	}
	root := filepath.Join(dir, "mem-rootfs")
	if err := busyboxRoot(root, busybox); err != nil {
		return nil, err
	}
	host, closeRegistry := loopbackRegistry()
	defer closeRegistry()
	ref, err := pushDir(host+"/bench/mem", root)
	if err != nil {
		return nil, err
	}
	icfg := base
	icfg.Pool, icfg.Image, icfg.ImageCacheDir = "mem-image", ref, filepath.Join(dir, "images-mem")
	ip, err := gvisor.New(icfg)
	if err != nil {
		return nil, err
	}
	if err := ip.PullImage(ctx); err != nil {
		return nil, err
	}
	totals, err := warmTotals(ctx, ip, 2)
	if err != nil {
		return nil, err
	}
	rep.ImageFirstKiB, rep.ImageAddedKiB = totals[0], totals[1]-totals[0]
	return rep, nil
}

// warmTotals provisions n cells one after the other and returns, after
// each, the PSS of all it has provisioned so far, measured while they all
// run; it destroys them before it returns.
func warmTotals(ctx context.Context, p *gvisor.Provider, n int) ([]int64, error) {
	var objs []driver.Object
	defer func() {
		for _, obj := range objs {
			_ = p.Destroy(context.WithoutCancel(ctx), obj)
		}
	}()
	var ids []string
	var totals []int64
	for range n {
		obj, id, err := provisionFor(ctx, p)
		if err != nil {
			return nil, err
		}
		objs, ids = append(objs, obj), append(ids, id)
		var total int64
		for _, id := range ids {
			m, err := settledMemory(ctx, id)
			if err != nil {
				return nil, err
			}
			total += m.pss
		}
		totals = append(totals, total)
	}
	return totals, nil
}

// warmIdle is how long a cell waits after Provision before it is
// measured: a cell of a pool waits for its claim with its agent idle, and
// an agent idle for a second (cmd/sandboxwich-agent's idleRelease) has
// given back its executable's pages.
const warmIdle = 2 * time.Second

// provisionFor provisions one cell and returns it with its container ID,
// warm: idle for warmIdle since Provision returned.
func provisionFor(ctx context.Context, p *gvisor.Provider) (driver.Object, string, error) {
	obj, err := p.Provision(ctx, driver.ProvisionRequest{CellID: uuid.Must(uuid.NewV7()), RuntimeClass: lease.GVisorLowerRisk})
	if err != nil {
		return obj, "", fmt.Errorf("provision: %w", err)
	}
	id, _, _ := strings.Cut(obj.Identity, "@")
	select {
	case <-ctx.Done():
		_ = p.Destroy(context.WithoutCancel(ctx), obj)
		return driver.Object{}, "", ctx.Err()
	case <-time.After(warmIdle):
	}
	return obj, id, nil
}

// besideBare starts a bare runsc container of the cell bundle's spec
// running sleep, measures the cell id and then the bare container while
// both run, and deletes the bare one. Both are measured with the same
// processes alive, so that the pages they share (runsc's own text) are
// split the same way in both readings: a cell measured alone and a bare
// container measured beside it would charge the cell for them.
func besideBare(ctx context.Context, id, stateDir, cellBundle, bundles string) (cell, bare mem, err error) {
	b, err := newBare(stateDir, cellBundle, "", bundles, []string{"sleep", "100000"})
	if err != nil {
		return mem{}, mem{}, err
	}
	defer b.close()
	bareID := "bare-" + uuid.NewString()[:8]
	defer func() { _ = b.runsc(context.WithoutCancel(ctx), "delete", "--force", bareID) }()
	if err := b.start(ctx, bareID); err != nil {
		return mem{}, mem{}, err
	}
	if cell, err = settledMemory(ctx, id); err != nil {
		return mem{}, mem{}, err
	}
	bare, err = settledMemory(ctx, bareID)
	return cell, bare, err
}

// mem is a container's memory in KiB.
type mem struct{ pss, rss int64 }

// settledMemory measures a container's processes until two readings 100 ms
// apart agree within 1% (a sandbox that just started is still faulting in),
// or for at most two seconds.
func settledMemory(ctx context.Context, id string) (mem, error) {
	var last mem
	for i := range 20 {
		m, err := containerMemory(id)
		if err != nil {
			return mem{}, err
		}
		if i > 0 && abs(m.pss-last.pss)*100 <= last.pss {
			return m, nil
		}
		last = m
		if err := ctxsleep.Sleep(ctx, 100*time.Millisecond); err != nil {
			return mem{}, err
		}
	}
	return last, nil
}

// containerMemory sums PSS and RSS over the host processes whose command
// line names the container (runsc's sandbox and gofer carry its ID or its
// bundle's path) and their descendants (the platform's stubs).
func containerMemory(id string) (mem, error) {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return mem{}, err
	}
	parent := map[int]int{}
	named := map[int]bool{}
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if bytes.Contains(cmdline, []byte(id)) && !bytes.Contains(cmdline, []byte("runsc\x00--root")) {
			named[pid] = true // not a runsc management command naming it
		}
		if stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil {
			// pid (comm) state ppid …: comm may hold spaces, so cut after ")".
			if i := bytes.LastIndexByte(stat, ')'); i > 0 {
				if f := strings.Fields(string(stat[i+1:])); len(f) > 1 {
					parent[pid], _ = strconv.Atoi(f[1])
				}
			}
		}
	}
	if len(named) == 0 {
		return mem{}, fmt.Errorf("no process of container %s", id)
	}
	in := func(pid int) bool {
		for seen := 0; pid > 1 && seen < 64; seen++ {
			if named[pid] {
				return true
			}
			pid = parent[pid]
		}
		return false
	}
	var m mem
	var counted []int // one process of each address space summed
	for pid := range parent {
		if !in(pid) || slices.ContainsFunc(counted, func(q int) bool { return sameMemory(pid, q) }) {
			continue
		}
		pss, rss, err := rollup(pid)
		if errors.Is(err, os.ErrNotExist) {
			continue // exited meanwhile
		}
		if err != nil {
			return mem{}, err
		}
		m.pss += pss
		m.rss += rss
		counted = append(counted, pid)
	}
	return m, nil
}

// sameMemory reports whether processes a and b share one address space
// (kcmp KCMP_VM). gVisor's systrap platform runs several stub processes
// in one address space of the sandboxed program (clone with CLONE_VM and
// without CLONE_THREAD), and each of them reports that address space's
// whole PSS: summed per process, a program that made three syscalls at
// once would count three times.
func sameMemory(a, b int) bool {
	const kcmpVM = 1 // <linux/kcmp.h>
	r, _, errno := unix.Syscall6(unix.SYS_KCMP, uintptr(a), uintptr(b), kcmpVM, 0, 0, 0)
	return errno == 0 && r == 0
}

// rollup reads a process's Pss and Rss in KiB from smaps_rollup.
func rollup(pid int) (pss, rss int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		k, v, ok := strings.Cut(s.Text(), ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, _ := strconv.ParseInt(f[0], 10, 64)
		switch k {
		case "Pss":
			pss = n
		case "Rss":
			rss = n
		}
	}
	return pss, rss, s.Err()
}

// median is the middle of v (the upper one of an even count), 0 for none.
func median[T cmp.Ordered](v []T) T {
	if len(v) == 0 {
		var zero T
		return zero
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func abs(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}
