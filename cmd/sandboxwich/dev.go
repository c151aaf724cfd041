package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/driver/gvisor"
	"github.com/sandboxwich/sandboxwich/egress"
	"github.com/sandboxwich/sandboxwich/lease"
)

// devRelease is the release the dev server signs for its pool.
const devReleaseSetID = "dev-release"

// devDrainTimeout bounds how long dev, at Ctrl-C, waits for the provider to
// prove every cell gone (after the HTTP grace of devShutdownGrace).
const (
	devShutdownGrace = 10 * time.Second
	devDrainTimeout  = 30 * time.Second
)

// dev starts a server for local use: embedded SQLite, a generated signing
// key and tokens (files of mode 0600 in --dir), and a pool of two gVisor
// cells, then prints commands to paste. At Ctrl-C it ends every cell it
// made, live leases included, with proof.
func dev(ctx context.Context, e env, args []string) error {
	flags := newFlags(e, "dev")
	dir := flags.String("dir", ".sandboxwich-dev", "directory for the database, key and token files (created 0700)")
	listen := flags.String("listen", "127.0.0.1:3217", "address to listen on")
	provider := flags.String("provider", "gvisor", "pool provider: gvisor, or dry-run (SIMULATED cells, no isolation)")
	target := flags.Int("target", 2, "number of warm cells")
	stateDir := flags.String("state-dir", "", "runsc's state root for the gVisor pool (default <dir>/runsc-state)")
	image := flags.String("image", "", "the gVisor pool's image, an OCI reference pinned by digest, pulled into <dir>/images (default: no image, the host's /usr)")
	images := flags.String("images", "", "also an image class, pool dev-images: comma-separated repositories (host/repo or host/prefix/*) whose images, pinned by digest, claims may name; cells made on demand")
	maxCells := flags.Int("max-cells", 4, "the image class's live cells, all images together (with --images)")
	allow := flags.String("egress", "", "the dev pool's egress allow-list (pool key egress): comma-separated host[:port] entries its cells may reach through the egress gateway (default none: loopback only; gvisor only)")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if *provider == "gvisor" {
		if err := devEnsureRunsc(ctx, e); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(*dir, 0o700); err != nil {
		return err
	}
	abs, err := filepath.Abs(*dir)
	if err != nil {
		return err
	}
	keyFile := filepath.Join(abs, "signing.key")
	if err := attest.GenerateKeyFile(keyFile); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	keys, err := attest.LoadKeyFile(keyFile)
	if err != nil {
		return err
	}
	tenantToken, err := secretFile(filepath.Join(abs, "tenant-token"), "sbw_dev_")
	if err != nil {
		return err
	}
	operatorToken, err := secretFile(filepath.Join(abs, "operator-token"), "sbw_op_")
	if err != nil {
		return err
	}
	workerToken, err := secretFile(filepath.Join(abs, "worker-token"), "sbw_wtok_")
	if err != nil {
		return err
	}
	workerID := uuid.NewSHA1(uuid.NameSpaceURL, []byte("sandboxwich-dev-worker:"+abs))

	rel := devRelease(keys)

	settings := map[string]string{}
	if *provider == "gvisor" { // runsc's state and bundles live in --dir too
		settings["state_dir"] = filepath.Join(abs, "runsc-state")
		if *stateDir != "" {
			settings["state_dir"] = *stateDir
		}
		settings["bundle_dir"] = filepath.Join(abs, "runsc-bundles")
		if *image != "" || *images != "" {
			settings["image_cache_dir"] = filepath.Join(abs, "images")
		}
	}
	// dev takes the maximum lease from the environment, as serve does, so
	// that long work and renewal can be tried with a short one.
	maxLease := uint64(sandboxwich.MaxLeaseSeconds)
	if v := e.getenv("SANDBOXWICH_MAX_LEASE_SECONDS"); v != "" {
		if err := parseMaxLease(&maxLease, v); err != nil {
			return fmt.Errorf("invalid SANDBOXWICH_MAX_LEASE_SECONDS: %w", err)
		}
	}
	c := &config{
		Listen:         *listen,
		DatabaseURL:    "sqlite://" + filepath.Join(abs, "sandboxwich.db"),
		AutoMigrate:    true,
		SigningKeyFile: keyFile,
		TenantTokens:   map[string]string{tenantToken: "dev"},
		DefaultTenant:  "dev",
		OperatorToken:  operatorToken,
		Workers: map[string]sandboxwich.Worker{workerToken: {ID: workerID, TenantID: "dev",
			RuntimeClasses: []lease.RuntimeClass{lease.GVisorLowerRisk, lease.KataMicroVM}}},
		SweepInterval:      time.Second,
		ClockSync:          sandboxwich.DefaultClockSyncInterval,
		LogLevel:           "info",
		LogFormat:          "text",
		ShutdownTimeout:    devShutdownGrace,
		MaxLeaseSeconds:    maxLease,
		ExecMaxOutputBytes: sandboxwich.MaxExecOutput,
		EventRetention:     sandboxwich.DefaultEventRetention,
		MaxPrepareAhead:    sandboxwich.DefaultMaxPrepareAhead,
		Pools: []poolConfig{{Name: "dev", Provider: *provider, TenantID: "dev", Release: rel, Target: *target,
			Image: *image, Settings: settings}},
	}
	if *allow != "" {
		pol, err := egress.Parse(strings.Split(*allow, ","))
		if err != nil {
			return fmt.Errorf("--egress: %w", err)
		}
		c.Pools[0].Egress = egressConfig{Allow: strings.Split(*allow, ","), Policy: pol}
	}
	if *images != "" {
		class := poolConfig{Name: "dev-images", Provider: *provider, TenantID: "dev", Release: rel, MaxCells: *maxCells,
			Settings: maps.Clone(settings)}
		for _, p := range strings.Split(*images, ",") {
			class.Images = append(class.Images, strings.TrimSpace(p))
		}
		if err := class.checkCapacity(); err != nil {
			return fmt.Errorf("--images: %w", err)
		}
		c.Pools = append(c.Pools, class)
	}
	log, err := newLogger(e.stderr, c.LogLevel, c.LogFormat)
	if err != nil {
		return err
	}
	s, err := build(ctx, c, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		s.store.Close()
		return err
	}
	url := "http://" + ln.Addr().String()
	inspectConfig, err := writeInspectConfig(abs, url, rel)
	if err != nil {
		ln.Close()
		s.store.Close()
		return err
	}
	printDevHelp(e, url, abs, *provider, rel, workerID, inspectConfig)
	s.drainTimeout = devDrainTimeout // Ctrl-C leaves no sandbox running, leased or not
	s.drained = func() {
		if *provider == "gvisor" && *stateDir == "" {
			// No container is left in dev's own root: unmount what runsc
			// pins there, so that removing --dir works. A root given by
			// --state-dir may be shared, and is left alone.
			_ = gvisor.RemoveStateDir(settings["state_dir"])
		}
		if s.egress != nil { // no cell is left on it either
			if err := s.egress.Remove(context.WithoutCancel(ctx)); err != nil {
				log.Warn("removing the egress net", "error", err)
			}
		}
	}
	return s.run(ctx, ln)
}

// devInstallRunsc builds the pinned runsc into its cache (a variable so
// tests need not build gVisor).
var devInstallRunsc = gvisor.InstallRunsc

// devEnsureRunsc makes runsc available to dev's gVisor pool: when none is
// installed (gvisor.FindRunsc), it builds the pinned version into the
// cache the driver looks in first, saying so on stderr, so that dev alone
// sets a fresh machine up. serve never builds: it refuses (requireRunsc).
func devEnsureRunsc(ctx context.Context, e env) error {
	if gvisor.FindRunsc() != "" {
		return nil
	}
	if _, err := devInstallRunsc(ctx, e.stderr); err != nil {
		return fmt.Errorf("runsc (gVisor) is not installed and building it failed: %w\n\n"+
			"(or run `sandboxwich dev --provider dry-run` for SIMULATED cells without isolation)", err)
	}
	return nil
}

// inspectConfigName is the file, in dev's directory, of the Inspect AI
// provider's configuration.
const inspectConfigName = "inspect-sandboxwich.json"

// inspectConfig is the configuration the Inspect AI provider reads
// (SandboxwichConfig in sdks/python/src/sandboxwich/inspect/_provider.py):
// the server's URL, the file holding the tenant token (never the token
// itself) and the pool's signed release.
type inspectConfig struct {
	URL       string        `json:"url"`
	TokenFile string        `json:"token_file"`
	Release   lease.Release `json:"release"`
}

// writeInspectConfig writes, into dir, the Inspect AI provider's
// configuration for the dev server at url, with absolute paths so it works
// from any directory, and returns its path.
func writeInspectConfig(dir, url string, rel lease.Release) (string, error) {
	b, err := json.MarshalIndent(inspectConfig{URL: url, TokenFile: filepath.Join(dir, "tenant-token"), Release: rel}, "", "  ")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, inspectConfigName)
	if err := os.WriteFile(path, append(b, '\n'), 0o600); err != nil {
		return "", fmt.Errorf("the Inspect provider's config: %w", err)
	}
	return path, nil
}

// devRelease is the release a dev server signs with keys for its pool.
func devRelease(keys *attest.Keyring) lease.Release {
	sum := sha256.Sum256([]byte("sandboxwich dev policy"))
	rel := lease.Release{ReleaseSetID: devReleaseSetID, RuntimeClass: lease.GVisorLowerRisk, PolicyDigest: hex.EncodeToString(sum[:])}
	rel.Signature = keys.SignRelease(rel)
	return rel
}

// secretFile returns the token stored at path, creating it (mode 0600)
// with a new random token when absent.
func secretFile(path, prefix string) (string, error) {
	if b, err := os.ReadFile(path); err == nil {
		return strings.TrimSpace(string(b)), nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	var r [24]byte
	if _, err := rand.Read(r[:]); err != nil {
		return "", err
	}
	tok := prefix + hex.EncodeToString(r[:])
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", err
	}
	if _, err := f.WriteString(tok + "\n"); err != nil {
		f.Close()
		return "", err
	}
	return tok, f.Close()
}

// printDevHelp prints the banner: commands that work exactly as printed,
// from the repository root, in a shell of their own.
func printDevHelp(e env, url, dir, provider string, rel lease.Release, workerID uuid.UUID, inspectConfig string) {
	w := e.stdout
	fmt.Fprintf(w, "\nsandboxwich dev: serving %s (pool \"dev\", provider %s)\n", url, provider)
	if provider == "dry-run" {
		fmt.Fprintln(w, "WARNING: dry-run cells are SIMULATED: no sandbox exists and exec is unsupported.")
	}
	fmt.Fprintf(w, "Ctrl-C ends every cell, live leases included, and proves each gone (within %s).\n",
		devShutdownGrace+devDrainTimeout)
	binding := "--org org-1 --workspace ws-1 --thread th-1 --session s-1"
	fmt.Fprintf(w, `
In another shell, from the repository root:

  go build -o %[2]s/sandboxwich ./cmd/sandboxwich
  cd %[2]s
  export SANDBOXWICH_URL=%[1]s
  export SANDBOXWICH_TOKEN="$(cat tenant-token)"

  ./sandboxwich claim --json --attestation-file lease.att \
    --release-set-id %[3]s --runtime-class %[4]s \
    --policy-digest %[5]s \
    --release-signature %[6]s \
    %[7]s > claim.json
  LEASE=$(sed -n 's/.*"lease_id": *"\([^"]*\)".*/\1/p' claim.json)
`, url, dir, rel.ReleaseSetID, rel.RuntimeClass, rel.PolicyDigest, rel.Signature, binding)
	if provider != "dry-run" {
		fmt.Fprintf(w, `  P="--lease-id $LEASE --attestation-file lease.att %s"
  ./sandboxwich exec $P -- sh -c 'uname -a; sleep 1; echo streamed as it comes'
  echo hello | ./sandboxwich cp $P - cell:/home/cell/hello.txt
  ./sandboxwich cp $P cell:/home/cell/hello.txt -
  ./sandboxwich launch $P --wait -- sh -c 'echo a resident workload; sleep 1'
`, binding)
	}
	fmt.Fprintf(w, `  ./sandboxwich release --lease-id "$LEASE" --attestation-file lease.att %[1]s --wait
  rm lease.att claim.json
  SANDBOXWICH_OPERATOR_TOKEN="$(cat operator-token)" ./sandboxwich pools

Worker %[2]s token: %[3]s/worker-token
`, binding, workerID, dir)
	fmt.Fprintf(w, "Inspect AI provider config (URL, token file, release): %[1]s\n"+
		"(use it from any directory: inspect eval TASK --sandbox sandboxwich:%[1]s)\n", inspectConfig)
}
