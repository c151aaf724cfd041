#!/usr/bin/env bash
# The Python SDK's checks (sdks/python): a fresh virtual environment with the
# pinned packages of sdks/python/requirements-dev.txt (pip downloads cached
# under ~/.cache/sandboxwich/pip), the package itself, then ruff check,
# ruff format --check, mypy --strict and pytest. The pytest suite builds the
# Go server and runs it with real gVisor cells; under CI=true a missing go
# or runsc fails instead of skipping.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export PIP_CACHE_DIR="${PIP_CACHE_DIR:-$HOME/.cache/sandboxwich/pip}"
export PIP_DISABLE_PIP_VERSION_CHECK=1
python=${PYTHON:-python3}
venv=$(mktemp -d "${TMPDIR:-/tmp}/sandboxwich-pyvenv.XXXXXX")
trap 'rm -rf "$venv"' EXIT

start=$(date +%s)
"$python" -m venv "$venv"
"$venv/bin/pip" install -q -r sdks/python/requirements-dev.txt
"$venv/bin/pip" install -q --no-deps --no-build-isolation ./sdks/python
echo "python-checks: environment ready in $(( $(date +%s) - start )) s ($("$venv/bin/python" --version))"

cd sdks/python
"$venv/bin/ruff" check .
"$venv/bin/ruff" format --check .
"$venv/bin/mypy" --strict
# The installed package, not the source tree, is what the tests import.
cd tests
"$venv/bin/python" -m pytest -q -p no:cacheprovider --rootdir "$root/sdks/python" -c "$root/sdks/python/pyproject.toml" .
echo "python-checks: done in $(( $(date +%s) - start )) s"
