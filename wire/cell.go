package wire

// The bodies of the lease operations that reach the cell agent (CONTRACT
// §14): streamed exec, launch and files.

// Users a command, a launch or a file operation runs as inside the cell.
const (
	UserCell = "cell" // the default: an unprivileged user
	UserRoot = "root" // root inside the cell (422 user_unsupported where the cell cannot)
)

// Reasons a command or a launched workload ended.
const (
	ReasonExited   = "exited"
	ReasonTimedOut = "timed_out"
	// ReasonKilled: the lease was released or expired during the command.
	ReasonKilled = "killed"
	// ReasonCellLost is the contract's name for a cell that died during
	// the command. The reference server never answers it as a reason: the
	// cell is quarantined and the exec is 409 conflict (an error event when
	// streamed), so that a client reading only exit_code cannot take it
	// for a finished command.
	ReasonCellLost = "cell_lost"
)

// The events of a streamed exec (Accept: text/event-stream): any number of
// stdout and stderr events in the order produced, then exactly one exit
// event — or, when the exec failed after the command started, one error
// event and no exit.
const (
	EventStdout = "stdout" // data: ExecOutput
	EventStderr = "stderr" // data: ExecOutput
	EventExit   = "exit"   // data: ExecExit
	EventError  = "error"  // data: StreamError
)

// ExecOutput is the data of a stdout or stderr event: one chunk of output.
type ExecOutput struct {
	DataBase64 string `json:"data_base64"`
}

// StreamError is the data of an error event: the failure of an exec after
// its command started, with the code and message an error response would
// have carried.
type StreamError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// LaunchRequest is the body of POST /v1/sterile-cell-leases/{id}/launch:
// the lease's one resident workload.
type LaunchRequest struct {
	LeaseProof
	Argv []string          `json:"argv"`
	Cwd  string            `json:"cwd,omitempty"`
	Env  map[string]string `json:"env,omitempty"`
	User string            `json:"user,omitempty"`
}

// Launch phases.
const (
	PhaseAccepted = "accepted"
	PhaseRunning  = "running"
	PhaseTerminal = "terminal"
)

// Launch is the status of a lease's launched workload. PID is null until
// it runs; ExitCode, Signal and Reason are null until it is terminal
// (Signal stays null when no signal ended it).
type Launch struct {
	Phase    string  `json:"phase"`
	PID      *int    `json:"pid"`
	ExitCode *int    `json:"exit_code"`
	Signal   *string `json:"signal"`
	Reason   *string `json:"reason"`
}

// LaunchResponse answers a launch (202 the first time, 200 for an exact
// replay) and a launch status read.
type LaunchResponse struct {
	OK     bool   `json:"ok"`
	Launch Launch `json:"launch"`
}

// Multipart parts of POST /v1/sterile-cell-leases/{id}/files/write, in this
// order.
const (
	PartProof   = "proof"   // application/json: FileWriteRequest
	PartContent = "content" // the file's bytes
)

// FileWriteRequest is the proof part of a file write: the lease fence, the
// file's absolute path, its mode as an octal string ("0644" when empty)
// and who writes it.
type FileWriteRequest struct {
	LeaseProof
	Path string `json:"path"`
	Mode string `json:"mode,omitempty"`
	User string `json:"user,omitempty"`
}

// FileWriteResponse answers a file write: the file as written, its
// SHA-256 in lowercase hex.
type FileWriteResponse struct {
	OK     bool   `json:"ok"`
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// FileReadRequest is the body of POST /v1/sterile-cell-leases/{id}/files/read.
// The answer is the file's bytes (application/octet-stream). A file larger
// than MaxBytes (default and upper bound 256 MiB) is 413.
type FileReadRequest struct {
	LeaseProof
	Path     string  `json:"path"`
	MaxBytes *uint64 `json:"max_bytes,omitempty"`
	User     string  `json:"user,omitempty"`
}
