//! Criterion benchmarks of floodgate's hot paths, one function per group, seeded inputs.
//!
//! `memory_backend`: one decision (one `Backend::charge` of one bucket) on the memory
//! backend with 10,000 live buckets, picked in a fixed pseudo-random order. The policies
//! are generous (hour-long, high limits) so every bucket stays live and the allowed path,
//! which writes, is what gets measured.

// criterion's macros generate undocumented public functions.
#![allow(missing_docs)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use floodgate::backend::memory::MemoryBackend;
use floodgate::backend::{Backend, BucketKey, Charge};
use floodgate::rules::{Algorithm, Policy, Unit};

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

criterion_group!(benches, memory_backend);
criterion_main!(benches);
