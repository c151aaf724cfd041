package agentsandbox

import (
	"time"

	"github.com/sandboxwich/sandboxwich/driver/internal/kubeconf"
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
func ConfigFromSettings(pool string, values map[string]string) (Config, error) {
	var cfg Config
	s := kubeconf.Settings{Driver: "agentsandbox", Known: Settings, Values: values}
	if err := s.Check(); err != nil {
		return cfg, err
	}
	var err error
	if cfg.RESTConfig, err = s.RESTConfig(); err != nil {
		return cfg, err
	}
	cfg.Namespace, cfg.WarmPool, cfg.Template, cfg.Container = values["namespace"], values["warm_pool"], values["template"], values["container"]
	cfg.RuntimeClassNames = s.RuntimeClassNames()
	if err := s.Millis(map[string]*time.Duration{"bind_timeout_ms": &cfg.BindTimeout, "delete_timeout_ms": &cfg.DeleteTimeout}); err != nil {
		return cfg, err
	}
	cfg.Pool = s.PoolLabel(pool)
	return cfg, nil
}
