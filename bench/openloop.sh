#!/usr/bin/env bash
# Latency as users feel it: WeChat Pay notifications sent OPEN LOOP — at a fixed rate, whatever
# the answers do, each latency counted from when its request was due (`paynotify load`) — at a
# release build on PostgreSQL, relay on.
#
#   bench/openloop.sh                          # empty database
#   HISTORY=2000000 bench/openloop.sh          # a database a year in (2,000,000 paid orders, analysed)
#   RATES="500 1000 1500" DURATION=5 bench/openloop.sh
#
# First the sustainable rate: first deliveries at each rate of RATES in turn (DURATION seconds
# each, fresh orders), until one is not sustained — p99 of 100 ms or more, any answer other
# than 204, fewer answers per second than 95 % of the rate, or exactly-once broken; then
# REFINE halvings between the last rate sustained and the first that was not. Then, at 25 %,
# 50 % and 75 % of the sustainable rate, MEASURE seconds of first deliveries (fresh orders)
# and the same requests again at the same rate (repeats). Exactly-once is checked in SQL after
# every pass (every order PAID, one callback row, one ORDER_PAID message, nothing else).
# FRACTIONS (default "25 50 75") names the percentages measured after the search; empty:
# none (RATES=2375 REFINE=0 FRACTIONS= measures one rate).
#
# GATE=1 puts the Redis gate in front ($REDIS_URL). SERVICE_ENV adds VAR=value words to the
# service's environment. DB_SET="name = value" sets a PostgreSQL setting for the benchmark's
# database (`ALTER DATABASE … SET`), for diagnosis: DB_SET="synchronous_commit = off" shows
# what the WAL flush costs — never a way to run the service. Requests are forged right before their pass (WeChat refuses a
# timestamp five minutes old). The load generator runs on the same machine: its own CPU is in
# the figures' machine, not in the service's.
#
# Prints a markdown table (and keeps it in $OUT, default /tmp/openloop.md).
set -euo pipefail

CONNS=${CONNS:-64}
DURATION=${DURATION:-8}
MEASURE=${MEASURE:-15}
RATES=${RATES:-"1000 2000 3000 4000 5000 6000 8000"}
REFINE=${REFINE:-2}
FRACTIONS=${FRACTIONS-"25 50 75"}   # percentages of the sustainable rate measured after the search
P99_LIMIT_MS=${P99_LIMIT_MS:-100}
GATE=${GATE:-0}
PGURL=${PGURL:-postgres://postgres@127.0.0.1:5432}
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379}
PORT=${PORT:-18932}
SERVICE_ENV=${SERVICE_ENV:-}
HISTORY=${HISTORY:-0}
STALE=${STALE:-0}
OUT=${OUT:-/tmp/openloop.md}
AMOUNT=19900

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=${BIN:-$TARGET/release/paynotify}
echo "building (release)"
[ "${BUILD:-1}" = 1 ] && cargo build --release --locked --bin paynotify 2>&1 | tail -1

# shellcheck source=bench/lib.sh
source bench/lib.sh
seed_history

ROWS=$WORK/rows.tsv   # pass rate achieved p50 p99 p999 max errors statuses lag_p99 cpu_us check
: >"$ROWS"
CLK_TCK=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$SERVICE_PID/stat"; }

# Waits (60 s at most) until the relay has sent every message written so far, so a pass does
# not pay for the one before it.
drain_relay() {
    local left
    for _ in $(seq 600); do
        left=$(sql "SELECT count(*) FROM local_message WHERE status = 0")
        [ "$left" = 0 ] && return 0
        sleep 0.1
    done
    echo "  (the relay still had $left messages to send)"
}

# One open-loop pass: sends FILE at RATE; appends its row; prints it; fails (1) when the
# rate was not sustained.
LAST_OK=0
load_pass() { # name rate file prefix count
    local name=$1 rate=$2 file=$3 prefix=$4 count=$5 line before after
    drain_relay
    before=$(cpu_ticks)
    "$BIN" load --requests "$file" --target "127.0.0.1:$PORT" --rate "$rate" \
        --connections "$CONNS" >"$WORK/load.out"
    line=$(grep '^RESULT' "$WORK/load.out")
    after=$(cpu_ticks)
    local verdict
    verdict=$(check "$prefix" "$count")
    field() { sed "s/.* $1=\([^ ]*\).*/\1/" <<<"$line"; }
    local achieved p50 p99 p999 max errors statuses lag cpu
    achieved=$(field achieved)
    p50=$(field p50_us)
    p99=$(field p99_us)
    p999=$(field p999_us)
    max=$(field max_us)
    errors=$(field errors)
    statuses=$(field statuses)
    lag=$(field lag_p99_us)
    cpu=$(awk -v t=$((after - before)) -v hz="$CLK_TCK" -v n="$count" 'BEGIN {printf "%.0f", t / hz / n * 1e6}')
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$rate" "$achieved" "$p50" "$p99" \
        "$p999" "$max" "$errors" "$statuses" "$lag" "$cpu" "$verdict" >>"$ROWS"
    ms() { awk -v v="$1" 'BEGIN {printf "%.1f", v / 1000}'; }
    printf '  %-8s %5s/s: %5s/s answered, p50 %s ms, p99 %s ms, p99.9 %s ms, max %s ms, errors %s (%s), send lag p99 %s ms, service CPU %s µs/request, exactly-once %s\n' \
        "$name" "$rate" "$achieved" "$(ms "$p50")" "$(ms "$p99")" "$(ms "$p999")" "$(ms "$max")" "$errors" \
        "$statuses" "$(ms "$lag")" "$cpu" "$verdict"
    # The slowest answers, "due ms:latency ms" (a stall shows as several due close together).
    echo "           $(grep '^SLOWEST' "$WORK/load.out" | cut -d' ' -f2-11)"
    [ "$verdict" = ok ] && [ "$errors" = 0 ] && [ "$p99" -lt $((P99_LIMIT_MS * 1000)) ] &&
        awk -v a="$achieved" -v r="$rate" 'BEGIN {exit !(a >= 0.95 * r)}'
}

STEP=0
first_pass() { # name rate seconds: fresh orders, forged now; sets FILE, PREFIX, COUNT
    STEP=$((STEP + 1))
    PREFIX="O${STEP}-"
    COUNT=$(($2 * $3))
    FILE=$WORK/step-$STEP
    seed_orders "$PREFIX" "$COUNT" >/dev/null
    forge wechat "$PREFIX" "$COUNT" "$FILE"
    load_pass "$1" "$2" "$FILE" "$PREFIX" "$COUNT"
}

[ -n "${DB_SET:-}" ] && sql "ALTER DATABASE $DB SET $DB_SET"
if [ "$GATE" = 1 ]; then
    start_service openloop PAYNOTIFY__REDIS__URL="$REDIS_URL" PAYNOTIFY__REDIS__KEY_PREFIX="$REDIS_PREFIX"
else
    start_service openloop
fi
MACHINE="$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), PostgreSQL $(sql 'SHOW server_version' | cut -d' ' -f1), synchronous_commit=$(sql 'SHOW synchronous_commit')${DB_SET:+ ($DB_SET for the service)}; history $HISTORY orders; gate $([ "$GATE" = 1 ] && echo on || echo off); $CONNS connections"
echo "machine: $MACHINE; load average $(cut -d' ' -f1-3 /proc/loadavg)"

# A warm-up, not counted: connections, prepared statements, the relay's first claims.
first_pass warm-up 200 2 >/dev/null || true
: >"$ROWS"

echo "the sustainable rate (first deliveries, $DURATION s each)"
sustained=0
failed=0
for rate in $RATES; do
    if first_pass search "$rate" "$DURATION"; then
        sustained=$rate
    else
        failed=$rate
        break
    fi
done
for _ in $(seq "$REFINE"); do
    [ "$failed" -gt 0 ] && [ $((failed - sustained)) -gt 100 ] || break
    rate=$(((sustained + failed) / 2))
    if first_pass search "$rate" "$DURATION"; then sustained=$rate; else failed=$rate; fi
done
[ "$sustained" -gt 0 ] || { echo "not even ${RATES%% *}/s was sustained" >&2; exit 1; }
echo "sustainable: $sustained/s$([ "$failed" -gt 0 ] && echo " (not $failed/s)")"

for pct in $FRACTIONS; do
    rate=$((sustained * pct / 100))
    first_pass "first $pct%" "$rate" "$MEASURE" || true
    load_pass "repeat $pct%" "$rate" "$FILE" "$PREFIX" "$COUNT" || true
done
stop_service

python3 - "$ROWS" "$OUT" "$MACHINE" "$sustained" "$failed" "$(date -u '+%Y-%m-%d %H:%M UTC')" \
    "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo +changes)" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'EOF'
import sys
rows_path, out, machine, sustained, failed, when, commit, load = sys.argv[1:]
rows = [l.rstrip("\n").split("\t") for l in open(rows_path) if l.strip()]
ms = lambda us: f"{int(us) / 1000:.1f}"
lines = [f"Run of {when}, commit {commit}: {machine}; load average at the end {load}. "
         f"Sustainable: **{int(sustained):,}/s** of first deliveries"
         + (f" (not {int(failed):,}/s)." if failed != "0" else "."), "",
         "| pass | rate /s | answered /s | p50 ms | p99 ms | p99.9 ms | max ms | errors | send lag p99 ms | service CPU µs/request | exactly-once |",
         "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
for name, rate, achieved, p50, p99, p999, mx, errors, statuses, lag, cpu, check in rows:
    errs = errors if statuses == "-" else f"{errors} ({statuses})"
    lines.append(f"| {name} | {int(rate):,} | {int(float(achieved)):,} | {ms(p50)} | {ms(p99)} | {ms(p999)} | {ms(mx)} | {errs} | {ms(lag)} | {cpu} | {check} |")
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
