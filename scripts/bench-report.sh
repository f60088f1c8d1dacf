#!/usr/bin/env bash
# Benchmark report: builds floodgate (release) once, then for the memory, redis and
# redis-cluster (3 masters) backends starts redis-server / the cluster / floodgate on free
# 127.0.0.1 ports and drives `floodgate bench` at 16, 64 and 512 calls in flight, 1, 10,000
# and 1,000,000 keys, 1 and 5 descriptors per request; writes BENCHMARKS.md (and
# BENCHMARKS.jsonl). See docs/development.md#the-bench-report.
#
#   scripts/bench-report.sh [--quick] [--seconds N] [--out FILE] [--backends memory,redis,...]
#
# Bounded: the whole report is stopped after 30 minutes (--quick: 10). Every process it
# starts is killed by pid on exit, error or interrupt. Needs redis-server, redis-cli and
# python3. FLOODGATE_BUILD_WRAPPER (e.g. "flock /tmp/cargo.lock") is put in front of the
# cargo build; FLOODGATE_BINARY skips the build.
set -euo pipefail

cd "$(dirname "$0")/.."
export PYTHONDONTWRITEBYTECODE=1
limit=30m
for arg in "$@"; do
    [[ "$arg" == "--quick" ]] && limit=10m
done
source scripts/lib/common.sh
require_tools bench-report redis-server redis-cli python3
binary=$(floodgate_binary)
exec timeout --signal=TERM --kill-after=30s "$limit" \
    python3 scripts/lib/bench_report.py --binary "$binary" \
    --argv "scripts/bench-report.sh $*" "$@"
