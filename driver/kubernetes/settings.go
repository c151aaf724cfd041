package kubernetes

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxwich/sandboxwich/driver/internal/kubeconf"
)

// Settings are the keys ConfigFromSettings understands: the reference
// binary's SANDBOXWICH_KUBERNETES_<KEY> variables, lower-cased.
var Settings = []string{
	"kubeconfig", "namespace", "image", "image_class", "command",
	"runtime_class_gvisor_lower_risk", "runtime_class_kata_microvm",
	"cpu", "memory", "tmp_size", "run_as_user", "network_policy",
	"ready_timeout_ms", "termination_grace_period_ms", "node_name", "pool_label",
	"agent_image", "agent_port", "cell_disk_bytes",
}

// ConfigFromSettings builds a Config for the named pool from string
// settings (see Settings), refusing unknown keys and naming the bad one:
//
//	kubeconfig                       path; empty: the in-cluster config
//	                                 of the Pod's ServiceAccount
//	namespace                        required
//	image                            the cell image, pinned by digest:
//	                                 required unless image_class
//	image_class                      true for an image class (CONTRACT
//	                                 §21, the pool key images): image is
//	                                 then empty, every provision names its
//	                                 image, and one that names none fails
//	command                          space-separated (default sleep infinity)
//	runtime_class_gvisor_lower_risk  RuntimeClass name for the class
//	runtime_class_kata_microvm       RuntimeClass name for the class
//	cpu, memory                      quantities ("1", "512Mi")
//	cell_disk_bytes                  the cell's writable storage in bytes
//	                                 (the pool key; default half of memory)
//	tmp_size                         its older name, as a quantity
//	run_as_user                      non-root UID (default 65532)
//	network_policy                   true (default) or false
//	ready_timeout_ms                 Provision's wait for readiness
//	termination_grace_period_ms      the Pods' grace period
//	node_name                        pin Pods to a node
//	pool_label                       ownership label value (default: the
//	                                 pool name, with characters a label
//	                                 value cannot hold replaced by "-")
//	agent_image                      the cell agent's image, pinned by
//	                                 digest: exec, files and launch go
//	                                 through the agent over per-cell mTLS
//	                                 (default none: exec via pods/exec)
//	agent_port                       the agent's Pod port (default 7443)
//
// At least one runtime_class_* setting is required. The result still goes
// through New for validation.
func ConfigFromSettings(pool string, values map[string]string) (Config, error) {
	var cfg Config
	s := kubeconf.Settings{Driver: "kubernetes", Known: Settings, Values: values}
	if err := s.Check(); err != nil {
		return cfg, err
	}
	var err error
	if cfg.RESTConfig, err = s.RESTConfig(); err != nil {
		return cfg, err
	}
	cfg.Namespace, cfg.Image, cfg.NodeName = values["namespace"], values["image"], values["node_name"]
	cfg.AgentImage = values["agent_image"]
	if v := values["agent_port"]; v != "" {
		if cfg.AgentPort, err = strconv.Atoi(v); err != nil || cfg.AgentPort < 1 || cfg.AgentPort > 65535 {
			return cfg, fmt.Errorf("kubernetes: setting agent_port: %q is not a TCP port", v)
		}
	}
	cfg.CPU, cfg.Memory, cfg.TmpSize = values["cpu"], values["memory"], values["tmp_size"]
	if v := values["cell_disk_bytes"]; v != "" {
		if cfg.CellDiskBytes, err = strconv.ParseInt(v, 10, 64); err != nil || cfg.CellDiskBytes <= 0 {
			return cfg, fmt.Errorf("kubernetes: key cell_disk_bytes: %q is not a positive number of bytes", v)
		}
	}
	if c := strings.Fields(values["command"]); len(c) > 0 {
		cfg.Command = c
	}
	cfg.RuntimeClassNames = s.RuntimeClassNames()
	if v := values["run_as_user"]; v != "" {
		if cfg.RunAsUser, err = strconv.ParseInt(v, 10, 64); err != nil || cfg.RunAsUser <= 0 {
			return cfg, fmt.Errorf("kubernetes: setting run_as_user: %q is not a positive UID", v)
		}
	}
	if v := values["image_class"]; v != "" {
		if cfg.ImageClass, err = strconv.ParseBool(v); err != nil {
			return cfg, fmt.Errorf("kubernetes: setting image_class: %q is not true or false", v)
		}
	}
	if v := values["network_policy"]; v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return cfg, fmt.Errorf("kubernetes: setting network_policy: %q is not true or false", v)
		}
		cfg.NetworkPolicy = &b
	}
	if err := s.Millis(map[string]*time.Duration{"ready_timeout_ms": &cfg.ReadyTimeout,
		"termination_grace_period_ms": &cfg.TerminationGracePeriod}); err != nil {
		return cfg, err
	}
	cfg.Pool = s.PoolLabel(pool)
	return cfg, nil
}

// LabelValue maps a pool name to a label value: characters a label value
// cannot hold become "-", and the ends are trimmed to alphanumerics.
func LabelValue(name string) string { return kubeconf.LabelValue(name) }
