//! What the quota service (RLQS) needs of the limiter: a bucket id resolved against the
//! rules in force to the same backend bucket ShouldRateLimit charges, and the bookings of
//! its reports, made the way ShouldRateLimit's charges are.

use std::sync::Arc;

use tokio::time::Instant;

use super::Limiter;
use crate::backend::{BackendError, BucketKey, Charge, Group, Outcome, Refund};
use crate::overload::{self, Caller};
use crate::rules::{Limit, Policy, Rule};

/// What a quota bucket id resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuotaRule {
    /// No rule matches, or the rule is `unlimited`: everything is allowed, nothing counted.
    Unlimited,
    /// Counted like a ShouldRateLimit descriptor matching the same rule.
    Limited(Box<QuotaBucket>),
}

/// A counted quota bucket: where its budget lives and where its demand is recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaBucket {
    /// The matched rule.
    pub rule: Arc<Rule>,
    /// Its policy (`L` may be 0).
    pub policy: Policy,
    /// The bucket ShouldRateLimit charges for the same descriptor.
    pub bucket: BucketKey,
    /// The bucket's fairness counters (demand, capped demand, presence: `rlqs::fair`),
    /// counted under the `counters` policy given to [`Limiter::quota_rule`], each replica
    /// in counters of its own ([`BucketKey::for_replica`]).
    pub counters: [BucketKey; 3],
    /// Denials are reported, never enforced (a `shadow_mode` rule, or global shadow mode).
    pub shadow: bool,
}

/// Appended to a rule path to name its fairness counters (demand, capped demand,
/// presence). A NUL cannot appear in a rule path read from YAML or xDS keys in practice, so
/// no rule's own bucket can be named alike.
const COUNTER_SUFFIXES: [&str; 3] = ["\0rlqs-demand", "\0rlqs-capped", "\0rlqs-presence"];

impl Limiter {
    /// Resolves a quota bucket id, given as entries sorted by key, as one descriptor of
    /// `domain` (limit overrides do not exist in RLQS). `counters` is the policy of the
    /// bucket's fairness counters, which takes part in their names.
    pub fn quota_rule(
        &self,
        domain: &str,
        entries: &[(String, String)],
        counters: &Policy,
    ) -> QuotaRule {
        let rules = self.rules.load();
        let Some(matched) = rules.matcher.lookup(domain, entries) else {
            return QuotaRule::Unlimited;
        };
        let rule = Arc::clone(matched.rule);
        let Limit::Limited(policy) = rule.limit else {
            return QuotaRule::Unlimited;
        };
        let levels = || matched.levels.iter().map(|(k, v, _)| (*k, *v));
        let bucket = BucketKey::new(domain, &rule.path, levels(), &policy);
        let counters = COUNTER_SUFFIXES.map(|suffix| {
            let path = format!("{}{suffix}", rule.path);
            BucketKey::new(domain, &path, levels(), counters)
        });
        let shadow = rule.shadow_mode || self.options.shadow_mode;
        QuotaRule::Limited(Box::new(QuotaBucket {
            rule,
            policy,
            bucket,
            counters,
            shadow,
        }))
    }

    /// Applies a quota stream's charges for `caller`, each booking standing on its own,
    /// through the backend call ShouldRateLimit makes: bounded by the caller's deadline and
    /// `--backend-timeout`, in a span, timed, its failures counted, refused at once by a
    /// backend queue that cannot answer in time, and queued in turn with the caller's
    /// connection.
    ///
    /// # Errors
    /// The backend failed, timed out or refused the work.
    pub async fn quota_charges(
        &self,
        charges: &[Charge],
        caller: Caller,
    ) -> Result<Vec<Outcome>, BackendError> {
        let group = Group {
            deadline: caller.deadline,
            connection: caller.connection,
            ..Group::independent(charges)
        };
        let work_ends = overload::work_ends_within(
            caller.deadline,
            Instant::now(),
            self.options.backend_timeout,
        );
        self.backend_call(work_ends, &group, None).await
    }

    /// Applies a quota stream's refunds (a stream that ends takes its fairness counts out
    /// of the shared counters), within `--backend-timeout`.
    ///
    /// # Errors
    /// The backend failed or timed out; the counts then fade out with their window.
    pub async fn quota_refunds(&self, refunds: &[Refund]) -> Result<(), BackendError> {
        match tokio::time::timeout(self.options.backend_timeout, self.backend.refund(refunds)).await
        {
            Ok(result) => result,
            Err(_) => Err(BackendError::Timeout),
        }
    }
}
