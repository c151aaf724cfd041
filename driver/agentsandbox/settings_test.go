package agentsandbox

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich/lease"
)

func TestConfigFromSettings(t *testing.T) {
	if _, err := ConfigFromSettings("p", map[string]string{"warmpool": "x"}); err == nil || !strings.Contains(err.Error(), `"warmpool"`) {
		t.Fatalf("unknown setting accepted: %v", err)
	}
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := ConfigFromSettings("pool:a/b", map[string]string{"kubeconfig": kc, "namespace": "ns", "warm_pool": "warm",
		"runtime_class_gvisor_lower_risk": "gvisor", "bind_timeout_ms": "1500"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Namespace != "ns" || cfg.WarmPool != "warm" || cfg.RuntimeClassNames[lease.GVisorLowerRisk] != "gvisor" ||
		cfg.BindTimeout != 1500*time.Millisecond || cfg.Pool != "pool-a-b" || cfg.RESTConfig.Host != "https://127.0.0.1:6443" {
		t.Fatalf("config: %+v", cfg)
	}
	if _, err := ConfigFromSettings("p", map[string]string{"kubeconfig": kc, "bind_timeout_ms": "-1"}); err == nil ||
		!strings.Contains(err.Error(), "bind_timeout_ms") {
		t.Fatalf("bad timeout accepted: %v", err)
	}
}
