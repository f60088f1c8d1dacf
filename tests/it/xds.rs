//! Rules over xDS against a test ADS server (tonic, built from the independent
//! `envoy-types` protos): pushed rules answer, a change applies, an invalid update is NACKed
//! with its error while the old rules answer, and a restarted server gets a resubscription
//! carrying the last ACKed version. Also: start and readiness without initial rules, and
//! LLM token budgets as Envoy AI Gateway spends them, whose rules from xDS `consume`.

use crate::common;

use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use common::{
    TestServer, current_limit, descriptor, eventually, http, metric_line, request,
    should_rate_limit, wait_for_limit,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor as EnvoyDescriptor;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use floodgate::rules::OnOverLimit;
use floodgate::xds::{Backoff, XdsSettings};
use futures::{SinkExt, Stream};
use prost::Message;
use tokio::sync::{mpsc, watch};
use tonic::transport::{Certificate, Identity, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

pub(crate) const TYPE_URL: &str =
    "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// The resource as the management server encodes it: written here from the
/// go-control-plane field numbers, independently of floodgate's own proto.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct RateLimitConfig {
    #[prost(string, tag = "1")]
    pub(crate) name: String,
    #[prost(string, tag = "2")]
    pub(crate) domain: String,
    #[prost(message, repeated, tag = "3")]
    pub(crate) descriptors: Vec<RateLimitDescriptor>,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct RateLimitDescriptor {
    #[prost(string, tag = "1")]
    pub(crate) key: String,
    #[prost(string, tag = "2")]
    pub(crate) value: String,
    #[prost(message, optional, tag = "3")]
    pub(crate) rate_limit: Option<RateLimitPolicy>,
    #[prost(message, repeated, tag = "4")]
    pub(crate) descriptors: Vec<RateLimitDescriptor>,
    #[prost(bool, tag = "5")]
    pub(crate) shadow_mode: bool,
    #[prost(bool, tag = "6")]
    pub(crate) detailed_metric: bool,
    #[prost(bool, tag = "7")]
    pub(crate) quota_mode: bool,
}

#[derive(Clone, PartialEq, Message)]
pub(crate) struct RateLimitPolicy {
    /// 1 = SECOND, 2 = MINUTE, 3 = HOUR, 4 = DAY, 5 = MONTH, 6 = YEAR, 7 = WEEK, 0 = UNKNOWN.
    #[prost(int32, tag = "1")]
    pub(crate) unit: i32,
    #[prost(uint32, tag = "2")]
    pub(crate) requests_per_unit: u32,
    #[prost(bool, tag = "3")]
    pub(crate) unlimited: bool,
    #[prost(string, tag = "4")]
    pub(crate) name: String,
}

/// One resource limiting domain `xds`, key `k`, to `limit` per `unit`.
fn rules(name: &str, unit: i32, limit: u32) -> Vec<Any> {
    let config = RateLimitConfig {
        name: name.into(),
        domain: "xds".into(),
        descriptors: vec![RateLimitDescriptor {
            key: "k".into(),
            value: String::new(),
            rate_limit: Some(RateLimitPolicy {
                unit,
                requests_per_unit: limit,
                ..Default::default()
            }),
            descriptors: Vec::new(),
            ..Default::default()
        }],
    };
    vec![Any {
        type_url: TYPE_URL.into(),
        value: config.encode_to_vec(),
    }]
}

/// (version, resources) the server pushes to every stream.
pub(crate) type Snapshot = Option<(String, Vec<Any>)>;

/// What the test ADS server saw: each request, with the stream's `x-token` header.
type Seen = (DiscoveryRequest, Option<String>);

#[derive(Clone)]
struct Ads {
    snapshot: watch::Receiver<Snapshot>,
    seen: mpsc::UnboundedSender<Seen>,
    /// Becomes true to cut every stream (a crash, as the client sees it).
    killed: watch::Receiver<bool>,
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;
type DeltaStream = Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = ResponseStream;
    type DeltaAggregatedResourcesStream = DeltaStream;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<ResponseStream>, Status> {
        let token = request
            .metadata()
            .get("x-token")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        let mut inbound = request.into_inner();
        let (mut out, responses) = futures::channel::mpsc::channel(16);
        let (mut snapshot, seen, mut killed) = (
            self.snapshot.clone(),
            self.seen.clone(),
            self.killed.clone(),
        );
        tokio::spawn(async move {
            let mut sent: Option<String> = None;
            let mut nonce = 0u32;
            loop {
                tokio::select! {
                    message = inbound.message() => match message {
                        Ok(Some(message)) => {
                            let _ = seen.send((message, token.clone()));
                        }
                        _ => return,
                    },
                    changed = snapshot.changed() => if changed.is_err() { return },
                    killed_now = async { killed.wait_for(|killed| *killed).await.is_ok() } => {
                        if killed_now {
                            let _ = out
                                .send(Err(Status::unavailable("management server going away")))
                                .await;
                        }
                        return;
                    }
                }
                let current = snapshot.borrow_and_update().clone();
                if let Some((version, resources)) = current
                    && sent.as_ref() != Some(&version)
                {
                    nonce += 1;
                    let response = DiscoveryResponse {
                        version_info: version.clone(),
                        resources,
                        type_url: TYPE_URL.into(),
                        nonce: format!("nonce-{version}-{nonce}"),
                        ..Default::default()
                    };
                    if out.send(Ok(response)).await.is_err() {
                        return;
                    }
                    sent = Some(version);
                }
            }
        });
        Ok(Response::new(Box::pin(responses)))
    }

    async fn delta_aggregated_resources(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<DeltaStream>, Status> {
        Err(Status::unimplemented("State of the World only"))
    }
}

/// A running test ADS server and its controls.
pub(crate) struct AdsServer {
    pub(crate) addr: SocketAddr,
    snapshot: watch::Sender<Snapshot>,
    seen: mpsc::UnboundedReceiver<Seen>,
    killed: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl AdsServer {
    /// Serves on `addr` (port 0 picks one) with `snapshot`, in plaintext.
    pub(crate) async fn start(addr: SocketAddr, snapshot: Snapshot) -> AdsServer {
        AdsServer::start_with_tls(addr, snapshot, None).await
    }

    /// Serves on `addr` with `snapshot`, over TLS when `tls` is given.
    async fn start_with_tls(
        addr: SocketAddr,
        snapshot: Snapshot,
        tls: Option<ServerTlsConfig>,
    ) -> AdsServer {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .expect("ADS binds");
        let addr = listener.local_addr().expect("ADS address");
        let (snapshot, snapshot_rx) = watch::channel(snapshot);
        let (seen_tx, seen) = mpsc::unbounded_channel();
        let (killed, killed_rx) = watch::channel(false);
        let ads = Ads {
            snapshot: snapshot_rx,
            seen: seen_tx,
            killed: killed_rx.clone(),
        };
        let mut stop = killed_rx;
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = tls {
            builder = builder.tls_config(tls).expect("server TLS config");
        }
        let task = tokio::spawn(async move {
            let _ = builder
                .add_service(AggregatedDiscoveryServiceServer::new(ads))
                .serve_with_incoming_shutdown(
                    tonic::transport::server::TcpIncoming::from(listener),
                    async move {
                        let _ = stop.wait_for(|killed| *killed).await;
                    },
                )
                .await;
        });
        AdsServer {
            addr,
            snapshot,
            seen,
            killed,
            task,
        }
    }

    fn push(&self, version: &str, resources: Vec<Any>) {
        self.snapshot
            .send_replace(Some((version.to_owned(), resources)));
    }

    /// The next request floodgate sends (bounded wait).
    async fn next_request(&mut self) -> Seen {
        tokio::time::timeout(Duration::from_secs(20), self.seen.recv())
            .await
            .expect("floodgate sends a discovery request in time")
            .expect("ADS server alive")
    }

    /// Cuts every stream and stops listening, as a crashed management server would.
    async fn crash(self) -> SocketAddr {
        self.killed.send_replace(true);
        let mut task = self.task;
        if tokio::time::timeout(Duration::from_secs(5), &mut task)
            .await
            .is_err()
        {
            task.abort();
        }
        self.addr
    }
}

/// Starts floodgate with `adjust` applied; bind waits for the first xDS rules unless forced
/// to start without, so the wait is bounded here.
pub(crate) async fn start_floodgate(
    adjust: impl FnOnce(&mut floodgate::server::Settings),
) -> TestServer {
    tokio::time::timeout(Duration::from_secs(30), TestServer::start_with(&[], adjust))
        .await
        .expect("floodgate starts (its first xDS rules arrive) in time")
}

pub(crate) fn xds_settings(addr: SocketAddr) -> XdsSettings {
    XdsSettings {
        server: addr.to_string(),
        node_id: "test-node".into(),
        node_metadata: vec![("zone".into(), "z1".into())],
        headers: vec![("x-token".into(), "t0ken".into())],
        tls: None,
        stall_timeout: Duration::from_secs(5),
        max_message_bytes: floodgate::xds::DEFAULT_MAX_MESSAGE_BYTES,
        backoff: Backoff {
            initial: Duration::from_millis(50),
            max: Duration::from_millis(200),
            jitter: 0.5,
        },
    }
}

/// The descriptor whose limit shows which rules floodgate applies.
const PROBE: (&str, &str) = ("k", "v");

/// The limit floodgate reports for `xds` / `k`, or None.
async fn limit(server: &TestServer) -> Option<u32> {
    current_limit(server, "xds", PROBE).await
}

#[tokio::test]
async fn rules_arrive_change_get_nacked_and_survive_a_server_restart() {
    let mut ads = AdsServer::start(
        "127.0.0.1:0".parse().unwrap(),
        Some(("v1".into(), rules("first", 2, 5))),
    )
    .await;
    let addr = ads.addr;
    // Without --force-start-without-initial-config, bind returns once v1 is in force.
    let server = start_floodgate(|settings| {
        settings.xds = Some(xds_settings(addr));
    })
    .await;
    assert_eq!(limit(&server).await, Some(5));

    let (subscribe, token) = ads.next_request().await;
    assert_eq!(token.as_deref(), Some("t0ken"));
    assert_eq!(subscribe.type_url, TYPE_URL);
    assert_eq!(subscribe.version_info, "");
    assert!(subscribe.resource_names.is_empty());
    let node = subscribe.node.expect("node");
    assert_eq!(node.id, "test-node");
    assert!(node.metadata.expect("metadata").fields.contains_key("zone"));
    let (ack, _) = ads.next_request().await;
    assert_eq!(
        (ack.version_info.as_str(), ack.response_nonce.as_str()),
        ("v1", "nonce-v1-1")
    );
    assert!(ack.error_detail.is_none());

    ads.push("v2", rules("second", 2, 7));
    let (ack, _) = ads.next_request().await;
    assert_eq!(ack.version_info, "v2");
    assert!(ack.error_detail.is_none());
    wait_for_limit(&server, "xds", PROBE, Some(7)).await;

    // UNKNOWN unit: invalid, as a file without `unit:` is.
    ads.push("v3", rules("broken-resource", 0, 3));
    let (nack, _) = ads.next_request().await;
    assert_eq!(
        nack.version_info, "v2",
        "a NACK keeps the last good version"
    );
    assert!(nack.response_nonce.starts_with("nonce-v3"));
    let detail = nack.error_detail.expect("a NACK carries the error").message;
    assert!(
        detail.contains("broken-resource") && detail.contains("unit"),
        "{detail}"
    );
    assert_eq!(limit(&server).await, Some(7), "old rules still answer");
    assert!(
        metric_line(server.http, "floodgate_config_load_error_total")
            .await
            .ends_with(" 1")
    );

    // The management server goes away: the last good rules keep answering.
    let addr = ads.crash().await;
    assert_eq!(limit(&server).await, Some(7));
    let mut ads = AdsServer::start(addr, Some(("v4".into(), rules("fourth", 2, 9)))).await;
    let (resubscribe, _) = ads.next_request().await;
    assert_eq!(
        resubscribe.version_info, "v2",
        "resubscribes with the last ACK"
    );
    assert_eq!(resubscribe.type_url, TYPE_URL);
    let (ack, _) = ads.next_request().await;
    assert_eq!(ack.version_info, "v4");
    wait_for_limit(&server, "xds", PROBE, Some(9)).await;
    server.stop().await;
}

/// (gRPC health SERVING, `/healthcheck` 200): read one after the other, so a test waits
/// for both to agree.
async fn readiness(server: &TestServer) -> (bool, bool) {
    let mut health = HealthClient::new(server.channel().await);
    let status = health
        .check(HealthCheckRequest {
            service: "envoy.service.ratelimit.v3.RateLimitService".into(),
        })
        .await
        .expect("health check")
        .into_inner()
        .status();
    let http_ok = http("GET", &server.http_url("/healthcheck"), "").await.0 == 200;
    (status == ServingStatus::Serving, http_ok)
}

/// Polls until gRPC health and `/healthcheck` both say `ready` (bounded); returns whether
/// they did.
async fn wait_for_readiness(server: &TestServer, ready: bool) -> bool {
    eventually(Duration::from_secs(5), async || {
        readiness(server).await == (ready, ready)
    })
    .await
}

#[tokio::test]
async fn forced_start_serves_at_once_and_is_ready_only_with_rules() {
    let mut ads = AdsServer::start("127.0.0.1:0".parse().unwrap(), None).await;
    let addr = ads.addr;
    let server = start_floodgate(|settings| {
        settings.xds = Some(xds_settings(addr));
        settings.startup.force_start_without_initial_config = true;
        settings.startup.ready_only_with_rules = true;
    })
    .await;
    // Listening before any rule: calls are UNAVAILABLE, as the reference errors.
    let mut client = server.client().await;
    let error = client
        .should_rate_limit(request("xds", vec![descriptor(&[("k", "v")])]))
        .await
        .expect_err("no rules yet");
    assert_eq!(error.code(), tonic::Code::Unavailable);
    let _subscribe = ads.next_request().await;
    // The memory backend answers at once, so only the missing rules hold readiness back.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        readiness(&server).await,
        (false, false),
        "not ready without rules"
    );

    ads.push("v1", rules("first", 2, 5));
    let (ack, _) = ads.next_request().await;
    assert_eq!(ack.version_info, "v1");
    wait_for_limit(&server, "xds", PROBE, Some(5)).await;
    assert!(
        wait_for_readiness(&server, true).await,
        "ready once rules arrived"
    );

    // An update that empties the rules makes the replica unready again.
    ads.push("v2", Vec::new());
    let _ack = ads.next_request().await;
    assert!(
        wait_for_readiness(&server, false).await,
        "no domain: NOT_SERVING"
    );
    server.stop().await;
}

#[tokio::test]
async fn without_the_readiness_gate_an_empty_rule_set_is_ready() {
    let ads = AdsServer::start(
        "127.0.0.1:0".parse().unwrap(),
        Some(("v1".into(), Vec::new())),
    )
    .await;
    let addr = ads.addr;
    let server = start_floodgate(|settings| {
        settings.xds = Some(xds_settings(addr));
    })
    .await;
    assert!(wait_for_readiness(&server, true).await);
    assert_eq!(limit(&server).await, None, "no domain, no limit");
    server.stop().await;
    drop(ads);
}

/// A CA, a server certificate for `xds.test` and a client certificate, all PEM.
struct Pki {
    ca: String,
    server: (String, String),
    client: (String, String),
}

fn pki() -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("CA key"))
        .expect("CA certificate");
    let leaf = |name: &str| {
        let key = KeyPair::generate().expect("key");
        let cert = CertificateParams::new(vec![name.to_owned()])
            .expect("params")
            .signed_by(&key, &ca)
            .expect("certificate");
        (cert.pem(), key.serialize_pem())
    };
    Pki {
        ca: ca.pem(),
        server: leaf("xds.test"),
        client: leaf("floodgate.test"),
    }
}

#[tokio::test]
async fn rules_arrive_over_mutual_tls() {
    let pki = pki();
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(&pki.server.0, &pki.server.1))
        .client_ca_root(Certificate::from_pem(&pki.ca));
    let ads = AdsServer::start_with_tls(
        "127.0.0.1:0".parse().unwrap(),
        Some(("v1".into(), rules("first", 2, 5))),
        Some(tls),
    )
    .await;
    let files = tempfile::tempdir().expect("tempdir");
    let write = |name: &str, text: &str| {
        let path = files.path().join(name);
        std::fs::write(&path, text).expect("write PEM");
        path
    };
    let mut settings = xds_settings(ads.addr);
    settings.tls = Some(floodgate::xds::XdsTls {
        cert: Some(write("client.pem", &pki.client.0)),
        key: Some(write("client.key", &pki.client.1)),
        ca: Some(write("ca.pem", &pki.ca)),
        // The server is reached by IP; its certificate names xds.test.
        san: Some("xds.test".into()),
    });
    let server = start_floodgate(|s| s.xds = Some(settings)).await;
    assert_eq!(limit(&server).await, Some(5));
    server.stop().await;
    drop(ads);
}

/// A management server that accepts the connection and never answers is left after the
/// stall timeout and tried again, instead of keeping the replica waiting without a word.
#[tokio::test]
async fn a_server_that_never_answers_is_left_and_retried() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let server = start_floodgate(|settings| {
        let mut xds = xds_settings(addr);
        xds.stall_timeout = Duration::from_millis(300);
        settings.xds = Some(xds);
        settings.startup.force_start_without_initial_config = true;
    })
    .await;
    let mut held = Vec::new();
    for attempt in 0..3 {
        let accepted = tokio::time::timeout(Duration::from_secs(10), silent.accept()).await;
        let (socket, _) = accepted
            .unwrap_or_else(|_| panic!("no connection attempt {attempt} within 10 s"))
            .unwrap();
        held.push(socket);
    }
    server.stop().await;
}

#[tokio::test]
async fn an_empty_snapshot_leaves_no_domain_and_says_so_in_a_metric() {
    let ads = AdsServer::start(
        "127.0.0.1:0".parse().unwrap(),
        Some(("v1".into(), rules("r", 2, 5))),
    )
    .await;
    let addr = ads.addr;
    let server = start_floodgate(|settings| {
        settings.xds = Some(xds_settings(addr));
    })
    .await;
    assert_eq!(
        metric_line(server.http, "floodgate_loaded_domains ").await,
        "floodgate_loaded_domains 1"
    );
    ads.push("v2", Vec::new());
    eventually(Duration::from_secs(5), async || {
        limit(&server).await.is_none()
    })
    .await;
    assert_eq!(limit(&server).await, None, "the empty snapshot is applied");
    assert_eq!(
        metric_line(server.http, "floodgate_loaded_domains ").await,
        "floodgate_loaded_domains 0"
    );
    assert!(wait_for_readiness(&server, true).await, "health stays OK");
    server.stop().await;
    drop(ads);
}

/// `chains` descriptor chains `depth` deep, each ending in a limit: about 864 KB encoded
/// for 2,500 chains of 60.
fn deep_chains(chains: usize, depth: usize) -> Vec<Any> {
    let descriptors = (0..chains)
        .map(|chain| {
            let mut node = RateLimitDescriptor {
                key: format!("k{}", depth - 1),
                value: "v".into(),
                rate_limit: Some(RateLimitPolicy {
                    unit: 2,
                    requests_per_unit: 5,
                    ..Default::default()
                }),
                descriptors: Vec::new(),
                ..Default::default()
            };
            for level in (0..depth - 1).rev() {
                node = RateLimitDescriptor {
                    key: format!("k{level}"),
                    value: if level == 0 {
                        chain.to_string()
                    } else {
                        "v".into()
                    },
                    rate_limit: None,
                    descriptors: vec![node],
                    ..Default::default()
                };
            }
            node
        })
        .collect();
    let config = RateLimitConfig {
        name: "deep".into(),
        domain: "deep".into(),
        descriptors,
    };
    vec![Any {
        type_url: TYPE_URL.into(),
        value: config.encode_to_vec(),
    }]
}

/// Peak resident memory of process `pid`, in KiB (`VmHWM`).
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

/// An update of 2,500 chains 60 deep is answered with a bounded peak memory (it took the
/// process from 20 MB to 717 MB when each resource was rendered pretty-printed first).
// The ADS server runs on the test's runtime while `Binary::start` blocks one thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deep_and_wide_update_is_answered_with_bounded_memory() {
    let mut ads = AdsServer::start(
        "127.0.0.1:0".parse().unwrap(),
        Some(("v1".into(), rules("r", 2, 5))),
    )
    .await;
    let server = common::Binary::start(
        &[
            "--config-source",
            "xds",
            "--xds-server",
            &ads.addr.to_string(),
        ],
        &[],
    );
    let pid = server.child.id();
    let before = peak_rss_kib(pid);
    let update = deep_chains(2_500, 60);
    let encoded: usize = update.iter().map(|any| any.value.len()).sum();
    assert!(encoded > 800_000, "{encoded} bytes");
    ads.push("v2", update);
    loop {
        let (request, _) = ads.next_request().await;
        if request.response_nonce.starts_with("nonce-v2") {
            break;
        }
    }
    let grown_mib = peak_rss_kib(pid).saturating_sub(before) / 1024;
    eprintln!("an update of {encoded} bytes grew the peak RSS by {grown_mib} MiB");
    assert!(grown_mib < 250, "peak RSS grew by {grown_mib} MiB");
    drop(server);
}

/// The domain Envoy Gateway names after a policy whose rules are `shared`
/// (`internal/xds/translator/ratelimit.go`, v1.9.x: `<namespace>/<policy>`), as
/// `deploy/ai-gateway/token-budgets.yaml`'s policy gets.
const BUDGETS: &str = "default/llm-token-budgets";
/// The top-level keys of the policy's rules 0 and 1, `<namespace>/<policy>/rule/<i>`.
const TENANT_RULE: &str = "default/llm-token-budgets/rule/0";
const TOTAL_RULE: &str = "default/llm-token-budgets/rule/1";

/// Envoy AI Gateway's token budgets, with rules as Envoy Gateway sends shared ones (see
/// `tests/it/gateway.rs` for the shapes): rule 0, per tenant (a distinct header, so a
/// `rule-0-match-0` level without a value), `budget` tokens a second; rule 1, an hourly
/// budget for all (`rule-1-match-0` with its own name as value) that no test spends.
fn budget_rules(budget: u32) -> Vec<Any> {
    let rule = |key: &str, child: RateLimitDescriptor| RateLimitDescriptor {
        key: key.into(),
        value: key.into(),
        descriptors: vec![child],
        ..Default::default()
    };
    let limited = |key: &str, value: &str, unit, requests_per_unit| RateLimitDescriptor {
        key: key.into(),
        value: value.into(),
        rate_limit: Some(RateLimitPolicy {
            unit,
            requests_per_unit,
            ..Default::default()
        }),
        ..Default::default()
    };
    let config = RateLimitConfig {
        name: BUDGETS.into(),
        domain: BUDGETS.into(),
        // 1 = SECOND, 3 = HOUR.
        descriptors: vec![
            rule(TENANT_RULE, limited("rule-0-match-0", "", 1, budget)),
            rule(
                TOTAL_RULE,
                limited("rule-1-match-0", "rule-1-match-0", 3, TOTAL_BUDGET),
            ),
        ],
    };
    vec![Any {
        type_url: TYPE_URL.into(),
        value: config.encode_to_vec(),
    }]
}

/// The hourly budget of `total`: far above what a test charges.
const TOTAL_BUDGET: u32 = 4_000_000_000;

/// A descriptor with its own `hits_addend` (Envoy's per-descriptor cost).
fn costing(pairs: &[(&str, &str)], hits: u64) -> EnvoyDescriptor {
    EnvoyDescriptor {
        hits_addend: Some(envoy_types::pb::google::protobuf::UInt64Value { value: hits }),
        ..descriptor(pairs)
    }
}

/// Envoy AI Gateway's two-phase flow against rules from xDS, whose accounting is `consume`
/// when they do not say: before each "response" a check of `hits_addend` 0 ("is the budget
/// spent?"), after it the response's cost, 500 to 8,000 tokens, whose answer Envoy ignores.
/// Per one-second window of 10,000 tokens: once the charges reach the budget no check is
/// admitted until the window ends, the admitted responses cost at most the budget plus one
/// response, and every charge is booked (the `total` descriptor, charged alongside, ends
/// down by exactly the sum of the charges, those answered OVER_LIMIT included).
async fn two_phase_budget_holds(adjust: impl FnOnce(&mut floodgate::server::Settings)) {
    const BUDGET: u64 = 10_000;
    let ads = AdsServer::start(
        "127.0.0.1:0".parse().unwrap(),
        Some(("v1".into(), budget_rules(BUDGET as u32))),
    )
    .await;
    let addr = ads.addr;
    let server = start_floodgate(|settings| {
        settings.xds = Some(xds_settings(addr));
        adjust(settings);
    })
    .await;
    let mut client = server.client().await;
    let tenant = [(TENANT_RULE, TENANT_RULE), ("rule-0-match-0", "t1")];
    let total = [
        (TOTAL_RULE, TOTAL_RULE),
        ("rule-1-match-0", "rule-1-match-0"),
    ];
    // (charged, admitted) tokens per epoch second, and whether the budget was spent in it.
    let mut windows: std::collections::BTreeMap<i64, (u64, u64)> = Default::default();
    let (mut charged, mut checks, mut admitted_after_spent) = (0u64, 0u64, Vec::new());
    let start = tokio::time::Instant::now();
    let mut i: u64 = 0;
    while start.elapsed() < Duration::from_secs(6) {
        i += 1;
        let now = floodgate::clock::Clock::now_ms(&floodgate::clock::SystemClock);
        // Nothing is sent near a window's edge, where a check and its charge could fall in
        // different seconds of the backend.
        let (window, into) = (now.div_euclid(1000), now.rem_euclid(1000));
        if !(60..900).contains(&into) {
            let wait = (1060 - into).rem_euclid(1000) as u64;
            tokio::time::sleep(Duration::from_millis(wait.max(1))).await;
            continue;
        }
        let check =
            should_rate_limit(&mut client, request(BUDGETS, vec![costing(&tenant, 0)])).await;
        checks += 1;
        let spent = windows.get(&window).is_some_and(|(c, _)| *c >= BUDGET);
        if check.overall_code == 1 {
            if spent {
                admitted_after_spent.push((window, into));
            }
            let cost = 500 + (i * 7919) % 7501;
            let charge = request(BUDGETS, vec![costing(&tenant, cost), costing(&total, cost)]);
            should_rate_limit(&mut client, charge).await;
            let entry = windows.entry(window).or_default();
            entry.0 += cost;
            entry.1 += cost;
            charged += cost;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!("{checks} checks; charged {charged}; per window {windows:?}");
    assert!(
        admitted_after_spent.is_empty(),
        "admitted after the budget was spent: {admitted_after_spent:?}"
    );
    for (window, (_, admitted)) in &windows {
        assert!(
            *admitted <= BUDGET + 8_000,
            "window {window}: {admitted} tokens admitted"
        );
    }
    let peek = should_rate_limit(&mut client, request(BUDGETS, vec![costing(&total, 0)])).await;
    let left = peek.statuses[0].limit_remaining;
    assert_eq!(
        u64::from(TOTAL_BUDGET) - u64::from(left),
        charged,
        "booked vs charged"
    );
    assert!(windows.len() >= 5 && charged > 5 * BUDGET, "{windows:?}");
    server.stop().await;
    ads.crash().await;
}

#[tokio::test]
async fn a_two_phase_token_budget_holds_on_memory() {
    two_phase_budget_holds(|_| {}).await;
}

#[tokio::test]
async fn a_two_phase_token_budget_holds_on_redis() {
    let redis = common::redis::RedisServer::start();
    let url = redis.url();
    two_phase_budget_holds(move |settings| {
        settings.backend = floodgate::backend::BackendSettings::Redis {
            url,
            options: common::redis_options(Duration::from_secs(2)),
        };
    })
    .await;
}

#[tokio::test]
async fn a_two_phase_token_budget_holds_on_a_cluster() {
    let cluster = common::redis::RedisCluster::start_async().await;
    let urls = cluster.urls();
    two_phase_budget_holds(move |settings| {
        settings.backend = floodgate::backend::BackendSettings::Cluster {
            urls,
            options: common::redis_options(Duration::from_secs(2)),
        };
    })
    .await;
}

/// Rules from files keep `reject` unless `--on-over-limit consume` says otherwise: the
/// over-limit charge books nothing by default, and everything with the flag.
#[tokio::test]
async fn files_reject_by_default_and_the_flag_makes_them_consume() {
    let rules = "domain: ai\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 10000}\n";
    for (flag, remaining_after) in [(None, 4_000), (Some(OnOverLimit::Consume), 0)] {
        let server = TestServer::start_with(&[("ai.yaml", rules)], move |settings| {
            settings.on_over_limit = flag;
        })
        .await;
        let mut client = server.client().await;
        let tenant = [("tenant", "t")];
        for cost in [6_000, 6_000] {
            should_rate_limit(&mut client, request("ai", vec![costing(&tenant, cost)])).await;
        }
        let peek = should_rate_limit(&mut client, request("ai", vec![costing(&tenant, 0)])).await;
        assert_eq!(
            peek.statuses[0].limit_remaining, remaining_after,
            "{flag:?}"
        );
        server.stop().await;
    }
}

/// A request under a per-model and a per-tenant budget is denied by whichever is spent;
/// under `reject` the denial books nothing on the other, under `consume` both book the cost
/// (Kuadrant/limitador#513 is the failure to avoid: a denial charged to the other budget
/// under `reject`).
#[tokio::test]
async fn the_spent_budget_denies_and_the_accounting_decides_what_the_other_books() {
    let rules = "domain: ai\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 10000}\n  - key: model\n    rate_limit: {unit: hour, requests_per_unit: 10000}\n";
    for (flag, model_left) in [(None, 10_000), (Some(OnOverLimit::Consume), 9_500)] {
        let server = TestServer::start_with(&[("ai.yaml", rules)], move |settings| {
            settings.on_over_limit = flag;
        })
        .await;
        let mut client = server.client().await;
        let (tenant, model) = ([("tenant", "t1")], [("model", "m1")]);
        should_rate_limit(&mut client, request("ai", vec![costing(&tenant, 10_000)])).await;
        let both = request("ai", vec![costing(&model, 500), costing(&tenant, 500)]);
        let answer = should_rate_limit(&mut client, both).await;
        // 2 = OVER_LIMIT: the tenant's budget is spent, the model's is not.
        assert_eq!(answer.overall_code, 2, "{flag:?}");
        assert_eq!(answer.statuses[0].code, 1, "{flag:?}");
        let peek = should_rate_limit(&mut client, request("ai", vec![costing(&model, 0)])).await;
        assert_eq!(peek.statuses[0].limit_remaining, model_left, "{flag:?}");
        server.stop().await;
    }
}

/// Issue 48: the overshoot of the two-phase flow with requests in flight at once. 64 callers
/// ask (`hits_addend` 0) and, once admitted, pay 500 tokens, in a loop, against 20,000 an
/// hour: a check is admitted while anything is left, so every caller whose check passed
/// before the budget was spent pays on top. The admitted cost ends within the budget plus
/// one response per caller in flight (64 x 500), and past the budget by at most that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_two_phase_requests_overrun_by_at_most_one_response_each() {
    const CALLERS: u64 = 64;
    const COST: u64 = 500;
    const BUDGET: u64 = 20_000;
    common::away_from_an_hour_boundary().await;
    let rules = format!(
        "domain: ai\ndescriptors:\n  - key: tenant\n    rate_limit: {{unit: hour, requests_per_unit: {BUDGET}, on_over_limit: consume}}\n"
    );
    let server = TestServer::start(&[("ai.yaml", &rules)]).await;
    let tenant = [("tenant", "t1")];
    let callers = (0..CALLERS).map(|_| {
        let channel = server.channel();
        async move {
            let mut client = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::new(channel.await);
            let mut paid = 0;
            loop {
                let check = should_rate_limit(&mut client, request("ai", vec![costing(&tenant, 0)])).await;
                if check.overall_code != 1 {
                    return paid;
                }
                should_rate_limit(&mut client, request("ai", vec![costing(&tenant, COST)])).await;
                paid += COST;
            }
        }
    });
    let admitted: u64 = futures::future::join_all(callers).await.into_iter().sum();
    let overrun = admitted.saturating_sub(BUDGET);
    eprintln!("{CALLERS} callers in flight admitted {admitted} tokens of {BUDGET}: {overrun} over");
    assert!(admitted >= BUDGET, "{admitted}");
    assert!(overrun <= CALLERS * COST, "{overrun} over the budget");
    server.stop().await;
}
