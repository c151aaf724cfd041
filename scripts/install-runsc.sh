#!/usr/bin/env bash
# Builds gVisor's runsc from its Go module at the version the project pins
# (gvisor.RunscVersion in driver/gvisor/runsc_version.go), caches it by
# version, links it as /usr/local/bin/runsc when that is writable, and
# prints the binary's path on its last line. Idempotent: once the cached
# binary exists it only checks and prints it.
#
#   scripts/install-runsc.sh
#
# The cache is ${SANDBOXWICH_RUNSC_CACHE:-${XDG_CACHE_HOME:-~/.cache}/sandboxwich/runsc}/<version>/runsc,
# the path the gVisor driver looks in first. A cold build takes about a
# minute on 2 cores. The proxy serves gVisor only as pseudo-versions, and
# such a build prints VERSION_MISSING for `runsc --version`: `go version -m`
# identifies it. Debian's `runsc` package (gVisor 2022-12-19, whose statx
# breaks `ls` and `stat` inside cells) is only a documented fallback.
set -euo pipefail
cd "$(dirname "$0")/.."

version=$(sed -n 's/^const RunscVersion = "\(.*\)"$/\1/p' driver/gvisor/runsc_version.go)
if [ -z "$version" ]; then
	echo "install-runsc: no RunscVersion in driver/gvisor/runsc_version.go" >&2
	exit 1
fi
cache="${SANDBOXWICH_RUNSC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sandboxwich/runsc}"
bin="$cache/$version/runsc"

built_version() { go version -m "$1" 2>/dev/null | awk '$1 == "mod" && $2 == "gvisor.dev/gvisor" { print $3 }'; }

if [ ! -x "$bin" ] || [ "$(built_version "$bin")" != "$version" ]; then
	echo "install-runsc: building runsc from gvisor.dev/gvisor@$version (about a minute)" >&2
	tmp=$(mktemp -d "$cache.tmp.XXXXXX" 2>/dev/null || { mkdir -p "$cache" && mktemp -d "$cache.tmp.XXXXXX"; })
	trap 'rm -rf "$tmp"' EXIT
	# Outside this module, so gVisor's own go.mod decides its dependencies.
	(cd "$tmp" && CGO_ENABLED=0 GOBIN="$tmp" GOFLAGS=-mod=mod go install "gvisor.dev/gvisor/runsc@$version")
	mkdir -p "$cache/$version"
	mv -f "$tmp/runsc" "$bin" # atomic: a concurrent run never sees half a binary
fi
if [ "$(built_version "$bin")" != "$version" ]; then
	echo "install-runsc: $bin is not gvisor.dev/gvisor@$version" >&2
	exit 1
fi
if [ -w /usr/local/bin ] && [ "$(readlink /usr/local/bin/runsc 2>/dev/null || true)" != "$bin" ]; then
	ln -sfn "$bin" /usr/local/bin/runsc
fi
echo "runsc: gvisor.dev/gvisor@$version" >&2
echo "$bin"
