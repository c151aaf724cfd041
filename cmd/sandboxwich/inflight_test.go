package main

import (
	"strings"
	"testing"
)

// TestMaxRequestsPerPrincipalSetting: SANDBOXWICH_MAX_REQUESTS_PER_PRINCIPAL
// defaults to 512 (CONTRACT §25), accepts a positive count and refuses
// anything else, naming the setting.
func TestMaxRequestsPerPrincipalSetting(t *testing.T) {
	e, _, _ := testEnv(nil)
	c, err := loadConfig(e, "serve", nil)
	if err != nil || c.MaxRequestsPerPrincipal != 512 {
		t.Fatalf("default: %d %v", c.MaxRequestsPerPrincipal, err)
	}
	for v, want := range map[string]int{"1": 1, "64": 64, "1048576": 1 << 20} {
		e, _, _ := testEnv(map[string]string{"SANDBOXWICH_MAX_REQUESTS_PER_PRINCIPAL": v})
		if c, err := loadConfig(e, "serve", nil); err != nil || c.MaxRequestsPerPrincipal != want {
			t.Errorf("%s: %d %v", v, c.MaxRequestsPerPrincipal, err)
		}
	}
	for _, v := range []string{"0", "-1", "1048577", "many"} {
		e, _, _ := testEnv(map[string]string{"SANDBOXWICH_MAX_REQUESTS_PER_PRINCIPAL": v})
		if _, err := loadConfig(e, "serve", nil); err == nil || !strings.Contains(err.Error(), "SANDBOXWICH_MAX_REQUESTS_PER_PRINCIPAL") {
			t.Errorf("%q: %v", v, err)
		}
	}
}
