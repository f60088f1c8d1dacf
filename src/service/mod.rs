//! The gRPC `envoy.service.ratelimit.v3.RateLimitService`: protobuf <-> engine types, and
//! the one place where errors become gRPC statuses.
//!
//! Protocol decisions made here:
//! - cost per descriptor: the descriptor's `hits_addend` when present (0 = peek), else the
//!   request's when > 0, else 1 (as the reference service does);
//! - an override with unit `UNKNOWN` (or an unknown number) is `INVALID_ARGUMENT`;
//! - the caller's `grpc-timeout` bounds the backend work, so a failure mode still answers
//!   before the caller gives up.

use std::sync::Arc;
use std::time::Instant as StdInstant;

use opentelemetry::propagation::Extractor;
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::metadata::{KeyRef, MetadataMap};
use tonic::{Request as GrpcRequest, Response as GrpcResponse, Status as GrpcStatus};

use crate::headers::{self, HeaderMode};
use crate::limiter::request::InvalidRequest;
use crate::limiter::request::bounds::MAX_DESCRIPTORS;
use crate::limiter::{
    Code, Descriptor, Fallback, LimitError, LimitOverride, Limiter, Request, Response, Status,
};
use crate::metrics::Metrics;
use crate::otel;
use crate::overload::{Admission, Arrival, Caller, Deadline, ShedReason};
use crate::proto::core::HeaderValue;
use crate::proto::rls::rate_limit_response::{
    Code as ProtoCode, DescriptorStatus, RateLimit, rate_limit::Unit as ProtoUnit,
};
use crate::proto::rls::rate_limit_service_server::RateLimitService;
use crate::proto::rls::{RateLimitRequest, RateLimitResponse};
use crate::proto::types::RateLimitUnit;
use crate::rules::Unit;

mod dynamic_metadata;

/// Why a request got no decision.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    /// The request breaks the request rules (docs/requests.md#validation).
    #[error("invalid request: {0}")]
    Invalid(#[from] InvalidRequest),
    /// The backend failed and the failure mode is `error`.
    #[error("rate limit backend unavailable")]
    Unavailable(LimitError),
    /// Started without rules (`--force-start-without-initial-config`) and none arrived yet.
    #[error("no rate limit configuration loaded yet")]
    NoRules,
}

impl From<LimitError> for DecideError {
    fn from(error: LimitError) -> DecideError {
        match error {
            LimitError::TooCostly(invalid) => DecideError::Invalid(invalid),
            backend @ LimitError::Backend(_) => DecideError::Unavailable(backend),
        }
    }
}

impl From<DecideError> for GrpcStatus {
    /// `UNAVAILABLE` lets Envoy's `failure_mode_deny` decide whether traffic passes; the
    /// backend's own message (which may name hosts) is logged, never sent.
    fn from(error: DecideError) -> Self {
        match error {
            DecideError::Invalid(invalid) => GrpcStatus::invalid_argument(invalid.0),
            DecideError::Unavailable(_) => {
                GrpcStatus::unavailable("rate limit backend unavailable")
            }
            DecideError::NoRules => {
                GrpcStatus::unavailable("no rate limit configuration loaded yet")
            }
        }
    }
}

/// Decides protobuf requests with a limiter; shared by gRPC and the admin `/json` endpoint.
#[derive(Clone)]
pub struct RlsService {
    limiter: Arc<Limiter>,
    header_mode: HeaderMode,
    dynamic_metadata: bool,
    /// Whether gRPC calls get an OpenTelemetry span (`--otlp-endpoint`).
    traced: bool,
    /// Set when serving may start before the first rules: true once they arrived.
    rules_loaded: Option<watch::Receiver<bool>>,
    /// Overload shedding of gRPC calls; None serves every call however late.
    admission: Option<Arc<Admission>>,
}

impl RlsService {
    /// A service answering from `limiter`, adding `header_mode` headers.
    pub fn new(limiter: Arc<Limiter>, header_mode: HeaderMode) -> RlsService {
        RlsService {
            limiter,
            header_mode,
            dynamic_metadata: false,
            traced: false,
            rules_loaded: None,
            admission: None,
        }
    }

    /// Sheds gRPC calls that cannot be served in time (see [`crate::overload`]).
    pub fn with_admission(mut self, admission: Option<Arc<Admission>>) -> RlsService {
        self.admission = admission;
        self
    }

    /// Answers UNAVAILABLE until `loaded` turns true, as the reference answers before its
    /// first config: Envoy's `failure_mode_deny` then decides.
    pub fn with_rules_gate(mut self, loaded: watch::Receiver<bool>) -> RlsService {
        self.rules_loaded = Some(loaded);
        self
    }

    /// Also answers with dynamic metadata (see [`dynamic_metadata`]).
    pub fn with_dynamic_metadata(mut self, enabled: bool) -> RlsService {
        self.dynamic_metadata = enabled;
        self
    }

    /// Gives every gRPC call a span, child of the caller's `traceparent` (see
    /// [`crate::otel`]). Off, calls read no trace header and create no span.
    pub fn with_tracing(mut self, enabled: bool) -> RlsService {
        self.traced = enabled;
        self
    }

    /// [`RlsService::decide`] inside a `ShouldRateLimit` span that records the answer.
    async fn decide_traced(
        &self,
        metadata: &MetadataMap,
        request: &RateLimitRequest,
        caller: Caller,
    ) -> Result<RateLimitResponse, DecideError> {
        use tracing::Instrument;
        let headers = MetadataExtractor(metadata);
        let span =
            otel::should_rate_limit_span(&headers, &request.domain, request.descriptors.len());
        let result = self.decide(request, caller).instrument(span.clone()).await;
        otel::record_code(&span, decision_code(&result));
        result
    }

    /// Validates, decides and encodes one request for `caller`.
    ///
    /// # Errors
    /// `Invalid` for bad input, `Unavailable` for a backend failure under `--failure-mode error`.
    pub async fn decide(
        &self,
        request: &RateLimitRequest,
        caller: Caller,
    ) -> Result<RateLimitResponse, DecideError> {
        let metrics = self.limiter.metrics();
        #[allow(
            clippy::disallowed_methods,
            reason = "the request latency histogram reports real time, also under a paused clock"
        )]
        let started = StdInstant::now();
        let result = async {
            if self
                .rules_loaded
                .as_ref()
                .is_some_and(|loaded| !*loaded.borrow())
            {
                return Err(DecideError::NoRules);
            }
            let parsed = to_request(request).inspect_err(|_| {
                metrics.invalid_requests.inc();
            })?;
            let decided = self.limiter.should_rate_limit(&parsed, caller).await?;
            let mut response = to_proto_response(&decided, self.header_mode);
            if self.dynamic_metadata {
                response.dynamic_metadata = Some(dynamic_metadata::build(request, &decided));
            }
            Ok(response)
        }
        .await;
        Metrics::observe(&metrics.request_latency, started.elapsed());
        metrics.decided(decision_code(&result));
        if let Err(DecideError::Unavailable(error)) = &result {
            tracing::debug!(%error, "answering UNAVAILABLE");
        }
        result
    }
}

#[tonic::async_trait]
impl RateLimitService for RlsService {
    async fn should_rate_limit(
        &self,
        request: GrpcRequest<RateLimitRequest>,
    ) -> Result<GrpcResponse<RateLimitResponse>, GrpcStatus> {
        let arrival = request.extensions().get::<Arrival>();
        // The caller's clock started before the call reached this host, not when this task
        // first ran.
        let arrived = arrival.map_or_else(Instant::now, Arrival::received);
        let deadline = request
            .metadata()
            .get("grpc-timeout")
            .and_then(|value| value.to_str().ok())
            .and_then(|value| Deadline::from_grpc_timeout(value, arrived))
            // Without shedding (`--overload-target-latency 0`) the deadline only bounds the
            // work: no backend queue refuses a call for it.
            .map(|deadline| match self.admission {
                Some(_) => deadline,
                None => deadline.without_shedding(),
            });
        let descriptors = request.get_ref().descriptors.len();
        // Oversized or empty requests skip admission: validation rejects them cheaply.
        let _permit = match &self.admission {
            Some(admission) if (1..=MAX_DESCRIPTORS).contains(&descriptors) => {
                match admission.admit(descriptors as u64, arrival, deadline) {
                    Ok(permit) => Some(permit),
                    Err(reason) => return self.shed(reason, descriptors),
                }
            }
            _ => None,
        };
        let caller = Caller {
            deadline,
            connection: arrival.map(|arrival| arrival.connection.id()),
        };
        let response = if self.traced {
            self.decide_traced(request.metadata(), request.get_ref(), caller)
                .await?
        } else {
            self.decide(request.get_ref(), caller).await?
        };
        if deadline.is_some_and(|deadline| deadline.passed(Instant::now())) {
            // The caller has given up: no answer is encoded for it.
            return Err(GrpcStatus::deadline_exceeded(
                "answered after the caller's deadline",
            ));
        }
        Ok(GrpcResponse::new(response))
    }
}

impl RlsService {
    /// Answers a shed call at once, as the failure mode answers a failed backend: without
    /// matching its descriptors, so shedding costs next to nothing.
    fn shed(
        &self,
        reason: ShedReason,
        descriptors: usize,
    ) -> Result<GrpcResponse<RateLimitResponse>, GrpcStatus> {
        let metrics = self.limiter.metrics();
        metrics.shed(reason);
        let status = match self.limiter.failure_mode().fallback() {
            Fallback::Unavailable => {
                metrics.decided("UNAVAILABLE");
                return Err(GrpcStatus::unavailable(
                    "rate limit service overloaded: call shed",
                ));
            }
            Fallback::Admit => Status::unmatched(),
            Fallback::Deny => Status {
                code: Code::OverLimit,
                ..Status::unmatched()
            },
        };
        let response = Response {
            overall: status.code,
            statuses: vec![status; descriptors],
            local: false,
        };
        metrics.decided(match response.overall {
            Code::Ok => "OK",
            Code::OverLimit => "OVER_LIMIT",
        });
        Ok(GrpcResponse::new(to_proto_response(
            &response,
            HeaderMode::Off,
        )))
    }
}

/// Reads the caller's trace context (W3C `traceparent`, `tracestate`; B3 `b3`, `x-b3-*`) from
/// gRPC metadata, where Envoy puts it when it traces.
struct MetadataExtractor<'a>(&'a MetadataMap);

impl Extractor for MetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .map(|key| match key {
                KeyRef::Ascii(key) => key.as_str(),
                KeyRef::Binary(key) => key.as_str(),
            })
            .collect()
    }
}

/// The `floodgate_decisions` code of an answer.
fn decision_code(result: &Result<RateLimitResponse, DecideError>) -> &'static str {
    match result {
        Ok(response) if response.overall_code == ProtoCode::OverLimit as i32 => "OVER_LIMIT",
        Ok(_) => "OK",
        Err(DecideError::Invalid(_)) => "INVALID_ARGUMENT",
        Err(DecideError::Unavailable(_) | DecideError::NoRules) => "UNAVAILABLE",
    }
}

/// The most one descriptor's cost counts as: 2^53, far past any rule's limit or burst
/// (`L` is 32 bits), so a cost up to 2^64-1 decides the same, with the same `reset`, on
/// every backend (Lua's numbers are exact to 2^53; Redis takes signed 64-bit words).
pub const MAX_COST: u64 = crate::algorithm::MAX_COUNT;

/// Translates and validates a protobuf request.
///
/// # Errors
/// The first rule of docs/requests.md#validation the request breaks.
pub fn to_request(request: &RateLimitRequest) -> Result<Request, InvalidRequest> {
    // Check the descriptor count before copying anything, so oversized requests cost nothing.
    Request::check_descriptor_count(request.descriptors.len())?;
    let request_cost = match request.hits_addend {
        0 => 1,
        n => u64::from(n),
    };
    let descriptors = request
        .descriptors
        .iter()
        .enumerate()
        .map(|(i, descriptor)| {
            let limit_override = match &descriptor.limit {
                None => None,
                Some(limit) => Some(LimitOverride {
                    requests_per_unit: limit.requests_per_unit,
                    unit: override_unit(limit.unit).ok_or_else(|| {
                        InvalidRequest(format!(
                            "descriptors[{i}].limit.unit must be SECOND..YEAR, got {}",
                            limit.unit
                        ))
                    })?,
                }),
            };
            Ok(Descriptor {
                entries: descriptor
                    .entries
                    .iter()
                    .map(|entry| (entry.key.clone(), entry.value.clone()))
                    .collect(),
                cost: descriptor
                    .hits_addend
                    .map_or(request_cost, |addend| addend.value)
                    .min(MAX_COST),
                limit_override,
            })
        })
        .collect::<Result<Vec<_>, InvalidRequest>>()?;
    let request = Request {
        domain: request.domain.clone(),
        descriptors,
    };
    request.validate()?;
    Ok(request)
}

fn override_unit(unit: i32) -> Option<Unit> {
    Some(match RateLimitUnit::try_from(unit).ok()? {
        RateLimitUnit::Unknown => return None,
        RateLimitUnit::Second => Unit::Second,
        RateLimitUnit::Minute => Unit::Minute,
        RateLimitUnit::Hour => Unit::Hour,
        RateLimitUnit::Day => Unit::Day,
        RateLimitUnit::Month => Unit::Month,
        RateLimitUnit::Year => Unit::Year,
    })
}

fn proto_unit(unit: Unit) -> ProtoUnit {
    match unit {
        Unit::Second => ProtoUnit::Second,
        Unit::Minute => ProtoUnit::Minute,
        Unit::Hour => ProtoUnit::Hour,
        Unit::Day => ProtoUnit::Day,
        Unit::Week => ProtoUnit::Week,
        Unit::Month => ProtoUnit::Month,
        Unit::Year => ProtoUnit::Year,
    }
}

fn proto_code(code: Code) -> ProtoCode {
    match code {
        Code::Ok => ProtoCode::Ok,
        Code::OverLimit => ProtoCode::OverLimit,
    }
}

fn proto_status(status: &Status) -> DescriptorStatus {
    DescriptorStatus {
        code: proto_code(status.code) as i32,
        current_limit: status.current_limit.as_ref().map(|limit| {
            // Per one unit: Envoy has no multiplier (headers keep the full window).
            let window_ms = limit.window.as_millis() as u64;
            let (requests_per_unit, unit) =
                limit.unit.stated_rate(limit.requests_per_unit, window_ms);
            RateLimit {
                name: limit.name.clone().unwrap_or_default(),
                requests_per_unit,
                unit: proto_unit(unit) as i32,
            }
        }),
        limit_remaining: status.limit_remaining,
        duration_until_reset: status.reset_seconds.map(|seconds| pbjson_types::Duration {
            seconds: i64::try_from(seconds).unwrap_or(i64::MAX),
            nanos: 0,
        }),
        quota: None,
    }
}

/// Encodes a decision, with the configured response headers.
pub fn to_proto_response(response: &Response, header_mode: HeaderMode) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: proto_code(response.overall) as i32,
        statuses: response.statuses.iter().map(proto_status).collect(),
        response_headers_to_add: headers::build(header_mode, response)
            .into_iter()
            .chain(
                response
                    .local
                    .then(|| (headers::LOCAL_FALLBACK, "local".to_owned())),
            )
            .map(|(key, value)| HeaderValue {
                key: key.to_owned(),
                value,
                raw_value: Vec::new(),
            })
            .collect(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::common::RateLimitDescriptor;
    use crate::proto::common::rate_limit_descriptor::{Entry, RateLimitOverride};

    /// A service over no rules with admission on, and a call with `grpc-timeout`.
    fn admitting_service_and_call(timeout: &str) -> (RlsService, GrpcRequest<RateLimitRequest>) {
        let limiter = Limiter::new(
            crate::matcher::Matcher::new(Vec::new()),
            Arc::new(crate::backend::memory::MemoryBackend::new(16)),
            Arc::new(Metrics::new()),
            crate::limiter::LimiterOptions::default(),
        );
        let admission = Admission::new(crate::overload::DEFAULT_TARGET_LATENCY);
        let service = RlsService::new(Arc::new(limiter), HeaderMode::Off)
            .with_admission(Some(Arc::new(admission)));
        let mut call = GrpcRequest::new(RateLimitRequest {
            domain: "any".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "k".into(),
                    value: "v".into(),
                }],
                limit: None,
                hits_addend: None,
            }],
            hits_addend: 0,
        });
        call.metadata_mut()
            .insert("grpc-timeout", timeout.parse().unwrap());
        (service, call)
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_with_a_one_millisecond_timeout_is_served_when_idle() {
        let (service, call) = admitting_service_and_call("1m");
        let answer = service.should_rate_limit(call).await;
        assert!(answer.is_ok(), "{answer:?}");
        let (service, call) = admitting_service_and_call("0m");
        let answer = service.should_rate_limit(call).await;
        assert_eq!(answer.unwrap_err().code(), tonic::Code::Unavailable);
    }

    #[test]
    fn the_trace_parent_is_read_from_grpc_metadata() {
        use opentelemetry::propagation::TextMapPropagator;
        use opentelemetry::trace::TraceContextExt;
        let mut metadata = MetadataMap::new();
        let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        metadata.insert("traceparent", traceparent.parse().unwrap());
        metadata.insert("tracestate", "vendor=value".parse().unwrap());
        let extractor = MetadataExtractor(&metadata);
        assert_eq!(extractor.get("traceparent"), Some(traceparent));
        assert!(extractor.keys().contains(&"tracestate"));
        let cx = opentelemetry_sdk::propagation::TraceContextPropagator::new()
            .extract_with_context(&opentelemetry::Context::new(), &extractor);
        let span = cx.span();
        let parent = span.span_context();
        assert_eq!(
            parent.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert_eq!(parent.span_id().to_string(), "b7ad6b7169203331");
        assert!(parent.is_sampled() && parent.is_remote());
        assert_eq!(parent.trace_state().get("vendor"), Some("value"));
    }

    fn descriptor(pairs: &[(&str, &str)]) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: pairs
                .iter()
                .map(|(k, v)| Entry {
                    key: k.to_string(),
                    value: v.to_string(),
                })
                .collect(),
            ..Default::default()
        }
    }

    fn request(descriptors: Vec<RateLimitDescriptor>, hits: u32) -> RateLimitRequest {
        RateLimitRequest {
            domain: "d".into(),
            descriptors,
            hits_addend: hits,
        }
    }

    #[test]
    fn cost_resolution_follows_the_reference() {
        let mut peek = descriptor(&[("k", "v")]);
        peek.hits_addend = Some(0u64.into());
        let mut five = descriptor(&[("k", "v")]);
        five.hits_addend = Some(5u64.into());
        let plain = descriptor(&[("k", "v")]);
        let costs = |hits| {
            to_request(&request(
                vec![peek.clone(), five.clone(), plain.clone()],
                hits,
            ))
            .unwrap()
            .descriptors
            .iter()
            .map(|d| d.cost)
            .collect::<Vec<_>>()
        };
        assert_eq!(costs(0), vec![0, 5, 1]);
        assert_eq!(costs(3), vec![0, 5, 3]);
    }

    #[test]
    fn bad_requests_are_invalid_argument() {
        let too_many = request(vec![descriptor(&[("k", "v")]); 65], 0);
        let cases = [
            (
                RateLimitRequest {
                    domain: String::new(),
                    ..request(vec![descriptor(&[("k", "v")])], 0)
                },
                "domain",
            ),
            (request(vec![], 0), "descriptor"),
            (request(vec![descriptor(&[])], 0), "no entries"),
            (request(vec![descriptor(&[("", "v")])], 0), "key is empty"),
            (
                request(vec![descriptor(&[("k", &"v".repeat(4097))])], 0),
                "longer than",
            ),
            (
                request(vec![descriptor(&vec![("k", "v"); 33])], 0),
                "more than 32",
            ),
            (too_many, "exceed"),
        ];
        for (req, needle) in cases {
            let error = to_request(&req).unwrap_err();
            assert!(error.0.contains(needle), "{} lacks {needle}", error.0);
            let status = GrpcStatus::from(DecideError::Invalid(error));
            assert_eq!(status.code(), tonic::Code::InvalidArgument);
        }
    }

    #[test]
    fn overrides_need_a_known_unit() {
        let mut d = descriptor(&[("k", "v")]);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 5,
            unit: RateLimitUnit::Minute as i32,
        });
        let parsed = to_request(&request(vec![d.clone()], 0)).unwrap();
        assert_eq!(
            parsed.descriptors[0].limit_override,
            Some(LimitOverride {
                requests_per_unit: 5,
                unit: Unit::Minute
            })
        );
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 5,
            unit: 0,
        });
        assert!(to_request(&request(vec![d.clone()], 0)).is_err());
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 5,
            unit: 99,
        });
        assert!(to_request(&request(vec![d], 0)).is_err());
    }

    #[test]
    fn week_limits_encode_as_unit_seven() {
        use crate::limiter::CurrentLimit;
        let response = Response {
            local: false,
            overall: Code::Ok,
            statuses: vec![Status {
                code: Code::Ok,
                current_limit: Some(CurrentLimit {
                    requests_per_unit: 1,
                    unit: Unit::Week,
                    name: Some("n".into()),
                    label: "n".into(),
                    window: std::time::Duration::from_secs(604_800),
                }),
                limit_remaining: 3,
                reset_seconds: None,
                metadata: None,
            }],
        };
        let encoded = prost::Message::encode_to_vec(&to_proto_response(&response, HeaderMode::Off));
        // Golden bytes from the wire facts (docs/wire.md#golden-bytes).
        assert_eq!(
            encoded,
            [
                0x08, 0x01, 0x12, 0x0d, 0x08, 0x01, 0x12, 0x07, 0x08, 0x01, 0x10, 0x07, 0x1a, 0x01,
                0x6e, 0x18, 0x03
            ]
        );
    }
}
