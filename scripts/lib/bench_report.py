"""The benchmark report behind scripts/bench-report.sh: see docs/development.md#the-bench-report.

For each backend (memory, redis, redis-cluster of 3 masters) it starts a floodgate, then for
every (calls in flight, keys, descriptors per request) runs `floodgate bench` for a fixed
time and records decisions/s, latency, floodgate CPU per decision (/proc/PID/stat), Redis
CPU per decision (INFO cpu, summed over masters) and Redis commands per decision (INFO
commandstats). It also measures the ceiling of Redis itself: the exact script call floodgate
makes (captured with MONITOR), replayed pipelined on random buckets. It writes
BENCHMARKS.md and the raw results as JSON lines beside it.

The overload section (memory and redis, `--overload`) gives every call Envoy's default 20 ms
deadline and offers more than the service can answer: open loop at 1x, 2x and 4x the
capacity measured at 64 in flight, closed loop at 8x and 32x that concurrency, and
64-descriptor requests at 8, 64 and 256 in flight. It reports goodput (answers within the
deadline per second), shed answers (UNAVAILABLE) per second and the p99 of both. Where the
machine has at least 2 CPUs, floodgate is pinned to CPU 0 and the generator and Redis to
the others (taskset), in every run of the report. Open-loop callers act as Envoy's do: at
most 1,024 calls in flight, and a call due past that fails at once in the caller. With
`--overload-cpu-share`, floodgate's CPU is capped for these runs (a CFS quota, where a cgroup
can be written).
"""

import argparse
import codecs
import json
import os
import platform
import random
import re
import resource
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from harness import (LOOPBACK, Bench, Floodgate, Harness, RedisCluster, RedisNode,  # noqa: E402
                     encode_command, log, process_cpu_seconds, process_rss_kib, read_reply,
                     redis_command_calls, redis_cpu_seconds, resp, run_bench)
import kept_sections  # noqa: E402

FULL = {"in_flight": [16, 64, 512], "keys": [1, 10_000, 1_000_000], "descriptors": [1, 5]}
QUICK = {"in_flight": [16, 64], "keys": [10_000], "descriptors": [1, 5]}
BACKENDS = ["memory", "redis", "redis-cluster"]
# Commands that run a script: what floodgate sends per batch of decisions. INFO commandstats
# also counts the commands scripts run inside Redis (HMGET, HSET, TIME...).
SCRIPT_CALLS = {"evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro"}
# The overload runs: Envoy's default deadline, and the concurrency where a node saturates.
OVERLOAD_TIMEOUT = "20ms"
SATURATING_IN_FLIGHT = 64
# Calls of the Redis ceiling's first pass, which creates the buckets (`replay`).
REPLAY_WARMUP = 20_000
# Runs of the closed-loop 32x overload row; the report gives their median.
REPEATS_32X = 3
OVERLOAD_BACKENDS = ["memory", "redis"]
# Open-loop callers behave as Envoy does: at most its default circuit breaker's calls in
# flight (`max_requests`), and a call due past it fails at once in the caller
# (`--fail-when-busy`), so the generator need not send 4x the capacity to offer it.
ENVOY_MAX_REQUESTS = 1024
# The cold-spike section (issue 33): its backends, request widths, and the length of each
# spike and of the idle between two.
COLD_SPIKE_BACKENDS = ["redis"]
COLD_SPIKE_DESCRIPTORS = (1, 16, 64)
COLD_SPIKE_SECONDS = 5
COLD_SPIKE_IDLE_S = 10
# The scaling section (issue 33): service CPUs tried, and the load.
SCALING_CPUS = (1, 2, 4, 8)
SCALING_IN_FLIGHT = 512
SCALING_CONNECTIONS = 8
# The RLQS section (issues 32, 37): the `quota` rule of the bench rules (1,000 a second),
# simulated Envoys reporting every 5 s as Envoy does, the first 20 s left out (the bench's
# --rlqs-warmup); each load is (Envoys, offered per Envoy per second, target).
RLQS_LIMIT = 1000
RLQS_SECONDS = 40
RLQS_LOADS = ((2, 3000, "within the limit"), (10, 600, "within the limit"),
              (100, 60, "within the limit"), (1, 500, "below the limit"))
RLQS_BACKENDS = ("memory", "redis", "redis-cluster")
# The push-latency run: many Envoys, several buckets each, on memory.
RLQS_MANY_STREAMS, RLQS_MANY_BUCKETS, RLQS_MANY_OFFERED = 1000, 10, 2
# The fairness section (issue 33): a light caller alone, then beside a heavy caller on
# another connection (run under `nice`, so that on a shared generator CPU the light
# caller's own process is not what waits).
FAIRNESS_LIGHT = ["--rate", "200/s", "--concurrency", "64", "--connections", "1",
                  "--keys", "1000", "--timeout", "1s"]
FAIRNESS_HEAVY = ["--concurrency", "512", "--connections", "1", "--descriptors", "64",
                  "--keys", "10000", "--timeout", "1s"]
FAIRNESS_HEAVY_LEAD_S = 2
FAIRNESS_BACKENDS = ("memory", "redis")
# The candidate section: the same loads with and without a candidate rule beside the live one.
CANDIDATE_BACKENDS = ("memory", "redis")
CANDIDATE_LOADS = ({"in_flight": 64, "keys": 10_000, "descriptors": 1},
                   {"in_flight": 64, "keys": 10_000, "descriptors": 5})
CANDIDATE_ROUNDS = 2
# With `--overload-cpu-share`, floodgate's CPU in the overload runs is capped as a Kubernetes
# CPU limit (a CFS quota) would cap it, in periods short enough that throttling adds as
# little latency as it can (p99 at 64 in flight, memory: 9.7 ms with 4 ms periods against
# 15.8 ms with 10 ms in one A/B, 7.6-20 ms over later runs).
QUOTA_PERIOD_US = 4000


def pinning():
    """(floodgate CPUs, generator and Redis CPUs) for taskset, or None on one CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    return str(cpus[0]), ",".join(str(c) for c in cpus[1:])


def pin_redis(masters, cpus):
    """Moves every Redis master (all its threads) to `cpus`, if given."""
    for master in masters if cpus else []:
        subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(master.proc.pid)],
                       capture_output=True, check=True)


def cpu_limited(pid, share):
    """Puts process `pid` under a CFS quota of `share` of one CPU, in a cgroup of its own
    (cgroup v2, else v1's cpu controller). Returns the cgroup's directory, for `uncapped`,
    or None where no cgroup can be written (then the process runs unlimited)."""
    quota = int(QUOTA_PERIOD_US * share)
    name = f"floodgate-bench-{pid}"
    v2, v1 = "/sys/fs/cgroup", "/sys/fs/cgroup/cpu"
    try:
        if os.path.exists(os.path.join(v2, "cgroup.controllers")):
            with open(os.path.join(v2, "cgroup.subtree_control"), "w") as f:
                f.write("+cpu")
            path = os.path.join(v2, name)
            os.makedirs(path, exist_ok=True)
            settings = {"cpu.max": f"{quota} {QUOTA_PERIOD_US}"}
        elif os.path.exists(os.path.join(v1, "cpu.cfs_quota_us")):
            path = os.path.join(v1, name)
            os.makedirs(path, exist_ok=True)
            settings = {"cpu.cfs_period_us": QUOTA_PERIOD_US, "cpu.cfs_quota_us": quota}
        else:
            return None
        for file, value in [*settings.items(), ("cgroup.procs", pid)]:
            with open(os.path.join(path, file), "w") as f:
                f.write(str(value))
        return path
    except OSError as error:
        log(f"no CPU quota for the overload runs: {error}")
        return None


def uncapped(path, pid):
    """Moves process `pid` back out of the cgroup `cpu_limited` made, and removes it."""
    if not path:
        return
    try:
        with open(os.path.join(os.path.dirname(path), "cgroup.procs"), "w") as f:
            f.write(str(pid))
    except OSError:
        pass  # it has exited: the cgroup is empty already
    try:
        os.rmdir(path)
    except OSError as error:
        log(f"cannot remove {path}: {error}")


def pinned(cpus, args):
    return ["taskset", "-c", cpus, *args] if cpus else list(args)


def machine():
    model = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kib = int(f.readline().split()[1])
    redis = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "kernel": platform.release(),
        "redis": (re.search(r"v=(\S+)", redis) or [None, "?"])[1],
        "loadavg": open("/proc/loadavg").read().split()[:3],
    }


def capture_script_call(port, binary, target):
    """The last EVALSHA, EVAL or FCALL floodgate sent while answering a few calls, as a list
    of byte strings (its arguments are binary: the batch's packed words). MONITOR streams
    forever (floodgate's health pings too), so reading stops at a deadline."""
    with socket.create_connection((LOOPBACK, port), timeout=5) as conn:
        conn.sendall(b"MONITOR\r\n")
        subprocess.run([binary, "bench", "--target", target, "--quiet", "--count", "60",
                        "--concurrency", "1", "--duration", "10s"],
                       capture_output=True, timeout=30, check=True)
        conn.settimeout(0.2)
        data = b""
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline and len(data) < 16 << 20:
            try:
                chunk = conn.recv(1 << 16)
            except (socket.timeout, OSError):
                continue
            if not chunk:
                break
            data += chunk
    calls = []
    for line in data.split(b"\n"):
        # MONITOR quotes each argument and escapes its bytes as Python does (\xHH, \n...).
        args = [codecs.escape_decode(a)[0] for a in re.findall(rb'"((?:[^"\\]|\\.)*)"', line)]
        if args and args[0].upper() in (b"EVALSHA", b"EVALSHA_RO", b"EVAL", b"FCALL"):
            calls.append(args)
    if not calls:
        raise RuntimeError("floodgate made no script call that MONITOR saw")
    return calls[-1]


def key_positions(call):
    """Where `call`'s bucket keys are: after numkeys, or for the Redis Cluster batch function
    (numkeys 0) after its own count at the head of ARGV."""
    numkeys = int(call[2])
    if numkeys:
        return range(3, 3 + numkeys)
    return range(4, 4 + int(call[3]))


def node_hash_tag(port):
    """A hash tag whose slot the cluster node on `port` serves."""
    node_id = resp(port, "CLUSTER", "MYID")
    owned = [(int(r[0]), int(r[1])) for r in resp(port, "CLUSTER", "SLOTS")
             if r[2][2] == node_id]
    for n in range(100_000):
        slot = int(resp(port, "CLUSTER", "KEYSLOT", f"{{t{n}}}"))
        if any(low <= slot <= high for low, high in owned):
            return f"t{n}"
    raise RuntimeError(f"no hash tag found for the node on port {port}")


def replay(call, port, cluster, requests):
    """Redis alone with floodgate's script call: `call` sent `requests` times on one
    connection, pipelined, each time on random buckets of 10,000 (on a cluster node, all
    under a hash tag the node serves), after a first pass that creates the buckets. Returns
    calls per second, or None if any failed. redis-benchmark cannot send the call: its words
    are binary."""
    tag = node_hash_tag(port) if cluster else None
    replay_once(call, port, tag, REPLAY_WARMUP)
    return replay_once(call, port, tag, requests)


def replay_once(call, port, tag, requests):
    """One pass of `replay`: calls per second, or None if any failed."""
    rng = random.Random(requests)
    positions = key_positions(call)

    def command():
        args = list(call)
        for i in positions:
            bucket = rng.randrange(10_000)
            args[i] = (f"fg:{{{tag}}}:{bucket}" if tag else f"fg:{{{bucket}}}").encode()
        return encode_command(args)

    payload = b"".join(command() for _ in range(requests))
    with socket.create_connection((LOOPBACK, port), timeout=30) as conn:
        writer = threading.Thread(target=conn.sendall, args=(payload,))
        started = time.monotonic()
        writer.start()
        reader = conn.makefile("rb", buffering=1 << 20)
        failed = 0
        for _ in range(requests):
            try:
                read_reply(reader)
            except RuntimeError:
                failed += 1
        elapsed = time.monotonic() - started
        writer.join()
    if failed:
        log(f"replay failed: {failed} of {requests} calls answered an error")
        return None
    return requests / elapsed


def measure(binary, floodgate, masters, run, seconds, harness, generator_cpus):
    """One bench run (the generator on `generator_cpus`; None: anywhere) with the CPU and
    command deltas around it."""
    before_fg = process_cpu_seconds(floodgate.proc.pid)
    before_cpu = sum(redis_cpu_seconds(m.port) for m in masters)
    before_calls = [redis_command_calls(m.port) for m in masters]
    summary = run_bench(harness, binary, floodgate.target, [
        "--concurrency", str(run["in_flight"]), "--keys", str(run["keys"]),
        "--descriptors", str(run["descriptors"]), "--connections", "4"], seconds,
        prefix=pinned(generator_cpus, []))
    fg_cpu = process_cpu_seconds(floodgate.proc.pid) - before_fg
    redis_cpu = sum(redis_cpu_seconds(m.port) for m in masters) - before_cpu
    commands = {}
    for master, before in zip(masters, before_calls):
        for name, calls in redis_command_calls(master.port).items():
            delta = calls - before.get(name, 0)
            if delta:
                commands[name] = commands.get(name, 0) + delta
    decisions = max(summary["decisions"], 1)
    result = dict(run)
    result.update({
        "decisions_per_s": summary["decisions_per_s"],
        "requests_per_s": summary["requests_per_s"],
        "latency_us": summary["latency_us"],
        "errors": summary["errors"],
        "errors_by_code": summary["errors_by_code"],
        "floodgate_cpu_us_per_decision": round(fg_cpu * 1e6 / decisions, 2),
        "redis_cpu_us_per_decision": round(redis_cpu * 1e6 / decisions, 2) if masters else None,
        "redis_script_calls_per_decision": round(
            sum(n for name, n in commands.items() if name in SCRIPT_CALLS) / decisions, 3)
        if masters else None,
        "redis_commands_per_decision": round(sum(commands.values()) / decisions, 3)
        if masters else None,
        "redis_commands": commands,
    })
    for master in masters:
        resp(master.port, "FLUSHALL")
    return result


def overload_run(binary, floodgate, harness, seconds, cpus, label, args):
    """One overload bench: goodput, shed rate and p99s, from the generator's summary, and
    the CPU floodgate and the generator used (cores busy), which shows which one limited the
    run."""
    served_before = process_cpu_seconds(floodgate.proc.pid)
    generated_before = children_cpu_seconds()
    summary = run_bench(harness, binary, floodgate.target,
                        ["--keys", "10000", "--connections", "4", "--timeout", OVERLOAD_TIMEOUT,
                         *args], seconds, name=f"overload-{label.replace(' ', '-')}",
                        prefix=pinned(cpus, []))
    elapsed = max(summary["elapsed_s"], 1e-9)
    served_cpu = process_cpu_seconds(floodgate.proc.pid) - served_before
    generated_cpu = children_cpu_seconds() - generated_before
    shed = summary["errors_by_code"].get("Unavailable", 0)
    overflow = summary["errors_by_code"].get("Overflow", 0)
    return {
        "floodgate_cores": round(served_cpu / elapsed, 2),
        "generator_cores": round(generated_cpu / elapsed, 2),
        "load": label,
        "goodput_per_s": summary["in_time_per_s"],
        "shed_per_s": round(shed / elapsed, 1),
        "overflow_per_s": round(overflow / elapsed, 1),
        "other_errors_per_s": round((summary["errors"] - shed - overflow) / elapsed, 1),
        "errors_by_code": summary["errors_by_code"],
        "answered_p99_us": summary["answered_latency_us"]["p99"],
        "shed_p99_us": summary["unavailable_latency_us"]["p99"],
    }


def children_cpu_seconds():
    """User + system CPU of this script's waited-for children (the generators)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def overload(binary, floodgate, harness, seconds, cpus):
    """The overload rows of one backend, with the ratios the targets are stated in; the
    generator runs on `cpus` (None: anywhere)."""
    closed = lambda n, d=1: ["--concurrency", str(n), "--descriptors", str(d)]  # noqa: E731
    run = lambda label, args: overload_run(  # noqa: E731
        binary, floodgate, harness, seconds, cpus, label, args)
    rows = [run(f"closed {SATURATING_IN_FLIGHT}", closed(SATURATING_IN_FLIGHT))]
    capacity = max(rows[0]["goodput_per_s"], 1.0)
    for factor in (1, 2, 4):
        rate = int(capacity * factor)
        rows.append(run(f"open {factor}x", ["--rate", f"{rate}/s", "--fail-when-busy",
                                            "--concurrency", str(ENVOY_MAX_REQUESTS)]))
        rows[-1]["offered_per_s"] = rate
    for factor in (8, 32):
        n = SATURATING_IN_FLIGHT * factor
        if factor == 32:
            # The 32x row settles in one of two states from its first moments (README,
            # Overload): its median of a few runs, with every run's goodput shown.
            runs = sorted((run(f"closed {n}", closed(n)) for _ in range(REPEATS_32X)),
                          key=lambda r: r["goodput_per_s"])
            rows.append(dict(runs[len(runs) // 2],
                             goodput_runs=[r["goodput_per_s"] for r in runs]))
        else:
            rows.append(run(f"closed {n}", closed(n)))
    for n in (8, 64, 256):
        rows.append(run(f"closed {n} x 64 descriptors", closed(n, 64)))
    by = {r["load"]: r for r in rows}
    peak = rows[0]["goodput_per_s"] or 1.0
    one_x = by["open 1x"]["goodput_per_s"] or 1.0
    wide_peak = by["closed 8 x 64 descriptors"]["goodput_per_s"] or 1.0
    ratios = {
        "open 2x / open 1x": by["open 2x"]["goodput_per_s"] / one_x,
        "open 4x / open 1x": by["open 4x"]["goodput_per_s"] / one_x,
        f"closed {SATURATING_IN_FLIGHT * 32} / closed {SATURATING_IN_FLIGHT}":
            by[f"closed {SATURATING_IN_FLIGHT * 32}"]["goodput_per_s"] / peak,
        "64 descriptors: closed 256 / closed 8":
            by["closed 256 x 64 descriptors"]["goodput_per_s"] / wide_peak,
    }
    return rows, {k: round(v, 2) for k, v in ratios.items()}


def overload_table(rows, ratios):
    out = ["| load | offered/s | goodput/s | shed/s | overflow/s | other errors/s "
           "| p99 answered us | p99 shed us | floodgate cores | generator cores |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        offered = f"{r['offered_per_s']:,}" if "offered_per_s" in r else "-"
        out.append(f"| {r['load']} | {offered} | {r['goodput_per_s']:,.0f} "
                   f"| {r['shed_per_s']:,.0f} | {r['overflow_per_s']:,.0f} "
                   f"| {r['other_errors_per_s']:,.0f} "
                   f"| {r['answered_p99_us']} | {r['shed_p99_us']} "
                   f"| {r['floodgate_cores']} | {r['generator_cores']} |")
    for r in rows:
        if "goodput_runs" in r:
            runs = ", ".join(f"{g:,.0f}" for g in r["goodput_runs"])
            out += ["", f"{r['load']}: the run of median goodput of {len(r['goodput_runs'])} "
                        f"(goodput/s of each: {runs})."]
    out += ["", "| goodput ratio | value |", "|---|---:|"]
    out += [f"| {name} | {value} |" for name, value in ratios.items()]
    return "\n".join(out)


def cold_start(binary, harness, rules, backend, masters, urls, pins, rate=10_000):
    """p99 of a fresh replica over its first 3 s, loaded at `rate` from its first SERVING
    answer, against the same replica's p99 over 3 s after 30 s of that load.

    floodgate runs on its own CPU, the generator and Redis on the other (`pins`), as in the
    overload runs, so that the figure is floodgate's start, not the two processes' contention."""
    pin_redis(masters, pins and pins[1])
    floodgate = Floodgate(harness, binary, rules, backend, urls,
                          prefix=pinned(pins and pins[0], []))
    args = ["--rate", f"{rate}/s", "--concurrency", "2000", "--keys", "10000",
            "--connections", "4"]
    generator = pinned(pins and pins[1], [])
    cold = run_bench(harness, binary, floodgate.target, args, 3, name=f"cold-{backend}",
                     prefix=generator)
    run_bench(harness, binary, floodgate.target, args, 24,
              name=f"cold-between-{backend}", prefix=generator)
    warm = run_bench(harness, binary, floodgate.target, args, 3, name=f"warm-{backend}",
                     prefix=generator)
    floodgate.stop()
    ratio = cold["latency_us"]["p99"] / max(warm["latency_us"]["p99"], 1)
    return {"backend": backend, "rate_per_s": rate, "cold_p99_us": cold["latency_us"]["p99"],
            "cold_max_us": cold["latency_us"]["max"], "warm_p99_us": warm["latency_us"]["p99"],
            "ratio": round(ratio, 2), "cold_errors": cold["errors"]}


def cold_spikes(binary, harness, rules, backend, urls, pins, seconds):
    """Goodput of a fresh replica over its first COLD_SPIKE_SECONDS under an open-loop spike
    of 2x and 4x its warm capacity, for requests of 1, 16 and 64 descriptors, and the same
    replica's goodput in a second spike after COLD_SPIKE_IDLE_S of idle; each as a share of
    the warm capacity: the goodput at SATURATING_IN_FLIGHT in flight of another replica that
    served 8 calls in flight first (issue 33)."""
    fresh = lambda: Floodgate(harness, binary, rules, backend, urls,  # noqa: E731
                              prefix=pinned(pins and pins[0], []))
    generator = pins and pins[1]
    rows = []
    for descriptors in COLD_SPIKE_DESCRIPTORS:
        wide = ["--descriptors", str(descriptors)]
        warm = fresh()
        run_bench(harness, binary, warm.target, ["--concurrency", "8", *wide], 2,
                  name=f"cold-spike-warmup-{descriptors}", prefix=pinned(generator, []))
        capacity = overload_run(binary, warm, harness, seconds, generator,
                                f"warm capacity {descriptors}",
                                ["--concurrency", str(SATURATING_IN_FLIGHT), *wide])
        warm.stop()
        capacity = max(capacity["goodput_per_s"], 1.0)
        for factor in (2, 4):
            rate = int(capacity * factor)
            spike = ["--rate", f"{rate}/s", "--fail-when-busy",
                     "--concurrency", str(ENVOY_MAX_REQUESTS), *wide]
            replica = fresh()
            cold = overload_run(binary, replica, harness, COLD_SPIKE_SECONDS, generator,
                                f"cold {factor}x {descriptors}", spike)
            time.sleep(COLD_SPIKE_IDLE_S)
            idle = overload_run(binary, replica, harness, COLD_SPIKE_SECONDS, generator,
                                f"idle {factor}x {descriptors}", spike)
            replica.stop()
            rows.append({"backend": backend, "descriptors": descriptors, "factor": factor,
                         "warm_capacity_per_s": round(capacity),
                         "cold_goodput_per_s": cold["goodput_per_s"],
                         "cold_ratio": round(cold["goodput_per_s"] / capacity, 2),
                         "cold_shed_per_s": cold["shed_per_s"],
                         "idle_goodput_per_s": idle["goodput_per_s"],
                         "idle_ratio": round(idle["goodput_per_s"] / capacity, 2)})
            log(f"cold spike {backend}: {json.dumps(rows[-1])}")
    return rows


def scaling(binary, harness, rules, seconds):
    """How decisions/s and CPU per decision grow with the service's CPUs (issue 33): the
    memory backend on the first N CPUs of this process's affinity, for each N of
    SCALING_CPUS that leaves at least as many CPUs again for the generator (which must not be
    what limits the run), at SCALING_IN_FLIGHT calls in flight over SCALING_CONNECTIONS
    connections."""
    cpus = sorted(os.sched_getaffinity(0))
    rows = []
    for n in SCALING_CPUS:
        if 2 * n > len(cpus) and n > 1:
            break
        serve = ",".join(str(c) for c in cpus[:n])
        generate = ",".join(str(c) for c in cpus[n:]) or None
        floodgate = Floodgate(harness, binary, rules, "memory", prefix=pinned(serve, []))
        load = ["--concurrency", str(SCALING_IN_FLIGHT), "--connections",
                str(SCALING_CONNECTIONS), "--keys", "10000"]
        run_bench(harness, binary, floodgate.target, load, 1, name=f"scaling-warmup-{n}",
                  prefix=pinned(generate, []))
        served_before = process_cpu_seconds(floodgate.proc.pid)
        generated_before = children_cpu_seconds()
        summary = run_bench(harness, binary, floodgate.target, load, seconds,
                            name=f"scaling-{n}", prefix=pinned(generate, []))
        elapsed = max(summary["elapsed_s"], 1e-9)
        served = process_cpu_seconds(floodgate.proc.pid) - served_before
        generated = children_cpu_seconds() - generated_before
        floodgate.stop()
        rows.append({"cpus": n, "generator_cpus": len(cpus) - n,
                     "decisions_per_s": summary["decisions_per_s"],
                     "cpu_us_per_decision": round(served * 1e6 / max(summary["decisions"], 1),
                                                  2),
                     "floodgate_cores": round(served / elapsed, 2),
                     "generator_cores": round(generated / elapsed, 2)})
        log(f"scaling: {json.dumps(rows[-1])}")
    return rows


def rlqs_servers(harness, binary, rules, backend, pins):
    """Fresh servers for one RLQS run: one replica on memory (replicas would not share it),
    two on a fresh Redis or 3-master Cluster."""
    serve = pins and pins[0]
    if backend == "memory":
        return [Floodgate(harness, binary, rules, "memory", prefix=pinned(serve, []))]
    if backend == "redis":
        node = RedisNode(harness)
        pin_redis([node], pins and pins[1])
        urls = [node.url]
    else:
        cluster = RedisCluster(harness, masters=3)
        pin_redis(cluster.masters(), pins and pins[1])
        urls = cluster.urls()
    return [Floodgate(harness, binary, rules, backend, urls, prefix=pinned(serve, []))
            for _ in range(2)]


def rlqs_bench(harness, binary, servers, args, seconds, name, pins, rule=("quota", RLQS_LIMIT)):
    """Simulated Envoys on `rule` (a key of the bench rules and its limit) over `servers`."""
    replicas = [arg for server in servers[1:] for arg in ("--rlqs-replica", server.target)]
    key, limit = rule
    return Bench(harness, binary, servers[0].target,
                 ["--duration", f"{seconds}s", "--rlqs", "--key", key, "--rlqs-limit",
                  str(limit), *replicas, *args], name,
                 prefix=pinned(pins and pins[1], []))


def rlqs(binary, harness, rules, pins):
    """Envoys on quota streams (issue 32): what they admit per window against the limit, on
    each backend with fresh servers per run; then the push latency and memory per stream
    with many streams."""
    rows = []
    for backend in RLQS_BACKENDS:
        for envoys, offered, target in RLQS_LOADS:
            servers = rlqs_servers(harness, binary, rules, backend, pins)
            summary = rlqs_bench(harness, binary, servers,
                                 ["--rlqs-streams", str(envoys), "--rlqs-offered",
                                  f"{offered}/s"], RLQS_SECONDS,
                                 f"rlqs-{backend}-{envoys}", pins).result(RLQS_SECONDS + 60)
            for server in servers:
                server.stop()
            harness.kill_all()
            rows.append({"target": target, "backend": backend, "envoys": envoys,
                         "offered_per_s": offered, "ratio": summary["admitted_ratio"],
                         "admitted": summary["admitted"], "denied": summary["denied"],
                         "push_p99_ms": summary["push_latency_ms"]["p99"],
                         "stream_errors": summary["stream_errors"]})
            log(f"rlqs: {json.dumps(rows[-1])}")
    server = rlqs_servers(harness, binary, rules, "memory", pins)
    rss_before = process_rss_kib(server[0].proc.pid)
    bench = rlqs_bench(harness, binary, server,
                       ["--rlqs-streams", str(RLQS_MANY_STREAMS), "--rlqs-buckets",
                        str(RLQS_MANY_BUCKETS), "--rlqs-offered", f"{RLQS_MANY_OFFERED}/s"],
                       RLQS_SECONDS, "rlqs-many", pins)
    time.sleep(RLQS_SECONDS / 2)
    rss_during = process_rss_kib(server[0].proc.pid)
    summary = bench.result(RLQS_SECONDS + 60)
    server[0].stop()
    many = {"streams": RLQS_MANY_STREAMS, "buckets": RLQS_MANY_BUCKETS,
            "push_latency_ms": summary["push_latency_ms"],
            "kib_per_stream": round((rss_during - rss_before) / RLQS_MANY_STREAMS, 1),
            "stream_errors": summary["stream_errors"]}
    log(f"rlqs many: {json.dumps(many)}")
    return {"rows": rows, "many": many}


def rlqs_table(rlqs_runs):
    names = {"memory": "memory", "redis": "Redis, 2 replicas",
             "redis-cluster": "Cluster (3 masters), 2 replicas"}
    out = ["| target | backend | Envoys x offered each | admitted per window / limit: min, "
           "mean, max | denied | push p99 ms |", "|---|---|---|---|---:|---:|"]
    for r in rlqs_runs["rows"]:
        ratio = r["ratio"]
        denied = f"{r['denied']:,} of {r['admitted'] + r['denied']:,}"
        out.append(f"| {r['target']} | {names[r['backend']]} | {r['envoys']} x "
                   f"{r['offered_per_s']:,}/s | {ratio['min']}, {ratio['mean']}, "
                   f"{ratio['max']} | {denied} | {r['push_p99_ms']} |")
    return "\n".join(out)


def fairness(binary, harness, rules, seconds, pins):
    """A light caller's latency alone and beside a heavy caller on another connection
    (issue 33), on each of FAIRNESS_BACKENDS: floodgate on the first CPU, Redis and both
    callers on the other(s)."""
    rows = []
    for backend in FAIRNESS_BACKENDS:
        urls = []
        if backend == "redis":
            node = RedisNode(harness)
            pin_redis([node], pins and pins[1])
            urls = [node.url]
        floodgate = Floodgate(harness, binary, rules, backend, urls,
                              prefix=pinned(pins and pins[0], []))
        rows.append(fairness_row(binary, harness, floodgate, seconds, pins and pins[1]))
        rows[-1]["backend"] = backend
        floodgate.stop()
        harness.kill_all()
        log(f"fairness: {json.dumps(rows[-1])}")
    return rows


def candidates(binary, harness, rules, seconds, pins):
    """Each of CANDIDATE_LOADS without and with `--candidate-config scripts/bench-candidates`
    (issue 39), CANDIDATE_ROUNDS times in turn, on each of CANDIDATE_BACKENDS: floodgate on
    the first CPU, the generator and Redis on the other(s)."""
    candidate_rules = os.path.join(os.path.dirname(rules), "bench-candidates")
    rows = []
    for backend in CANDIDATE_BACKENDS:
        for _ in range(CANDIDATE_ROUNDS):
            for with_candidate in (False, True):
                masters, urls = [], []
                if backend == "redis":
                    node = RedisNode(harness)
                    pin_redis([node], pins and pins[1])
                    masters, urls = [node], [node.url]
                extra = ["--candidate-config", candidate_rules] if with_candidate else []
                floodgate = Floodgate(harness, binary, rules, backend, urls, extra=extra,
                                      prefix=pinned(pins and pins[0], []))
                run_bench(harness, binary, floodgate.target, ["--concurrency", "16"], 1,
                          name=f"warmup-candidate-{backend}", prefix=pinned(pins and pins[1], []))
                for load in CANDIDATE_LOADS:
                    row = measure(binary, floodgate, masters, {"backend": backend, **load},
                                  seconds, harness, pins and pins[1])
                    row["candidate"] = with_candidate
                    rows.append(row)
                    log(f"candidates: {json.dumps({k: row[k] for k in ('backend', 'descriptors', 'candidate', 'decisions_per_s', 'floodgate_cpu_us_per_decision')})}")
                floodgate.stop()
                harness.kill_all()
    return rows


def candidates_table(rows):
    out = ["| backend | descriptors | candidate rule | decisions/s | p99 us "
           "| floodgate CPU us/decision | Redis CPU us/decision | CPU ratio |",
           "|---|---:|---|---:|---:|---:|---:|---:|"]
    keys = sorted({(r["backend"], r["descriptors"]) for r in rows},
                  key=lambda k: (CANDIDATE_BACKENDS.index(k[0]), k[1]))
    for backend, descriptors in keys:
        runs = [r for r in rows if (r["backend"], r["descriptors"]) == (backend, descriptors)]
        mean = {}
        for with_candidate in (False, True):
            mine = [r for r in runs if r["candidate"] == with_candidate]
            mean[with_candidate] = sum(r["floodgate_cpu_us_per_decision"] for r in mine) / len(mine)
            for r in mine:
                ratio = (f"{r['floodgate_cpu_us_per_decision'] / mean[False]:.2f}"
                         if with_candidate else "-")
                redis_cpu = r["redis_cpu_us_per_decision"]
                out.append(f"| {backend} | {descriptors} | {'yes' if with_candidate else 'no'} "
                           f"| {r['decisions_per_s']:,.0f} | {r['latency_us']['p99']} "
                           f"| {r['floodgate_cpu_us_per_decision']} "
                           f"| {'-' if redis_cpu is None else redis_cpu} | {ratio} |")
    return "\n".join(out)


def fairness_row(binary, harness, floodgate, seconds, generate):
    """The light caller alone, then beside the heavy caller (under `nice`), on `floodgate`."""
    def light(name):
        return run_bench(harness, binary, floodgate.target, FAIRNESS_LIGHT, seconds, name=name,
                         prefix=pinned(generate, []))

    alone = light("fairness-light-alone")
    heavy = Bench(harness, binary, floodgate.target,
                  ["--duration", f"{seconds + 2 * FAIRNESS_HEAVY_LEAD_S}s", *FAIRNESS_HEAVY],
                  "fairness-heavy", prefix=["nice", "-n", "19", *pinned(generate, [])])
    time.sleep(FAIRNESS_HEAVY_LEAD_S)
    beside = light("fairness-light-beside")
    heavy_summary = heavy.result(seconds + 60)
    return {"light_alone_us": {q: alone["latency_us"][q] for q in ("p50", "p90", "p99")},
            "light_beside_us": {q: beside["latency_us"][q] for q in ("p50", "p90", "p99")},
            "light_beside_errors": beside["errors"],
            "heavy_calls_per_s": heavy_summary["requests_per_s"],
            "heavy_p99_us": heavy_summary["latency_us"]["p99"]}


def fairness_table(rows):
    out = ["| backend | light caller | p50 ms | p90 ms | p99 ms | light errors "
           "| heavy calls/s | heavy p99 ms |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        for label, key in (("alone", "light_alone_us"), ("beside the heavy caller",
                                                           "light_beside_us")):
            q = row[key]
            beside = key == "light_beside_us"
            heavy = (f"{row['heavy_calls_per_s']:,.0f} | {row['heavy_p99_us'] / 1000:.1f}"
                     if beside else "- | -")
            errors = row["light_beside_errors"] if beside else "-"
            out.append(f"| {row['backend']} | {label} | {q['p50'] / 1000:.1f} "
                       f"| {q['p90'] / 1000:.1f} | {q['p99'] / 1000:.1f} | {errors} | {heavy} |")
    return "\n".join(out)


def scaling_table(rows):
    one = rows[0]
    out = ["| service CPUs | decisions/s | / 1 CPU | floodgate CPU us/decision | / 1 CPU "
           "| floodgate cores | generator CPUs | generator cores |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['cpus']} | {r['decisions_per_s']:,.0f} "
                   f"| {r['decisions_per_s'] / max(one['decisions_per_s'], 1e-9):.2f} "
                   f"| {r['cpu_us_per_decision']} "
                   f"| {r['cpu_us_per_decision'] / max(one['cpu_us_per_decision'], 1e-9):.2f} "
                   f"| {r['floodgate_cores']} | {r['generator_cpus']} "
                   f"| {r['generator_cores']} |")
    return "\n".join(out)


def cold_spike_table(rows):
    out = [f"| backend | descriptors | spike | warm capacity/s | goodput/s, first "
           f"{COLD_SPIKE_SECONDS} s | / warm | shed/s | goodput/s after {COLD_SPIKE_IDLE_S} s idle "
           "| / warm |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['backend']} | {r['descriptors']} | {r['factor']}x "
                   f"| {r['warm_capacity_per_s']:,} | {r['cold_goodput_per_s']:,.0f} "
                   f"| {r['cold_ratio']} | {r['cold_shed_per_s']:,.0f} "
                   f"| {r['idle_goodput_per_s']:,.0f} | {r['idle_ratio']} |")
    return "\n".join(out)


def targets(results):
    """The ratios the Redis targets are stated in (issue: Redis at the limit), where this
    report has the runs they compare."""
    def pick(backend, in_flight, keys, descriptors=1):
        return next((r for r in results if (r["backend"], r["in_flight"], r["keys"],
                                            r["descriptors"]) ==
                     (backend, in_flight, keys, descriptors)), None)
    out = []

    def ratio(name, a, b, field, target):
        if a and b and b[field]:
            out.append((name, round(a[field] / b[field], 2), target))
    cpu = "floodgate_cpu_us_per_decision"
    ratio("floodgate CPU/decision, redis / memory, 1 bucket, 512 in flight",
          pick("redis", 512, 1), pick("memory", 512, 1), cpu, "<= 1.2")
    ratio("floodgate CPU/decision, redis / memory, 10k buckets, 64 in flight",
          pick("redis", 64, 10_000), pick("memory", 64, 10_000), cpu, "<= 1.4")
    ratio("decisions/s, redis-cluster / redis, 10k buckets, 64 in flight",
          pick("redis-cluster", 64, 10_000), pick("redis", 64, 10_000), "decisions_per_s",
          ">= 0.9")
    ratio("decisions/s, redis / memory, 1 bucket, 512 in flight",
          pick("redis", 512, 1), pick("memory", 512, 1), "decisions_per_s", ">= 0.7")
    for backend in ("redis", "redis-cluster"):
        run = pick(backend, 64, 10_000)
        if run:
            out.append((f"Redis CPU us/decision, {backend}, 10k buckets, 64 in flight",
                        run["redis_cpu_us_per_decision"], "half of the last report"))
            out.append((f"script calls/decision, {backend}, 10k buckets, 64 in flight",
                        run["redis_script_calls_per_decision"], "<= 0.2"))
    for backend in BACKENDS:
        run = pick(backend, 16, 10_000)
        if run:
            out.append((f"p99 us at 16 in flight, {backend}, 10k buckets",
                        run["latency_us"]["p99"], "<= the last report"))
    return out


def table(results):
    rows = ["| in flight | keys | descriptors | decisions/s | p50 us | p99 us | p99.9 us "
            "| floodgate CPU us/decision | Redis CPU us/decision | script calls/decision "
            "| Redis commands/decision | errors |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lat = r["latency_us"]
        dash = lambda v: "-" if v is None else v  # noqa: E731
        rows.append(f"| {r['in_flight']} | {r['keys']:,} | {r['descriptors']} "
                    f"| {r['decisions_per_s']:,.0f} | {lat['p50']} | {lat['p99']} "
                    f"| {lat['p99.9']} | {r['floodgate_cpu_us_per_decision']} "
                    f"| {dash(r['redis_cpu_us_per_decision'])} "
                    f"| {dash(r['redis_script_calls_per_decision'])} "
                    f"| {dash(r['redis_commands_per_decision'])} | {r['errors']} |")
    return "\n".join(rows)


def write_report(path, meta, results, ceilings, argv, overloads, colds, spikes=(),
                 scale=(), fair=None, rlqs_runs=None, cands=None):
    m = meta["machine"]
    lines = [
        "# Benchmarks",
        "",
        "Generated by `scripts/bench-report.sh` (do not edit by hand; re-run it).",
        "",
        f"- Date: {meta['date']}",
        f"- Commit: `{meta['commit']}`",
        f"- Machine: {m['nproc']} CPUs ({m['cpu']}), {m['memory_gib']} GiB RAM, "
        f"Linux {m['kernel']}, Redis {m['redis']}; load average at start "
        f"{' '.join(m['loadavg'])}",
        f"- Command: `{argv}`",
        f"- Each run: `floodgate bench --duration {meta['seconds']}s --connections 4 "
        "--concurrency N --keys K --descriptors D` against `floodgate serve` on the same "
        "machine (rules: `scripts/bench-rules`, one fixed-window bucket per key, never over "
        "its limit); Redis is flushed after every run.",
        "- A decision is one descriptor answered; CPU per decision is the process's "
        "utime+stime delta (/proc/PID/stat) for floodgate, and `INFO cpu` "
        "used_cpu_sys+used_cpu_user deltas summed over every master for Redis; Redis "
        "commands are `INFO commandstats` deltas (INFO itself excluded): script calls are "
        "EVALSHA/EVAL/FCALL (what floodgate sends), Redis commands also count the commands "
        "the scripts run inside Redis.",
        "- The load generator, floodgate and Redis share the machine, so absolute figures "
        "are lower than on separate hosts; compare runs of one report with each other. "
        + (f"floodgate ran on CPU {meta['pinning'][0]}, the generator and Redis on CPU "
           f"{meta['pinning'][1]} (taskset), in every run." if meta.get("pinning") else
           "Nothing was pinned (one CPU)."),
        "",
    ]
    for backend in BACKENDS:
        rows = [r for r in results if r["backend"] == backend]
        if rows:
            lines += [f"## {backend}", "", table(rows), ""]
    lines += ["## Redis ceiling", "",
              "The script call floodgate makes for one descriptor (captured with MONITOR), "
              "replayed on one connection, pipelined, over 10,000 random buckets on the same "
              "Redis (on the cluster, its first master): what Redis alone can do with this "
              "script.", "",
              "| Redis | calls/s |", "|---|---:|"]
    for name, rate in ceilings.items():
        lines.append(f"| {name} | {'failed' if rate is None else f'{rate:,.0f}'} |")
    lines.append("")
    rows = targets(results)
    if rows:
        lines += ["## Target ratios", "", "| measure | value | target |", "|---|---:|---|"]
        lines += [f"| {name} | {value} | {target} |" for name, value, target in rows]
        lines.append("")
    if colds:
        lines += ["## Cold start", "",
                  "A fresh floodgate loaded open loop at 10,000 calls/s from its first SERVING "
                  "answer: p99 over its first 3 s against its p99 over 3 s after 30 s "
                  "(target: at most 2x). floodgate ran on one CPU, the generator and Redis on "
                  "the other (taskset), as in the overload runs.", "",
                  "| backend | cold p99 us | cold max us | warm p99 us | ratio | cold errors |",
                  "|---|---:|---:|---:|---:|---:|"]
        lines += [f"| {c['backend']} | {c['cold_p99_us']} | {c['cold_max_us']} "
                  f"| {c['warm_p99_us']} | {c['ratio']} | {c['cold_errors']} |" for c in colds]
        lines.append("")
    if overloads:
        pins = meta.get("pinning")
        lines += ["## Overload (every call with a 20 ms deadline)", "",
                  "Goodput is calls answered (OK or OVER_LIMIT) within the deadline per second; "
                  "shed is UNAVAILABLE answers per second (`--failure-mode error`); other errors "
                  "are calls the generator gave up on. Open loop offers a multiple of the "
                  f"goodput at {SATURATING_IN_FLIGHT} in flight as Envoy's callers would: at most "
                  f"{ENVOY_MAX_REQUESTS:,} calls in flight (its default circuit breaker), a call "
                  "due past that fails at once in the caller (counted apart, as overflow), and "
                  "each call sends what is left of its deadline. Closed loop keeps N calls in "
                  "flight over 4 connections. "
                  + (f"floodgate ran on CPU {pins[0]}, the generator and Redis on CPU {pins[1]} "
                     "(taskset)." if pins else "Nothing was pinned (one CPU).")
                  + (f" floodgate's CPU was capped at {meta['overload_cpu_share']} of one CPU "
                     f"(a CFS quota in {QUOTA_PERIOD_US // 1000} ms periods, as a Kubernetes CPU "
                     "limit sets)." if meta.get("overload_cpu_share") else
                     " floodgate's CPU was not capped.")
                  + " The cores columns are the CPU each process used over the run: a "
                  "generator near 1.0 on its core limited the run, not floodgate.", ""]
        for backend, (rows, ratios) in overloads.items():
            lines += [f"### {backend}", "", overload_table(rows, ratios), ""]
    if spikes:
        lines += ["## A spike on a cold replica", "",
                  "A replica that has never measured its backend's queue (just started), hit "
                  "at once by an open-loop spike of 2x or 4x the warm capacity, as above (20 ms "
                  "deadlines, Envoy's circuit breaker), then hit again after "
                  f"{COLD_SPIKE_IDLE_S} s of idle, when its measured drain rate has aged out. "
                  "Warm capacity: the goodput at "
                  f"{SATURATING_IN_FLIGHT} in flight of a replica that served 8 in flight first.",
                  "", cold_spike_table(spikes), ""]
    if scale:
        lines += ["## Scaling with the service's CPUs", "",
                  f"The memory backend on 1, 2, 4 and 8 CPUs (as many as this machine leaves the "
                  f"generator at least as many CPUs), {SCALING_IN_FLIGHT} calls in flight over "
                  f"{SCALING_CONNECTIONS} connections, the generator on the other CPUs (taskset). "
                  "The ratios are against the 1-CPU row.", "", scaling_table(scale), ""]
    if rlqs_runs:
        many = rlqs_runs["many"]
        latency = many["push_latency_ms"]
        lines += ["## RLQS: simulated Envoys on quota streams", "",
                  f"One rule of {RLQS_LIMIT:,} a second; each simulated Envoy enforces what it "
                  "is assigned as Envoy's filter does and reports as Envoy does (at once "
                  "for a new bucket, then every 5 s); "
                  f"{RLQS_SECONDS} s runs on fresh servers, the first 20 s left out; the "
                  "replicas on the first CPU, the bench and Redis on the other(s).", "",
                  rlqs_table(rlqs_runs), "",
                  f"With {many['streams']:,} streams x {many['buckets']} buckets on memory: "
                  f"push latency p50 {latency['p50']} ms, p99 {latency['p99']} ms, max "
                  f"{latency['max']} ms; about {many['kib_per_stream']} KiB of resident "
                  "memory per open stream.", ""]
    if fair:
        lines += ["## Fairness between callers", "",
                  "floodgate on one CPU (Redis, on the other, for the redis rows). A light caller "
                  "(1 descriptor, 200 calls/s, one connection) alone, then beside a heavy caller "
                  f"keeping {FAIRNESS_HEAVY[1]} calls of {FAIRNESS_HEAVY[5]} descriptors in "
                  "flight on one connection (under `nice` on the generator CPU), both with 1 s "
                  "deadlines.", "", fairness_table(fair), ""]
    if cands:
        lines += ["## Candidate rules", "",
                  "The same load without and with a candidate rule (`--candidate-config "
                  "scripts/bench-candidates`: a second, never-reached limit on every `user` "
                  f"bucket), {CANDIDATE_ROUNDS} rounds in turn, each on a fresh floodgate "
                  "(and Redis); floodgate on one CPU, the generator and Redis on the other. "
                  "CPU ratio: floodgate CPU per decision over the mean of the runs without "
                  "(target: at most 1.3).", "", candidates_table(cands), ""]
    # Sections other scripts write (scripts/bench-regions.sh) stay.
    lines.append(kept_sections.kept(path))
    with open(path, "w") as f:
        f.write("\n".join(lines))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True)
    parser.add_argument("--quick", action="store_true", help="a subset, 3 s per run")
    parser.add_argument("--seconds", type=int, help="per-run duration (default 10, quick 3)")
    parser.add_argument("--out", default="BENCHMARKS.md")
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help="backends of the main table; empty: none (e.g. only --rlqs)")
    parser.add_argument("--argv", default="scripts/bench-report.sh")
    parser.add_argument("--overload", action=argparse.BooleanOptionalAction, default=True,
                        help="add the overload section (memory and redis)")
    parser.add_argument("--scaling", action=argparse.BooleanOptionalAction, default=True,
                        help="add the scaling section (memory, 1 to 8 service CPUs)")
    parser.add_argument("--rlqs", action=argparse.BooleanOptionalAction, default=True,
                        help="add the RLQS section (simulated Envoys on every backend)")
    parser.add_argument("--fairness", action=argparse.BooleanOptionalAction, default=True,
                        help="add the fairness section (a light caller beside a heavy one)")
    parser.add_argument("--candidates", action=argparse.BooleanOptionalAction, default=True,
                        help="add the candidate-rule section (memory and redis)")
    parser.add_argument("--cold-spikes", action=argparse.BooleanOptionalAction, default=True,
                        help="add the cold-replica spike section (redis)")
    parser.add_argument("--overload-cpu-share", type=float, metavar="SHARE",
                        help="cap floodgate at this share of one CPU in the overload runs "
                        "(e.g. 0.25, as a Kubernetes CPU limit; default: no cap)")
    args = parser.parse_args()
    if args.overload_cpu_share is not None and not 0.001 <= args.overload_cpu_share <= 1:
        parser.error("--overload-cpu-share must be between 0.001 and 1")
    matrix = QUICK if args.quick else FULL
    seconds = args.seconds or (3 if args.quick else 10)
    if not 1 <= seconds <= 60:
        parser.error("--seconds must be between 1 and 60")
    rules = os.path.join(os.path.dirname(__file__), "..", "bench-rules")
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    pins = pinning()
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit,
            "machine": machine(), "seconds": seconds, "pinning": pins}
    harness = Harness("bench-report")
    results, ceilings, overloads, colds, spikes, scale = [], {}, {}, [], [], []
    fair, rlqs_runs, cands = None, None, None
    started = time.monotonic()
    try:
        for backend in filter(None, args.backends.split(",")):
            masters, urls, cluster = [], [], None
            if backend == "redis":
                node = RedisNode(harness)
                masters, urls = [node], [node.url]
            elif backend == "redis-cluster":
                cluster = RedisCluster(harness, masters=3)
                masters, urls = cluster.masters(), cluster.urls()
            elif backend != "memory":
                parser.error(f"unknown backend {backend}")
            # floodgate on one CPU, the generator and Redis on the other(s): left to the
            # scheduler, the three moved between the cores from run to run, and floodgate's
            # CPU per decision on Redis moved by half (11.9 against 19.7 us at 64 in flight).
            generator_cpus = pins and pins[1]
            pin_redis(masters, generator_cpus)
            floodgate = Floodgate(harness, args.binary, rules, backend, urls,
                                  prefix=pinned(pins and pins[0], []))
            run_bench(harness, args.binary, floodgate.target, ["--concurrency", "16"], 1,
                      name=f"warmup-{backend}", prefix=pinned(generator_cpus, []))
            for in_flight in matrix["in_flight"]:
                for keys in matrix["keys"]:
                    for descriptors in matrix["descriptors"]:
                        run = {"backend": backend, "in_flight": in_flight, "keys": keys,
                               "descriptors": descriptors}
                        result = measure(args.binary, floodgate, masters, run, seconds, harness,
                                         generator_cpus)
                        log(json.dumps({k: result[k] for k in (
                            "backend", "in_flight", "keys", "descriptors", "decisions_per_s",
                            "floodgate_cpu_us_per_decision", "redis_cpu_us_per_decision")}))
                        results.append(result)
            if backend != "memory":
                colds.append(cold_start(args.binary, harness, rules, backend, masters, urls,
                                        pins))
                log(f"cold start {backend}: {json.dumps(colds[-1])}")
            if args.overload and backend in OVERLOAD_BACKENDS:
                share = args.overload_cpu_share
                quota = share and cpu_limited(floodgate.proc.pid, share)
                meta["overload_cpu_share"] = share if quota else None
                try:
                    overloads[backend] = overload(args.binary, floodgate, harness, seconds,
                                                  generator_cpus)
                finally:
                    uncapped(quota, floodgate.proc.pid)
                log(f"overload {backend}: {json.dumps(overloads[backend][1])}")
            if args.cold_spikes and backend in COLD_SPIKE_BACKENDS:
                spikes += cold_spikes(args.binary, harness, rules, backend, urls, pins,
                                      seconds)
            if masters:
                # On a cluster, MONITOR on one master sees only its slots: enough calls
                # are made (capture_script_call) that some land there.
                call = capture_script_call(masters[0].port, args.binary, floodgate.target)
                ceilings[backend] = replay(call, masters[0].port, cluster is not None,
                                           50_000 if args.quick else 300_000)
                log(f"Redis ceiling {backend}: {ceilings[backend]}")
            floodgate.stop()
            harness.kill_all()
        if args.rlqs:
            rlqs_runs = rlqs(args.binary, harness, rules, pins)
        if args.fairness:
            fair = fairness(args.binary, harness, rules, seconds, pins)
        if args.candidates:
            cands = candidates(args.binary, harness, rules, seconds, pins)
        if args.scaling:
            scale = scaling(args.binary, harness, rules, seconds)
        raw = os.path.splitext(args.out)[0] + ".jsonl"
        with open(raw, "w") as f:
            for result in results:
                f.write(json.dumps(result) + "\n")
        with open(raw, "a") as f:
            for backend, (rows, ratios) in overloads.items():
                for row in rows:
                    f.write(json.dumps({"backend": backend, "overload": row}) + "\n")
                f.write(json.dumps({"backend": backend, "overload_ratios": ratios}) + "\n")
            for cold in colds:
                f.write(json.dumps({"cold_start": cold}) + "\n")
            for spike in spikes:
                f.write(json.dumps({"cold_spike": spike}) + "\n")
            for row in scale:
                f.write(json.dumps({"scaling": row}) + "\n")
            if fair:
                f.write(json.dumps({"fairness": fair}) + "\n")
            if rlqs_runs:
                f.write(json.dumps({"rlqs": rlqs_runs}) + "\n")
            for row in cands or ():
                f.write(json.dumps({"candidates": row}) + "\n")
        write_report(args.out, meta, results, ceilings, args.argv, overloads, colds, spikes,
                     scale, fair, rlqs_runs, cands)
        log(f"wrote {args.out} and {raw} in {time.monotonic() - started:.0f}s")
    finally:
        harness.close()


if __name__ == "__main__":
    main()
