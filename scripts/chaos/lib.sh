# shellcheck shell=bash
# Helpers shared by the fault scenarios under scripts/chaos/. Source it; never run it.
#
# Every scenario starts what it needs on ports of its own (127.0.0.1 only) with its data under
# one temporary directory: a throw-away PostgreSQL cluster (initdb + pg_ctl), its own
# redis-server, its own paynotify processes. chaos_begin installs an EXIT trap that stops all of
# them. Nothing here touches the shared services on the standard ports.
#
# Environment:
#   PAYNOTIFY_BIN      the binary (default: $CARGO_TARGET_DIR/debug/paynotify, else target/debug)
#   CHAOS_KEEP=1       keep the temporary directory (logs, databases) after the run
#   CHAOS_TRIES        attempts per delivery before the sender gives up (default 80)
#   CHAOS_RETRY_DELAY  seconds between attempts (default 0.25)
#   CHAOS_DB           postgres (default) or mariadb, for the scenarios that call db_start

set -uo pipefail

CHAOS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$CHAOS_DIR/../.." && pwd)
PAYNOTIFY_BIN=${PAYNOTIFY_BIN:-${CARGO_TARGET_DIR:-$REPO_DIR/target}/debug/paynotify}
# Not for the children: paynotify warns about every PAYNOTIFY… variable it does not know.
export -n PAYNOTIFY_BIN
PGBIN=${PGBIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}
CHAOS_TRIES=${CHAOS_TRIES:-80}
CHAOS_RETRY_DELAY=${CHAOS_RETRY_DELAY:-0.25}

SCENARIO=""
T=""
CHAOS_FAILED=0
declare -a CHAOS_PIDS=()
declare -A PN_PID=() PN_PORT=() PN_ENVS=() REDIS_PID=()
declare -a PN_ENV=()
PGDATA=""
PG_PORT=""
DB_URL=""

log() { echo "[$(date +%T)] ${SCENARIO}: $*" >&2; }
fail() {
  log "FAIL: $*"
  CHAOS_FAILED=1
}
die() {
  fail "$*"
  exit 1
}

# chaos_begin NAME: the temporary directory $T and the EXIT trap.
chaos_begin() {
  SCENARIO=$1
  [ "${CHAOS_DB:-postgres}" = postgres ] || SCENARIO=$1@$CHAOS_DB
  [ -z "${CHAOS_CASE:-}" ] || SCENARIO=$SCENARIO@$CHAOS_CASE
  [ -x "$PAYNOTIFY_BIN" ] || {
    echo "$SCENARIO: no paynotify binary at $PAYNOTIFY_BIN (cargo build, or set PAYNOTIFY_BIN)" >&2
    exit 2
  }
  T=$(mktemp -d "${TMPDIR:-/tmp}/chaos-$SCENARIO.XXXXXX")
  chmod 755 "$T"
  : >"$T/codes"
  trap chaos_cleanup EXIT
  # run-all's timeout sends TERM: exit through the EXIT trap, which stops everything.
  trap 'exit 143' TERM INT
  echo load >"$T/phase"
  log "working in $T"
}

chaos_cleanup() {
  local rc=$?
  set +e
  local pid
  for pid in "${CHAOS_PIDS[@]}"; do
    kill -CONT "$pid" 2>/dev/null
    kill -TERM "$pid" 2>/dev/null
  done
  for pid in "${CHAOS_PIDS[@]}"; do
    for _ in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null
  done
  if [ -n "$PGDATA" ] && [ -f "$PGDATA/postmaster.pid" ]; then
    as_pg "$PGBIN/pg_ctl" -D "$PGDATA" -m immediate -w -t 20 stop >/dev/null 2>&1
  fi
  wait 2>/dev/null
  if [ "${CHAOS_KEEP:-0}" = 1 ] || [ "$CHAOS_FAILED" = 1 ] || [ "$rc" != 0 ]; then
    log "kept $T"
  else
    rm -rf "$T"
  fi
}

# chaos_end: prints the verdict line run-all.sh reads; the exit status says it too.
chaos_end() {
  if [ "$CHAOS_FAILED" = 0 ]; then
    echo "RESULT $SCENARIO: PASS"
    exit 0
  fi
  echo "RESULT $SCENARIO: FAIL"
  exit 1
}

track() { CHAOS_PIDS+=("$1"); }

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Bounded wait: wait_until SECONDS COMMAND...
wait_until() {
  local secs=$1
  shift
  local end=$((SECONDS + secs))
  while ! "$@"; do
    [ "$SECONDS" -ge "$end" ] && return 1
    sleep 0.1
  done
}

# --- PostgreSQL of our own --------------------------------------------------------------

# initdb refuses root: run the cluster as the postgres user then.
as_pg() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

pg_ctl_() { as_pg "$PGBIN/pg_ctl" -D "$PGDATA" -l "$T/pg/log" -w -t 60 "$@" >>"$T/pg/ctl.log" 2>&1; }

# pg_start: a fresh cluster on a free port; sets PG_PORT, PGDATA and DB_URL.
pg_start() {
  [ -x "$PGBIN/initdb" ] || die "no PostgreSQL binaries under $PGBIN (set PGBIN)"
  PG_PORT=$(free_port)
  mkdir -p "$T/pg"
  [ "$(id -u)" = 0 ] && chown postgres "$T/pg"
  PGDATA=$T/pg/data
  as_pg "$PGBIN/initdb" -D "$PGDATA" -U postgres -A trust -E UTF8 --no-sync >"$T/pg/initdb.log" 2>&1 ||
    die "initdb failed: $(tail -n 3 "$T/pg/initdb.log")"
  # In the configuration file, not on the command line: every later start (after a stop
  # fault) must come up on this port again, never on the default 5432.
  cat >>"$PGDATA/postgresql.conf" <<CONF
port = $PG_PORT
listen_addresses = '127.0.0.1'
unix_socket_directories = '$T/pg'
max_connections = 200
CONF
  pg_ctl_ start ||
    die "PostgreSQL did not start: $(tail -n 5 "$T/pg/log")"
  psql_ postgres -c "CREATE DATABASE paynotify" >/dev/null || die "CREATE DATABASE failed"
  DB_URL="postgres://postgres@127.0.0.1:$PG_PORT/paynotify"
  log "PostgreSQL on 127.0.0.1:$PG_PORT"
}

psql_() {
  local db=$1
  shift
  psql -X -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -d "$db" -v ON_ERROR_STOP=1 "$@"
}

# --- MariaDB of our own -------------------------------------------------------------------

MY_PID=""
MY_PORT=""
MYDATA=""

# mariadbd refuses to run as root: run it as the mysql user then.
my_user_args() { [ "$(id -u)" = 0 ] && echo "--user=mysql"; }

# my_start: a fresh MariaDB data directory (mariadb-install-db) on a free port, with its socket,
# pid file and log under $T/my; sets MY_PORT, MYDATA and DB_URL.
my_start() {
  command -v mariadb-install-db >/dev/null || die "mariadb-install-db not found (apt-get install mariadb-server)"
  MY_PORT=$(free_port)
  mkdir -p "$T/my"
  MYDATA=$T/my/data
  [ "$(id -u)" = 0 ] && chown mysql "$T/my"
  # shellcheck disable=SC2046
  mariadb-install-db --no-defaults $(my_user_args) --datadir="$MYDATA" --skip-test-db \
    --auth-root-authentication-method=normal >"$T/my/install.log" 2>&1 ||
    die "mariadb-install-db failed: $(tail -n 3 "$T/my/install.log")"
  my_up || die "MariaDB did not start: $(tail -n 5 "$T/my/log")"
  # root@localhost is for the socket; the service connects over TCP to 127.0.0.1.
  my_sock -e "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'; GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
    CREATE DATABASE paynotify" || die "MariaDB set-up failed"
  DB_URL="mysql://root@127.0.0.1:$MY_PORT/paynotify"
  log "MariaDB on 127.0.0.1:$MY_PORT (socket $T/my/sock)"
}

# my_up: starts mariadbd on the data directory, port and socket of this scenario (never the
# defaults: --no-defaults reads no my.cnf) and waits (60 s at most) for it to answer.
my_up() {
  # shellcheck disable=SC2046
  mariadbd --no-defaults $(my_user_args) --datadir="$MYDATA" --port="$MY_PORT" \
    --bind-address=127.0.0.1 --socket="$T/my/sock" --pid-file="$T/my/pid" \
    --log-error="$T/my/log" --skip-log-bin --innodb-buffer-pool-size=64M \
    --innodb-flush-log-at-trx-commit=1 --max-connections=200 >/dev/null 2>&1 </dev/null &
  MY_PID=$!
  track "$MY_PID"
  wait_until 60 my_ping
}
my_ping() { mariadb-admin --no-defaults --socket="$T/my/sock" -uroot ping >/dev/null 2>&1; }
my_sock() { mariadb --no-defaults --socket="$T/my/sock" -uroot "$@"; }
# my_stop: a clean shutdown; waits for the process to exit (60 s at most).
my_stop() {
  mariadb-admin --no-defaults --socket="$T/my/sock" -uroot shutdown >/dev/null 2>&1 || return 1
  wait_until 60 my_gone
}
my_gone() { ! kill -0 "$MY_PID" 2>/dev/null; }
my_kill9() { kill -KILL "$MY_PID" 2>/dev/null; wait "$MY_PID" 2>/dev/null; ! kill -0 "$MY_PID" 2>/dev/null; }

# db_start: the scenario's database, PostgreSQL unless CHAOS_DB=mariadb (run-all.sh sets it
# for NAME@mariadb).
db_start() {
  case ${CHAOS_DB:-postgres} in
  postgres) pg_start ;;
  mariadb) my_start ;;
  *) die "CHAOS_DB must be postgres or mariadb, not $CHAOS_DB" ;;
  esac
}

# --- Redis of our own -------------------------------------------------------------------

# redis_start [PORT]: sets REDIS_PORT; REDIS_PID[port] holds the process.
redis_start() {
  local port=${1:-$(free_port)}
  REDIS_PORT=$port
  mkdir -p "$T/redis-$port"
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --enable-debug-command local \
    --dir "$T/redis-$port" --logfile "$T/redis-$port/log" >/dev/null 2>&1 </dev/null &
  REDIS_PID[$port]=$!
  track $!
  wait_until 10 redis_ping "$port" || die "redis-server on $port did not answer"
}
redis_ping() { [ "$(redis-cli -p "$1" ping 2>/dev/null)" = PONG ]; }
rcli() {
  local port=$1
  shift
  redis-cli -p "$port" "$@"
}

# --- paynotify ----------------------------------------------------------------------------

# sandbox_init: provider-side sandbox keys and config in $T/sbx; TOKEN is its api_token.
sandbox_init() {
  "$PAYNOTIFY_BIN" sandbox-keys --out "$T/sbx" --listen 127.0.0.1:1 >/dev/null 2>"$T/sbx.err" ||
    die "sandbox-keys failed: $(cat "$T/sbx.err")"
  TOKEN=$(sed -n 's/^api_token = "\(.*\)"$/\1/p' "$T/sbx/paynotify.toml")
  mkdir -p "$T/cap"
}

# pn_migrate: apply the migrations once (instances start with auto_migrate off).
pn_migrate() {
  (cd "$T/sbx" && env "${PN_ENV[@]}" PAYNOTIFY__DATABASE__URL="$DB_URL" \
    "$PAYNOTIFY_BIN" migrate --config paynotify.toml) >>"$T/migrate.log" 2>&1 ||
    die "migrate failed: $(tail -n 3 "$T/migrate.log")"
}

# pn_start NAME PORT [VAR=VALUE...]: one instance on 127.0.0.1:PORT with $PN_ENV plus the
# extra variables; waits (30 s at most) for /healthz. Logs: $T/pn-NAME.log.
pn_start() {
  local name=$1 port=$2
  shift 2
  PN_PORT[$name]=$port
  PN_ENVS[$name]="$*"
  (
    cd "$T/sbx" || exit 1
    exec env RUST_LOG="${CHAOS_RUST_LOG:-info}" "${PN_ENV[@]}" \
      PAYNOTIFY__DATABASE__URL="$DB_URL" PAYNOTIFY__SERVER__LISTEN="127.0.0.1:$port" "$@" \
      "$PAYNOTIFY_BIN" serve --config paynotify.toml
  ) >>"$T/pn-$name.log" 2>&1 &
  PN_PID[$name]=$!
  track $!
  wait_until 30 pn_alive "$name" || die "paynotify $name did not come up: $(tail -n 5 "$T/pn-$name.log")"
}
pn_alive() { curl -s -o /dev/null --max-time 1 "http://127.0.0.1:${PN_PORT[$1]}/healthz"; }
pn_url() { echo "http://127.0.0.1:${PN_PORT[$1]}"; }
# pn_restart NAME: the same instance again, same port and variables.
pn_restart() {
  local name=$1
  # shellcheck disable=SC2086
  pn_start "$name" "${PN_PORT[$name]}" ${PN_ENVS[$name]}
}
pn_kill9() { kill -KILL "${PN_PID[$1]}" 2>/dev/null; wait "${PN_PID[$1]}" 2>/dev/null; }
# pn_term NAME [SECS]: SIGTERM and wait; fails when it is still running after SECS (default 20).
pn_term() {
  local pid=${PN_PID[$1]} secs=${2:-20}
  kill -TERM "$pid" 2>/dev/null
  local end=$((SECONDS + secs))
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$SECONDS" -ge "$end" ]; then
      kill -KILL "$pid" 2>/dev/null
      return 1
    fi
    sleep 0.1
  done
  wait "$pid" 2>/dev/null
  return 0
}
pn_rss_kb() { awk '/^VmRSS:/{print $2}' "/proc/${PN_PID[$1]}/status" 2>/dev/null; }
pn_fds() { ls "/proc/${PN_PID[$1]}/fd" 2>/dev/null | wc -l; }

# create_orders PREFIX N BASE_URL: orders PREFIX-00001 … through POST /orders (retried).
create_orders() {
  local prefix=$1 n=$2 base=$3 i no code
  for i in $(seq 1 "$n"); do
    no=$(printf '%s-%05d' "$prefix" "$i")
    for _ in $(seq 1 40); do
      code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 -XPOST "$base/orders" \
        -H "Authorization: Bearer $TOKEN" -H "Idempotency-Key: ck-$no" \
        -H 'content-type: application/json' \
        -d "{\"order_no\":\"$no\",\"amount_fen\":$(amount_of "$no"),\"currency\":\"CNY\",\"subject\":\"chaos\"}")
      case $code in 201 | 200) break ;; esac
      sleep 0.25
    done
    case $code in 201 | 200) ;; *) die "could not create order $no (last answer $code)" ;; esac
  done
}
order_no() { printf '%s-%05d' "$1" "$2"; }
amount_of() { echo $((100 + 10#${1##*-} % 9000)); }
# Even orders are paid through WeChat Pay, odd ones through Alipay.
kind_of() { if [ $((10#${1##*-} % 2)) = 0 ]; then echo wechat; else echo alipay; fi; }

# forge ORDER NAME: a freshly signed payment notification for ORDER, recorded as
# $T/cap/NAME.{path,hdr,body} by capture.py (started by capture_start).
forge() {
  local no=$1 name=$2 out
  out=$(cd "$T/sbx" && "$PAYNOTIFY_BIN" replay "$(kind_of "$no")" --config paynotify.toml \
    --order-no "$no" --amount-fen "$(amount_of "$no")" \
    --target "http://127.0.0.1:$CAPTURE_PORT/$name" 2>&1)
  [ -s "$T/cap/$name.path" ] || die "forging $no failed: $out"
}

capture_start() {
  CAPTURE_PORT=$(free_port)
  python3 "$CHAOS_DIR/capture.py" "$CAPTURE_PORT" "$T/cap" 2>>"$T/capture.log" &
  track $!
  wait_until 10 port_open "$CAPTURE_PORT" || die "capture.py did not start"
}

# post NAME BASE_URL: sends the recorded notification NAME once; prints the HTTP status
# (000: no answer).
post() {
  local name=$1 base=$2
  curl -s -o /dev/null -w '%{http_code}' --max-time 15 -XPOST -H "@$T/cap/$name.hdr" \
    --data-binary "@$T/cap/$name.body" "$base$(cat "$T/cap/$name.path")"
}

# deliver NAME URL...: a provider's delivery of NAME: retried on every non-2xx (bounded by
# CHAOS_TRIES), each attempt going to the next URL in turn, like a load balancer. Every answer
# is appended to $T/codes as "CODE PHASE" (the phase is what set_phase wrote last). Fails after CHAOS_TRIES.
deliver() {
  local name=$1
  shift
  local -a urls=("$@")
  local i code phase
  for i in $(seq 0 $((CHAOS_TRIES - 1))); do
    code=$(post "$name" "${urls[$((i % ${#urls[@]}))]}")
    read -r phase <"$T/phase"
    echo "$code $phase" >>"$T/codes"
    case $code in 2??) return 0 ;; esac
    sleep "$CHAOS_RETRY_DELAY"
  done
  echo "$name" >>"$T/gave-up"
  return 1
}

# run_workers W FUNCTION ARGS...: FUNCTION W-INDEX ARGS... in W background workers; waits
# for those only (never for the services started in the background).
run_workers() {
  local w n=$1 f=$2
  shift 2
  local -a pids=()
  for w in $(seq 0 $((n - 1))); do
    "$f" "$w" "$@" &
    pids+=($!)
  done
  local rc=0
  for w in "${pids[@]}"; do wait "$w" || rc=1; done
  return $rc
}

# set_phase NAME: tags the answers that follow (e.g. the fault in progress).
set_phase() { echo "$1" >"$T/phase.new" && mv "$T/phase.new" "$T/phase"; }
readyz() { curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$1/readyz"; }
ready() { [ "$(readyz "$1")" = 200 ]; }
# answers_at_least N: N answers recorded so far (for wait_until).
answers_at_least() { [ "$(wc -l <"$T/codes")" -ge "$1" ]; }

# codes_summary: the answers seen, by code, e.g. "204×500 200×500 503×12".
codes_summary() {
  awk '{n[$1]++} END {for (c in n) printf "%s×%d ", c, n[c]}' "$T/codes" | sed 's/ $//'
}
# codes_outside ALLOWED_REGEX: the answers whose code does not match, with counts.
codes_outside() {
  awk -v ok="$1" '$1 !~ ok {n[$1" ("$2")"]++} END {for (c in n) printf "%s×%d ", c, n[c]}' "$T/codes"
}

# --- checks -------------------------------------------------------------------------------

# sql QUERY: one value, on the scenario's database (PostgreSQL, MariaDB or SQLite).
sql() {
  case $DB_URL in
  postgres://*) psql_ paynotify -At -c "$1" ;;
  sqlite://*) sqlite3 -cmd '.timeout 5000' "${DB_URL#sqlite://}" "$1" ;;
  mysql://*) my_sock -N -B -D paynotify -e "$1" ;;
  esac
}

# check_ledger PREFIX N: every order PREFIX-* paid exactly once: N orders PAID, N callback
# rows, N ORDER_PAID events, one per order, and nothing else (no anomaly, refund or status
# row, no other event).
check_ledger() {
  local prefix=$1 n=$2 like="$1-%" v
  v=$(sql "SELECT count(*) FROM orders WHERE order_no LIKE '$like'")
  [ "$v" = "$n" ] || fail "$v orders, expected $n"
  v=$(sql "SELECT count(*) FROM orders WHERE order_no LIKE '$like' AND status = 'PAID'")
  [ "$v" = "$n" ] || fail "$v of $n orders PAID: lost payments (unpaid: $(sql "SELECT order_no FROM orders WHERE order_no LIKE '$like' AND status <> 'PAID' LIMIT 10" 2>/dev/null | tr '\n' ' '))"
  v=$(sql "SELECT count(*) FROM pay_callback WHERE out_trade_no LIKE '$like'")
  [ "$v" = "$n" ] || fail "$v pay_callback rows, expected $n"
  v=$(sql "SELECT count(*) FROM (SELECT out_trade_no FROM pay_callback WHERE out_trade_no LIKE '$like' GROUP BY out_trade_no HAVING count(*) > 1) x")
  [ "$v" = 0 ] || fail "$v orders with more than one callback row"
  v=$(sql "SELECT count(*) FROM local_message WHERE topic = 'ORDER_PAID' AND biz_key LIKE '$like'")
  [ "$v" = "$n" ] || fail "$v ORDER_PAID events, expected $n (double-apply or lost)"
  v=$(sql "SELECT count(DISTINCT biz_key) FROM local_message WHERE topic = 'ORDER_PAID' AND biz_key LIKE '$like'")
  [ "$v" = "$n" ] || fail "$v distinct ORDER_PAID biz_keys, expected $n"
  v=$(sql "SELECT count(*) FROM local_message WHERE topic <> 'ORDER_PAID'")
  [ "$v" = 0 ] || fail "$v other events: $(sql "SELECT topic, biz_key FROM local_message WHERE topic <> 'ORDER_PAID' LIMIT 5" | tr '\n' ' ')"
  v=$(sql "SELECT (SELECT count(*) FROM refund_callback) + (SELECT count(*) FROM status_callback)")
  [ "$v" = 0 ] || fail "$v refund/status callback rows, expected 0"
  v=$(sql "SELECT count(*) FROM orders o JOIN pay_callback c ON c.out_trade_no = o.order_no WHERE o.order_no LIKE '$like' AND (c.amount_fen <> o.amount_fen OR o.channel <> c.channel)")
  [ "$v" = 0 ] || fail "$v orders whose callback does not match the order"
  if [ -s "$T/gave-up" ]; then
    fail "the sender gave up on $(wc -l <"$T/gave-up") deliveries: $(head -n 5 "$T/gave-up" | tr '\n' ' ')"
  fi
  [ "$CHAOS_FAILED" = 0 ] && log "ledger: $n orders, each paid once, one callback row and one ORDER_PAID each"
}

# wait_drained SECS: every outbox row sent (status 1) within SECS.
outbox_drained() { [ "$(sql "SELECT count(*) FROM local_message WHERE status <> 1" 2>/dev/null)" = 0 ]; }
wait_drained() {
  wait_until "${1:-60}" outbox_drained ||
    fail "outbox not drained: $(sql "SELECT status, count(*), max(attempts) FROM local_message GROUP BY status")"
}

# check_stream REDIS_PORT PREFIX N: every ORDER_PAID biz_key of PREFIX-* reached the stream
# paynotify:events on that Redis at least once. Sets STREAM_ENTRIES.
check_stream() {
  local port=$1 prefix=$2 n=$3 missing
  rcli "$port" --raw XRANGE paynotify:events - + |
    awk 'prev == "biz_key" {print} {prev = $0}' | sort -u >"$T/stream-keys"
  STREAM_ENTRIES=$(rcli "$port" XLEN paynotify:events)
  for i in $(seq 1 "$n"); do order_no "$prefix" "$i"; echo; done | sort >"$T/want-keys"
  missing=$(comm -23 "$T/want-keys" "$T/stream-keys" | wc -l)
  [ "$missing" = 0 ] ||
    fail "$missing of $n ORDER_PAID events never reached the stream (e.g. $(comm -23 "$T/want-keys" "$T/stream-keys" | head -n 3 | tr '\n' ' '))"
  [ "$missing" = 0 ] && log "stream: $STREAM_ENTRIES entries, all $n biz_keys present"
}

# check_log_events PREFIX N LOGFILE...: with the log sink, every biz_key appears in an event line.
check_log_events() {
  local prefix=$1 n=$2
  shift 2
  grep -ho 'paynotify::events.*biz_key=[^ ]*' "$@" | sed 's/.*biz_key=//' | sort -u >"$T/log-keys"
  for i in $(seq 1 "$n"); do order_no "$prefix" "$i"; echo; done | sort >"$T/want-keys"
  local missing
  missing=$(comm -23 "$T/want-keys" "$T/log-keys" | wc -l)
  [ "$missing" = 0 ] || fail "$missing of $n events never published by the log sink"
}

# check_no_500 LOGFILE...: no 500 answered and no panic logged.
check_logs_clean() {
  local hits
  hits=$(grep -hE 'panicked|PANIC' "$@" | head -n 3)
  [ -z "$hits" ] || fail "panic in the service log: $hits"
}

# The end of a database-faults scenario (PostgreSQL or MariaDB), once its faults are injected
# and the load $LOAD is running: the rest of the load, every order once more as a duplicate,
# then the checks (only 2xx/503, /readyz 503 while down, ledger, events, logs, RSS, SIGTERM).
# Needs WORKERS, ORDERS, U, LOAD, READY_DOWN and RSS0; $1 is the scenario's order-number prefix.
database_faults_end() {
  local prefix=$1
  DUP_PREFIX=$prefix
  set_phase after
  wait "$LOAD" || fail "some deliveries were never answered 2xx"
  log "load done; every order once more (duplicates)"
  set_phase duplicates
  dup_worker() {
    local w=$1 i no
    for i in $(seq $((w + 1)) "$WORKERS" "$ORDERS"); do
      no=$(order_no "$DUP_PREFIX" "$i")
      forge "$no" "$no-dup"
      deliver "$no-dup" "$U"
    done
  }
  run_workers "$WORKERS" dup_worker

  for c in "${READY_DOWN[@]}"; do
    [ "$c" = 503 ] || fail "/readyz answered $c while the database was stopped (${READY_DOWN[*]})"
  done
  bad=$(codes_outside '^(2..|503)$')
  [ -z "$bad" ] || fail "answers other than 2xx/503: $bad"
  wait_drained 60
  check_ledger "$prefix" "$ORDERS"
  check_log_events "$prefix" "$ORDERS" "$T/pn-a.log"
  check_logs_clean "$T/pn-a.log"
  pn_alive a || fail "the service died"
  RSS1=$(pn_rss_kb a)
  n500=$(awk '$1 == 500' "$T/codes" | wc -l)
  log "answers: $(codes_summary) | by phase, non-2xx: $(awk '$1 !~ /^2/ {n[$1" "$2]++} END {for (k in n) printf "%s×%d, ", k, n[k]}' "$T/codes")"
  log "/readyz while stopped: ${READY_DOWN[*]}; RSS ${RSS0} kB → ${RSS1} kB; 500s: $n500"
  pn_term a || fail "no exit within 20 s of SIGTERM"
  chaos_end
}
