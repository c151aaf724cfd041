package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/driver"
)

const (
	// agentStartTimeout bounds how long Provision waits for a started
	// cell's agent to answer, when ctx allows longer.
	agentStartTimeout = 30 * time.Second
	// lostGrace is how long a failed agent call waits for runsc to show
	// whether the cell died (a sandbox whose init exited takes a moment
	// to stop).
	lostGrace = 3 * time.Second
)

// oPath is Linux's O_PATH, which package syscall does not name.
const oPath = 0x200000

// hostDir is the cell's host directory: a small tmpfs mounted 0700 in the
// container's bundle, removed with it, and mounted read-write at
// /run/sandboxwich in the cell, where the agent creates its socket (runsc
// --host-uds=create).
func (p *Provider) hostDir(id string) string { return filepath.Join(p.bundlePath(id), hostDirName) }

// Limits of a cell's host directory. A root workload can write into it, so
// it is a tmpfs of its own rather than a directory of the host's disk: it
// holds the agent's socket, and the record of RecordAgentMessages.
const (
	hostDirSize       = "64k"
	hostDirRecordSize = "1g"
	hostDirInodes     = "16"
)

// mountHostDir mounts the host directory's tmpfs on dir.
func mountHostDir(dir string, record bool) error {
	size := hostDirSize
	if record {
		size = hostDirRecordSize
	}
	err := syscall.Mount("sandboxwich-cell", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC,
		"mode=0700,size="+size+",nr_inodes="+hostDirInodes)
	if err != nil {
		return fmt.Errorf("mounting the cell's host directory %s: %w", dir, err)
	}
	return nil
}

// removeBundle unmounts the host directory of container id, if mounted,
// and removes its bundle.
func (p *Provider) removeBundle(id string) error {
	for syscall.Unmount(p.hostDir(id), syscall.MNT_DETACH) == nil {
	}
	return os.RemoveAll(p.bundlePath(id))
}

// dialer dials the agent socket of container id. It connects through
// /proc/self/fd/<dir>/agent.sock, so the path of a bundle directory never
// meets the 107-byte limit of a Unix socket address.
func (p *Provider) dialer(id string) func(context.Context) (net.Conn, error) {
	dir := p.hostDir(id)
	return func(ctx context.Context) (net.Conn, error) {
		fd, err := syscall.Open(dir, oPath|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: dir, Err: err}
		}
		defer syscall.Close(fd)
		var d net.Dialer
		return d.DialContext(ctx, "unix", fmt.Sprintf("/proc/self/fd/%d/%s", fd, agentSocket))
	}
}

// client returns the cached agent client of a container identity.
func (p *Provider) client(identity, id string) *agent.Client {
	if c, ok := p.agents.Load(identity); ok {
		return c.(*agent.Client)
	}
	c, _ := p.agents.LoadOrStore(identity, agent.NewClient(p.dialer(id)))
	return c.(*agent.Client)
}

// dropAgents forgets the agent clients of container id.
func (p *Provider) dropAgents(id string) {
	p.agents.Range(func(k, c any) bool {
		if strings.HasPrefix(k.(string), id+"@") {
			p.agents.Delete(k)
			c.(*agent.Client).CloseIdleConnections()
		}
		return true
	})
}

// Agent returns a connection to the agent of obj's cell, over the cell's
// Unix socket on the host. Any Provider over the same directories reaches
// it: a restarted server, another replica. A missing object (or one of
// another identity) is driver.ErrNotFound; a container that stopped (its
// agent, the cell's init, exited) is driver.ErrCellLost. A call on the
// connection that fails without an answer while runsc shows the container
// is no longer running returns an error wrapping driver.ErrCellLost.
func (p *Provider) Agent(ctx context.Context, obj driver.Object) (agent.Conn, error) {
	id, ok := p.objectID(obj)
	if !ok {
		return nil, fmt.Errorf("gvisor: agent: identity %q: %w", obj.Identity, driver.ErrNotFound)
	}
	st, err := p.state(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("gvisor: agent of %s: %w", id, err)
	}
	if st == nil || (obj.Identity != "" && identityOf(st) != obj.Identity) {
		return nil, fmt.Errorf("gvisor: agent of %s: %w", id, driver.ErrNotFound)
	}
	if st.Status != statusRunning {
		return nil, fmt.Errorf("gvisor: agent of %s: %w (the container is %s)", id, driver.ErrCellLost, st.Status)
	}
	return &cellConn{p: p, id: id, c: p.client(identityOf(st), id)}, nil
}

// awaitAgent waits until the agent of a started container answers its
// status through c, within ctx and agentStartTimeout, and returns it.
func (p *Provider) awaitAgent(ctx context.Context, id string, c *agent.Client) (agent.Status, error) {
	ctx, cancel := context.WithTimeout(ctx, agentStartTimeout)
	defer cancel()
	for {
		st, err := c.Status(ctx)
		if err == nil {
			return st, nil
		}
		if ctx.Err() != nil {
			return agent.Status{}, fmt.Errorf("the cell agent did not answer: %w (%w)", ctx.Err(), err)
		}
		if st := p.r.stateFile(id); st != nil && (st.Status != statusRunning || !p.isSandboxProcess(st.Pid, id)) {
			return agent.Status{}, fmt.Errorf("the container's sandbox stopped before its agent answered (runsc state: %s): %w", st.Status, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// lost reports, after a call to container id's agent failed with err, the
// error to return: err wrapped with driver.ErrCellLost when the cell died,
// else err. An answer of the agent, or the caller's context ending, is
// returned as it is.
func (p *Provider) lost(ctx context.Context, id string, err error) error {
	if err == nil || agent.IsAnswer(err) || ctx.Err() != nil {
		return err
	}
	deadline := time.Now().Add(lostGrace)
	for {
		if why := p.sandboxLost(id); why != nil {
			return fmt.Errorf("gvisor: agent of %s: %w: %w", id, why, err)
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// cellConn is a cell's agent.Conn that tells a dead cell (driver.ErrCellLost)
// from an agent that merely failed to answer.
type cellConn struct {
	p  *Provider
	id string
	c  agent.Conn
}

var _ agent.Conn = (*cellConn)(nil)

func (c *cellConn) Status(ctx context.Context) (agent.Status, error) {
	st, err := c.c.Status(ctx)
	return st, c.p.lost(ctx, c.id, err)
}

func (c *cellConn) Activate(ctx context.Context, a agent.Activation) error {
	return c.p.lost(ctx, c.id, c.c.Activate(ctx, a))
}

func (c *cellConn) Exec(ctx context.Context, req agent.ExecRequest, out func(agent.Output) error) (agent.ExecResult, error) {
	var outErr error
	if out != nil {
		inner := out
		out = func(o agent.Output) error {
			outErr = inner(o)
			return outErr
		}
	}
	res, err := c.c.Exec(ctx, req, out)
	if err != nil && outErr != nil && errors.Is(err, outErr) {
		return res, err // the caller's own callback stopped the command
	}
	return res, c.p.lost(ctx, c.id, err)
}

func (c *cellConn) Launch(ctx context.Context, req agent.LaunchRequest) (agent.LaunchStatus, error) {
	st, err := c.c.Launch(ctx, req)
	return st, c.p.lost(ctx, c.id, err)
}

func (c *cellConn) LaunchStatus(ctx context.Context, f agent.Fence) (agent.LaunchStatus, error) {
	st, err := c.c.LaunchStatus(ctx, f)
	return st, c.p.lost(ctx, c.id, err)
}

func (c *cellConn) WriteFile(ctx context.Context, req agent.WriteRequest, content io.Reader) (agent.FileInfo, error) {
	info, err := c.c.WriteFile(ctx, req, content)
	return info, c.p.lost(ctx, c.id, err)
}

func (c *cellConn) ReadFile(ctx context.Context, req agent.ReadRequest) (io.ReadCloser, int64, error) {
	r, n, err := c.c.ReadFile(ctx, req)
	if err != nil {
		return nil, 0, c.p.lost(ctx, c.id, err)
	}
	return &cellReader{ReadCloser: r, ctx: ctx, conn: c}, n, nil
}

func (c *cellConn) Release(ctx context.Context, f agent.Fence) error {
	return c.p.lost(ctx, c.id, c.c.Release(ctx, f))
}

// cellReader reports a read that fails because the cell died as
// driver.ErrCellLost.
type cellReader struct {
	io.ReadCloser
	ctx  context.Context
	conn *cellConn
}

func (r *cellReader) Read(b []byte) (int, error) {
	n, err := r.ReadCloser.Read(b)
	if err != nil && err != io.EOF {
		err = r.conn.p.lost(r.ctx, r.conn.id, err)
	}
	return n, err
}

// AgentMessages returns what the agent of obj's cell has recorded of the
// messages it received, with Config.RecordAgentMessages (for tests only):
// one entry per request, as the agent writes them. It reads the cell's
// host directory, so it works until the cell is destroyed.
func (p *Provider) AgentMessages(obj driver.Object) ([]byte, error) {
	if !p.cfg.RecordAgentMessages {
		return nil, errors.New("gvisor: agent messages are recorded only with Config.RecordAgentMessages")
	}
	id, ok := p.objectID(obj)
	if !ok {
		return nil, fmt.Errorf("gvisor: agent messages: identity %q: %w", obj.Identity, driver.ErrNotFound)
	}
	b, err := os.ReadFile(filepath.Join(p.hostDir(id), agentRecord))
	if errors.Is(err, os.ErrNotExist) {
		if _, serr := os.Stat(p.hostDir(id)); serr != nil {
			return nil, fmt.Errorf("gvisor: agent messages of %s: %w", id, driver.ErrNotFound)
		}
		return nil, nil // nothing received yet
	}
	if err != nil {
		return nil, fmt.Errorf("gvisor: agent messages of %s: %w", id, err)
	}
	return b, nil
}
