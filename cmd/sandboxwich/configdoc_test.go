package main

import (
	"os"
	"strings"
	"testing"
)

// TestConfigurationReference keeps docs/configuration.md true: every
// setting the server reads is documented in its table, and no row repeats
// (a duplicated row once said two different things about the pool keys).
func TestConfigurationReference(t *testing.T) {
	b, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	section := string(b)
	seen := map[string]bool{}
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		key := strings.TrimSpace(strings.Split(line, "|")[1])
		if seen[key] {
			t.Errorf("the configuration table has two rows for %s", key)
		}
		seen[key] = true
	}
	for _, s := range settings {
		if !documented(section, s.env()) {
			t.Errorf("%s is read by the server but not in docs/configuration.md", s.env())
		}
	}
}

// documented reports whether env is named in section, in full or as the
// `_SUFFIX` of a row that names its prefix ("`SANDBOXWICH_LOG_LEVEL` /
// `_FORMAT`").
func documented(section, env string) bool {
	if strings.Contains(section, "`"+env+"`") {
		return true
	}
	for i := len("SANDBOXWICH_"); i < len(env); i++ {
		if env[i] == '_' && strings.Contains(section, "`"+env[:i]) && strings.Contains(section, "`"+env[i:]+"`") {
			return true
		}
	}
	return false
}
