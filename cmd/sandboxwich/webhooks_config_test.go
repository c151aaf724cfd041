package main

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxwich/sandboxwich/internal/testenv"
)

// TestWebhooksConfig: webhooks come from the config file; a secret file
// group or others can read, an http URL off loopback, an unknown field or
// a missing secret stop start-up, naming what is wrong; retention is read.
func TestWebhooksConfig(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "hook.secret")
	if err := os.WriteFile(secret, []byte("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	write := func(body string) string {
		p := filepath.Join(dir, "config.json")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	load := func(body string) (*config, error) {
		e, _, _ := testEnv(map[string]string{"SANDBOXWICH_CONFIG": write(body), "SANDBOXWICH_EVENT_RETENTION_HOURS": "24"})
		return loadConfig(e, "serve", nil)
	}
	c, err := load(`{"webhooks": [{"tenant_id": "acme", "url": "https://hooks.example/sbw", "secret_file": "` + secret + `", "types": ["cell.", "lease."]}]}`)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Webhooks) != 1 || c.Webhooks[0].TenantID != "acme" || len(c.Webhooks[0].Types) != 2 || c.EventRetention.Hours() != 24 {
		t.Fatalf("config %+v", c)
	}
	st := testenv.SQLite(t)
	if d, err := buildWebhooks(c, st, quiet); err != nil || d == nil {
		t.Fatalf("buildWebhooks: %v", err)
	}
	if _, err := load(`{"webhooks": [{"tenant_id": "acme", "url": "https://h/x", "secret": "x"}]}`); err == nil || !strings.Contains(err.Error(), "webhooks") {
		t.Errorf("an unknown webhook field: %v", err)
	}
	for body, want := range map[string]string{
		`{"webhooks": [{"tenant_id": "acme", "url": "http://hooks.example/x", "secret_file": "` + secret + `"}]}`: "loopback",
		`{"webhooks": [{"tenant_id": "acme", "url": "https://hooks.example/x"}]}`:                                 "secret_file",
	} {
		c, err := load(body)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := buildWebhooks(c, st, quiet); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error naming %s", body, err, want)
		}
	}
	if err := os.Chmod(secret, 0o640); err != nil {
		t.Fatal(err)
	}
	c, _ = load(`{"webhooks": [{"tenant_id": "acme", "url": "https://hooks.example/x", "secret_file": "` + secret + `"}]}`)
	if _, err := buildWebhooks(c, st, quiet); err == nil || !strings.Contains(err.Error(), "webhooks[0].secret_file") {
		t.Errorf("a 0640 secret file: %v", err)
	}
	e, _, _ := testEnv(map[string]string{"SANDBOXWICH_EVENT_RETENTION_HOURS": "x"})
	if _, err := loadConfig(e, "serve", nil); err == nil || !strings.Contains(err.Error(), "SANDBOXWICH_EVENT_RETENTION_HOURS") {
		t.Errorf("a bad retention: %v", err)
	}
}
