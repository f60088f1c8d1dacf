//! The tracing variables: `TRACING_*` and the OTLP protocol variables onto the tracing
//! flags.

use super::*;

impl Mapper<'_> {
    /// OpenTelemetry tracing: `TRACING_ENABLED=true` turns it on with the endpoint of the
    /// standard `OTEL_EXPORTER_OTLP_*` variables, as in the reference; the other `TRACING_*`
    /// variables describe the exporter and the service. The transport comes from
    /// `TRACING_EXPORTER_PROTOCOL`, else from the standard protocol variables.
    pub(super) fn tracing(&mut self, args: &mut ServeArgs) -> Result<(), ReferenceEnvError> {
        let tracing = &mut args.tracing;
        if self.claim(OTLP_ENDPOINT, &["TRACING_ENABLED"]) {
            tracing.tracing_from_environment =
                self.parse("TRACING_ENABLED", parse_bool)? == Some(true);
        }
        let endpoint_given = tracing
            .otlp_endpoint
            .as_ref()
            .is_some_and(|endpoint| !endpoint.is_empty());
        if !(tracing.tracing_from_environment || endpoint_given) {
            for variable in table::variables(Gate::Tracing) {
                if self.is_set(variable) {
                    self.warn(
                        variable,
                        "has no effect without TRACING_ENABLED=true (or --otlp-endpoint)",
                    );
                }
            }
            return Ok(());
        }
        // Without `TRACING_EXPORTER_PROTOCOL`, the standard variables choose the transport.
        if !self.is_set("TRACING_EXPORTER_PROTOCOL")
            && !self.explicit(OTLP_PROTOCOL)
            && let Some(name) = OTLP_PROTOCOL_VARIABLES
                .into_iter()
                .find(|name| self.is_set(name))
        {
            let protocol = self.parse(name, |value| match value {
                "grpc" => Ok(OtlpProtocol::Grpc),
                "http/protobuf" => Ok(OtlpProtocol::Http),
                _ => Err(BadValue::NotOneOf {
                    value: value.to_owned(),
                    expected: "grpc, http/protobuf (http/json is not supported)",
                }),
            })?;
            tracing.otlp_protocol = protocol.unwrap_or(tracing.otlp_protocol);
        }
        if tracing.tracing_from_environment
            && !self.is_set("TRACING_SERVICE_NAME")
            && !self.explicit(TRACING_SERVICE_NAME)
        {
            // The reference's own default: its spans keep the name queries look for.
            tracing.tracing_service_name = REFERENCE_SERVICE_NAME.to_owned();
        }
        self.rows(args, Gate::Tracing)
    }
}
