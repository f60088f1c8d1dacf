//! Candidate rules (`--candidate-config`): rules evaluated beside the live ones on every
//! request, on the same descriptors, in buckets of their own ([`BucketKey::candidate`]), so
//! that a new limit can be watched on real traffic before anyone enforces it.
//!
//! A candidate never changes an answer, by construction:
//! - its buckets live in a store of their own (`Backend::candidate_store`: on memory, a
//!   second bounded map), so filling them never evicts a live bucket;
//! - its charges are decided in a task of their own, beside the live call and never
//!   awaited by it, so a slow or stopped backend that only candidates use never delays a
//!   live answer. At most [`MAX_IN_FLIGHT`] such tasks run at once; past that a request's
//!   candidates are skipped, and both a skip and a failure only count in
//!   `floodgate_candidate_errors_total`;
//! - each charge is decided on its own (as if it were the only rule).

use std::sync::Arc;

use tokio::sync::{Semaphore, oneshot};
use tokio::time::Instant;

use super::rule_set::{Ranking, RuleSet};
use super::{Hits, Request, always_over};
use crate::backend::{Backend, BucketKey, Charge, Group, Item, Outcome, Weight};
use crate::matcher::Matcher;
use crate::metrics::{CandidateCounters, Metrics};
use crate::rules::{Limit, Policy};
use crate::top::TopKeys;

/// Candidate decisions in flight at most, over every request.
pub const MAX_IN_FLIGHT: usize = 1024;

/// Loaded candidate rules and their counters, by rule id.
pub(super) struct CandidateSet {
    pub(super) rules: RuleSet,
    counters: Box<[CandidateCounters]>,
}

impl CandidateSet {
    /// Candidate rules from `matcher`; their series exist from the start, at 0.
    pub(super) fn new(matcher: Matcher, metrics: &Metrics) -> CandidateSet {
        metrics.candidates.clear();
        let counters = matcher
            .rules()
            .iter()
            .map(|rule| metrics.candidates.counters(&rule.domain, &rule.path))
            .collect();
        CandidateSet {
            rules: RuleSet::new(matcher, true),
            counters,
        }
    }

    /// The candidate rules' view of `request`: one trial per descriptor a limited candidate
    /// rule matches.
    pub(super) fn trials(&self, request: &Request, top: &TopKeys) -> Vec<Trial> {
        let domain = request.domain.as_str();
        if !self.rules.matcher.has_domain(domain) {
            return Vec::new();
        }
        let mut trials = Vec::with_capacity(request.descriptors.len());
        for entries in &request.descriptors {
            let Some(matched) = self.rules.matcher.lookup(domain, &entries.entries) else {
                continue;
            };
            let Limit::Limited(policy) = matched.rule.limit else {
                continue;
            };
            let levels = matched.levels.iter().map(|(k, v, _)| (*k, *v));
            let bucket = BucketKey::candidate(domain, &matched.rule.path, levels, &policy);
            let ranking = self.rules.ranking(top, &matched).map(|ranking| {
                let levels = entries.entries.get(..ranking.levels);
                let levels = levels.unwrap_or(&entries.entries).to_vec();
                (ranking, levels)
            });
            trials.push(Trial {
                policy,
                bucket,
                cost: entries.cost,
                rule_id: matched.rule_id,
                ranking,
            });
        }
        trials
    }

    /// Decides `trials` in a task of their own on `backend` by `work_ends`, then counts
    /// them once the live answer is known: the returned sender takes whether it denied
    /// (dropped unsent: it did not). `None`, counted as an error, when
    /// [`MAX_IN_FLIGHT`] decisions hold `slots` (the limiter's, across reloads).
    pub(super) fn spawn(
        self: Arc<Self>,
        slots: &Arc<Semaphore>,
        backend: Arc<dyn Backend>,
        metrics: Arc<Metrics>,
        trials: Vec<Trial>,
        work_ends: Instant,
    ) -> Option<oneshot::Sender<bool>> {
        let Ok(permit) = Arc::clone(slots).try_acquire_owned() else {
            metrics.candidates.errors.inc();
            return None;
        };
        let (verdict, live) = oneshot::channel();
        tokio::spawn(async move {
            let tried = decide(&backend, work_ends, &trials).await;
            let live_denied = live.await.unwrap_or(false);
            self.settle(&trials, tried, live_denied, &metrics);
            drop(permit);
        });
        Some(verdict)
    }

    /// Counts what the candidates decided for a request whose live answer denied it or not.
    fn settle(
        &self,
        trials: &[Trial],
        outcomes: Option<Vec<Outcome>>,
        live_denied: bool,
        metrics: &Metrics,
    ) {
        let Some(outcomes) = outcomes else {
            metrics.candidates.errors.inc();
            return;
        };
        for (trial, outcome) in trials.iter().zip(&outcomes) {
            let hits = Hits::weigh(&trial.policy, trial.cost, outcome);
            let counters = &self.counters[trial.rule_id];
            counters.hits.inc_by(hits.cost);
            if hits.denied {
                counters.over_limit.inc_by(hits.cost);
            }
            if live_denied {
                counters.live_over_limit.inc_by(hits.cost);
            }
            if let Some((ranking, levels)) = &trial.ranking {
                hits.rank(ranking, trial.bucket, levels);
            }
        }
    }
}

/// One descriptor as a candidate rule sees it.
pub(super) struct Trial {
    policy: Policy,
    bucket: BucketKey,
    cost: u64,
    rule_id: usize,
    /// Where its keys are ranked, with the entries that name its key there.
    ranking: Option<(Ranking, Vec<(String, String)>)>,
}

/// Decides `trials` by `work_ends`, each charge on its own; `None` when the backend failed.
async fn decide(
    backend: &Arc<dyn Backend>,
    work_ends: Instant,
    trials: &[Trial],
) -> Option<Vec<Outcome>> {
    // A candidate of limit 0 denies without the backend, as a live one does.
    let charged = |trial: &&Trial| trial.policy.requests_per_unit > 0;
    let items: Vec<Item> = trials
        .iter()
        .filter(charged)
        .map(|trial| Item {
            charge: Charge {
                bucket: trial.bucket,
                policy: trial.policy,
                cost: trial.cost,
                spread_ms: 0,
            },
            weight: Weight::default(),
            lease: None,
        })
        .collect();
    let wanted = items.len();
    let decided = if items.is_empty() {
        Vec::new()
    } else {
        let group = Group {
            items,
            ..Group::independent(&[])
        };
        match tokio::time::timeout_at(work_ends, backend.decide(&group)).await {
            Ok(Ok(outcomes)) if outcomes.len() == wanted => outcomes,
            _ => return None,
        }
    };
    if wanted == trials.len() {
        return Some(decided);
    }
    let mut decided = decided.into_iter();
    trials
        .iter()
        .map(|trial| {
            if charged(&trial) {
                decided.next()
            } else {
                Some(always_over(&trial.policy))
            }
        })
        .collect()
}
