package main

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxwich/sandboxwich/driver"
)

// TestCellDiskKey: the pool key cell_disk_bytes (CONTRACT §25) from the
// environment, the config file and a provider setting; bad values and
// providers that cannot bound a cell's storage stop start-up naming the
// key, and so does a value not below the cell's memory.
func TestCellDiskKey(t *testing.T) {
	e, _, _ := testEnv(map[string]string{"SANDBOXWICH_STERILE_POOL_TARGET": "1", "SANDBOXWICH_STERILE_POOL_CELL_DISK_BYTES": "100000000"})
	c, err := loadConfig(e, "serve", nil)
	if err != nil || c.Pools[0].CellDiskBytes != 100000000 {
		t.Fatalf("SANDBOXWICH_STERILE_POOL_CELL_DISK_BYTES: %v, %+v", err, c)
	}
	for _, bad := range []string{"0", "-1", "lots", "1e9"} {
		e, _, _ := testEnv(map[string]string{"SANDBOXWICH_STERILE_POOL_TARGET": "1", "SANDBOXWICH_STERILE_POOL_CELL_DISK_BYTES": bad})
		if _, err := loadConfig(e, "serve", nil); err == nil || !strings.Contains(err.Error(), "cell_disk_bytes") {
			t.Errorf("SANDBOXWICH_STERILE_POOL_CELL_DISK_BYTES=%s: %v, want it refused naming the key", bad, err)
		}
	}
	// The provider setting is the pool key all the same.
	e, _, _ = testEnv(map[string]string{"SANDBOXWICH_STERILE_POOL_TARGET": "1", "SANDBOXWICH_GVISOR_CELL_DISK_BYTES": "4194304"})
	if c, err := loadConfig(e, "serve", nil); err != nil || c.Pools[0].CellDiskBytes != 4<<20 {
		t.Errorf("SANDBOXWICH_GVISOR_CELL_DISK_BYTES: %v, %+v", err, c)
	}
	e, _, _ = testEnv(map[string]string{"SANDBOXWICH_STERILE_POOL_TARGET": "1", "SANDBOXWICH_STERILE_POOL_CELL_DISK_BYTES": "8388608",
		"SANDBOXWICH_GVISOR_CELL_DISK_BYTES": "4194304"})
	if _, err := loadConfig(e, "serve", nil); err == nil || !strings.Contains(err.Error(), "cell_disk_bytes") {
		t.Errorf("the key and the setting differing: %v", err)
	}

	for name, body := range map[string]string{
		"negative": `{"pools": [{"name": "swe", "provider": "gvisor", "target": 1, "cell_disk_bytes": -1}]}`,
		"dry-run":  `{"pools": [{"name": "swe", "provider": "dry-run", "target": 1, "cell_disk_bytes": 1048576}]}`,
		"string":   `{"pools": [{"name": "swe", "provider": "gvisor", "target": 1, "cell_disk_bytes": "1g"}]}`,
	} {
		file := filepath.Join(t.TempDir(), "c.json")
		if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		e, _, _ := testEnv(map[string]string{"SANDBOXWICH_CONFIG": file})
		if _, err := loadConfig(e, "serve", nil); err == nil || !strings.Contains(err.Error(), "cell_disk_bytes") {
			t.Errorf("config file, %s: %v, want it refused naming the key", name, err)
		}
	}

	// Not below the cell's memory: the provider refuses it at start-up.
	log := slog.New(slog.DiscardHandler)
	for _, tc := range []struct {
		disk     int64
		settings map[string]string
	}{
		{512 << 20, nil}, // the default memory, 512 MiB
		{1 << 30, nil},
		{256 << 20, map[string]string{"memory_limit_bytes": "268435456"}},
	} {
		s := map[string]string{"runsc": "/nonexistent/runsc"}
		for k, v := range tc.settings {
			s[k] = v
		}
		p := poolConfig{Name: "swe", Provider: "gvisor", CellDiskBytes: tc.disk, Settings: s}
		_, err := newProvider(p, driver.InstallationTag("test"), log)
		if err == nil || !strings.Contains(err.Error(), "cell_disk_bytes") || !strings.Contains(err.Error(), "not below the cell's memory") {
			t.Errorf("cell_disk_bytes %d with %v: %v, want start-up refused naming the key", tc.disk, tc.settings, err)
		}
	}
	// Below it, the key passes (New then fails on the missing runsc).
	p := poolConfig{Name: "swe", Provider: "gvisor", CellDiskBytes: 200 << 20, Settings: map[string]string{"runsc": "/nonexistent/runsc"}}
	if _, err := newProvider(p, driver.InstallationTag("test"), log); err == nil || strings.Contains(err.Error(), "cell_disk_bytes") {
		t.Errorf("cell_disk_bytes below the memory: %v, want only the missing runsc refused", err)
	}
}
