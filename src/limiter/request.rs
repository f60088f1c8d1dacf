//! Protocol-free request and response of one rate-limit decision.
//!
//! `service` translates Envoy's protobufs to and from these; the engine never sees
//! protocol types.

use std::sync::Arc;
use std::time::Duration;

use crate::rules::{Metadata, Unit};

/// Bounds on one request: they keep the work per request small and predictable.
pub mod bounds {
    /// Most descriptors in one request.
    pub const MAX_DESCRIPTORS: usize = 64;
    /// Most entries in one descriptor.
    pub const MAX_ENTRIES: usize = 32;
    /// Longest key or value, in bytes.
    pub const MAX_TEXT_BYTES: usize = 4096;
    /// Longest domain, in bytes.
    pub const MAX_DOMAIN_BYTES: usize = 4096;
}

/// A validated rate-limit request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Rule namespace; non-empty.
    pub domain: String,
    /// At least one descriptor, at most `bounds::MAX_DESCRIPTORS`.
    pub descriptors: Vec<Descriptor>,
}

/// One descriptor: the entries that select a rule, and what the request costs there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    /// Ordered (key, value) pairs; at least one, keys non-empty.
    pub entries: Vec<(String, String)>,
    /// `n`, already resolved from the descriptor's and the request's hits_addend.
    pub cost: u64,
    /// A limit the caller asks to use instead of the configured one.
    pub limit_override: Option<LimitOverride>,
}

/// The per-descriptor limit override Envoy may send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitOverride {
    /// Requests per unit.
    pub requests_per_unit: u32,
    /// Window unit.
    pub unit: Unit,
}

/// Why a request is rejected before evaluation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidRequest(pub String);

impl Request {
    /// Checks that a request has 1..=`MAX_DESCRIPTORS` descriptors.
    ///
    /// # Errors
    /// A message saying which bound is broken.
    pub fn check_descriptor_count(count: usize) -> Result<(), InvalidRequest> {
        if count == 0 {
            return Err(InvalidRequest("at least one descriptor is required".into()));
        }
        if count > bounds::MAX_DESCRIPTORS {
            return Err(InvalidRequest(format!(
                "{count} descriptors exceed the limit of {}",
                bounds::MAX_DESCRIPTORS
            )));
        }
        Ok(())
    }

    /// Checks the request rules of docs/requests.md#validation: non-empty domain, 1..=64
    /// descriptors, each with 1..=32 entries, non-empty keys, keys and values at most 4 KiB.
    ///
    /// # Errors
    /// A message naming the first offending field.
    pub fn validate(&self) -> Result<(), InvalidRequest> {
        use bounds::*;
        let fail = |message: String| Err(InvalidRequest(message));
        if self.domain.is_empty() {
            return fail("domain must not be empty".into());
        }
        if self.domain.len() > MAX_DOMAIN_BYTES {
            return fail(format!("domain is longer than {MAX_DOMAIN_BYTES} bytes"));
        }
        Request::check_descriptor_count(self.descriptors.len())?;
        for (i, descriptor) in self.descriptors.iter().enumerate() {
            let entries = &descriptor.entries;
            if entries.is_empty() {
                return fail(format!("descriptors[{i}] has no entries"));
            }
            if entries.len() > MAX_ENTRIES {
                return fail(format!(
                    "descriptors[{i}] has {} entries, more than {MAX_ENTRIES}",
                    entries.len()
                ));
            }
            for (j, (key, value)) in entries.iter().enumerate() {
                if key.is_empty() {
                    return fail(format!("descriptors[{i}].entries[{j}].key is empty"));
                }
                if key.len() > MAX_TEXT_BYTES || value.len() > MAX_TEXT_BYTES {
                    return fail(format!(
                        "descriptors[{i}].entries[{j}] key or value is longer than {MAX_TEXT_BYTES} bytes"
                    ));
                }
            }
        }
        Ok(())
    }
}

/// A verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// Allow.
    Ok,
    /// Deny.
    OverLimit,
}

/// The limit a status was decided against, as reported to the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentLimit {
    /// `L`.
    pub requests_per_unit: u32,
    /// The configured unit (a multiplier shows in `window`, not here).
    pub unit: Unit,
    /// The rule's `name`, if any.
    pub name: Option<String>,
    /// Label for headers: the name, else the rule path.
    pub label: String,
    /// The full window `W` (unit x multiplier).
    pub window: Duration,
}

/// The decision for one descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// This descriptor's verdict.
    pub code: Code,
    /// The matched limit; `None` when nothing (or an unlimited rule) matched.
    pub current_limit: Option<CurrentLimit>,
    /// Requests left (0 when over; `u32::MAX` for unlimited).
    pub limit_remaining: u32,
    /// Whole seconds until reset, `ceil(R / 1000)`; `None` without a limit.
    pub reset_seconds: Option<u64>,
    /// The matched rule's `metadata`, for the response's dynamic metadata; `None` when no
    /// counted rule decided this status.
    pub metadata: Option<Arc<Metadata>>,
}

impl Status {
    /// OK with no limit: unknown domain, unmatched or replaced descriptor.
    pub fn unmatched() -> Status {
        Status {
            code: Code::Ok,
            current_limit: None,
            limit_remaining: 0,
            reset_seconds: None,
            metadata: None,
        }
    }

    /// OK from an `unlimited` rule.
    pub fn unlimited() -> Status {
        Status {
            limit_remaining: u32::MAX,
            ..Status::unmatched()
        }
    }
}

/// The decision for a whole request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The verdict Envoy enforces.
    pub overall: Code,
    /// One status per request descriptor, in request order.
    pub statuses: Vec<Status>,
    /// Decided from this replica's memory, cut off from Redis (failure mode `local`).
    pub local: bool,
}

/// `ceil(ms / 1000)`: `duration_until_reset` (docs/algorithms.md#time-and-resets).
pub fn reset_seconds(reset_ms: u64) -> u64 {
    reset_ms.div_ceil(1000)
}
