package cloudflare

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxwich/sandboxwich/lease"
)

// Settings are the keys ConfigFromSettings understands: the reference
// binary's SANDBOXWICH_CLOUDFLARE_<KEY> variables, lower-cased.
var Settings = []string{
	"bridge_url", "bridge_token_file", "runtime_class", "image", "instance_type", "container_class", "agent_digest",
	"api_base_url", "api_token_file", "account_id", "worker_name", "worker_id", "container_application_id",
	"durable_object_binding", "compatibility_date", "compatibility_flags",
	"read_back_interval_ms", "ready_timeout_ms",
}

// ConfigFromSettings builds a Config for the named pool from string
// settings (see Settings), refusing unknown keys and naming the bad one:
//
//	bridge_url                 the bridge Worker's https URL (required)
//	bridge_token_file          file holding the bridge's bearer token (required)
//	runtime_class              the signed runtime class a Cloudflare Container
//	                           counts as (required, no default)
//	image                      the cell image, repository@sha256:… (required)
//	instance_type              the container application's instance type (required)
//	container_class            Durable Object class with the container (CellObject)
//	agent_digest               sha256:<hex> of the agent binary in the image (required)
//	api_token_file             read-only Cloudflare API token (required)
//	account_id, worker_name, container_application_id,
//	compatibility_date         what the read-back compares (required)
//	compatibility_flags        comma-separated (default none)
//	worker_id                  the Worker's ID for the version read (worker_name)
//	durable_object_binding     the cells' binding (CELLS)
//	api_base_url               the Cloudflare API (DefaultAPIBaseURL)
//	read_back_interval_ms      age of the read-back the class is admitted on
//	ready_timeout_ms           Provision's wait for the agent
//
// The result still goes through New for validation.
func ConfigFromSettings(pool string, values map[string]string) (Config, error) {
	var cfg Config
	for k := range values {
		if !slices.Contains(Settings, k) {
			return cfg, fmt.Errorf("cloudflare: unknown setting %q (known: %s)", k, strings.Join(Settings, ", "))
		}
	}
	var missing []string
	for _, k := range []string{"bridge_url", "bridge_token_file", "runtime_class", "image", "instance_type", "agent_digest",
		"api_token_file", "account_id", "worker_name", "container_application_id", "compatibility_date"} {
		if values[k] == "" {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		return cfg, fmt.Errorf("cloudflare: settings %s are required (SANDBOXWICH_CLOUDFLARE_<KEY>)", strings.Join(missing, ", "))
	}
	cfg = Config{
		BridgeURL: values["bridge_url"], BridgeTokenFile: values["bridge_token_file"],
		Pool: pool, RuntimeClass: lease.RuntimeClass(values["runtime_class"]),
		Image: values["image"], InstanceType: values["instance_type"], ContainerClass: values["container_class"],
		AgentDigest: values["agent_digest"],
		ReadBack: ReadBack{
			APIBaseURL: values["api_base_url"], APITokenFile: values["api_token_file"], AccountID: values["account_id"],
			WorkerName: values["worker_name"], WorkerID: values["worker_id"], ContainerApplicationID: values["container_application_id"],
			DurableObjectBinding: values["durable_object_binding"], CompatibilityDate: values["compatibility_date"],
		},
	}
	if f := values["compatibility_flags"]; f != "" {
		for _, s := range strings.Split(f, ",") {
			if s = strings.TrimSpace(s); s != "" {
				cfg.ReadBack.CompatibilityFlags = append(cfg.ReadBack.CompatibilityFlags, s)
			}
		}
	}
	for key, dst := range map[string]*time.Duration{"read_back_interval_ms": &cfg.ReadBack.Interval, "ready_timeout_ms": &cfg.ReadyTimeout} {
		if v := values[key]; v != "" {
			n, err := strconv.ParseUint(v, 10, 32)
			if err != nil || n == 0 {
				return cfg, fmt.Errorf("cloudflare: setting %s: %q is not a positive number of milliseconds", key, v)
			}
			*dst = time.Duration(n) * time.Millisecond
		}
	}
	return cfg, nil
}
