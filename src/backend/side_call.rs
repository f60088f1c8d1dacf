//! Small scripts beside the decisions: the replica registry and the region leases call a
//! script of `lua/` on the node that holds their keys, a few times a second at most, so
//! they go as `EVALSHA` (then `EVAL` once a node does not know it) on the backend's own
//! connections rather than through the batcher.

use std::sync::OnceLock;

use redis::{Cmd, Value};

use super::BackendError;

/// A script's text and its SHA-1, hashed once (the lease script carries every algorithm:
/// some 20 KB to hash on each call otherwise).
pub struct SideScript {
    source: &'static str,
    sha: OnceLock<String>,
}

impl SideScript {
    /// The script of `source`.
    pub const fn new(source: &'static str) -> SideScript {
        SideScript {
            source,
            sha: OnceLock::new(),
        }
    }

    fn sha(&self) -> &str {
        self.sha
            .get_or_init(|| redis::Script::new(self.source).get_hash().to_owned())
    }
}

impl std::fmt::Debug for SideScript {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SideScript")
            .field("sha", &self.sha())
            .finish()
    }
}

/// One call of `script` on `keys` (written without the key prefix; every key of a call
/// carries the same hash tag), with `args`.
#[derive(Debug, Clone)]
pub struct SideCall {
    /// The script.
    pub script: &'static SideScript,
    /// Its keys, each then stored as `<prefix>:<key>`.
    pub keys: Vec<String>,
    /// Its arguments.
    pub args: Vec<String>,
}

impl SideCall {
    /// `EVALSHA` of the script, or `EVAL` of its text when `by_text`, on keys under `prefix`.
    pub(crate) fn command(&self, prefix: &str, by_text: bool) -> Cmd {
        let mut cmd = if by_text {
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(self.script.source);
            cmd
        } else {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(self.script.sha());
            cmd
        };
        cmd.arg(self.keys.len());
        for key in &self.keys {
            cmd.arg(format!("{prefix}:{key}"));
        }
        cmd.arg(&self.args);
        cmd
    }
}

/// A script's reply, or the server's error as a backend error.
pub(crate) fn reply(value: Option<Value>) -> Result<Value, BackendError> {
    match value {
        Some(Value::ServerError(error)) => Err(super::redis::server_error(error)),
        Some(value) => Ok(value),
        None => Err(BackendError::failed("no reply to a side call")),
    }
}
