#!/usr/bin/env bash
# Installs gVisor's runsc from the Debian archive when it is missing, then
# prints its version. Idempotent: a second run only prints the version.
#
#   scripts/install-runsc.sh
#
# The gVisor driver (driver/gvisor) and its tests need runsc; CI runs this
# before the tests. Needs root (or sudo) for apt-get.
set -euo pipefail

if ! command -v runsc >/dev/null 2>&1; then
	SUDO=""
	if [ "$(id -u)" != "0" ]; then
		SUDO="sudo"
	fi
	export DEBIAN_FRONTEND=noninteractive
	$SUDO apt-get update -qq
	$SUDO apt-get install -y -qq runsc >/dev/null
fi

runsc --version
