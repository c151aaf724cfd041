package gvisor

import (
	"os"
	"os/exec"
	"path/filepath"
)

// RunscVersion is the gVisor module version the project builds runsc from
// and tests against. The proxy serves gVisor only as pseudo-versions; such
// a build prints VERSION_MISSING for `runsc --version`, and
// `go version -m $(which runsc)` shows this version.
// scripts/install-runsc.sh reads it from this line.
const RunscVersion = "v0.0.0-20260905035102-160fafc42237"

// InstallCommand builds the pinned runsc into the path PinnedRunscPath
// reports (cached by version). It needs Go and the module proxy, and takes
// about a minute on 2 cores. From a checkout, scripts/install-runsc.sh
// runs the same build and also links /usr/local/bin/runsc to it.
const InstallCommand = `CGO_ENABLED=0 GOBIN="${XDG_CACHE_HOME:-$HOME/.cache}/sandboxwich/runsc/` + RunscVersion +
	`" go install gvisor.dev/gvisor/runsc@` + RunscVersion

// PinnedRunscPath is where the pinned runsc is cached:
// $SANDBOXWICH_RUNSC_CACHE (default os.UserCacheDir()/sandboxwich/runsc),
// then RunscVersion, then "runsc". It returns "" when no cache directory
// can be determined.
func PinnedRunscPath() string {
	cache := os.Getenv("SANDBOXWICH_RUNSC_CACHE")
	if cache == "" {
		dir, err := os.UserCacheDir()
		if err != nil {
			return ""
		}
		cache = filepath.Join(dir, "sandboxwich", "runsc")
	}
	return filepath.Join(cache, RunscVersion, "runsc")
}

// FindRunsc returns the runsc a Provider with an empty Config.RunscPath
// uses: the pinned build when it is cached, else "runsc" from PATH (for
// example Debian's package, a documented fallback whose 2022 gVisor breaks
// `ls` and `stat` in cells), else "".
func FindRunsc() string {
	if p := PinnedRunscPath(); p != "" {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	if p, err := exec.LookPath("runsc"); err == nil {
		return p
	}
	return ""
}
