#!/usr/bin/env bash
# The relay's 60-second lease: kill -9 of the service while a relay batch is in flight. The
# relay publishes to an HTTP receiver of our own (slow_sink.py) that holds its answers while
# told to stall, so the kill lands after the batch's rows were claimed and posted and before
# they were marked sent. Then the service is restarted with the receiver answering at once.
# Checks: the killed batch's rows (claimed, unmarked, lease still running) are not sent again
# before their lease ends, each is sent again after it (at least once), every other row goes
# out at once, every ORDER_PAID biz_key reaches the receiver, every order paid exactly once.
#   CHAOS_ORDERS (default 40), CHAOS_BATCH (relay.batch_size, default 10).
source "$(dirname "$0")/lib.sh"
chaos_begin relay-lease
ORDERS=${CHAOS_ORDERS:-40}
BATCH=${CHAOS_BATCH:-10}
LEASE=60

pg_start
sandbox_init
capture_start
SINK_PORT=$(free_port)
mkdir -p "$T/sink"
python3 "$CHAOS_DIR/slow_sink.py" "$SINK_PORT" "$T/sink" 2>>"$T/sink.log" &
track $!
wait_until 10 port_open "$SINK_PORT" || die "slow_sink.py did not start"
: >"$T/sink/arrivals"
touch "$T/sink/stall"

# A relay tick every 3 s while the payments arrive, so the first batch is a full one.
PN_ENV=(PAYNOTIFY__DATABASE__AUTO_MIGRATE=false PAYNOTIFY__RELAY__SINK=http
  PAYNOTIFY__RELAY__HTTP_URL="http://127.0.0.1:$SINK_PORT/events"
  PAYNOTIFY__RELAY__HTTP_SECRET=chaos-relay-lease PAYNOTIFY__RELAY__BATCH_SIZE=$BATCH)
pn_migrate
pn_start a "$(free_port)" PAYNOTIFY__RELAY__INTERVAL_MS=3000
U=$(pn_url a)
create_orders L "$ORDERS" "$U"
for i in $(seq 1 "$ORDERS"); do
  no=$(order_no L "$i")
  forge "$no" "$no"
done
worker() {
  local w=$1 i
  for i in $(seq $((w + 1)) 4 "$ORDERS"); do deliver "$(order_no L "$i")" "$U"; done
}
run_workers 4 worker || fail "some deliveries were never answered 2xx"
pending() { [ "$(cat "$T/sink/pending")" -ge "$1" ]; }
wait_until 20 pending 1 || die "no relay batch reached the receiver within 20 s"
sleep 0.5
held=$(cat "$T/sink/pending")
set_phase dead
pn_kill9 a
KILLED_AT=$(date +%s.%N)
log "fault: kill -9 with $held deliveries of a relay batch held by the receiver"

# The rows the dead relay claimed and never marked: pending, leased until the future.
sql "SELECT biz_key, extract(epoch FROM locked_until) FROM local_message
  WHERE status = 0 AND locked_until > now()" >"$T/leased"
sed -i 's/|/ /' "$T/leased"
LEASED=$(wc -l <"$T/leased")
[ "$LEASED" -ge 1 ] || die "no row under a lease after the kill: the kill missed the batch"
[ "$LEASED" -le "$BATCH" ] || fail "$LEASED rows leased, more than one batch ($BATCH)"
BEFORE=$(wc -l <"$T/sink/arrivals")
log "$LEASED rows claimed and unmarked (lease until $(cut -d' ' -f2 "$T/leased" | sort -n | head -n 1 | cut -d. -f1)); $BEFORE arrivals so far"

rm -f "$T/sink/stall"
set_phase restarted
pn_start a "${PN_PORT[a]}" PAYNOTIFY__RELAY__INTERVAL_MS=200
RESTARTED_AT=$(date +%s.%N)
t0=$SECONDS
wait_drained $((LEASE + 60))
log "outbox drained $((SECONDS - t0)) s after the restart"

# Each leased row: sent again after the restart, never before its lease ended.
while read -r key until; do
  again=$(awk -v k="ORDER_PAID:$key" -v after="$RESTARTED_AT" '$2 == k && $1 > after {print $1}' "$T/sink/arrivals" | sort -n)
  [ -n "$again" ] || fail "$key: claimed by the killed relay and never sent again"
  first=$(echo "$again" | head -n 1)
  # The database's clock and this one are the same machine's; half a second of slack.
  awk -v a="$first" -v u="$until" 'BEGIN {exit !(a + 0.5 >= u)}' ||
    fail "$key sent again at $first, before its lease ended at $until"
done <"$T/leased"
# Every other row went out at once, not after a lease.
late=$(awk -v r="$RESTARTED_AT" -v l="$LEASE" 'NR == FNR {leased["ORDER_PAID:" $1] = 1; next}
  $1 > r && !($2 in leased) && $1 > r + l / 2 {n++} END {print n + 0}' "$T/leased" "$T/sink/arrivals")
[ "$late" = 0 ] || fail "$late rows that were never leased waited more than $((LEASE / 2)) s"

check_ledger L "$ORDERS"
cut -d' ' -f2 "$T/sink/arrivals" | sed 's/^ORDER_PAID://' | sort -u >"$T/sink-keys"
for i in $(seq 1 "$ORDERS"); do order_no L "$i"; echo; done | sort >"$T/want-keys"
missing=$(comm -23 "$T/want-keys" "$T/sink-keys" | wc -l)
[ "$missing" = 0 ] || fail "$missing of $ORDERS ORDER_PAID events never reached the receiver"
check_logs_clean "$T/pn-a.log"
twice=$(cut -d' ' -f2 "$T/sink/arrivals" | sort | uniq -d | wc -l)
log "arrivals: $(wc -l <"$T/sink/arrivals") for $ORDERS events, $twice of them twice (the killed batch: $LEASED leased); killed at $KILLED_AT, restarted at $RESTARTED_AT"
pn_term a || fail "no exit within 20 s of SIGTERM"
chaos_end
