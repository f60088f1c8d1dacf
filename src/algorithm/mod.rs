//! The rate-limit algorithms as pure functions: (state, now, cost) -> (verdict, new state).
//!
//! These are the single definition of floodgate's semantics (docs/algorithms.md). The memory
//! backend calls them; the Lua scripts in `lua/` follow them step for step, with the same integer
//! arithmetic, so both give identical decisions, remaining counts and resets.
//!
//! This module owns what all algorithms share: peeks (`cost = 0`), lockouts and the
//! `on_over_limit` mode. Each submodule owns one algorithm's state and arithmetic.

pub mod fixed_window;
pub mod sliding_log;
pub mod sliding_window;
pub mod token_bucket;

use crate::rules::{Algorithm, OnOverLimit, Policy};

/// The numbers an algorithm computes with, all integers (ms, requests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// `W`: window length in ms (>= 1000).
    pub window_ms: i64,
    /// `L`: requests per window (>= 1; `L = 0` never reaches an algorithm).
    pub limit: u64,
    /// `B`: token-bucket capacity in requests.
    pub burst: u64,
}

impl Params {
    /// Extracts the algorithm's numbers from a policy.
    pub fn of(policy: &Policy) -> Params {
        Params {
            window_ms: policy.window_ms() as i64,
            limit: u64::from(policy.requests_per_unit),
            burst: u64::from(policy.burst),
        }
    }
}

/// One algorithm's answer for one charge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Whether the cost fits.
    pub allowed: bool,
    /// Requests left after booking (0 when denied).
    pub remaining: u64,
    /// `R` in ms, as docs/algorithms.md defines it for the algorithm and outcome.
    pub reset_ms: u64,
    /// Whether the cost was booked into the counter, so that a refund of it makes sense.
    /// Starting a lockout is not a booking: refunding a denial would take back units that
    /// other requests booked.
    pub booked: bool,
}

/// The behaviour every algorithm's state implements.
pub trait Counter: Default + Clone {
    /// Charges `cost >= 1` at `now_ms`. Books the cost when it fits, and also when it does
    /// not if `book_on_deny` (the `consume` mode; the sliding log, for which validation
    /// rejects `consume`, ignores it).
    fn check(&mut self, params: &Params, now_ms: i64, cost: u64, book_on_deny: bool) -> Verdict;

    /// As `check`, for a cost spent over the `spread_ms` before `now_ms` (a quota report).
    /// Only the token bucket books it from its start (`token_bucket`); the windows are
    /// handed only the part of a report that falls inside them, and book it now.
    fn check_spent(
        &mut self,
        params: &Params,
        now_ms: i64,
        cost: u64,
        book_on_deny: bool,
        spread_ms: u64,
    ) -> Verdict {
        let _ = spread_ms;
        self.check(params, now_ms, cost, book_on_deny)
    }

    /// Answers whether a cost-1 request would fit now, changing nothing. `remaining` is what
    /// is left without booking; `reset_ms` is as for an allowed (or denied cost-1) check.
    fn peek(&self, params: &Params, now_ms: i64) -> Verdict;

    /// Undoes a booking of `cost` made at `booked_at_ms`, as far as the state still holds it.
    fn refund(&mut self, params: &Params, now_ms: i64, cost: u64, booked_at_ms: i64);

    /// The instant (ms) from which this state is indistinguishable from an empty one, so the
    /// bucket can be dropped (memory) or expire (Redis TTL).
    fn expires_at_ms(&self, params: &Params) -> i64;
}

/// Per-algorithm state of one bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CounterState {
    /// See `fixed_window`.
    FixedWindow(fixed_window::FixedWindow),
    /// See `token_bucket`.
    TokenBucket(token_bucket::TokenBucket),
    /// See `sliding_window`.
    SlidingWindow(sliding_window::SlidingWindow),
    /// See `sliding_log`.
    SlidingLog(sliding_log::SlidingLog),
}

/// Full state of one bucket: the algorithm's counter plus the lockout deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    /// The algorithm's own state.
    pub counter: CounterState,
    /// Until when (ms) every request is denied; 0 when not locked.
    pub locked_until_ms: i64,
}

/// Dispatches a call to whichever counter a bucket holds.
macro_rules! with_counter {
    ($state:expr, $counter:ident => $body:expr) => {
        match $state {
            CounterState::FixedWindow($counter) => $body,
            CounterState::TokenBucket($counter) => $body,
            CounterState::SlidingWindow($counter) => $body,
            CounterState::SlidingLog($counter) => $body,
        }
    };
}

impl Bucket {
    /// A fresh, empty bucket for an algorithm.
    pub fn new(algorithm: Algorithm) -> Bucket {
        let counter = match algorithm {
            Algorithm::FixedWindow => CounterState::FixedWindow(Default::default()),
            Algorithm::TokenBucket => CounterState::TokenBucket(Default::default()),
            Algorithm::SlidingWindow => CounterState::SlidingWindow(Default::default()),
            Algorithm::SlidingLog => CounterState::SlidingLog(Default::default()),
        };
        Bucket {
            counter,
            locked_until_ms: 0,
        }
    }

    /// Decides one charge of `cost` at `now_ms` under `policy` (docs/algorithms.md), updating the
    /// state.
    ///
    /// Order: a peek changes nothing; an active lock denies with R = lock left (booking the
    /// cost only under `consume`); otherwise the algorithm decides, and a real denial starts
    /// the lockout, reporting R = the whole lockout.
    pub fn decide(&mut self, policy: &Policy, now_ms: i64, cost: u64) -> Verdict {
        self.decide_spent(policy, now_ms, cost, 0)
    }

    /// As [`Bucket::decide`], for a cost spent over the `spread_ms` before `now_ms`
    /// ([`Counter::check_spent`]).
    pub fn decide_spent(
        &mut self,
        policy: &Policy,
        now_ms: i64,
        cost: u64,
        spread_ms: u64,
    ) -> Verdict {
        let params = Params::of(policy);
        let lock_left = self.locked_until_ms.saturating_sub(now_ms);
        let consume = policy.on_over_limit == OnOverLimit::Consume;
        if cost == 0 {
            if lock_left > 0 {
                return denied(lock_left, false);
            }
            return with_counter!(&self.counter, c => c.peek(&params, now_ms));
        }
        if lock_left > 0 {
            let booked = consume
                && with_counter!(&mut self.counter, c => c.check_spent(&params, now_ms, cost, true, spread_ms))
                    .booked;
            return denied(lock_left, booked);
        }
        let mut verdict = with_counter!(&mut self.counter, c => c.check_spent(&params, now_ms, cost, consume, spread_ms));
        let lockout_ms = policy.lockout_ms() as i64;
        if !verdict.allowed && lockout_ms > 0 {
            self.locked_until_ms = now_ms.saturating_add(lockout_ms);
            verdict.reset_ms = lockout_ms as u64;
        }
        verdict
    }

    /// Undoes a booking made by `decide` (see `Counter::refund`).
    pub fn refund(&mut self, policy: &Policy, now_ms: i64, cost: u64, booked_at_ms: i64) {
        let params = Params::of(policy);
        with_counter!(&mut self.counter, c => c.refund(&params, now_ms, cost, booked_at_ms));
    }

    /// How many units of the memory backend's cap this bucket takes: a sliding log one per
    /// logged instant (its state grows with them), every other bucket one.
    pub fn size(&self) -> usize {
        match &self.counter {
            CounterState::SlidingLog(log) => log.len().max(1),
            _ => 1,
        }
    }

    /// When the bucket may be dropped: its counter is empty and any lock is over.
    pub fn expires_at_ms(&self, policy: &Policy) -> i64 {
        let params = Params::of(policy);
        let counter = with_counter!(&self.counter, c => c.expires_at_ms(&params));
        counter.max(self.locked_until_ms)
    }
}

fn denied(reset_ms: i64, booked: bool) -> Verdict {
    Verdict::denied(reset_ms.max(0) as u64, booked)
}

impl Verdict {
    /// A denial: nothing remains, and the caller may retry after `reset_ms`.
    pub fn denied(reset_ms: u64, booked: bool) -> Verdict {
        Verdict {
            allowed: false,
            remaining: 0,
            reset_ms,
            booked,
        }
    }
}

/// Shared fixture of the algorithms' unit tests.
#[cfg(test)]
pub(crate) mod test_params {
    use super::Params;

    /// A one-minute window.
    pub const W: i64 = 60_000;

    /// `L = limit` per minute, burst `limit`.
    pub fn minute(limit: u64) -> Params {
        Params {
            window_ms: W,
            limit,
            burst: limit,
        }
    }
}

/// `ceil(a / b)` for non-negative `a` and positive `b`.
pub fn div_ceil(a: i128, b: i128) -> i128 {
    debug_assert!(a >= 0 && b > 0);
    (a + b - 1) / b
}

/// Counts booked without a fit (`consume`) stop growing here: 2^53, the largest integer
/// the Lua scripts hold exactly. Any limit is far below it, so decisions are unaffected.
pub const MAX_COUNT: u64 = crate::rules::MAX_EXACT_INTEGER;

impl Params {
    /// `W` widened for arithmetic, at least 1 ms so that no policy can divide by zero.
    fn window(&self) -> i128 {
        i128::from(self.window_ms.max(1))
    }
}

/// An R computed in wide arithmetic, clamped to `0..=u64::MAX` (never negative).
fn reset(ms: i128) -> u64 {
    ms.clamp(0, i128::from(u64::MAX)) as u64
}

/// An instant computed in wide arithmetic, clamped to the `i64` range.
fn instant(ms: i128) -> i64 {
    ms.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::Unit;
    use std::time::Duration;

    /// The start of some minute.
    const NOW: i64 = 1_700_000_040_000;
    const LOCK: i64 = 900_000;

    fn locking(limit: u32) -> Policy {
        let mut policy = Policy::fixed_window(limit, Unit::Minute);
        policy.lockout = Some(Duration::from_millis(LOCK as u64));
        policy
    }

    #[test]
    fn consume_books_denials_also_during_a_lock() {
        let mut policy = locking(2);
        policy.on_over_limit = OnOverLimit::Consume;
        let mut bucket = Bucket::new(Algorithm::FixedWindow);
        bucket.decide(&policy, NOW, 2);
        let v = bucket.decide(&policy, NOW, 1);
        assert_eq!(
            (v.allowed, v.booked, v.reset_ms),
            (false, true, LOCK as u64)
        );
        let v = bucket.decide(&policy, NOW + 1, 4);
        assert_eq!((v.allowed, v.booked), (false, true));
        let CounterState::FixedWindow(counter) = &bucket.counter else {
            panic!("fixed window expected");
        };
        assert_eq!(counter.count, 7);
    }

    #[test]
    fn lock_across_a_clock_going_backwards_stays_positive() {
        let mut policy = locking(1);
        policy.algorithm = Algorithm::TokenBucket;
        let mut bucket = Bucket::new(Algorithm::TokenBucket);
        bucket.decide(&policy, NOW, 1);
        bucket.decide(&policy, NOW, 1);
        let v = bucket.decide(&policy, NOW - 1_000, 1);
        assert_eq!((v.allowed, v.reset_ms), (false, (LOCK + 1_000) as u64));
        // A lock near the end of time saturates instead of overflowing.
        let mut late = Bucket::new(Algorithm::TokenBucket);
        late.decide(&policy, i64::MAX - 10, 1);
        late.decide(&policy, i64::MAX - 10, 1);
        assert_eq!(late.locked_until_ms, i64::MAX);
    }

    #[test]
    fn refund_dispatches_to_the_counter() {
        let policy = Policy::fixed_window(3, Unit::Minute);
        for algorithm in Algorithm::ALL {
            if algorithm == Algorithm::TokenBucket {
                continue;
            }
            let mut bucket = Bucket::new(algorithm);
            let empty = bucket.decide(&policy, NOW + 7, 0);
            assert!(bucket.decide(&policy, NOW + 7, 3).booked);
            assert!(!bucket.decide(&policy, NOW + 7, 1).allowed, "{algorithm}");
            bucket.refund(&policy, NOW + 7, 3, NOW + 7);
            assert_eq!(bucket.decide(&policy, NOW + 7, 0), empty, "{algorithm}");
        }
        let mut token = policy;
        token.algorithm = Algorithm::TokenBucket;
        let mut bucket = Bucket::new(Algorithm::TokenBucket);
        bucket.decide(&token, NOW, 3);
        bucket.refund(&token, NOW, 3, NOW);
        assert_eq!(bucket.decide(&token, NOW, 0).remaining, 3);
    }

    #[test]
    fn new_buckets_match_their_algorithm_and_expire_at_once() {
        let policy = Policy::fixed_window(3, Unit::Second);
        for algorithm in Algorithm::ALL {
            let bucket = Bucket::new(algorithm);
            // The state's variant carries the algorithm's name.
            assert!(format!("{:?}", bucket.counter).starts_with(&format!("{algorithm:?}(")));
            assert_eq!(bucket.expires_at_ms(&policy), 0);
        }
    }

    #[test]
    fn div_ceil_rounds_up() {
        assert_eq!(div_ceil(0, 7), 0);
        assert_eq!(div_ceil(7, 7), 1);
        assert_eq!(div_ceil(8, 7), 2);
    }
}
