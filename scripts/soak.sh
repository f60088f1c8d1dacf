#!/usr/bin/env bash
# Chaos soak: a 3-master + 3-replica Redis Cluster and 3 floodgate replicas
# (--backend redis-cluster --failure-mode error) on free 127.0.0.1 ports, steady load from
# `floodgate bench` on buckets with a known limit, rules reloaded every 10 s, and one fault
# per 2-minute phase: SIGKILL a master (then restart it), SIGSTOP another master for 5 s,
# restart a floodgate replica, burst 2,048 calls in flight (20 ms deadline) at every replica
# for 30 s, SIGSTOP every Redis node for 10 s. Writes a Markdown report
# (default SOAK.md): per phase decisions, OK / OVER_LIMIT / errors, which buckets erred and
# why, p50/p99, over-admission per bucket and window, RSS, crashes. See
# docs/reliability.md#the-chaos-soak.
#
#   scripts/soak.sh [--scale 0.2] [--out FILE]
#
# Bounded: 12 minutes of load at --scale 1 (about 2.5 at 0.2), and the whole script is
# stopped after 18 minutes. Every process it starts is killed by pid on exit, error or
# interrupt. Exit 0 when nothing was found, 1 on findings. Needs redis-server, redis-cli and
# python3. FLOODGATE_BUILD_WRAPPER is put in front of the cargo build; FLOODGATE_BINARY
# skips it; SOAK_KEEP_LOGS=1 keeps the processes' logs.
set -euo pipefail

cd "$(dirname "$0")/.."
export PYTHONDONTWRITEBYTECODE=1
source scripts/lib/common.sh
require_tools soak redis-server redis-cli python3
binary=$(floodgate_binary)
exec timeout --signal=TERM --kill-after=30s 18m \
    python3 scripts/lib/soak.py --binary "$binary" --argv "scripts/soak.sh $*" "$@"
