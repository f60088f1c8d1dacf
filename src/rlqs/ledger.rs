//! The backend side of a quota bucket: booking what clients report into the bucket
//! ShouldRateLimit charges, and the fairness counters (`fair`) beside it, where every
//! replica reads them, all through the limiter as ShouldRateLimit's charges go. This needs
//! no backend operation beyond the charges, peeks and refunds every backend already makes
//! atomically.
//!
//! Each replica books its streams' counts twice: into the shared counters, which every
//! replica reads at once, and into counters of its own ([`BucketKey::for_replica`]). A
//! reading takes the counts of the replicas the registry calls silent (`limiter::replicas`:
//! not heard from for `LIVE_FOR`) out of the shared totals, so a replica that dies takes
//! its streams' demand with it within seconds, instead of over two demand windows.

use std::sync::Arc;
use std::time::Duration;

use crate::backend::{BackendError, BucketKey, Charge, Outcome, Refund};
use crate::limiter::{Limiter, QuotaBucket, always_over};
use crate::overload::Caller;
use crate::rules::{OnOverLimit, Policy};

use super::assign::Budget;
use super::fair::{self, Booked, Counts, OwnCounts};

/// Rounds of peek-then-book when a report does not fit whole (others booking meanwhile).
const SATURATE_ROUNDS: usize = 3;

/// What the backend said after a booking or a peek.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    /// The bucket's budget.
    pub budget: Budget,
    /// The fairness counters of every stream over the demand window.
    pub total: Counts,
    /// The backend's clock when it booked the counters (ms since the epoch): the window a
    /// stream's own copy of them, and so its withdrawal, is dated by.
    pub now_ms: i64,
}

/// What a bucket's reports carried that the backend has not yet booked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pending {
    /// Allowed requests, for the bucket.
    pub allowed: u64,
    /// The fairness counters' part.
    pub counted: Booked,
    /// The time the reports covered (`time_elapsed`): a token bucket books `allowed` as
    /// spent over it.
    pub over: Duration,
}

impl Pending {
    /// Adds one report's counts, each up to `most`.
    pub fn add(&mut self, allowed: u64, counted: Booked, over: Duration, most: u64) {
        let add = |sum: u64, more: u64| sum.saturating_add(more).min(most);
        self.allowed = add(self.allowed, allowed);
        self.counted = Booked {
            demand: add(self.counted.demand, counted.demand),
            capped: add(self.counted.capped, counted.capped),
            presence_ms: add(self.counted.presence_ms, counted.presence_ms),
        };
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
    /// bucket into debt. Books `pending.counted` into the fairness counters, in the same
    /// backend call. Nothing pending only reads. Every backend call is made for `caller`.
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
            allowed, counted, ..
        } = pending;
        let spread_ms = u64::try_from(pending.over.as_millis()).unwrap_or(u64::MAX);
        let call = |charges: Vec<Charge>| async move {
            self.limiter.quota_charges(&charges, caller).await
        };
        let fairness = self.fairness(quota, counted);
        if quota.policy.requests_per_unit == 0 {
            let outcomes = call(fairness).await?;
            return Ok(Reading {
                budget: budget(&always_over(&quota.policy)),
                total: totals(&outcomes),
                now_ms: outcomes[0].now_ms,
            });
        }
        // A lockout rule starts its lock on a denial, so never try what may not fit.
        let first = if quota.policy.lockout.is_none() {
            allowed
        } else {
            0
        };
        let mut charges = self.book_then_peek(quota, first, spread_ms).to_vec();
        charges.extend(fairness);
        let outcomes = call(charges).await?;
        let total = totals(&outcomes[2..]);
        let now_ms = outcomes[2].now_ms;
        let left = if first > 0 && outcomes[0].allowed {
            0
        } else {
            allowed
        };
        let peek = self
            .saturate(quota, left, outcomes[1], spread_ms, caller)
            .await;
        Ok(Reading {
            budget: budget(&peek),
            total,
            now_ms,
        })
    }

    /// This replica's id, under which its streams' fairness counts are kept apart, once the
    /// registry answered (a shared backend); `None` before, and on the memory backend.
    pub fn replica(&self) -> Option<&Arc<str>> {
        let registry = self.limiter.registry();
        registry.view().map(|_| registry.id())
    }

    /// The charges that book `counted` into the shared fairness counters of `quota` and
    /// into this replica's, then read the silent replicas' (cost 0): [`totals`] reads them.
    fn fairness(&self, quota: &QuotaBucket, counted: Booked) -> Vec<Charge> {
        let mut charges = counters(quota, counted, None).to_vec();
        let registry = self.limiter.registry();
        if let Some(view) = registry.view() {
            charges.extend(counters(quota, counted, Some(registry.id())));
            for silent in &view.silent {
                charges.extend(counters(quota, Booked::default(), Some(silent)));
            }
        }
        charges
    }

    /// Books what fits of the `left` requests of a report that did not fit whole, given the
    /// `peek` after its first booking; returns the last peek. Others may book meanwhile, and
    /// the next round's peek says so. The counters are booked by now, so a round that fails
    /// ends the rounds rather than the booking: the report is not booked twice.
    async fn saturate(
        &self,
        quota: &QuotaBucket,
        mut left: u64,
        mut peek: Outcome,
        spread_ms: u64,
        caller: Caller,
    ) -> Outcome {
        for _ in 0..SATURATE_ROUNDS {
            let fits = left.min(peek.remaining);
            if fits == 0 {
                break;
            }
            let charges = self.book_then_peek(quota, fits, spread_ms);
            let Ok(outcomes) = self.limiter.quota_charges(&charges, caller).await else {
                break;
            };
            if outcomes[0].allowed {
                left -= fits;
            }
            peek = outcomes[1];
        }
        peek
    }

    /// A booking of `cost` and a peek after it, in one call: the peek says whether one more
    /// fits and when, whatever the booking did, so a spent bucket costs no second round
    /// trip to learn its refill.
    fn book_then_peek(&self, quota: &QuotaBucket, cost: u64, spread_ms: u64) -> [Charge; 2] {
        [
            self.charge(quota, cost, spread_ms),
            self.charge(quota, 0, 0),
        ]
    }

    /// A charge that books only what fits, whatever the rule's accounting: a `consume`
    /// rule booking a report whole would go into debt (a 10-an-hour bucket denied for
    /// 3,960 s instead of 360 s), which [`Ledger::book`] never does. `spread_ms`: the time
    /// the cost was spent over.
    fn charge(&self, quota: &QuotaBucket, cost: u64, spread_ms: u64) -> Charge {
        Charge {
            bucket: quota.bucket,
            // A booking that races others may not fit; it must not start a lock either.
            policy: Policy {
                on_over_limit: OnOverLimit::Reject,
                lockout: None,
                ..quota.policy
            },
            cost,
            spread_ms,
        }
    }
}

/// The charges that book `counted` into the bucket's fairness counters, shared or
/// `replica`'s own, and read them.
fn counters(quota: &QuotaBucket, counted: Booked, replica: Option<&str>) -> [Charge; 3] {
    let costs = [counted.demand, counted.capped, counted.presence_ms];
    std::array::from_fn(|i| Charge {
        bucket: kept_by(quota.counters[i], replica),
        policy: fair::counter_policy(),
        cost: costs[i],
        spread_ms: 0,
    })
}

/// A fairness counter, shared or `replica`'s own.
fn kept_by(counter: BucketKey, replica: Option<&str>) -> BucketKey {
    replica.map_or(counter, |replica| counter.for_replica(replica))
}

/// The fairness counters' totals from the outcomes of [`Ledger::fairness`]: the shared
/// counts (the first three) less the silent replicas' (three each, after this replica's).
fn totals(outcomes: &[Outcome]) -> Counts {
    let read = |three: &[Outcome]| {
        let count = |i: usize| {
            three
                .get(i)
                .map_or(0, |outcome| fair::counted(outcome.remaining))
        };
        Counts {
            demand: count(0),
            capped: count(1),
            presence_ms: count(2),
        }
    };
    let mut total = read(outcomes.get(..3).unwrap_or_default());
    for silent in outcomes.get(6..).unwrap_or_default().chunks(3) {
        let gone = read(silent);
        total.demand = total.demand.saturating_sub(gone.demand);
        total.capped = total.capped.saturating_sub(gone.capped);
        total.presence_ms = total.presence_ms.saturating_sub(gone.presence_ms);
    }
    total
}

/// The refunds that take a stream's own counts of `quota` out of the shared counters and,
/// where they are kept apart, out of its `replica`'s own.
pub fn withdrawals(quota: &QuotaBucket, own: &OwnCounts, replica: Option<&str>) -> Vec<Refund> {
    let bookings = own.withdrawals();
    std::iter::once(None)
        .chain(replica.map(Some))
        .flat_map(|kept| {
            bookings
                .iter()
                .zip(quota.counters)
                .flat_map(move |(bookings, counter)| {
                    let bucket = kept_by(counter, kept);
                    bookings.iter().map(move |&(cost, booked_at_ms)| {
                        Refund::new(bucket, fair::counter_policy(), cost, booked_at_ms)
                    })
                })
        })
        .collect()
}

/// The budget a booking's or a peek's outcome leaves.
fn budget(outcome: &Outcome) -> Budget {
    Budget {
        open: outcome.allowed && outcome.remaining > 0,
        remaining: outcome.remaining,
        reset: Duration::from_millis(outcome.reset_ms),
    }
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

    /// Counts reported with no time covered for the bucket; 5 s of presence with demand.
    fn at_once(allowed: u64, demand: u64) -> Pending {
        Pending {
            allowed,
            counted: Booked {
                demand,
                capped: demand,
                presence_ms: if demand > 0 { 5_000 } else { 0 },
            },
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
        match limiter.quota_rule("d", &entries, &fair::counter_policy()) {
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
                .total
                .demand,
            5
        );
        assert_eq!(
            ledger
                .book(&window, at_once(0, 7), Caller::default())
                .await
                .unwrap()
                .total
                .demand,
            12
        );
        // A read books nothing.
        let read = ledger
            .book(&window, at_once(0, 0), Caller::default())
            .await
            .unwrap();
        assert_eq!((read.total.demand, read.budget.remaining), (12, 10));
        // Every report counts its time: two of 5 s each.
        assert_eq!(read.total.presence_ms, 10_000);
    }
}
