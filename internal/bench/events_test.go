package bench

import (
	"testing"
)

// TestFanoutRuns: the fan-out measurement runs end to end and every
// subscriber receives every claim's event: each decoding one gives a
// latency sample per claim, and a raw stream's missing frame would count
// as an error (its figures are the bench's; nothing here is timed).
func TestFanoutRuns(t *testing.T) {
	rep, err := benchFanout(t.Context(), t.TempDir(), 5, 20)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Decoding != 1 || rep.Latency.N != rep.Decoding*20 || rep.Latency.Errors != 0 ||
		rep.With.Errors != 0 || rep.Without.Errors != 0 || rep.After.Errors != 0 {
		t.Fatalf("fan-out report %+v", rep)
	}
}
