#!/usr/bin/env bash
# MariaDB failover under a provider-like storm: a primary and a replica of our own (two
# mariadb-install-db data directories, GTID replication, semi-synchronous with
# rpl_semi_sync_master_wait_point = AFTER_SYNC and a timeout of an hour, so it never falls
# back to asynchronous silently). kill -9 of the primary mid-storm, the replica promoted 1 s
# later (STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = 0, once it applied what it
# received).
# CHAOS_CASE (run-all.sh: mariadb-failover@CASE):
#   multihost (default): paynotify on mysql://root@127.0.0.1:P1,127.0.0.1:P2/paynotify and
#     follows the promotion itself (contract: "MariaDB/MySQL, several hosts").
#   restart: paynotify on the primary alone, and after the promotion restarted on the
#     replica's URL, as docs/operations.md's runbook does by hand.
# Checks on the promoted replica (storm.py report): every order answered 2xx is PAID with one
# callback row and one ORDER_PAID, delivered by the log sink; nothing paid twice; only
# 2xx/503 (or no answer); the time from the fault to the first payment acknowledged after it.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/failover-lib.sh"
case ${CHAOS_CASE:-multihost} in
multihost) MULTI=1 ;;
restart) MULTI=0 ;;
*) echo "mariadb-failover: CHAOS_CASE must be multihost or restart" >&2; exit 2 ;;
esac
chaos_begin mariadb-failover
storm_sizes
command -v mariadb-install-db >/dev/null || die "mariadb-install-db not found (apt-get install mariadb-server)"

declare -A MNODE_PORT=() MNODE_PID=()
mnode_sock() { echo "$T/$1/sock"; }
mnode_sql() {
  local n=$1
  shift
  mariadb --no-defaults --socket="$(mnode_sock "$n")" -uroot -N -B "$@"
}
mnode_ping() { mariadb-admin --no-defaults --socket="$(mnode_sock "$1")" -uroot ping >/dev/null 2>&1; }
# mnode_start N SERVER_ID ROLE_ARGS...: mariadbd on N's directory and port, binary log on.
mnode_start() {
  local n=$1 id=$2
  shift 2
  # shellcheck disable=SC2046
  mariadbd --no-defaults $(my_user_args) --datadir="$T/$n/data" --port="${MNODE_PORT[$n]}" \
    --bind-address=127.0.0.1 --socket="$(mnode_sock "$n")" --pid-file="$T/$n/pid" \
    --log-error="$T/$n/log" --innodb-buffer-pool-size=64M --innodb-flush-log-at-trx-commit=1 \
    --max-connections=200 --server-id="$id" --log-bin="$T/$n/data/binlog" --log-slave-updates \
    --binlog-format=ROW --sync-binlog=1 --gtid-strict-mode=1 \
    --rpl-semi-sync-slave-enabled=ON --rpl-semi-sync-master-wait-point=AFTER_SYNC --rpl-semi-sync-master-timeout=3600000 \
    "$@" >/dev/null 2>&1 </dev/null &
  MNODE_PID[$n]=$!
  track $!
  wait_until 60 mnode_ping "$n" || die "MariaDB $n did not start: $(tail -n 5 "$T/$n/log")"
}
mnode_init() {
  local n=$1
  MNODE_PORT[$n]=$(free_port)
  mkdir -p "$T/$n"
  [ "$(id -u)" = 0 ] && chown mysql "$T/$n"
  # shellcheck disable=SC2046
  mariadb-install-db --no-defaults $(my_user_args) --datadir="$T/$n/data" --skip-test-db \
    --auth-root-authentication-method=normal >"$T/$n/install.log" 2>&1 ||
    die "mariadb-install-db failed: $(tail -n 3 "$T/$n/install.log")"
}
mnode_gone() { ! kill -0 "${MNODE_PID[$1]}" 2>/dev/null; }
mnode_status() { mnode_sql "$1" -e "SHOW GLOBAL STATUS LIKE '$2'" | cut -f 2; }
semisync_on() { [ "$(mnode_status m1 Rpl_semi_sync_master_status)" = ON ] && [ "$(mnode_status m1 Rpl_semi_sync_master_clients)" -ge 1 ]; }
# The replica applied every event it received (the primary is gone: nothing more comes).
relay_applied() {
  mariadb --no-defaults --socket="$(mnode_sock m2)" -uroot -e "SHOW SLAVE STATUS\G" >"$T/slave-status" 2>/dev/null ||
    return 1
  local read exec rf ef
  read=$(sed -n 's/^ *Read_Master_Log_Pos: //p' "$T/slave-status")
  exec=$(sed -n 's/^ *Exec_Master_Log_Pos: //p' "$T/slave-status")
  rf=$(sed -n 's/^ *Master_Log_File: //p' "$T/slave-status")
  ef=$(sed -n 's/^ *Relay_Master_Log_File: //p' "$T/slave-status")
  [ -n "$read" ] && [ "$read" = "$exec" ] && [ "$rf" = "$ef" ]
}

mnode_init m1
mnode_init m2
# Semi-sync on the primary only: a replica with it on (and log_slave_updates) would wait for
# an acknowledgement of its own before applying the next event. The promoted replica has no
# replica of its own here, so it writes on alone (with a second replica, turn it on there).
mnode_start m1 1 --rpl-semi-sync-master-enabled=ON
mnode_start m2 2 --read-only=1
# The accounts on each server alone (not replicated); the database through replication.
for n in m1 m2; do
  mnode_sql "$n" -e "SET sql_log_bin = 0; CREATE USER IF NOT EXISTS 'root'@'127.0.0.1';
    GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION" || die "MariaDB $n set-up failed"
done
mnode_sql m2 -e "CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = ${MNODE_PORT[m1]},
  MASTER_USER = 'root', MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1; START SLAVE" ||
  die "replication set-up failed"
wait_until 30 semisync_on || die "semi-synchronous replication is not on: $(mnode_sql m1 -e "SHOW GLOBAL STATUS LIKE 'Rpl_semi%'" | tr '\n' ' ')"
mnode_sql m1 -e "CREATE DATABASE paynotify" || die "CREATE DATABASE failed"
log "primary m1 on ${MNODE_PORT[m1]}, replica m2 on ${MNODE_PORT[m2]} (GTID, semi-sync AFTER_SYNC)"

# lib.sh's sql() and my_sock read these.
MY_PORT=${MNODE_PORT[m1]}
if [ "$MULTI" = 1 ]; then
  DB_URL="mysql://root@127.0.0.1:${MNODE_PORT[m1]},127.0.0.1:${MNODE_PORT[m2]}/paynotify"
else
  DB_URL="mysql://root@127.0.0.1:${MNODE_PORT[m1]}/paynotify"
fi
sandbox_init
PN_ENV=(PAYNOTIFY__DATABASE__AUTO_MIGRATE=false PAYNOTIFY__RELAY__SINK=log
  PAYNOTIFY__RELAY__INTERVAL_MS=200)
pn_migrate
PORT_A=$(free_port)
pn_start a "$PORT_A"
U=$(pn_url a)
storm_prepare "$U"
semisync_on || die "semi-synchronous replication fell back before the storm"

storm_start "$U"
storm_until_fault
mark_fault "kill -9 of the primary m1, m2 promoted 1 s later"
kill -KILL "${MNODE_PID[m1]}"
wait "${MNODE_PID[m1]}" 2>/dev/null
wait_until 10 mnode_gone m1 || fail "m1 did not die"
sleep 1
wait_until 30 relay_applied || die "m2 did not apply its relay log within 30 s"
mnode_sql m2 -e "STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = 0" || die "promoting m2 failed"
log "m2 promoted"
if [ "$MULTI" != 1 ]; then
  pn_kill9 a
  DB_URL="mysql://root@127.0.0.1:${MNODE_PORT[m2]}/paynotify"
  pn_start a "$PORT_A"
  log "paynotify restarted on m2's URL"
fi
wait_until 60 ack_since "$FAULT_AT" || fail "no 2xx within 60 s of the fault"
storm_wait || fail "the storm did not end with every delivery answered 2xx"
MY_PORT=${MNODE_PORT[m2]}
outbox_drained_m2() { [ "$(mnode_sql m2 -D paynotify -e "SELECT count(*) FROM local_message WHERE status <> 1")" = 0 ]; }
wait_until 60 outbox_drained_m2 || fail "outbox not drained on m2"

mnode_sql m2 -D paynotify -e "SET time_zone = '+00:00'; SELECT o.order_no, o.status,
    coalesce(CAST(UNIX_TIMESTAMP(c.created_at) AS CHAR), ''),
    (SELECT count(*) FROM local_message m WHERE m.topic = 'ORDER_PAID' AND m.biz_key = o.order_no),
    (SELECT count(*) FROM local_message m WHERE m.topic = 'PAYMENT_ANOMALY'
       AND (m.biz_key = o.order_no OR m.biz_key LIKE CONCAT(o.order_no, ':%')))
  FROM orders o LEFT JOIN pay_callback c ON c.out_trade_no = o.order_no
  WHERE o.order_no LIKE 'F_-%'" >"$T/db.tsv" || fail "the dump of the promoted replica failed"
log_sink_keys "$T/delivered" "$T"/pn-*.log
storm_report "$T/db.tsv" "$T/delivered"
check_logs_clean "$T"/pn-*.log
pn_alive a || fail "the service died"
log "readyz now: $(readyz_body "$U")"
pn_term a || fail "no exit within 20 s of SIGTERM"
chaos_end
