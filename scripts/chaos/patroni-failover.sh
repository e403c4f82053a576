#!/usr/bin/env bash
# PostgreSQL failover by Patroni under a provider-like storm: one etcd of our own, two Patroni
# nodes (n1, n2: their own REST API and PostgreSQL ports, data under $T) in strict synchronous
# mode (synchronous_mode, synchronous_mode_strict, synchronous_commit on; ttl/loop_wait/
# retry_timeout 10/1/3 so a failover takes seconds), paynotify on the multi-host URL
# postgres://…@127.0.0.1:P1,127.0.0.1:P2/paynotify?target_session_attrs=read-write. Here Patroni,
# not this script, decides and performs the promotion (pg-failover.sh does it by pg_ctl promote).
#
# One case per run, CHAOS_CASE (run-all.sh: patroni-failover@CASE):
#   kill        a crashed leader host: kill -9 of the leader's Patroni, then of its PostgreSQL
#               (postmaster and every backend). Patroni promotes the synchronous standby once
#               the leader key expires (ttl); the old leader's Patroni is started again once
#               the new leader is there and rejoins as its synchronous standby (pg_rewind if
#               needed). Strict mode: writes wait until it does.
#   switchover  a planned switchover: `patronictl switchover --force` to the synchronous standby;
#               Patroni demotes the leader and restarts it as the new leader's standby.
# Checks (storm.py report, on the leader at the end): every order answered 2xx is PAID with one
# callback row and one ORDER_PAID, delivered by the sink at least once; nothing paid twice;
# only 2xx/503 (or no answer); the time from the fault to the first 2xx after it; the leader
# changed; both nodes streaming and synchronous again at the end.
#
# Needs Debian's patroni (3.x) and etcd-server (3.4+): when `patroni` or `etcd` is missing and
# this runs as root, it installs them (apt-get install patroni etcd-server); when that fails,
# the scenario fails (it never falls back to pg_ctl promote: that is pg-failover.sh).
# CHAOS_PATRONI_TTL, CHAOS_PATRONI_LOOP_WAIT, CHAOS_PATRONI_RETRY_TIMEOUT change the timings.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/failover-lib.sh"
CASE=${CHAOS_CASE:-kill}
case $CASE in kill | switchover) ;; *)
  echo "patroni-failover: CHAOS_CASE must be kill or switchover" >&2
  exit 2
  ;;
esac
chaos_begin patroni-failover
storm_sizes
TTL=${CHAOS_PATRONI_TTL:-10}
LOOP_WAIT=${CHAOS_PATRONI_LOOP_WAIT:-1}
RETRY_TIMEOUT=${CHAOS_PATRONI_RETRY_TIMEOUT:-3}

if ! command -v patroni >/dev/null || ! command -v patronictl >/dev/null || ! command -v etcd >/dev/null; then
  [ "$(id -u)" = 0 ] || die "patroni or etcd missing, and not root to install them (apt-get install patroni etcd-server)"
  log "patroni or etcd missing: apt-get install patroni etcd-server"
  timeout 600 env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
    patroni etcd-server >"$T/apt.log" 2>&1 ||
    die "apt-get install patroni etcd-server failed (the scenario needs them; pg-failover.sh is the pg_ctl promote version): $(tail -n 3 "$T/apt.log")"
  command -v patroni >/dev/null && command -v etcd >/dev/null || die "patroni or etcd still missing after apt-get install"
fi
[ -x "$PGBIN/pg_ctl" ] || die "no PostgreSQL binaries under $PGBIN (set PGBIN)"

# --- etcd of our own ------------------------------------------------------------------------
ETCD_PORT=$(free_port)
ETCD_PEER_PORT=$(free_port)
mkdir -p "$T/etcd"
etcd --name chaos --data-dir "$T/etcd/data" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster "chaos=http://127.0.0.1:$ETCD_PEER_PORT" --initial-cluster-state new \
  --initial-cluster-token "chaos-$$" >"$T/etcd/log" 2>&1 </dev/null &
ETCD_PID=$!
track "$ETCD_PID"
etcd_up() { curl -s --max-time 2 "http://127.0.0.1:$ETCD_PORT/health" | grep -q '"health":"true"'; }
wait_until 30 etcd_up || die "etcd did not come up: $(tail -n 3 "$T/etcd/log")"

# --- two Patroni nodes ----------------------------------------------------------------------
declare -A NODE_PORT=() NODE_REST=() NODE_DATA=() PATRONI_PID=()
SCOPE=paynotify-chaos-$$
node_psql() {
  local n=$1
  shift
  # Bounded: in strict synchronous mode a write on a leader without a standby waits for one.
  PGCONNECT_TIMEOUT=3 timeout 30 psql -X -q -h 127.0.0.1 -p "${NODE_PORT[$n]}" -U postgres -v ON_ERROR_STOP=1 "$@"
}
node_pid() { head -n 1 "${NODE_DATA[$1]}/postmaster.pid" 2>/dev/null; }
# rest N PATH: the HTTP status of Patroni's REST API on node N (000 when it does not answer).
rest() { curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:${NODE_REST[$1]}$2"; }
node_is_leader() { [ "$(rest "$1" /primary)" = 200 ]; }
# node_sync_standby N: N is the synchronous standby (Patroni's view, and PostgreSQL's).
node_sync_standby() { [ "$(rest "$1" /sync)" = 200 ]; }
node_is_primary() { [ "$(node_psql "$1" -d postgres -At -c "SELECT NOT pg_is_in_recovery()" 2>/dev/null)" = t ]; }
node_sync() {
  [ "$(node_psql "$1" -d postgres -At -c "SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')" 2>/dev/null)" -ge 1 ] 2>/dev/null
}
other() { if [ "$1" = n1 ]; then echo n2; else echo n1; fi; }
leader() {
  local n
  for n in n1 n2; do node_is_leader "$n" && echo "$n" && return 0; done
  return 1
}
members() { patronictl -c "$T/n1/patroni.yml" list 2>/dev/null | sed -n 's/^| \(n[12]\) .*/&/p' | tr -s ' ' | tr '\n' ' '; }

node_config() {
  local n=$1
  NODE_PORT[$n]=$(free_port)
  NODE_REST[$n]=$(free_port)
  NODE_DATA[$n]=$T/$n/data
  mkdir -p "$T/$n"
  [ "$(id -u)" = 0 ] && chown postgres "$T/$n"
  cat >"$T/$n/patroni.yml" <<YML
scope: $SCOPE
namespace: /service/
name: $n
restapi:
  listen: 127.0.0.1:${NODE_REST[$n]}
  connect_address: 127.0.0.1:${NODE_REST[$n]}
etcd3:
  hosts: 127.0.0.1:$ETCD_PORT
bootstrap:
  dcs:
    ttl: $TTL
    loop_wait: $LOOP_WAIT
    retry_timeout: $RETRY_TIMEOUT
    synchronous_mode: true
    synchronous_mode_strict: true
    synchronous_node_count: 1
    maximum_lag_on_failover: 0
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        synchronous_commit: "on"
        wal_level: replica
        hot_standby: "on"
        wal_log_hints: "on"
        max_wal_senders: 10
        max_replication_slots: 10
        max_connections: 200
        wal_keep_size: 256MB
  initdb:
    - encoding: UTF8
    - no-sync
  pg_hba:
    - local all all trust
    - host replication all 127.0.0.1/32 trust
    - host all all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:${NODE_PORT[$n]}
  connect_address: 127.0.0.1:${NODE_PORT[$n]}
  data_dir: ${NODE_DATA[$n]}
  bin_dir: $PGBIN
  pgpass: $T/$n/pgpass
  authentication:
    superuser:
      username: postgres
      password: chaos
    replication:
      username: replicator
      password: chaos
    rewind:
      username: rewind_user
      password: chaos
  parameters:
    unix_socket_directories: $T/$n
tags:
  nofailover: false
  noloadbalance: false
  clonefrom: false
  nosync: false
YML
  chmod 644 "$T/$n/patroni.yml"
}
# patroni_start N: Patroni of node N in the background, as the postgres user when root (setpriv
# execs, so the tracked pid is Patroni's own).
patroni_start() {
  local n=$1
  local -a as=()
  [ "$(id -u)" = 0 ] && as=(setpriv --reuid=postgres --regid=postgres --init-groups)
  (cd "$T/$n" && exec env HOME="$T/$n" "${as[@]}" patroni "$T/$n/patroni.yml") >>"$T/$n/patroni.log" 2>&1 </dev/null &
  PATRONI_PID[$n]=$!
  track "$!"
}
patroni_gone() { ! kill -0 "${PATRONI_PID[$1]}" 2>/dev/null; }
pid_gone() { ! kill -0 "$1" 2>/dev/null; }

stop_nodes() {
  local n pid
  for n in "${!PATRONI_PID[@]}"; do kill -TERM "${PATRONI_PID[$n]}" 2>/dev/null; done
  for n in "${!PATRONI_PID[@]}"; do wait_until 30 patroni_gone "$n" || kill -KILL "${PATRONI_PID[$n]}" 2>/dev/null; done
  # What Patroni left running (it was killed, or did not stop PostgreSQL in time).
  for n in "${!NODE_DATA[@]}"; do
    [ -f "${NODE_DATA[$n]}/postmaster.pid" ] || continue
    pid=$(node_pid "$n")
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || continue
    as_pg "$PGBIN/pg_ctl" -D "${NODE_DATA[$n]}" -m immediate -w -t 20 stop >/dev/null 2>&1
  done
}
trap 'rc=$?; stop_nodes; (exit $rc); chaos_cleanup' EXIT

node_config n1
node_config n2
patroni_start n1
wait_until 90 node_is_leader n1 || die "Patroni n1 did not bootstrap a leader: $(tail -n 5 "$T/n1/patroni.log")"
patroni_start n2
wait_until 90 node_sync_standby n2 || die "n2 did not become the synchronous standby: $(tail -n 5 "$T/n2/patroni.log")"
wait_until 30 node_sync n1 || die "n1 sees no synchronous standby"
# Strict synchronous mode: the leader commits nothing (not even CREATE DATABASE) until a
# synchronous standby is there.
node_psql n1 -d postgres -c "CREATE DATABASE paynotify" >/dev/null || die "CREATE DATABASE failed"
log "etcd on $ETCD_PORT; Patroni n1 (PostgreSQL ${NODE_PORT[n1]}, REST ${NODE_REST[n1]}) leader, n2 (${NODE_PORT[n2]}, REST ${NODE_REST[n2]}) synchronous standby; ttl/loop_wait/retry_timeout $TTL/$LOOP_WAIT/$RETRY_TIMEOUT; case $CASE"
log "members: $(members)"
PG_PORT=${NODE_PORT[n1]}
DB_URL="postgres://postgres@127.0.0.1:${NODE_PORT[n1]},127.0.0.1:${NODE_PORT[n2]}/paynotify?target_session_attrs=read-write&connect_timeout=2"

sandbox_init
provider_start
PN_ENV=(PAYNOTIFY__DATABASE__AUTO_MIGRATE=false PAYNOTIFY__RELAY__SINK=log
  PAYNOTIFY__RELAY__INTERVAL_MS=200)
pn_migrate
pn_start a "$(free_port)"
U=$(pn_url a)
storm_prepare "$U"

storm_start "$U"
storm_until_fault
OLD=n1
NEW=n2
case $CASE in
kill)
  pgpid=$(node_pid n1)
  [ -n "$pgpid" ] || die "no postmaster.pid on n1"
  mark_fault "kill -9 of the leader n1's Patroni, then of its PostgreSQL (a crashed host)"
  kids=$(pgrep -P "$pgpid")
  # stderr: bash's "Killed" notice for the background job, not news here.
  {
    kill -KILL "${PATRONI_PID[n1]}"
    # shellcheck disable=SC2086
    kill -KILL "$pgpid" $kids
    wait_until 10 patroni_gone n1 && wait "${PATRONI_PID[n1]}"
  } 2>/dev/null
  patroni_gone n1 || fail "n1's Patroni did not die"
  wait_until 10 pid_gone "$pgpid" || fail "n1's PostgreSQL did not die"
  wait_until $((TTL * 4 + 20)) node_is_leader n2 || fail "Patroni did not promote n2 within $((TTL * 4 + 20)) s"
  PROMOTED=$(awk -v a="$FAULT_AT" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}')
  log "Patroni promoted n2 $PROMOTED s after the fault; n1's Patroni started again"
  patroni_start n1
  wait_until 90 node_sync_standby n1 || fail "n1 did not rejoin as the synchronous standby: $(tail -n 5 "$T/n1/patroni.log")"
  log "n1 the synchronous standby again $(awk -v a="$FAULT_AT" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}') s after the fault"
  ;;
switchover)
  mark_fault "patronictl switchover --force from n1 to n2"
  timeout 60 patronictl -c "$T/n1/patroni.yml" switchover --leader n1 --candidate n2 --force \
    >"$T/switchover.log" 2>&1 || fail "patronictl switchover failed: $(tail -n 3 "$T/switchover.log")"
  wait_until 60 node_is_leader n2 || fail "n2 is not the leader after the switchover"
  PROMOTED=$(awk -v a="$FAULT_AT" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}')
  log "n2 leader $PROMOTED s after the switchover began"
  wait_until 90 node_sync_standby n1 || fail "n1 did not come back as the synchronous standby: $(tail -n 5 "$T/n1/patroni.log")"
  log "n1 the synchronous standby $(awk -v a="$FAULT_AT" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}') s after the switchover began"
  ;;
esac
PG_PORT=${NODE_PORT[$NEW]}
wait_until 90 ack_since "$FAULT_AT" || fail "no 2xx within 90 s of the fault"
storm_wait || fail "the storm did not end with every delivery answered 2xx"
[ "$(leader)" = "$NEW" ] || fail "the leader at the end is '$(leader)', expected $NEW"
node_is_primary "$NEW" || fail "$NEW's PostgreSQL is not a primary"
node_sync "$NEW" || fail "$NEW has no synchronous standby at the end"
log "members: $(members)"
drain_from=$SECONDS
wait_drained 90
log "outbox drained $((SECONDS - drain_from)) s after the storm's end"

node_psql "$NEW" -d paynotify -At -F $'\t' -c "SELECT o.order_no, o.status,
    coalesce(extract(epoch FROM c.created_at)::text, ''),
    (SELECT count(*) FROM local_message m WHERE m.topic = 'ORDER_PAID' AND m.biz_key = o.order_no),
    (SELECT count(*) FROM local_message m WHERE m.topic = 'PAYMENT_ANOMALY'
       AND (m.biz_key = o.order_no OR m.biz_key LIKE o.order_no || ':%'))
  FROM orders o LEFT JOIN pay_callback c ON c.out_trade_no = o.order_no
  WHERE o.order_no LIKE 'F_-%'" >"$T/db.tsv" || fail "the dump of the new leader failed"
log_sink_keys "$T/delivered" "$T"/pn-*.log
storm_report "$T/db.tsv" "$T/delivered"
check_logs_clean "$T"/pn-*.log
pn_alive a || fail "the service died"
log "readyz now: $(readyz_body "$U")"
log "failovers counted: $(curl -s "$U/metrics" | grep -E '^paynotify_database_failovers_total' | tr '\n' ' ')"
pn_term a || fail "no exit within 20 s of SIGTERM"
[ "$OLD" != "$NEW" ] || fail "no leader change"
chaos_end
