#!/usr/bin/env bash
# Soak: CHAOS_SOAK_SECS (default 600) of steady mixed traffic at one instance (own PostgreSQL,
# Redis gate and stream sink, relay every 200 ms): new orders paid by WeChat Pay or Alipay,
# each delivered twice (identical bytes), every 10th order also a forged signature (401) and
# a notification for an order that does not exist (404).
# Reports and checks: RSS and open file descriptors after a one-minute warm-up and at the end
# (the end under 1.5× the warm-up plus 32 MB), p99 of the notify answers in the first and the
# last minute, no ERROR or panic line in the log, every order paid exactly once, every event
# in the stream.
#   CHAOS_SOAK_SECS (default 600), CHAOS_WORKERS (default 4).
source "$(dirname "$0")/lib.sh"
chaos_begin soak
SECS=${CHAOS_SOAK_SECS:-600}
WORKERS=${CHAOS_WORKERS:-4}
MAX_PER_WORKER=${CHAOS_SOAK_MAX:-100000}

pg_start
sandbox_init
capture_start
REDIS_PORT=""
redis_start
RP=$REDIS_PORT
PN_ENV=(PAYNOTIFY__DATABASE__AUTO_MIGRATE=false PAYNOTIFY__REDIS__URL="redis://127.0.0.1:$RP"
  PAYNOTIFY__RELAY__SINK=redis-stream PAYNOTIFY__RELAY__INTERVAL_MS=200)
pn_migrate
pn_start s "$(free_port)"
U=$(pn_url s)
START=$SECONDS
END=$((START + SECS))

timed_post() { # NAME -> appends "ELAPSED_S CODE LATENCY_S" to $T/lat
  local r
  r=$(curl -s -o /dev/null -w '%{http_code} %{time_total}' --max-time 15 -XPOST -H "@$T/cap/$1.hdr" \
    --data-binary "@$T/cap/$1.body" "$U$(cat "$T/cap/$1.path")")
  echo "$((SECONDS - START)) $r" >>"$T/lat"
}

worker() {
  local w=$1 n=0 i no
  while [ "$SECONDS" -lt "$END" ] && [ "$n" -lt "$MAX_PER_WORKER" ]; do
    n=$((n + 1))
    i=$((n * WORKERS + w))
    no=$(order_no P "$i")
    echo "$no" >>"$T/orders"
    create_orders_one "$no"
    forge "$no" "$no"
    deliver "$no" "$U"
    timed_post "$no"
    if [ $((n % 10)) = 0 ]; then
      (cd "$T/sbx" && "$PAYNOTIFY_BIN" replay "$(kind_of "$no")" --config paynotify.toml \
        --order-no "$no" --amount-fen "$(amount_of "$no")" --bad-signature --target "$U" \
        >/dev/null 2>&1) || echo "bad-signature $no" >>"$T/unexpected"
      forge "X-$no" "X-$no"
      code=$(post "X-$no" "$U")
      [ "$code" = 404 ] || echo "unknown order answered $code" >>"$T/unexpected"
    fi
  done
}
create_orders_one() {
  local code
  code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 -XPOST "$U/orders" \
    -H "Authorization: Bearer $TOKEN" -H "Idempotency-Key: ck-$1" -H 'content-type: application/json' \
    -d "{\"order_no\":\"$1\",\"amount_fen\":$(amount_of "$1"),\"currency\":\"CNY\",\"subject\":\"soak\"}")
  [ "$code" = 201 ] || echo "create $1 answered $code" >>"$T/unexpected"
}

run_workers "$WORKERS" worker &
LOAD=$!
sleep 60
RSS0=$(pn_rss_kb s)
FD0=$(pn_fds s)
log "after warm-up: RSS $RSS0 kB, $FD0 fds"
while kill -0 "$LOAD" 2>/dev/null && [ "$SECONDS" -lt $((END + 60)) ]; do
  echo "$((SECONDS - START)) $(pn_rss_kb s) $(pn_fds s)" >>"$T/samples"
  sleep 10
done
wait "$LOAD" || fail "some deliveries were never answered 2xx"
RSS1=$(pn_rss_kb s)
FD1=$(pn_fds s)

ORDERS=$(wc -l <"$T/orders")
p99() { # FROM TO: p99 latency (ms) of the answers sent in that window
  awk -v a="$1" -v b="$2" '$1 >= a && $1 < b {print $3}' "$T/lat" | sort -g |
    awk '{v[NR] = $1} END {if (NR) printf "%.1f", v[int((NR - 1) * 0.99) + 1] * 1000; else print "n/a"}'
}
P99A=$(p99 0 60)
P99B=$(p99 $((SECS - 60)) $((SECS + 60)))
[ ! -s "$T/unexpected" ] || fail "unexpected answers: $(sort "$T/unexpected" | uniq -c | head -n 5 | tr '\n' ' ')"
bad=$(codes_outside '^(2..|503)$')
[ -z "$bad" ] || fail "answers other than 2xx/503: $bad"
[ "$RSS1" -lt $((RSS0 * 3 / 2 + 32768)) ] || fail "RSS grew from $RSS0 kB to $RSS1 kB"
[ "$FD1" -le $((FD0 + 20)) ] || fail "open fds grew from $FD0 to $FD1"
errors=$(grep -cE ' ERROR |panicked' "$T/pn-s.log")
[ "$errors" = 0 ] || fail "$errors ERROR/panic lines in the log: $(grep -m 3 -E ' ERROR |panicked' "$T/pn-s.log")"
wait_drained 60
# Orders are numbered by worker: check them by their list, not by a range.
v=$(sql "SELECT count(*) FROM orders WHERE status = 'PAID'")
[ "$v" = "$ORDERS" ] || fail "$v of $ORDERS orders PAID"
v=$(sql "SELECT count(*) FROM pay_callback")
[ "$v" = "$ORDERS" ] || fail "$v callback rows for $ORDERS orders"
v=$(sql "SELECT count(*) FROM local_message WHERE topic = 'ORDER_PAID'")
[ "$v" = "$ORDERS" ] || fail "$v ORDER_PAID events for $ORDERS orders"
v=$(sql "SELECT count(*) FROM local_message WHERE topic <> 'ORDER_PAID'")
[ "$v" = 0 ] || fail "$v other events"
rcli "$RP" --raw XRANGE paynotify:events - + | awk 'prev == "biz_key" {print} {prev = $0}' | sort -u >"$T/stream-keys"
missing=$(sort "$T/orders" | comm -23 - "$T/stream-keys" | wc -l)
[ "$missing" = 0 ] || fail "$missing events never reached the stream"
log "$SECS s, $ORDERS orders, $(wc -l <"$T/lat") timed + $(wc -l <"$T/codes") retried deliveries; answers: $(codes_summary)"
log "RSS $RSS0 kB → $RSS1 kB; fds $FD0 → $FD1; p99 first minute ${P99A} ms, last minute ${P99B} ms; ERROR lines $errors"
pn_term s || fail "no exit within 20 s of SIGTERM"
chaos_end
