//! The regions benchmark (docs/regions.md, BENCHMARKS.md): one budget across three regions,
//! and a replica cut off from its Redis, on this machine.
//!
//! ```text
//! cargo run --release --example regions -- --floodgate target/release/floodgate \
//!     [--minutes 5] [--phase-seconds 30] [--limit 10000] [--delay-ms 75] [--period-ms 1000]
//! ```
//!
//! **Regions.** Three regions, each a `redis-server` and one floodgate replica; each region
//! reaches the others' Redis through a proxy adding `--delay-ms` each way. One global rule of
//! `--limit` a minute (fixed window), offered twice the limit, 90/5/5 of it moving from region
//! to region every `--phase-seconds`. Region c is cut off from the others (both ways) during
//! the fourth minute. Printed per minute: what each region admitted, against the bound `L +
//! R x C`; the share of requests denied while the window still had room; and each Redis'
//! `FCALL` count (the decisions' batch function) beside the decisions of its own region: a
//! request never reaches another region's Redis.
//!
//! **Cut off.** One region, three replicas under `--failure-mode local`, one reaching Redis
//! through a proxy that is cut for the second of three minutes; twice the limit offered
//! evenly. Printed: admitted per minute.
//!
//! Everything listens on loopback ports; every process is stopped when the run ends.
#![allow(
    clippy::disallowed_methods,
    reason = "a benchmark stamps real time against separate processes"
)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use floodgate::bench::proxy::Proxy;
use parking_lot::Mutex;
use tonic::transport::Channel;

const NAMES: [&str; 3] = ["a", "b", "c"];
const WINDOW_MS: u64 = 60_000;

struct Args {
    floodgate: PathBuf,
    minutes: u64,
    phase: Duration,
    limit: u64,
    delay: Duration,
    period: Duration,
}

fn args() -> Args {
    let mut args = Args {
        floodgate: PathBuf::from("target/release/floodgate"),
        minutes: 5,
        phase: Duration::from_secs(30),
        limit: 10_000,
        delay: Duration::from_millis(75),
        period: Duration::from_secs(1),
    };
    let mut words = std::env::args().skip(1);
    while let Some(flag) = words.next() {
        let value = words
            .next()
            .unwrap_or_else(|| panic!("{flag} needs a value"));
        let number = || {
            value
                .parse::<u64>()
                .unwrap_or_else(|_| panic!("{flag}: a number"))
        };
        match flag.as_str() {
            "--floodgate" => args.floodgate = PathBuf::from(&value),
            "--minutes" => args.minutes = number(),
            "--phase-seconds" => args.phase = Duration::from_secs(number()),
            "--limit" => args.limit = number(),
            "--delay-ms" => args.delay = Duration::from_millis(number()),
            "--period-ms" => args.period = Duration::from_millis(number()),
            other => panic!("unknown flag {other}"),
        }
    }
    args
}

/// A child process killed when dropped.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("a free port")
}

fn redis_server() -> (Process, u16) {
    let port = free_port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .args(["--appendonly", "no"])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server starts");
    std::thread::sleep(Duration::from_millis(300));
    (Process(child), port)
}

/// A floodgate replica with `extra` flags on Redis at `redis_port`; its gRPC port.
fn floodgate(
    args: &Args,
    config: &std::path::Path,
    redis_port: u16,
    extra: &[String],
) -> (Process, u16) {
    let grpc = free_port();
    let child = Command::new(&args.floodgate)
        .arg("serve")
        .args(["--config", &config.display().to_string()])
        .args([
            "--backend",
            "redis",
            "--redis-url",
            &format!("redis://127.0.0.1:{redis_port}"),
        ])
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .args(["--http-addr", &format!("127.0.0.1:{}", free_port())])
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("floodgate starts");
    (Process(child), grpc)
}

async fn client(port: u16) -> RateLimitServiceClient<Channel> {
    for _ in 0..100 {
        if let Ok(client) =
            RateLimitServiceClient::connect(format!("http://127.0.0.1:{port}")).await
        {
            return client;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("floodgate on {port} never answered");
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64)
}

fn request() -> RateLimitRequest {
    RateLimitRequest {
        domain: "global".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "tenant".into(),
                value: "t".into(),
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// One answer: when (ms since the epoch), from which source, admitted or not.
type Answer = (u64, usize, bool);

/// Sends `rate(source, elapsed)` requests a second from each source to `clients[source]` until
/// `length`, open loop; returns every answer.
async fn offer(
    clients: Vec<RateLimitServiceClient<Channel>>,
    length: Duration,
    rate: impl Fn(usize, Duration) -> f64 + Send + Sync + 'static,
) -> Vec<Answer> {
    let answers = Arc::new(Mutex::new(Vec::new()));
    let rate = Arc::new(rate);
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for (source, client) in clients.into_iter().enumerate() {
        let (answers, rate) = (Arc::clone(&answers), Arc::clone(&rate));
        tasks.push(tokio::spawn(async move {
            let mut owed = 0.0;
            let mut ticks = tokio::time::interval(Duration::from_millis(10));
            while start.elapsed() < length {
                ticks.tick().await;
                owed += rate(source, start.elapsed()) / 100.0;
                while owed >= 1.0 {
                    owed -= 1.0;
                    let mut client = client.clone();
                    let answers = Arc::clone(&answers);
                    tokio::spawn(async move {
                        if let Ok(answer) = client.should_rate_limit(request()).await {
                            let ok = answer.into_inner().overall_code == Code::Ok as i32;
                            answers.lock().push((now_ms(), source, ok));
                        }
                    });
                }
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    std::mem::take(&mut *answers.lock())
}

/// Per full window: admitted per source, requests, and avoidable denials: denials of a
/// window that ended with budget left, up to what was left. The first window counts when
/// the load started with it (`aligned`).
fn windows(
    answers: &[Answer],
    sources: usize,
    limit: u64,
    aligned: bool,
) -> Vec<(u64, Vec<u64>, u64, u64)> {
    let mut sorted = answers.to_vec();
    sorted.sort_by_key(|answer| answer.0);
    let skip = u64::from(!aligned);
    let first = sorted.first().map_or(0, |a| a.0 / WINDOW_MS + skip);
    let last = sorted.last().map_or(0, |a| a.0 / WINDOW_MS);
    (first..last)
        .map(|window| {
            let mut admitted = vec![0u64; sources];
            let (mut total, mut requests) = (0, 0);
            for &(_, source, ok) in sorted.iter().filter(|a| a.0 / WINDOW_MS == window) {
                requests += 1;
                if ok {
                    admitted[source] += 1;
                    total += 1;
                }
            }
            let avoidable = (requests - total).min(limit.saturating_sub(total));
            (window, admitted, requests, avoidable)
        })
        .collect()
}

fn rules(limit: u64, scope: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("global.yaml"),
        format!(
            "domain: global\ndescriptors:\n  - key: tenant\n    rate_limit: {{unit: minute, \
             requests_per_unit: {limit}, scope: {scope}}}\n"
        ),
    )
    .expect("rules");
    dir
}

/// `INFO commandstats` calls of `command` on the Redis at `port`.
fn calls(port: u16, command: &str) -> u64 {
    let output = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "info", "commandstats"])
        .output()
        .expect("redis-cli");
    let prefix = format!("cmdstat_{command}:calls=");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// FCALL (decisions) and EVALSHA + EVAL (lease periods) on the Redis at `port`.
fn script_calls(port: u16) -> [u64; 2] {
    [
        calls(port, "fcall"),
        calls(port, "evalsha") + calls(port, "eval"),
    ]
}

async fn regions(args: &Args) {
    let config = rules(args.limit, "global");
    let redis: Vec<(Process, u16)> = (0..3).map(|_| redis_server()).collect();
    // links[i][j]: region i to region j's Redis.
    let mut links: Vec<Vec<Option<Proxy>>> = Vec::new();
    for i in 0..3 {
        let mut row = Vec::new();
        for (j, (_, port)) in redis.iter().enumerate() {
            row.push(if i == j {
                None
            } else {
                let target = ([127, 0, 0, 1], *port).into();
                Some(Proxy::start(target, args.delay).await.expect("proxy"))
            });
        }
        links.push(row);
    }
    let mut replicas = Vec::new();
    let mut clients = Vec::new();
    for i in 0..3 {
        let mut extra = vec![
            "--region".to_owned(),
            NAMES[i].to_owned(),
            "--lease-period".to_owned(),
            format!("{}ms", args.period.as_millis()),
        ];
        for (j, link) in links[i].iter().enumerate() {
            if let Some(link) = link {
                extra.push("--peer-region".to_owned());
                extra.push(format!("{}=redis://{}", NAMES[j], link.addr()));
            }
        }
        let (process, grpc) = floodgate(args, config.path(), redis[i].1, &extra);
        replicas.push(process);
        clients.push(client(grpc).await);
    }
    let before: Vec<[u64; 2]> = redis.iter().map(|(_, port)| script_calls(*port)).collect();
    let offered = 2.0 * args.limit as f64 / 60.0;
    let phase = args.phase;
    let length = Duration::from_secs(args.minutes * 60);
    let links = Arc::new(links);
    let cut = Arc::clone(&links);
    let partition = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(180)).await;
        set_partition(&cut, 2, true);
        eprintln!("region c cut off");
        tokio::time::sleep(Duration::from_secs(60)).await;
        set_partition(&cut, 2, false);
        eprintln!("region c back");
    });
    let answers = offer(clients, length, move |source, elapsed| {
        let busy = (elapsed.as_secs() / phase.as_secs().max(1)) as usize % 3;
        offered * if source == busy { 0.9 } else { 0.05 }
    })
    .await;
    partition.abort();
    let after: Vec<[u64; 2]> = redis.iter().map(|(_, port)| script_calls(*port)).collect();
    println!(
        "### One budget across regions: limit {} a minute, offered 2x, 90/5/5 moving every {} s",
        args.limit,
        phase.as_secs()
    );
    println!("window | a | b | c | total | bound | requests | avoidable denials");
    println!("---|---:|---:|---:|---:|---|---:|---:");
    let bound = args.limit + 3;
    let (mut all, mut avoidable) = (0, 0);
    for (window, admitted, requests, denied_avoidable) in windows(&answers, 3, args.limit, false) {
        let total: u64 = admitted.iter().sum();
        all += requests;
        avoidable += denied_avoidable;
        println!(
            "{window} | {} | {} | {} | {total} | {bound} {} | {requests} | {denied_avoidable}",
            admitted[0],
            admitted[1],
            admitted[2],
            if total <= bound { "ok" } else { "OVER" },
        );
    }
    println!(
        "avoidable denials (denied in a window that ended with budget left): {:.2}% of {all} requests",
        100.0 * avoidable as f64 / all.max(1) as f64
    );
    println!(
        "\nregion | decisions | FCALL on its Redis (decisions) | EVALSHA/EVAL on its Redis (lease periods, its own and the others')"
    );
    println!("---|---:|---:|---:");
    for (i, name) in NAMES.iter().enumerate() {
        let decided = answers.iter().filter(|answer| answer.1 == i).count();
        println!(
            "{name} | {decided} | {} | {}",
            after[i][0] - before[i][0],
            after[i][1] - before[i][1]
        );
    }
}

fn set_partition(links: &[Vec<Option<Proxy>>], region: usize, cut: bool) {
    for (i, row) in links.iter().enumerate() {
        for (j, link) in row.iter().enumerate() {
            if let Some(link) = link
                && (i == region || j == region)
            {
                if cut {
                    link.cut();
                } else {
                    link.heal();
                }
            }
        }
    }
}

async fn cut_off(args: &Args) {
    let config = rules(args.limit, "region");
    let (_redis, port) = redis_server();
    let proxy = Proxy::start(([127, 0, 0, 1], port).into(), Duration::ZERO)
        .await
        .expect("proxy");
    let local = ["--failure-mode".to_owned(), "local".to_owned()];
    let mut replicas = Vec::new();
    let mut clients = Vec::new();
    for i in 0..3 {
        let (process, grpc) = if i == 2 {
            let mut extra = local.to_vec();
            extra.extend([
                "--redis-url".to_owned(),
                format!("redis://{}", proxy.addr()),
            ]);
            floodgate(args, config.path(), port, &extra)
        } else {
            floodgate(args, config.path(), port, &local)
        };
        replicas.push(process);
        clients.push(client(grpc).await);
    }
    // Start at a window's start, so the cut covers the second window whole.
    let into = now_ms() % WINDOW_MS;
    tokio::time::sleep(Duration::from_millis(WINDOW_MS - into + 500)).await;
    let proxy = Arc::new(proxy);
    let cut = Arc::clone(&proxy);
    let cutting = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(60)).await;
        cut.cut();
        eprintln!("replica 3 cut off from Redis");
        tokio::time::sleep(Duration::from_secs(60)).await;
        cut.heal();
        eprintln!("replica 3 back");
    });
    let offered = 2.0 * args.limit as f64 / 60.0 / 3.0;
    let answers = offer(clients, Duration::from_secs(180), move |_, _| offered).await;
    cutting.abort();
    println!(
        "\n### A replica cut off from Redis (--failure-mode local): limit {} a minute, 3 replicas, one cut off for the second minute",
        args.limit
    );
    println!(
        "window | replica 1 | replica 2 | replica 3 (cut off in the second) | total | of the limit"
    );
    println!("---|---:|---:|---:|---:|---:");
    for (window, admitted, _, _) in windows(&answers, 3, args.limit, true) {
        let total: u64 = admitted.iter().sum();
        println!(
            "{window} | {} | {} | {} | {total} | {:.3}",
            admitted[0],
            admitted[1],
            admitted[2],
            total as f64 / args.limit as f64
        );
    }
}

#[tokio::main]
async fn main() {
    let args = args();
    regions(&args).await;
    cut_off(&args).await;
}
