#!/usr/bin/env bash
# Fleet scale at Envoy's cadence (issue 47): 10,000 simulated Envoys of 10 buckets on memory,
# 2,000 on Redis and on a 3-master Cluster (two replicas each), reporting every 5 s. Logs each
# row on stderr and writes the table as the "RLQS fleet at Envoy's cadence" section of
# BENCHMARKS.md. About 4 minutes; bounded at 15.
#
#   scripts/bench-fleet.sh [--backends memory,redis,redis-cluster]
set -euo pipefail

cd "$(dirname "$0")/.."
export PYTHONDONTWRITEBYTECODE=1
source scripts/lib/common.sh
require_tools bench-fleet redis-server redis-cli python3
binary=$(floodgate_binary)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
timeout --signal=TERM --kill-after=30s 15m \
    python3 scripts/lib/rlqs_fleet.py --binary "$binary" "$@" >"$out"
keep_section "## RLQS fleet at Envoy's cadence" "$out" scripts/bench-fleet.sh \
    "Simulated Envoys (\`floodgate bench --rlqs --rlqs-buckets 10 --rlqs-offered 1/s\`, at most 500 streams a connection), each reporting its 10 buckets every 5 s on a rule no run reaches; fresh servers per row, the replicas on the first CPU, the bench and Redis on the others. Over 30 s after a 25 s warm-up: bucket reports booked (\`floodgate_rlqs_reports_total\`) a second and per CPU-second of the replicas (\`/proc/<pid>/stat\`) and of Redis (\`INFO cpu\`); the first replica's resident memory, and its growth over the run per stream it serves; the push latency of the reports sent after the warm-up (a report not answered before the stream's next one is counted as unanswered); the cold start, each stream's first report (every stream's at once) to its answer." "$@"
