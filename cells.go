package sandboxwich

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
)

// Lease operations that reach the cell agent (CONTRACT §13, §14). Each one
// checks the request (errcode.ErrInvalidRequest, before anything reaches
// the store), then the lease fence, then refuses a cell of an external
// worker (errcode.ErrNotFound) and a provider without the agent
// (errcode.ErrExecUnsupported; exec alone falls back to the provider's own
// exec), then reads the admitted runtime back from the provider
// (errcode.ErrRuntimeClassBoundaryUnverified, the cell quarantined), then
// activates the cell's agent with the sanitized activation — cell, lease,
// generation, expiry and the lease's remaining life by the plane's clock;
// never the attestation, its digest, the binding or a token — and only
// then sends the operation, carrying the same fence.
//
// The activation goes with every operation, in the operation's own request
// (agent.Conn): the first activates the agent and the later ones are exact
// replays it accepts, so the plane keeps no record of which cells it
// activated, a restarted plane or another replica acts the same, and
// activating costs no round trip of its own.
//
// The agent's answers are reports, never proof. A refused fence, or any
// answer a sterile cell's agent never gives, quarantines the cell and is
// errcode.ErrCellAgentUnverified; an agent that does not answer (the cell
// died) quarantines the cell and is errcode.ErrConflict wrapping
// driver.ErrCellLost; an agent that reports the lease expired is
// errcode.ErrConflict. Refusals of the request itself map to
// errcode.ErrInvalidRequest, errcode.ErrUserUnsupported,
// errcode.ErrFileNotFound, errcode.ErrFileAccessDenied,
// errcode.ErrPayloadTooLarge and errcode.ErrInsufficientStorage. An
// operation cut short by ctx returns ctx's error and leaves the cell as it
// is.

// LaunchRequest starts a lease's one resident workload.
type LaunchRequest struct {
	Argv []string
	Env  map[string]string
	// Cwd is absolute; "" means the cell's home.
	Cwd  string
	User User
}

// Launch starts the lease's resident workload; created is false when req
// repeated the launch already made (an exact replay). A different spec is
// errcode.ErrConflict. The request is checked as Exec's argv, env, cwd and
// user are.
func (p *Plane) Launch(ctx context.Context, tenantID string, leaseID uuid.UUID, pr Proof, req LaunchRequest) (st LaunchStatus, created bool, err error) {
	if err := checkCommand(req.Argv, req.Env, req.Cwd, req.User); err != nil {
		return LaunchStatus{}, false, err
	}
	c, err := p.openFenced(ctx, tenantID, leaseID, pr)
	if err != nil {
		return LaunchStatus{}, false, err
	}
	actx, cancel := context.WithTimeout(ctx, agentTimeout)
	defer cancel()
	ast, err := c.conn.Launch(actx, agent.LaunchRequest{Fence: c.fence, Activation: c.activation, Argv: req.Argv, Env: req.Env, Cwd: req.Cwd, User: req.User.agent()})
	if err == nil {
		err = p.checkLaunch(ctx, c, ast)
	}
	if err != nil {
		return LaunchStatus{}, false, p.agentError(ctx, c.member, err)
	}
	return launchStatusOf(ast), !ast.Replay, nil
}

// LaunchStatusOf reports a lease's launched workload to its tenant. It
// takes no proof (the route is tenant-scoped): the fence sent to the agent
// is the store's record of the lease, which must be live (else
// errcode.ErrConflict; unknown or foreign: errcode.ErrNotFound). Like every
// operation it verifies the runtime and activates the agent first.
// errcode.ErrNotFound when the lease launched nothing.
func (p *Plane) LaunchStatusOf(ctx context.Context, tenantID string, leaseID uuid.UUID) (LaunchStatus, error) {
	rec, err := p.store.Lease(ctx, tenantID, leaseID)
	if err != nil {
		return LaunchStatus{}, err
	}
	if l := rec.Cell.Lease; rec.Cell.State != lease.Leased || l == nil || !p.Now().Before(l.ExpiresAt) {
		return LaunchStatus{}, errNotLive()
	}
	c, err := p.open(ctx, rec, false)
	if err != nil {
		return LaunchStatus{}, err
	}
	actx, cancel := context.WithTimeout(ctx, agentTimeout)
	defer cancel()
	// A status request carries a fence only: the activation goes first.
	var st agent.LaunchStatus
	err = c.conn.Activate(actx, *c.activation)
	if err == nil {
		st, err = c.conn.LaunchStatus(actx, c.fence)
	}
	if err == nil {
		err = p.checkLaunch(ctx, c, st)
	}
	if err != nil {
		return LaunchStatus{}, p.agentError(ctx, c.member, err)
	}
	return launchStatusOf(st), nil
}

// checkLaunch refuses a launch status no agent reports: an unknown phase,
// a running workload without its pid, or a terminal one without its exit.
func (p *Plane) checkLaunch(ctx context.Context, c *leaseCell, st agent.LaunchStatus) error {
	ok := false
	switch st.Phase {
	case agent.Accepted:
		ok = st.PID == nil && st.ExitCode == nil && st.Reason == nil
	case agent.Running:
		ok = st.PID != nil && st.ExitCode == nil && st.Reason == nil
	case agent.Terminal:
		ok = st.ExitCode != nil && st.Reason != nil
	}
	if !ok {
		return p.agentUnverified(ctx, c.member, fmt.Errorf("launch status %+v is not one an agent reports", st))
	}
	return nil
}

// WriteFileRequest writes one file into a leased cell.
type WriteFileRequest struct {
	// Path is absolute, resolved inside the cell.
	Path string
	// Mode is the file's permission bits (fs.ModePerm at most; no type or
	// special bits); zero means 0644.
	Mode fs.FileMode
	User User
}

// WriteFile streams content into a file of the leased cell: parents are
// created, the file is replaced atomically, and more than 256 MiB is
// errcode.ErrPayloadTooLarge with nothing written. The path must be
// absolute, at most MaxPath bytes, without NUL, and name a file (not end
// in "/", "/." or "/.."); the user cell or root.
//
// The file is replaced only when content ends with io.EOF: an error
// reading content aborts the write, leaves the old file as it was, and is
// returned as it is. A caller whose source can end early (a request body)
// must turn that into an error, never into io.EOF.
func (p *Plane) WriteFile(ctx context.Context, tenantID string, leaseID uuid.UUID, pr Proof, req WriteFileRequest, content io.Reader) (FileInfo, error) {
	if err := checkPath("path", req.Path); err != nil {
		return FileInfo{}, err
	}
	if agent.NamesDirectory(req.Path) {
		return FileInfo{}, errcode.New(errcode.InvalidRequest, "path must name a file: it may not end in /, /. or /..")
	}
	if req.Mode&^fs.ModePerm != 0 {
		return FileInfo{}, errcode.New(errcode.InvalidRequest, "mode must hold permission bits only (0000 to 0777)")
	}
	if err := checkUser(req.User); err != nil {
		return FileInfo{}, err
	}
	c, err := p.openFenced(ctx, tenantID, leaseID, pr)
	if err != nil {
		return FileInfo{}, err
	}
	src := &sourceReader{r: content}
	info, err := c.conn.WriteFile(ctx, agent.WriteRequest{Fence: c.fence, Activation: c.activation, Path: req.Path, Mode: uint32(req.Mode), User: req.User.agent()}, src)
	switch {
	case src.err != nil:
		return FileInfo{}, src.err
	case err != nil:
		return FileInfo{}, p.agentError(ctx, c.member, err)
	}
	return fileInfoOf(info), nil
}

// sourceReader remembers the error of the reader it reads, so that a
// caller's failing upload is told from a failing agent.
type sourceReader struct {
	r   io.Reader
	err error
}

func (s *sourceReader) Read(b []byte) (int, error) {
	n, err := s.r.Read(b)
	if err != nil && err != io.EOF {
		s.err = err
	}
	return n, err
}

// ReadFileRequest reads one file of a leased cell.
type ReadFileRequest struct {
	Path string
	// MaxBytes refuses a larger file; zero means 256 MiB, the most it may
	// be.
	MaxBytes int64
	User     User
}

// ReadFile opens a file of the leased cell and returns its content and
// size; the caller closes the reader. A file larger than MaxBytes is
// errcode.ErrPayloadTooLarge. The reader yields exactly size bytes: one
// the agent ends early fails with io.ErrUnexpectedEOF, and it never reads
// past size.
func (p *Plane) ReadFile(ctx context.Context, tenantID string, leaseID uuid.UUID, pr Proof, req ReadFileRequest) (io.ReadCloser, int64, error) {
	if err := checkPath("path", req.Path); err != nil {
		return nil, 0, err
	}
	if req.MaxBytes < 0 || req.MaxBytes > MaxFileBytes {
		return nil, 0, errcode.New(errcode.InvalidRequest, "max_bytes must be 0 to 268435456")
	}
	if err := checkUser(req.User); err != nil {
		return nil, 0, err
	}
	maxBytes := req.MaxBytes
	if maxBytes == 0 {
		maxBytes = MaxFileBytes
	}
	c, err := p.openFenced(ctx, tenantID, leaseID, pr)
	if err != nil {
		return nil, 0, err
	}
	rc, size, err := c.conn.ReadFile(ctx, agent.ReadRequest{Fence: c.fence, Activation: c.activation, Path: req.Path, MaxBytes: maxBytes, User: req.User.agent()})
	if err != nil {
		return nil, 0, p.agentError(ctx, c.member, err)
	}
	if size < 0 || size > maxBytes {
		_ = rc.Close()
		return nil, 0, p.agentUnverified(ctx, c.member, fmt.Errorf("read answered %d bytes for a limit of %d", size, maxBytes))
	}
	return &exactReader{r: io.LimitReader(rc, size), c: rc, left: size}, size, nil
}

// exactReader yields exactly left bytes of r.
type exactReader struct {
	r    io.Reader
	c    io.Closer
	left int64
}

func (e *exactReader) Read(b []byte) (int, error) {
	n, err := e.r.Read(b)
	e.left -= int64(n)
	if errors.Is(err, io.EOF) && e.left > 0 {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

func (e *exactReader) Close() error { return e.c.Close() }
