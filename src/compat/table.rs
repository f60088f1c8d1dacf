//! The reference variables that each stand in for one floodgate setting and convert on
//! their own value alone: one table, which [`Mapper::rows`] applies and the tests walk row
//! by row. A variable read together with others (`HOST`/`PORT`, `RUNTIME_*`, the Redis
//! URL and its companions, the switches that turn a feature on) has its own function.

use super::*;
use crate::statsd::Tag;
use Convert::{Bool, Duration, File, Millis, OptionalText, Other, Secret, Text};
use Gate::{Always, GrpcTls, Redis, Statsd, Tracing};

/// When a row applies; outside it, the mapping function of that feature reports the
/// variable instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Gate {
    /// Always.
    Always,
    /// With `GRPC_SERVER_USE_TLS=true`, as in the reference.
    GrpcTls,
    /// With a Redis backend.
    Redis,
    /// With tracing on.
    Tracing,
    /// With StatsD on.
    Statsd,
}

/// How a variable's value converts, and the `ServeArgs` field that takes it.
#[derive(Clone, Copy)]
pub(super) enum Convert {
    /// The value as it is.
    Text(fn(&mut ServeArgs) -> &mut String),
    /// The value as it is, for a setting that may be absent.
    OptionalText(fn(&mut ServeArgs) -> &mut Option<String>),
    /// A file path.
    File(fn(&mut ServeArgs) -> &mut Option<PathBuf>),
    /// A secret, redacted wherever the settings are shown.
    Secret(fn(&mut ServeArgs) -> &mut Option<SecretText>),
    /// A boolean as Go reads it ([`parse_bool`]).
    Bool(fn(&mut ServeArgs) -> &mut bool),
    /// A Go duration.
    Duration(fn(&mut ServeArgs) -> &mut GoDuration),
    /// A Go duration, at least 1 ms (less is read as 1 ms).
    Millis(fn(&mut ServeArgs) -> &mut GoDuration),
    /// A conversion of its own, which also sets the field.
    Other(fn(&str, &mut ServeArgs) -> Result<(), BadValue>),
}

impl Convert {
    /// Converts `value` into its field of `args`; the error says what is wrong with it.
    fn apply(self, value: &str, args: &mut ServeArgs) -> Result<(), BadValue> {
        match self {
            Text(field) => *field(args) = value.to_owned(),
            OptionalText(field) => *field(args) = Some(value.to_owned()),
            File(field) => *field(args) = Some(PathBuf::from(value)),
            Secret(field) => *field(args) = Some(SecretText::from(value.to_owned())),
            Bool(field) => *field(args) = parse_bool(value)?,
            Duration(field) => *field(args) = value.parse().map_err(BadValue::Flag)?,
            Millis(field) => {
                let duration = parse_go_duration(value)?;
                *field(args) = GoDuration(duration.max(std::time::Duration::from_millis(1)));
            }
            Other(convert) => convert(value, args)?,
        }
        Ok(())
    }
}

/// One variable and the setting it stands in for.
#[derive(Clone, Copy)]
pub(super) struct Row {
    pub(super) variable: &'static str,
    pub(super) setting: Setting,
    pub(super) gate: Gate,
    pub(super) convert: Convert,
}

const fn row(gate: Gate, variable: &'static str, flag: &'static str, convert: Convert) -> Row {
    Row {
        variable,
        setting: setting(flag),
        gate,
        convert,
    }
}

/// Every one-to-one variable, in the order each gate applies its rows.
#[rustfmt::skip]
pub(super) static ROWS: [Row; 39] = [
    row(Always, "GRPC_UDS", "--grpc-uds", File(|a| &mut a.grpc_uds)),
    row(Always, "GRPC_MAX_CONNECTION_AGE", "--grpc-max-connection-age",
        Duration(|a| &mut a.grpc.grpc_max_connection_age)),
    row(Always, "GRPC_MAX_CONNECTION_AGE_GRACE", "--grpc-max-connection-age-grace",
        Duration(|a| &mut a.grpc.grpc_max_connection_age_grace)),
    row(Always, "LOG_FORMAT", "--log-format", Other(log_format)),
    row(Always, "SHADOW_MODE", "--shadow-mode", Bool(|a| &mut a.shadow_mode)),
    row(Always, "QUOTA_MODE", "--quota-mode", Bool(|a| &mut a.quota_mode)),
    row(Always, "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "--on-over-limit",
        Other(stop_increment)),
    row(Always, "LIMIT_RESPONSE_HEADERS_ENABLED", "--response-headers", Other(response_headers)),
    row(Always, "LOCAL_CACHE_SIZE_IN_BYTES", "--local-cache-entries", Other(local_cache_entries)),
    row(Always, "CACHE_KEY_PREFIX", "--key-prefix", Text(|a| &mut a.key_prefix)),
    row(Always, "CONFIG_TYPE", "--config-source", Other(config_source)),
    row(Always, "CONFIG_GRPC_XDS_SERVER_URL", "--xds-server",
        OptionalText(|a| &mut a.xds.xds_server)),
    row(Always, "CONFIG_GRPC_XDS_NODE_ID", "--xds-node-id", Text(|a| &mut a.xds.xds_node_id)),
    row(Always, "CONFIG_GRPC_XDS_NODE_METADATA", "--xds-node-metadata",
        OptionalText(|a| &mut a.xds.xds_node_metadata)),
    row(Always, "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "--xds-client-headers",
        Secret(|a| &mut a.xds.xds_client_headers)),
    row(Always, "CONFIG_GRPC_XDS_SERVER_USE_TLS", "--xds-tls", Bool(|a| &mut a.xds.xds_tls)),
    row(Always, "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "--xds-tls-cert",
        File(|a| &mut a.xds.xds_tls_cert)),
    row(Always, "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "--xds-tls-key",
        File(|a| &mut a.xds.xds_tls_key)),
    row(Always, "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "--xds-tls-ca",
        File(|a| &mut a.xds.xds_tls_ca)),
    row(Always, "CONFIG_GRPC_XDS_SERVER_TLS_SAN", "--xds-tls-san",
        OptionalText(|a| &mut a.xds.xds_tls_san)),
    row(Always, "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "--xds-max-message-bytes",
        Other(xds_max_message_bytes)),
    row(Always, "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "--xds-backoff-initial",
        Millis(|a| &mut a.xds.xds_backoff_initial)),
    row(Always, "XDS_CLIENT_BACKOFF_MAX_INTERVAL", "--xds-backoff-max",
        Millis(|a| &mut a.xds.xds_backoff_max)),
    row(Always, "FORCE_START_WITHOUT_INITIAL_CONFIG", "--force-start-without-initial-config",
        Bool(|a| &mut a.xds.force_start_without_initial_config)),
    row(Always, "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
        "--healthy-with-at-least-one-config-loaded",
        Bool(|a| &mut a.xds.healthy_with_at_least_one_config_loaded)),
    row(Always, "RESPONSE_DYNAMIC_METADATA", "--response-dynamic-metadata",
        Bool(|a| &mut a.response_dynamic_metadata)),
    row(GrpcTls, "GRPC_SERVER_TLS_CERT", "--grpc-tls-cert", File(|a| &mut a.grpc.grpc_tls_cert)),
    row(GrpcTls, "GRPC_SERVER_TLS_KEY", "--grpc-tls-key", File(|a| &mut a.grpc.grpc_tls_key)),
    row(GrpcTls, "GRPC_CLIENT_TLS_CACERT", "--grpc-tls-client-ca",
        File(|a| &mut a.grpc.grpc_tls_client_ca)),
    row(GrpcTls, "GRPC_CLIENT_TLS_SAN", "--grpc-tls-client-san",
        OptionalText(|a| &mut a.grpc.grpc_tls_client_san)),
    row(Redis, "REDIS_TLS_CLIENT_CERT", "--redis-tls-client-cert",
        File(|a| &mut a.redis_tls_client_cert)),
    row(Redis, "REDIS_TLS_CLIENT_KEY", "--redis-tls-client-key",
        File(|a| &mut a.redis_tls_client_key)),
    row(Redis, "REDIS_TLS_CACERT", "--redis-ca-file", File(|a| &mut a.redis_ca_file)),
    row(Tracing, "TRACING_EXPORTER_PROTOCOL", "--otlp-protocol", Other(otlp_protocol)),
    row(Tracing, "TRACING_SERVICE_NAME", "--tracing-service-name",
        Text(|a| &mut a.tracing.tracing_service_name)),
    row(Tracing, "TRACING_SERVICE_NAMESPACE", "--tracing-service-namespace",
        OptionalText(|a| &mut a.tracing.tracing_service_namespace)),
    row(Tracing, "TRACING_SERVICE_INSTANCE_ID", "--tracing-service-instance-id",
        OptionalText(|a| &mut a.tracing.tracing_service_instance_id)),
    row(Tracing, "TRACING_SAMPLING_RATE", "--tracing-sampling-rate", Other(sampling_rate)),
    row(Statsd, "EXTRA_TAGS", "--statsd-tags", Other(statsd_tags)),
];

/// The variables of `gate`'s rows, in table order.
pub(super) fn variables(gate: Gate) -> impl Iterator<Item = &'static str> {
    ROWS.iter()
        .filter(move |row| row.gate == gate)
        .map(|row| row.variable)
}

impl Mapper<'_> {
    /// Applies `gate`'s rows: each set variable whose setting is not given converts into it.
    pub(super) fn rows(
        &mut self,
        args: &mut ServeArgs,
        gate: Gate,
    ) -> Result<(), ReferenceEnvError> {
        for row in ROWS.iter().filter(|row| row.gate == gate) {
            if self.claim(row.setting, &[row.variable]) {
                let value = self.get(row.variable).unwrap_or_default();
                row.convert
                    .apply(&value, args)
                    .map_err(|bad| invalid(row.variable, bad.to_string()))?;
            }
        }
        Ok(())
    }
}

/// The choice `value` names, ignoring ASCII case.
fn choose<T>(value: &str, choices: [(&str, T); 2]) -> Option<T> {
    let choice = choices
        .into_iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(value));
    choice.map(|(_, choice)| choice)
}

/// `value` is not one of `expected`.
fn not_one_of(value: &str, expected: &'static str) -> BadValue {
    BadValue::NotOneOf {
        value: value.to_owned(),
        expected,
    }
}

fn log_format(value: &str, args: &mut ServeArgs) -> Result<(), BadValue> {
    let choices = [("json", LogFormat::Json), ("text", LogFormat::Text)];
    args.log_format = choose(value, choices).ok_or_else(|| not_one_of(value, "json, text"))?;
    Ok(())
}

/// `true` stops the reference booking requests over the limit: `--on-over-limit reject`.
/// `false`, the reference's default, changes nothing: rules from xDS `consume` already, and
/// rules from files keep floodgate's "a rejected request consumes nothing".
fn stop_increment(value: &str, args: &mut ServeArgs) -> Result<(), BadValue> {
    if parse_bool(value)? {
        args.on_over_limit = Some(OnOverLimit::Reject);
    }
    Ok(())
}

/// The reference's headers are the plain-integer RateLimit-Limit/Remaining/Reset.
fn response_headers(value: &str, args: &mut ServeArgs) -> Result<(), BadValue> {
    args.response_headers = if parse_bool(value)? {
        ResponseHeaders::Legacy
    } else {
        ResponseHeaders::Off
    };
    Ok(())
}

fn local_cache_entries(value: &str, args: &mut ServeArgs) -> Result<(), BadValue> {
    let bytes = value.parse::<u64>().map_err(|_| BadValue::NotA {
        value: value.to_owned(),
        expected: "a number of bytes",
    })?;
    let entries = bytes / ASSUMED_BYTES_PER_CACHE_ENTRY;
    args.local_cache_entries = usize::try_from(entries).unwrap_or(usize::MAX);
    Ok(())
}

fn config_source(value: &str, args: &mut ServeArgs) -> Result<(), BadValue> {
    let choices = [
        ("FILE", ConfigSource::File),
        ("GRPC_XDS_SOTW", ConfigSource::Xds),
    ];
    args.xds.config_source =
        choose(value, choices).ok_or_else(|| not_one_of(value, "FILE, GRPC_XDS_SOTW"))?;
    Ok(())
}

fn xds_max_message_bytes(value: &str, args: &mut ServeArgs) -> Result<(), BadValue> {
    match value.parse::<usize>() {
        Ok(bytes) if bytes >= 1024 => args.xds.xds_max_message_bytes = bytes,
        _ => {
            return Err(BadValue::NotA {
                value: value.to_owned(),
                expected: "a size in bytes of at least 1024",
            });
        }
    }
    Ok(())
}

fn otlp_protocol(value: &str, args: &mut ServeArgs) -> Result<(), BadValue> {
    let choices = [("http", OtlpProtocol::Http), ("grpc", OtlpProtocol::Grpc)];
    args.tracing.otlp_protocol =
        choose(value, choices).ok_or_else(|| not_one_of(value, "http, grpc"))?;
    Ok(())
}

fn sampling_rate(value: &str, args: &mut ServeArgs) -> Result<(), BadValue> {
    args.tracing.tracing_sampling_rate = parse_rate(value).map_err(BadValue::Flag)?;
    Ok(())
}

fn statsd_tags(value: &str, args: &mut ServeArgs) -> Result<(), BadValue> {
    args.statsd.statsd_tags = value
        .split(',')
        .filter(|tag| !tag.trim().is_empty())
        .map(str::parse::<Tag>)
        .collect::<Result<_, _>>()
        .map_err(BadValue::Flag)?;
    Ok(())
}
