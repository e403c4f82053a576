#!/usr/bin/env bash
# Redis faults with the gate on (two instances, one PostgreSQL — or MariaDB — of our own, one redis-server of
# our own that is both the gate and the relay's stream): kill -9 and restart, FLUSHALL,
# DEBUG SLEEP 3, SIGSTOP for 3 s then SIGCONT, mid-load. Every order gets four deliveries (two
# signings; identical bytes at once to both instances, then re-signed, then the first again).
# Checks: only 2xx and 503 answered, every order paid exactly once, one callback row and one
# ORDER_PAID each, the outbox drained. (The stream itself is not checked here: kill -9 and
# FLUSHALL of the only Redis destroy the entries already delivered to it.)
#   CHAOS_ORDERS (default 200), CHAOS_WORKERS (default 4), CHAOS_WINDOW (default 30 s).
source "$(dirname "$0")/lib.sh"
chaos_begin redis-faults
ORDERS=${CHAOS_ORDERS:-200}
WORKERS=${CHAOS_WORKERS:-4}
WINDOW=${CHAOS_WINDOW:-30}
PACE=$(awk -v w="$WINDOW" -v n="$ORDERS" -v k="$WORKERS" 'BEGIN {printf "%.3f", w * k / n}')

db_start
sandbox_init
capture_start
REDIS_PORT=""
redis_start
RP=$REDIS_PORT
PN_ENV=(PAYNOTIFY__DATABASE__AUTO_MIGRATE=false PAYNOTIFY__REDIS__URL="redis://127.0.0.1:$RP"
  PAYNOTIFY__RELAY__SINK=redis-stream PAYNOTIFY__RELAY__INTERVAL_MS=200)
pn_migrate
pn_start a "$(free_port)"
pn_start b "$(free_port)"
U1=$(pn_url a)
U2=$(pn_url b)
create_orders R "$ORDERS" "$U1"

worker() {
  local w=$1 i no
  for i in $(seq $((w + 1)) "$WORKERS" "$ORDERS"); do
    no=$(order_no R "$i")
    forge "$no" "$no-a"
    forge "$no" "$no-b"
    deliver "$no-a" "$U1" "$U2" &
    deliver "$no-a" "$U2" "$U1" &
    wait
    deliver "$no-b" "$U2" "$U1"
    deliver "$no-a" "$U1" "$U2"
    sleep "$PACE"
  done
}
run_workers "$WORKERS" worker &
LOAD=$!

sleep 3
set_phase kill9
log "fault: kill -9 redis-server, restart after 2 s"
kill -KILL "${REDIS_PID[$RP]}"
sleep 2
redis_start "$RP"
sleep 3
set_phase flushall
log "fault: FLUSHALL"
rcli "$RP" FLUSHALL >/dev/null || fail "FLUSHALL refused"
sleep 3
set_phase debug-sleep
log "fault: DEBUG SLEEP 3"
rcli "$RP" DEBUG SLEEP 3 >/dev/null || fail "DEBUG SLEEP refused"
sleep 3
set_phase sigstop
log "fault: SIGSTOP for 3 s, SIGCONT"
kill -STOP "${REDIS_PID[$RP]}"
sleep 3
kill -CONT "${REDIS_PID[$RP]}"
set_phase after
wait "$LOAD" || fail "some deliveries were never answered 2xx"

bad=$(codes_outside '^(2..|503)$')
[ -z "$bad" ] || fail "answers other than 2xx/503: $bad"
wait_drained 90
check_ledger R "$ORDERS"
check_logs_clean "$T"/pn-*.log
for n in a b; do pn_alive $n || fail "instance $n died"; done
log "answers: $(codes_summary) | non-2xx by phase: $(awk '$1 !~ /^2/ {n[$1" "$2]++} END {for (k in n) printf "%s×%d, ", k, n[k]}' "$T/codes")"
log "gate metrics (a): $(curl -s "$U1/metrics" | grep -E '^paynotify_gate_total' | tr '\n' ' ')"
chaos_end
