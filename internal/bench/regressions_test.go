package bench

import (
	"slices"
	"strings"
	"testing"
)

// TestSummaryLine: every ratio of the summary line has a target, R14 and
// R15 among them, and one not measured reads "na".
func TestSummaryLine(t *testing.T) {
	for _, k := range Keys {
		if _, ok := Targets[k]; !ok {
			t.Errorf("ratio %s has no target", k)
		}
	}
	if len(Targets) != len(Keys) {
		t.Errorf("%d targets for %d ratios", len(Targets), len(Keys))
	}
	line := (&Report{Ratios: map[string]float64{"cold_claim_ratio": 1.234, "renew_claim_ratio": 0.9}}).SummaryLine()
	for _, want := range []string{" cold_claim_ratio=1.234", " warm_hit_ratio=na", " renew_claim_ratio=0.900 cold_claim_ratio="} {
		if !strings.Contains(line, want) {
			t.Errorf("summary %q lacks %q", line, want)
		}
	}
	if !strings.HasSuffix(line, " warm_hit_ratio=na") {
		t.Errorf("summary %q: R15 is not last", line)
	}
}

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
		{map[string]float64{"cold_claim_ratio": 3.8, "warm_hit_ratio": 0.27}, nil},
		{map[string]float64{"cold_claim_ratio": 4.0, "warm_hit_ratio": 0.26},
			[]string{"cold_claim_ratio=4.000 (target 1.30)", "warm_hit_ratio=0.260 (target 0.80)"}},
	} {
		rep := &Report{Ratios: c.ratios}
		if got := rep.Regressions(3); !slices.Equal(got, c.want) {
			t.Errorf("Regressions(3) of %v = %q, want %q", c.ratios, got, c.want)
		}
	}
}
