#!/usr/bin/env bash
# cargo fuzz smoke: every target under fuzz/ for CHAOS_FUZZ_SECS seconds (default 60, 15 with
# --fast) each, one after the other. Any crash, leak or timeout fails the scenario; the input
# is kept under fuzz/artifacts/TARGET/ (reproduce: cargo +nightly fuzz run --codegen-units 16
# TARGET FILE).
# Needs the nightly toolchain (rustup toolchain install nightly); cargo-fuzz is installed from
# crates.io when missing. The corpus grows in fuzz/corpus/TARGET (not committed).
#   CHAOS_FUZZ_SECS, CHAOS_FUZZ_TARGETS (default: all five), CHAOS_FUZZ_TARGET_DIR (where the
#   instrumented build goes; default $CARGO_TARGET_DIR, else fuzz/target).
set -uo pipefail
CHAOS_DIR=$(cd "$(dirname "$0")" && pwd)
REPO_DIR=$(cd "$CHAOS_DIR/../.." && pwd)
SECS=${CHAOS_FUZZ_SECS:-$([ "${CHAOS_FAST:-0}" = 1 ] && echo 15 || echo 60)}
read -r -a TARGETS <<<"${CHAOS_FUZZ_TARGETS:-wechat alipay money config bills}"
log() { echo "[$(date +%T)] fuzz: $*" >&2; }
if [ -n "${CHAOS_FUZZ_TARGET_DIR:-}" ]; then
  export CARGO_TARGET_DIR=$CHAOS_FUZZ_TARGET_DIR
fi

if ! cargo +nightly --version >/dev/null 2>&1; then
  log "FAIL: the nightly toolchain is missing (rustup toolchain install nightly)"
  echo "RESULT fuzz: FAIL"
  exit 1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  log "cargo-fuzz is missing: cargo install cargo-fuzz --locked"
  cargo install cargo-fuzz --locked >&2 || {
    log "FAIL: cargo install cargo-fuzz failed"
    echo "RESULT fuzz: FAIL"
    exit 1
  }
fi

cd "$REPO_DIR/fuzz" || exit 1
# 16 codegen units (cargo fuzz's release default is one): the build runs on both cores; the
# run below passes the same, or it would build again. fuzz/Cargo.toml sets opt-level 1.
BUILD=(--codegen-units 16)
log "building ${TARGETS[*]} ($(cargo fuzz --version))"
cargo +nightly fuzz build "${BUILD[@]}" >&2 || {
  log "FAIL: the fuzz targets do not build"
  echo "RESULT fuzz: FAIL"
  exit 1
}
failed=0
for target in "${TARGETS[@]}"; do
  mkdir -p "corpus/$target"
  out=$(mktemp "${TMPDIR:-/tmp}/fuzz-$target.XXXXXX")
  # -timeout: one input taking over 10 s is a finding; -rss_limit_mb bounds memory.
  cargo +nightly fuzz run "${BUILD[@]}" "$target" "corpus/$target" -- -max_total_time="$SECS" \
    -dict="dict/$target.dict" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    >"$out" 2>&1
  rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out" | tail -n 1)
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$out" | tail -n 1)
  if [ "$rc" = 0 ]; then
    log "$target: ${runs:-?} executions in $SECS s, ${cov:-no coverage line}, corpus $(ls "corpus/$target" | wc -l)"
    rm -f "$out"
  else
    failed=1
    log "FAIL: $target stopped (exit $rc), log kept in $out:"
    grep -E 'panicked|ERROR|SUMMARY|Test unit written' "$out" | head -n 10 >&2
  fi
done
if [ "$failed" = 0 ]; then
  echo "RESULT fuzz: PASS"
  exit 0
fi
echo "RESULT fuzz: FAIL"
exit 1
