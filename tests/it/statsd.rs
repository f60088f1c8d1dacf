//! StatsD export (issue 16 item 2): real TCP and UDP listeners in the test receive the
//! reference's StatsD names with exact counts (the same as `/metrics`), tags in both
//! flavors; counts made while the server is down arrive once it is back; and a dead or
//! stuck StatsD server changes no answer and does not hold decisions up.

use crate::common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{
    Binary, TestServer, descriptor, eventually, request, sample, scrape, should_rate_limit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use floodgate::statsd::{Flavor, Protocol, StatsdSettings, Tag};
use tokio::io::AsyncBufReadExt;
use tokio::net::{TcpListener, TcpSocket, UdpSocket};
use tokio::task::JoinHandle;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

const API: &str = "\
domain: api
descriptors:
  - key: path
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: user
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 1000000}
";

/// Flush interval of the tests: short, so counts arrive within a few polls.
const FLUSH: Duration = Duration::from_millis(50);

/// Every line a listener received, in arrival order; the listener stops with the test.
struct Received {
    lines: Arc<Mutex<Vec<String>>>,
    task: JoinHandle<()>,
}

impl Drop for Received {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Received {
    fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// The sum of the values of the counter lines named `name` (tags excluded for
    /// DogStatsD, included in the name for plain StatsD).
    fn total(&self, name: &str) -> u64 {
        self.lines()
            .iter()
            .filter_map(|line| parse(line))
            .filter(|(line_name, _, kind)| *line_name == name && *kind == "c")
            .map(|(_, value, _)| value)
            .sum()
    }

    /// Waits (at most 10 s) until `name` adds up to `expected`, then three more flushes so
    /// that an overcount would show, and returns the total.
    async fn settled_total(&self, name: &str, expected: u64) -> u64 {
        eventually(Duration::from_secs(10), async || {
            self.total(name) >= expected
        })
        .await;
        tokio::time::sleep(FLUSH * 3).await;
        self.total(name)
    }
}

/// `name:value|kind[|#tags]` as (name, value, kind).
fn parse(line: &str) -> Option<(&str, u64, &str)> {
    let (name, rest) = line.split_once(':')?;
    let mut fields = rest.split('|');
    let value = fields.next()?.parse().ok()?;
    Some((name, value, fields.next()?))
}

/// A StatsD server on TCP: reads newline-separated lines from every connection.
async fn tcp_server() -> (SocketAddr, Received) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (addr, collect_tcp(listener))
}

fn collect_tcp(listener: TcpListener) -> Received {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&lines);
    let task = tokio::spawn(async move {
        let mut readers = tokio::task::JoinSet::new();
        while let Ok((stream, _)) = listener.accept().await {
            let sink = Arc::clone(&sink);
            readers.spawn(async move {
                let mut reader = tokio::io::BufReader::new(stream).lines();
                while let Ok(Some(line)) = reader.next_line().await {
                    sink.lock().unwrap().push(line);
                }
            });
        }
    });
    Received { lines, task }
}

/// A StatsD server on UDP: splits every datagram into lines.
async fn udp_server() -> (SocketAddr, Received) {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&lines);
    let task = tokio::spawn(async move {
        let mut buffer = vec![0; 65_536];
        while let Ok(n) = socket.recv(&mut buffer).await {
            let text = String::from_utf8_lossy(&buffer[..n]).into_owned();
            sink.lock().unwrap().extend(text.lines().map(str::to_owned));
        }
    });
    (addr, Received { lines, task })
}

fn statsd(addr: String, protocol: Protocol, flavor: Flavor, tags: &[&str]) -> StatsdSettings {
    StatsdSettings {
        addr,
        protocol,
        flavor,
        flush_interval: FLUSH,
        tags: tags.iter().map(|tag| tag.parse::<Tag>().unwrap()).collect(),
    }
}

async fn start(settings: StatsdSettings) -> TestServer {
    TestServer::start_with(&[("api.yaml", API)], |s| s.statsd = Some(settings)).await
}

/// Five calls on a limit of three: OK three times, then OVER_LIMIT twice.
async fn five_calls(server: &TestServer) {
    let mut client = server.client().await;
    for (i, expected) in [OK, OK, OK, OVER, OVER].into_iter().enumerate() {
        let call = request("api", vec![descriptor(&[("path", "/x")])]);
        let response = should_rate_limit(&mut client, call).await;
        assert_eq!(response.overall_code, expected, "call {}", i + 1);
    }
}

/// The `/metrics` value of `series` (name and labels).
async fn scraped(server: &TestServer, series: &str) -> u64 {
    let text = scrape(server.http).await;
    sample(&text, series).unwrap_or_else(|| panic!("no {series} in /metrics")) as u64
}

/// The `/metrics` value of a per-rule counter of the `path` rule.
async fn scraped_path(server: &TestServer, stat: &str) -> u64 {
    let series =
        format!("ratelimit_service_rate_limit_{stat}_total{{domain=\"api\",key=\"path\"}}");
    scraped(server, &series).await
}

async fn dropped(server: &TestServer) -> u64 {
    scraped(server, "floodgate_statsd_dropped_total").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_statsd_receives_the_reference_names_with_exact_counts() {
    common::away_from_an_hour_boundary().await;
    let (addr, received) = tcp_server().await;
    let settings = statsd(
        addr.to_string(),
        Protocol::Tcp,
        Flavor::Statsd,
        &["env:test"],
    );
    let server = start(settings).await;
    five_calls(&server).await;

    let name = |stat: &str| format!("ratelimit.service.rate_limit.api.path.{stat}.__env=test");
    for (stat, expected) in [("total_hits", 5), ("within_limit", 3), ("over_limit", 2)] {
        assert_eq!(
            received.settled_total(&name(stat), expected).await,
            expected,
            "{stat}"
        );
        assert_eq!(
            scraped_path(&server, stat).await,
            expected,
            "/metrics {stat}"
        );
    }
    for stat in ["near_limit", "shadow_mode", "over_limit_with_local_cache"] {
        assert_eq!(
            received.total(&name(stat)),
            scraped_path(&server, stat).await
        );
    }
    let requests = "ratelimit_server.ShouldRateLimit.total_requests.__env=test";
    assert_eq!(received.total(requests), 5);
    let success = "ratelimit.service.config_load_success.__env=test";
    let loads = scraped(&server, "floodgate_config_load_success_total").await;
    assert!(loads >= 1);
    assert_eq!(received.total(success), loads);
    let lines = received.lines();
    assert!(
        lines
            .iter()
            .any(|line| line == "floodgate.ready.__env=test:1|g"),
        "{lines:?}"
    );
    assert!(lines.iter().all(|line| parse(line).is_some()), "{lines:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_dogstatsd_receives_exact_counts_with_tags() {
    common::away_from_an_hour_boundary().await;
    let (addr, received) = udp_server().await;
    let tags = ["team:edge", "env:test"];
    let settings = statsd(addr.to_string(), Protocol::Udp, Flavor::Dogstatsd, &tags);
    let server = start(settings).await;
    five_calls(&server).await;

    let name = |stat: &str| format!("ratelimit.service.rate_limit.api.path.{stat}");
    for (stat, expected) in [("total_hits", 5), ("within_limit", 3), ("over_limit", 2)] {
        assert_eq!(
            received.settled_total(&name(stat), expected).await,
            expected,
            "{stat}"
        );
    }
    assert_eq!(
        received.total("ratelimit_server.ShouldRateLimit.total_requests"),
        5
    );
    let lines = received.lines();
    assert!(!lines.is_empty());
    for line in &lines {
        assert!(line.ends_with("|#env:test,team:edge"), "{line}");
    }
    assert!(lines.contains(&"floodgate.ready:1|g|#env:test,team:edge".to_owned()));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_made_while_statsd_is_down_arrive_when_it_is_back() {
    common::away_from_an_hour_boundary().await;
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let server = start(statsd(addr.to_string(), Protocol::Tcp, Flavor::Statsd, &[])).await;
    five_calls(&server).await;
    eventually(Duration::from_secs(5), async || dropped(&server).await > 0).await;
    assert!(
        dropped(&server).await > 0,
        "the refused flushes are counted"
    );

    // The server comes back on the same port; the first reconnect (after at most the 1 s
    // backoff) carries everything counted meanwhile, once.
    let received = collect_tcp(TcpListener::bind(addr).await.expect("port still free"));
    let total_hits = "ratelimit.service.rate_limit.api.path.total_hits";
    assert_eq!(received.settled_total(total_hits, 5).await, 5);
    assert_eq!(
        received.total("ratelimit.service.rate_limit.api.path.over_limit"),
        2
    );
    server.stop().await;
}

/// A Deployment that only sets the reference's variables: `USE_STATSD=true` with
/// `STATSD_HOST` / `STATSD_PORT`, `EXTRA_TAGS` and `STATS_FLUSH_INTERVAL` reach a TCP
/// listener as plain StatsD with gostats-style tags.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_variables_send_statsd_over_tcp() {
    common::away_from_an_hour_boundary().await;
    let (addr, received) = tcp_server().await;
    let dir = common::config_dir(&[("api.yaml", API)]);
    let port = addr.port().to_string();
    let mut binary = Binary::start_with_env_only(&[
        ("FLOODGATE_CONFIG", dir.path().to_str().unwrap()),
        ("FLOODGATE_GRPC_ADDR", "127.0.0.1:0"),
        ("FLOODGATE_HTTP_ADDR", "127.0.0.1:0"),
        ("USE_STATSD", "true"),
        ("STATSD_HOST", "127.0.0.1"),
        ("STATSD_PORT", port.as_str()),
        ("EXTRA_TAGS", "cluster:eu1"),
        ("STATS_FLUSH_INTERVAL", "50ms"),
    ]);
    let mut client = RateLimitServiceClient::connect(format!("http://{}", binary.grpc))
        .await
        .expect("client connects");
    for expected in [OK, OK, OK, OVER, OVER] {
        let call = request("api", vec![descriptor(&[("path", "/x")])]);
        assert_eq!(
            should_rate_limit(&mut client, call).await.overall_code,
            expected
        );
    }
    let name = "ratelimit.service.rate_limit.api.path.over_limit.__cluster=eu1";
    assert_eq!(received.settled_total(name, 2).await, 2);
    binary.signal("TERM");
    assert_eq!(binary.wait_exit(Duration::from_secs(15)).await, Some(0));
}

/// A TCP StatsD server that accepts connections and never reads them; its receive buffer
/// is small, so the sink's writes soon block.
async fn stuck_tcp_server() -> (SocketAddr, JoinHandle<()>) {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(16).unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    (addr, task)
}

/// A closed TCP port, a closed UDP port, and a TCP server that never reads: every answer
/// is the one a server without StatsD gives, every call returns, and the unsent lines are
/// counted as dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_or_stuck_statsd_server_changes_no_answer() {
    common::away_from_an_hour_boundary().await;
    let closed_tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let closed_tcp_addr = closed_tcp.local_addr().unwrap();
    drop(closed_tcp);
    let closed_udp = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let closed_udp_addr = closed_udp.local_addr().unwrap();
    drop(closed_udp);
    let (stuck_addr, stuck) = stuck_tcp_server().await;
    let fast = Duration::from_millis(10);
    for (what, addr, protocol) in [
        ("closed TCP port", closed_tcp_addr, Protocol::Tcp),
        ("closed UDP port", closed_udp_addr, Protocol::Udp),
        ("TCP server that never reads", stuck_addr, Protocol::Tcp),
    ] {
        let mut settings = statsd(addr.to_string(), protocol, Flavor::Statsd, &[]);
        settings.flush_interval = fast;
        let server = start(settings).await;
        let mut client = server.client().await;
        // 600 calls over 200 detailed series with long keys: every flush has changes to
        // send, megabytes in all, far past the stuck server's window and the sink's buffer.
        for round in 0..600_usize {
            let mut descriptors = vec![descriptor(&[("path", "/x")])];
            descriptors.extend((0..20).map(|j| {
                let user = format!("user-{:03}-{}", (round * 20 + j) % 200, "x".repeat(200));
                descriptor(&[("user", user.as_str())])
            }));
            let call = request("api", descriptors);
            let response = tokio::time::timeout(
                Duration::from_secs(30),
                should_rate_limit(&mut client, call),
            )
            .await
            .unwrap_or_else(|_| panic!("{what}: call {round} did not return"));
            let expected = if round < 3 { OK } else { OVER };
            assert_eq!(response.overall_code, expected, "{what}: call {round}");
            assert_eq!(response.statuses.len(), 21, "{what}");
            assert!(
                response.statuses[1..].iter().all(|s| s.code == OK),
                "{what}"
            );
        }
        let mut count = 0;
        eventually(Duration::from_secs(15), async || {
            count = dropped(&server).await;
            count > 0
        })
        .await;
        assert!(count > 0, "{what}: no line counted as dropped");
        server.stop().await;
    }
    stuck.abort();
}
