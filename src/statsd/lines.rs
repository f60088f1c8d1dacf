//! What one flush sends: floodgate's metrics under the reference's StatsD names, counters as
//! the change since the last delivered flush, gauges as their value.
//!
//! Names (the reference's gostats scopes):
//! - `ratelimit.service.rate_limit.<domain>.<key>.<stat>` per series, `<stat>` one of
//!   `total_hits`, `over_limit`, `near_limit`, `within_limit`, `shadow_mode`,
//!   `over_limit_with_local_cache`; `:`, `|` and control characters in the domain and key
//!   become `_` (the reference replaces `:` and `|`; a newline would split the line);
//! - `ratelimit.service.config_load_success`, `ratelimit.service.config_load_error`,
//!   `ratelimit.service.call.should_rate_limit.redis_error` (every backend error) and
//!   `...service_error` (invalid requests), `ratelimit_server.ShouldRateLimit.total_requests`;
//! - floodgate's own under `floodgate.*` (decisions by code, backend errors by kind, ...).

use std::collections::HashMap;
use std::io::Write;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use super::{Flavor, Tag};
use crate::metrics::{CodeLabels, DECISION_CODES, KindLabels, Metrics, RuleCounters};

/// The reference's scope of per-rule stats.
const RULE_PREFIX: &str = "ratelimit.service.rate_limit";
/// Every kind `BackendError::kind` returns (a test below keeps the list whole).
const BACKEND_ERROR_KINDS: [&str; 4] = ["timeout", "unavailable", "failed", "config"];
/// Every failure mode that can answer a request.
const FAILURE_MODES: [&str; 3] = ["error", "allow", "deny"];

/// Reads one stat of a series.
type ReadStat = fn(&RuleCounters) -> &Counter;

/// The per-rule stats, in the reference's names, with how to read each.
const RULE_STATS: [(&str, ReadStat); 6] = [
    ("total_hits", |c| &c.total_hits),
    ("over_limit", |c| &c.over_limit),
    ("near_limit", |c| &c.near_limit),
    ("within_limit", |c| &c.within_limit),
    ("shadow_mode", |c| &c.shadow_mode),
    ("over_limit_with_local_cache", |c| {
        &c.over_limit_with_local_cache
    }),
];

/// One value to send.
enum Sample {
    /// A running total; the line carries its change.
    Counter(String, u64),
    /// A level; the line carries it as is.
    Gauge(&'static str, i64),
}

/// Writes lines in one flavor, with the configured tags.
pub(super) struct Encoder {
    /// Appended to every name: gostats' `.__key=value` tags (plain StatsD).
    name_suffix: String,
    /// Appended to every line: `|#key:value,...` (DogStatsD).
    line_suffix: String,
}

impl Encoder {
    pub(super) fn new(flavor: Flavor, tags: &[Tag]) -> Encoder {
        let mut sorted: Vec<&Tag> = tags.iter().collect();
        sorted.sort_by(|a, b| a.key.cmp(&b.key));
        let (mut name_suffix, mut line_suffix) = (String::new(), String::new());
        match flavor {
            Flavor::Statsd => {
                for tag in sorted {
                    name_suffix.push_str(".__");
                    name_suffix.push_str(&tag.key);
                    name_suffix.push('=');
                    // In a name, a `:` would end it: gostats writes `_` instead.
                    name_suffix.push_str(&tag.value.replace(':', "_"));
                }
            }
            Flavor::Dogstatsd if !sorted.is_empty() => {
                let tags: Vec<String> = sorted.iter().map(ToString::to_string).collect();
                line_suffix = format!("|#{}", tags.join(","));
            }
            Flavor::Dogstatsd => {}
        }
        Encoder {
            name_suffix,
            line_suffix,
        }
    }

    fn line(&self, out: &mut Vec<u8>, name: &str, value: impl std::fmt::Display, kind: &str) {
        // Writing into a Vec cannot fail.
        let _ = writeln!(
            out,
            "{name}{}:{value}|{kind}{}",
            self.name_suffix, self.line_suffix
        );
    }
}

/// The last value of each counter the socket accepted, by name.
#[derive(Default)]
pub(super) struct Deltas {
    delivered: HashMap<String, u64>,
}

/// One flush's lines and what delivering each one commits.
pub(super) struct Batch {
    payload: Vec<u8>,
    /// End offset of each line in `payload` (past its newline).
    ends: Vec<usize>,
    /// Per line: the counter and the total it reports, or None for a gauge.
    commits: Vec<Option<(String, u64)>>,
    /// The delivered totals after this flush if no line gets through; only names that
    /// still exist, so removed series do not linger.
    next: HashMap<String, u64>,
}

impl Batch {
    pub(super) fn payload(&self) -> &[u8] {
        &self.payload
    }

    pub(super) fn ends(&self) -> &[usize] {
        &self.ends
    }
}

impl Deltas {
    /// The lines of every counter that changed since its last delivered total, and of every
    /// gauge. A total below the delivered one means the series was dropped and made again,
    /// so all of it is new.
    pub(super) fn batch(&self, metrics: &Metrics, encoder: &Encoder) -> Batch {
        let mut batch = Batch {
            payload: Vec::new(),
            ends: Vec::new(),
            commits: Vec::new(),
            next: HashMap::with_capacity(self.delivered.len()),
        };
        for sample in samples(metrics) {
            match sample {
                Sample::Counter(name, total) => {
                    let base = self
                        .delivered
                        .get(&name)
                        .copied()
                        .filter(|&base| base <= total)
                        .unwrap_or(0);
                    if total > base {
                        encoder.line(&mut batch.payload, &name, total - base, "c");
                        batch.ends.push(batch.payload.len());
                        batch.commits.push(Some((name.clone(), total)));
                    }
                    batch.next.insert(name, base);
                }
                Sample::Gauge(name, value) => {
                    encoder.line(&mut batch.payload, name, value, "g");
                    batch.ends.push(batch.payload.len());
                    batch.commits.push(None);
                }
            }
        }
        batch
    }

    /// Records the lines of `batch` the socket accepted (`delivered[i]` for line `i`); the
    /// others' counts stay pending for the next flush. Returns how many lines were dropped.
    pub(super) fn commit(&mut self, batch: Batch, delivered: &[bool]) -> u64 {
        let Batch {
            commits, mut next, ..
        } = batch;
        let mut dropped = 0;
        for (index, commit) in commits.into_iter().enumerate() {
            if !delivered.get(index).copied().unwrap_or(false) {
                dropped += 1;
            } else if let Some((name, total)) = commit {
                next.insert(name, total);
            }
        }
        self.delivered = next;
        dropped
    }
}

/// Every value one flush reports, per-rule series first.
fn samples(metrics: &Metrics) -> Vec<Sample> {
    let series = metrics.rule_series();
    let mut out = Vec::with_capacity(series.len() * RULE_STATS.len() + 24);
    for one in &series {
        let mut stem = format!("{RULE_PREFIX}.");
        push_sanitized(&mut stem, &one.domain);
        stem.push('.');
        push_sanitized(&mut stem, &one.key);
        for (stat, read) in RULE_STATS {
            out.push(Sample::Counter(
                format!("{stem}.{stat}"),
                read(&one.counters).get(),
            ));
        }
    }
    let counter = |name: &str, total: u64| Sample::Counter(name.to_owned(), total);
    let decisions = DECISION_CODES.map(|code| {
        let value = metrics
            .decisions
            .get(&CodeLabels { code })
            .map_or(0, |c| c.get());
        (code, value)
    });
    let backend_errors =
        BACKEND_ERROR_KINDS.map(|kind| (kind, by_kind(&metrics.backend_errors, kind)));
    out.extend([
        counter(
            "ratelimit.service.config_load_success",
            metrics.config_load_success.get(),
        ),
        counter(
            "ratelimit.service.config_load_error",
            metrics.config_load_error.get(),
        ),
        counter(
            "ratelimit.service.call.should_rate_limit.redis_error",
            backend_errors.iter().map(|(_, n)| n).sum(),
        ),
        counter(
            "ratelimit.service.call.should_rate_limit.service_error",
            metrics.invalid_requests.get(),
        ),
        counter(
            "ratelimit_server.ShouldRateLimit.total_requests",
            decisions.iter().map(|(_, n)| n).sum(),
        ),
        counter("floodgate.local_cache_hits", metrics.local_cache_hits.get()),
        counter("floodgate.refund_errors", metrics.refund_errors.get()),
        counter(
            "floodgate.metric_series_overflow",
            metrics.series_overflow.get(),
        ),
        counter("floodgate.statsd_dropped", metrics.statsd_dropped.get()),
    ]);
    for (code, total) in decisions {
        out.push(counter(&format!("floodgate.decisions.{code}"), total));
    }
    for (kind, total) in backend_errors {
        out.push(counter(&format!("floodgate.backend_errors.{kind}"), total));
    }
    for mode in FAILURE_MODES {
        let total = by_kind(&metrics.failure_mode, mode);
        out.push(counter(&format!("floodgate.failure_mode.{mode}"), total));
    }
    out.push(Sample::Gauge("floodgate.ready", metrics.ready.get()));
    out.push(Sample::Gauge(
        "floodgate.loaded_rules",
        metrics.loaded_rules.get(),
    ));
    out
}

fn by_kind(family: &Family<KindLabels, Counter>, kind: &str) -> u64 {
    let labels = KindLabels {
        kind: kind.to_owned(),
    };
    family.get(&labels).map_or(0, |counter| counter.get())
}

/// Appends `part` with `:`, `|` and control characters as `_`: they would end the name or
/// the line.
fn push_sanitized(out: &mut String, part: &str) {
    out.extend(part.chars().map(|c| {
        if c == ':' || c == '|' || c.is_control() {
            '_'
        } else {
            c
        }
    }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::BackendError;

    fn text(batch: &Batch) -> String {
        String::from_utf8(batch.payload().to_vec()).unwrap()
    }

    #[test]
    fn every_backend_error_kind_is_listed() {
        // The match is exhaustive: a new variant fails to compile here until it is listed.
        let all = [
            BackendError::Timeout,
            BackendError::Unavailable(String::new()),
            BackendError::Failed {
                detail: String::new(),
                transient: false,
            },
            BackendError::Config(String::new()),
            BackendError::Overloaded,
        ];
        for error in &all {
            match error {
                BackendError::Timeout
                | BackendError::Unavailable(_)
                | BackendError::Failed { .. }
                | BackendError::Config(_) => assert!(BACKEND_ERROR_KINDS.contains(&error.kind())),
                // Counted as shed (`floodgate_shed`), never as a backend error.
                BackendError::Overloaded => {
                    assert!(!BACKEND_ERROR_KINDS.contains(&error.kind()));
                }
            }
        }
    }

    #[test]
    fn counters_send_their_change_and_undelivered_changes_carry_over() {
        let metrics = Metrics::new();
        let encoder = Encoder::new(Flavor::Statsd, &[]);
        let mut deltas = Deltas::default();
        let rule = metrics.rule("api", "path_/a:b|c");
        rule.total_hits.inc_by(5);
        let batch = deltas.batch(&metrics, &encoder);
        let sent = text(&batch);
        let name = "ratelimit.service.rate_limit.api.path_/a_b_c.total_hits";
        assert!(sent.contains(&format!("{name}:5|c\n")), "{sent}");
        assert!(
            !sent.contains("over_limit:"),
            "zero changes are not sent: {sent}"
        );
        assert!(sent.contains("floodgate.ready:0|g\n"), "{sent}");
        let lines = batch.ends().len();
        assert_eq!(deltas.commit(batch, &vec![false; lines]), lines as u64);

        rule.total_hits.inc_by(2);
        let batch = deltas.batch(&metrics, &encoder);
        assert!(text(&batch).contains(&format!("{name}:7|c\n")));
        let lines = batch.ends().len();
        assert_eq!(deltas.commit(batch, &vec![true; lines]), 0);

        rule.total_hits.inc();
        let batch = deltas.batch(&metrics, &encoder);
        assert!(text(&batch).contains(&format!("{name}:1|c\n")));
    }

    #[test]
    fn tags_follow_the_flavor() {
        let tags: Vec<Tag> = ["zone:a:1", "env:prod"]
            .iter()
            .map(|t| t.parse().unwrap())
            .collect();
        let mut out = Vec::new();
        Encoder::new(Flavor::Statsd, &tags).line(&mut out, "x.y", 3, "c");
        Encoder::new(Flavor::Dogstatsd, &tags).line(&mut out, "x.y", 3, "c");
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "x.y.__env=prod.__zone=a_1:3|c\nx.y:3|c|#env:prod,zone:a:1\n"
        );
    }
}
