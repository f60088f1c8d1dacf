//! Every metric floodgate exports, in one place (docs/operations.md#metrics), on a Prometheus
//! registry.
//!
//! Per-rule counters keep the reference service's names
//! (`ratelimit_service_rate_limit_<stat>{domain,key}`), where `key` is the rule path, so the
//! label set is bounded by the config. The client library appends `_total` to counters,
//! which Prometheus treats as the same series.
//!
//! Keys built from what a request sends (`detailed_metric`, `value_to_metric`, limit
//! overrides) would let clients create series without end, so they are bounded: such a key
//! gets its own series only while fewer than `max_series` request-made series exist and the
//! key is at most [`MAX_REQUEST_KEY_BYTES`] long; otherwise its hits fold into the domain's
//! [`OVERFLOW_KEY`] series and `floodgate_metric_series_overflow` counts the fold. A reload
//! drops the series of rules it removed ([`Metrics::retain_rules`]).

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::overload::ShedReason;

mod candidates;
mod rlqs;

use crate::rules::Rule;
pub use candidates::{CandidateCounters, CandidateMetrics};
pub use rlqs::{RLQS_SKIP_REASONS, RLQS_STRATEGIES, RLQS_STREAM_END_REASONS, RlqsMetrics};

/// Default of `--max-metric-series`: request-made per-rule series (each key is six series,
/// one per per-rule counter), so about 1,666 keys and well under 1 MB of `/metrics`.
pub const DEFAULT_MAX_METRIC_SERIES: usize = 10_000;
/// Longest request-made metric key kept as its own series; longer ones fold into
/// [`OVERFLOW_KEY`]. Bounds the memory of each series next to their number.
pub const MAX_REQUEST_KEY_BYTES: usize = 256;
/// The `key` label request-made series fold into past the cap.
pub const OVERFLOW_KEY: &str = "_overflow";
/// Series per key: one per per-rule counter.
const SERIES_PER_KEY: usize = 6;

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

/// One per-rule series as [`Metrics::rule_series`] hands it out.
pub struct RuleSeries {
    /// The request's domain.
    pub domain: String,
    /// The rule path or request-made key ([`OVERFLOW_KEY`] past the cap).
    pub key: String,
    /// Its live counters.
    pub counters: Arc<RuleCounters>,
}

/// One per-rule key's counters and what they belong to.
struct Series {
    counters: Arc<RuleCounters>,
    /// The rule path whose removal drops this series; `None` for series of the domain itself
    /// (limit overrides, the overflow series).
    rule: Option<String>,
    /// Whether the key came from a request, so it counts against the cap.
    request_made: bool,
}

/// Every per-rule key in use: domain -> key -> series, looked up with borrowed strings so a
/// hit allocates nothing.
#[derive(Default)]
struct SeriesIndex {
    domains: HashMap<String, HashMap<String, Series>>,
    /// Request-made keys held now.
    request_made: usize,
}

/// The whole metric set, shared by the limiter, service, admin and reloader.
pub struct Metrics {
    registry: Registry,
    per_rule: PerRuleFamilies,
    series: RwLock<SeriesIndex>,
    /// Most request-made per-rule series (six per key) before keys fold into the overflow.
    max_series: usize,
    /// Reads the memory backend's eviction count at scrape time, once one is attached.
    evictions: Arc<EvictionsCollector>,
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
    /// Replicas the registry of failure mode `local` heard from lately (`live`), and within
    /// the grace that keeps a silent replica's share reserved (`known`).
    pub replicas: Family<KindLabels, Gauge>,
    /// Lease moved between regions, in a limit's units, by kind (`granted`, `received`).
    pub region_transfers: Family<KindLabels, Counter>,
    /// Peer regions by kind (`reachable`, `unreachable`), as the latest period saw them.
    pub region_peers: Family<KindLabels, Gauge>,
    /// Global buckets this replica tracks.
    pub region_buckets: Gauge,
    /// Domains in the active config (0: no limit applies, e.g. an empty xDS snapshot).
    pub loaded_domains: Gauge,
    /// Decisions answered from the local over-limit cache.
    pub local_cache_hits: Counter,
    /// Requests rejected as invalid before evaluation.
    pub invalid_requests: Counter,
    /// Answers by code: `OK`, `OVER_LIMIT`, `INVALID_ARGUMENT`, `UNAVAILABLE`.
    pub decisions: Family<CodeLabels, Counter>,
    /// Hits counted in an overflow series because their key could not have its own.
    pub series_overflow: Counter,
    /// 1 while the readiness latch says SERVING, else 0.
    pub ready: Gauge,
    /// Calls answered at once by the failure mode because they could not be served in
    /// time, by reason ([`ShedReason`]).
    pub shed: Family<ReasonLabels, Counter>,
    /// StatsD lines not handed to the socket (server down, slow or unreachable).
    pub statsd_dropped: Counter,
    /// Streams (`RST_STREAM`) and connections (`GOAWAY` with an error) the HTTP/2 layer
    /// reset, by error code (`crate::listener` counts them as they are sent).
    pub http2_resets: Family<Http2ResetLabels, Counter>,
    /// The quota service's (RLQS) streams, buckets, reports and assignments.
    pub rlqs: RlqsMetrics,
    /// What the candidate rules (`--candidate-config`) would have decided.
    pub candidates: CandidateMetrics,
}

/// Labels of the HTTP/2 reset counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Http2ResetLabels {
    /// `stream` or `connection`.
    pub kind: &'static str,
    /// The HTTP/2 error code's name, e.g. `PROTOCOL_ERROR`, `REFUSED_STREAM`.
    pub code: String,
}

/// Labels of the shed counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// Why: `deadline`, `queue`, `fair_share` or `backlog`.
    pub reason: &'static str,
}

/// Labels of the decision counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabels {
    /// The answer: `OK`, `OVER_LIMIT`, `INVALID_ARGUMENT` or `UNAVAILABLE`.
    pub code: &'static str,
}

/// Every decision code, so each series exists (at 0) before its first answer.
pub const DECISION_CODES: [&str; 4] = ["OK", "OVER_LIMIT", "INVALID_ARGUMENT", "UNAVAILABLE"];

/// A source of the memory backend's eviction count.
type EvictionSource = Box<dyn Fn() -> Option<u64> + Send + Sync>;

/// Exports `floodgate_memory_evictions` from the backend's own count at each scrape, so the
/// backend keeps one counter and needs no handle into the metrics.
#[derive(Default)]
struct EvictionsCollector {
    source: RwLock<Option<EvictionSource>>,
}

impl fmt::Debug for EvictionsCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("EvictionsCollector")
    }
}

impl Collector for EvictionsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let Some(count) = self.source.read().as_ref().and_then(|source| source()) else {
            return Ok(());
        };
        let counter = ConstCounter::new(count);
        let metric = encoder.encode_descriptor(
            "floodgate_memory_evictions",
            "Live buckets the memory backend dropped to respect --memory-max-buckets",
            None,
            counter.metric_type(),
        )?;
        counter.encode(metric)
    }
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

impl PerRuleFamilies {
    /// Drops one key's series from every per-rule family.
    fn remove(&self, labels: &RuleLabels) {
        for family in [
            &self.total_hits,
            &self.over_limit,
            &self.near_limit,
            &self.within_limit,
            &self.shadow_mode,
            &self.over_limit_with_local_cache,
        ] {
            family.remove(labels);
        }
    }
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
    /// Builds and registers every metric, with the default cap on request-made series.
    pub fn new() -> Metrics {
        Metrics::with_max_series(DEFAULT_MAX_METRIC_SERIES)
    }

    /// Builds and registers every metric; at most `max_series` request-made per-rule series
    /// (six per key) exist at once.
    pub fn with_max_series(max_series: usize) -> Metrics {
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
        let evictions = Arc::new(EvictionsCollector::default());
        registry.register_collector(Box::new(Arc::clone(&evictions)));
        let metrics = Metrics {
            per_rule,
            series: RwLock::default(),
            max_series,
            evictions,
            request_latency: latency_histogram(),
            backend_latency: latency_histogram(),
            backend_errors: Family::default(),
            failure_mode: Family::default(),
            refund_errors: Counter::default(),
            config_load_success: Counter::default(),
            config_load_error: Counter::default(),
            loaded_rules: Gauge::default(),
            replicas: Family::default(),
            region_transfers: Family::default(),
            region_peers: Family::default(),
            region_buckets: Gauge::default(),
            loaded_domains: Gauge::default(),
            local_cache_hits: Counter::default(),
            invalid_requests: Counter::default(),
            decisions: Family::default(),
            series_overflow: Counter::default(),
            ready: Gauge::default(),
            shed: Family::default(),
            statsd_dropped: Counter::default(),
            http2_resets: Family::default(),
            rlqs: RlqsMetrics::default(),
            candidates: CandidateMetrics::default(),
            registry: Registry::default(),
        };
        for code in DECISION_CODES {
            let _ = metrics.decisions.get_or_create(&CodeLabels { code });
        }
        // The resets of malformed calls exist at 0, so a rate over them works from the start.
        for kind in ["stream", "connection"] {
            let _ = metrics.http2_resets.get_or_create(&Http2ResetLabels {
                kind,
                code: "PROTOCOL_ERROR".to_owned(),
            });
        }
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
            "loaded_domains",
            "Domains in the active config; 0 means no rate limit applies",
            metrics.loaded_domains.clone(),
        );
        fg.register(
            "replicas",
            "Replicas sharing the limits under failure mode local, by kind (live, known)",
            metrics.replicas.clone(),
        );
        fg.register(
            "region_transfers",
            "Lease moved between regions, in a limit's units, by kind (granted, received)",
            metrics.region_transfers.clone(),
        );
        fg.register(
            "region_peers",
            "Peer regions by kind (reachable, unreachable)",
            metrics.region_peers.clone(),
        );
        fg.register(
            "region_buckets",
            "Global buckets this replica tracks",
            metrics.region_buckets.clone(),
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
        fg.register(
            "decisions",
            "ShouldRateLimit and /json answers by code",
            metrics.decisions.clone(),
        );
        fg.register(
            "metric_series_overflow",
            "Hits counted in an _overflow series: their request-made key found no room",
            metrics.series_overflow.clone(),
        );
        fg.register(
            "ready",
            "1 while ready (gRPC health SERVING, /healthcheck 200), else 0",
            metrics.ready.clone(),
        );
        fg.register(
            "shed",
            "Calls answered at once by the failure mode because they could not be served in time",
            metrics.shed.clone(),
        );
        fg.register(
            "statsd_dropped",
            "StatsD lines not handed to the socket; counter deltas carry to the next flush",
            metrics.statsd_dropped.clone(),
        );
        fg.register(
            "http2_resets",
            "Streams and connections the HTTP/2 layer reset before their calls reached the service",
            metrics.http2_resets.clone(),
        );
        metrics.rlqs.register(fg);
        metrics.candidates.register(fg);
        Metrics {
            registry,
            ..metrics
        }
    }

    /// The counters of a rule path (bounded by the config), created on first use.
    pub fn rule(&self, domain: &str, path: &str) -> Arc<RuleCounters> {
        self.series(domain, Some(path), path)
    }

    /// The counters of `key` in `domain`. `rule` is the path of the configured rule the key
    /// belongs to (`None` for a limit override). A key other than the rule path itself was
    /// built from the request, so it is bounded: past the cap or the length limit it folds
    /// into the domain's [`OVERFLOW_KEY`] series (the caller must only pass known domains).
    pub fn series(&self, domain: &str, rule: Option<&str>, key: &str) -> Arc<RuleCounters> {
        if let Some(series) = self
            .series
            .read()
            .domains
            .get(domain)
            .and_then(|keys| keys.get(key))
        {
            return Arc::clone(&series.counters);
        }
        let request_made = rule != Some(key);
        let mut index = self.series.write();
        if let Some(series) = index.domains.get(domain).and_then(|keys| keys.get(key)) {
            return Arc::clone(&series.counters);
        }
        let room = index.request_made * SERIES_PER_KEY + SERIES_PER_KEY <= self.max_series;
        if request_made && (!room || key.len() > MAX_REQUEST_KEY_BYTES) {
            self.series_overflow.inc();
            return self.create(&mut index, domain, OVERFLOW_KEY, None, false);
        }
        index.request_made += usize::from(request_made);
        self.create(&mut index, domain, key, rule, request_made)
    }

    /// The series of `key`, created and indexed unless it exists.
    fn create(
        &self,
        index: &mut SeriesIndex,
        domain: &str,
        key: &str,
        rule: Option<&str>,
        request_made: bool,
    ) -> Arc<RuleCounters> {
        let keys = index.domains.entry(domain.to_owned()).or_default();
        if let Some(series) = keys.get(key) {
            return Arc::clone(&series.counters);
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
        keys.insert(
            labels.key,
            Series {
                counters: Arc::clone(&counters),
                rule: rule.map(str::to_owned),
                request_made,
            },
        );
        counters
    }

    /// Every per-rule series now held (the capped set `/metrics` shows), copied out so the
    /// caller (the StatsD flush) holds the index lock only while copying.
    pub fn rule_series(&self) -> Vec<RuleSeries> {
        let index = self.series.read();
        let mut all = Vec::with_capacity(index.domains.values().map(HashMap::len).sum());
        for (domain, keys) in &index.domains {
            for (key, series) in keys {
                all.push(RuleSeries {
                    domain: domain.clone(),
                    key: key.clone(),
                    counters: Arc::clone(&series.counters),
                });
            }
        }
        all
    }

    /// Drops the series of domains and rules no longer in `rules` (called on every reload),
    /// so removed rules neither linger in `/metrics` nor hold room under the cap. Series of a
    /// domain that stays (overrides, the overflow) stay with it.
    pub fn retain_rules(&self, rules: &[Arc<Rule>]) {
        let domains: HashSet<&str> = rules.iter().map(|rule| rule.domain.as_str()).collect();
        let paths: HashSet<(&str, &str)> = rules
            .iter()
            .map(|rule| (rule.domain.as_str(), rule.path.as_str()))
            .collect();
        let mut index = self.series.write();
        let mut dropped = 0;
        let families = &self.per_rule;
        index.domains.retain(|domain, keys| {
            let domain_stays = domains.contains(domain.as_str());
            keys.retain(|key, series| {
                let stays = domain_stays
                    && series
                        .rule
                        .as_deref()
                        .is_none_or(|path| paths.contains(&(domain.as_str(), path)));
                if !stays {
                    dropped += usize::from(series.request_made);
                    families.remove(&RuleLabels {
                        domain: domain.clone(),
                        key: key.clone(),
                    });
                }
                stays
            });
            !keys.is_empty()
        });
        index.request_made -= dropped;
    }

    /// Exports `floodgate_memory_evictions` from `source` (the backend's own count; `None`
    /// for backends without evictions) at every scrape.
    pub fn export_evictions(&self, source: impl Fn() -> Option<u64> + Send + Sync + 'static) {
        *self.evictions.source.write() = Some(Box::new(source));
    }

    /// Counts one answer by its code (one of [`DECISION_CODES`]).
    pub fn decided(&self, code: &'static str) {
        self.decisions.get_or_create(&CodeLabels { code }).inc();
    }

    /// Creates every shed reason's series at 0 (shedding is on), so a rate over them works
    /// from the start.
    pub fn shed_reasons_from_zero(&self) {
        for reason in ShedReason::ALL {
            let _ = self.shed.get_or_create(&ReasonLabels {
                reason: reason.as_str(),
            });
        }
    }

    /// Counts one call shed for `reason`.
    pub fn shed(&self, reason: ShedReason) {
        self.shed
            .get_or_create(&ReasonLabels {
                reason: reason.as_str(),
            })
            .inc();
    }

    /// Counts one backend failure.
    pub fn backend_error(&self, kind: &str) {
        self.backend_errors
            .get_or_create(&KindLabels {
                kind: kind.to_owned(),
            })
            .inc();
    }

    /// Sets the replica registry's counts.
    pub fn replicas_seen(&self, live: u32, known: u32) {
        set_by_kind(
            &self.replicas,
            [("live", i64::from(live)), ("known", i64::from(known))],
        );
    }

    /// Counts `amount` of lease moved between regions, `granted` or `received`.
    pub fn region_transfer(&self, kind: &str, amount: u64) {
        self.region_transfers
            .get_or_create(&KindLabels {
                kind: kind.to_owned(),
            })
            .inc_by(amount);
    }

    /// Sets how many peer regions answered the latest period.
    pub fn region_peers_seen(&self, reachable: usize, unreachable: usize) {
        set_by_kind(
            &self.region_peers,
            [
                ("reachable", reachable as i64),
                ("unreachable", unreachable as i64),
            ],
        );
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

/// Sets each `(kind, value)` of a gauge family labelled by kind.
fn set_by_kind<const N: usize>(family: &Family<KindLabels, Gauge>, values: [(&str, i64); N]) {
    for (kind, value) in values {
        family
            .get_or_create(&KindLabels {
                kind: kind.to_owned(),
            })
            .set(value);
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
