//! The Redis backend through Redis Sentinel, on real processes: a master, one replica and
//! three sentinels. Decisions are booked on the master; after the master is SIGKILLed and
//! the replica promoted, or after a manual failover that leaves the old master running as a
//! replica, floodgate books on the new master without a restart.

use crate::common;

use std::time::Duration;

use common::redis::SentinelGroup;
use common::{TestServer, descriptor, eventually, redis_options, request};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use floodgate::backend::{BackendSettings, SentinelSettings};

const RULES: &str = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1000}\n";
/// How long floodgate may take to book on the new master once the old one is gone:
/// detection (1 s down-after), election and promotion, then floodgate's reconnect.
const FAILOVER_LIMIT: Duration = Duration::from_secs(30);

async fn server(group: &SentinelGroup) -> TestServer {
    TestServer::start_with(&[("api.yaml", RULES)], |settings| {
        settings.backend = BackendSettings::Sentinel {
            sentinel: SentinelSettings {
                master: group.name.to_owned(),
                sentinels: group.sentinel_urls(),
                node_auth: None,
            },
            options: redis_options(Duration::from_millis(300)),
        };
        settings.limiter.backend_timeout = Duration::from_millis(300);
        settings.limiter.local_cache_entries = 0;
    })
    .await
}

fn keys(group: &SentinelGroup, index: usize) -> u64 {
    group.nodes()[index]
        .cli(&["DBSIZE"])
        .parse()
        .expect("DBSIZE")
}

/// Sends one decision for `user`; Ok(true) when it was answered OK, Ok(false) for any other
/// code, Err for an error status (UNAVAILABLE while no master answers).
async fn decide(server: &TestServer, user: &str) -> Result<bool, tonic::Status> {
    let mut client = server.client().await;
    let response = client
        .should_rate_limit(request("api", vec![descriptor(&[("user", user)])]))
        .await?;
    Ok(response.into_inner().overall_code == Code::Ok as i32)
}

/// Polls, bounded, until a decision for a fresh user is booked on the node at `index`;
/// every answer on the way must be OK or UNAVAILABLE. Returns how many calls it took.
async fn books_on(server: &TestServer, group: &SentinelGroup, index: usize, tag: &str) -> u32 {
    let mut attempt = 0;
    let booked = eventually(FAILOVER_LIMIT, async || {
        let before = keys(group, index);
        let booked = match decide(server, &format!("{tag}-{attempt}")).await {
            Ok(true) => keys(group, index) > before,
            Ok(false) => panic!("a user with room was rejected"),
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
                false
            }
        };
        if !booked {
            attempt += 1;
        }
        booked
    })
    .await;
    assert!(
        booked,
        "nothing booked on node {index} within {FAILOVER_LIMIT:?}"
    );
    attempt
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn books_on_the_master_and_follows_a_crash_failover() {
    common::away_from_an_hour_boundary().await;
    let mut group = SentinelGroup::start_async().await;
    let server = server(&group).await;
    assert!(decide(&server, "first").await.expect("answered"));
    assert_eq!(keys(&group, 0), 1, "booked on the master");
    // The replica holds the key only through replication, never from floodgate.
    assert_eq!(
        group.nodes()[1]
            .info_field("replication", "role")
            .as_deref(),
        Some("slave")
    );

    group.node_mut(0).stop();
    #[allow(
        clippy::disallowed_methods,
        reason = "the failover runs on real time in other processes"
    )]
    let killed = std::time::Instant::now();
    let calls = books_on(&server, &group, 1, "after-crash").await;
    assert_eq!(
        tokio::task::block_in_place(|| group.master_index()),
        1,
        "the sentinels promoted the replica"
    );
    println!(
        "booked on the promoted replica {:?} after the kill ({calls} calls failed or went before)",
        killed.elapsed()
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_a_manual_failover_while_the_old_master_still_runs() {
    common::away_from_an_hour_boundary().await;
    let group = SentinelGroup::start_async().await;
    let server = server(&group).await;
    assert!(decide(&server, "first").await.expect("answered"));
    assert_eq!(keys(&group, 0), 1);

    // The old master stays up and is demoted: its sockets never break, so only
    // `+switch-master` (or its READONLY answers) can move floodgate.
    let answer = group.sentinel(0).cli(&["SENTINEL", "FAILOVER", group.name]);
    assert_eq!(answer, "OK");
    // Until the old master is demoted, its writes replicate to node 1 as well: wait for the
    // switch before counting keys there.
    tokio::task::block_in_place(|| {
        common::redis::wait_until("the old master demoted", FAILOVER_LIMIT, || {
            group.master_index() == 1
                && group.nodes()[0]
                    .info_field("replication", "role")
                    .as_deref()
                    == Some("slave")
        });
    });
    let calls = books_on(&server, &group, 1, "after-switch").await;
    println!("booked on the new master after {calls} failed calls");
    // The demoted node refuses writes, so every booking since is on the new master.
    assert!(decide(&server, "last").await.expect("answered"));
    server.stop().await;
}

/// The reference's variables alone (`REDIS_TYPE=sentinel`, `REDIS_URL=master,host:port,...`)
/// start the binary on the Sentinel group, booking on the master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_variables_alone_reach_the_master() {
    common::away_from_an_hour_boundary().await;
    let group = SentinelGroup::start_async().await;
    let rules = common::config_dir(&[("api.yaml", RULES)]);
    let sentinels: Vec<String> = group
        .sentinel_urls()
        .iter()
        .map(|url| url.trim_start_matches("redis://").to_owned())
        .collect();
    let redis_url = format!("{},{}", group.name, sentinels.join(","));
    let binary = common::Binary::start_with_env_only(&[
        (
            "FLOODGATE_CONFIG",
            rules.path().to_str().expect("utf-8 path"),
        ),
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
        ("REDIS_TYPE", "sentinel"),
        ("REDIS_URL", &redis_url),
    ]);
    let mut client = RateLimitServiceClient::connect(format!("http://{}", binary.grpc))
        .await
        .expect("client connects");
    let response = client
        .should_rate_limit(request("api", vec![descriptor(&[("user", "env")])]))
        .await
        .expect("answered");
    assert_eq!(response.into_inner().overall_code, Code::Ok as i32);
    assert_eq!(keys(&group, 0), 1, "booked on the master");
}
