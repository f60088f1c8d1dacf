"""Fleet scale at Envoy's cadence (issue 47): many simulated Envoys, each reporting 10
buckets every 5 s (1 request a second per bucket, on a rule no run reaches), against fresh
servers: one replica on memory, two on Redis and on a 3-master Cluster. Measures, over 30 s
after a 25 s warm-up, the bucket reports booked a second and per CPU-second of the servers
(and of Redis), the resident memory per stream, the push latency after the warm-up, and the
cold start (every Envoy's first report at once, as after a rollout). Logs each row as JSON on
stderr, then prints the Markdown table of the rows that ran."""

import argparse
import json
import os
import time

from bench_report import pinning, rlqs_bench, rlqs_servers
from harness import Harness, log, process_cpu_seconds, process_rss_kib, redis_cpu_seconds

# (backend, streams): the memory row is the 10,000 x 10; the shared backends serve
# 2,000 x 10 over two replicas, what one Redis core answers beside them on two cores.
ROWS = (("memory", 10_000), ("redis", 2_000), ("redis-cluster", 2_000))
BUCKETS = 10
WARMUP, MEASURED = 25, 30
NAMES = {"memory": "memory, 1 replica", "redis": "Redis, 2 replicas",
         "redis-cluster": "Cluster (3 masters), 2 replicas"}


def reports(servers):
    """Bucket reports booked so far, over every replica."""
    total = 0
    for server in servers:
        for line in server.metrics().splitlines():
            if line.startswith("floodgate_rlqs_reports_total"):
                total += float(line.split()[-1])
    return total


def redis_ports(servers):
    """The Redis masters' ports, read from the replicas' `--redis-url`."""
    urls = servers[0].args[servers[0].args.index("--redis-url") + 1] \
        if "--redis-url" in servers[0].args else ""
    return [int(url.rsplit(":", 1)[1]) for url in urls.split(",") if url]


def sample(servers, ports):
    return (reports(servers), sum(process_cpu_seconds(s.proc.pid) for s in servers),
            sum(redis_cpu_seconds(port) for port in ports), time.monotonic())


def row(harness, binary, rules, backend, streams, pins):
    servers = rlqs_servers(harness, binary, rules, backend, pins)
    ports = redis_ports(servers)
    seconds = WARMUP + MEASURED + 5
    try:
        rss_before = process_rss_kib(servers[0].proc.pid)
        bench = rlqs_bench(harness, binary, servers,
                           ["--rlqs-streams", str(streams), "--rlqs-buckets",
                            str(BUCKETS), "--rlqs-offered", "1/s", "--rlqs-warmup",
                            f"{WARMUP}s"], seconds, f"fleet-{backend}", pins, rule=("user", 1_000_000_000))
        time.sleep(WARMUP)
        before = sample(servers, ports)
        time.sleep(MEASURED)
        after = sample(servers, ports)
        rss = process_rss_kib(servers[0].proc.pid)
        summary = bench.result(seconds + 60)
    finally:
        for server in servers:
            server.stop()
        harness.kill_all()
    booked, cpu, redis_cpu, elapsed = (b - a for a, b in zip(before, after))
    on_first = streams / len(servers)
    return {"backend": backend, "streams": streams, "buckets": BUCKETS,
            "booked_per_s": round(booked / elapsed), "server_cpu_s": round(cpu, 2),
            "per_cpu_s": round(booked / cpu) if cpu else None,
            "per_redis_cpu_s": round(booked / redis_cpu) if redis_cpu else None,
            "rss_mib": round(rss / 1024, 1),
            "kib_per_stream": round((rss - rss_before) / on_first, 1),
            "push_ms": summary["push_latency_ms"], "unanswered": summary["unanswered_reports"],
            "cold_start_ms": summary["cold_start_ms"], "stream_errors": summary["stream_errors"]}


def table(rows):
    out = ["| backend | streams x buckets | bucket reports booked per s | server CPU in "
           f"{MEASURED} s | per server CPU-second | per Redis CPU-second | resident (first "
           "replica) | push p50 / p99 / max ms | unanswered | cold start p50 / max ms | "
           "streams ended |", "|---|---|---:|---:|---:|---:|---|---|---:|---|---:|"]
    for r in rows:
        push, cold = r["push_ms"], r["cold_start_ms"]
        redis = f"{r['per_redis_cpu_s']:,}" if r["per_redis_cpu_s"] else "-"
        out.append(f"| {NAMES[r['backend']]} | {r['streams']:,} x {r['buckets']} | "
                   f"{r['booked_per_s']:,} | {r['server_cpu_s']} s | {r['per_cpu_s']:,} | "
                   f"{redis} | {r['rss_mib']} MiB ({r['kib_per_stream']} KiB a stream) | "
                   f"{push['p50']} / {push['p99']} / {push['max']} | {r['unanswered']} | "
                   f"{cold['p50']} / {cold['max']} | {r['stream_errors']} |")
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True)
    parser.add_argument("--backends", default=",".join(backend for backend, _ in ROWS))
    args = parser.parse_args()
    wanted = args.backends.split(",")
    unknown = set(wanted) - {backend for backend, _ in ROWS}
    if unknown:
        parser.error(f"unknown backends {sorted(unknown)}; known: memory, redis, redis-cluster")
    rules = os.path.join(os.path.dirname(__file__), "..", "bench-rules")
    pins = pinning()
    harness = Harness("bench-fleet")
    rows = []
    try:
        for backend, streams in ROWS:
            if backend in wanted:
                rows.append(row(harness, args.binary, rules, backend, streams, pins))
                log(f"fleet: {json.dumps(rows[-1])}")
    finally:
        harness.close()
        print(table(rows))


if __name__ == "__main__":
    main()
