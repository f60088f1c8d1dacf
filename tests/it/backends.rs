//! One scenario list, written once, run over gRPC against a server on each backend: memory,
//! a real redis-server, and a real 3-master Redis Cluster. Every backend must give the same
//! codes, remaining counts and resets.
//!
//! Scenarios use limits whose windows are long compared with the test, and resets are only
//! compared where they cannot straddle a window boundary, so the wall clock does not matter.

use crate::common;

use common::redis::{RedisCluster, RedisServer};
use common::{
    TestServer, away_from_an_hour_boundary, descriptor, redis_options, request, should_rate_limit,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::google::protobuf::UInt64Value;
use floodgate::backend::BackendSettings;
use floodgate::backend::redis::Scripting;
use std::time::Duration;

const RULES: &str = r#"
domain: conformance
descriptors:
  - key: fixed
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: tokens
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: token_bucket}
  - key: tokens_minute
    rate_limit: {unit: minute, requests_per_unit: 60, algorithm: gcra}
  - key: sliding
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: sliding_window}
  - key: log
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: sliding_log}
  - key: locked
    rate_limit: {unit: hour, requests_per_unit: 1, lockout_seconds: 900}
  - key: locked_full
    rate_limit: {unit: hour, requests_per_unit: 2, lockout_seconds: 600}
  - key: consume
    rate_limit: {unit: hour, requests_per_unit: 2, on_over_limit: consume}
  - key: zero
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: debt
    rate_limit: {unit: minute, requests_per_unit: 60, algorithm: token_bucket, on_over_limit: consume}
  - key: free
    rate_limit: {unlimited: true}
"#;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// What one call observed: overall code, then (code, remaining, reset seconds) per status.
type Observed = (i32, Vec<(i32, u32, Option<i64>)>);

fn d(key: &str, value: &str, cost: Option<u64>) -> RateLimitDescriptor {
    let mut descriptor = descriptor(&[(key, value)]);
    descriptor.hits_addend = cost.map(|value| UInt64Value { value });
    descriptor
}

/// Runs every scenario against one server and returns what each call answered.
async fn run_scenarios(server: &TestServer) -> Vec<Observed> {
    away_from_an_hour_boundary().await;
    let mut client = server.client().await;
    let mut observed = Vec::new();
    let mut call = async |descriptors: Vec<RateLimitDescriptor>| {
        let response = should_rate_limit(&mut client, request("conformance", descriptors)).await;
        let statuses = response
            .statuses
            .iter()
            .map(|s| {
                (
                    s.code,
                    s.limit_remaining,
                    s.duration_until_reset.as_ref().map(|r| r.seconds),
                )
            })
            .collect();
        (response.overall_code, statuses)
    };
    // Fixed window: count down, deny without booking, peek.
    for cost in [2, 4, 3] {
        observed.push(call(vec![d("fixed", "a", Some(cost))]).await);
    }
    observed.push(call(vec![d("fixed", "a", Some(0))]).await);
    // Token bucket, L=10/s at (nearly) one instant: the vector of docs/algorithms.md#test-vectors,
    // ten at once then denied.
    let burst = vec![d("tokens", "a", None); 11];
    observed.push(call(burst).await);
    // Token bucket, L=60/min: n=10 OK rem 50 reset 10; n=51 OVER reset 1; n=50 OK rem 0.
    for cost in [10, 51, 50] {
        observed.push(call(vec![d("tokens_minute", "a", Some(cost))]).await);
    }
    // Sliding window and sliding log: three fit, the fourth does not.
    for key in ["sliding", "log"] {
        for _ in 0..4 {
            observed.push(call(vec![d(key, "a", None)]).await);
        }
    }
    // Lockout: the second request trips it; the lock then denies even a peek.
    for cost in [1, 1, 0] {
        observed.push(call(vec![d("locked", "a", Some(cost))]).await);
    }
    // Consume books denials too.
    for cost in [1, 5, 0] {
        observed.push(call(vec![d("consume", "a", Some(cost))]).await);
    }
    // All-or-nothing: the zero-limit rule denies, so fixed/b and log/b are refunded.
    observed.push(
        call(vec![
            d("fixed", "b", Some(2)),
            d("log", "b", None),
            d("zero", "x", None),
        ])
        .await,
    );
    observed.push(
        call(vec![
            d("fixed", "b", Some(0)),
            d("log", "b", Some(0)),
            d("free", "x", None),
        ])
        .await,
    );
    // A window filled by one request, then denied: the denial starts the lock in the
    // backend (a local cache must not answer it from the full window); the lock then
    // denies, cached or not, with the lock's reset.
    for cost in [2, 1, 1] {
        observed.push(call(vec![d("locked_full", "a", Some(cost))]).await);
    }
    // Issue 46: debt has an end and every backend answers the same reset for any cost, up
    // to 2^64-1 (Redis takes signed 64-bit words; Lua's numbers are exact to 2^53). Each
    // locks the token bucket for one period (60 s), never more.
    for (value, cost) in [("a", u64::from(u32::MAX)), ("b", 1 << 53), ("c", u64::MAX)] {
        observed.push(call(vec![d("debt", value, Some(cost))]).await);
        observed.push(call(vec![d("debt", value, Some(0))]).await);
    }
    // A sliding-log cost past its limit on an empty log: denied, and never reset 0.
    observed.push(call(vec![d("log", "huge", Some(u64::MAX))]).await);
    observed
}

/// Calls whose resets do not depend on where the wall clock stands in an hour-long window:
/// the token buckets (4 to 7, 27 to 32), the lockouts (17, 25, 26) and a never-fitting
/// sliding-log cost (33).
const CLOCK_FREE_RESETS: [usize; 14] = [4, 5, 6, 7, 17, 25, 26, 27, 28, 29, 30, 31, 32, 33];

/// Drops the reset values that depend on the wall clock (they differ by a second between
/// the runs on different backends).
fn comparable(observed: &[Observed]) -> Vec<Observed> {
    observed
        .iter()
        .enumerate()
        .map(|(i, (code, statuses))| {
            let keep = CLOCK_FREE_RESETS.contains(&i);
            let statuses = statuses
                .iter()
                .map(|&(c, remaining, reset)| (c, remaining, reset.filter(|_| keep)))
                .collect();
            (*code, statuses)
        })
        .collect()
}

async fn server_on(backend: BackendSettings, local_cache_entries: usize) -> TestServer {
    TestServer::start_with(&[("conformance.yaml", RULES)], |settings| {
        settings.backend = backend;
        settings.limiter.backend_timeout = Duration::from_secs(2);
        settings.limiter.local_cache_entries = local_cache_entries;
    })
    .await
}

fn assert_expected(observed: &[Observed]) {
    let statuses = |i: usize| &observed[i].1;
    assert_eq!((observed[0].0, statuses(0)[0].1), (OK, 3), "fixed n=2");
    assert_eq!((observed[1].0, statuses(1)[0].1), (OVER, 0), "fixed n=4");
    assert_eq!((observed[2].0, statuses(2)[0].1), (OK, 0), "fixed n=3");
    assert_eq!(observed[3].0, OVER, "fixed peek");
    let burst = statuses(4);
    assert_eq!(observed[4].0, OVER);
    for (i, status) in burst.iter().take(10).enumerate() {
        assert_eq!(status.0, OK, "token {i}");
    }
    assert_eq!(burst[10].0, OVER, "11th token");
    assert_eq!(statuses(5)[0], (OK, 50, Some(10)), "tb n=10");
    assert_eq!(
        (statuses(6)[0].0, statuses(6)[0].2),
        (OVER, Some(1)),
        "tb n=51"
    );
    assert_eq!((statuses(7)[0].0, statuses(7)[0].1), (OK, 0), "tb n=50");
    for base in [8, 12] {
        let remaining: Vec<u32> = (0..3).map(|i| statuses(base + i)[0].1).collect();
        assert_eq!(remaining, vec![2, 1, 0]);
        assert_eq!(observed[base + 3].0, OVER);
    }
    assert_eq!(observed[16].0, OK, "lock: first");
    assert_eq!(
        (observed[17].0, statuses(17)[0].2),
        (OVER, Some(900)),
        "lock trips"
    );
    assert_eq!(observed[18].0, OVER, "lock denies peeks");
    assert_eq!((observed[19].0, statuses(19)[0].1), (OK, 1), "consume 1");
    assert_eq!(observed[20].0, OVER, "consume 5");
    assert_eq!(
        (observed[21].0, statuses(21)[0].1),
        (OVER, 0),
        "consume booked the denial"
    );
    assert_eq!(observed[22].0, OVER);
    assert_eq!(
        statuses(22)[0].1,
        5,
        "refunded fixed reports pre-request remaining"
    );
    assert_eq!(
        statuses(22)[1].1,
        3,
        "refunded log reports pre-request remaining"
    );
    assert_eq!(statuses(23)[0].1, 5, "fixed/b untouched");
    assert_eq!(statuses(23)[1].1, 3, "log/b untouched");
    assert_eq!(statuses(23)[2].1, u32::MAX, "unlimited");
    assert_eq!(
        (observed[24].0, statuses(24)[0].1),
        (OK, 0),
        "window filled"
    );
    assert_eq!(statuses(25)[0], (OVER, 0, Some(600)), "first denial locks");
    assert_eq!(statuses(26)[0], (OVER, 0, Some(600)), "the lock denies");
    for (i, cost) in (27..33).step_by(2).zip(["2^32-1", "2^53", "2^64-1"]) {
        assert_eq!(statuses(i)[0], (OVER, 0, Some(60)), "debt of {cost}");
        assert_eq!(statuses(i + 1)[0], (OVER, 0, Some(60)), "peek after {cost}");
    }
    assert_eq!(
        statuses(33)[0],
        (OVER, 0, Some(3600)),
        "sliding log, 2^64-1"
    );
}

/// Redis options whose keys start with `prefix`, so runs on one server stay apart.
fn options(prefix: &str, scripting: Scripting) -> floodgate::backend::RedisOptions {
    floodgate::backend::RedisOptions {
        key_prefix: prefix.to_owned(),
        scripting,
        ..redis_options(Duration::from_secs(2))
    }
}

#[tokio::test]
async fn every_backend_gives_the_same_answers_with_and_without_the_local_cache() {
    let memory = server_on(
        BackendSettings::Memory {
            max_buckets: 10_000,
        },
        0,
    )
    .await;
    let memory_observed = run_scenarios(&memory).await;
    memory.stop().await;
    assert_expected(&memory_observed);

    let redis = RedisServer::start();
    let cluster = RedisCluster::start();
    // Both ways of running the code, each with and without the cache.
    let runs = [
        (1000, Scripting::Functions),
        (0, Scripting::Functions),
        (1000, Scripting::Evalsha),
        (0, Scripting::Evalsha),
    ];
    for (cache, scripting) in runs {
        let prefix = format!("cache{cache}{scripting:?}");
        let backends = [
            (
                "redis",
                BackendSettings::Redis {
                    url: redis.url(),
                    options: options(&prefix, scripting),
                },
            ),
            (
                "cluster",
                BackendSettings::Cluster {
                    urls: cluster.urls(),
                    options: options(&prefix, scripting),
                },
            ),
        ];
        for (name, backend) in backends {
            let server = server_on(backend, cache).await;
            let observed = run_scenarios(&server).await;
            server.stop().await;
            assert_expected(&observed);
            assert_eq!(
                comparable(&observed),
                comparable(&memory_observed),
                "{name} (local cache {cache}, {scripting:?}) vs memory"
            );
        }
    }
}
