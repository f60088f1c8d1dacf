//! Validated rule types: what a YAML descriptor becomes once it has passed validation.
//!
//! Nothing here parses strings at request time; `config::validate` builds these once per load
//! and the matcher, limiter and backends only read them.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Largest integer that Redis' Lua (IEEE doubles) represents exactly: 2^53.
///
/// Every quantity a script computes must stay below it, so validation bounds the products of
/// window length, limit and burst against it.
pub const MAX_EXACT_INTEGER: u64 = 1 << 53;

/// Window unit of a rate limit, with the reference service's fixed lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// 1 second.
    Second,
    /// 60 seconds.
    Minute,
    /// 3600 seconds.
    Hour,
    /// 86400 seconds.
    Day,
    /// 7 days, counted from the Unix epoch.
    Week,
    /// 30 days (the reference's fixed month).
    Month,
    /// 365 days (the reference's fixed year).
    Year,
}

impl Unit {
    /// Every unit, in increasing length.
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// Parses a unit name case-insensitively, as the reference service does.
    pub fn parse(name: &str) -> Option<Unit> {
        Unit::ALL
            .into_iter()
            .find(|unit| unit.as_str().eq_ignore_ascii_case(name))
    }

    /// Lower-case name as written in YAML.
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// `requests` per `window_ms` as Envoy's `current_limit` can state it (a count per one
    /// unit, no multiplier): unchanged when the window is this one unit; else the same rate
    /// exactly, in this unit if it can be, or in the smallest unit where it is a whole number
    /// (5 per 5 minutes is 1 per minute, 3 per 5 minutes is 36 per hour); else the largest
    /// whole rate not above it, in the smallest unit where that is at least 1, so a client
    /// is never told more than the real rate.
    pub fn stated_rate(self, requests: u32, window_ms: u64) -> (u32, Unit) {
        let window = u128::from(window_ms.max(1));
        if window == u128::from(self.millis()) {
            return (requests, self);
        }
        let in_unit = |unit: Unit| u128::from(requests) * u128::from(unit.millis());
        let exact = |unit: Unit| {
            let scaled = in_unit(unit);
            (scaled % window == 0)
                .then(|| u32::try_from(scaled / window).ok())
                .flatten()
                .map(|count| (count, unit))
        };
        if let Some(stated) = std::iter::once(self).chain(Unit::ALL).find_map(exact) {
            return stated;
        }
        Unit::ALL
            .into_iter()
            .find_map(|unit| {
                let count = in_unit(unit) / window;
                (count >= 1).then(|| (u32::try_from(count).unwrap_or(u32::MAX), unit))
            })
            .unwrap_or((requests, self))
    }

    /// Length of one unit in milliseconds.
    pub fn millis(self) -> u64 {
        const SECOND: u64 = 1000;
        const DAY: u64 = 86_400 * SECOND;
        match self {
            Unit::Second => SECOND,
            Unit::Minute => 60 * SECOND,
            Unit::Hour => 3600 * SECOND,
            Unit::Day => DAY,
            Unit::Week => 7 * DAY,
            Unit::Month => 30 * DAY,
            Unit::Year => 365 * DAY,
        }
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The counting algorithm of a limited rule (docs/algorithms.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Count per epoch-aligned window; the reference's algorithm.
    FixedWindow,
    /// Integer GCRA with capacity `burst` (aliases `gcra`, `leaky_bucket`).
    TokenBucket,
    /// Weighted previous + current window counter.
    SlidingWindow,
    /// Exact log of admitted timestamps over the last window.
    SlidingLog,
}

impl Algorithm {
    /// Every algorithm, in declaration order. The batch script numbers them from 1 in this
    /// order (lua/batch.lua).
    pub const ALL: [Algorithm; 4] = [
        Algorithm::FixedWindow,
        Algorithm::TokenBucket,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
    ];

    /// Parses a YAML algorithm name, including the aliases of the token bucket.
    pub fn parse(name: &str) -> Option<Algorithm> {
        match name.to_ascii_lowercase().as_str() {
            "fixed_window" => Some(Algorithm::FixedWindow),
            "token_bucket" | "gcra" | "leaky_bucket" => Some(Algorithm::TokenBucket),
            "sliding_window" => Some(Algorithm::SlidingWindow),
            "sliding_log" => Some(Algorithm::SlidingLog),
            _ => None,
        }
    }

    /// Canonical name, used in bucket identities and `/rlconfig`.
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::SlidingLog => "sliding_log",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a rule books when it denies a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum OnOverLimit {
    /// A denied request books nothing, and an over-limit request is refunded everywhere.
    #[default]
    Reject,
    /// The cost is always booked (usage reports sent after the response).
    Consume,
}

/// The numbers an algorithm needs: everything that defines one bucket's behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Policy {
    /// Counting algorithm.
    pub algorithm: Algorithm,
    /// Window unit as configured (reported back to Envoy).
    pub unit: Unit,
    /// Number of units in one window.
    pub unit_multiplier: u32,
    /// `L`: requests allowed per window.
    pub requests_per_unit: u32,
    /// `B`: token-bucket capacity in requests (equals `L` unless configured).
    pub burst: u32,
    /// Whether denials book the cost.
    pub on_over_limit: OnOverLimit,
    /// Once the rule denies, deny everything for this long.
    pub lockout: Option<Duration>,
}

impl Policy {
    /// A plain fixed-window policy, as the reference service would build it.
    pub fn fixed_window(requests_per_unit: u32, unit: Unit) -> Policy {
        Policy {
            algorithm: Algorithm::FixedWindow,
            unit,
            unit_multiplier: 1,
            requests_per_unit,
            burst: requests_per_unit,
            on_over_limit: OnOverLimit::Reject,
            lockout: None,
        }
    }

    /// `W`: the window length in milliseconds.
    pub fn window_ms(&self) -> u64 {
        self.unit.millis() * u64::from(self.unit_multiplier)
    }

    /// Lockout length in milliseconds (0 when the rule has none).
    pub fn lockout_ms(&self) -> u64 {
        self.lockout.map_or(0, |d| d.as_millis() as u64)
    }

    /// Checks that every quantity the algorithm computes stays an exact integer in Lua.
    ///
    /// # Errors
    /// The quantity that the policy takes past 2^53.
    pub fn check_exact_bounds(&self) -> Result<(), InexactPolicy> {
        let window = self.window_ms();
        let limit = u64::from(self.requests_per_unit);
        let bound = |quantity: &'static str, value: Option<u64>| match value {
            Some(v) if v <= MAX_EXACT_INTEGER => Ok(()),
            _ => Err(InexactPolicy { quantity }),
        };
        bound("window length in ms", Some(window))?;
        match self.algorithm {
            Algorithm::FixedWindow => Ok(()),
            Algorithm::TokenBucket => {
                if limit == 0 {
                    return Ok(());
                }
                let unit_cost = window / gcd(window, limit);
                bound(
                    "burst x window / gcd(window, limit)",
                    unit_cost.checked_mul(u64::from(self.burst)),
                )
            }
            Algorithm::SlidingWindow => bound(
                "requests_per_unit x window length in ms",
                limit.checked_mul(window),
            ),
            Algorithm::SlidingLog => Ok(()),
        }
    }
}

/// A policy one of whose quantities the Lua scripts could not compute exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "{quantity} exceeds 2^53, the largest value the Lua scripts compute exactly; use a \
     shorter window or a smaller limit"
)]
pub struct InexactPolicy {
    /// The quantity past the bound, e.g. `window length in ms`.
    pub quantity: &'static str,
}

/// Greatest common divisor (Euclid); `gcd(x, 0) = x`.
pub fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// What a matched rule does with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Limit {
    /// Always OK, remaining `u32::MAX`, no backend call.
    Unlimited,
    /// Counted by a backend under this policy.
    Limited(Policy),
}

/// One configured rate limit: the leaf a descriptor path leads to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Domain of the file the rule came from.
    pub domain: String,
    /// Rule path below the domain, e.g. `path_/login` or `user.remote_address`:
    /// the reference service's stat key without the domain. Bounded by the config.
    pub path: String,
    /// Optional name, reported as `current_limit.name` and targeted by `replaces`.
    pub name: Option<String>,
    /// Names of limits this one replaces when both match in one request.
    pub replaces: Vec<String>,
    /// Unlimited, or the policy to count with.
    pub limit: Limit,
    /// Whether the rule sets `on_over_limit` itself; otherwise its policy takes the
    /// accounting default of where the rule came from ([`Rule::with_default_accounting`]).
    pub sets_accounting: bool,
    /// Report OK even when over the limit (remaining 0); counted as shadow.
    pub shadow_mode: bool,
    /// Over-limit statuses only deny overall when every quota-mode status denies.
    pub quota_mode: bool,
    /// Metric key built from the request's own values (unbounded cardinality, opt-in).
    pub detailed_metric: bool,
    /// Metric key includes runtime values at levels matched by wildcard or key only.
    pub value_to_metric: bool,
    /// The descriptor's free-form `metadata`, returned in the response's dynamic metadata
    /// while the rule is not over its limit (`--response-dynamic-metadata`).
    pub metadata: Option<Arc<Metadata>>,
    /// `scope: global`: one budget across regions, each region deciding within its lease
    /// (`limiter::regions`); otherwise each region's Redis keeps the whole limit.
    pub global: bool,
}

/// A rule's `metadata` mapping as JSON-like data (keys are strings, as in a protobuf
/// `Struct`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Metadata(pub serde_json::Map<String, serde_json::Value>);

/// JSON values hold no NaN (serde_json has no such number), so equality is total.
impl Eq for Metadata {}

impl Rule {
    /// The rule with `default` as its `on_over_limit` when it does not set its own; `None`
    /// when that changes nothing.
    pub fn with_default_accounting(&self, default: OnOverLimit) -> Option<Rule> {
        match self.limit {
            Limit::Limited(policy) if !self.sets_accounting && policy.on_over_limit != default => {
                Some(Rule {
                    limit: Limit::Limited(Policy {
                        on_over_limit: default,
                        ..policy
                    }),
                    ..self.clone()
                })
            }
            _ => None,
        }
    }

    /// The policy of a limited rule.
    pub fn policy(&self) -> Option<&Policy> {
        match &self.limit {
            Limit::Limited(policy) => Some(policy),
            Limit::Unlimited => None,
        }
    }

    /// The label shown for this rule in headers: its name, else its path.
    pub fn display_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.path)
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn multiplied_windows_are_stated_as_honest_rates() {
        let minute = Unit::Minute.millis();
        let cases = [
            (5, Unit::Minute, minute, (5, Unit::Minute)),
            (5, Unit::Minute, 5 * minute, (1, Unit::Minute)),
            (10, Unit::Minute, 2 * minute, (5, Unit::Minute)),
            (3, Unit::Minute, 5 * minute, (36, Unit::Hour)),
            (10, Unit::Second, 10_000, (1, Unit::Second)),
            (120, Unit::Hour, 2 * Unit::Hour.millis(), (60, Unit::Hour)),
            // A week holds 1,440 windows of 7 minutes.
            (3, Unit::Minute, 7 * minute, (4_320, Unit::Week)),
            // 3 per 11 minutes is whole in no unit; 16 per hour is the most not above it.
            (3, Unit::Minute, 11 * minute, (16, Unit::Hour)),
        ];
        for (requests, unit, window, stated) in cases {
            assert_eq!(
                unit.stated_rate(requests, window),
                stated,
                "{requests} per {window} ms"
            );
        }
    }

    use super::*;

    #[test]
    fn units_parse_case_insensitively_with_reference_lengths() {
        assert_eq!(Unit::parse("SECOND"), Some(Unit::Second));
        assert_eq!(Unit::parse("Minute"), Some(Unit::Minute));
        assert_eq!(Unit::parse("fortnight"), None);
        assert_eq!(Unit::Week.millis(), 604_800_000);
        assert_eq!(Unit::Month.millis(), 2_592_000_000);
        assert_eq!(Unit::Year.millis(), 31_536_000_000);
    }

    #[test]
    fn algorithm_aliases_map_to_token_bucket() {
        for alias in ["token_bucket", "GCRA", "leaky_bucket"] {
            assert_eq!(Algorithm::parse(alias), Some(Algorithm::TokenBucket));
        }
        assert_eq!(Algorithm::parse("fixed"), None);
    }

    #[test]
    fn all_lists_every_algorithm_once_in_declaration_order() {
        for (i, algorithm) in Algorithm::ALL.into_iter().enumerate() {
            // Exhaustive: a new algorithm does not compile here until ALL places it.
            let declared = match algorithm {
                Algorithm::FixedWindow => 0,
                Algorithm::TokenBucket => 1,
                Algorithm::SlidingWindow => 2,
                Algorithm::SlidingLog => 3,
            };
            assert_eq!(declared, i);
            assert_eq!(Algorithm::parse(algorithm.as_str()), Some(algorithm));
        }
    }

    #[test]
    fn exact_bounds_reject_token_buckets_lua_cannot_count() {
        let mut policy = Policy::fixed_window(999_983, Unit::Year);
        policy.algorithm = Algorithm::TokenBucket;
        policy.burst = 1_000_000;
        assert!(policy.check_exact_bounds().is_err());
        policy.requests_per_unit = 1000;
        policy.unit = Unit::Second;
        assert!(policy.check_exact_bounds().is_ok());
    }

    #[test]
    fn gcd_handles_zero() {
        assert_eq!(gcd(60_000, 60), 60);
        assert_eq!(gcd(7, 0), 7);
    }
}
