package gvisor

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// fakeBuilds is an injected build: it records each command and "builds" a
// file named runsc into its GOBIN.
type fakeBuilds struct {
	cmds []*exec.Cmd
	fail bool
}

func (f *fakeBuilds) run(cmd *exec.Cmd) ([]byte, error) {
	f.cmds = append(f.cmds, cmd)
	if f.fail {
		return []byte("go: downloading gvisor.dev/gvisor\nproxy: 404 Not Found\n"), errors.New("exit status 1")
	}
	for _, kv := range cmd.Env {
		if dir, ok := strings.CutPrefix(kv, "GOBIN="); ok {
			return nil, os.WriteFile(filepath.Join(dir, "runsc"), []byte("built"), 0o755)
		}
	}
	return nil, errors.New("no GOBIN")
}

// fakeVersion: a file "built" or "cached" is a build of RunscVersion.
func fakeVersion(path string) string {
	b, _ := os.ReadFile(path)
	if s := string(b); s == "built" || s == "cached" {
		return RunscVersion
	}
	return ""
}

func testInstaller(bin string, f *fakeBuilds) runscInstaller {
	return runscInstaller{bin: bin, goTool: func() (string, error) { return "/opt/go/bin/go", nil }, run: f.run, version: fakeVersion}
}

// TestInstallRunscDecisions: a cached build of the pinned version is used
// as it is (no build); a missing or foreign one is built with the pinned
// version into a directory of the cache, then moved to the path the driver
// looks in first, with a line before and after; a failure names the
// command and its output's tail.
func TestInstallRunscDecisions(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("SANDBOXWICH_RUNSC_CACHE", cache)
	bin := PinnedRunscPath()
	if bin != filepath.Join(cache, RunscVersion, "runsc") {
		t.Fatalf("PinnedRunscPath = %s", bin)
	}

	// Miss: the build command, its GOBIN in the cache, the version pinned.
	f := &fakeBuilds{}
	var progress bytes.Buffer
	got, err := testInstaller(bin, f).install(context.Background(), &progress)
	if err != nil || got != bin {
		t.Fatalf("install = %q, %v", got, err)
	}
	if len(f.cmds) != 1 {
		t.Fatalf("%d builds, want 1", len(f.cmds))
	}
	cmd := f.cmds[0]
	if want := []string{"/opt/go/bin/go", "install", "gvisor.dev/gvisor/runsc@" + RunscVersion}; !slices.Equal(cmd.Args, want) {
		t.Errorf("build args %q, want %q", cmd.Args, want)
	}
	gobin := ""
	for _, kv := range cmd.Env {
		if v, ok := strings.CutPrefix(kv, "GOBIN="); ok {
			gobin = v
		}
	}
	if filepath.Dir(gobin) != cache || cmd.Dir != gobin {
		t.Errorf("GOBIN %q, dir %q: want a directory of the cache %s", gobin, cmd.Dir, cache)
	}
	if !slices.Contains(cmd.Env, "CGO_ENABLED=0") || !slices.Contains(cmd.Env, "GOFLAGS=-mod=mod") {
		t.Errorf("build env lacks CGO_ENABLED=0 or GOFLAGS=-mod=mod: %q", cmd.Env[len(cmd.Env)-3:])
	}
	if b, err := os.ReadFile(bin); err != nil || string(b) != "built" {
		t.Fatalf("the build is not at %s: %q %v", bin, b, err)
	}
	if _, err := os.Stat(gobin); !os.IsNotExist(err) {
		t.Errorf("the build directory %s is left behind (%v)", gobin, err)
	}
	lines := strings.Split(strings.TrimSpace(progress.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "building runsc") || !strings.Contains(lines[1], "runsc built in ") {
		t.Errorf("progress:\n%s", progress.String())
	}
	if FindRunsc() != bin {
		t.Errorf("FindRunsc = %q after the install, want %s", FindRunsc(), bin)
	}

	// Hit: nothing built, nothing printed.
	f2 := &fakeBuilds{}
	progress.Reset()
	if got, err := testInstaller(bin, f2).install(context.Background(), &progress); err != nil || got != bin || len(f2.cmds) != 0 || progress.Len() != 0 {
		t.Fatalf("cached: %q %v, %d builds, progress %q", got, err, len(f2.cmds), progress.String())
	}

	// A file of another version in the cache is rebuilt.
	if err := os.WriteFile(bin, []byte("other"), 0o755); err != nil {
		t.Fatal(err)
	}
	f3 := &fakeBuilds{}
	if _, err := testInstaller(bin, f3).install(context.Background(), &progress); err != nil || len(f3.cmds) != 1 {
		t.Fatalf("foreign build: %v, %d builds", err, len(f3.cmds))
	}

	// A failure names the command and the output's tail; the cache is left
	// as it was.
	if err := os.Remove(bin); err != nil {
		t.Fatal(err)
	}
	_, err = testInstaller(bin, &fakeBuilds{fail: true}).install(context.Background(), &progress)
	ie, ok := errors.AsType[*InstallError](err)
	if !ok || !strings.Contains(ie.Command, "go install gvisor.dev/gvisor/runsc@"+RunscVersion) ||
		!strings.Contains(err.Error(), "proxy: 404 Not Found") {
		t.Fatalf("failed build: %v", err)
	}
	if _, err := os.Stat(bin); !os.IsNotExist(err) {
		t.Errorf("a failed build left %s (%v)", bin, err)
	}
	if ents, _ := os.ReadDir(cache); len(ents) != 1 { // <version>/ only
		t.Errorf("cache after a failed build: %v", ents)
	}

	// Without Go: ErrNoGo, with the command to run by hand.
	in := testInstaller(bin, &fakeBuilds{})
	in.goTool = func() (string, error) { return "", ErrNoGo }
	if _, err := in.install(context.Background(), &progress); !errors.Is(err, ErrNoGo) {
		t.Fatalf("without go: %v", err)
	}
}

// TestInstallScriptAgrees: scripts/install-runsc.sh, which also links
// /usr/local/bin/runsc, builds the same version into the same cache path as
// InstallRunsc.
func TestInstallScriptAgrees(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "scripts", "install-runsc.sh"))
	if err != nil {
		t.Fatal(err)
	}
	script := string(b)
	for _, want := range []string{
		`sed -n 's/^const RunscVersion = "\(.*\)"$/\1/p' driver/gvisor/runsc_version.go`,
		`cache="${SANDBOXWICH_RUNSC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sandboxwich/runsc}"`,
		`bin="$cache/$version/runsc"`,
		`CGO_ENABLED=0 GOBIN="$tmp" GOFLAGS=-mod=mod go install "gvisor.dev/gvisor/runsc@$version"`,
	} {
		if !strings.Contains(script, want) {
			t.Errorf("scripts/install-runsc.sh no longer has %s", want)
		}
	}
	if !strings.Contains(InstallCommand, "/sandboxwich/runsc/"+RunscVersion) {
		t.Errorf("InstallCommand %q does not build into the cache", InstallCommand)
	}
}

// TestInstallRunscReal builds the pinned runsc for real into an empty cache
// (about a minute on 2 cores, with the module proxy), then finds it cached.
// It runs only with SANDBOXWICH_TEST_RUNSC_INSTALL=1.
func TestInstallRunscReal(t *testing.T) {
	if os.Getenv("SANDBOXWICH_TEST_RUNSC_INSTALL") != "1" {
		t.Skip("set SANDBOXWICH_TEST_RUNSC_INSTALL=1 to build runsc from the module proxy")
	}
	t.Setenv("SANDBOXWICH_RUNSC_CACHE", t.TempDir())
	var progress bytes.Buffer
	bin, err := InstallRunsc(context.Background(), &progress)
	if err != nil {
		t.Fatal(err)
	}
	if builtVersion(bin) != RunscVersion || FindRunsc() != bin {
		t.Fatalf("%s: version %q, FindRunsc %q", bin, builtVersion(bin), FindRunsc())
	}
	progress.Reset()
	if again, err := InstallRunsc(context.Background(), &progress); err != nil || again != bin || progress.Len() != 0 {
		t.Fatalf("second install: %q %v, progress %q", again, err, progress.String())
	}
}
