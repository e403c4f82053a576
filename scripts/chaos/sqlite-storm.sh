#!/usr/bin/env bash
# SQLite storm: one instance on an SQLite file, 20 concurrent senders each delivering every
# order's notification (two signings, identical bytes shared between senders), so every
# order sees ~20 racing duplicates; SIGTERM to the service mid-storm, restart, go on.
# Checks: SIGTERM exits 0 within 20 s; only 2xx, 503 and "no answer" (000, while it is
# down) seen; every order paid exactly once, one callback row and one ORDER_PAID each;
# every event published.
#   CHAOS_ORDERS (default 200), CHAOS_SENDERS (default 20).
source "$(dirname "$0")/lib.sh"
chaos_begin sqlite-storm
ORDERS=${CHAOS_ORDERS:-200}
SENDERS=${CHAOS_SENDERS:-20}
command -v sqlite3 >/dev/null || die "the checks need the sqlite3 command"

sandbox_init
capture_start
mkdir -p "$T/data"
DB_URL="sqlite://$T/data/paynotify.db"
PN_ENV=(PAYNOTIFY__RELAY__SINK=log PAYNOTIFY__RELAY__INTERVAL_MS=200)
pn_start s "$(free_port)"
U=$(pn_url s)
create_orders S "$ORDERS" "$U"
for i in $(seq 1 "$ORDERS"); do
  no=$(order_no S "$i")
  forge "$no" "$no-a"
  forge "$no" "$no-b"
done
log "$ORDERS orders, 2 signings each; $SENDERS senders"

sender() {
  local w=$1 k i no sig
  for k in $(seq 0 $((ORDERS - 1))); do
    i=$(((k + w * 7) % ORDERS + 1))
    no=$(order_no S "$i")
    if [ $(((w + k) % 2)) = 0 ]; then sig=a; else sig=b; fi
    deliver "$no-$sig" "$U"
  done
}
run_workers "$SENDERS" sender &
LOAD=$!

# SIGTERM once a third of the storm has been answered.
third=$((ORDERS * SENDERS / 3))
wait_until 120 answers_at_least "$third" || fail "the storm did not get going"
set_phase sigterm
log "SIGTERM mid-storm ($(wc -l <"$T/codes") answers so far)"
t0=$SECONDS
pn_term s 20 || fail "no exit within 20 s of SIGTERM"
wait "${PN_PID[s]}" 2>/dev/null
log "stopped in $((SECONDS - t0)) s; restarting"
set_phase restarted
pn_restart s
wait "$LOAD" || fail "some deliveries were never answered 2xx"
set_phase done

bad=$(codes_outside '^(2..|503|000)$')
[ -z "$bad" ] || fail "answers other than 2xx/503/000: $bad"
wait_drained 60
check_ledger S "$ORDERS"
check_log_events S "$ORDERS" "$T/pn-s.log"
check_logs_clean "$T/pn-s.log"
grep -q 'stopped' "$T/pn-s.log" || fail "no clean stop logged after SIGTERM"
log "answers: $(codes_summary) | non-2xx by phase: $(awk '$1 !~ /^2/ {n[$1" "$2]++} END {for (k in n) printf "%s×%d, ", k, n[k]}' "$T/codes")"
pn_term s || fail "no exit within 20 s of the final SIGTERM"
chaos_end
