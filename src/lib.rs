//! floodgate: a global rate-limit service for Envoy and Istio.
//!
//! Module map (dependencies point down; nothing below `limiter` knows about gRPC):
//!
//! - `cli`: the command line (`serve`, `check-config`) and every serve setting with its default.
//! - `config`: loads and validates the YAML domain files into `rules` and `matcher` input.
//! - `rules`: validated rule types (units, algorithms, policies).
//! - `matcher`: the compiled descriptor tree; (domain, entries) -> rule. Pure.
//! - `backend`: where bucket state lives (`memory`, Redis, Redis Cluster) and the bucket keys.

pub mod backend;
pub mod cli;
pub mod config;
pub mod matcher;
pub mod rules;
