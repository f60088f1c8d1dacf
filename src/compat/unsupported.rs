//! The reference variables floodgate recognises but does not honour, and the values of each
//! that ask for nothing floodgate lacks (those are not reported): usually the reference's
//! default, or the value that describes what floodgate always does.

use super::parse_bool;

/// Why `name` set to `value` is not honoured, or None when it is not one of these variables
/// or its value asks for nothing floodgate lacks.
pub(super) fn reason(name: &str, value: &str) -> Option<&'static str> {
    UNSUPPORTED
        .iter()
        .find(|rule| rule.matches(name))
        .filter(|rule| !(rule.quiet)(value))
        .map(|rule| rule.reason)
}

/// A reference variable (or a family of them, by prefix) that floodgate does not honour.
struct Ignored {
    name: &'static str,
    prefix: bool,
    /// Whether a value asks for nothing floodgate lacks (such values are not reported).
    quiet: fn(&str) -> bool,
    reason: &'static str,
}

impl Ignored {
    fn matches(&self, name: &str) -> bool {
        if self.prefix {
            name.starts_with(self.name)
        } else {
            name == self.name
        }
    }
}

const fn exact(name: &'static str, quiet: fn(&str) -> bool, reason: &'static str) -> Ignored {
    Ignored {
        name,
        prefix: false,
        quiet,
        reason,
    }
}

/// Every variable of the family starting with `prefix` is reported whatever its value.
const fn family(prefix: &'static str, reason: &'static str) -> Ignored {
    Ignored {
        name: prefix,
        prefix: true,
        quiet: never,
        reason,
    }
}

fn never(_: &str) -> bool {
    false
}

fn when_false(value: &str) -> bool {
    parse_bool(value) == Ok(false)
}

fn when_true(value: &str) -> bool {
    parse_bool(value) == Ok(true)
}

const METRICS_ON_ADMIN: &str = "metrics are at /metrics on the admin HTTP port (--http-addr)";
const ONE_SCRIPT_CALL: &str =
    "one request's descriptors always go to Redis together, in one script call per node";
const BACKEND_TIMEOUT: &str = "each backend call is bounded by --backend-timeout instead \
     (FLOODGATE_BACKEND_TIMEOUT), far below the reference's 10 s I/O timeout";
const NO_POOL_WAIT: &str = "calls never wait for a free pooled connection: they share the \
     pool's connections, and one that cannot be answered in time is shed";
const LEGACY_HEADER_NAMES: &str =
    "the legacy headers are always RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset";

/// The reference variables floodgate recognises but does not honour. First match wins, so
/// exact names come before a family that would include them.
const UNSUPPORTED: &[Ignored] = &[
    exact("PROTO", |v| v == "tcp", "floodgate listens on TCP"),
    exact(
        "DEBUG_HOST",
        never,
        "no debug listener; /rlconfig and /metrics are on the admin HTTP port",
    ),
    exact(
        "DEBUG_PORT",
        never,
        "no debug listener; /rlconfig and /metrics are on the admin HTTP port",
    ),
    exact(
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
        |v| v == "3s",
        "the xDS client reconnects on the XDS_CLIENT_BACKOFF_* schedule (--xds-backoff-*)",
    ),
    family(
        "USE_DOG_STATSD_",
        "no mogrifiers: DogStatsD names are the reference's base names, tagged with EXTRA_TAGS",
    ),
    exact("PROMETHEUS_ADDR", never, METRICS_ON_ADMIN),
    exact("PROMETHEUS_PATH", |v| v == "/metrics", METRICS_ON_ADMIN),
    exact(
        "PROMETHEUS_MAPPER_YAML",
        never,
        "metric names are fixed (ratelimit_service_rate_limit_*)",
    ),
    exact(
        "RUNTIME_WATCH_ROOT",
        when_false,
        "floodgate watches the rule directory itself (and reloads on SIGHUP), not RUNTIME_ROOT",
    ),
    exact(
        "RUNTIME_IGNOREDOTFILES",
        when_true,
        "dotfiles in the rule directory are always skipped",
    ),
    exact(
        "EXPIRATION_JITTER_MAX_SECONDS",
        |v| v == "0" || v == "300",
        "bucket keys expire when their window ends, without jitter",
    ),
    exact(
        "NEAR_LIMIT_RATIO",
        |v| v.parse::<f64>() == Ok(0.8),
        "near_limit counts hits past a fixed 80% of the limit",
    ),
    exact(
        "MERGE_DOMAIN_CONFIG",
        when_false,
        "a domain lives in one file; a duplicate domain is a config error",
    ),
    exact(
        "LIMIT_LIMIT_HEADER",
        |v| v.eq_ignore_ascii_case("RateLimit-Limit"),
        LEGACY_HEADER_NAMES,
    ),
    exact(
        "LIMIT_REMAINING_HEADER",
        |v| v.eq_ignore_ascii_case("RateLimit-Remaining"),
        LEGACY_HEADER_NAMES,
    ),
    exact(
        "LIMIT_RESET_HEADER",
        |v| v.eq_ignore_ascii_case("RateLimit-Reset"),
        LEGACY_HEADER_NAMES,
    ),
    exact(
        "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
        when_false,
        "Redis TLS always verifies the server name",
    ),
    exact(
        "REDIS_PIPELINE_WINDOW",
        |v| v == "0" || v == "0s",
        "the descriptors of one request are always pipelined",
    ),
    exact(
        "REDIS_PIPELINE_LIMIT",
        |v| v == "0",
        "the descriptors of one request are always pipelined",
    ),
    exact(
        "REDIS_PERSECOND_PIPELINE_WINDOW",
        |v| v == "0" || v == "0s",
        "the descriptors of one request are always pipelined",
    ),
    exact(
        "REDIS_PERSECOND_PIPELINE_LIMIT",
        |v| v == "0",
        "the descriptors of one request are always pipelined",
    ),
    exact("REDIS_USE_EXPLICIT_PIPELINE", when_false, ONE_SCRIPT_CALL),
    exact(
        "REDIS_PERSECOND_USE_EXPLICIT_PIPELINE",
        when_false,
        ONE_SCRIPT_CALL,
    ),
    exact("REDIS_TIMEOUT", |v| v == "10s", BACKEND_TIMEOUT),
    exact("REDIS_PERSECOND_TIMEOUT", |v| v == "10s", BACKEND_TIMEOUT),
    exact(
        "REDIS_POOL_ON_EMPTY_BEHAVIOR",
        |v| v.eq_ignore_ascii_case("WAIT"),
        NO_POOL_WAIT,
    ),
    exact(
        "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
        |v| v.eq_ignore_ascii_case("WAIT"),
        NO_POOL_WAIT,
    ),
    exact("REDIS_POOL_ON_EMPTY_WAIT_DURATION", never, NO_POOL_WAIT),
    exact(
        "REDIS_PERSECOND_POOL_ON_EMPTY_WAIT_DURATION",
        never,
        NO_POOL_WAIT,
    ),
    exact(
        "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
        when_true,
        "readiness always drops while the backend is unreachable",
    ),
    family("MEMCACHE_", "no memcache backend"),
];

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference variables with a meaning here, which no rule may swallow.
    const MAPPED: [&str; 75] = [
        "GRPC_UDS",
        "USE_STATSD",
        "USE_DOG_STATSD",
        "STATSD_HOST",
        "STATSD_PORT",
        "EXTRA_TAGS",
        "STATS_FLUSH_INTERVAL",
        "GOSTATS_FLUSH_INTERVAL_SECONDS",
        "DISABLE_STATS",
        "GRPC_SERVER_USE_TLS",
        "GRPC_SERVER_TLS_CERT",
        "GRPC_SERVER_TLS_KEY",
        "GRPC_CLIENT_TLS_CACERT",
        "GRPC_CLIENT_TLS_SAN",
        "GRPC_MAX_CONNECTION_AGE",
        "GRPC_MAX_CONNECTION_AGE_GRACE",
        "REDIS_TLS_CLIENT_CERT",
        "REDIS_TLS_CLIENT_KEY",
        "REDIS_TLS_CACERT",
        "CONFIG_TYPE",
        "CONFIG_GRPC_XDS_SERVER_URL",
        "CONFIG_GRPC_XDS_NODE_ID",
        "CONFIG_GRPC_XDS_NODE_METADATA",
        "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
        "CONFIG_GRPC_XDS_SERVER_USE_TLS",
        "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
        "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
        "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
        "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
        "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
        "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
        "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
        "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
        "XDS_CLIENT_BACKOFF_JITTER",
        "FORCE_START_WITHOUT_INITIAL_CONFIG",
        "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
        "RESPONSE_DYNAMIC_METADATA",
        "TRACING_ENABLED",
        "TRACING_EXPORTER_PROTOCOL",
        "TRACING_SERVICE_NAME",
        "TRACING_SERVICE_NAMESPACE",
        "TRACING_SERVICE_INSTANCE_ID",
        "TRACING_SAMPLING_RATE",
        "HOST",
        "PORT",
        "GRPC_HOST",
        "GRPC_PORT",
        "LOG_LEVEL",
        "LOG_FORMAT",
        "RUNTIME_ROOT",
        "RUNTIME_SUBDIRECTORY",
        "RUNTIME_APPDIRECTORY",
        "BACKEND_TYPE",
        "REDIS_TYPE",
        "REDIS_URL",
        "REDIS_AUTH",
        "REDIS_TLS",
        "REDIS_SOCKET_TYPE",
        "REDIS_POOL_SIZE",
        "REDIS_SENTINEL_AUTH",
        "REDIS_PERSECOND",
        "REDIS_PERSECOND_URL",
        "REDIS_PERSECOND_TYPE",
        "REDIS_PERSECOND_AUTH",
        "REDIS_PERSECOND_TLS",
        "REDIS_PERSECOND_SOCKET_TYPE",
        "REDIS_PERSECOND_SENTINEL_AUTH",
        "REDIS_PERSECOND_POOL_SIZE",
        "SHADOW_MODE",
        "QUOTA_MODE",
        "LIMIT_RESPONSE_HEADERS_ENABLED",
        "LOCAL_CACHE_SIZE_IN_BYTES",
        "CACHE_KEY_PREFIX",
        "USE_PROMETHEUS",
        "RUST_LOG",
    ];

    #[test]
    fn no_rule_swallows_a_mapped_variable() {
        for name in MAPPED {
            let rule = UNSUPPORTED.iter().find(|rule| rule.matches(name));
            assert!(rule.is_none(), "{name} matched by {}", rule.unwrap().name);
        }
    }

    #[test]
    fn every_exact_rule_is_reachable() {
        for rule in UNSUPPORTED.iter().filter(|rule| !rule.prefix) {
            let first = UNSUPPORTED.iter().find(|other| other.matches(rule.name));
            assert!(
                std::ptr::eq(first.unwrap(), rule),
                "{} is shadowed by {}",
                rule.name,
                first.unwrap().name
            );
        }
    }

    #[test]
    fn quiet_values_are_not_reported_and_others_are() {
        for (name, quiet, loud) in [
            ("PROTO", "tcp", "udp"),
            ("RUNTIME_IGNOREDOTFILES", "1", "0"),
            ("NEAR_LIMIT_RATIO", "0.8", "0.5"),
            ("REDIS_PIPELINE_WINDOW", "0s", "150us"),
            ("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "true", "false"),
            ("LIMIT_LIMIT_HEADER", "RateLimit-Limit", "X-Limit"),
            ("REDIS_USE_EXPLICIT_PIPELINE", "false", "true"),
            ("REDIS_TIMEOUT", "10s", "1s"),
            ("REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", "wait", "ERROR"),
        ] {
            assert_eq!(reason(name, quiet), None, "{name}={quiet}");
            assert!(reason(name, loud).is_some(), "{name}={loud}");
        }
        assert!(reason("MEMCACHE_SRV", "_m._tcp").is_some());
        assert!(reason("USE_DOG_STATSD_MOGRIFIERS", "TAG").is_some());
        assert_eq!(reason("UNRELATED", "x"), None);
    }
}
