package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/agentsandbox"
	"github.com/sandboxwich/sandboxwich/driver/cloudflare"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/driver/gvisor"
	"github.com/sandboxwich/sandboxwich/driver/kubernetes"
	"github.com/sandboxwich/sandboxwich/internal/dirprovider"
	"github.com/sandboxwich/sandboxwich/store"
)

// providerFactory builds a pool's provider from its settings and the
// plane's installation tag (driver.InstallationTag), which every provider
// that creates objects puts on them. It must refuse unknown settings,
// naming them.
type providerFactory func(pool, installation string, settings map[string]string, log *slog.Logger, egressNet *gvisor.EgressNet) (driver.Provider, error)

// providers maps SANDBOXWICH_STERILE_POOL_PROVIDER values to factories.
var providers = map[string]providerFactory{
	// dry-run simulates every cell: labelled dry_run in every report, never
	// evidence that a runtime existed.
	"dry-run": func(_, _ string, s map[string]string, _ *slog.Logger, _ *gvisor.EgressNet) (driver.Provider, error) {
		latency, err := settingMillis(s, "latency_ms")
		if err != nil {
			return nil, err
		}
		return fake.New(fake.Config{Latency: latency}), unknownSettings(s, "latency_ms")
	},
	// dir simulates every cell as a file in the directory of setting path:
	// labelled dry_run like dry-run, but its cells outlive the process, so
	// a restarted server finds the ones it left. It can delay calls and
	// inject destroy faults (probabilities 0 to 1): the crash checks of the
	// reliability proof run it.
	"dir": func(_, _ string, s map[string]string, _ *slog.Logger, _ *gvisor.EgressNet) (driver.Provider, error) {
		if err := unknownSettings(s, "path", "min_latency_ms", "max_latency_ms", "destroy_uncertain", "lost_destroy"); err != nil {
			return nil, err
		}
		if s["path"] == "" {
			return nil, errors.New("setting path is required")
		}
		minLatency, err1 := settingMillis(s, "min_latency_ms")
		maxLatency, err2 := settingMillis(s, "max_latency_ms")
		uncertain, err3 := settingProbability(s, "destroy_uncertain")
		lost, err4 := settingProbability(s, "lost_destroy")
		return &dirprovider.Provider{Dir: s["path"], MinLatency: minLatency, MaxLatency: maxLatency,
			DestroyUncertain: uncertain, LostDestroy: lost}, errors.Join(err1, err2, err3, err4)
	},
	// gvisor runs each cell as a runsc container on this host.
	// With an egress net (a pool whose key egress allows hosts), each cell
	// runs in a network namespace of its own routed only to the gateway.
	"gvisor": func(pool, installation string, s map[string]string, log *slog.Logger, egressNet *gvisor.EgressNet) (driver.Provider, error) {
		if err := unknownSettings(s, "runsc", "agent_path", "state_dir", "bundle_dir", "rootfs", "network", "platform",
			"memory_limit_bytes", "cpus", "pids_limit", "image", "image_cache_dir", "registry_auth_file",
			"image_max_bytes", "image_cache_bytes", cellDiskKey); err != nil {
			return nil, err
		}
		if err := requireRunsc(); s["runsc"] == "" && err != nil {
			return nil, err
		}
		cfg := gvisor.Config{RunscPath: s["runsc"], AgentPath: s["agent_path"], StateDir: s["state_dir"], BundleDir: s["bundle_dir"],
			RootFS: s["rootfs"], Network: s["network"], Platform: s["platform"], Pool: gvisorPoolName(pool),
			Image: s["image"], ImageCacheDir: s["image_cache_dir"], RegistryAuthFile: s["registry_auth_file"],
			Installation: installation, Logger: log, Egress: egressNet}
		if v := s["memory_limit_bytes"]; v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n <= 0 {
				return nil, fmt.Errorf("setting memory_limit_bytes: %q is not a positive integer", v)
			}
			cfg.MemoryLimitBytes = n
		}
		if v := s[cellDiskKey]; v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n <= 0 {
				return nil, fmt.Errorf("key %s: %q is not a positive number of bytes", cellDiskKey, v)
			}
			cfg.CellDiskBytes = n
		}
		if v := s["image_max_bytes"]; v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n <= 0 {
				return nil, fmt.Errorf("setting image_max_bytes: %q is not a positive integer", v)
			}
			cfg.ImageMaxBytes = n
		}
		// The image cache's budget (CONTRACT §21): 0 is unbounded.
		if v := s["image_cache_bytes"]; v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return nil, fmt.Errorf("setting image_cache_bytes: %q is not a non-negative integer", v)
			}
			cfg.ImageCacheBytes = n
		}
		if v := s["cpus"]; v != "" {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil || n <= 0 {
				return nil, fmt.Errorf("setting cpus: %q is not a positive number", v)
			}
			cfg.CPUs = n
		}
		if v := s["pids_limit"]; v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < gvisor.MinPidsLimit {
				return nil, fmt.Errorf("setting pids_limit: %q is not an integer of at least %d", v, gvisor.MinPidsLimit)
			}
			cfg.PidsLimit = n
		}
		return gvisor.New(cfg)
	},
	// kubernetes runs each cell as a RuntimeClass Pod, verified after
	// admission (settings: SANDBOXWICH_KUBERNETES_*, see driver/kubernetes).
	"kubernetes": func(pool, installation string, s map[string]string, log *slog.Logger, _ *gvisor.EgressNet) (driver.Provider, error) {
		cfg, err := kubernetes.ConfigFromSettings(pool, s)
		if err != nil {
			return nil, err
		}
		cfg.Installation, cfg.Logger = installation, log
		p, err := kubernetes.New(cfg)
		if err != nil {
			return nil, err
		}
		// With agent_image: exec, files and launch through the cell agent
		// over per-cell mTLS; without: exec through pods/exec.
		return p.Driver(), nil
	},
	// agent-sandbox claims warm Pods of kubernetes-sigs/agent-sandbox
	// (settings: SANDBOXWICH_AGENT_SANDBOX_*, see driver/agentsandbox).
	"agent-sandbox": func(pool, installation string, s map[string]string, log *slog.Logger, _ *gvisor.EgressNet) (driver.Provider, error) {
		cfg, err := agentsandbox.ConfigFromSettings(pool, s)
		if err != nil {
			return nil, err
		}
		cfg.Installation, cfg.Logger = installation, log
		return agentsandbox.New(cfg)
	},
	// cloudflare runs each cell as a Cloudflare Container behind the
	// project's bridge Worker, the deployment read back with cloudflare-go
	// (settings: SANDBOXWICH_CLOUDFLARE_*, see driver/cloudflare).
	"cloudflare": newCloudflare,
}

// cloudflareStartup bounds the start-up read-back of a cloudflare pool.
const cloudflareStartup = 30 * time.Second

// newCloudflare builds a cloudflare pool's provider and reads its
// deployment back once: a refused token stops the start; any other
// failure is logged, and the runtime class stays unadmitted until a
// later read-back proves the deployment.
func newCloudflare(pool, installation string, s map[string]string, log *slog.Logger, _ *gvisor.EgressNet) (driver.Provider, error) {
	cfg, err := cloudflare.ConfigFromSettings(pool, s)
	if err != nil {
		return nil, err
	}
	cfg.Installation, cfg.Logger = installation, log
	p, err := cloudflare.New(cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), cloudflareStartup)
	defer cancel()
	d, err := p.VerifyDeployment(ctx)
	switch {
	case errors.Is(err, cloudflare.ErrUnauthorized):
		return nil, err
	case err != nil:
		log.Warn("cloudflare: the deployment is not proven: cells are not admitted until it is (runtime_class_boundary_unverified)",
			"pool", pool, "error", err.Error())
	default:
		log.Info("cloudflare: deployment proven", "pool", pool, "deployment", d.DeploymentID, "version", d.VersionID,
			"image", d.Image, "instance_type", d.InstanceType)
	}
	return p, nil
}

// imageProviders are the providers that report the admitted image digest
// read back, which the plane verifies against a pool's key image (CONTRACT
// §15), each with the setting its factory reads the image from: gvisor
// pulls it, kubernetes makes it the Pod's image and reads the kubelet's
// imageID back. agent-sandbox reads the bound Pod's imageID back, but its
// template, not the plane, names the image: no setting.
var imageProviders = map[string]string{"gvisor": "image", "kubernetes": "image", "agent-sandbox": ""}

// gvisorPoolName maps a pool name to the characters runsc container IDs
// allow.
func gvisorPoolName(pool string) string {
	return strings.Map(func(r rune) rune {
		if r == ':' || r == '/' {
			return '_'
		}
		return r
	}, pool)
}

// requireRunsc fails at once, with the install command, when gVisor's
// runsc is not installed. serve never builds it (an operator's server
// does not build software at start); dev does (devEnsureRunsc).
func requireRunsc() error {
	if gvisor.FindRunsc() == "" {
		return errors.New("runsc (gVisor) is not installed. Build the pinned version (about a minute) with:\n\n  " +
			gvisor.InstallCommand + "\n\nor run `bash scripts/install-runsc.sh` in a checkout; `sandboxwich dev` builds it itself " +
			"(or `sandboxwich dev --provider dry-run` for SIMULATED cells without isolation)")
	}
	return nil
}

// newPoolProvider builds the provider of a pool of st's installation. The
// store comes first: providers name their objects after the installation
// it records, so a database that is not migrated yet fails here.
func newPoolProvider(ctx context.Context, st store.Store, p poolConfig, log *slog.Logger) (driver.Provider, error) {
	installation, err := st.Installation(ctx)
	if err != nil {
		return nil, fmt.Errorf("pool %q: %w", p.Name, err)
	}
	return newProvider(p, driver.InstallationTag(installation), log)
}

// newProvider builds the provider of a pool of the installation whose tag
// is installation.
func newProvider(p poolConfig, installation string, log *slog.Logger) (driver.Provider, error) {
	f, ok := providers[p.Provider]
	if !ok {
		kinds := make([]string, 0, len(providers))
		for k := range providers {
			kinds = append(kinds, k)
		}
		sort.Strings(kinds)
		return nil, fmt.Errorf("pool %q: provider %q is not available in this build (available: %s)",
			p.Name, p.Provider, strings.Join(kinds, ", "))
	}
	settings := p.Settings
	if p.Image != "" {
		key, ok := imageProviders[p.Provider]
		switch {
		case !ok:
			return nil, fmt.Errorf("pool %q: key image: provider %s reports no admitted image (gvisor, kubernetes and agent-sandbox do)", p.Name, p.Provider)
		case key == "":
		case settings[key] != "" && settings[key] != p.Image:
			return nil, fmt.Errorf("pool %q: key image and setting %s name different images", p.Name, key)
		default:
			settings = maps.Clone(settings)
			if settings == nil {
				settings = map[string]string{}
			}
			settings[key] = p.Image
		}
	}
	settings, err := withCellDisk(p, settings)
	if err != nil {
		return nil, err
	}
	if len(p.Images) > 0 && p.Provider == "kubernetes" {
		// The driver then makes every cell of the image its claim names,
		// and has no image of its own (CONTRACT §21).
		settings = maps.Clone(settings)
		if settings == nil {
			settings = map[string]string{}
		}
		settings["image_class"] = "true"
	}
	prov, err := f(p.Name, installation, settings, log, p.egressNet)
	if err != nil {
		return nil, fmt.Errorf("pool %q: provider %s: %w", p.Name, p.Provider, err)
	}
	return prov, nil
}

func settingMillis(s map[string]string, key string) (time.Duration, error) {
	v, ok := s[key]
	if !ok || v == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(v, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("setting %s: %q is not a number of milliseconds", key, v)
	}
	return time.Duration(n) * time.Millisecond, nil
}

// settingProbability reads a probability from 0 to 1 (default 0).
func settingProbability(s map[string]string, key string) (float64, error) {
	v := s[key]
	if v == "" {
		return 0, nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < 0 || f > 1 {
		return 0, fmt.Errorf("setting %s: %q is not a probability from 0 to 1", key, v)
	}
	return f, nil
}

// unknownSettings refuses settings a provider does not read, so that a typo
// fails at start-up instead of being ignored.
func unknownSettings(s map[string]string, known ...string) error {
	for k := range s {
		found := false
		for _, kk := range known {
			found = found || k == kk
		}
		if !found {
			return fmt.Errorf("unknown setting %q (known: %s)", k, strings.Join(known, ", "))
		}
	}
	return nil
}

// startEgressNet starts the plane's egress net (CONTRACT §22) when a
// gvisor pool's key egress allows hosts, or returns nil: its gateway
// listens on every port those pools allow, never connects to this host's
// own addresses, and serves until ctx ends. Its namespaces are named after
// the installation; their records live in the temporary directory, as
// the namespaces do not outlive the host's boot either.
func startEgressNet(ctx context.Context, st store.Store, pools []poolConfig, log *slog.Logger) (*gvisor.EgressNet, error) {
	ports := map[uint16]bool{}
	for _, p := range pools {
		if p.Provider != "gvisor" {
			continue
		}
		for _, e := range p.Egress.Policy.Entries() {
			ports[e.Port] = true
		}
	}
	if len(ports) == 0 {
		return nil, nil
	}
	installation, err := st.Installation(ctx)
	if err != nil {
		return nil, err
	}
	var own []netip.Prefix
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("egress: this host's addresses: %w", err)
	}
	for _, a := range addrs {
		if pfx, err := netip.ParsePrefix(a.String()); err == nil {
			own = append(own, netip.PrefixFrom(pfx.Addr(), pfx.Addr().BitLen()))
		}
	}
	tag := driver.InstallationTag(installation)
	n, err := gvisor.NewEgressNet(ctx, gvisor.EgressConfig{Name: tag, Ports: slices.Sorted(maps.Keys(ports)), Own: own,
		StateDir: filepath.Join(os.TempDir(), fmt.Sprintf("sandboxwich-egress-%d-%s", os.Getuid(), tag)), Logger: log})
	if err != nil {
		return nil, fmt.Errorf("egress: %w", err)
	}
	return n, nil
}
