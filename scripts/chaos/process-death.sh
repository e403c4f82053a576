#!/usr/bin/env bash
# Process death (PostgreSQL, or MariaDB with CHAOS_DB=mariadb): kill -9 of the service three
# times mid-load, restarted each time, with the
# relay publishing into a Redis stream (a redis-server of our own) every relay.interval_ms,
# once with 200 and once with 1000. Rows a killed relay had claimed wait for their 60 s lease.
# Checks: only 2xx, 503 and 000 (no answer while it is dead) seen; every order paid exactly
# once; the outbox drained and every ORDER_PAID biz_key in the stream at least once.
#   CHAOS_ORDERS (default 150 per interval), CHAOS_WORKERS (default 4), CHAOS_WINDOW (20 s).
source "$(dirname "$0")/lib.sh"
chaos_begin process-death
ORDERS=${CHAOS_ORDERS:-150}
WORKERS=${CHAOS_WORKERS:-4}
WINDOW=${CHAOS_WINDOW:-20}
PACE=$(awk -v w="$WINDOW" -v n="$ORDERS" -v k="$WORKERS" 'BEGIN {printf "%.3f", w * k / n}')

db_start
sandbox_init
capture_start
REDIS_PORT=""
redis_start
RP=$REDIS_PORT
pn_migrate

worker() {
  local w=$1 prefix=$2 i no
  for i in $(seq $((w + 1)) "$WORKERS" "$ORDERS"); do
    no=$(order_no "$prefix" "$i")
    forge "$no" "$no-a"
    forge "$no" "$no-b"
    deliver "$no-a" "$U"
    deliver "$no-b" "$U"
    sleep "$PACE"
  done
}

for interval in 200 1000; do
  prefix=K$interval
  PN_ENV=(PAYNOTIFY__DATABASE__AUTO_MIGRATE=false PAYNOTIFY__REDIS__URL="redis://127.0.0.1:$RP"
    PAYNOTIFY__RELAY__SINK=redis-stream PAYNOTIFY__RELAY__INTERVAL_MS=$interval)
  pn_start "$prefix" "$(free_port)"
  U=$(pn_url "$prefix")
  create_orders "$prefix" "$ORDERS" "$U"
  set_phase "$prefix-load"
  run_workers "$WORKERS" worker "$prefix" &
  LOAD=$!
  for k in 1 2 3; do
    sleep 4
    set_phase "$prefix-dead"
    log "fault: kill -9 the service ($k of 3, relay.interval_ms $interval)"
    pn_kill9 "$prefix"
    sleep 1
    pn_restart "$prefix"
    set_phase "$prefix-load"
  done
  wait "$LOAD" || fail "some deliveries were never answered 2xx"
  t0=$SECONDS
  wait_drained 150
  log "$prefix: outbox drained $((SECONDS - t0)) s after the load"
  pn_term "$prefix" || fail "no exit within 20 s of SIGTERM"
done

bad=$(codes_outside '^(2..|503|000)$')
[ -z "$bad" ] || fail "answers other than 2xx/503/000: $bad"
for interval in 200 1000; do
  check_ledger "K$interval" "$ORDERS"
  check_stream "$RP" "K$interval" "$ORDERS"
done
log "answers: $(codes_summary) | non-2xx by phase: $(awk '$1 !~ /^2/ {n[$1" "$2]++} END {for (k in n) printf "%s×%d, ", k, n[k]}' "$T/codes")"
chaos_end
