//! Every integration test, in one binary: each module is one suite (one topic), and
//! `common` holds the fixtures they share (servers, Redis nodes and clusters, clients, the
//! algorithm vectors). One binary links the service once instead of once per suite.
//!
//! Run one suite with `cargo test --test it rlqs::`, one test with its full path.

mod common;

mod algorithms;
mod all_or_nothing;
mod authority;
mod backends;
mod bench;
mod cli;
mod clients;
mod cluster_batching;
mod cluster_faults;
mod config;
mod conformance;
mod dynamic_metadata;
mod fallback;
mod fuzz;
mod gateway;
mod hostile;
mod layering;
mod limits;
mod lua;
mod metrics;
mod operator;
mod overload;
mod per_second;
mod redis_backend;
mod redis_service;
mod reference_env;
mod regions;
mod reload;
mod rlqs;
mod rls;
mod sentinel;
mod shutdown;
mod statsd;
mod tls;
mod tracing;
mod uds;
mod valkey;
mod xds;
