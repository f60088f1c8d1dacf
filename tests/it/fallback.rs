//! Failure mode `local` (docs/reliability.md#failure-mode-local): three replicas on one
//! Redis, one cut off from it by a proxy. The cut-off replica decides from its memory with
//! a third of the limit and says so in a header; the two still on Redis keep two thirds
//! between them once it has gone silent; offered twice the limit evenly, the three admit
//! the limit per window, where fail-open admits all and fail-closed none.

use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use floodgate::backend::BackendSettings;
use floodgate::bench::proxy::Proxy;
use floodgate::limiter::FailureMode;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

use crate::common;
use crate::common::redis::RedisServer;
use crate::common::{TestServer, descriptor, eventually, redis_options, request, sample, scrape};

const RULES: &str = "domain: cutoff
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 30}
";

/// A replica on Redis at `url`, under failure mode `local`.
async fn replica(url: String) -> TestServer {
    TestServer::start_with(&[("rules.yaml", RULES)], |settings| {
        settings.backend = BackendSettings::Redis {
            url,
            options: redis_options(Duration::from_millis(200)),
        };
        settings.limiter.failure_mode = FailureMode::Local;
        settings.limiter.replica_grace = Duration::from_secs(60);
    })
    .await
}

/// One call for tenant `a`.
async fn ask(client: &mut RateLimitServiceClient<Channel>) -> RateLimitResponse {
    client
        .should_rate_limit(request("cutoff", vec![descriptor(&[("tenant", "a")])]))
        .await
        .expect("answered")
        .into_inner()
}

fn is_local(response: &RateLimitResponse) -> bool {
    response
        .response_headers_to_add
        .iter()
        .any(|header| header.key == "x-floodgate-fallback" && header.value == "local")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_from_redis_enforces_its_share() {
    let redis = RedisServer::start();
    let proxy = Proxy::start(([127, 0, 0, 1], redis.port()).into(), Duration::ZERO)
        .await
        .expect("proxy starts");
    let on_redis = [replica(redis.url()).await, replica(redis.url()).await];
    let cut = replica(format!("redis://{}", proxy.addr())).await;
    let all = [&on_redis[0], &on_redis[1], &cut];
    for server in all {
        assert!(
            eventually(Duration::from_secs(10), async || {
                sample(
                    &scrape(server.http).await,
                    "floodgate_replicas{kind=\"known\"}",
                ) == Some(3.0)
            })
            .await,
            "every replica sees three"
        );
    }
    proxy.cut();
    // The others hear nothing from it for LIVE_FOR, then hold two thirds.
    assert!(
        eventually(Duration::from_secs(10), async || {
            sample(
                &scrape(on_redis[0].http).await,
                "floodgate_replicas{kind=\"live\"}",
            ) == Some(2.0)
        })
        .await,
        "the replicas on Redis see the cut-off one go silent"
    );
    let mut clients = Vec::new();
    for server in all {
        clients.push(server.client().await);
    }
    let mut admitted_per_window = Vec::new();
    for _ in 0..4 {
        common::start_of_the_next_second().await;
        // Twice the limit, evenly: 20 a replica, the three at once.
        let started = tokio::time::Instant::now();
        let counts =
            futures::future::join_all(clients.iter_mut().enumerate().map(async |(i, client)| {
                let mut admitted = 0;
                for _ in 0..20 {
                    let response = ask(client).await;
                    assert_eq!(is_local(&response), i == 2, "only the cut-off one is local");
                    admitted += usize::from(response.overall_code == Code::Ok as i32);
                }
                admitted
            }))
            .await;
        // Not an assertion on speed: a window whose calls spill into the next counts
        // nothing (at most one, on a machine starved for seconds).
        if started.elapsed() >= Duration::from_millis(950) {
            continue;
        }
        admitted_per_window.push(counts.iter().sum::<usize>());
    }
    // The first window may hold what the cut-off replica admitted before the cut; the
    // next ones are the share's alone: 20 on Redis, 10 from memory.
    eprintln!("admitted per window (limit 30, 60 offered): {admitted_per_window:?}");
    assert!(admitted_per_window.len() >= 2, "{admitted_per_window:?}");
    for admitted in &admitted_per_window[1..] {
        assert!(
            (24..=30).contains(admitted),
            "admitted per window {admitted_per_window:?}, limit 30"
        );
    }
    let metrics = scrape(cut.http).await;
    assert!(
        sample(&metrics, "floodgate_failure_mode_total{kind=\"local\"}").unwrap_or(0.0) >= 60.0,
        "local decisions are counted"
    );
    proxy.heal();
    assert!(
        eventually(Duration::from_secs(10), async || !is_local(
            &ask(&mut clients[2]).await
        ))
        .await,
        "back on Redis once it answers"
    );
    for server in on_redis {
        server.stop().await;
    }
    cut.stop().await;
}
