//! floodgate: a global rate-limit service for Envoy and Istio.
//!
//! Module map (dependencies point down; nothing below `service` knows about gRPC):
//!
//! - `cli`: the command line (`serve`, `check-config`), every serve setting with its default, and
//!   the reference service's environment variables that stand in for them.
//! - `bench`: `floodgate bench`, the load generator (a gRPC client of the service).
//! - `server`: wiring; binds listeners, serves gRPC + admin, reloads, shuts down gracefully.
//! - `listener`: the gRPC accept loop and its bounds (connections, streams, age, keepalive).
//! - `tls`: gRPC server TLS / mTLS from files reloaded on change.
//! - `admission`: overload shedding; stamps each call's arrival on its connection.
//! - `service`: gRPC RateLimitService; protobuf <-> engine types; the error -> status mapping.
//! - `admin`: admin HTTP (`/healthcheck`, `/livez`, `/json`, `/metrics`, `/rlconfig`).
//! - `health`: the readiness latch behind gRPC health and `/healthcheck`.
//! - `reload`: config directory watch and SIGHUP reload.
//! - `headers`: `RateLimit-*` response headers.
//! - `limiter`: evaluates one request: matcher + backend -> statuses and overall code.
//! - `config`: loads and validates the YAML domain files into `rules` and `matcher` input.
//! - `matcher`: the compiled descriptor tree; (domain, entries) -> rule. Pure.
//! - `algorithm`: the pure rate-limit algorithms every backend follows.
//! - `backend`: where bucket state lives (memory, Redis, Redis Cluster) and the bucket keys.
//! - `rules`: validated rule types (units, algorithms, policies).
//! - `metrics`: every exported metric, on one Prometheus registry.
//! - `otel`: OpenTelemetry tracing over OTLP (off by default) and the spans it exports.
//! - `statsd`: StatsD / DogStatsD export of the metrics under the reference's names (off by default).
//! - `proto`: generated Envoy RLS v3 protobuf code.
//! - `shutdown`, `telemetry`: signals and logging.

pub mod admin;
pub mod admission;
pub mod algorithm;
pub mod backend;
pub mod bench;
pub mod cli;
pub mod config;
pub mod dynamic_metadata;
pub mod headers;
pub mod health;
pub mod limiter;
pub mod listener;
pub mod matcher;
pub mod metrics;
pub mod otel;
pub mod proto;
pub mod redact;
pub mod reload;
pub mod rules;
pub mod server;
pub mod service;
pub mod shutdown;
pub mod statsd;
pub mod telemetry;
pub mod tls;
pub mod xds;
