package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/lease"
)

func init() {
	register(command{name: "dev", summary: "run a local server with zero configuration (SQLite, generated key and tokens, a gVisor pool)", run: dev})
}

// devRelease is the release the dev server signs for its pool.
const devReleaseSetID = "dev-release"

// dev starts a server for local use: embedded SQLite, a generated signing
// key and tokens (files of mode 0600 in --dir), and a pool of two gVisor
// cells, then prints commands to paste.
func dev(ctx context.Context, e env, args []string) error {
	flags := newFlags(e, "dev")
	dir := flags.String("dir", ".sandboxwich-dev", "directory for the database, key and token files (created 0700)")
	listen := flags.String("listen", "127.0.0.1:3217", "address to listen on")
	provider := flags.String("provider", "gvisor", "pool provider: gvisor, or dry-run (SIMULATED cells, no isolation)")
	target := flags.Int("target", 2, "number of warm cells")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if *provider == "gvisor" {
		if err := requireRunsc(); err != nil {
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
		SweepInterval:   time.Second,
		LogLevel:        "info",
		LogFormat:       "text",
		ShutdownTimeout: 10 * time.Second,
		Pools: []poolConfig{{Name: "dev", Provider: *provider, TenantID: "dev", Release: rel, Target: *target,
			ReadyTTLSeconds: 600, Settings: map[string]string{}}},
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
	printDevHelp(e, "http://"+ln.Addr().String(), abs, *provider, rel, workerID)
	s.drainOnExit = true // Ctrl-C leaves no sandbox running
	return s.run(ctx, ln)
}

// devRelease is the release a dev server signs with keys for its pool.
func devRelease(keys *attest.Keyring) lease.Release {
	sum := sha256.Sum256([]byte("sandboxwich dev policy"))
	rel := lease.Release{ReleaseSetID: devReleaseSetID, RuntimeClass: lease.GVisorLowerRisk, PolicyDigest: hex.EncodeToString(sum[:])}
	rel.Signature = keys.SignRelease(rel.ReleaseSetID, string(rel.RuntimeClass), rel.PolicyDigest)
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

func printDevHelp(e env, url, dir, provider string, rel lease.Release, workerID uuid.UUID) {
	w := e.stdout
	fmt.Fprintf(w, "\nsandboxwich dev: serving %s (pool \"dev\", provider %s)\n", url, provider)
	if provider == "dry-run" {
		fmt.Fprintln(w, "WARNING: dry-run cells are SIMULATED: no sandbox exists and exec is unsupported.")
	}
	fmt.Fprintf(w, `
In another shell:

  export SANDBOXWICH_URL=%s
  export SANDBOXWICH_TOKEN="$(cat %s/tenant-token)"

  sandboxwich claim --attestation-file lease.att \
    --release-set-id %s --runtime-class %s \
    --policy-digest %s \
    --release-signature %s \
    --org org-1 --workspace ws-1 --thread th-1 --session s-1

  LEASE=<lease_id printed by claim>
  sandboxwich exec --lease-id "$LEASE" --attestation-file lease.att \
    --org org-1 --workspace ws-1 --thread th-1 --session s-1 -- uname -a
  sandboxwich release --lease-id "$LEASE" --attestation-file lease.att \
    --org org-1 --workspace ws-1 --thread th-1 --session s-1 --wait

Operator view:  SANDBOXWICH_OPERATOR_TOKEN="$(cat %s/operator-token)" sandboxwich pools
Worker %s token: %s/worker-token
`, url, dir, rel.ReleaseSetID, rel.RuntimeClass, rel.PolicyDigest, rel.Signature, dir, workerID, dir)
}
