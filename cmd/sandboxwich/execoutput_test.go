package main

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/sandboxwich/sandboxwich/driver"
)

// TestExecMaxOutputSetting: SANDBOXWICH_EXEC_MAX_OUTPUT_BYTES defaults to
// 1 MiB, accepts 1 to 64 MiB and refuses anything else, naming the
// setting.
func TestExecMaxOutputSetting(t *testing.T) {
	e, _, _ := testEnv(nil)
	c, err := loadConfig(e, "serve", nil)
	if err != nil || c.ExecMaxOutputBytes != 1<<20 {
		t.Fatalf("default: %d %v", c.ExecMaxOutputBytes, err)
	}
	for v, want := range map[string]int{"1": 1, "4096": 4096, "67108864": 64 << 20} {
		e, _, _ := testEnv(map[string]string{"SANDBOXWICH_EXEC_MAX_OUTPUT_BYTES": v})
		if c, err := loadConfig(e, "serve", nil); err != nil || c.ExecMaxOutputBytes != want {
			t.Errorf("%s: %d %v", v, c.ExecMaxOutputBytes, err)
		}
	}
	for _, v := range []string{"0", "67108865", "-1", "1MiB"} {
		e, _, _ := testEnv(map[string]string{"SANDBOXWICH_EXEC_MAX_OUTPUT_BYTES": v})
		if _, err := loadConfig(e, "serve", nil); err == nil || !strings.Contains(err.Error(), "SANDBOXWICH_EXEC_MAX_OUTPUT_BYTES") {
			t.Errorf("%q: %v", v, err)
		}
	}
}

// TestDryRunHasNoAgentAndNoExec: the dry-run provider simulates cells, so
// the plane must answer exec, files and launch on them with
// exec_unsupported — it must be neither a driver.AgentHost nor a
// driver.Execer.
func TestDryRunHasNoAgentAndNoExec(t *testing.T) {
	prov, err := providers["dry-run"]("p", "tag", map[string]string{}, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := prov.(driver.AgentHost); ok {
		t.Error("dry-run is a driver.AgentHost")
	}
	if _, ok := prov.(driver.Execer); ok {
		t.Error("dry-run is a driver.Execer")
	}
}

// TestExecMaxOutputCeilingSetting: SANDBOXWICH_EXEC_MAX_OUTPUT_CEILING_BYTES
// is unset by default (the plane's 16 MiB), accepts up to 64 MiB, and a
// value below SANDBOXWICH_EXEC_MAX_OUTPUT_BYTES or out of range stops
// start-up naming the setting.
func TestExecMaxOutputCeilingSetting(t *testing.T) {
	e, _, _ := testEnv(nil)
	c, err := loadConfig(e, "serve", nil)
	if err != nil || c.ExecMaxOutputCeilingBytes != 0 {
		t.Fatalf("default: %d %v", c.ExecMaxOutputCeilingBytes, err)
	}
	e, _, _ = testEnv(map[string]string{"SANDBOXWICH_EXEC_MAX_OUTPUT_CEILING_BYTES": "33554432"})
	if c, err := loadConfig(e, "serve", nil); err != nil || c.ExecMaxOutputCeilingBytes != 32<<20 {
		t.Fatalf("32 MiB: %d %v", c.ExecMaxOutputCeilingBytes, err)
	}
	for _, env := range []map[string]string{
		{"SANDBOXWICH_EXEC_MAX_OUTPUT_CEILING_BYTES": "0"},
		{"SANDBOXWICH_EXEC_MAX_OUTPUT_CEILING_BYTES": "67108865"},
		{"SANDBOXWICH_EXEC_MAX_OUTPUT_CEILING_BYTES": "16MiB"},
		{"SANDBOXWICH_EXEC_MAX_OUTPUT_CEILING_BYTES": "1048576", "SANDBOXWICH_EXEC_MAX_OUTPUT_BYTES": "2097152"},
	} {
		e, _, _ := testEnv(env)
		if _, err := loadConfig(e, "serve", nil); err == nil || !strings.Contains(err.Error(), "SANDBOXWICH_EXEC_MAX_OUTPUT_CEILING_BYTES") {
			t.Errorf("%v: %v", env, err)
		}
	}
}
