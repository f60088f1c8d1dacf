//! Why a bench run could not start or finish: bad options, an unreachable target, a file it
//! cannot write. Calls that fail during a run are outcomes, counted in the summary.

use std::net::SocketAddr;
use std::path::PathBuf;

/// A bench run that could not be made.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A target that is not on this machine: bench only loads loopback addresses.
    #[error("{flag} {addr} is not a loopback address: bench only loads 127.0.0.1 or ::1")]
    NotLoopback {
        /// `--target` or `--rlqs-replica`.
        flag: &'static str,
        /// The address given.
        addr: SocketAddr,
    },
    /// An option out of its range.
    #[error("{flag} must be {expected}")]
    OutOfRange {
        /// The option.
        flag: &'static str,
        /// What it must be.
        expected: String,
    },
    /// More keys than `--record` follows.
    #[error("--record follows at most {max} keys (--keys {keys})")]
    TooManyRecordedKeys {
        /// The most `--record` follows.
        max: u64,
        /// `--keys`.
        keys: u64,
    },
    /// An empty name.
    #[error("--domain, --key and --over-limit-key must not be empty")]
    EmptyName,
    /// `--record-config` does not load.
    #[error("--record-config {}: {errors}", dir.display())]
    RecordConfig {
        /// The directory.
        dir: PathBuf,
        /// Every error, one per line.
        errors: crate::config::ConfigErrors,
    },
    /// The target cannot be reached at the start.
    #[error("cannot connect to {target}: {reason}")]
    Connect {
        /// The address.
        target: SocketAddr,
        /// Why.
        reason: String,
    },
    /// A quota stream could not be opened or fed.
    #[error("quota stream: {0}")]
    Stream(String),
    /// A task of the run died.
    #[error("a task of the run failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// A caller outlived the run (a bug).
    #[error("a caller outlived the run")]
    Outlived,
    /// The `--record` file cannot be written.
    #[error("cannot write --record {}: {source}", path.display())]
    Record {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}
