//! Bounded resources on the gRPC listener: idle connections and oversized requests do not
//! starve a well-behaved client, connections past the cap are closed, an aged connection is
//! drained with a GOAWAY without failing its in-flight call, and `--admin-json false`.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::redis::RedisServer;
use common::{TestServer, descriptor, eventually, request};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use floodgate::backend::BackendSettings;
use floodgate::listener::GrpcLimits;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint};

const CONFIG: &str = "domain: limits\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1000000}\n";

/// Idle connections the first test opens; the server's cap is set above it.
const IDLE_CONNECTIONS: usize = 1_000;
/// File descriptors used per idle connection in this process: the client end and the
/// server's end.
const FDS_PER_CONNECTION: u64 = 2;

/// Raises the soft open-file limit towards what `connections` need; returns how many
/// connections fit (fewer than asked only where the hard limit is lower).
fn fit_connections(connections: usize) -> usize {
    let needed = connections as u64 * FDS_PER_CONNECTION + 256;
    let _ = rlimit::increase_nofile_limit(needed);
    let (soft, _) = rlimit::Resource::NOFILE.get().unwrap_or((1024, 1024));
    let fit = usize::try_from(soft.saturating_sub(256) / FDS_PER_CONNECTION).unwrap_or(usize::MAX);
    // A hard limit below the need (rare) leaves fewer idle connections, not a failure.
    connections.min(fit)
}

fn many_descriptors(count: usize) -> Vec<RateLimitDescriptor> {
    (0..count)
        .map(|i| descriptor(&[("k", &i.to_string())]))
        .collect()
}

/// Opens `count` TCP connections that never send a byte.
async fn idle_connections(addr: std::net::SocketAddr, count: usize) -> Vec<TcpStream> {
    let mut idle = Vec::with_capacity(count);
    for _ in 0..count {
        idle.push(TcpStream::connect(addr).await.expect("idle connection"));
    }
    idle
}

async fn client(addr: std::net::SocketAddr) -> RateLimitServiceClient<Channel> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        // Bounds a hang, not a latency: the assertions are on answers.
        .timeout(Duration::from_secs(30))
        .connect()
        .await
        .expect("client connects");
    RateLimitServiceClient::new(channel)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_and_huge_requests_do_not_starve_a_good_client() {
    let idle_count = fit_connections(IDLE_CONNECTIONS);
    let server = TestServer::start_with(&[("limits.yaml", CONFIG)], |settings| {
        settings.grpc_limits = GrpcLimits {
            max_connections: IDLE_CONNECTIONS + 100,
            ..GrpcLimits::default()
        };
    })
    .await;
    let idle = idle_connections(server.grpc, idle_count).await;

    let mut flooder = client(server.grpc).await;
    let flood = tokio::spawn(async move {
        let mut codes = Vec::new();
        for _ in 0..20 {
            let huge = request("limits", many_descriptors(10_000));
            let status = flooder
                .should_rate_limit(huge)
                .await
                .expect_err("a 10,000-descriptor request is rejected");
            codes.push(status.code());
        }
        codes
    });

    let mut good = client(server.grpc).await;
    for i in 0..50 {
        let answer = good
            .should_rate_limit(request("limits", vec![descriptor(&[("k", "good")])]))
            .await
            .unwrap_or_else(|status| panic!("call {i} failed: {status:?}"));
        assert_eq!(answer.into_inner().overall_code(), Code::Ok);
    }
    let codes = flood.await.unwrap();
    assert!(
        codes
            .iter()
            .all(|code| *code == tonic::Code::InvalidArgument),
        "{codes:?}"
    );
    // The idle connections are still open: nothing was closed to make room.
    assert_eq!(idle.len(), idle_count);
    drop(idle);
    server.stop().await;
}

#[tokio::test]
async fn requests_past_the_message_size_limit_are_refused() {
    let server = TestServer::start_with(&[("limits.yaml", CONFIG)], |settings| {
        settings.grpc_limits.max_message_bytes = 64 * 1024;
    })
    .await;
    let mut client = client(server.grpc).await;
    let status = client
        .should_rate_limit(request("limits", many_descriptors(10_000)))
        .await
        .expect_err("too large");
    // tonic's code for a message over the decoding limit.
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
    let answer = client
        .should_rate_limit(request("limits", vec![descriptor(&[("k", "v")])]))
        .await
        .expect("a small request on the same connection");
    assert_eq!(answer.into_inner().overall_code(), Code::Ok);
    server.stop().await;
}

/// A channel to `addr` through a connector that counts the TCP connections it opens.
async fn counting_channel(addr: std::net::SocketAddr) -> (Channel, Arc<AtomicUsize>) {
    let connects = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&connects);
    let connector = tower::service_fn(move |_: tonic::transport::Uri| {
        counter.fetch_add(1, Ordering::SeqCst);
        async move {
            let tcp = TcpStream::connect(addr).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tcp))
        }
    });
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_with_connector(connector)
        .await
        .unwrap();
    (channel, connects)
}

/// Makes one call on `client`; panics with the status if it is not answered.
async fn answered(client: &mut RateLimitServiceClient<Channel>) {
    let call = request("limits", vec![descriptor(&[("k", "v")])]);
    let answer = client.should_rate_limit(call).await.expect("answered");
    assert_eq!(answer.into_inner().overall_code(), Code::Ok);
}

/// Reads until the server closes `socket` (EOF or a reset), within `limit`.
async fn closed_within(socket: &mut TcpStream, limit: Duration) {
    let mut buf = [0u8; 64];
    let closed = tokio::time::timeout(limit, async {
        loop {
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    });
    closed.await.expect("the server closed the connection");
}

#[tokio::test]
async fn silent_sockets_at_the_cap_make_room_and_busy_connections_keep_theirs() {
    let server = TestServer::start_with(&[("limits.yaml", CONFIG)], |settings| {
        settings.grpc_limits.max_connections = 4;
    })
    .await;
    // Four sockets that never send a byte fill the cap: a client still gets in, and again.
    let mut silent = idle_connections(server.grpc, 4).await;
    let mut first = client(server.grpc).await;
    answered(&mut first).await;
    let mut second = client(server.grpc).await;
    answered(&mut second).await;
    // The oldest silent sockets were closed to make room for them.
    closed_within(&mut silent[0], Duration::from_secs(2)).await;
    closed_within(&mut silent[1], Duration::from_secs(2)).await;
    // Once only connections that carried calls and silent newcomers are left, a newcomer
    // evicts the remaining silent ones, then is refused itself: busy connections stay.
    let mut third = client(server.grpc).await;
    answered(&mut third).await;
    let mut fourth = client(server.grpc).await;
    answered(&mut fourth).await;
    let mut extra = TcpStream::connect(server.grpc).await.unwrap();
    closed_within(&mut extra, Duration::from_secs(2)).await;
    for client in [&mut first, &mut second, &mut third, &mut fourth] {
        answered(client).await;
    }
    server.stop().await;
}

/// Issue 33: connections that made a call and went idle no longer hold the cap. With two
/// connections allowed, one idle past `IDLE_BEFORE_EVICTION` and one just used, a newcomer
/// is served: the idle one gets a GOAWAY, and its client must reconnect to call again.
#[tokio::test]
async fn at_the_cap_the_connection_idle_longest_makes_room() {
    let server = TestServer::start_with(&[("limits.yaml", CONFIG)], |settings| {
        settings.grpc_limits.max_connections = 2;
    })
    .await;
    let (channel, connects) = counting_channel(server.grpc).await;
    let mut idle = RateLimitServiceClient::new(channel);
    answered(&mut idle).await;
    let mut busy = client(server.grpc).await;
    answered(&mut busy).await;
    tokio::time::sleep(floodgate::listener::IDLE_BEFORE_EVICTION + Duration::from_millis(200))
        .await;
    answered(&mut busy).await;
    let mut newcomer = client(server.grpc).await;
    answered(&mut newcomer).await;
    answered(&mut busy).await;
    // The idle connection was drained: its client's next call needs a new connection (which
    // the cap, held by the two in use, then refuses).
    let mut reconnected = false;
    for _ in 0..20 {
        let call = request("limits", vec![descriptor(&[("k", "v")])]);
        let _ = idle.should_rate_limit(call).await;
        if connects.load(Ordering::SeqCst) >= 2 {
            reconnected = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(reconnected, "the idle connection was not drained");
    server.stop().await;
}

#[tokio::test]
async fn a_connection_that_sends_no_call_is_closed_after_the_first_call_timeout() {
    let server = TestServer::start_with(&[("limits.yaml", CONFIG)], |settings| {
        settings.grpc_limits.first_call_timeout = Some(Duration::from_millis(300));
    })
    .await;
    let mut silent = TcpStream::connect(server.grpc).await.unwrap();
    closed_within(&mut silent, Duration::from_secs(5)).await;
    // A client that calls keeps its connection past the timeout.
    let mut client = client(server.grpc).await;
    answered(&mut client).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    answered(&mut client).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aged_connection_is_drained_without_failing_its_call() {
    let redis = RedisServer::start();
    let url = redis.url();
    let server = TestServer::start_with(&[("limits.yaml", CONFIG)], move |settings| {
        settings.backend = BackendSettings::Redis {
            url,
            options: common::redis_options(Duration::from_secs(10)),
        };
        settings.limiter.backend_timeout = Duration::from_secs(10);
        settings.grpc_limits.max_connection_age = Some(Duration::from_millis(1500));
        settings.grpc_limits.max_connection_age_grace = Duration::from_secs(30);
    })
    .await;
    // Counts the TCP connections the channel opens.
    let (channel, connects) = counting_channel(server.grpc).await;
    let mut client = RateLimitServiceClient::new(channel);
    let call = || request("limits", vec![descriptor(&[("k", "aged")])]);
    assert!(client.should_rate_limit(call()).await.is_ok());
    assert_eq!(connects.load(Ordering::SeqCst), 1);

    // Redis holds every command for 3 s, so the next call is still in flight when the
    // connection reaches its age (1.35 to 1.5 s) and gets its GOAWAY.
    redis.cli(&["CLIENT", "PAUSE", "3000"]);
    let in_flight = client
        .should_rate_limit(call())
        .await
        .expect("the in-flight call finishes within the grace");
    assert_eq!(in_flight.into_inner().overall_code(), Code::Ok);

    // The drained connection is gone: the next call goes over a new one.
    let reconnected = eventually(Duration::from_secs(5), async || {
        client.should_rate_limit(call()).await.is_ok() && connects.load(Ordering::SeqCst) >= 2
    })
    .await;
    assert!(reconnected, "the aged connection was never replaced");
    server.stop().await;
}

#[tokio::test]
async fn admin_json_can_be_turned_off() {
    let body = r#"{"domain":"limits","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
    let on = TestServer::start(&[("limits.yaml", CONFIG)]).await;
    let (status, _) = common::http("POST", &on.http_url("/json"), body).await;
    assert_eq!(status, 200);
    on.stop().await;

    let off = TestServer::start_with(&[("limits.yaml", CONFIG)], |settings| {
        settings.admin_json = false;
    })
    .await;
    let (status, _) = common::http("POST", &off.http_url("/json"), body).await;
    assert_eq!(status, 404);
    let (status, _) = common::http("GET", &off.http_url("/healthcheck"), "").await;
    assert_eq!(status, 200);
    off.stop().await;
}

#[tokio::test]
async fn every_key_written_to_redis_has_a_ttl() {
    const RULES: &str = "domain: ttl\ndescriptors:
  - key: fixed
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: token
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: token_bucket}
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: sliding_window}
  - key: log
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: sliding_log}
  - key: lock
    rate_limit: {unit: minute, requests_per_unit: 1, lockout_seconds: 900}
";
    let redis = RedisServer::start();
    let url = redis.url();
    let server = TestServer::start_with(&[("ttl.yaml", RULES)], move |settings| {
        settings.backend = BackendSettings::Redis {
            url,
            options: common::redis_options(Duration::from_secs(2)),
        };
        settings.limiter.backend_timeout = Duration::from_secs(2);
    })
    .await;
    let mut client = client(server.grpc).await;
    let mut over_limit = 0;
    for key in ["fixed", "token", "sliding", "log", "lock"] {
        for value in 0..5 {
            // Past every limit, so lockouts engage and over-limit paths write too.
            for _ in 0..4 {
                let call = request("ttl", vec![descriptor(&[(key, &value.to_string())])]);
                let answer = client.should_rate_limit(call).await.expect("answered");
                if answer.into_inner().overall_code() == Code::OverLimit {
                    over_limit += 1;
                }
            }
        }
    }
    assert!(over_limit > 0, "no call went over its limit");
    let keys = redis.cli(&["KEYS", "*"]);
    let keys: Vec<&str> = keys.lines().filter(|key| !key.is_empty()).collect();
    assert!(keys.len() >= 25, "only {} keys: {keys:?}", keys.len());
    for key in keys {
        let ttl: i64 = redis.cli(&["PTTL", key]).parse().expect("PTTL is a number");
        assert!(ttl > 0, "{key} has PTTL {ttl}");
    }
    server.stop().await;
}
