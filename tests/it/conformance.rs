//! The Lua scripts decide exactly as the Rust algorithms: one seeded random sequence of
//! charges and refunds goes to Redis (single node and cluster), and every reply is compared
//! with `algorithm::Bucket` and with the memory backend. All three run on one `ManualClock`:
//! the Redis backends run `ScriptSet::pinned` scripts, which read the time from it. Both
//! Redis backends run it twice: as scripts (`EVALSHA`) and as the function library (`FCALL`).
//!
//! Windows of 1-3 s, lockouts of 0.3-1.2 s and clock steps make windows roll, buckets leak
//! and locks expire during the run. Redis would expire keys by its own clock, so the test
//! expires them on the pinned one: before a step touches a key whose PEXPIRETIME has come,
//! it deletes the key. A key set to vanish while its state still counted would then show
//! up as a different decision.

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::redis::{RedisCluster, RedisServer};
use floodgate::algorithm::Bucket;
use floodgate::backend::memory::MemoryBackend;
use floodgate::backend::redis::Scripting;
use floodgate::backend::redis::scripts::ScriptSet;
use floodgate::backend::{
    Backend, BucketKey, Charge, ClusterBackend, Outcome, RedisBackend, RedisOptions, Refund,
};
use floodgate::clock::{Clock, ManualClock};
use floodgate::rules::{Algorithm, OnOverLimit, Policy, Unit};
use redis::ConnectionLike;

const STEPS: usize = 500;
/// A day boundary ahead of the real clock, so that Redis never expires a key by its own.
const START: i64 = 4_102_444_800_000;
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

/// Deletes `key` if its expiry (PEXPIRETIME, as the scripts set it) has come by `now`: what
/// Redis does on its own clock, done on the pinned one. Returns whether it did.
fn expire_due(conn: &mut dyn ConnectionLike, key: &str, now: i64) -> bool {
    let at: i64 = redis::cmd("PEXPIRETIME").arg(key).query(conn).unwrap();
    assert_ne!(at, -1, "{key} was written without an expiry");
    let due = at >= 0 && at <= now;
    if due {
        let _: i64 = redis::cmd("DEL").arg(key).query(conn).unwrap();
    }
    due
}

/// Runs `expire_due` at the given time on the Redis key of each bucket; returns how many
/// keys it deleted.
type Expire<'a> = Box<dyn FnMut(&[BucketKey], i64) -> usize + 'a>;

async fn conforms(
    backend: &dyn Backend,
    clock: Arc<ManualClock>,
    mut expire: Expire<'_>,
    seed: u64,
) {
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
    let memory = MemoryBackend::with_clock(10_000, clock.clone());
    let mut booked: Vec<Refund> = Vec::new();
    let mut history: Vec<String> = Vec::new();
    let mut expired = 0;

    for step in 0..STEPS {
        // Time moves a little at every step and now and then pauses longer.
        clock.advance(rng.below(4) as i64);
        if rng.below(4) == 0 {
            clock.advance(rng.below(60) as i64);
        }
        let now = clock.now_ms();
        if !booked.is_empty() && rng.below(7) == 0 {
            let refund = booked.swap_remove(rng.below(booked.len() as u64) as usize);
            expired += expire(&[refund.bucket], now);
            backend.refund(std::slice::from_ref(&refund)).await.unwrap();
            model.get_mut(&refund.bucket).unwrap().refund(
                &refund.policy,
                now,
                refund.cost,
                refund.booked_at_ms,
            );
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
                    spread_ms: 0,
                }
            })
            .collect();
        let keys: Vec<BucketKey> = request.iter().map(|c| c.bucket).collect();
        expired += expire(&keys, now);
        let outcomes = backend.charge(&request).await.unwrap();
        for (charge, redis) in request.iter().zip(outcomes) {
            let verdict =
                model
                    .get_mut(&charge.bucket)
                    .unwrap()
                    .decide(&charge.policy, now, charge.cost);
            let in_memory = memory.charge(std::slice::from_ref(charge)).await.unwrap()[0];
            let expected = Outcome {
                allowed: verdict.allowed,
                remaining: verdict.remaining,
                reset_ms: verdict.reset_ms,
                now_ms: now,
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
                booked.push(Refund::new(charge.bucket, charge.policy, charge.cost, now));
            }
        }
    }
    // The run must have exercised expiry, both answers and every algorithm.
    assert!(expired > 0, "no key expired");
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

/// The two ways of running the code, each with the seed of its run (so each runs on keys of
/// its own) and the command it must have used.
const PATHS: [(Scripting, u64, &str); 2] = [
    (Scripting::Evalsha, 0x0000, "evalsha"),
    (Scripting::Functions, 0x1000, "fcall"),
];

fn options(scripting: Scripting) -> RedisOptions {
    RedisOptions {
        scripting,
        ..RedisOptions::default()
    }
}

#[tokio::test]
async fn redis_decides_exactly_as_the_algorithms() {
    let server = RedisServer::start();
    for (scripting, seed, command) in PATHS {
        let before = server.calls_of(command);
        let clock = Arc::new(ManualClock::new(START));
        let scripts = ScriptSet::pinned(clock.clone());
        let backend =
            RedisBackend::connect_with_scripts(&server.url(), options(scripting), scripts)
                .await
                .unwrap();
        let mut conn = redis::Client::open(server.url())
            .unwrap()
            .get_connection()
            .unwrap();
        let expire: Expire = Box::new(|buckets: &[BucketKey], now| {
            buckets
                .iter()
                .filter(|bucket| expire_due(&mut conn, &bucket.redis_key("fg"), now))
                .count()
        });
        conforms(&backend, clock, expire, 0x5EED_0001 + seed).await;
        let calls = server.calls_of(command) - before;
        assert!(
            calls as usize >= STEPS / 2,
            "{scripting:?}: {calls} {command}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_decides_exactly_as_the_algorithms() {
    let cluster = RedisCluster::start_async().await;
    let calls_of = |command| -> u64 { cluster.masters().iter().map(|m| m.calls_of(command)).sum() };
    for (scripting, seed, command) in PATHS {
        let before = calls_of(command);
        let clock = Arc::new(ManualClock::new(START));
        let scripts = ScriptSet::pinned(clock.clone());
        let backend =
            ClusterBackend::connect_with_scripts(&cluster.urls(), options(scripting), scripts)
                .await
                .unwrap();
        let client = redis::cluster::ClusterClient::new(cluster.urls()).unwrap();
        let mut conn = client.get_connection().unwrap();
        let expire: Expire = Box::new(|buckets: &[BucketKey], now| {
            tokio::task::block_in_place(|| {
                buckets
                    .iter()
                    .filter(|bucket| expire_due(&mut conn, &bucket.redis_key("fg"), now))
                    .count()
            })
        });
        conforms(&backend, clock, expire, 0x5EED_0002 + seed).await;
        let calls = calls_of(command) - before;
        assert!(
            calls as usize >= STEPS / 2,
            "{scripting:?}: {calls} {command}"
        );
    }
}
