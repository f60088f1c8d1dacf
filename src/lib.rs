//! floodgate: a global rate-limit service for Envoy and Istio.
//!
//! Module map (dependencies point down; nothing below `limiter` knows about gRPC):
//!
//! - `rules`: validated rule types (units, algorithms, policies).
//! - `matcher`: the compiled descriptor tree; (domain, entries) -> rule. Pure.
//! - `algorithm`: the four counting algorithms as pure state transitions (SPEC 3), shared
//!   by the memory backend and mirrored by the Lua scripts.
//! - `backend`: where bucket state lives (`memory`, Redis, Redis Cluster) and the bucket keys.

pub mod algorithm;
pub mod backend;
pub mod matcher;
pub mod rules;
