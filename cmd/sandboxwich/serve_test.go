package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxwich/sandboxwich/httpapi"
)

// TestServeHeaderTooLarge: the real server configuration lets an oversized
// header reach the handler, which answers 431 request_header_too_large in
// the JSON envelope rather than Go's plain-text 431.
func TestServeHeaderTooLarge(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "signing.key")
	if err := os.WriteFile(key, []byte(strings.Repeat("k", 48)), 0o600); err != nil {
		t.Fatal(err)
	}
	e, _, _ := testEnv(map[string]string{
		"SANDBOXWICH_STERILE_CELL_SIGNING_KEY_FILE": key,
		"SANDBOXWICH_DATABASE_URL":                  "sqlite://" + filepath.Join(dir, "db"),
		"SANDBOXWICH_TENANT_TOKENS":                 "acme=tok-acme-header-test",
	})
	c, err := loadConfig(e, "serve", nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := build(t.Context(), c, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.run(ctx, ln) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	for _, tc := range []struct {
		size   int
		status int
	}{{100 << 10, 431}, {httpapi.MaxHeaderBytes - 1024, 200}} {
		req, err := http.NewRequest("GET", "http://"+ln.Addr().String()+"/healthz", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Pad", strings.Repeat("x", tc.size))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != tc.status {
			t.Errorf("%d-byte header: status %d, want %d; %s", tc.size, res.StatusCode, tc.status, body)
			continue
		}
		if tc.status != 431 {
			continue
		}
		var env struct {
			OK   *bool  `json:"ok"`
			Code string `json:"code"`
		}
		if ct := res.Header.Get("Content-Type"); ct != "application/json" || json.Unmarshal(body, &env) != nil ||
			env.OK == nil || *env.OK || env.Code != "request_header_too_large" {
			t.Errorf("%d-byte header: %s %q, want the JSON envelope", tc.size, ct, body)
		}
	}
}
