# shellcheck shell=bash
# What the failover scenarios (pg-failover.sh, mariadb-failover.sh, redis-failover.sh) share,
# on top of lib.sh: the provider-like storm (storm.py) and its verdict.
#
# A storm: ORDERS orders (half WeChat Pay FW-1…, half Alipay FA-1…, one amount), each order's
# notification delivered ROUNDS times (round after round, RATE sends per second, each
# delivery retried on every non-2xx like a provider). Every attempt is a line of $T/storm.log.
#   CHAOS_STORM_ORDERS (default 1000, fast mode 200), CHAOS_STORM_ROUNDS (5, fast 3),
#   CHAOS_STORM_RATE (sends per second: 200, fast 50), CHAOS_FAULT_AFTER (the fault this many
#   seconds into the storm; default halfway through the first round), CHAOS_FIGURES (a file
#   each scenario appends its figures to, one JSON line each)

STORM_AMOUNT=1234
STORM_PID=""
FAULT_AT=""

storm_sizes() {
  if [ "${CHAOS_FAST:-0}" = 1 ]; then
    ORDERS=${CHAOS_STORM_ORDERS:-200}
    ROUNDS=${CHAOS_STORM_ROUNDS:-3}
    RATE=${CHAOS_STORM_RATE:-50}
  else
    ORDERS=${CHAOS_STORM_ORDERS:-1000}
    ROUNDS=${CHAOS_STORM_ROUNDS:-5}
    RATE=${CHAOS_STORM_RATE:-200}
  fi
  [ "$ORDERS" -ge 2 ] || ORDERS=2
  # Halfway through the first round: first deliveries in flight at the fault, and every
  # order delivered again after it.
  FAULT_AFTER=${CHAOS_FAULT_AFTER:-$(awk -v n="$ORDERS" -v r="$RATE" 'BEGIN {printf "%.2f", n / r / 2}')}
}

# storm_prepare BASE_URL: creates the orders and forges one notification for each.
storm_prepare() {
  local base=$1 half=$((ORDERS / 2)) i
  local -a orders=()
  for i in $(seq 1 "$half"); do orders+=("FW-$i" "FA-$i"); done
  python3 "$CHAOS_DIR/storm.py" create --url "$base" --token "$TOKEN" --amount "$STORM_AMOUNT" \
    "${orders[@]}" || die "creating the orders failed"
  ORDERS=$((half * 2))
  local kind prefix
  for kind in wechat alipay; do
    prefix=FW-
    [ "$kind" = alipay ] && prefix=FA-
    (cd "$T/sbx" && "$PAYNOTIFY_BIN" forge "$kind" --config paynotify.toml --prefix "$prefix" \
      --count "$half" --amount-fen "$STORM_AMOUNT" --out "$T/$kind.req") >>"$T/forge.log" 2>&1 ||
      die "forge $kind failed: $(tail -n 3 "$T/forge.log")"
  done
  log "$ORDERS orders created and forged; storm of $ROUNDS rounds at $RATE/s"
}

# storm_start URL[,URL...]: the storm in the background (bounded by CHAOS_STORM_DEADLINE s).
storm_start() {
  : >"$T/storm.log"
  python3 "$CHAOS_DIR/storm.py" run --url "$1" --rate "$RATE" --rounds "$ROUNDS" \
    --out "$T/storm.log" --deadline "${CHAOS_STORM_DEADLINE:-150}" \
    "$T/wechat.req:FW-" "$T/alipay.req:FA-" 2>>"$T/storm.err" &
  STORM_PID=$!
  track "$STORM_PID"
}
# storm_until_fault: returns FAULT_AFTER seconds after the storm's first answer (the storm's
# schedule, not an assertion; 60 s at most for the first answer).
storm_until_fault() {
  storm_wait_sent 1
  local first
  first=$(head -n 1 "$T/storm.log" | cut -f 1)
  sleep "$(awk -v f="$first" -v d="$FAULT_AFTER" -v n="$(now)" 'BEGIN {s = f + d - n; print (s > 0 ? s : 0)}')"
}
storm_sent_at_least() { [ "$(wc -l <"$T/storm.log")" -ge "$1" ]; }
# storm_wait_sent N: waits (60 s at most) until N attempts were made.
storm_wait_sent() { wait_until 60 storm_sent_at_least "$1" || die "the storm did not reach $1 sends"; }
storm_wait() {
  wait "$STORM_PID"
  local rc=$?
  cat "$T/storm.err" >&2
  return $rc
}
now() { date +%s.%N; }
mark_fault() {
  FAULT_AT=$(now)
  log "fault: $*"
}

# first_ack_since EPOCH: a 2xx answered to a request sent after EPOCH (for wait_until).
ack_since() { awk -v t="$1" '$1 >= t && $5 ~ /^2/ {f = 1; exit} END {exit !f}' "$T/storm.log"; }

# storm_report DUMP KEYS [extra storm.py report flags]: the verdict; records the figures in
# $T/figures.json and prints them as "FIGURES <scenario> {...}".
storm_report() {
  local out rc
  out=$(python3 "$CHAOS_DIR/storm.py" report --log "$T/storm.log" --fault-at "$FAULT_AT" \
    --db "$1" --delivered "$2" --json "$T/figures.json" "${@:3}")
  rc=$?
  echo "FIGURES $SCENARIO $(echo "$out" | head -n 1)"
  echo "$out" | sed -n 's/^CHECK FAILED: //p' | while read -r line; do log "FAIL: $line"; done
  [ "$rc" = 0 ] || CHAOS_FAILED=1
  if [ -n "${CHAOS_FIGURES:-}" ]; then
    echo "$SCENARIO $(head -n 1 <<<"$out")" >>"$CHAOS_FIGURES"
  fi
}

# log_sink_keys FILE LOG...: the ORDER_PAID biz_keys the log sink published.
log_sink_keys() {
  local out=$1
  shift
  grep -ho 'paynotify::events.*ORDER_PAID.*biz_key=[^ ]*' "$@" | sed 's/.*biz_key=//; s/"//g' | sort -u >"$out"
}

# stream_keys PORT FILE: the biz_keys in the stream paynotify:events on that Redis.
stream_keys() {
  rcli "$1" --raw XRANGE paynotify:events - + | awk 'prev == "biz_key" {print} {prev = $0}' |
    sort -u >"$2"
}

# readyz_body URL: the /readyz answer's body (empty when none).
readyz_body() { curl -s --max-time 3 "$1/readyz"; }

# provider_start: provider_query.py (the providers' query APIs, answering "paid" signed with the
# sandbox keys) on a free port, and the sandbox configuration's API credentials pointed at it,
# so a reconcile or a recheck can heal a lost payment. Call after sandbox_init, before
# pn_migrate.
provider_start() {
  PROVIDER_PORT=$(free_port)
  python3 "$CHAOS_DIR/provider_query.py" "$PROVIDER_PORT" "$T/sbx" "$STORM_AMOUNT" FW- FA- 2>>"$T/provider.log" &
  track $!
  wait_until 10 port_open "$PROVIDER_PORT" || die "provider_query.py did not start: $(tail -n 3 "$T/provider.log")"
  sed -i -e 's#^\# \(private_key_file\|merchant_serial\|app_private_key_file\) =#\1 =#' \
    -e "s|^# api_base = .*|api_base = \"http://127.0.0.1:$PROVIDER_PORT\"|" \
    -e "s|^# gateway = .*|gateway = \"http://127.0.0.1:$PROVIDER_PORT/gateway.do\"|" "$T/sbx/paynotify.toml"
  : >"$T/queries"
}

# acked_orders FILE: the orders the storm got a 2xx for, one a line.
acked_orders() { awk '$5 ~ /^2/ {print $2}' "$T/storm.log" | sort -u >"$1"; }
