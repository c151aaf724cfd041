#!/usr/bin/env bash
# The reliability proof: every check in one run, bounded in time.
#
#   scripts/reliability.sh          full run (about 30 minutes on 2 cores)
#   scripts/reliability.sh --quick  every check in a shortened form (under 5 minutes)
#
# Each check prints one line, PASS or FAIL with its figures (SKIP when there
# is nothing to run yet); the last line is exactly
#
#   reliability: N checks passed, M failed
#
# and the exit status is non-zero when M > 0. What each check proves:
# docs/reliability.md.
#
# Needs PostgreSQL on 127.0.0.1:5432 (scripts/start-postgres.sh starts it)
# and runsc (scripts/install-runsc.sh installs it); both are used when the
# scripts are present. Artifacts (server logs, porcupine visualizations of
# violations, fuzz logs) stay in $RELIABILITY_ARTIFACTS (default: a new
# directory under /tmp), which is removed when every check passed unless
# RELIABILITY_KEEP=1.
set -uo pipefail
cd "$(dirname "$0")/.."

quick=0
case "${1:-}" in
--quick) quick=1 ;;
"") ;;
*)
	echo "usage: scripts/reliability.sh [--quick]" >&2
	exit 2
	;;
esac

artifacts="${RELIABILITY_ARTIFACTS:-$(mktemp -d /tmp/sbw-reliability.XXXXXX)}"
mkdir -p "$artifacts"
pg_admin="${SANDBOXWICH_RELIABILITY_POSTGRES:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}"
passed=0
failed=0
started=$(date +%s)

# report STATUS LINE: print one check line and count it.
report() {
	echo "$1 $2"
	case "$1" in
	PASS) passed=$((passed + 1)) ;;
	FAIL) failed=$((failed + 1)) ;;
	esac
}

# harness CHECK TIMEOUT ARGS…: one check of the Go harness, which prints its
# own PASS/FAIL line.
harness() {
	local name=$1 limit=$2
	shift 2
	local line
	line=$(timeout --kill-after=10 "$limit" "$artifacts/reliability" -dir "$artifacts" "$@" "$name" \
		2>>"$artifacts/$name.log" | tail -n 1)
	case "$line" in
	PASS*) report PASS "${line#PASS }" ;;
	FAIL*) report FAIL "${line#FAIL }" ;;
	*) report FAIL "$name: no verdict within ${limit} (log: $artifacts/$name.log)" ;;
	esac
}

if [ "$quick" = 1 ]; then
	mode=(-quick)
	lin_time=10s
	fuzztime=5s
	fuzz_budget=60
else
	mode=()
	lin_time=90s
	fuzztime=30s
	fuzz_budget=100000
fi

echo "== reliability ($([ "$quick" = 1 ] && echo quick || echo full)), artifacts in $artifacts"

# Services: PostgreSQL and runsc, through the repository's scripts.
if ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null && [ -f scripts/start-postgres.sh ]; then
	bash scripts/start-postgres.sh >"$artifacts/start-postgres.log" 2>&1 || true
fi
if ! command -v runsc >/dev/null 2>&1 && [ -f scripts/install-runsc.sh ]; then
	bash scripts/install-runsc.sh >"$artifacts/install-runsc.log" 2>&1 || true
fi

# Build the server, its cell agent and the harness once.
if ! go build -o "$artifacts/sandboxwich" ./cmd/sandboxwich >"$artifacts/build.log" 2>&1 ||
	! CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$artifacts/sandboxwich-agent" ./cmd/sandboxwich-agent >>"$artifacts/build.log" 2>&1 ||
	! go build -o "$artifacts/reliability" ./internal/reliability/cmd/reliability >>"$artifacts/build.log" 2>&1; then
	report FAIL "build: $(tail -n 3 "$artifacts/build.log" | tr '\n' ' ')"
	echo "reliability: $passed checks passed, $failed failed"
	exit 1
fi
bin=(-bin "$artifacts/sandboxwich")

# 1. Linearizability (porcupine) under dropped answers.
harness lin-sqlite-worker 5m "${bin[@]}" -duration "$lin_time"
harness lin-sqlite-pool 5m "${bin[@]}" -duration "$lin_time"
harness lin-postgres 5m "${bin[@]}" -duration "$lin_time" -postgres "$pg_admin"
# … and with the replicas' links to PostgreSQL cut and healed (network
# namespaces; root).
harness lin-partition 5m "${bin[@]}" -duration "$lin_time"

# 2. Crash recovery: SIGKILL loops.
harness crash-dir 8m "${bin[@]}" "${mode[@]}"
harness crash-gvisor 12m "${bin[@]}" "${mode[@]}"
# … with an image class (CONTRACT §21): claims of three marked images from
# a loopback registry, waiting while cells of them are made on demand. Full
# profile only: the quick one (CI) is at its time budget, and the Go tests
# cover a kill during an on-demand provision (TestCrashRecoveryImageClassGVisor).
if [ "$quick" = 0 ]; then
	harness crash-gvisor-images 12m "${bin[@]}" "${mode[@]}"
fi
# … and two of them at once, two installations on one runsc state root.
harness crash-two-gvisor 12m "${bin[@]}" "${mode[@]}"
# … and the cell agent's fence on real gVisor cells (the agent binary sits
# next to the server's, where the gVisor driver looks first).
harness agent-fence 8m "${bin[@]}" "${mode[@]}"

# 3. Soak: 60 s quick, 10 minutes full; and the server's memory with
#    100,000 terminal rows and 1,000 live leases, soaked beside them for
#    30 s quick, 10 minutes full.
harness soak 15m "${bin[@]}" "${mode[@]}"
harness rss 15m "${bin[@]}" "${mode[@]}"

# 4. The database goes away under load and comes back: a private
#    PostgreSQL cluster restarted under two replicas, SQLite's disk
#    filling up, and one replica's link to PostgreSQL cut (4 outages
#    quick, 16 full).
harness pg-restart 8m "${bin[@]}" "${mode[@]}"
harness disk-full 8m "${bin[@]}" "${mode[@]}"
harness partition 8m "${bin[@]}" "${mode[@]}"
# … and replicas whose clocks disagree by 10 s.
harness clock-skew 8m -postgres "$pg_admin" "${mode[@]}"

# 5. Hostile input, security and provider faults: the Go tests of the
#    other suites, one check. A fresh PostgreSQL database backs the tests
#    that need one.
#    scripts/test.sh runs every Go test (these included, with -race)
#    just before, and says so with SANDBOXWICH_GO_TESTS_PASSED=1: then
#    they are not run a second time.
if [ "${SANDBOXWICH_GO_TESTS_PASSED:-}" = 1 ]; then
	report SKIP "hostile: the Hostile|Security|ProviderFault tests passed in this run's go test -race ./... (scripts/test.sh); not run twice"
else
hostile_db="sbw_rel_hostile_$$"
if psql -h 127.0.0.1 -U postgres -d test -qc "CREATE DATABASE $hostile_db" >/dev/null 2>&1; then
	export SANDBOXWICH_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:5432/$hostile_db?sslmode=disable"
fi
t0=$(date +%s)
# Only the packages that hold such tests are compiled: the same tests as
# `go test -run '…' ./...`, without building every other test binary.
hostile_pkgs=$(grep -rlE --include='*_test.go' '^func Test[A-Za-z0-9_]*(Hostile|Security|ProviderFault)' . 2>/dev/null |
	xargs -r -n1 dirname | sort -u)
rc=0
: >"$artifacts/hostile.log"
if [ -n "$hostile_pkgs" ]; then
	# shellcheck disable=SC2086 # one argument per package
	timeout --kill-after=10 15m go test -count=1 -v -run 'Hostile|Security|ProviderFault' $hostile_pkgs >"$artifacts/hostile.log" 2>&1
	rc=$?
fi
ran=$(grep -c -- '^--- PASS' "$artifacts/hostile.log")
fails=$(grep -c -- '--- FAIL' "$artifacts/hostile.log")
if [ "$rc" != 0 ]; then
	report FAIL "hostile: go test -run 'Hostile|Security|ProviderFault' ./... failed: $fails failing tests, first: $(grep -m1 -- '--- FAIL' "$artifacts/hostile.log" | sed 's/^ *//') (log: $artifacts/hostile.log) [$(($(date +%s) - t0))s]"
elif [ "$ran" = 0 ]; then
	report SKIP "hostile: no test matches Hostile|Security|ProviderFault yet [$(($(date +%s) - t0))s]"
else
	report PASS "hostile: $ran top-level and sub-tests of Hostile|Security|ProviderFault passed [$(($(date +%s) - t0))s]"
fi
psql -h 127.0.0.1 -U postgres -d test -qc "DROP DATABASE IF EXISTS $hostile_db WITH (FORCE)" >/dev/null 2>&1 || true
unset SANDBOXWICH_TEST_POSTGRES_URL
fi

# 6. Fuzzing: every fuzz target, found now (they are written concurrently),
#    gets its own `go test -fuzz` run. Quick runs share a budget for them:
#    once it is spent, the remaining targets of a package run their seed
#    corpus in one `go test` (every target is still checked, one line each).
fuzz_pkgs=$(grep -rlE --include='*_test.go' '^func Fuzz[A-Z0-9_]' . 2>/dev/null | xargs -r -n1 dirname | sort -u)
fuzz_deadline=$(($(date +%s) + fuzz_budget))
# fuzz_once DIR TARGET LOG: one -fuzz run of a target.
fuzz_once() {
	timeout --kill-after=10 5m go test -run '^$' -fuzz "^$2\$" -fuzztime "$fuzztime" "$1" >"$3" 2>&1
}
nfuzz=0
for dir in $fuzz_pkgs; do
	targets=$(go test -list '^Fuzz' "$dir" 2>/dev/null | grep -E '^Fuzz')
	seeds=()
	for t in $targets; do
		nfuzz=$((nfuzz + 1))
		t0=$(date +%s)
		if [ "$t0" -ge "$fuzz_deadline" ]; then
			seeds+=("$t")
			continue
		fi
		log="$artifacts/fuzz-$(echo "${dir#./}" | tr '/' '_')-$t.log"
		# Go's fuzzer can fail a run whose -fuzztime ends while a worker is
		# mid-input, with only "context deadline exceeded" and no failing
		# input (a race in the fuzzing engine): such a run is repeated once. A real
		# failure always writes its input and fails again.
		if fuzz_once "$dir" "$t" "$log" ||
			{ grep -q 'context deadline exceeded' "$log" && ! grep -q 'Failing input' "$log" &&
				fuzz_once "$dir" "$t" "$log"; }; then
			execs=$(grep -oE 'execs: [0-9]+' "$log" | tail -n 1)
			report PASS "fuzz $dir $t: -fuzz $fuzztime${execs:+, $execs} [$(($(date +%s) - t0))s]"
		elif [ "$quick" = 1 ] && [ ! -s "$log" ]; then
			# Nothing printed in the run's 5 minutes: still building the
			# package's fuzz-instrumented test binary (cmd/sandboxwich with
			# client-go, on a cold build cache and a busy machine). A quick
			# run cannot afford that build; the target's seeds run as a test.
			seeds+=("$t")
			fuzz_deadline=0
		else
			report FAIL "fuzz $dir $t: -fuzz $fuzztime: $(grep -m1 -E -- '--- FAIL|panic|Failing input' "$log" | sed 's/^ *//'); $(grep -m1 -E '^ +[a-z_]+_test\.go:[0-9]+: ' "$log" | sed 's/^ *//' | cut -c1-200) (log: $log; new failing inputs are kept under $dir/testdata/fuzz/$t) [$(($(date +%s) - t0))s]"
		fi
	done
	if [ "${#seeds[@]}" -gt 0 ]; then
		log="$artifacts/fuzz-$(echo "${dir#./}" | tr '/' '_')-seeds.log"
		pattern=$(IFS='|'; echo "${seeds[*]}")
		timeout --kill-after=10 5m go test -count=1 -v -run "^($pattern)\$" "$dir" >"$log" 2>&1
		for t in "${seeds[@]}"; do
			how="seed corpus only (quick fuzz budget of ${fuzz_budget}s spent)"
			if grep -q -- "^--- PASS: $t " "$log"; then
				report PASS "fuzz $dir $t: $how"
			else
				why=$(awk -v t="$t" 'index($0, "=== RUN   " t "/") == 1 || $0 == "=== RUN   " t { in_t = 1 }
					in_t && /_test\.go:[0-9]+: / { sub(/^ +/, ""); print; exit }' "$log" | cut -c1-200)
				report FAIL "fuzz $dir $t: $how: ${why:-see the log} (log: $log)"
			fi
		done
	fi
done
if [ "$nfuzz" = 0 ]; then
	report SKIP "fuzz: no fuzz target found yet"
fi

echo "== total $(($(date +%s) - started))s, artifacts in $artifacts"
if [ "$failed" = 0 ] && [ "${RELIABILITY_KEEP:-0}" != 1 ] && [ -z "${RELIABILITY_ARTIFACTS:-}" ]; then
	rm -rf "$artifacts"
fi
echo "reliability: $passed checks passed, $failed failed"
[ "$failed" = 0 ]
