//! The Lua scripts of `lua/`, hashed once, and how a charge or refund becomes one command.
//!
//! Every script takes one key (the bucket) and the same ARGV (see the header of each file),
//! and answers integers only. The same sources are assembled two ways (`Scripting`):
//!
//! - a function library (Redis >= 7): `FUNCTION LOAD` defines the helpers and the algorithms
//!   once, and each call is an `FCALL` that only reads the clock and runs. A node that answers
//!   `ERR Function not found` (restarted, `FUNCTION FLUSH`ed, or a replica promoted that
//!   never had it) gets `FUNCTION LOAD REPLACE` and the same call again, in one round trip;
//! - scripts (any version): `EVALSHA`, and after `NOSCRIPT` the same call again as `EVAL`
//!   with the source, which runs it and caches it in one step on exactly the node that owns
//!   the key.
//!
//! A retry never repeats a call that ran: both errors mean the script did not start.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use redis::{Cmd, ErrorKind, RedisError, RedisWrite, ServerErrorKind, ToRedisArgs, Value};

use crate::algorithm::sliding_log;
use crate::backend::{BackendError, Charge, Group, Outcome, Refund};
use crate::clock::Clock;
use crate::rules::{Algorithm, OnOverLimit, Policy};

/// The first line of every script: the server clock, read once per call as `CLOCK`
/// (`{seconds, microseconds}`), so all the buckets a batch decides see the same instant and
/// a batch pays for one `TIME`.
macro_rules! clock {
    () => {
        "local CLOCK = redis.call('TIME')\n"
    };
}

/// What a pinned set (`ScriptSet::pinned`) reads instead of `clock!()`: the time in ms that
/// each of its calls appends as the last ARGV word, split as `TIME` splits it.
const PINNED_CLOCK: &str = "local CLOCK = {math.floor(tonumber(ARGV[#ARGV]) / 1000), \
    tonumber(ARGV[#ARGV]) % 1000 * 1000}\n";

/// The clock reading in ms, as every algorithm reads it: `now`, from `CLOCK`.
macro_rules! now {
    () => {
        "now = tonumber(CLOCK[1]) * 1000 + math.floor(tonumber(CLOCK[2]) / 1000)\n"
    };
}

/// An algorithm's code: its name, the shared head (arguments), the algorithm, and the shared
/// tail (the order of `Bucket::decide`: peek, lock, algorithm, lockout), so what all four
/// share is written once. It expects `once_per_call!` before it.
macro_rules! algorithm {
    ($name:literal) => {
        concat!(
            "local ALGORITHM = '",
            $name,
            "'\n",
            include_str!("../../../lua/prelude.lua"),
            include_str!(concat!("../../../lua/", $name, ".lua")),
            include_str!("../../../lua/decide.lua"),
        )
    };
}

/// What every script runs once per call, before any bucket: the clock as `now`, then the
/// helpers of lua/lib.lua (integer and refund-id helpers), defined once however many
/// buckets follow.
macro_rules! once_per_call {
    () => {
        concat!(
            clock!(),
            "local ",
            now!(),
            include_str!("../../../lua/lib.lua")
        )
    };
}

/// One loadable single-bucket script (refunds, Redis Cluster charges).
macro_rules! script {
    ($name:literal) => {
        concat!(once_per_call!(), algorithm!($name))
    };
}

/// One algorithm wrapped as entry `$index` of the batch script's ALGORITHMS table.
macro_rules! batch_entry {
    ($index:literal, $name:literal) => {
        concat!(
            "ALGORITHMS[",
            $index,
            "] = function(KEYS, ARGV)\n",
            algorithm!($name),
            "\nend\n",
        )
    };
}

/// The table ALGORITHMS of the four algorithms as functions, in the order of
/// `Algorithm::ALL`.
macro_rules! algorithms {
    () => {
        concat!(
            "local ALGORITHMS = {}\n",
            batch_entry!("1", "fixed_window"),
            batch_entry!("2", "token_bucket"),
            batch_entry!("3", "sliding_window"),
            batch_entry!("4", "sliding_log"),
        )
    };
}

/// The batch script (lua/batch.lua) with the four algorithms as functions, sharing one
/// clock reading.
const BATCH: &str = concat!(
    once_per_call!(),
    algorithms!(),
    include_str!("../../../lua/batch.lua"),
);

/// The function library's code after its clock function (see `Library`): the helpers and
/// the algorithms, defined once at `FUNCTION LOAD`; `now` is a library-wide variable that
/// each function sets first (Redis runs one function at a time, so no call sees another's).
const LIBRARY_HEAD: &str = concat!(
    "local now\n",
    include_str!("../../../lua/lib.lua"),
    algorithms!()
);

/// The batch function's name after the library's; each algorithm's function (refunds,
/// Redis Cluster charges) is named after the algorithm.
const BATCH_FUNCTION: &str = "batch";

const FIXED_WINDOW: &str = script!("fixed_window");
const TOKEN_BUCKET: &str = script!("token_bucket");
const SLIDING_WINDOW: &str = script!("sliding_window");
const SLIDING_LOG: &str = script!("sliding_log");

/// The batch script's number for `algorithm` (its index in `Algorithm::ALL`, from 1).
fn batch_index(algorithm: Algorithm) -> usize {
    Algorithm::ALL
        .iter()
        .position(|&a| a == algorithm)
        .expect("every algorithm is listed")
        + 1
}

/// The source of the script that runs `algorithm`.
pub fn source(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::FixedWindow => FIXED_WINDOW,
        Algorithm::TokenBucket => TOKEN_BUCKET,
        Algorithm::SlidingWindow => SLIDING_WINDOW,
        Algorithm::SlidingLog => SLIDING_LOG,
    }
}

/// One script per algorithm with its SHA-1, and the same code as one function library,
/// computed once when a backend is built.
#[derive(Clone)]
pub struct ScriptSet {
    fixed_window: Loaded,
    token_bucket: Loaded,
    sliding_window: Loaded,
    sliding_log: Loaded,
    batch: Loaded,
    library: Arc<Library>,
    /// Set for a pinned set only: the time its calls append to their ARGV.
    clock: Option<Arc<dyn Clock>>,
}

/// A script with its source, which `EVAL` sends after `NOSCRIPT`, and the name of the
/// library function with the same code.
#[derive(Clone)]
struct Loaded {
    script: redis::Script,
    source: Cow<'static, str>,
    function: String,
}

impl Loaded {
    fn new(source: Cow<'static, str>, function: String) -> Loaded {
        Loaded {
            script: redis::Script::new(&source),
            source,
            function,
        }
    }
}

/// The scripts as one Redis function library (`#!lua name=<name>`).
///
/// Its name is `floodgate_` and the start of the SHA-1 of its code, and each function's name
/// starts with the library's: two floodgate versions (a rolling upgrade) or a pinned test
/// set keep apart on one server instead of replacing each other's code, and loading the
/// same library again (`FUNCTION LOAD REPLACE`) changes nothing.
///
/// No function flag is set: every function may write (no `no-writes`), so Redis refuses it
/// on a replica, while out of memory, and on a stale replica, as it refuses a writing
/// `EVALSHA`. Reading `TIME` before writing is allowed: functions replicate their effects.
struct Library {
    name: String,
    code: String,
}

impl Library {
    /// The library whose functions read the clock with `clock_line` (`clock!()` or
    /// `PINNED_CLOCK`).
    fn new(clock_line: &str) -> Library {
        let body = format!(
            "{LIBRARY_HEAD}local function tick(ARGV)\n{clock_line}{}end\n",
            now!()
        );
        let hash = redis::Script::new(&body).get_hash()[..16].to_owned();
        let name = format!("floodgate_{hash}");
        let mut code = format!("#!lua name={name}\n{body}");
        let mut register = |function: &str, run: &str| {
            code.push_str(&format!(
                "redis.register_function('{name}_{function}', function(KEYS, ARGV)\n\
                 tick(ARGV)\n{run}end)\n"
            ));
        };
        register(BATCH_FUNCTION, include_str!("../../../lua/batch.lua"));
        for algorithm in Algorithm::ALL {
            let index = batch_index(algorithm);
            register(
                algorithm.as_str(),
                &format!("return ALGORITHMS[{index}](KEYS, ARGV)\n"),
            );
        }
        Library { name, code }
    }

    /// The name `FCALL` gives for `function` (`BATCH_FUNCTION` or an algorithm's name).
    fn function(&self, function: &str) -> String {
        format!("{}_{function}", self.name)
    }
}

impl fmt::Debug for ScriptSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptSet")
            .field("pinned", &self.clock.is_some())
            .finish_non_exhaustive()
    }
}

impl Default for ScriptSet {
    fn default() -> Self {
        ScriptSet::new()
    }
}

impl ScriptSet {
    /// Hashes the four scripts and the batch script.
    pub fn new() -> ScriptSet {
        ScriptSet::with_sources(Cow::Borrowed, clock!(), None)
    }

    /// For tests: the same scripts on a clock that only moves when the test moves it. Each
    /// script's first line (`clock!()`) reads the last ARGV word instead of `TIME`, and every
    /// call built from this set (`Call`, `BatchCall`, [`ScriptSet::pinned_now`]) appends
    /// `clock`'s time there, so Redis decides at exactly the instant the Rust algorithms and
    /// the memory backend are given. The rest of each script is the production text.
    #[doc(hidden)]
    pub fn pinned(clock: Arc<dyn Clock>) -> ScriptSet {
        let pin = |source: &'static str| {
            let rest = source
                .strip_prefix(clock!())
                .expect("every script starts with the clock line");
            Cow::Owned(format!("{PINNED_CLOCK}{rest}"))
        };
        ScriptSet::with_sources(pin, PINNED_CLOCK, Some(clock))
    }

    fn with_sources(
        source_of: impl Fn(&'static str) -> Cow<'static, str>,
        clock_line: &str,
        clock: Option<Arc<dyn Clock>>,
    ) -> ScriptSet {
        let library = Library::new(clock_line);
        let script = |algorithm: Algorithm| {
            Loaded::new(
                source_of(source(algorithm)),
                library.function(algorithm.as_str()),
            )
        };
        ScriptSet {
            fixed_window: script(Algorithm::FixedWindow),
            token_bucket: script(Algorithm::TokenBucket),
            sliding_window: script(Algorithm::SlidingWindow),
            sliding_log: script(Algorithm::SlidingLog),
            batch: Loaded::new(source_of(BATCH), library.function(BATCH_FUNCTION)),
            library: Arc::new(library),
            clock,
        }
    }

    /// The function library's name (`FUNCTION LIST LIBRARYNAME <name>`).
    pub fn library_name(&self) -> &str {
        &self.library.name
    }

    /// `FUNCTION LOAD REPLACE` of the library: defines its functions, or redefines them
    /// with the same code.
    pub fn library_load(&self) -> Cmd {
        let mut cmd = redis::cmd("FUNCTION");
        cmd.arg("LOAD").arg("REPLACE").arg(&self.library.code);
        cmd
    }

    /// The script that decides many requests' items at once (lua/batch.lua).
    pub fn batch(&self) -> &redis::Script {
        &self.batch.script
    }

    /// The script that runs `algorithm`.
    pub fn get(&self, algorithm: Algorithm) -> &redis::Script {
        &self.loaded(algorithm).script
    }

    fn loaded(&self, algorithm: Algorithm) -> &Loaded {
        match algorithm {
            Algorithm::FixedWindow => &self.fixed_window,
            Algorithm::TokenBucket => &self.token_bucket,
            Algorithm::SlidingWindow => &self.sliding_window,
            Algorithm::SlidingLog => &self.sliding_log,
        }
    }

    /// For tests that call the code directly: one call of `argv`'s algorithm on `key`, as
    /// `scripting` makes it first (`EVALSHA`, or `FCALL` of this set's library), pinned time
    /// included. The script or the library must be loaded (`load_commands`).
    #[doc(hidden)]
    pub fn command(&self, scripting: Scripting, key: &str, argv: Argv) -> Cmd {
        let call = Call {
            key: key.to_owned(),
            argv,
        };
        call.command(self, scripting.first())
    }

    /// The word a call of a pinned set ends with: the pinned time in ms. `None` (no word)
    /// for a real set. Tests that invoke a script directly append it after the [`Argv`].
    pub fn pinned_now(&self) -> Option<i64> {
        self.clock.as_ref().map(|clock| clock.now_ms())
    }

    /// What makes every call of `scripting` known to a node: `SCRIPT LOAD` of every script,
    /// or `FUNCTION LOAD REPLACE` of the library (a cluster client sends either to every
    /// node).
    pub fn load_commands(&self, scripting: Scripting) -> Vec<Cmd> {
        if scripting == Scripting::Functions {
            return vec![self.library_load()];
        }
        Algorithm::ALL
            .iter()
            .map(|&algorithm| &*self.loaded(algorithm).source)
            .chain([&*self.batch.source])
            .map(|source| {
                let mut cmd = redis::cmd("SCRIPT");
                cmd.arg("LOAD").arg(source);
                cmd
            })
            .collect()
    }
}

/// How the backends run the scripts (`--redis-scripting`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scripting {
    /// The function library when the server takes `FUNCTION LOAD` (Redis >= 7), else
    /// scripts.
    #[default]
    Auto,
    /// `EVALSHA`/`EVAL` of scripts, on any version.
    Evalsha,
    /// `FCALL` of the function library; connecting fails on a server before Redis 7.
    Functions,
}

impl Scripting {
    /// How the first attempt of a call names its script (`Auto` must be resolved first).
    pub(crate) fn first(self) -> Via {
        match self {
            Scripting::Functions => Via::Function,
            Scripting::Auto | Scripting::Evalsha => Via::Sha,
        }
    }

    /// After a reply that `is_missing`: what to send before the call (the library load) and
    /// how the call names its script the second time.
    pub(crate) fn again(self, scripts: &ScriptSet) -> (Option<Cmd>, Via) {
        match self {
            Scripting::Functions => (Some(scripts.library_load()), Via::Function),
            Scripting::Auto | Scripting::Evalsha => (None, Via::Source),
        }
    }
}

/// How a command names its script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Via {
    /// `EVALSHA <sha>`: the normal path.
    Sha,
    /// `EVAL <source>`: after `NOSCRIPT`.
    Source,
    /// `FCALL <library>_<function>`.
    Function,
}

impl Via {
    /// `EVALSHA <sha of script>`, `EVAL <source>` or `FCALL <function>`, ready for the keys
    /// and arguments.
    fn command(self, loaded: &Loaded) -> Cmd {
        match self {
            Via::Function => {
                let mut cmd = redis::cmd("FCALL");
                cmd.arg(&loaded.function);
                cmd
            }
            Via::Sha => {
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(loaded.script.get_hash());
                cmd
            }
            Via::Source => {
                let mut cmd = redis::cmd("EVAL");
                cmd.arg(&*loaded.source);
                cmd
            }
        }
    }
}

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
        let mut cmd = via.command(scripts.loaded(self.argv.policy.algorithm));
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
        let mut cmd = via.command(&scripts.batch);
        cmd.arg(calls.iter().map(|call| call.len()).sum::<usize>());
        for call in calls {
            cmd.arg(&call.keys);
        }
        cmd.arg(calls.iter().map(|call| call.groups).sum::<u64>());
        for call in calls {
            cmd.arg(&call.argv);
        }
        cmd.arg(scripts.pinned_now());
        cmd
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
        Value::ServerError(e) => return Err(server_error(&RedisError::from(e))),
        other => {
            return Err(BackendError::failed(format!(
                "unexpected batch reply for {items} items: {other:?}"
            )));
        }
    };
    let mut values = values.into_iter();
    (0..items)
        .map(|_| {
            let reply: Vec<Value> = values.by_ref().take(6).collect();
            let [allowed, remaining, reset_ms, now_ms, booked, rolled_back] =
                integers::<6>(Value::Array(reply))?;
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

/// Whether a reply says that the node does not know the script or the function, so the
/// call did not run.
pub(crate) fn is_missing(value: &Value) -> bool {
    match value {
        Value::ServerError(e) => {
            e.kind() == Some(ServerErrorKind::NoScript)
                || (e.code() == "ERR" && e.details() == Some(FUNCTION_NOT_FOUND))
        }
        _ => false,
    }
}

/// Whether an error says that the node does not know the script or the function.
pub(crate) fn is_missing_error(err: &RedisError) -> bool {
    err.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
        || (err.code() == Some("ERR") && err.detail() == Some(FUNCTION_NOT_FOUND))
}

/// What Redis answers (after `ERR`) to an `FCALL` of a function it does not have.
const FUNCTION_NOT_FOUND: &str = "Function not found";

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
        Value::ServerError(e) => return Err(server_error(&RedisError::from(e))),
        other => {
            return Err(BackendError::failed(format!(
                "unexpected script reply: {other:?}"
            )));
        }
    };
    let mut out = [0i64; N];
    for (slot, item) in out.iter_mut().zip(items) {
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

/// Maps a Redis error to the backend's error kinds, in words that carry no address or
/// credential: transport failures are `Unavailable`, answers from the server `Failed`.
///
/// Server errors keep their code first (`CLUSTERDOWN`, `LOADING`, `TRYAGAIN`, `MASTERDOWN`,
/// `READONLY`, `NOSCRIPT`, ...) and say whether waiting can help, so logs and operators can
/// tell a failover from a broken script.
pub(crate) fn classify(err: &RedisError) -> BackendError {
    match err.kind() {
        ErrorKind::Io | ErrorKind::ClusterConnectionNotFound => {
            BackendError::Unavailable(err.to_string())
        }
        ErrorKind::Server(_) | ErrorKind::Extension => server_error(err),
        ErrorKind::AuthenticationFailed => BackendError::failed("authentication failed"),
        _ => BackendError::failed(format!("{}: {err}", err.category())),
    }
}

fn server_error(err: &RedisError) -> BackendError {
    let code = err.code().unwrap_or("ERR");
    let transient = matches!(
        err.kind(),
        ErrorKind::Server(
            ServerErrorKind::ClusterDown
                | ServerErrorKind::TryAgain
                | ServerErrorKind::BusyLoading
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ReadOnly
                | ServerErrorKind::Moved
                | ServerErrorKind::Ask
        )
    ) || code == "BUSY";
    let detail = err.detail().unwrap_or("");
    let class = if transient { "transient" } else { "permanent" };
    BackendError::Failed {
        detail: format!("{code} ({class}): {detail}"),
        transient,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::BucketKey;
    use crate::rules::Unit;

    #[test]
    fn every_script_has_its_own_hash_and_documents_its_contract() {
        let set = ScriptSet::new();
        let hashes: std::collections::HashSet<&str> = Algorithm::ALL
            .iter()
            .map(|&a| set.get(a).get_hash())
            .collect();
        assert_eq!(hashes.len(), 4);
        assert!(!hashes.contains(set.batch().get_hash()));
        for algorithm in Algorithm::ALL {
            let src = source(algorithm);
            for word in ["KEYS[1]", "ARGV[9]", "Reply", "PEXPIRE", "TIME"] {
                assert!(src.contains(word), "{algorithm}: header lacks {word}");
            }
        }
        assert_eq!(set.load_commands(Scripting::Evalsha).len(), 5);
        assert_eq!(set.load_commands(Scripting::Functions).len(), 1);
    }

    #[test]
    fn the_library_holds_every_script_once_and_is_named_after_its_code() {
        let set = ScriptSet::new();
        let code = &set.library.code;
        let name = set.library_name();
        assert!(code.starts_with(&format!("#!lua name={name}\n")));
        assert!(name.starts_with("floodgate_") && name.len() == "floodgate_".len() + 16);
        // The helpers are defined once, at load; each function reads the clock itself.
        assert_eq!(code.matches("local function cdiv").count(), 1);
        assert_eq!(code.matches(clock!()).count(), 1, "once, in tick");
        for function in ["batch", "fixed_window", "sliding_log"] {
            let registered = format!("redis.register_function('{name}_{function}',");
            assert_eq!(code.matches(&registered).count(), 1, "{function}");
        }
        assert_eq!(code.matches("redis.register_function(").count(), 5);
        assert_eq!(
            ScriptSet::new().library_name(),
            name,
            "the same code, the same name"
        );
        let clock = Arc::new(crate::clock::ManualClock::new(0));
        let pinned = ScriptSet::pinned(clock);
        assert_ne!(pinned.library_name(), name, "a pinned library keeps apart");
        assert!(pinned.library.code.contains(PINNED_CLOCK));
        assert!(!pinned.library.code.contains(clock!()));
        let batch = BatchCall::command(&[], &set, Via::Function);
        assert_eq!(words(&batch)[..3], ["FCALL", &format!("{name}_batch"), "0"]);
    }

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
    fn a_pinned_set_changes_only_the_clock_line_and_ends_every_call_with_the_time() {
        let clock = Arc::new(crate::clock::ManualClock::new(4_102_444_812_345));
        let pinned = ScriptSet::pinned(clock.clone());
        let real = ScriptSet::new();
        for algorithm in Algorithm::ALL {
            let text = &pinned.loaded(algorithm).source;
            assert_eq!(
                text.strip_prefix(PINNED_CLOCK),
                source(algorithm).strip_prefix(clock!())
            );
            let (a, b) = (pinned.get(algorithm), real.get(algorithm));
            assert_ne!(a.get_hash(), b.get_hash(), "{algorithm}");
        }
        assert_eq!(
            pinned.batch.source.strip_prefix(PINNED_CLOCK),
            BATCH.strip_prefix(clock!())
        );
        assert_eq!(real.pinned_now(), None);
        clock.advance(5);
        assert_eq!(pinned.pinned_now(), Some(4_102_444_812_350));

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

    fn server(reply: &[u8]) -> RedisError {
        match redis::parse_redis_value(reply).unwrap() {
            Value::ServerError(e) => RedisError::from(e),
            other => panic!("not an error: {other:?}"),
        }
    }

    #[test]
    fn errors_are_classified_with_their_code() {
        for (reply, code, class) in [
            (
                &b"-CLUSTERDOWN The cluster is down\r\n"[..],
                "CLUSTERDOWN",
                "transient",
            ),
            (
                b"-LOADING Redis is loading the dataset\r\n",
                "LOADING",
                "transient",
            ),
            (
                b"-TRYAGAIN Multiple keys request during rehashing\r\n",
                "TRYAGAIN",
                "transient",
            ),
            (
                b"-BUSY Redis is busy running a script\r\n",
                "BUSY",
                "transient",
            ),
            (b"-NOSCRIPT No matching script\r\n", "NOSCRIPT", "permanent"),
            (
                b"-ERR floodgate fixed_window: bad arguments\r\n",
                "ERR",
                "permanent",
            ),
        ] {
            let err = server(reply);
            let classified = classify(&err);
            let BackendError::Failed { detail: text, .. } = &classified else {
                panic!("{err:?} is not Failed");
            };
            assert!(text.starts_with(&format!("{code} ({class})")), "{text}");
            assert_eq!(classified.is_transient(), class == "transient", "{text}");
        }
        assert!(is_missing_error(&server(
            b"-NOSCRIPT No matching script\r\n"
        )));
        assert!(is_missing_error(&server(b"-ERR Function not found\r\n")));
        assert!(!is_missing_error(&server(b"-ERR floodgate batch: bad\r\n")));
        let reply = redis::parse_redis_value(b"-ERR Function not found\r\n").unwrap();
        assert!(is_missing(&reply));
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(matches!(classify(&io), BackendError::Unavailable(_)));
        assert!(classify(&io).is_transient());
    }
}
