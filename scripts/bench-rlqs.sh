#!/usr/bin/env bash
# The RLQS table of every rule (issue 47): simulated Envoys that restart a changed token
# bucket at its fill ratio, as Envoy 1.33 and later do, on 1,000 a second, 100 per 10 s and
# 60,000 a minute, with 2, 10 and 100 Envoys, on memory, Redis and a 3-master Cluster.
# Prints one JSON line per row on stderr and the Markdown table on stdout. About 45 minutes
# for all three backends on two cores; bounded at 60.
#
#   scripts/bench-rlqs.sh [--backends memory,redis,redis-cluster]
set -euo pipefail

cd "$(dirname "$0")/.."
export PYTHONDONTWRITEBYTECODE=1
source scripts/lib/common.sh
require_tools bench-rlqs redis-server redis-cli python3
binary=$(floodgate_binary)
exec timeout --signal=TERM --kill-after=30s 60m \
    python3 scripts/lib/rlqs_rules.py --binary "$binary" "$@"
