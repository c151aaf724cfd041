package main

import (
	"errors"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/cloudflare"
	"github.com/sandboxwich/sandboxwich/internal/dirprovider"
)

func TestGVisorPidsLimitSetting(t *testing.T) {
	for _, v := range []string{"10", "63", "-1", "many", "1e3"} {
		_, err := providers["gvisor"]("p", driver.InstallationTag("test"), map[string]string{"runsc": "/nonexistent/runsc", "pids_limit": v}, slog.Default(), nil)
		if err == nil || !strings.Contains(err.Error(), "pids_limit") {
			t.Errorf("pids_limit %q: %v, want it refused", v, err)
		}
	}
	// A valid value passes the setting's check (New then fails on the
	// missing runsc, not on the setting).
	_, err := providers["gvisor"]("p", driver.InstallationTag("test"), map[string]string{"runsc": "/nonexistent/runsc", "pids_limit": "2048"}, slog.Default(), nil)
	if err == nil || strings.Contains(err.Error(), "pids_limit") {
		t.Errorf("pids_limit 2048: %v, want only the missing runsc refused", err)
	}
}

// TestGVisorImageCacheBytesSetting: the image cache's budget comes from
// SANDBOXWICH_GVISOR_IMAGE_CACHE_BYTES (setting image_cache_bytes); a value
// that is not a non-negative integer stops start-up naming the key.
func TestGVisorImageCacheBytesSetting(t *testing.T) {
	e, _, _ := testEnv(map[string]string{"SANDBOXWICH_STERILE_POOL_TARGET": "1", "SANDBOXWICH_GVISOR_IMAGE_CACHE_BYTES": "10737418240"})
	c, err := loadConfig(e, "serve", nil)
	if err != nil || c.Pools[0].Settings["image_cache_bytes"] != "10737418240" {
		t.Fatalf("SANDBOXWICH_GVISOR_IMAGE_CACHE_BYTES: %v, %+v", err, c)
	}
	for _, v := range []string{"-1", "lots", "1e9", "10GiB"} {
		p := poolConfig{Name: "swe", Provider: "gvisor", Settings: map[string]string{"runsc": "/nonexistent/runsc", "image_cache_bytes": v}}
		if _, err := newProvider(p, driver.InstallationTag("test"), slog.Default()); err == nil || !strings.Contains(err.Error(), "image_cache_bytes") {
			t.Errorf("image_cache_bytes %q: %v, want start-up refused naming the key", v, err)
		}
	}
	// A valid value (0 is unbounded) passes the setting's check: New then
	// fails on the missing runsc, not on the setting.
	for _, v := range []string{"0", "10737418240"} {
		p := poolConfig{Name: "swe", Provider: "gvisor", Settings: map[string]string{"runsc": "/nonexistent/runsc", "image_cache_bytes": v}}
		if _, err := newProvider(p, driver.InstallationTag("test"), slog.Default()); err == nil || strings.Contains(err.Error(), "image_cache_bytes") {
			t.Errorf("image_cache_bytes %s: %v, want only the missing runsc refused", v, err)
		}
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
		if _, err := providers["dir"]("p", "", tc.settings, slog.Default(), nil); err == nil || !strings.Contains(err.Error(), tc.refused) {
			t.Errorf("%v: %v, want %s refused", tc.settings, err, tc.refused)
		}
	}
	p, err := providers["dir"]("p", "", map[string]string{"path": dir, "min_latency_ms": "1", "max_latency_ms": "2",
		"destroy_uncertain": "0.25", "lost_destroy": "0"}, slog.Default(), nil)
	want := &dirprovider.Provider{Dir: dir, MinLatency: time.Millisecond, MaxLatency: 2 * time.Millisecond, DestroyUncertain: 0.25}
	if err != nil || !reflect.DeepEqual(p, want) || p.Capabilities().Mode != driver.DryRun {
		t.Errorf("dir provider = %+v, %v; want %+v in mode dry_run", p, err, want)
	}
}

// TestCloudflareProviderSettings: the cloudflare provider names a missing
// or unknown setting, and a Cloudflare API that refuses the token stops
// the start (a configuration error), without the token in the error.
func TestCloudflareProviderSettings(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "tok")
	if err := os.WriteFile(tok, []byte("secret-token-value-0123456789abcdef"), 0o600); err != nil {
		t.Fatal(err)
	}
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte(`{"success":false,"errors":[{"code":10000,"message":"Authentication error"}],"messages":[],"result":null}`))
	}))
	defer api.Close()
	s := map[string]string{"bridge_url": "https://bridge.invalid", "bridge_token_file": tok, "runtime_class": "gvisor_lower_risk",
		"image": "registry.example/cell@sha256:" + strings.Repeat("a", 64), "instance_type": "basic",
		"agent_digest": "sha256:" + strings.Repeat("b", 64), "api_token_file": tok, "account_id": "acct",
		"worker_name": "sandboxwich-bridge", "container_application_id": "app", "compatibility_date": "2026-04-26",
		"api_base_url": api.URL}
	for _, key := range []string{"runtime_class", "image", "api_token_file"} {
		c := maps.Clone(s)
		delete(c, key)
		if _, err := providers["cloudflare"]("p", "inst", c, slog.Default(), nil); err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("without %s: %v, want it named", key, err)
		}
	}
	c := maps.Clone(s)
	c["typo"] = "1"
	if _, err := providers["cloudflare"]("p", "inst", c, slog.Default(), nil); err == nil || !strings.Contains(err.Error(), "typo") {
		t.Errorf("unknown setting: %v", err)
	}
	_, err := providers["cloudflare"]("p", "inst", s, slog.Default(), nil)
	if !errors.Is(err, cloudflare.ErrUnauthorized) || strings.Contains(err.Error(), "secret-token-value") {
		t.Fatalf("a refused API token: %v, want ErrUnauthorized without the token", err)
	}
}
