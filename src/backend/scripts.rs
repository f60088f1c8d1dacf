//! The Lua scripts of `lua/`, hashed once, and how a charge or refund becomes one command.
//!
//! Every script takes one key (the bucket) and the same ARGV (see the header of each file),
//! and answers integers only. Commands go out as `EVALSHA`; a node that answers `NOSCRIPT`
//! (restarted, flushed, or a replica promoted since the scripts were loaded) gets the same
//! call again as `EVAL` with the source, which runs it and caches it in one step on exactly
//! the node that owns the key. A retry never repeats a call that ran: `NOSCRIPT` means the
//! script did not start.

use redis::{Cmd, ErrorKind, RedisError, ServerErrorKind, Value};

use super::{BackendError, Charge, Outcome, Refund};
use crate::rules::{Algorithm, OnOverLimit, Policy};

/// One loadable script: its name, the shared head (arguments, clock, integer helpers), the
/// algorithm, and the shared tail (the order of `Bucket::decide`: peek, lock, algorithm,
/// lockout), so what all four share is written once.
macro_rules! script {
    ($name:literal) => {
        concat!(
            "local ALGORITHM = '",
            $name,
            "'\n",
            include_str!("../../lua/prelude.lua"),
            include_str!(concat!("../../lua/", $name, ".lua")),
            include_str!("../../lua/decide.lua"),
        )
    };
}

const FIXED_WINDOW: &str = script!("fixed_window");
const TOKEN_BUCKET: &str = script!("token_bucket");
const SLIDING_WINDOW: &str = script!("sliding_window");
const SLIDING_LOG: &str = script!("sliding_log");

const ALGORITHMS: [Algorithm; 4] = [
    Algorithm::FixedWindow,
    Algorithm::TokenBucket,
    Algorithm::SlidingWindow,
    Algorithm::SlidingLog,
];

/// The source of the script that runs `algorithm`.
pub fn source(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::FixedWindow => FIXED_WINDOW,
        Algorithm::TokenBucket => TOKEN_BUCKET,
        Algorithm::SlidingWindow => SLIDING_WINDOW,
        Algorithm::SlidingLog => SLIDING_LOG,
    }
}

/// One script per algorithm with its SHA-1, computed once when a backend is built.
#[derive(Debug, Clone)]
pub struct ScriptSet {
    fixed_window: redis::Script,
    token_bucket: redis::Script,
    sliding_window: redis::Script,
    sliding_log: redis::Script,
}

impl Default for ScriptSet {
    fn default() -> Self {
        ScriptSet::new()
    }
}

impl ScriptSet {
    /// Hashes the four scripts.
    pub fn new() -> ScriptSet {
        let script = |algorithm| redis::Script::new(source(algorithm));
        ScriptSet {
            fixed_window: script(Algorithm::FixedWindow),
            token_bucket: script(Algorithm::TokenBucket),
            sliding_window: script(Algorithm::SlidingWindow),
            sliding_log: script(Algorithm::SlidingLog),
        }
    }

    /// The script that runs `algorithm`.
    pub fn get(&self, algorithm: Algorithm) -> &redis::Script {
        match algorithm {
            Algorithm::FixedWindow => &self.fixed_window,
            Algorithm::TokenBucket => &self.token_bucket,
            Algorithm::SlidingWindow => &self.sliding_window,
            Algorithm::SlidingLog => &self.sliding_log,
        }
    }

    /// `SCRIPT LOAD` of every script (a cluster client sends it to every node).
    pub(crate) fn load_commands() -> impl Iterator<Item = Cmd> {
        ALGORITHMS.into_iter().map(|algorithm| {
            let mut cmd = redis::cmd("SCRIPT");
            cmd.arg("LOAD").arg(source(algorithm));
            cmd
        })
    }
}

/// How a command names its script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Via {
    /// `EVALSHA <sha>`: the normal path.
    Sha,
    /// `EVAL <source>`: after `NOSCRIPT`.
    Source,
}

/// One script call: which script, on which key, with which ARGV.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    key: String,
    op: &'static str,
    cost: u64,
    policy: Policy,
    booked_at_ms: i64,
    refund_id: u64,
}

impl Call {
    /// The call that decides `charge` on the bucket stored under `prefix`.
    pub(crate) fn charge(charge: &Charge, prefix: &str) -> Call {
        Call {
            key: charge.bucket.redis_key(prefix),
            op: "charge",
            cost: charge.cost,
            policy: charge.policy,
            booked_at_ms: 0,
            refund_id: 0,
        }
    }

    /// The call that undoes `refund` on the bucket stored under `prefix`.
    pub(crate) fn refund(refund: &Refund, prefix: &str) -> Call {
        Call {
            key: refund.bucket.redis_key(prefix),
            op: "refund",
            cost: refund.cost,
            policy: refund.policy,
            booked_at_ms: refund.booked_at_ms,
            refund_id: refund.id,
        }
    }

    /// The command: `EVALSHA sha 1 key argv...` or `EVAL source 1 key argv...`.
    pub(crate) fn command(&self, scripts: &ScriptSet, via: Via) -> Cmd {
        let mut cmd = match via {
            Via::Sha => {
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(scripts.get(self.policy.algorithm).get_hash());
                cmd
            }
            Via::Source => {
                let mut cmd = redis::cmd("EVAL");
                cmd.arg(source(self.policy.algorithm));
                cmd
            }
        };
        // Numbers are written straight into the command buffer: no string per argument.
        let policy = &self.policy;
        let consume = policy.on_over_limit == OnOverLimit::Consume;
        cmd.arg(1)
            .arg(&self.key)
            .arg(self.op)
            .arg(self.cost)
            .arg(policy.window_ms())
            .arg(policy.requests_per_unit)
            .arg(policy.burst)
            .arg(if consume { "1" } else { "0" })
            .arg(policy.lockout_ms())
            .arg(self.booked_at_ms)
            .arg(self.refund_id);
        cmd
    }
}

/// Whether a reply says that the node does not know the script.
pub(crate) fn is_noscript(value: &Value) -> bool {
    matches!(value, Value::ServerError(e) if e.kind() == Some(ServerErrorKind::NoScript))
}

/// Whether an error says that the node does not know the script.
pub(crate) fn is_noscript_error(err: &RedisError) -> bool {
    err.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

/// Reads a charge reply `{allowed, remaining, reset_ms, now_ms, booked}`.
pub(crate) fn outcome(value: Value) -> Result<Outcome, BackendError> {
    match integers::<5>(value)? {
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
        }),
        other => Err(BackendError::Failed(format!(
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
            return Err(BackendError::Failed(format!(
                "unexpected script reply: {other:?}"
            )));
        }
    };
    let mut out = [0i64; N];
    for (slot, item) in out.iter_mut().zip(items) {
        *slot = match item {
            Value::Int(i) => i,
            other => {
                return Err(BackendError::Failed(format!(
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
        ErrorKind::AuthenticationFailed => BackendError::Failed("authentication failed".to_owned()),
        _ => BackendError::Failed(format!("{}: {err}", err.category())),
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
    BackendError::Failed(format!("{code} ({class}): {detail}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::BucketKey;
    use crate::rules::Unit;

    #[test]
    fn every_script_has_its_own_hash_and_documents_its_contract() {
        let set = ScriptSet::new();
        let hashes: std::collections::HashSet<&str> =
            ALGORITHMS.iter().map(|&a| set.get(a).get_hash()).collect();
        assert_eq!(hashes.len(), 4);
        for algorithm in ALGORITHMS {
            let src = source(algorithm);
            for word in ["KEYS[1]", "ARGV[9]", "Reply", "PEXPIRE", "TIME"] {
                assert!(src.contains(word), "{algorithm}: header lacks {word}");
            }
        }
        assert_eq!(ScriptSet::load_commands().count(), 4);
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
        let packed = call
            .command(&ScriptSet::new(), Via::Sha)
            .get_packed_command();
        let words: Vec<String> = String::from_utf8(packed)
            .unwrap()
            .split("\r\n")
            .filter(|w| !w.is_empty() && !w.starts_with(['*', '$']))
            .map(String::from)
            .collect();
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
            let BackendError::Failed(text) = classify(&err) else {
                panic!("{err:?} is not Failed");
            };
            assert!(text.starts_with(&format!("{code} ({class})")), "{text}");
        }
        assert!(is_noscript_error(&server(
            b"-NOSCRIPT No matching script\r\n"
        )));
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(matches!(classify(&io), BackendError::Unavailable(_)));
    }
}
