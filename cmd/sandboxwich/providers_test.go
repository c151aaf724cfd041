package main

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/sandboxwich/sandboxwich/driver"
)

func TestGVisorPidsLimitSetting(t *testing.T) {
	for _, v := range []string{"10", "63", "-1", "many", "1e3"} {
		_, err := providers["gvisor"]("p", driver.InstallationTag("test"), map[string]string{"runsc": "/nonexistent/runsc", "pids_limit": v}, slog.Default())
		if err == nil || !strings.Contains(err.Error(), "pids_limit") {
			t.Errorf("pids_limit %q: %v, want it refused", v, err)
		}
	}
	// A valid value passes the setting's check (New then fails on the
	// missing runsc, not on the setting).
	_, err := providers["gvisor"]("p", driver.InstallationTag("test"), map[string]string{"runsc": "/nonexistent/runsc", "pids_limit": "2048"}, slog.Default())
	if err == nil || strings.Contains(err.Error(), "pids_limit") {
		t.Errorf("pids_limit 2048: %v, want only the missing runsc refused", err)
	}
}
