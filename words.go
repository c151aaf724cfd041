package sandboxwich

import "time"

// The Plane's words for what happens inside a cell. The root package owns
// every type of its API except the shared nouns of package lease (cells,
// leases, states, dispositions, bindings); the agent's and the drivers'
// types are converted at the boundary (cellconv.go), never aliased, so a
// harness that runs a command or reads a file imports this package alone.

// User is who runs a command or owns a file inside a cell (CONTRACT §14).
// The zero value means UserCell.
type User string

// Users.
const (
	UserCell User = "cell" // uid 1000, no capabilities
	UserRoot User = "root" // uid 0 inside the cell
)

// Reason says how a command or a launched workload ended.
type Reason string

// Reasons (CONTRACT §14).
const (
	ReasonExited   Reason = "exited"
	ReasonTimedOut Reason = "timed_out"
	// ReasonKilled: the lease expired or ended during the command.
	ReasonKilled Reason = "killed"
)

// ExecResult is a finished command. Reason is ReasonExited,
// ReasonTimedOut or ReasonKilled; a cell that died during the command is
// an error instead (see Plane.Exec).
type ExecResult struct {
	// ExitCode is the command's code, or 128 + the signal number when a
	// signal ended it.
	ExitCode int
	// Stdout and Stderr are the collected output (none with ExecStream),
	// each cut at the request's cap.
	Stdout, Stderr []byte
	// Truncated reports that stdout or stderr hit the cap.
	Truncated bool
	// TimedOut reports that the command was killed at its timeout.
	TimedOut bool
	// Signal names the signal that ended the command ("KILL"), or "".
	Signal   string
	Reason   Reason
	Duration time.Duration
	// Message says why the cell ended a command it killed (ReasonKilled):
	// the lease expired, or was released or revoked; "" otherwise.
	Message string
}

// Stream names an output stream of a command.
type Stream string

// Output streams.
const (
	Stdout Stream = "stdout"
	Stderr Stream = "stderr"
)

// Output is one chunk of a streamed command's output, in the order
// produced.
type Output struct {
	Stream Stream
	Data   []byte
}

// LaunchPhase is where a launched workload is (CONTRACT §14).
type LaunchPhase string

// Launch phases.
const (
	LaunchAccepted LaunchPhase = "accepted"
	LaunchRunning  LaunchPhase = "running"
	LaunchTerminal LaunchPhase = "terminal"
)

// LaunchStatus is the launched workload's status. PID is set once it
// runs; ExitCode, Signal and Reason once it is terminal.
type LaunchStatus struct {
	Phase    LaunchPhase
	PID      *int
	ExitCode *int
	Signal   *string
	Reason   *Reason
	// Replay reports that the request repeated the launch already made.
	Replay bool
}

// FileInfo describes a written file.
type FileInfo struct {
	Path   string
	Size   int64
	SHA256 string // hex
}
