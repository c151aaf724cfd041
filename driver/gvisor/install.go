package gvisor

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// runscModule is the Go module runsc is built from; runscPackage its
// command.
const (
	runscModule  = "gvisor.dev/gvisor"
	runscPackage = runscModule + "/runsc"
)

// ErrNoGo reports that the pinned runsc cannot be built because no Go
// toolchain is on PATH.
var ErrNoGo = errors.New("gvisor: building runsc needs Go (`go` on PATH)")

// InstallError is a failed build of the pinned runsc: the command that ran
// and the tail of its output.
type InstallError struct {
	// Command is the build command, as a shell would run it.
	Command string
	// Output is the last lines of the command's combined output.
	Output string
	// Err is why it failed.
	Err error
}

func (e *InstallError) Error() string {
	msg := fmt.Sprintf("gvisor: building runsc failed (%v): %s", e.Err, e.Command)
	if e.Output != "" {
		msg += "\n" + e.Output
	}
	return msg
}

func (e *InstallError) Unwrap() error { return e.Err }

// InstallRunsc returns the path of the pinned runsc (RunscVersion) in the
// cache PinnedRunscPath names, building it first when the cache holds no
// build of that version: the build InstallCommand and
// scripts/install-runsc.sh run (`go install` of gvisor.dev/gvisor/runsc at
// RunscVersion, CGO_ENABLED=0, outside any module, into a temporary
// directory next to the cache and then renamed into place, so that a
// concurrent run never sees half a binary). A cached build is returned at
// once. The build needs Go and the module proxy and takes about a minute on
// 2 cores: a line on progress says so before it, and another how long it
// took after it. A failed build is an *InstallError naming the command and
// the tail of its output; without Go on PATH the error wraps ErrNoGo.
func InstallRunsc(ctx context.Context, progress io.Writer) (string, error) {
	bin := PinnedRunscPath()
	if bin == "" {
		return "", errors.New("gvisor: no cache directory for runsc (set SANDBOXWICH_RUNSC_CACHE, XDG_CACHE_HOME or HOME)")
	}
	return runscInstaller{bin: bin, goTool: findGo, run: runCombined, version: builtVersion}.install(ctx, progress)
}

// runscInstaller is InstallRunsc with its effects injected, so tests can
// check its decisions without building gVisor.
type runscInstaller struct {
	// bin is where the pinned runsc is cached.
	bin string
	// goTool finds the go command.
	goTool func() (string, error)
	// run runs a command, returning its combined output.
	run func(cmd *exec.Cmd) ([]byte, error)
	// version returns the gvisor.dev/gvisor version a binary was built
	// from, "" when it is not such a build.
	version func(path string) string
}

// cached reports whether bin holds an executable build of RunscVersion.
func (in runscInstaller) cached() bool {
	fi, err := os.Stat(in.bin)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 && in.version(in.bin) == RunscVersion
}

// buildCommand is the build of RunscVersion into the directory gobin.
func (in runscInstaller) buildCommand(ctx context.Context, goTool, gobin string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, goTool, "install", runscPackage+"@"+RunscVersion)
	// Outside this module, so gVisor's own go.mod decides its dependencies.
	cmd.Dir = gobin
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOBIN="+gobin, "GOFLAGS=-mod=mod")
	return cmd
}

func (in runscInstaller) install(ctx context.Context, progress io.Writer) (string, error) {
	if in.cached() {
		return in.bin, nil
	}
	goTool, err := in.goTool()
	if err != nil {
		return "", err
	}
	cache := filepath.Dir(filepath.Dir(in.bin)) // <cache>/<version>/runsc
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", fmt.Errorf("gvisor: runsc cache: %w", err)
	}
	tmp, err := os.MkdirTemp(cache, ".build-")
	if err != nil {
		return "", fmt.Errorf("gvisor: runsc cache: %w", err)
	}
	defer os.RemoveAll(tmp)
	cmd := in.buildCommand(ctx, goTool, tmp)
	shown := fmt.Sprintf("CGO_ENABLED=0 GOBIN=%s GOFLAGS=-mod=mod %s install %s@%s", tmp, goTool, runscPackage, RunscVersion)
	fmt.Fprintf(progress, "sandboxwich: building runsc (gVisor %s) into %s: about a minute, once per version\n", RunscVersion, filepath.Dir(in.bin))
	start := time.Now()
	out, err := in.run(cmd)
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
		return "", &InstallError{Command: shown, Output: outputTail(out, 20, 2000), Err: err}
	}
	built := filepath.Join(tmp, "runsc")
	if v := in.version(built); v != RunscVersion {
		return "", &InstallError{Command: shown, Output: outputTail(out, 20, 2000),
			Err: fmt.Errorf("the build is %s@%q, not %s", runscModule, v, RunscVersion)}
	}
	if err := os.MkdirAll(filepath.Dir(in.bin), 0o755); err != nil {
		return "", fmt.Errorf("gvisor: runsc cache: %w", err)
	}
	if err := os.Rename(built, in.bin); err != nil { // atomic, as the script's mv
		return "", fmt.Errorf("gvisor: runsc cache: %w", err)
	}
	fmt.Fprintf(progress, "sandboxwich: runsc built in %s: %s\n", time.Since(start).Round(time.Second), in.bin)
	return in.bin, nil
}

// findGo returns the go command on PATH.
func findGo() (string, error) {
	p, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("%w: install Go from https://go.dev/dl/, or install runsc yourself: %s", ErrNoGo, InstallCommand)
	}
	return p, nil
}

// runCombined runs cmd and returns its combined output.
func runCombined(cmd *exec.Cmd) ([]byte, error) { return cmd.CombinedOutput() }

// builtVersion returns the gvisor.dev/gvisor version the Go binary at path
// was built from, "" when it is not a build of that module (what `go
// version -m` shows, and scripts/install-runsc.sh checks).
func builtVersion(path string) string {
	bi, err := buildinfo.ReadFile(path)
	if err != nil || bi.Main.Path != runscModule {
		return ""
	}
	return bi.Main.Version
}

// outputTail returns at most the last lines lines and max bytes of out.
func outputTail(out []byte, lines, max int) string {
	out = bytes.TrimRight(out, "\n")
	if len(out) > max {
		out = out[len(out)-max:]
	}
	s := strings.Split(string(out), "\n")
	if len(s) > lines {
		s = s[len(s)-lines:]
	}
	return strings.Join(s, "\n")
}
