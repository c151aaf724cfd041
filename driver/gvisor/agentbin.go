package gvisor

import (
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"time"
)

// The cell agent's binary (see "The cell agent" in the package
// documentation).
const (
	// agentBinaryName is the file looked for next to the running
	// executable, and the name of the cached copy.
	agentBinaryName = "sandboxwich-agent"
	// agentModule and agentPackage are where the agent's source lives.
	agentModule  = "github.com/sandboxwich/sandboxwich"
	agentPackage = agentModule + "/cmd/sandboxwich-agent"
	// agentBuildTimeout bounds building the agent (a cold build compiles
	// part of the standard library without cgo).
	agentBuildTimeout = 10 * time.Minute
	// agentLdflags strip the symbol table and DWARF: every cell maps the
	// agent and the agent hashes itself at start (through the sentry
	// under gVisor), so the file's size is paid per cell; stack traces
	// keep their function names and lines (pclntab is not stripped).
	agentLdflags = "-s -w"
)

// agentBuildHint tells how to build the static cell agent by hand.
const agentBuildHint = "`CGO_ENABLED=0 go build -trimpath -ldflags='" + agentLdflags + "' -o " + agentBinaryName + " ./cmd/sandboxwich-agent` in a checkout " +
	"(or `CGO_ENABLED=0 go install -trimpath -ldflags='" + agentLdflags + "' " + agentPackage + "@<version>`), then set agent_path to it or put it next to the sandboxwich binary"

// agentBinary is the agent file mounted into every cell and its digest.
type agentBinary struct {
	path   string // a read-only file in the content-addressed cache
	digest string // "sha256:<hex>" of that file
}

// agentCacheDir is the content-addressed cache of agent binaries:
// os.UserCacheDir()/sandboxwich/agent, or, for a process without a user
// cache directory (no HOME, as under a bare service manager), the
// provider's private bundle directory. Each binary is
// <cache>/sha256-<hex>/sandboxwich-agent, read-only.
func agentCacheDir(bundleDir string) string {
	dir, err := os.UserCacheDir()
	if err != nil {
		return filepath.Join(bundleDir, "agent-cache")
	}
	return filepath.Join(dir, "sandboxwich", "agent")
}

// resolveAgent finds the agent binary a Provider mounts (see Config.AgentPath)
// and returns its copy in the content-addressed cacheDir.
func resolveAgent(configured, cacheDir string, log *slog.Logger) (agentBinary, error) {
	if configured != "" {
		return cacheAgent(configured, cacheDir)
	}
	if exe, err := os.Executable(); err == nil {
		next := filepath.Join(filepath.Dir(exe), agentBinaryName)
		if fi, err := os.Stat(next); err == nil && fi.Mode().IsRegular() {
			return cacheAgent(next, cacheDir)
		}
	}
	built, cleanup, err := buildAgent(log)
	if err != nil {
		return agentBinary{}, fmt.Errorf("gvisor: no cell agent: Config.AgentPath (setting agent_path) is empty, "+
			"there is no %s next to this executable, and building one failed: %w; build it with %s",
			agentBinaryName, err, agentBuildHint)
	}
	defer cleanup()
	return cacheAgent(built, cacheDir)
}

// buildAgent builds the agent with the Go toolchain into a temporary
// directory: from the module's source when the running program is a
// development build (`go list -m` from the working directory finds it), or
// with `go install <package>@<version>` for a released version of the
// module. The caller runs cleanup.
func buildAgent(log *slog.Logger) (path string, cleanup func(), err error) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		return "", nil, errors.New("no Go toolchain in PATH")
	}
	tmp, err := os.MkdirTemp("", "sandboxwich-agent-build-")
	if err != nil {
		return "", nil, err
	}
	cleanup = func() { _ = os.RemoveAll(tmp) }
	ctx, cancel := context.WithTimeout(context.Background(), agentBuildTimeout)
	defer cancel()
	env := append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH, "GOBIN="+tmp)
	run := func(dir string, args ...string) ([]byte, error) {
		cmd := exec.CommandContext(ctx, goCmd, args...)
		cmd.Dir, cmd.Env = dir, env
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("go %s: %w: %s", strings.Join(args, " "), err, truncate(bytes.TrimSpace(stderr.Bytes()), 1000))
		}
		return out, nil
	}
	version := moduleVersion()
	if version == "" {
		out, err := run("", "list", "-m", "-f", "{{.Dir}}", agentModule)
		dir := strings.TrimSpace(string(out))
		if err != nil || dir == "" {
			cleanup()
			return "", nil, fmt.Errorf("a development build of %s, but its source is not found from the working directory (%v)", agentModule, err)
		}
		log.Info("building the cell agent from the module's source", "dir", dir)
		if _, err := run(dir, "build", "-trimpath", "-ldflags="+agentLdflags, "-o", filepath.Join(tmp, agentBinaryName), "./cmd/sandboxwich-agent"); err != nil {
			cleanup()
			return "", nil, err
		}
	} else {
		log.Info("building the cell agent of this release", "version", version)
		if _, err := run(tmp, "install", "-trimpath", "-ldflags="+agentLdflags, agentPackage+"@"+version); err != nil {
			cleanup()
			return "", nil, err
		}
	}
	return filepath.Join(tmp, agentBinaryName), cleanup, nil
}

// moduleVersion is the released version of this module the running
// program was built with, or "" for a development build: one built in a
// checkout (`go build` and `go run` record the VCS revision, and may
// stamp a pseudo-version of an unpublished commit), one with local
// changes, or one whose dependency on the module is replaced.
func moduleVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	if info.Main.Path == agentModule {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" {
				return ""
			}
		}
		return releaseVersion(info.Main.Version)
	}
	for _, d := range info.Deps {
		if d.Path == agentModule && d.Replace == nil {
			return releaseVersion(d.Version)
		}
	}
	return ""
}

// releaseVersion is v unless it names no release.
func releaseVersion(v string) string {
	if v == "" || v == "(devel)" || strings.Contains(v, "+") {
		return ""
	}
	return v
}

// cacheAgent checks that src is a static executable and copies it into the
// content-addressed cache (unless an intact copy is there already). The
// returned digest is that of the cached file, read back after the copy.
func cacheAgent(src, cacheDir string) (agentBinary, error) {
	if err := checkStatic(src); err != nil {
		return agentBinary{}, fmt.Errorf("gvisor: cell agent %s: %w", src, err)
	}
	sum, err := fileDigest(src)
	if err != nil {
		return agentBinary{}, fmt.Errorf("gvisor: cell agent: %w", err)
	}
	dir := filepath.Join(cacheDir, "sha256-"+sum)
	dst := filepath.Join(dir, agentBinaryName)
	if got, err := fileDigest(dst); err != nil || got != sum {
		if err := copyReadOnly(src, dst); err != nil {
			return agentBinary{}, fmt.Errorf("gvisor: caching the cell agent: %w", err)
		}
		if got, err = fileDigest(dst); err != nil || got != sum {
			return agentBinary{}, fmt.Errorf("gvisor: caching the cell agent: %s does not hold what was copied (%v)", dst, err)
		}
	}
	return agentBinary{path: dst, digest: "sha256:" + sum}, nil
}

// checkStatic refuses anything but a statically linked ELF executable of
// this machine's architecture: the agent must run on any root filesystem,
// one without a C library included.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("not an executable: %w", err)
	}
	defer f.Close()
	want := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[runtime.GOARCH]
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return fmt.Errorf("not an executable (ELF type %v)", f.Type)
	}
	if want != 0 && f.Machine != want {
		return fmt.Errorf("built for %v, this machine is %s", f.Machine, runtime.GOARCH)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("dynamically linked; build it with CGO_ENABLED=0: %s", agentBuildHint)
		}
	}
	return nil
}

// fileDigest is the hex SHA-256 of a file.
func fileDigest(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// copyReadOnly copies src to dst atomically (a temporary file renamed into
// place), leaving dst mode 0555 and its directory 0755.
func copyReadOnly(src, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, err = io.Copy(tmp, in)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o555)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), dst)
	}
	return err
}
