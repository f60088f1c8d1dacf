//! Drop-in migration from envoyproxy/ratelimit (the reference service): `serve` also reads
//! the reference's environment variables wherever they mean something here, so a Deployment
//! can swap the image and keep its `env:` block.
//!
//! Precedence, per floodgate setting: a flag or `FLOODGATE_*` variable, then the reference
//! variables that stand in for it, then floodgate's default. clap's value source tells an
//! explicit setting from a default; a reference variable whose setting is explicit is not
//! even parsed, and is logged as overridden.
//!
//! A set reference variable is never ignored silently. A value floodgate cannot honour
//! without answering clients differently (a memcache backend, a malformed value)
//! stops startup; anything else it cannot honour is logged as a warning, one line per
//! variable. An empty value counts as unset, as templated manifests often render one.
//!
//! A variable that stands in for one setting on its own value is a row of the table in
//! `table.rs`; the functions here and in the `*_vars` files read the variables that combine.
//!
//! The environment is read through [`Environment`], so tests feed maps and never touch the
//! process environment.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use clap::ArgMatches;
use clap::parser::ValueSource;
use url::Url;

use crate::cli::tracing_args::parse_rate;
use crate::cli::{
    BackendKind, ConfigSource, GoDuration, LogFormat, OnOverLimit, RedisUrl, ResponseHeaders,
    SecretText, ServeArgs,
};
use crate::otel::{OtlpProtocol, REFERENCE_SERVICE_NAME};
use crate::telemetry::LevelFilter;
use table::Gate;

mod redis_vars;
mod statsd_vars;
mod table;
mod tracing_vars;
mod unsupported;
mod xds_vars;

/// Where the variables come from: the process, or a map in tests.
pub trait Environment {
    /// The value of `name`, if set (lossily decoded: a non-UTF-8 value then fails to parse
    /// instead of reading as unset).
    fn var(&self, name: &str) -> Option<String>;
    /// The names of every variable set, for the prefix families of unsupported variables.
    fn names(&self) -> Vec<String>;
}

/// The environment of this process.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnvironment;

impl Environment for ProcessEnvironment {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var_os(name).map(|value| value.to_string_lossy().into_owned())
    }

    fn names(&self) -> Vec<String> {
        std::env::vars_os()
            .map(|(name, _)| name.to_string_lossy().into_owned())
            .collect()
    }
}

impl Environment for BTreeMap<String, String> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name).cloned()
    }

    fn names(&self) -> Vec<String> {
        self.keys().cloned().collect()
    }
}

/// A reference variable whose value floodgate cannot use; startup stops.
#[derive(Debug, thiserror::Error)]
#[error("{variable}: {message}")]
pub struct ReferenceEnvError {
    /// The variable at fault.
    pub variable: &'static str,
    /// What is wrong, never echoing a secret.
    message: String,
}

/// Why one variable's value cannot be read as its setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadValue {
    /// Not one of the spellings the setting takes.
    #[error("`{value}` is not one of {expected}")]
    NotOneOf {
        /// The value given.
        value: String,
        /// The spellings taken.
        expected: &'static str,
    },
    /// Not the kind of value the setting takes.
    #[error("`{value}` is not {expected}")]
    NotA {
        /// The value given.
        value: String,
        /// What it must be.
        expected: &'static str,
    },
    /// Refused by the parser of the floodgate flag it stands in for (durations, rates,
    /// tags), in that parser's words.
    #[error("{0}")]
    Flag(String),
}

fn invalid(variable: &'static str, message: impl Into<String>) -> ReferenceEnvError {
    ReferenceEnvError {
        variable,
        message: message.into(),
    }
}

/// What the reference variables did, for the startup log.
#[derive(Debug, Default, PartialEq)]
pub struct Report {
    /// The level from `LOG_LEVEL`, when `RUST_LOG` does not set the filter.
    pub log_level: Option<LevelFilter>,
    /// (variable, floodgate setting) pairs that were applied.
    pub applied: Vec<(&'static str, &'static str)>,
    /// (variable, floodgate setting) pairs not applied because the setting was given.
    pub overridden: Vec<(&'static str, &'static str)>,
    /// Set variables floodgate does not (fully) honour.
    pub unsupported: Vec<Unsupported>,
    /// Where floodgate departs from a reference default it cannot safely assume.
    pub notices: Vec<&'static str>,
}

/// A set reference variable that floodgate does not (fully) honour.
#[derive(Debug, PartialEq)]
pub struct Unsupported {
    /// Its name.
    pub variable: String,
    /// What floodgate does instead.
    pub reason: &'static str,
}

impl Report {
    /// Logs one line per variable: applied and overridden at info, unsupported as a warning;
    /// then each notice as a warning.
    pub fn log(&self) {
        for (variable, setting) in &self.applied {
            tracing::info!(variable, setting, "reference environment variable applied");
        }
        for (variable, setting) in &self.overridden {
            tracing::info!(
                variable,
                setting,
                "reference environment variable ignored: the floodgate setting is given"
            );
        }
        for unsupported in &self.unsupported {
            tracing::warn!(
                variable = %unsupported.variable,
                "reference environment variable not supported, ignored: {}",
                unsupported.reason
            );
        }
        for notice in &self.notices {
            tracing::warn!("{notice}");
        }
    }
}

/// A floodgate setting, by its flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Setting {
    flag: &'static str,
}

impl Setting {
    /// Its clap argument id, the `ServeArgs` field: the flag's name with `_` for `-`.
    fn id(self) -> String {
        self.flag.trim_start_matches("--").replace('-', "_")
    }
}

const fn setting(flag: &'static str) -> Setting {
    Setting { flag }
}

const CONFIG: Setting = setting("--config");
const GRPC_ADDR: Setting = setting("--grpc-addr");
const HTTP_ADDR: Setting = setting("--http-addr");
const BACKEND: Setting = setting("--backend");
const REDIS_URL: Setting = setting("--redis-url");
const REDIS_POOL_SIZE: Setting = setting("--redis-pool-size");
const GRPC_TLS_CERT: Setting = setting("--grpc-tls-cert");
const GRPC_TLS_KEY: Setting = setting("--grpc-tls-key");
const REDIS_SENTINEL_MASTER: Setting = setting("--redis-sentinel-master");
const REDIS_MASTER_AUTH: Setting = setting("--redis-master-auth");
const PER_SECOND_BACKEND: Setting = setting("--per-second-backend");
const PER_SECOND_REDIS_URL: Setting = setting("--per-second-redis-url");
const PER_SECOND_REDIS_POOL_SIZE: Setting = setting("--per-second-redis-pool-size");
const PER_SECOND_REDIS_SENTINEL_MASTER: Setting = setting("--per-second-redis-sentinel-master");
const PER_SECOND_REDIS_MASTER_AUTH: Setting = setting("--per-second-redis-master-auth");
const XDS_BACKOFF_JITTER: Setting = setting("--xds-backoff-jitter");
const OTLP_ENDPOINT: Setting = setting("--otlp-endpoint");
const OTLP_PROTOCOL: Setting = setting("--otlp-protocol");
const TRACING_SERVICE_NAME: Setting = setting("--tracing-service-name");

/// The standard variables that choose the OTLP transport, most specific first; the
/// exporter itself reads the other `OTEL_EXPORTER_OTLP_*` ones.
const OTLP_PROTOCOL_VARIABLES: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
];

/// The reference's rule root when `RUNTIME_ROOT` is unset.
const REFERENCE_RUNTIME_ROOT: &str = "/srv/runtime_data/current";
/// The reference's rule directory name under the root when `RUNTIME_APPDIRECTORY` is unset.
const REFERENCE_APP_DIRECTORY: &str = "config";
/// The reference's listen host when `HOST` / `GRPC_HOST` is unset.
const REFERENCE_HOST: IpAddr = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
/// The reference's xDS server when `CONFIG_TYPE=GRPC_XDS_SOTW` names none.
const REFERENCE_XDS_SERVER: &str = "localhost:18000";
/// The reference's xDS backoff spread when `XDS_CLIENT_BACKOFF_RANDOM_FACTOR` is unset.
const REFERENCE_XDS_JITTER: f64 = 0.5;
/// The reference's admin HTTP port when `PORT` is unset.
const REFERENCE_HTTP_PORT: u16 = 8080;
/// The reference's gRPC port when `GRPC_PORT` is unset.
const REFERENCE_GRPC_PORT: u16 = 8081;
/// `LOCAL_CACHE_SIZE_IN_BYTES` is a byte budget for the reference's freecache; floodgate's
/// cache counts entries. An entry (key, expiry, bookkeeping) takes roughly this many bytes,
/// so the same budget holds about `bytes / 100` entries.
const ASSUMED_BYTES_PER_CACHE_ENTRY: u64 = 100;

/// The reference variables that describe a Redis connection; any of them (or `BACKEND_TYPE`)
/// moves floodgate off its memory default, as the reference's own default backend is Redis.
const REDIS_VARIABLES: [&str; 7] = [
    "REDIS_URL",
    "REDIS_TYPE",
    "REDIS_AUTH",
    "REDIS_TLS",
    "REDIS_SOCKET_TYPE",
    "REDIS_POOL_SIZE",
    "REDIS_SENTINEL_AUTH",
];

/// Applies the reference variables of `env` to `args`, for every setting that `matches`
/// (the serve flags' matches) shows at its default.
///
/// # Errors
/// A variable floodgate would apply has a malformed value, or asks for something floodgate
/// cannot do without answering clients differently (`BACKEND_TYPE=memcache`).
pub fn apply(
    args: &mut ServeArgs,
    matches: &ArgMatches,
    env: &dyn Environment,
) -> Result<Report, ReferenceEnvError> {
    let mut mapper = Mapper {
        env,
        matches,
        report: Report::default(),
    };
    mapper.listeners(args)?;
    mapper.grpc_tls(args)?;
    mapper.rules(args);
    mapper.log_level()?;
    mapper.rows(args, Gate::Always)?;
    mapper.backend(args)?;
    mapper.per_second(args)?;
    mapper.xds(args)?;
    mapper.tracing(args)?;
    mapper.statsd(args)?;
    mapper.unsupported();
    Ok(mapper.report)
}

struct Mapper<'a> {
    env: &'a dyn Environment,
    matches: &'a ArgMatches,
    report: Report,
}

impl Mapper<'_> {
    fn get(&self, name: &str) -> Option<String> {
        self.env.var(name).filter(|value| !value.is_empty())
    }

    fn is_set(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// Whether a flag or `FLOODGATE_*` variable gave `setting`.
    fn explicit(&self, setting: Setting) -> bool {
        !matches!(
            self.matches.value_source(&setting.id()),
            None | Some(ValueSource::DefaultValue)
        )
    }

    /// Whether the set ones among `variables` may decide `setting`; records them as applied,
    /// or as overridden when floodgate's own setting is given. False when none is set.
    fn claim(&mut self, setting: Setting, variables: &[&'static str]) -> bool {
        let set: Vec<_> = variables
            .iter()
            .copied()
            .filter(|name| self.is_set(name))
            .collect();
        if set.is_empty() {
            return false;
        }
        let free = !self.explicit(setting);
        let record = if free {
            &mut self.report.applied
        } else {
            &mut self.report.overridden
        };
        record.extend(set.into_iter().map(|name| (name, setting.flag)));
        free
    }

    /// `name`'s value through `parse`, or None when unset.
    fn parse<T>(
        &self,
        name: &'static str,
        parse: impl FnOnce(&str) -> Result<T, BadValue>,
    ) -> Result<Option<T>, ReferenceEnvError> {
        self.get(name)
            .map(|value| parse(&value).map_err(|bad| invalid(name, bad.to_string())))
            .transpose()
    }

    fn warn(&mut self, variable: &str, reason: &'static str) {
        self.report.unsupported.push(Unsupported {
            variable: variable.to_owned(),
            reason,
        });
    }

    fn listeners(&mut self, args: &mut ServeArgs) -> Result<(), ReferenceEnvError> {
        if self.claim(HTTP_ADDR, &["HOST", "PORT"]) {
            args.http_addr = self.listen_addr("HOST", "PORT", REFERENCE_HTTP_PORT)?;
        }
        if self.claim(GRPC_ADDR, &["GRPC_HOST", "GRPC_PORT"]) {
            args.grpc_addr = self.listen_addr("GRPC_HOST", "GRPC_PORT", REFERENCE_GRPC_PORT)?;
        }
        Ok(())
    }

    fn listen_addr(
        &self,
        host: &'static str,
        port: &'static str,
        default_port: u16,
    ) -> Result<SocketAddr, ReferenceEnvError> {
        let ip = self
            .parse(host, |value| {
                let bare = value.trim_start_matches('[').trim_end_matches(']');
                bare.parse::<IpAddr>().map_err(|_| BadValue::NotA {
                    value: value.to_owned(),
                    expected: "an IP address (floodgate binds an IP, e.g. 0.0.0.0)",
                })
            })?
            .unwrap_or(REFERENCE_HOST);
        let port = self
            .parse(port, |value| {
                value.parse::<u16>().map_err(|_| BadValue::NotA {
                    value: value.to_owned(),
                    expected: "a port number",
                })
            })?
            .unwrap_or(default_port);
        Ok(SocketAddr::new(ip, port))
    }

    /// `GRPC_SERVER_USE_TLS=true` with the certificate, key, client CA and client SAN
    /// variables; without it they do nothing (in the reference too) and are reported.
    fn grpc_tls(&mut self, args: &mut ServeArgs) -> Result<(), ReferenceEnvError> {
        let use_tls = self.parse("GRPC_SERVER_USE_TLS", parse_bool)?;
        if use_tls != Some(true) {
            for variable in table::variables(Gate::GrpcTls) {
                if self.is_set(variable) {
                    self.warn(variable, "has no effect without GRPC_SERVER_USE_TLS=true");
                }
            }
            return Ok(());
        }
        let given_by_flags = self.explicit(GRPC_TLS_CERT) || self.explicit(GRPC_TLS_KEY);
        let given_by_variables =
            self.is_set("GRPC_SERVER_TLS_CERT") && self.is_set("GRPC_SERVER_TLS_KEY");
        if !(given_by_flags || given_by_variables) {
            return Err(invalid(
                "GRPC_SERVER_USE_TLS",
                "needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY (or --grpc-tls-cert and \
                 --grpc-tls-key)",
            ));
        }
        self.claim(GRPC_TLS_CERT, &["GRPC_SERVER_USE_TLS"]);
        self.rows(args, Gate::GrpcTls)
    }

    /// The rule directory: `<RUNTIME_ROOT>/<RUNTIME_SUBDIRECTORY>/<RUNTIME_APPDIRECTORY>`,
    /// joined as Go's `filepath.Join` does (a leading `/` does not restart the path).
    fn rules(&mut self, args: &mut ServeArgs) {
        let (root, sub) = (self.get("RUNTIME_ROOT"), self.get("RUNTIME_SUBDIRECTORY"));
        if root.is_none() && sub.is_none() {
            if self.is_set("RUNTIME_APPDIRECTORY") {
                self.warn(
                    "RUNTIME_APPDIRECTORY",
                    "used only with RUNTIME_ROOT or RUNTIME_SUBDIRECTORY; --config applies",
                );
            }
            return;
        }
        let variables = [
            "RUNTIME_ROOT",
            "RUNTIME_SUBDIRECTORY",
            "RUNTIME_APPDIRECTORY",
        ];
        if self.claim(CONFIG, &variables) {
            let mut dir = PathBuf::from(root.as_deref().unwrap_or(REFERENCE_RUNTIME_ROOT));
            let app = self.get("RUNTIME_APPDIRECTORY");
            for part in [
                sub.as_deref(),
                Some(app.as_deref().unwrap_or(REFERENCE_APP_DIRECTORY)),
            ]
            .into_iter()
            .flatten()
            {
                let part = part.trim_start_matches('/');
                if !part.is_empty() {
                    dir.push(part);
                }
            }
            args.config = dir;
        }
    }

    /// `LOG_LEVEL` stands in for `RUST_LOG`, not a flag.
    fn log_level(&mut self) -> Result<(), ReferenceEnvError> {
        if self.is_set("LOG_LEVEL") {
            if self.is_set("RUST_LOG") {
                self.report.overridden.push(("LOG_LEVEL", "RUST_LOG"));
            } else {
                self.report.log_level = self.parse("LOG_LEVEL", parse_level)?;
                self.report.applied.push(("LOG_LEVEL", "RUST_LOG"));
            }
        }
        Ok(())
    }

    /// Reports every set variable that floodgate recognises but does not honour, unless its
    /// value asks for nothing floodgate lacks.
    fn unsupported(&mut self) {
        let mut names = self.env.names();
        names.sort();
        for name in names {
            let Some(value) = self.get(&name) else {
                continue;
            };
            if let Some(reason) = unsupported::reason(&name, &value) {
                self.warn(&name, reason);
            }
        }
    }
}

/// A boolean as Go's `strconv.ParseBool` (and so the reference) reads it.
fn parse_bool(value: &str) -> Result<bool, BadValue> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(BadValue::NotA {
            value: value.to_owned(),
            expected: "a boolean (true/false, 1/0, t/f)",
        }),
    }
}

/// A Go `time.Duration` as the reference reads it (`300ms`, `10s`, `1m30s`, `1.5h`, `0`):
/// the one parser of `GoDuration`.
fn parse_go_duration(value: &str) -> Result<std::time::Duration, BadValue> {
    value
        .parse::<GoDuration>()
        .map(|duration| duration.0)
        .map_err(BadValue::Flag)
}

/// A logrus level name, case-insensitive; `fatal` and `panic` log errors only.
fn parse_level(value: &str) -> Result<LevelFilter, BadValue> {
    match value.to_ascii_lowercase().as_str() {
        "trace" => Ok(LevelFilter::TRACE),
        "debug" => Ok(LevelFilter::DEBUG),
        "info" => Ok(LevelFilter::INFO),
        "warn" | "warning" => Ok(LevelFilter::WARN),
        "error" | "fatal" | "panic" => Ok(LevelFilter::ERROR),
        _ => Err(BadValue::NotOneOf {
            value: value.to_owned(),
            expected: "trace, debug, info, warn, error, fatal, panic",
        }),
    }
}

#[cfg(test)]
mod tests;
