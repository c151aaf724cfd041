package cellagent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sandboxwich/sandboxwich/agent"
)

// drainLimit bounds how long Exec keeps reading output after the direct
// child exited: what is buffered in the pipes is read at once, but
// processes left in the background may hold them and keep writing.
const drainLimit = 100 * time.Millisecond

// exec runs sp and waits for its direct child; see Conn.Exec.
func (a *Agent) exec(ctx context.Context, sp spec, stdin []byte, timeout time.Duration, maxOut int, out func(agent.Output) error) (agent.ExecResult, error) {
	s := &sink{max: maxOut, out: out, failed: make(chan error, 1)}
	if err := checkDir(sp.cwd); err != nil {
		return agent.ExecResult{}, err
	}
	path, ok := lookPath(sp.argv[0], sp.cwd, envValue(sp.env, "PATH"))
	if !ok {
		return s.refused(127, sp.argv[0]+": command not found")
	}
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		return agent.ExecResult{}, fmt.Errorf("agent: exec: %w", err)
	}
	defer stdinW.Close()
	outR, outW, err := os.Pipe()
	if err != nil {
		stdinR.Close()
		return agent.ExecResult{}, fmt.Errorf("agent: exec: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		stdinR.Close()
		outR.Close()
		outW.Close()
		return agent.ExecResult{}, fmt.Errorf("agent: exec: %w", err)
	}
	attr := &syscall.ProcAttr{
		Dir:   sp.cwd,
		Env:   sp.env,
		Files: []uintptr{stdinR.Fd(), outW.Fd(), errW.Fd()},
		Sys:   &syscall.SysProcAttr{Credential: sp.cred.sys()},
	}
	start := time.Now()
	pid, exited, err := a.procs.spawn(path, sp.argv, attr)
	stdinR.Close()
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		switch {
		case agent.IsAnswer(err):
			return agent.ExecResult{}, err
		case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
			return s.refused(126, "cannot enter "+sp.cwd+" or execute "+sp.argv[0]+": permission denied")
		case errors.Is(err, syscall.ENOEXEC):
			return s.refused(126, sp.argv[0]+": cannot execute: "+err.Error())
		case errors.Is(err, syscall.ENOENT), errors.Is(err, syscall.ENOTDIR):
			return s.refused(127, sp.argv[0]+": cannot execute: "+err.Error())
		case errors.Is(err, syscall.E2BIG), errors.Is(err, syscall.ENAMETOOLONG):
			// CheckArgs keeps requests below the kernel's limits; one the
			// kernel still refuses is the request's fault, not the cell's.
			// (Linux says E2BIG; gVisor ENAMETOOLONG for a string over
			// MAX_ARG_STRLEN.)
			return agent.ExecResult{}, agent.Errorf(agent.CodeInvalid, "the kernel refused the program's path, argv or env as too long ("+err.Error()+")")
		}
		return agent.ExecResult{}, fmt.Errorf("agent: exec: start: %w", err)
	}
	go func() {
		_, _ = stdinW.Write(stdin)
		stdinW.Close()
	}()
	var pumps sync.WaitGroup
	pumps.Add(2)
	go s.pump(&pumps, agent.Stdout, outR)
	go s.pump(&pumps, agent.Stderr, errR)

	var timerC <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		timerC = t.C
	}
	done, failed := ctx.Done(), (<-chan error)(s.failed)
	var (
		es       exitStatus
		timedOut bool
		failure  error
	)
wait:
	for {
		select {
		case es = <-exited:
			break wait
		case <-timerC:
			timedOut, timerC = true, nil
			a.procs.killTree(pid)
		case <-done:
			failure, done = ctx.Err(), nil
			a.procs.killTree(pid)
		case err := <-failed:
			failure, failed = err, nil
			a.procs.killTree(pid)
		}
	}
	dur := time.Since(start)
	// The direct child exited. Take what is buffered, then stop reading:
	// processes it left in the background may hold the pipes open.
	past := time.Unix(1, 0)
	_ = outR.SetReadDeadline(past)
	_ = errR.SetReadDeadline(past)
	pumps.Wait()
	outR.Close()
	errR.Close()
	if failure == nil {
		failure = s.err()
	}
	if failure != nil {
		return agent.ExecResult{}, failure
	}
	res := agent.ExecResult{ExitCode: es.code, Signal: es.signal, Reason: agent.Exited, DurationMillis: dur.Milliseconds()}
	select {
	case <-a.ended:
		res.Reason = agent.Killed
	default:
		switch {
		case timedOut:
			res.Reason = agent.TimedOut
		case es.lost:
			res.Reason = agent.CellLost
		}
	}
	res.Truncated = s.finish(&res)
	return res, nil
}

// sink takes a command's output in the order produced, caps each stream
// at max bytes and hands it to out, or collects it when out is nil.
type sink struct {
	max    int
	out    func(agent.Output) error
	failed chan error // the error of out, once

	mu        sync.Mutex
	n         [2]int
	buf       [2][]byte
	truncated bool
	outErr    error
}

func streamIndex(st agent.Stream) int {
	if st == agent.Stderr {
		return 1
	}
	return 0
}

// write takes one chunk of stream st.
func (s *sink) write(st agent.Stream, p []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := streamIndex(st)
	room := s.max - s.n[i]
	if len(p) > room {
		p, s.truncated = p[:max(room, 0)], true
	}
	if len(p) == 0 || s.outErr != nil {
		return
	}
	s.n[i] += len(p)
	if s.out == nil {
		s.buf[i] = append(s.buf[i], p...)
		return
	}
	if err := s.out(agent.Output{Stream: st, Data: append([]byte(nil), p...)}); err != nil {
		s.outErr = err
		s.failed <- err
	}
}

func (s *sink) err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.outErr
}

// finish puts the collected output into res and reports truncation.
func (s *sink) finish(res *agent.ExecResult) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.out == nil {
		res.Stdout, res.Stderr = s.buf[0], s.buf[1]
	}
	return s.truncated
}

// refused is the result of a command that could not be started (as a
// shell reports it: 126 not executable, 127 not found), msg on stderr.
func (s *sink) refused(code int, msg string) (agent.ExecResult, error) {
	s.write(agent.Stderr, []byte("sandboxwich-agent: "+msg+"\n"))
	if err := s.err(); err != nil {
		return agent.ExecResult{}, err
	}
	res := agent.ExecResult{ExitCode: code, Reason: agent.Exited}
	res.Truncated = s.finish(&res)
	return res, nil
}

// pump reads stream st from f until EOF, or until the read deadline set
// at the child's exit; then it drains what is buffered without waiting.
func (s *sink) pump(wg *sync.WaitGroup, st agent.Stream, f *os.File) {
	defer wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			s.write(st, buf[:n])
		}
		if err == nil {
			continue
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			s.drain(st, f, buf)
		}
		return
	}
}

// drain reads what f holds now, without waiting for more, for at most
// drainLimit.
func (s *sink) drain(st agent.Stream, f *os.File, buf []byte) {
	if f.SetReadDeadline(time.Time{}) != nil {
		return
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	stop := time.Now().Add(drainLimit)
	for time.Now().Before(stop) {
		var n int
		var rerr error
		if err := rc.Read(func(fd uintptr) bool {
			n, rerr = syscall.Read(int(fd), buf)
			return rerr != syscall.EINTR
		}); err != nil || rerr != nil || n <= 0 {
			return
		}
		s.write(st, buf[:n])
	}
}

// checkDir refuses a cwd that does not exist or is not a directory.
func checkDir(dir string) error {
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return agent.Errorf(agent.CodeInvalid, fmt.Sprintf("cwd %s does not exist", dir))
	case err != nil:
		return agent.Errorf(agent.CodeInvalid, fmt.Sprintf("cwd %s: %v", dir, errors.Unwrap(err)))
	case !fi.IsDir():
		return agent.Errorf(agent.CodeInvalid, fmt.Sprintf("cwd %s is not a directory", dir))
	}
	return nil
}

// lookPath finds name as a shell would: a name with a slash as it is
// (relative to cwd), another in the directories of path.
func lookPath(name, cwd, path string) (string, bool) {
	executable := func(p string) bool {
		if !filepath.IsAbs(p) {
			p = filepath.Join(cwd, p)
		}
		fi, err := os.Stat(p)
		return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
	}
	if strings.Contains(name, "/") {
		return name, executable(name)
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" || !filepath.IsAbs(dir) {
			continue
		}
		if p := filepath.Join(dir, name); executable(p) {
			return p, true
		}
	}
	return "", false
}

// envValue is the value of key in an environment list.
func envValue(env []string, key string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v
		}
	}
	return ""
}
