package httpapi

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
)

// recordingProvider is the fake provider with an exec that records every
// call and, like a real driver handed input it cannot run, fails with an
// error that quotes the input.
type recordingProvider struct {
	*fake.Provider
	mu    sync.Mutex
	calls int
}

func (p *recordingProvider) Exec(_ context.Context, _ driver.Object, req driver.ExecRequest) (driver.ExecResult, error) {
	p.mu.Lock()
	p.calls++
	p.mu.Unlock()
	return driver.ExecResult{}, fmt.Errorf("exec %q with env %q: refused", req.Argv, req.Env)
}

func (p *recordingProvider) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls
}

// captureHandler is a slog.Handler that keeps every record, with its
// attributes (those added through WithAttrs included) flattened to text.
type captureHandler struct {
	mu    *sync.Mutex
	recs  *[]capturedRecord
	attrs []slog.Attr
}

type capturedRecord struct {
	level slog.Level
	text  string // message and every attribute value
}

func newCaptureHandler() *captureHandler {
	return &captureHandler{mu: &sync.Mutex{}, recs: &[]capturedRecord{}}
}

func (h *captureHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *captureHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	add := func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value.Resolve().Any())
		return true
	}
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(add)
	h.mu.Lock()
	defer h.mu.Unlock()
	*h.recs = append(*h.recs, capturedRecord{level: r.Level, text: b.String()})
	return nil
}

func (h *captureHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(append([]slog.Attr{}, h.attrs...), as...)
	return &c
}

func (h *captureHandler) WithGroup(string) slog.Handler { return h }

func (h *captureHandler) records() []capturedRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]capturedRecord{}, *h.recs...)
}

// TestExecRefusesBadInput: an empty argv[0], a NUL byte in an argv string,
// env key or value, and env keys outside [A-Za-z_][A-Za-z0-9_]* are 422
// invalid_request, the provider sees no call, and no user string reaches a
// log record at ERROR level (CONTRACT §14).
func TestExecRefusesBadInput(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		prov := &recordingProvider{Provider: fake.New(fake.Config{})}
		logs := newCaptureHandler()
		log := slog.New(logs)
		e := newEnvWith(t, b, []sandboxwich.Option{sandboxwich.WithLogger(log), sandboxwich.WithPools(pool.Config{
			Name: "p1", TenantID: "acme", Release: signedRelease(t, lease.GVisorLowerRisk), Target: 1, Provider: prov,
		})}, func(c *Config) { c.Logger = log })
		e.plane.Pools().Pass(context.Background())
		c := e.claim(tokAcme, nil, lease.GVisorLowerRisk)
		if c.Lease == nil {
			t.Fatal("no pool cell was leased")
		}
		// Each hostile string carries a marker to look for in the logs.
		markers := []string{"m1a7", "m2b8", "m3c9", "m4d0", "m5e1", "m6f2", "m7a3", "m8b4"}
		for _, tc := range []struct {
			name string
			argv []string
			env  map[string]string
		}{
			{"empty argv[0]", []string{"", "m1a7"}, nil},
			{"NUL in argv[0]", []string{"echo\x00m2b8"}, nil},
			{"NUL inside an argument", []string{"echo", "a\x00m3c9"}, nil},
			{"= in an env key", []string{"true"}, map[string]string{"K=m4d0": "v"}},
			{"empty env key", []string{"true"}, map[string]string{"": "m5e1"}},
			{"NUL in an env key", []string{"true"}, map[string]string{"K\x00m6f2": "v"}},
			{"NUL in an env value", []string{"true"}, map[string]string{"K": "v\x00m7a3"}},
			{"env key starting with a digit", []string{"true"}, map[string]string{"9m8b4": "v"}},
			{"env key with a dash", []string{"true"}, map[string]string{"A-m8b4": "v"}},
		} {
			body := with(proofBody(c), "argv", tc.argv)
			if tc.env != nil {
				body["env"] = tc.env
			}
			r := e.do("POST", leasePath(c.Lease.LeaseID, "/exec"), tokAcme, body)
			if r.status != 422 {
				t.Errorf("%s: status %d, want 422; body %s", tc.name, r.status, r.body)
				continue
			}
			r.errCode(t, 422, "invalid_request")
		}
		if n := prov.count(); n != 0 {
			t.Errorf("the provider saw %d exec calls, want none", n)
		}
		for _, rec := range logs.records() {
			if rec.level < slog.LevelError {
				continue
			}
			for _, m := range markers {
				if strings.Contains(rec.text, m) {
					t.Errorf("an ERROR log record holds user input %q: %s", m, rec.text)
				}
			}
		}
		// The same lease still runs valid input through the provider.
		e.do("POST", leasePath(c.Lease.LeaseID, "/exec"), tokAcme, with(proofBody(c), "argv", []string{"true"},
			"env", map[string]string{"_Ok_9": "any value = fine"})).errCode(t, 500, "internal")
		if n := prov.count(); n != 1 {
			t.Errorf("valid input: the provider saw %d exec calls, want 1", n)
		}
	})
}
