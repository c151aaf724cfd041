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
		diff := a.Now().Sub(b.Now()).Abs()
		if sync == 0 {
			if _, _, ok := a.ClockOffset(); ok || diff < 2*skew-time.Second {
				t.Fatalf("correction off: measured %v, planes %v apart; want no offset and their own clocks", ok, diff)
			}
			continue
		}
		if diff > 50*time.Millisecond {
			t.Fatalf("planes 5 s fast and 5 s slow are %v apart after measuring the database's clock", diff)
		}
		offA, uncA, okA := a.ClockOffset()
		offB, _, okB := b.ClockOffset()
		if !okA || !okB || (offA+skew).Abs() > 50*time.Millisecond || (offB-skew).Abs() > 50*time.Millisecond || uncA <= 0 {
			t.Fatalf("offsets %v (±%v, %v) and %v (%v), want about -5 s and +5 s", offA, uncA, okA, offB, okB)
		}
	}
}
