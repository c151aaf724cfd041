package main

// Fuzz targets for the configuration parsers: tenant tokens, worker tokens
// and the JSON config file. Beyond never panicking, each checks that what
// is accepted satisfies the rules, and that no error message repeats a
// secret it was given (configuration errors are printed at start-up and end
// up in logs).

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/lease"
)

// fzFixedText is every string literal of the configuration code: a
// "secret" that is part of a fixed message (say, the token "tenant=token")
// does not count as leaked.
func fzFixedText(tb testing.TB) string {
	tb.Helper()
	var b strings.Builder
	fset := token.NewFileSet()
	for _, name := range []string{"config.go", "main.go", "serve.go", "providers.go"} {
		file, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			tb.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if s, err := strconv.Unquote(lit.Value); err == nil {
					b.WriteString(s + "\x00")
				}
			}
			return true
		})
	}
	return b.String()
}

// fzSecretsOf returns the tokens of a token list: the right-hand side of
// each "x=token" entry, and each whole entry (a token given without its
// tenant is still a secret).
func fzSecretsOf(v string) []string {
	var out []string
	for _, item := range strings.Split(v, ",") {
		out = append(out, strings.TrimSpace(item))
		if _, tok, ok := strings.Cut(item, "="); ok {
			out = append(out, strings.TrimSpace(tok))
		}
	}
	return out
}

// fzNoLeak fails t when msg holds a secret of at least 6 bytes that is not
// part of a fixed message.
func fzNoLeak(t *testing.T, fixed, msg string, secrets []string) {
	t.Helper()
	for _, s := range secrets {
		if len(s) >= 6 && !strings.Contains(fixed, s) && strings.Contains(msg, s) {
			t.Fatalf("error message %q repeats the secret %q", msg, s)
		}
	}
}

// fzEnv is a command environment with the given variables.
func fzEnv(vars map[string]string) env {
	return env{stdout: new(strings.Builder), stderr: new(strings.Builder),
		getenv: func(k string) string { return vars[k] },
		environ: func() []string {
			var out []string
			for k, v := range vars {
				out = append(out, k+"="+v)
			}
			return out
		}}
}

// FuzzTenantTokens parses SANDBOXWICH_TENANT_TOKENS. Accepted: one entry
// per non-blank comma-separated item, each tenant an identifier, each token
// non-empty and trimmed, no token twice. Refused: the error (also through
// loadConfig, as start-up prints it) never repeats a token.
func FuzzTenantTokens(f *testing.F) {
	for _, s := range []string{
		"acme=abc123,globex=def456", "acme=abc123", " acme = abc123 , ", "acme=", "=abc123", "acme",
		"acme=abc123,acme=abc123", "acme=tok-one,globex=tok-one", "ac me=secret-token-1", "оcme=secret-token-2",
		"acme\x00=secret-token-3", "acme=secret=with=equals", ",,,", "", "acme=tok\x00en-4",
		"a/b:c.d_e-f=tok-5,x=" + strings.Repeat("t", 5000),
	} {
		f.Add(s)
	}
	fixed := fzFixedText(f)
	f.Fuzz(func(t *testing.T, v string) {
		c := &config{}
		err := parseTenantTokens(c, v)
		secrets := fzSecretsOf(v)
		if err != nil {
			fzNoLeak(t, fixed, err.Error(), secrets)
		} else {
			if len(c.TenantTokens) != len(splitList(v)) {
				t.Fatalf("%q: %d tokens from %d entries", v, len(c.TenantTokens), len(splitList(v)))
			}
			for tok, tenant := range c.TenantTokens {
				if tok == "" || strings.TrimSpace(tok) != tok || !lease.ValidIdentifier(tenant) {
					t.Fatalf("%q: accepted tenant %q token %q", v, tenant, tok)
				}
				if !strings.Contains(v, tok) {
					t.Fatalf("%q: token %q is not in the input", v, tok)
				}
			}
		}
		_, lerr := loadConfig(fzEnv(map[string]string{"SANDBOXWICH_TENANT_TOKENS": v}), "serve", nil)
		if (err == nil) != (lerr == nil || !strings.Contains(lerr.Error(), "SANDBOXWICH_TENANT_TOKENS")) {
			t.Fatalf("%q: parse error %v but loadConfig error %v", v, err, lerr)
		}
		if lerr != nil {
			fzNoLeak(t, fixed, lerr.Error(), secrets)
		}
	})
}

// FuzzWorkerTokens parses SANDBOXWICH_WORKER_TOKENS. Accepted: every worker
// has a UUID (no two alike), a tenant that is an identifier, at least one
// valid runtime class, and a token that starts with sbw_wtok_ and has more
// after it. Refused: the error never repeats a token.
func FuzzWorkerTokens(f *testing.F) {
	const w1, w2 = "01890a5d-ac96-774b-bcce-000000000001", "01890a5d-ac96-774b-bcce-000000000002"
	for _, s := range []string{
		w1 + "@acme:gvisor_lower_risk=sbw_wtok_abc123",
		w1 + "@acme:kata_microvm|gvisor_lower_risk=sbw_wtok_abc123," + w2 + "@globex:kata_microvm=sbw_wtok_def456",
		w1 + "@acme:kata_microvm=sbw_wtok_", w1 + "@acme:kata_microvm=abc123-secret", w1 + "@acme:docker=sbw_wtok_secret-1",
		w1 + "@acme=sbw_wtok_secret-2", "not-a-uuid@acme:kata_microvm=sbw_wtok_secret-3", w1 + "@ac me:kata_microvm=sbw_wtok_secret-4",
		w1 + "@acme:kata_microvm=sbw_wtok_same," + w1 + "@acme:kata_microvm=sbw_wtok_other",
		w1 + "@acme:kata_microvm=sbw_wtok_same," + w2 + "@acme:kata_microvm=sbw_wtok_same",
		"{" + w1 + "}@acme:kata_microvm=sbw_wtok_secret-5", "00000000-0000-0000-0000-000000000000@acme:kata_microvm=sbw_wtok_s-6",
		"sbw_wtok_secret-7=" + w1 + "@acme:kata_microvm", w1 + "@acme:kata_microvm|=sbw_wtok_secret-8", "", ",",
	} {
		f.Add(s)
	}
	fixed := fzFixedText(f)
	f.Fuzz(func(t *testing.T, v string) {
		c := &config{}
		err := parseWorkerTokens(c, v)
		secrets := fzSecretsOf(v)
		if err != nil {
			fzNoLeak(t, fixed, err.Error(), secrets)
		} else {
			ids := map[uuid.UUID]bool{}
			for tok, w := range c.Workers {
				if !strings.HasPrefix(tok, "sbw_wtok_") || len(tok) <= len("sbw_wtok_") || strings.TrimSpace(tok) != tok {
					t.Fatalf("%q: accepted worker token %q", v, tok)
				}
				if ids[w.ID] || !lease.ValidIdentifier(w.TenantID) || len(w.RuntimeClasses) == 0 {
					t.Fatalf("%q: accepted worker %+v", v, w)
				}
				ids[w.ID] = true
				for _, rc := range w.RuntimeClasses {
					if !rc.Valid() {
						t.Fatalf("%q: accepted runtime class %q", v, rc)
					}
				}
			}
			if len(c.Workers) != len(splitList(v)) {
				t.Fatalf("%q: %d workers from %d entries", v, len(c.Workers), len(splitList(v)))
			}
		}
		if _, lerr := loadConfig(fzEnv(map[string]string{"SANDBOXWICH_WORKER_TOKENS": v}), "serve", nil); lerr != nil {
			fzNoLeak(t, fixed, lerr.Error(), secrets)
		}
	})
}

// FuzzConfigFile loads an arbitrary config file. A refused file's error
// never repeats a token it holds (tenant, shared, operator or worker). An
// accepted file's settings are the ones the config holds: the file's
// tokens, its pools, its listen address (the environment is empty here).
func FuzzConfigFile(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"listen":"127.0.0.1:0","database_url":"sqlite://x.db","log_level":"debug"}`,
		`{"tenant_tokens":"acme=file-secret-token-1","api_token":"file-shared-token-2","operator_token":"file-operator-token-3"}`,
		`{"worker_tokens":"01890a5d-ac96-774b-bcce-000000000001@acme:kata_microvm=sbw_wtok_file-worker-4"}`,
		`{"tenant_tokens":"acme=dup-token-5","api_token":"dup-token-5"}`,
		`{"tenant_tokens":"bad tenant=file-secret-token-6"}`, `{"tenant_tokens":["acme=file-secret-token-7"]}`,
		`{"api_token":{"nested":"file-secret-token-8"}}`, `{"unknown_key":"file-secret-token-9"}`,
		`{"auto_migrate":"maybe","api_token":"file-secret-token-10"}`, `{"sweep_interval_ms":1e3}`, `{"metrics_public":true}`,
		`{"pools":[{"name":"p","provider":"dry-run","tenant_id":"acme","target":2,"release":{"release_set_id":"r","runtime_class":"kata_microvm","policy_digest":"` + strings.Repeat("a", 64) + `","signature":"s"},"settings":{"latency_ms":"5"}}]}`,
		`{"pools":[{"name":"p"},{"name":"p"}]}`, `{"pools":[{"bogus":1}]}`, `{"pools":{}}`, `[]`, `{`, ``, `null`,
		`{"tls_cert_file":"c.pem"}`, `{"api_token":"tok","api_token":"file-secret-token-11 x"}`,
	} {
		f.Add([]byte(s))
	}
	fixed := fzFixedText(f)
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, "config.json")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := loadConfig(fzEnv(nil), "serve", []string{"--config", path})

		// The secrets the file holds, as loadConfig would read them.
		var raw map[string]json.RawMessage
		_ = json.Unmarshal(data, &raw)
		var secrets []string
		str := func(k string) (string, bool) {
			var s string
			if v, ok := raw[k]; ok && json.Unmarshal(v, &s) == nil {
				return s, true
			}
			return "", false
		}
		for _, k := range []string{"tenant_tokens", "worker_tokens"} {
			if s, ok := str(k); ok {
				secrets = append(secrets, fzSecretsOf(s)...)
			}
		}
		for _, k := range []string{"api_token", "operator_token"} {
			if s, ok := str(k); ok {
				secrets = append(secrets, s, strings.TrimSpace(s))
			}
		}
		if err != nil {
			fzNoLeak(t, fixed, err.Error(), secrets)
			return
		}
		if s, ok := str("api_token"); ok && c.APIToken != strings.TrimSpace(s) {
			t.Fatalf("api_token %q loaded as %q", s, c.APIToken)
		}
		if s, ok := str("operator_token"); ok && c.OperatorToken != strings.TrimSpace(s) {
			t.Fatalf("operator_token %q loaded as %q", s, c.OperatorToken)
		}
		if s, ok := str("listen"); ok && c.Listen != strings.TrimSpace(s) {
			t.Fatalf("listen %q loaded as %q", s, c.Listen)
		} else if !ok && c.Listen != "127.0.0.1:3217" {
			t.Fatalf("default listen is %q", c.Listen)
		}
		if c.APIToken != "" {
			if _, dup := c.TenantTokens[c.APIToken]; dup {
				t.Fatal("the shared token is also a tenant token")
			}
		}
		if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
			t.Fatal("a TLS certificate without a key was accepted")
		}
		names := map[string]bool{}
		for _, p := range c.Pools {
			if names[p.Name] {
				t.Fatalf("pool %q accepted twice", p.Name)
			}
			names[p.Name] = true
		}
	})
}
