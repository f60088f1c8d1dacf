//! The gRPC request path: arbitrary bytes -> protobuf `RateLimitRequest` -> validation
//! (`to_request`) -> evaluation on the memory backend -> protobuf response, as
//! `RlsService::decide` runs it for every call.
//!
//! Rules: `config/` (the documented examples) plus `fuzz/rules/` (tiny limits, so that over
//! limit, lockout and refunds happen within one input): every algorithm, wildcards,
//! `replaces`, shadow and quota mode; requests bring their own overrides.
//!
//! Each input gets fresh buckets and metrics, so a crash replays from its input alone. It is
//! decided twice by a limiter with a local over-limit cache (the second time 1.5 s later on
//! the backend's clock, against the buckets the first left), and once in global shadow mode.
//! Checked: no panic, no backend error, one status per descriptor, a response that encodes,
//! and global shadow mode always answering OK.
#![no_main]

use std::path::Path;
use std::sync::{Arc, OnceLock};

use floodgate::backend::memory::MemoryBackend;
use floodgate::clock::ManualClock;
use floodgate::config::load_dir;
use floodgate::headers::HeaderMode;
use floodgate::limiter::{FailureMode, Limiter, LimiterOptions};
use floodgate::matcher::{DomainRules, Matcher};
use floodgate::metrics::Metrics;
use floodgate::proto::rls::RateLimitRequest;
use floodgate::proto::rls::rate_limit_response::Code as ProtoCode;
use floodgate::service::{DecideError, RlsService};
use libfuzzer_sys::fuzz_target;
use prost::Message;

/// An instant well inside the range every algorithm handles (2023-11-14).
const START_MS: i64 = 1_700_000_000_000;

struct Fixture {
    runtime: tokio::runtime::Runtime,
    domains: Vec<DomainRules>,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut domains = Vec::new();
        for dir in [root.join("../config"), root.join("rules")] {
            let loaded = load_dir(&dir).unwrap_or_else(|errors| panic!("{errors}"));
            domains.extend(loaded.domains);
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a current-thread runtime");
        Fixture { runtime, domains }
    })
}

/// A service over fresh buckets on `clock`.
fn service(fixture: &Fixture, clock: &Arc<ManualClock>, options: LimiterOptions) -> RlsService {
    let backend = Arc::new(MemoryBackend::with_clock(4096, clock.clone()));
    let limiter = Limiter::new(
        Matcher::new(fixture.domains.clone()),
        backend,
        Arc::new(Metrics::new()),
        options,
    );
    RlsService::new(Arc::new(limiter), HeaderMode::Ietf)
}

fuzz_target!(|data: &[u8]| {
    let Ok(request) = RateLimitRequest::decode(data) else {
        return;
    };
    let fixture = fixture();
    let clock = Arc::new(ManualClock::new(START_MS));
    let cached = service(
        fixture,
        &clock,
        LimiterOptions {
            local_cache_entries: 64,
            ..LimiterOptions::default()
        },
    );
    let shadow = service(
        fixture,
        &clock,
        LimiterOptions {
            shadow_mode: true,
            failure_mode: FailureMode::Deny,
            ..LimiterOptions::default()
        },
    );
    fixture.runtime.block_on(async {
        if decide(&cached, &request).await.is_none() {
            return;
        }
        clock.advance(1500);
        decide(&cached, &request).await;
        if let Some(response) = decide(&shadow, &request).await {
            assert_eq!(
                response.overall_code,
                ProtoCode::Ok as i32,
                "global shadow mode answered {response:?}"
            );
        }
    });
});

/// Decides `request`; `None` when it is invalid. The memory backend never fails.
async fn decide(
    service: &RlsService,
    request: &RateLimitRequest,
) -> Option<floodgate::proto::rls::RateLimitResponse> {
    match service.decide(request, floodgate::overload::Caller::default()).await {
        Ok(response) => {
            assert_eq!(response.statuses.len(), request.descriptors.len());
            assert_ne!(response.overall_code, ProtoCode::Unknown as i32);
            let encoded = response.encode_to_vec();
            assert_eq!(
                floodgate::proto::rls::RateLimitResponse::decode(encoded.as_slice()).ok(),
                Some(response.clone())
            );
            Some(response)
        }
        Err(DecideError::Invalid(_)) => None,
        Err(DecideError::Unavailable(error)) => panic!("memory backend failed: {error}"),
        // Only an xDS-fed service waits for rules; this one loads them up front.
        Err(DecideError::NoRules) => panic!("rules loaded at start are missing"),
    }
}
