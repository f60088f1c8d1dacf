"""The chaos soak behind scripts/soak.sh: see docs/reliability.md#the-chaos-soak.

A 3-master + 3-replica Redis Cluster and 3 floodgate replicas (backend redis-cluster,
--failure-mode error) take steady open-loop load from one `floodgate bench` per replica on
a set of buckets with a known limit (fixed windows, limit N per bucket), while the script
reloads the rules every 10 s and, phase by phase: SIGKILLs a master and brings it back,
SIGSTOPs another master for 5 s, restarts one floodgate replica, bursts 32x the saturating
concurrency (2,048 calls in flight, 20 ms deadline) at every replica for 30 s on other buckets,
and stops every Redis node for 10 s. Each phase runs its own bench processes, so every phase has its own figures.

Checks, written to a Markdown report:
- over-admission: OK answers summed over every replica and phase, per bucket and window,
  against the limit N (calls sent in one window and answered in the next are counted apart
  as ambiguous, since they may have been decided in either);
- errors: each failed call's bucket is mapped to its slot (CLUSTER KEYSLOT of the Redis key
  floodgate uses) and so to its master; an error is expected only on the failed shard, or
  on the restarted replica, inside the fault's window (plus a margin); any other is listed;
- p50/p99 per phase, RSS of each replica at start and end, and any process that died.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from harness import (Bench, Floodgate, Harness, RedisCluster, log,  # noqa: E402
                     process_rss_kib, resp, wait_until)

PHASES = ["steady", "master-kill", "master-stop", "replica-restart", "overload", "redis-stop"]
FULL_PHASE_SECONDS = 120
KEYS = 30
RATE_PER_REPLICA = 300
# Seconds after a fault ends (recovery seen) during which its errors are still expected:
# clients refresh the slot map and reconnect.
MARGIN = 3
# The overload burst: calls in flight per replica (32x the 64 where one node saturates),
# with Envoy's default deadline, on buckets of their own.
BURST_IN_FLIGHT = 2048
BURST_SECONDS = 30


def rules(window_s, limit, generation):
    return (f"# soak rules, generation {generation} (rewritten to trigger reloads)\n"
            "domain: soak\n"
            "descriptors:\n"
            "  - key: bucket\n"
            "    rate_limit:\n"
            "      unit: second\n"
            f"      unit_multiplier: {window_s}\n"
            f"      requests_per_unit: {limit}\n"
            "  - key: burst\n"
            "    rate_limit:\n"
            "      unit: hour\n"
            "      requests_per_unit: 1000000000\n")


class Soak:
    def __init__(self, args):
        self.args = args
        self.scale = args.scale
        self.phase_s = max(20, round(FULL_PHASE_SECONDS * self.scale))
        self.window_s = max(10, round(60 * self.scale))
        # About 60% of each bucket's traffic is admitted.
        per_key_window = 3 * RATE_PER_REPLICA * self.window_s / KEYS
        self.limit = max(1, int(per_key_window * 0.6))
        self.reload_s = max(2, round(10 * self.scale))
        self.harness = Harness("soak")
        self.events = []      # (start, end, phase, what, slots or None, replica or None)
        self.crashes = []
        self.reloads = 0
        self.generation = 0

    # --- setup -------------------------------------------------------------------------

    def start(self):
        h = self.harness
        log(f"starting a 3+3 Redis Cluster in {h.dir}")
        self.cluster = RedisCluster(h, masters=3, replicas=1)
        self.config_dirs = []
        for i in range(3):
            d = os.path.join(h.dir, f"rules-{i}")
            os.makedirs(d)
            self.config_dirs.append(d)
        self.write_rules()
        self.replicas = [
            Floodgate(h, self.args.binary, self.config_dirs[i], "redis-cluster",
                      self.cluster.urls(), ["--failure-mode", "error"], name=f"floodgate-{i}")
            for i in range(3)]
        self.rss_start = [process_rss_kib(r.proc.pid) for r in self.replicas]
        self.intentional = set()

    def write_rules(self):
        self.generation += 1
        text = rules(self.window_s, self.limit, self.generation)
        for d in self.config_dirs:
            tmp = os.path.join(d, ".soak.yaml.tmp")
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, os.path.join(d, "soak.yaml"))

    # --- faults ------------------------------------------------------------------------

    def slots_of(self, port):
        return [(lo, hi) for lo, hi, owner in self.cluster.slot_owners() if owner == port]

    def node_by_port(self, port):
        return next(n for n in self.cluster.nodes if n.port == port)

    def kill_master(self, phase):
        master = self.cluster.masters()[0]
        slots = self.slots_of(master.port)
        start = time.time()
        log(f"SIGKILL master :{master.port} (slots {slots})")
        master.kill()
        # Back once a replica has taken its slots (bounded), as an operator would.
        try:
            wait_until("failover", 30, lambda: all(
                owner != master.port for _, _, owner in self.cluster.slot_owners()), poll=0.2)
        except RuntimeError as error:
            log(str(error))
        self.cluster.wait_ok(30)
        end = time.time()
        time.sleep(2)
        master.start()
        log(f"master :{master.port} back (rejoins as a replica)")
        self.events.append((start, end, phase, f"SIGKILL master :{master.port}, restarted",
                            slots, None))
        self.killed_slots = slots

    def stop_master(self, phase):
        # Another shard than the one whose master was killed, so a second shard is tested.
        killed = getattr(self, "killed_slots", [])
        masters = [m for m in self.cluster.masters() if self.slots_of(m.port) != killed]
        master = masters[-1]
        slots = self.slots_of(master.port)
        start = time.time()
        log(f"SIGSTOP master :{master.port} for 5 s")
        master.signal(signal.SIGSTOP)
        time.sleep(5)
        master.signal(signal.SIGCONT)
        try:
            self.cluster.wait_ok(30)
        except RuntimeError as error:
            log(str(error))
        end = time.time()
        self.events.append((start, end, phase, f"SIGSTOP master :{master.port} for 5 s",
                            slots, None))

    def restart_replica(self, phase):
        replica = self.replicas[1]
        start = time.time()
        log("restarting floodgate-1")
        self.intentional.add(replica.proc.pid)
        replica.stop()
        replica.start()
        end = time.time()
        self.events.append((start, end, phase, "floodgate-1 stopped (SIGTERM) and restarted",
                            None, 1))

    def stop_redis(self, phase):
        start = time.time()
        log("SIGSTOP every Redis node for 10 s")
        nodes = [n for n in self.cluster.nodes if n.running()]
        for node in nodes:
            node.signal(signal.SIGSTOP)
        time.sleep(10)
        for node in nodes:
            node.signal(signal.SIGCONT)
        try:
            self.cluster.wait_ok(30)
        except RuntimeError as error:
            log(str(error))
        end = time.time()
        self.events.append((start, end, phase, "every Redis node stopped (SIGSTOP) for 10 s",
                            None, None))

    def overload(self, phase):
        """A burst far past capacity beside the steady load: its goodput is reported, and
        the steady calls shed meanwhile are expected errors (the failure mode answers them)."""
        seconds = max(10, min(BURST_SECONDS, round(self.phase_s / 2)))
        start = time.time()
        log(f"overload burst: {BURST_IN_FLIGHT} in flight per replica for {seconds} s")
        bursts = [Bench(self.harness, self.args.binary, r.target, [
            "--concurrency", str(BURST_IN_FLIGHT), "--connections", "4",
            "--duration", f"{seconds}s", "--domain", "soak", "--key", "burst",
            "--keys", "10000", "--timeout", "20ms"], name=f"burst-{i}")
            for i, r in enumerate(self.replicas)]
        self.bursts = [b.result(seconds + 60) for b in bursts]
        end = time.time()
        goodput = sum(b["in_time_per_s"] for b in self.bursts)
        self.events.append((start, end, phase,
                            f"burst of {BURST_IN_FLIGHT} calls in flight per replica for "
                            f"{seconds} s: {goodput:,.0f} answers/s within 20 ms", None, None))

    # --- phases ------------------------------------------------------------------------

    def run_phase(self, index, name):
        benches = [
            Bench(self.harness, self.args.binary, r.target, [
                "--rate", f"{RATE_PER_REPLICA}/s", "--concurrency", "64",
                "--duration", f"{self.phase_s}s", "--keys", str(KEYS),
                "--domain", "soak", "--key", "bucket", "--timeout", "500ms",
                "--connections", "2",
                "--record", os.path.join(self.harness.dir, f"record-{name}-{i}.json"),
                "--record-window", f"{self.window_s}s",
                "--record-config", self.config_dirs[i]], name=f"bench-{name}-{i}")
            for i, r in enumerate(self.replicas)]
        phase_start = time.time()
        fault = {"master-kill": self.kill_master, "master-stop": self.stop_master,
                 "replica-restart": self.restart_replica, "overload": self.overload,
                 "redis-stop": self.stop_redis}.get(name)
        lead_in = min(5, self.phase_s / 5)
        next_reload = phase_start + self.reload_s
        fault_at = phase_start + lead_in
        end = phase_start + self.phase_s
        while time.time() < end:
            now = time.time()
            if fault and now >= fault_at:
                fault(name)
                fault = None
            if now >= next_reload:
                self.write_rules()
                self.reloads += 1
                next_reload += self.reload_s
            self.check_processes()
            time.sleep(0.2)
        summaries = [b.result(60) for b in benches]
        records = []
        for i in range(3):
            with open(os.path.join(self.harness.dir, f"record-{name}-{i}.json")) as f:
                records.append(json.load(f))
        return {"name": name, "start": phase_start, "end": time.time(),
                "summaries": summaries, "records": records}

    def check_processes(self):
        for i, replica in enumerate(self.replicas):
            code = replica.proc.poll()
            if code is not None and replica.proc.pid not in self.intentional:
                self.crashes.append(f"floodgate-{i} (pid {replica.proc.pid}) exited with {code}")
                self.intentional.add(replica.proc.pid)
        for node in self.cluster.nodes:
            code = node.proc.poll()
            if code is not None and code != -signal.SIGKILL:
                self.crashes.append(f"redis :{node.port} exited with {code}")

    # --- analysis ----------------------------------------------------------------------

    def analyse(self, phases):
        slot_of = {}
        over = []
        windows = {}   # (redis_key, window) -> [certain, ambiguous]
        unexpected, expected = [], {}
        for phase in phases:
            for replica, record in enumerate(phase["records"]):
                for key in record["keys"]:
                    redis_key = key["redis_key"]
                    if redis_key not in slot_of:
                        slot_of[redis_key] = self.cluster.keyslot(redis_key)
                    for field, idx in (("ok", 0), ("ok_ambiguous", 1)):
                        for window, count in key.get(field, {}).items():
                            windows.setdefault((redis_key, int(window)), [0, 0])[idx] += count
                    for second, count in key.get("errors", {}).items():
                        second = int(second)
                        why = self.explain(second, slot_of[redis_key], replica)
                        if why:
                            buckets = expected.setdefault((phase["name"], why), {})
                            buckets[key["value"]] = buckets.get(key["value"], 0) + count
                        else:
                            unexpected.append((phase["name"], replica, key["value"],
                                               slot_of[redis_key], second, count))
        for (redis_key, window), (certain, ambiguous) in sorted(windows.items()):
            if certain > self.limit:
                over.append((redis_key, window, certain, ambiguous))
        return windows, over, expected, unexpected

    def explain(self, second, slot, replica):
        for start, end, _phase, what, slots, only_replica in self.events:
            if not (start - 1 <= second <= end + MARGIN):
                continue
            if only_replica is not None and only_replica != replica:
                continue
            if slots is not None and not any(lo <= slot <= hi for lo, hi in slots):
                continue
            return what
        return None

    def report(self, phases, path):
        windows, over, expected, unexpected = self.analyse(phases)
        rss_end = [process_rss_kib(r.proc.pid) if r.proc.poll() is None else None
                   for r in self.replicas]
        commit = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                                text=True).stdout.strip() or "unknown"
        lines = [
            "# Chaos soak report", "",
            "Generated by `scripts/soak.sh` (do not edit by hand; re-run it).", "",
            f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(phases[0]['start']))}",
            f"- Commit: `{commit}`",
            f"- Command: `{self.args.argv}`; scale {self.scale}: {len(phases)} phases of "
            f"{self.phase_s} s",
            f"- Setup: Redis Cluster of 3 masters + 3 replicas (node timeout 2 s), 3 floodgate "
            f"replicas (`--backend redis-cluster --failure-mode error`), each loaded by its own "
            f"`floodgate bench --rate {RATE_PER_REPLICA}/s` on {KEYS} buckets of one fixed-window "
            f"rule: limit {self.limit} per {self.window_s} s window; rules rewritten every "
            f"{self.reload_s} s ({self.reloads} reloads).",
            "", "## Phases", "",
            "| phase | fault | requests | OK | OVER_LIMIT | errors | expected errors "
            "| p50 us (worst replica) | p99 us (worst replica) |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        for phase in phases:
            s = phase["summaries"]
            faults = "; ".join(e[3] for e in self.events if e[2] == phase["name"]) or "-"
            errors = sum(x["errors"] for x in s)
            unexpected_here = sum(u[5] for u in unexpected if u[0] == phase["name"])
            lines.append(
                f"| {phase['name']} | {faults} | {sum(x['requests'] for x in s):,} "
                f"| {sum(x['ok'] for x in s):,} | {sum(x['over_limit'] for x in s):,} "
                f"| {errors:,} | {errors - unexpected_here:,} "
                f"| {max(x['latency_us']['p50'] for x in s)} "
                f"| {max(x['latency_us']['p99'] for x in s)} |")
        for burst in getattr(self, "bursts", []):
            codes = ", ".join(f"{k} {v:,}" for k, v in sorted(burst["errors_by_code"].items()))
            lines.append("")
            lines.append(f"Overload burst on one replica: {burst['in_time_per_s']:,.0f} answers/s "
                         f"within the 20 ms deadline, p99 of answers "
                         f"{burst['answered_latency_us']['p99']} us; failed calls: {codes or 'none'}.")
        lines += ["", "## Errors", ""]
        for (phase, why), buckets in sorted(expected.items()):
            lines.append(f"- {phase}: {sum(buckets.values())} errors on buckets "
                         f"{', '.join(sorted(buckets, key=int))}, explained by: {why}")
        if unexpected:
            lines.append(f"- **{sum(u[5] for u in unexpected)} unexpected errors** "
                         "(outside every fault's shard or window):")
            for phase in PHASES:
                mine = [u for u in unexpected if u[0] == phase]
                if not mine:
                    continue
                seconds = [u[4] for u in mine]
                buckets = sorted({u[2] for u in mine}, key=int)
                lines.append(
                    f"  - {phase}: {sum(u[5] for u in mine)} errors on floodgate-"
                    f"{', floodgate-'.join(str(r) for r in sorted({u[1] for u in mine}))}, "
                    f"{len(buckets)} buckets ({', '.join(buckets)}), between {time.strftime('%H:%M:%S', time.gmtime(min(seconds)))} and "
                    f"{time.strftime('%H:%M:%S', time.gmtime(max(seconds)))}")
            lines.append("  Fault windows: " + "; ".join(
                f"{e[3]} from {time.strftime('%H:%M:%S', time.gmtime(e[0]))} to "
                f"{time.strftime('%H:%M:%S', time.gmtime(e[1]))}, slots "
                f"{e[4] if e[4] is not None else 'all'}" for e in self.events))
        else:
            lines.append("- No unexpected errors: every error was on the failed shard (or the "
                         "restarted replica) inside its fault window.")
        lines += ["", "## Over-admission", "",
                  f"{len(windows)} (bucket, window) pairs checked; OK answers summed over the 3 "
                  f"replicas against the limit {self.limit}."]
        if over:
            lines.append(f"**{len(over)} over-admitted windows:**")
            lines.append("")
            lines.append("| bucket key | window start | OK (certain) | OK (ambiguous) | over by |")
            lines.append("|---|---|---:|---:|---:|")
            for redis_key, window, certain, ambiguous in over:
                lines.append(f"| `{redis_key}` | {time.strftime('%H:%M:%S', time.gmtime(window))} "
                             f"| {certain} | {ambiguous} | {certain - self.limit} |")
        else:
            worst = max((c for c, _ in windows.values()), default=0)
            lines.append(f"Over-admission: **0** (highest certain count in a window: {worst}; "
                         f"calls straddling a window boundary: "
                         f"{sum(a for _, a in windows.values())}).")
        lines += ["", "## Processes", "", "| replica | RSS at start (KiB) | RSS at end (KiB) |",
                  "|---|---:|---:|"]
        for i in range(3):
            note = " (restarted)" if i == 1 else ""
            lines.append(f"| floodgate-{i}{note} | {self.rss_start[i]} | {rss_end[i]} |")
        lines += ["", "Crashes: " + ("; ".join(self.crashes) if self.crashes else "none."), ""]
        with open(path, "w") as f:
            f.write("\n".join(lines))
        return not over and not unexpected and not self.crashes


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True)
    parser.add_argument("--scale", type=float, default=1.0,
                        help="timeline scale: 1 = 12 minutes, 0.2 = about 2.5")
    parser.add_argument("--out", default="SOAK.md")
    parser.add_argument("--argv", default="scripts/soak.sh")
    args = parser.parse_args()
    if not 0.05 <= args.scale <= 1.0:
        parser.error("--scale must be between 0.05 and 1")
    soak = Soak(args)
    try:
        soak.start()
        phases = []
        for index, name in enumerate(PHASES):
            log(f"phase {name}: {soak.phase_s} s")
            phases.append(soak.run_phase(index, name))
        ok = soak.report(phases, args.out)
        log(f"wrote {args.out}: {'PASS' if ok else 'FINDINGS (see the report)'}")
        if not os.environ.get("SOAK_KEEP_LOGS"):
            shutil.rmtree(soak.harness.dir, ignore_errors=True)
        return 0 if ok else 1
    finally:
        soak.harness.close()


if __name__ == "__main__":
    sys.exit(main())
