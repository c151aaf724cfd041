// Package ctxsleep is the module's one sleep that ends with its context:
// the waits of retry loops, fake latencies and pollers.
package ctxsleep

import (
	"context"
	"time"
)

// Sleep waits d, or until ctx ends, whose error it then returns.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
