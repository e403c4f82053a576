#!/usr/bin/env bash
# Many merchants (issue #48): a release build on a fresh PostgreSQL database with a master
# key; N WeChat direct accounts added through POST /admin/merchants by CLIENTS concurrent
# clients; start-up to /readyz 200 with them; the latency of single notifications, sent open
# loop at a fixed rate, for an account among 10 and among N, in one run.
#
#   bench/accounts.sh                     # N=10000, CLIENTS=8, CREDS=none
#   CREDS=all bench/accounts.sh           # every account with its API credentials
#   N=500 RATE=50 DURATION=5 BUILD=0 bench/accounts.sh
#
# Every account's platform key is the sandbox's one RSA-2048 public key under a serial of its
# own (PUB_KEY_ID_<i>), with an APIv3 key of its own; with CREDS=all every account also carries
# the sandbox merchant private key (one PEM for all, parsed per account like distinct keys).
# Notifications are pre-forged with `paynotify forge` from a copy of the sandbox config naming
# the target account, and sent by bench/accounts.py at RATE per second for SECONDS; latency
# counts from when each request was due (open loop).
#
# Needs: cargo, psql, curl, python3. PostgreSQL at $PGURL (default
# postgres://postgres@127.0.0.1:5432). Everything runs on 127.0.0.1; the database is dropped
# at the end.
set -euo pipefail

N=${N:-10000}
CLIENTS=${CLIENTS:-8}
CREDS=${CREDS:-none}   # none or all: accounts without / with private_key_pem
RATE=${RATE:-100}
SECONDS_EACH=${DURATION:-20}
PGURL=${PGURL:-postgres://postgres@127.0.0.1:5432}
PORT=${PORT:-18941}
AMOUNT=19900
[ "$N" -gt 10 ] || { echo "N must be over 10" >&2; exit 2; }

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=${BIN:-$TARGET/release/paynotify}
PY=$ROOT/bench/accounts.py
if [ "${BUILD:-1}" = 1 ]; then
    echo "building (release)"
    cargo build --release --locked --bin paynotify 2>&1 | tail -1
fi

DB=paynotify_accounts_$$
DBURL=$PGURL/$DB
WORK=$(mktemp -d /tmp/paynotify-accounts.XXXXXX)
SERVICE_PID=
cleanup() {
    [ -n "$SERVICE_PID" ] && kill "$SERVICE_PID" 2>/dev/null && wait "$SERVICE_PID" 2>/dev/null
    psql -q "$PGURL/postgres" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
sql() { psql -qAt "$DBURL" -c "$1"; }

psql -q "$PGURL/postgres" -c "CREATE DATABASE $DB" >/dev/null
"$BIN" sandbox-keys --out "$WORK/keys" --listen "127.0.0.1:$PORT" >/dev/null
(cd "$WORK/keys" && PAYNOTIFY__DATABASE__URL=$DBURL "$BIN" migrate --config paynotify.toml >/dev/null 2>&1)
MASTER_KEY=$(python3 -c 'import base64, os; print(base64.b64encode(os.urandom(32)).decode())')
TOKEN=$(sed -n 's/^api_token = "\(.*\)"$/\1/p' "$WORK/keys/paynotify.toml")
MACHINE="$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), PostgreSQL $(psql -qAt "$PGURL/postgres" -c 'SHOW server_version' | cut -d' ' -f1)"

# Starts the service; STARTUP_MS is the time from exec to the first /readyz 200.
start_service() { # name
    local t0 t1
    t0=$(date +%s%N)
    (cd "$WORK/keys" && exec env PAYNOTIFY__DATABASE__URL="$DBURL" PAYNOTIFY__SECRETS__MASTER_KEY="$MASTER_KEY" \
        RUST_LOG=warn "$BIN" serve --config paynotify.toml >"$WORK/$1.log" 2>&1) &
    SERVICE_PID=$!
    for _ in $(seq 6000); do
        if curl -fs "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1; then
            t1=$(date +%s%N)
            STARTUP_MS=$(((t1 - t0) / 1000000))
            return 0
        fi
        kill -0 "$SERVICE_PID" 2>/dev/null || break
        sleep 0.02
    done
    echo "the service did not become ready; its log:" >&2
    tail -20 "$WORK/$1.log" >&2
    exit 1
}
stop_service() {
    kill -TERM "$SERVICE_PID"
    wait "$SERVICE_PID" || true
    SERVICE_PID=
}
rss_mb() { awk '/VmRSS/ {printf "%.0f", $2 / 1024}' "/proc/$SERVICE_PID/status"; }

add() { # from count
    python3 "$PY" add "127.0.0.1:$PORT" "$TOKEN" "$1" "$2" "$CLIENTS" "$CREDS" \
        "$WORK/keys/keys/wechat_platform_public.pem" "$WORK/keys/keys/wechat_merchant_private.pem"
}

# Forges `count` notifications for account i into $WORK/$label, for orders seeded now.
forge_for() { # i label count
    local i=$1 label=$2 count=$3 cfg=$WORK/keys/forge-$2.toml
    sed -e "s/^mchid = .*/mchid = \"$((1901000000 + i))\"/" \
        -e "s/^  serial = .*/  serial = \"PUB_KEY_ID_$(printf '%034d' "$i")\"/" \
        -e "s/^apiv3_key = .*/apiv3_key = \"APIV3$(printf '%027d' "$i")\"/" \
        "$WORK/keys/paynotify.toml" >"$cfg"
    sql "INSERT INTO orders (order_no, status, amount_fen, refunded_fen, currency, subject, created_at, expire_at)
         SELECT '$label-' || g, 'WAIT_PAY', $AMOUNT, 0, 'CNY', 'bench', now(), now() + interval '1 day'
         FROM generate_series(1, $count) g; ANALYZE orders;" >/dev/null
    (cd "$WORK/keys" && "$BIN" forge wechat --prefix "$label-" --count "$count" --amount-fen $AMOUNT \
        --out "$WORK/$label" --config "$cfg" >/dev/null)
}

send() { # files...
    python3 "$PY" send 127.0.0.1 "$PORT" "$RATE" "$SECONDS_EACH" "$@"
}
field() { sed -n "s/.*$1=\([^ ]*\).*/\1/p"; }

PER=$((RATE * SECONDS_EACH))
OUT=$WORK/out.txt
: >"$OUT"
note() { echo "$*" | tee -a "$OUT"; }

note "machine: $MACHINE; N=$N, $CLIENTS clients, API credentials: $CREDS; open loop $RATE/s for ${SECONDS_EACH}s per pass"
start_service empty
note "start-up, no stored accounts: $STARTUP_MS ms"

added10=$(add 0 10)
note "add 10: $added10"
# A warm-up pass first (connections, caches), then the measured one.
forge_for 5 warmup $((RATE * 3))
python3 "$PY" send 127.0.0.1 "$PORT" "$RATE" 3 "$WORK/warmup" >/dev/null
forge_for 4 among10 "$PER"
note "among 10: $(send "$WORK/among10")"

addrest=$(add 10 $((N - 10)))
note "add $((N - 10)) more: $addrest (RSS $(rss_mb) MB)"
total_s=$(awk -v a="$(field seconds <<<"$added10")" -v b="$(field seconds <<<"$addrest")" 'BEGIN {printf "%.1f", a + b}')
note "added $N accounts in $total_s s"
[ "$(sql "SELECT count(*) FROM merchant_account")" = "$N" ] 2>/dev/null || note "stored accounts: $(sql "SELECT count(*) FROM merchant_account" 2>/dev/null || echo '?')"

# Both, interleaved in one pass: the same account as before (now among N) and the last added.
half=$((PER / 2 + 1))
forge_for 4 "first-of-$N" "$half"
forge_for $((N - 1)) "last-of-$N" "$half"
note "among $N (same service): $(send "$WORK/first-of-$N" "$WORK/last-of-$N")"

stop_service
for r in 1 2 3; do
    start_service "restart$r"
    note "start-up with $N stored accounts (run $r): $STARTUP_MS ms (RSS $(rss_mb) MB)"
    [ "$r" = 3 ] || stop_service
done
forge_for 4 "again-of-$N" "$half"
forge_for $((N - 1)) "again-last-of-$N" "$half"
note "among $N (after restart): $(send "$WORK/again-of-$N" "$WORK/again-last-of-$N")"
sql "SELECT 'paid orders: ' || count(*) FROM orders WHERE status = 'PAID'"
echo
echo "run of $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo +changes)"
cat "$OUT"
