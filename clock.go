package sandboxwich

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sandboxwich/sandboxwich/store"
)

// Every expiry — a lease's, a ready cell's, an executor lock's — is decided
// by Plane.Now of whichever replica looks. Replicas sharing a database must
// therefore agree on the time, whatever their own clocks say: a fast clock
// would refuse and quarantine a live lease early, a slow one would honour a
// lease past its deadline. The truth is the database's clock. When the
// store keeps one (store.Clock), the plane measures its offset from it at
// the start of Run and every clock-sync interval, and Now is the plane's
// clock plus that offset: replicas then disagree by at most the sum of
// their measurements' uncertainties (half the round trip of the best of
// three probes each), whatever the skew of their own clocks.

// DefaultClockSyncInterval is how often Run measures the offset from the
// database's clock.
const DefaultClockSyncInterval = 10 * time.Second

// clockProbes is the number of probes of one measurement; the one with the
// shortest round trip wins.
const clockProbes = 3

// WithClockSync sets how often Run measures the offset between the plane's
// clock and the database's (default DefaultClockSyncInterval); 0 turns the
// correction off, and Now is then the plane's own clock (replicas must then
// keep their clocks in agreement by other means). It has no effect over a
// store without a clock (store.Clock).
func WithClockSync(every time.Duration) Option { return func(p *Plane) { p.clockEvery = every } }

// clockOffset is the last measurement of the offset from the database's
// clock.
type clockOffset struct {
	offset      atomic.Int64 // nanoseconds added to the plane's clock
	uncertainty atomic.Int64 // nanoseconds
	measured    atomic.Bool
}

// ClockOffset returns what the plane adds to its own clock to read the
// database's, and the uncertainty of that measurement (half the round trip
// of its best probe). ok is false before the first measurement, and when
// the correction is off or the store has no clock.
func (p *Plane) ClockOffset() (offset, uncertainty time.Duration, ok bool) {
	if !p.clock.measured.Load() {
		return 0, 0, false
	}
	return time.Duration(p.clock.offset.Load()), time.Duration(p.clock.uncertainty.Load()), true
}

// SyncClock measures the offset from the database's clock now and corrects
// Now by it. Run calls it first (unless it was called already) and then
// every clock-sync interval; a server may call it once before it takes
// requests. It does nothing when the correction is off or the store has no
// clock.
func (p *Plane) SyncClock(ctx context.Context) error {
	c, ok := p.store.(store.Clock)
	if !ok || p.clockEvery <= 0 {
		return nil
	}
	best, offset := time.Duration(-1), time.Duration(0)
	for range clockProbes {
		t0 := p.now()
		db, err := c.DatabaseTime(ctx)
		if err != nil {
			return fmt.Errorf("sandboxwich: clock sync: %w", err)
		}
		rtt := p.now().Sub(t0)
		if best < 0 || rtt < best {
			best, offset = rtt, db.Sub(t0.Add(rtt/2))
		}
	}
	p.clock.offset.Store(int64(offset))
	p.clock.uncertainty.Store(int64(best / 2))
	p.clock.measured.Store(true)
	return nil
}

// syncClock runs SyncClock every interval until ctx ends.
func (p *Plane) syncClock(ctx context.Context) {
	t := time.NewTicker(p.clockEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := p.SyncClock(ctx); err != nil && ctx.Err() == nil {
			p.log.Warn("clock sync", "error", err) // the last offset stays in force
		}
	}
}
