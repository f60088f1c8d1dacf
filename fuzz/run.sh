#!/usr/bin/env bash
# Builds every fuzz target once, then runs each for a bounded time on its seed corpus, one
# target per core at a time (FUZZ_JOBS overrides).
#
#   fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]     (default: 45 s, every target)
#
# Needs the nightly toolchain and cargo-fuzz (`cargo install --locked cargo-fuzz`). Without
# nightly it says so and exits 0, so CI skips only this step. Any crash, leak, timeout or
# out-of-memory fails the run; the input that caused it is saved under
# fuzz/artifacts/<target>/ (replay: fuzz/target/<triple>/release/<target> <file>).
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_TARGET="${1:-45}"
shift || true
ALL_TARGETS=(config_file config_dir request json_body reference_env xds_resources)
if [ $# -gt 0 ]; then TARGETS=("$@"); else TARGETS=("${ALL_TARGETS[@]}"); fi
CARGO="${CARGO:-cargo}"

if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  echo "fuzz: the nightly toolchain is not installed; skipping the fuzz step"
  exit 0
fi
if ! "$CARGO" +nightly fuzz --version >/dev/null 2>&1; then
  echo "fuzz: cargo-fuzz is missing; install it with: cargo install --locked cargo-fuzz" >&2
  exit 1
fi

# Seeds: the example files, the bad-config fixtures and encoded requests (never deleted:
# libFuzzer adds the inputs it finds interesting to the same directories).
"$CARGO" run --quiet --locked --example fuzz_seeds -- fuzz/corpus

started=$(date +%s)
"$CARGO" +nightly fuzz build
echo "fuzz: build took $(($(date +%s) - started)) s"

host=$(rustc +nightly -vV | sed -n 's/^host: //p')
bin_dir="fuzz/target/$host/release"
# One target per core at a time: on CI's 2 cores the step takes half as long.
parallel="${FUZZ_JOBS:-$(nproc)}"

# Runs one target; its exit status goes to fuzz/artifacts/<target>/last-run.status.
fuzz_one() {
  local target=$1 dict=()
  # A target without seeds starts from an empty corpus rather than failing to start.
  mkdir -p "fuzz/artifacts/$target" "fuzz/corpus/$target"
  case "$target" in
    config_file | config_dir) dict=(-dict=fuzz/dicts/yaml.dict) ;;
    reference_env) dict=(-dict=fuzz/dicts/reference_env.dict) ;;
  esac
  # -timeout: one input may take at most 10 s (a hang is a finding); -rss_limit_mb bounds
  # memory (growth is a finding); -print_final_stats gives the executions.
  local status=0
  "$bin_dir/$target" "fuzz/corpus/$target" "${dict[@]}" \
    -max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="fuzz/artifacts/$target/" \
    >"fuzz/artifacts/$target/last-run.log" 2>&1 || status=$?
  echo "$status" >"fuzz/artifacts/$target/last-run.status"
}

running=0
for target in "${TARGETS[@]}"; do
  echo "fuzz: $target for ${SECONDS_PER_TARGET} s"
  fuzz_one "$target" &
  running=$((running + 1))
  if [ "$running" -ge "$parallel" ]; then
    wait -n
    running=$((running - 1))
  fi
done
wait

failed=0
for target in "${TARGETS[@]}"; do
  log="fuzz/artifacts/$target/last-run.log"
  status=$(cat "fuzz/artifacts/$target/last-run.status" 2>/dev/null || echo 1)
  if [ "$status" -ne 0 ]; then
    tail -n 80 "$log" >&2
    echo "fuzz: $target FAILED (exit $status); the input is in fuzz/artifacts/$target/" >&2
    failed=$status
    continue
  fi
  echo "fuzz: $target"
  grep -E '^#[0-9]+[[:space:]]+(INITED|DONE)|^stat::(number_of_executed_units|peak_rss_mb)' "$log"
done
[ "$failed" -eq 0 ] || exit "$failed"
echo "fuzz: all targets passed"
