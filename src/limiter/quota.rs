//! What the quota service (RLQS) needs of the limiter: a bucket id resolved against the
//! rules in force to the same backend bucket ShouldRateLimit charges, and the bookings of
//! its reports, made the way ShouldRateLimit's charges are.

use std::sync::Arc;

use tokio::time::Instant;

use super::Limiter;
use crate::backend::{BackendError, BucketKey, Charge, Group, Outcome};
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
    /// The bucket's demand counter, counted under the `demand` policy given to
    /// [`Limiter::quota_rule`].
    pub demand: BucketKey,
    /// Denials are reported, never enforced (a `shadow_mode` rule, or global shadow mode).
    pub shadow: bool,
}

/// Appended to a rule path to name its demand counter. A NUL cannot appear in a rule path
/// read from YAML or xDS keys in practice, so no rule's own bucket can be named alike.
const DEMAND_SUFFIX: &str = "\0rlqs-demand";

impl Limiter {
    /// Resolves a quota bucket id, given as entries sorted by key, as one descriptor of
    /// `domain` (limit overrides do not exist in RLQS). `demand` is the policy of the
    /// bucket's demand counter, which takes part in its name.
    pub fn quota_rule(
        &self,
        domain: &str,
        entries: &[(String, String)],
        demand: &Policy,
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
        let demand_path = format!("{}{DEMAND_SUFFIX}", rule.path);
        let demand = BucketKey::new(domain, &demand_path, levels(), demand);
        let shadow = rule.shadow_mode || self.options.shadow_mode;
        QuotaRule::Limited(Box::new(QuotaBucket {
            rule,
            policy,
            bucket,
            demand,
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
        self.backend_call(work_ends, &group).await
    }
}
