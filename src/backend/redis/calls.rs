//! How a charge, a refund or a batch becomes one command, and how its reply becomes
//! outcomes. What the scripts are is `super::scripts`; the words of each call follow the
//! headers of `lua/*.lua`, written once here in Rust.

use std::collections::HashMap;

use redis::{Cmd, RedisError, RedisWrite, ToRedisArgs, Value};

use super::errors;
use super::scripts::{ScriptSet, Scripting, Via, batch_index};
use crate::algorithm::{sliding_log, token_bucket};
use crate::backend::{BackendError, BucketKey, Charge, Group, Item, Outcome, Refund};
use crate::rules::{Algorithm, OnOverLimit, Policy};

/// What an algorithm script call does (ARGV[1], and ARGV[8..=9]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Decide a charge of the cost (0: a peek).
    Charge {
        /// The ms before now over which the cost was spent (`Charge::spread_ms`).
        spread_ms: u64,
    },
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
/// booked_at (a charge: its spread), refund id (0 for a charge). The backends and the tests build every
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
        Argv::spent(cost, policy, 0)
    }

    /// A charge of `cost` spent over the `spread_ms` before now.
    pub fn spent(cost: u64, policy: Policy, spread_ms: u64) -> Argv {
        Argv {
            op: Op::Charge { spread_ms },
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

/// ARGV[3..=7] of an algorithm script, `W L B consume lockout`: what a decision needs
/// besides its cost. The batch script's policy table holds the same five.
fn policy_args(policy: &Policy) -> [u64; 5] {
    [
        policy.window_ms(),
        u64::from(policy.requests_per_unit),
        u64::from(policy.burst),
        u64::from(policy.on_over_limit == OnOverLimit::Consume),
        policy.lockout_ms(),
    ]
}

/// A charge's spread as the scripts take it: at most `MAX_SPREAD_MS`, so that no script
/// computes a leak past 2^53.
fn spread_word(spread_ms: u64) -> i64 {
    spread_ms.min(token_bucket::MAX_SPREAD_MS) as i64
}

impl ToRedisArgs for Argv {
    // Numbers are written straight into the command buffer: no string per argument.
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + RedisWrite,
    {
        let (op, booked_at_ms, id) = match self.op {
            Op::Charge { spread_ms } => ("charge", spread_word(spread_ms), 0),
            Op::Refund { booked_at_ms, id } => ("refund", booked_at_ms, id),
        };
        op.write_redis_args(out);
        self.cost.write_redis_args(out);
        for word in policy_args(&self.policy) {
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
            argv: Argv::spent(charge.cost, charge.policy, charge.spread_ms),
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

/// One request's group as the batch script reads it (lua/batch.lua). A batch call sends the
/// groups of several requests ([`GroupWords::command`]), each decided all-or-nothing.
#[derive(Debug)]
pub(crate) struct GroupWords {
    /// `admit over qtotal qover`, when any is set (most requests send none).
    prior: Option<[u64; 4]>,
    items: Vec<ItemWords>,
    /// Worst-case work in Redis: one per item, plus the log entries a sliding-log denial
    /// may read (`sliding_log::wait_reads`).
    work: u64,
}

#[derive(Debug)]
struct ItemWords {
    /// Its key is written into the command (`append`), not kept as a string.
    bucket: BucketKey,
    policy: PolicyWords,
    cost: u64,
}

/// An entry of the batch script's policy table: `algorithm quota shadow W L B consume
/// lockout spread lease`. Items of one rule (and spread) share it, so a batch sends it once.
type PolicyWords = [u64; 10];

impl GroupWords {
    /// The words of `group`.
    pub(crate) fn new(group: &Group) -> GroupWords {
        let prior = &group.prior;
        let head = [
            u64::from(group.admit),
            u64::from(prior.over),
            u64::from(prior.quota_total),
            u64::from(prior.quota_over),
        ];
        GroupWords::of(head, group.items.iter())
    }

    /// The words of some of a request's `items`, each admitted whatever the others decide
    /// (`Group::independent`): the part of a request that one Redis Cluster master holds,
    /// the request being settled once every master has answered.
    pub(crate) fn independent<'a>(items: impl Iterator<Item = &'a Item>) -> GroupWords {
        GroupWords::of([1, 0, 0, 0], items)
    }

    /// The words of `items` after the request's `admit over qtotal qover`.
    fn of<'a>(head: [u64; 4], items: impl Iterator<Item = &'a Item>) -> GroupWords {
        let mut work = 0;
        let items = items
            .map(|item| {
                let (charge, policy) = (&item.charge, &item.charge.policy);
                work += 1;
                if policy.algorithm == Algorithm::SlidingLog {
                    let limit = u64::from(policy.requests_per_unit);
                    work += sliding_log::wait_reads(limit, charge.cost);
                }
                let [w, l, b, consume, lockout] = policy_args(policy);
                ItemWords {
                    bucket: charge.bucket,
                    policy: [
                        batch_index(policy.algorithm) as u64,
                        u64::from(item.weight.quota),
                        u64::from(item.weight.shadow),
                        w,
                        l,
                        b,
                        consume,
                        lockout,
                        spread_word(charge.spread_ms) as u64,
                        item.lease.map_or(0, |base| u64::from(base) + 1),
                    ],
                    cost: charge.cost,
                }
            })
            .collect();
        GroupWords {
            prior: (head != [0; 4]).then_some(head),
            items,
            work,
        }
    }

    /// Worst-case work in Redis, in items and log entries read (see `work`).
    pub(crate) fn work(&self) -> u64 {
        self.work
    }

    /// Items in the group.
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    /// One command deciding every one of `groups`, in order, on keys under `prefix`:
    /// `EVALSHA sha numkeys keys... words` (or `EVAL` with the source, or `FCALL` of the
    /// batch function; `words` as in `append`). Arguments are written straight into the
    /// command buffer.
    pub(crate) fn command(
        groups: &[&GroupWords],
        prefix: &str,
        scripts: &ScriptSet,
        via: Via,
    ) -> Cmd {
        let mut cmd = scripts.batch_head(via);
        GroupWords::append(&mut cmd, groups, prefix, scripts);
        cmd
    }

    /// The Redis Cluster form of [`GroupWords::command`]: `FCALL <library>_batch_slots 0
    /// nkeys keys... words`, the keys in ARGV so that they may lie in several slots of the
    /// node that runs it.
    pub(crate) fn command_across_slots(
        groups: &[&GroupWords],
        prefix: &str,
        scripts: &ScriptSet,
    ) -> Cmd {
        let mut cmd = scripts.batch_slots_head();
        GroupWords::append(&mut cmd, groups, prefix, scripts);
        cmd
    }

    /// `nkeys keys... words [pinned time]`, `words` being `G P policies... groups...` packed
    /// as 8-byte little-endian integers in one argument (lua/batch.lua): Redis parses one
    /// argument instead of a few per item, and the script reads numbers, not decimals.
    fn append(cmd: &mut Cmd, groups: &[&GroupWords], prefix: &str, scripts: &ScriptSet) {
        let items = || groups.iter().flat_map(|group| &group.items);
        cmd.arg(groups.iter().map(|group| group.len()).sum::<usize>());
        // One buffer for every key: a key costs no allocation of its own.
        let mut key = String::new();
        for item in items() {
            key.clear();
            item.bucket.write_redis_key(prefix, &mut key);
            cmd.arg(key.as_bytes());
        }
        let mut table = PolicyTable::default();
        let numbers: Vec<u64> = items().map(|item| table.number(item.policy)).collect();
        let mut words = PackedWords::default();
        words
            .push(groups.len() as u64)
            .push(table.list.len() as u64);
        for &word in table.list.iter().flatten() {
            words.push(word);
        }
        let mut numbers = numbers.into_iter();
        for group in groups {
            let m = group.items.len() as u64;
            match group.prior {
                Some(prior) => {
                    words.push_signed(-(m as i64));
                    for word in prior {
                        words.push(word);
                    }
                }
                None => {
                    words.push(m);
                }
            }
            for (item, number) in group.items.iter().zip(numbers.by_ref()) {
                words.push(number).push(item.cost);
            }
        }
        cmd.arg(words.0);
        cmd.arg(scripts.pinned_now());
    }
}

/// Numbers as the batch script unpacks them (`struct.unpack` of `i8`s): 8-byte little-endian
/// signed integers, back to back. A number past `i64::MAX` (a cost no limit admits) is sent
/// as `i64::MAX`, which no limit admits either.
#[derive(Default)]
struct PackedWords(Vec<u8>);

impl PackedWords {
    fn push(&mut self, word: u64) -> &mut Self {
        self.push_signed(i64::try_from(word).unwrap_or(i64::MAX))
    }

    fn push_signed(&mut self, word: i64) -> &mut Self {
        self.0.extend_from_slice(&word.to_le_bytes());
        self
    }
}

/// The distinct policies of one batch, numbered from 1 in the order first seen.
#[derive(Default)]
struct PolicyTable {
    list: Vec<PolicyWords>,
    /// Filled once the list outgrows `SCAN`: a batch of a few rules scans, a batch of many
    /// hashes.
    index: HashMap<PolicyWords, usize>,
}

impl PolicyTable {
    const SCAN: usize = 8;

    /// The number of `words` in the table, added if new.
    fn number(&mut self, words: PolicyWords) -> u64 {
        let found = if self.list.len() > Self::SCAN {
            self.index.get(&words).copied()
        } else {
            self.list.iter().position(|known| *known == words)
        };
        let index = found.unwrap_or_else(|| {
            self.list.push(words);
            match self.list.len() {
                n if n == Self::SCAN + 1 => self.index.extend(self.list.iter().copied().zip(0..)),
                n if n > Self::SCAN + 1 => _ = self.index.insert(words, n - 1),
                _ => {}
            }
            self.list.len() - 1
        });
        index as u64 + 1
    }
}

/// The outcome of every item of a batch reply (see lua/batch.lua: one string of 8-byte
/// little-endian integers, the call's `now_ms`, then `state remaining reset_ms` per item),
/// `items` items; `None` for the items of a group whose charge failed in the script (its own
/// request fails, the others stand).
pub(crate) fn batch_outcomes(
    value: Value,
    items: usize,
) -> Result<Vec<Option<Outcome>>, BackendError> {
    const WORD: usize = size_of::<i64>();
    let bytes = match value {
        Value::BulkString(bytes) if bytes.len() == (1 + items * 3) * WORD => bytes,
        Value::ServerError(e) => return Err(errors::server_error(&RedisError::from(e))),
        other => {
            return Err(BackendError::failed(format!(
                "unexpected batch reply for {items} items: {other:?}"
            )));
        }
    };
    let mut words = bytes
        .chunks_exact(WORD)
        .map(|word| i64::from_le_bytes(word.try_into().expect("chunks of one word")));
    let mut next = || words.next().expect("the length was checked");
    let now_ms = next();
    (0..items)
        .map(|_| {
            let (state, remaining, reset_ms) = (next(), next(), next());
            match state {
                -1 => Ok(None),
                0..=7 => {
                    let (allowed, booked) = (state & 1, state >> 1 & 1);
                    let mut outcome = outcome_of([allowed, remaining, reset_ms, now_ms, booked])?;
                    outcome.rolled_back = state & 4 != 0;
                    Ok(Some(outcome))
                }
                other => Err(BackendError::failed(format!(
                    "batch reply out of range: state {other}"
                ))),
            }
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
                spread_ms: 0,
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
            spread_ms: 0,
        };
        let call = Call::charge(&charge, "fg");
        let on_time = words(&call.command(&real, Via::Sha));
        let pinned_words = words(&call.command(&pinned, Via::Source));
        assert_eq!(pinned_words.len(), on_time.len() + 1);
        assert_eq!(pinned_words.last().unwrap(), "4102444812350");
        let batch = GroupWords::command(&[], "fg", &pinned, Via::Sha);
        assert_eq!(arguments(&batch).last().unwrap(), b"4102444812350");
    }

    /// The arguments of a command, as bytes.
    fn arguments(cmd: &Cmd) -> Vec<Vec<u8>> {
        cmd.args_iter()
            .map(|argument| match argument {
                redis::Arg::Simple(bytes) => bytes.to_vec(),
                _ => panic!("a script call has only plain arguments"),
            })
            .collect()
    }

    /// The words of a command without packed words (text arguments).
    fn words(cmd: &Cmd) -> Vec<String> {
        arguments(cmd)
            .into_iter()
            .map(|argument| String::from_utf8(argument).unwrap())
            .collect()
    }

    /// A batch command's text arguments (the call and its keys), and its packed words (the
    /// last argument: `PackedWords`) as numbers.
    fn batch_words(cmd: &Cmd) -> (Vec<String>, Vec<i64>) {
        let mut arguments = arguments(cmd);
        let packed = arguments.pop().unwrap();
        assert_eq!(packed.len() % 8, 0, "whole 8-byte words");
        let numbers = packed
            .chunks(8)
            .map(|word| i64::from_le_bytes(word.try_into().unwrap()))
            .collect();
        let text = arguments
            .into_iter()
            .map(|argument| String::from_utf8(argument).unwrap())
            .collect();
        (text, numbers)
    }

    #[test]
    fn the_batch_function_is_called_by_its_library_name() {
        let set = ScriptSet::new();
        let batch = GroupWords::command(&[], "fg", &set, Via::Function);
        let name = set.library_name();
        assert_eq!(
            batch_words(&batch).0,
            ["FCALL", &format!("{name}_batch"), "0"]
        );
        let policy = Policy::fixed_window(5, Unit::Minute);
        let charge = Charge {
            bucket: BucketKey::new("d", "r", [("k", "v")], &policy),
            policy,
            cost: 1,
            spread_ms: 0,
        };
        let group = GroupWords::new(&Group::independent(std::slice::from_ref(&charge)));
        let (across, numbers) =
            batch_words(&GroupWords::command_across_slots(&[&group], "fg", &set));
        let key = charge.bucket.redis_key("fg");
        let function = format!("{name}_batch_slots");
        assert_eq!(across, ["FCALL", &function, "0", "1", &key]);
        assert_eq!(numbers[..2], [1, 1], "1 group, 1 policy");
    }

    #[test]
    fn batch_call_joins_groups_in_order() {
        let policy = Policy::fixed_window(5, Unit::Minute);
        let charge = |value: &str, cost| Charge {
            bucket: BucketKey::new("d", "r", [("k", value)], &policy),
            policy,
            cost,
            spread_ms: 0,
        };
        let item = |value, cost, quota, shadow| crate::backend::Item {
            charge: charge(value, cost),
            weight: crate::backend::Weight { quota, shadow },
            lease: None,
        };
        let mut group = Group {
            items: vec![item("a", 2, true, false), item("b", 0, false, true)],
            ..Group::default()
        };
        group.prior.over = true;
        let first = GroupWords::new(&group);
        let second = GroupWords::new(&Group::independent(&[charge("c", 1)]));
        let set = ScriptSet::new();
        let (text, numbers) = batch_words(&GroupWords::command(
            &[&first, &second],
            "fg",
            &set,
            Via::Sha,
        ));
        let key = |value| charge(value, 0).bucket.redis_key("fg");
        let (a, b, c) = (key("a"), key("b"), key("c"));
        let sha = set.batch().get_hash().to_owned();
        assert_eq!(text, ["EVALSHA", &sha, "3", &a, &b, &c]);
        // 2 groups and 3 policies (10 words, the spread and the lease last); the first group
        // with its prior verdicts (-m), items as policy number and cost; the second admitted
        // whatever it decides.
        #[rustfmt::skip]
        let expected = [
            2, 3,
            1, 1, 0, 60000, 5, 5, 0, 0, 0, 0,
            1, 0, 1, 60000, 5, 5, 0, 0, 0, 0,
            1, 0, 0, 60000, 5, 5, 0, 0, 0, 0,
            -2, 0, 1, 0, 0, 1, 2, 2, 0,
            -1, 1, 0, 0, 0, 3, 1,
        ];
        assert_eq!(numbers, expected);
        assert_eq!(first.len() + second.len(), 3);
    }

    #[test]
    fn a_part_of_a_request_is_sent_as_an_independent_group() {
        let policy = Policy::fixed_window(5, Unit::Minute);
        let item = |value, quota| crate::backend::Item {
            charge: Charge {
                bucket: BucketKey::new("d", "r", [("k", value)], &policy),
                policy,
                cost: 1,
                spread_ms: 0,
            },
            weight: crate::backend::Weight {
                quota,
                shadow: false,
            },
            lease: None,
        };
        let items = [item("a", true), item("b", false)];
        let part = GroupWords::independent(items.iter());
        let as_group = GroupWords::new(&Group {
            items: items.to_vec(),
            ..Group::independent(&[])
        });
        let set = ScriptSet::new();
        assert_eq!(
            batch_words(&GroupWords::command(&[&part], "fg", &set, Via::Sha)),
            batch_words(&GroupWords::command(&[&as_group], "fg", &set, Via::Sha)),
        );
        assert_eq!(part.work(), as_group.work());
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
            spread_ms: 0,
        };
        let work = |charges: &[Charge]| GroupWords::new(&Group::independent(charges)).work();
        assert_eq!(work(&[charge(fixed, 9_000)]), 1);
        assert_eq!(
            work(&[charge(log, 10_000)]),
            2,
            "a cost of L reads the newest entry only"
        );
        assert_eq!(work(&[charge(fixed, 1), charge(log, 5_000)]), 1 + 5_001);
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

        // A batch: one string of little-endian words, now_ms, then state (allowed + 2 booked
        // + 4 rolled back) remaining reset.
        let words = |v: &[i64]| {
            Value::BulkString(v.iter().flat_map(|i| i.to_le_bytes()).collect::<Vec<u8>>())
        };
        let now = 1_700_000_000_000;
        let batch = batch_outcomes(words(&[now, 5, 4, 500, -1, 0, 0, 0, 0, 9]), 3).unwrap();
        let first = batch[0].unwrap();
        assert!(first.allowed && !first.booked && first.rolled_back);
        assert_eq!(
            (first.remaining, first.reset_ms, first.now_ms),
            (4, 500, now)
        );
        assert!(batch[1].is_none());
        let third = batch[2].unwrap();
        assert!(!third.allowed && !third.booked && !third.rolled_back);
        assert!(batch_outcomes(words(&[now, 8, 0, 0]), 1).is_err());
        assert!(batch_outcomes(words(&[now, 1, 0, 0]), 2).is_err());
        assert!(batch_outcomes(words(&[now, 1, -1, 0]), 1).is_err());
        assert!(
            batch_outcomes(ints(&[now, 1, 0, 0]), 1).is_err(),
            "integers are not the batch's reply"
        );
        let mut torn = words(&[now, 1, 0, 0]);
        if let Value::BulkString(bytes) = &mut torn {
            bytes.pop();
        }
        assert!(batch_outcomes(torn, 1).is_err());
    }

    #[test]
    fn packed_words_are_little_endian_and_a_huge_cost_saturates() {
        let mut words = PackedWords::default();
        words.push(1).push(u64::MAX).push_signed(-2).push(1 << 53);
        let numbers: Vec<i64> = words
            .0
            .chunks(8)
            .map(|word| i64::from_le_bytes(word.try_into().unwrap()))
            .collect();
        assert_eq!(numbers, [1, i64::MAX, -2, 1 << 53]);
        assert_eq!(&words.0[..8], &[1, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn a_batch_sends_each_policy_once_however_many_there_are() {
        let mut table = PolicyTable::default();
        let words = |i: u64| [1, 0, 0, 1000, i, i, 0, 0, 0, 0];
        let first: Vec<u64> = (0..20).map(|i| table.number(words(i))).collect();
        assert_eq!(first, (1..=20).collect::<Vec<_>>());
        let again: Vec<u64> = (0..20).rev().map(|i| table.number(words(i))).collect();
        assert_eq!(again, (1..=20).rev().collect::<Vec<_>>());
        assert_eq!(table.list.len(), 20);
    }
}
