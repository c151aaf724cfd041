package gvisor

import (
	"context"
	"fmt"
	"time"

	"github.com/sandboxwich/sandboxwich/driver"
)

// MinPidsLimit is the smallest Config.PidsLimit: an idle sandbox already
// holds a few dozen host tasks (the sentry's threads, the gofer), and
// below this it could not start reliably.
const MinPidsLimit = 64

// defaultPidsLimit fills in and checks PidsLimit.
func (c *Config) defaultPidsLimit() error {
	if c.PidsLimit == 0 {
		c.PidsLimit = DefaultPidsLimit
	}
	if c.PidsLimit < MinPidsLimit {
		return fmt.Errorf("gvisor: process limit %d is below %d", c.PidsLimit, MinPidsLimit)
	}
	return nil
}

// ErrSandboxLost is driver.ErrCellLost: calls to a cell's agent return it
// (wrapped) when the cell's sandbox died, e.g. because its agent (the
// cell's init) exited or a fork bomb reached the cell's process limit on
// the host.
var ErrSandboxLost = driver.ErrCellLost

// stopTimeout bounds the runsc commands that tell whether a cell died.
const stopTimeout = 30 * time.Second

// runscFailed is the exit code of runsc exec when runsc itself fails (for
// instance when the sandbox dies under it); a command's own 128 looks the
// same, so the provider's read-back never trusts it.
const runscFailed = 128

// sandboxLost returns ErrSandboxLost, with what was observed, when
// container id no longer runs, and nil when it does.
func (p *Provider) sandboxLost(id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	st, err := p.r.state(ctx, id)
	switch {
	case err != nil:
		return fmt.Errorf("%w (runsc state: %v)", ErrSandboxLost, err)
	case st == nil:
		return fmt.Errorf("%w (the container is gone)", ErrSandboxLost)
	case st.Status != statusRunning:
		return fmt.Errorf("%w (the container is %s)", ErrSandboxLost, st.Status)
	}
	if _, err := p.r.ps(ctx, id); err != nil {
		return fmt.Errorf("%w (runsc ps: %v)", ErrSandboxLost, err)
	}
	return nil
}
