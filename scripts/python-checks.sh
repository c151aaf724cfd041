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
#   scripts/python-checks.sh                 the checks
#   scripts/python-checks.sh --fetch         only download the wheels into the
#                                            cache (.ci/run does it while
#                                            other steps build)
#   scripts/python-checks.sh --which-python  print the interpreter it would use
#
# The pins need Python >= 3.11.5 (the highest Requires-Python among them:
# soupsieve==4.1.3; Debian 12's python3 is 3.11.2). PYTHON=/path/to/python3
# chooses the interpreter; without it the first that fits of python3,
# python3.11, python3.12, python3.13 on PATH and pyenv's versions
# ($PYENV_ROOT/versions, the oldest that fits) is used, and the script says
# which. An interpreter that does not fit stops it before anything is
# installed, saying what is needed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
cache="${SANDBOXWICH_PIP_CACHE:-$HOME/.cache/sandboxwich/pip}"
export PIP_DISABLE_PIP_VERSION_CHECK=1
need=3.11.5

# pyversion prints the version of interpreter $1 if it can make a venv.
pyversion() {
	"$1" -c 'import sys, venv, ensurepip; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null
}
# fits says whether version $1 is at least $need.
fits() {
	[ -n "$1" ] && [ "$(printf '%s\n%s\n' "$need" "$1" | sort -V | head -n 1)" = "$need" ]
}
if [ -n "${PYTHON:-}" ]; then
	python=$PYTHON
	v=$(pyversion "$python" || true)
	if ! fits "$v"; then
		echo "python-checks: PYTHON=$python is ${v:+Python }${v:-not a Python that can create a venv (python3 -m venv, ensurepip)};" \
			"the pinned packages (sdks/python/requirements-dev.txt) need Python >= $need." >&2
		echo "python-checks: point PYTHON at one, e.g. PYTHON=\$HOME/.pyenv/versions/3.11.9/bin/python3 bash scripts/python-checks.sh" >&2
		exit 2
	fi
else
	python=
	tried=
	for c in python3 python3.11 python3.12 python3.13; do
		p=$(command -v "$c" 2>/dev/null) || continue
		v=$(pyversion "$p" || true)
		tried="$tried $p (${v:-no venv})"
		if fits "$v"; then python=$p; break; fi
	done
	if [ -z "$python" ] && [ -d "${PYENV_ROOT:-$HOME/.pyenv}/versions" ]; then
		for p in $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/*/bin/python3 2>/dev/null | sort -V); do
			v=$(pyversion "$p" || true)
			tried="$tried $p (${v:-no venv})"
			if fits "$v"; then python=$p; break; fi
		done
	fi
	if [ -z "$python" ]; then
		echo "python-checks: the pinned packages (sdks/python/requirements-dev.txt) need Python >= $need; found:${tried:- none}." >&2
		echo "python-checks: install one (e.g. pyenv install 3.11.9) and run PYTHON=/path/to/python3 bash scripts/python-checks.sh" >&2
		exit 2
	fi
	first=$(command -v python3 2>/dev/null || true)
	if [ "$python" != "$first" ]; then
		echo "python-checks: using $python (Python $v): python3 on PATH${first:+ ($first)} does not fit (the pins need Python >= $need with venv); PYTHON= chooses another" >&2
	fi
fi
if [ "${1:-}" = "--which-python" ]; then
	echo "$python"
	exit 0
fi
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
