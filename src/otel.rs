//! OpenTelemetry tracing over OTLP (docs/operations.md#tracing): the exporter and tracer
//! provider, the `tracing` layer that feeds them, the W3C trace context read from a call's
//! gRPC metadata, and the two spans floodgate exports.
//!
//! Off unless `--otlp-endpoint` (or the reference's `TRACING_ENABLED`) turns it on. When off,
//! nothing here runs on the request path: no layer is installed, no metadata is read and no
//! span is created, so a call costs what it did without tracing.
//!
//! Spans carry the domain, counts and codes, never descriptor keys or values: those often
//! name users, API keys or client addresses, and a trace backend is not the place for them.
//!
//! The standard `OTEL_EXPORTER_OTLP_*` variables are read by the OTLP exporter itself
//! (endpoint when no flag names one, headers, timeout, gRPC `INSECURE`); a flag wins over them.

use std::fmt;
use std::time::Duration;

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::tonic_types::transport::ClientTlsConfig;
use opentelemetry_otlp::{WithExportConfig, WithTonicConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing::Span;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::registry::LookupSpan;

mod b3;

/// The `tracing` target of every exported span: the OpenTelemetry layer sees only these, and
/// the log output never shows them.
pub const TARGET: &str = "floodgate::otel";
/// Default `service.name` of the exported spans.
pub const DEFAULT_SERVICE_NAME: &str = "floodgate";
/// The reference's `service.name` when `TRACING_SERVICE_NAME` is unset, kept when tracing is
/// turned on by `TRACING_ENABLED` so existing trace queries keep matching.
pub const REFERENCE_SERVICE_NAME: &str = "RateLimit";
/// Longest client-sent text a span attribute keeps, in bytes.
///
/// The SDK's batch processor bounds its queue in spans only (`OTEL_BSP_MAX_QUEUE_SIZE`,
/// default 2,048; no byte bound exists in opentelemetry_sdk 0.33), so the bytes are bounded
/// per span instead: what a client sends reaches a span only as this domain prefix and as a
/// `tracestate` of at most [`MAX_TRACESTATE_BYTES`], a span holds under 2 KB, and the
/// default queue under 4 MB, whatever the requests send.
const MAX_ATTRIBUTE_BYTES: usize = 256;
/// Longest caller `tracestate` kept, in bytes (the W3C minimum a vendor should propagate);
/// a longer one is dropped whole (the trace id and parent stay), since the SDK would copy
/// up to 32 entries of 512 bytes into every span of the call.
const MAX_TRACESTATE_BYTES: usize = 512;
/// The OTLP/HTTP path of traces, appended to an `--otlp-endpoint` without a path.
const HTTP_TRACES_PATH: &str = "/v1/traces";
/// How long shutdown waits for the last spans to be exported.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);
/// The standard variables that name the endpoint when no flag does, most specific first.
const ENDPOINT_VARIABLES: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// How spans travel to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OtlpProtocol {
    /// OTLP/gRPC (usually port 4317); `https://` endpoints use TLS with the public web roots.
    Grpc,
    /// OTLP/HTTP with protobuf bodies (usually port 4318), plain HTTP.
    #[default]
    Http,
}

/// What to export and how (`--otlp-*`, `--tracing-*`).
#[derive(Debug, Clone, PartialEq)]
pub struct TracingSettings {
    /// The collector; `None` leaves it to `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`,
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` or the OTLP default (`http://localhost:4318` for HTTP,
    /// `http://localhost:4317` for gRPC), as the reference does.
    pub endpoint: Option<String>,
    /// gRPC or HTTP.
    pub protocol: OtlpProtocol,
    /// `service.name`.
    pub service_name: String,
    /// `service.namespace`, when given.
    pub service_namespace: Option<String>,
    /// `service.instance.id`; a random UUID when not given, as the reference does.
    pub service_instance_id: Option<String>,
    /// Share of new traces sampled, 0 to 1; a call with a parent follows the parent's flag.
    pub sampling_rate: f64,
}

impl TracingSettings {
    /// Checks what the exporter would only find out at its first export.
    ///
    /// # Errors
    /// A rate outside 0..=1, an endpoint that is not an `http(s)://` URL, or HTTPS with the
    /// HTTP protocol (whose client speaks plain HTTP only).
    pub fn check(&self) -> Result<(), TracingSettingsError> {
        if !(0.0..=1.0).contains(&self.sampling_rate) {
            return Err(TracingSettingsError::SamplingRate(self.sampling_rate));
        }
        if let Some(endpoint) = &self.endpoint {
            check_endpoint("--otlp-endpoint", endpoint, self.protocol)?;
        }
        Ok(())
    }

    /// The URL the exporter is given, or None to let it read the standard variables. An
    /// HTTP endpoint without a path gets the traces path, as `OTEL_EXPORTER_OTLP_ENDPOINT`
    /// does.
    fn exporter_endpoint(&self) -> Option<String> {
        let endpoint = self.endpoint.as_deref()?.trim_end_matches('/');
        let has_path = endpoint
            .split_once("://")
            .is_some_and(|(_, rest)| rest.contains('/'));
        Some(match self.protocol {
            OtlpProtocol::Http if !has_path => format!("{endpoint}{HTTP_TRACES_PATH}"),
            _ => endpoint.to_owned(),
        })
    }
}

/// Why tracing settings cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TracingSettingsError {
    /// The sampling rate is outside 0..=1.
    #[error("--tracing-sampling-rate {0} is not between 0 and 1")]
    SamplingRate(f64),
    /// An endpoint that is not an `http(s)://` URL; `source` names the flag or variable.
    #[error("{origin} `{endpoint}` is not an http:// or https:// URL")]
    NotHttp {
        /// Where the endpoint came from.
        origin: String,
        /// The endpoint.
        endpoint: String,
    },
    /// HTTPS over the HTTP protocol, whose client speaks plain HTTP only.
    #[error(
        "{origin} `{endpoint}`: OTLP over HTTPS needs --otlp-protocol grpc (the HTTP \
         exporter speaks plain HTTP)"
    )]
    HttpsOverHttp {
        /// Where the endpoint came from.
        origin: String,
        /// The endpoint.
        endpoint: String,
    },
}

/// Checks a flag's endpoint: an `http(s)://` URL the protocol can reach.
fn check_endpoint(
    source: &str,
    endpoint: &str,
    protocol: OtlpProtocol,
) -> Result<(), TracingSettingsError> {
    if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
        return Err(TracingSettingsError::NotHttp {
            origin: source.to_owned(),
            endpoint: endpoint.to_owned(),
        });
    }
    check_reachable(source, endpoint, protocol)
}

/// Rejects HTTPS over the HTTP protocol, whose client speaks plain HTTP only. Anything else
/// in a standard variable is the exporter's to judge (it applies `INSECURE` to an endpoint
/// without a scheme, for instance).
fn check_reachable(
    source: &str,
    endpoint: &str,
    protocol: OtlpProtocol,
) -> Result<(), TracingSettingsError> {
    if protocol == OtlpProtocol::Http && endpoint.starts_with("https://") {
        return Err(TracingSettingsError::HttpsOverHttp {
            origin: source.to_owned(),
            endpoint: endpoint.to_owned(),
        });
    }
    Ok(())
}

/// Why tracing could not start.
#[derive(Debug, thiserror::Error)]
#[error("OpenTelemetry tracing: {0}")]
pub struct TracingError(String);

/// A running tracer provider: spans are batched and exported on the Tokio runtime.
pub struct Tracing {
    provider: SdkTracerProvider,
}

impl fmt::Debug for Tracing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Tracing")
    }
}

impl Tracing {
    /// Builds the exporter and the provider. Must run inside a Tokio runtime, which must
    /// outlive [`Tracing::shutdown`]: the batch processor and the exporter run on it.
    ///
    /// # Errors
    /// Invalid settings, or a standard variable the exporter rejects (e.g. an endpoint that
    /// is not a URL, or a compression floodgate is not built with).
    pub fn start(settings: &TracingSettings) -> Result<Tracing, TracingError> {
        settings
            .check()
            .map_err(|error| TracingError(error.to_string()))?;
        if settings.endpoint.is_none() {
            for variable in ENDPOINT_VARIABLES {
                if let Some(endpoint) = std::env::var(variable).ok().filter(|v| !v.is_empty()) {
                    check_reachable(variable, &endpoint, settings.protocol)
                        .map_err(|error| TracingError(error.to_string()))?;
                    break;
                }
            }
        }
        let endpoint = settings.exporter_endpoint();
        let exporter = match settings.protocol {
            OtlpProtocol::Grpc => {
                let builder = opentelemetry_otlp::SpanExporter::builder()
                    .with_tonic()
                    // Used for `https://` endpoints only; plain ones stay plain.
                    .with_tls_config(ClientTlsConfig::new().with_enabled_roots());
                match endpoint {
                    Some(endpoint) => builder.with_endpoint(endpoint).build(),
                    None => builder.build(),
                }
            }
            OtlpProtocol::Http => {
                let builder = opentelemetry_otlp::SpanExporter::builder().with_http();
                match endpoint {
                    Some(endpoint) => builder.with_endpoint(endpoint).build(),
                    None => builder.build(),
                }
            }
        }
        .map_err(|error| TracingError(error.to_string()))?;
        let processor =
            BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio).build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(sampler(settings.sampling_rate))
            .with_resource(resource(settings))
            .build();
        Ok(Tracing { provider })
    }

    /// The `tracing` layer that turns floodgate's spans (target [`TARGET`]) into
    /// OpenTelemetry spans; it ignores everything else.
    pub fn layer<S>(&self) -> impl Layer<S> + Send + Sync + 'static
    where
        S: tracing::Subscriber + for<'span> LookupSpan<'span> + Send + Sync,
    {
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("floodgate"))
            // Source locations, threads and busy/idle times say nothing about a decision.
            .with_location(false)
            .with_threads(false)
            .with_tracked_inactivity(false)
            .with_target(false)
            .with_filter(filter_fn(|metadata| metadata.target() == TARGET))
    }

    /// Exports the spans still queued (bounded by a timeout) and stops the exporter. Call
    /// it outside the runtime's tasks, before the runtime is dropped.
    pub fn shutdown(self) {
        if let Err(error) = self.provider.shutdown_with_timeout(FLUSH_TIMEOUT) {
            tracing::warn!(%error, "OpenTelemetry: spans may be lost at shutdown");
        }
    }
}

/// The sampler of a sampling rate: a caller's sampled flag is followed (as Envoy's traces
/// expect), except at rate 0, which means no span at all: a caller must not be able to turn
/// tracing on (and fill the exporter's queue) where the operator turned it off.
fn sampler(rate: f64) -> Sampler {
    if rate <= 0.0 {
        return Sampler::AlwaysOff;
    }
    Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(rate)))
}

/// `text` cut to at most `max` bytes, at a character boundary.
fn truncated(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `service.name`, `service.namespace` and `service.instance.id`, over the SDK's defaults
/// (which add `OTEL_RESOURCE_ATTRIBUTES`).
fn resource(settings: &TracingSettings) -> Resource {
    let instance = settings
        .service_instance_id
        .clone()
        .unwrap_or_else(random_uuid);
    let mut builder = Resource::builder()
        .with_service_name(settings.service_name.clone())
        .with_attribute(KeyValue::new("service.instance.id", instance));
    if let Some(namespace) = &settings.service_namespace {
        builder = builder.with_attribute(KeyValue::new("service.namespace", namespace.clone()));
    }
    builder.build()
}

/// A random version-4 UUID, the default `service.instance.id`.
fn random_uuid() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// The span of one `ShouldRateLimit` call, child of the caller's trace context (W3C or B3,
/// see `caller_context`) when `headers` carry one. Its code is recorded by [`record_code`].
pub fn should_rate_limit_span(headers: &dyn Extractor, domain: &str, descriptors: usize) -> Span {
    // The span is made before the request is validated: a client-sent text is cut, so a
    // queued span holds at most this much of it.
    let domain = truncated(domain, MAX_ATTRIBUTE_BYTES);
    let span = tracing::info_span!(
        target: TARGET,
        "ShouldRateLimit",
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.service = "envoy.service.ratelimit.v3.RateLimitService",
        rpc.method = "ShouldRateLimit",
        ratelimit.domain = domain,
        ratelimit.descriptor_count = count(descriptors),
        ratelimit.overall_code = Empty,
        otel.status_code = Empty,
    );
    // Fails only when the span is disabled, which leaves nothing to parent.
    drop(span.set_parent(caller_context(headers)));
    span
}

/// The caller's trace context: W3C (`traceparent`, `tracestate`) when it sends a valid one,
/// else B3 (`b3`, or `x-b3-traceid` and its companions), as Envoy sends under Zipkin tracing.
fn caller_context(headers: &dyn Extractor) -> Context {
    let headers = BoundedTraceState(headers);
    let w3c = TraceContextPropagator::new().extract_with_context(&Context::new(), &headers);
    if w3c.span().span_context().is_valid() {
        return w3c;
    }
    match b3::extract(&headers) {
        Some(caller) => w3c.with_remote_span_context(caller),
        None => w3c,
    }
}

/// A caller's trace context headers with a `tracestate` longer than [`MAX_TRACESTATE_BYTES`]
/// left out.
struct BoundedTraceState<'a>(&'a dyn Extractor);

impl Extractor for BoundedTraceState<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        let value = self.0.get(key)?;
        if key.eq_ignore_ascii_case("tracestate") && value.len() > MAX_TRACESTATE_BYTES {
            return None;
        }
        Some(value)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys()
    }
}

/// Records the call's answer: the overall code (or the error's gRPC code), and an error
/// status when the backend was unavailable.
pub fn record_code(span: &Span, code: &'static str) {
    span.record("ratelimit.overall_code", code);
    if code == "UNAVAILABLE" {
        span.record("otel.status_code", "ERROR");
    }
}

/// The span of one backend call, inside a traced call; a disabled span otherwise (nothing is
/// created when tracing is off or the call came from elsewhere, e.g. `/json`).
pub fn backend_span(charges: usize) -> Span {
    let traced = Span::current()
        .metadata()
        .is_some_and(|metadata| metadata.target() == TARGET);
    if !traced {
        return Span::none();
    }
    tracing::info_span!(
        target: TARGET,
        "backend.decide",
        otel.kind = "client",
        ratelimit.charges = count(charges),
        error.type = Empty,
        otel.status_code = Empty,
    )
}

/// A count as the OTLP integer attribute it is: unsigned fields would be exported as text.
fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Marks a backend span failed with the error's kind (never its message, which may name
/// hosts).
pub fn record_backend_error(span: &Span, kind: &'static str) {
    span.record("error.type", kind);
    span.record("otel.status_code", "ERROR");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(endpoint: &str, protocol: OtlpProtocol) -> TracingSettings {
        TracingSettings {
            endpoint: Some(endpoint.to_owned()),
            protocol,
            service_name: DEFAULT_SERVICE_NAME.to_owned(),
            service_namespace: None,
            service_instance_id: None,
            sampling_rate: 1.0,
        }
    }

    #[test]
    fn the_caller_context_comes_from_w3c_else_from_b3() {
        use opentelemetry::trace::TraceContextExt;
        let trace_of = |pairs: &[(&str, &str)]| {
            let headers: std::collections::HashMap<String, String> = pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            let context = caller_context(&headers);
            let span = context.span().span_context().clone();
            span.is_valid().then(|| span.trace_id().to_string())
        };
        let w3c = (
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        );
        let single = ("b3", "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-1");
        let multi = [
            ("x-b3-traceid", "463ac35c9f6413ad48485a3953bb6124"),
            ("x-b3-spanid", "a2fb4a1d1a96d312"),
            ("x-b3-sampled", "1"),
        ];
        assert_eq!(
            trace_of(&[w3c, single]).as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        assert_eq!(
            trace_of(&[single]).as_deref(),
            Some("80f198ee56343ba864fe8b2a57d3eff7")
        );
        assert_eq!(
            trace_of(&multi).as_deref(),
            Some("463ac35c9f6413ad48485a3953bb6124")
        );
        assert_eq!(trace_of(&[("b3", "garbage")]), None);
    }

    #[test]
    fn a_long_tracestate_is_left_out_and_the_parent_kept() {
        use opentelemetry::trace::TraceContextExt;
        let parent = |tracestate: String| {
            let headers = std::collections::HashMap::from([
                (
                    "traceparent".to_owned(),
                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
                ),
                ("tracestate".to_owned(), tracestate),
            ]);
            let context = TraceContextPropagator::new()
                .extract_with_context(&Context::new(), &BoundedTraceState(&headers));
            context.span().span_context().clone()
        };
        let short = parent("vendor=abc".to_owned());
        assert_eq!(short.trace_state().header(), "vendor=abc");
        let entries: Vec<String> = (0..32)
            .map(|i| format!("k{i}={}", "v".repeat(200)))
            .collect();
        let long = parent(entries.join(","));
        assert!(long.is_valid() && long.is_sampled());
        assert_eq!(long.trace_state().header(), "");
    }

    #[test]
    fn http_endpoints_without_a_path_get_the_traces_path() {
        for (given, sent) in [
            ("http://c:4318", "http://c:4318/v1/traces"),
            ("http://c:4318/", "http://c:4318/v1/traces"),
            ("http://c:4318/custom/traces", "http://c:4318/custom/traces"),
        ] {
            let endpoint = settings(given, OtlpProtocol::Http).exporter_endpoint();
            assert_eq!(endpoint.as_deref(), Some(sent), "{given}");
        }
        let grpc = settings("http://c:4317", OtlpProtocol::Grpc).exporter_endpoint();
        assert_eq!(grpc.as_deref(), Some("http://c:4317"));
    }

    #[test]
    fn bad_settings_are_rejected() {
        assert!(
            settings("http://c:4318", OtlpProtocol::Http)
                .check()
                .is_ok()
        );
        assert!(
            settings("https://c:4317", OtlpProtocol::Grpc)
                .check()
                .is_ok()
        );
        assert!(
            settings("https://c:4318", OtlpProtocol::Http)
                .check()
                .is_err()
        );
        assert!(settings("c:4317", OtlpProtocol::Grpc).check().is_err());
        let mut rate = settings("http://c:4318", OtlpProtocol::Http);
        rate.sampling_rate = 1.5;
        assert!(rate.check().is_err());
    }

    #[test]
    fn instance_ids_are_version_4_uuids() {
        let id = random_uuid();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
        assert!(matches!(&id[19..20], "8" | "9" | "a" | "b"), "{id}");
        assert_ne!(id, random_uuid());
    }
}
