//! A second Redis for the rules whose unit is `second` (the reference's `REDIS_PERSECOND`),
//! on two real redis-servers: each rule books only in its own Redis, and a request that
//! spans both stays all-or-nothing.

use crate::common;

use std::time::Duration;

use common::redis::RedisServer;
use common::{TestServer, descriptor, eventually, http, redis_options, request};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use floodgate::backend::BackendSettings;

/// `fast` counts per second (over a one-hour window, so that no second boundary can free
/// room mid-test); `slow` counts per minute.
const RULES: &str = "domain: api
descriptors:
  - key: fast
    rate_limit: {unit: second, unit_multiplier: 3600, requests_per_unit: 1}
  - key: slow
    rate_limit: {unit: minute, unit_multiplier: 60, requests_per_unit: 10}
";

async fn server(main: &RedisServer, per_second: &RedisServer) -> TestServer {
    let redis = |server: &RedisServer| BackendSettings::Redis {
        url: server.url(),
        options: redis_options(Duration::from_millis(500)),
    };
    TestServer::start_with(&[("api.yaml", RULES)], |settings| {
        settings.backend = BackendSettings::PerSecond {
            main: Box::new(redis(main)),
            per_second: Box::new(redis(per_second)),
        };
        settings.limiter.backend_timeout = Duration::from_millis(500);
        settings.limiter.local_cache_entries = 0;
    })
    .await
}

fn keys(server: &RedisServer) -> u64 {
    server.cli(&["DBSIZE"]).parse().expect("DBSIZE")
}

async fn decide(server: &TestServer, pairs: &[(&str, &str)]) -> RateLimitResponse {
    let descriptors = pairs.iter().map(|pair| descriptor(&[*pair])).collect();
    server
        .client()
        .await
        .should_rate_limit(request("api", descriptors))
        .await
        .expect("answered")
        .into_inner()
}

#[tokio::test]
async fn each_unit_books_in_its_own_redis_and_a_rejection_spans_both() {
    common::away_from_an_hour_boundary().await;
    let (main, per_second) = (RedisServer::start(), RedisServer::start());
    let server = server(&main, &per_second).await;

    let response = decide(&server, &[("fast", "a")]).await;
    assert_eq!(response.overall_code, Code::Ok as i32);
    assert_eq!((keys(&main), keys(&per_second)), (0, 1), "per-second only");
    let response = decide(&server, &[("slow", "a")]).await;
    assert_eq!(response.overall_code, Code::Ok as i32);
    assert_eq!((keys(&main), keys(&per_second)), (1, 1), "per-minute only");

    // `fast/a` is full: the request is rejected, and `slow/a`, which had room, books nothing.
    let response = decide(&server, &[("slow", "a"), ("fast", "a")]).await;
    assert_eq!(response.overall_code, Code::OverLimit as i32);
    assert_eq!(response.statuses[1].code, Code::OverLimit as i32);
    let response = decide(&server, &[("slow", "a")]).await;
    assert_eq!(
        response.statuses[0].limit_remaining, 8,
        "two bookings of slow/a stand, not three"
    );

    // The other way round: `slow/b` cannot fit, so the per-second booking of `fast/b` is
    // refunded.
    for _ in 0..10 {
        decide(&server, &[("slow", "b")]).await;
    }
    let response = decide(&server, &[("fast", "b"), ("slow", "b")]).await;
    assert_eq!(response.overall_code, Code::OverLimit as i32);
    let response = decide(&server, &[("fast", "b")]).await;
    assert_eq!(
        response.overall_code,
        Code::Ok as i32,
        "fast/b still has room"
    );

    // Readiness covers both: the per-second Redis down makes the service NOT_SERVING.
    let mut per_second = per_second;
    per_second.stop();
    let mut status = 0;
    eventually(Duration::from_secs(5), async || {
        status = http("GET", &server.http_url("/healthcheck"), "").await.0;
        status == 503
    })
    .await;
    assert_eq!(status, 503);
    server.stop().await;
}
