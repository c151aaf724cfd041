package main

import (
	"strings"
	"testing"
)

// TestMaxLeaseSecondsSetting: SANDBOXWICH_MAX_LEASE_SECONDS defaults to 300,
// accepts 1–86400 and refuses anything else, naming the setting.
func TestMaxLeaseSecondsSetting(t *testing.T) {
	e, _, _ := testEnv(nil)
	c, err := loadConfig(e, "serve", nil)
	if err != nil || c.MaxLeaseSeconds != 300 {
		t.Fatalf("default: %d %v", c.MaxLeaseSeconds, err)
	}
	for v, want := range map[string]uint64{"1": 1, "3600": 3600, "86400": 86400} {
		e, _, _ := testEnv(map[string]string{"SANDBOXWICH_MAX_LEASE_SECONDS": v})
		if c, err := loadConfig(e, "serve", nil); err != nil || c.MaxLeaseSeconds != want {
			t.Errorf("%s: %d %v", v, c.MaxLeaseSeconds, err)
		}
	}
	for _, v := range []string{"0", "86401", "-5", "1h"} {
		e, _, _ := testEnv(map[string]string{"SANDBOXWICH_MAX_LEASE_SECONDS": v})
		if _, err := loadConfig(e, "serve", nil); err == nil || !strings.Contains(err.Error(), "SANDBOXWICH_MAX_LEASE_SECONDS") {
			t.Errorf("%s: %v", v, err)
		}
	}
}
