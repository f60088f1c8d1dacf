//! The accounting of rules that do not set `on_over_limit`: what a request over the limit
//! books. Rules from files keep floodgate's own default, `reject` (a rejected request
//! consumes nothing); rules from xDS come from control planes built for the reference's
//! accounting, which books every hit, so theirs is `consume` (a cost reported after the
//! response, such as an LLM's tokens, is never lost). `--on-over-limit` overrides both.

use std::sync::Arc;

use crate::matcher::{DescriptorRule, DomainRules};
use crate::rules::OnOverLimit;

/// Where the rules in force come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleSource {
    /// YAML files of the config directory.
    Files,
    /// An xDS management server (Envoy Gateway).
    Xds,
}

/// The accounting of rules from `source` that do not set their own: `flag`
/// (`--on-over-limit`) when given, else the source's.
pub fn default_accounting(source: RuleSource, flag: Option<OnOverLimit>) -> OnOverLimit {
    flag.unwrap_or(match source {
        RuleSource::Files => OnOverLimit::Reject,
        RuleSource::Xds => OnOverLimit::Consume,
    })
}

/// Gives every rule of `domains` that does not set `on_over_limit` the accounting
/// `default`.
pub fn apply_default_accounting(domains: &mut [DomainRules], default: OnOverLimit) {
    for domain in domains {
        apply(&mut domain.descriptors, default);
    }
}

fn apply(level: &mut [DescriptorRule], default: OnOverLimit) {
    for node in level {
        if let Some(rule) = &node.rule
            && let Some(changed) = rule.with_default_accounting(default)
        {
            node.rule = Some(Arc::new(changed));
        }
        apply(&mut node.children, default);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::Limit;

    const RULES: &str = "\
domain: d
descriptors:
  - key: unset
    rate_limit: {unit: minute, requests_per_unit: 5}
    descriptors:
      - key: nested
        rate_limit: {unit: minute, requests_per_unit: 5, algorithm: sliding_log}
  - key: rejects
    rate_limit: {unit: minute, requests_per_unit: 5, on_over_limit: reject}
  - key: free
    rate_limit: {unlimited: true}
";

    fn accounting(domain: &DomainRules, key: &str) -> Option<OnOverLimit> {
        let mut level = &domain.descriptors;
        let mut found = None;
        for step in key.split('.') {
            let node = level.iter().find(|node| node.key == step).expect("a node");
            found = node.rule.as_ref().and_then(|rule| match rule.limit {
                Limit::Limited(policy) => Some(policy.on_over_limit),
                Limit::Unlimited => None,
            });
            level = &node.children;
        }
        found
    }

    #[test]
    fn files_reject_xds_consumes_and_the_flag_overrides_both() {
        assert_eq!(
            default_accounting(RuleSource::Files, None),
            OnOverLimit::Reject
        );
        assert_eq!(
            default_accounting(RuleSource::Xds, None),
            OnOverLimit::Consume
        );
        let flag = Some(OnOverLimit::Consume);
        assert_eq!(
            default_accounting(RuleSource::Files, flag),
            OnOverLimit::Consume
        );
        let flag = Some(OnOverLimit::Reject);
        assert_eq!(
            default_accounting(RuleSource::Xds, flag),
            OnOverLimit::Reject
        );
    }

    #[test]
    fn only_rules_without_their_own_take_the_default() {
        let mut domains = vec![super::super::parse_domain("d.yaml", RULES).expect("parses")];
        apply_default_accounting(&mut domains, OnOverLimit::Consume);
        let consume = Some(OnOverLimit::Consume);
        assert_eq!(accounting(&domains[0], "unset"), consume);
        assert_eq!(accounting(&domains[0], "unset.nested"), consume);
        assert_eq!(
            accounting(&domains[0], "rejects"),
            Some(OnOverLimit::Reject)
        );
        assert_eq!(accounting(&domains[0], "free"), None);
    }
}
