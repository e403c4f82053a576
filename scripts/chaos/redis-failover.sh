#!/usr/bin/env bash
# Redis failover under a provider-like storm: a Redis master and a replica of our own, three
# sentinels (redis-server CONF --sentinel, quorum 2, down-after 1 s), two paynotify instances
# with the gate and the Redis Streams sink, one PostgreSQL of our own. Mid-storm the master is
# stopped (SIGSTOP) for CHAOS_STOP_SECS (default 5): the sentinels promote the replica; the old
# master, continued, is demoted to a replica of the new one and drops what was written to it
# meanwhile.
# CHAOS_CASE (run-all.sh: redis-failover@CASE):
#   sentinel (default): paynotify through the sentinels (contract: [redis] sentinels,
#     sentinel_master; wait_replicas 1: an XADD is marked sent only once WAIT confirmed it).
#   direct: paynotify on the master's own URL (what a deployment without sentinel support
#     does): measures what a Redis failover costs then.
# Checks: nothing paid twice, every order answered 2xx PAID with one callback row and one
# ORDER_PAID, every ORDER_PAID in the stream on the new master at least once, only 2xx/503.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/failover-lib.sh"
case ${CHAOS_CASE:-sentinel} in sentinel | direct) ;; *)
  echo "redis-failover: CHAOS_CASE must be sentinel or direct" >&2
  exit 2
  ;;
esac
MODE=${CHAOS_CASE:-sentinel}
chaos_begin redis-failover
storm_sizes
STOP=${CHAOS_STOP_SECS:-5}

pg_start
redis_start
RM=$REDIS_PORT
RR=$(free_port)
mkdir -p "$T/redis-$RR"
redis-server --port "$RR" --bind 127.0.0.1 --save "" --appendonly no --replicaof 127.0.0.1 "$RM" \
  --dir "$T/redis-$RR" --logfile "$T/redis-$RR/log" >/dev/null 2>&1 </dev/null &
REDIS_PID[$RR]=$!
track $!
wait_until 10 redis_ping "$RR" || die "the replica on $RR did not answer"
replica_linked() { rcli "$RR" INFO replication | grep -q '^master_link_status:up'; }
wait_until 20 replica_linked || die "the replica did not sync"

SENTINELS=()
for _ in 1 2 3; do
  sp=$(free_port)
  mkdir -p "$T/sentinel-$sp"
  cat >"$T/sentinel-$sp/sentinel.conf" <<CONF
port $sp
bind 127.0.0.1
daemonize no
dir $T/sentinel-$sp
logfile $T/sentinel-$sp/log
sentinel monitor pn 127.0.0.1 $RM 2
sentinel down-after-milliseconds pn 1000
sentinel failover-timeout pn 10000
sentinel parallel-syncs pn 1
CONF
  redis-server "$T/sentinel-$sp/sentinel.conf" --sentinel >/dev/null 2>&1 </dev/null &
  track $!
  wait_until 10 redis_ping "$sp" || die "sentinel on $sp did not answer"
  SENTINELS+=("$sp")
done
master_port() { rcli "${SENTINELS[0]}" SENTINEL get-master-addr-by-name pn 2>/dev/null | sed -n 2p; }
sentinels_know_all() {
  [ "$(rcli "${SENTINELS[0]}" SENTINEL master pn | awk 'prev == "num-other-sentinels" {print} {prev = $0}')" = 2 ] &&
    [ "$(rcli "${SENTINELS[0]}" SENTINEL master pn | awk 'prev == "num-slaves" {print} {prev = $0}')" = 1 ]
}
wait_until 30 sentinels_know_all || die "the sentinels do not see each other and the replica"
log "Redis master $RM, replica $RR, sentinels ${SENTINELS[*]} ($MODE)"

sandbox_init
capture_start
PN_ENV=(PAYNOTIFY__DATABASE__AUTO_MIGRATE=false PAYNOTIFY__RELAY__SINK=redis-stream
  PAYNOTIFY__RELAY__INTERVAL_MS=200)
if [ "$MODE" = sentinel ]; then
  {
    echo
    echo "[redis]"
    echo "sentinels = [$(printf '"127.0.0.1:%s", ' "${SENTINELS[@]}" | sed 's/, $//')]"
    echo 'sentinel_master = "pn"'
    echo "wait_replicas = 1"
  } >>"$T/sbx/paynotify.toml"
else
  PN_ENV+=(PAYNOTIFY__REDIS__URL="redis://127.0.0.1:$RM")
fi
pn_migrate
pn_start a "$(free_port)"
pn_start b "$(free_port)"
U1=$(pn_url a)
U2=$(pn_url b)
storm_prepare "$U1"

storm_start "$U1,$U2"
storm_until_fault
mark_fault "SIGSTOP of the Redis master ($RM) for $STOP s"
kill -STOP "${REDIS_PID[$RM]}"
promoted() { [ "$(master_port)" = "$RR" ]; }
wait_until "$STOP" promoted
sleep_left=$(awk -v a="$FAULT_AT" -v n="$(now)" -v s="$STOP" 'BEGIN {x = a + s - n; print (x > 0 ? x : 0)}')
sleep "$sleep_left"
kill -CONT "${REDIS_PID[$RM]}"
wait_until 30 promoted || fail "the sentinels did not promote the replica within 30 s"
demoted() { rcli "$RM" ROLE 2>/dev/null | head -n 1 | grep -q slave; }
wait_until 30 demoted || fail "the old master was not demoted within 30 s"
log "the sentinels promoted $RR; the old master $RM is its replica"
wait_until 60 ack_since "$FAULT_AT" || fail "no 2xx within 60 s of the fault"
storm_wait || fail "the storm did not end with every delivery answered 2xx"
wait_drained 60

psql_ paynotify -At -F $'\t' -c "SELECT o.order_no, o.status,
    coalesce(extract(epoch FROM c.created_at)::text, ''),
    (SELECT count(*) FROM local_message m WHERE m.topic = 'ORDER_PAID' AND m.biz_key = o.order_no),
    (SELECT count(*) FROM local_message m WHERE m.topic = 'PAYMENT_ANOMALY'
       AND (m.biz_key = o.order_no OR m.biz_key LIKE o.order_no || ':%'))
  FROM orders o LEFT JOIN pay_callback c ON c.out_trade_no = o.order_no
  WHERE o.order_no LIKE 'F_-%'" >"$T/db.tsv" || fail "the database dump failed"
stream_keys "$RR" "$T/delivered"
log "stream on the new master: $(rcli "$RR" XLEN paynotify:events) entries, $(wc -l <"$T/delivered") distinct biz_keys"
storm_report "$T/db.tsv" "$T/delivered"
check_logs_clean "$T"/pn-*.log
for n in a b; do pn_alive $n || fail "instance $n died"; done
log "readyz now: $(readyz_body "$U1")"
chaos_end
