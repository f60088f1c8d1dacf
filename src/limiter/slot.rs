//! One descriptor of a request from plan to status: the rule it resolved to, what the
//! backend (or the local cache, or `L = 0`) decided, how its hits count in the per-rule stats
//! and the top keys, and the status it answers.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::rule_set::Ranking;
use super::{Code, CurrentLimit, OverLimitCache, Status, always_over, request};
use crate::backend::{BucketKey, Charge, Item, Outcome, Weight, undoable};
use crate::metrics::{Metrics, RuleCounters};
use crate::rules::{Algorithm, OnOverLimit, Policy, Rule};
use crate::top::Kind;

/// What one descriptor needs once its rule is known.
pub(super) enum Plan {
    /// Answered without the backend.
    Done(Status),
    /// Always over limit (`L = 0`); no backend call.
    Zero(Limited),
    /// To be charged (or answered from the local cache).
    Charge(Limited),
}

/// A descriptor resolved to a counted rule.
pub(super) struct Limited {
    pub(super) rule: Arc<Rule>,
    pub(super) policy: Policy,
    pub(super) bucket: BucketKey,
    pub(super) cost: u64,
    pub(super) counters: Arc<RuleCounters>,
    /// How its verdict weighs: the rule's modes, with global quota mode applied.
    pub(super) weight: Weight,
    pub(super) ranking: Option<Ranking>,
    /// A global rule's base lease in this region (`regions`), else `None`.
    pub(super) lease: Option<u32>,
}

impl Limited {
    /// The charge for the backend, weighted by the rule's modes.
    pub(super) fn item(&self) -> Item {
        Item {
            charge: Charge {
                bucket: self.bucket,
                policy: self.policy,
                cost: self.cost,
                spread_ms: 0,
            },
            weight: self.weight,
            lease: self.lease,
        }
    }

    /// The denial the local cache holds for this bucket, if any.
    pub(super) fn cached_exhaustion(&self, cache: &OverLimitCache) -> Option<Outcome> {
        if self.policy.on_over_limit == OnOverLimit::Consume {
            return None;
        }
        let left = cache.exhausted_for(self.bucket, self.policy)?;
        Some(Outcome {
            allowed: false,
            remaining: 0,
            reset_ms: left.as_millis() as u64,
            now_ms: 0,
            booked: false,
            rolled_back: false,
        })
    }

    pub(super) fn current_limit(&self) -> CurrentLimit {
        CurrentLimit {
            requests_per_unit: self.policy.requests_per_unit,
            unit: self.policy.unit,
            name: self.rule.name.clone(),
            label: self.rule.display_name().to_owned(),
            window: Duration::from_millis(self.policy.window_ms()),
        }
    }

    pub(super) fn status(&self, code: Code, remaining: u64, reset_ms: u64) -> Status {
        Status {
            code,
            current_limit: Some(self.current_limit()),
            limit_remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
            reset_seconds: Some(request::reset_seconds(reset_ms)),
            metadata: self.rule.metadata.clone(),
        }
    }

    /// Counts this descriptor's hits in the reference's per-rule stats, and ranks its key
    /// (`entries` are the descriptor's) when it was denied or near its limit.
    pub(super) fn record(&self, outcome: &Outcome, from_cache: bool, entries: &[(String, String)]) {
        let counters = &self.counters;
        let hits = Hits::weigh(&self.policy, self.cost, outcome);
        counters.total_hits.inc_by(hits.cost);
        if outcome.allowed {
            counters.within_limit.inc_by(hits.cost);
            counters.near_limit.inc_by(hits.near_limit);
        } else {
            counters.over_limit.inc_by(hits.cost);
            if self.rule.shadow_mode {
                counters.shadow_mode.inc_by(hits.cost);
            }
            if from_cache {
                counters.over_limit_with_local_cache.inc_by(hits.cost);
            }
        }
        if let Some(ranking) = &self.ranking {
            hits.rank(ranking, self.bucket, entries);
        }
    }

    /// Whether `outcome` proves no cost-1 request fits for `reset_ms`, so the bucket may be
    /// cached as exhausted. A denial of cost <= 1 says so directly (R is then the wait until
    /// one request fits); a fixed window that is exactly full stays full until its end.
    ///
    /// A lockout rule's first real denial has a side effect (it starts the lock), so such a
    /// rule is only cached once the backend holds its lock: after a denial of cost >= 1.
    pub(super) fn proves_exhausted(&self, outcome: &Outcome) -> bool {
        if self.policy.on_over_limit == OnOverLimit::Consume {
            return false;
        }
        if self.policy.lockout_ms() > 0 {
            return !outcome.allowed && self.cost >= 1;
        }
        let denied_one = !outcome.allowed && self.cost <= 1;
        let window_full = outcome.allowed
            && outcome.remaining == 0
            && self.cost > 0
            && self.policy.algorithm == Algorithm::FixedWindow;
        denied_one || window_full
    }
}

/// How one decided hit counts in the per-rule stats and the top keys.
pub(super) struct Hits {
    /// The cost, clamped to the capacity + 1: no single request can be admitted past the
    /// capacity, and a client-chosen cost (up to 2^64 - 1) would otherwise saturate or wrap
    /// the counters.
    pub(super) cost: u64,
    /// Whether it was denied.
    pub(super) denied: bool,
    /// How much of an admitted cost fell past 80% of the capacity (the reference's
    /// `near_limit`).
    pub(super) near_limit: u64,
}

impl Hits {
    pub(super) fn weigh(policy: &Policy, cost: u64, outcome: &Outcome) -> Hits {
        let capacity = match policy.algorithm {
            Algorithm::TokenBucket => u64::from(policy.burst),
            _ => u64::from(policy.requests_per_unit),
        };
        let cost = cost.min(capacity.saturating_add(1));
        let near_threshold = capacity * 4 / 5;
        let used = capacity.saturating_sub(outcome.remaining);
        let near_limit = if outcome.allowed && used > near_threshold {
            cost.min(used - near_threshold)
        } else {
            0
        };
        Hits {
            cost,
            denied: !outcome.allowed,
            near_limit,
        }
    }

    /// Ranks the bucket `bucket` (whose descriptor has `entries`) by these hits.
    pub(super) fn rank(&self, ranking: &Ranking, bucket: BucketKey, entries: &[(String, String)]) {
        let levels = entries.get(..ranking.levels).unwrap_or(entries);
        if self.denied {
            ranking.top.offer(Kind::Denied, bucket, levels, self.cost);
        } else {
            ranking
                .top
                .offer(Kind::NearLimit, bucket, levels, self.near_limit);
        }
    }
}

/// One descriptor of a request from plan to status: what it needs, what was decided, and
/// whether the backend just decided it (only such answers may fill the local cache).
pub(super) struct Slot {
    pub(super) plan: Plan,
    /// The verdict, once decided (backend, local cache, `L = 0`, failure mode `deny`).
    pub(super) outcome: Option<Outcome>,
    /// When the backend was asked, for answers the backend gave.
    pub(super) asked_at: Option<Instant>,
}

impl Slot {
    pub(super) fn limited(&self) -> Option<&Limited> {
        match &self.plan {
            Plan::Zero(limited) | Plan::Charge(limited) => Some(limited),
            Plan::Done(_) => None,
        }
    }

    /// Decides what needs no backend: `L = 0` and buckets the local cache knows exhausted.
    pub(super) fn decide_locally(
        &mut self,
        cache: Option<&OverLimitCache>,
        metrics: &Metrics,
        entries: &[(String, String)],
    ) {
        let outcome = match &self.plan {
            Plan::Done(_) => return,
            Plan::Zero(limited) => {
                let outcome = always_over(&limited.policy);
                limited.record(&outcome, false, entries);
                outcome
            }
            Plan::Charge(limited) => {
                let Some(outcome) = cache.and_then(|cache| limited.cached_exhaustion(cache)) else {
                    return;
                };
                metrics.local_cache_hits.inc();
                limited.record(&outcome, true, entries);
                outcome
            }
        };
        self.outcome = Some(outcome);
    }

    /// The charge this slot still needs from the backend.
    pub(super) fn pending_item(&self) -> Option<Item> {
        match (&self.plan, &self.outcome) {
            (Plan::Charge(limited), None) => Some(limited.item()),
            _ => None,
        }
    }

    /// The outcome of a rule with `L = 0` under this slot's policy, for a counted rule.
    pub(super) fn zero_outcome(&self) -> Option<Outcome> {
        self.limited().map(|limited| always_over(&limited.policy))
    }

    /// The descriptor's status; `rejected` says whether its request ends over limit.
    pub(super) fn status(&self, rejected: bool) -> Status {
        let (Some(limited), Some(outcome)) = (self.limited(), &self.outcome) else {
            return match &self.plan {
                Plan::Done(status) => status.clone(),
                // Failure mode `allow`: answered without limits.
                _ => Status::unmatched(),
            };
        };
        if outcome.allowed {
            // A rejected request booked nothing: report the remaining from before it.
            let undone = outcome.rolled_back || (rejected && undoable(&limited.item(), outcome));
            let remaining = if undone {
                outcome.remaining + limited.cost
            } else {
                outcome.remaining
            };
            limited.status(Code::Ok, remaining, outcome.reset_ms)
        } else if limited.rule.shadow_mode {
            limited.status(Code::Ok, 0, outcome.reset_ms)
        } else {
            limited.status(Code::OverLimit, 0, outcome.reset_ms)
        }
    }
}
