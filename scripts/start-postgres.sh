#!/usr/bin/env bash
# Makes PostgreSQL answer on 127.0.0.1:5432 for the tests: user postgres
# without a password, database "test". Idempotent: returns at once when that
# already works.
#
# It never touches a system cluster. It runs a private cluster of its own:
#   - PostgreSQL's server binaries come from Debian (installed when missing);
#   - the cluster lives in ${SANDBOXWICH_PG_DIR:-/tmp/sandboxwich-pg}, made
#     by initdb with `trust` authentication, owned by the user "postgres"
#     when this runs as root (initdb refuses root), by the caller otherwise;
#   - it listens on 127.0.0.1 only (trust is therefore loopback-only), with
#     its Unix socket in the same folder, and logs to postgres.log there.
# Stop it with: pg_ctl -D "${SANDBOXWICH_PG_DIR:-/tmp/sandboxwich-pg}/data" stop
# (as the user that owns it).
set -euo pipefail

dir="${SANDBOXWICH_PG_DIR:-/tmp/sandboxwich-pg}"
port=5432

usable() {
	psql "postgres://postgres@127.0.0.1:$port/test?sslmode=disable&connect_timeout=3" -Atqc 'select 1' >/dev/null 2>&1
}

if command -v psql >/dev/null 2>&1 && usable; then exit 0; fi

bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
if [ -z "$bindir" ] || [ ! -x "$bindir/initdb" ]; then
	echo "start-postgres: installing PostgreSQL from Debian" >&2
	SUDO=""
	if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql >/dev/null
	bindir=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
	# Where the package's post-install started its own cluster, stop it:
	# this script just made it, and the port is the test cluster's.
	$SUDO pg_ctlcluster --skip-systemctl-redirect "$(basename "$(dirname "$bindir")")" main stop 2>/dev/null || true
fi

# Something else on the port that does not let postgres in without a
# password (a system cluster, say): say so instead of fighting it.
if "$bindir/pg_isready" -h 127.0.0.1 -p "$port" -q 2>/dev/null; then
	if "$bindir/psql" "postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable&connect_timeout=3" -Atqc 'select 1' >/dev/null 2>&1; then
		"$bindir/psql" "postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable" -qc 'CREATE DATABASE test'
		exit 0
	fi
	echo "start-postgres: a server on 127.0.0.1:$port does not let user postgres in without a password;" \
		"stop it (e.g. pg_ctlcluster <version> main stop) so the test cluster can run there" >&2
	exit 1
fi

as_owner=()
owner=$(id -un)
if [ "$(id -u)" = "0" ]; then
	owner=postgres
	as_owner=(runuser -u postgres --)
fi
mkdir -p "$dir"
chown "$owner" "$dir"
chmod 0700 "$dir"
if [ ! -s "$dir/data/PG_VERSION" ]; then
	rm -rf "$dir/data"
	"${as_owner[@]}" "$bindir/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log"
fi
"${as_owner[@]}" "$bindir/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 \
	-o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c max_connections=300" start >/dev/null
for _ in $(seq 1 60); do
	if "$bindir/pg_isready" -h 127.0.0.1 -p "$port" -q; then
		"$bindir/psql" "postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable" -Atqc \
			"SELECT 1 FROM pg_database WHERE datname = 'test'" | grep -q 1 ||
			"$bindir/psql" "postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable" -qc 'CREATE DATABASE test'
		usable && exit 0
	fi
	sleep 0.5
done
echo "start-postgres: PostgreSQL did not come up on 127.0.0.1:$port (log: $dir/postgres.log)" >&2
exit 1
