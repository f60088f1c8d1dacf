//! The operator's views on the admin port: `GET /overview` (the service, its rules and
//! candidate rules with their cumulative counters, shedding, backend errors, RLQS) and
//! `GET /top` (the heaviest denied and near-limit keys per rule), both JSON, and the page
//! at `GET /` that polls them (docs/operations.md#the-admin-page).

use std::collections::HashMap;
use std::fmt::Write as _;

use std::sync::LazyLock;

use base64::Engine as _;
use base64::prelude::BASE64_STANDARD;
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::AdminState;
use crate::metrics::{CodeLabels, DECISION_CODES, KindLabels, RLQS_STRATEGIES, ReasonLabels};
use crate::overload::ShedReason;
use crate::rules::{Algorithm, Limit, Rule};
use crate::top::{Ranked, RuleReading};

/// The page: self-contained (no asset from elsewhere), it polls the two views.
pub const PAGE: &str = include_str!("page.html");

/// Keys per rule and kind `/top` returns unless `?limit=` says otherwise.
const DEFAULT_TOP_LIMIT: usize = 10;
/// Most keys per rule and kind one `/top` answer lists, whatever `?limit=` asks.
pub const MAX_TOP_LIMIT: usize = 100;
/// Most keys one `/top` answer lists in all (each at most [`crate::top::MAX_SHOWN_BYTES`]
/// of text), so that an answer stays near a megabyte however many rules are ranked: rules
/// past it keep their totals and list no keys, and the answer says `"truncated": true`.
pub const MAX_TOP_KEYS: usize = 4096;

/// The page's Content-Security-Policy: nothing loads from anywhere, the page's own inline
/// script runs by its hash (no other script can), and it may only fetch its own views.
pub fn page_policy() -> &'static str {
    static POLICY: LazyLock<String> = LazyLock::new(|| {
        let script = inline_script(PAGE);
        let hash = BASE64_STANDARD.encode(Sha256::digest(script.as_bytes()));
        format!(
            "default-src 'none'; script-src 'sha256-{hash}'; style-src 'unsafe-inline'; \
             connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; \
             frame-ancestors 'none'"
        )
    });
    &POLICY
}

/// The text of the page's one inline `<script>`.
fn inline_script(page: &str) -> &str {
    let start = page.find("<script>").map_or(0, |at| at + "<script>".len());
    let end = page[start..]
        .find("</script>")
        .map_or(page.len(), |at| start + at);
    &page[start..end]
}

/// `GET /top`'s query.
#[derive(Debug, Deserialize)]
pub struct TopQuery {
    /// Keys per list (1 to the summaries' capacity).
    limit: Option<usize>,
}

/// `GET /top`: per rule (live and candidate), the heaviest denied and near-limit keys of the
/// last 30 to 60 s, and the heaviest denied keys of all live rules together.
pub fn top(state: &AdminState, query: &TopQuery) -> Value {
    let top = state.limiter.top();
    let limit = query
        .limit
        .unwrap_or(DEFAULT_TOP_LIMIT)
        .clamp(1, top.capacity().min(MAX_TOP_LIMIT));
    let (readings, truncated) = top.read_within(limit, MAX_TOP_KEYS);
    let (candidates, live): (Vec<&RuleReading>, Vec<&RuleReading>) =
        readings.iter().partition(|reading| reading.rule.candidate);
    let mut overall: Vec<(&RuleReading, &Ranked)> = live
        .iter()
        .flat_map(|reading| reading.denied.iter().map(move |key| (*reading, key)))
        .collect();
    overall.sort_by(|a, b| {
        b.1.count
            .cmp(&a.1.count)
            .then_with(|| a.1.key.cmp(&b.1.key))
    });
    overall.truncate(limit);
    json!({
        "window_seconds": 2 * crate::top::HALF.as_secs(),
        "values_shown": top.shows_values(),
        "capacity": top.capacity(),
        "limit": limit,
        "truncated": truncated,
        "top": overall.iter().map(|(reading, key)| json!({
            "domain": reading.rule.domain,
            "rule": reading.rule.path,
            "name": reading.rule.name,
            "key": key.key,
            "count": key.count,
            "error": key.error,
        })).collect::<Vec<_>>(),
        "rules": live.iter().map(|reading| reading_json(reading)).collect::<Vec<_>>(),
        "candidates": candidates.iter().map(|reading| reading_json(reading)).collect::<Vec<_>>(),
    })
}

fn reading_json(reading: &RuleReading) -> Value {
    let keys = |ranked: &[Ranked]| -> Vec<Value> {
        ranked
            .iter()
            .map(|key| json!({"key": key.key, "count": key.count, "error": key.error}))
            .collect()
    };
    json!({
        "domain": reading.rule.domain,
        "rule": reading.rule.path,
        "name": reading.rule.name,
        "denied_total": reading.denied_total,
        "near_limit_total": reading.near_limit_total,
        "denied": keys(&reading.denied),
        "near_limit": keys(&reading.near_limit),
    })
}

/// `GET /overview`: what the page shows besides the top keys, as cumulative counters (the
/// page turns two readings into rates).
pub fn overview(state: &AdminState) -> Value {
    let limiter = &state.limiter;
    let metrics = limiter.metrics();
    let series: HashMap<(String, String), _> = metrics
        .rule_series()
        .into_iter()
        .map(|series| ((series.domain, series.key), series.counters))
        .collect();
    let rules: Vec<Value> = limiter
        .rules()
        .rules()
        .iter()
        .map(|rule| {
            let counters = series.get(&(rule.domain.clone(), rule.path.clone()));
            let read =
                |pick: fn(&crate::metrics::RuleCounters) -> u64| counters.map_or(0, |c| pick(c));
            json!({
                "domain": rule.domain,
                "rule": rule.path,
                "name": rule.name,
                "limit": describe_limit(rule),
                "mode": if rule.shadow_mode { "shadow" } else { "enforced" },
                "hits": read(|c| c.total_hits.get()),
                "over_limit": read(|c| c.over_limit.get()),
                "near_limit": read(|c| c.near_limit.get()),
            })
        })
        .collect();
    let candidates: Vec<Value> = limiter
        .candidates()
        .map(|matcher| {
            matcher
                .rules()
                .iter()
                .map(|rule| {
                    let counters = metrics.candidates.counters(&rule.domain, &rule.path);
                    json!({
                        "domain": rule.domain,
                        "rule": rule.path,
                        "name": rule.name,
                        "limit": describe_limit(rule),
                        "hits": counters.hits.get(),
                        "would_deny": counters.over_limit.get(),
                        "live_denied": counters.live_over_limit.get(),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let decisions = counts(DECISION_CODES, |code| {
        metrics.decisions.get_or_create(&CodeLabels { code }).get()
    });
    let shed = counts(ShedReason::ALL.map(ShedReason::as_str), |reason| {
        metrics.shed.get_or_create(&ReasonLabels { reason }).get()
    });
    let kind = |kind: &str| KindLabels {
        kind: kind.to_owned(),
    };
    let backend_errors = counts(crate::backend::BackendError::KINDS, |name| {
        metrics.backend_errors.get_or_create(&kind(name)).get()
    });
    let assignments = counts(RLQS_STRATEGIES, |strategy| {
        metrics
            .rlqs
            .assignments
            .get_or_create(&kind(strategy))
            .get()
    });
    json!({
        "service": {
            "version": env!("CARGO_PKG_VERSION"),
            "uptime_seconds": state.info.started.elapsed().as_secs_f64(),
            "ready": state.health.is_ready(),
            "backend": state.info.backend,
            "config_source": state.info.config_source,
            "failure_mode": limiter.failure_mode().as_str(),
        },
        "decisions": decisions,
        "shed": shed,
        "backend_errors": backend_errors,
        "rules": rules,
        "candidates": candidates,
        "rlqs": {
            "streams": metrics.rlqs.streams.get(),
            "buckets": metrics.rlqs.buckets.get(),
            "reports": metrics.rlqs.reports.get(),
            "assignments": assignments,
        },
        "regions": limiter.regions().map(|regions| regions.overview()),
    })
}

/// A JSON object of one counter per label value, in the given order.
fn counts<const N: usize>(
    names: [&'static str; N],
    count: impl Fn(&'static str) -> u64,
) -> serde_json::Map<String, Value> {
    names
        .into_iter()
        .map(|name| (name.to_owned(), json!(count(name))))
        .collect()
}

/// A rule's limit in words: `10 per second, fixed window`.
pub fn describe_limit(rule: &Rule) -> String {
    let policy = match &rule.limit {
        Limit::Unlimited => return "unlimited".to_owned(),
        Limit::Limited(policy) => policy,
    };
    let mut text = format!("{} per ", policy.requests_per_unit);
    if policy.unit_multiplier > 1 {
        let _ = write!(text, "{} {}s", policy.unit_multiplier, policy.unit.as_str());
    } else {
        text.push_str(policy.unit.as_str());
    }
    let _ = write!(text, ", {}", policy.algorithm.to_string().replace('_', " "));
    if policy.algorithm == Algorithm::TokenBucket {
        let _ = write!(text, ", burst {}", policy.burst);
    }
    text
}
