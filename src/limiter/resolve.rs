//! One descriptor to its rule, bucket and metric series: the rule the matcher finds, or the
//! fixed-window rule an Envoy limit override stands for.

use std::borrow::Cow;
use std::sync::Arc;

use super::rule_set::{Ranking, RuleSet};
use super::{Descriptor, LimitOverride};
use crate::backend::BucketKey;
use crate::metrics::{Metrics, RuleCounters};
use crate::rules::{Limit, OnOverLimit, Policy, Rule};
use crate::top::TopKeys;

/// What a descriptor resolved to.
pub(super) struct Resolved {
    pub(super) rule: Arc<Rule>,
    /// The bucket, for limited rules.
    pub(super) bucket: Option<BucketKey>,
    pub(super) counters: Arc<RuleCounters>,
    /// Where its keys are ranked: configured limited rules only (a limit override's path
    /// is made of request values).
    pub(super) ranking: Option<Ranking>,
}

/// Finds the rule, bucket and metric series of one descriptor; the override, when present in
/// a known domain, replaces the configured rule as in the reference service.
pub(super) fn resolve(
    rules: &RuleSet,
    metrics: &Metrics,
    top: &TopKeys,
    accounting: OnOverLimit,
    domain: &str,
    descriptor: &Descriptor,
) -> Option<Resolved> {
    let entries = &descriptor.entries;
    if let Some(limit) = descriptor.limit_override {
        let rule = Arc::new(override_rule(domain, entries, limit, accounting));
        let policy = *rule.policy()?;
        let levels = entries.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        let bucket = BucketKey::new(domain, &rule.path, levels, &policy);
        // Label by the entry keys only (values would be one series per client); the keys come
        // from requests too, so the series is capped like any request-made one.
        let keys: Vec<&str> = entries.iter().map(|(key, _)| key.as_str()).collect();
        let counters = metrics.series(domain, None, &keys.join("."));
        return Some(Resolved {
            rule,
            bucket: Some(bucket),
            counters,
            ranking: None,
        });
    }
    let matched = rules.matcher.lookup(domain, entries)?;
    // Only keys built from request values need the capped lookup.
    let counters = match matched.metric_key(entries) {
        Cow::Borrowed(_) => rules.rule_series(metrics, &matched),
        Cow::Owned(key) => metrics.series(domain, Some(&matched.rule.path), &key),
    };
    let rule = Arc::clone(matched.rule);
    let bucket = rule.policy().map(|policy| {
        let levels = matched.levels.iter().map(|(k, v, _)| (*k, *v));
        BucketKey::new(domain, &rule.path, levels, policy)
    });
    let ranking = bucket.and_then(|_| rules.ranking(top, &matched));
    Some(Resolved {
        rule,
        bucket,
        counters,
        ranking,
    })
}

/// The fixed-window rule an Envoy limit override stands for. Its path is the reference's
/// descriptor key (`k1_v1.k2_v2`), which names its bucket (its metrics are named by the
/// entry keys only, see `resolve`).
fn override_rule(
    domain: &str,
    entries: &[(String, String)],
    limit: LimitOverride,
    accounting: OnOverLimit,
) -> Rule {
    let path = entries
        .iter()
        .map(|(key, value)| {
            if value.is_empty() {
                key.clone()
            } else {
                format!("{key}_{value}")
            }
        })
        .collect::<Vec<_>>()
        .join(".");
    Rule {
        domain: domain.to_owned(),
        path,
        name: None,
        replaces: Vec::new(),
        limit: Limit::Limited(Policy {
            on_over_limit: accounting,
            ..Policy::fixed_window(limit.requests_per_unit, limit.unit)
        }),
        sets_accounting: false,
        shadow_mode: false,
        quota_mode: false,
        detailed_metric: false,
        value_to_metric: false,
        metadata: None,
        global: false,
    }
}
