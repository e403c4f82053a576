#!/usr/bin/env bash
# The growth benchmark (docs/benchmarks.md, "Growth"): first deliveries on a database a year
# in, in one run, each case on a database of its own seeded by bench/run.sh:
#   HISTORY=0, never analysed          the first 20,000 on empty tables
#   HISTORY=2000000                    steady state
#   HISTORY=2000000 STALE=1            a sale after a quiet night's statistics
#   HISTORY=20000000                   ten times the history
# then prints each case's first deliveries/s, p99, service and database CPU per request, and
# the ratios the targets name. Needs what bench/run.sh needs, and the disk for 20 million
# orders with their callback rows and messages (about 17 GB on PostgreSQL).
#
#   bench/growth.sh
#   CASES="empty steady empty steady" bench/growth.sh   # chosen cases, in this order (alternating
#                                                     # rounds: the ratios use each case's mean)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
N=${N:-20000}
BIG=${BIG:-20000000}
OUT=$(mktemp /tmp/paynotify-growth.XXXXXX)
trap 'rm -f "$OUT"' EXIT

cargo build --release --locked --bin paynotify 2>&1 | tail -1
common=(N="$N" CONNS=64 ONLY=ledger CHANNELS=wechat PASSES=first PGBENCH=0 RECEIPT_ROUNDS=0
    GROUP_ROUNDS=0 GATE_ROUNDS=0 WRITE_DOCS=0 BUILD=0)
declare -A settings=([empty]="HISTORY=0 STALE=1" [steady]="HISTORY=2000000 STALE=0"
    [stale]="HISTORY=2000000 STALE=1" [big]="HISTORY=$BIG STALE=0")
for name in ${CASES:-empty steady stale big}; do
    [ -n "${settings[$name]:-}" ] || { echo "no case $name (empty, steady, stale, big)" >&2; exit 2; }
    echo "== $name: ${settings[$name]}"
    start=$(date +%s)
    # shellcheck disable=SC2086
    env "${common[@]}" ${settings[$name]} bash bench/run.sh | tee -a /dev/stderr |
        awk -v name="$name" '/^  ledger +wechat +first/ {print name, $0}' >>"$OUT"
    echo "   ($(($(date +%s) - start)) s with its seeding)"
done

echo
echo "| case | first/s | p50 ms | p99 ms | service CPU µs/req | database CPU µs/req | exactly-once |"
echo "|---|---:|---:|---:|---:|---:|---|"
# "  ledger wechat first 20000 answered, 0 errors (…), 4582/s, p50 13.0 ms, p99 26.8 ms, CPU 177 µs/request (database 168, machine 402), …, exactly-once ok"
sed -E 's/^([a-z]+) .* ([0-9]+)\/s, p50 ([0-9.]+) ms, p99 ([0-9.]+) ms, CPU ([0-9]+) µs\/request \(database ([0-9]+), .*exactly-once ([A-Za-z]+)$/| \1 | \2 | \3 | \4 | \5 | \6 | \7 |/' "$OUT"
# The mean first deliveries/s of a case over its rounds.
rate() { awk -v n="$1" '$1 == n {for (i = 1; i <= NF; i++) if ($i ~ /\/s,$/) {sub(/\/s,/, "", $i); s += $i; k++}} END {if (k) printf "%.0f", s / k}' "$OUT"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (a > 0 && b > 0) printf "%.2f", a / b; else print "-"}'; }
echo
echo "history $BIG / 2,000,000: $(ratio "$(rate big)" "$(rate steady)") (target ≥ 0.9)"
echo "empty / steady: $(ratio "$(rate empty)" "$(rate steady)") (target ≥ 0.8)"
echo "stale / steady: $(ratio "$(rate stale)" "$(rate steady)") (target ≥ 0.8)"
