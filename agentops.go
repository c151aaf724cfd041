package sandboxwich

import (
	"context"
	"io"
	"io/fs"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/errcode"
)

// Lease operations that reach the cell agent (CONTRACT §13, §14). Each one
// checks the request, then the lease fence, then reads the admitted runtime
// back from the provider, then activates the cell's agent with the
// sanitized activation (an exact replay after the first), and only then
// acts. A provider without an agent answers files and launch with
// errcode.ErrExecUnsupported; exec falls back to the provider's own exec.

// Output is one chunk of a streamed command's output.
type Output = agent.Output

// ExecStream runs a command like Exec and hands its output to out as it is
// produced; the result then carries no output. An error from out stops
// the command and is returned.
func (p *Plane) ExecStream(ctx context.Context, tenantID string, leaseID uuid.UUID, pr Proof, req ExecRequest, out func(Output) error) (ExecResult, error) {
	return ExecResult{}, errcode.New(errcode.Internal, "not implemented yet")
}

// LaunchRequest starts a lease's one resident workload.
type LaunchRequest struct {
	Argv []string
	Env  map[string]string
	// Cwd is absolute; "" means the cell's home.
	Cwd  string
	User agent.User
}

// LaunchStatus is the launched workload's status.
type LaunchStatus = agent.LaunchStatus

// Launch starts the lease's resident workload; created is false when req
// repeated the launch already made (an exact replay). A different spec is
// errcode.ErrConflict.
func (p *Plane) Launch(ctx context.Context, tenantID string, leaseID uuid.UUID, pr Proof, req LaunchRequest) (st LaunchStatus, created bool, err error) {
	return LaunchStatus{}, false, errcode.New(errcode.Internal, "not implemented yet")
}

// LaunchStatusOf reports a lease's launched workload to its tenant (no
// fence: the route is tenant-scoped). errcode.ErrNotFound when none.
func (p *Plane) LaunchStatusOf(ctx context.Context, tenantID string, leaseID uuid.UUID) (LaunchStatus, error) {
	return LaunchStatus{}, errcode.New(errcode.Internal, "not implemented yet")
}

// WriteFileRequest writes one file into a leased cell.
type WriteFileRequest struct {
	// Path is absolute, resolved inside the cell.
	Path string
	// Mode is the file's permission bits; zero means 0644.
	Mode fs.FileMode
	User agent.User
}

// FileInfo describes a written file.
type FileInfo = agent.FileInfo

// WriteFile streams content into a file of the leased cell: parents are
// created, the file is replaced atomically, and more than 256 MiB is
// errcode.ErrPayloadTooLarge with nothing written.
func (p *Plane) WriteFile(ctx context.Context, tenantID string, leaseID uuid.UUID, pr Proof, req WriteFileRequest, content io.Reader) (FileInfo, error) {
	return FileInfo{}, errcode.New(errcode.Internal, "not implemented yet")
}

// ReadFileRequest reads one file of a leased cell.
type ReadFileRequest struct {
	Path string
	// MaxBytes refuses a larger file; zero means 256 MiB.
	MaxBytes int64
	User     agent.User
}

// ReadFile opens a file of the leased cell and returns its content and
// size; the caller closes the reader.
func (p *Plane) ReadFile(ctx context.Context, tenantID string, leaseID uuid.UUID, pr Proof, req ReadFileRequest) (io.ReadCloser, int64, error) {
	return nil, 0, errcode.New(errcode.Internal, "not implemented yet")
}
