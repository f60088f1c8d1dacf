//! The flags of the quota service (RLQS, docs/rlqs.md).

use super::FlagError;
use clap::Args;

use super::GoDuration;
use crate::rlqs::{DEFAULT_MAX_BUCKETS, RlqsSettings};

/// Longest `--rlqs-abandon-after`: a bucket idle for a day is gone.
const MAX_ABANDON_AFTER: std::time::Duration = std::time::Duration::from_secs(86_400);

/// Default of `--rlqs-abandon-after`.
pub const DEFAULT_RLQS_ABANDON_AFTER: &str = "60s";

/// The quota service (RLQS).
#[derive(Debug, Clone, Args)]
pub struct RlqsArgs {
    /// Most buckets one RLQS stream may hold (a connection's streams 2x as many, the process
    /// 20x); a bucket past it is left unanswered, and the stream stays open.
    #[arg(
        long,
        env = "FLOODGATE_RLQS_MAX_BUCKETS",
        value_name = "N",
        default_value_t = DEFAULT_MAX_BUCKETS,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
    )]
    pub rlqs_max_buckets: usize,
    /// A bucket reported without demand (or not reported) for this long (Go syntax: 60s,
    /// 5m; at most 24h) is answered with abandon_action and forgotten.
    #[arg(long, env = "FLOODGATE_RLQS_ABANDON_AFTER", value_name = "DURATION", default_value = DEFAULT_RLQS_ABANDON_AFTER)]
    pub rlqs_abandon_after: GoDuration,
}

impl RlqsArgs {
    /// The settings these flags give.
    ///
    /// # Errors
    /// An abandon time of zero or over a day.
    pub fn settings(&self) -> Result<RlqsSettings, FlagError> {
        let abandon = self.rlqs_abandon_after.0;
        if abandon.is_zero() || abandon > MAX_ABANDON_AFTER {
            return Err(FlagError::OutOfRange {
                flag: "--rlqs-abandon-after",
                expected: "more than 0 and at most 24h",
            });
        }
        Ok(RlqsSettings {
            max_buckets: self.rlqs_max_buckets,
            abandon_after: self.rlqs_abandon_after.0,
        })
    }
}
