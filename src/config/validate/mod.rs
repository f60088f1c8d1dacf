//! The one validating walk: a file's tree -> [`DomainRules`], every error with its line.
//!
//! The checks mirror envoyproxy/ratelimit's loader (empty key, duplicate composite keys, unit
//! rules, `replaces` rules) and add floodgate's: extensions must make sense for the algorithm,
//! and every policy must stay exact in the Lua scripts. Validation never stops at the first
//! problem: an operator fixing a file sees all of them at once.
//!
//! Values come from `read`, which reports keys and types as it goes. A value the file does
//! not settle is [`Field::Lost`]: checks that depend on it are skipped rather than run on a
//! default, since the rule they would judge is not the one the operator wrote.

mod read;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::ConfigError;
use super::tree::Tree;
use crate::matcher::{DescriptorRule, DomainRules};
use crate::rules::{
    Algorithm, Limit, MAX_EXACT_INTEGER, Metadata, OnOverLimit, Policy, Rule, Unit,
};
use read::{Field, Map, Reader, Shape};

/// The largest `requests_per_unit` of a `sliding_log` rule: the log holds one entry per
/// admitted request, so its size (memory and script time per call) must stay bounded.
pub const SLIDING_LOG_MAX_REQUESTS: u32 = 10_000;

const UNITS: &str = "second, minute, hour, day, week, month, year";
const ALGORITHMS: &str =
    "fixed_window, token_bucket, gcra, leaky_bucket, sliding_window, sliding_log";

/// One file, walked.
pub struct Walked {
    /// The top-level `domain` and its line, whenever it reads as a non-blank string given
    /// once, however broken the rest of the file is.
    pub domain: Option<(String, Option<usize>)>,
    /// The rules, or every error of the file in line order.
    pub rules: Result<DomainRules, Vec<ConfigError>>,
}

/// Validates one parsed file; `file` labels the errors.
pub fn domain(file: &str, tree: &Tree) -> Walked {
    let mut v = Validator {
        read: Reader::new(file, tree),
        domain: String::new(),
    };
    let Some(root) = v.read.root() else {
        let error = ConfigError {
            file: file.to_owned(),
            line: None,
            path: String::new(),
            message: "file is empty; expected a mapping with `domain`".to_owned(),
        };
        return Walked {
            domain: None,
            rules: Err(vec![error]),
        };
    };
    let mut found = None;
    let mut descriptors = Vec::new();
    if let Some(mut root) = root {
        match v.read.text(&mut root, "domain") {
            Field::Absent => v.read.rule(
                &root,
                Some("domain"),
                "missing `domain`: every file names the domain its rules apply to",
            ),
            Field::Is(domain) if domain.trim().is_empty() => {
                v.read
                    .rule(&root, Some("domain"), "`domain` must not be empty");
            }
            Field::Is(domain) => {
                found = Some((domain.clone(), Some(root.line_of("domain"))));
                v.domain = domain;
            }
            Field::Lost => {}
        }
        descriptors = v.level(&mut root, "");
    }
    let rules = if v.read.error_count() > 0 {
        Err(v.read.finish())
    } else {
        Ok(DomainRules {
            domain: v.domain,
            descriptors,
        })
    };
    Walked {
        domain: found,
        rules,
    }
}

struct Validator<'a> {
    read: Reader<'a>,
    domain: String,
}

impl Validator<'_> {
    /// The `descriptors` of `parent`. `rule_parent` is the rule path of the enclosing node.
    fn level(&mut self, parent: &mut Map, rule_parent: &str) -> Vec<DescriptorRule> {
        let items = self.read.list(parent, "descriptors", Shape::Descriptor);
        // Composite key (`key` or `key_value`, as the reference builds it) -> first item.
        let mut seen: HashMap<String, (String, usize)> = HashMap::new();
        let mut level = Vec::with_capacity(items.len());
        for mut map in items.into_iter().flatten() {
            let key = self.read.text(&mut map, "key");
            let value = self.read.text(&mut map, "value");
            let key = match &key {
                Field::Absent => {
                    self.read.rule(&map, None, "descriptor has no `key`");
                    ""
                }
                Field::Is(key) if key.is_empty() => {
                    self.read.rule(&map, Some("key"), "`key` must not be empty");
                    ""
                }
                Field::Is(key) => key,
                Field::Lost => "",
            };
            // A key or value that could not be read leaves the composite key unknown.
            let value_known = !value.is_lost();
            let unknown = key.is_empty() || !value_known;
            // As in the reference, an empty value is no value: the key-only default node.
            let value = value.get().filter(|value| !value.is_empty()).cloned();
            let composite = match &value {
                Some(value) => format!("{key}_{value}"),
                None => key.to_owned(),
            };
            if !unknown {
                match seen.get(&composite) {
                    Some((first, line)) => {
                        let message = format!(
                            "duplicate descriptor `{composite}`: {first} (line {line}) already \
                             defines it"
                        );
                        self.read.rule(&map, None, message);
                    }
                    None => {
                        let first = (map.path.to_string(), map.line());
                        seen.insert(composite.clone(), first);
                    }
                }
            }
            let rule_path = if rule_parent.is_empty() {
                composite
            } else {
                format!("{rule_parent}.{composite}")
            };
            let key = key.to_owned();
            level.push(self.descriptor(map, key, (value, value_known), &rule_path));
        }
        level
    }

    /// `scope`: `region` (the default: each region's Redis keeps the whole limit) or
    /// `global` (one budget across regions); true for `global`.
    fn scope(&mut self, rate_limit: &mut Map) -> bool {
        match self.read.text(rate_limit, "scope") {
            Field::Is(scope) if scope == "global" => true,
            Field::Is(scope) if scope != "region" => {
                self.read.rule(
                    rate_limit,
                    Some("scope"),
                    format!("unknown scope `{scope}`: expected `region` or `global`"),
                );
                false
            }
            _ => false,
        }
    }

    fn descriptor(
        &mut self,
        mut map: Map,
        key: String,
        (value, value_known): (Option<String>, bool),
        rule_path: &str,
    ) -> DescriptorRule {
        let flag = |v: &mut Self, map: &mut Map, field| v.read.flag(map, field) == Field::Is(true);
        let share_threshold = self.read.flag(&mut map, "share_threshold");
        let shadow_mode = flag(self, &mut map, "shadow_mode");
        let detailed_metric = flag(self, &mut map, "detailed_metric");
        let value_to_metric = flag(self, &mut map, "value_to_metric");
        let quota_mode = flag(self, &mut map, "quota_mode");
        let metadata = self.read.metadata(&mut map, "metadata");
        let wildcard = value.as_deref().is_some_and(|value| value.contains('*'));
        if share_threshold == Field::Is(true) && !wildcard && value_known {
            self.read.rule(
                &map,
                Some("share_threshold"),
                "`share_threshold` needs a wildcard `value` (one containing `*`): it makes every \
                 value matching the pattern share one bucket",
            );
        }
        let mut rule = None;
        if let Some(mut rate_limit) = self.read.child(&mut map, "rate_limit", Shape::RateLimit) {
            let name = self.read.text(&mut rate_limit, "name");
            let rl_quota_mode = flag(self, &mut rate_limit, "quota_mode");
            let global = self.scope(&mut rate_limit);
            let limit = self.limit(&mut rate_limit);
            let own_name = name.get().filter(|name| !name.is_empty());
            let replaces = self.replaces(&mut rate_limit, own_name.map(String::as_str));
            rule = limit.map(|(limit, sets_accounting)| {
                Arc::new(Rule {
                    domain: self.domain.clone(),
                    path: rule_path.to_owned(),
                    name: own_name.cloned(),
                    replaces,
                    limit,
                    sets_accounting,
                    shadow_mode,
                    quota_mode: quota_mode || rl_quota_mode,
                    detailed_metric,
                    value_to_metric,
                    metadata: metadata.map(|metadata| Arc::new(Metadata(metadata))),
                    global,
                })
            });
        }
        self.read.descend();
        let children = self.level(&mut map, rule_path);
        self.read.ascend();
        DescriptorRule {
            key,
            value,
            share_threshold: share_threshold == Field::Is(true),
            value_to_metric,
            rule,
            children,
        }
    }

    fn replaces(&mut self, rate_limit: &mut Map, own_name: Option<&str>) -> Vec<String> {
        let mut names = Vec::new();
        for mut entry in self
            .read
            .list(rate_limit, "replaces", Shape::Replaces)
            .into_iter()
            .flatten()
        {
            let problem = match self.read.text(&mut entry, "name") {
                Field::Absent => Some("`replaces` entry needs a non-empty `name`".to_owned()),
                Field::Is(name) if name.is_empty() => {
                    Some("`replaces` entry needs a non-empty `name`".to_owned())
                }
                Field::Is(name) if Some(name.as_str()) == own_name => {
                    Some(format!("`replaces` names this rule's own name `{name}`"))
                }
                Field::Is(name) => {
                    names.push(name);
                    None
                }
                Field::Lost => None,
            };
            if let Some(message) = problem {
                self.read.rule(&entry, Some("name"), message);
            }
        }
        names
    }

    /// The limit of one `rate_limit`, and whether it sets `on_over_limit` itself; `None`
    /// after recording why it is invalid.
    fn limit(&mut self, rl: &mut Map) -> Option<(Limit, bool)> {
        let read = &mut self.read;
        let unlimited = read.flag(rl, "unlimited");
        let unit = read.text(rl, "unit");
        let requests = read.count(rl, "requests_per_unit");
        let algorithm = read.text(rl, "algorithm");
        let burst = read.count(rl, "burst");
        let unit_multiplier = read.count(rl, "unit_multiplier");
        let on_over_limit = read.text(rl, "on_over_limit");
        let lockout_seconds = read.count(rl, "lockout_seconds");
        let sets_accounting = on_over_limit.get().is_some();
        let before = read.error_count();
        let unlimited = match unlimited {
            // Limited or not: no check applies to both.
            Field::Lost => return None,
            unlimited => unlimited == Field::Is(true),
        };
        // The checks of the whole policy below would judge lost values by their defaults.
        let policy_lost =
            unit.is_lost() || requests.is_lost() || burst.is_lost() || unit_multiplier.is_lost();
        if unlimited {
            if unit.get().is_some() {
                read.rule(
                    rl,
                    Some("unit"),
                    "`unit` together with `unlimited: true`: an unlimited rule has no window; \
                     remove one of them",
                );
            }
            let extensions = [
                ("algorithm", algorithm.get().is_some()),
                ("burst", burst.get().is_some()),
                ("unit_multiplier", unit_multiplier.get().is_some()),
                ("on_over_limit", on_over_limit.get().is_some()),
                ("lockout_seconds", lockout_seconds.get().is_some()),
            ];
            for (field, _) in extensions.iter().filter(|(_, set)| *set) {
                read.rule(
                    rl,
                    Some(field),
                    format!("`{field}` has no effect with `unlimited: true`; remove it"),
                );
            }
            return (read.error_count() == before).then_some((Limit::Unlimited, false));
        }

        let unit = match &unit {
            Field::Absent => {
                read.rule(
                    rl,
                    Some("unit"),
                    format!(
                        "missing `unit` on a limited rule; expected one of: {UNITS} \
                         (or set `unlimited: true`)"
                    ),
                );
                None
            }
            Field::Lost => None,
            Field::Is(name) => Unit::parse(name).or_else(|| {
                let message = format!("unknown unit `{name}`; expected one of: {UNITS}");
                read.rule(rl, Some("unit"), message);
                None
            }),
        };
        let algorithm = match &algorithm {
            // Unknown, not the default: a `burst` is not misplaced on a lost algorithm.
            Field::Lost => None,
            Field::Absent => Some(Algorithm::FixedWindow),
            Field::Is(name) => Algorithm::parse(name).or_else(|| {
                let message = format!("unknown algorithm `{name}`; expected one of: {ALGORITHMS}");
                read.rule(rl, Some("algorithm"), message);
                None
            }),
        };
        // Absent means 0, as in the reference: the rule always denies.
        let requests_per_unit = requests.get().copied().unwrap_or(0);
        let burst = match burst {
            Field::Absent | Field::Lost => requests_per_unit,
            Field::Is(0) => {
                read.rule(rl, Some("burst"), "`burst` must be at least 1");
                0
            }
            Field::Is(burst) => {
                if let Some(other) = algorithm.filter(|a| *a != Algorithm::TokenBucket) {
                    read.rule(
                        rl,
                        Some("burst"),
                        format!(
                            "`burst` only applies to algorithm token_bucket (or its aliases gcra, \
                             leaky_bucket); this rule uses {other}"
                        ),
                    );
                }
                burst
            }
        };
        let unit_multiplier = match unit_multiplier {
            Field::Absent | Field::Lost => 1,
            Field::Is(0) => {
                read.rule(
                    rl,
                    Some("unit_multiplier"),
                    "`unit_multiplier` must be at least 1",
                );
                1
            }
            Field::Is(multiplier) => multiplier,
        };
        let on_over_limit = match on_over_limit.get() {
            None => OnOverLimit::Reject,
            Some(mode) if mode.eq_ignore_ascii_case("reject") => OnOverLimit::Reject,
            Some(mode) if mode.eq_ignore_ascii_case("consume") => OnOverLimit::Consume,
            Some(mode) => {
                read.rule(
                    rl,
                    Some("on_over_limit"),
                    format!("unknown on_over_limit `{mode}`; expected one of: reject, consume"),
                );
                OnOverLimit::Reject
            }
        };
        let lockout = match lockout_seconds {
            Field::Absent | Field::Lost => None,
            Field::Is(0) => {
                read.rule(
                    rl,
                    Some("lockout_seconds"),
                    "`lockout_seconds` must be at least 1 (omit it for no lockout)",
                );
                None
            }
            Field::Is(seconds) => Some(Duration::from_secs(u64::from(seconds))),
        };
        if algorithm == Some(Algorithm::SlidingLog) && requests_per_unit > SLIDING_LOG_MAX_REQUESTS
        {
            read.rule(
                rl,
                Some("requests_per_unit"),
                format!(
                    "sliding_log keeps one entry per request, so requests_per_unit is capped at \
                     {SLIDING_LOG_MAX_REQUESTS} (got {requests_per_unit}); use sliding_window \
                     for larger limits"
                ),
            );
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
            read.rule(
                rl,
                Some("unit_multiplier"),
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
        if let Err(inexact) = policy.check_exact_bounds() {
            read.rule(rl, None, inexact.to_string());
        }
        (read.error_count() == before).then_some((Limit::Limited(policy), sets_accounting))
    }
}

#[cfg(test)]
mod tests;
