//! The backend side of a quota bucket: booking what clients report into the bucket
//! ShouldRateLimit charges, and recording demand where every replica sees it.
//!
//! Demand (allowed + denied) goes into a sliding-window counter next to the bucket (its
//! own key, same backend), so the total over every stream of every replica is one read;
//! each stream keeps the same counter of its own demand in process. A stream's share is
//! its demand rate (from its latest report) over everyone's: the total less its own
//! counter, over [`DEMAND_WINDOW`], plus its own rate. Its own counter peaks right after
//! its report while the others' are read at any point of theirs, so counters alone would
//! overstate every stream's share (by 12-20% with 5 s reports: the shares added up to
//! 1.2). A stream that goes away fades out of the total within two windows. This needs no
//! backend operation beyond the charges and peeks every backend already makes atomically.

use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::Bucket;
use crate::backend::{BackendError, Charge, Outcome};
use crate::limiter::{Limiter, QuotaBucket, always_over};
use crate::overload::Caller;
use crate::rules::{Algorithm, OnOverLimit, Policy, Unit};

use super::assign::Budget;

/// Length of the demand counters' sliding window.
pub const DEMAND_WINDOW: Duration = Duration::from_secs(10);

/// Rounds of peek-then-book when a report does not fit whole (others booking meanwhile).
const SATURATE_ROUNDS: usize = 3;

/// The policy of every demand counter: a sliding window that never denies and books
/// whatever it is given.
pub fn demand_policy() -> Policy {
    Policy {
        algorithm: Algorithm::SlidingWindow,
        unit: Unit::Second,
        unit_multiplier: DEMAND_WINDOW.as_secs() as u32,
        requests_per_unit: u32::MAX,
        burst: u32::MAX,
        on_over_limit: OnOverLimit::Consume,
        lockout: None,
    }
}

/// What the backend said after a booking or a peek.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    /// The bucket's budget.
    pub budget: Budget,
    /// Demand of every stream over the demand window.
    pub total_demand: u64,
}

/// What a bucket's reports carried that the backend has not yet booked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pending {
    /// Allowed requests, for the bucket.
    pub allowed: u64,
    /// Allowed and denied requests, for the demand counter.
    pub demand: u64,
    /// The time the reports covered (`time_elapsed`): a token bucket books `allowed` as
    /// spent over it.
    pub over: Duration,
}

impl Pending {
    /// Adds one report's counts, each up to `most`.
    pub fn add(&mut self, allowed: u64, demand: u64, over: Duration, most: u64) {
        self.allowed = self.allowed.saturating_add(allowed).min(most);
        self.demand = self.demand.saturating_add(demand).min(most);
        self.over = self.over.saturating_add(over);
    }
}

/// Books reports and reads budgets through the limiter, as ShouldRateLimit's charges go.
#[derive(Clone)]
pub struct Ledger {
    limiter: Arc<Limiter>,
}

impl Ledger {
    /// A ledger over `limiter`'s backend.
    pub fn new(limiter: Arc<Limiter>) -> Ledger {
        Ledger { limiter }
    }

    /// Books `pending.allowed` requests into the bucket, saturating at its limit: they
    /// already happened, so they are neither refused nor refunded, and never push the
    /// bucket into debt. Books `pending.demand` into the demand counter. Nothing pending
    /// only reads. Every backend call is made for `caller`.
    ///
    /// # Errors
    /// The backend failed, timed out or refused the work; nothing is known about what was
    /// booked.
    pub async fn book(
        &self,
        quota: &QuotaBucket,
        pending: Pending,
        caller: Caller,
    ) -> Result<Reading, BackendError> {
        let Pending {
            allowed, demand, ..
        } = pending;
        let spread_ms = u64::try_from(pending.over.as_millis()).unwrap_or(u64::MAX);
        let call = |charges: Vec<Charge>| async move {
            self.limiter.quota_charges(&charges, caller).await
        };
        if quota.policy.requests_per_unit == 0 {
            let outcomes = call(vec![self.demand(quota, demand)]).await?;
            return Ok(Reading {
                budget: budget(&always_over(&quota.policy)),
                total_demand: counted(outcomes[0].remaining),
            });
        }
        // A lockout rule starts its lock on a denial, so never try what may not fit.
        let direct = allowed > 0 && quota.policy.lockout.is_none();
        let first = if direct { allowed } else { 0 };
        let outcomes = call(vec![
            self.charge(quota, first, spread_ms),
            self.demand(quota, demand),
        ])
        .await?;
        let total_demand = counted(outcomes[1].remaining);
        let mut state = outcomes[0];
        // Whether `state` is a peek (it then says whether one more fits, and when it will).
        let mut peeked = first == 0;
        let mut left = if direct && state.allowed { 0 } else { allowed };
        for _ in 0..SATURATE_ROUNDS {
            if left == 0 {
                break;
            }
            if !peeked {
                state = call(vec![self.charge(quota, 0, 0)]).await?[0];
                peeked = true;
            }
            let fits = left.min(state.remaining);
            if fits == 0 {
                break;
            }
            // Others may have booked since the peek; then peek again.
            let booked = call(vec![self.charge(quota, fits, spread_ms)]).await?[0];
            peeked = false;
            if booked.allowed {
                left -= fits;
                state = booked;
            }
        }
        // A booking's reset is not "until one more fits"; a spent bucket needs that one.
        let open = state.allowed && state.remaining > 0;
        if !peeked && !open {
            state = call(vec![self.charge(quota, 0, 0)]).await?[0];
        }
        Ok(Reading {
            budget: budget(&state),
            total_demand,
        })
    }

    /// A charge that books only what fits, whatever the rule's accounting: a `consume`
    /// rule booking a report whole would go into debt (a 10-an-hour bucket denied for
    /// 3,960 s instead of 360 s), which [`Ledger::book`] never does. `spread_ms`: the time
    /// the cost was spent over.
    fn charge(&self, quota: &QuotaBucket, cost: u64, spread_ms: u64) -> Charge {
        Charge {
            bucket: quota.bucket,
            policy: Policy {
                on_over_limit: OnOverLimit::Reject,
                ..quota.policy
            },
            cost,
            spread_ms,
        }
    }

    fn demand(&self, quota: &QuotaBucket, cost: u64) -> Charge {
        Charge {
            bucket: quota.demand,
            policy: demand_policy(),
            cost,
            spread_ms: 0,
        }
    }
}

/// A demand counter's count, from what its outcome says remains of `u32::MAX`.
fn counted(remaining: u64) -> u64 {
    u64::from(u32::MAX).saturating_sub(remaining)
}

/// The budget a booking's or a peek's outcome leaves.
fn budget(outcome: &Outcome) -> Budget {
    Budget {
        open: outcome.allowed && outcome.remaining > 0,
        remaining: outcome.remaining,
        reset: Duration::from_millis(outcome.reset_ms),
    }
}

/// One stream's own demand for one bucket, counted like the shared counter.
#[derive(Debug, Clone)]
pub struct OwnDemand(Bucket);

impl Default for OwnDemand {
    fn default() -> Self {
        OwnDemand(Bucket::new(Algorithm::SlidingWindow))
    }
}

impl OwnDemand {
    /// Adds `demand` at `now` (ms since the epoch) and returns the count over the demand
    /// window.
    pub fn add(&mut self, demand: u64, now: i64) -> u64 {
        let policy = demand_policy();
        if demand > 0 {
            self.0.decide(&policy, now, demand);
        }
        counted(self.0.decide(&policy, now, 0).remaining)
    }
}

/// The demand rate of every other stream of a bucket: the shared counter (`total`) less
/// the stream's own counter (`own_count`), over the time the counters hold: the demand
/// window, or less while the stream's own counter holds less than a window (every stream
/// new), as its own count over its own rate (`own_rate`) says.
pub fn others_rate(own_rate: f64, own_count: u64, total: u64) -> f64 {
    let window = DEMAND_WINDOW.as_secs_f64();
    let held = if own_rate > 0.0 {
        (own_count as f64 / own_rate).clamp(1.0, window)
    } else {
        window
    };
    total.saturating_sub(own_count) as f64 / held
}

/// A stream's share of a bucket: its demand rate (`own_rate` a second) over everyone's
/// (`others` a second besides). The stream counts at least one request per demand window,
/// so a quiet stream still gets room for its next one.
pub fn share(own_rate: f64, others: f64) -> f64 {
    let own = own_rate.max(1.0 / DEMAND_WINDOW.as_secs_f64());
    own / (others.max(0.0) + own)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Backend;
    use crate::backend::memory::MemoryBackend;
    use crate::clock::ManualClock;
    use crate::limiter::{LimiterOptions, QuotaRule};
    use crate::matcher::Matcher;
    use crate::metrics::Metrics;

    const RULES: &str = "\
domain: d
descriptors:
  - key: window
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: tokens
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: token_bucket}
  - key: locked
    rate_limit: {unit: hour, requests_per_unit: 2, lockout_seconds: 600}
  - key: consumed
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: token_bucket, on_over_limit: consume}
";

    /// Counts reported with no time covered.
    fn at_once(allowed: u64, demand: u64) -> Pending {
        Pending {
            allowed,
            demand,
            over: Duration::ZERO,
        }
    }

    /// A ledger on a memory backend whose clock reads one second into an hour.
    fn fixture() -> (Ledger, Arc<Limiter>) {
        let clock = Arc::new(ManualClock::new(3_600_000 * 500_000 + 1000));
        let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::with_clock(1000, clock));
        let domain = crate::config::parse_domain("d.yaml", RULES).expect("rules parse");
        let limiter = Arc::new(Limiter::new(
            Matcher::new(vec![domain]),
            backend,
            Arc::new(Metrics::new()),
            LimiterOptions::default(),
        ));
        (Ledger::new(Arc::clone(&limiter)), limiter)
    }

    fn quota(limiter: &Limiter, key: &str) -> Box<QuotaBucket> {
        let entries = [(key.to_owned(), "v".to_owned())];
        match limiter.quota_rule("d", &entries, &demand_policy()) {
            QuotaRule::Limited(quota) => quota,
            QuotaRule::Unlimited => panic!("{key} has a limit"),
        }
    }

    #[tokio::test]
    async fn reports_book_up_to_the_limit_and_never_past_it() {
        let (ledger, limiter) = fixture();
        let window = quota(&limiter, "window");
        let some = ledger
            .book(&window, at_once(4, 4), Caller::default())
            .await
            .unwrap();
        assert_eq!((some.budget.open, some.budget.remaining), (true, 6));
        let spent = ledger
            .book(&window, at_once(100, 100), Caller::default())
            .await
            .unwrap();
        assert_eq!((spent.budget.open, spent.budget.remaining), (false, 0));
        assert_eq!(spent.budget.reset, Duration::from_secs(3599));
        // A token bucket is left empty, not in debt: one request fits again after one
        // refill period (6 minutes at 10 an hour), not after 9 hours.
        let tokens = quota(&limiter, "tokens");
        let empty = ledger
            .book(&tokens, at_once(100, 0), Caller::default())
            .await
            .unwrap();
        assert!(!empty.budget.open);
        assert_eq!(empty.budget.reset, Duration::from_secs(360));
    }

    #[tokio::test]
    async fn a_consume_rule_is_left_empty_too_not_in_debt() {
        let (ledger, limiter) = fixture();
        let consumed = quota(&limiter, "consumed");
        let empty = ledger
            .book(&consumed, at_once(100, 0), Caller::default())
            .await
            .unwrap();
        assert!(!empty.budget.open);
        // One refill period (6 minutes at 10 an hour), not 9 hours and 6 minutes.
        assert_eq!(empty.budget.reset, Duration::from_secs(360));
    }

    #[tokio::test]
    async fn booking_past_a_lockout_rule_does_not_start_its_lock() {
        let (ledger, limiter) = fixture();
        let locked = quota(&limiter, "locked");
        let spent = ledger
            .book(&locked, at_once(5, 5), Caller::default())
            .await
            .unwrap();
        assert!(!spent.budget.open);
        // Denied until the window ends, not for the 600 s lockout.
        assert_eq!(spent.budget.reset, Duration::from_secs(3599));
    }

    #[tokio::test]
    async fn demand_adds_up_over_every_stream() {
        let (ledger, limiter) = fixture();
        let window = quota(&limiter, "window");
        assert_eq!(
            ledger
                .book(&window, at_once(0, 5), Caller::default())
                .await
                .unwrap()
                .total_demand,
            5
        );
        assert_eq!(
            ledger
                .book(&window, at_once(0, 7), Caller::default())
                .await
                .unwrap()
                .total_demand,
            12
        );
        // A read books nothing.
        let read = ledger
            .book(&window, at_once(0, 0), Caller::default())
            .await
            .unwrap();
        assert_eq!((read.total_demand, read.budget.remaining), (12, 10));
    }

    #[test]
    fn a_share_is_the_streams_rate_over_everyones_and_at_least_one_request() {
        // 5/s of its own, 15/s of others (150 counted over 10 s beside its own 60).
        assert_eq!(others_rate(5.0, 60, 210), 15.0);
        assert_eq!(share(5.0, 15.0), 0.25);
        assert_eq!(share(0.0, others_rate(0.0, 0, 0)), 1.0);
        assert_eq!(share(0.0, others_rate(0.0, 0, 9)), 0.1 / 1.0);
        // A total that lags the stream's own count (another clock) leaves it all.
        assert_eq!(share(3.0, others_rate(3.0, 30, 20)), 1.0);
        // Every stream new: 4 s of demand held, 20/s of its own and as much of another.
        assert_eq!(others_rate(20.0, 80, 160), 20.0);
    }
}
