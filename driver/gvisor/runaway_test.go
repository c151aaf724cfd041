package gvisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich/agent"
)

// cellCgroupPids reads pids.current and pids.max of container id's host
// cgroup (v1's pids hierarchy or the v2 unified one).
func cellCgroupPids(id string) (current, limit int, dir string, err error) {
	for _, d := range []string{"/sys/fs/cgroup/pids/" + id, "/sys/fs/cgroup/" + id} {
		cur, err1 := os.ReadFile(filepath.Join(d, "pids.current"))
		if err1 != nil {
			continue
		}
		current, err = strconv.Atoi(strings.TrimSpace(string(cur)))
		if err != nil {
			return 0, 0, d, err
		}
		limit = -1 // "max"
		if m, err1 := os.ReadFile(filepath.Join(d, "pids.max")); err1 == nil {
			if n, err1 := strconv.Atoi(strings.TrimSpace(string(m))); err1 == nil {
				limit = n
			}
		}
		return current, limit, d, nil
	}
	return 0, 0, "", fmt.Errorf("no pids cgroup for %s", id)
}

// TestForkBombIsBounded runs a fork bomb under a short timeout. The exec
// must report the timeout, the cell's own task count (its host cgroup's,
// not the host's) must never exceed the cell's process limit, and the cell
// must afterwards either be usable with the bomb gone, or be lost and then
// provably deleted. A watchdog kills the sandbox at once if the count goes
// past the limit, so the test stays bounded on a driver that lacks it.
func TestForkBombIsBounded(t *testing.T) {
	requireRunsc(t)
	cfg := testConfig(t)
	p := newProvider(t, cfg)
	obj := provision(t, p)
	c := activate(t, p, obj)
	id := p.containerID(obj.CellID)
	const limit = DefaultPidsLimit
	before, pidsMax, dir, err := cellCgroupPids(id)
	if err != nil || p.r.ignoreCgroups.Load() {
		t.Skipf("no host pids cgroup for the cell here (ignore-cgroups %v): %v", p.r.ignoreCgroups.Load(), err)
	}
	t.Logf("cell cgroup %s: pids.current %d before, pids.max %d", dir, before, pidsMax)
	if pidsMax != limit {
		t.Errorf("the cell's cgroup has pids.max %d, want %d", pidsMax, limit)
	}

	var mu sync.Mutex
	peak, over := before, false
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			n, _, _, err := cellCgroupPids(id)
			if err != nil {
				continue
			}
			mu.Lock()
			peak = max(peak, n)
			if n > limit && !over {
				over = true
				// The safety valve: the bomb must not take the machine.
				_, _ = p.r.run(context.Background(), "kill", "--all", id, "KILL")
			}
			mu.Unlock()
		}
	}()

	// exec sleep keeps the direct child alive (without forking) until the
	// timeout; the bomb's processes are orphaned at once and reparented to
	// the cell's init, the agent.
	res, execErr := c.conn.Exec(context.Background(), agent.ExecRequest{Fence: c.fence,
		Argv:          []string{"/bin/sh", "-c", "b(){ b|b& }; b; exec sleep 30"},
		TimeoutMillis: 3000,
	}, nil)
	// Let the bomb's remains run for a moment: they must not grow back.
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	t.Logf("exec: %+v, err %v; cgroup peak %d", res, execErr, peak)
	if over {
		t.Fatalf("the cell's cgroup reached %d tasks, over the limit %d (the watchdog killed the sandbox)", peak, limit)
	}
	if execErr != nil && !errors.Is(execErr, ErrSandboxLost) {
		t.Errorf("Exec error %v, want none or ErrSandboxLost", execErr)
	}
	if execErr == nil {
		if res.Reason != agent.TimedOut || res.ExitCode != 137 {
			t.Errorf("exec = reason %s, exit code %d; want timed_out, 137", res.Reason, res.ExitCode)
		}
	}

	// Either the cell is usable and the bomb is gone, or it is lost and
	// Destroy proves it deleted.
	var ps []guestProcess
	deadline := time.Now().Add(20 * time.Second)
	for {
		ps, err = p.r.ps(context.Background(), id)
		if err != nil || len(ps) <= 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err == nil && execErr == nil {
		if len(ps) > 1 {
			t.Errorf("%d processes left in the cell after the timeout, want the agent alone: %v", len(ps), ps[:min(len(ps), 10)])
		}
		after := c.run(t, "echo", "usable")
		if string(after.Stdout) != "usable\n" || after.ExitCode != 0 {
			t.Errorf("the cell is unusable after the bomb: %+v", after)
		}
		if n, _, _, err := cellCgroupPids(id); err == nil {
			t.Logf("cell cgroup after: %d tasks", n)
		}
		return
	}
	t.Logf("the cell was lost (exec error %v, ps error %v); destroying it", execErr, err)
	if err := p.Destroy(context.Background(), obj); err != nil {
		t.Fatalf("Destroy of the lost cell: %v", err)
	}
	if st, err := p.r.state(context.Background(), id); err != nil || st != nil {
		t.Fatalf("after Destroy: runsc state = %+v, %v; want absent", st, err)
	}
}

// TestTimeoutKillsOrphanedTree checks that a timeout kills the command's
// whole process tree, the processes orphaned and reparented to the cell's
// init included, while what a command that exited on its own left in the
// background keeps running (CONTRACT §14).
func TestTimeoutKillsOrphanedTree(t *testing.T) {
	requireRunsc(t)
	t.Parallel()
	p := newProvider(t, testConfig(t))
	obj := provision(t, p)
	c := activate(t, p, obj)
	id := p.containerID(obj.CellID)
	count := func() int {
		t.Helper()
		ps, err := p.r.ps(context.Background(), id)
		if err != nil {
			t.Fatalf("runsc ps: %v", err)
		}
		return len(ps)
	}
	idle := count()

	// Two orphans (their subshells exit at once) and a grandchild, then the
	// direct child waits for the timeout.
	res, err := c.conn.Exec(context.Background(), agent.ExecRequest{Fence: c.fence,
		Argv:          []string{"/bin/sh", "-c", "(sleep 300 &); (sleep 301 &); sleep 302 & exec sleep 30"},
		TimeoutMillis: 2000,
	}, nil)
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	if res.Reason != agent.TimedOut || res.ExitCode != 137 {
		t.Errorf("exec = reason %s, exit code %d; want timed_out, 137", res.Reason, res.ExitCode)
	}
	n := count()
	for deadline := time.Now().Add(30 * time.Second); n != idle && time.Now().Before(deadline); n = count() { // a hang guard: the orphans sleep 300 s unless killed
		time.Sleep(100 * time.Millisecond)
	}
	if n != idle {
		ps, _ := p.r.ps(context.Background(), id)
		t.Errorf("%d processes in the cell after the timeout, %d before the exec: %v", n, idle, ps)
	}

	// A command that exits leaves its background process running.
	res = c.run(t, "/bin/sh", "-c", "sleep 303 >/dev/null 2>&1 &")
	if res.Reason != agent.Exited || res.ExitCode != 0 {
		t.Errorf("background exec = %+v, want exit 0", res)
	}
	if n := count(); n != idle+1 {
		t.Errorf("%d processes after an exec left one in the background, want %d", n, idle+1)
	}
}

// TestLsAndStat runs GNU coreutils' ls and stat in a cell: gVisor 20221219
// (Debian bookworm's runsc) rejected the AT_NO_AUTOMOUNT flag they pass to
// statx, so both failed with "Invalid argument".
func TestLsAndStat(t *testing.T) {
	requireRunsc(t)
	t.Parallel()
	p := newProvider(t, testConfig(t))
	c := activate(t, p, provision(t, p))
	for _, argv := range [][]string{{"ls", "-la", "/"}, {"stat", "/home/cell"}} {
		res := c.run(t, argv...)
		// gVisor denies the cell user the xattr look-up ls -l makes on
		// the 0700 /root ("ls: /root: Permission denied", exit 0): only
		// statx failing is the bug.
		if res.ExitCode != 0 || len(res.Stdout) == 0 || bytes.Contains(res.Stderr, []byte("Invalid argument")) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 0 and no \"Invalid argument\"", argv, res.ExitCode, res.Stdout, res.Stderr)
		} else if len(res.Stderr) != 0 {
			t.Logf("%q: stderr %q", argv, res.Stderr)
		}
	}
	if res := c.run(t, "stat", "-c", "%U %a", "/home/cell"); string(res.Stdout) != "cell 700\n" {
		t.Errorf("stat /home/cell = %q, want \"cell 700\"", res.Stdout)
	}
}
