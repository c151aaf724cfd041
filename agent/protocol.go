// Package agent is the protocol the control side speaks to the cell agent
// — the credential-free launcher that runs inside every cell of an
// agent-capable provider (CONTRACT §13) — and its client.
//
// The agent holds no token, key or attestation and is never sent one. It
// starts in state Waiting, is activated once with a sanitized Activation
// (cell, lease, generation and expiry — nothing that authorises anything
// outside the cell), serves exec, launch and files for that one fence, and
// ends at expiry, killing every process of the cell. [Gate] holds those
// fence rules, pure. Its answers are tenant-influenced data: the plane
// proves the boundary by the provider's read-back, never by the agent's
// word.
//
// Things that implement [Conn]: the in-cell daemon (package
// agent/cellagent, which the static binary cmd/sandboxwich-agent serves
// inside the cell), [Client] (the same calls over HTTP, on whatever
// channel a driver opens to its cell), and anything a driver author wraps
// around them or writes for tests (driver/fake keeps an in-memory one).
// [NewHandler] serves a Conn over HTTP.
//
// This package imports only the standard library.
package agent

import (
	"context"
	"errors"
	"io"
	"time"
)

// The cell's home and the output caps of an exec (CONTRACT §14).
const (
	// DefaultHome is the cell user's home: an exec's default cwd and the
	// parent of the launch's output directory.
	DefaultHome = "/home/cell"
	// DefaultMaxOutput caps each output stream of an exec whose MaxOutput
	// is zero.
	DefaultMaxOutput = 1 << 20
	// MaxOutputLimit is the largest MaxOutput an exec may ask for.
	MaxOutputLimit = 64 << 20
)

// The cell user's identity (CONTRACT §14).
const (
	CellUID = 1000
	CellGID = 1000
)

// State is an agent's life-cycle state. No transition leads back to
// Waiting.
type State string

// Agent states (CONTRACT §13).
const (
	// Waiting: never activated. A ready cell's agent must be waiting.
	Waiting State = "waiting"
	// Active: bound to one fence until its expiry.
	Active State = "active"
	// Ended: expired or ended; every cell process was killed and every
	// request is refused.
	Ended State = "ended"
)

// Status is what the agent reports about itself. It is a report, never
// proof: a root workload can replace the agent.
type Status struct {
	State State `json:"state"`
	// Activations counts accepted activations (an exact replay does not
	// count again): 0 while waiting, 1 once active.
	Activations int `json:"activations"`
	// CellID is the cell the agent was started for.
	CellID string `json:"cell_id"`
	// Digest is "sha256:<hex>" of the agent's own executable.
	Digest string `json:"digest"`
	// Kernel is the kernel release the agent sees (uname's release field),
	// "" where it cannot tell: under gVisor, gVisor's own kernel, not the
	// host's. A driver may check it at admission, when nothing but the
	// agent has run in the cell.
	Kernel string `json:"kernel,omitempty"`
}

// ProtocolVersion is the Activation version this package speaks.
const ProtocolVersion = 1

// Fence names the lease an agent serves. Every request after activation
// carries it; another fence is refused.
type Fence struct {
	CellID     string `json:"cell_id"`
	LeaseID    string `json:"lease_id"`
	Generation int64  `json:"generation"`
}

// Activation binds a waiting agent to one lease. It is sanitized: it never
// carries the attestation, its digest, the organization / workspace /
// thread / session tuple or any token.
type Activation struct {
	Version int `json:"version"`
	Fence
	// ExpiresAt is the lease's expiry, for reports only: the agent enforces
	// TTL on its own monotonic clock from activation, not the cell's wall
	// clock.
	ExpiresAt time.Time `json:"expires_at"`
	// TTL is the lease's remaining life by the plane's clock, in
	// milliseconds.
	TTLMillis int64 `json:"ttl_ms"`
}

// User names who a process runs as inside the cell.
type User string

// Users (CONTRACT §14). The zero value means UserCell.
const (
	UserCell User = "cell" // uid 1000, no capabilities
	UserRoot User = "root" // uid 0 inside the cell
)

// Limits of one request to the agent (CONTRACT §14).
const (
	MaxStdin     = 1 << 20   // bytes of stdin in an exec request
	MaxFileBytes = 256 << 20 // bytes of one file written or read
	MaxPath      = 4096      // bytes of a cwd or a path
)

// ExecRequest is one command. Argv, Env and Cwd have been validated by the
// plane; the agent checks them again and refuses what it cannot run.
type ExecRequest struct {
	Fence
	// Activation, when set, is sent with the request: see Conn.
	Activation *Activation       `json:"activation,omitempty"`
	Argv       []string          `json:"argv"`
	Env        map[string]string `json:"env,omitempty"`
	// Cwd is absolute; empty means the cell's home (/home/cell).
	Cwd   string `json:"cwd,omitempty"`
	User  User   `json:"user,omitempty"`
	Stdin []byte `json:"stdin,omitempty"`
	// TimeoutMillis bounds the command; at it the whole process tree of
	// the command is killed. Zero means no bound beyond the lease's expiry.
	TimeoutMillis int64 `json:"timeout_ms,omitempty"`
	// MaxOutput caps each of stdout and stderr in bytes (both the streamed
	// and the collected output); zero means 1 MiB.
	MaxOutput int `json:"max_output,omitempty"`
}

// Stream names an output stream.
type Stream string

// Output streams.
const (
	Stdout Stream = "stdout"
	Stderr Stream = "stderr"
)

// Output is one chunk of a command's output, in the order produced.
type Output struct {
	Stream Stream `json:"stream"`
	Data   []byte `json:"data"`
}

// Reason says how a command or a launched process ended.
type Reason string

// Reasons (CONTRACT §14).
const (
	Exited   Reason = "exited"
	TimedOut Reason = "timed_out"
	Killed   Reason = "killed" // the lease expired or ended during the command
	CellLost Reason = "cell_lost"
)

// ExecResult is a finished command. ExitCode is the child's code, or 128 +
// the signal number when a signal ended it.
type ExecResult struct {
	ExitCode int `json:"exit_code"`
	// Signal is the signal that ended the command ("KILL"), or "".
	Signal string `json:"signal,omitempty"`
	Reason Reason `json:"reason"`
	// Stdout and Stderr are the collected output when the caller did not
	// take it as it came (Conn.Exec with a nil callback), each cut at
	// MaxOutput.
	Stdout    []byte `json:"stdout,omitempty"`
	Stderr    []byte `json:"stderr,omitempty"`
	Truncated bool   `json:"truncated"`
	// DurationMillis is how long the command ran.
	DurationMillis int64 `json:"duration_ms"`
}

// LaunchRequest starts the lease's one resident process. Its stdout and
// stderr go to /home/cell/.launch/stdout and …/stderr.
type LaunchRequest struct {
	Fence
	Activation *Activation       `json:"activation,omitempty"`
	Argv       []string          `json:"argv"`
	Env        map[string]string `json:"env,omitempty"`
	Cwd        string            `json:"cwd,omitempty"`
	User       User              `json:"user,omitempty"`
}

// Phase is a launched process's phase.
type Phase string

// Launch phases (CONTRACT §14).
const (
	Accepted Phase = "accepted"
	Running  Phase = "running"
	Terminal Phase = "terminal"
)

// LaunchStatus reports the launched process. PID is set once it runs;
// ExitCode, Signal and Reason once it is terminal.
type LaunchStatus struct {
	Phase    Phase   `json:"phase"`
	PID      *int    `json:"pid"`
	ExitCode *int    `json:"exit_code"`
	Signal   *string `json:"signal"`
	Reason   *Reason `json:"reason"`
	// Replay reports that the request repeated the launch already made.
	Replay bool `json:"replay"`
}

// WriteRequest writes one file. Path is absolute and resolved by the
// agent, inside the cell; parents are created (owned by User) and the file
// is replaced atomically.
type WriteRequest struct {
	Fence
	Activation *Activation `json:"activation,omitempty"`
	Path       string      `json:"path"`
	// Mode is the file's permission bits; zero means 0644.
	Mode uint32 `json:"mode,omitempty"`
	User User   `json:"user,omitempty"`
}

// FileInfo describes a written file.
type FileInfo struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"` // hex
}

// ReadRequest reads one file.
type ReadRequest struct {
	Fence
	Activation *Activation `json:"activation,omitempty"`
	Path       string      `json:"path"`
	// MaxBytes refuses a larger file (ErrTooLarge); zero means
	// MaxFileBytes, more is ErrInvalid.
	MaxBytes int64 `json:"max_bytes,omitempty"`
	User     User  `json:"user,omitempty"`
}

// Conn is the agent protocol: what the control side asks of one cell's
// agent. Implementations are safe for concurrent use.
//
// A lease request (Exec, Launch, WriteFile, ReadFile) may carry its
// Activation, whose Fence must be the request's: the agent then activates,
// or accepts the exact replay, before it admits the request — the same
// answers as Activate — so that one round trip does both. The plane sends
// it with every operation.
//
// Errors the agent decides are *Error values, matched with errors.Is
// against the sentinels below; anything else (a broken channel, a context
// ended) means the answer is unknown.
type Conn interface {
	// Status reports the agent's state. It carries no fence and is
	// answered in every state.
	Status(ctx context.Context) (Status, error)
	// Activate binds a waiting agent to a.Fence, or accepts an exact
	// replay of the fence it is bound to. Another fence: ErrFenceRefused.
	Activate(ctx context.Context, a Activation) error
	// Exec runs one command and waits for its direct child. When out is
	// non-nil it receives the output as it is produced (and the result
	// carries none); an error from out stops the command.
	Exec(ctx context.Context, req ExecRequest, out func(Output) error) (ExecResult, error)
	// Launch starts the lease's one resident process, or reports it when
	// req repeats the launch exactly; a different spec: ErrConflict.
	Launch(ctx context.Context, req LaunchRequest) (LaunchStatus, error)
	// LaunchStatus reports the launched process; ErrNotLaunched when none.
	LaunchStatus(ctx context.Context, f Fence) (LaunchStatus, error)
	// WriteFile streams content into req.Path. The file is replaced only
	// when content ends with io.EOF: any other error from content (the
	// sender went away, a body cut short) aborts the write and leaves the
	// old file as it was. More than MaxFileBytes: ErrTooLarge, and nothing
	// is written. A path ending in "/" (or "/.", "/..") is ErrInvalid.
	WriteFile(ctx context.Context, req WriteRequest, content io.Reader) (FileInfo, error)
	// ReadFile opens req.Path and returns its content and size. The caller
	// closes the reader. Only regular files are read (a directory, socket,
	// FIFO or device is ErrInvalid, without blocking on it); one whose
	// size the kernel reports as 0 (/proc, /sys) is read to its end and
	// the size is what it held.
	ReadFile(ctx context.Context, req ReadRequest) (io.ReadCloser, int64, error)
	// Release ends the agent bound to f as expiry does: every process of
	// the cell is killed and every later request refused (ErrExpired).
	// Releasing an ended agent again with its fence succeeds.
	Release(ctx context.Context, f Fence) error
}

// Code is the machine-readable kind of an agent error.
type Code string

// Error codes of the agent protocol.
const (
	CodeFenceRefused    Code = "fence_refused"    // another fence than the bound one, or a second activation
	CodeNotActive       Code = "not_active"       // a lease operation before activation
	CodeExpired         Code = "expired"          // the lease expired; the agent ended
	CodeInvalid         Code = "invalid_request"  // bad input; nothing was run or written
	CodeUserUnsupported Code = "user_unsupported" // the cell cannot run as that user
	CodeNotFound        Code = "file_not_found"
	CodeAccessDenied    Code = "file_access_denied"
	CodeTooLarge        Code = "too_large"
	CodeNoSpace         Code = "insufficient_storage"
	CodeConflict        Code = "conflict"     // a second, different launch
	CodeNotLaunched     Code = "not_launched" // no launch yet
)

// Error is an answer of the agent that refuses a request. Message never
// repeats file contents, env values or stdin.
type Error struct {
	Code    Code   `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return "cell agent: " + string(e.Code) + ": " + e.Message }

// Is matches an *Error by Code, so errors.Is(err, agent.ErrExpired) holds
// for any expired answer.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code && t.Message == ""
}

// Sentinels for errors.Is, one per Code.
var (
	ErrFenceRefused    error = &Error{Code: CodeFenceRefused}
	ErrNotActive       error = &Error{Code: CodeNotActive}
	ErrExpired         error = &Error{Code: CodeExpired}
	ErrInvalid         error = &Error{Code: CodeInvalid}
	ErrUserUnsupported error = &Error{Code: CodeUserUnsupported}
	ErrNotFound        error = &Error{Code: CodeNotFound}
	ErrAccessDenied    error = &Error{Code: CodeAccessDenied}
	ErrTooLarge        error = &Error{Code: CodeTooLarge}
	ErrNoSpace         error = &Error{Code: CodeNoSpace}
	ErrConflict        error = &Error{Code: CodeConflict}
	ErrNotLaunched     error = &Error{Code: CodeNotLaunched}
)

// Errorf returns an *Error of code with message.
func Errorf(code Code, message string) error { return &Error{Code: code, Message: message} }

// IsAnswer reports whether err is an answer of the agent (an *Error), as
// opposed to a failure to reach it.
func IsAnswer(err error) bool {
	var e *Error
	return errors.As(err, &e)
}
