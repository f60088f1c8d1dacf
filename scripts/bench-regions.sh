#!/usr/bin/env bash
# Regions report: one budget across three regions (75 ms between them, load moving, one
# region cut off for a minute) and a replica cut off from its Redis under
# --failure-mode local (examples/regions.rs, docs/regions.md). Writes the section
# "## Regions" of BENCHMARKS.md (replacing the previous one; scripts/bench-report.sh keeps
# it when it rewrites the rest).
#
#   scripts/bench-regions.sh [example flags: --minutes 5 --limit 10000 --delay-ms 75 ...]
#
# Bounded: stopped after 15 minutes. Every process it starts is stopped when it ends. Needs
# redis-server, redis-cli and python3. FLOODGATE_BUILD_WRAPPER as for bench-report.sh.
set -euo pipefail

cd "$(dirname "$0")/.."
source scripts/lib/common.sh
require_tools bench-regions redis-server redis-cli python3
binary=$(floodgate_binary)
${FLOODGATE_BUILD_WRAPPER:-} cargo build --release --locked --quiet --example regions >&2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
timeout --signal=TERM --kill-after=30s 15m \
    target/release/examples/regions --floodgate "$binary" "$@" >"$out"
keep_section "## Regions" "$out" scripts/bench-regions.sh \
    "" "$@"
