//! Every metric floodgate exports, in one place (SPEC 5), on a Prometheus registry.
//!
//! Per-rule counters keep the reference service's names
//! (`ratelimit_service_rate_limit_<stat>{domain,key}`), where `key` is the rule path, so the
//! label set is bounded by the config (unless a rule opts into `detailed_metric`). The
//! client library appends `_total` to counters, which Prometheus treats as the same series.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of the per-rule counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleLabels {
    /// The request's domain.
    pub domain: String,
    /// The rule path (the reference's stat key without the domain).
    pub key: String,
}

/// Labels naming a kind or outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// e.g. `timeout`, `unavailable`, `allow`.
    pub kind: String,
}

/// The reference's per-rule stats.
#[derive(Clone, Default)]
pub struct RuleCounters {
    /// Every hit, weighted by cost, rejected ones included.
    pub total_hits: Counter,
    /// Hits denied.
    pub over_limit: Counter,
    /// Hits admitted past 80% of the limit.
    pub near_limit: Counter,
    /// Hits admitted.
    pub within_limit: Counter,
    /// Hits over the limit of a `shadow_mode` rule (reported OK).
    pub shadow_mode: Counter,
    /// Hits denied from the local over-limit cache without a backend call.
    pub over_limit_with_local_cache: Counter,
}

/// The whole metric set, shared by the limiter, service, admin and reloader.
pub struct Metrics {
    registry: Registry,
    per_rule: PerRuleFamilies,
    /// domain -> key -> counters: looked up with borrowed strings, so a hit allocates nothing.
    rule_cache: RwLock<HashMap<String, HashMap<String, Arc<RuleCounters>>>>,
    /// gRPC/JSON request latency, seconds.
    pub request_latency: Histogram,
    /// Backend round-trip latency, seconds.
    pub backend_latency: Histogram,
    /// Backend failures by kind.
    pub backend_errors: Family<KindLabels, Counter>,
    /// Requests answered by the failure mode (`error`, `allow`, `deny`).
    pub failure_mode: Family<KindLabels, Counter>,
    /// Refunds that could not be applied.
    pub refund_errors: Counter,
    /// Successful config loads.
    pub config_load_success: Counter,
    /// Config loads rejected (the previous rules stay).
    pub config_load_error: Counter,
    /// Rules in the active config.
    pub loaded_rules: Gauge,
    /// Decisions answered from the local over-limit cache.
    pub local_cache_hits: Counter,
    /// Requests rejected as invalid before evaluation.
    pub invalid_requests: Counter,
}

#[derive(Clone, Default)]
struct PerRuleFamilies {
    total_hits: Family<RuleLabels, Counter>,
    over_limit: Family<RuleLabels, Counter>,
    near_limit: Family<RuleLabels, Counter>,
    within_limit: Family<RuleLabels, Counter>,
    shadow_mode: Family<RuleLabels, Counter>,
    over_limit_with_local_cache: Family<RuleLabels, Counter>,
}

fn latency_histogram() -> Histogram {
    // 50 us .. ~1.6 s, doubling: covers a local cache hit up to a stuck backend.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Builds and registers every metric.
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let per_rule = PerRuleFamilies::default();
        {
            let rl = registry.sub_registry_with_prefix("ratelimit_service_rate_limit");
            rl.register(
                "total_hits",
                "Hits per rule, weighted by cost",
                per_rule.total_hits.clone(),
            );
            rl.register(
                "over_limit",
                "Hits denied per rule",
                per_rule.over_limit.clone(),
            );
            rl.register(
                "near_limit",
                "Hits admitted past 80% of the limit",
                per_rule.near_limit.clone(),
            );
            rl.register(
                "within_limit",
                "Hits admitted per rule",
                per_rule.within_limit.clone(),
            );
            rl.register(
                "shadow_mode",
                "Over-limit hits of shadow-mode rules",
                per_rule.shadow_mode.clone(),
            );
            rl.register(
                "over_limit_with_local_cache",
                "Hits denied from the local over-limit cache",
                per_rule.over_limit_with_local_cache.clone(),
            );
        }
        let metrics = Metrics {
            per_rule,
            rule_cache: RwLock::default(),
            request_latency: latency_histogram(),
            backend_latency: latency_histogram(),
            backend_errors: Family::default(),
            failure_mode: Family::default(),
            refund_errors: Counter::default(),
            config_load_success: Counter::default(),
            config_load_error: Counter::default(),
            loaded_rules: Gauge::default(),
            local_cache_hits: Counter::default(),
            invalid_requests: Counter::default(),
            registry: Registry::default(),
        };
        let fg = registry.sub_registry_with_prefix("floodgate");
        fg.register(
            "request_latency_seconds",
            "ShouldRateLimit latency",
            metrics.request_latency.clone(),
        );
        fg.register(
            "backend_latency_seconds",
            "Backend round-trip latency",
            metrics.backend_latency.clone(),
        );
        fg.register(
            "backend_errors",
            "Backend failures by kind",
            metrics.backend_errors.clone(),
        );
        fg.register(
            "failure_mode",
            "Requests answered by the failure mode",
            metrics.failure_mode.clone(),
        );
        fg.register(
            "refund_errors",
            "Refunds that could not be applied",
            metrics.refund_errors.clone(),
        );
        fg.register(
            "config_load_success",
            "Config loads applied",
            metrics.config_load_success.clone(),
        );
        fg.register(
            "config_load_error",
            "Config loads rejected",
            metrics.config_load_error.clone(),
        );
        fg.register(
            "loaded_rules",
            "Rules in the active config",
            metrics.loaded_rules.clone(),
        );
        fg.register(
            "local_cache_hits",
            "Decisions answered by the local over-limit cache",
            metrics.local_cache_hits.clone(),
        );
        fg.register(
            "invalid_requests",
            "Requests rejected as invalid",
            metrics.invalid_requests.clone(),
        );
        Metrics {
            registry,
            ..metrics
        }
    }

    /// The counters of one rule (domain, metric key), created on first use.
    pub fn rule(&self, domain: &str, key: &str) -> Arc<RuleCounters> {
        if let Some(counters) = self
            .rule_cache
            .read()
            .get(domain)
            .and_then(|keys| keys.get(key))
        {
            return Arc::clone(counters);
        }
        let labels = RuleLabels {
            domain: domain.to_owned(),
            key: key.to_owned(),
        };
        let families = &self.per_rule;
        let counters = Arc::new(RuleCounters {
            total_hits: families.total_hits.get_or_create(&labels).clone(),
            over_limit: families.over_limit.get_or_create(&labels).clone(),
            near_limit: families.near_limit.get_or_create(&labels).clone(),
            within_limit: families.within_limit.get_or_create(&labels).clone(),
            shadow_mode: families.shadow_mode.get_or_create(&labels).clone(),
            over_limit_with_local_cache: families
                .over_limit_with_local_cache
                .get_or_create(&labels)
                .clone(),
        });
        let mut cache = self.rule_cache.write();
        let keys = cache.entry(labels.domain).or_default();
        Arc::clone(keys.entry(labels.key).or_insert(counters))
    }

    /// Counts one backend failure.
    pub fn backend_error(&self, kind: &str) {
        self.backend_errors
            .get_or_create(&KindLabels {
                kind: kind.to_owned(),
            })
            .inc();
    }

    /// Counts one request answered by the failure mode.
    pub fn failure_mode_used(&self, mode: &str) {
        self.failure_mode
            .get_or_create(&KindLabels {
                kind: mode.to_owned(),
            })
            .inc();
    }

    /// Records a duration in a latency histogram.
    pub fn observe(histogram: &Histogram, elapsed: Duration) {
        histogram.observe(elapsed.as_secs_f64());
    }

    /// The Prometheus/OpenMetrics text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_rule_counters_use_reference_names() {
        let metrics = Metrics::new();
        metrics.rule("api", "path_/login").total_hits.inc_by(3);
        metrics.rule("api", "path_/login").over_limit.inc();
        metrics.backend_error("timeout");
        let text = metrics.encode();
        assert!(text.contains(
            "ratelimit_service_rate_limit_total_hits_total{domain=\"api\",key=\"path_/login\"} 3"
        ));
        assert!(text.contains(
            "ratelimit_service_rate_limit_over_limit_total{domain=\"api\",key=\"path_/login\"} 1"
        ));
        assert!(text.contains("floodgate_backend_errors_total{kind=\"timeout\"} 1"));
    }
}
