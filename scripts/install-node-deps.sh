#!/usr/bin/env bash
# Installs the npm dependencies of the Cloudflare bridge Worker
# (driver/cloudflare/bridge) exactly as its committed package-lock.json
# pins them: `npm ci --ignore-scripts` (no package runs an install script;
# workerd and esbuild ship their binaries as platform packages). The
# result is cached by the lockfile's SHA-256 under
# ~/.cache/sandboxwich/npm/<hash>.tar, so a later run with the same
# lockfile unpacks it instead of downloading. Idempotent: a tree already
# installed from this lockfile is kept. Prints the bridge directory on the
# last line.
set -euo pipefail
cd "$(dirname "$0")/.."

dir=driver/cloudflare/bridge
lock="$dir/package-lock.json"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/sandboxwich/npm"

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
	echo "install-node-deps: node and npm are required (Node ≥ 20.19)" >&2
	exit 1
fi
node -e 'const [a,b]=process.versions.node.split(".").map(Number); process.exit(a>20||(a===20&&b>=19)?0:1)' || {
	echo "install-node-deps: Node $(node --version) is too old: the bridge's toolchain needs Node ≥ 20.19" >&2
	exit 1
}

hash=$(sha256sum "$lock" | cut -c1-64)
stamp="$dir/node_modules/.sandboxwich-lock-sha256"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$hash" ]; then
	echo "install-node-deps: $dir/node_modules is current" >&2
	echo "$dir"
	exit 0
fi

rm -rf "$dir/node_modules"
if [ -f "$cache/$hash.tar" ]; then
	echo "install-node-deps: unpacking the cached tree for lockfile $hash" >&2
	tar -C "$dir" -xf "$cache/$hash.tar"
else
	echo "install-node-deps: npm ci in $dir (lockfile $hash)" >&2
	(cd "$dir" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
	mkdir -p "$cache"
	tmp=$(mktemp "$cache/.tmp.XXXXXX")
	tar -C "$dir" -cf "$tmp" node_modules
	mv "$tmp" "$cache/$hash.tar"
fi
echo "$hash" >"$stamp"
echo "$dir"
