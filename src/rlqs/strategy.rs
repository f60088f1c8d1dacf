//! What an assignment is: the strategy a client applies to a bucket, as floodgate decides
//! it, before `wire` writes it the way Envoy reads it.

use std::time::Duration;

/// What a client does with a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Admit everything.
    AllowAll,
    /// Deny everything.
    DenyAll,
    /// Envoy's token bucket: starts with `max_tokens`, gains `tokens_per_fill` every
    /// `fill_interval` (whole seconds, at least 1), continuously.
    TokenBucket {
        /// Capacity, and the tokens a new bucket starts with.
        max_tokens: u32,
        /// Tokens added each fill.
        tokens_per_fill: u32,
        /// Time between fills.
        fill_interval: Duration,
    },
}

impl Strategy {
    /// The label of the `floodgate_rlqs_assignments` metric.
    pub fn label(&self) -> &'static str {
        match self {
            Strategy::AllowAll => "allow_all",
            Strategy::DenyAll => "deny_all",
            Strategy::TokenBucket { .. } => "token_bucket",
        }
    }

    /// `max_tokens` of a token bucket.
    pub fn max_tokens(&self) -> Option<u32> {
        match self {
            Strategy::TokenBucket { max_tokens, .. } => Some(*max_tokens),
            _ => None,
        }
    }

    /// The same strategy holding at most `most` tokens, when it is a token bucket.
    pub fn holding_at_most(self, most: u32) -> Strategy {
        match self {
            Strategy::TokenBucket {
                max_tokens,
                tokens_per_fill,
                fill_interval,
            } => Strategy::TokenBucket {
                max_tokens: max_tokens.min(most),
                tokens_per_fill,
                fill_interval,
            },
            other => other,
        }
    }

    /// Tokens per second of a token bucket.
    pub fn rate(&self) -> Option<f64> {
        match self {
            Strategy::TokenBucket {
                tokens_per_fill,
                fill_interval,
                ..
            } => Some(f64::from(*tokens_per_fill) / fill_interval.as_secs_f64()),
            _ => None,
        }
    }
}

/// A strategy and how long it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Assignment {
    /// What to do.
    pub strategy: Strategy,
    /// When the client drops it (and applies its expired-assignment behaviour).
    pub ttl: Duration,
}
