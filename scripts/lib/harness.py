"""Processes for scripts/bench-report.sh and scripts/soak.sh: redis-server nodes, Redis
Clusters, floodgate replicas and `floodgate bench` runs, all on 127.0.0.1.

Every process started here is registered by pid and killed by `Harness.close()` (called
from `finally` and from SIGINT/SIGTERM handlers), so an interrupted script leaves nothing
running. Every wait polls a condition with a bound, as tests/it/common/redis.rs does.
"""

import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

LOOPBACK = "127.0.0.1"


def log(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def wait_until(what, limit, ready, poll=0.05):
    """Polls `ready()` until it is true or `limit` seconds pass (then raises)."""
    end = time.monotonic() + limit
    while True:
        if ready():
            return
        if time.monotonic() > end:
            raise RuntimeError(f"timed out after {limit}s waiting for {what}")
        time.sleep(poll)


def port_free(port):
    with socket.socket() as s:
        try:
            s.bind((LOOPBACK, port))
            return True
        except OSError:
            return False


_used_ports = set()


def free_port(bus=False):
    """A free loopback port; with `bus`, port + 10000 is free as well (cluster bus)."""
    for _ in range(10_000):
        port = random.randint(20_000, 29_999)
        if port in _used_ports:
            continue
        if port_free(port) and (not bus or port_free(port + 10_000)):
            _used_ports.add(port)
            return port
    raise RuntimeError("no free loopback port in 20000..30000")


def resp(port, *args, timeout=2.0):
    """Sends one command over RESP and returns the reply decoded (str, int, list, None);
    error replies raise RuntimeError. Independent of redis-cli for speed."""
    with socket.create_connection((LOOPBACK, port), timeout=timeout) as conn:
        conn.sendall(encode_command(args))
        reader = conn.makefile("rb")
        return read_reply(reader)


def encode_command(args):
    """One command in RESP: each argument as bytes (str and numbers are encoded)."""
    payload = b"*%d\r\n" % len(args)
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        payload += b"$%d\r\n%s\r\n" % (len(data), data)
    return payload


def read_reply(reader):
    """The next RESP reply from `reader` (a binary file), decoded as `resp` returns it."""
    line = reader.readline()
    if not line:
        raise RuntimeError("connection closed")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise RuntimeError(rest.decode())
    if kind == b":":
        return int(rest)
    if kind == b"$":
        size = int(rest)
        if size < 0:
            return None
        data = reader.read(size + 2)[:-2]
        return data.decode(errors="replace")
    if kind == b"*":
        size = int(rest)
        return None if size < 0 else [read_reply(reader) for _ in range(size)]
    raise RuntimeError(f"unexpected reply {line!r}")


def info(port, section):
    """`INFO section` as a dict of strings."""
    fields = {}
    for line in resp(port, "INFO", section).splitlines():
        if ":" in line and not line.startswith("#"):
            key, value = line.split(":", 1)
            fields[key] = value.strip()
    return fields


def redis_cpu_seconds(port):
    cpu = info(port, "cpu")
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])


def redis_command_calls(port):
    """Calls per command (`INFO commandstats`), without INFO itself (our own probe)."""
    calls = {}
    for key, value in info(port, "commandstats").items():
        name = key.removeprefix("cmdstat_")
        if name == "info":
            continue
        fields = dict(part.split("=", 1) for part in value.split(","))
        calls[name] = int(fields["calls"])
    return calls


def process_cpu_seconds(pid):
    """utime + stime of a process, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2 :].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def process_rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return None


class Harness:
    """Owns every process the script starts; `close()` kills them all by pid."""

    def __init__(self, name):
        self.dir = tempfile.mkdtemp(prefix=f"floodgate-{name}-")
        self.procs = []
        self._closed = False
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, _frame):
        log(f"signal {signum}: stopping every started process")
        self.close()
        sys.exit(128 + signum)

    def spawn(self, args, name, stdout=None, **kwargs):
        """Starts `args` with stderr (and stdout unless given) appended to `<dir>/<name>.log`."""
        logfile = open(os.path.join(self.dir, f"{name}.log"), "ab")
        proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=stdout or logfile, stderr=logfile, **kwargs
        )
        logfile.close()
        self.procs.append(proc)
        return proc

    def kill(self, proc):
        """SIGKILLs one started process (resuming it first if stopped) and reaps it."""
        if proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGCONT)
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            log(f"pid {proc.pid} did not exit after SIGKILL")

    def kill_all(self):
        """Kills every process started so far (between phases that each start their own)."""
        for proc in reversed(self.procs):
            self.kill(proc)
        self.procs.clear()

    def close(self):
        if self._closed:
            return
        self._closed = True
        for proc in reversed(self.procs):
            self.kill(proc)


class RedisNode:
    """One redis-server on a free loopback port, in its own directory."""

    def __init__(self, harness, cluster=False, extra=()):
        self.harness = harness
        self.port = free_port(bus=cluster)
        self.dir = os.path.join(harness.dir, f"redis-{self.port}")
        os.makedirs(self.dir, exist_ok=True)
        self.args = ["redis-server", "--port", str(self.port), "--bind", LOOPBACK,
                     "--save", "", "--appendonly", "no", "--daemonize", "no",
                     "--dir", self.dir, *extra]
        if cluster:
            self.args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                          "--cluster-node-timeout", "2000",
                          # A failed shard must not stop the others (docs/reliability.md#the-chaos-soak).
                          "--cluster-require-full-coverage", "no"]
        self.proc = None
        self.start()

    def start(self):
        self.proc = self.harness.spawn(self.args, f"redis-{self.port}")
        wait_until(f"redis-server :{self.port}", 10, self.pings)

    def pings(self):
        try:
            return resp(self.port, "PING", timeout=0.5) == "PONG"
        except (OSError, RuntimeError):
            return False

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def kill(self):
        self.harness.kill(self.proc)

    def signal(self, sig):
        os.kill(self.proc.pid, sig)

    @property
    def url(self):
        return f"redis://{LOOPBACK}:{self.port}"

    @property
    def addr(self):
        return f"{LOOPBACK}:{self.port}"


class RedisCluster:
    """`masters` cluster nodes with `replicas` replicas each, formed by
    `redis-cli --cluster create`, waited on until every node says cluster_state:ok."""

    def __init__(self, harness, masters=3, replicas=0):
        self.nodes = [RedisNode(harness, cluster=True) for _ in range(masters * (1 + replicas))]
        out = subprocess.run(
            ["redis-cli", "--cluster", "create", *[n.addr for n in self.nodes],
             "--cluster-replicas", str(replicas), "--cluster-yes"],
            capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"cluster create failed: {out.stdout}{out.stderr}")
        self.wait_ok(30)
        if replicas:
            wait_until("replicas in sync", 30, lambda: all(
                info(n.port, "replication").get("role") != "slave"
                or info(n.port, "replication").get("master_link_status") == "up"
                for n in self.nodes))

    def wait_ok(self, limit):
        def ok():
            try:
                return all("cluster_state:ok" in resp(n.port, "CLUSTER", "INFO")
                           for n in self.nodes if n.running())
            except (OSError, RuntimeError):
                return False
        wait_until("cluster_state:ok", limit, ok, poll=0.2)

    def masters(self):
        out = []
        for node in self.nodes:
            try:
                if node.running() and info(node.port, "replication").get("role") == "master":
                    out.append(node)
            except (OSError, RuntimeError):
                pass
        return out

    def urls(self):
        return [n.url for n in self.nodes]

    def slot_owners(self):
        """[(first_slot, last_slot, master_port)] from CLUSTER SLOTS of a reachable node."""
        for node in self.nodes:
            try:
                if node.running():
                    return [(r[0], r[1], int(r[2][1])) for r in resp(node.port, "CLUSTER", "SLOTS")]
            except (OSError, RuntimeError):
                continue
        return []

    def keyslot(self, key):
        for node in self.nodes:
            try:
                if node.running():
                    return resp(node.port, "CLUSTER", "KEYSLOT", key)
            except (OSError, RuntimeError):
                continue
        raise RuntimeError("no cluster node answers")


class Floodgate:
    """One `floodgate serve` on free loopback ports, ready once /healthcheck says 200."""

    def __init__(self, harness, binary, config_dir, backend, urls=(), extra=(), name=None,
                 prefix=()):
        """`prefix` goes before the command (e.g. `taskset -c 0`)."""
        self.harness = harness
        self.grpc_port = free_port()
        self.http_port = free_port()
        self.name = name or f"floodgate-{self.grpc_port}"
        self.args = [*prefix, binary, "serve", "--config", config_dir, "--backend", backend,
                     "--grpc-addr", f"{LOOPBACK}:{self.grpc_port}",
                     "--http-addr", f"{LOOPBACK}:{self.http_port}",
                     "--health-grace", "0", *extra]
        if urls:
            self.args += ["--redis-url", ",".join(urls)]
        self.proc = None
        self.start()

    def start(self):
        self.proc = self.harness.spawn(self.args, self.name, env={**os.environ, "RUST_LOG": "warn"})
        wait_until(f"{self.name} ready", 30, self.ready, poll=0.1)

    def ready(self):
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; "
                               f"see {self.harness.dir}/{self.name}.log")
        try:
            with urllib.request.urlopen(
                    f"http://{LOOPBACK}:{self.http_port}/healthcheck", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def stop(self):
        """Graceful stop (SIGTERM), bounded; SIGKILL if it does not exit."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.harness.kill(self.proc)

    @property
    def target(self):
        return f"{LOOPBACK}:{self.grpc_port}"

    def metrics(self):
        with urllib.request.urlopen(f"http://{LOOPBACK}:{self.http_port}/metrics", timeout=2) as r:
            return r.read().decode()


class Bench:
    """One `floodgate bench` process; its JSON summary is read by `result()`."""

    def __init__(self, harness, binary, target, args, name="bench", prefix=()):
        self.harness = harness
        self.name = name
        self.out = os.path.join(harness.dir, f"{name}.json")
        with open(self.out, "wb") as stdout:
            self.proc = harness.spawn(
                [*prefix, binary, "bench", "--target", target, "--quiet", *args], name,
                stdout=stdout)

    def result(self, timeout):
        """Waits (bounded) and returns the summary; raises if the run failed."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.harness.kill(self.proc)
            raise RuntimeError(f"{self.name} overran {timeout}s")
        if code != 0:
            with open(os.path.join(self.harness.dir, f"{self.name}.log")) as f:
                raise RuntimeError(f"{self.name} failed ({code}): {f.read()[-2000:]}")
        with open(self.out) as f:
            return json.loads(f.read().strip().splitlines()[-1])


def run_bench(harness, binary, target, args, seconds, name="bench", prefix=()):
    """Runs one bench of at most `seconds` (its --duration) and returns its summary."""
    return Bench(harness, binary, target, ["--duration", f"{seconds}s", *args], name,
                 prefix).result(seconds + 30)
