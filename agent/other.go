//go:build !linux

package agent

import (
	"context"
	"io"
	"time"
)

// Processes need Linux: elsewhere an Agent keeps its state machine but
// refuses every process and file operation with ErrUserUnsupported.

var errNoProcesses = Errorf(CodeUserUnsupported, "the cell agent runs processes on Linux only")

// HelperMain returns at once: there is no helper outside Linux.
func HelperMain() {}

type procTable struct{ done chan struct{} }

func newProcTable() *procTable { return &procTable{done: make(chan struct{})} }
func (t *procTable) beginEnd() {}
func (t *procTable) wait()     { <-t.done }
func (t *procTable) killAll()  { close(t.done) }
func canBecome(cred) error     { return errNoProcesses }

func (a *Agent) exec(context.Context, spec, []byte, time.Duration, int, func(Output) error) (ExecResult, error) {
	return ExecResult{}, errNoProcesses
}

func (a *Agent) startLaunch(spec) (int, <-chan exitStatus, error) { return 0, nil, errNoProcesses }

func (a *Agent) writeFile(context.Context, cred, string, uint32, io.Reader) (FileInfo, error) {
	return FileInfo{}, errNoProcesses
}

func (a *Agent) readFile(context.Context, cred, string, int64) (io.ReadCloser, int64, error) {
	return nil, 0, errNoProcesses
}
