#!/usr/bin/env bash
# Database faults mid-load on a MariaDB of our own (mariadb-install-db into the scenario's
# directory, its own port and socket; the shared MariaDB on 3306 is never touched): a clean
# restart (mariadb-admin shutdown, start), a crash (kill -9 of mariadbd, start: InnoDB
# recovery), stopped for 5 s then started, and KILL of the service's connections (three
# times). Each order's notification is delivered until the first 2xx and then never again, so
# a 2xx that did not commit would leave its order unpaid; then every order once more (a
# duplicate: 2xx, nothing changes).
# Checks: only 2xx and 503 answered (no 500), /readyz 503 while the database is stopped and
# 200 after, every order paid exactly once, every event published.
#   CHAOS_ORDERS (default 300), CHAOS_WORKERS (default 4), CHAOS_WINDOW (seconds the load
#   is spread over, default 40).
source "$(dirname "$0")/lib.sh"
chaos_begin mariadb-faults
ORDERS=${CHAOS_ORDERS:-300}
WORKERS=${CHAOS_WORKERS:-4}
WINDOW=${CHAOS_WINDOW:-40}
PACE=$(awk -v w="$WINDOW" -v n="$ORDERS" -v k="$WORKERS" 'BEGIN {printf "%.3f", w * k / n}')

my_start
sandbox_init
capture_start
PN_ENV=(PAYNOTIFY__DATABASE__AUTO_MIGRATE=false PAYNOTIFY__RELAY__SINK=log
  PAYNOTIFY__RELAY__INTERVAL_MS=200)
pn_migrate
pn_start a "$(free_port)"
U=$(pn_url a)
create_orders M "$ORDERS" "$U"
RSS0=$(pn_rss_kb a)

worker() {
  local w=$1 i no
  for i in $(seq $((w + 1)) "$WORKERS" "$ORDERS"); do
    no=$(order_no M "$i")
    forge "$no" "$no"
    deliver "$no" "$U"
    sleep "$PACE"
  done
}
run_workers "$WORKERS" worker &
LOAD=$!

kill_connections() {
  local ids id n=0
  ids=$(my_sock -N -B -e "SELECT id FROM information_schema.processlist
    WHERE db = 'paynotify' AND id <> CONNECTION_ID()")
  for id in $ids; do
    my_sock -e "KILL CONNECTION $id" 2>/dev/null && n=$((n + 1))
  done
  echo "$n"
}
READY_DOWN=()
sleep 2
set_phase restart
log "fault: mariadb-admin shutdown, start"
my_stop || fail "clean shutdown failed"
my_up || fail "MariaDB did not come back: $(tail -n 5 "$T/my/log")"
sleep 3
set_phase crash
log "fault: kill -9 mariadbd, start (crash recovery)"
my_kill9 || fail "mariadbd survived kill -9"
my_up || fail "MariaDB did not recover: $(tail -n 5 "$T/my/log")"
sleep 3
set_phase stopped
log "fault: mariadb-admin shutdown, 5 s down"
my_stop || fail "shutdown failed"
for _ in 1 2 3 4 5; do
  sleep 1
  READY_DOWN+=("$(readyz "$U")")
done
my_up || fail "MariaDB did not start again: $(tail -n 5 "$T/my/log")"
set_phase recovered
wait_until 30 ready "$U" || fail "/readyz not 200 within 30 s of the database's return"
sleep 2
for k in 1 2 3; do
  set_phase kill-connections
  log "fault: KILL CONNECTION of $(kill_connections) connections"
  sleep 1
done
database_faults_end M
