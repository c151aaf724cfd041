package gvisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxwich/sandboxwich/driver"
)

// Exec defaults, used when an ExecRequest leaves Timeout or MaxOutput zero.
const (
	DefaultExecTimeout = driver.DefaultExecTimeout
	DefaultMaxOutput   = driver.DefaultMaxOutput
)

const (
	// pipeGrace is how long Exec keeps reading a command's output after
	// the command exited, when processes it left in the background still
	// hold its stdout or stderr.
	pipeGrace = 500 * time.Millisecond
	// stopTimeout bounds killing a timed-out or cancelled command.
	stopTimeout = 30 * time.Second
)

// Exec runs one command in the cell as the unprivileged cell user (uid
// 1000) in /home/cell, with the cell's fixed environment plus req.Env. The
// process spec, env included, is handed to runsc in a 0600 file, so no
// value appears in any command line. When req.Timeout expires, the command
// and every process it started that is still its descendant are killed
// inside the sandbox, and the result has TimedOut set. When ctx ends first,
// the same happens and Exec returns ctx's error. A zero Timeout means
// DefaultExecTimeout, a zero MaxOutput DefaultMaxOutput.
func (p *Provider) Exec(ctx context.Context, obj driver.Object, req driver.ExecRequest) (driver.ExecResult, error) {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return driver.ExecResult{}, errors.New("gvisor: exec: empty argv")
	}
	for k, v := range req.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.Contains(v, "\x00") {
			return driver.ExecResult{}, fmt.Errorf("gvisor: exec: invalid environment variable name %q", k)
		}
	}
	if err := ctx.Err(); err != nil {
		return driver.ExecResult{}, fmt.Errorf("gvisor: exec: %w", err)
	}
	id, ok := p.objectID(obj)
	if !ok {
		return driver.ExecResult{}, fmt.Errorf("gvisor: exec: identity %q: %w", obj.Identity, driver.ErrNotFound)
	}
	// runsc's own state file answers in microseconds; `runsc state`, a
	// process start costing tens of milliseconds, only when it is missing.
	st := p.r.stateFile(id)
	if st == nil {
		var err error
		if st, err = p.r.state(ctx, id); err != nil {
			return driver.ExecResult{}, fmt.Errorf("gvisor: exec in %s: %w", id, err)
		}
	}
	if st == nil || (obj.Identity != "" && identityOf(st) != obj.Identity) {
		return driver.ExecResult{}, fmt.Errorf("gvisor: exec in %s: %w", id, driver.ErrNotFound)
	}
	if st.Status != statusRunning {
		return driver.ExecResult{}, fmt.Errorf("gvisor: exec in %s: container is %s", id, st.Status)
	}
	return p.exec(ctx, id, req)
}

// execEnv is the cell's fixed environment with extra added (extra wins).
func execEnv(extra map[string]string) []string {
	env := slices.Clone(cellEnv)
	keys := make([]string, 0, len(extra))
	for k := range extra {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		env = slices.DeleteFunc(env, func(kv string) bool { return strings.HasPrefix(kv, k+"=") })
		env = append(env, k+"="+extra[k])
	}
	return env
}

// exec runs req in container id; see Exec.
func (p *Provider) exec(ctx context.Context, id string, req driver.ExecRequest) (driver.ExecResult, error) {
	timeout, maxOut := req.Limits()
	dir, err := os.MkdirTemp(p.cfg.BundleDir, "exec-")
	if err != nil {
		return driver.ExecResult{}, fmt.Errorf("gvisor: exec in %s: %w", id, err)
	}
	defer os.RemoveAll(dir)
	procFile, pidFile := filepath.Join(dir, "process.json"), filepath.Join(dir, "pid")
	if err := writeJSON(procFile, process(req.Argv, execEnv(req.Env))); err != nil {
		return driver.ExecResult{}, fmt.Errorf("gvisor: exec in %s: %w", id, err)
	}

	cmd := p.r.command("exec", "--internal-pid-file="+pidFile, "--process="+procFile, id)
	cmd.Stdin = bytes.NewReader(req.Stdin)
	stdout, stderr := &cappedBuffer{max: maxOut}, &cappedBuffer{max: maxOut}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.WaitDelay = pipeGrace
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return driver.ExecResult{}, fmt.Errorf("gvisor: exec in %s: %w", id, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	timer := time.NewTimer(timeout)
	defer timer.Stop()

	var waitErr error
	timedOut := false
	select {
	case waitErr = <-done:
	case <-timer.C:
		timedOut = true
		waitErr = p.stopExec(id, pidFile, cmd, done)
	case <-ctx.Done():
		_ = p.stopExec(id, pidFile, cmd, done)
		return driver.ExecResult{}, fmt.Errorf("gvisor: exec in %s: %w", id, ctx.Err())
	}
	res := driver.ExecResult{
		Stdout:    stdout.buf.Bytes(),
		Stderr:    stderr.buf.Bytes(),
		Truncated: stdout.truncated || stderr.truncated,
		TimedOut:  timedOut,
		Duration:  time.Since(start),
	}
	var exitErr *exec.ExitError
	switch {
	case waitErr == nil || errors.Is(waitErr, exec.ErrWaitDelay):
		res.ExitCode = cmd.ProcessState.ExitCode()
	case errors.As(waitErr, &exitErr):
		res.ExitCode = exitErr.ExitCode()
	default:
		return driver.ExecResult{}, fmt.Errorf("gvisor: exec in %s: %w", id, waitErr)
	}
	if timedOut && res.ExitCode == 0 {
		res.ExitCode = -1 // killed, whatever runsc made of it
	}
	if res.ExitCode == runscFailed {
		// runsc exec's own failure, or the command's 128: only a sandbox
		// that is no longer running tells them apart.
		if lost := p.sandboxLost(id); lost != nil {
			return driver.ExecResult{}, fmt.Errorf("gvisor: exec in %s: %w", id, lost)
		}
	}
	return res, nil
}

// stopExec kills a running exec: first the command and its descendants
// inside the sandbox (killing runsc exec on the host would leave them
// running), then, if runsc exec has not returned by then, runsc exec's
// host process group. It returns cmd's Wait result.
func (p *Provider) stopExec(id, pidFile string, cmd *exec.Cmd, done <-chan error) error {
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	var waitErr error
	exited := false
	// runsc exec writes the in-sandbox PID once the process started.
	pid := 0
	for deadline := time.Now().Add(2 * time.Second); ; {
		if pid = readPid(pidFile); pid > 0 || exited || time.Now().After(deadline) {
			break
		}
		select {
		case waitErr = <-done:
			exited = true
		case <-time.After(20 * time.Millisecond):
		}
	}
	if pid > 0 {
		if err := p.killGuestTree(ctx, id, pid); err != nil {
			p.log.Warn("killing a timed-out exec inside the sandbox", "container", id, "pid", pid, "error", err)
		}
	}
	if !exited {
		select {
		case waitErr = <-done:
			exited = true
		case <-time.After(processGrace):
		}
	}
	if !exited {
		_ = killGroup(cmd)
		waitErr = <-done
	}
	return waitErr
}

func readPid(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0
	}
	return pid
}

// killRounds bounds how often killGuestTree looks again for processes of
// a tree it is killing (a fork bomb adds some between two looks).
const killRounds = 5

// killGuestTree kills process root of container id and its whole tree, by
// their PIDs in the sandbox: root's process group (runsc kill --pgid, which
// the sentry delivers in one step, and which reaches the processes orphaned
// and reparented to the cell's init) and every descendant of root or of a
// group member (those that moved to another group). It looks again while
// processes of the tree remain. Only a process that both left the group
// (setpgid, setsid) and lost its parent in the tree escapes; the cell's
// process limit still bounds it, and it ends with the cell.
func (p *Provider) killGuestTree(ctx context.Context, id string, root int) error {
	for round := 0; round < killRounds; round++ {
		ps, err := p.r.ps(ctx, id)
		if err != nil {
			return err
		}
		group, tree := treeOf(ps, root)
		if group == 0 && len(tree) == 0 {
			return nil
		}
		if group != 0 {
			if _, err := p.r.run(ctx, "kill", "--pgid="+strconv.Itoa(group), id, "KILL"); err != nil {
				p.log.Debug("runsc kill --pgid", "container", id, "pgid", group, "error", err)
			}
		}
		for _, pid := range tree {
			if _, err := p.r.run(ctx, "kill", "--pid="+strconv.Itoa(pid), id, "KILL"); err != nil {
				p.log.Debug("runsc kill --pid", "container", id, "pid", pid, "error", err)
			}
		}
	}
	return nil
}

// treeOf returns what killGuestTree kills of root's tree in ps: root's
// process group when root leads it or led it (group 0 otherwise: the group
// of the cell's init is never signalled), and the processes outside that group
// that descend from root or from a member of the group, parents first.
// It never returns the cell's init (PID 1).
func treeOf(ps []guestProcess, root int) (group int, tree []int) {
	children := make(map[int][]int)
	inGroup := make(map[int]bool)
	for _, pr := range ps {
		children[pr.ppid] = append(children[pr.ppid], pr.pid)
		// root leads its group; the group outlives root when root died
		// first (killed in an earlier round) and members remain.
		if pr.pgid == root && root != 1 {
			group = root
		}
	}
	if group != 0 {
		for _, pr := range ps {
			inGroup[pr.pid] = pr.pgid == group
		}
	}
	// Breadth first from root and from every group member.
	seen := map[int]bool{1: true}
	var queue []int
	for _, pr := range ps {
		if pr.pid == root || inGroup[pr.pid] {
			if !seen[pr.pid] {
				seen[pr.pid] = true
				queue = append(queue, pr.pid)
			}
		}
	}
	for i := 0; i < len(queue); i++ {
		pid := queue[i]
		if !inGroup[pid] {
			tree = append(tree, pid)
		}
		for _, c := range children[pid] {
			if !seen[c] {
				seen[c] = true
				queue = append(queue, c)
			}
		}
	}
	return group, tree
}

// cappedBuffer keeps the first max bytes written to it and records whether
// more came. It accepts (and drops) everything beyond, so the writer is
// never blocked or failed.
type cappedBuffer struct {
	max       int
	buf       bytes.Buffer
	truncated bool
}

func (c *cappedBuffer) Write(b []byte) (int, error) {
	room := c.max - c.buf.Len()
	if len(b) > room {
		c.truncated = true
		if room > 0 {
			c.buf.Write(b[:room])
		}
		return len(b), nil
	}
	c.buf.Write(b)
	return len(b), nil
}
