//! The service on a real redis-server: startup while Redis is down, outage and recovery with
//! health flipping, each failure mode, the local over-limit cache, and a graceful shutdown
//! with calls still waiting on Redis.

use crate::common;

use std::time::Duration;

use common::redis::RedisServer;
use common::{
    TestServer, descriptor, eventually, http, redis_options, request, sample, scrape,
    should_rate_limit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use floodgate::backend::BackendSettings;
use floodgate::limiter::FailureMode;

const RULES: &str = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";

async fn server(redis: &RedisServer, mode: FailureMode) -> TestServer {
    TestServer::start_with(&[("api.yaml", RULES)], |settings| {
        settings.backend = BackendSettings::Redis {
            url: redis.url(),
            options: floodgate::backend::RedisOptions {
                // Each mode in keys of its own: the local one alone in its registry.
                key_prefix: mode.as_str().to_owned(),
                ..redis_options(Duration::from_millis(300))
            },
        };
        settings.limiter.backend_timeout = Duration::from_millis(300);
        settings.limiter.failure_mode = mode;
        settings.limiter.local_cache_entries = 1000;
    })
    .await
}

/// Polls `/healthcheck` until it answers `status` (bounded).
async fn wait_health(server: &TestServer, status: u16) {
    let url = server.http_url("/healthcheck");
    let answered = eventually(Duration::from_secs(10), async || {
        http("GET", &url, "").await.0 == status
    })
    .await;
    assert!(answered, "/healthcheck never answered {status}");
}

#[tokio::test]
async fn starts_without_redis_and_serves_once_it_appears() {
    let mut redis = RedisServer::start();
    redis.stop();
    let server = server(&redis, FailureMode::Error).await;
    wait_health(&server, 503).await;
    let mut client = server.client().await;
    let error = client
        .should_rate_limit(request("api", vec![descriptor(&[("user", "a")])]))
        .await
        .expect_err("no backend yet");
    assert_eq!(error.code(), tonic::Code::Unavailable);
    assert!(
        !error.message().contains("127.0.0.1"),
        "{}",
        error.message()
    );

    redis.restart();
    wait_health(&server, 200).await;
    let response = should_rate_limit(
        &mut client,
        request("api", vec![descriptor(&[("user", "a")])]),
    )
    .await;
    assert_eq!(response.overall_code, Code::Ok as i32);
    server.stop().await;
}

#[tokio::test]
async fn outage_flips_health_and_applies_each_failure_mode() {
    let mut redis = RedisServer::start();
    let servers = [
        (FailureMode::Error, server(&redis, FailureMode::Error).await),
        (FailureMode::Allow, server(&redis, FailureMode::Allow).await),
        (FailureMode::Deny, server(&redis, FailureMode::Deny).await),
        (FailureMode::Local, server(&redis, FailureMode::Local).await),
    ];
    for (_, server) in &servers {
        wait_health(server, 200).await;
    }
    // The local replica knows its share once the registry has answered it.
    let local = &servers[3].1;
    assert!(
        eventually(Duration::from_secs(10), async || {
            sample(
                &scrape(local.http).await,
                "floodgate_replicas{kind=\"known\"}",
            ) == Some(1.0)
        })
        .await
    );
    redis.stop();
    for (mode, server) in &servers {
        let mut client = server.client().await;
        let result = client
            .should_rate_limit(request("api", vec![descriptor(&[("user", "outage")])]))
            .await;
        match mode {
            FailureMode::Error => assert_eq!(
                result.expect_err("error mode").code(),
                tonic::Code::Unavailable
            ),
            FailureMode::Allow => {
                let response = result.expect("allow mode answers").into_inner();
                assert_eq!(response.overall_code, Code::Ok as i32);
                assert!(response.statuses[0].current_limit.is_none());
            }
            FailureMode::Deny => {
                let response = result.expect("deny mode answers").into_inner();
                assert_eq!(response.overall_code, Code::OverLimit as i32);
            }
            FailureMode::Local => {
                // Alone in the registry: the whole limit, from memory, and still ready.
                let response = result.expect("local mode answers").into_inner();
                assert_eq!(response.overall_code, Code::Ok as i32);
                assert!(response.statuses[0].current_limit.is_some());
                assert!(
                    response
                        .response_headers_to_add
                        .iter()
                        .any(|header| header.key == "x-floodgate-fallback")
                );
            }
        }
        if *mode == FailureMode::Local {
            wait_health(server, 200).await;
        } else {
            wait_health(server, 503).await;
        }
        let text = scrape(server.http).await;
        let mode_name = format!("{mode:?}").to_lowercase();
        assert!(
            text.contains(&format!(
                "floodgate_failure_mode_total{{kind=\"{mode_name}\"}}"
            )),
            "{text}"
        );
        assert!(
            text.contains("floodgate_backend_errors_total{kind="),
            "{text}"
        );
    }
    redis.restart();
    for (_, server) in &servers {
        wait_health(server, 200).await;
        let mut client = server.client().await;
        let response = should_rate_limit(
            &mut client,
            request("api", vec![descriptor(&[("user", "back")])]),
        )
        .await;
        assert_eq!(
            response.statuses[0]
                .current_limit
                .as_ref()
                .map(|l| l.requests_per_unit),
            Some(1)
        );
    }
    for (_, server) in servers {
        server.stop().await;
    }
}

#[tokio::test]
async fn exhausted_buckets_are_answered_from_the_local_cache() {
    common::away_from_an_hour_boundary().await;
    let redis = RedisServer::start();
    let server = server(&redis, FailureMode::Error).await;
    let mut client = server.client().await;
    let ask = || request("api", vec![descriptor(&[("user", "cached")])]);
    assert_eq!(
        should_rate_limit(&mut client, ask()).await.overall_code,
        Code::Ok as i32
    );
    assert_eq!(
        should_rate_limit(&mut client, ask()).await.overall_code,
        Code::OverLimit as i32
    );
    let before = redis.info_field("stats", "total_commands_processed");
    let cached = should_rate_limit(&mut client, ask()).await;
    assert_eq!(cached.overall_code, Code::OverLimit as i32);
    assert!(
        cached.statuses[0]
            .duration_until_reset
            .as_ref()
            .unwrap()
            .seconds
            > 0
    );
    // INFO itself is one command: nothing else reached Redis for the cached answer.
    let after = redis.info_field("stats", "total_commands_processed");
    let count = |v: Option<String>| v.unwrap().parse::<u64>().unwrap();
    assert_eq!(count(after), count(before) + 1);
    let text = scrape(server.http).await;
    // The first call left the fixed window exactly full, which proves it exhausted until the
    // window ends: both later calls were answered locally.
    assert!(
        text.contains(r#"ratelimit_service_rate_limit_over_limit_with_local_cache_total{domain="api",key="user"} 2"#),
        "{text}"
    );
    assert!(
        text.contains("floodgate_local_cache_hits_total 2"),
        "{text}"
    );
    server.stop().await;
}

#[tokio::test]
async fn shutdown_waits_for_calls_blocked_on_redis() {
    let redis = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let server = TestServer::start_with(&[("api.yaml", RULES)], |settings| {
        settings.backend = BackendSettings::Redis {
            url: redis.url(),
            options: redis_options(Duration::from_secs(5)),
        };
        settings.limiter.backend_timeout = Duration::from_secs(5);
    })
    .await;
    wait_health(&server, 200).await;
    let port = redis.port().to_string();
    // Redis sleeps for a second: calls made now wait on it.
    let sleeper = std::thread::spawn(move || {
        std::process::Command::new("redis-cli")
            .args(["-p", &port, "DEBUG", "SLEEP", "1"])
            .output()
            .expect("redis-cli")
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut calls = Vec::new();
    for i in 0..8 {
        let mut client = server.client().await;
        calls.push(tokio::spawn(async move {
            client
                .should_rate_limit(request(
                    "api",
                    vec![descriptor(&[("user", &format!("u{i}"))])],
                ))
                .await
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let stopping = tokio::spawn(server.stop());
    for call in calls {
        let response = call
            .await
            .unwrap()
            .expect("in-flight call completes")
            .into_inner();
        assert_eq!(response.overall_code, Code::Ok as i32);
    }
    stopping.await.unwrap();
    sleeper.join().unwrap();
}

/// A request whose sliding-log descriptors could make Redis walk more than one full log is
/// refused at once (64 of cost 10,000 against a full 10,000-entry log took 640 ms of
/// Redis per script, and the calls beside it timed out); one full log still passes, and an
/// innocent caller beside the refused request is answered.
#[tokio::test]
async fn a_request_of_too_many_full_log_walks_is_refused_and_others_are_answered() {
    let redis = RedisServer::start();
    let rules = "domain: log\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 10000, algorithm: sliding_log}\n";
    let server = TestServer::start_with(&[("log.yaml", rules)], |settings| {
        settings.backend = BackendSettings::Redis {
            url: redis.url(),
            options: redis_options(Duration::from_secs(1)),
        };
    })
    .await;
    let mut client = server.client().await;
    let costly = |value: &str, cost: u64| {
        let mut d = descriptor(&[("k", value)]);
        d.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: cost });
        d
    };
    let heavy: Vec<_> = (0..64).map(|i| costly(&format!("h{i}"), 10_000)).collect();
    let status = client
        .should_rate_limit(request("log", heavy))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("sliding-log"),
        "{}",
        status.message()
    );
    // One full log is within the budget, and the innocent call beside it is answered.
    let full = should_rate_limit(&mut client, request("log", vec![costly("one", 10_000)])).await;
    assert_eq!(full.overall_code(), Code::Ok);
    let innocent = should_rate_limit(&mut client, request("log", vec![costly("other", 1)])).await;
    assert_eq!(innocent.overall_code(), Code::Ok);
    server.stop().await;
}
