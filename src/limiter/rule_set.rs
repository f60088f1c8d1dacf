//! A loaded set of rules (live, or candidate) with the per-rule state resolved once, on
//! first use, instead of looked up per descriptor: the rule's metric series and where its
//! denied and near-limit keys are ranked. A reload swaps the whole set.

use std::sync::{Arc, OnceLock};

use crate::matcher::{Matched, Matcher};
use crate::metrics::{Metrics, RuleCounters};
use crate::top::{RuleName, RuleTop, TopKeys};

/// Rules and their per-rule state, by rule id.
pub(super) struct RuleSet {
    pub(super) matcher: Arc<Matcher>,
    /// Resolved on first use, so `/metrics` shows a rule only once it was hit.
    series: Box<[OnceLock<Arc<RuleCounters>>]>,
    tops: Box<[OnceLock<Option<Arc<RuleTop>>>]>,
    /// Whether these are candidate rules (`--candidate-config`).
    candidate: bool,
}

impl RuleSet {
    pub(super) fn new(matcher: Matcher, candidate: bool) -> RuleSet {
        let count = matcher.rules().len();
        RuleSet {
            matcher: Arc::new(matcher),
            series: (0..count).map(|_| OnceLock::new()).collect(),
            tops: (0..count).map(|_| OnceLock::new()).collect(),
            candidate,
        }
    }

    /// The series of a matched rule whose metric key is its path.
    pub(super) fn rule_series(
        &self,
        metrics: &Metrics,
        matched: &Matched<'_>,
    ) -> Arc<RuleCounters> {
        let series = self.series[matched.rule_id]
            .get_or_init(|| metrics.rule(&matched.rule.domain, &matched.rule.path));
        Arc::clone(series)
    }

    /// Where a matched rule's keys are ranked; `None` past `top`'s bound on ranked rules.
    pub(super) fn ranking(&self, top: &TopKeys, matched: &Matched<'_>) -> Option<Ranking> {
        let rule_top = self.tops[matched.rule_id].get_or_init(|| {
            let rule = matched.rule;
            top.rule(RuleName {
                domain: rule.domain.clone(),
                path: rule.path.clone(),
                name: rule.name.clone(),
                candidate: self.candidate,
            })
        });
        Some(Ranking {
            top: Arc::clone(rule_top.as_ref()?),
            levels: matched.levels.len(),
        })
    }
}

/// Where one descriptor's denied and near-limit hits are ranked.
pub(super) struct Ranking {
    pub(super) top: Arc<RuleTop>,
    /// How many of the descriptor's entries the rule matched: they name the key.
    pub(super) levels: usize,
}
