#!/usr/bin/env bash
# Starts the local PostgreSQL cluster when it is down (installing it when
# missing), and waits until it accepts connections on 127.0.0.1:5432.
set -euo pipefail
if pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then exit 0; fi
if ! command -v pg_ctlcluster >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi
version=$(ls /etc/postgresql | sort -V | tail -n 1)
pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
for _ in $(seq 1 60); do
  if pg_isready -h 127.0.0.1 -p 5432 -q; then exit 0; fi
  sleep 0.5
done
echo "start-postgres: PostgreSQL did not come up on 127.0.0.1:5432" >&2
exit 1
