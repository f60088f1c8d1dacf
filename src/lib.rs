//! floodgate: a global rate-limit service for Envoy and Istio.
//!
//! Module map (dependencies point down; nothing below `service` knows about gRPC):
//!
//! - `limiter`: evaluates one request: matcher + backend -> statuses and overall code.
//! - `matcher`: the compiled descriptor tree; (domain, entries) -> rule. Pure.
//! - `backend`: where bucket state lives (`memory`, Redis, Redis Cluster) and the bucket keys.
//! - `rules`: validated rule types (units, algorithms, policies).
//! - `metrics`: every exported metric, on one Prometheus registry.

pub mod backend;
pub mod headers;
pub mod limiter;
pub mod matcher;
pub mod metrics;
pub mod proto;
pub mod rules;
pub mod service;
