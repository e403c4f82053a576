#!/usr/bin/env bash
# Database faults mid-load on a PostgreSQL cluster of our own: `pg_ctl restart -m fast`,
# `restart -m immediate`, stop for 5 s then start, and pg_terminate_backend of the service's
# connections (three times). Each order's notification is delivered until the first 2xx and
# then never again, so a 2xx that did not commit would leave its order unpaid; then every
# order is delivered once more (a duplicate: 2xx, nothing changes).
# Checks: only 2xx and 503 answered (no 500), /readyz 503 while the database is stopped and
# 200 after, every order paid exactly once, every event published.
#   CHAOS_ORDERS (default 300), CHAOS_WORKERS (default 4), CHAOS_WINDOW (seconds the load
#   is spread over, default 30), CHAOS_GATE=1 (the Redis gate on, a redis-server of its own).
source "$(dirname "$0")/lib.sh"
chaos_begin db-faults
ORDERS=${CHAOS_ORDERS:-300}
WORKERS=${CHAOS_WORKERS:-4}
WINDOW=${CHAOS_WINDOW:-30}
# Pause between two orders of one worker, so the load covers the whole fault schedule.
PACE=$(awk -v w="$WINDOW" -v n="$ORDERS" -v k="$WORKERS" 'BEGIN {printf "%.3f", w * k / n}')

pg_start
sandbox_init
capture_start
PN_ENV=(PAYNOTIFY__DATABASE__AUTO_MIGRATE=false PAYNOTIFY__RELAY__SINK=log
  PAYNOTIFY__RELAY__INTERVAL_MS=200)
if [ "${CHAOS_GATE:-0}" = 1 ]; then
  # The same faults with the Redis gate on (its own redis-server).
  REDIS_PORT=""
  redis_start
  PN_ENV+=(PAYNOTIFY__REDIS__URL="redis://127.0.0.1:$REDIS_PORT")
fi
pn_migrate
pn_start a "$(free_port)"
U=$(pn_url a)
create_orders D "$ORDERS" "$U"
RSS0=$(pn_rss_kb a)

worker() {
  local w=$1 i no
  for i in $(seq $((w + 1)) "$WORKERS" "$ORDERS"); do
    no=$(order_no D "$i")
    forge "$no" "$no"
    deliver "$no" "$U"
    sleep "$PACE"
  done
}
run_workers "$WORKERS" worker &
LOAD=$!

terminate_backends() {
  psql_ postgres -At -c "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
    WHERE datname = 'paynotify' AND pid <> pg_backend_pid()"
}
READY_DOWN=()
sleep 2
set_phase restart-fast
log "fault: pg_ctl restart -m fast"
pg_ctl_ -m fast restart || fail "restart -m fast failed"
sleep 3
set_phase restart-immediate
log "fault: pg_ctl restart -m immediate"
pg_ctl_ -m immediate restart || fail "restart -m immediate failed"
sleep 3
set_phase stopped
log "fault: pg_ctl stop -m fast, 5 s down"
pg_ctl_ -m fast stop || fail "stop failed"
for _ in 1 2 3 4 5; do
  sleep 1
  READY_DOWN+=("$(readyz "$U")")
done
pg_ctl_ start || fail "start failed"
set_phase recovered
wait_until 30 ready "$U" || fail "/readyz not 200 within 30 s of the database's return"
sleep 2
for k in 1 2 3; do
  set_phase terminate
  log "fault: pg_terminate_backend of $(terminate_backends) backends"
  sleep 1
done
database_faults_end D
