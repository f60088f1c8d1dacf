//! One bucket of a stream: what its reports said, what the stream booked of them, what the
//! client was last assigned, and the decisions that turn a backend reading into the next
//! assignment. The stream (`super`) speaks the wire and the backend; this holds the state.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::BackendError;
use crate::clock::{Clock, SystemClock};
use crate::limiter::{FailureMode, Fallback, QuotaRule};

use super::super::fair::{self, Allowance, Counts, OwnCounts, Weigher};
use super::super::ledger::{self, Pending};
use super::super::strategy::{Assignment, Strategy};
use super::super::validate::{BucketPairs, Usage};
use super::super::{assign, pace, spread};
use super::{DEFAULT_INTERVAL, MAX_INTERVAL, MAX_PENDING, MIN_INTERVAL};

/// One bucket of the stream.
pub(super) struct Tracked {
    /// Shared with the index, so each id is held once.
    pub(super) id: Arc<BucketPairs>,
    pub(super) rule: QuotaRule,
    /// The client's reporting interval, as its reports' `time_elapsed` say.
    pub(super) interval: Duration,
    /// The latest report with any demand (or the bucket's first).
    pub(super) last_demand: Instant,
    /// The bucket's latest report on this stream; `None` before the first.
    pub(super) last_report: Option<Instant>,
    /// Reported, not yet booked (the backend failed, or the booking was shed).
    pub(super) unbooked: Pending,
    /// What the stream may still claim of the bucket's demand ([`fair::Allowance`]).
    pub(super) allowance: Allowance,
    /// Weighs its counts by where they land in the demand window ([`fair::Weigher`]).
    pub(super) weigher: Weigher,
    /// The stream's own fairness counters, and their counts after its latest report.
    pub(super) own: OwnCounts,
    pub(super) own_counts: Counts,
    /// Demand a second, as its latest report says (at most the limit's rate).
    pub(super) demand_rate: f64,
    /// The fair share a second the stream last saw: its capped demand counts up to it.
    pub(super) fair: f64,
    pub(super) sent: Option<Sent>,
    /// When the bucket needs a push without a report: a refill, or a rule reload.
    pub(super) next_look: Option<Instant>,
    /// When a held change of a slow bucket is pushed ([`pace`]).
    pub(super) slot: Option<Instant>,
    /// Its first report on this stream covered time: the client held it on an earlier
    /// stream (Envoy counts `time_elapsed` from the bucket's last report whatever the
    /// stream), and may still run that stream's assignment.
    pub(super) continued: bool,
}

/// The assignment in force on the client.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sent {
    pub(super) strategy: Strategy,
    pub(super) expires: Instant,
    /// When the client started it: the strategy's first push (a refresh keeps it running).
    pub(super) started: Instant,
    /// Started full: a token bucket after none or after a blanket rule. Its tokens then come
    /// a token period after the first request that takes one, not after `started`.
    pub(super) full: bool,
}

impl Tracked {
    /// A bucket first reported at `now`, under `rule`, with nothing booked or sent yet.
    pub(super) fn new(id: Arc<BucketPairs>, rule: QuotaRule, now: Instant) -> Tracked {
        Tracked {
            id,
            rule,
            interval: DEFAULT_INTERVAL,
            last_demand: now,
            last_report: None,
            unbooked: Pending::default(),
            allowance: Allowance::default(),
            weigher: Weigher::default(),
            own: OwnCounts::default(),
            own_counts: Counts::default(),
            demand_rate: 0.0,
            fair: f64::INFINITY,
            sent: None,
            next_look: None,
            slot: None,
            continued: false,
        }
    }

    /// Learns the reporting interval from a report's `time_elapsed`: at once when it grows,
    /// slowly when it shrinks, so a first periodic report (which covers less than an
    /// interval) never gives TTLs that end before the next report.
    pub(super) fn learn_interval(&mut self, elapsed: Duration) {
        if elapsed < MIN_INTERVAL {
            return;
        }
        let elapsed = elapsed.min(MAX_INTERVAL);
        self.interval = if elapsed < self.interval {
            (self.interval * 3 + elapsed) / 4
        } else {
            elapsed
        };
    }

    /// Counts one report's merged usage of the bucket. Its demand claims at most the
    /// limit's rate over the real time since the stream's previous report of the bucket
    /// ([`fair::Allowance`]), whatever the report says; a first report covers one interval.
    pub(super) fn record(&mut self, usage: Merged, now: Instant, now_ms: i64) {
        let bucket = self;
        bucket.learn_interval(usage.elapsed);
        let demand = usage.allowed.saturating_add(usage.denied);
        if demand > 0 {
            bucket.last_demand = now;
        }
        let previous = bucket.last_report.replace(now);
        bucket.continued |= previous.is_none() && !usage.elapsed.is_zero();
        let covered = previous.map_or(DEFAULT_INTERVAL, |last| now - last);
        let QuotaRule::Limited(quota) = &bucket.rule else {
            return;
        };
        let booked = spread::booked_now(&quota.policy, usage.allowed, usage.elapsed, now_ms);
        let limit_rate = fair::limit_rate(&quota.policy);
        let bank = (2 * bucket.interval).max(fair::BANKED);
        let claimed = bucket.allowance.claim(demand, limit_rate, covered, bank);
        let per_second = fair::demand_rate(claimed, covered, bucket.interval, limit_rate);
        bucket.demand_rate = per_second;
        let counted = fair::booked(claimed, per_second, covered, bucket.fair);
        let counted = bucket.weigher.weigh(counted, now_ms);
        bucket
            .unbooked
            .add(booked, counted, usage.elapsed, MAX_PENDING);
    }
}

/// What a bucket's reading makes of it: the assignment, the stream's part of the bucket
/// (which decides whether a slow bucket is paced) and when a denial ends.
pub(super) struct Next {
    assignment: Assignment,
    fraction: f64,
    refill: Option<Duration>,
}

impl Tracked {
    /// The assignment the bucket's `reading` calls for; `None` when the backend failed and
    /// the failure mode says to leave the client to its own (or the assignment in force
    /// stands until its TTL).
    pub(super) fn next(
        &mut self,
        reading: Option<Result<ledger::Reading, BackendError>>,
        failure_mode: FailureMode,
        now: Instant,
    ) -> Option<Next> {
        let ttl = assign::ttl(self.interval);
        let blanket = |strategy| Next {
            assignment: Assignment { strategy, ttl },
            fraction: 1.0,
            refill: None,
        };
        let quota = match (&self.rule, reading) {
            (QuotaRule::Limited(quota), Some(Ok(reading))) => {
                // What the backend booked, and only that, is the stream's own: a report shed
                // or failed waits in `unbooked`, and a withdrawal refunds no more than was
                // booked, dated by the backend's clock.
                self.own_counts = self.own.add(self.unbooked.counted, reading.now_ms);
                (quota.clone(), reading)
            }
            // Counted where the limiter made the call.
            (_, Some(Err(_))) => {
                // The assignment in force stands until its TTL.
                if self.sent.is_some_and(|sent| sent.expires > now) {
                    return None;
                }
                return match failure_mode.fallback() {
                    Fallback::Admit => Some(blanket(Strategy::AllowAll)),
                    Fallback::Deny => Some(blanket(Strategy::DenyAll)),
                    Fallback::Unavailable => None,
                };
            }
            _ => return Some(blanket(Strategy::AllowAll)),
        };
        let (quota, reading) = quota;
        self.unbooked = Pending::default();
        if quota.shadow {
            return Some(blanket(Strategy::AllowAll));
        }
        let per_second = assign::per_second(&quota.policy, reading.budget, self.interval);
        let room = assign::room(per_second);
        let others = fair::others(reading.total, self.own_counts, self.own.at_report());
        self.fair = fair::fair_share(room, &others);
        let rate = fair::rate(self.demand_rate, &others, room);
        let fraction = if room > 0.0 { rate / room } else { 1.0 };
        Some(Next {
            assignment: assign::size(&quota.policy, reading.budget, fraction, self.interval),
            fraction,
            refill: Some(reading.budget.reset),
        })
    }

    /// Decides what the client gets of `next`: the assignment in force when `next` did not
    /// move enough ([`assign::moved`]), held until the stream's slot when paced
    /// ([`pace`]); records it as sent. `None` when nothing is to be pushed: no report asked
    /// (`answer`) and nothing changed.
    pub(super) fn push(
        &mut self,
        next: Next,
        phase: f64,
        now: Instant,
        answer: bool,
    ) -> Option<Assignment> {
        let ttl = assign::ttl(self.interval);
        let running = self.sent.filter(|sent| sent.expires > now);
        let (mut strategy, mut lives) = self.kept_or_next(&next, now);
        let starts_full = running.is_none_or(|sent| sent.strategy.rate().is_none());
        if starts_full && self.paced(&strategy, next.fraction) {
            strategy = strategy.holding_at_most(pace::FIRST_TOKENS);
        }
        let changes = |strategy: &Strategy| {
            running.is_none_or(|sent| !assign::same_for_envoy(&sent.strategy, strategy))
        };
        let mut changed = changes(&strategy);
        let wait = changed
            .then(|| self.change_wait(running, &strategy, next.fraction, phase, now))
            .flatten();
        self.slot = pace::slot(self.slot, wait, now);
        let slot = self.slot.map(|slot| slot - now);
        if let Some(wait) = slot {
            strategy = pace::held(running.map(|sent| sent.strategy), &strategy, wait);
            lives = ttl + assign::whole_seconds(wait);
            changed = changes(&strategy);
        }
        self.next_look = match (slot, next.refill) {
            (Some(wait), _) => Some(now + wait),
            (None, Some(refill)) if changed || answer => {
                (strategy == Strategy::DenyAll).then(|| now + refill.max(Duration::from_millis(1)))
            }
            _ => None,
        };
        if !answer && !changed {
            return None;
        }
        let (started, full) = match running {
            Some(sent) if !changed => (sent.started, sent.full),
            _ => (now, starts_full),
        };
        self.sent = Some(Sent {
            strategy,
            expires: now + lives,
            started,
            full,
        });
        Some(Assignment {
            strategy,
            ttl: lives,
        })
    }

    /// How long a change to `strategy`, the stream's `fraction` of the bucket, waits; `None`
    /// to push it now. A [`pace::paced`] stream whose client runs a token bucket changes it
    /// just after its next token, or just before it for a larger bucket
    /// ([`pace::token_wait`]); one whose client runs none starts the bucket at its slot
    /// ([`pace::wait`]).
    fn change_wait(
        &self,
        running: Option<Sent>,
        strategy: &Strategy,
        fraction: f64,
        phase: f64,
        now: Instant,
    ) -> Option<Duration> {
        let token_bucket = running.and_then(|sent| Some((sent, sent.strategy.rate()?)));
        match token_bucket {
            Some((sent, rate))
                if strategy.rate().is_some() && self.paced(&sent.strategy, fraction) =>
            {
                let aim = if strategy.max_tokens() > sent.strategy.max_tokens() {
                    pace::Aim::Before
                } else {
                    pace::Aim::After
                };
                // A bucket started full counts its tokens from its first request: about
                // one request apart later, at most half a token period. Aimed before a
                // token, from the earliest it can be: the push, so never past the token.
                let first_request =
                    if sent.full && aim == pace::Aim::After && self.demand_rate > 0.0 {
                        Duration::from_secs_f64((1.0 / self.demand_rate).min(0.5 / rate))
                    } else {
                        Duration::ZERO
                    };
                pace::token_wait(sent.started + first_request, rate, now, aim)
            }
            _ => pace::wait(
                strategy,
                fraction,
                self.interval,
                phase,
                SystemClock.now_ms(),
            ),
        }
    }

    /// The strategy the client gets for `next` and how long it lives, before pacing: the
    /// one running, kept while `next` did not move enough (it then lives as long as an
    /// assignment does, also in place of a `DENY_ALL`), else `next`, made to differ for
    /// Envoy from the one running.
    fn kept_or_next(&self, next: &Next, now: Instant) -> (Strategy, Duration) {
        let window = match &self.rule {
            QuotaRule::Limited(quota) => Duration::from_millis(quota.policy.window_ms()),
            QuotaRule::Unlimited => Duration::ZERO,
        };
        match self.sent {
            Some(sent)
                if sent.expires > now
                    && !self.grows(sent, next)
                    && !assign::moved(
                        &sent.strategy,
                        &next.assignment,
                        window,
                        self.hysteresis(sent, next),
                    ) =>
            {
                (sent.strategy, assign::ttl(self.interval))
            }
            Some(sent) => (
                assign::distinct_for_envoy(&sent.strategy, next.assignment.strategy),
                next.assignment.ttl,
            ),
            None => (next.assignment.strategy, next.assignment.ttl),
        }
    }
}

impl Tracked {
    /// Whether `strategy`, a token bucket, is [`pace::paced`] for a stream holding
    /// `fraction` of the bucket.
    fn paced(&self, strategy: &Strategy, fraction: f64) -> bool {
        strategy
            .rate()
            .is_some_and(|rate| pace::paced(rate, fraction, self.interval))
    }

    /// How far `next` must move from the running `sent` to be pushed: a paced change waits
    /// for the running bucket's next token ([`Self::change_wait`]) and costs next to nothing.
    fn hysteresis(&self, sent: Sent, next: &Next) -> assign::Hysteresis {
        if self.paced(&sent.strategy, next.fraction) && next.assignment.strategy.rate().is_some() {
            assign::Hysteresis::AT_TOKEN
        } else {
            assign::Hysteresis::ANY_POINT
        }
    }

    /// Whether a paced bucket started with [`pace::FIRST_TOKENS`] is due its whole size:
    /// pushed just before its next token, the raise hands out nothing.
    fn grows(&self, sent: Sent, next: &Next) -> bool {
        self.hysteresis(sent, next) == assign::Hysteresis::AT_TOKEN
            && next.assignment.strategy.max_tokens() > sent.strategy.max_tokens()
    }
}

/// One report's usage of one bucket, its duplicates merged.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Merged {
    allowed: u64,
    denied: u64,
    /// The longest `time_elapsed` its usages claimed.
    elapsed: Duration,
}

impl Merged {
    pub(super) fn add(&mut self, usage: &Usage) {
        self.allowed = self.allowed.saturating_add(usage.allowed);
        self.denied = self.denied.saturating_add(usage.denied);
        self.elapsed = self.elapsed.max(usage.elapsed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slow token bucket of two tokens: `tokens` every 1,000 s.
    fn slow(tokens: u32) -> Strategy {
        Strategy::TokenBucket {
            max_tokens: 2,
            tokens_per_fill: tokens,
            fill_interval: Duration::from_secs(1000),
        }
    }

    /// A stream's bucket whose client runs a token every 10 s since `started`.
    fn running(started: Instant, full: bool) -> Tracked {
        let id = Arc::new(vec![("k".to_owned(), "v".to_owned())]);
        let mut bucket = Tracked::new(id, QuotaRule::Unlimited, started);
        bucket.demand_rate = 0.6;
        bucket.sent = Some(Sent {
            strategy: slow(100),
            expires: started + Duration::from_secs(15),
            started,
            full,
        });
        bucket
    }

    /// A paced share of `tokens` every 1,000 s.
    fn share(tokens: u32) -> Next {
        Next {
            assignment: Assignment {
                strategy: slow(tokens),
                ttl: Duration::from_secs(15),
            },
            fraction: 0.01,
            refill: None,
        }
    }

    /// A paced share 5% faster than the running one.
    fn faster() -> Next {
        share(105)
    }

    fn close(a: Instant, b: Instant) -> bool {
        a.max(b) - a.min(b) < Duration::from_millis(2)
    }

    #[test]
    fn a_paced_change_goes_out_just_after_the_running_buckets_next_token() {
        let started = Instant::now();
        let mut bucket = running(started, false);
        // 3 s in: the running bucket is kept, and the change waits for its token at 10 s.
        let held = bucket.push(faster(), 0.0, started + Duration::from_secs(3), true);
        assert_eq!(held.map(|held| held.strategy), Some(slow(100)));
        let slot = bucket.slot.expect("a slot");
        assert!(
            close(slot, started + Duration::from_millis(10_050)),
            "{slot:?}"
        );
        // At the slot the new rate starts, and its tokens count from then.
        let pushed = bucket.push(faster(), 0.0, slot, false).expect("pushed");
        assert_eq!(pushed.strategy.rate(), slow(105).rate());
        let sent = bucket.sent.expect("sent");
        assert_eq!((sent.started, sent.full), (slot, false));
    }

    #[test]
    fn a_bucket_started_full_counts_its_tokens_from_its_first_request() {
        let started = Instant::now();
        let mut bucket = running(started, true);
        bucket.push(faster(), 0.0, started + Duration::from_secs(3), true);
        // The first request, one request apart (at 0.6 a second) later, takes a token.
        let slot = bucket.slot.expect("a slot");
        assert!(
            close(slot, started + Duration::from_millis(11_717)),
            "{slot:?}"
        );
    }

    #[test]
    fn a_paced_restart_holds_one_token_and_grows_just_before_its_next() {
        let started = Instant::now();
        let mut bucket = running(started, false);
        bucket.sent = Some(Sent {
            strategy: Strategy::DenyAll,
            ..bucket.sent.expect("sent")
        });
        // After a blanket rule the bucket starts full at its slot: one token, not two.
        let first = bucket
            .push(share(100), 0.0, started, true)
            .expect("answered");
        let (slot, restarted) = match bucket.slot {
            Some(slot) => (
                slot,
                bucket.push(share(100), 0.0, slot, false).expect("pushed"),
            ),
            None => (started, first),
        };
        assert_eq!(restarted.strategy, slow(100).holding_at_most(1));
        // Its whole size goes out 50 ms before its next token, counted from the push.
        bucket.push(share(100), 0.0, slot + Duration::from_secs(3), true);
        let grow = bucket.slot.expect("a slot for the raise");
        assert!(close(grow, slot + Duration::from_millis(9_950)), "{grow:?}");
        let grown = bucket.push(share(100), 0.0, grow, false).expect("pushed");
        assert_eq!(grown.strategy.max_tokens(), Some(2));
    }

    #[test]
    fn a_paced_share_within_two_percent_stands() {
        let started = Instant::now();
        let mut bucket = running(started, false);
        let mut next = faster();
        next.assignment.strategy = slow(101);
        let kept = bucket.push(next, 0.0, started + Duration::from_secs(3), true);
        assert_eq!(kept.map(|kept| kept.strategy), Some(slow(100)));
        assert_eq!(bucket.slot, None);
    }
}
