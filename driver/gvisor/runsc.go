package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// runscEnv is the whole environment runsc runs with: nothing of the
// driver's own environment is passed through.
var runscEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

// maxRunscOutput caps what is kept of a runsc management command's output.
const maxRunscOutput = 1 << 20

// defaultCallTimeout bounds one runsc management command when the caller's
// context has no earlier deadline.
const defaultCallTimeout = time.Minute

// runsc runs the runsc binary with the provider's global flags. It is the
// only place that builds runsc command lines.
type runsc struct {
	path     string
	root     string // absolute path of the private --root
	network  string
	platform string
	// overlay is --overlay2 ("root:memory,size=…": the writable layer of
	// an image cell's root), or "" for runsc's default. runsc applies it
	// to a writable root only, so cells of a read-only root (the default
	// or an operator's) run as without it.
	overlay string
	// ignoreCgroups is set once, when runsc could not apply cgroup limits
	// on this host.
	ignoreCgroups atomic.Bool
}

// globalFlags are passed to every invocation. runsc needs the same flags
// for every command on one container (start fails if --network differs
// from create's).
func (r *runsc) globalFlags() []string {
	f := []string{"--root=" + r.root, "--network=" + r.network, "--host-uds=create"}
	if r.platform != "" {
		f = append(f, "--platform="+r.platform)
	}
	if r.overlay != "" {
		f = append(f, "--overlay2="+r.overlay)
	}
	if r.ignoreCgroups.Load() {
		f = append(f, "--ignore-cgroups")
	}
	return f
}

// command builds an exec.Cmd for runsc with args after the global flags. It
// runs with a fixed environment, in its own process group (so that a signal
// to the driver's group does not reach sandboxes, and a kill of the group
// reaches runsc's helpers), from "/".
func (r *runsc) command(args ...string) *exec.Cmd {
	cmd := exec.Command(r.path, append(r.globalFlags(), args...)...)
	cmd.Env = runscEnv
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

// killGroup kills cmd's process group.
func killGroup(cmd *exec.Cmd) error {
	if cmd.Process == nil {
		return nil
	}
	err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// runError is a failed runsc command.
type runError struct {
	args   []string // the subcommand and its arguments
	err    error
	stderr string
}

func (e *runError) Error() string {
	msg := strings.TrimSpace(e.stderr)
	if len(msg) > 2048 {
		msg = msg[:2048] + "…"
	}
	if msg == "" {
		return fmt.Sprintf("runsc %s: %v", strings.Join(e.args, " "), e.err)
	}
	return fmt.Sprintf("runsc %s: %v: %s", strings.Join(e.args, " "), e.err, msg)
}

func (e *runError) Unwrap() error { return e.err }

// notExist reports whether err is runsc saying the container (or its
// sandbox) does not exist.
func notExist(err error) bool {
	var re *runError
	return errors.As(err, &re) && strings.Contains(re.stderr, "file does not exist")
}

// cgroupFailure reports whether err is runsc failing to set up cgroups.
func cgroupFailure(err error) bool {
	var re *runError
	return errors.As(err, &re) && strings.Contains(strings.ToLower(re.stderr), "cgroup")
}

// run runs one runsc management command within ctx and returns its stdout.
// On cancellation the whole process group is killed.
//
// Stdout and stderr go to unnamed temporary files rather than pipes: runsc
// create hands its stdio to the container's init, which keeps it open for
// the container's life, so a pipe would never reach EOF.
func (r *runsc) run(ctx context.Context, args ...string) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultCallTimeout)
		defer cancel()
	}
	stdout, err := tempFile()
	if err != nil {
		return nil, err
	}
	defer stdout.Close()
	stderr, err := tempFile()
	if err != nil {
		return nil, err
	}
	defer stderr.Close()

	cmd := r.command(args...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Start(); err != nil {
		return nil, &runError{args: args, err: err}
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		_ = killGroup(cmd)
		<-done
		err = ctx.Err()
	}
	out := readAll(stdout)
	if err != nil {
		return out, &runError{args: args, err: err, stderr: string(readAll(stderr))}
	}
	return out, nil
}

// tempFile returns an unlinked read-write temporary file.
func tempFile() (*os.File, error) {
	f, err := os.CreateTemp("", "sandboxwich-runsc-*")
	if err != nil {
		return nil, err
	}
	_ = os.Remove(f.Name())
	return f, nil
}

// readAll reads f from its start, up to maxRunscOutput bytes.
func readAll(f *os.File) []byte {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil
	}
	b, _ := io.ReadAll(io.LimitReader(f, maxRunscOutput))
	return b
}

// containerState is the part of `runsc state` and `runsc list
// -format=json` output the driver reads.
type containerState struct {
	ID          string            `json:"id"`
	Status      string            `json:"status"`
	Pid         int               `json:"pid"`
	Bundle      string            `json:"bundle"`
	Annotations map[string]string `json:"annotations"`
}

// statusRunning is the status runsc reports for a started container
// (others: creating, created, paused, stopped).
const statusRunning = "running"

// state returns the container's state, or nil when runsc says it does not
// exist.
func (r *runsc) state(ctx context.Context, id string) (*containerState, error) {
	out, err := r.run(ctx, "state", id)
	if notExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var st containerState
	if err := json.Unmarshal(out, &st); err != nil {
		return nil, fmt.Errorf("runsc state %s: decoding %q: %w", id, truncate(out, 200), err)
	}
	if st.ID != id {
		return nil, fmt.Errorf("runsc state %s: reported container %q", id, st.ID)
	}
	return &st, nil
}

// stateFile reads the container's state from runsc's own state file under
// the private root, without running runsc (tens of milliseconds saved on
// every pre-exec verification). It returns nil when the file is absent or
// unreadable; callers then ask `runsc state`, which stays the authority on
// absence.
func (r *runsc) stateFile(id string) *containerState {
	b, err := os.ReadFile(r.stateFilePath(id))
	if err != nil {
		return nil
	}
	var f struct {
		ID      string `json:"id"`
		Status  string `json:"status"`
		Sandbox struct {
			Pid int `json:"pid"`
		} `json:"sandbox"`
		Spec struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"spec"`
	}
	if json.Unmarshal(b, &f) != nil || f.ID != id {
		return nil
	}
	return &containerState{ID: f.ID, Status: f.Status, Pid: f.Sandbox.Pid, Annotations: f.Spec.Annotations}
}

// noStateFile reports whether runsc has no state file of container id (the
// file stateFile reads: a cell's container is alone in its sandbox, which
// runsc names after it), so that `runsc state` would answer that it does
// not exist. Any other error than the file's absence is false.
func (r *runsc) noStateFile(id string) bool {
	_, err := os.Lstat(r.stateFilePath(id))
	return errors.Is(err, fs.ErrNotExist)
}

// stateFilePath is where runsc keeps container id's state.
func (r *runsc) stateFilePath(id string) string { return stateFilePath(r.root, id) }

// stateFilePath is where runsc keeps the state of container id, alone in
// its sandbox (as a cell's is), under state root root.
func stateFilePath(root, id string) string {
	return filepath.Join(root, id+"_sandbox:"+id+".state")
}

// list returns every container under the private root.
func (r *runsc) list(ctx context.Context) ([]containerState, error) {
	out, err := r.run(ctx, "list", "-format=json")
	if err != nil {
		return nil, err
	}
	var cs []containerState // "null" when there are none
	if err := json.Unmarshal(out, &cs); err != nil {
		return nil, fmt.Errorf("runsc list: decoding %q: %w", truncate(out, 200), err)
	}
	return cs, nil
}

// guestProcess is one process of `runsc ps`.
type guestProcess struct{ pid, ppid, pgid int }

// ps lists the container's processes with their parents and process
// groups. PIDs are in the sandbox's root PID namespace, as `runsc kill
// --pid` and `--pgid` expect. (`runsc ps --format=json` lists PIDs alone,
// so the table is parsed by its header; a runsc without the PGID column
// yields pgid 0.)
func (r *runsc) ps(ctx context.Context, id string) ([]guestProcess, error) {
	out, err := r.run(ctx, "ps", id)
	if err != nil {
		return nil, err
	}
	return parsePS(id, out)
}

// parsePS parses `runsc ps` table output: "UID PID PPID PGID C TTY STIME
// TIME CMD".
func parsePS(id string, out []byte) ([]guestProcess, error) {
	lines := strings.Split(string(out), "\n")
	col := map[string]int{}
	for i, h := range strings.Fields(lines[0]) {
		col[h] = i
	}
	iPID, ok1 := col["PID"]
	iPPID, ok2 := col["PPID"]
	iPGID, hasPGID := col["PGID"]
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("runsc ps %s: unexpected header %q", id, lines[0])
	}
	var ps []guestProcess
	for _, line := range lines[1:] {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		var pr guestProcess
		var err1, err2, err3 error
		if len(f) > max(iPID, iPPID, iPGID) {
			pr.pid, err1 = strconv.Atoi(f[iPID])
			pr.ppid, err2 = strconv.Atoi(f[iPPID])
			if hasPGID {
				pr.pgid, err3 = strconv.Atoi(f[iPGID])
			}
		} else {
			err1 = errors.New("short line")
		}
		if err1 != nil || err2 != nil || err3 != nil {
			return nil, fmt.Errorf("runsc ps %s: unexpected line %q", id, line)
		}
		ps = append(ps, pr)
	}
	return ps, nil
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

// nullNetNS is the file under a state root where runsc bind-mounts the
// empty network namespace it shares between the gofers of cells with
// --network=none (runsc/specutils.NullNetNSFilename).
const nullNetNS = "null-netns"

// RemoveStateDir removes a runsc state root that no longer holds
// containers, such as a test's or a benchmark's. runsc pins an empty
// network namespace there with bind mounts (stacked when created
// concurrently) that must be unmounted first, or the removal fails with
// EBUSY and leaves a mount behind on the host.
func RemoveStateDir(dir string) error {
	path := filepath.Join(dir, nullNetNS)
	for syscall.Unmount(path, syscall.MNT_DETACH) == nil {
	}
	return os.RemoveAll(dir)
}
