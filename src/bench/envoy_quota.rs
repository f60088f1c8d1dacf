//! A simulated Envoy: what Envoy's `rate_limit_quota` filter does, behaviour by behaviour,
//! as its source does it (`source/extensions/filters/http/rate_limit_quota/`:
//! `global_client_impl.cc` sends the reports and applies the answers, `filter.cc` decides
//! requests; facts in the wire notes, section 11). The RLQS bench and tests drive it.
//!
//! - A bucket's first request sends at once a report of that bucket alone, `time_elapsed`
//!   0 s ([`SimulatedEnvoy::request`]).
//! - Every 5 s (hard-coded; `reporting_interval` is ignored) one message reports every
//!   bucket held, idle ones with 0 / 0, `time_elapsed` in whole seconds, truncated
//!   ([`SimulatedEnvoy::tick`]).
//! - A lost stream is not reopened at once: the next tick's full report opens a new one;
//!   a new bucket's immediate report is dropped meanwhile.
//! - Only the whole seconds of a TTL and of a `fill_interval` are read: a TTL under 1 s
//!   expires at once, a `fill_interval` under 1 s is an infinite rate; an unset
//!   `tokens_per_fill` is 0.
//! - Two token buckets are the same when `max_tokens`, `tokens_per_fill` and
//!   `fill_interval.nanos` match: the running bucket stays, only the TTL is re-armed.
//!   Another starts full after a blanket rule or none; in place of a running token bucket
//!   it starts at the old one's fill ratio, rounded down (Envoy 1.33 and later), or full
//!   (Envoy 1.32 and older), as `createTokenBucketFromAction` does ([`Restart`]). A
//!   message's actions apply in order, so a blanket rule then a token bucket for one
//!   bucket starts the token bucket full.
//! - `requests_per_time_unit` and an unset strategy are ignored: the bucket keeps what it
//!   had. Actions without a bucket id, or for a bucket not held, are ignored.
//! - On expiry, the `fallback_rate_limit` of `expired_assignment_behavior` applies for its
//!   timeout (`reuse_last_assignment` is not implemented), then `no_assignment_behavior`.
//! - `abandon_action` erases the bucket; its next request starts it anew.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::proto::rlqs::rate_limit_quota_response::bucket_action::BucketAction as Action;
use crate::proto::rlqs::rate_limit_quota_usage_reports::BucketQuotaUsage;
use crate::proto::rlqs::{BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports};
use crate::proto::types::rate_limit_strategy::{BlanketRule, Strategy};

/// Envoy's reporting interval, whatever its configuration says.
pub const REPORT_INTERVAL: Duration = Duration::from_secs(5);

/// A blanket rule of the filter's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Fallback {
    /// Admit every request.
    Allow,
    /// Deny every request.
    Deny,
}

/// How a token bucket that replaces a running one starts: Envoy's source has done both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Restart {
    /// Full, whatever the old bucket held: Envoy 1.32 and older (`client_impl.cc`).
    Full,
    /// At the old bucket's ratio of tokens to `max_tokens`, times the new `max_tokens`,
    /// rounded down to whole tokens (Envoy multiplies into an integer): every Envoy since
    /// 1.33 (PR 37624, December 2024), `createTokenBucketFromAction(strategy, time_source,
    /// existing)` in `global_client_impl.cc`. The default.
    FillRatio,
}

/// A bucket id: pairs sorted by key.
pub type Id = Vec<(String, String)>;

/// The filter's configuration that decides requests without an assignment.
#[derive(Debug, Clone)]
pub struct EnvoyConfig {
    /// The stream's domain, sent on every message.
    pub domain: String,
    /// `no_assignment_behavior`.
    pub no_assignment: Fallback,
    /// `expired_assignment_behavior.fallback_rate_limit` and its
    /// `expired_assignment_behavior_timeout` (whole seconds), if set.
    pub expired: Option<(Fallback, Duration)>,
    /// How a changed token bucket starts.
    pub restart: Restart,
}

/// What applying one action did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// A new enforcement (a new token bucket starts, full or at the old one's fill ratio).
    Changed,
    /// The same enforcement: only its TTL moved.
    Extended,
    /// The bucket was erased.
    Abandoned,
    /// A strategy the filter does not apply; the bucket keeps what it had.
    Unsupported,
    /// No bucket id, or a bucket not held.
    Ignored,
}

impl Applied {
    /// A label for counting.
    pub fn label(self) -> &'static str {
        match self {
            Applied::Changed => "changed",
            Applied::Extended => "extended",
            Applied::Abandoned => "abandoned",
            Applied::Unsupported => "unsupported",
            Applied::Ignored => "ignored",
        }
    }
}

/// The enforcement of an assignment.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Enforced {
    Allow,
    Deny,
    /// Envoy's token bucket, refilled continuously at `rate` a second (infinite when the
    /// whole seconds of `fill_interval` are 0).
    Tokens {
        /// What Envoy compares: `max_tokens`, `tokens_per_fill`, `fill_interval.nanos`.
        compared: (u32, u32, i32),
        rate: f64,
        tokens: f64,
        at: Instant,
    },
}

/// An assignment in force and when its TTL ends.
#[derive(Debug, Clone, Copy)]
struct Assigned {
    enforced: Enforced,
    expires: Instant,
}

#[derive(Debug, Clone)]
struct Bucket {
    assigned: Option<Assigned>,
    allowed: u64,
    denied: u64,
    last_report: Instant,
}

/// Where the stream stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StreamState {
    /// Never opened: the first report opens it.
    NotYet,
    Open,
    /// Lost: only the next tick reopens it.
    Lost,
}

/// A report to send, and whether it opens a new stream.
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// The message.
    pub report: RateLimitQuotaUsageReports,
    /// The stream must be (re)opened with this message.
    pub opens_stream: bool,
}

/// One Envoy's quota client for one domain.
#[derive(Debug, Clone)]
pub struct SimulatedEnvoy {
    config: EnvoyConfig,
    buckets: HashMap<Id, Bucket>,
    stream: StreamState,
    next_tick: Instant,
}

impl SimulatedEnvoy {
    /// A client with no buckets, its first tick one interval after `now`.
    pub fn new(config: EnvoyConfig, now: Instant) -> SimulatedEnvoy {
        SimulatedEnvoy {
            config,
            buckets: HashMap::new(),
            stream: StreamState::NotYet,
            next_tick: now + REPORT_INTERVAL,
        }
    }

    /// Buckets held.
    pub fn buckets(&self) -> usize {
        self.buckets.len()
    }

    /// When the next periodic report is due.
    pub fn next_tick(&self) -> Instant {
        self.next_tick
    }

    /// Decides one request for bucket `id` at `now`. A new bucket also returns its
    /// immediate report, unless the stream is lost.
    pub fn request(&mut self, id: &Id, now: Instant) -> (bool, Option<Outgoing>) {
        let config = &self.config;
        let new = !self.buckets.contains_key(id);
        if new {
            // Cloned once per bucket, not per request: the bench decides thousands a second.
            self.buckets.insert(
                id.clone(),
                Bucket {
                    assigned: None,
                    allowed: 0,
                    denied: 0,
                    last_report: now,
                },
            );
        }
        let bucket = self.buckets.get_mut(id).expect("inserted above");
        let admitted = decide(bucket, config, now);
        if admitted {
            bucket.allowed += 1;
        } else {
            bucket.denied += 1;
        }
        if !new || self.stream == StreamState::Lost {
            return (admitted, None);
        }
        let opens_stream = self.stream == StreamState::NotYet;
        self.stream = StreamState::Open;
        let usage = take_usage(id, bucket, now);
        let report = self.message(vec![usage]);
        (
            admitted,
            Some(Outgoing {
                report,
                opens_stream,
            }),
        )
    }

    /// The periodic report, if due at `now`: every bucket held, counts zeroed. After a
    /// loss it opens a new stream.
    pub fn tick(&mut self, now: Instant) -> Option<Outgoing> {
        if now < self.next_tick {
            return None;
        }
        while self.next_tick <= now {
            self.next_tick += REPORT_INTERVAL;
        }
        let mut ids: Vec<&Id> = self.buckets.keys().collect();
        ids.sort_unstable();
        let ids: Vec<Id> = ids.into_iter().cloned().collect();
        let usages = ids
            .iter()
            .map(|id| take_usage(id, self.buckets.get_mut(id).expect("held"), now))
            .collect();
        let opens_stream = self.stream != StreamState::Open;
        self.stream = StreamState::Open;
        Some(Outgoing {
            report: self.message(usages),
            opens_stream,
        })
    }

    /// The stream ended (an error, or the server closed it).
    pub fn stream_lost(&mut self) {
        self.stream = StreamState::Lost;
    }

    /// Applies every action of one answer, in order.
    pub fn apply(&mut self, answer: &RateLimitQuotaResponse, now: Instant) -> Vec<Applied> {
        answer
            .bucket_action
            .iter()
            .map(|action| {
                let Some(id) = action.bucket_id.as_ref().map(sorted) else {
                    return Applied::Ignored;
                };
                match &action.bucket_action {
                    Some(Action::AbandonAction(_)) => match self.buckets.remove(&id) {
                        Some(_) => Applied::Abandoned,
                        None => Applied::Ignored,
                    },
                    Some(Action::QuotaAssignmentAction(assignment)) => {
                        let Some(bucket) = self.buckets.get_mut(&id) else {
                            return Applied::Ignored;
                        };
                        let strategy = assignment
                            .rate_limit_strategy
                            .as_ref()
                            .and_then(|strategy| strategy.strategy.as_ref());
                        let ttl = whole_seconds(assignment.assignment_time_to_live);
                        assign(bucket, strategy, ttl, self.config.restart, now)
                    }
                    None => Applied::Ignored,
                }
            })
            .collect()
    }

    fn message(&self, usages: Vec<BucketQuotaUsage>) -> RateLimitQuotaUsageReports {
        RateLimitQuotaUsageReports {
            domain: self.config.domain.clone(),
            bucket_quota_usages: usages,
        }
    }
}

/// Decides one request of `bucket` at `now`.
fn decide(bucket: &mut Bucket, config: &EnvoyConfig, now: Instant) -> bool {
    let blanket = |rule: Fallback| rule == Fallback::Allow;
    let Some(assigned) = &mut bucket.assigned else {
        return blanket(config.no_assignment);
    };
    if now >= assigned.expires {
        return match config.expired {
            Some((rule, timeout)) if now < assigned.expires + timeout => blanket(rule),
            _ => blanket(config.no_assignment),
        };
    }
    match &mut assigned.enforced {
        Enforced::Allow => true,
        Enforced::Deny => false,
        Enforced::Tokens { rate, .. } if rate.is_infinite() => true,
        Enforced::Tokens {
            compared: (max, _, _),
            rate,
            tokens,
            at,
        } => {
            refill(tokens, at, *rate, *max, now);
            if *tokens >= 1.0 {
                *tokens -= 1.0;
                true
            } else {
                false
            }
        }
    }
}

/// Refills a token bucket's `tokens`, last refilled `at`, continuously at `rate` a second
/// up to `max` tokens, as of `now`.
fn refill(tokens: &mut f64, at: &mut Instant, rate: f64, max: u32, now: Instant) {
    let elapsed = now.saturating_duration_since(*at).as_secs_f64();
    *tokens = (*tokens + elapsed * rate).min(f64::from(max));
    *at = now;
}

/// Applies one assignment to a held bucket.
fn assign(
    bucket: &mut Bucket,
    strategy: Option<&Strategy>,
    ttl: u64,
    restart: Restart,
    now: Instant,
) -> Applied {
    let expires = now + Duration::from_secs(ttl);
    let enforced = match strategy {
        Some(Strategy::BlanketRule(rule)) if *rule == BlanketRule::DenyAll as i32 => Enforced::Deny,
        Some(Strategy::BlanketRule(_)) => Enforced::Allow,
        Some(Strategy::TokenBucket(tokens)) => {
            let per_fill = tokens.tokens_per_fill.map_or(0, |value| value.value);
            let every = tokens.fill_interval.unwrap_or_default();
            let seconds = every.seconds.max(0) as f64;
            Enforced::Tokens {
                compared: (tokens.max_tokens, per_fill, every.nanos),
                // A division by whole seconds: 0 of them is an infinite rate.
                rate: f64::from(per_fill) / seconds,
                tokens: f64::from(tokens.max_tokens),
                at: now,
            }
        }
        Some(Strategy::RequestsPerTimeUnit(_)) | None => return Applied::Unsupported,
    };
    let same = match (bucket.assigned.map(|assigned| assigned.enforced), enforced) {
        (Some(Enforced::Tokens { compared: old, .. }), Enforced::Tokens { compared: new, .. }) => {
            old == new
        }
        (Some(old), new) => old == new,
        (None, _) => false,
    };
    match &mut bucket.assigned {
        Some(assigned) if same => {
            assigned.expires = expires;
            Applied::Extended
        }
        _ => {
            let running = bucket.assigned.filter(|assigned| assigned.expires > now);
            let enforced = match (restart, running.map(|assigned| assigned.enforced), enforced) {
                (
                    Restart::FillRatio,
                    Some(Enforced::Tokens {
                        compared: (old_max, ..),
                        rate: old_rate,
                        mut tokens,
                        mut at,
                    }),
                    Enforced::Tokens { compared, rate, .. },
                ) => {
                    refill(&mut tokens, &mut at, old_rate, old_max, now);
                    let ratio = tokens / f64::from(old_max.max(1));
                    Enforced::Tokens {
                        compared,
                        rate,
                        tokens: (f64::from(compared.0) * ratio).floor(),
                        at: now,
                    }
                }
                (_, _, enforced) => enforced,
            };
            bucket.assigned = Some(Assigned { enforced, expires });
            Applied::Changed
        }
    }
}

/// The usage of one bucket since its last report, whole seconds, and starts the next.
fn take_usage(id: &Id, bucket: &mut Bucket, now: Instant) -> BucketQuotaUsage {
    let elapsed = now.saturating_duration_since(bucket.last_report).as_secs();
    let usage = BucketQuotaUsage {
        bucket_id: Some(BucketId {
            bucket: id.iter().cloned().collect(),
        }),
        time_elapsed: Some(pbjson_types::Duration {
            seconds: i64::try_from(elapsed).unwrap_or(i64::MAX),
            nanos: 0,
        }),
        num_requests_allowed: bucket.allowed,
        num_requests_denied: bucket.denied,
    };
    bucket.allowed = 0;
    bucket.denied = 0;
    bucket.last_report = now;
    usage
}

/// A TTL as Envoy reads it: its whole seconds; unset or negative is 0 (expired at once).
fn whole_seconds(duration: Option<pbjson_types::Duration>) -> u64 {
    duration.map_or(0, |duration| u64::try_from(duration.seconds).unwrap_or(0))
}

/// A bucket id's pairs, sorted.
fn sorted(id: &BucketId) -> Id {
    let mut pairs: Id = id
        .bucket
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    pairs.sort_unstable();
    pairs
}

#[cfg(test)]
mod tests;
