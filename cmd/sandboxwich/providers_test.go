package main

import (
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/internal/dirprovider"
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

// TestDirProviderSettings: the dir provider needs a path, refuses a bad
// latency or probability naming it, and builds what its settings say.
func TestDirProviderSettings(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		settings map[string]string
		refused  string
	}{
		{map[string]string{}, "path"},
		{map[string]string{"path": dir, "max_latency_ms": "soon"}, "max_latency_ms"},
		{map[string]string{"path": dir, "destroy_uncertain": "1.5"}, "destroy_uncertain"},
		{map[string]string{"path": dir, "lost_destroy": "-0.1"}, "lost_destroy"},
		{map[string]string{"path": dir, "latency_ms": "5"}, "latency_ms"},
	} {
		if _, err := providers["dir"]("p", "", tc.settings, slog.Default()); err == nil || !strings.Contains(err.Error(), tc.refused) {
			t.Errorf("%v: %v, want %s refused", tc.settings, err, tc.refused)
		}
	}
	p, err := providers["dir"]("p", "", map[string]string{"path": dir, "min_latency_ms": "1", "max_latency_ms": "2",
		"destroy_uncertain": "0.25", "lost_destroy": "0"}, slog.Default())
	want := &dirprovider.Provider{Dir: dir, MinLatency: time.Millisecond, MaxLatency: 2 * time.Millisecond, DestroyUncertain: 0.25}
	if err != nil || !reflect.DeepEqual(p, want) || p.Capabilities().Mode != driver.DryRun {
		t.Errorf("dir provider = %+v, %v; want %+v in mode dry_run", p, err, want)
	}
}
