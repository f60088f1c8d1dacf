//! The flags of OpenTelemetry tracing over OTLP (docs/operations.md#tracing): off unless
//! `--otlp-endpoint` names a collector (or the reference's `TRACING_ENABLED` asks for it).

use super::FlagError;
use clap::Args;

use crate::otel::{DEFAULT_SERVICE_NAME, OtlpProtocol, TracingSettings};

/// Default share of new traces sampled: all, as the reference does.
pub const DEFAULT_TRACING_SAMPLING_RATE: f64 = 1.0;

/// OpenTelemetry tracing.
#[derive(Debug, Clone, Args)]
pub struct TracingArgs {
    /// OTLP collector URL; turns tracing on. For `http`, `/v1/traces` is appended when the
    /// URL has no path. The `OTEL_EXPORTER_OTLP_*` headers, timeout and insecure variables
    /// apply.
    #[arg(long, env = "FLOODGATE_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// OTLP transport: `http` (http/protobuf) or `grpc`.
    #[arg(long, env = "FLOODGATE_OTLP_PROTOCOL", value_name = "PROTOCOL", value_enum, default_value_t = OtlpProtocol::Http)]
    pub otlp_protocol: OtlpProtocol,
    /// `service.name` of the exported spans.
    #[arg(long, env = "FLOODGATE_TRACING_SERVICE_NAME", value_name = "NAME", default_value = DEFAULT_SERVICE_NAME)]
    pub tracing_service_name: String,
    /// `service.namespace` of the exported spans.
    #[arg(
        long,
        env = "FLOODGATE_TRACING_SERVICE_NAMESPACE",
        value_name = "NAMESPACE"
    )]
    pub tracing_service_namespace: Option<String>,
    /// `service.instance.id` of the exported spans (default: a random UUID per process).
    #[arg(long, env = "FLOODGATE_TRACING_SERVICE_INSTANCE_ID", value_name = "ID")]
    pub tracing_service_instance_id: Option<String>,
    /// Share of new traces sampled, 0 to 1; a call whose `traceparent` carries a sampled
    /// flag follows it.
    #[arg(
        long,
        env = "FLOODGATE_TRACING_SAMPLING_RATE",
        value_name = "RATE",
        default_value_t = DEFAULT_TRACING_SAMPLING_RATE,
        value_parser = parse_rate
    )]
    pub tracing_sampling_rate: f64,
    /// Set by the reference's `TRACING_ENABLED=true`: trace with the endpoint the standard
    /// `OTEL_EXPORTER_OTLP_*` variables name (the OTLP default when none does).
    #[arg(skip)]
    pub tracing_from_environment: bool,
}

impl TracingArgs {
    /// The tracing settings, or `None` when tracing is off.
    ///
    /// # Errors
    /// A setting [`TracingSettings::check`] rejects.
    pub fn settings(&self) -> Result<Option<TracingSettings>, FlagError> {
        let endpoint = self
            .otlp_endpoint
            .clone()
            .filter(|endpoint| !endpoint.is_empty());
        if endpoint.is_none() && !self.tracing_from_environment {
            return Ok(None);
        }
        let non_empty = |value: &Option<String>| value.clone().filter(|value| !value.is_empty());
        let settings = TracingSettings {
            endpoint,
            protocol: self.otlp_protocol,
            service_name: self.tracing_service_name.clone(),
            service_namespace: non_empty(&self.tracing_service_namespace),
            service_instance_id: non_empty(&self.tracing_service_instance_id),
            sampling_rate: self.tracing_sampling_rate,
        };
        settings.check()?;
        Ok(Some(settings))
    }
}

/// A sampling rate: a number from 0 to 1.
pub(crate) fn parse_rate(value: &str) -> Result<f64, String> {
    match value.trim().parse::<f64>() {
        Ok(rate) if (0.0..=1.0).contains(&rate) => Ok(rate),
        _ => Err(format!("`{value}` is not a rate between 0 and 1")),
    }
}
