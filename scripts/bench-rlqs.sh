#!/usr/bin/env bash
# The RLQS table of every rule (issue 47): simulated Envoys that restart a changed token
# bucket at its fill ratio, as Envoy 1.33 and later do, on 1,000 a second, 100 per 10 s and
# 60,000 a minute, with 2, 10 and 100 Envoys, on memory, Redis and a 3-master Cluster.
# Logs each row on stderr and writes the table as the "RLQS on every rule and backend"
# section of BENCHMARKS.md. About 45 minutes for all three backends on two cores; bounded
# at 60.
#
#   scripts/bench-rlqs.sh [--backends memory,redis,redis-cluster]
set -euo pipefail

cd "$(dirname "$0")/.."
export PYTHONDONTWRITEBYTECODE=1
source scripts/lib/common.sh
require_tools bench-rlqs redis-server redis-cli python3
binary=$(floodgate_binary)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
timeout --signal=TERM --kill-after=30s 60m \
    python3 scripts/lib/rlqs_rules.py --binary "$binary" "$@" >"$out"
keep_section "## RLQS on every rule and backend" "$out" scripts/bench-rlqs.sh \
    "Simulated Envoys that restart a changed token bucket at its fill ratio (Envoy 1.33 and later), reporting every 5 s; fresh servers per row (one replica on memory, two on Redis or a 3-master Cluster), the replicas on the first CPU, the bench and Redis on the others; the Envoys offer 6x the limit between them; the first 20 s left out. The cold start is the time from each stream's first report (every stream's at once) to its answer." "$@"
