"""The RLQS table of issue 47: simulated Envoys (fill-ratio restarts, Envoy's 5 s reports)
on every rule of the issue (1,000 a second, 100 per 10 s, 60,000 a minute) with 2, 10 and 100
Envoys offering 6x the limit between them, on memory (one replica) and on Redis and a 3-master
Cluster (two replicas each); fresh servers per row, the first 20 s left out. Logs each row
as JSON on stderr, then prints the Markdown table of the rows that ran."""

import argparse
import json
import os

from bench_report import pinning, rlqs_bench, rlqs_servers
from harness import Harness, log

# (key, limit, window, run seconds): runs long enough for several windows after the warm-up,
# and for one whole window of a minute.
RULES = (("quota", 1000, "1s", 40), ("slow", 100, "10s", 100), ("minute", 60000, "60s", 140))
ENVOYS = (2, 10, 100)
BACKENDS = ("memory", "redis", "redis-cluster")
NAMES = {"memory": "memory", "redis": "Redis, 2 replicas",
         "redis-cluster": "Cluster (3 masters), 2 replicas"}


def row(harness, binary, rules, backend, rule, envoys, pins):
    key, limit, window, seconds = rule
    window_s = int(window.rstrip("s"))
    offered = 6 * limit / window_s / envoys
    servers = rlqs_servers(harness, binary, rules, backend, pins)
    args = ["--rlqs-window", window, "--rlqs-streams", str(envoys),
            "--rlqs-offered", f"{offered:g}/s"]
    try:
        summary = rlqs_bench(harness, binary, servers, args, seconds,
                             f"rlqs-{backend}-{key}-{envoys}", pins,
                             rule=(key, limit)).result(seconds + 60)
    finally:
        for server in servers:
            server.stop()
        harness.kill_all()
    return {"rule": f"{limit:,} per {window}", "backend": backend, "envoys": envoys,
            "offered_per_s": offered, "ratio": summary["admitted_ratio"],
            "admitted": summary["admitted"], "denied": summary["denied"],
            "push_p99_ms": summary["push_latency_ms"]["p99"],
            "cold_start_max_ms": summary["cold_start_ms"]["max"],
            "stream_errors": summary["stream_errors"]}


def table(rows):
    out = ["| rule | backend | Envoys x offered each | admitted per window / limit: min, mean,"
           " max | push p99 ms | cold start max ms | streams ended |",
           "|---|---|---|---|---:|---:|---:|"]
    for r in rows:
        ratio = r["ratio"]
        out.append(f"| {r['rule']} | {NAMES[r['backend']]} | {r['envoys']} x "
                   f"{r['offered_per_s']:g}/s | {ratio['min']}, {ratio['mean']}, {ratio['max']}"
                   f" | {r['push_p99_ms']} | {r['cold_start_max_ms']} | {r['stream_errors']} |")
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    args = parser.parse_args()
    unknown = set(args.backends.split(",")) - set(BACKENDS)
    if unknown:
        parser.error(f"unknown backends {sorted(unknown)}; known: {', '.join(BACKENDS)}")
    rules = os.path.join(os.path.dirname(__file__), "..", "bench-rules")
    pins = pinning()
    harness = Harness("bench-rlqs")
    rows = []
    try:
        for backend in args.backends.split(","):
            for rule in RULES:
                for envoys in ENVOYS:
                    rows.append(row(harness, args.binary, rules, backend, rule, envoys, pins))
                    log(f"rlqs: {json.dumps(rows[-1])}")
    finally:
        harness.close()
        print(table(rows))


if __name__ == "__main__":
    main()
