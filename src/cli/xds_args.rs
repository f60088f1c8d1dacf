//! The flags of the xDS rule source and of serving before rules arrive
//! (docs/operations.md#security-and-config-sources).

use super::FlagError;
use std::path::PathBuf;

use clap::{Args, ValueEnum};

use super::{
    DEFAULT_XDS_BACKOFF_INITIAL, DEFAULT_XDS_BACKOFF_JITTER, DEFAULT_XDS_BACKOFF_MAX,
    DEFAULT_XDS_NODE_ID,
};
use crate::duration::{self, GoDuration};
use crate::redact::SecretText;
use crate::server::Startup;
use crate::xds::{self, Backoff, XdsSettings, XdsTls};

/// Where rules come from, and serving before they arrive.
#[derive(Debug, Clone, Args)]
pub struct XdsArgs {
    /// Where rules come from: `file` (the --config directory) or `xds` (--xds-server).
    #[arg(long, env = "FLOODGATE_CONFIG_SOURCE", value_name = "SOURCE", value_enum, default_value_t = ConfigSource::File)]
    pub config_source: ConfigSource,
    /// xDS management server (ADS, State of the World): `host:port` or an `http(s)://` URL.
    #[arg(long, env = "FLOODGATE_XDS_SERVER", value_name = "URL")]
    pub xds_server: Option<String>,
    /// Node id the management server picks the rules by.
    #[arg(long, env = "FLOODGATE_XDS_NODE_ID", value_name = "ID", default_value = DEFAULT_XDS_NODE_ID)]
    pub xds_node_id: String,
    /// Node metadata, `key=value,key2=value2` (string values), as the reference reads it.
    #[arg(long, env = "FLOODGATE_XDS_NODE_METADATA", value_name = "K=V,...")]
    pub xds_node_metadata: Option<String>,
    /// gRPC metadata sent with the stream, `name:value,name2:value2` (the reference's
    /// format), e.g. an authorization token.
    #[arg(
        long,
        env = "FLOODGATE_XDS_CLIENT_HEADERS",
        value_name = "NAME:VALUE,...",
        hide_env_values = true
    )]
    pub xds_client_headers: Option<SecretText>,
    /// Connect to the management server over TLS.
    #[arg(long, env = "FLOODGATE_XDS_TLS", value_parser = clap::builder::BoolishValueParser::new())]
    pub xds_tls: bool,
    /// PEM client certificate for mutual TLS (with --xds-tls-key).
    #[arg(long, env = "FLOODGATE_XDS_TLS_CERT", value_name = "FILE")]
    pub xds_tls_cert: Option<PathBuf>,
    /// PEM private key of --xds-tls-cert.
    #[arg(long, env = "FLOODGATE_XDS_TLS_KEY", value_name = "FILE")]
    pub xds_tls_key: Option<PathBuf>,
    /// PEM CA bundle that signs the management server (default: the public web roots).
    #[arg(long, env = "FLOODGATE_XDS_TLS_CA", value_name = "FILE")]
    pub xds_tls_ca: Option<PathBuf>,
    /// Name to verify in the server certificate instead of the URL's host.
    #[arg(long, env = "FLOODGATE_XDS_TLS_SAN", value_name = "NAME")]
    pub xds_tls_san: Option<String>,
    /// Largest response accepted from the management server, in bytes.
    #[arg(
        long,
        env = "FLOODGATE_XDS_MAX_MESSAGE_BYTES",
        value_name = "BYTES",
        default_value_t = xds::DEFAULT_MAX_MESSAGE_BYTES,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1024..)
    )]
    pub xds_max_message_bytes: usize,
    /// First reconnect delay; doubles up to --xds-backoff-max.
    #[arg(
        long,
        env = "FLOODGATE_XDS_BACKOFF_INITIAL",
        value_name = "DURATION",
        default_value = DEFAULT_XDS_BACKOFF_INITIAL,
        value_parser = duration::parse_positive
    )]
    pub xds_backoff_initial: GoDuration,
    /// The old spelling of --xds-backoff-initial, in whole milliseconds.
    #[arg(long, env = "FLOODGATE_XDS_BACKOFF_INITIAL_MS", value_name = "MS", hide = true,
          conflicts_with = "xds_backoff_initial", value_parser = clap::value_parser!(u64).range(1..))]
    pub xds_backoff_initial_ms: Option<u64>,
    /// Longest reconnect delay.
    #[arg(long, env = "FLOODGATE_XDS_BACKOFF_MAX", value_name = "DURATION", default_value = DEFAULT_XDS_BACKOFF_MAX)]
    pub xds_backoff_max: GoDuration,
    /// The old spelling of --xds-backoff-max, in whole milliseconds.
    #[arg(
        long,
        env = "FLOODGATE_XDS_BACKOFF_MAX_MS",
        value_name = "MS",
        hide = true,
        conflicts_with = "xds_backoff_max"
    )]
    pub xds_backoff_max_ms: Option<u64>,
    /// Spread of each reconnect delay, 0 (none) to 1.
    #[arg(long, env = "FLOODGATE_XDS_BACKOFF_JITTER", value_name = "FACTOR", default_value_t = DEFAULT_XDS_BACKOFF_JITTER)]
    pub xds_backoff_jitter: f64,
    /// With xDS, serve as soon as the listeners are up instead of waiting for the first
    /// rules; calls are answered UNAVAILABLE until they arrive.
    #[arg(long, env = "FLOODGATE_FORCE_START_WITHOUT_INITIAL_CONFIG", value_parser = clap::builder::BoolishValueParser::new())]
    pub force_start_without_initial_config: bool,
    /// Report NOT_SERVING (gRPC health and /healthcheck) while the rules define no domain.
    #[arg(long, env = "FLOODGATE_HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", value_parser = clap::builder::BoolishValueParser::new())]
    pub healthy_with_at_least_one_config_loaded: bool,
}

impl XdsArgs {
    /// The xDS settings, or `None` for file rules.
    ///
    /// # Errors
    /// xDS without a server, or a setting [`XdsSettings::check`] rejects.
    pub fn settings(&self) -> Result<Option<XdsSettings>, FlagError> {
        if self.config_source == ConfigSource::File {
            return Ok(None);
        }
        let server = self
            .xds_server
            .clone()
            .filter(|server| !server.is_empty())
            .ok_or_else(|| FlagError::Needs {
                flag: "--config-source xds".to_owned(),
                needs: "--xds-server".to_owned(),
            })?;
        // An https:// URL asks for TLS as --xds-tls does (tonic would not add it itself).
        let tls_on = self.xds_tls || server.starts_with("https://");
        let tls = tls_on.then(|| XdsTls {
            cert: self.xds_tls_cert.clone(),
            key: self.xds_tls_key.clone(),
            ca: self.xds_tls_ca.clone(),
            san: self.xds_tls_san.clone().filter(|san| !san.is_empty()),
        });
        let settings = XdsSettings {
            server,
            node_id: self.xds_node_id.clone(),
            node_metadata: xds::parse_node_metadata(
                self.xds_node_metadata.as_deref().unwrap_or(""),
            ),
            headers: self
                .xds_client_headers
                .as_ref()
                .map(|headers| xds::parse_headers(headers.as_str()))
                .unwrap_or_default(),
            tls,
            stall_timeout: xds::DEFAULT_STALL_TIMEOUT,
            max_message_bytes: self.xds_max_message_bytes,
            backoff: Backoff {
                initial: duration::or_legacy_millis(
                    self.xds_backoff_initial,
                    self.xds_backoff_initial_ms,
                ),
                max: duration::or_legacy_millis(self.xds_backoff_max, self.xds_backoff_max_ms),
                jitter: self.xds_backoff_jitter,
            },
        };
        settings.check()?;
        Ok(Some(settings))
    }

    /// Serving and readiness before rules arrive.
    pub fn startup(&self) -> Startup {
        Startup {
            force_start_without_initial_config: self.force_start_without_initial_config,
            ready_only_with_rules: self.healthy_with_at_least_one_config_loaded,
        }
    }
}

/// Where rules come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ConfigSource {
    /// YAML files in --config, reloaded on change.
    File,
    /// An xDS management server (--xds-server).
    Xds,
}
