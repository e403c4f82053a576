#!/usr/bin/env bash
# The test commands (README, "Test it"):
#   bash tests/run.sh           the suite: every test of the workspace on PostgreSQL, MariaDB,
#                               SQLite, Redis and RabbitMQ, the alert rules (promtool) and the
#                               console in a browser (headless Chromium)
#   bash tests/run.sh FILTER…   the same, only the tests cargo's FILTER selects
#   bash tests/run.sh --faults  the fast fault suite (scripts/chaos/run-all.sh --fast)
#   bash tests/run.sh --fuzz    the fuzz smoke: 15 s of each target under fuzz/
#   bash tests/run.sh --all     all three in that order: what CI runs (.ci/run)
# Each brings up the local services the tests talk to (PostgreSQL, MariaDB, Redis, RabbitMQ)
# when they are installed but down, and installs promtool and Chromium from Debian's packages
# when they are missing. A service that is missing is a loud failure, never a skip. The fault
# suite also needs initdb/pg_ctl, mariadb-install-db/mariadbd, sqlite3 and python3; the fuzz
# smoke the nightly toolchain (it installs cargo-fuzz from crates.io when it is missing).
set -euo pipefail
cd "$(dirname "$0")/.."

PG_URL="${PAYNOTIFY_TEST_PG_URL:-postgres://postgres@127.0.0.1:5432/postgres}"

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_for_port() {
  for _ in $(seq 1 60); do
    port_open "$1" && return 0
    sleep 0.5
  done
  return 1
}

ensure_postgres() {
  if [ -n "${PAYNOTIFY_TEST_PG_URL:-}" ] || port_open 5432; then return 0; fi
  if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
    echo "tests/run.sh: starting the local PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main start
    wait_for_port 5432 && return 0
  fi
  cat >&2 <<MSG
tests/run.sh: PostgreSQL is required on 127.0.0.1:5432 (trust auth for user postgres) and is
not running. Install it (Debian: apt-get install postgresql), start it, or point
PAYNOTIFY_TEST_PG_URL at a server where the tests may create databases.
MSG
  exit 1
}

ensure_redis() {
  if port_open 6379; then return 0; fi
  if command -v redis-server >/dev/null 2>&1; then
    echo "tests/run.sh: starting the local Redis"
    mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
      --dir "${TMPDIR:-/tmp}" --logfile "${TMPDIR:-/tmp}/paynotify-tests-redis.log"
    wait_for_port 6379 && return 0
  fi
  cat >&2 <<MSG
tests/run.sh: Redis is required on 127.0.0.1:6379 and is not running. Install it (Debian:
apt-get install redis-server) or start it.
MSG
  exit 1
}

ensure_mysql() {
  if [ -n "${PAYNOTIFY_TEST_MYSQL_URL:-}" ] || port_open 3306; then return 0; fi
  if [ -x /usr/sbin/mariadbd ]; then
    echo "tests/run.sh: starting the local MariaDB"
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
    wait_for_port 3306 && return 0
  fi
  cat >&2 <<MSG
tests/run.sh: MySQL or MariaDB is required on 127.0.0.1:3306 (user root, no password) and is
not running. Install it (Debian: apt-get install mariadb-server), start it, or point
PAYNOTIFY_TEST_MYSQL_URL at a server where the tests may create databases.
MSG
  exit 1
}

ensure_rabbitmq() {
  if port_open 5672; then return 0; fi
  if command -v rabbitmq-server >/dev/null 2>&1; then
    echo "tests/run.sh: starting the local RabbitMQ"
    rabbitmq-server -detached
    # The broker opens its port a few seconds after the VM starts.
    for _ in $(seq 1 120); do
      port_open 5672 && return 0
      sleep 0.5
    done
  fi
  cat >&2 <<MSG
tests/run.sh: RabbitMQ is required on 127.0.0.1:5672 (guest/guest, rabbitmqctl usable by this
user) and is not running. Install it (Debian: apt-get install rabbitmq-server) or start it.
MSG
  exit 1
}

# promtool, for the alert rules' checks and unit tests (tests/api/dashboards.rs).
ensure_promtool() {
  command -v promtool >/dev/null 2>&1 && return 0
  echo "tests/run.sh: installing promtool (Debian's prometheus package)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus >/dev/null ||
    { echo "tests/run.sh: promtool is required: apt-get install prometheus" >&2; exit 1; }
}

# Chromium and chromedriver, for the console's browser tests (tests/api/console.rs).
ensure_chromium() {
  [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] && return 0
  echo "tests/run.sh: installing Chromium and chromedriver (Debian's chromium, chromium-driver)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium chromium-driver >/dev/null ||
    { echo "tests/run.sh: the browser tests need: apt-get install chromium chromium-driver" >&2; exit 1; }
}

timed() {
  local started=$SECONDS
  "$@"
  echo "tests/run.sh: $1 ${2:-} done in $((SECONDS - started)) s" >&2
}

suite() {
  ensure_postgres
  ensure_mysql
  ensure_promtool
  ensure_chromium
  ensure_redis
  ensure_rabbitmq
  echo "tests/run.sh: PostgreSQL for tests at ${PG_URL%%@*}@…"
  # The consumer's tests run its example binary (consumer/tests/support builds it when it is
  # stale): built first with the same command, so no test waits beside a build of its own.
  cargo build --locked --quiet -p paynotify-consumer --example inventory
  cargo test --locked --workspace "$@"
}

# The fast part of the fault suite (docs/reliability.md): two instances on one database,
# database faults on PostgreSQL and on MariaDB, an SQLite storm, and failovers (PostgreSQL
# primary + standby, MariaDB semi-sync, Redis Sentinel) under a provider-like storm, on
# database servers, Redis and service processes of its own (never the services above).
faults() {
  cargo build --locked --bin paynotify
  local target_dir="${CARGO_TARGET_DIR:-target}"
  case "$target_dir" in /*) ;; *) target_dir="$PWD/$target_dir" ;; esac
  PAYNOTIFY_BIN="$target_dir/debug/paynotify" bash scripts/chaos/run-all.sh --fast
}

fuzz() {
  CHAOS_FAST=1 bash scripts/chaos/run-all.sh fuzz
}

case "${1:-}" in
  --all)
    timed suite
    timed faults
    timed fuzz
    ;;
  --faults) faults ;;
  --fuzz) fuzz ;;
  *) suite "$@" ;;
esac
