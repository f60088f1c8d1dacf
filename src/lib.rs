//! floodgate: a global rate-limit service for Envoy and Istio.
//!
//! Module map, top down: a module uses only modules listed below it (`tests/it/layering.rs`
//! checks this), and nothing below `service` knows about gRPC.
//!
//! - `compat`: the reference service's (envoyproxy/ratelimit) environment variables, read
//!   into the serve settings they stand in for, and the ones refused.
//! - `cli`: the command line (`serve`, `check-config`, `bench`), every serve setting with its
//!   default.
//! - `telemetry`, `shutdown`: logging and signals.
//! - `bench`: `floodgate bench`, the load generator (a gRPC client of the service).
//! - `server`: wiring; binds listeners, serves gRPC + admin, reloads, shuts down gracefully.
//! - `xds`: rules from an xDS management server (Envoy Gateway's rate-limit config).
//! - `reload`: config directory watch and SIGHUP reload.
//! - `statsd`: StatsD / DogStatsD export of the metrics under the reference's names (off by default).
//! - `listener`: the gRPC accept loop over TCP or a unix socket, and its bounds (connections,
//!   streams, age, keepalive).
//! - `tls`: gRPC server TLS / mTLS from files reloaded on change.
//! - `admin`: admin HTTP (`/healthcheck`, `/livez`, `/json`, `/metrics`, `/rlconfig`).
//! - `rlqs`: gRPC RateLimitQuotaService (RLQS): usage reports booked into the limiter's
//!   buckets, quota assignments pushed back.
//! - `service`: gRPC RateLimitService; protobuf <-> engine types; the error -> status
//!   mapping; the dynamic metadata of an answer (`--response-dynamic-metadata`).
//! - `headers`: `RateLimit-*` response headers.
//! - `health`: the readiness latch behind gRPC health and `/healthcheck`.
//! - `limiter`: evaluates one request: matcher + backend -> statuses and overall code.
//! - `config`: loads and validates the YAML domain files into `rules` and `matcher` input.
//! - `matcher`: the compiled descriptor tree; (domain, entries) -> rule. Pure.
//! - `top`: who is being limited: per rule, the heaviest denied and near-limit keys of the
//!   last minute, in bounded memory (`/top`).
//! - `otel`: OpenTelemetry tracing over OTLP (off by default) and the spans it exports.
//! - `metrics`: every exported metric, on one Prometheus registry.
//! - `backend`: where bucket state lives (memory, Redis, Redis Cluster) and the bucket keys.
//! - `overload`: shedding what cannot be answered in time: a call's deadline, its arrival
//!   (stamped on its connection), admission, and why a call was shed. Below the backends,
//!   which refuse by the same deadline rule.
//! - `algorithm`: the pure rate-limit algorithms every backend follows.
//! - `rules`: validated rule types (units, algorithms, policies).
//! - `redact`: secrets out of URLs, errors and logs.
//! - `clock`: wall time in ms since the epoch, injected (`ManualClock` in tests).
//! - `duration`: durations as Go writes them (`300ms`, `1h30m`), the one grammar of every
//!   duration flag, `bench` option and reference variable.
//! - `proto`: generated Envoy RLS v3 protobuf code.

pub mod admin;
pub mod algorithm;
pub mod backend;
pub mod bench;
pub mod cli;
pub mod clock;
pub mod compat;
pub mod config;
pub mod duration;
pub mod headers;
pub mod health;
pub mod limiter;
pub mod listener;
pub mod matcher;
pub mod metrics;
pub mod otel;
pub mod overload;
pub mod proto;
pub mod redact;
pub mod reload;
pub mod rlqs;
pub mod rules;
pub mod server;
pub mod service;
pub mod shutdown;
pub mod statsd;
pub mod telemetry;
pub mod tls;
pub mod top;
pub mod xds;
