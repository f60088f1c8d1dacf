//! The Lua scripts decide exactly as the Rust algorithms: one seeded random sequence of
//! charges and refunds goes to Redis (single node and cluster), and every reply is compared
//! with `algorithm::Bucket` and with the memory backend at the `now_ms` Redis reported.
//!
//! Windows of 1-2 s, lockouts of 0.3-1.2 s and short pauses make windows roll, buckets leak,
//! locks expire and Redis keys expire during the run, so TTLs are checked too: a key that
//! vanished while its state still counted would show up as a different decision.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::redis::{RedisCluster, RedisServer};
use floodgate::algorithm::Bucket;
use floodgate::backend::memory::{ManualClock, MemoryBackend};
use floodgate::backend::{Backend, BucketKey, Charge, Outcome, RedisBackend, RedisOptions, Refund};
use floodgate::rules::{Algorithm, OnOverLimit, Policy, Unit};

const STEPS: usize = 500;
const COSTS: [u64; 8] = [0, 1, 1, 1, 1, 2, 3, 9];

/// xorshift64: a fixed seed gives the same sequence on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn random_policy(rng: &mut Rng, algorithm: Algorithm) -> Policy {
    // Limits prime to the window make the token bucket's U and λ both exceed 1.
    let limit = [1, 2, 3, 5, 6, 7][rng.below(6) as usize];
    Policy {
        algorithm,
        unit: Unit::Second,
        unit_multiplier: 1 + rng.below(3) as u32,
        requests_per_unit: limit,
        burst: if algorithm == Algorithm::TokenBucket {
            1 + rng.below(8) as u32
        } else {
            limit
        },
        // Validation rejects consume for the sliding log.
        on_over_limit: if algorithm != Algorithm::SlidingLog && rng.below(3) == 0 {
            OnOverLimit::Consume
        } else {
            OnOverLimit::Reject
        },
        lockout: [None, None, Some(300), Some(1_200)][rng.below(4) as usize]
            .map(Duration::from_millis),
    }
}

/// The refund call as `RedisBackend::refund` makes it, but through a plain connection so
/// that its reply (with Redis' `now_ms`) is visible.
fn refund_argv(refund: &Refund) -> Vec<String> {
    let p = &refund.policy;
    vec![
        "refund".into(),
        refund.cost.to_string(),
        p.window_ms().to_string(),
        p.requests_per_unit.to_string(),
        p.burst.to_string(),
        if p.on_over_limit == OnOverLimit::Consume {
            "1"
        } else {
            "0"
        }
        .into(),
        p.lockout_ms().to_string(),
        refund.booked_at_ms.to_string(),
        refund.id.to_string(),
    ]
}

/// Runs a refund script call and returns the `now_ms` it ran at.
type RawRefund<'a> = Box<dyn FnMut(&Refund) -> i64 + 'a>;

async fn conforms(backend: &dyn Backend, mut raw_refund: RawRefund<'_>, seed: u64) {
    let mut rng = Rng(seed);
    let buckets: Vec<(BucketKey, Policy)> = (0..24)
        .map(|i| {
            let policy = random_policy(&mut rng, Algorithm::ALL[i % 4]);
            let value = format!("conformance-{seed}-{i}");
            let key = BucketKey::new("api", "rule", [("k", value.as_str())], &policy);
            (key, policy)
        })
        .collect();
    let mut model: HashMap<BucketKey, Bucket> = buckets
        .iter()
        .map(|(k, p)| (*k, Bucket::new(p.algorithm)))
        .collect();
    let clock = Arc::new(ManualClock::new(0));
    let memory = MemoryBackend::with_clock(10_000, clock.clone());
    let mut booked: Vec<Refund> = Vec::new();
    let mut history: Vec<String> = Vec::new();

    for step in 0..STEPS {
        if rng.below(4) == 0 {
            tokio::time::sleep(Duration::from_millis(rng.below(60))).await;
        }
        if !booked.is_empty() && rng.below(7) == 0 {
            let refund = booked.swap_remove(rng.below(booked.len() as u64) as usize);
            let now = raw_refund(&refund);
            model.get_mut(&refund.bucket).unwrap().refund(
                &refund.policy,
                now,
                refund.cost,
                refund.booked_at_ms,
            );
            clock.set(now);
            memory.refund(std::slice::from_ref(&refund)).await.unwrap();
            history.push(format!(
                "{step}: refund {} of {:?} booked at {} (now {now})",
                refund.cost, refund.policy.algorithm, refund.booked_at_ms
            ));
            continue;
        }
        let request: Vec<Charge> = (0..1 + rng.below(3))
            .map(|_| {
                let (bucket, policy) = buckets[rng.below(buckets.len() as u64) as usize];
                Charge {
                    bucket,
                    policy,
                    cost: COSTS[rng.below(COSTS.len() as u64) as usize],
                }
            })
            .collect();
        let outcomes = backend.charge(&request).await.unwrap();
        for (charge, redis) in request.iter().zip(outcomes) {
            let verdict = model.get_mut(&charge.bucket).unwrap().decide(
                &charge.policy,
                redis.now_ms,
                charge.cost,
            );
            clock.set(redis.now_ms);
            let in_memory = memory.charge(std::slice::from_ref(charge)).await.unwrap()[0];
            let expected = Outcome {
                allowed: verdict.allowed,
                remaining: verdict.remaining,
                reset_ms: verdict.reset_ms,
                now_ms: redis.now_ms,
                booked: verdict.booked,
                rolled_back: false,
            };
            history.push(format!(
                "{step}: n={} {:?} -> {redis:?}",
                charge.cost, charge.policy
            ));
            let context = || history[history.len().saturating_sub(12)..].join("\n");
            assert_eq!(redis, expected, "Redis vs Bucket::decide\n{}", context());
            assert_eq!(
                in_memory,
                expected,
                "memory vs Bucket::decide\n{}",
                context()
            );
            if redis.booked {
                booked.push(Refund::new(
                    charge.bucket,
                    charge.policy,
                    charge.cost,
                    redis.now_ms,
                ));
            }
        }
    }
    // The run must have exercised both answers and every algorithm.
    let decisions = history.iter().filter(|h| h.contains("allowed")).count();
    let denials = history
        .iter()
        .filter(|h| h.contains("allowed: false"))
        .count();
    assert!(
        denials > decisions / 10 && denials < decisions * 9 / 10,
        "{denials}/{decisions}"
    );
}

#[tokio::test]
async fn redis_decides_exactly_as_the_algorithms() {
    let server = RedisServer::start();
    let backend = RedisBackend::connect(&server.url(), RedisOptions::default())
        .await
        .unwrap();
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let scripts = floodgate::backend::redis::scripts::ScriptSet::new();
    let raw: RawRefund = Box::new(|refund: &Refund| {
        let mut call = scripts.get(refund.policy.algorithm).prepare_invoke();
        call.key(refund.bucket.redis_key("fg"));
        call.arg(refund_argv(refund));
        let reply: Vec<i64> = call.invoke(&mut conn).unwrap();
        reply[1]
    });
    conforms(&backend, raw, 0x5EED_0001).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_decides_exactly_as_the_algorithms() {
    let cluster = RedisCluster::start_async().await;
    let backend = cluster.backend().await;
    let client = redis::cluster::ClusterClient::new(cluster.urls()).unwrap();
    let mut conn = client.get_connection().unwrap();
    let scripts = floodgate::backend::redis::scripts::ScriptSet::new();
    let raw: RawRefund = Box::new(|refund: &Refund| {
        let mut call = scripts.get(refund.policy.algorithm).prepare_invoke();
        call.key(refund.bucket.redis_key("fg"));
        call.arg(refund_argv(refund));
        let reply: Vec<i64> = tokio::task::block_in_place(|| call.invoke(&mut conn)).unwrap();
        reply[1]
    });
    conforms(&backend, raw, 0x5EED_0002).await;
}
