//! Criterion benchmarks of floodgate's hot paths, one function per group, seeded inputs.
//!
//! `matcher`: one lookup in a 1,000-rule domain (exact, wildcard and key-only nodes, two
//! levels deep), for a mix of matching and non-matching descriptors.
//!
//! `limiter`: a whole 5-descriptor request through `Limiter::should_rate_limit` on the
//! memory backend (match, bucket keys, charge, statuses, metrics).
//!
//! `memory_backend`: one decision (one `Backend::charge` of one bucket) on the memory
//! backend with 10,000 live buckets, picked in a fixed pseudo-random order. The policies
//! are generous (hour-long, high limits) so every bucket stays live and the allowed path,
//! which writes, is what gets measured.

#![allow(
    missing_docs,
    reason = "criterion's macros generate undocumented public functions"
)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use floodgate::backend::memory::MemoryBackend;
use floodgate::backend::{Backend, BucketKey, Charge};
use floodgate::config;
use floodgate::limiter::{Descriptor, Limiter, LimiterOptions, Request};
use floodgate::matcher::Matcher;
use floodgate::metrics::Metrics;
use floodgate::rules::{Algorithm, Policy, Unit};
use std::fmt::Write as _;
use std::sync::Arc;

const LIVE_BUCKETS: usize = 10_000;
const SEED: u64 = 0x5eed_f100_d6a7_e000;

/// xorshift64: a fixed, dependency-free sequence so every run charges the same buckets.
struct Sequence(u64);

impl Sequence {
    fn next_below(&mut self, bound: usize) -> usize {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        ((u128::from(x) * bound as u128) >> 64) as usize
    }
}

fn charges(algorithm: Algorithm) -> Vec<Charge> {
    let mut policy = Policy::fixed_window(1_000_000, Unit::Hour);
    if algorithm == Algorithm::TokenBucket {
        // One request keeps a bucket non-empty for 3.6 s; the burst never runs out here.
        policy.algorithm = algorithm;
        policy.requests_per_unit = 1_000;
    }
    (0..LIVE_BUCKETS)
        .map(|i| {
            let value = format!("user-{i}");
            Charge {
                bucket: BucketKey::new("bench", "user", [("user", value.as_str())], &policy),
                policy,
                cost: 1,
                spread_ms: 0,
            }
        })
        .collect()
}

fn memory_backend(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("tokio runtime");
    let mut group = c.benchmark_group("memory_backend");
    for algorithm in [Algorithm::FixedWindow, Algorithm::TokenBucket] {
        let backend = MemoryBackend::new(1_000_000);
        let charges = charges(algorithm);
        runtime.block_on(async {
            for charge in &charges {
                backend.charge(std::slice::from_ref(charge)).await.unwrap();
            }
        });
        assert_eq!(backend.len(), LIVE_BUCKETS);
        let mut sequence = Sequence(SEED);
        group.bench_function(algorithm.as_str(), |b| {
            b.to_async(&runtime).iter(|| {
                let charge = &charges[sequence.next_below(charges.len())];
                let backend = &backend;
                async move { black_box(backend.charge(std::slice::from_ref(charge)).await) }
            })
        });
    }
    group.finish();
}

/// A domain of 1,000 rules: 600 exact values, 200 wildcards and 200 two-level trees.
fn thousand_rules() -> Matcher {
    let mut yaml = String::from("domain: bench\ndescriptors:\n");
    for i in 0..600 {
        let _ = write!(
            yaml,
            "  - key: route\n    value: /r{i}\n    rate_limit: {{unit: minute, requests_per_unit: 100}}\n"
        );
    }
    for i in 0..200 {
        let _ = write!(
            yaml,
            "  - key: path\n    value: /p{i}/*\n    rate_limit: {{unit: minute, requests_per_unit: 100}}\n"
        );
    }
    for i in 0..200 {
        let _ = write!(
            yaml,
            "  - key: tenant\n    value: t{i}\n    descriptors:\n      - key: user\n        rate_limit: {{unit: second, requests_per_unit: 10}}\n"
        );
    }
    let domain = config::parse_domain("bench.yaml", &yaml).expect("bench config is valid");
    Matcher::new(vec![domain])
}

fn entries(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn matcher(c: &mut Criterion) {
    let matcher = thousand_rules();
    assert_eq!(matcher.rules().len(), 1_000);
    let cases = [
        ("exact", entries(&[("route", "/r417")])),
        ("wildcard_last", entries(&[("path", "/p199/items/42")])),
        ("nested", entries(&[("tenant", "t150"), ("user", "alice")])),
        ("miss", entries(&[("route", "/unknown")])),
    ];
    let mut group = c.benchmark_group("matcher");
    for (name, entries) in &cases {
        group.bench_function(*name, |b| {
            b.iter(|| black_box(matcher.lookup("bench", black_box(entries)).is_some()))
        });
    }
    group.finish();
}

/// Whether `limiter` decided `request` (no deadline, no connection: as a direct caller).
async fn decided(limiter: &Limiter, request: &Request) -> bool {
    limiter
        .should_rate_limit(request, floodgate::overload::Caller::default())
        .await
        .is_ok()
}

fn limiter(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("tokio runtime");
    let limiter = Limiter::new(
        thousand_rules(),
        Arc::new(MemoryBackend::new(1_000_000)),
        Arc::new(Metrics::new()),
        LimiterOptions::default(),
    );
    let descriptor = |pairs: &[(&str, &str)]| Descriptor {
        entries: entries(pairs),
        cost: 1,
        limit_override: None,
    };
    let mut sequence = Sequence(SEED);
    let mut group = c.benchmark_group("limiter");
    group.bench_function("five_descriptors", |b| {
        b.to_async(&runtime).iter(|| {
            let user = format!("user-{}", sequence.next_below(LIVE_BUCKETS));
            let request = Request {
                domain: "bench".into(),
                descriptors: vec![
                    descriptor(&[("route", "/r1")]),
                    descriptor(&[("path", "/p7/x")]),
                    descriptor(&[("tenant", "t3"), ("user", &user)]),
                    descriptor(&[("route", "/unknown")]),
                    descriptor(&[("tenant", "t9"), ("user", &user)]),
                ],
            };
            let limiter = &limiter;
            async move { black_box(decided(limiter, &request).await) }
        })
    });
    group.bench_function("one_descriptor", |b| {
        b.to_async(&runtime).iter(|| {
            let user = format!("user-{}", sequence.next_below(LIVE_BUCKETS));
            let request = Request {
                domain: "bench".into(),
                descriptors: vec![descriptor(&[("tenant", "t3"), ("user", &user)])],
            };
            let limiter = &limiter;
            async move { black_box(decided(limiter, &request).await) }
        })
    });
    group.finish();
}

criterion_group!(benches, matcher, memory_backend, limiter);
criterion_main!(benches);
