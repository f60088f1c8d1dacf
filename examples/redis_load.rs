//! Load test of `RedisBackend::charge` against a local `redis-server`, next to
//! `redis-benchmark` running the same EVALSHA pipelined (docs/operations.md#performance-targets:
//! the backend should reach at least 60% of it, with p99 <= 1 ms at 16 in flight).
//!
//! ```text
//! cargo run --release --example redis_load -- [--requests N] [--seconds S] [--keys K] [--pool P]
//! ```
//!
//! It starts its own `redis-server` on a free loopback port (nothing else is ever a target),
//! then for 16 and 64 concurrent tasks sends single-descriptor charges on K random buckets
//! until N decisions or S seconds, whichever comes first, and prints decisions/s and latency
//! percentiles, alternating with `redis-benchmark -P 16 -n 200000` running the same script
//! and arguments; it ends with the medians and their ratio.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use floodgate::backend::redis::scripts::ScriptSet;
use floodgate::backend::{Backend, BucketKey, Charge, RedisBackend, RedisOptions};
use floodgate::rules::{Algorithm, Policy, Unit};
use tokio::time::Instant;

/// Alternating rounds of redis-benchmark and both concurrency levels.
const ROUNDS: usize = 3;

struct Args {
    pool: u32,
    requests: u64,
    seconds: u64,
    keys: u64,
}

fn args() -> Args {
    let mut args = Args {
        pool: floodgate::backend::redis::DEFAULT_POOL_SIZE,
        requests: 200_000,
        seconds: 20,
        keys: 10_000,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().and_then(|v| v.parse().ok());
        match (flag.as_str(), value) {
            ("--requests", Some(v)) => args.requests = v,
            ("--seconds", Some(v)) => args.seconds = v,
            ("--keys", Some(v)) => args.keys = v.max(1),
            ("--pool", Some(v)) => args.pool = (v as u32).max(1),
            _ => {
                eprintln!("usage: redis_load [--requests N] [--seconds S] [--keys K] [--pool P]");
                std::process::exit(2);
            }
        }
    }
    args
}

/// A `redis-server` on a free loopback port, killed on drop.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start() -> Server {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server must be installed");
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Server { child, port }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A tiny deterministic generator (xorshift), so runs are comparable.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    f64::from(sorted[i]) / 1000.0
}

/// One measured run; returns decisions/s.
async fn run(
    backend: Arc<RedisBackend>,
    charges: Arc<Vec<Charge>>,
    tasks: u64,
    args: &Args,
) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let per_task = args.requests / tasks;
    let started = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let (backend, charges) = (backend.clone(), charges.clone());
            tokio::spawn(async move {
                let mut rng = 0x9E37_79B9_7F4A_7C15 ^ (task + 1);
                let mut latencies = Vec::with_capacity(per_task as usize);
                let mut errors = 0u64;
                for _ in 0..per_task {
                    if Instant::now() >= deadline {
                        break;
                    }
                    let charge = &charges[(next(&mut rng) % charges.len() as u64) as usize];
                    let sent = Instant::now();
                    if backend.charge(std::slice::from_ref(charge)).await.is_err() {
                        errors += 1;
                    }
                    latencies.push(sent.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
                }
                (latencies, errors)
            })
        })
        .collect();
    let mut latencies = Vec::new();
    let mut errors = 0;
    for handle in handles {
        let (l, e) = handle.await.expect("task");
        latencies.extend(l);
        errors += e;
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let rate = latencies.len() as f64 / elapsed;
    println!(
        "  RedisBackend::charge, {tasks:>2} in flight: {rate:>8.0} decisions/s \
         ({} in {elapsed:.1} s, {errors} errors), p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        latencies.len(),
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        percentile(&latencies, 1.0),
    );
    rate
}

/// `redis-benchmark` with the same script and ARGV: 50 connections, 16 pipelined each.
/// Returns requests/s.
fn redis_benchmark(port: u16, keys: u64) -> f64 {
    let sha = ScriptSet::new()
        .get(Algorithm::FixedWindow)
        .get_hash()
        .to_owned();
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-n", "200000", "-P", "16", "-r", &keys.to_string(), "--csv"])
        .args(["EVALSHA", &sha, "1", "fg:{__rand_int__}"])
        .args(["charge", "1", "1000", "1000000", "1000000", "0", "0", "0"])
        .output()
        .expect("redis-benchmark must be installed");
    // CSV: a header line, then "test","rps","avg","min","p50","p95","p99","max".
    let text = String::from_utf8_lossy(&out.stdout);
    let row = text.lines().nth(1).unwrap_or_default().replace('"', "");
    let fields: Vec<&str> = row.split(',').collect();
    let rps: f64 = fields.get(1).and_then(|f| f.parse().ok()).unwrap_or(0.0);
    println!(
        "  redis-benchmark -P 16 -n 200000 EVALSHA:  {rps:>8.0} requests/s (p50 {} ms, p99 {} ms)",
        fields.get(4).unwrap_or(&"?"),
        fields.get(6).unwrap_or(&"?"),
    );
    rps
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[tokio::main]
async fn main() {
    let args = args();
    let server = Server::start();
    let url = format!("redis://127.0.0.1:{}", server.port);
    let backend = Arc::new(
        RedisBackend::connect(
            &url,
            RedisOptions {
                pool_size: args.pool,
                ..RedisOptions::default()
            },
        )
        .await
        .expect("connect"),
    );
    let policy = Policy {
        algorithm: Algorithm::FixedWindow,
        ..Policy::fixed_window(1_000_000, Unit::Second)
    };
    let charges: Arc<Vec<Charge>> = Arc::new(
        (0..args.keys)
            .map(|i| Charge {
                bucket: BucketKey::new(
                    "bench",
                    "user",
                    [("user", i.to_string().as_str())],
                    &policy,
                ),
                policy,
                cost: 1,
                spread_ms: 0,
            })
            .collect(),
    );
    // Warm up: connections open, script cached.
    for charge in charges.iter().take(1000) {
        backend
            .charge(std::slice::from_ref(charge))
            .await
            .expect("warm-up");
    }
    // The machine is shared: alternate the two sides and compare medians.
    let (mut reference, mut at16, mut at64) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=ROUNDS {
        println!("round {round}/{ROUNDS}");
        reference.push(redis_benchmark(server.port, args.keys));
        at16.push(run(backend.clone(), charges.clone(), 16, &args).await);
        at64.push(run(backend.clone(), charges.clone(), 64, &args).await);
    }
    let reference = median(reference);
    for (tasks, rates) in [(16, at16), (64, at64)] {
        let rate = median(rates);
        println!(
            "median: {tasks} in flight {rate:.0} decisions/s = {:.0}% of redis-benchmark's {reference:.0}",
            100.0 * rate / reference
        );
    }
    drop(server);
}
