//! Admin HTTP server (axum), on its own port.
//!
//! Endpoints:
//! - `GET /healthcheck`: 200 `OK` when ready (same latch as gRPC health), else 503.
//! - `GET /livez`: 200 while the process answers at all.
//! - `POST /json`: proto3 JSON `RateLimitRequest` in, proto3 JSON response out; 200 OK,
//!   429 OVER_LIMIT, 400 bad input (with a message), 415 a body not sent as
//!   `application/json`, 503 backend failure. It spends real quota (and can trip lockouts),
//!   so `--admin-json false` turns it off: then it answers 404, as a route that does not
//!   exist would. Only `application/json` is taken: a web page on another origin can post
//!   `text/plain` (a "simple" request, sent without asking the browser's CORS preflight),
//!   never `application/json`.
//! - `GET /metrics`: Prometheus (OpenMetrics text) exposition.
//! - `GET /rlconfig`: the loaded rules, one line per rule.
//! - `GET /`, `GET /overview`, `GET /top`: the operator's page and the two JSON views it
//!   polls (`views`).

mod views;

use std::fmt::Write as _;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::health::Health;
use crate::limiter::Limiter;
use crate::overload::Caller;
use crate::proto::rls::RateLimitRequest;
use crate::proto::rls::rate_limit_response::Code as ProtoCode;
use crate::rules::Limit;
use crate::service::{DecideError, RlsService};

/// Largest accepted `/json` body; requests are bounded far below this anyway.
const MAX_JSON_BODY_BYTES: usize = 1 << 20;

/// What the handlers share.
#[derive(Clone)]
pub struct AdminState {
    /// Decides `/json` requests exactly as gRPC does.
    pub service: RlsService,
    /// Rules and metrics.
    pub limiter: Arc<Limiter>,
    /// Readiness.
    pub health: Arc<Health>,
    /// Whether `/json` is served.
    pub json_enabled: bool,
    /// What the overview says of the service itself.
    pub info: ServiceInfo,
}

/// The service's facts the overview shows.
#[derive(Debug, Clone)]
pub struct ServiceInfo {
    /// When the service started.
    pub started: tokio::time::Instant,
    /// The backend's name (`memory`, `redis`, `redis-cluster`, ...).
    pub backend: &'static str,
    /// Where the rules come from: `files` or `xds`.
    pub config_source: &'static str,
}

/// The admin router.
pub fn router(state: AdminState) -> Router {
    let router = Router::new()
        .route("/healthcheck", get(healthcheck))
        .route("/livez", get(|| async { "OK" }));
    let router = if state.json_enabled {
        router.route("/json", post(json))
    } else {
        router
    };
    router
        .route("/metrics", get(metrics))
        .route("/rlconfig", get(rlconfig))
        .route("/", get(page))
        .route("/overview", get(overview))
        .route("/top", get(top))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_JSON_BODY_BYTES))
        .layer(axum::middleware::map_response(nosniff))
        .with_state(state)
}

/// Every answer of the admin port says its content type is the one to use: a JSON view
/// holding a hostile key is never run as a script or a page.
async fn nosniff(mut response: Response) -> Response {
    response.headers_mut().insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, views::page_policy()),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        views::PAGE,
    )
        .into_response()
}

async fn overview(State(state): State<AdminState>) -> Response {
    axum::Json(views::overview(&state)).into_response()
}

async fn top(State(state): State<AdminState>, Query(query): Query<views::TopQuery>) -> Response {
    axum::Json(views::top(&state, &query)).into_response()
}

async fn healthcheck(State(state): State<AdminState>) -> Response {
    if state.health.is_ready() {
        (StatusCode::OK, "OK").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "NOT READY").into_response()
    }
}

async fn json(State(state): State<AdminState>, headers: HeaderMap, body: Bytes) -> Response {
    if !is_json(&headers) {
        state.limiter.metrics().invalid_requests.inc();
        return (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "POST /json takes only Content-Type: application/json\n",
        )
            .into_response();
    }
    let request = match parse_json_request(&body) {
        Ok(request) => request,
        Err(error) => {
            state.limiter.metrics().invalid_requests.inc();
            return bad_request(format!("invalid RateLimitRequest JSON: {error}"));
        }
    };
    match state.service.decide(&request, Caller::default()).await {
        Ok(response) => {
            let status = if response.overall_code == ProtoCode::OverLimit as i32 {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            match serde_json::to_string(&response) {
                Ok(text) => {
                    (status, [(header::CONTENT_TYPE, "application/json")], text).into_response()
                }
                Err(error) => {
                    (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response()
                }
            }
        }
        Err(DecideError::Invalid(invalid)) => bad_request(invalid.0),
        Err(error @ (DecideError::Unavailable(_) | DecideError::NoRules)) => {
            (StatusCode::SERVICE_UNAVAILABLE, format!("{error}\n")).into_response()
        }
    }
}

/// Whether a request says its body is `application/json` (parameters such as `charset`
/// allowed, case-insensitive as media types are).
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"))
}

/// Reads a `/json` body: a proto3 JSON `RateLimitRequest` (not yet validated). Public so
/// the fuzz target parses bodies exactly as the endpoint does.
///
/// # Errors
/// The body is not a proto3 JSON `RateLimitRequest`.
pub fn parse_json_request(body: &[u8]) -> Result<RateLimitRequest, serde_json::Error> {
    serde_json::from_slice(body)
}

fn bad_request(message: String) -> Response {
    (StatusCode::BAD_REQUEST, format!("{message}\n")).into_response()
}

async fn metrics(State(state): State<AdminState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.limiter.metrics().encode(),
    )
        .into_response()
}

async fn rlconfig(State(state): State<AdminState>) -> String {
    let rules = state.limiter.rules();
    let mut out = String::new();
    for rule in rules.rules() {
        let _ = write!(out, "{}.{}: ", rule.domain, rule.path);
        match &rule.limit {
            Limit::Unlimited => out.push_str("unlimited"),
            Limit::Limited(policy) => {
                let _ = write!(
                    out,
                    "unit={} requests_per_unit={} unit_multiplier={} algorithm={}",
                    policy.unit.as_str().to_ascii_uppercase(),
                    policy.requests_per_unit,
                    policy.unit_multiplier,
                    policy.algorithm,
                );
                if policy.algorithm == crate::rules::Algorithm::TokenBucket {
                    let _ = write!(out, " burst={}", policy.burst);
                }
                if let Some(lockout) = policy.lockout {
                    let _ = write!(out, " lockout_seconds={}", lockout.as_secs());
                }
            }
        }
        if let Some(name) = &rule.name {
            let _ = write!(out, ", name={name}");
        }
        let _ = writeln!(
            out,
            ", shadow_mode={}, quota_mode={}",
            rule.shadow_mode, rule.quota_mode
        );
    }
    out
}
