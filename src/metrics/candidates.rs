//! What the candidate rules (`--candidate-config`) would have decided:
//! `floodgate_candidate_*`, one series per candidate rule.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::RuleLabels;

/// The counters of one candidate rule (`floodgate_candidate_*{domain,key}`), weighted by
/// cost like the per-rule series.
#[derive(Clone, Default)]
pub struct CandidateCounters {
    /// Hits the candidate saw.
    pub hits: Counter,
    /// Hits it would have denied.
    pub over_limit: Counter,
    /// Hits of requests the live rules denied.
    pub live_over_limit: Counter,
}

/// The candidate rules' metrics: one series per candidate rule (config-made, so bounded).
#[derive(Clone, Default)]
pub struct CandidateMetrics {
    hits: Family<RuleLabels, Counter>,
    over_limit: Family<RuleLabels, Counter>,
    live_over_limit: Family<RuleLabels, Counter>,
    /// Candidate evaluations lost to a backend error or timeout, or skipped past the bound
    /// on those in flight (the answer is unaffected).
    pub errors: Counter,
    /// Candidate rule loads rejected (the previous candidates stay); apart from the live
    /// rules' `config_load_error`, which alerts on the rules in force.
    pub load_errors: Counter,
}

impl CandidateMetrics {
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "candidate_hits",
            "Hits a candidate rule saw, weighted by cost",
            self.hits.clone(),
        );
        registry.register(
            "candidate_over_limit",
            "Hits a candidate rule would have denied",
            self.over_limit.clone(),
        );
        registry.register(
            "candidate_live_over_limit",
            "Hits a candidate rule saw in requests the live rules denied",
            self.live_over_limit.clone(),
        );
        registry.register(
            "candidate_errors",
            "Candidate evaluations lost to a backend error, or skipped under load; answers are unaffected",
            self.errors.clone(),
        );
        registry.register(
            "candidate_config_load_error",
            "Candidate rule loads rejected; the previous candidates stay",
            self.load_errors.clone(),
        );
    }

    /// The counters of the candidate rule `path` in `domain`.
    pub fn counters(&self, domain: &str, path: &str) -> CandidateCounters {
        let labels = RuleLabels {
            domain: domain.to_owned(),
            key: path.to_owned(),
        };
        CandidateCounters {
            hits: self.hits.get_or_create(&labels).clone(),
            over_limit: self.over_limit.get_or_create(&labels).clone(),
            live_over_limit: self.live_over_limit.get_or_create(&labels).clone(),
        }
    }

    /// Drops every candidate series (new candidate rules were loaded).
    pub fn clear(&self) {
        self.hits.clear();
        self.over_limit.clear();
        self.live_over_limit.clear();
    }
}
