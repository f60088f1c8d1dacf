//! One quota stream: the buckets its client reports, what each was last assigned, and
//! when each next needs a push without a report.
//!
//! A report books its counts and answers every bucket it names (Envoy names every bucket
//! it holds, every 5 s): a moved assignment, or the one in force again (which only re-arms
//! its TTL on the client). Between reports the stream does backend work only for what time
//! alone changes: a spent budget refilling and a rule reload. A bucket reported without
//! demand for `--rlqs-abandon-after`, or not reported for as long, is abandoned.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, stream};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::backend::BackendError;
use crate::clock::{Clock, SystemClock};
use crate::limiter::{Limiter, QuotaRule};
use crate::matcher::Matcher;
use crate::metrics::RlqsMetrics;
use crate::overload::{Admission, Caller, ConnectionLoad, Deadline};
use crate::proto::rlqs::RateLimitQuotaUsageReports;
use crate::proto::rlqs::rate_limit_quota_response::BucketAction;

use super::RlqsSettings;
use super::bounds::{self, BucketBounds, Holding, Load};
use super::fair::{self, Counts, OwnCounts};
use super::ledger::{self, Ledger};
use super::pace;
use super::strategy::{Assignment, Strategy};
use super::validate::{self, BadBucket, BucketPairs, InvalidMessage, Usage};
use super::wire;

/// Envoy's reporting interval: hard-coded whatever `reporting_interval` says
/// (`source/extensions/filters/http/rate_limit_quota/filter_persistence.cc`).
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);
/// Shortest reporting interval learned: Envoy's `time_elapsed` is whole seconds, and 0 on a
/// bucket's first report.
const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// Longest reporting interval learned.
const MAX_INTERVAL: Duration = Duration::from_secs(3600);
/// Most requests a bucket's report may carry into the backend: more than any limit holds
/// (`L` is 32 bits), and small enough that every backend's arithmetic stays exact.
const MAX_PENDING: u64 = u32::MAX as u64;
/// Backend calls one stream has in flight at once, so a report of 10,000 buckets does not
/// queue 10,000 calls ahead of every other caller's.
const CONCURRENT_BOOKINGS: usize = 64;
/// Longest sleep of a stream with no bucket due: it wakes for rule reloads when told
/// ([`Stream::nudged`]), and a bucket's abandonment wakes it sooner.
const MAX_SLEEP: Duration = Duration::from_secs(3600);
/// Shortest sleep, so a stream whose buckets are all due never spins.
const MIN_SLEEP: Duration = Duration::from_millis(5);
/// Most refunds one backend call carries when a stream withdraws its counts.
const WITHDRAWALS_PER_CALL: usize = 256;
/// Longest a report keeps its connection from eviction at the connection cap.
const MAX_PROTECTED: Duration = Duration::from_secs(30);

/// What every stream shares.
pub struct Shared {
    /// Rules and backend.
    pub limiter: Arc<Limiter>,
    /// Bookings and reads.
    pub ledger: Ledger,
    /// Bounds and abandon time.
    pub settings: RlqsSettings,
    /// Buckets held by every stream.
    pub bounds: Arc<BucketBounds>,
    /// Counters and gauges.
    pub metrics: RlqsMetrics,
    /// ShouldRateLimit's admission controller, when shedding is on.
    pub admission: Option<Arc<Admission>>,
}

/// Why a bucket of a report got no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Skipped {
    /// The bucket itself is malformed.
    #[error(transparent)]
    Bad(#[from] BadBucket),
    /// Holding it would pass a bound on buckets or id bytes.
    #[error("past the bound on buckets held (--rlqs-max-buckets, per connection or process)")]
    Bounded,
}

impl Skipped {
    /// The `reason` label of `floodgate_rlqs_skipped_buckets`.
    pub fn label(self) -> &'static str {
        match self {
            Skipped::Bad(bad) => bad.label(),
            Skipped::Bounded => "bucket_limit",
        }
    }
}

/// What one report gets.
#[derive(Debug, Default)]
pub struct Answered {
    /// The actions to push.
    pub actions: Vec<BucketAction>,
    /// The buckets skipped, and why.
    pub skipped: Vec<Skipped>,
}

/// The state of one stream.
pub struct Stream {
    shared: Arc<Shared>,
    domain: Option<String>,
    buckets: Vec<Tracked>,
    index: HashMap<Arc<BucketPairs>, usize>,
    rules: Arc<Matcher>,
    /// Told of each rule reload: the stream then resolves its buckets again.
    reloads: watch::Receiver<()>,
    holding: Holding,
    connection: Option<Arc<ConnectionLoad>>,
    /// The stream's own load: one caller of its own in admission and the backend's turns.
    load: Arc<ConnectionLoad>,
    /// Where in a slow bucket's token period this stream starts it ([`pace`]).
    phase: f64,
}

impl Stream {
    /// A stream with no buckets yet, on `connection` when known.
    pub fn new(shared: Arc<Shared>, connection: Option<Arc<ConnectionLoad>>) -> Stream {
        shared.metrics.streams.inc();
        let reloads = shared.limiter.rule_reloads();
        let rules = shared.limiter.rules();
        let holding = Holding::new(
            Arc::clone(&shared.bounds),
            connection.as_ref().map(|load| load.id()),
        );
        Stream {
            shared,
            domain: None,
            buckets: Vec::new(),
            index: HashMap::new(),
            rules,
            reloads,
            holding,
            connection,
            load: Arc::new(ConnectionLoad::default()),
            phase: pace::next_phase(),
        }
    }

    /// The stream's reporting interval: the longest its buckets have learned.
    fn interval(&self) -> Duration {
        self.buckets
            .iter()
            .map(|bucket| bucket.interval)
            .max()
            .unwrap_or(DEFAULT_INTERVAL)
    }

    /// The quota service's metrics.
    pub fn metrics(&self) -> &RlqsMetrics {
        &self.shared.metrics
    }

    /// Books one message of reports and answers each bucket it names; skips the bad ones.
    ///
    /// # Errors
    /// A message whose domain is missing, too long, or not the stream's.
    pub async fn report(
        &mut self,
        message: RateLimitQuotaUsageReports,
    ) -> Result<Answered, InvalidMessage> {
        let domain = validate::domain(self.domain.as_deref(), &message.domain)?;
        self.domain = Some(domain);
        let now = Instant::now();
        if let Some(connection) = &self.connection {
            // Protected for two intervals, but a claimed interval of an hour protects no
            // idle connection for two: at most `MAX_PROTECTED`.
            connection.reporting(now, self.interval().min(MAX_PROTECTED / 2));
        }
        self.follow_rules(now);
        let now_ms = SystemClock.now_ms();
        let mut answered = Answered::default();
        // A bucket named more than once in one report counts once, its usages merged.
        let mut merged: HashMap<usize, Merged> = HashMap::new();
        for usage in validate::usages(message) {
            match usage.map_err(Skipped::from).and_then(|usage| {
                let at = self.find_or_add(&usage, now)?;
                Ok((at, usage))
            }) {
                Ok((at, usage)) => {
                    self.shared.metrics.reports.inc();
                    merged.entry(at).or_default().add(&usage);
                }
                Err(skipped) => {
                    self.shared.metrics.skipped(skipped.label());
                    answered.skipped.push(skipped);
                }
            }
        }
        let mut reported: Vec<usize> = merged.keys().copied().collect();
        reported.sort_unstable();
        for &at in &reported {
            self.buckets[at].record(merged[&at], now, now_ms);
        }
        answered.actions = self.look(&reported, now, true).await;
        Ok(answered)
    }

    /// Answers what time changed: abandons quiet buckets, and pushes refills and rule
    /// changes.
    pub async fn tick(&mut self) -> Vec<BucketAction> {
        let now = Instant::now();
        let mut gone = self.take_quiet(now);
        gone.extend(self.take_owed());
        let mut actions: Vec<BucketAction> = gone
            .iter()
            .map(|bucket| wire::abandon(&bucket.id))
            .collect();
        withdraw(&self.shared, &gone).await;
        self.follow_rules(now);
        let due: Vec<usize> = (0..self.buckets.len())
            .filter(|&i| self.buckets[i].next_look.is_some_and(|look| look <= now))
            .collect();
        actions.extend(self.look(&due, now, false).await);
        actions
    }

    /// Resolves when the stream has a look to take without a report: the rules were
    /// reloaded, or its connection was handed a debt of room to give back to smaller
    /// holders, since it last looked.
    pub async fn nudged(&mut self) {
        tokio::select! {
            () = super::next_change(&mut self.reloads) => {}
            () = self.holding.owing() => {}
        }
    }

    /// When the stream next has something to do without a report or a reload.
    pub fn next_wake(&self) -> Instant {
        let now = Instant::now();
        let abandon = self.shared.settings.abandon_after;
        let mut wake = now + MAX_SLEEP;
        for bucket in &self.buckets {
            if let Some(look) = bucket.next_look {
                wake = wake.min(look);
            }
            if let Some(quiet) = bucket.last_demand.checked_add(abandon) {
                wake = wake.min(quiet);
            }
        }
        wake.max(now + MIN_SLEEP)
    }

    /// Finds or adds the reported bucket; returns its index.
    fn find_or_add(&mut self, usage: &Usage, now: Instant) -> Result<usize, Skipped> {
        match self.index.get(&usage.id) {
            Some(&at) => Ok(at),
            None => self.add(usage.id.clone(), now),
        }
    }

    /// Takes the stream's own counts out of the shared fairness counters, so that the
    /// others' shares grow at once when it ends, on every replica (they read the same
    /// counters). A backend that fails lets them fade out with their window instead.
    pub async fn withdraw(&mut self) {
        withdraw(&self.shared, &self.buckets).await;
    }

    fn add(&mut self, id: BucketPairs, now: Instant) -> Result<usize, Skipped> {
        let load = bucket_load(&id);
        self.holding.take(load).map_err(|_| Skipped::Bounded)?;
        let rule = self.resolve(&id);
        let at = self.buckets.len();
        let id = Arc::new(id);
        self.index.insert(Arc::clone(&id), at);
        self.buckets.push(Tracked::new(id, rule, now));
        self.shared.metrics.buckets.inc();
        Ok(at)
    }

    fn resolve(&self, id: &BucketPairs) -> QuotaRule {
        let domain = self.domain.as_deref().unwrap_or_default();
        self.shared
            .limiter
            .quota_rule(domain, id, &fair::counter_policy())
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
                // Other counters now: the old ones fade out with their window.
                bucket.rule = rule;
                bucket.own = OwnCounts::default();
                bucket.own_counts = Counts::default();
                bucket.fair = f64::INFINITY;
                bucket.next_look = Some(now);
            }
        }
    }

    /// The buckets reported without demand, or not reported at all, for
    /// `--rlqs-abandon-after`, forgotten. Envoy reports every bucket it holds until told to
    /// drop it, so an idle one never goes quiet on its own.
    fn take_quiet(&mut self, now: Instant) -> Vec<Tracked> {
        let abandon = self.shared.settings.abandon_after;
        let quiet: Vec<Arc<BucketPairs>> = self
            .buckets
            .iter()
            .filter(|bucket| {
                let quiet = bucket.last_demand.checked_add(abandon);
                quiet.is_some_and(|quiet| quiet <= now)
            })
            .map(|bucket| Arc::clone(&bucket.id))
            .collect();
        quiet.iter().filter_map(|id| self.forget(id)).collect()
    }

    /// The least active buckets, forgotten until the stream's connection owes no more room
    /// to smaller holders ([`BucketBounds`]).
    fn take_owed(&mut self) -> Vec<Tracked> {
        if self.holding.owed() == 0 {
            return Vec::new();
        }
        let mut by_activity: Vec<(Instant, Arc<BucketPairs>)> = self
            .buckets
            .iter()
            .map(|bucket| (bucket.last_demand, Arc::clone(&bucket.id)))
            .collect();
        by_activity.sort_unstable_by_key(|(last_demand, _)| *last_demand);
        let mut gone = Vec::new();
        for (_, id) in by_activity {
            if self.holding.owed() == 0 {
                break;
            }
            gone.extend(self.forget(&id));
        }
        if !gone.is_empty() {
            tracing::info!(
                buckets = gone.len(),
                "RLQS: the largest holder gave back buckets for smaller ones"
            );
        }
        gone
    }

    /// Removes the bucket `id` from the stream and gives back what it held.
    fn forget(&mut self, id: &BucketPairs) -> Option<Tracked> {
        let at = self.index.remove(id)?;
        let gone = self.buckets.swap_remove(at);
        if let Some(moved) = self.buckets.get(at) {
            self.index.insert(Arc::clone(&moved.id), at);
        }
        self.holding.release(bucket_load(&gone.id));
        self.shared.metrics.buckets.dec();
        self.shared.metrics.abandons.inc();
        Some(gone)
    }

    /// Books and sizes the buckets at `indexes` (their backend calls concurrently), and
    /// returns what to push. `answer`: a report asked, so every bucket is answered, with
    /// the assignment in force when the new one did not move enough. Under overload the
    /// bookings are shed as one piece of work: every bucket keeps what it was assigned and
    /// its counts wait for the next look.
    async fn look(&mut self, indexes: &[usize], now: Instant, answer: bool) -> Vec<BucketAction> {
        let units = indexes.len().min(CONCURRENT_BOOKINGS) as u64;
        // Its own handle: the permit borrows the admission while `settle` takes the stream.
        let shared = Arc::clone(&self.shared);
        let load = Arc::clone(&self.load);
        let _permit = match shared
            .admission
            .as_deref()
            .map(|admission| admission.admit_work(units, &load))
        {
            Some(Err(reason)) => {
                shared.limiter.metrics().shed(reason);
                return indexes
                    .iter()
                    .flat_map(|&at| {
                        let shed = Some(Err(BackendError::Overloaded));
                        self.settle(at, shed, now, answer)
                    })
                    .collect();
            }
            Some(Ok(permit)) => Some(permit),
            None => None,
        };
        let ledger = &self.shared.ledger;
        let buckets = &self.buckets;
        // One caller per stream, so a backend queue serves it in turn with the others; an
        // answer is of use until the client's next report.
        let caller = Caller {
            deadline: Some(Deadline::new(now, self.interval())),
            connection: Some(self.load.id()),
        };
        // Collected first: a stream over a closure's futures is not `Send` to the compiler.
        let jobs: Vec<_> = indexes
            .iter()
            .map(|&at| async move {
                let bucket = &buckets[at];
                match &bucket.rule {
                    QuotaRule::Unlimited => None,
                    QuotaRule::Limited(quota) => {
                        Some(ledger.book(quota, bucket.unbooked, caller).await)
                    }
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
            .flat_map(|(&at, reading)| self.settle(at, reading, now, answer))
            .collect()
    }

    /// Turns what the backend said about one bucket into the actions to push, if any.
    fn settle(
        &mut self,
        at: usize,
        reading: Option<Result<ledger::Reading, BackendError>>,
        now: Instant,
        answer: bool,
    ) -> Vec<BucketAction> {
        let failure_mode = self.shared.limiter.failure_mode();
        let bucket = &mut self.buckets[at];
        bucket.next_look = None;
        let Some(next) = bucket.next(reading, failure_mode, now) else {
            return Vec::new();
        };
        let first = bucket.sent.is_none();
        let Some(assignment) = bucket.push(next, self.phase, now, answer) else {
            return Vec::new();
        };
        self.shared.metrics.assigned(assignment.strategy.label());
        let mut actions = Vec::with_capacity(2);
        // A client that held the bucket on an earlier stream (another replica's) may hold a
        // token bucket that Envoy would take for this one (it compares neither the rate
        // nor the seconds of `fill_interval`) and keep running at the old rate. A blanket
        // rule first, in the same answer, makes it start the new one: Envoy applies a
        // message's actions in order, a blanket rule leaves the bucket without a token
        // bucket, and a token bucket after it is always new (`onQuotaResponseImpl` and
        // `shouldReplaceTokenBucket` in
        // `source/extensions/filters/http/rate_limit_quota/global_client_impl.cc`,
        // envoyproxy/envoy at 0b559611 and c33e7f82).
        if first && bucket.continued && matches!(assignment.strategy, Strategy::TokenBucket { .. })
        {
            let blanket = Assignment {
                strategy: Strategy::DenyAll,
                ttl: assignment.ttl,
            };
            actions.push(wire::assign(&bucket.id, &blanket));
        }
        actions.push(wire::assign(&bucket.id, &assignment));
        actions
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

/// What a bucket of id `id` takes against the bounds.
fn bucket_load(id: &BucketPairs) -> Load {
    let text = id.iter().map(|(k, v)| k.len() + v.len()).sum();
    bounds::bucket_load(id.len(), text)
}

/// Takes the counts of `buckets` out of the shared fairness counters: the others' shares
/// grow at once, on every replica. A backend that fails lets them fade out instead.
async fn withdraw(shared: &Shared, buckets: &[Tracked]) {
    let refunds: Vec<_> = buckets
        .iter()
        .filter_map(|bucket| match &bucket.rule {
            QuotaRule::Limited(quota) => Some(ledger::withdrawals(
                quota,
                &bucket.own,
                shared.ledger.replica().map(|id| &**id),
            )),
            QuotaRule::Unlimited => None,
        })
        .flatten()
        .collect();
    // In calls of a bounded size: a stream of 10,000 buckets has up to 60,000 refunds.
    for refunds in refunds.chunks(WITHDRAWALS_PER_CALL) {
        if let Err(error) = shared.limiter.quota_refunds(refunds).await {
            tracing::debug!(%error, "RLQS: withdrawn demand fades out instead");
            return;
        }
    }
}

mod tracked;

use tracked::{Merged, Tracked};

#[cfg(test)]
mod tests;
