//! The enum-valued `serve` flags as clap sees them. The modules that act on these choices
//! (limiter, headers, telemetry) keep their own plain enums and know nothing of clap; each
//! flag enum here maps onto its domain enum with a `From` impl.

use clap::ValueEnum;

use crate::backend::redis;
use crate::{headers, limiter, rules, telemetry};

/// `--failure-mode`: what to answer when the backend fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FailureMode {
    /// Return an error (gRPC `UNAVAILABLE`), so Envoy's `failure_mode_deny` decides.
    Error,
    /// Answer OK with no limits.
    Allow,
    /// Answer OVER_LIMIT.
    Deny,
    /// Decide from this replica's memory with its share of each limit (Redis backends).
    Local,
}

impl From<FailureMode> for limiter::FailureMode {
    fn from(mode: FailureMode) -> limiter::FailureMode {
        match mode {
            FailureMode::Error => limiter::FailureMode::Error,
            FailureMode::Allow => limiter::FailureMode::Allow,
            FailureMode::Deny => limiter::FailureMode::Deny,
            FailureMode::Local => limiter::FailureMode::Local,
        }
    }
}

/// `--on-over-limit`: what a request over the limit books, for rules that do not say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnOverLimit {
    /// Nothing: a rejected request consumes nothing (floodgate's default for files).
    Reject,
    /// Its whole cost, into debt where the algorithm keeps one (the default for xDS).
    Consume,
}

impl From<OnOverLimit> for rules::OnOverLimit {
    fn from(mode: OnOverLimit) -> rules::OnOverLimit {
        match mode {
            OnOverLimit::Reject => rules::OnOverLimit::Reject,
            OnOverLimit::Consume => rules::OnOverLimit::Consume,
        }
    }
}

/// `--response-headers`: which headers to add to responses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ResponseHeaders {
    /// None; Envoy may derive `X-RateLimit-*` from the statuses itself.
    Off,
    /// draft-ietf-httpapi-ratelimit-headers.
    Ietf,
    /// The reference service's three plain headers.
    Legacy,
}

impl From<ResponseHeaders> for headers::HeaderMode {
    fn from(mode: ResponseHeaders) -> headers::HeaderMode {
        match mode {
            ResponseHeaders::Off => headers::HeaderMode::Off,
            ResponseHeaders::Ietf => headers::HeaderMode::Ietf,
            ResponseHeaders::Legacy => headers::HeaderMode::Legacy,
        }
    }
}

/// `--redis-scripting`: how the Redis backends run their Lua code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RedisScripting {
    /// The function library where the server has functions (Redis >= 7), else scripts.
    Auto,
    /// Scripts by `EVALSHA` (any Redis version).
    Evalsha,
    /// The function library by `FCALL`; startup fails before Redis 7.
    Functions,
}

impl From<RedisScripting> for redis::Scripting {
    fn from(mode: RedisScripting) -> redis::Scripting {
        match mode {
            RedisScripting::Auto => redis::Scripting::Auto,
            RedisScripting::Evalsha => redis::Scripting::Evalsha,
            RedisScripting::Functions => redis::Scripting::Functions,
        }
    }
}

/// `--log-format`: the log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable text.
    Text,
    /// One JSON object per line, for log pipelines.
    Json,
}

impl From<LogFormat> for telemetry::LogFormat {
    fn from(format: LogFormat) -> telemetry::LogFormat {
        match format {
            LogFormat::Text => telemetry::LogFormat::Text,
            LogFormat::Json => telemetry::LogFormat::Json,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each flag value names the domain variant of the same name, so the mapping cannot
    /// silently swap two choices.
    #[test]
    fn every_choice_maps_to_its_namesake() {
        for mode in FailureMode::value_variants() {
            let name = mode.to_possible_value().unwrap().get_name().to_owned();
            let domain = format!("{:?}", limiter::FailureMode::from(*mode));
            assert_eq!(domain.to_lowercase(), name);
        }
        for mode in ResponseHeaders::value_variants() {
            let name = mode.to_possible_value().unwrap().get_name().to_owned();
            let domain = format!("{:?}", headers::HeaderMode::from(*mode));
            assert_eq!(domain.to_lowercase(), name);
        }
        for mode in RedisScripting::value_variants() {
            let name = mode.to_possible_value().unwrap().get_name().to_owned();
            let domain = format!("{:?}", redis::Scripting::from(*mode));
            assert_eq!(domain.to_lowercase(), name);
        }
        for format in LogFormat::value_variants() {
            let name = format.to_possible_value().unwrap().get_name().to_owned();
            let domain = format!("{:?}", telemetry::LogFormat::from(*format));
            assert_eq!(domain.to_lowercase(), name);
        }
    }
}
