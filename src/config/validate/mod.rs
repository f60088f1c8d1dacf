//! Raw model -> validated [`DomainRules`], collecting every error with its document path.
//!
//! The checks mirror envoyproxy/ratelimit's loader (empty key, duplicate composite keys, unit
//! rules, `replaces` rules) and add floodgate's: extensions must make sense for the algorithm,
//! and every policy must stay exact in the Lua scripts. Validation never stops at the first
//! problem: an operator fixing a file sees all of them at once.
//!
//! A file may arrive partly read (see `recover`): values lost to an unknown key or a wrong
//! type are [`Unreadable`]. Errors at or below such a path are dropped (they would repeat
//! the reported one), and checks that depend on a lost value are skipped rather than run
//! on its default: the rule they would judge is not the one the operator wrote.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::ConfigError;
use super::located::{DocPath, Located};
use super::model::{RawDescriptor, RawDomain, RawRateLimit};
use super::recover::Unreadable;
use crate::matcher::{DescriptorRule, DomainRules};
use crate::rules::{
    Algorithm, Limit, MAX_EXACT_INTEGER, Metadata, OnOverLimit, Policy, Rule, Unit,
};

/// The largest `requests_per_unit` of a `sliding_log` rule: the log holds one entry per
/// admitted request, so its size (memory and script time per call) must stay bounded.
pub const SLIDING_LOG_MAX_REQUESTS: u32 = 10_000;

const UNITS: &str = "second, minute, hour, day, week, month, year";
const ALGORITHMS: &str =
    "fixed_window, token_bucket, gcra, leaky_bucket, sliding_window, sliding_log";

/// Validates one parsed file. `located` supplies the line of each error's path;
/// `unreadable` names the values serde could not read (already reported).
///
/// # Errors
/// Every problem found in the file, in document order.
pub fn domain(
    file: &str,
    raw: RawDomain,
    located: &Located,
    unreadable: &Unreadable,
) -> Result<DomainRules, Vec<ConfigError>> {
    let mut v = Validator {
        file,
        located,
        unreadable,
        domain: String::new(),
        errors: Vec::new(),
    };
    let root = DocPath::default();
    match raw.domain {
        None => v.error(
            &root.key("domain"),
            "missing `domain`: every file names the domain its rules apply to",
        ),
        Some(domain) if domain.trim().is_empty() => {
            v.error(&root.key("domain"), "`domain` must not be empty");
        }
        Some(domain) => v.domain = domain,
    }
    let descriptors = v.level(
        raw.descriptors.unwrap_or_default(),
        &root.key("descriptors"),
        "",
    );
    if v.errors.is_empty() {
        Ok(DomainRules {
            domain: v.domain,
            descriptors,
        })
    } else {
        Err(v.errors)
    }
}

struct Validator<'a> {
    file: &'a str,
    located: &'a Located,
    unreadable: &'a Unreadable,
    domain: String,
    errors: Vec<ConfigError>,
}

impl Validator<'_> {
    fn error(&mut self, path: &DocPath, message: impl Into<String>) {
        if self.unreadable.covers(path) {
            return;
        }
        self.errors.push(ConfigError {
            file: self.file.to_owned(),
            line: self.located.line(path),
            path: path.to_string(),
            message: message.into(),
        });
    }

    /// One level of siblings. `parent` is the rule path of the enclosing node.
    fn level(
        &mut self,
        raws: Vec<RawDescriptor>,
        path: &DocPath,
        parent: &str,
    ) -> Vec<DescriptorRule> {
        // Composite key (`key` or `key_value`, as the reference builds it) -> first index.
        let mut seen: HashMap<String, usize> = HashMap::new();
        let mut level = Vec::with_capacity(raws.len());
        for (index, raw) in raws.into_iter().enumerate() {
            let here = path.index(index);
            // A key or value that could not be read leaves the composite key unknown.
            let unknown = self.unreadable.contains(&here.key("key"))
                || self.unreadable.contains(&here.key("value"));
            let key = match raw.key.as_deref() {
                None => {
                    if !self.unreadable.contains(&here.key("key")) {
                        self.error(&here, "descriptor has no `key`");
                    }
                    ""
                }
                Some("") => {
                    self.error(&here.key("key"), "`key` must not be empty");
                    ""
                }
                Some(key) => key,
            };
            // As in the reference, an empty value is no value: the key-only default node.
            let value = raw.value.as_deref().filter(|value| !value.is_empty());
            let composite = match value {
                Some(value) => format!("{key}_{value}"),
                None => key.to_owned(),
            };
            if !key.is_empty() && !unknown {
                if let Some(&first) = seen.get(&composite) {
                    let first_path = path.index(first);
                    let at = match self.located.line(&first_path) {
                        Some(line) => format!("{first_path} (line {line})"),
                        None => first_path.to_string(),
                    };
                    self.error(
                        &here,
                        format!("duplicate descriptor `{composite}`: {at} already defines it"),
                    );
                } else {
                    seen.insert(composite.clone(), index);
                }
            }
            let rule_path = if parent.is_empty() {
                composite
            } else {
                format!("{parent}.{composite}")
            };
            level.push(self.descriptor(raw, &here, &rule_path));
        }
        level
    }

    fn descriptor(
        &mut self,
        raw: RawDescriptor,
        path: &DocPath,
        rule_path: &str,
    ) -> DescriptorRule {
        let value = raw.value.filter(|value| !value.is_empty());
        let wildcard = value.as_deref().is_some_and(|value| value.contains('*'));
        let value_known = !self.unreadable.contains(&path.key("value"));
        if raw.share_threshold && !wildcard && value_known {
            self.error(
                &path.key("share_threshold"),
                "`share_threshold` needs a wildcard `value` (one containing `*`): it makes every \
                 value matching the pattern share one bucket",
            );
        }
        let mut rule = None;
        if let Some(rate_limit) = raw.rate_limit {
            let rl_path = path.key("rate_limit");
            let limit = self.limit(&rate_limit, &rl_path);
            let name = rate_limit.name.clone().filter(|name| !name.is_empty());
            // A repeated `name` is not known to be the one a `replaces` entry repeats.
            let own_name = name
                .as_deref()
                .filter(|_| !self.unreadable.contains(&rl_path.key("name")));
            let replaces = self.replaces(&rate_limit, own_name, &rl_path);
            rule = limit.map(|limit| {
                Arc::new(Rule {
                    domain: self.domain.clone(),
                    path: rule_path.to_owned(),
                    name,
                    replaces,
                    limit,
                    shadow_mode: raw.shadow_mode,
                    quota_mode: raw.quota_mode || rate_limit.quota_mode,
                    detailed_metric: raw.detailed_metric,
                    value_to_metric: raw.value_to_metric,
                    metadata: raw
                        .metadata
                        .map(|metadata| Arc::new(yaml_metadata(metadata))),
                })
            });
        }
        let children = self.level(
            raw.descriptors.unwrap_or_default(),
            &path.key("descriptors"),
            rule_path,
        );
        DescriptorRule {
            key: raw.key.unwrap_or_default(),
            value,
            share_threshold: raw.share_threshold,
            value_to_metric: raw.value_to_metric,
            rule,
            children,
        }
    }

    fn replaces(
        &mut self,
        rate_limit: &RawRateLimit,
        own_name: Option<&str>,
        path: &DocPath,
    ) -> Vec<String> {
        let mut names = Vec::new();
        for (index, entry) in rate_limit.replaces.iter().flatten().enumerate() {
            let here = path.key("replaces").index(index);
            match entry.name.as_deref() {
                None | Some("") => {
                    self.error(
                        &here.key("name"),
                        "`replaces` entry needs a non-empty `name`",
                    );
                }
                Some(name) if Some(name) == own_name => self.error(
                    &here.key("name"),
                    format!("`replaces` names this rule's own name `{name}`"),
                ),
                Some(name) => names.push(name.to_owned()),
            }
        }
        names
    }

    /// The limit of one `rate_limit`, or `None` after recording why it is invalid.
    fn limit(&mut self, rl: &RawRateLimit, path: &DocPath) -> Option<Limit> {
        let before = self.errors.len();
        let unreadable = self.unreadable;
        let lost = |field: &str| unreadable.contains(&path.key(field));
        if lost("unlimited") {
            // Limited or not: no check applies to both.
            return None;
        }
        // The checks of the whole policy below would judge lost values by their defaults.
        let policy_lost = ["unit", "requests_per_unit", "burst", "unit_multiplier"]
            .into_iter()
            .any(lost);
        if rl.unlimited {
            if rl.unit.is_some() {
                self.error(
                    &path.key("unit"),
                    "`unit` together with `unlimited: true`: an unlimited rule has no window; \
                     remove one of them",
                );
            }
            let extensions = [
                ("algorithm", rl.algorithm.is_some()),
                ("burst", rl.burst.is_some()),
                ("unit_multiplier", rl.unit_multiplier.is_some()),
                ("on_over_limit", rl.on_over_limit.is_some()),
                ("lockout_seconds", rl.lockout_seconds.is_some()),
            ];
            for (field, _) in extensions.iter().filter(|(_, set)| *set) {
                self.error(
                    &path.key(field),
                    format!("`{field}` has no effect with `unlimited: true`; remove it"),
                );
            }
            return (self.errors.len() == before).then_some(Limit::Unlimited);
        }

        let unit = match rl.unit.as_deref() {
            None => {
                self.error(
                    &path.key("unit"),
                    format!(
                        "missing `unit` on a limited rule; expected one of: {UNITS} \
                         (or set `unlimited: true`)"
                    ),
                );
                None
            }
            Some(name) => Unit::parse(name).or_else(|| {
                let message = format!("unknown unit `{name}`; expected one of: {UNITS}");
                self.error(&path.key("unit"), message);
                None
            }),
        };
        let algorithm = match rl.algorithm.as_deref() {
            // Unknown, not the default: a `burst` is not misplaced on a lost algorithm.
            _ if lost("algorithm") => None,
            None => Some(Algorithm::FixedWindow),
            Some(name) => Algorithm::parse(name).or_else(|| {
                let message = format!("unknown algorithm `{name}`; expected one of: {ALGORITHMS}");
                self.error(&path.key("algorithm"), message);
                None
            }),
        };
        // Absent means 0, as in the reference: the rule always denies.
        let requests_per_unit = rl.requests_per_unit.unwrap_or(0);
        let burst = match rl.burst {
            None => requests_per_unit,
            Some(0) => {
                self.error(&path.key("burst"), "`burst` must be at least 1");
                0
            }
            Some(burst) => {
                if let Some(other) = algorithm.filter(|a| *a != Algorithm::TokenBucket) {
                    self.error(
                        &path.key("burst"),
                        format!(
                            "`burst` only applies to algorithm token_bucket (or its aliases gcra, \
                             leaky_bucket); this rule uses {other}"
                        ),
                    );
                }
                burst
            }
        };
        let unit_multiplier = match rl.unit_multiplier {
            None => 1,
            Some(0) => {
                self.error(
                    &path.key("unit_multiplier"),
                    "`unit_multiplier` must be at least 1",
                );
                1
            }
            Some(multiplier) => multiplier,
        };
        let on_over_limit = match rl.on_over_limit.as_deref() {
            None => OnOverLimit::Reject,
            Some(mode) if mode.eq_ignore_ascii_case("reject") => OnOverLimit::Reject,
            Some(mode) if mode.eq_ignore_ascii_case("consume") => OnOverLimit::Consume,
            Some(mode) => {
                self.error(
                    &path.key("on_over_limit"),
                    format!("unknown on_over_limit `{mode}`; expected one of: reject, consume"),
                );
                OnOverLimit::Reject
            }
        };
        let lockout = match rl.lockout_seconds {
            None => None,
            Some(0) => {
                self.error(
                    &path.key("lockout_seconds"),
                    "`lockout_seconds` must be at least 1 (omit it for no lockout)",
                );
                None
            }
            Some(seconds) => Some(Duration::from_secs(u64::from(seconds))),
        };
        if algorithm == Some(Algorithm::SlidingLog) {
            if on_over_limit == OnOverLimit::Consume {
                self.error(
                    &path.key("on_over_limit"),
                    "`on_over_limit: consume` is not supported with algorithm sliding_log: its \
                     exact log records admitted requests only",
                );
            }
            if requests_per_unit > SLIDING_LOG_MAX_REQUESTS {
                self.error(
                    &path.key("requests_per_unit"),
                    format!(
                        "sliding_log keeps one entry per request, so requests_per_unit is capped \
                         at {SLIDING_LOG_MAX_REQUESTS} (got {requests_per_unit}); use \
                         sliding_window for larger limits"
                    ),
                );
            }
        }

        let (Some(unit), Some(algorithm)) = (unit, algorithm) else {
            return None;
        };
        if policy_lost {
            return None;
        }
        // Checked here because `Policy::window_ms` would overflow u64 for huge multipliers.
        let window_fits = unit
            .millis()
            .checked_mul(u64::from(unit_multiplier))
            .is_some_and(|window| window <= MAX_EXACT_INTEGER);
        if !window_fits {
            self.error(
                &path.key("unit_multiplier"),
                format!(
                    "a window of {unit_multiplier} x {unit} exceeds 2^53 ms, the largest value \
                     the Lua scripts compute exactly"
                ),
            );
            return None;
        }
        let policy = Policy {
            algorithm,
            unit,
            unit_multiplier,
            requests_per_unit,
            burst,
            on_over_limit,
            lockout,
        };
        if let Err(message) = policy.check_exact_bounds() {
            self.error(path, message);
        }
        (self.errors.len() == before).then_some(Limit::Limited(policy))
    }
}

/// A descriptor's `metadata` as protobuf-`Struct`-like JSON: keys become strings (YAML 1.1
/// allows `yes:` or `1:` keys), tags are dropped, and a number JSON cannot hold (NaN, inf)
/// keeps its YAML spelling as a string.
fn yaml_metadata(mapping: serde_yaml::Mapping) -> Metadata {
    Metadata(
        mapping
            .into_iter()
            .map(|(key, value)| (yaml_key(key), yaml_json(value)))
            .collect(),
    )
}

fn yaml_key(key: serde_yaml::Value) -> String {
    match key {
        serde_yaml::Value::String(text) => text,
        serde_yaml::Value::Bool(flag) => flag.to_string(),
        serde_yaml::Value::Number(number) => number.to_string(),
        serde_yaml::Value::Null => "null".to_owned(),
        serde_yaml::Value::Tagged(tagged) => yaml_key(tagged.value),
        other => serde_yaml::to_string(&other)
            .map(|text| text.trim_end().to_owned())
            .unwrap_or_default(),
    }
}

fn yaml_json(value: serde_yaml::Value) -> serde_json::Value {
    use serde_json::Value as Json;
    match value {
        serde_yaml::Value::Null => Json::Null,
        serde_yaml::Value::Bool(flag) => Json::Bool(flag),
        serde_yaml::Value::Number(number) => number
            .as_i64()
            .map(Json::from)
            .or_else(|| number.as_u64().map(Json::from))
            .or_else(|| {
                number
                    .as_f64()
                    .and_then(serde_json::Number::from_f64)
                    .map(Json::Number)
            })
            .unwrap_or_else(|| Json::String(number.to_string())),
        serde_yaml::Value::String(text) => Json::String(text),
        serde_yaml::Value::Sequence(items) => {
            Json::Array(items.into_iter().map(yaml_json).collect())
        }
        serde_yaml::Value::Mapping(mapping) => Json::Object(yaml_metadata(mapping).0),
        serde_yaml::Value::Tagged(tagged) => yaml_json(tagged.value),
    }
}

#[cfg(test)]
mod tests;
