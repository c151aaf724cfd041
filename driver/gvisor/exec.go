package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// insideTimeout bounds the provider's own command inside a cell.
const insideTimeout = 30 * time.Second

// runInside runs argv in container id through runsc exec, as the cell user
// (uid 1000, no capabilities) in /home/cell with the cell's fixed
// environment, and returns its stdout and exit code. It is the provider's
// own read-back from inside a cell (Inspect's kernel check), never a
// tenant's command: those go through the cell's agent. The process spec is
// handed to runsc in a 0600 file, so nothing of it appears in a command
// line.
func (p *Provider) runInside(ctx context.Context, id string, argv ...string) (stdout []byte, exitCode int, err error) {
	ctx, cancel := context.WithTimeout(ctx, insideTimeout)
	defer cancel()
	dir, err := os.MkdirTemp(p.cfg.BundleDir, "exec-")
	if err != nil {
		return nil, 0, err
	}
	defer os.RemoveAll(dir)
	procFile := filepath.Join(dir, "process.json")
	if err := writeJSON(procFile, process(argv, cellEnv)); err != nil {
		return nil, 0, err
	}
	out, err := p.r.run(ctx, "exec", "--process="+procFile, id)
	var exitErr *exec.ExitError
	switch {
	case err == nil:
		return out, 0, nil
	case ctx.Err() == nil && errors.As(err, &exitErr) && exitErr.ExitCode() != runscFailed:
		return out, exitErr.ExitCode(), nil
	}
	return nil, 0, fmt.Errorf("runsc exec: %w", err)
}
