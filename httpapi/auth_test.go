package httpapi

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/internal/testenv"
	"github.com/sandboxwich/sandboxwich/lease"
)

// TestNewRejectsBadConfig: inconsistent token configurations fail New, and
// the error never shows a token.
func TestNewRejectsBadConfig(t *testing.T) {
	plane, err := sandboxwich.New(backends[0].open(t), testenv.Keyring(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{}); err == nil {
		t.Error("New without a plane succeeded")
	}
	w := sandboxwich.Worker{ID: uuid.New(), TenantID: "acme", RuntimeClasses: []lease.RuntimeClass{lease.KataMicroVM}}
	for name, a := range map[string]Auth{
		"empty tenant token":          {TenantTokens: map[string]string{"": "acme"}},
		"empty tenant":                {TenantTokens: map[string]string{"secret-1": ""}},
		"spaced tenant token":         {TenantTokens: map[string]string{" secret-1": "acme"}},
		"tenant token with prefix":    {TenantTokens: map[string]string{"sbw_wtok_secret-1": "acme"}},
		"shared equals tenant token":  {TenantTokens: map[string]string{"secret-1": "acme"}, SharedToken: "secret-1"},
		"worker token without prefix": {Workers: map[string]sandboxwich.Worker{"secret-1": w}},
		"bare worker prefix":          {Workers: map[string]sandboxwich.Worker{"sbw_wtok_": w}},
		"worker without ID":           {Workers: map[string]sandboxwich.Worker{"sbw_wtok_secret-1": {TenantID: "acme"}}},
		"worker without tenant":       {Workers: map[string]sandboxwich.Worker{"sbw_wtok_secret-1": {ID: uuid.New()}}},
		"spaced operator token":       {SharedToken: "secret-2", OperatorToken: "secret-1 "},
		"operator equals tenant token": {TenantTokens: map[string]string{"secret-2": "globex", "secret-1": "acme"},
			OperatorToken: "secret-1"},
		"operator equals shared token": {SharedToken: "secret-1", OperatorToken: "secret-1"},
		"operator equals worker token": {SharedToken: "secret-2", Workers: map[string]sandboxwich.Worker{"sbw_wtok_secret-1": w},
			OperatorToken: "sbw_wtok_secret-1"},
	} {
		_, err := New(Config{Plane: plane, Auth: a, Logger: slog.New(slog.DiscardHandler)})
		if err == nil {
			t.Errorf("%s: New succeeded", name)
			continue
		}
		mustNotContain(t, name, err.Error(), "secret-1", "secret-2")
	}
	reg := prometheus.NewRegistry()
	cfg := Config{Plane: plane, Auth: Auth{SharedToken: "secret-2"}, Registry: reg, Logger: slog.New(slog.DiscardHandler)}
	if _, err := New(cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := New(cfg); err == nil {
		t.Error("a second handler on the same registry succeeded")
	}
}

// TestBearer: the Authorization header forms that carry a token.
func TestBearer(t *testing.T) {
	for _, tc := range []struct {
		values []string
		tok    string
		ok     bool
	}{
		{[]string{"Bearer abc"}, "abc", true},
		{[]string{"bearer abc"}, "abc", true},
		{[]string{"BEARER  abc "}, "abc", true},
		{[]string{"Bearer"}, "", false},
		{[]string{"Bearer "}, "", false},
		{[]string{"Basic abc"}, "", false},
		{[]string{"abc"}, "", false},
		{[]string{"Bearer abc", "Bearer abc"}, "", false},
	} {
		tok, ok := bearer(tc.values)
		if tok != tc.tok || ok != tc.ok {
			t.Errorf("bearer(%q) = %q, %v", tc.values, tok, ok)
		}
	}
}

// TestPanicRecovered: a panicking route answers 500 internal with the
// request ID, and is logged once.
func TestPanicRecovered(t *testing.T) {
	var logs bytes.Buffer
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg, nil) // the cell collector is never scraped here
	if err != nil {
		t.Fatal(err)
	}
	h := &handler{log: slog.New(slog.NewJSONHandler(&logs, nil)), metrics: m}
	srv := httptest.NewServer(h.middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") })))
	defer srv.Close()
	res, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 500 || res.Header.Get(RequestIDHeader) == "" {
		t.Errorf("status %d, x-request-id %q", res.StatusCode, res.Header.Get(RequestIDHeader))
	}
	if n := strings.Count(logs.String(), "httpapi: panic"); n != 1 {
		t.Errorf("%d panic log lines:\n%s", n, logs.String())
	}
}
