//! Candidate rules (`--candidate-config`): rules evaluated beside the live ones on every
//! request, on the same descriptors, in buckets of their own ([`BucketKey::candidate`]), so
//! that a new limit can be watched on real traffic before anyone enforces it.
//!
//! A candidate never changes an answer: its charges are decided independently of each other
//! and of the live ones (each as if it were the only rule), concurrently with the live call,
//! and a failure only counts in `floodgate_candidate_errors_total`.

use std::sync::Arc;

use tokio::time::Instant;

use super::rule_set::{Ranking, RuleSet};
use super::{Hits, Request, always_over};
use crate::backend::{Backend, BucketKey, Charge, Group, Item, Outcome, Weight};
use crate::matcher::Matcher;
use crate::metrics::{CandidateCounters, Metrics};
use crate::rules::{Limit, Policy};
use crate::top::TopKeys;

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
        for (descriptor, entries) in request.descriptors.iter().enumerate() {
            let Some(matched) = self.rules.matcher.lookup(domain, &entries.entries) else {
                continue;
            };
            let Limit::Limited(policy) = matched.rule.limit else {
                continue;
            };
            let levels = matched.levels.iter().map(|(k, v, _)| (*k, *v));
            let bucket = BucketKey::candidate(domain, &matched.rule.path, levels, &policy);
            trials.push(Trial {
                descriptor,
                policy,
                bucket,
                cost: entries.cost,
                rule_id: matched.rule_id,
                ranking: self.rules.ranking(top, &matched),
            });
        }
        trials
    }

    /// Counts what the candidates decided for `request`, whose live answer denied it or not.
    pub(super) fn settle(
        &self,
        trials: &[Trial],
        outcomes: Option<Vec<Outcome>>,
        live_denied: bool,
        request: &Request,
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
            if let Some(ranking) = &trial.ranking {
                let entries = &request.descriptors[trial.descriptor].entries;
                hits.rank(ranking, trial.bucket, entries);
            }
        }
    }
}

/// One descriptor as a candidate rule sees it.
pub(super) struct Trial {
    /// Its place in the request.
    descriptor: usize,
    policy: Policy,
    bucket: BucketKey,
    cost: u64,
    rule_id: usize,
    ranking: Option<Ranking>,
}

/// Decides `trials` by `work_ends`, each charge on its own; `None` when the backend failed.
pub(super) async fn decide(
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
