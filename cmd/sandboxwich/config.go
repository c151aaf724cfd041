package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/driver/gvisor"
	"github.com/sandboxwich/sandboxwich/egress"
	"github.com/sandboxwich/sandboxwich/httpapi"
	"github.com/sandboxwich/sandboxwich/internal/imageref"
	"github.com/sandboxwich/sandboxwich/lease"
)

// config is the server configuration (CONTRACT §11). Each setting is read
// from, in increasing precedence: its default, the config file, the
// environment (SANDBOXWICH_<KEY>), and a flag. Secrets (tokens) have no flag,
// so they never appear in argv; the signing key is only ever read from a
// file.
type config struct {
	Listen               string
	DatabaseURL          string
	AutoMigrate          bool
	SigningKeyFile       string
	TenantTokens         map[string]string // token → tenant
	APIToken             string
	DefaultTenant        string
	OperatorToken        string
	Workers              map[string]sandboxwich.Worker // token → worker
	AllowInsecureNoAuth  bool
	MetricsPublic        bool
	SweepInterval        time.Duration
	PoolLockTTL          time.Duration
	ClockSync            time.Duration
	DisableExpirySweeper bool
	MaxPrepareAhead      time.Duration
	LogLevel             string
	LogFormat            string
	ShutdownTimeout      time.Duration
	TLSCertFile          string
	TLSKeyFile           string
	MaxLeaseSeconds      uint64
	ExecMaxOutputBytes   int
	// ExecMaxOutputCeilingBytes is the largest max_output_bytes an exec
	// may ask for (CONTRACT §25); 0: the plane's default, 16 MiB or
	// ExecMaxOutputBytes when that is more.
	ExecMaxOutputCeilingBytes int
	EventRetention            time.Duration
	// MaxRequestsPerPrincipal caps the requests in flight per token
	// (CONTRACT §25); beyond it the server answers 429.
	MaxRequestsPerPrincipal int
	Pools                   []poolConfig
	Webhooks                []webhookConfig
}

// poolConfig is one pool as configured. Image is the pool's cell image,
// an OCI reference pinned by digest (CONTRACT §15); "" for the provider's
// own root filesystem. CellDiskBytes is the pool key cell_disk_bytes
// (CONTRACT §25): the size of each cell's writable storage, below its
// memory; 0 leaves the provider's default, half the cell's memory.
type poolConfig struct {
	Name            string        `json:"name"`
	Provider        string        `json:"provider"`
	TenantID        string        `json:"tenant_id"`
	Release         lease.Release `json:"release"`
	Target          int           `json:"target"`
	ReadyFloor      int           `json:"ready_floor"`
	MaxProvisioning int           `json:"max_provisioning"`
	ReadyTTLSeconds int           `json:"ready_ttl_seconds"`
	MaxCellSeconds  int           `json:"max_cell_seconds"`
	Image           string        `json:"image"`
	CellDiskBytes   int64         `json:"cell_disk_bytes"`
	// Images makes the pool an image class (CONTRACT §21), with MaxCells,
	// MaxCold, WarmPerImage and WarmIdleSeconds; a fixed pool reads
	// max_cells as its target and max_cold as its max_provisioning.
	Images          []string `json:"images"`
	MaxCells        int      `json:"max_cells"`
	MaxCold         int      `json:"max_cold"`
	WarmPerImage    int      `json:"warm_per_image"`
	WarmIdleSeconds int      `json:"warm_idle_seconds"`
	// Egress is the pool key egress (CONTRACT §22): "none" (the default)
	// or {"allow": ["host[:port]", "*.suffix", …]}.
	Egress   egressConfig      `json:"egress"`
	Settings map[string]string `json:"settings"`
	// egressNet is the plane's egress net, given to a gvisor pool whose
	// egress allows hosts (serve makes it).
	egressNet *gvisor.EgressNet
}

// egressConfig is the pool key egress as written: "none", or an object
// whose allow list is parsed into Policy when the configuration is
// checked. null and an absent key are none.
type egressConfig struct {
	Allow  []string `json:"allow"`
	Policy egress.Policy
}

// UnmarshalJSON reads "none" or {"allow": [...]}; anything else is an
// error naming the key.
func (e *egressConfig) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil {
		if s != "none" {
			return fmt.Errorf(`pool key egress: %q is neither "none" nor {"allow": [...]}`, s)
		}
		*e = egressConfig{}
		return nil
	}
	var v struct {
		Allow *[]string `json:"allow"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil || v.Allow == nil {
		return errors.New(`pool key egress: neither "none" nor {"allow": [...]}`)
	}
	*e = egressConfig{Allow: *v.Allow}
	return nil
}

// setting is one scalar configuration key.
type setting struct {
	key    string // config-file key; env is SANDBOXWICH_ + upper(key)
	def    string
	secret bool // no flag: secrets never come from argv
	usage  string
	apply  func(c *config, v string) error
}

func (s setting) env() string  { return "SANDBOXWICH_" + strings.ToUpper(s.key) }
func (s setting) flag() string { return strings.ReplaceAll(s.key, "_", "-") }

var settings = []setting{
	{key: "listen", def: "127.0.0.1:3217", usage: "address to listen on",
		apply: func(c *config, v string) error { c.Listen = v; return nil }},
	{key: "database_url", def: "sqlite://sandboxwich.db", usage: "sqlite://relative/path, sqlite:///absolute/path or postgres://…",
		apply: func(c *config, v string) error { c.DatabaseURL = v; return nil }},
	{key: "auto_migrate", def: "true", usage: "apply database migrations at start-up",
		apply: func(c *config, v string) error { return parseBool(&c.AutoMigrate, v) }},
	{key: "sterile_cell_signing_key_file", usage: "file holding the HMAC signing key (mode 0600, ≥ 32 bytes)",
		apply: func(c *config, v string) error { c.SigningKeyFile = v; return nil }},
	{key: "tenant_tokens", secret: true, usage: "tenant=token pairs, comma-separated",
		apply: func(c *config, v string) error { return parseTenantTokens(c, v) }},
	{key: "api_token", secret: true, usage: "one shared tenant token, mapped to the default tenant",
		apply: func(c *config, v string) error { c.APIToken = v; return nil }},
	{key: "default_tenant", def: "default", usage: "tenant of the shared token and of insecure mode",
		apply: func(c *config, v string) error { c.DefaultTenant = v; return identifier(v) }},
	{key: "operator_token", secret: true, usage: "value of the x-sandboxwich-operator-token header",
		apply: func(c *config, v string) error { c.OperatorToken = v; return nil }},
	{key: "worker_tokens", secret: true, usage: "<worker_id>@<tenant>:<class>|<class>=sbw_wtok_…, comma-separated",
		apply: func(c *config, v string) error { return parseWorkerTokens(c, v) }},
	{key: "allow_insecure_no_auth", def: "false", usage: "LOCAL ONLY: unauthenticated requests act as the default tenant",
		apply: func(c *config, v string) error { return parseBool(&c.AllowInsecureNoAuth, v) }},
	{key: "metrics_public", def: "false", usage: "serve /metrics without a token",
		apply: func(c *config, v string) error { return parseBool(&c.MetricsPublic, v) }},
	{key: "sweep_interval_ms", def: "1000", usage: "interval of pool reconciliation and expiry sweeps",
		apply: func(c *config, v string) error { return parseMillis(&c.SweepInterval, v) }},
	{key: "pool_lock_ttl_ms", def: "15000", usage: "how long a pool member stays locked by a process that died acting on it",
		apply: func(c *config, v string) error { return parseMillis(&c.PoolLockTTL, v) }},
	{key: "clock_sync_interval_ms", def: "10000", usage: "how often to measure the offset from the database's clock (PostgreSQL), which every expiry follows; 0 trusts this host's clock",
		apply: func(c *config, v string) error { return parseMillis(&c.ClockSync, v) }},
	{key: "disable_expiry_sweeper", def: "false", usage: "do not quarantine expired cells of external workers",
		apply: func(c *config, v string) error { return parseBool(&c.DisableExpirySweeper, v) }},
	{key: "max_prepare_seconds", def: "604800", usage: "how far ahead a worker's prepare may set expires_at (1 s to 10 years)",
		apply: func(c *config, v string) error { return parseSeconds(&c.MaxPrepareAhead, v, 10*365*24*3600) }},
	{key: "log_level", def: "info", usage: "debug, info, warn or error",
		apply: func(c *config, v string) error { c.LogLevel = v; return nil }},
	{key: "log_format", def: "text", usage: "text or json",
		apply: func(c *config, v string) error { c.LogFormat = v; return oneOf(v, "text", "json") }},
	{key: "shutdown_timeout_ms", def: "30000", usage: "how long in-flight requests may finish at shutdown",
		apply: func(c *config, v string) error { return parseMillis(&c.ShutdownTimeout, v) }},
	{key: "tls_cert_file", usage: "serve HTTPS with this certificate (PEM)",
		apply: func(c *config, v string) error { c.TLSCertFile = v; return nil }},
	{key: "tls_key_file", usage: "serve HTTPS with this key (PEM)",
		apply: func(c *config, v string) error { c.TLSKeyFile = v; return nil }},
	{key: "max_lease_seconds", def: strconv.Itoa(sandboxwich.MaxLeaseSeconds), usage: "longest lease a claim gets (1–86400)",
		apply: func(c *config, v string) error { return parseMaxLease(&c.MaxLeaseSeconds, v) }},
	{key: "exec_max_output_bytes", def: strconv.Itoa(sandboxwich.MaxExecOutput), usage: "cap of each of an exec's stdout and stderr (1 to 67108864 bytes)",
		apply: func(c *config, v string) error { return parseExecMaxOutput(&c.ExecMaxOutputBytes, v) }},
	{key: "exec_max_output_ceiling_bytes", usage: "largest max_output_bytes an exec may ask for (default 16777216, or exec_max_output_bytes when larger; up to 67108864)",
		apply: func(c *config, v string) error {
			if v == "" {
				return nil
			}
			return parseExecMaxOutput(&c.ExecMaxOutputCeilingBytes, v)
		}},
	{key: "event_retention_hours", def: "168", usage: "how long the event log keeps events (0 keeps them all, at most 87600)",
		apply: func(c *config, v string) error { return parseRetention(&c.EventRetention, v) }},
	{key: "max_requests_per_principal", def: strconv.Itoa(httpapi.DefaultMaxRequestsPerPrincipal), usage: "requests in flight per token; beyond, 429 too_many_requests (1 to 1048576)",
		apply: func(c *config, v string) error { return parseMaxRequestsPerPrincipal(&c.MaxRequestsPerPrincipal, v) }},
}

// maxRequestsPerPrincipalLimit bounds SANDBOXWICH_MAX_REQUESTS_PER_PRINCIPAL.
const maxRequestsPerPrincipalLimit = 1 << 20

// parseMaxRequestsPerPrincipal reads SANDBOXWICH_MAX_REQUESTS_PER_PRINCIPAL
// (CONTRACT §25).
func parseMaxRequestsPerPrincipal(dst *int, v string) error {
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > maxRequestsPerPrincipalLimit {
		return fmt.Errorf("%q is not a number of requests from 1 to %d", v, maxRequestsPerPrincipalLimit)
	}
	*dst = n
	return nil
}

// parseRetention reads SANDBOXWICH_EVENT_RETENTION_HOURS (CONTRACT §17).
func parseRetention(dst *time.Duration, v string) error {
	n, err := strconv.ParseUint(v, 10, 32)
	if err != nil || n > 87600 {
		return fmt.Errorf("%q is not a number of hours from 0 to 87600", v)
	}
	*dst = time.Duration(n) * time.Hour
	return nil
}

// parseExecMaxOutput reads SANDBOXWICH_EXEC_MAX_OUTPUT_BYTES (CONTRACT §17).
func parseExecMaxOutput(dst *int, v string) error {
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > sandboxwich.MaxExecOutputLimit {
		return fmt.Errorf("%q is not a number of bytes from 1 to %d", v, sandboxwich.MaxExecOutputLimit)
	}
	*dst = n
	return nil
}

// parseMaxLease reads SANDBOXWICH_MAX_LEASE_SECONDS (CONTRACT §14).
func parseMaxLease(dst *uint64, v string) error {
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil || n < sandboxwich.MinLeaseSeconds || n > sandboxwich.MaxLeaseSecondsLimit {
		return fmt.Errorf("%q is not a number of seconds from %d to %d", v, sandboxwich.MinLeaseSeconds, sandboxwich.MaxLeaseSecondsLimit)
	}
	*dst = n
	return nil
}

// poolEnv lists the single pool's environment keys (SANDBOXWICH_STERILE_POOL_*).
var poolEnv = []string{"NAME", "PROVIDER", "TARGET", "READY_FLOOR", "MAX_PROVISIONING", "READY_TTL_SECONDS",
	"MAX_CELL_SECONDS", "TENANT_ID", "RELEASE_SET_ID", "RUNTIME_CLASS", "POLICY_DIGEST", "RELEASE_SIGNATURE", "IMAGE",
	"CELL_DISK_BYTES", "IMAGES", "MAX_CELLS", "MAX_COLD", "WARM_PER_IMAGE", "WARM_IDLE_SECONDS", "EGRESS"}

// migrateSettings are the settings migrate has flags for: the others only
// matter to serve (their environment and file values are still checked).
var migrateSettings = map[string]bool{"database_url": true}

// loadConfig reads the configuration for a command from args, the
// environment and the config file named by --config or SANDBOXWICH_CONFIG.
func loadConfig(e env, name string, args []string) (*config, error) {
	fs := newFlags(e, name)
	configFile := fs.String("config", e.getenv("SANDBOXWICH_CONFIG"), "optional JSON config file")
	flagVals := map[string]*string{}
	for _, s := range settings {
		if !s.secret && (name != "migrate" || migrateSettings[s.key]) {
			flagVals[s.key] = fs.String(s.flag(), "", s.usage+" (env "+s.env()+")")
		}
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	file, filePools, fileHooks, err := readConfigFile(*configFile)
	if err != nil {
		return nil, err
	}
	c := &config{}
	for _, s := range settings {
		v, from := s.def, "default"
		if fv, ok := file[s.key]; ok {
			v, from = fv, "config file key "+s.key
		}
		if ev := e.getenv(s.env()); ev != "" {
			v, from = ev, s.env()
		}
		if set[s.flag()] {
			v, from = *flagVals[s.key], "--"+s.flag()
		}
		if err := s.apply(c, strings.TrimSpace(v)); err != nil {
			return nil, fmt.Errorf("invalid %s: %w", from, err)
		}
	}
	c.Pools = filePools
	c.Webhooks = fileHooks
	envPool, err := poolFromEnv(e, c.DefaultTenant)
	if err != nil {
		return nil, err
	}
	if envPool != nil {
		c.Pools = append(c.Pools, *envPool)
	}
	return c, c.check()
}

func (c *config) check() error {
	if c.ExecMaxOutputCeilingBytes != 0 && c.ExecMaxOutputCeilingBytes < c.ExecMaxOutputBytes {
		return fmt.Errorf("invalid SANDBOXWICH_EXEC_MAX_OUTPUT_CEILING_BYTES: %d is below SANDBOXWICH_EXEC_MAX_OUTPUT_BYTES (%d)",
			c.ExecMaxOutputCeilingBytes, c.ExecMaxOutputBytes)
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		return errors.New("invalid TLS settings: SANDBOXWICH_TLS_CERT_FILE and SANDBOXWICH_TLS_KEY_FILE go together")
	}
	if c.APIToken != "" {
		if _, dup := c.TenantTokens[c.APIToken]; dup {
			return errors.New("invalid SANDBOXWICH_API_TOKEN: it is also a tenant token")
		}
	}
	seen := map[string]bool{}
	for i := range c.Pools {
		p := &c.Pools[i]
		// A provider's image setting (SANDBOXWICH_GVISOR_IMAGE,
		// SANDBOXWICH_KUBERNETES_IMAGE) is the pool's image all the same.
		if key := imageProviders[p.Provider]; key != "" && p.Image == "" && p.Settings[key] != "" {
			p.Image = p.Settings[key]
		}
		if seen[p.Name] {
			return fmt.Errorf("invalid pools: name %q is used twice", p.Name)
		}
		seen[p.Name] = true
		if p.Image != "" {
			if _, err := imageref.Parse(p.Image); err != nil {
				return &poolImageError{Pool: p.Name, Err: err}
			}
		}
		if err := checkCellDisk(p); err != nil {
			return err
		}
		pol, err := egress.Parse(p.Egress.Allow)
		if err != nil {
			return fmt.Errorf("invalid pool %q: key egress: %w", p.Name, err)
		}
		p.Egress.Policy = pol
		if err := p.checkCapacity(); err != nil {
			return fmt.Errorf("invalid pool %q: %w", p.Name, err)
		}
	}
	return nil
}

// checkCapacity reads max_cells and max_cold (CONTRACT §21): an image
// class's bounds, which refuses target, ready_floor and max_provisioning;
// a fixed pool's target and max_provisioning by other names.
func (p *poolConfig) checkCapacity() error {
	if len(p.Images) > 0 {
		switch {
		case p.Target != 0 || p.ReadyFloor != 0 || p.MaxProvisioning != 0:
			return errors.New("an image class (key images) has max_cells and max_cold, not target, ready_floor or max_provisioning")
		case p.MaxCells < 1:
			return errors.New("key max_cells must be at least 1 for an image class")
		case p.MaxCold < 0 || p.MaxCold > p.MaxCells:
			return errors.New("key max_cold must be between 1 and max_cells (0: max_cells)")
		}
		return nil
	}
	switch {
	case p.WarmPerImage != 0 || p.WarmIdleSeconds != 0:
		return errors.New("keys warm_per_image and warm_idle_seconds belong to an image class (key images)")
	case p.MaxCells != 0 && p.Target != 0 && p.MaxCells != p.Target:
		return errors.New("keys max_cells and target differ: a fixed pool reads max_cells as its target")
	case p.MaxCold != 0 && p.MaxProvisioning != 0 && p.MaxCold != p.MaxProvisioning:
		return errors.New("keys max_cold and max_provisioning differ: a fixed pool reads max_cold as its max_provisioning")
	}
	if p.MaxCells != 0 {
		p.Target = p.MaxCells
	}
	if p.MaxCold != 0 {
		p.MaxProvisioning = p.MaxCold
	}
	return nil
}

// poolImageError is a pool whose image is not pinned by digest, or
// malformed (CONTRACT §15): start-up stops, naming the pool and the key.
type poolImageError struct {
	Pool string
	Err  error // an *imageref.Error
}

func (e *poolImageError) Error() string {
	return fmt.Sprintf("invalid pool %q: key image (SANDBOXWICH_STERILE_POOL_IMAGE for the environment's pool): %v", e.Pool, e.Err)
}

func (e *poolImageError) Unwrap() error { return e.Err }

// authConfigured reports whether any token mode is configured.
func (c *config) authConfigured() bool {
	return len(c.TenantTokens) > 0 || c.APIToken != "" || len(c.Workers) > 0 || c.AllowInsecureNoAuth
}

// webhookConfig is one entry of the config file's webhooks (CONTRACT §16).
type webhookConfig struct {
	TenantID   string   `json:"tenant_id"`
	URL        string   `json:"url"`
	SecretFile string   `json:"secret_file"`
	Types      []string `json:"types"`
}

func readConfigFile(path string) (map[string]string, []poolConfig, []webhookConfig, error) {
	if path == "" {
		return nil, nil, nil, nil
	}
	out, pools, err := readConfigKeys(path)
	if err != nil {
		return nil, nil, nil, err
	}
	b, _ := os.ReadFile(path) // read by readConfigKeys
	var raw map[string]json.RawMessage
	_ = json.Unmarshal(b, &raw)
	var hooks []webhookConfig
	if h, ok := raw["webhooks"]; ok {
		dec := json.NewDecoder(bytes.NewReader(h))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&hooks); err != nil {
			return nil, nil, nil, fmt.Errorf("config file %s: webhooks: %w", path, err)
		}
	}
	return out, pools, hooks, nil
}

func readConfigKeys(path string) (map[string]string, []poolConfig, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("config file: %w", err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, nil, fmt.Errorf("config file %s: %w", path, err)
	}
	known := map[string]bool{"pools": true, "webhooks": true}
	for _, s := range settings {
		known[s.key] = true
	}
	out := map[string]string{}
	for k, v := range raw {
		if !known[k] {
			return nil, nil, fmt.Errorf("config file %s: unknown key %q", path, k)
		}
		if k == "pools" || k == "webhooks" {
			continue
		}
		var s any
		if err := json.Unmarshal(v, &s); err != nil {
			return nil, nil, fmt.Errorf("config file %s: key %q: %w", path, k, err)
		}
		switch s := s.(type) {
		case string:
			out[k] = s
		case bool, float64:
			out[k] = string(v)
		default:
			return nil, nil, fmt.Errorf("config file %s: key %q must be a string, number or boolean", path, k)
		}
	}
	var pools []poolConfig
	if p, ok := raw["pools"]; ok {
		dec := json.NewDecoder(bytes.NewReader(p))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&pools); err != nil {
			return nil, nil, fmt.Errorf("config file %s: pools: %w", path, err)
		}
	}
	return out, pools, nil
}

// poolFromEnv reads the single pool of SANDBOXWICH_STERILE_POOL_*; nil when
// none of those variables is set.
func poolFromEnv(e env, defaultTenant string) (*poolConfig, error) {
	v := map[string]string{}
	for _, k := range poolEnv {
		if s := strings.TrimSpace(e.getenv("SANDBOXWICH_STERILE_POOL_" + k)); s != "" {
			v[k] = s
		}
	}
	if len(v) == 0 {
		return nil, nil
	}
	p := &poolConfig{
		Name:     or(v["NAME"], "default"),
		Provider: or(v["PROVIDER"], "gvisor"),
		TenantID: or(v["TENANT_ID"], defaultTenant),
		Release: lease.Release{
			ReleaseSetID: v["RELEASE_SET_ID"],
			RuntimeClass: lease.RuntimeClass(v["RUNTIME_CLASS"]),
			PolicyDigest: v["POLICY_DIGEST"],
			Signature:    v["RELEASE_SIGNATURE"],
		},
		Image:    v["IMAGE"],
		Settings: map[string]string{},
	}
	if s := v["IMAGES"]; s != "" {
		for _, im := range strings.Split(s, ",") {
			p.Images = append(p.Images, strings.TrimSpace(im))
		}
	}
	if s := v["EGRESS"]; s != "" && s != "none" {
		for _, h := range strings.Split(s, ",") {
			p.Egress.Allow = append(p.Egress.Allow, strings.TrimSpace(h))
		}
	}
	if s := v["CELL_DISK_BYTES"]; s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("invalid SANDBOXWICH_STERILE_POOL_CELL_DISK_BYTES (pool key cell_disk_bytes): %q is not a positive number of bytes", s)
		}
		p.CellDiskBytes = n
	}
	// A pool sized by max_cells (an image class, or a fixed pool by that
	// name) needs no target.
	targetDefault := ""
	if v["MAX_CELLS"] != "" {
		targetDefault = "0"
	}
	for _, f := range []struct {
		key string
		dst *int
		def string
	}{{"TARGET", &p.Target, targetDefault}, {"READY_FLOOR", &p.ReadyFloor, "0"},
		{"MAX_PROVISIONING", &p.MaxProvisioning, "0"}, {"READY_TTL_SECONDS", &p.ReadyTTLSeconds, "0"},
		{"MAX_CELL_SECONDS", &p.MaxCellSeconds, "0"}, {"MAX_CELLS", &p.MaxCells, "0"}, {"MAX_COLD", &p.MaxCold, "0"},
		{"WARM_PER_IMAGE", &p.WarmPerImage, "0"}, {"WARM_IDLE_SECONDS", &p.WarmIdleSeconds, "0"}} {
		s := or(v[f.key], f.def)
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("invalid SANDBOXWICH_STERILE_POOL_%s: %q is not a non-negative integer", f.key, s)
		}
		*f.dst = n
	}
	// Provider settings: SANDBOXWICH_<PROVIDER>_<KEY>, e.g. SANDBOXWICH_GVISOR_ROOTFS.
	prefix := "SANDBOXWICH_" + strings.ToUpper(strings.ReplaceAll(p.Provider, "-", "_")) + "_"
	for _, kv := range environ(e) {
		k, val, _ := strings.Cut(kv, "=")
		if rest, ok := strings.CutPrefix(k, prefix); ok && rest != "" {
			p.Settings[strings.ToLower(rest)] = val
		}
	}
	return p, nil
}

func environ(e env) []string {
	if e.environ == nil {
		return nil
	}
	return e.environ()
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

func parseBool(dst *bool, v string) error {
	b, err := strconv.ParseBool(v)
	if err != nil {
		return fmt.Errorf("%q is not a boolean (true or false)", v)
	}
	*dst = b
	return nil
}

func parseMillis(dst *time.Duration, v string) error {
	n, err := strconv.ParseUint(v, 10, 32)
	if err != nil {
		return fmt.Errorf("%q is not a number of milliseconds", v)
	}
	*dst = time.Duration(n) * time.Millisecond
	return nil
}

// parseSeconds reads a whole number of seconds from 1 to max.
func parseSeconds(dst *time.Duration, v string, max uint64) error {
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil || n < 1 || n > max {
		return fmt.Errorf("%q is not a number of seconds from 1 to %d", v, max)
	}
	*dst = time.Duration(n) * time.Second
	return nil
}

func identifier(v string) error {
	if !lease.ValidIdentifier(v) {
		return fmt.Errorf("%q is not an identifier (1–256 of [A-Za-z0-9-_.:/])", v)
	}
	return nil
}

func oneOf(v string, allowed ...string) error {
	for _, a := range allowed {
		if v == a {
			return nil
		}
	}
	return fmt.Errorf("%q is not one of %s", v, strings.Join(allowed, ", "))
}

// parseTenantTokens reads "acme=abc123,globex=def456". Messages never
// repeat a token.
func parseTenantTokens(c *config, v string) error {
	c.TenantTokens = map[string]string{}
	for i, pair := range splitList(v) {
		tenant, token, ok := strings.Cut(pair, "=")
		tenant, token = strings.TrimSpace(tenant), strings.TrimSpace(token)
		switch {
		case !ok || token == "":
			return fmt.Errorf("entry %d is not tenant=token", i+1)
		case identifier(tenant) != nil:
			return fmt.Errorf("entry %d: tenant is not an identifier", i+1)
		}
		if _, dup := c.TenantTokens[token]; dup {
			return fmt.Errorf("entry %d: token is used twice", i+1)
		}
		c.TenantTokens[token] = tenant
	}
	return nil
}

// parseWorkerTokens reads "<worker_id>@<tenant>:<class>|<class>=sbw_wtok_…".
func parseWorkerTokens(c *config, v string) error {
	c.Workers = map[string]sandboxwich.Worker{}
	ids := map[uuid.UUID]bool{}
	for i, entry := range splitList(v) {
		spec, token, ok := strings.Cut(entry, "=")
		token = strings.TrimSpace(token)
		if !ok || !strings.HasPrefix(token, "sbw_wtok_") || len(token) <= len("sbw_wtok_") {
			return fmt.Errorf("entry %d is not <worker_id>@<tenant>:<classes>=sbw_wtok_…", i+1)
		}
		idPart, rest, ok1 := strings.Cut(strings.TrimSpace(spec), "@")
		tenant, classes, ok2 := strings.Cut(rest, ":")
		id, err := uuid.Parse(idPart)
		if !ok1 || !ok2 || err != nil {
			return fmt.Errorf("entry %d: worker spec must be <uuid>@<tenant>:<class>|<class>", i+1)
		}
		if identifier(tenant) != nil {
			return fmt.Errorf("entry %d: tenant is not an identifier", i+1)
		}
		w := sandboxwich.Worker{ID: id, TenantID: tenant}
		for _, cl := range strings.Split(classes, "|") {
			rc := lease.RuntimeClass(strings.TrimSpace(cl))
			if !rc.Valid() {
				return fmt.Errorf("entry %d: runtime class %q is not kata_microvm or gvisor_lower_risk", i+1, rc)
			}
			w.RuntimeClasses = append(w.RuntimeClasses, rc)
		}
		if ids[id] {
			return fmt.Errorf("entry %d: worker %s is configured twice", i+1, id)
		}
		if _, dup := c.Workers[token]; dup {
			return fmt.Errorf("entry %d: token is used twice", i+1)
		}
		ids[id] = true
		c.Workers[token] = w
	}
	return nil
}

func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
