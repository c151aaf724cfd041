//go:build !linux

package cellagent

import (
	"context"
	"io"
	"time"

	"github.com/sandboxwich/sandboxwich/agent"
)

// Processes need Linux: elsewhere an Agent keeps its state machine but
// refuses every process and file operation with agent.ErrUserUnsupported.

var errNoProcesses = agent.Errorf(agent.CodeUserUnsupported, "the cell agent runs processes on Linux only")

// kernelRelease is unknown outside Linux.
func kernelRelease() string { return "" }

// HelperMain returns at once: there is no helper outside Linux.
func HelperMain() {}

type procTable struct{ done chan struct{} }

func newProcTable() *procTable { return &procTable{done: make(chan struct{})} }
func (t *procTable) beginEnd() {}
func (t *procTable) wait()     { <-t.done }
func (t *procTable) killAll()  { close(t.done) }
func canBecome(cred) error     { return errNoProcesses }

func (a *Agent) exec(context.Context, spec, []byte, time.Duration, int, func(agent.Output) error) (agent.ExecResult, error) {
	return agent.ExecResult{}, errNoProcesses
}

func (a *Agent) startLaunch(spec) (int, <-chan exitStatus, error) { return 0, nil, errNoProcesses }

func (a *Agent) writeFile(context.Context, cred, string, uint32, io.Reader) (agent.FileInfo, error) {
	return agent.FileInfo{}, errNoProcesses
}

func (a *Agent) readFile(context.Context, cred, string, int64) (io.ReadCloser, int64, error) {
	return nil, 0, errNoProcesses
}
