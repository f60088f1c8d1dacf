//! The command line (docs/operations.md#command-line): `serve` (the default), `check-config DIR`,
//! `bench` (a load generator, in [`crate::bench`]), `--version`.
//!
//! Every `serve` flag can also come from a `FLOODGATE_*` environment variable, so the same
//! binary is configured by flags locally and by the environment in Kubernetes. Parsing goes
//! through [`Cli::try_parse_from`], so tests hand in arguments and never touch the process
//! environment of other tests. Defaults are named constants beside the flags that use them.
//! `serve` also reads envoyproxy/ratelimit's variables, below its own ([`crate::compat`]).

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{ArgMatches, Args, Parser, Subcommand, ValueEnum};

use crate::backend::BackendSettings;
use crate::backend::redis::{ClientIdentity, RedisOptions};
use crate::limiter::LimiterOptions;
use crate::server::Settings;
use crate::tls;

mod choices;
use crate::duration;
mod error;
mod grpc_args;
mod plaintext;
mod redis_url;
mod region_args;
mod rlqs_args;
mod statsd_args;
mod topology_args;
pub(crate) mod tracing_args;
mod xds_args;

pub use crate::duration::GoDuration;
pub use crate::redact::SecretText;
pub use choices::{FailureMode, LogFormat, OnOverLimit, RedisScripting, ResponseHeaders};
pub use error::FlagError;
pub use grpc_args::{
    DEFAULT_GRPC_FIRST_CALL_TIMEOUT, DEFAULT_GRPC_KEEPALIVE_INTERVAL,
    DEFAULT_GRPC_KEEPALIVE_TIMEOUT, DEFAULT_GRPC_MAX_CONNECTION_AGE,
    DEFAULT_GRPC_MAX_CONNECTION_AGE_GRACE, GrpcArgs,
};
pub use redis_url::RedisUrl;
pub use region_args::RegionArgs;
pub use rlqs_args::RlqsArgs;
pub use statsd_args::StatsdArgs;
pub use topology_args::TopologyArgs;
pub use tracing_args::TracingArgs;
pub use xds_args::{ConfigSource, XdsArgs};

/// `--version` output: the crate version and the git revision it was built from
/// (`unknown` when built outside a git checkout).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (git ",
    env!("FLOODGATE_GIT_SHA"),
    ")"
);

/// Default directory of domain files.
pub const DEFAULT_CONFIG_DIR: &str = "config";
/// Default gRPC listen address (RateLimitService and gRPC health).
pub const DEFAULT_GRPC_ADDR: &str = "0.0.0.0:8081";
/// Default admin HTTP listen address.
pub const DEFAULT_HTTP_ADDR: &str = "0.0.0.0:8080";
/// Default Redis URL: a local single node.
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";
/// Default bound on one backend call (`backend::DEFAULT_BACKEND_TIMEOUT`); Envoy's own
/// default timeout is 20 ms higher up.
pub const DEFAULT_BACKEND_TIMEOUT: &str = "100ms";
/// Default size of the local over-limit cache.
pub const DEFAULT_LOCAL_CACHE_ENTRIES: usize = 10_000;
/// Default trust period of a local over-limit cache entry
/// (`limiter::DEFAULT_LOCAL_CACHE_MAX_AGE`).
pub const DEFAULT_LOCAL_CACHE_MAX_AGE: &str = "3s";
/// Default `--replica-grace` (`limiter::replicas::DEFAULT_GRACE`).
pub const DEFAULT_REPLICA_GRACE: &str = "2m";
/// Default time in-flight calls get to finish after shutdown starts.
pub const DEFAULT_DRAIN_TIMEOUT: &str = "10s";
/// Default pause between reporting NOT_SERVING and closing the listeners.
pub const DEFAULT_HEALTH_GRACE: &str = "2s";
/// Default overload latency target (`overload::DEFAULT_TARGET_LATENCY`, in Go syntax).
pub const DEFAULT_OVERLOAD_TARGET_LATENCY: &str = "5ms";
/// Default xDS node id: the reference's.
pub const DEFAULT_XDS_NODE_ID: &str = "default";
/// Default first xDS reconnect delay.
pub const DEFAULT_XDS_BACKOFF_INITIAL: &str = "1s";
/// Default longest xDS reconnect delay: the reference's.
pub const DEFAULT_XDS_BACKOFF_MAX: &str = "60s";
/// Default spread of each xDS reconnect delay: the reference's.
pub const DEFAULT_XDS_BACKOFF_JITTER: f64 = 0.5;

/// `floodgate [serve flags] | floodgate serve [flags] | floodgate check-config DIR`.
#[derive(Debug, Parser)]
#[command(
    name = "floodgate",
    version = VERSION,
    about = "Global rate-limit service for Envoy and Istio"
)]
pub struct Cli {
    /// What to run; `serve` when omitted (see [`with_default_command`]).
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The command to run.
    pub fn into_command(self) -> Command {
        self.command
    }
}

/// Makes `serve` the default: inserts it when the first argument names no subcommand and is
/// not a top-level flag (`--help`, `--version`). Doing this before parsing, rather than
/// flattening the serve flags into the top level, keeps `FLOODGATE_*` variables (which only
/// `serve` reads) from being parsed, and failing, for `check-config`.
pub fn with_default_command(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    const TOP_LEVEL: &[&str] = &[
        "serve",
        "check-config",
        "bench",
        "help",
        "-h",
        "--help",
        "-V",
        "--version",
    ];
    let mut args: Vec<OsString> = args.into_iter().collect();
    let names_command = args
        .get(1)
        .and_then(|first| first.to_str())
        .is_some_and(|first| TOP_LEVEL.contains(&first));
    if !names_command {
        args.insert(1.min(args.len()), OsString::from("serve"));
    }
    args
}

/// The matches that hold the serve flags: the subcommand's when `serve` was named, else the
/// top level's (where the flattened flags live). Their value sources tell a given setting
/// from a default.
pub fn serve_matches(matches: &ArgMatches) -> &ArgMatches {
    matches.subcommand_matches("serve").unwrap_or(matches)
}

/// The subcommands.
#[derive(Debug, Subcommand)]
#[expect(
    clippy::large_enum_variant,
    reason = "parsed once per process; boxing the serve flags would only add indirection"
)]
pub enum Command {
    /// Run the rate-limit service (the default).
    Serve(ServeArgs),
    /// Load and validate every domain file in DIR; print every error; exit 1 if any.
    CheckConfig {
        /// Directory of `*.yaml` / `*.yml` domain files.
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
    /// Load a running floodgate (loopback only) and print a JSON summary: decisions/s,
    /// outcomes, latency percentiles (docs/development.md#floodgate-bench).
    Bench(crate::bench::BenchArgs),
}

/// Settings of the running service (docs/operations.md#command-line).
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Directory of YAML domain files.
    #[arg(long, env = "FLOODGATE_CONFIG", value_name = "DIR", default_value = DEFAULT_CONFIG_DIR)]
    pub config: PathBuf,
    /// Directory of candidate rules, in the same format: evaluated beside the live rules on
    /// every request, in buckets of their own, never changing an answer; what they would
    /// have denied is at `GET /top` and on the admin page (docs/operations.md#candidate-rules).
    #[arg(long, env = "FLOODGATE_CANDIDATE_CONFIG", value_name = "DIR")]
    pub candidate_config: Option<PathBuf>,
    /// Show descriptor values at `GET /top` and on the admin page instead of hashes of them
    /// (they are often addresses or API keys). Same spellings as --shadow-mode.
    #[arg(long, env = "FLOODGATE_TOP_SHOW_VALUES", value_parser = clap::builder::BoolishValueParser::new())]
    pub top_show_values: bool,
    /// Keys each top-keys summary holds (one per rule, kind and half minute): a key with more
    /// than 1/N of its rule's denied hits is always ranked, and counts are within N-th of the
    /// total.
    #[arg(
        long,
        env = "FLOODGATE_TOP_CAPACITY",
        value_name = "N",
        default_value_t = crate::top::DEFAULT_CAPACITY as u32,
        value_parser = clap::value_parser!(u32).range(16..=65_536)
    )]
    pub top_capacity: u32,
    /// gRPC listen address (RateLimitService and gRPC health); port 0 picks a free port.
    #[arg(long, env = "FLOODGATE_GRPC_ADDR", value_name = "ADDR", default_value = DEFAULT_GRPC_ADDR)]
    pub grpc_addr: SocketAddr,
    /// Serve gRPC on this unix socket instead of --grpc-addr (file mode 0666; a stale socket
    /// file is replaced, and the file is removed at shutdown).
    #[arg(long, env = "FLOODGATE_GRPC_UDS", value_name = "PATH")]
    pub grpc_uds: Option<PathBuf>,
    /// Admin HTTP listen address; port 0 picks a free port.
    #[arg(long, env = "FLOODGATE_HTTP_ADDR", value_name = "ADDR", default_value = DEFAULT_HTTP_ADDR)]
    pub http_addr: SocketAddr,
    /// Where bucket state lives.
    #[arg(long, env = "FLOODGATE_BACKEND", value_name = "KIND", value_enum, default_value_t = BackendKind::Memory)]
    pub backend: BackendKind,
    /// Redis URL(s), comma-separated: one node for `redis`, seed nodes for `redis-cluster`.
    /// `rediss://` for TLS; user and password go in the URL.
    #[arg(
        long,
        env = "FLOODGATE_REDIS_URL",
        value_name = "URL[,URL...]",
        value_delimiter = ',',
        default_value = DEFAULT_REDIS_URL,
        hide_env_values = true
    )]
    pub redis_url: Vec<RedisUrl>,
    /// Connections per Redis pool.
    #[arg(
        long,
        env = "FLOODGATE_REDIS_POOL_SIZE",
        value_name = "N",
        default_value_t = crate::backend::redis::DEFAULT_POOL_SIZE,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub redis_pool_size: u32,
    /// How the Redis backends run their Lua code: `auto` (functions on Redis >= 7, else
    /// scripts), `evalsha` or `functions`.
    #[arg(long, env = "FLOODGATE_REDIS_SCRIPTING", value_name = "MODE", value_enum, default_value_t = RedisScripting::Auto)]
    pub redis_scripting: RedisScripting,
    /// PEM file of the CA that signs the Redis servers' certificates (for `rediss://` with a
    /// private CA; the public web roots are trusted without it).
    #[arg(long, env = "FLOODGATE_REDIS_CA_FILE", value_name = "FILE")]
    pub redis_ca_file: Option<PathBuf>,
    /// Bound on one backend call (Go syntax: 100ms, 1s); the caller's `grpc-timeout` bounds
    /// it further.
    #[arg(
        long,
        env = "FLOODGATE_BACKEND_TIMEOUT",
        value_name = "DURATION",
        default_value = DEFAULT_BACKEND_TIMEOUT,
        value_parser = duration::parse_positive
    )]
    pub backend_timeout: GoDuration,
    /// The old spelling of --backend-timeout, in whole milliseconds.
    #[arg(long, env = "FLOODGATE_BACKEND_TIMEOUT_MS", value_name = "MS", hide = true,
          conflicts_with = "backend_timeout", value_parser = clap::value_parser!(u64).range(1..))]
    pub backend_timeout_ms: Option<u64>,
    /// Answer when the backend fails: `error` (UNAVAILABLE), `allow`, `deny`, or `local`
    /// (decide from memory with this replica's share of each limit; Redis backends only).
    #[arg(long, env = "FLOODGATE_FAILURE_MODE", value_name = "MODE", value_enum, default_value_t = FailureMode::Error)]
    pub failure_mode: FailureMode,
    /// Under `--failure-mode local`: how long the replicas on Redis keep the share of one
    /// that went silent (it may be cut off and deciding from its memory).
    #[arg(long, env = "FLOODGATE_REPLICA_GRACE", value_name = "DURATION", default_value = DEFAULT_REPLICA_GRACE, value_parser = duration::parse_positive)]
    pub replica_grace: GoDuration,
    /// What a request over the limit books under rules that do not set `on_over_limit`:
    /// `reject` (nothing) or `consume` (its whole cost). Default: `reject` for rules from
    /// files, `consume` for rules from xDS (docs/cost-budgets.md).
    #[arg(long, env = "FLOODGATE_ON_OVER_LIMIT", value_name = "MODE", value_enum)]
    pub on_over_limit: Option<OnOverLimit>,
    /// Rate-limit headers added to responses.
    #[arg(long, env = "FLOODGATE_RESPONSE_HEADERS", value_name = "MODE", value_enum, default_value_t = ResponseHeaders::Off)]
    pub response_headers: ResponseHeaders,
    /// Entries of the local over-limit cache; 0 disables it.
    #[arg(long, env = "FLOODGATE_LOCAL_CACHE_ENTRIES", value_name = "N", default_value_t = DEFAULT_LOCAL_CACHE_ENTRIES)]
    pub local_cache_entries: usize,
    /// Longest time a local over-limit cache entry answers before the backend is asked
    /// again (a refund or another replica may have freed room); 0 disables the cache.
    #[arg(long, env = "FLOODGATE_LOCAL_CACHE_MAX_AGE", value_name = "DURATION", default_value = DEFAULT_LOCAL_CACHE_MAX_AGE)]
    pub local_cache_max_age: GoDuration,
    /// The old spelling of --local-cache-max-age, in whole milliseconds.
    #[arg(
        long,
        env = "FLOODGATE_LOCAL_CACHE_MAX_AGE_MS",
        value_name = "MS",
        hide = true,
        conflicts_with = "local_cache_max_age"
    )]
    pub local_cache_max_age_ms: Option<u64>,
    /// Evaluate every limit but force the overall code to OK. The variable accepts the usual
    /// spellings (`true`/`false`, `1`/`0`, `yes`/`no`, `on`/`off`).
    #[arg(long, env = "FLOODGATE_SHADOW_MODE", value_parser = clap::builder::BoolishValueParser::new())]
    pub shadow_mode: bool,
    /// Treat every rule as a `quota_mode` rule: a request is over limit only when every
    /// limited descriptor in it is. Same spellings as --shadow-mode.
    #[arg(long, env = "FLOODGATE_QUOTA_MODE", value_parser = clap::builder::BoolishValueParser::new())]
    pub quota_mode: bool,
    /// Log line format; the level comes from `RUST_LOG`.
    #[arg(long, env = "FLOODGATE_LOG_FORMAT", value_name = "FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Prefix of every backend key, to share a Redis between deployments.
    #[arg(long, env = "FLOODGATE_KEY_PREFIX", value_name = "STR", default_value = crate::backend::keys::DEFAULT_KEY_PREFIX)]
    pub key_prefix: String,
    /// Cap on live buckets in the memory backend.
    #[arg(
        long,
        env = "FLOODGATE_MEMORY_MAX_BUCKETS",
        value_name = "N",
        default_value_t = crate::backend::memory::DEFAULT_CAPACITY,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
    )]
    pub memory_max_buckets: usize,
    /// Time in-flight calls get to finish after shutdown starts.
    #[arg(long, env = "FLOODGATE_DRAIN_TIMEOUT", value_name = "DURATION", default_value = DEFAULT_DRAIN_TIMEOUT)]
    pub drain_timeout: GoDuration,
    /// The old spelling of --drain-timeout, in whole milliseconds.
    #[arg(
        long,
        env = "FLOODGATE_DRAIN_TIMEOUT_MS",
        value_name = "MS",
        hide = true,
        conflicts_with = "drain_timeout"
    )]
    pub drain_timeout_ms: Option<u64>,
    /// Pause between reporting NOT_SERVING and closing the listeners, so Envoy stops sending
    /// before the port closes.
    #[arg(long, env = "FLOODGATE_HEALTH_GRACE", value_name = "DURATION", default_value = DEFAULT_HEALTH_GRACE)]
    pub health_grace: GoDuration,
    /// The old spelling of --health-grace, in whole milliseconds.
    #[arg(
        long,
        env = "FLOODGATE_HEALTH_GRACE_MS",
        value_name = "MS",
        hide = true,
        conflicts_with = "health_grace"
    )]
    pub health_grace_ms: Option<u64>,
    /// Most per-rule metric series built from request values (`detailed_metric`,
    /// `value_to_metric`, limit overrides), six per key; past it they fold into `_overflow`.
    #[arg(long, env = "FLOODGATE_MAX_METRIC_SERIES", value_name = "N", default_value_t = crate::metrics::DEFAULT_MAX_METRIC_SERIES)]
    pub max_metric_series: usize,
    /// The gRPC listener's connections: TLS, limits, keepalive, age.
    #[command(flatten)]
    pub grpc: GrpcArgs,
    /// Overload shedding (docs/overload.md): calls that cannot be answered before their
    /// deadline are answered at once by the failure mode; calls without a deadline are shed
    /// once they meet a queue standing above this latency. 0 turns all shedding off.
    #[arg(long, env = "FLOODGATE_OVERLOAD_TARGET_LATENCY", value_name = "DURATION", default_value = DEFAULT_OVERLOAD_TARGET_LATENCY)]
    pub overload_target_latency: GoDuration,
    /// PEM client certificate for `rediss://` servers that require one (with
    /// --redis-tls-client-key).
    #[arg(long, env = "FLOODGATE_REDIS_TLS_CLIENT_CERT", value_name = "FILE")]
    pub redis_tls_client_cert: Option<PathBuf>,
    /// PEM private key of --redis-tls-client-cert.
    #[arg(long, env = "FLOODGATE_REDIS_TLS_CLIENT_KEY", value_name = "FILE")]
    pub redis_tls_client_key: Option<PathBuf>,
    /// Whether the admin port serves `POST /json`, which spends real quota; `false` answers it
    /// with 404.
    #[arg(
        long,
        env = "FLOODGATE_ADMIN_JSON",
        value_name = "BOOL",
        default_value = "true",
        action = clap::ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub admin_json: bool,
    /// Answer with dynamic metadata: domain, descriptors, hits and the merged rule `metadata`
    /// of every descriptor not over its limit.
    #[arg(long, env = "FLOODGATE_RESPONSE_DYNAMIC_METADATA", value_parser = clap::builder::BoolishValueParser::new())]
    pub response_dynamic_metadata: bool,
    /// Rules over xDS and serving before rules arrive.
    #[command(flatten)]
    pub xds: XdsArgs,
    /// OpenTelemetry tracing over OTLP.
    #[command(flatten)]
    pub tracing: TracingArgs,
    /// StatsD / DogStatsD export.
    #[command(flatten)]
    pub statsd: StatsdArgs,
    /// The quota service (RLQS).
    #[command(flatten)]
    pub rlqs: RlqsArgs,
    /// One budget across regions.
    #[command(flatten)]
    pub regions: RegionArgs,
    /// Redis Sentinel and a second backend for per-second rules.
    #[command(flatten)]
    pub topology: TopologyArgs,
}

impl ServeArgs {
    /// Checks what clap cannot without printing secrets: the Redis URLs' schemes.
    ///
    /// # Errors
    /// The first invalid setting, with URLs redacted.
    pub fn check(&self) -> Result<(), FlagError> {
        self.main_backend().check()?;
        self.topology.check_per_second()
    }

    /// The main backend as the flags describe it.
    fn main_backend(&self) -> topology_args::BackendFlags<'_> {
        topology_args::BackendFlags {
            kind: self.backend,
            urls: &self.redis_url,
            sentinel_master: self.topology.redis_sentinel_master.as_deref(),
            master_auth: self.topology.redis_master_auth.as_ref(),
            names: [
                "--backend",
                "--redis-url",
                "--redis-sentinel-master",
                "--redis-master-auth",
            ],
        }
    }

    /// Rejects TLS settings that a plaintext scheme would ignore (see `plaintext`); run
    /// after the reference's variables are applied, so they are checked too.
    ///
    /// # Errors
    /// Every such pair, one per line.
    pub fn check_plaintext(&self) -> Result<(), FlagError> {
        let conflicts = plaintext::conflicts(self);
        if conflicts.is_empty() {
            return Ok(());
        }
        Err(FlagError::Plaintext(conflicts))
    }

    /// The server settings these flags describe; reads the Redis CA file if one is named.
    ///
    /// # Errors
    /// The CA file cannot be read.
    pub fn settings(&self) -> Result<Settings, FlagError> {
        let timeout = duration::or_legacy_millis(self.backend_timeout, self.backend_timeout_ms);
        let tls_ca_pem = match &self.redis_ca_file {
            Some(path) => Some(std::fs::read(path).map_err(|source| FlagError::Unreadable {
                flag: "--redis-ca-file",
                path: path.clone(),
                source,
            })?),
            None => None,
        };
        let options = RedisOptions {
            pool_size: self.redis_pool_size,
            timeout,
            key_prefix: self.key_prefix.clone(),
            tls_ca_pem,
            tls_client: self.redis_client_identity()?,
            scripting: self.redis_scripting.into(),
        };
        let main = self
            .main_backend()
            .settings(options.clone(), self.memory_max_buckets);
        if self.failure_mode == FailureMode::Local && matches!(main, BackendSettings::Memory { .. })
        {
            return Err(FlagError::Needs {
                flag: "--failure-mode local".into(),
                needs: "a Redis backend (the memory backend never fails)".into(),
            });
        }
        let backend = match self.topology.per_second() {
            None => main,
            Some(flags) => BackendSettings::PerSecond {
                main: Box::new(main),
                per_second: Box::new(flags.settings(
                    RedisOptions {
                        pool_size: self.topology.per_second_redis_pool_size,
                        ..options
                    },
                    self.memory_max_buckets,
                )),
            },
        };
        let regions = self.regions.settings(&backend)?;
        Ok(Settings {
            config_dir: self.config.clone(),
            candidate_dir: self.candidate_config.clone(),
            grpc_addr: match &self.grpc_uds {
                Some(path) => format!("{}{}", crate::server::UNIX_PREFIX, path.display()),
                None => self.grpc_addr.to_string(),
            },
            http_addr: self.http_addr.to_string(),
            backend,
            limiter: LimiterOptions {
                backend_timeout: timeout,
                failure_mode: self.failure_mode.into(),
                replica_grace: self.replica_grace.0,
                shadow_mode: self.shadow_mode,
                quota_mode: self.quota_mode,
                local_cache_entries: self.local_cache_entries,
                local_cache_max_age: duration::or_legacy_millis(
                    self.local_cache_max_age,
                    self.local_cache_max_age_ms,
                ),
                top: crate::top::TopOptions {
                    capacity: self.top_capacity as usize,
                    show_values: self.top_show_values,
                },
                ..LimiterOptions::default()
            },
            on_over_limit: self.on_over_limit.map(Into::into),
            header_mode: self.response_headers.into(),
            drain_timeout: duration::or_legacy_millis(self.drain_timeout, self.drain_timeout_ms),
            shutdown_grace: duration::or_legacy_millis(self.health_grace, self.health_grace_ms),
            max_metric_series: self.max_metric_series,
            grpc_tls: self.grpc.tls()?,
            grpc_limits: self.grpc.limits(),
            overload_target: Some(self.overload_target_latency.0).filter(|d| !d.is_zero()),
            admin_json: self.admin_json,
            xds: self.xds.settings()?,
            startup: self.xds.startup(),
            response_dynamic_metadata: self.response_dynamic_metadata,
            tracing: self.tracing.settings()?,
            statsd: self.statsd.settings()?,
            rlqs: self.rlqs.settings()?,
            regions,
        })
    }

    /// The Redis client certificate and key, read and checked now so that a bad file fails
    /// startup with a message that names the path and never the contents.
    fn redis_client_identity(&self) -> Result<Option<ClientIdentity>, FlagError> {
        let (cert_path, key_path) = match (&self.redis_tls_client_cert, &self.redis_tls_client_key)
        {
            (Some(cert), Some(key)) => (cert, key),
            (None, None) => return Ok(None),
            _ => {
                return Err(FlagError::Together(
                    "--redis-tls-client-cert",
                    "--redis-tls-client-key",
                ));
            }
        };
        let cert = tls::read_file("--redis-tls-client-cert", cert_path)?;
        let key = tls::read_file("--redis-tls-client-key", key_path)?;
        tls::parse_certs("--redis-tls-client-cert", &cert)?;
        tls::parse_key("--redis-tls-client-key", &key)?;
        Ok(Some(ClientIdentity { cert, key }))
    }
}

/// Where bucket state lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// In-process; for tests and single replicas.
    Memory,
    /// One Redis node.
    Redis,
    /// A Redis Cluster, reached through seed nodes.
    RedisCluster,
}

#[cfg(test)]
mod tests;
