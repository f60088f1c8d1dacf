//! Request evaluation: matcher + backend -> per-descriptor statuses and the overall code.
//!
//! One call resolves every descriptor to a rule (or none) in a `Slot`, drops replaced
//! limits, answers what needs no backend (unmatched, unlimited, `L = 0`, local over-limit
//! cache), hands the rest to the backend as one all-or-nothing `Group`, then applies shadow
//! and quota semantics (docs/requests.md). A request that is over limit overall books nothing under
//! `on_over_limit: reject`: the backend undoes those bookings, atomically where it can.

mod candidate;
pub mod fallback;
mod local_cache;
mod quota;
pub mod regions;
pub mod replicas;
pub mod request;
mod resolve;
mod rule_set;
mod slot;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};
use tokio::time::Instant;

use crate::backend::{Backend, BackendError, Group, Outcome, Tally, Weight, undoable};
use crate::clock::{Clock, SystemClock};
use crate::matcher::Matcher;
use crate::metrics::Metrics;
use crate::otel;
use crate::overload::{self, Caller, ShedReason};
use crate::rules::{Algorithm, Limit, OnOverLimit, Policy, Rule};
use crate::top::{TopKeys, TopOptions};
use candidate::CandidateSet;
use fallback::{LocalFallback, Share};
pub use local_cache::OverLimitCache;
pub use quota::{QuotaBucket, QuotaRule};
use regions::Regions;
use replicas::Registry;
pub use request::{Code, CurrentLimit, Descriptor, LimitOverride, Request, Response, Status};
use resolve::{Resolved, resolve};
use rule_set::RuleSet;
use slot::{Hits, Limited, Plan, Slot};

/// What to answer when the backend fails (docs/requests.md#backend-failure).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailureMode {
    /// Return an error (gRPC `UNAVAILABLE`), so Envoy's `failure_mode_deny` decides.
    #[default]
    Error,
    /// Answer OK with no limits.
    Allow,
    /// Answer OVER_LIMIT.
    Deny,
    /// Decide from this replica's memory with its share of each limit
    /// (`fallback`); a shed call and a quota stream, which have no charge to decide
    /// there, answer as `Error` does.
    Local,
}

/// What stands in for a decision the backend could not make (it failed, or the call was
/// shed): the one reading of the failure mode, for ShouldRateLimit and the quota service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// No answer: gRPC `UNAVAILABLE` (Envoy's `failure_mode_deny` decides), or no quota
    /// assignment (Envoy's `no_assignment_behavior` decides).
    Unavailable,
    /// Admitted: OK without limits, or `ALLOW_ALL`.
    Admit,
    /// Denied: OVER_LIMIT, or `DENY_ALL`.
    Deny,
}

impl FailureMode {
    /// What stands in for a decision under this mode.
    pub fn fallback(self) -> Fallback {
        match self {
            FailureMode::Error | FailureMode::Local => Fallback::Unavailable,
            FailureMode::Allow => Fallback::Admit,
            FailureMode::Deny => Fallback::Deny,
        }
    }

    /// The flag's spelling: `error`, `allow` or `deny`.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureMode::Error => "error",
            FailureMode::Allow => "allow",
            FailureMode::Deny => "deny",
            FailureMode::Local => "local",
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
    /// Global quota mode: every rule weighs as a `quota_mode` rule, so a request is over
    /// limit only when all its limited descriptors are (the reference's `QUOTA_MODE`).
    pub quota_mode: bool,
    /// Capacity of the local over-limit cache; 0 disables it.
    pub local_cache_entries: usize,
    /// Longest time a local cache entry is trusted, so a refund or another replica's view
    /// is seen soon even when the bucket's reset is far away.
    pub local_cache_max_age: Duration,
    /// The accounting of rules that do not set `on_over_limit`, and of limit overrides
    /// (`config::default_accounting`: the rules' source's, or `--on-over-limit`).
    pub accounting: OnOverLimit,
    /// How the keys of denied and near-limit hits are ranked (`/top`).
    pub top: TopOptions,
    /// Under failure mode `local`: how long a silent replica's share stays reserved.
    pub replica_grace: Duration,
}

/// Default `LimiterOptions::local_cache_max_age`.
pub const DEFAULT_LOCAL_CACHE_MAX_AGE: Duration = Duration::from_secs(3);

impl Default for LimiterOptions {
    fn default() -> Self {
        LimiterOptions {
            backend_timeout: crate::backend::DEFAULT_BACKEND_TIMEOUT,
            failure_mode: FailureMode::Error,
            shadow_mode: false,
            quota_mode: false,
            local_cache_entries: 0,
            local_cache_max_age: DEFAULT_LOCAL_CACHE_MAX_AGE,
            accounting: OnOverLimit::Reject,
            top: TopOptions::default(),
            replica_grace: replicas::DEFAULT_GRACE,
        }
    }
}

/// Why a request could not be decided.
#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    /// The backend failed and the failure mode is `error`.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The request would cost more backend work than one request may (see
    /// [`MAX_SLIDING_LOG_WORK`]).
    #[error(transparent)]
    TooCostly(#[from] request::InvalidRequest),
}

/// Most sliding-log entries one request may make the backend walk: a denied sliding-log
/// charge of cost `n` against limit `L` reads up to `min(n, L)` entries to find when room
/// comes back, inside the one script (or lock) that decides the whole request. One full
/// log (the largest `L`) is allowed; 64 of them in one request kept Redis busy for 640 ms,
/// failing every other caller meanwhile.
pub const MAX_SLIDING_LOG_WORK: u64 = 10_000;

/// The rate-limit engine: the active rules, a backend, and the metrics it feeds.
pub struct Limiter {
    rules: ArcSwap<RuleSet>,
    /// Told of every rule reload, so that long-lived quota streams need not poll for one.
    reloads: tokio::sync::watch::Sender<()>,
    /// Rules evaluated beside the live ones that never change an answer.
    candidates: ArcSwapOption<CandidateSet>,
    backend: Arc<dyn Backend>,
    /// Where candidate rules' buckets live: a store of their own where the backend caps
    /// what it holds (`Backend::candidate_store`), else `backend`.
    candidate_backend: Arc<dyn Backend>,
    /// Candidate decisions in flight, at most [`candidate::MAX_IN_FLIGHT`] whatever the
    /// reloads.
    candidate_slots: Arc<tokio::sync::Semaphore>,
    metrics: Arc<Metrics>,
    top: TopKeys,
    cache: Option<OverLimitCache>,
    /// Which replicas share the backend (the quota service's demand, failure mode `local`).
    registry: Arc<Registry>,
    /// Under failure mode `local`: the memory a cut-off replica decides from.
    local: Option<LocalFallback>,
    /// With `--region`: the leases of global rules.
    regions: Option<Arc<Regions>>,
    options: LimiterOptions,
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
            .then(|| OverLimitCache::new(options.local_cache_entries, options.local_cache_max_age));
        metrics.loaded_rules.set(rules.rules().len() as i64);
        metrics.loaded_domains.set(rules.domain_count() as i64);
        let registry = Arc::new(Registry::new(options.replica_grace));
        if options.failure_mode == FailureMode::Local {
            registry.want();
        }
        Limiter {
            rules: ArcSwap::from_pointee(RuleSet::new(rules, false)),
            reloads: tokio::sync::watch::Sender::new(()),
            candidates: ArcSwapOption::empty(),
            candidate_backend: backend
                .candidate_store()
                .unwrap_or_else(|| Arc::clone(&backend)),
            candidate_slots: Arc::new(tokio::sync::Semaphore::new(candidate::MAX_IN_FLIGHT)),
            backend,
            metrics,
            top: TopKeys::new(options.top),
            cache,
            registry: Arc::clone(&registry),
            local: (options.failure_mode == FailureMode::Local)
                .then(|| LocalFallback::new(registry)),
            regions: None,
            options,
        }
    }

    /// The limiter deciding global rules within `regions`' lease.
    pub fn with_regions(self, regions: Arc<Regions>) -> Limiter {
        Limiter {
            regions: Some(regions),
            ..self
        }
    }

    /// With `--region`: the leases of global rules.
    pub fn regions(&self) -> Option<&Arc<Regions>> {
        self.regions.as_ref()
    }

    /// Under failure mode `local`: the memory a cut-off replica decides from.
    pub fn local_fallback(&self) -> Option<&LocalFallback> {
        self.local.as_ref()
    }

    /// Which replicas share the backend; its heartbeat runs where the backend is shared
    /// (`server`).
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// Swaps in new rules atomically; requests in flight finish on the old ones.
    pub fn replace_rules(&self, rules: Matcher) {
        self.metrics.loaded_rules.set(rules.rules().len() as i64);
        self.metrics.loaded_domains.set(rules.domain_count() as i64);
        self.rules.store(Arc::new(RuleSet::new(rules, false)));
        self.metrics.retain_rules(self.rules.load().matcher.rules());
        self.retain_ranked();
        // A changed limit may have room where the old one had none.
        if let Some(cache) = &self.cache {
            cache.clear();
        }
        self.reloads.send_replace(());
    }

    /// Wakes on every rule reload after this call: subscribe before reading [`Self::rules`]
    /// and no reload goes unseen.
    pub fn rule_reloads(&self) -> tokio::sync::watch::Receiver<()> {
        self.reloads.subscribe()
    }

    /// The accounting that rules which do not set `on_over_limit` take
    /// ([`config::apply_default_accounting`](crate::config::apply_default_accounting) gives
    /// it to newly loaded rules).
    pub fn accounting(&self) -> OnOverLimit {
        self.options.accounting
    }

    /// The active rules.
    pub fn rules(&self) -> Arc<Matcher> {
        Arc::clone(&self.rules.load().matcher)
    }

    /// What a failed backend answers (shed calls answer the same).
    pub fn failure_mode(&self) -> FailureMode {
        self.options.failure_mode
    }

    /// The metrics this limiter feeds.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The keys of denied and near-limit hits, ranked per rule.
    pub fn top(&self) -> &TopKeys {
        &self.top
    }

    /// Swaps in candidate rules (`None`: none); the live rules and answers are untouched.
    pub fn replace_candidates(&self, rules: Option<Matcher>) {
        let set = rules.map(|rules| Arc::new(CandidateSet::new(rules, &self.metrics)));
        if set.is_none() {
            self.metrics.candidates.clear();
        }
        self.candidates.store(set);
        self.retain_ranked();
    }

    /// The candidate rules, if any are loaded.
    pub fn candidates(&self) -> Option<Arc<Matcher>> {
        let set = self.candidates.load();
        set.as_ref().map(|set| Arc::clone(&set.rules.matcher))
    }

    /// Drops the rankings of rules no longer loaded, live or candidate.
    fn retain_ranked(&self) {
        let live = self.rules.load();
        let candidates = self.candidates.load();
        self.top.retain(|name| {
            let set = if name.candidate {
                match candidates.as_ref() {
                    Some(set) => &set.rules,
                    None => return false,
                }
            } else {
                &live
            };
            set.matcher.rules().iter().any(|rule| {
                rule.domain == name.domain && rule.path == name.path && rule.name == name.name
            })
        });
    }

    /// Decides a validated request for `caller`: backend work never outlives its deadline
    /// nor `backend_timeout`, and a backend queue serves its connection in turn.
    ///
    /// All-or-nothing: the backend decides the request's charges as one group, and when the
    /// request ends over limit none of its `reject` bookings stand (docs/requests.md).
    ///
    /// # Errors
    /// `LimitError::Backend` when the backend fails and the failure mode is `error`.
    pub async fn should_rate_limit(
        &self,
        request: &Request,
        caller: Caller,
    ) -> Result<Response, LimitError> {
        let work_ends = overload::work_ends_within(
            caller.deadline,
            Instant::now(),
            self.options.backend_timeout,
        );
        let mut slots: Vec<Slot> = {
            let rules = self.rules.load();
            self.plan(&rules, request)
                .into_iter()
                .map(|plan| Slot {
                    plan,
                    outcome: None,
                    asked_at: None,
                })
                .collect()
        };
        check_sliding_log_work(&slots)?;
        let mut prior = Tally::default();
        for (slot, descriptor) in slots.iter_mut().zip(&request.descriptors) {
            slot.decide_locally(self.cache.as_ref(), &self.metrics, &descriptor.entries);
            if let (Some(limited), Some(outcome)) = (slot.limited(), &slot.outcome) {
                prior.add(limited.weight, outcome.allowed);
            }
        }
        // While replicas are silent (failure mode `local`), Redis decides with the live
        // replicas' share; a charge whose share rounds to nothing is denied here.
        let reserved = self.local.as_ref().and_then(LocalFallback::reserved);
        let (mut pending, mut items) = (Vec::new(), Vec::new());
        for (i, slot) in slots.iter_mut().enumerate() {
            let Some(item) = slot.pending_item() else {
                continue;
            };
            if reserved.is_some_and(|share| share.apply(&item).is_none()) {
                prior.add(item.weight, false);
                slot.outcome = Some(always_over(&item.charge.policy));
                continue;
            }
            pending.push(i);
            items.push(item);
        }
        let group = (!pending.is_empty()).then(|| Group {
            items,
            prior,
            admit: self.options.shadow_mode,
            keep_on_failure: self.options.failure_mode == FailureMode::Allow,
            deadline: caller.deadline,
            connection: caller.connection,
        });
        // The candidates' charges go beside the live ones, in a task the live answer never
        // waits for; it is told whether the live answer denied.
        let live_verdict = self.candidates.load_full().and_then(|candidates| {
            let trials = candidates.trials(request, &self.top);
            let backend = Arc::clone(&self.candidate_backend);
            let metrics = Arc::clone(&self.metrics);
            let slots = &self.candidate_slots;
            (!trials.is_empty())
                .then(|| candidates.spawn(slots, backend, metrics, trials, work_ends))?
        });
        let asked_at = Instant::now();
        let live = match &group {
            Some(_) if self.local.as_ref().is_some_and(LocalFallback::is_cut_off) => {
                Some(Err(BackendError::Unavailable("cut off from Redis".into())))
            }
            Some(group) => {
                let result = self.backend_call(work_ends, group, reserved).await;
                if let Some(local) = &self.local {
                    let lost = matches!(
                        result,
                        Err(BackendError::Timeout | BackendError::Unavailable(_))
                    );
                    local.note(!lost);
                }
                Some(result)
            }
            None => None,
        };
        let mut local = false;
        match live {
            Some(Ok(outcomes)) => self.settle(request, &mut slots, &pending, outcomes, asked_at),
            Some(Err(error)) => {
                let decided = match (&self.local, &group) {
                    (Some(fallback), Some(group)) => match &self.regions {
                        // A global rule's share is of the region's lease, not the limit.
                        Some(regions) => {
                            let items = group.items.iter();
                            let held = Group {
                                items: items.map(|item| regions.held_to_last_lease(item)).collect(),
                                ..group.clone()
                            };
                            fallback.decide(&held).await
                        }
                        None => fallback.decide(group).await,
                    },
                    _ => None,
                };
                match decided {
                    Some(Ok(outcomes)) => {
                        self.metrics.failure_mode_used(FailureMode::Local.as_str());
                        // An item whose share rounds to nothing is denied as `L = 0` is.
                        let outcomes = (outcomes.into_iter().zip(&pending))
                            .map(|(outcome, &i)| outcome.or_else(|| slots[i].zero_outcome()))
                            .collect::<Option<Vec<Outcome>>>()
                            .unwrap_or_default();
                        self.settle(request, &mut slots, &pending, outcomes, asked_at);
                        local = true;
                    }
                    _ => self.apply_failure_mode(error, &mut slots, &pending)?,
                }
            }
            None => {}
        }
        let mut response = self.finish(&slots);
        response.local = local;
        if let Some(verdict) = live_verdict {
            let _ = verdict.send(response.overall == Code::OverLimit);
        }
        Ok(response)
    }

    /// Records the `outcomes` of the `pending` slots' charges, asked at `asked_at`.
    fn settle(
        &self,
        request: &Request,
        slots: &mut [Slot],
        pending: &[usize],
        outcomes: Vec<Outcome>,
        asked_at: Instant,
    ) {
        for (&i, outcome) in pending.iter().zip(outcomes) {
            let slot = &mut slots[i];
            if let Some(limited) = slot.limited() {
                limited.record(&outcome, false, &request.descriptors[i].entries);
            }
            slot.outcome = Some(outcome);
            slot.asked_at = Some(asked_at);
        }
    }

    /// Resolves every descriptor to a plan, applying `replaces` across the request.
    fn plan(&self, rules: &RuleSet, request: &Request) -> Vec<Plan> {
        let domain = request.domain.as_str();
        if !rules.matcher.has_domain(domain) {
            return request
                .descriptors
                .iter()
                .map(|_| Plan::Done(Status::unmatched()))
                .collect();
        }
        let resolved: Vec<Option<Resolved>> = request
            .descriptors
            .iter()
            .map(|descriptor| {
                resolve(
                    rules,
                    &self.metrics,
                    &self.top,
                    self.options.accounting,
                    domain,
                    descriptor,
                )
            })
            .collect();
        // Owned, as the resolved descriptors are then consumed; rules rarely replace others.
        let replaced: HashSet<String> = resolved
            .iter()
            .flatten()
            .filter(|resolved| matches!(resolved.rule.limit, Limit::Limited(_)))
            .flat_map(|resolved| resolved.rule.replaces.iter().cloned())
            .collect();
        resolved
            .into_iter()
            .zip(&request.descriptors)
            .map(|(resolved, descriptor)| {
                let Some(Resolved {
                    rule,
                    bucket,
                    counters,
                    ranking,
                }) = resolved
                else {
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
                let weight = Weight {
                    quota: rule.quota_mode || self.options.quota_mode,
                    shadow: rule.shadow_mode,
                };
                let lease = self.lease(&rule, domain, bucket, &policy, descriptor.cost);
                let limited = Limited {
                    rule,
                    policy,
                    bucket,
                    cost: descriptor.cost,
                    counters,
                    weight,
                    ranking,
                    lease,
                };
                if policy.requests_per_unit == 0 {
                    Plan::Zero(limited)
                } else {
                    Plan::Charge(limited)
                }
            })
            .collect()
    }

    /// A global rule's base lease in this region, counting `cost` in its demand; `None`
    /// for a rule of one region, or without `--region`.
    fn lease(
        &self,
        rule: &Rule,
        domain: &str,
        bucket: crate::backend::BucketKey,
        policy: &Policy,
        cost: u64,
    ) -> Option<u32> {
        let regions = self.regions.as_ref()?;
        let global = rule.global || regions.is_global_domain(domain);
        (global && policy.requests_per_unit > 0)
            .then(|| regions.offered(bucket, policy, rule.display_name(), cost))
    }

    /// Runs the request's backend call, ending at `limit`, with `reserved` of each limit
    /// when some, and checks its answer's shape.
    async fn backend_call(
        &self,
        limit: Instant,
        group: &Group,
        reserved: Option<Share>,
    ) -> Result<Vec<Outcome>, BackendError> {
        let held;
        let group = match reserved {
            Some(share) => {
                held = fallback::scaled(group, share);
                &held
            }
            None => group,
        };
        let started = Instant::now();
        // A child of the call's span when it is traced; a disabled span (no allocation)
        // otherwise.
        let span = otel::backend_span(group.items.len());
        let call = tokio::time::timeout_at(limit, self.backend.decide(group));
        let result = match tracing::Instrument::instrument(call, span.clone()).await {
            Ok(Ok(outcomes)) if outcomes.len() != group.items.len() => {
                Err(BackendError::failed(format!(
                    "{} outcomes for {} charges",
                    outcomes.len(),
                    group.items.len()
                )))
            }
            Ok(result) => result,
            Err(_) => Err(BackendError::Timeout),
        };
        Metrics::observe(&self.metrics.backend_latency, started.elapsed());
        match &result {
            // Refused by the backend's queue under overload: shed, not failed.
            Err(BackendError::Overloaded) => self.metrics.shed(ShedReason::Backlog),
            Err(error) => {
                self.metrics.backend_error(error.kind());
                otel::record_backend_error(&span, error.kind());
            }
            Ok(outcomes) => {
                // A rejected request whose booking could not be undone keeps it.
                if group.rejects(outcomes) {
                    let unrefunded = group
                        .items
                        .iter()
                        .zip(outcomes)
                        .filter(|(item, outcome)| undoable(item, outcome) && !outcome.rolled_back)
                        .count();
                    self.metrics.refund_errors.inc_by(unrefunded as u64);
                }
            }
        }
        result
    }

    /// Builds the statuses and the overall code, and caches proven exhaustion.
    fn finish(&self, slots: &[Slot]) -> Response {
        let mut tally = Tally::default();
        for slot in slots {
            if let (Some(limited), Some(outcome)) = (slot.limited(), &slot.outcome) {
                tally.add(limited.weight, outcome.allowed);
            }
        }
        // Under global shadow mode the request is admitted, so its bookings stand.
        let rejected = tally.rejects() && !self.options.shadow_mode;
        if let Some(cache) = &self.cache {
            for slot in slots {
                let (Some(limited), Some(outcome), Some(asked_at)) =
                    (slot.limited(), &slot.outcome, slot.asked_at)
                else {
                    continue;
                };
                if !outcome.rolled_back && limited.proves_exhausted(outcome) {
                    cache.insert(limited.bucket, limited.policy, asked_at, outcome.reset_ms);
                }
            }
        }
        Response {
            local: false,
            overall: if rejected { Code::OverLimit } else { Code::Ok },
            statuses: slots.iter().map(|slot| slot.status(rejected)).collect(),
        }
    }

    /// Applies the failure mode to a backend error for the descriptors that needed the
    /// backend; everything decided without it (unmatched, unlimited, `L = 0`, cached) stands,
    /// and `finish` then applies shadow modes as for any answer.
    fn apply_failure_mode(
        &self,
        error: BackendError,
        slots: &mut [Slot],
        pending: &[usize],
    ) -> Result<(), LimitError> {
        let mode = self.options.failure_mode;
        self.metrics.failure_mode_used(mode.as_str());
        // Debug, not warn: during an outage this fires per request; health logs the outage
        // once and the failure_mode and backend_errors metrics count every case.
        tracing::debug!(%error, mode = mode.as_str(), "backend failed; applying the failure mode");
        match mode.fallback() {
            Fallback::Unavailable => return Err(LimitError::Backend(error)),
            // No outcome: `Slot::status` answers without limits.
            Fallback::Admit => {}
            Fallback::Deny => {
                for &i in pending {
                    let slot = &mut slots[i];
                    slot.outcome = slot.limited().map(|limited| always_over(&limited.policy));
                }
            }
        }
        Ok(())
    }
}

/// Refuses a request whose sliding-log charges could make the backend walk more than
/// [`MAX_SLIDING_LOG_WORK`] entries.
fn check_sliding_log_work(slots: &[Slot]) -> Result<(), LimitError> {
    let work: u64 = slots
        .iter()
        .filter_map(|slot| match &slot.plan {
            Plan::Charge(limited) if limited.policy.algorithm == Algorithm::SlidingLog => Some(
                limited
                    .cost
                    .min(u64::from(limited.policy.requests_per_unit)),
            ),
            _ => None,
        })
        .sum();
    if work > MAX_SLIDING_LOG_WORK {
        return Err(LimitError::TooCostly(request::InvalidRequest(format!(
            "the sliding-log descriptors' costs add up to {work} (each counted up to its \
             limit); one request may cost at most {MAX_SLIDING_LOG_WORK}"
        ))));
    }
    Ok(())
}

/// The outcome of a rule with `L = 0`: denied until the current window ends (wall clock).
/// Also the budget RLQS reports for such a rule.
pub fn always_over(policy: &Policy) -> Outcome {
    let now_ms = u64::try_from(SystemClock.now_ms()).unwrap_or(0);
    let window = policy.window_ms().max(1);
    Outcome {
        allowed: false,
        remaining: 0,
        reset_ms: window - now_ms % window,
        now_ms: 0,
        booked: false,
        rolled_back: false,
    }
}

#[cfg(test)]
mod tests;
