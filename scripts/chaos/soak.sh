#!/usr/bin/env bash
# Soak: the peak of one instance measured first, then CHAOS_SOAK_SECS (default 600) of steady
# mixed traffic at half of it (own PostgreSQL, Redis gate, stream sink, relay every 200 ms).
#
# The traffic comes in segments of CHAOS_SOAK_SEGMENT seconds (default 60), each a file of
# pre-forged requests that wrk replays on a fixed schedule (bench/notify.lua, BENCH_RATE),
# composed by soak_mix.py:
#   first deliveries of new orders (WeChat Pay and Alipay, half each): 10 % of the segment, at
#       most CHAOS_SOAK_FIRSTS (default 2000; RSA signing is what the forger can afford beside
#       the service: the next segment is forged while the current one runs)
#   5 %  copies of earlier notifications with one signature character changed (401)
#   5 %  signed notifications for orders that do not exist, 100 of them again and again (404)
#   the rest: the previous segment's first deliveries again, byte for byte (duplicates; the
#       gate answers most of them)
# The peak is the same mix sent as fast as answers come back: a warm-up of CHAOS_SOAK_FIRSTS
# first deliveries, then 10 × CHAOS_SOAK_FIRSTS requests of the mix.
#
# Checks: every answer is the expected one (2xx, 401 or 404, counted per segment; nothing
# else), RSS and open file descriptors of the last segment against the first (under 1.5× plus
# 32 MB; at most 20 more fds), p99 of the last segment at most 3× that of the first plus
# 20 ms, every segment done within 1.5× its length, no ERROR or panic line in the log, every
# order paid exactly once (one callback row, one ORDER_PAID), every event in the stream, and
# SIGTERM still prompt. Reports them all.
#   CHAOS_SOAK_SECS (600), CHAOS_SOAK_SEGMENT (60), CHAOS_SOAK_CONNS (32), CHAOS_SOAK_FIRSTS (2000)
#
# With retention (docs/benchmarks.md, "Sustained, with retention running"):
#   CHAOS_SOAK_HISTORY_DAYS (0)        days of sent messages and receipts older than the window,
#                                      in their day partitions (the retention job drops them)
#   CHAOS_SOAK_HISTORY_PER_DAY (200000) messages per such day (and a tenth as many receipts)
#   CHAOS_SOAK_ARCHIVE_ORDERS (0)      paid orders with their callback rows created 401 days ago
#                                      (the archive takes them)
# Either makes the retention job run every 60 s (retention.keep_days and receipts.keep_days 2),
# and the report adds each segment's table sizes and WAL bytes, the WAL bytes per request and
# per first delivery, and the retention runs' rows per second.
source "$(dirname "$0")/lib.sh"
chaos_begin soak
SECS=${CHAOS_SOAK_SECS:-600}
SEG=${CHAOS_SOAK_SEGMENT:-60}
CONNS=${CHAOS_SOAK_CONNS:-32}
FIRSTS=${CHAOS_SOAK_FIRSTS:-2000}
SEGMENTS=$(((SECS + SEG - 1) / SEG))
AMOUNT=19900
THREADS=2
command -v wrk >/dev/null || die "wrk is needed (Debian: apt-get install wrk)"

pg_start
sandbox_init
REDIS_PORT=""
redis_start
RP=$REDIS_PORT
PN_ENV=(PAYNOTIFY__DATABASE__AUTO_MIGRATE=false PAYNOTIFY__REDIS__URL="redis://127.0.0.1:$RP"
  PAYNOTIFY__RELAY__SINK=redis-stream PAYNOTIFY__RELAY__INTERVAL_MS=200)
HIST_DAYS=${CHAOS_SOAK_HISTORY_DAYS:-0}
HIST_PER_DAY=${CHAOS_SOAK_HISTORY_PER_DAY:-200000}
ARCHIVE_ORDERS=${CHAOS_SOAK_ARCHIVE_ORDERS:-0}
RETENTION=0
if [ "$HIST_DAYS" -gt 0 ] || [ "$ARCHIVE_ORDERS" -gt 0 ]; then
  RETENTION=1
  PN_ENV+=(PAYNOTIFY__RETENTION__EVERY_SECS=60 PAYNOTIFY__RETENTION__KEEP_DAYS=2
    PAYNOTIFY__RECEIPTS__KEEP_DAYS=2 PAYNOTIFY__RETENTION__ARCHIVE_DIR="$T/archive")
fi
pn_migrate

# Sent messages and receipts of HIST_DAYS days from three days ago back, each day in its own
# partition (or the migration's "before" partition for days before its bound); paid orders
# of 401 days ago with their callback rows.
seed_history() {
  local bound d day next t
  bound=$(sql "SELECT substring(c.relname from '_before_([0-9]{8})$') FROM pg_inherits i
               JOIN pg_class c ON c.oid = i.inhrelid
               WHERE i.inhparent = 'local_message'::regclass AND c.relname LIKE 'local_message_before_%'")
  for d in $(seq 3 $((HIST_DAYS + 2))); do
    day=$(date -u -d "-$d days" +%Y-%m-%d)
    next=$(date -u -d "$day + 1 day" +%Y-%m-%d)
    if [ "${day//-/}" -ge "$bound" ]; then
      for t in local_message notify_receipt; do
        sql "CREATE TABLE ${t}_${day//-/} PARTITION OF $t
             FOR VALUES FROM ('$day 00:00:00+00') TO ('$next 00:00:00+00')" >/dev/null
      done
    fi
    sql "INSERT INTO local_message (topic, biz_key, payload, status, attempts, next_attempt_at, created_at, sent_at)
         SELECT 'ORDER_PAID', 'H$d-' || g, jsonb_build_object('order_no', 'H$d-' || g, 'channel', 'wechat',
                'transaction_id', '42000' || lpad(g::text, 23, '0'), 'amount_fen', $AMOUNT, 'currency', 'CNY'),
                1, 1, '$day 12:00:00+00', '$day 12:00:00+00', '$day 12:00:01+00'
         FROM generate_series(1, $HIST_PER_DAY) g" >/dev/null || die "seeding day $day failed"
    sql "INSERT INTO notify_receipt (channel, received_at, peer, headers, body_b64, body_bytes, status, outcome, detail, out_trade_no, route)
         SELECT 'wechat', '$day 12:00:00+00', '127.0.0.1', '{\"content-type\": \"application/json\"}',
                encode(convert_to(repeat(md5(g::text), 28), 'UTF8'), 'base64'), 896, 401, 'bad_signature',
                'seeded', 'H$d-' || g, '/notify/wechat'
         FROM generate_series(1, $((HIST_PER_DAY / 10))) g" >/dev/null || die "seeding receipts of $day failed"
  done
  if [ "$ARCHIVE_ORDERS" -gt 0 ]; then
    sql "INSERT INTO orders (order_no, status, amount_fen, refunded_fen, currency, subject, channel, transaction_id, created_at, paid_at, expire_at)
         SELECT 'Z' || g, 'PAID', $AMOUNT, 0, 'CNY', 'a year ago', 'wechat', 'TZ' || g,
                now() - interval '401 days', now() - interval '401 days', now() - interval '401 days'
         FROM generate_series(1, $ARCHIVE_ORDERS) g;
         INSERT INTO pay_callback (out_trade_no, channel, transaction_id, amount_fen, digest, created_at)
         SELECT 'Z' || g, 'wechat', 'TZ' || g, $AMOUNT, md5(g::text) || md5(g::text), now() - interval '401 days'
         FROM generate_series(1, $ARCHIVE_ORDERS) g" >/dev/null || die "seeding old orders failed"
  fi
  sql "VACUUM ANALYZE" >/dev/null
}
# "message-bytes receipt-bytes orders-bytes callback-bytes wal-position"
sizes() {
  sql "SELECT (SELECT coalesce(sum(pg_total_relation_size(inhrelid)), 0) FROM pg_inherits WHERE inhparent = 'local_message'::regclass)
       || ' ' || (SELECT coalesce(sum(pg_total_relation_size(inhrelid)), 0) FROM pg_inherits WHERE inhparent = 'notify_receipt'::regclass)
       || ' ' || pg_total_relation_size('orders') || ' ' || pg_total_relation_size('pay_callback')
       || ' ' || (pg_current_wal_lsn() - '0/0'::pg_lsn)"
}
if [ "$RETENTION" = 1 ]; then
  log "seeding $HIST_DAYS days × $HIST_PER_DAY sent messages (and a tenth as many receipts) before the window, $ARCHIVE_ORDERS orders of 401 days ago"
  seed_history
  log "sizes before (messages receipts orders callbacks, bytes; WAL position): $(sizes)"
fi
pn_start s "$(free_port)"
U=$(pn_url s)

seed() { # PREFIX COUNT: waiting orders PREFIX1 … PREFIXCOUNT
  sql "INSERT INTO orders (order_no, status, amount_fen, refunded_fen, currency, subject, created_at, expire_at)
       SELECT '$1' || g, 'WAIT_PAY', $AMOUNT, 0, 'CNY', 'soak', now(), now() + interval '1 day'
       FROM generate_series(1, $2) g" >/dev/null || die "seeding $1 failed"
}
forge_to() { # KIND PREFIX COUNT FILE
  (cd "$T/sbx" && "$PAYNOTIFY_BIN" forge "$1" --prefix "$2" --count "$3" --amount-fen $AMOUNT \
    --out "$4" --config paynotify.toml >/dev/null 2>>"$T/forge.err") || die "forge $2 failed: $(tail -n 2 "$T/forge.err")"
}

# segment NAME TOTAL FIRSTS_ONLY [PREVIOUS]: forges and composes $T/seg-NAME.req (TOTAL
# requests) and $T/seg-NAME.want (see soak_mix.py); repeats come from segment PREVIOUS.
segment() {
  local name=$1 total=$2 only=$3 prev=${4:-} firsts half
  firsts=$((total / 10))
  [ "$firsts" -le "$FIRSTS" ] || firsts=$FIRSTS
  [ "$only" = 1 ] && firsts=$total
  half=$((firsts / 2))
  seed "$name-W" "$half"
  seed "$name-A" "$((firsts - half))"
  forge_to wechat "$name-W" "$half" "$T/$name.fw"
  forge_to alipay "$name-A" "$((firsts - half))" "$T/$name.fa"
  if [ "$only" = 0 ]; then
    forge_to wechat "$name-UW" 50 "$T/$name.uw"
    forge_to alipay "$name-UA" 50 "$T/$name.ua"
  fi
  python3 "$CHAOS_DIR/soak_mix.py" "$T" "$name" "$total" "$only" $prev 2>>"$T/forge.err" ||
    die "composing segment $name failed: $(tail -n 2 "$T/forge.err")"
  rm -f "$T/$name".f? "$T/$name".u?
}

# replay NAME [RATE]: wrk over segment NAME (at RATE per second, else as fast as it answers);
# checks the answers against the want file and writes "answered ok statuses duration_us
# p99_us" to $T/result.
replay() {
  local name=$1 rate=${2:-} wrk_pid line
  rm -f "$T"/done.*
  env BENCH_REQUESTS="$T/seg-$name.req" BENCH_THREADS=$THREADS BENCH_DONE="$T/done" ${rate:+BENCH_RATE=$rate} \
    wrk -t$THREADS -c"$CONNS" -d$((SEG * 3))s --timeout 10s -s "$REPO_DIR/bench/notify.lua" "$U" >"$T/wrk-$name.out" 2>&1 &
  wrk_pid=$!
  while kill -0 "$wrk_pid" 2>/dev/null; do
    if [ "$(find "$T" -maxdepth 1 -name 'done.*' | wc -l)" -ge $THREADS ]; then
      kill -INT "$wrk_pid"
      break
    fi
    sleep 0.1
  done
  wait "$wrk_pid"
  line=$(grep '^RESULT' "$T/wrk-$name.out") || die "wrk gave no result for $name: $(tail -n 3 "$T/wrk-$name.out")"
  local answered ok statuses duration p99 n401 n404 other firsts dups bad unknown
  answered=$(sed 's/.*answered=\([0-9]*\).*/\1/' <<<"$line")
  ok=$(sed 's/.* ok=\([0-9]*\).*/\1/' <<<"$line")
  statuses=$(sed 's/.*statuses=\([^ ]*\).*/\1/' <<<"$line")
  duration=$(sed 's/.*duration_us=\([0-9]*\).*/\1/' <<<"$line")
  p99=$(sed 's/.*p99_us=\([0-9]*\).*/\1/' <<<"$line")
  read -r firsts dups bad unknown <"$T/seg-$name.want"
  sum_code() { tr ',' '\n' <<<"$statuses" | awk -F x -v c="$1" '$1 == c {n += $2} END {print n + 0}'; }
  n401=$(sum_code 401)
  n404=$(sum_code 404)
  other=$(tr ',' '\n' <<<"$statuses" | awk -F x '$1 != "" && $1 != "-" && $1 != 401 && $1 != 404 {n += $2} END {print n + 0}')
  [ "$ok" = $((firsts + dups)) ] || fail "segment $name: $ok answered 2xx, expected $((firsts + dups)) ($statuses)"
  [ "$n401" = "$bad" ] || fail "segment $name: $n401 answered 401, expected $bad"
  [ "$n404" = "$unknown" ] || fail "segment $name: $n404 answered 404, expected $unknown"
  [ "$other" = 0 ] || fail "segment $name: $other other answers ($statuses)"
  echo "$answered $ok $statuses $duration $p99" >"$T/result"
}

log "warm-up and peak: $FIRSTS first deliveries, then $((FIRSTS * 10)) requests of the mix, unpaced, $CONNS connections"
segment warm "$FIRSTS" 1
segment peak $((FIRSTS * 10)) 0 warm
replay warm
replay peak
read -r answered _ _ duration p99 <"$T/result"
PEAK=$((answered * 1000000 / duration))
RATE=$((PEAK / 2))
[ "$RATE" -gt 0 ] || die "no peak measured"
PER_SEG=$((RATE * SEG))
log "peak $PEAK requests/s (p99 $((p99 / 1000)) ms); soak at $RATE/s: $SEGMENTS segments of $SEG s, $PER_SEG requests each"

RSS_PEAK=$(pn_rss_kb s)
segment s1 "$PER_SEG" 0 peak
: >"$T/report"
: >"$T/sizes"
# First deliveries so far: callback rows of the soak's own orders (the archive removes the
# seeded ones meanwhile).
firsts_so_far() { sql "SELECT count(*) FROM pay_callback WHERE out_trade_no NOT LIKE 'Z%'"; }
[ "$RETENTION" = 1 ] && echo "0 $(sizes) $(firsts_so_far)" >>"$T/sizes"
for k in $(seq 1 "$SEGMENTS"); do
  next=$((k + 1))
  if [ "$k" -lt "$SEGMENTS" ]; then
    segment "s$next" "$PER_SEG" 0 "s$k" &
    forging=$!
  fi
  started=$SECONDS
  replay "s$k" "$RATE"
  read -r answered ok statuses duration p99 <"$T/result"
  took=$((SECONDS - started))
  rss=$(pn_rss_kb s)
  fds=$(pn_fds s)
  echo "$k $answered $((answered * 1000000 / duration)) $((p99 / 1000)) $rss $fds $took $statuses" >>"$T/report"
  log "segment $k: $answered requests at $((answered * 1000000 / duration))/s, p99 $((p99 / 1000)) ms, RSS $rss kB, $fds fds, ${took} s"
  if [ "$RETENTION" = 1 ]; then
    echo "$k $(sizes) $(firsts_so_far)" >>"$T/sizes"
    log "segment $k sizes (messages receipts orders callbacks, bytes; WAL position; first deliveries so far): $(tail -n 1 "$T/sizes")"
  fi
  [ "$took" -le $((SEG * 3 / 2)) ] || fail "segment $k took $took s (the service fell behind $RATE/s)"
  if [ "$k" -lt "$SEGMENTS" ]; then wait "$forging" || die "forging segment $next failed"; fi
  rm -f "$T/seg-s$k.req" "$T/s$((k - 1)).first"
done

read -r _ _ _ P99A RSS0 FD0 _ <"$T/report"
read -r _ _ _ P99B RSS1 FD1 _ < <(tail -n 1 "$T/report")
[ "$RSS1" -lt $((RSS0 * 3 / 2 + 32768)) ] || fail "RSS grew from $RSS0 kB to $RSS1 kB"
[ "$FD1" -le $((FD0 + 20)) ] || fail "open fds grew from $FD0 to $FD1"
[ "$P99B" -le $((P99A * 3 + 20)) ] || fail "p99 grew from $P99A ms to $P99B ms"
errors=$(grep -cE ' ERROR |panicked' "$T/pn-s.log")
[ "$errors" = 0 ] || fail "$errors ERROR/panic lines in the log: $(grep -m 3 -E ' ERROR |panicked' "$T/pn-s.log")"

wait_drained 120
if [ "$RETENTION" = 1 ]; then
  # WAL per request and per first delivery over the soak's segments; the retention runs.
  read -r _ _ _ _ _ WAL0 CB0 <"$T/sizes"
  read -r _ _ _ _ _ WAL1 CB1 < <(tail -n 1 "$T/sizes")
  soaked=$(awk '{n += $2} END {print n}' "$T/report")
  log "WAL over the soak: $((WAL1 - WAL0)) bytes, $(((WAL1 - WAL0) / soaked)) per request, $(((WAL1 - WAL0) / (CB1 - CB0 > 0 ? CB1 - CB0 : 1))) per first delivery ($((CB1 - CB0)) first deliveries, $soaked requests)"
  grep -E 'retention purge|orders archived|partitions not kept|order archive failed' "$T/pn-s.log" | sed 's/^/  /' >"$T/retention" || true
  log "retention runs:"
  cat "$T/retention"
  [ "$(sql "SELECT count(*) FROM local_message WHERE biz_key LIKE 'H%'")" = 0 ] || fail "history messages left past the window"
  [ "$(sql "SELECT count(*) FROM orders WHERE order_no LIKE 'Z%'")" = 0 ] || fail "orders of 401 days ago left"
  [ "$(sql "SELECT count(*) FROM pay_callback WHERE out_trade_no LIKE 'Z%'")" = 0 ] || fail "callback rows of archived orders left"
  archived=$(zcat "$T"/archive/orders-*.jsonl.gz 2>/dev/null | grep -c '"order_no":"Z' || true)
  [ "$archived" -ge "$ARCHIVE_ORDERS" ] || fail "$archived orders in the archive, $ARCHIVE_ORDERS expected"
fi
ORDERS=$(sql "SELECT count(*) FROM orders")
v=$(sql "SELECT count(*) FROM orders WHERE status = 'PAID'")
[ "$v" = "$ORDERS" ] || fail "$v of $ORDERS orders PAID"
v=$(sql "SELECT count(*) FROM pay_callback")
[ "$v" = "$ORDERS" ] || fail "$v callback rows for $ORDERS orders"
v=$(sql "SELECT count(DISTINCT biz_key) || ' ' || count(*) FROM local_message WHERE topic = 'ORDER_PAID'")
[ "$v" = "$ORDERS $ORDERS" ] || fail "ORDER_PAID events (distinct, all) $v for $ORDERS orders"
v=$(sql "SELECT count(*) FROM local_message WHERE topic <> 'ORDER_PAID'")
[ "$v" = 0 ] || fail "$v other events"
sql "SELECT order_no FROM orders" | sort >"$T/orders"
rcli "$RP" --raw XRANGE paynotify:events - + | awk 'prev == "biz_key" {print} {prev = $0}' | sort -u >"$T/stream-keys"
missing=$(comm -23 "$T/orders" "$T/stream-keys" | wc -l)
[ "$missing" = 0 ] || fail "$missing events never reached the stream"

total=$(awk '{n += $2} END {print n}' "$T/report")
log "peak $PEAK/s, soak $RATE/s for $SEGMENTS × $SEG s: $total requests, $ORDERS orders paid once each (warm-up and peak included)"
log "RSS after the peak $RSS_PEAK kB; first segment $RSS0 kB → last $RSS1 kB; fds $FD0 → $FD1; p99 first segment $P99A ms, last $P99B ms; ERROR lines $errors"
log "per segment (k, requests, per s, p99 ms, RSS kB, fds, seconds, non-2xx): $(tr '\n' ';' <"$T/report")"
pn_term s || fail "no exit within 20 s of SIGTERM"
chaos_end
