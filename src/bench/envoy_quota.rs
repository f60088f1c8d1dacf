//! A model of how Envoy's `rate_limit_quota` filter enforces one bucket: what it does
//! before any assignment, with each kind of assignment, and after an assignment's TTL.
//! The RLQS bench and tests drive simulated Envoys with it.

use std::time::{Duration, Instant};

use crate::proto::rlqs::rate_limit_quota_response::BucketAction;
use crate::proto::rlqs::rate_limit_quota_response::bucket_action::BucketAction as Action;
use crate::proto::types::rate_limit_strategy::{BlanketRule, Strategy};

/// What the filter does without an assignment in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Fallback {
    /// Admit every request.
    Allow,
    /// Deny every request.
    Deny,
}

/// The enforcement in force.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Enforced {
    Allow,
    Deny,
    /// A token bucket as Envoy runs it: refilled continuously at `tokens_per_fill` per
    /// `fill_interval`, capped at `max_tokens`.
    Tokens {
        spec: (u32, u32, Duration),
        tokens: f64,
        at: Instant,
    },
}

/// What applying one action did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// A new enforcement (a changed token bucket starts full).
    Changed,
    /// The same enforcement again: only its TTL moved.
    Extended,
    /// The server told the client to forget the bucket.
    Abandoned,
    /// An action the filter ignores or does not implement (it fails open).
    Unsupported,
}

/// One bucket on one simulated Envoy.
#[derive(Debug, Clone)]
pub struct EnvoyBucket {
    enforced: Option<Enforced>,
    expires: Option<Instant>,
    no_assignment: Fallback,
    expired: Fallback,
    allowed: u64,
    denied: u64,
    reported_at: Instant,
}

impl EnvoyBucket {
    /// A bucket first hit at `now`, with the filter's `no_assignment_behavior` and
    /// `expired_assignment_behavior`.
    pub fn new(no_assignment: Fallback, expired: Fallback, now: Instant) -> EnvoyBucket {
        EnvoyBucket {
            enforced: None,
            expires: None,
            no_assignment,
            expired,
            allowed: 0,
            denied: 0,
            reported_at: now,
        }
    }

    /// Decides one request at `now` and counts it for the next report.
    pub fn admit(&mut self, now: Instant) -> bool {
        let expired = self.expires.is_some_and(|expires| now >= expires);
        let admitted = match (&mut self.enforced, expired) {
            (None, _) => self.no_assignment == Fallback::Allow,
            (Some(_), true) => self.expired == Fallback::Allow,
            (Some(Enforced::Allow), false) => true,
            (Some(Enforced::Deny), false) => false,
            (Some(Enforced::Tokens { spec, tokens, at }), false) => {
                let (max, per_fill, every) = *spec;
                let rate = f64::from(per_fill) / every.as_secs_f64();
                let elapsed = now.saturating_duration_since(*at).as_secs_f64();
                *tokens = (*tokens + elapsed * rate).min(f64::from(max));
                *at = now;
                if *tokens >= 1.0 {
                    *tokens -= 1.0;
                    true
                } else {
                    false
                }
            }
        };
        if admitted {
            self.allowed += 1;
        } else {
            self.denied += 1;
        }
        admitted
    }

    /// Applies one action of the server at `now`.
    pub fn apply(&mut self, action: &BucketAction, now: Instant) -> Applied {
        let assignment = match &action.bucket_action {
            Some(Action::QuotaAssignmentAction(assignment)) => assignment,
            Some(Action::AbandonAction(_)) => {
                self.enforced = None;
                self.expires = None;
                return Applied::Abandoned;
            }
            None => return Applied::Unsupported,
        };
        let strategy = assignment
            .rate_limit_strategy
            .as_ref()
            .and_then(|strategy| strategy.strategy.as_ref());
        let (next, supported) = match strategy {
            None => (Enforced::Allow, true),
            Some(Strategy::BlanketRule(rule)) if *rule == BlanketRule::DenyAll as i32 => {
                (Enforced::Deny, true)
            }
            Some(Strategy::BlanketRule(_)) => (Enforced::Allow, true),
            Some(Strategy::TokenBucket(bucket)) => {
                let every = bucket.fill_interval.map_or(Duration::ZERO, std_duration);
                let per_fill = bucket.tokens_per_fill.map_or(1, |value| value.value);
                if bucket.max_tokens == 0 || every.is_zero() {
                    (Enforced::Allow, false)
                } else {
                    let spec = (bucket.max_tokens, per_fill, every);
                    (
                        Enforced::Tokens {
                            spec,
                            tokens: f64::from(bucket.max_tokens),
                            at: now,
                        },
                        true,
                    )
                }
            }
            // Envoy logs it as not supported and fails open.
            Some(Strategy::RequestsPerTimeUnit(_)) => (Enforced::Allow, false),
        };
        self.expires = assignment
            .assignment_time_to_live
            .map(|ttl| now + std_duration(ttl));
        let same = match (&self.enforced, &next) {
            (Some(Enforced::Tokens { spec: old, .. }), Enforced::Tokens { spec: new, .. }) => {
                old == new
            }
            (Some(old), new) => old == new,
            (None, _) => false,
        };
        if !supported {
            self.enforced = Some(next);
            return Applied::Unsupported;
        }
        if same {
            return Applied::Extended;
        }
        self.enforced = Some(next);
        Applied::Changed
    }

    /// The counts since the last report and the time they cover; starts the next period.
    pub fn take_report(&mut self, now: Instant) -> (u64, u64, Duration) {
        let report = (
            self.allowed,
            self.denied,
            now.saturating_duration_since(self.reported_at),
        );
        self.allowed = 0;
        self.denied = 0;
        self.reported_at = now;
        report
    }
}

/// A protobuf duration as Envoy reads it: a negative or malformed one as zero.
fn std_duration(duration: pbjson_types::Duration) -> Duration {
    Duration::try_from(duration).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::rlqs::rate_limit_quota_response::bucket_action::QuotaAssignmentAction;
    use crate::proto::types::{RateLimitStrategy, TokenBucket};

    fn action(strategy: Strategy, ttl_s: i64) -> BucketAction {
        BucketAction {
            bucket_id: None,
            bucket_action: Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
                assignment_time_to_live: Some(pbjson_types::Duration {
                    seconds: ttl_s,
                    nanos: 0,
                }),
                rate_limit_strategy: Some(RateLimitStrategy {
                    strategy: Some(strategy),
                }),
            })),
        }
    }

    fn tokens(max: u32, per_second: u32) -> Strategy {
        Strategy::TokenBucket(TokenBucket {
            max_tokens: max,
            tokens_per_fill: Some(per_second.into()),
            fill_interval: Some(pbjson_types::Duration {
                seconds: 1,
                nanos: 0,
            }),
        })
    }

    #[test]
    fn a_changed_bucket_starts_full_and_a_repeated_one_keeps_its_tokens() {
        let start = Instant::now();
        let mut bucket = EnvoyBucket::new(Fallback::Deny, Fallback::Deny, start);
        assert!(!bucket.admit(start));
        assert_eq!(
            bucket.apply(&action(tokens(2, 1), 10), start),
            Applied::Changed
        );
        assert!(bucket.admit(start) && bucket.admit(start) && !bucket.admit(start));
        assert_eq!(
            bucket.apply(&action(tokens(2, 1), 10), start),
            Applied::Extended
        );
        assert!(!bucket.admit(start));
        assert_eq!(
            bucket.apply(&action(tokens(3, 1), 10), start),
            Applied::Changed
        );
        assert!(bucket.admit(start));
        // Refilled at one a second.
        let later = start + Duration::from_secs(1);
        assert!(bucket.admit(later) && bucket.admit(later) && bucket.admit(later));
        assert!(!bucket.admit(later));
        // Past the TTL, the expired behaviour.
        assert!(!bucket.admit(start + Duration::from_secs(11)));
        assert_eq!(bucket.take_report(later).0, 6);
    }

    #[test]
    fn blanket_rules_and_unsupported_strategies() {
        let now = Instant::now();
        let mut bucket = EnvoyBucket::new(Fallback::Allow, Fallback::Allow, now);
        let deny = Strategy::BlanketRule(BlanketRule::DenyAll as i32);
        assert_eq!(bucket.apply(&action(deny, 10), now), Applied::Changed);
        assert!(!bucket.admit(now));
        let per_unit = Strategy::RequestsPerTimeUnit(Default::default());
        assert_eq!(
            bucket.apply(&action(per_unit, 10), now),
            Applied::Unsupported
        );
        assert!(bucket.admit(now));
    }
}
