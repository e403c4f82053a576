#!/usr/bin/env bash
# Two instances, one database (a PostgreSQL cluster of our own, or MariaDB with CHAOS_DB=mariadb): every order gets five
# deliveries of its payment notification, two signings of it (identical bytes twice at once to
# both instances, then the re-signed copy the same way, then the first again), with and
# without the Redis gate; both relays drain the outbox (into a Redis stream on our own
# redis-server with the gate; the log sink without, the sink needs redis.url).
# Checks: every order paid exactly once, one callback row and one ORDER_PAID each, nothing
# else, only 2xx (and 503 "in flight" with the gate) answered, every event delivered.
#   CHAOS_ORDERS (default 1000) orders per variant, CHAOS_WORKERS (default 4) senders.
source "$(dirname "$0")/lib.sh"
chaos_begin two-instances
ORDERS=${CHAOS_ORDERS:-1000}
WORKERS=${CHAOS_WORKERS:-4}

db_start
sandbox_init
capture_start
PN_ENV=(PAYNOTIFY__DATABASE__AUTO_MIGRATE=false PAYNOTIFY__DATABASE__POOL_SIZE=8)
pn_migrate

run_order() {
  local no=$1 u1=$2 u2=$3
  forge "$no" "$no-a"
  forge "$no" "$no-b"
  deliver "$no-a" "$u1" "$u2" &
  deliver "$no-a" "$u2" "$u1" &
  wait
  deliver "$no-b" "$u1" "$u2" &
  deliver "$no-b" "$u2" "$u1" &
  wait
  deliver "$no-a" "$u1" "$u2"
}

worker() {
  local w=$1 prefix=$2 u1=$3 u2=$4 i
  for i in $(seq $((w + 1)) "$WORKERS" "$ORDERS"); do
    run_order "$(order_no "$prefix" "$i")" "$u1" "$u2"
  done
}

variant() {
  local prefix=$1
  shift
  local u1 u2
  pn_start "$prefix-1" "$(free_port)" "$@"
  pn_start "$prefix-2" "$(free_port)" "$@"
  u1=$(pn_url "$prefix-1")
  u2=$(pn_url "$prefix-2")
  create_orders "$prefix" "$ORDERS" "$u1"
  local started=$SECONDS
  run_workers "$WORKERS" worker "$prefix" "$u1" "$u2"
  log "$prefix: $ORDERS orders × 5 deliveries in $((SECONDS - started)) s"
  wait_drained 60
  pn_term "$prefix-1" || fail "$prefix-1 did not stop on SIGTERM within 20 s"
  pn_term "$prefix-2" || fail "$prefix-2 did not stop on SIGTERM within 20 s"
}

REDIS_PORT=""
redis_start
SINK_REDIS=$REDIS_PORT
variant G PAYNOTIFY__REDIS__URL="redis://127.0.0.1:$SINK_REDIS" PAYNOTIFY__RELAY__SINK=redis-stream
check_ledger G "$ORDERS"
check_stream "$SINK_REDIS" G "$ORDERS"

variant N PAYNOTIFY__RELAY__SINK=log
# Both variants share the database: the second check covers G's rows too (still once each).
check_ledger N "$ORDERS"
check_log_events N "$ORDERS" "$T"/pn-N-*.log

bad=$(codes_outside '^(2..|503)$')
[ -z "$bad" ] || fail "answers other than 2xx/503: $bad"
check_logs_clean "$T"/pn-*.log
log "answers: $(codes_summary); deliveries: $(wc -l <"$T/codes")"
chaos_end
