package bench

import (
	"slices"
	"testing"
)

// TestRegressions: a ratio fails the smoke past factor × its target, in
// the target's direction, or past its gate where it has one (R7, whose
// target is below the platform's reach).
func TestRegressions(t *testing.T) {
	for _, c := range []struct {
		ratios map[string]float64
		want   []string
	}{
		{map[string]float64{"claim_p50_ratio_sqlite": 4.4, "file_write_ratio": 0.17, "agent_first_output_ratio": 0.94}, nil},
		{map[string]float64{"claim_p50_ratio_sqlite": 4.6}, []string{"claim_p50_ratio_sqlite=4.600 (target 1.50)"}},
		{map[string]float64{"file_write_ratio": 0.16}, []string{"file_write_ratio=0.160 (target 0.50)"}},
		{map[string]float64{"agent_first_output_ratio": 2.1}, []string{"agent_first_output_ratio=2.100 (target 0.25)"}},
	} {
		rep := &Report{Ratios: c.ratios}
		if got := rep.Regressions(3); !slices.Equal(got, c.want) {
			t.Errorf("Regressions(3) of %v = %q, want %q", c.ratios, got, c.want)
		}
	}
}
