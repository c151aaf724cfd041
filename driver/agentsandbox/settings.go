package agentsandbox

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxwich/sandboxwich/driver/internal/kubeconf"
	"github.com/sandboxwich/sandboxwich/lease"
)

// Settings are the keys ConfigFromSettings understands: the reference
// binary's SANDBOXWICH_AGENT_SANDBOX_<KEY> variables, lower-cased.
var Settings = []string{
	"kubeconfig", "namespace", "warm_pool", "template", "container",
	"runtime_class_gvisor_lower_risk", "runtime_class_kata_microvm",
	"bind_timeout_ms", "delete_timeout_ms", "pool_label",
}

// ConfigFromSettings builds a Config for the named pool from string
// settings (see Settings), refusing unknown keys and naming the bad one:
//
//	kubeconfig                       path; empty: the in-cluster config
//	namespace, warm_pool             required (the SandboxWarmPool to claim from)
//	template                         SandboxTemplate, for the v1alpha1 fallback
//	container                        container to exec in (default: the first)
//	runtime_class_gvisor_lower_risk  RuntimeClass name for the class
//	runtime_class_kata_microvm       RuntimeClass name for the class
//	bind_timeout_ms, delete_timeout_ms
//	pool_label                       ownership label value (default: the
//	                                 pool name as a label value)
//
// The result still goes through New for validation.
func ConfigFromSettings(pool string, s map[string]string) (Config, error) {
	var cfg Config
	for k := range s {
		if !slices.Contains(Settings, k) {
			return cfg, fmt.Errorf("agentsandbox: unknown setting %q (known: %s)", k, strings.Join(Settings, ", "))
		}
	}
	var err error
	if cfg.RESTConfig, err = kubeconf.RESTConfig(s["kubeconfig"]); err != nil {
		return cfg, fmt.Errorf("agentsandbox: setting kubeconfig: %w", err)
	}
	cfg.Namespace, cfg.WarmPool, cfg.Template, cfg.Container = s["namespace"], s["warm_pool"], s["template"], s["container"]
	cfg.RuntimeClassNames = map[lease.RuntimeClass]string{}
	for _, class := range []lease.RuntimeClass{lease.GVisorLowerRisk, lease.KataMicroVM} {
		if name := s["runtime_class_"+string(class)]; name != "" {
			cfg.RuntimeClassNames[class] = name
		}
	}
	for key, dst := range map[string]*time.Duration{"bind_timeout_ms": &cfg.BindTimeout, "delete_timeout_ms": &cfg.DeleteTimeout} {
		if v := s[key]; v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n <= 0 {
				return cfg, fmt.Errorf("agentsandbox: setting %s: %q is not a positive number of milliseconds", key, v)
			}
			*dst = time.Duration(n) * time.Millisecond
		}
	}
	cfg.Pool = s["pool_label"]
	if cfg.Pool == "" {
		cfg.Pool = kubeconf.LabelValue(pool)
	}
	return cfg, nil
}
