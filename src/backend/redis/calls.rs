//! How a charge, a refund or a batch becomes one command, and how its reply becomes
//! outcomes. What the scripts are is `super::scripts`; the words of each call follow the
//! headers of `lua/*.lua`, written once here in Rust.

use redis::{Cmd, RedisError, RedisWrite, ToRedisArgs, Value};

use super::errors;
use super::scripts::{ScriptSet, Scripting, Via, batch_index};
use crate::algorithm::sliding_log;
use crate::backend::{BackendError, Charge, Group, Outcome, Refund};
use crate::rules::{Algorithm, OnOverLimit, Policy};

/// What an algorithm script call does (ARGV[1], and ARGV[8..=9] of a refund).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Decide a charge of the cost (0: a peek).
    Charge,
    /// Give back the cost of a booking.
    Refund {
        /// The `now_ms` that the charge being undone replied.
        booked_at_ms: i64,
        /// The refund's id: the same id again changes nothing (a re-sent refund).
        id: u64,
    },
}

/// The ARGV of one algorithm script call. Its `ToRedisArgs` writes the words in the order
/// of the script headers (lua/fixed_window.lua): op, n, W, L, B, consume, lockout,
/// booked_at, refund id (0 and 0 for a charge). The backends and the tests build every
/// call from it, so that order is written once in Rust.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Argv {
    /// Charge or refund.
    pub op: Op,
    /// `n`: the cost to charge or give back.
    pub cost: u64,
    /// The bucket's policy (W, L, B, consume, lockout).
    pub policy: Policy,
}

impl Argv {
    /// A charge of `cost` (0: a peek).
    pub fn charge(cost: u64, policy: Policy) -> Argv {
        Argv {
            op: Op::Charge,
            cost,
            policy,
        }
    }

    /// A refund of `cost`, booked at `booked_at_ms`, named `id`.
    pub fn refund(cost: u64, policy: Policy, booked_at_ms: i64, id: u64) -> Argv {
        Argv {
            op: Op::Refund { booked_at_ms, id },
            cost,
            policy,
        }
    }
}

impl Argv {
    /// For tests that call the code directly: one call of this ARGV's algorithm on `key`,
    /// as `scripting` makes it first (`EVALSHA`, or `FCALL` of the set's library), pinned
    /// time included. The script or the library must be loaded (`load_commands`).
    #[doc(hidden)]
    pub fn command(self, key: &str, scripts: &ScriptSet, scripting: Scripting) -> Cmd {
        let call = Call {
            key: key.to_owned(),
            argv: self,
        };
        call.command(scripts, scripting.first())
    }
}

/// ARGV[2..=7] of an algorithm script, `n W L B consume lockout`: what a decision needs.
/// The batch script takes the same six per item.
fn decision_args(cost: u64, policy: &Policy) -> [u64; 6] {
    [
        cost,
        policy.window_ms(),
        u64::from(policy.requests_per_unit),
        u64::from(policy.burst),
        u64::from(policy.on_over_limit == OnOverLimit::Consume),
        policy.lockout_ms(),
    ]
}

impl ToRedisArgs for Argv {
    // Numbers are written straight into the command buffer: no string per argument.
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + RedisWrite,
    {
        let (op, booked_at_ms, id) = match self.op {
            Op::Charge => ("charge", 0, 0),
            Op::Refund { booked_at_ms, id } => ("refund", booked_at_ms, id),
        };
        op.write_redis_args(out);
        for word in decision_args(self.cost, &self.policy) {
            word.write_redis_args(out);
        }
        booked_at_ms.write_redis_args(out);
        id.write_redis_args(out);
    }

    fn num_of_args(&self) -> usize {
        9
    }
}

/// One script call: which script, on which key, with which ARGV.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    key: String,
    argv: Argv,
}

impl Call {
    /// The call that decides `charge` on the bucket stored under `prefix`.
    pub(crate) fn charge(charge: &Charge, prefix: &str) -> Call {
        Call {
            key: charge.bucket.redis_key(prefix),
            argv: Argv::charge(charge.cost, charge.policy),
        }
    }

    /// The call that undoes `refund` on the bucket stored under `prefix`.
    pub(crate) fn refund(refund: &Refund, prefix: &str) -> Call {
        Call {
            key: refund.bucket.redis_key(prefix),
            argv: Argv::refund(refund.cost, refund.policy, refund.booked_at_ms, refund.id),
        }
    }

    /// The bucket's key.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// The command: `EVALSHA sha 1 key argv...`, `EVAL source 1 key argv...` or
    /// `FCALL function 1 key argv...`.
    pub(crate) fn command(&self, scripts: &ScriptSet, via: Via) -> Cmd {
        let mut cmd = scripts.algorithm_head(self.argv.policy.algorithm, via);
        cmd.arg(1)
            .arg(&self.key)
            .arg(self.argv)
            .arg(scripts.pinned_now());
        cmd
    }
}

/// One batch script call: the groups of several requests, each decided all-or-nothing.
#[derive(Debug, Default)]
pub(crate) struct BatchCall {
    keys: Vec<String>,
    argv: Vec<u64>,
    groups: u64,
    /// Worst-case work in Redis: one per item, plus the log entries a sliding-log denial
    /// may read (`sliding_log::wait_reads`).
    work: u64,
}

impl BatchCall {
    /// Adds one request's group; its items' keys carry `prefix`.
    pub(crate) fn push(&mut self, group: &Group, prefix: &str) {
        self.groups += 1;
        let prior = &group.prior;
        self.argv.extend([
            u64::from(group.admit),
            u64::from(prior.over),
            u64::from(prior.quota_total),
            u64::from(prior.quota_over),
            group.items.len() as u64,
        ]);
        for item in &group.items {
            let (charge, policy) = (&item.charge, &item.charge.policy);
            self.keys.push(charge.bucket.redis_key(prefix));
            self.argv.extend([
                batch_index(policy.algorithm) as u64,
                u64::from(item.weight.quota),
                u64::from(item.weight.shadow),
            ]);
            self.argv.extend(decision_args(charge.cost, policy));
            self.work += 1;
            if policy.algorithm == Algorithm::SlidingLog {
                let limit = u64::from(policy.requests_per_unit);
                self.work += sliding_log::wait_reads(limit, charge.cost);
            }
        }
    }

    /// Worst-case work in Redis, in items and log entries read (see `push`).
    pub(crate) fn work(&self) -> u64 {
        self.work
    }

    /// Items in the call.
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    /// One command deciding every group of `calls`, in order: `EVALSHA sha numkeys keys...
    /// G argv...` (or `EVAL` with the source, or `FCALL` of the batch function). Arguments
    /// are written straight into the command buffer, so joining requests copies nothing else.
    pub(crate) fn command(calls: &[&BatchCall], scripts: &ScriptSet, via: Via) -> Cmd {
        let mut cmd = scripts.batch_head(via);
        BatchCall::append(&mut cmd, calls, scripts);
        cmd
    }

    /// The Redis Cluster form of [`BatchCall::command`]: `FCALL <library>_batch_slots 0
    /// nkeys keys... G argv...`, the keys in ARGV so that they may lie in several slots of
    /// the node that runs it.
    pub(crate) fn command_across_slots(calls: &[&BatchCall], scripts: &ScriptSet) -> Cmd {
        let mut cmd = scripts.batch_slots_head();
        BatchCall::append(&mut cmd, calls, scripts);
        cmd
    }

    /// `nkeys keys... G argv... [pinned time]`.
    fn append(cmd: &mut Cmd, calls: &[&BatchCall], scripts: &ScriptSet) {
        cmd.arg(calls.iter().map(|call| call.len()).sum::<usize>());
        for call in calls {
            cmd.arg(&call.keys);
        }
        cmd.arg(calls.iter().map(|call| call.groups).sum::<u64>());
        for call in calls {
            cmd.arg(&call.argv);
        }
        cmd.arg(scripts.pinned_now());
    }
}

/// Reads a batch reply: 6 integers per item (see lua/batch.lua), `items` items.
/// The outcome of every item of a batch reply; `None` for the items of a group whose charge
/// failed in the script (its own request fails, the others stand).
pub(crate) fn batch_outcomes(
    value: Value,
    items: usize,
) -> Result<Vec<Option<Outcome>>, BackendError> {
    let values = match value {
        Value::Array(values) if values.len() == items * 6 => values,
        Value::ServerError(e) => return Err(errors::server_error(&RedisError::from(e))),
        other => {
            return Err(BackendError::failed(format!(
                "unexpected batch reply for {items} items: {other:?}"
            )));
        }
    };
    let mut values = values.into_iter();
    (0..items)
        .map(|_| {
            let [allowed, remaining, reset_ms, now_ms, booked, rolled_back] =
                integers_of::<6>(values.by_ref())?;
            if allowed == -1 {
                return Ok(None);
            }
            let mut outcome = outcome_of([allowed, remaining, reset_ms, now_ms, booked])?;
            outcome.rolled_back = match rolled_back {
                0 | 1 => rolled_back == 1,
                other => {
                    return Err(BackendError::failed(format!(
                        "batch reply out of range: rolled_back {other}"
                    )));
                }
            };
            Ok(Some(outcome))
        })
        .collect()
}

/// Reads a charge reply `{allowed, remaining, reset_ms, now_ms, booked}`.
pub(crate) fn outcome(value: Value) -> Result<Outcome, BackendError> {
    outcome_of(integers::<5>(value)?)
}

fn outcome_of(reply: [i64; 5]) -> Result<Outcome, BackendError> {
    match reply {
        [
            allowed @ 0..=1,
            remaining @ 0..=i64::MAX,
            reset_ms @ 0..=i64::MAX,
            now_ms,
            booked @ 0..=1,
        ] => Ok(Outcome {
            allowed: allowed == 1,
            remaining: remaining as u64,
            reset_ms: reset_ms as u64,
            now_ms,
            booked: booked == 1,
            rolled_back: false,
        }),
        other => Err(BackendError::failed(format!(
            "script reply out of range: {other:?}"
        ))),
    }
}

/// Checks a refund reply `{changed, now_ms}`.
pub(crate) fn refunded(value: Value) -> Result<(), BackendError> {
    integers::<2>(value).map(|_| ())
}

fn integers<const N: usize>(value: Value) -> Result<[i64; N], BackendError> {
    let items = match value {
        Value::Array(items) if items.len() == N => items,
        Value::ServerError(e) => return Err(errors::server_error(&RedisError::from(e))),
        other => {
            return Err(BackendError::failed(format!(
                "unexpected script reply: {other:?}"
            )));
        }
    };
    integers_of(items.into_iter())
}

/// The next `N` values of `values`, each an integer (the caller checked that `N` are left).
fn integers_of<const N: usize>(
    values: impl Iterator<Item = Value>,
) -> Result<[i64; N], BackendError> {
    let mut out = [0i64; N];
    for (slot, item) in out.iter_mut().zip(values) {
        *slot = match item {
            Value::Int(i) => i,
            other => {
                return Err(BackendError::failed(format!(
                    "non-integer in script reply: {other:?}"
                )));
            }
        };
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::backend::BucketKey;
    use crate::rules::Unit;

    #[test]
    fn charge_call_carries_policy_in_argv_order() {
        let mut policy = Policy::fixed_window(5, Unit::Minute);
        policy.algorithm = Algorithm::TokenBucket;
        policy.burst = 7;
        policy.on_over_limit = OnOverLimit::Consume;
        policy.lockout = Some(std::time::Duration::from_secs(9));
        let bucket = BucketKey::new("d", "r", [("k", "v")], &policy);
        let call = Call::charge(
            &Charge {
                bucket,
                policy,
                cost: 3,
            },
            "fg",
        );
        let words = words(&call.command(&ScriptSet::new(), Via::Sha));
        let sha = ScriptSet::new()
            .get(Algorithm::TokenBucket)
            .get_hash()
            .to_owned();
        let key = bucket.redis_key("fg");
        let expected = [
            "EVALSHA", &sha, "1", &key, "charge", "3", "60000", "5", "7", "1", "9000", "0", "0",
        ];
        assert_eq!(words, expected);
        let eval = call
            .command(&ScriptSet::new(), Via::Source)
            .get_packed_command();
        assert!(String::from_utf8_lossy(&eval).contains("token_bucket.rs"));
    }

    #[test]
    fn a_pinned_set_ends_every_call_with_the_time() {
        let clock = Arc::new(crate::clock::ManualClock::new(4_102_444_812_350));
        let pinned = ScriptSet::pinned(clock);
        let real = ScriptSet::new();

        let policy = Policy::fixed_window(5, Unit::Minute);
        let charge = Charge {
            bucket: BucketKey::new("d", "r", [("k", "v")], &policy),
            policy,
            cost: 1,
        };
        let call = Call::charge(&charge, "fg");
        let on_time = words(&call.command(&real, Via::Sha));
        let pinned_words = words(&call.command(&pinned, Via::Source));
        assert_eq!(pinned_words.len(), on_time.len() + 1);
        assert_eq!(pinned_words.last().unwrap(), "4102444812350");
        let batch = BatchCall::command(&[], &pinned, Via::Sha);
        assert_eq!(words(&batch).last().unwrap(), "4102444812350");
    }

    /// The words of a command as it goes on the wire.
    fn words(cmd: &Cmd) -> Vec<String> {
        String::from_utf8(cmd.get_packed_command())
            .unwrap()
            .split("\r\n")
            .filter(|w| !w.is_empty() && !w.starts_with(['*', '$']))
            .map(String::from)
            .collect()
    }

    #[test]
    fn the_batch_function_is_called_by_its_library_name() {
        let set = ScriptSet::new();
        let batch = BatchCall::command(&[], &set, Via::Function);
        let name = set.library_name();
        assert_eq!(words(&batch)[..3], ["FCALL", &format!("{name}_batch"), "0"]);
        let policy = Policy::fixed_window(5, Unit::Minute);
        let charge = Charge {
            bucket: BucketKey::new("d", "r", [("k", "v")], &policy),
            policy,
            cost: 1,
        };
        let mut call = BatchCall::default();
        call.push(&Group::independent(std::slice::from_ref(&charge)), "fg");
        let across = words(&BatchCall::command_across_slots(&[&call], &set));
        let key = charge.bucket.redis_key("fg");
        let function = format!("{name}_batch_slots");
        assert_eq!(across[..6], ["FCALL", &function, "0", "1", &key, "1"]);
    }

    #[test]
    fn batch_call_joins_groups_in_order() {
        let policy = Policy::fixed_window(5, Unit::Minute);
        let charge = |value: &str, cost| Charge {
            bucket: BucketKey::new("d", "r", [("k", value)], &policy),
            policy,
            cost,
        };
        let item = |value, cost, quota, shadow| crate::backend::Item {
            charge: charge(value, cost),
            weight: crate::backend::Weight { quota, shadow },
        };
        let mut first = BatchCall::default();
        let mut group = Group {
            items: vec![item("a", 2, true, false), item("b", 0, false, true)],
            ..Group::default()
        };
        group.prior.over = true;
        first.push(&group, "fg");
        let mut second = BatchCall::default();
        second.push(&Group::independent(&[charge("c", 1)]), "fg");
        let set = ScriptSet::new();
        let words = words(&BatchCall::command(&[&first, &second], &set, Via::Sha));
        let key = |value| charge(value, 0).bucket.redis_key("fg");
        let (a, b, c) = (key("a"), key("b"), key("c"));
        let sha = set.batch().get_hash().to_owned();
        #[rustfmt::skip]
        let expected = [
            "EVALSHA", &sha, "3", &a, &b, &c, "2",
            "0", "1", "0", "0", "2",
            "1", "1", "0", "2", "60000", "5", "5", "0", "0",
            "1", "0", "1", "0", "60000", "5", "5", "0", "0",
            "1", "0", "0", "0", "1",
            "1", "0", "0", "1", "60000", "5", "5", "0", "0",
        ];
        assert_eq!(words, expected);
        assert_eq!(first.len() + second.len(), 3);
    }

    #[test]
    fn batch_work_counts_items_and_the_log_entries_a_denial_may_read() {
        let fixed = Policy::fixed_window(10_000, Unit::Hour);
        let log = Policy {
            algorithm: Algorithm::SlidingLog,
            ..fixed
        };
        let charge = |policy: Policy, cost| Charge {
            bucket: BucketKey::new("d", "r", [("k", "v")], &policy),
            policy,
            cost,
        };
        let mut call = BatchCall::default();
        call.push(&Group::independent(&[charge(fixed, 9_000)]), "fg");
        assert_eq!(call.work(), 1);
        call.push(&Group::independent(&[charge(log, 10_000)]), "fg");
        assert_eq!(
            call.work(),
            1 + 2,
            "a cost of L reads the newest entry only"
        );
        call.push(&Group::independent(&[charge(log, 5_000)]), "fg");
        assert_eq!(call.work(), 3 + 5_001);
    }

    #[test]
    fn replies_are_checked() {
        let ints = |v: &[i64]| Value::Array(v.iter().map(|&i| Value::Int(i)).collect());
        let ok = outcome(ints(&[1, 4, 500, 1_700_000_000_000, 1])).unwrap();
        assert!(ok.allowed && ok.booked);
        assert_eq!((ok.remaining, ok.reset_ms), (4, 500));
        assert!(outcome(ints(&[2, 0, 0, 0, 0])).is_err());
        assert!(outcome(ints(&[1, -1, 0, 0, 0])).is_err());
        assert!(outcome(ints(&[1, 0, 0, 0])).is_err());
        assert!(refunded(ints(&[1, 5])).is_ok());
        assert!(refunded(Value::Nil).is_err());
    }
}
