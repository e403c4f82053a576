#!/usr/bin/env bash
# The whole-service benchmark: a release build on a fresh PostgreSQL database with sandbox
# keys, driven by wrk replaying pre-forged notifications (the load generator only sends
# bytes), next to pgbench running the ledger's statements on the same server, in one run.
#
#   bench/run.sh                  # N=10000 notifications per pass, 64 connections
#   N=20000 CONNS=64 bench/run.sh
#   HISTORY=2000000 STALE=1 ONLY=ledger CHANNELS=wechat PASSES=first PGBENCH=0 bench/run.sh
#
# HISTORY=N seeds N paid orders first, each with its callback row and its sent ORDER_PAID
# message, and analyses the tables: a database a year in. STALE=1 leaves the pass's own
# waiting orders out of the statistics (they are seeded after the last ANALYZE: a sale after a
# quiet night, or an empty database never analysed when HISTORY=0); by default every seed is
# analysed.
#
# Passes, for the ledger alone (group apply on, the default), the ledger with group apply off
# (`single`: every payment its own statement) and with the Redis gate, for WeChat Pay and
# Alipay:
#   first      N first deliveries, each for its own order
#   duplicate  the same N requests again, byte for byte
#   mix        N/2 requests: 9 first deliveries of fresh orders, then 1 redelivery, repeated
# After every pass exactly-once is checked in SQL (every order of the pass PAID, one callback
# row and one ORDER_PAID message per order, no other message). Then receipts.store
# "rejected" vs "off" for first deliveries, in alternating rounds (RECEIPT_ROUNDS, 0 to skip),
# and the same for group apply on vs off (GROUP_ROUNDS, N each, 0 to skip) and for the Redis
# gate on vs off (GATE_ROUNDS, N each, 0 to skip). IO_ROUNDS compares server.io_threads
# (0: a quarter of the cores) with one thread per core; RECENT_ROUNDS compares the gate with
# and without redis.recent_answers, first deliveries then the same requests again (both off
# by default). BUILD_ROUNDS compares two builds, BIN_BEFORE (another binary) and BIN, first
# deliveries then the same requests again (off by default).
# pgbench runs benches/sql/ledger_first.sql (three statements, five round trips),
# ledger_first_cte.sql (the same rows in one statement), ledger_group_cte.sql (ten notices
# in one statement, as group apply writes them) and ledger_duplicate.sql. Every pass and
# pgbench run also reports the WAL the server wrote per notice (`pg_stat_wal`).
#
# Prints a table; with WRITE_DOCS=1 (the default) writes it between the markers in
# docs/benchmarks.md and the latency plot to docs/bench/latency.png.
#
# Needs: cargo, psql/pgbench/createdb, redis-cli, curl, python3; wrk and gnuplot (both
# installed from Debian when missing; without gnuplot the report has no plot). PostgreSQL at $PGURL
# (default postgres://postgres@127.0.0.1:5432), Redis at $REDIS_URL (default
# redis://127.0.0.1:6379). Everything runs on 127.0.0.1.
set -euo pipefail

N=${N:-10000}
CONNS=${CONNS:-64}
THREADS=${THREADS:-2}
PGBENCH_CLIENTS=${PGBENCH_CLIENTS:-16}
RECEIPT_ROUNDS=${RECEIPT_ROUNDS:-6}
GROUP_ROUNDS=${GROUP_ROUNDS:-4}
GATE_ROUNDS=${GATE_ROUNDS:-4}
IO_ROUNDS=${IO_ROUNDS:-0}
RECENT_ROUNDS=${RECENT_ROUNDS:-0}
BUILD_ROUNDS=${BUILD_ROUNDS:-0}
BIN_BEFORE=${BIN_BEFORE:-}
RECEIPT_N=${RECEIPT_N:-$((N / 2))}
PGURL=${PGURL:-postgres://postgres@127.0.0.1:5432}
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379}
PORT=${PORT:-18931}
WRITE_DOCS=${WRITE_DOCS:-1}
ONLY=${ONLY:-}            # ONLY=ledger, single, gate or receipts: that part only (or several, "ledger single")
SERVICE_ENV=${SERVICE_ENV:-}  # extra VAR=value words for the service, e.g. RUST_LOG=warn
PERF_OUT=${PERF_OUT:-}    # with PERF_MATCH (a glob of config/channel/pass, e.g. "ledger/wechat/first"):
PERF_MATCH=${PERF_MATCH:-}  # `perf record` of the service during matching passes, into $PERF_OUT.<pass>
CHANNELS=${CHANNELS:-"wechat alipay"}
PGBENCH=${PGBENCH:-1}     # 0: skip pgbench (quick comparisons of the service alone)
PASSES=${PASSES:-"first duplicate mix"}
HISTORY=${HISTORY:-0}
STALE=${STALE:-0}
AMOUNT=19900

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=${BIN:-$TARGET/release/paynotify}

command -v wrk >/dev/null || { echo "installing wrk"; apt-get install -y wrk >/dev/null; }
if [ "$WRITE_DOCS" = 1 ] && ! command -v gnuplot >/dev/null; then
    echo "installing gnuplot"
    apt-get install -y gnuplot-nox >/dev/null || echo "no gnuplot: the report will have no plot"
fi
echo "building (release)"
[ "${BUILD:-1}" = 1 ] && cargo build --release --locked --bin paynotify 2>&1 | tail -1

# shellcheck source=bench/lib.sh
source bench/lib.sh

CLK_TCK=$(getconf CLK_TCK)
MACHINE="$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(psql -qAt "$PGURL/postgres" -c 'SHOW server_version' | cut -d' ' -f1) PostgreSQL, synchronous_commit=$(psql -qAt "$PGURL/postgres" -c 'SHOW synchronous_commit'); history $HISTORY orders, statistics $([ "$STALE" = 1 ] && echo "stale (the pass's orders never analysed)" || echo fresh)"
RESULTS=$WORK/results.tsv   # config channel pass answered ok errors rate p50 p99 p999 cpu_us rss_mb check group machine_us db_us wal_bytes wal_syncs
: >"$RESULTS"

seed_history

# The mix: 9 requests of $1 (fresh orders), then 1 of $2 (a redelivery), repeated.
interleave() { # fresh redeliveries out
    python3 - "$1" "$2" "$3" <<'EOF'
import sys
def records(path):
    with open(path, "rb") as f:
        while True:
            line = f.readline()
            if not line:
                return
            yield line + f.read(int(line))
fresh, again = records(sys.argv[1]), records(sys.argv[2])
with open(sys.argv[3], "wb") as out:
    for i, r in enumerate(fresh):
        out.write(r)
        if i % 9 == 8:
            out.write(next(again))
EOF
}

cpu_ticks() { awk '{print $14 + $15}' "/proc/$SERVICE_PID/stat"; }
# WAL written by the whole server so far (bytes; PostgreSQL 14+).
wal_bytes() { psql -qAt "$PGURL/postgres" -c "SELECT wal_bytes::bigint FROM pg_stat_wal"; }
# WAL flushes (fsync/fdatasync) of the whole server so far.
wal_syncs() { psql -qAt "$PGURL/postgres" -c "SELECT wal_sync FROM pg_stat_wal"; }
# Busy ticks of the whole machine (service, database, Redis, wrk: all it costs on two cores).
machine_ticks() { awk '$1 == "cpu" {print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; }
# "groups payments gate-round-trips gate-calls" so far (from /metrics).
group_counts() {
    curl -fs "http://127.0.0.1:$PORT/metrics" | awk '
        $1 == "paynotify_ledger_groups_total" {g = $2}
        $1 == "paynotify_ledger_group_payments_total" {p = $2}
        $1 == "paynotify_gate_round_trips_total" {r = $2}
        $1 == "paynotify_gate_calls_total" {c = $2}
        END {print g + 0, p + 0, r + 0, c + 0}'
}
# CPU ticks of the database's backends for this benchmark's database (the service's pool).
db_ticks() {
    local total=0 pid
    for pid in $(pgrep -f "^postgres: .* $DB " || true); do
        total=$((total + $(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)))
    done
    echo "$total"
}
rss_mb() { awk '/VmRSS/ {printf "%.0f", $2 / 1024}' "/proc/$SERVICE_PID/status"; }

# One wrk pass over a file of requests; appends a row to $RESULTS.
pass() { # config channel pass file checks...
    local config=$1 channel=$2 name=$3 file=$4
    shift 4
    local before after line
    local perf_pid=
    # shellcheck disable=SC2053
    if [ -n "$PERF_OUT" ] && [[ "$config/$channel/$name" == $PERF_MATCH ]]; then
        perf record -e cpu-clock -F 999 -g -p "$SERVICE_PID" -o "$PERF_OUT.$config.$channel.$name" >/dev/null 2>&1 &
        perf_pid=$!
        sleep 0.5
    fi
    local groups_before
    groups_before=$(group_counts)
    before=$(cpu_ticks)
    local machine_before db_before
    machine_before=$(machine_ticks)
    db_before=$(db_ticks)
    local wal_before syncs_before
    wal_before=$(wal_bytes)
    syncs_before=$(wal_syncs)
    rm -f "$WORK"/done.*
    BENCH_REQUESTS=$file BENCH_THREADS=$THREADS BENCH_DONE=$WORK/done wrk -t"$THREADS" -c"$CONNS" \
        -d300s --timeout 10s -s bench/notify.lua "http://127.0.0.1:$PORT" >"$WORK/wrk.out" &
    local wrk_pid=$!
    # wrk sleeps for -d whatever happens; every thread leaves a file when its share is answered.
    while kill -0 "$wrk_pid" 2>/dev/null; do
        if [ "$(find "$WORK" -maxdepth 1 -name 'done.*' | wc -l)" -ge "$THREADS" ]; then
            kill -INT "$wrk_pid"
            break
        fi
        sleep 0.05
    done
    wait "$wrk_pid" || true
    line=$(grep '^RESULT' "$WORK/wrk.out")
    after=$(cpu_ticks)
    local machine_after db_after
    machine_after=$(machine_ticks)
    db_after=$(db_ticks)
    local wal_after syncs_after
    wal_after=$(wal_bytes)
    syncs_after=$(wal_syncs)
    local group pipeline counts
    counts="$groups_before $(group_counts)"
    # The mean group size of the pass: payments per group ("-" when nothing was grouped).
    group=$(echo "$counts" | awk '{g = $5 - $1; p = $6 - $2; if (g > 0) printf "%.1f", p / g; else print "-"}')
    # The mean gate pipeline: calls per round trip to Redis ("-" without the gate).
    pipeline=$(echo "$counts" | awk '{r = $7 - $3; c = $8 - $4; if (r > 0) printf "%.1f", c / r; else print "-"}')
    if [ -n "$perf_pid" ]; then
        kill -INT "$perf_pid"
        wait "$perf_pid" || true
    fi
    local answered ok errors duration p50 p99 p999 statuses
    answered=$(sed 's/.*answered=\([0-9]*\).*/\1/' <<<"$line")
    ok=$(sed 's/.* ok=\([0-9]*\).*/\1/' <<<"$line")
    errors=$(sed 's/.*errors=\([0-9]*\).*/\1/' <<<"$line")
    statuses=$(sed 's/.*statuses=\([^ ]*\).*/\1/' <<<"$line")
    duration=$(sed 's/.*duration_us=\([0-9]*\).*/\1/' <<<"$line")
    p50=$(sed 's/.*p50_us=\([0-9]*\).*/\1/' <<<"$line")
    p99=$(sed 's/.*p99_us=\([0-9]*\).*/\1/' <<<"$line")
    p999=$(sed 's/.*p999_us=\([0-9]*\).*/\1/' <<<"$line")
    local verdict=ok
    while [ $# -gt 0 ]; do
        [ "$(check "$1" "$2")" = ok ] || verdict=FAILED
        shift 2
    done
    local rate cpu machine db
    rate=$(awk -v a="$answered" -v d="$duration" 'BEGIN {printf "%.0f", a / (d / 1e6)}')
    cpu=$(awk -v t=$((after - before)) -v hz="$CLK_TCK" -v a="$answered" 'BEGIN {printf "%.0f", t / hz / a * 1e6}')
    machine=$(awk -v t=$((machine_after - machine_before)) -v hz="$CLK_TCK" -v a="$answered" 'BEGIN {printf "%.0f", t / hz / a * 1e6}')
    db=$(awk -v t=$((db_after - db_before)) -v hz="$CLK_TCK" -v a="$answered" 'BEGIN {printf "%.0f", t / hz / a * 1e6}')
    # WAL the whole server wrote during the pass, per request (the relay's marks included as
    # far as it kept up).
    local wal syncs
    wal=$(awk -v w=$((wal_after - wal_before)) -v a="$answered" 'BEGIN {printf "%.0f", w / a}')
    syncs=$(awk -v w=$((syncs_after - syncs_before)) -v a="$answered" 'BEGIN {printf "%.2f", w / a}')
    local ms50 ms99 ms999
    ms50=$(awk -v v="$p50" 'BEGIN {printf "%.1f", v / 1000}')
    ms99=$(awk -v v="$p99" 'BEGIN {printf "%.1f", v / 1000}')
    ms999=$(awk -v v="$p999" 'BEGIN {printf "%.1f", v / 1000}')
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$config" "$channel" "$name" \
        "$answered" "$ok" "$errors" "$rate" "$ms50" "$ms99" "$ms999" "$cpu" "$(rss_mb)" "$verdict" "$group" "$machine" "$db" "$wal" "$syncs" >>"$RESULTS"
    printf '  %-17s %-6s %-9s %6s answered, %s errors (%s), %6s/s, p50 %s ms, p99 %s ms, CPU %s µs/request (database %s, machine %s), WAL %s bytes and %s flushes per request, group %s, gate pipeline %s, exactly-once %s\n' \
        "$config" "$channel" "$name" "$answered" "$errors" "$statuses" "$rate" "$ms50" "$ms99" "$cpu" "$db" "$machine" "$wal" "$syncs" "$group" "$pipeline" "$verdict"
}

PG_ROWS=$WORK/pgbench.tsv
: >"$PG_ROWS"
pgbench_run() { # label script transactions [notices per transaction]
    local per_client=$(($3 / PGBENCH_CLIENTS)) tps per=${4:-1} wal_before wal_after wal
    wal_before=$(wal_bytes)
    tps=$(pgbench -n -M prepared -c "$PGBENCH_CLIENTS" -j 2 -t "$per_client" -D "norders=$N" \
        -f "$2" "$DBURL" 2>/dev/null | awk -v per="$per" '/^tps = / {printf "%.0f", $3 * per}')
    wal_after=$(wal_bytes)
    wal=$(((wal_after - wal_before) / (per_client * PGBENCH_CLIENTS * per)))
    printf '%s\t%s\t%s\n' "$1" "$tps" "$wal" >>"$PG_ROWS"
    echo "  pgbench $1: $tps notices/s, $wal WAL bytes per notice"
}

pgbench_all() { # round
    # Orders B1..B{3N}: B1..BN for the three statements, B{N+1}..B{2N} for the single
    # statement, B{2N+1}..B{3N} ten at a time; the duplicate script replays B1..BN.
    sql "DELETE FROM pay_callback WHERE out_trade_no LIKE 'B%'; DELETE FROM local_message WHERE biz_key LIKE 'B%'; DELETE FROM orders WHERE order_no LIKE 'B%';
         DROP SEQUENCE IF EXISTS bench_seq; CREATE SEQUENCE bench_seq START 1;" >/dev/null
    seed_orders B $((3 * N)) 100 >/dev/null   # the amount the SQL scripts say
    pgbench_run "three statements (5 round trips) #$1" benches/sql/ledger_first.sql "$N"
    pgbench_run "one statement (CTE) #$1" benches/sql/ledger_first_cte.sql "$N"
    pgbench_run "ten notices per statement (group) #$1" benches/sql/ledger_group_cte.sql $((N / 10)) 10
    sql "ALTER SEQUENCE bench_seq RESTART 1" >/dev/null
    pgbench_run "duplicate (4 round trips) #$1" benches/sql/ledger_duplicate.sql "$N"
    sql "DELETE FROM pay_callback WHERE out_trade_no LIKE 'B%'; DELETE FROM local_message WHERE biz_key LIKE 'B%';" >/dev/null
}

echo "machine: $MACHINE; load average $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "$PGBENCH" = 1 ]; then
    echo "pgbench, $PGBENCH_CLIENTS clients, $N transactions each"
    pgbench_all 1
fi

configs="ledger single gate"
[ -n "$ONLY" ] && configs=$ONLY
[ "$ONLY" = receipts ] && configs=
for config in $configs; do
    case $config in gate) tag=G ;; single) tag=S ;; *) tag=L ;; esac
    echo "forging $config requests"
    for channel in $CHANNELS; do
        c=$([ "$channel" = wechat ] && echo W || echo A)
        seed_orders "${tag}${c}F-" "$N" >/dev/null
        seed_orders "${tag}${c}M-" $((N / 2 * 9 / 10)) >/dev/null
        forge "$channel" "${tag}${c}F-" "$N" "$WORK/$config-$channel-first"
        forge "$channel" "${tag}${c}M-" $((N / 2 * 9 / 10)) "$WORK/$config-$channel-fresh"
        interleave "$WORK/$config-$channel-fresh" "$WORK/$config-$channel-first" "$WORK/$config-$channel-mix"
    done
    case $config in
        gate) start_service "$config" PAYNOTIFY__REDIS__URL="$REDIS_URL" PAYNOTIFY__REDIS__KEY_PREFIX="$REDIS_PREFIX" ;;
        single) start_service "$config" PAYNOTIFY__DATABASE__GROUP_APPLY_MAX=0 ;;
        *) start_service "$config" ;;
    esac
    echo "$config: passes ($CONNS connections, $THREADS wrk threads)"
    for channel in $CHANNELS; do
        c=$([ "$channel" = wechat ] && echo W || echo A)
        for p in $PASSES; do
            case $p in
                first | duplicate) pass "$config" "$channel" "$p" "$WORK/$config-$channel-first" "${tag}${c}F-" "$N" ;;
                mix) pass "$config" "$channel" mix "$WORK/$config-$channel-mix" "${tag}${c}F-" "$N" \
                    "${tag}${c}M-" $((N / 2 * 9 / 10)) ;;
            esac
        done
    done
    stop_service
done

# Rounds of WeChat first deliveries alternating two settings (a, b, b, a, a, b, …: neither
# always goes first), a fresh service and fresh orders per round. A setting is one or more
# VAR=value words.
ROUND=0
ALT_PASSES=first   # what each round runs: "first", or "first duplicate" (the same requests again)
alternate() { # rounds count name_a setting_a name_b setting_b
    local rounds=$1 count=$2 order=() r mode setting i p
    for r in $(seq "$rounds"); do
        if [ $(((r - 1) % 2)) -eq 0 ]; then order+=("$3" "$5"); else order+=("$5" "$3"); fi
    done
    for mode in "${order[@]}"; do
        ROUND=$((ROUND + 1))
        i=$ROUND
        if [ "$mode" = "$3" ]; then setting=$4; else setting=$6; fi
        # Forged right before its round: WeChat refuses timestamps over 5 minutes old.
        seed_orders "${mode:0:1}${i}R-" "$count" >/dev/null
        forge wechat "${mode:0:1}${i}R-" "$count" "$WORK/round-$i"
        # shellcheck disable=SC2086 # a setting may be several VAR=value words
        start_service "$mode" $setting
        for p in $ALT_PASSES; do
            pass "$mode" wechat "$p" "$WORK/round-$i" "${mode:0:1}${i}R-" "$count"
        done
        stop_service
    done
}

if [ "$GROUP_ROUNDS" -gt 0 ]; then
    echo "group apply on vs off: $GROUP_ROUNDS rounds each of $N WeChat first deliveries"
    alternate "$GROUP_ROUNDS" "$N" group-on PAYNOTIFY__DATABASE__GROUP_APPLY_MAX=64 \
        group-off PAYNOTIFY__DATABASE__GROUP_APPLY_MAX=0
fi

if [ "$GATE_ROUNDS" -gt 0 ]; then
    echo "Redis gate on vs off: $GATE_ROUNDS rounds each of $N WeChat first deliveries"
    alternate "$GATE_ROUNDS" "$N" \
        gate-on "PAYNOTIFY__REDIS__URL=$REDIS_URL PAYNOTIFY__REDIS__KEY_PREFIX=$REDIS_PREFIX" \
        gate-off PAYNOTIFY__REDIS__URL=
fi

if [ "$IO_ROUNDS" -gt 0 ]; then
    echo "server.io_threads auto vs one per core: $IO_ROUNDS rounds each of $N WeChat first deliveries"
    alternate "$IO_ROUNDS" "$N" io-auto PAYNOTIFY__SERVER__IO_THREADS=0 \
        io-cores "PAYNOTIFY__SERVER__IO_THREADS=$(nproc)"
fi

if [ "$RECENT_ROUNDS" -gt 0 ]; then
    echo "gate with vs without recent answers in memory: $RECENT_ROUNDS rounds each of $N WeChat first deliveries, then the same again"
    ALT_PASSES="first duplicate"
    alternate "$RECENT_ROUNDS" "$N" \
        recent-on "PAYNOTIFY__REDIS__URL=$REDIS_URL PAYNOTIFY__REDIS__KEY_PREFIX=$REDIS_PREFIX" \
        recent-off "PAYNOTIFY__REDIS__URL=$REDIS_URL PAYNOTIFY__REDIS__KEY_PREFIX=$REDIS_PREFIX PAYNOTIFY__REDIS__RECENT_ANSWERS=0"
    ALT_PASSES=first
fi

if [ "$BUILD_ROUNDS" -gt 0 ]; then
    echo "build before ($BIN_BEFORE) vs after ($BIN): $BUILD_ROUNDS rounds each of $N WeChat first deliveries, then the same again"
    ALT_PASSES="first duplicate"
    alternate "$BUILD_ROUNDS" "$N" before "BIN=$BIN_BEFORE" after "BIN=$BIN"
    ALT_PASSES=first
fi

if [ "$RECEIPT_ROUNDS" -gt 0 ]; then
    echo "receipts.store rejected vs off: $RECEIPT_ROUNDS rounds each of $RECEIPT_N WeChat first deliveries"
    alternate "$RECEIPT_ROUNDS" "$RECEIPT_N" receipts-rejected PAYNOTIFY__RECEIPTS__STORE=rejected \
        receipts-off PAYNOTIFY__RECEIPTS__STORE=off
fi

if [ "$PGBENCH" = 1 ]; then
    echo "pgbench again"
    pgbench_all 2
fi

# The report.
REPORT=$WORK/report.md
python3 - "$RESULTS" "$PG_ROWS" "$REPORT" "$MACHINE" "$N" "$CONNS" "$PGBENCH_CLIENTS" "$(date -u '+%Y-%m-%d %H:%M UTC')" \
    "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo +changes)" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'EOF'
import sys, statistics
results, pg_rows, report, machine, n, conns, clients, when, commit, load = sys.argv[1:]
rows = [l.rstrip("\n").split("\t") for l in open(results) if l.strip()]
pg = [l.rstrip("\n").split("\t") for l in open(pg_rows) if l.strip()]
def mean_pg(prefix):
    v = [float(t) for label, t, _ in pg if label.startswith(prefix) and t]
    return statistics.mean(v) if v else float("nan")
three, cte, dup, ten = mean_pg("three"), mean_pg("one"), mean_pg("duplicate"), mean_pg("ten")
out = []
w = out.append
w(f"Run of {when}, commit {commit}: {machine}; N = {n} per pass, wrk {conns} connections; "
  f"pgbench {clients} clients; load average at the end {load}.\n")
w("| configuration | channel | pass | answered | errors | per s | p50 ms | p99 ms | p99.9 ms | service CPU µs/request | database CPU µs/request | machine CPU µs/request | WAL bytes/request | WAL flushes/request | RSS MB | mean group | exactly-once |")
w("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
for r in rows:
    config, channel, name, answered, ok, errors, rate, p50, p99, p999, cpu, rss, check, group, machine, db, wal, syncs = r
    w(f"| {config} | {channel} | {name} | {answered} | {errors} | {int(rate):,} | {p50} | {p99} | {p999} | {cpu} | {db} | {machine} | {wal} | {syncs} | {rss} | {group} | {check} |")
w("")
w("| pgbench (same server, same run) | notices/s | WAL bytes/notice |")
w("|---|---:|---:|")
for label, tps, wal in pg:
    w(f"| {label} | {int(tps):,} | {wal} |" if tps else f"| {label} | failed | |")
w("")
def rate(config, channel, name):
    v = [float(r[6]) for r in rows if r[0] == config and r[1] == channel and r[2] == name]
    return statistics.mean(v) if v else float("nan")
w("| ratio | value |")
w("|---|---:|")
for channel in ("wechat", "alipay"):
    for config in ("ledger", "single", "gate"):
        f = rate(config, channel, "first")
        if f == f:
            w(f"| {channel}, {config}: first deliveries / pgbench three statements | {f / three:.2f} |")
            w(f"| {channel}, {config}: first deliveries / pgbench one statement | {f / cte:.2f} |")
            w(f"| {channel}, {config}: first deliveries / pgbench ten per statement | {f / ten:.2f} |")
    l, g, one = rate("ledger", channel, "first"), rate("gate", channel, "first"), rate("single", channel, "first")
    if l == l and g == g:
        w(f"| {channel}: gate on / gate off, first deliveries | {g / l:.2f} |")
    if l == l and one == one:
        w(f"| {channel}: group apply on / off, first deliveries | {l / one:.2f} |")
    d = rate("ledger", channel, "duplicate")
    if d == d:
        w(f"| {channel}, ledger: duplicates / pgbench duplicate | {d / dup:.2f} |")
def alternated(a, b, what, name="first"):
    ra = [float(r[6]) for r in rows if r[0] == a and r[2] == name]
    rb = [float(r[6]) for r in rows if r[0] == b and r[2] == name]
    ca = [float(r[10]) for r in rows if r[0] == a and r[2] == name]
    cb = [float(r[10]) for r in rows if r[0] == b and r[2] == name]
    ma = [float(r[14]) for r in rows if r[0] == a and r[2] == name]
    mb = [float(r[14]) for r in rows if r[0] == b and r[2] == name]
    kind = "first deliveries" if name == "first" else "the same again"
    if ra and rb:
        w(f"| {what}, {kind} (mean of {len(ra)} alternating rounds each: "
          f"{statistics.mean(ra):,.0f} / {statistics.mean(rb):,.0f} per s; service CPU "
          f"{statistics.mean(ca):.0f} / {statistics.mean(cb):.0f} µs; machine CPU "
          f"{statistics.mean(ma):.0f} / {statistics.mean(mb):.0f} µs) | {statistics.mean(ra) / statistics.mean(rb):.3f} |")
    return statistics.mean(ra) if ra else float("nan")
on = alternated("group-on", "group-off", "group apply on / off")
if on == on:
    w(f"| group apply on (alternating rounds) / pgbench three statements | {on / three:.2f} |")
alternated("gate-on", "gate-off", "gate on / off")
alternated("receipts-rejected", "receipts-off", "receipts rejected / off")
alternated("io-auto", "io-cores", "io_threads auto / one per core")
alternated("recent-on", "recent-off", "recent answers on / off")
alternated("recent-on", "recent-off", "recent answers on / off", "duplicate")
alternated("after", "before", "build after / before")
alternated("after", "before", "build after / before", "duplicate")
open(report, "w").write("\n".join(out) + "\n")
EOF
echo
cat "$REPORT"

if [ "$WRITE_DOCS" = 1 ]; then
    mkdir -p docs/bench
    plot=
    if command -v gnuplot >/dev/null; then
        plot="bench/latency.png"
        awk -F'\t' '$1 == "ledger" || $1 == "single" || $1 == "gate" {print $1 "/" $2 "/" $3 "\t" $8 "\t" $9 "\t" $10}' "$RESULTS" >"$WORK/latency.dat"
        gnuplot <<EOF
set terminal pngcairo size 1000,500 noenhanced
set output "docs/bench/latency.png"
set title "paynotify latency by pass ($CONNS connections, N = $N)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set logscale y
set ylabel "ms"
set xtics rotate by -30
set rmargin 12
set key top left
plot "$WORK/latency.dat" using 2:xtic(1) title "p50", '' using 3 title "p99", '' using 4 title "p99.9"
EOF
    fi
    python3 - "$REPORT" docs/benchmarks.md "$plot" <<'EOF'
import sys
report, doc, plot = open(sys.argv[1]).read(), open(sys.argv[2]).read(), sys.argv[3]
begin, end = "<!-- bench/run.sh: begin -->", "<!-- bench/run.sh: end -->"
# Only a plot drawn by this run is shown with its table.
figure = f"\n![latency by pass]({plot})" if plot else ""
block = f"{begin}\n{report}{figure}\n{end}"
if begin in doc and end in doc:
    doc = doc[:doc.index(begin)] + block + doc[doc.index(end) + len(end):]
else:
    doc = doc.rstrip("\n") + "\n\n## Latest `bench/run.sh` run\n\n" + block + "\n"
open(sys.argv[2], "w").write(doc)
EOF
    echo "written: docs/benchmarks.md (between the bench/run.sh markers)${plot:+, docs/$plot}"
fi
