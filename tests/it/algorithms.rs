//! The algorithms (docs/algorithms.md) against every vector of tests/vectors/algorithms.json,
//! and property tests: budgets hold for any request sequence, refunds undo bookings exactly,
//! answers stay in range, and no input panics.

use crate::common;

use std::time::Duration;

use common::vectors::{self, Action, Observed};

use floodgate::algorithm::{Bucket, Counter, Params, Verdict};
use floodgate::algorithm::{sliding_log::SlidingLog, token_bucket::TokenBucket};
use floodgate::rules::{Algorithm, MAX_EXACT_INTEGER, OnOverLimit, Policy, Unit, gcd};
use proptest::prelude::*;

/// Every vector of the table on `Bucket::decide` and `Bucket::refund`: the same steps and
/// expectations that tests/lua.rs runs on the Lua scripts.
#[test]
fn every_vector_holds_on_the_rust_algorithms() {
    for case in vectors::cases() {
        let mut bucket = Bucket::new(case.policy.algorithm);
        for (i, step) in case.steps.iter().enumerate() {
            let before = bucket.clone();
            let mut seen = match step.action {
                Action::Charge { cost, spread_ms } => {
                    let v = bucket.decide_spent(&case.policy, step.at_ms, cost, spread_ms);
                    Observed {
                        allowed: Some(v.allowed),
                        remaining: Some(v.remaining),
                        reset_ms: Some(v.reset_ms),
                        booked: Some(v.booked),
                        ..Observed::default()
                    }
                }
                Action::Refund { cost, booked_at_ms } => {
                    bucket.refund(&case.policy, step.at_ms, cost, booked_at_ms);
                    Observed::default()
                }
            };
            // Every state past its expiry is the empty bucket (as memory drops it).
            let expired = |b: &Bucket| b.expires_at_ms(&case.policy) <= step.at_ms;
            seen.changed = bucket != before && !(expired(&before) && expired(&bucket));
            seen.locked_until_ms = bucket.locked_until_ms;
            seen.expires_at_ms = bucket.expires_at_ms(&case.policy);
            step.expect
                .check(&seen, &format!("{}, step {}", case.name, i + 1));
        }
    }
}

/// The start of some day, so every tested unit's window starts here.
const DAY_START: i64 = 1_700_006_400_000;

fn policy(
    algorithm: Algorithm,
    limit: u32,
    burst: u32,
    unit: Unit,
    consume: bool,
    lockout_ms: u64,
) -> Policy {
    Policy {
        algorithm,
        unit,
        unit_multiplier: 1,
        requests_per_unit: limit,
        burst,
        // Validation rejects `consume` for the sliding log.
        on_over_limit: if consume && algorithm != Algorithm::SlidingLog {
            OnOverLimit::Consume
        } else {
            OnOverLimit::Reject
        },
        lockout: (lockout_ms > 0).then(|| Duration::from_millis(lockout_ms)),
    }
}

fn any_algorithm() -> impl Strategy<Value = Algorithm> {
    prop::sample::select(Algorithm::ALL.to_vec())
}

fn any_unit() -> impl Strategy<Value = Unit> {
    prop::sample::select(vec![Unit::Second, Unit::Minute, Unit::Hour])
}

/// A valid policy for the algorithm, as config validation would accept it.
fn any_policy() -> impl Strategy<Value = Policy> {
    (
        any_algorithm(),
        1u32..=40,
        1u32..=40,
        any_unit(),
        any::<bool>(),
        prop_oneof![Just(0u64), 1u64..=120_000],
    )
        .prop_map(|(algorithm, limit, burst, unit, consume, lockout)| {
            policy(algorithm, limit, burst, unit, consume, lockout)
        })
}

/// Two verdicts agree on everything a caller sees.
fn same_answer(a: Verdict, b: Verdict) -> bool {
    (a.allowed, a.remaining, a.reset_ms) == (b.allowed, b.remaining, b.reset_ms)
}

/// Sum of the costs admitted by `(offset from start, cost)` requests on a fresh bucket.
fn admitted(policy: &Policy, start: i64, requests: &[(i64, u64)]) -> u64 {
    let mut bucket = Bucket::new(policy.algorithm);
    requests
        .iter()
        .filter(|&&(offset, cost)| cost > 0 && bucket.decide(policy, start + offset, cost).allowed)
        .map(|&(_, cost)| cost)
        .sum()
}

proptest! {
    /// Inside one window (times in any order, any costs, consume or lockout) the windowed
    /// algorithms never admit more than `L`.
    #[test]
    fn windows_never_admit_more_than_the_limit(
        policy in any_policy().prop_filter("windowed", |p| p.algorithm != Algorithm::TokenBucket),
        requests in prop::collection::vec((0i64..1000, 0u64..=45), 1..60),
    ) {
        let scale = policy.window_ms() as i64 / 1000;
        let requests: Vec<_> = requests.iter().map(|&(at, cost)| (at * scale, cost)).collect();
        let total = admitted(&policy, DAY_START, &requests);
        prop_assert!(total <= u64::from(policy.requests_per_unit), "admitted {total}");
    }

    /// At one instant a token bucket admits at most `B`, and exactly `B` requests of cost 1.
    #[test]
    fn token_bucket_admits_exactly_the_burst_at_one_instant(
        limit in 1u32..=10_000,
        burst in 1u32..=10_000,
        unit in any_unit(),
        costs in prop::collection::vec(1u64..=50, 1..60),
    ) {
        let policy = policy(Algorithm::TokenBucket, limit, burst, unit, false, 0);
        let requests: Vec<_> = costs.iter().map(|&cost| (0, cost)).collect();
        prop_assert!(admitted(&policy, DAY_START, &requests) <= u64::from(burst));

        let mut bucket = Bucket::new(Algorithm::TokenBucket);
        for _ in 0..burst {
            prop_assert!(bucket.decide(&policy, DAY_START, 1).allowed);
        }
        prop_assert!(!bucket.decide(&policy, DAY_START, 1).allowed);
    }

    /// A refund right after a booking leaves a bucket that answers exactly like the bucket
    /// before the booking, now and at any later time.
    #[test]
    fn refund_right_after_a_booking_restores_the_state(
        policy in any_policy(),
        history in prop::collection::vec((0i64..5_000, 0u64..=12), 0..30),
        cost in 1u64..=12,
        probes in prop::collection::vec(0i64..7_200_000, 1..6),
    ) {
        let mut policy = policy;
        policy.on_over_limit = OnOverLimit::Reject;
        let mut bucket = Bucket::new(policy.algorithm);
        let mut now = DAY_START;
        for &(step, n) in &history {
            now += step;
            bucket.decide(&policy, now, n);
        }
        let before = bucket.clone();
        let verdict = bucket.decide(&policy, now, cost);
        prop_assume!(verdict.allowed && verdict.booked);
        bucket.refund(&policy, now, cost, now);
        for t in std::iter::once(now).chain(probes.iter().map(|&p| now + p)) {
            let (mut a, mut b) = (before.clone(), bucket.clone());
            prop_assert!(same_answer(a.decide(&policy, t, 0), b.decide(&policy, t, 0)));
            for n in [1, cost, cost + 1] {
                let (va, vb) = (a.decide(&policy, t, n), b.decide(&policy, t, n));
                prop_assert!(same_answer(va, vb), "at +{}: {va:?} vs {vb:?}", t - now);
            }
        }
    }

    /// With a clock that only moves forward, `remaining` stays within the budget and R
    /// within the algorithm's horizon (window end, drain time, two windows, lock).
    #[test]
    fn answers_stay_in_range(
        policy in any_policy(),
        requests in prop::collection::vec((0i64..20_000, 0u64..=50), 1..60),
    ) {
        let window = policy.window_ms();
        let (limit, burst) = (u64::from(policy.requests_per_unit), u64::from(policy.burst));
        let horizon = match policy.algorithm {
            Algorithm::FixedWindow | Algorithm::SlidingLog => window,
            Algorithm::SlidingWindow => 2 * window,
            // ceil(C / λ) = ceil(B * W / L); consume may fill past C, up to 2^53 units.
            Algorithm::TokenBucket if policy.on_over_limit == OnOverLimit::Consume => {
                let leak = limit / gcd(window, limit);
                MAX_EXACT_INTEGER.div_ceil(leak)
            }
            Algorithm::TokenBucket => (burst * window).div_ceil(limit),
        }
        .max(policy.lockout_ms());
        let budget = if policy.algorithm == Algorithm::TokenBucket { burst } else { limit };
        let mut bucket = Bucket::new(policy.algorithm);
        let mut now = DAY_START;
        for &(step, cost) in &requests {
            now += step;
            let v = bucket.decide(&policy, now, cost);
            prop_assert!(v.remaining <= budget, "{v:?}");
            prop_assert!(v.reset_ms <= horizon, "{v:?} beyond {horizon}");
            prop_assert!(v.allowed || v.remaining == 0);
            prop_assert!(bucket.expires_at_ms(&policy) <= now + horizon as i64);
        }
    }

    /// The sliding log is exact: no span of `W` ms admits more than `L`.
    #[test]
    fn sliding_log_never_admits_more_than_the_limit_in_any_window(
        limit in 1u64..=20,
        requests in prop::collection::vec((0i64..700, 1u64..=6), 1..120),
    ) {
        let params = Params { window_ms: 1000, limit, burst: limit };
        let mut log = SlidingLog::default();
        let mut admitted: Vec<(i64, u64)> = Vec::new();
        let mut now = DAY_START;
        for &(step, cost) in &requests {
            now += step;
            if log.check(&params, now, cost, true).allowed {
                admitted.push((now, cost));
            }
        }
        for &(end, _) in &admitted {
            let in_span: u64 = admitted
                .iter()
                .filter(|&&(t, _)| t > end - 1000 && t <= end)
                .map(|&(_, n)| n)
                .sum();
            prop_assert!(in_span <= limit, "{in_span} admitted in the W ending at {end}");
        }
    }

    /// Any instant (backwards too), any cost up to `u64::MAX`, any refund: no panic, and
    /// `remaining` never exceeds the budget.
    #[test]
    fn arbitrary_inputs_never_panic(
        policy in any_policy(),
        operations in prop::collection::vec(
            (any::<i64>(), prop_oneof![any::<u64>(), 0u64..=50], any::<bool>(), any::<i64>()),
            1..40,
        ),
    ) {
        let budget = u64::from(policy.requests_per_unit.max(policy.burst));
        let mut bucket = Bucket::new(policy.algorithm);
        for &(now, cost, refund, booked_at) in &operations {
            if refund {
                bucket.refund(&policy, now, cost, booked_at);
            } else {
                let v = bucket.decide(&policy, now, cost);
                prop_assert!(v.remaining <= budget);
            }
            bucket.expires_at_ms(&policy);
        }
    }

    /// The token bucket's numbers at large scale stay exact: a full burst drains in
    /// `B * W / L` ms, whatever the ratio of `W` to `L`.
    #[test]
    fn token_bucket_drain_time_is_exact(
        limit in 1u32..=u32::MAX,
        burst in 1u32..=1_000_000,
        unit in any_unit(),
    ) {
        let policy = policy(Algorithm::TokenBucket, limit, burst, unit, false, 0);
        prop_assume!(policy.check_exact_bounds().is_ok());
        let params = Params::of(&policy);
        let mut bucket = TokenBucket::default();
        let v = bucket.check(&params, DAY_START, u64::from(burst), false);
        prop_assert!(v.allowed);
        let drain = (u128::from(burst) * u128::from(policy.window_ms()))
            .div_ceil(u128::from(limit));
        prop_assert_eq!(u128::from(v.reset_ms), drain);
        prop_assert_eq!(bucket.expires_at_ms(&params), DAY_START + drain as i64);
    }
}

/// One step of a token-bucket history: a charge of `cost`, or the refund of the
/// `pick`-th (modulo) still-unrefunded booking. Each step happens `dt` ms after the last.
#[derive(Debug, Clone, Copy)]
enum Step {
    Charge { dt: i64, cost: u64 },
    Refund { dt: i64, pick: usize },
}

fn any_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0i64..400, 1u64..=12).prop_map(|(dt, cost)| Step::Charge { dt, cost }),
        1 => (0i64..400, any::<usize>()).prop_map(|(dt, pick)| Step::Refund { dt, pick }),
    ]
}

/// Runs `steps` on a fresh token bucket, with the extra request `x = (cost, charged before
/// step i, refunded before step j)` when given, and returns what every charge step answered
/// and a cost-1 peek after every step (the extra request's own answer is left out).
fn token_bucket_run(
    policy: &Policy,
    steps: &[Step],
    x: Option<(u64, usize, usize)>,
) -> Vec<(Option<Verdict>, Verdict)> {
    let mut bucket = Bucket::new(Algorithm::TokenBucket);
    let mut now = DAY_START;
    // (cost, booked_at) of the bookings not yet refunded, the extra request's kept apart.
    let mut bookings: Vec<(u64, i64)> = Vec::new();
    let mut x_booking = None;
    let mut answers = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let dt = match *step {
            Step::Charge { dt, .. } | Step::Refund { dt, .. } => dt,
        };
        now += dt;
        if let Some((cost, charged, refunded)) = x {
            if i == charged && bucket.decide(policy, now, cost).booked {
                x_booking = Some((cost, now));
            }
            if i == refunded
                && let Some((cost, at)) = x_booking.take()
            {
                bucket.refund(policy, now, cost, at);
            }
        }
        let answer = match *step {
            Step::Charge { cost, .. } => {
                let verdict = bucket.decide(policy, now, cost);
                if verdict.booked {
                    bookings.push((cost, now));
                }
                Some(verdict)
            }
            Step::Refund { pick, .. } => {
                if !bookings.is_empty() {
                    let (cost, at) = bookings.remove(pick % bookings.len());
                    bucket.refund(policy, now, cost, at);
                }
                None
            }
        };
        answers.push((answer, bucket.clone().decide(policy, now, 0)));
    }
    answers
}

proptest! {
    /// A token-bucket request that is booked and later refunded never lets more through
    /// than if it had never been made: until the two histories first answer a charge
    /// differently, the one with the refunded request is never the one that admits, and
    /// never shows more remaining.
    #[test]
    fn token_bucket_refund_never_lets_more_through(
        limit in 1u32..=20,
        burst in 1u32..=20,
        unit in prop::sample::select(vec![Unit::Second, Unit::Minute]),
        steps in prop::collection::vec(any_step(), 2..40),
        x_cost in 1u64..=12,
        x_at in any::<prop::sample::Index>(),
        x_refund_after in any::<prop::sample::Index>(),
    ) {
        let policy = policy(Algorithm::TokenBucket, limit, burst, unit, false, 0);
        let charged = x_at.index(steps.len() - 1);
        let refunded = charged + x_refund_after.index(steps.len() - charged);
        let with = token_bucket_run(&policy, &steps, Some((x_cost, charged, refunded)));
        let without = token_bucket_run(&policy, &steps, None);
        for (i, ((a, peek_a), (b, peek_b))) in with.iter().zip(&without).enumerate() {
            if let (Some(a), Some(b)) = (a, b) {
                prop_assert!(
                    !a.allowed || b.allowed,
                    "step {i} admitted only with the refunded request: {a:?} vs {b:?}"
                );
                if a.allowed != b.allowed {
                    break;
                }
            }
            prop_assert!(
                peek_a.remaining <= peek_b.remaining,
                "step {i}: {peek_a:?} vs {peek_b:?}"
            );
        }
    }
}
