package bench

import (
	"testing"
)

// TestFanoutRuns: the fan-out measurement runs end to end and every
// subscriber receives every claim's event: each decoding one gives a
// latency sample per claim, and a raw stream's missing frame would count
// as an error (its figures are the bench's; nothing here is timed).
func TestFanoutRuns(t *testing.T) {
	rep, err := benchFanout(t.Context(), t.TempDir(), 5, 20, 2)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Decoding != 1 || rep.Latency.N != 2*20 || rep.Latency.Errors != 0 ||
		len(rep.With) != 2 || len(rep.Without) != 3 || len(rep.RoundRatios) != 2 {
		t.Fatalf("fan-out report %+v", rep)
	}
	for _, s := range append(rep.With, rep.Without...) {
		if s.Errors != 0 || s.N != 20 {
			t.Fatalf("a series of 20 claims: %+v", s)
		}
	}
}
