#!/usr/bin/env bash
# The project's test command: installs and starts what the tests need, then
# runs every suite. On a fresh machine with Go, Python >= 3.11.5
# (scripts/python-checks.sh finds one, or is told with PYTHON=) and
# Node >= 20.19, run as root, it is the whole set-up; everything it
# installs is cached by version, so a second run only tests.
#
#   bash scripts/test.sh        every check, as CI runs it (.ci/run calls it)
#
# Once everything is installed, `go test ./...` (with the environment the
# docs/operations.md gives) is the fast loop.
#
# Steps, overlapped where neither needs the other (a cold build of the
# Kubernetes binaries takes most of a cold run on 2 cores):
#   background  the Kubernetes test binaries (scripts/k8s-binaries.sh)
#   downloads   the Python SDK's pinned wheels; the bridge's npm packages
#   services    PostgreSQL (a private cluster), runsc, busybox
#   bridge      strict tsc and vitest in real workerd
#   lint        gofmt, go vet, staticcheck
#   wait        for the Kubernetes binaries
#   go          go test -race ./...
#   python      ruff, mypy --strict, pytest against real cells
#   reliability scripts/reliability.sh --quick
#   bench       sandboxwich bench --quick as a smoke (fails only on ratios
#               3x worse than their targets: gross regressions, never noise)
# The last lines are a table of each step's wall time.
set -euo pipefail
cd "$(dirname "$0")/.."

# The cleanup is in place before anything starts, so a run that fails early
# stops the background build and drops its database.
k8s_pid=
k8s_log=
db=
cleanup() {
	if [ -n "$k8s_pid" ]; then
		# The build runs in a session of its own: end its whole group
		# (the go commands it started included).
		kill -TERM -- "-$k8s_pid" 2>/dev/null || true
	fi
	[ -z "$k8s_log" ] || rm -f "$k8s_log"
	if [ -n "$db" ]; then
		psql -h 127.0.0.1 -U postgres -d test -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
	fi
}
trap cleanup EXIT

steps=()
step_start=$SECONDS
step_name=
# step NAME DESCRIPTION: ends the previous step (recording its time) and
# prints the minutes and seconds since the start.
step() {
	[ -z "$step_name" ] || steps+=("$(printf '%-12s %5d s' "$step_name" $((SECONDS - step_start)))")
	step_name=$1
	step_start=$SECONDS
	echo "== [$((SECONDS / 60))m$((SECONDS % 60))s] $1: $2"
}

step background "the Kubernetes test binaries (etcd, kube-apiserver, kwok, a real node's kubelet, containerd, runc and gVisor shim, from Go modules; cached by version)"
k8s_log=$(mktemp)
k8s_started=$SECONDS
# The build's own time is recorded when it ends. setsid gives it a process
# group the cleanup can end whole (without job control a background child
# is no group leader, so setsid execs in place and $! is the group's id).
setsid bash -c 'start=$SECONDS; bash scripts/k8s-binaries.sh; rc=$?; echo "k8s-binaries: built in $((SECONDS - start)) s (exit $rc)" >&2; exit $rc' >"$k8s_log" 2>&1 &
k8s_pid=$!

step downloads "the Python SDK's pinned wheels; the Cloudflare bridge's npm packages (npm ci from its lockfile); cached by their pins"
bash scripts/python-checks.sh --fetch
bridge=$(bash scripts/install-node-deps.sh | tail -n 1)

step services "PostgreSQL, runsc, busybox"
bash scripts/start-postgres.sh
bash scripts/install-runsc.sh
bash scripts/install-busybox.sh >/dev/null
# A fresh database for this run, dropped at exit.
db="sbw_test_$(date +%s)_$$"
psql -h 127.0.0.1 -U postgres -d test -qc "CREATE DATABASE $db"
export SANDBOXWICH_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:5432/$db?sslmode=disable"

step bridge "the bridge Worker: strict tsc, and its tests in real workerd with the real cell agent"
(cd "$bridge" && npx --no-install tsc --noEmit -p tsconfig.json && npx --no-install vitest run)

step lint "gofmt, go vet, staticcheck"
unformatted=$(gofmt -l $(git ls-files '*.go'))
if [ -n "$unformatted" ]; then echo "gofmt needed: $unformatted"; exit 1; fi
go vet ./...
go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

step wait "for the Kubernetes test binaries"
if ! wait "$k8s_pid"; then
	k8s_pid=
	cat "$k8s_log"
	echo "k8s-binaries.sh failed"
	exit 1
fi
k8s_pid=
k8s_built=$(sed -n 's/^k8s-binaries: built in \([0-9]*\) s.*/\1/p' "$k8s_log")
KUBEBUILDER_ASSETS=$(grep -v '^k8s-binaries: built in' "$k8s_log" | tail -n 1)
export KUBEBUILDER_ASSETS

step go "go test -race ./..."
go test -race -count=1 ./...
# The reliability profile's hostile check is a subset of these tests.
export SANDBOXWICH_GO_TESTS_PASSED=1

step python "the Python SDK and Inspect provider: fresh venv, pinned packages, ruff, mypy --strict, pytest against real gVisor cells"
bash scripts/python-checks.sh

step reliability "scripts/reliability.sh --quick"
bash scripts/reliability.sh --quick

step bench "benchmark smoke (fails only on ratios 3x worse than their targets, or past their gate)"
go run ./cmd/sandboxwich bench --quick --fail-factor 3 | tail -n 1

step done "every suite passed"
echo "== step times (wall clock; the Kubernetes build ran beside the steps up to 'wait' and took ${k8s_built:-?} s)"
printf '%s\n' "${steps[@]}"
printf '%-12s %5d s\n' total "$SECONDS"
