//! The algorithm test vectors of `tests/vectors/algorithms.json` (its `about` says what each
//! field means), read into runnable cases. The Rust algorithms (tests/algorithms.rs) and the
//! Lua scripts on a pinned clock (tests/lua.rs) run every case and check every expectation
//! with [`Expect::check`], so each vector is written once for both.

use std::time::Duration;

use floodgate::rules::{Algorithm, OnOverLimit, Policy, Unit};
use serde::Deserialize;

const TABLE: &str = include_str!("../../vectors/algorithms.json");

/// One vector on one algorithm: a fresh bucket, its policy and the steps in order.
pub struct Case {
    /// The vector's name and the algorithm, for failure messages.
    pub name: String,
    pub policy: Policy,
    pub steps: Vec<Step>,
}

/// One charge or refund at an absolute instant, with what it must answer.
pub struct Step {
    pub at_ms: i64,
    pub action: Action,
    pub expect: Expect,
}

#[derive(Debug, Clone, Copy)]
pub enum Action {
    /// A charge of `cost` (0: a peek), spent over the `spread_ms` before it (0: now).
    Charge { cost: u64, spread_ms: u64 },
    /// A refund of `cost` booked at `booked_at_ms`.
    Refund { cost: u64, booked_at_ms: i64 },
}

/// What a runner saw after one step; `None` where the step gives no such answer (a refund
/// has no verdict).
#[derive(Debug, Default)]
pub struct Observed {
    pub allowed: Option<bool>,
    pub remaining: Option<u64>,
    pub reset_ms: Option<u64>,
    pub booked: Option<bool>,
    pub changed: bool,
    pub locked_until_ms: i64,
    pub expires_at_ms: i64,
}

/// The expectations of one step; absolute instants.
#[derive(Debug, Default)]
pub struct Expect {
    allowed: Option<bool>,
    remaining: Option<u64>,
    reset_ms: Option<u64>,
    reset_s: Option<u64>,
    booked: Option<bool>,
    changed: Option<bool>,
    locked_until_ms: Option<i64>,
    expires_at_ms: Option<i64>,
}

impl Expect {
    /// Asserts every expectation the table gives for this step.
    pub fn check(&self, seen: &Observed, context: &str) {
        let verdict = |field: &str| {
            seen.allowed
                .unwrap_or_else(|| panic!("{context}: {field} expected of a refund"))
        };
        if let Some(allowed) = self.allowed {
            assert_eq!(verdict("allowed"), allowed, "{context}: allowed; {seen:?}");
        }
        if let Some(remaining) = self.remaining {
            verdict("remaining");
            assert_eq!(seen.remaining, Some(remaining), "{context}: remaining");
        }
        if let Some(reset_ms) = self.reset_ms {
            verdict("reset_ms");
            assert_eq!(seen.reset_ms, Some(reset_ms), "{context}: reset_ms");
        }
        if let Some(reset_s) = self.reset_s {
            verdict("reset_s");
            let seconds = seen.reset_ms.map(|ms| ms.div_ceil(1000));
            assert_eq!(seconds, Some(reset_s), "{context}: reset in seconds");
        }
        if let Some(booked) = self.booked {
            verdict("booked");
            assert_eq!(seen.booked, Some(booked), "{context}: booked");
        }
        if let Some(changed) = self.changed {
            assert_eq!(seen.changed, changed, "{context}: changed");
        }
        if let Some(until) = self.locked_until_ms {
            assert_eq!(seen.locked_until_ms, until, "{context}: locked until");
        }
        if let Some(at) = self.expires_at_ms {
            assert_eq!(seen.expires_at_ms, at, "{context}: expires at");
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Table {
    /// Documentation for the reader of the file; required so that it stays there.
    #[allow(dead_code, reason = "read only to require it in the file")]
    about: Vec<String>,
    start: i64,
    vectors: Vec<Vector>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Vector {
    name: String,
    algorithms: Vec<String>,
    policy: PolicySpec,
    steps: Vec<StepSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicySpec {
    limit: u32,
    unit: String,
    burst: Option<u32>,
    #[serde(default)]
    consume: bool,
    #[serde(default)]
    lockout_ms: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StepSpec {
    at: i64,
    cost: Option<u64>,
    #[serde(default)]
    spread: u64,
    refund: Option<u64>,
    booked_at: Option<i64>,
    allowed: Option<bool>,
    remaining: Option<u64>,
    reset_ms: Option<u64>,
    reset_s: Option<u64>,
    booked: Option<bool>,
    changed: Option<bool>,
    locked_until: Option<i64>,
    expires_at: Option<i64>,
}

/// Every vector on every algorithm it names, with absolute times.
pub fn cases() -> Vec<Case> {
    let table: Table = serde_json::from_str(TABLE).expect("tests/vectors/algorithms.json");
    assert_eq!(
        table.start % Unit::Day.millis() as i64,
        0,
        "start is a day boundary, so every unit's windows start there"
    );
    let mut cases = Vec::new();
    for vector in &table.vectors {
        assert!(
            !vector.algorithms.is_empty(),
            "{}: no algorithm",
            vector.name
        );
        for name in &vector.algorithms {
            let algorithm = Algorithm::parse(name)
                .unwrap_or_else(|| panic!("{}: unknown algorithm {name}", vector.name));
            cases.push(Case {
                name: format!("{} [{algorithm}]", vector.name),
                policy: policy(algorithm, &vector.policy, &vector.name),
                steps: vector
                    .steps
                    .iter()
                    .map(|step| step.resolve(table.start, &vector.name))
                    .collect(),
            });
        }
    }
    cases
}

fn policy(algorithm: Algorithm, spec: &PolicySpec, name: &str) -> Policy {
    let unit = Unit::parse(&spec.unit).unwrap_or_else(|| panic!("{name}: unknown unit"));
    Policy {
        algorithm,
        unit,
        unit_multiplier: 1,
        requests_per_unit: spec.limit,
        burst: spec.burst.unwrap_or(spec.limit),
        on_over_limit: if spec.consume {
            OnOverLimit::Consume
        } else {
            OnOverLimit::Reject
        },
        lockout: (spec.lockout_ms > 0).then(|| Duration::from_millis(spec.lockout_ms)),
    }
}

impl StepSpec {
    fn resolve(&self, start: i64, name: &str) -> Step {
        let action = match (self.cost, self.refund, self.booked_at) {
            (Some(cost), None, None) => Action::Charge {
                cost,
                spread_ms: self.spread,
            },
            (None, Some(cost), Some(booked_at)) => Action::Refund {
                cost,
                booked_at_ms: start + booked_at,
            },
            _ => panic!("{name}: a step has either cost, or refund and booked_at"),
        };
        let verdict = [self.allowed, self.booked].iter().any(Option::is_some)
            || [self.remaining, self.reset_ms, self.reset_s]
                .iter()
                .any(Option::is_some);
        assert!(
            !(verdict && matches!(action, Action::Refund { .. })),
            "{name}: a refund has no verdict to expect"
        );
        Step {
            at_ms: start + self.at,
            action,
            expect: Expect {
                allowed: self.allowed,
                remaining: self.remaining,
                reset_ms: self.reset_ms,
                reset_s: self.reset_s,
                booked: self.booked,
                changed: self.changed,
                locked_until_ms: self.locked_until.map(|at| start + at),
                expires_at_ms: self.expires_at.map(|at| start + at),
            },
        }
    }
}
