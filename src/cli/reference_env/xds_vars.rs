//! The rule source variables: `CONFIG_TYPE`, `CONFIG_GRPC_XDS_*`, `XDS_CLIENT_BACKOFF_*` and
//! the start/readiness switches onto the xDS flags.

use super::*;

impl Mapper<'_> {
    /// The rule source (`CONFIG_TYPE`), the xDS client, start and readiness without rules,
    /// and dynamic metadata.
    pub(super) fn xds(&mut self, args: &mut ServeArgs) -> Result<(), ReferenceEnvError> {
        let xds = &mut args.xds;
        if self.claim(CONFIG_SOURCE, &["CONFIG_TYPE"]) {
            let source = self.parse("CONFIG_TYPE", |value| {
                match value.to_ascii_uppercase().as_str() {
                    "FILE" => Ok(ConfigSource::File),
                    "GRPC_XDS_SOTW" => Ok(ConfigSource::Xds),
                    _ => Err(format!("`{value}` is neither FILE nor GRPC_XDS_SOTW")),
                }
            })?;
            xds.config_source = source.unwrap_or(xds.config_source);
        }
        if self.claim(XDS_SERVER, &["CONFIG_GRPC_XDS_SERVER_URL"]) {
            xds.xds_server = self.get("CONFIG_GRPC_XDS_SERVER_URL");
        } else if xds.config_source == ConfigSource::Xds
            && xds.xds_server.is_none()
            && self.is_set("CONFIG_TYPE")
        {
            // The reference's own default: a drop-in that relied on it keeps working.
            xds.xds_server = Some(REFERENCE_XDS_SERVER.to_owned());
        }
        if self.claim(XDS_NODE_ID, &["CONFIG_GRPC_XDS_NODE_ID"]) {
            xds.xds_node_id = self.get("CONFIG_GRPC_XDS_NODE_ID").unwrap_or_default();
        }
        if self.claim(XDS_NODE_METADATA, &["CONFIG_GRPC_XDS_NODE_METADATA"]) {
            xds.xds_node_metadata = self.get("CONFIG_GRPC_XDS_NODE_METADATA");
        }
        let headers = "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS";
        if self.claim(XDS_CLIENT_HEADERS, &[headers]) {
            xds.xds_client_headers = self.get(headers).map(SecretText::from);
        }
        if self.claim(XDS_TLS, &["CONFIG_GRPC_XDS_SERVER_USE_TLS"]) {
            xds.xds_tls = self.parse("CONFIG_GRPC_XDS_SERVER_USE_TLS", parse_bool)? == Some(true);
        }
        for (setting, name, field) in [
            (
                XDS_TLS_CERT,
                "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
                &mut xds.xds_tls_cert,
            ),
            (
                XDS_TLS_KEY,
                "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
                &mut xds.xds_tls_key,
            ),
            (
                XDS_TLS_CA,
                "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
                &mut xds.xds_tls_ca,
            ),
        ] {
            if self.claim(setting, &[name]) {
                *field = self.get(name).map(PathBuf::from);
            }
        }
        if self.claim(XDS_TLS_SAN, &["CONFIG_GRPC_XDS_SERVER_TLS_SAN"]) {
            xds.xds_tls_san = self.get("CONFIG_GRPC_XDS_SERVER_TLS_SAN");
        }
        let max_message = "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES";
        if self.claim(XDS_MAX_MESSAGE_BYTES, &[max_message]) {
            let bytes = self.parse(max_message, |value| match value.parse::<usize>() {
                Ok(bytes) if bytes >= 1024 => Ok(bytes),
                _ => Err("not a size in bytes of at least 1024".to_owned()),
            })?;
            xds.xds_max_message_bytes = bytes.unwrap_or(xds.xds_max_message_bytes);
        }
        for (setting, name, field) in [
            (
                XDS_BACKOFF_INITIAL,
                "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
                &mut xds.xds_backoff_initial_ms,
            ),
            (
                XDS_BACKOFF_MAX,
                "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
                &mut xds.xds_backoff_max_ms,
            ),
        ] {
            if self.claim(setting, &[name]) {
                let interval = self.parse(name, parse_go_duration)?;
                if let Some(interval) = interval {
                    *field = u64::try_from(interval.as_millis())
                        .unwrap_or(u64::MAX)
                        .max(1);
                }
            }
        }
        let jitter = [
            "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
            "XDS_CLIENT_BACKOFF_JITTER",
        ];
        if self.claim(XDS_BACKOFF_JITTER, &jitter) {
            let factor = self.parse(jitter[0], |value| match value.parse::<f64>() {
                Ok(factor) if (0.0..=1.0).contains(&factor) => Ok(factor),
                _ => Err(format!("`{value}` is not a factor between 0 and 1")),
            })?;
            let enabled = self.parse(jitter[1], parse_bool)?;
            xds.xds_backoff_jitter = match enabled {
                Some(false) => 0.0,
                _ => factor.unwrap_or(REFERENCE_XDS_JITTER),
            };
        }
        for (setting, name, field) in [
            (
                FORCE_START,
                "FORCE_START_WITHOUT_INITIAL_CONFIG",
                &mut xds.force_start_without_initial_config,
            ),
            (
                HEALTHY_WITH_CONFIG,
                "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
                &mut xds.healthy_with_at_least_one_config_loaded,
            ),
            (
                RESPONSE_DYNAMIC_METADATA,
                "RESPONSE_DYNAMIC_METADATA",
                &mut args.response_dynamic_metadata,
            ),
        ] {
            if self.claim(setting, &[name]) {
                *field = self.parse(name, parse_bool)? == Some(true);
            }
        }
        Ok(())
    }
}
