#!/usr/bin/env bash
# The Python SDK's checks (sdks/python): a fresh virtual environment with the
# pinned packages of sdks/python/requirements-dev.txt (their wheels cached
# under ~/.cache/sandboxwich/pip, keyed by the requirements and the Python
# version: the registry's answers are not HTTP-cacheable, so pip's own cache
# stays empty), the package itself, then ruff check,
# ruff format --check, mypy --strict and pytest. The pytest suite builds the
# Go server and runs it with real gVisor cells; under CI=true a missing go
# or runsc fails instead of skipping.
#
#   scripts/python-checks.sh          the checks
#   scripts/python-checks.sh --fetch  only download the wheels into the cache
#                                     (.ci/run does it while other steps build)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
cache="${SANDBOXWICH_PIP_CACHE:-$HOME/.cache/sandboxwich/pip}"
export PIP_DISABLE_PIP_VERSION_CHECK=1
python=${PYTHON:-python3}
venv=$(mktemp -d "${TMPDIR:-/tmp}/sandboxwich-pyvenv.XXXXXX")
trap 'rm -rf "$venv"' EXIT
req=sdks/python/requirements-dev.txt

start=$(date +%s)
"$python" -m venv "$venv"
key="$("$python" -c 'import sys; print("py%d%d" % sys.version_info[:2])')-$(sha256sum "$req" | cut -c1-16)"
wheels="$cache/wheels-$key"
if [ ! -f "$wheels/.complete" ]; then
	rm -rf "$wheels.partial"
	mkdir -p "$cache"
	"$venv/bin/pip" download -q -r "$req" -d "$wheels.partial"
	touch "$wheels.partial/.complete"
	rm -rf "$wheels"
	mv "$wheels.partial" "$wheels"
fi
if [ "${1:-}" = "--fetch" ]; then
	echo "python-checks: wheels cached in $wheels"
	exit 0
fi
"$venv/bin/pip" install -q --no-compile --no-index --find-links "$wheels" -r "$req"
"$venv/bin/pip" install -q --no-compile --no-deps --no-build-isolation ./sdks/python
echo "python-checks: environment ready in $(( $(date +%s) - start )) s ($("$venv/bin/python" --version))"

cd sdks/python
"$venv/bin/ruff" check .
"$venv/bin/ruff" format --check .
"$venv/bin/mypy" --strict
# The installed package, not the source tree, is what the tests import.
cd tests
"$venv/bin/python" -m pytest -q -p no:cacheprovider --rootdir "$root/sdks/python" -c "$root/sdks/python/pyproject.toml" .
echo "python-checks: done in $(( $(date +%s) - start )) s"
