package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/lease"
)

// testEnv returns an env whose environment is vars.
func testEnv(vars map[string]string) (env, *bytes.Buffer, *bytes.Buffer) {
	var out, errb bytes.Buffer
	return env{
		stdin: strings.NewReader(""), stdout: &out, stderr: &errb,
		getenv: func(k string) string { return vars[k] },
		environ: func() []string {
			var kv []string
			for k, v := range vars {
				kv = append(kv, k+"="+v)
			}
			return kv
		},
	}, &out, &errb
}

func TestConfigPrecedence(t *testing.T) {
	file := filepath.Join(t.TempDir(), "c.json")
	if err := os.WriteFile(file, []byte(`{"listen": "127.0.0.1:1", "database_url": "sqlite://file.db",
		"sweep_interval_ms": 250, "metrics_public": true}`), 0o600); err != nil {
		t.Fatal(err)
	}
	e, _, _ := testEnv(map[string]string{"SANDBOXWICH_CONFIG": file, "SANDBOXWICH_DATABASE_URL": "sqlite://env.db",
		"SANDBOXWICH_LISTEN": "127.0.0.1:2"})
	c, err := loadConfig(e, "serve", []string{"--listen", "127.0.0.1:3"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:3" || c.DatabaseURL != "sqlite://env.db" || c.SweepInterval != 250*time.Millisecond ||
		!c.MetricsPublic || !c.AutoMigrate || c.DefaultTenant != "default" || c.MaxPrepareAhead != 7*24*time.Hour {
		t.Fatalf("precedence flag > env > file > default broken: %+v", c)
	}
}

func TestConfigErrorsNameTheSetting(t *testing.T) {
	for _, tc := range []struct {
		vars map[string]string
		want string
	}{
		{map[string]string{"SANDBOXWICH_AUTO_MIGRATE": "maybe"}, "SANDBOXWICH_AUTO_MIGRATE"},
		{map[string]string{"SANDBOXWICH_SWEEP_INTERVAL_MS": "-1"}, "SANDBOXWICH_SWEEP_INTERVAL_MS"},
		{map[string]string{"SANDBOXWICH_POOL_LOCK_TTL_MS": "15s"}, "SANDBOXWICH_POOL_LOCK_TTL_MS"},
		{map[string]string{"SANDBOXWICH_TENANT_TOKENS": "acme"}, "SANDBOXWICH_TENANT_TOKENS"},
		{map[string]string{"SANDBOXWICH_TENANT_TOKENS": "a b=tok"}, "SANDBOXWICH_TENANT_TOKENS"},
		{map[string]string{"SANDBOXWICH_WORKER_TOKENS": "not-a-uuid@acme:gvisor_lower_risk=sbw_wtok_x"}, "SANDBOXWICH_WORKER_TOKENS"},
		{map[string]string{"SANDBOXWICH_WORKER_TOKENS": uuid.NewString() + "@acme:runc=sbw_wtok_x"}, "SANDBOXWICH_WORKER_TOKENS"},
		{map[string]string{"SANDBOXWICH_WORKER_TOKENS": uuid.NewString() + "@acme:gvisor_lower_risk=wtok"}, "SANDBOXWICH_WORKER_TOKENS"},
		{map[string]string{"SANDBOXWICH_STERILE_POOL_TARGET": "x"}, "SANDBOXWICH_STERILE_POOL_TARGET"},
		{map[string]string{"SANDBOXWICH_STERILE_POOL_READY_FLOOR": "1"}, "SANDBOXWICH_STERILE_POOL_TARGET"},
		{map[string]string{"SANDBOXWICH_LOG_FORMAT": "xml"}, "SANDBOXWICH_LOG_FORMAT"},
		{map[string]string{"SANDBOXWICH_TLS_CERT_FILE": "c.pem"}, "SANDBOXWICH_TLS_KEY_FILE"},
		{map[string]string{"SANDBOXWICH_MAX_PREPARE_SECONDS": "0"}, "SANDBOXWICH_MAX_PREPARE_SECONDS"},
		{map[string]string{"SANDBOXWICH_MAX_PREPARE_SECONDS": "7d"}, "SANDBOXWICH_MAX_PREPARE_SECONDS"},
	} {
		e, _, _ := testEnv(tc.vars)
		_, err := loadConfig(e, "serve", nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v does not name %s", tc.vars, err, tc.want)
		}
		for _, v := range tc.vars {
			if strings.Contains(v, "tok") && err != nil && strings.Contains(err.Error(), v) {
				t.Errorf("error repeats a secret: %v", err)
			}
		}
	}
}

func TestConfigTokensAndPool(t *testing.T) {
	wid := uuid.New()
	e, _, _ := testEnv(map[string]string{
		"SANDBOXWICH_TENANT_TOKENS":                  "acme=t1, globex=t2",
		"SANDBOXWICH_WORKER_TOKENS":                  wid.String() + "@acme:gvisor_lower_risk|kata_microvm=sbw_wtok_abc",
		"SANDBOXWICH_STERILE_POOL_TARGET":            "3",
		"SANDBOXWICH_STERILE_POOL_PROVIDER":          "dry-run",
		"SANDBOXWICH_STERILE_POOL_RUNTIME_CLASS":     "kata_microvm",
		"SANDBOXWICH_DRY_RUN_LATENCY_MS":             "5",
		"SANDBOXWICH_STERILE_POOL_RELEASE_SET_ID":    "rel",
		"SANDBOXWICH_STERILE_POOL_READY_TTL_SECONDS": "60",
	})
	c, err := loadConfig(e, "serve", nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.TenantTokens["t1"] != "acme" || c.TenantTokens["t2"] != "globex" {
		t.Fatalf("tenant tokens: %v", c.TenantTokens)
	}
	w := c.Workers["sbw_wtok_abc"]
	if w.ID != wid || w.TenantID != "acme" || len(w.RuntimeClasses) != 2 {
		t.Fatalf("worker: %+v", w)
	}
	p := c.Pools[0]
	if p.Name != "default" || p.Provider != "dry-run" || p.Target != 3 || p.TenantID != "default" ||
		p.Release.RuntimeClass != lease.KataMicroVM || p.ReadyTTLSeconds != 60 || p.Settings["latency_ms"] != "5" {
		t.Fatalf("pool: %+v", p)
	}
	if _, err := newProvider(p, driver.InstallationTag("test"), slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	p.Settings["latncy_ms"] = "1"
	if _, err := newProvider(p, driver.InstallationTag("test"), slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "latncy_ms") {
		t.Fatalf("unknown provider setting accepted: %v", err)
	}
	p.Provider = "nomad"
	if _, err := newProvider(p, driver.InstallationTag("test"), slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "nomad") {
		t.Fatalf("unknown provider accepted: %v", err)
	}
}

func TestServeRefusesWithoutSigningKey(t *testing.T) {
	dir := t.TempDir()
	e, _, errb := testEnv(map[string]string{"SANDBOXWICH_DATABASE_URL": "sqlite://" + filepath.Join(dir, "x.db"),
		"SANDBOXWICH_TENANT_TOKENS": "acme=t1"})
	if code := run(context.Background(), e, []string{"serve"}); code != 1 ||
		!strings.Contains(errb.String(), "SANDBOXWICH_STERILE_CELL_SIGNING_KEY_FILE") {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	key := filepath.Join(dir, "key")
	if err := os.WriteFile(key, []byte(strings.Repeat("k", 40)), 0o644); err != nil {
		t.Fatal(err)
	}
	e, _, errb = testEnv(map[string]string{"SANDBOXWICH_DATABASE_URL": "sqlite://" + filepath.Join(dir, "x.db"),
		"SANDBOXWICH_TENANT_TOKENS": "acme=t1", "SANDBOXWICH_STERILE_CELL_SIGNING_KEY_FILE": key})
	if code := run(context.Background(), e, []string{"serve"}); code != 1 || !strings.Contains(errb.String(), "chmod 600") {
		t.Fatalf("group/world-readable key accepted: exit %d: %s", code, errb.String())
	}
}

func TestRedactURL(t *testing.T) {
	if got := redactURL("postgres://sbw:s3cret@db:5432/x"); strings.Contains(got, "s3cret") || !strings.Contains(got, "sbw:***@db") {
		t.Fatal(got)
	}
}

// TestConfigPoolImage: a pool's image must be pinned by digest; a tag
// alone or a malformed reference stops start-up naming the pool and the
// key (CONTRACT §15, §17), from the environment and the config file alike.
func TestConfigPoolImage(t *testing.T) {
	pinned := "registry.example/team/cell@sha256:" + strings.Repeat("0a", 32)
	e, _, _ := testEnv(map[string]string{"SANDBOXWICH_STERILE_POOL_TARGET": "1", "SANDBOXWICH_STERILE_POOL_NAME": "evals",
		"SANDBOXWICH_STERILE_POOL_IMAGE": pinned})
	c, err := loadConfig(e, "serve", nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Pools[0].Image != pinned {
		t.Fatalf("pool image = %q", c.Pools[0].Image)
	}
	for _, bad := range []string{"registry.example/team/cell:latest", "registry.example/team/cell", "registry.example/cell@sha256:abc",
		"registry.example/cell@md5:" + strings.Repeat("0a", 16)} {
		e, _, _ := testEnv(map[string]string{"SANDBOXWICH_STERILE_POOL_TARGET": "1", "SANDBOXWICH_STERILE_POOL_NAME": "evals",
			"SANDBOXWICH_STERILE_POOL_IMAGE": bad})
		_, err := loadConfig(e, "serve", nil)
		var pe *poolImageError
		if !errors.As(err, &pe) || pe.Pool != "evals" || !strings.Contains(err.Error(), `pool "evals"`) ||
			!strings.Contains(err.Error(), "SANDBOXWICH_STERILE_POOL_IMAGE") {
			t.Errorf("image %q: %v, want a poolImageError naming pool evals and the key", bad, err)
		}
	}
	file := filepath.Join(t.TempDir(), "c.json")
	if err := os.WriteFile(file, []byte(`{"pools": [{"name": "swe", "provider": "gvisor", "target": 1, "image": "cell:v1"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	e, _, _ = testEnv(map[string]string{"SANDBOXWICH_CONFIG": file})
	if _, err := loadConfig(e, "serve", nil); err == nil || !strings.Contains(err.Error(), `pool "swe"`) || !strings.Contains(err.Error(), "key image") {
		t.Errorf("config file pool with a tag-only image: %v", err)
	}
	// A provider that runs no pinned image refuses one.
	p := poolConfig{Name: "sim", Provider: "dry-run", Image: pinned}
	if _, err := newProvider(p, driver.InstallationTag("test"), slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "key image") {
		t.Errorf("dry-run pool with an image: %v", err)
	}
	// The gvisor setting image is the pool's image.
	e, _, _ = testEnv(map[string]string{"SANDBOXWICH_STERILE_POOL_TARGET": "1", "SANDBOXWICH_GVISOR_IMAGE": pinned})
	if c, err := loadConfig(e, "serve", nil); err != nil || c.Pools[0].Image != pinned {
		t.Errorf("SANDBOXWICH_GVISOR_IMAGE: %v, %+v", err, c)
	}
}

// TestConfigImageClass: an image class from the config file and from the
// environment (images, max_cells, max_cold, warm_per_image,
// warm_idle_seconds); a fixed pool reads max_cells and max_cold as its
// target and max_provisioning; settings that can never hold stop start-up
// naming the pool and the key.
func TestConfigImageClass(t *testing.T) {
	file := filepath.Join(t.TempDir(), "c.json")
	if err := os.WriteFile(file, []byte(`{"pools": [
		{"name": "swe", "provider": "gvisor", "images": ["registry.test/swe/*"], "max_cells": 8, "max_cold": 2,
		 "warm_per_image": 2, "warm_idle_seconds": 60},
		{"name": "fixed", "provider": "gvisor", "max_cells": 3, "max_cold": 1}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	e, _, _ := testEnv(map[string]string{"SANDBOXWICH_CONFIG": file, "SANDBOXWICH_STERILE_POOL_NAME": "tb",
		"SANDBOXWICH_STERILE_POOL_IMAGES": "registry.test/tb/a, registry.test/tb/b", "SANDBOXWICH_STERILE_POOL_MAX_CELLS": "4",
		"SANDBOXWICH_STERILE_POOL_MAX_CELL_SECONDS": "7200"})
	c, err := loadConfig(e, "serve", nil)
	if err != nil {
		t.Fatal(err)
	}
	swe, fixed, tb := c.Pools[0], c.Pools[1], c.Pools[2]
	if len(swe.Images) != 1 || swe.MaxCells != 8 || swe.MaxCold != 2 || swe.WarmPerImage != 2 || swe.WarmIdleSeconds != 60 {
		t.Errorf("the file's image class: %+v", swe)
	}
	if fixed.Target != 3 || fixed.MaxProvisioning != 1 {
		t.Errorf("a fixed pool's max_cells and max_cold: target %d, max_provisioning %d; want 3 and 1", fixed.Target, fixed.MaxProvisioning)
	}
	if len(tb.Images) != 2 || tb.Images[1] != "registry.test/tb/b" || tb.MaxCells != 4 || tb.MaxCellSeconds != 7200 {
		t.Errorf("the environment's image class: %+v", tb)
	}
	for _, tc := range []struct {
		pool, want string
	}{
		{`{"name": "p", "images": ["registry.test/x/*"], "max_cells": 2, "target": 2}`, "not target"},
		{`{"name": "p", "images": ["registry.test/x/*"], "max_cells": 2, "ready_floor": 1}`, "not target, ready_floor"},
		{`{"name": "p", "images": ["registry.test/x/*"]}`, "max_cells"},
		{`{"name": "p", "images": ["registry.test/x/*"], "max_cells": 2, "max_cold": 3}`, "max_cold"},
		{`{"name": "p", "target": 2, "warm_per_image": 1}`, "warm_per_image"},
		{`{"name": "p", "target": 2, "max_cells": 3}`, "max_cells and target"},
	} {
		if err := os.WriteFile(file, []byte(`{"pools": [`+tc.pool+`]}`), 0o600); err != nil {
			t.Fatal(err)
		}
		e, _, _ := testEnv(map[string]string{"SANDBOXWICH_CONFIG": file})
		if _, err := loadConfig(e, "serve", nil); err == nil || !strings.Contains(err.Error(), `pool "p"`) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming pool p and %q", tc.pool, err, tc.want)
		}
	}
}

// TestConfigEgress: the pool key egress from the config file ("none" or
// {"allow": [...]}) and the environment (a comma list, or none), in
// canonical form; a malformed one stops start-up naming the pool and the
// key.
func TestConfigEgress(t *testing.T) {
	file := filepath.Join(t.TempDir(), "c.json")
	if err := os.WriteFile(file, []byte(`{"pools": [
		{"name": "open", "provider": "gvisor", "target": 1, "egress": {"allow": ["PKGS.test.", "*.files.test:8443"]}},
		{"name": "closed", "provider": "gvisor", "target": 1, "egress": "none"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	e, _, _ := testEnv(map[string]string{"SANDBOXWICH_CONFIG": file, "SANDBOXWICH_STERILE_POOL_NAME": "env",
		"SANDBOXWICH_STERILE_POOL_TARGET": "1", "SANDBOXWICH_STERILE_POOL_EGRESS": "pypi.test, files.test:443"})
	c, err := loadConfig(e, "serve", nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"*.files.test:8443\npkgs.test:443\npkgs.test:80", "none", "files.test:443\npypi.test:443\npypi.test:80"} {
		if got := c.Pools[i].Egress.Policy.Canonical(); got != want {
			t.Errorf("pool %s: egress %q, want %q", c.Pools[i].Name, got, want)
		}
	}
	for _, tc := range []struct{ egress, want string }{
		{`"open"`, "egress"}, {`{"allow": ["10.0.0.1"]}`, "IP literal"}, {`{"allow": "pkgs.test"}`, "egress"},
		{`{"allow": ["pkgs.test"], "deny": []}`, "egress"}, {`{}`, "egress"},
	} {
		if err := os.WriteFile(file, []byte(`{"pools": [{"name": "p", "target": 1, "egress": `+tc.egress+`}]}`), 0o600); err != nil {
			t.Fatal(err)
		}
		e, _, _ := testEnv(map[string]string{"SANDBOXWICH_CONFIG": file})
		if _, err := loadConfig(e, "serve", nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("egress %s: %v, want an error naming %q", tc.egress, err, tc.want)
		}
	}
}
