package sandboxwich_test

import (
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/internal/testenv"
)

// TestClockFollowsTheDatabase: two planes on one PostgreSQL database whose
// own clocks are 5 s fast and 5 s slow agree on the time once they measured
// their offsets from the database's clock, and each offset is the skew it
// was given; with the correction off they disagree by the full 10 s.
func TestClockFollowsTheDatabase(t *testing.T) {
	st := testenv.Postgres(t)
	keys := testenv.Keyring(t)
	const skew = 5 * time.Second
	fast := func() time.Time { return time.Now().Add(skew) }
	slow := func() time.Time { return time.Now().Add(-skew) }
	for _, sync := range []time.Duration{sandboxwich.DefaultClockSyncInterval, 0} {
		a, err := sandboxwich.New(st, keys, sandboxwich.WithClock(fast), sandboxwich.WithClockSync(sync))
		if err != nil {
			t.Fatal(err)
		}
		b, err := sandboxwich.New(st, keys, sandboxwich.WithClock(slow), sandboxwich.WithClockSync(sync))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range []*sandboxwich.Plane{a, b} {
			if err := p.SyncClock(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		// Every bound below is one the run measured (the time between the
		// two readings, each offset's uncertainty: half its probe's round
		// trip), never a fixed figure a loaded machine can exceed.
		begin := time.Now()
		nowA, nowB := a.Now(), b.Now()
		between := time.Since(begin)
		diff := nowA.Sub(nowB).Abs()
		if sync == 0 {
			if _, _, ok := a.ClockOffset(); ok || diff < 2*skew-between-time.Millisecond {
				t.Fatalf("correction off: measured %v, planes %v apart; want no offset and their own clocks", ok, diff)
			}
			continue
		}
		offA, uncA, okA := a.ClockOffset()
		offB, uncB, okB := b.ClockOffset()
		// clock_timestamp() has microseconds, and the wall clock may be
		// slewed meanwhile: a millisecond of slack.
		const slack = time.Millisecond
		if !okA || !okB || uncA <= 0 || uncB <= 0 || (offA+skew).Abs() > uncA+slack || (offB-skew).Abs() > uncB+slack {
			t.Fatalf("offsets %v (±%v, %v) and %v (±%v, %v), want -5 s and +5 s within their uncertainty", offA, uncA, okA, offB, uncB, okB)
		}
		if diff > between+uncA+uncB+2*slack {
			t.Fatalf("planes 5 s fast and 5 s slow are %v apart after measuring the database's clock (uncertainties ±%v, ±%v; %v between the readings)",
				diff, uncA, uncB, between)
		}
	}
}
