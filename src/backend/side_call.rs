//! Small scripts beside the decisions: the replica registry and the region leases call a
//! script of `lua/` on the node that holds their keys, a few times a second at most, so
//! they go as `EVALSHA` (then `EVAL` once a node does not know it) on the backend's own
//! connections rather than through the batcher.

use redis::{Cmd, Value};

use super::BackendError;

/// One call of `source` on `keys` (written without the key prefix; every key of a call
/// carries the same hash tag), with `args`.
#[derive(Debug, Clone)]
pub struct SideCall {
    /// The script's text.
    pub source: &'static str,
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
            cmd.arg(self.source);
            cmd
        } else {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(redis::Script::new(self.source).get_hash());
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

/// Whether a reply says the node does not know the script yet.
pub(crate) fn is_noscript(value: &Value) -> bool {
    matches!(value, Value::ServerError(error) if error.code() == "NOSCRIPT")
}

/// A script's reply, or the server's error as a backend error.
pub(crate) fn reply(value: Option<Value>) -> Result<Value, BackendError> {
    match value {
        Some(Value::ServerError(error)) => Err(super::redis::server_error(error)),
        Some(value) => Ok(value),
        None => Err(BackendError::failed("no reply to a side call")),
    }
}
