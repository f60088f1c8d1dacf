//! `floodgate bench` end to end against an in-process server: a few hundred calls in closed
//! and open loop, with over-limit traffic and per-key records checked against the limits.

use crate::common;

use std::ffi::OsString;
use std::time::Duration;

use clap::Parser;
use common::TestServer;
use floodgate::bench::{self, BenchArgs};
use floodgate::cli::{Cli, Command, with_default_command};

const RULES: &str = "
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: tiny
    rate_limit: {unit: hour, requests_per_unit: 1}
";

fn bench_args(server: &TestServer, extra: &[&str]) -> BenchArgs {
    let target = server.grpc.to_string();
    let argv = ["floodgate", "bench", "--quiet", "--target", &target]
        .into_iter()
        .chain(extra.iter().copied())
        .map(OsString::from);
    match Cli::try_parse_from(with_default_command(argv)).map(Cli::into_command) {
        Ok(Command::Bench(args)) => args,
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_counts_every_call_and_outcome() {
    common::away_from_an_hour_boundary().await;
    let server = TestServer::start(&[("bench.yaml", RULES)]).await;
    let args = bench_args(
        &server,
        &[
            "--count",
            "400",
            "--duration",
            "60s",
            "--concurrency",
            "8",
            "--keys",
            "1000",
            "--descriptors",
            "2",
            "--over-limit-share",
            "0.2",
        ],
    );
    let summary = bench::run(&args).await.expect("bench runs");
    assert_eq!(summary.requests, 400);
    assert_eq!(summary.errors, 0, "{summary:?}");
    assert_eq!(summary.ok + summary.over_limit, 400);
    // The tiny bucket admits its first call only; 1000 keys of 20/minute never fill.
    let hot_calls = summary.over_limit + 1;
    assert!((40..=130).contains(&hot_calls), "{summary:?}");
    assert_eq!(summary.decisions, 2 * (400 - hot_calls) + hot_calls);
    let latency = &summary.latency_us;
    assert!(
        latency.p50 <= latency.p99 && latency.p99 <= latency.p99_9 && latency.p99_9 <= latency.max
    );
    assert!(latency.p50 > 0);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_records_admitted_counts_within_the_limits() {
    let server = TestServer::start(&[("bench.yaml", RULES)]).await;
    let record = tempfile::NamedTempFile::new().expect("temp file");
    let path = record.path().to_str().expect("utf-8 path").to_owned();
    let config = server
        .config_dir
        .path()
        .to_str()
        .expect("utf-8 path")
        .to_owned();
    let args = bench_args(
        &server,
        &[
            "--rate",
            "2000/s",
            "--count",
            "300",
            "--duration",
            "60s",
            "--keys",
            "5",
            "--record",
            &path,
            "--record-config",
            &config,
        ],
    );
    let summary = bench::run(&args).await.expect("bench runs");
    assert_eq!(summary.requests, 300);
    assert_eq!(summary.errors, 0, "{summary:?}");
    assert!(matches!(summary.mode, bench::Mode::Open { .. }));
    // 5 keys of 20 per minute: at most 100 admitted, or 200 if the run crossed a minute.
    assert!((100..=200).contains(&summary.ok), "{summary:?}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("record written"))
            .expect("record is JSON");
    assert_eq!(json["window_secs"], 60);
    let keys = json["keys"].as_array().expect("keys");
    assert_eq!(keys.len(), 5);
    let mut recorded_ok = 0;
    for key in keys {
        let redis_key = key["redis_key"].as_str().expect("bucket key resolved");
        assert!(
            redis_key.starts_with("fg:{") && redis_key.ends_with('}'),
            "{redis_key}"
        );
        let mut per_window = std::collections::BTreeMap::<String, u64>::new();
        for field in ["ok", "ok_ambiguous"] {
            if let Some(counts) = key[field].as_object() {
                for (window, count) in counts {
                    *per_window.entry(window.clone()).or_default() += count.as_u64().unwrap();
                }
            }
        }
        for (window, count) in &per_window {
            assert!(*count <= 20 * 2, "key {key} window {window}: {count}");
            recorded_ok += count;
        }
        if let Some(counts) = key["ok"].as_object() {
            for count in counts.values() {
                assert!(count.as_u64().unwrap() <= 20, "{key}");
            }
        }
    }
    assert_eq!(recorded_ok, summary.ok);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_target_is_an_error_not_a_hang() {
    let server = TestServer::start(&[("bench.yaml", RULES)]).await;
    let args = bench_args(&server, &["--count", "10"]);
    server.stop().await;
    let error = bench::run(&args).await.expect_err("nothing listens");
    assert!(
        matches!(error, bench::BenchError::Connect { .. }),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_go_on_over_a_new_connection_after_the_service_restarts() {
    let first = TestServer::start(&[("bench.yaml", RULES)]).await;
    let address = first.grpc;
    let args = bench_args(
        &first,
        &[
            "--duration",
            "4s",
            "--concurrency",
            "4",
            "--rate",
            "200/s",
            "--keys",
            "1000",
            "--timeout",
            "200ms",
        ],
    );
    let run = tokio::spawn(async move { bench::run(&args).await });
    tokio::time::sleep(Duration::from_millis(800)).await;
    first.stop().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let second = TestServer::start_with(&[("bench.yaml", RULES)], |settings| {
        settings.grpc_addr = address.to_string();
    })
    .await;
    let summary = run.await.expect("bench task").expect("bench runs");
    assert!(summary.errors > 0, "calls failed while down: {summary:?}");
    let served = common::sample(
        &common::scrape(second.http).await,
        "floodgate_request_latency_seconds_count",
    );
    assert!(
        served.is_some_and(|served| served >= 100.0),
        "the restarted service answered {served:?} calls: {summary:?}"
    );
    second.stop().await;
}

/// An open-loop run at far more calls a second than one caller can make: `rate` and
/// `concurrency` fixed, the rest from `extra`.
async fn one_caller_outpaced(server: &TestServer, extra: &[&str]) -> bench::Summary {
    let mut flags = vec![
        "--count",
        "2000",
        "--duration",
        "60s",
        "--concurrency",
        "1",
        "--rate",
        "100000/s",
        "--keys",
        "1000",
    ];
    flags.extend_from_slice(extra);
    bench::run(&bench_args(server, &flags))
        .await
        .expect("bench runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_due_while_every_caller_is_busy_fails_at_once_when_asked() {
    common::away_from_an_hour_boundary().await;
    let server = TestServer::start(&[("bench.yaml", RULES)]).await;
    // One caller cannot make a call every 10 us: most calls are due while it is busy.
    let failing = one_caller_outpaced(&server, &["--fail-when-busy"]).await;
    let overflow = failing.errors_by_code.get("Overflow").copied().unwrap_or(0);
    assert!(overflow > 1000, "{failing:?}");
    assert_eq!(failing.requests, 2000);
    assert_eq!(
        failing.errors, overflow,
        "only unsent calls fail: {failing:?}"
    );
    // A call sent is never late by the backlog: its latency is its own round trip.
    assert!(failing.latency_us.max < 1_000_000, "{failing:?}");
    // Without the flag the same calls wait for the caller and are all sent, late (a debug
    // build takes about a second for them all, so the deadline is far off).
    let queued = one_caller_outpaced(&server, &["--timeout", "60s"]).await;
    assert_eq!(queued.errors, 0, "{queued:?}");
    assert_eq!(queued.ok, 2000);
    assert!(
        queued.latency_us.max > failing.latency_us.p50,
        "queued calls count their wait: {queued:?}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_deadline_passed_before_it_could_start_is_not_sent() {
    common::away_from_an_hour_boundary().await;
    let server = TestServer::start(&[("bench.yaml", RULES)]).await;
    let summary = one_caller_outpaced(&server, &["--timeout", "2ms"]).await;
    let expired = summary
        .errors_by_code
        .get("ExpiredUnsent")
        .copied()
        .unwrap_or(0);
    assert!(expired > 1000, "{summary:?}");
    let served = common::sample(
        &common::scrape(server.http).await,
        "floodgate_request_latency_seconds_count",
    )
    .unwrap_or(0.0);
    assert!(
        served <= (2000 - expired) as f64,
        "the service saw {served} calls of {} sent: {summary:?}",
        2000 - expired
    );
    server.stop().await;
}
