//! The Lua scripts of `lua/`, assembled and hashed once: what Redis runs. How a charge or a
//! refund becomes a command is `super::calls`; what a Redis error means, `super::errors`.
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
//!
//! `tests/it/lua.rs` writes every assembled script and the library under
//! `target/lua-assembled/` (`ScriptSet::assembled`), to read what Redis actually runs.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use redis::Cmd;

use crate::clock::Clock;
use crate::rules::Algorithm;

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

/// An algorithm as a Lua expression: a function(KEYS, ARGV) that answers one call. What does
/// not change between calls is made once, when the expression is evaluated: the algorithm's
/// functions and the variables they share (its name, the arguments, the bucket's state), so
/// a call allocates no closure. Each call then runs the shared head (arguments), the
/// algorithm's `load()` (the bucket's state, or a refund's reply), and the shared tail (the
/// order of `Bucket::decide`: peek, lock, algorithm, lockout), so what all four share is
/// written once. Redis runs one script at a time and an algorithm's call never reenters it,
/// so the shared variables are never in use twice. It expects `once_per_call!` before it.
macro_rules! algorithm {
    ($name:literal) => {
        concat!(
            "(function()\nlocal ALGORITHM = '",
            $name,
            "'\nlocal key, op, n, W, L, B, consume, lockout, refund_id, booked_at, spread\n",
            include_str!(concat!("../../../lua/", $name, ".lua")),
            "return function(KEYS, ARGV)\n",
            include_str!("../../../lua/prelude.lua"),
            "local answer = load()\nif answer then\nreturn answer\nend\n",
            include_str!("../../../lua/decide.lua"),
            "\nend\nend)()",
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

/// One loadable single-bucket script (refunds, Redis Cluster charges): the algorithm as a
/// function, so that its writes go out (`flush()` of lua/lib.lua) whichever way it returns.
macro_rules! script {
    ($name:literal) => {
        concat!(
            once_per_call!(),
            "local run = ",
            algorithm!($name),
            "\nlocal reply = run(KEYS, ARGV)\nflush()\nreturn reply\n",
        )
    };
}

/// One algorithm wrapped as entry `$index` of the batch script's ALGORITHMS table.
macro_rules! batch_entry {
    ($index:literal, $name:literal) => {
        concat!("ALGORITHMS[", $index, "] = ", algorithm!($name), "\n",)
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

/// The lease script of a global rule (lua/lease.lua), with the algorithms it peeks and
/// rescales through, run beside the decisions (`backend::SideCall`).
pub const LEASE: &str = concat!(
    once_per_call!(),
    algorithms!(),
    include_str!("../../../lua/lease.lua"),
);

/// The function library's code after its clock function (see `Library`): the helpers and
/// the algorithms, defined once at `FUNCTION LOAD`; `now` and the bucket cache are
/// library-wide variables that each function sets first (`tick`: Redis runs one function at a
/// time, so no call sees another's).
const LIBRARY_HEAD: &str = concat!(
    "local now\n",
    include_str!("../../../lua/lib.lua"),
    algorithms!()
);

/// The batch function's name after the library's; each algorithm's function (refunds,
/// Redis Cluster charges) is named after the algorithm.
const BATCH_FUNCTION: &str = "batch";

/// The Redis Cluster batch function's name after the library's (see `BATCH_SLOTS_HEAD`).
const BATCH_SLOTS_FUNCTION: &str = "batch_slots";

/// The start of the Redis Cluster batch function: the batch of `lua/batch.lua` over keys of
/// many slots that one node holds. Declared keys of several slots are refused (`CROSSSLOT`)
/// before any code runs, so its keys come first in ARGV (`nkeys key... G argv...`), and the
/// function is registered with the flag `allow-cross-slot-keys`. A key the node does not
/// hold (a slot moved or migrating) makes `redis.call` fail for that key, inside the group's
/// `pcall`: that group alone fails, with its bookings undone, and the caller retries it.
///
/// The split is two `unpack`s, not a loop per word: about 1.5 us less of Redis per call of 16
/// items.
const BATCH_SLOTS_HEAD: &str = "local count = tonumber(ARGV[1])
KEYS, ARGV = {unpack(ARGV, 2, count + 1)}, {unpack(ARGV, count + 2)}
";

const FIXED_WINDOW: &str = script!("fixed_window");
const TOKEN_BUCKET: &str = script!("token_bucket");
const SLIDING_WINDOW: &str = script!("sliding_window");
const SLIDING_LOG: &str = script!("sliding_log");

/// The batch script's number for `algorithm` (its index in `Algorithm::ALL`, from 1).
pub(super) fn batch_index(algorithm: Algorithm) -> usize {
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
    /// `FCALL` name of the Redis Cluster batch function (`BATCH_SLOTS_HEAD`).
    batch_slots: String,
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
            "{LIBRARY_HEAD}local function tick(ARGV)\n{clock_line}{}forget()\nend\n",
            now!()
        );
        // Registered under `NAME_<function>`, NAME replaced by the library's name once the
        // whole code is hashed.
        let mut functions = String::new();
        let mut register = |function: &str, head: &str, run: &str, flags: &str| {
            functions.push_str(&format!(
                "redis.register_function{{function_name = 'NAME_{function}', \
                 callback = function(KEYS, ARGV)\n{head}tick(ARGV)\n{run}end, \
                 flags = {{{flags}}}}}\n"
            ));
        };
        let batch = include_str!("../../../lua/batch.lua");
        register(BATCH_FUNCTION, "", batch, "");
        register(
            BATCH_SLOTS_FUNCTION,
            BATCH_SLOTS_HEAD,
            batch,
            "'allow-cross-slot-keys'",
        );
        for algorithm in Algorithm::ALL {
            let index = batch_index(algorithm);
            register(
                algorithm.as_str(),
                "",
                &format!("local reply = ALGORITHMS[{index}](KEYS, ARGV)\nflush()\nreturn reply\n"),
                "",
            );
        }
        let hash = redis::Script::new(&format!("{body}{functions}")).get_hash()[..16].to_owned();
        let name = format!("floodgate_{hash}");
        let functions = functions.replace("'NAME_", &format!("'{name}_"));
        let code = format!("#!lua name={name}\n{body}{functions}");
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
    /// call built from this set (`Call`, `GroupWords`, [`ScriptSet::pinned_now`]) appends
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
            batch_slots: library.function(BATCH_SLOTS_FUNCTION),
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

    /// The start of a call of `algorithm`'s script named `via`, ready for the keys and
    /// arguments.
    pub(super) fn algorithm_head(&self, algorithm: Algorithm, via: Via) -> Cmd {
        via.command(self.loaded(algorithm))
    }

    /// The start of a call of the batch script named `via`.
    pub(super) fn batch_head(&self, via: Via) -> Cmd {
        via.command(&self.batch)
    }

    /// The start of a call of the Redis Cluster batch function (declaring no key, see
    /// `BATCH_SLOTS_HEAD`), ready for its ARGV.
    pub(super) fn batch_slots_head(&self) -> Cmd {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(&self.batch_slots).arg(0);
        cmd
    }

    /// Every script as Redis receives it, named after its file (`fixed_window.lua`, ...,
    /// `batch.lua`), and the function library (`library.lua`): what `tests/it/lua.rs` writes
    /// under `target/lua-assembled/` for a reader.
    pub fn assembled(&self) -> Vec<(String, String)> {
        Algorithm::ALL
            .iter()
            .map(|&algorithm| (algorithm.as_str(), &*self.loaded(algorithm).source))
            .chain([
                ("batch", &*self.batch.source),
                ("library", &self.library.code),
            ])
            .map(|(name, code)| (format!("{name}.lua"), code.to_owned()))
            .collect()
    }

    /// The word a call of a pinned set ends with: the pinned time in ms. `None` (no word)
    /// for a real set. Tests that invoke a script directly append it after the ARGV.
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

#[cfg(test)]
mod tests {
    use super::*;

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
            let registered = format!("function_name = '{name}_{function}',");
            assert_eq!(code.matches(&registered).count(), 1, "{function}");
        }
        assert_eq!(code.matches("redis.register_function{").count(), 6);
        assert_eq!(code.matches("'allow-cross-slot-keys'").count(), 1);
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
    }

    #[test]
    fn a_pinned_set_changes_only_the_clock_line() {
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
    }

    #[test]
    fn assembled_names_every_script_and_the_library() {
        let set = ScriptSet::new();
        let assembled = set.assembled();
        let names: Vec<&str> = assembled.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(
            names,
            [
                "fixed_window.lua",
                "token_bucket.lua",
                "sliding_window.lua",
                "sliding_log.lua",
                "batch.lua",
                "library.lua"
            ]
        );
        assert_eq!(assembled[0].1, source(Algorithm::FixedWindow));
        assert_eq!(assembled[4].1, BATCH);
        assert!(assembled[5].1.starts_with("#!lua name=floodgate_"));
    }
}
