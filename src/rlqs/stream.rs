//! One quota stream: the buckets its client reports, what each was last assigned, and
//! when each is due for another look.
//!
//! A report books its counts and answers every reported bucket: a moved assignment, or
//! the one in force again (which only extends its TTL on the client). Between reports the
//! stream wakes for what time alone changes: a spent budget refilling, a rule reload, a
//! bucket gone quiet for too long, and a late report.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, stream};
use tokio::time::Instant;
use tonic::Status;

use crate::backend::BackendError;
use crate::limiter::{FailureMode, Limiter, QuotaRule};
use crate::matcher::Matcher;
use crate::metrics::RlqsMetrics;
use crate::proto::rlqs::RateLimitQuotaUsageReports;
use crate::proto::rlqs::rate_limit_quota_response::BucketAction;

use super::RlqsSettings;
use super::assign::{self, Assignment, Strategy};
use super::ledger::{self, Ledger, OwnDemand};
use super::validate::{self, BucketPairs, Usage};
use super::wire;

/// Reporting interval assumed until a report says (`time_elapsed`).
const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);
/// Shortest reporting interval learned.
const MIN_INTERVAL: Duration = Duration::from_millis(50);
/// Longest reporting interval learned.
const MAX_INTERVAL: Duration = Duration::from_secs(3600);
/// Most bytes of bucket ids one stream may hold (the count alone would allow 2.5 GiB).
pub const MAX_STREAM_ID_BYTES: usize = 16 << 20;
/// Most requests a bucket's report may carry into the backend: more than any limit holds
/// (`L` is 32 bits), and small enough that every backend's arithmetic stays exact.
const MAX_PENDING: u64 = u32::MAX as u64;
/// Backend calls one stream has in flight at once, so a report of 10,000 buckets does not
/// queue 10,000 calls ahead of every other caller's.
const CONCURRENT_BOOKINGS: usize = 64;
/// Longest sleep between checks for a rule reload.
const MAX_SLEEP: Duration = Duration::from_secs(1);
/// Shortest sleep, so a stream whose buckets are all due never spins.
const MIN_SLEEP: Duration = Duration::from_millis(5);

/// What every stream shares.
pub struct Shared {
    /// Rules and backend.
    pub limiter: Arc<Limiter>,
    /// Bookings and reads.
    pub ledger: Ledger,
    /// Bounds and abandon time.
    pub settings: RlqsSettings,
    /// Counters and gauges.
    pub metrics: RlqsMetrics,
}

/// One bucket of the stream.
struct Tracked {
    /// Shared with the index, so each id is held once.
    id: Arc<BucketPairs>,
    rule: QuotaRule,
    interval: Option<Duration>,
    last_report: Instant,
    /// Allowed requests reported but not yet booked (the backend failed).
    unbooked: u64,
    /// Demand (allowed + denied) reported but not yet recorded in the backend.
    unbooked_demand: u64,
    own: OwnDemand,
    own_count: u64,
    sent: Option<Sent>,
    next_look: Instant,
}

/// The assignment in force on the client.
#[derive(Debug, Clone, Copy)]
struct Sent {
    strategy: Strategy,
    expires: Instant,
}

impl Tracked {
    fn interval(&self) -> Duration {
        self.interval.unwrap_or(DEFAULT_INTERVAL)
    }

    /// Learns the reporting interval from a report's `time_elapsed`: at once when it grows,
    /// slowly when it shrinks, so jitter or a first report sent early never gives TTLs that
    /// end before the next report. Shorter than [`MIN_INTERVAL`] says nothing (the first
    /// report of a bucket may come right after its first request).
    fn learn_interval(&mut self, elapsed: Duration) {
        if elapsed < MIN_INTERVAL {
            return;
        }
        let elapsed = elapsed.min(MAX_INTERVAL);
        self.interval = Some(match self.interval {
            Some(known) if elapsed < known => (known * 3 + elapsed) / 4,
            _ => elapsed,
        });
    }
}

/// The state of one stream.
pub struct Stream {
    shared: Arc<Shared>,
    domain: Option<String>,
    buckets: Vec<Tracked>,
    index: HashMap<Arc<BucketPairs>, usize>,
    id_bytes: usize,
    rules: Arc<Matcher>,
}

impl Stream {
    /// A stream with no buckets yet.
    pub fn new(shared: Arc<Shared>) -> Stream {
        shared.metrics.streams.inc();
        let rules = shared.limiter.rules();
        Stream {
            shared,
            domain: None,
            buckets: Vec::new(),
            index: HashMap::new(),
            id_bytes: 0,
            rules,
        }
    }

    /// Books one message of reports and answers each reported bucket.
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` for a bad message, `RESOURCE_EXHAUSTED` past the stream's bounds.
    pub async fn report(
        &mut self,
        message: RateLimitQuotaUsageReports,
    ) -> Result<Vec<BucketAction>, Status> {
        let domain = validate::domain(self.domain.as_deref(), &message.domain)
            .map_err(|why| Status::invalid_argument(why.0))?;
        self.domain = Some(domain);
        let usages = validate::usages(message).map_err(|why| Status::invalid_argument(why.0))?;
        let now = Instant::now();
        self.follow_rules(now);
        let mut reported = Vec::with_capacity(usages.len());
        for usage in usages {
            reported.push(self.record(usage, now)?);
        }
        reported.sort_unstable();
        reported.dedup();
        Ok(self.look(&reported, now, true).await)
    }

    /// Answers what time changed: abandons quiet buckets, and looks again at those due.
    pub async fn tick(&mut self) -> Vec<BucketAction> {
        let now = Instant::now();
        let mut actions = self.abandon_quiet(now);
        self.follow_rules(now);
        let due: Vec<usize> = (0..self.buckets.len())
            .filter(|&i| self.buckets[i].next_look <= now)
            .collect();
        actions.extend(self.look(&due, now, false).await);
        actions
    }

    /// When the stream next has something to do without a report.
    pub fn next_wake(&self) -> Instant {
        let now = Instant::now();
        let abandon = self.shared.settings.abandon_after;
        let mut wake = now + MAX_SLEEP;
        for bucket in &self.buckets {
            // Rule reloads are checked at least once per reporting interval.
            let soonest = (now + bucket.interval()).min(bucket.next_look);
            wake = wake.min(soonest);
            if let Some(quiet) = bucket.last_report.checked_add(abandon) {
                wake = wake.min(quiet);
            }
        }
        wake.max(now + MIN_SLEEP)
    }

    /// Finds or adds the reported bucket, and counts its report. Returns its index.
    fn record(&mut self, usage: Usage, now: Instant) -> Result<usize, Status> {
        self.shared.metrics.reports.inc();
        let at = match self.index.get(&usage.id) {
            Some(&at) => at,
            None => self.add(usage.id, now)?,
        };
        let bucket = &mut self.buckets[at];
        bucket.learn_interval(usage.elapsed);
        bucket.last_report = now;
        bucket.unbooked = bucket
            .unbooked
            .saturating_add(usage.allowed)
            .min(MAX_PENDING);
        let demand = usage.allowed.saturating_add(usage.denied).min(MAX_PENDING);
        bucket.unbooked_demand = bucket
            .unbooked_demand
            .saturating_add(demand)
            .min(MAX_PENDING);
        bucket.own_count = bucket.own.add(demand);
        Ok(at)
    }

    fn add(&mut self, id: BucketPairs, now: Instant) -> Result<usize, Status> {
        let max = self.shared.settings.max_buckets;
        if self.buckets.len() >= max {
            return Err(Status::resource_exhausted(format!(
                "a stream may hold at most {max} buckets (--rlqs-max-buckets)"
            )));
        }
        let bytes = id_bytes(&id);
        if self.id_bytes + bytes > MAX_STREAM_ID_BYTES {
            return Err(Status::resource_exhausted(format!(
                "a stream's bucket ids may take at most {MAX_STREAM_ID_BYTES} bytes"
            )));
        }
        self.id_bytes += bytes;
        let rule = self.resolve(&id);
        let at = self.buckets.len();
        let id = Arc::new(id);
        self.index.insert(Arc::clone(&id), at);
        self.buckets.push(Tracked {
            id,
            rule,
            interval: None,
            last_report: now,
            unbooked: 0,
            unbooked_demand: 0,
            own: OwnDemand::default(),
            own_count: 0,
            sent: None,
            next_look: now,
        });
        self.shared.metrics.buckets.inc();
        Ok(at)
    }

    fn resolve(&self, id: &BucketPairs) -> QuotaRule {
        let domain = self.domain.as_deref().unwrap_or_default();
        self.shared
            .limiter
            .quota_rule(domain, id, &ledger::demand_policy())
    }

    /// After a rule reload, resolves every bucket again; those whose rule changed are due.
    fn follow_rules(&mut self, now: Instant) {
        let rules = self.shared.limiter.rules();
        if Arc::ptr_eq(&rules, &self.rules) {
            return;
        }
        self.rules = rules;
        for at in 0..self.buckets.len() {
            let rule = self.resolve(&self.buckets[at].id);
            let bucket = &mut self.buckets[at];
            if rule != bucket.rule {
                bucket.rule = rule;
                bucket.next_look = now;
            }
        }
    }

    /// Abandons the buckets not reported for `--rlqs-abandon-after`, and forgets them.
    fn abandon_quiet(&mut self, now: Instant) -> Vec<BucketAction> {
        let abandon = self.shared.settings.abandon_after;
        let mut actions = Vec::new();
        let mut at = 0;
        while at < self.buckets.len() {
            let quiet = self.buckets[at].last_report.checked_add(abandon);
            if quiet.is_none_or(|quiet| quiet > now) {
                at += 1;
                continue;
            }
            let gone = self.buckets.swap_remove(at);
            self.index.remove(&gone.id);
            if let Some(moved) = self.buckets.get(at) {
                self.index.insert(Arc::clone(&moved.id), at);
            }
            self.id_bytes -= id_bytes(&gone.id);
            self.shared.metrics.buckets.dec();
            self.shared.metrics.abandons.inc();
            actions.push(wire::abandon(&gone.id));
        }
        actions
    }

    /// Books and sizes the buckets at `indexes` (their backend calls concurrently), and
    /// returns what to push. `answer`: a report asked, so every bucket is answered, with
    /// the assignment in force when the new one did not move enough.
    async fn look(&mut self, indexes: &[usize], now: Instant, answer: bool) -> Vec<BucketAction> {
        let ledger = &self.shared.ledger;
        let buckets = &self.buckets;
        // Collected first: a stream over a closure's futures is not `Send` to the compiler.
        let jobs: Vec<_> = indexes
            .iter()
            .map(|&at| async move {
                let bucket = &buckets[at];
                match &bucket.rule {
                    QuotaRule::Unlimited => None,
                    QuotaRule::Limited(quota) => Some(
                        ledger
                            .book(quota, bucket.unbooked, bucket.unbooked_demand)
                            .await,
                    ),
                }
            })
            .collect();
        let readings: Vec<_> = stream::iter(jobs)
            .buffered(CONCURRENT_BOOKINGS)
            .collect()
            .await;
        indexes
            .iter()
            .zip(readings)
            .filter_map(|(&at, reading)| self.settle(at, reading, now, answer))
            .collect()
    }

    /// Turns what the backend said about one bucket into the action to push, if any.
    fn settle(
        &mut self,
        at: usize,
        reading: Option<Result<ledger::Reading, BackendError>>,
        now: Instant,
        answer: bool,
    ) -> Option<BucketAction> {
        let failure_mode = self.shared.limiter.failure_mode();
        let bucket = &mut self.buckets[at];
        let interval = bucket.interval();
        let ttl = interval * assign::TTL_INTERVALS;
        // A report on time comes first; this look only catches a late one.
        bucket.next_look = now + interval + interval / 2;
        let next = match (&bucket.rule, reading) {
            (QuotaRule::Limited(quota), Some(Ok(reading))) => {
                bucket.unbooked = 0;
                bucket.unbooked_demand = 0;
                if quota.shadow {
                    Assignment {
                        strategy: Strategy::AllowAll,
                        ttl,
                    }
                } else {
                    let share = ledger::share(bucket.own_count, reading.total_demand);
                    assign::size(&quota.policy, reading.budget, share, interval)
                }
            }
            (_, Some(Err(error))) => {
                self.shared.limiter.metrics().backend_error(error.kind());
                // The assignment in force stands until its TTL; a bucket without one
                // gets what the failure mode says.
                if bucket.sent.is_some_and(|sent| sent.expires > now) {
                    return None;
                }
                let strategy = match failure_mode {
                    FailureMode::Allow => Strategy::AllowAll,
                    FailureMode::Deny => Strategy::DenyAll,
                    FailureMode::Error => return None,
                };
                Assignment { strategy, ttl }
            }
            _ => Assignment {
                strategy: Strategy::AllowAll,
                ttl,
            },
        };
        let strategy = match bucket.sent {
            Some(sent) if sent.expires > now && !assign::moved(&sent.strategy, &next.strategy) => {
                sent.strategy
            }
            _ => next.strategy,
        };
        let changed = bucket
            .sent
            .is_none_or(|sent| sent.strategy != strategy || sent.expires <= now);
        if !answer && !changed {
            return None;
        }
        bucket.sent = Some(Sent {
            strategy,
            expires: now + next.ttl,
        });
        if strategy == Strategy::DenyAll {
            // Push the refill as it comes.
            bucket.next_look = bucket.next_look.min(now + next.ttl);
        }
        self.shared.metrics.assigned(strategy.label());
        Some(wire::assign(
            &bucket.id,
            &Assignment {
                strategy,
                ttl: next.ttl,
            },
        ))
    }
}

impl Drop for Stream {
    /// The stream's buckets leave the gauges with it.
    fn drop(&mut self) {
        self.shared.metrics.streams.dec();
        self.shared
            .metrics
            .buckets
            .dec_by(self.buckets.len() as i64);
    }
}

/// What a bucket id counts against `MAX_STREAM_ID_BYTES`: its keys and values.
fn id_bytes(id: &BucketPairs) -> usize {
    id.iter().map(|(k, v)| k.len() + v.len()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracked() -> Tracked {
        Tracked {
            id: Arc::new(vec![("k".to_owned(), "v".to_owned())]),
            rule: QuotaRule::Unlimited,
            interval: None,
            last_report: Instant::now(),
            unbooked: 0,
            unbooked_demand: 0,
            own: OwnDemand::default(),
            own_count: 0,
            sent: None,
            next_look: Instant::now(),
        }
    }

    #[test]
    fn the_interval_grows_at_once_and_shrinks_slowly() {
        let mut bucket = tracked();
        bucket.learn_interval(Duration::from_millis(3));
        assert_eq!(bucket.interval(), DEFAULT_INTERVAL);
        bucket.learn_interval(Duration::from_millis(400));
        assert_eq!(bucket.interval(), Duration::from_millis(400));
        bucket.learn_interval(Duration::from_secs(2));
        assert_eq!(bucket.interval(), Duration::from_secs(2));
        bucket.learn_interval(Duration::from_secs(1));
        assert_eq!(bucket.interval(), Duration::from_millis(1750));
        bucket.learn_interval(Duration::from_secs(86_400));
        assert_eq!(bucket.interval(), MAX_INTERVAL);
    }
}
