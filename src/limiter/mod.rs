//! Request evaluation: matcher + backend -> per-descriptor statuses and the overall code.
//!
//! One call resolves every descriptor to a rule (or none), drops replaced limits, answers
//! what needs no backend (unmatched, unlimited, `L = 0`, local over-limit cache), charges the
//! rest in one backend batch, then applies SPEC 1.3: shadow and quota semantics, and the
//! all-or-nothing rule that a request which is over limit overall books nothing under
//! `on_over_limit: reject` (charged buckets are refunded).

mod local_cache;
pub mod request;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use tokio::time::Instant;

use crate::backend::{Backend, BackendError, BucketKey, Charge, Outcome, Refund};
use crate::matcher::Matcher;
use crate::metrics::{Metrics, RuleCounters};
use crate::rules::{Algorithm, Limit, OnOverLimit, Policy, Rule};
pub use local_cache::OverLimitCache;
pub use request::{Code, CurrentLimit, Descriptor, LimitOverride, Request, Response, Status};

/// What to answer when the backend fails (SPEC 1.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum FailureMode {
    /// Return an error (gRPC `UNAVAILABLE`), so Envoy's `failure_mode_deny` decides.
    #[default]
    Error,
    /// Answer OK with no limits.
    Allow,
    /// Answer OVER_LIMIT.
    Deny,
}

impl FailureMode {
    fn as_str(self) -> &'static str {
        match self {
            FailureMode::Error => "error",
            FailureMode::Allow => "allow",
            FailureMode::Deny => "deny",
        }
    }
}

/// Settings of the limiter.
#[derive(Debug, Clone)]
pub struct LimiterOptions {
    /// Upper bound on each backend call.
    pub backend_timeout: Duration,
    /// What a backend failure answers.
    pub failure_mode: FailureMode,
    /// Global shadow mode: keep per-descriptor verdicts, force the overall code to OK.
    pub shadow_mode: bool,
    /// Capacity of the local over-limit cache; 0 disables it.
    pub local_cache_entries: usize,
}

impl Default for LimiterOptions {
    fn default() -> Self {
        LimiterOptions {
            backend_timeout: crate::backend::redis::DEFAULT_TIMEOUT,
            failure_mode: FailureMode::Error,
            shadow_mode: false,
            local_cache_entries: 0,
        }
    }
}

/// Why a request could not be decided.
#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    /// The backend failed and the failure mode is `error`.
    #[error(transparent)]
    Backend(#[from] BackendError),
}

/// The rate-limit engine: the active rules, a backend, and the metrics it feeds.
pub struct Limiter {
    rules: ArcSwap<Matcher>,
    backend: Arc<dyn Backend>,
    metrics: Arc<Metrics>,
    cache: Option<OverLimitCache>,
    options: LimiterOptions,
}

/// What one descriptor needs once its rule is known.
enum Plan {
    /// Answered without the backend.
    Done(Status),
    /// Always over limit (`L = 0`); no backend call.
    Zero(Limited),
    /// To be charged (or answered from the local cache).
    Charge(Limited),
}

/// A descriptor resolved to a counted rule.
struct Limited {
    rule: Arc<Rule>,
    policy: Policy,
    bucket: BucketKey,
    cost: u64,
    counters: Arc<RuleCounters>,
}

impl Limited {
    fn current_limit(&self) -> CurrentLimit {
        CurrentLimit {
            requests_per_unit: self.policy.requests_per_unit,
            unit: self.policy.unit,
            name: self.rule.name.clone(),
            label: self.rule.display_name().to_owned(),
            window: Duration::from_millis(self.policy.window_ms()),
        }
    }

    fn status(&self, code: Code, remaining: u64, reset_ms: u64) -> Status {
        Status {
            code,
            current_limit: Some(self.current_limit()),
            limit_remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
            reset_seconds: Some(request::reset_seconds(reset_ms)),
            metadata: self.rule.metadata.clone(),
        }
    }

    /// Capacity that "near limit" is measured against.
    fn capacity(&self) -> u64 {
        match self.policy.algorithm {
            Algorithm::TokenBucket => u64::from(self.policy.burst),
            _ => u64::from(self.policy.requests_per_unit),
        }
    }

    /// Counts this descriptor's hits in the reference's per-rule stats.
    fn record(&self, outcome: &Outcome, from_cache: bool) {
        let (counters, cost) = (&self.counters, self.cost);
        counters.total_hits.inc_by(cost);
        if outcome.allowed {
            counters.within_limit.inc_by(cost);
            let near_threshold = self.capacity() * 4 / 5;
            let used = self.capacity().saturating_sub(outcome.remaining);
            if used > near_threshold {
                counters.near_limit.inc_by(cost.min(used - near_threshold));
            }
        } else {
            counters.over_limit.inc_by(cost);
            if self.rule.shadow_mode {
                counters.shadow_mode.inc_by(cost);
            }
            if from_cache {
                counters.over_limit_with_local_cache.inc_by(cost);
            }
        }
    }

    /// Whether `outcome` proves no cost-1 request fits for `reset_ms`, so the bucket may be
    /// cached as exhausted. A denial of cost <= 1 says so directly (R is then the wait until
    /// one request fits); a fixed window that is exactly full stays full until its end.
    fn proves_exhausted(&self, outcome: &Outcome) -> bool {
        if self.policy.on_over_limit == OnOverLimit::Consume {
            return false;
        }
        let denied_one = !outcome.allowed && self.cost <= 1;
        let window_full = outcome.allowed
            && outcome.remaining == 0
            && self.cost > 0
            && self.policy.algorithm == Algorithm::FixedWindow;
        denied_one || window_full
    }
}

impl Limiter {
    /// Builds a limiter over `backend` with the initial `rules`.
    pub fn new(
        rules: Matcher,
        backend: Arc<dyn Backend>,
        metrics: Arc<Metrics>,
        options: LimiterOptions,
    ) -> Limiter {
        let cache = (options.local_cache_entries > 0)
            .then(|| OverLimitCache::new(options.local_cache_entries));
        metrics.loaded_rules.set(rules.rules().len() as i64);
        Limiter {
            rules: ArcSwap::from_pointee(rules),
            backend,
            metrics,
            cache,
            options,
        }
    }

    /// Swaps in new rules atomically; requests in flight finish on the old ones.
    pub fn replace_rules(&self, rules: Matcher) {
        self.metrics.loaded_rules.set(rules.rules().len() as i64);
        self.rules.store(Arc::new(rules));
        // A changed limit may have room where the old one had none.
        if let Some(cache) = &self.cache {
            cache.clear();
        }
    }

    /// The active rules.
    pub fn rules(&self) -> Arc<Matcher> {
        self.rules.load_full()
    }

    /// The metrics this limiter feeds.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Decides a validated request. `deadline` is the caller's; backend work never outlives
    /// it nor `backend_timeout`.
    ///
    /// # Errors
    /// `LimitError::Backend` when the backend fails and the failure mode is `error`.
    pub async fn should_rate_limit(
        &self,
        request: &Request,
        deadline: Option<Instant>,
    ) -> Result<Response, LimitError> {
        // The whole request's backend work, refunds included, ends here.
        let budget_end = self.budget_end(Instant::now(), deadline);
        let rules = self.rules.load();
        let plans = self.plan(&rules, request);
        drop(rules);

        let mut statuses: Vec<Option<Status>> = vec![None; plans.len()];
        let mut outcomes: Vec<Option<Outcome>> = vec![None; plans.len()];
        let mut to_charge = Vec::new();
        for (i, plan) in plans.iter().enumerate() {
            match plan {
                Plan::Done(status) => statuses[i] = Some(status.clone()),
                Plan::Zero(limited) => {
                    let outcome = always_over(&limited.policy);
                    limited.record(&outcome, false);
                    outcomes[i] = Some(outcome);
                }
                Plan::Charge(limited) => match self.cached_exhaustion(limited) {
                    Some(outcome) => {
                        limited.record(&outcome, true);
                        outcomes[i] = Some(outcome);
                    }
                    None => to_charge.push(i),
                },
            }
        }

        // Outcomes the backend just decided: the only ones that may fill the local cache.
        let mut fresh = Vec::new();
        if !to_charge.is_empty() {
            let charges: Vec<Charge> = to_charge
                .iter()
                .map(|&i| {
                    let limited = limited_of(&plans[i]);
                    Charge {
                        bucket: limited.bucket,
                        policy: limited.policy,
                        cost: limited.cost,
                    }
                })
                .collect();
            let asked_at = Instant::now();
            let answer = self
                .backend_call(budget_end, self.backend.charge(&charges))
                .await
                .and_then(|results| {
                    if results.len() == charges.len() {
                        Ok(results)
                    } else {
                        Err(BackendError::Failed(format!(
                            "{} outcomes for {} charges",
                            results.len(),
                            charges.len()
                        )))
                    }
                });
            match answer {
                Ok(results) => {
                    for (&i, outcome) in to_charge.iter().zip(results) {
                        limited_of(&plans[i]).record(&outcome, false);
                        outcomes[i] = Some(outcome);
                        fresh.push((i, asked_at));
                    }
                }
                Err(error) => self.apply_failure_mode(
                    error,
                    &plans,
                    &to_charge,
                    &mut statuses,
                    &mut outcomes,
                )?,
            }
        }

        Ok(self
            .finish(&plans, statuses, outcomes, &fresh, budget_end)
            .await)
    }

    /// Resolves every descriptor to a plan, applying `replaces` across the request.
    fn plan(&self, rules: &Matcher, request: &Request) -> Vec<Plan> {
        let domain = request.domain.as_str();
        if !rules.has_domain(domain) {
            return request
                .descriptors
                .iter()
                .map(|_| Plan::Done(Status::unmatched()))
                .collect();
        }
        let resolved: Vec<Option<Resolved>> = request
            .descriptors
            .iter()
            .map(|descriptor| resolve(rules, &self.metrics, domain, descriptor))
            .collect();
        let replaced: HashSet<&str> = resolved
            .iter()
            .flatten()
            .filter(|(rule, _, _)| matches!(rule.limit, Limit::Limited(_)))
            .flat_map(|(rule, _, _)| rule.replaces.iter().map(String::as_str))
            .collect();
        resolved
            .iter()
            .zip(&request.descriptors)
            .map(|(resolved, descriptor)| {
                let Some((rule, bucket, counters)) = resolved else {
                    return Plan::Done(Status::unmatched());
                };
                let (Limit::Limited(policy), Some(bucket)) = (&rule.limit, bucket) else {
                    return Plan::Done(Status::unlimited());
                };
                let policy = *policy;
                if rule
                    .name
                    .as_deref()
                    .is_some_and(|name| replaced.contains(name))
                {
                    return Plan::Done(Status::unmatched());
                }
                let limited = Limited {
                    rule: Arc::clone(rule),
                    policy,
                    bucket: *bucket,
                    cost: descriptor.cost,
                    counters: Arc::clone(counters),
                };
                if policy.requests_per_unit == 0 {
                    Plan::Zero(limited)
                } else {
                    Plan::Charge(limited)
                }
            })
            .collect()
    }

    fn cached_exhaustion(&self, limited: &Limited) -> Option<Outcome> {
        if limited.policy.on_over_limit == OnOverLimit::Consume {
            return None;
        }
        let left = self
            .cache
            .as_ref()?
            .exhausted_for(limited.bucket, limited.policy)?;
        self.metrics.local_cache_hits.inc();
        Some(Outcome {
            allowed: false,
            remaining: 0,
            reset_ms: left.as_millis() as u64,
            now_ms: 0,
            booked: false,
        })
    }

    /// Runs one backend call under the backend timeout and the caller's deadline.
    /// When backend work started at `start` must end: `backend_timeout` later, or the
    /// caller's deadline if that comes first.
    fn budget_end(&self, start: Instant, deadline: Option<Instant>) -> Instant {
        let limit = start + self.options.backend_timeout;
        deadline.map_or(limit, |deadline| limit.min(deadline))
    }

    /// Runs one backend call, ending at `limit`.
    async fn backend_call<T>(
        &self,
        limit: Instant,
        call: impl Future<Output = Result<T, BackendError>>,
    ) -> Result<T, BackendError> {
        let started = Instant::now();
        let result = match tokio::time::timeout_at(limit, call).await {
            Ok(result) => result,
            Err(_) => Err(BackendError::Timeout),
        };
        Metrics::observe(&self.metrics.backend_latency, started.elapsed());
        if let Err(error) = &result {
            self.metrics.backend_error(error.kind());
        }
        result
    }

    /// Builds the statuses and overall code, refunding when the request is over limit.
    async fn finish(
        &self,
        plans: &[Plan],
        mut statuses: Vec<Option<Status>>,
        outcomes: Vec<Option<Outcome>>,
        fresh: &[(usize, Instant)],
        budget_end: Instant,
    ) -> Response {
        let mut over = false;
        let mut quota_total = 0usize;
        let mut quota_over = 0usize;
        for (i, outcome) in outcomes.iter().enumerate() {
            let (Some(outcome), Some(limited)) = (outcome, limited_of_opt(&plans[i])) else {
                continue;
            };
            let status = if outcome.allowed {
                limited.status(Code::Ok, outcome.remaining, outcome.reset_ms)
            } else if limited.rule.shadow_mode {
                limited.status(Code::Ok, 0, outcome.reset_ms)
            } else {
                limited.status(Code::OverLimit, 0, outcome.reset_ms)
            };
            let denied = status.code == Code::OverLimit;
            if limited.rule.quota_mode {
                quota_total += 1;
                quota_over += usize::from(denied);
            } else {
                over |= denied;
            }
            statuses[i] = Some(status);
        }
        over |= quota_total > 0 && quota_over == quota_total;

        // The request is admitted under global shadow mode, so its bookings stand.
        let refunding = over && !self.options.shadow_mode;
        let mut refunds = Vec::new();
        let mut refunded = vec![false; outcomes.len()];
        for (i, outcome) in outcomes.iter().enumerate() {
            let (Some(outcome), Some(limited)) = (outcome, limited_of_opt(&plans[i])) else {
                continue;
            };
            let refundable = outcome.allowed
                && outcome.booked
                && limited.cost > 0
                && limited.policy.on_over_limit == OnOverLimit::Reject;
            if refunding && refundable {
                refunds.push(Refund {
                    bucket: limited.bucket,
                    policy: limited.policy,
                    cost: limited.cost,
                    booked_at_ms: outcome.now_ms,
                });
                refunded[i] = true;
                if let Some(status) = statuses[i].as_mut() {
                    let before = u64::from(status.limit_remaining) + limited.cost;
                    status.limit_remaining = u32::try_from(before).unwrap_or(u32::MAX);
                }
            }
        }
        if let Some(cache) = &self.cache {
            for &(i, asked_at) in fresh {
                let (Some(outcome), Some(limited)) = (&outcomes[i], limited_of_opt(&plans[i]))
                else {
                    continue;
                };
                if !refunded[i] && limited.proves_exhausted(outcome) {
                    cache.insert(limited.bucket, limited.policy, asked_at, outcome.reset_ms);
                }
            }
        }
        if !refunds.is_empty() {
            self.refund(refunds, budget_end).await;
        }

        let overall = if over && !self.options.shadow_mode {
            Code::OverLimit
        } else {
            Code::Ok
        };
        Response {
            overall,
            statuses: statuses
                .into_iter()
                .map(|status| status.unwrap_or_else(Status::unmatched))
                .collect(),
        }
    }

    /// Applies the failure mode to a backend error for the descriptors that needed the
    /// backend; everything decided without it (unmatched, unlimited, `L = 0`, cached) stands,
    /// and `finish` then applies shadow modes as for any answer.
    fn apply_failure_mode(
        &self,
        error: BackendError,
        plans: &[Plan],
        to_charge: &[usize],
        statuses: &mut [Option<Status>],
        outcomes: &mut [Option<Outcome>],
    ) -> Result<(), LimitError> {
        let mode = self.options.failure_mode;
        self.metrics.failure_mode_used(mode.as_str());
        // Debug, not warn: during an outage this fires per request; health logs the outage
        // once and the failure_mode and backend_errors metrics count every case.
        tracing::debug!(%error, mode = mode.as_str(), "backend failed; applying the failure mode");
        for &i in to_charge {
            match mode {
                FailureMode::Error => return Err(LimitError::Backend(error)),
                FailureMode::Allow => statuses[i] = Some(Status::unmatched()),
                FailureMode::Deny => outcomes[i] = Some(always_over(&limited_of(&plans[i]).policy)),
            }
        }
        Ok(())
    }

    /// Undoes the bookings of an over-limit request. Runs as its own task, bounded by the
    /// backend timeout: the answer waits for it only until the request's budget ends, and if
    /// the caller gives up (a deadline, a reset stream) the refund still completes.
    async fn refund(&self, refunds: Vec<Refund>, budget_end: Instant) {
        let backend = Arc::clone(&self.backend);
        let metrics = Arc::clone(&self.metrics);
        let timeout = self.options.backend_timeout;
        let task = tokio::spawn(async move {
            let result = match tokio::time::timeout(timeout, backend.refund(&refunds)).await {
                Ok(result) => result,
                Err(_) => Err(BackendError::Timeout),
            };
            if let Err(error) = result {
                metrics.backend_error(error.kind());
                metrics.refund_errors.inc();
                tracing::warn!(%error, "refund failed; the over-limit request's bookings stand");
            }
        });
        let _ = tokio::time::timeout_at(budget_end, task).await;
    }
}

/// A descriptor's rule, its bucket (limited rules only) and its rule counters.
type Resolved = (Arc<Rule>, Option<BucketKey>, Arc<RuleCounters>);

/// Finds the rule, bucket and metric key of one descriptor; the override, when present in a
/// known domain, replaces the configured rule as in the reference service.
fn resolve(
    rules: &Matcher,
    metrics: &Metrics,
    domain: &str,
    descriptor: &Descriptor,
) -> Option<Resolved> {
    let entries = &descriptor.entries;
    if let Some(limit) = descriptor.limit_override {
        let rule = Arc::new(override_rule(domain, entries, limit));
        let policy = *rule.policy()?;
        let levels = entries.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        let bucket = BucketKey::new(domain, &rule.path, levels, &policy);
        // Label by the entry keys only: values come from requests and would make the
        // metric's cardinality unbounded.
        let keys: Vec<&str> = entries.iter().map(|(key, _)| key.as_str()).collect();
        let counters = metrics.rule(domain, &keys.join("."));
        return Some((rule, Some(bucket), counters));
    }
    let matched = rules.lookup(domain, entries)?;
    let counters = metrics.rule(domain, &matched.metric_key(entries));
    let rule = Arc::clone(matched.rule);
    let bucket = rule.policy().map(|policy| {
        let levels = matched.levels.iter().map(|(k, v, _)| (*k, *v));
        BucketKey::new(domain, &rule.path, levels, policy)
    });
    Some((rule, bucket, counters))
}

/// The fixed-window rule an Envoy limit override stands for. Its path is the reference's
/// descriptor key (`k1_v1.k2_v2`), which also names its metrics.
fn override_rule(domain: &str, entries: &[(String, String)], limit: LimitOverride) -> Rule {
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
        limit: Limit::Limited(Policy::fixed_window(limit.requests_per_unit, limit.unit)),
        shadow_mode: false,
        quota_mode: false,
        detailed_metric: false,
        value_to_metric: false,
        metadata: None,
    }
}

/// The outcome of a rule with `L = 0`: denied until the current window ends (wall clock).
fn always_over(policy: &Policy) -> Outcome {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let window = policy.window_ms().max(1);
    Outcome {
        allowed: false,
        remaining: 0,
        reset_ms: window - now_ms % window,
        now_ms: 0,
        booked: false,
    }
}

fn limited_of(plan: &Plan) -> &Limited {
    limited_of_opt(plan).expect("only counted plans are charged")
}

fn limited_of_opt(plan: &Plan) -> Option<&Limited> {
    match plan {
        Plan::Zero(limited) | Plan::Charge(limited) => Some(limited),
        Plan::Done(_) => None,
    }
}

#[cfg(test)]
mod tests;
