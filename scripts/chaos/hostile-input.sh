#!/usr/bin/env bash
# Hostile input: at least 2,000 mutations of genuine notifications (truncations, flipped bytes
# in body and headers, dropped/duplicated/junk/huge headers, invalid UTF-8, GBK junk, bodies
# around server.max_body_bytes, lying Content-Length, garbage request lines, chunked junk,
# stale timestamps), then 50 slow-loris connections (half a request head, or a stalled body),
# then SIGTERM with 50 more of them open.
# The notifications are for orders that do not exist: a mutation that still verifies (a junk
# header, a duplicated Content-Type) is answered 404 and writes nothing either, so every answer
# must be a 4xx whatever the mutation. 404s are reported by mutation: they are the requests
# that passed verification.
# Checks: every answer a 4xx (or the connection closed for a request that is not HTTP), nothing
# written (no callback row, no event, no order), RSS bounded, /healthz answering during the
# slow-loris, exit within 20 s of SIGTERM.
#   CHAOS_HOSTILE (default 2000 requests), CHAOS_SEED (default 17).
source "$(dirname "$0")/lib.sh"
chaos_begin hostile-input
COUNT=${CHAOS_HOSTILE:-2000}
SEED=${CHAOS_SEED:-17}
MAX_BODY=65536
BODY_TIMEOUT_MS=3000

pg_start
sandbox_init
capture_start
PN_ENV=(PAYNOTIFY__DATABASE__AUTO_MIGRATE=false PAYNOTIFY__RELAY__SINK=log
  PAYNOTIFY__SERVER__MAX_BODY_BYTES=$MAX_BODY PAYNOTIFY__SERVER__BODY_TIMEOUT_MS=$BODY_TIMEOUT_MS)
pn_migrate
PORT=$(free_port)
pn_start h "$PORT"
U=$(pn_url h)
for i in $(seq 1 10); do forge "$(order_no H "$i")" "$(order_no H "$i")"; done
RSS0=$(pn_rss_kb h)
FD0=$(pn_fds h)

log "sending $COUNT mutated requests (seed $SEED)"
python3 "$CHAOS_DIR/hostile.py" mutate "$PORT" "$T/cap" "$COUNT" "$SEED" "$MAX_BODY" >"$T/mutate.out" ||
  fail "hostile.py mutate failed"
sent=$(wc -l <"$T/mutate.out")
[ "$sent" -ge "$COUNT" ] || fail "only $sent of $COUNT mutated requests sent"
log "mutations, answers by status: $(awk '{n[$1]++} END {for (k in n) printf "%s×%d ", k, n[k]}' "$T/mutate.out")"
log "verified anyway (404), by mutation: $(awk '$1 == 404 {n[$2]++} END {for (k in n) printf "%s×%d ", k, n[k]}' "$T/mutate.out")"
bad=$(awk '$1 !~ /^4..$/ && !($1 == "closed" && $2 == "garbage-line") {n[$1" "$2]++} END {for (k in n) printf "%s×%d, ", k, n[k]}' "$T/mutate.out")
[ -z "$bad" ] || fail "answers other than 4xx: $bad"
RSS1=$(pn_rss_kb h)

log "50 slow-loris connections held 8 s"
python3 "$CHAOS_DIR/hostile.py" loris "$PORT" "$T/cap" 50 8 >"$T/loris.out" &
LORIS=$!
sleep 2
h0=$(date +%s%N)
curl -sf --max-time 5 -o /dev/null "$U/healthz" || fail "/healthz did not answer during the slow-loris"
log "/healthz during the slow-loris: $((($(date +%s%N) - h0) / 1000000)) ms"
wait "$LORIS" || fail "hostile.py loris failed"
log "slow-loris, answers: $(awk '{n[$1" "$2]++} END {for (k in n) printf "%s×%d ", k, n[k]}' "$T/loris.out")"
bad=$(awk '$1 != "408" && $1 != "closed" && $1 !~ /^4..$/ {n[$1" "$2]++} END {for (k in n) printf "%s×%d, ", k, n[k]}' "$T/loris.out")
[ -z "$bad" ] || fail "slow-loris connections answered other than 408/4xx/closed: $bad"
RSS2=$(pn_rss_kb h)
FD2=$(pn_fds h)

v=$(sql "SELECT (SELECT count(*) FROM pay_callback) + (SELECT count(*) FROM refund_callback) + (SELECT count(*) FROM status_callback) + (SELECT count(*) FROM local_message)")
[ "$v" = 0 ] || fail "$v rows written by hostile input"
v=$(sql "SELECT count(*) FROM orders")
[ "$v" = 0 ] || fail "$v orders created by hostile input"
# Bounded: under 64 MB above the start and under three times it.
[ "$RSS2" -lt $((RSS0 + 65536)) ] && [ "$RSS2" -lt $((RSS0 * 3)) ] ||
  fail "RSS grew from $RSS0 kB to $RSS2 kB"
log "RSS ${RSS0} kB → ${RSS1} kB (after mutations) → ${RSS2} kB (after slow-loris); fds $FD0 → $FD2"

log "SIGTERM with 50 slow-loris connections open"
python3 "$CHAOS_DIR/hostile.py" loris "$PORT" "$T/cap" 50 25 >"$T/loris2.out" 2>&1 &
LORIS=$!
sleep 2
t0=$(date +%s%N)
pn_term h 20 || fail "no exit within 20 s of SIGTERM with slow-loris connections open"
log "exited $((($(date +%s%N) - t0) / 1000000)) ms after SIGTERM"
kill "$LORIS" 2>/dev/null
wait "$LORIS" 2>/dev/null
check_logs_clean "$T/pn-h.log"
chaos_end
