#!/usr/bin/env bash
# The service's own cost in instructions, not seconds: a release build run under
# `valgrind --tool=callgrind` on a fresh PostgreSQL database with sandbox keys, replayed N
# WeChat first deliveries (each for its own waiting order), then the same N requests again
# (repeats). Callgrind counts the instructions the service's process executes in user space,
# whatever else the machine does: the same binary and the same requests give the same count.
# The kernel (system calls, the network stack), the database and the sender are not counted.
#
#   bench/instructions.sh                    # N=500 per pass
#   N=1000 BIN=target/release/paynotify bench/instructions.sh
#   GATE=1 bench/instructions.sh             # with the Redis gate ($REDIS_URL)
#   KEEP=/tmp/instr bench/instructions.sh    # keep the callgrind dumps there
#
# Steps: build (unless BIN= is given), create a database on $PGURL (bench/lib.sh: a unique
# name, dropped at exit), sandbox keys, migrate, seed N waiting orders, start the service under
# callgrind (relay on with its default sink; no Redis unless GATE=1), wait for /readyz, zero
# the counters (`callgrind_control -z`), send the N first deliveries (`paynotify load`: RATE a
# second over CONNS keep-alive connections; the sender is not measured), wait until every order
# is PAID and the relay has sent every message, dump (`callgrind_control -d`), send the same N
# requests again, wait until the relay is idle, dump, stop the service. After each pass
# exactly-once is checked in SQL (every order PAID, one pay_callback row and one ORDER_PAID
# message per order, every message sent).
#
# WeChat refuses a Wechatpay-Timestamp more than 5 minutes from now: the requests are forged
# once the service is ready, and forged again (same orders, same transactions, same amounts:
# duplicates to the ledger) for the repeat pass when the first pass took longer than
# REFORGE_AFTER seconds (default 240).
#
# The report (bench/callgrind_components.py): the self cost of every function grouped
# by component (patterns on the demangled symbol, see `component()` below), in instructions
# per request; "crypto" is RSA verify + AES-GCM decrypt of the request (ring's bignum, RSA,
# SHA-256 of the signed message, AES and GHASH).
#
# Needs: cargo, valgrind (callgrind_control, callgrind_annotate), psql, curl, python3.
set -euo pipefail

N=${N:-500}
CONNS=${CONNS:-4}
RATE=${RATE:-25}
GATE=${GATE:-0}
PGURL=${PGURL:-postgres://postgres@127.0.0.1:5432}
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379}
PORT=${PORT:-18961}
READY_SECS=${READY_SECS:-600}
REFORGE_AFTER=${REFORGE_AFTER:-240}
KEEP=${KEEP:-}
AMOUNT=19900

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
if [ -z "${BIN:-}" ]; then
    echo "building (release)"
    cargo build --release --locked --bin paynotify 2>&1 | tail -1
    BIN=$TARGET/release/paynotify
fi
BIN=$(realpath "$BIN")
command -v valgrind >/dev/null || { echo "installing valgrind"; apt-get install -y valgrind >/dev/null; }

HISTORY=0
STALE=0
# shellcheck source=bench/lib.sh
source bench/lib.sh
OUT=$WORK/callgrind.out
# The dumps are kept (KEEP=dir) before lib.sh's cleanup removes $WORK.
keep_dumps() {
    if [ -n "$KEEP" ]; then
        mkdir -p "$KEEP"
        cp "$WORK"/callgrind.out* "$WORK"/*.log "$KEEP"/ 2>/dev/null || true
    fi
    cleanup
}
trap keep_dumps EXIT
seed_orders I- "$N" >/dev/null

# Exactly-once for the N orders, and the relay done: "paid callbacks messages distinct other unsent".
state() {
    sql "SELECT (SELECT count(*) FROM orders WHERE order_no LIKE 'I-%' AND status = 'PAID' AND paid_at IS NOT NULL)
        || ' ' || (SELECT count(*) FROM pay_callback WHERE out_trade_no LIKE 'I-%')
        || ' ' || (SELECT count(*) FROM local_message WHERE topic = 'ORDER_PAID' AND biz_key LIKE 'I-%')
        || ' ' || (SELECT count(DISTINCT biz_key) FROM local_message WHERE topic = 'ORDER_PAID' AND biz_key LIKE 'I-%')
        || ' ' || (SELECT count(*) FROM local_message WHERE topic <> 'ORDER_PAID' AND biz_key LIKE 'I-%')
        || ' ' || (SELECT count(*) FROM local_message WHERE sent_at IS NULL)"
}
# Waits until every order is paid exactly once and every message sent; fails after 10 minutes.
settled() { # pass
    local got
    for _ in $(seq 600); do
        got=$(state)
        [ "$got" = "$N $N $N $N 0 0" ] && { echo "  $1: exactly-once ok, relay done"; return 0; }
        sleep 1
    done
    echo "  $1: FAILED (paid callbacks messages distinct other unsent = $got, want $N $N $N $N 0 0)" >&2
    exit 1
}

# Sends every request of a file once, RATE a second over CONNS keep-alive connections
# (`paynotify load`); prints the answers' statuses.
send() { # file
    "$BIN" load --requests "$1" --target "127.0.0.1:$PORT" --rate "$RATE" --connections "$CONNS" \
        --timeout-secs 60 | sed -n 's/^RESULT.* ok=\([0-9]*\) errors=\([0-9]*\) statuses=\([^ ]*\).*/\1 ok, \2 errors (\3)/p'
}

metric() { # name and labels as /metrics prints them
    curl -fs "http://127.0.0.1:$PORT/metrics" | awk -v m="$1" '$1 == m {print $2}'
}

dumps() { find "$WORK" -maxdepth 1 -name 'callgrind.out.*' | wc -l; }
dump() { # waits for the dump file to appear
    local before
    before=$(dumps)
    callgrind_control -d "$SERVICE_PID" >/dev/null
    for _ in $(seq 300); do
        [ "$(dumps)" -gt "$before" ] && return 0
        sleep 1
    done
    echo "no callgrind dump appeared" >&2
    exit 1
}

gate_env=(PAYNOTIFY__REDIS__URL=)
[ "$GATE" = 1 ] && gate_env=(PAYNOTIFY__REDIS__URL="$REDIS_URL" PAYNOTIFY__REDIS__KEY_PREFIX="$REDIS_PREFIX")
(cd "$WORK/keys" && exec env PAYNOTIFY__DATABASE__URL="$DBURL" PAYNOTIFY__DATABASE__AUTO_MIGRATE=false \
    "${gate_env[@]}" valgrind --tool=callgrind --callgrind-out-file="$OUT" --dump-instr=no \
    --collect-atstart=yes "$BIN" serve --config paynotify.toml >"$WORK/service.log" 2>&1) &
SERVICE_PID=$!
echo "waiting for the service under callgrind (pid $SERVICE_PID)"
ready=0
for _ in $(seq "$READY_SECS"); do
    if curl -fs "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1; then ready=1; break; fi
    kill -0 "$SERVICE_PID" 2>/dev/null || break
    sleep 1
done
if [ "$ready" != 1 ]; then
    echo "the service did not become ready; its log:" >&2
    tail -20 "$WORK/service.log" >&2
    exit 1
fi
# Let start-up's background work (the relay's first ticks, job scheduling) settle.
sleep 5

forge wechat I- "$N" "$WORK/first"
callgrind_control -z "$SERVICE_PID" >/dev/null
t0=$(date +%s)
echo "first deliveries: $N requests, $CONNS connections: $(send "$WORK/first")"
settled first
dump
FIRST_DUMP=$(ls -t "$WORK"/callgrind.out.* | head -1)

if [ $(($(date +%s) - t0)) -gt "$REFORGE_AFTER" ]; then
    echo "  forged again for the repeats (the first requests' timestamps are too old by now)"
    forge wechat I- "$N" "$WORK/first"
fi
dup_before=$(metric 'paynotify_notifications_total{channel="wechat",outcome="duplicate"}')
callgrind_control -z "$SERVICE_PID" >/dev/null
echo "repeats: $N requests: $(send "$WORK/first")"
settled repeats
dup_after=$(metric 'paynotify_notifications_total{channel="wechat",outcome="duplicate"}')
echo "  repeats counted as duplicates: $(( ${dup_after%.*} - ${dup_before:-0} ))"
dump
REPEAT_DUMP=$(ls -t "$WORK"/callgrind.out.* | head -1)

kill -TERM "$SERVICE_PID"
wait "$SERVICE_PID" || true
SERVICE_PID=

# Instructions per request by component: bench/callgrind_components.py.
report() { # title dump
    python3 bench/callgrind_components.py "$1" "$N" "$2"
}
report "first deliveries" "$FIRST_DUMP"
report "repeats" "$REPEAT_DUMP"
