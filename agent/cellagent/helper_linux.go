package cellagent

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/sandboxwich/sandboxwich/agent"
)

// File operations and the launch run in a helper: the agent's own
// executable (Config.Helper), re-executed with helperArg as the
// requesting user — uid and gid set, no supplementary groups, so no
// capability either. The kernel then checks every path component, symlink
// and permission with that user's rights: a cell user cannot make the
// root agent write through a symlink into /etc or read /root, and the
// parents it creates are its own. The agent talks to the helper over two
// pipes: requests and file content go in as length-prefixed frames on its
// stdin (a zero-length frame commits a write; end of input without it
// aborts), replies (one JSON line) and read content come back on fd 3.

// Frames between the agent and its helper, the same form as a file
// write's content on the wire (agent.NewHandler): a length prefix of
// frameHeader bytes, big-endian, then at most maxFrame bytes; length 0
// ends the content.
const (
	frameHeader = 4
	maxFrame    = 1 << 20
)

// fill reads r into b until b is full (err nil) or r reports an error:
// io.EOF, returned as it is, is the content's clean end; anything else —
// io.ErrUnexpectedEOF from a body cut short included — is a failure. Unlike
// io.ReadFull it never turns an end into success or a failure into an
// end.
func fill(r io.Reader, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := r.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// helperArg is argv[1] of a helper process.
const helperArg = "sandboxwich-agent-helper"

// helperReq is a helper's first frame.
type helperReq struct {
	Op   string `json:"op"` // "write", "read" or "launch"
	Path string `json:"path"`
	Mode uint32 `json:"mode,omitempty"`
	Max  int64  `json:"max,omitempty"`
	// launch
	Argv   []string `json:"argv,omitempty"`
	Env    []string `json:"env,omitempty"`
	Cwd    string   `json:"cwd,omitempty"`
	OutDir string   `json:"out_dir,omitempty"`
}

// helperReply is a helper's answer line.
type helperReply struct {
	OK    bool       `json:"ok"`
	Size  int64      `json:"size,omitempty"`
	Errno int        `json:"errno,omitempty"`
	Code  agent.Code `json:"code,omitempty"` // a decided error without errno
	Msg   string     `json:"msg,omitempty"`
}

// HelperMain runs the agent's helper and exits when the process was
// started as one (os.Args[1] is the helper's hidden subcommand); otherwise
// it returns at once. The agent binary calls it first in main, and so must
// the TestMain of any test binary that creates an Agent whose Helper is
// the test binary itself (the default, /proc/self/exe).
func HelperMain() {
	if len(os.Args) < 2 || os.Args[1] != helperArg {
		return
	}
	os.Exit(runHelper(os.Stdin, os.NewFile(3, "reply")))
}

func runHelper(in *os.File, reply *os.File) int {
	syscall.CloseOnExec(3)
	r := bufio.NewReader(in)
	b, commit, err := readFrame(r, nil)
	if err != nil || commit {
		return 2
	}
	var req helperReq
	if err := json.Unmarshal(b, &req); err != nil {
		return 2
	}
	switch req.Op {
	case "write":
		return helperWrite(r, reply, req)
	case "read":
		return helperRead(reply, req)
	case "launch":
		return helperLaunch(reply, req)
	}
	return 2
}

// answer writes one reply line; err nil is success.
func answer(w io.Writer, rep helperReply, err error) int {
	if err != nil {
		rep = helperReply{Msg: err.Error()}
		var errno syscall.Errno
		var e *agent.Error
		switch {
		case errors.As(err, &e):
			rep.Code, rep.Msg = e.Code, e.Message
		case errors.As(err, &errno):
			rep.Errno = int(errno)
		}
	} else {
		rep.OK = true
	}
	b, _ := json.Marshal(rep)
	_, _ = w.Write(append(b, '\n'))
	if err != nil {
		return 1
	}
	return 0
}

func helperWrite(in *bufio.Reader, reply io.Writer, req helperReq) int {
	dir := filepath.Dir(req.Path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return answer(reply, helperReply{}, err)
	}
	f, err := os.CreateTemp(dir, ".sbw-write-*")
	if err != nil {
		return answer(reply, helperReply{}, err)
	}
	tmp := f.Name()
	fail := func(err error) int {
		f.Close()
		os.Remove(tmp)
		if err == nil {
			return 1 // aborted: nothing to answer
		}
		return answer(reply, helperReply{}, err)
	}
	answer(reply, helperReply{}, nil) // ready for the content
	var total int64
	scratch := make([]byte, maxFrame)
	for {
		b, commit, err := readFrame(in, scratch)
		if err != nil {
			return fail(nil)
		}
		if commit {
			break
		}
		if total += int64(len(b)); total > req.Max {
			return fail(agent.Errorf(agent.CodeTooLarge, fmt.Sprintf("the content is larger than %d bytes", req.Max)))
		}
		if _, err := f.Write(b); err != nil {
			return fail(err)
		}
	}
	if err := f.Chmod(os.FileMode(req.Mode)); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return answer(reply, helperReply{}, err)
	}
	if err := os.Rename(tmp, req.Path); err != nil {
		os.Remove(tmp)
		return answer(reply, helperReply{}, err)
	}
	return answer(reply, helperReply{Size: total}, nil)
}

// maxPseudoFile bounds what is read of a file whose size the kernel
// reports as 0 (procfs, sysfs): its content is read whole before the
// answer, which states its size.
const maxPseudoFile = 16 << 20

// notRegular is the answer to a read of a socket, FIFO or device.
func notRegular(path string) error {
	return agent.Errorf(agent.CodeInvalid, path+" is not a regular file (a socket, FIFO or device)")
}

func helperRead(reply io.Writer, req helperReq) int {
	// What is not a regular file is refused before it is opened: opening
	// a socket fails (ENXIO), a FIFO or a device may block or act.
	var st syscall.Stat_t
	if err := syscall.Stat(req.Path, &st); err != nil {
		return answer(reply, helperReply{}, err)
	}
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		return answer(reply, helperReply{}, syscall.EISDIR)
	case syscall.S_IFREG:
	default:
		return answer(reply, helperReply{}, notRegular(req.Path))
	}
	// O_NONBLOCK: a FIFO swapped in since the stat must not hang the
	// open; it changes nothing for a regular file.
	fd, err := syscall.Open(req.Path, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return answer(reply, helperReply{}, err)
	}
	f := os.NewFile(uintptr(fd), req.Path)
	defer f.Close()
	fi, err := f.Stat()
	switch {
	case err != nil:
		return answer(reply, helperReply{}, err)
	case fi.IsDir():
		return answer(reply, helperReply{}, syscall.EISDIR)
	case !fi.Mode().IsRegular():
		return answer(reply, helperReply{}, notRegular(req.Path))
	case fi.Size() > req.Max:
		return answer(reply, helperReply{}, agent.Errorf(agent.CodeTooLarge, fmt.Sprintf("%s is larger than %d bytes", req.Path, req.Max)))
	case fi.Size() == 0:
		return helperReadUnsized(reply, f, req)
	}
	answer(reply, helperReply{Size: fi.Size()}, nil)
	if _, err := io.CopyN(reply, f, fi.Size()); err != nil {
		return 1
	}
	return 0
}

// helperReadUnsized reads a file whose size the kernel reports as 0 (a
// pseudo file of /proc or /sys, or an empty file) to its end, then answers
// with the size it held and sends it.
func helperReadUnsized(reply io.Writer, f *os.File, req helperReq) int {
	limit := min(req.Max, maxPseudoFile)
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	switch {
	case err != nil:
		return answer(reply, helperReply{}, err)
	case int64(len(b)) > req.Max:
		return answer(reply, helperReply{}, agent.Errorf(agent.CodeTooLarge, fmt.Sprintf("%s is larger than %d bytes", req.Path, req.Max)))
	case int64(len(b)) > limit:
		return answer(reply, helperReply{}, agent.Errorf(agent.CodeTooLarge, fmt.Sprintf("%s reports no size and holds more than %d bytes", req.Path, limit)))
	}
	answer(reply, helperReply{Size: int64(len(b))}, nil)
	if _, err := reply.Write(b); err != nil {
		return 1
	}
	return 0
}

// helperLaunch opens the launch's output files, enters cwd and becomes
// the workload (execve: same pid). Success is silence: fd 3 closes at the
// exec.
func helperLaunch(reply io.Writer, req helperReq) int {
	if err := os.MkdirAll(req.OutDir, 0o755); err != nil {
		return answer(reply, helperReply{}, err)
	}
	open := func(name string) (int, error) {
		return syscall.Open(filepath.Join(req.OutDir, name), syscall.O_WRONLY|syscall.O_CREAT|syscall.O_TRUNC|syscall.O_CLOEXEC, 0o644)
	}
	stdout, err := open("stdout")
	if err != nil {
		return answer(reply, helperReply{}, err)
	}
	stderr, err := open("stderr")
	if err != nil {
		return answer(reply, helperReply{}, err)
	}
	null, err := syscall.Open("/dev/null", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return answer(reply, helperReply{}, err)
	}
	if err := syscall.Chdir(req.Cwd); err != nil {
		return answer(reply, helperReply{}, err)
	}
	for _, d := range [][2]int{{null, 0}, {stdout, 1}, {stderr, 2}} {
		if err := syscall.Dup3(d[0], d[1], 0); err != nil {
			return answer(reply, helperReply{}, err)
		}
	}
	err = syscall.Exec(req.Path, req.Argv, req.Env)
	return answer(reply, helperReply{}, err)
}

// readFrame reads one frame: a 4-byte big-endian length, then the bytes,
// into scratch when it is large enough (the bytes are valid until the next
// call). A zero length is the commit.
func readFrame(r *bufio.Reader, scratch []byte) (b []byte, commit bool, err error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, false, err
	}
	size := binary.BigEndian.Uint32(n[:])
	if size == 0 {
		return nil, true, nil
	}
	if size > maxFrame {
		return nil, false, errors.New("frame too large")
	}
	if int(size) <= len(scratch) {
		b = scratch[:size]
	} else {
		b = make([]byte, size)
	}
	_, err = io.ReadFull(r, b)
	return b, false, err
}

// writeFrame writes one frame; nil b is the commit.
func writeFrame(w io.Writer, b []byte) error {
	frame := make([]byte, frameHeader+len(b))
	copy(frame[frameHeader:], b)
	return writeFramed(w, frame)
}

// writeFramed writes frame, whose first frameHeader bytes are free for the
// length of the rest, in one write.
func writeFramed(w io.Writer, frame []byte) error {
	binary.BigEndian.PutUint32(frame[:frameHeader], uint32(len(frame)-frameHeader))
	_, err := w.Write(frame)
	return err
}

// helper is a running helper process, from the agent's side.
type helper struct {
	pid    int
	in     *os.File
	replyF *os.File
	reply  *bufio.Reader
	exited <-chan exitStatus
	done   bool
}

// startHelper starts a helper as c and sends it req.
func (a *Agent) startHelper(c cred, req helperReq) (*helper, error) {
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("agent: helper: %w", err)
	}
	growPipe(inW)
	repR, repW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, fmt.Errorf("agent: helper: %w", err)
	}
	null, err := os.Open(os.DevNull)
	if err != nil {
		inR.Close()
		inW.Close()
		repR.Close()
		repW.Close()
		return nil, fmt.Errorf("agent: helper: %w", err)
	}
	attr := &syscall.ProcAttr{
		Dir:   "/",
		Env:   []string{},
		Files: []uintptr{inR.Fd(), null.Fd(), null.Fd(), repW.Fd()},
		Sys:   &syscall.SysProcAttr{Credential: c.sys()},
	}
	pid, exited, err := a.procs.spawn(a.cfg.Helper, []string{"sandboxwich-agent", helperArg}, attr)
	inR.Close()
	repW.Close()
	null.Close()
	if err != nil {
		inW.Close()
		repR.Close()
		if agent.IsAnswer(err) {
			return nil, err
		}
		return nil, fmt.Errorf("agent: start helper %s: %w", a.cfg.Helper, err)
	}
	h := &helper{pid: pid, in: inW, replyF: repR, reply: bufio.NewReader(repR), exited: exited}
	b, _ := json.Marshal(req)
	if err := writeFrame(inW, b); err != nil {
		h.close()
		return nil, fmt.Errorf("agent: helper: %w", err)
	}
	return h, nil
}

// answer reads the helper's next reply; io.EOF when it closed fd 3
// without one.
func (h *helper) answer(path string) (helperReply, error) {
	line, err := h.reply.ReadBytes('\n')
	if err != nil {
		if err == io.EOF && len(line) == 0 {
			return helperReply{}, io.EOF
		}
		return helperReply{}, fmt.Errorf("agent: helper for %s: %w", path, err)
	}
	var rep helperReply
	if err := json.Unmarshal(line, &rep); err != nil {
		return helperReply{}, fmt.Errorf("agent: helper for %s: bad reply: %w", path, err)
	}
	if !rep.OK {
		return rep, fileError(path, rep)
	}
	return rep, nil
}

// close ends the helper: its pipes are closed (a write without commit is
// then aborted and its temporary file removed), and the agent waits for
// its exit, killing it when it takes too long.
func (h *helper) close() exitStatus {
	if h.done {
		return exitStatus{}
	}
	h.done = true
	h.in.Close()
	h.replyF.Close()
	select {
	case es := <-h.exited:
		return es
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(h.pid, syscall.SIGKILL) // not reaped yet: the pid is still ours
		return <-h.exited
	}
}

// fileError maps a helper's failure to the protocol's errors.
func fileError(path string, rep helperReply) error {
	if rep.Code != "" {
		return agent.Errorf(rep.Code, rep.Msg)
	}
	errno := syscall.Errno(rep.Errno)
	msg := fmt.Sprintf("%s: %s", path, errno.Error())
	switch errno {
	case syscall.ENOENT:
		return agent.Errorf(agent.CodeNotFound, msg)
	case syscall.EISDIR, syscall.ENOTDIR, syscall.ELOOP, syscall.ENAMETOOLONG, syscall.EINVAL, syscall.EEXIST, syscall.ENOTEMPTY:
		return agent.Errorf(agent.CodeInvalid, msg)
	case syscall.ENXIO, syscall.ENODEV, syscall.EOPNOTSUPP:
		// Opening a socket, or a device without a driver: not a file.
		return agent.Errorf(agent.CodeInvalid, path+" is not a regular file (a socket, FIFO or device)")
	case syscall.EACCES, syscall.EPERM, syscall.EROFS, syscall.ETXTBSY:
		return agent.Errorf(agent.CodeAccessDenied, msg)
	case syscall.ENOSPC, syscall.EDQUOT:
		return agent.Errorf(agent.CodeNoSpace, msg)
	case syscall.EFBIG:
		return agent.Errorf(agent.CodeTooLarge, msg)
	case 0:
		return fmt.Errorf("agent: helper for %s failed: %s", path, rep.Msg)
	}
	return fmt.Errorf("agent: file %s: %w", path, errno)
}

// writeFile streams content to a helper running as c; see Conn.WriteFile.
func (a *Agent) writeFile(ctx context.Context, c cred, path string, mode uint32, content io.Reader) (agent.FileInfo, error) {
	h, err := a.startHelper(c, helperReq{Op: "write", Path: path, Mode: mode, Max: agent.MaxFileBytes})
	if err != nil {
		return agent.FileInfo{}, err
	}
	defer h.close()
	if _, err := h.answer(path); err != nil {
		return agent.FileInfo{}, err
	}
	hash := sha256.New()
	var size int64
	// Frames as large as the helper takes, filled before they are sent:
	// in gVisor every pipe write and task switch is costly, so fewer,
	// larger writes make the upload several times faster.
	frame := make([]byte, frameHeader+maxFrame)
	for {
		if err := ctx.Err(); err != nil {
			return agent.FileInfo{}, err
		}
		n, rerr := fill(content, frame[frameHeader:])
		if rerr != nil && rerr != io.EOF { //nolint:errorlint // only the reader's own EOF is a complete content
			h.close() // aborts: the helper removes its temporary file
			if agent.IsAnswer(rerr) {
				return agent.FileInfo{}, rerr
			}
			return agent.FileInfo{}, fmt.Errorf("agent: write %s: reading the content: %w; nothing was written", path, rerr)
		}
		if n > 0 {
			if size += int64(n); size > agent.MaxFileBytes {
				h.close() // aborts: the helper removes its temporary file
				return agent.FileInfo{}, agent.Errorf(agent.CodeTooLarge, fmt.Sprintf("the content is larger than %d bytes; nothing was written", agent.MaxFileBytes))
			}
			hash.Write(frame[frameHeader : frameHeader+n])
			if err := writeFramed(h.in, frame[:frameHeader+n]); err != nil {
				return agent.FileInfo{}, a.endedOr(h.failure(path, err)) // the helper gave up: its answer says why
			}
		}
		if rerr == io.EOF { //nolint:errorlint // see above
			break
		}
	}
	if err := writeFrame(h.in, nil); err != nil {
		return agent.FileInfo{}, a.endedOr(h.failure(path, err))
	}
	if _, err := h.answer(path); err != nil {
		return agent.FileInfo{}, a.endedOr(err)
	}
	return agent.FileInfo{Path: path, Size: size, SHA256: hex.EncodeToString(hash.Sum(nil))}, nil
}

// endedOr is ErrExpired when the agent ended (killing the helper), err
// otherwise.
func (a *Agent) endedOr(err error) error {
	select {
	case <-a.ended:
		if !agent.IsAnswer(err) {
			return agent.Errorf(agent.CodeExpired, "the lease ended during the operation")
		}
	default:
	}
	return err
}

// failure is the helper's own answer after writing to it failed, or the
// write error when it gave none.
func (h *helper) failure(path string, werr error) error {
	if _, err := h.answer(path); err != nil && err != io.EOF {
		return err
	}
	return fmt.Errorf("agent: write %s: the helper stopped reading: %w", path, werr)
}

// readFile opens path in a helper running as c; see Conn.ReadFile.
func (a *Agent) readFile(ctx context.Context, c cred, path string, limit int64) (io.ReadCloser, int64, error) {
	h, err := a.startHelper(c, helperReq{Op: "read", Path: path, Max: limit})
	if err != nil {
		return nil, 0, err
	}
	rep, err := h.answer(path)
	if err != nil {
		h.close()
		if err == io.EOF {
			err = fmt.Errorf("agent: read %s: the helper gave no answer", path)
		}
		return nil, 0, a.endedOr(err)
	}
	return &helperReader{h: h, left: rep.Size}, rep.Size, nil
}

// helperReader is a file's content as a read helper sends it.
type helperReader struct {
	h    *helper
	left int64
}

func (r *helperReader) Read(p []byte) (int, error) {
	if r.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > r.left {
		p = p[:r.left]
	}
	n, err := r.h.reply.Read(p)
	r.left -= int64(n)
	if err == io.EOF && r.left > 0 {
		err = io.ErrUnexpectedEOF // the file shrank, or the helper died
	}
	return n, err
}

func (r *helperReader) Close() error {
	r.h.close()
	return nil
}

// startLaunch starts the launch's helper, which becomes the workload.
func (a *Agent) startLaunch(sp spec) (int, <-chan exitStatus, error) {
	if err := checkDir(sp.cwd); err != nil {
		return 0, nil, err
	}
	path, ok := lookPath(sp.argv[0], sp.cwd, envValue(sp.env, "PATH"))
	if !ok {
		return 0, nil, agent.Errorf(agent.CodeInvalid, fmt.Sprintf("argv[0] %q: command not found", sp.argv[0]))
	}
	h, err := a.startHelper(sp.cred, helperReq{Op: "launch", Path: path, Argv: sp.argv, Env: sp.env, Cwd: sp.cwd, OutDir: filepath.Join(a.cfg.Home, ".launch")})
	if err != nil {
		return 0, nil, err
	}
	if _, err := h.answer(path); err != io.EOF {
		h.close()
		if err == nil {
			err = fmt.Errorf("agent: launch: unexpected answer")
		}
		return 0, nil, err
	}
	// fd 3 closed at the exec: the helper is the workload now.
	h.in.Close()
	h.replyF.Close()
	return h.pid, h.exited, nil
}

// growPipe raises a pipe's capacity to one whole frame (best effort: the
// default 64 KiB still works, only slower), so that a frame is one write
// and one read.
func growPipe(f *os.File) {
	const fSetPipeSize = 1031 // F_SETPIPE_SZ
	_, _, _ = syscall.Syscall(syscall.SYS_FCNTL, f.Fd(), fSetPipeSize, frameHeader+maxFrame)
}
