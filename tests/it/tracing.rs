//! OpenTelemetry tracing of the real binary against OTLP collectors started here (gRPC and
//! HTTP/protobuf): spans arrive with the caller's W3C parent, the documented attributes and a
//! backend child span, never a descriptor value; spans queued at SIGTERM are flushed; and with
//! tracing off nothing is sent.

use crate::common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Binary, descriptor, eventually, request};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;
use tempfile::TempDir;

const RULES: &str = "\
domain: traced
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 1000000}
";
/// A descriptor value no exported byte may contain (it could be a user's key).
const SECRET_VALUE: &str = "s3cret-user-4711";
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_SPAN_ID: &str = "00f067aa0ba902b7";
/// Spans are exported every 100 ms, so the tests need not wait for the 5 s default.
const QUICK_EXPORT: (&str, &str) = ("OTEL_BSP_SCHEDULE_DELAY", "100");
/// Longest wait for a span to arrive.
const ARRIVAL: Duration = Duration::from_secs(20);

/// Every export request a collector received, as protobuf bytes.
#[derive(Clone, Default)]
struct Received(Arc<Mutex<Vec<Vec<u8>>>>);

impl Received {
    fn push(&self, payload: Vec<u8>) {
        self.0.lock().unwrap().push(payload);
    }

    fn payloads(&self) -> Vec<Vec<u8>> {
        self.0.lock().unwrap().clone()
    }

    /// Every span received, with the `service.name` of its resource.
    fn spans(&self) -> Vec<(String, Span)> {
        let mut spans = Vec::new();
        for payload in self.payloads() {
            let request = ExportTraceServiceRequest::decode(payload.as_slice()).unwrap();
            for resource_spans in request.resource_spans {
                let resource = resource_spans.resource.unwrap_or_default();
                let service = string_attribute(&resource.attributes, "service.name");
                for scope in resource_spans.scope_spans {
                    for span in scope.spans {
                        spans.push((service.clone().unwrap_or_default(), span));
                    }
                }
            }
        }
        spans
    }

    /// Waits (bounded) until a span named `name` arrived and returns it with its service.
    async fn wait_for(&self, name: &str) -> (String, Span) {
        let mut found = None;
        eventually(ARRIVAL, async || {
            found = self.spans().into_iter().find(|(_, span)| span.name == name);
            found.is_some()
        })
        .await;
        found.unwrap_or_else(|| panic!("no `{name}` span within {ARRIVAL:?}"))
    }

    /// No descriptor value or key appears anywhere in what was exported.
    fn assert_no_descriptor_data(&self) {
        for payload in self.payloads() {
            for needle in [SECRET_VALUE, "api_key"] {
                assert!(
                    !payload
                        .windows(needle.len())
                        .any(|window| window == needle.as_bytes()),
                    "`{needle}` was exported"
                );
            }
        }
    }
}

/// An OTLP/gRPC TraceService that records what it is sent.
struct GrpcCollector(Received);

#[tonic::async_trait]
impl TraceService for GrpcCollector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.push(request.into_inner().encode_to_vec());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// Starts an OTLP/gRPC collector on a free loopback port; it lives until the test ends.
async fn grpc_collector() -> (SocketAddr, Received) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received = Received::default();
    let service = TraceServiceServer::new(GrpcCollector(received.clone()));
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    (addr, received)
}

/// Starts an OTLP/HTTP collector (protobuf bodies on `/v1/traces`) on a free loopback port.
async fn http_collector() -> (SocketAddr, Received) {
    use axum::routing::post;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received = Received::default();
    let sink = received.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        post(move |body: axum::body::Bytes| {
            let sink = sink.clone();
            async move {
                sink.push(body.to_vec());
                (
                    [("content-type", "application/x-protobuf")],
                    ExportTraceServiceResponse::default().encode_to_vec(),
                )
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, received)
}

fn rules() -> TempDir {
    common::config_dir(&[("traced.yaml", RULES)])
}

fn traceparent(flags: &str) -> String {
    format!("00-{TRACE_ID}-{PARENT_SPAN_ID}-{flags}")
}

/// One ShouldRateLimit call carrying `traceparent` (when given) and a secret descriptor value.
async fn call(grpc: SocketAddr, traceparent: Option<&str>) -> RateLimitResponse {
    let mut client = RateLimitServiceClient::connect(format!("http://{grpc}"))
        .await
        .expect("client connects");
    let mut call = tonic::Request::new(request(
        "traced",
        vec![descriptor(&[("api_key", SECRET_VALUE)])],
    ));
    if let Some(traceparent) = traceparent {
        call.metadata_mut()
            .insert("traceparent", traceparent.parse().unwrap());
        call.metadata_mut()
            .insert("tracestate", "envoy=1".parse().unwrap());
    }
    client
        .should_rate_limit(call)
        .await
        .expect("ShouldRateLimit succeeds")
        .into_inner()
}

fn attribute<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a Value> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|AnyValue { value }| value.as_ref())
}

fn string_attribute(attributes: &[KeyValue], key: &str) -> Option<String> {
    match attribute(attributes, key)? {
        Value::StringValue(text) => Some(text.clone()),
        _ => None,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The call's span is the caller's child and carries domain, count and code; the backend's
/// span is its child.
async fn assert_traced_call(received: &Received, service: &str) {
    let (service_name, call) = received.wait_for("ShouldRateLimit").await;
    assert_eq!(service_name, service);
    assert_eq!(hex(&call.trace_id), TRACE_ID);
    assert_eq!(hex(&call.parent_span_id), PARENT_SPAN_ID);
    assert_eq!(call.kind, SpanKind::Server as i32);
    assert_eq!(
        string_attribute(&call.attributes, "ratelimit.domain").as_deref(),
        Some("traced")
    );
    assert_eq!(
        attribute(&call.attributes, "ratelimit.descriptor_count"),
        Some(&Value::IntValue(1))
    );
    assert_eq!(
        string_attribute(&call.attributes, "ratelimit.overall_code").as_deref(),
        Some("OK")
    );
    let (_, backend) = received.wait_for("backend.decide").await;
    assert_eq!(backend.trace_id, call.trace_id);
    assert_eq!(backend.parent_span_id, call.span_id);
    assert_eq!(
        attribute(&backend.attributes, "ratelimit.charges"),
        Some(&Value::IntValue(1))
    );
    received.assert_no_descriptor_data();
}

#[tokio::test]
async fn grpc_collector_gets_the_call_span_under_the_callers_parent() {
    let (collector, received) = grpc_collector().await;
    let dir = rules();
    let endpoint = format!("http://{collector}");
    let server = Binary::start(
        &[
            "--config",
            dir.path().to_str().unwrap(),
            "--otlp-protocol",
            "grpc",
            "--otlp-endpoint",
            &endpoint,
        ],
        &[QUICK_EXPORT],
    );
    let response = call(server.grpc, Some(&traceparent("01"))).await;
    assert_eq!(response.overall_code, 1, "OK");
    assert_traced_call(&received, "floodgate").await;
}

#[tokio::test]
async fn http_collector_gets_what_was_queued_at_sigterm() {
    let (collector, received) = http_collector().await;
    let dir = rules();
    let endpoint = format!("http://{collector}");
    // Nothing is exported on schedule within the test: only the shutdown flush sends spans.
    let mut server = Binary::start(
        &[
            "--config",
            dir.path().to_str().unwrap(),
            "--otlp-endpoint",
            &endpoint,
            "--tracing-service-name",
            "edge-limits",
            "--health-grace",
            "0",
        ],
        &[("OTEL_BSP_SCHEDULE_DELAY", "600000")],
    );
    call(server.grpc, Some(&traceparent("01"))).await;
    // The caller decided not to sample this trace: its call is not exported.
    let unsampled = "00-11111111111111111111111111111111-2222222222222222-00";
    call(server.grpc, Some(unsampled)).await;
    server.signal("TERM");
    assert_eq!(server.wait_exit(Duration::from_secs(20)).await, Some(0));
    assert_traced_call(&received, "edge-limits").await;
    let calls: Vec<_> = received
        .spans()
        .into_iter()
        .filter(|(_, span)| span.name == "ShouldRateLimit")
        .collect();
    assert_eq!(calls.len(), 1, "the unsampled call was exported");
}

#[tokio::test]
async fn the_reference_variables_and_the_standard_endpoint_turn_tracing_on() {
    let (collector, received) = grpc_collector().await;
    let dir = rules();
    let endpoint = format!("http://{collector}");
    let server = Binary::start_with_env_only(&[
        ("FLOODGATE_CONFIG", dir.path().to_str().unwrap()),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("TRACING_ENABLED", "true"),
        ("TRACING_EXPORTER_PROTOCOL", "grpc"),
        ("TRACING_SERVICE_NAMESPACE", "gateway"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
        QUICK_EXPORT,
    ]);
    call(server.grpc, Some(&traceparent("01"))).await;
    // TRACING_SERVICE_NAME unset: the reference's own default name.
    assert_traced_call(&received, "RateLimit").await;
}

#[tokio::test]
async fn with_tracing_off_nothing_is_sent() {
    let (grpc, grpc_received) = grpc_collector().await;
    let (http, http_received) = http_collector().await;
    let dir = rules();
    // The standard variables alone do not turn tracing on (nor do they in the reference).
    let grpc_endpoint = format!("http://{grpc}");
    let http_endpoint = format!("http://{http}");
    let mut server = Binary::start(
        &[
            "--config",
            dir.path().to_str().unwrap(),
            "--health-grace",
            "0",
        ],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &grpc_endpoint),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &http_endpoint),
            QUICK_EXPORT,
        ],
    );
    for _ in 0..5 {
        call(server.grpc, Some(&traceparent("01"))).await;
    }
    // Past the export schedule, and through the shutdown path that would flush.
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.signal("TERM");
    assert_eq!(server.wait_exit(Duration::from_secs(20)).await, Some(0));
    assert!(grpc_received.payloads().is_empty());
    assert!(http_received.payloads().is_empty());
}

/// Runs `floodgate serve` with settings that must stop it before it listens.
fn refused(args: &[&str], envs: &[(&str, &str)]) -> (Option<i32>, String) {
    let out = common::serve_command()
        .args(args)
        .envs(envs.iter().copied())
        .output()
        .expect("run floodgate");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn unusable_tracing_settings_stop_startup() {
    let (code, stderr) = refused(&["--otlp-endpoint", "https://collector:4318"], &[]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("--otlp-protocol grpc"), "{stderr}");
    let (code, stderr) = refused(&["--otlp-endpoint", "collector:4318"], &[]);
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("not an http:// or https:// URL"),
        "{stderr}"
    );
    let (code, stderr) = refused(
        &[],
        &[
            ("TRACING_ENABLED", "true"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318"),
        ],
    );
    assert_eq!(code, Some(1));
    assert!(stderr.contains("OTEL_EXPORTER_OTLP_ENDPOINT"), "{stderr}");
    let (code, _) = refused(&["--tracing-sampling-rate", "2"], &[]);
    assert_eq!(code, Some(2));
    let (code, stderr) = refused(
        &[],
        &[
            ("TRACING_ENABLED", "true"),
            ("TRACING_SAMPLING_RATE", "all"),
        ],
    );
    assert_eq!(code, Some(2));
    assert!(stderr.contains("TRACING_SAMPLING_RATE"), "{stderr}");
}

/// A client-sent domain is cut to 256 bytes in the span (a 900 KB domain used to be copied
/// whole into every queued span), and at `--tracing-sampling-rate 0` a caller's sampled flag
/// no longer turns tracing on.
#[tokio::test]
async fn span_attributes_are_capped_and_rate_zero_exports_nothing() {
    let (collector, received) = grpc_collector().await;
    let dir = rules();
    let endpoint = format!("http://{collector}");
    let args = |rate: &'static str| {
        vec![
            "--config".to_owned(),
            dir.path().to_str().unwrap().to_owned(),
            "--otlp-protocol".into(),
            "grpc".into(),
            "--otlp-endpoint".into(),
            endpoint.clone(),
            "--tracing-sampling-rate".into(),
            rate.into(),
        ]
    };
    let huge_domain = "d".repeat(900_000);
    let server = Binary::start(
        &args("1").iter().map(String::as_str).collect::<Vec<_>>(),
        &[QUICK_EXPORT],
    );
    let mut client = RateLimitServiceClient::connect(format!("http://{}", server.grpc))
        .await
        .unwrap();
    let mut huge =
        tonic::Request::new(request(&huge_domain, vec![descriptor(&[("api_key", "v")])]));
    huge.metadata_mut()
        .insert("traceparent", traceparent("01").parse().unwrap());
    let status = client.should_rate_limit(huge).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    let (_, span) = received.wait_for("ShouldRateLimit").await;
    let domain = string_attribute(&span.attributes, "ratelimit.domain").unwrap();
    assert_eq!(domain.len(), 256);
    drop(server);

    let (collector, received) = grpc_collector().await;
    let endpoint = format!("http://{collector}");
    let mut args = args("0");
    args[5] = endpoint;
    let mut server = Binary::start(
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        &[QUICK_EXPORT],
    );
    for _ in 0..5 {
        call(server.grpc, Some(&traceparent("01"))).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.signal("TERM");
    assert_eq!(server.wait_exit(Duration::from_secs(20)).await, Some(0));
    assert!(
        received.payloads().is_empty(),
        "a rate-0 replica exported spans"
    );
}

/// Most resident memory the two scenarios below may add, in KiB. Each sends 400 calls of a
/// 900 KB domain (so 360 MB of client text) with a sampled `traceparent` and an 8 KB
/// `tracestate`, to an exporter whose collector never reads: a queued span keeps at most
/// 256 bytes of the domain and no tracestate over 512 bytes, so the 2,048-span queue holds a
/// few MB. The rest of the bound is allocator slack for the transient 900 KB messages.
const MAX_RSS_GROWTH_KB: u64 = 32 * 1024;

/// A collector that accepts connections and never reads from them: the exporter's calls
/// stall, and spans wait in its queue. Holds at most 64 connections.
async fn silent_collector() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while held.len() < 64 {
            match listener.accept().await {
                Ok((socket, _)) => held.push(socket),
                Err(_) => break,
            }
        }
        std::future::pending::<()>().await;
    });
    (addr, task)
}

/// RSS growth of a replica at `--tracing-sampling-rate rate` over 400 invalid calls, each
/// with a 900 KB domain, a sampled `traceparent` and a long `tracestate`.
async fn rss_growth_over_huge_domains(rate: &str) -> u64 {
    let (collector, holder) = silent_collector().await;
    let dir = rules();
    let endpoint = format!("http://{collector}");
    let server = Binary::start(
        &[
            "--config",
            dir.path().to_str().unwrap(),
            "--otlp-protocol",
            "grpc",
            "--otlp-endpoint",
            &endpoint,
            "--tracing-sampling-rate",
            rate,
        ],
        &[QUICK_EXPORT],
    );
    let pid = server.child.id();
    for _ in 0..20 {
        call(server.grpc, Some(&traceparent("01"))).await;
    }
    let before = common::rss_kib(pid);
    let mut client = RateLimitServiceClient::connect(format!("http://{}", server.grpc))
        .await
        .unwrap();
    let huge_domain = "d".repeat(900_000);
    let tracestate: Vec<String> = (0..32)
        .map(|i| format!("k{i}={}", "v".repeat(250)))
        .collect();
    let tracestate = tracestate.join(",");
    for _ in 0..400 {
        let mut huge =
            tonic::Request::new(request(&huge_domain, vec![descriptor(&[("api_key", "v")])]));
        let metadata = huge.metadata_mut();
        metadata.insert("traceparent", traceparent("01").parse().unwrap());
        metadata.insert("tracestate", tracestate.parse().unwrap());
        let status = client.should_rate_limit(huge).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
    }
    // The batch processor takes the last spans into its queue within its schedule (100 ms).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = common::rss_kib(pid);
    holder.abort();
    eprintln!("rate {rate}: VmRSS {before} kB -> {after} kB");
    after.saturating_sub(before)
}

/// Issue 20 item 6, both scenarios against a collector that never reads: 400 invalid calls
/// with a 900 KB domain took RSS from 20 MB to 419 MB (the span, made before validation,
/// copied the domain whole), and at rate 0 a caller's sampled flag still made spans (200
/// calls: 228 MB). Now both stay under `MAX_RSS_GROWTH_KB`.
#[tokio::test]
async fn huge_domains_and_a_silent_collector_keep_memory_bounded() {
    for rate in ["1", "0"] {
        let growth = rss_growth_over_huge_domains(rate).await;
        assert!(
            growth < MAX_RSS_GROWTH_KB,
            "rate {rate}: RSS grew by {growth} KiB"
        );
    }
}
