#!/usr/bin/env bash
# Runs every fault scenario (or the fast subset with --fast) and ends with "N passed, M failed".
#   scripts/chaos/run-all.sh            every scenario at full size (the soak alone takes 10 min)
#   scripts/chaos/run-all.sh --fast     two-instances, db-faults, mariadb-faults, sqlite-storm
#                                       with a few dozen orders, and the failover scenarios with
#                                       a small storm (tests/run.sh --faults)
#   CHAOS_FAST=1 scripts/chaos/run-all.sh fuzz
#                                       15 s of each fuzz target (tests/run.sh --fuzz)
#   scripts/chaos/run-all.sh NAME...    only these scenarios (file names without .sh; NAME@mariadb
#                                       runs a scenario that calls db_start on MariaDB; any other
#                                       NAME@CASE sets CHAOS_CASE, e.g. pg-failover@kill)
# patroni-failover also starts an etcd and two Patroni nodes of its own (Debian's patroni and
# etcd-server, installed by the scenario when missing).
# Each scenario starts its own PostgreSQL, MariaDB, Redis and paynotify processes on free ports under a
# temporary directory and stops them at the end; the shared services are never touched.
# PAYNOTIFY_BIN names the binary (default: target/debug/paynotify; build it first).

# One brace group: bash reads all of it before running any, so a run is never changed by an
# edit of this file while it runs.
{
set -uo pipefail
cd "$(dirname "$0")"

# The failover scenarios (pg-failover@CASE, patroni-failover@CASE, mariadb-failover@CASE,
# redis-failover@CASE) run
# with a smaller storm in fast mode (CHAOS_FAST=1: 200 orders x 3 deliveries at 50/s).
FAILOVER=(pg-failover@kill pg-failover@switchover pg-failover@sync-stall pg-failover@async-lag
  patroni-failover@kill patroni-failover@switchover mariadb-failover redis-failover)
ALL=(two-instances two-instances@mariadb db-faults mariadb-faults redis-faults redis-faults@mariadb
  process-death process-death@mariadb relay-lease sqlite-storm hostile-input "${FAILOVER[@]}"
  mariadb-failover@restart fuzz soak)
FAST=(two-instances db-faults mariadb-faults sqlite-storm "${FAILOVER[@]}")
if [ "${1:-}" = --fast ]; then
  shift
  export CHAOS_ORDERS=${CHAOS_ORDERS:-30} CHAOS_FAST=1
  names=("${FAST[@]}")
elif [ $# -gt 0 ]; then
  names=("$@")
else
  names=("${ALL[@]}")
fi

passed=0
failed=0
failures=()
for name in "${names[@]}"; do
  script=./${name%@*}.sh
  db=postgres
  case_=""
  # NAME@postgres / NAME@mariadb: the database; any other NAME@CASE: the scenario's case.
  if [ "$name" != "${name%@*}" ]; then
    case ${name#*@} in
    postgres | mariadb) db=${name#*@} ;;
    *) case_=${name#*@} ;;
    esac
  fi
  if [ ! -f "$script" ]; then
    echo "run-all: no scenario $name" >&2
    failed=$((failed + 1))
    failures+=("$name")
    continue
  fi
  echo "=== $name" >&2
  started=$SECONDS
  # A bound on each scenario, whatever happens inside it. The fuzz scenario's first run builds
  # the instrumented targets with nightly (cargo-fuzz install and 15 minutes of build on 2
  # cores, before a minute of fuzzing): it gets an hour.
  limit=${CHAOS_SCENARIO_TIMEOUT:-1200}
  [ "$name" = fuzz ] && limit=${CHAOS_FUZZ_TIMEOUT:-3600}
  if CHAOS_DB=$db CHAOS_CASE=$case_ timeout -k 10 "$limit" bash "$script"; then
    passed=$((passed + 1))
    echo "=== $name: passed in $((SECONDS - started)) s" >&2
  else
    failed=$((failed + 1))
    failures+=("$name")
    echo "=== $name: FAILED after $((SECONDS - started)) s" >&2
  fi
done
[ "$failed" = 0 ] || echo "failed: ${failures[*]}" >&2
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
exit
}
