#!/usr/bin/env bash
# Installs Debian's busybox-static (a statically linked /bin/busybox) when
# it is not installed, and prints the binary's path on the last line. The
# gVisor driver's tests build a root filesystem of it alone (no C library,
# no /usr) to prove that the cell agent, a static binary, serves any root
# filesystem. Idempotent.
set -euo pipefail

bin=/bin/busybox
installed() { [ -x "$bin" ] && [ "$(dpkg-query -W -f='${Status}' busybox-static 2>/dev/null)" = "install ok installed" ]; }

if ! installed; then
	echo "install-busybox: installing busybox-static from Debian" >&2
	SUDO=""
	if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq busybox-static >/dev/null
fi
if ! installed; then
	echo "install-busybox: busybox-static did not install $bin" >&2
	exit 1
fi
echo "$bin"
