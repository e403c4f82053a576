# What the whole-service benchmarks share (`bench/run.sh`, `bench/openloop.sh`), sourced after
# their settings: a fresh PostgreSQL database with the service's schema and sandbox keys
# (dropped at exit), seeding, forging, the exactly-once check, and starting and stopping the
# service. Needs ROOT, BIN, PGURL, REDIS_URL, PORT, HISTORY, STALE and AMOUNT set.
# shellcheck shell=bash
RUN_ID=$$
DB=paynotify_bench_$RUN_ID
DBURL=$PGURL/$DB
WORK=$(mktemp -d /tmp/paynotify-bench.XXXXXX)
REDIS_PREFIX="paynotify:bench:$RUN_ID:"
SERVICE_PID=
cleanup() {
    [ -n "$SERVICE_PID" ] && kill "$SERVICE_PID" 2>/dev/null && wait "$SERVICE_PID" 2>/dev/null
    psql -q "$PGURL/postgres" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true
    redis-cli -u "$REDIS_URL" --scan --pattern "${REDIS_PREFIX}*" | xargs -r -n 500 redis-cli -u "$REDIS_URL" DEL >/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

createdb_url() { psql -q "$PGURL/postgres" -c "CREATE DATABASE $DB" >/dev/null; }
sql() { psql -qAt "$DBURL" -c "$1"; }

createdb_url
"$BIN" sandbox-keys --out "$WORK/keys" --listen "127.0.0.1:$PORT" >/dev/null
# The schema, from the service's own migrations.
(cd "$WORK/keys" && PAYNOTIFY__DATABASE__URL=$DBURL "$BIN" migrate --config paynotify.toml >/dev/null 2>&1)

seed_orders() { # prefix count [amount]
    local analyse="ANALYZE orders;"
    [ "$STALE" = 1 ] && analyse=
    sql "INSERT INTO orders (order_no, status, amount_fen, refunded_fen, currency, subject, created_at, expire_at)
         SELECT '$1' || g, 'WAIT_PAY', ${3:-$AMOUNT}, 0, 'CNY', 'bench', now(), now() + interval '1 day'
         FROM generate_series(1, $2) g; $analyse"
}

# HISTORY paid orders, a day old, with their callback rows and sent messages; analysed.
seed_history() {
    [ "$HISTORY" -gt 0 ] || return 0
    echo "seeding $HISTORY orders of history"
    sql "INSERT INTO orders (order_no, status, amount_fen, refunded_fen, currency, subject, channel, transaction_id, created_at, paid_at, expire_at)
         SELECT 'H' || g, 'PAID', $AMOUNT, 0, 'CNY', 'history', 'wechat', 'TH' || g, now() - interval '1 day', now() - interval '1 day', now()
         FROM generate_series(1, $HISTORY) g;
         INSERT INTO pay_callback (out_trade_no, channel, transaction_id, amount_fen, digest, created_at)
         SELECT 'H' || g, 'wechat', 'TH' || g, $AMOUNT, md5(g::text) || md5(g::text), now() - interval '1 day'
         FROM generate_series(1, $HISTORY) g;
         INSERT INTO local_message (topic, biz_key, payload, status, attempts, next_attempt_at, created_at, sent_at)
         SELECT 'ORDER_PAID', 'H' || g, jsonb_build_object('order_no', 'H' || g, 'amount_fen', $AMOUNT), 1, 1,
                now() - interval '1 day', now() - interval '1 day', now() - interval '1 day'
         FROM generate_series(1, $HISTORY) g;"
    local t
    for t in orders pay_callback local_message; do sql "VACUUM ANALYZE $t"; done
}

forge() { # kind prefix count file
    (cd "$WORK/keys" && "$BIN" forge "$1" --prefix "$2" --count "$3" --amount-fen $AMOUNT \
        --out "$4" --config paynotify.toml >/dev/null 2>&1)
}

# Exactly-once for the orders $1*: every one PAID, one callback, one ORDER_PAID, nothing else.
check() { # prefix count
    local got
    got=$(sql "SELECT (SELECT count(*) FROM orders WHERE order_no LIKE '$1%' AND status = 'PAID' AND paid_at IS NOT NULL)
        || ' ' || (SELECT count(*) FROM pay_callback WHERE out_trade_no LIKE '$1%')
        || ' ' || (SELECT count(*) FROM local_message WHERE topic = 'ORDER_PAID' AND biz_key LIKE '$1%')
        || ' ' || (SELECT count(DISTINCT biz_key) FROM local_message WHERE topic = 'ORDER_PAID' AND biz_key LIKE '$1%')
        || ' ' || (SELECT count(*) FROM local_message WHERE topic <> 'ORDER_PAID' AND biz_key LIKE '$1%')")
    if [ "$got" = "$2 $2 $2 $2 0" ]; then
        echo ok
    else
        echo "FAILED($1: paid callbacks messages distinct other = $got, want $2)" >&2
        echo FAILED
    fi
}

start_service() { # name, then VAR=value settings (BIN=path: another build of the service)
    local name=$1 bin=$BIN word
    shift
    for word in "$@"; do
        [[ $word == BIN=* ]] && bin=${word#BIN=}
    done
    (cd "$WORK/keys" && exec env PAYNOTIFY__DATABASE__URL="$DBURL" PAYNOTIFY__DATABASE__AUTO_MIGRATE=false \
        $SERVICE_ENV "$@" "$bin" serve --config paynotify.toml >"$WORK/$name.log" 2>&1) &
    SERVICE_PID=$!
    for _ in $(seq 100); do
        curl -fs "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "the service did not become ready; its log:" >&2
    tail -20 "$WORK/$name.log" >&2
    exit 1
}

stop_service() {
    kill -TERM "$SERVICE_PID"
    wait "$SERVICE_PID" || true
    SERVICE_PID=
}

