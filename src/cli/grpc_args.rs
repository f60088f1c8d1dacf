//! The flags of the gRPC listener's connections: TLS, message and stream limits, keepalive,
//! connection age and count (docs/operations.md#command-line).

use std::path::PathBuf;

use clap::Args;

use super::{FlagError, GoDuration};
use crate::listener::{self, GrpcLimits};
use crate::tls::TlsFiles;

/// Default HTTP/2 keepalive ping interval.
pub const DEFAULT_GRPC_KEEPALIVE_INTERVAL: &str = "60s";
/// Default HTTP/2 keepalive ping timeout.
pub const DEFAULT_GRPC_KEEPALIVE_TIMEOUT: &str = "20s";
/// Default gRPC connection age before a GOAWAY (the reference service's default).
pub const DEFAULT_GRPC_MAX_CONNECTION_AGE: &str = "24h";
/// Default time in-flight calls get after that GOAWAY (the reference service's default).
pub const DEFAULT_GRPC_MAX_CONNECTION_AGE_GRACE: &str = "1h";
/// Default time a new gRPC connection gets for its first call (`listener`'s default).
pub const DEFAULT_GRPC_FIRST_CALL_TIMEOUT: &str = "5s";

/// The gRPC listener's connections.
#[derive(Debug, Clone, Args)]
pub struct GrpcArgs {
    /// PEM certificate chain for the gRPC listener; with --grpc-tls-key, serves gRPC over TLS.
    /// Re-read when the file changes (new connections get the new certificate).
    #[arg(long, env = "FLOODGATE_GRPC_TLS_CERT", value_name = "FILE")]
    pub grpc_tls_cert: Option<PathBuf>,
    /// PEM private key of --grpc-tls-cert; re-read when the file changes.
    #[arg(long, env = "FLOODGATE_GRPC_TLS_KEY", value_name = "FILE")]
    pub grpc_tls_key: Option<PathBuf>,
    /// PEM CA certificates of client certificates: when given, every gRPC client must present
    /// a certificate they sign (mTLS). Re-read when the file changes.
    #[arg(long, env = "FLOODGATE_GRPC_TLS_CLIENT_CA", value_name = "FILE")]
    pub grpc_tls_client_ca: Option<PathBuf>,
    /// A DNS name or IP address every client certificate must carry as a subject alternative
    /// name (needs --grpc-tls-client-ca).
    #[arg(long, env = "FLOODGATE_GRPC_TLS_CLIENT_SAN", value_name = "NAME")]
    pub grpc_tls_client_san: Option<String>,
    /// Largest decoded gRPC request message, in bytes; larger ones fail with OUT_OF_RANGE.
    #[arg(
        long,
        env = "FLOODGATE_GRPC_MAX_MESSAGE_BYTES",
        value_name = "BYTES",
        default_value_t = listener::DEFAULT_MAX_MESSAGE_BYTES,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1024..)
    )]
    pub grpc_max_message_bytes: usize,
    /// Concurrent calls per gRPC (HTTP/2) connection.
    #[arg(
        long,
        env = "FLOODGATE_GRPC_MAX_CONCURRENT_STREAMS",
        value_name = "N",
        default_value_t = listener::DEFAULT_MAX_CONCURRENT_STREAMS,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub grpc_max_concurrent_streams: u32,
    /// Open gRPC connections at most; past it new connections are closed at once. Keep it
    /// below the process's file-descriptor limit.
    #[arg(
        long,
        env = "FLOODGATE_GRPC_MAX_CONNECTIONS",
        value_name = "N",
        default_value_t = listener::DEFAULT_MAX_CONNECTIONS,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
    )]
    pub grpc_max_connections: usize,
    /// Interval of HTTP/2 keepalive pings on gRPC connections (Go syntax: 60s, 1m); 0
    /// disables them.
    #[arg(long, env = "FLOODGATE_GRPC_KEEPALIVE_INTERVAL", value_name = "DURATION", default_value = DEFAULT_GRPC_KEEPALIVE_INTERVAL)]
    pub grpc_keepalive_interval: GoDuration,
    /// How long a keepalive ping may go unanswered before the connection is closed.
    #[arg(long, env = "FLOODGATE_GRPC_KEEPALIVE_TIMEOUT", value_name = "DURATION", default_value = DEFAULT_GRPC_KEEPALIVE_TIMEOUT)]
    pub grpc_keepalive_timeout: GoDuration,
    /// Age after which a gRPC connection gets a GOAWAY, so clients reconnect and new
    /// replicas get traffic (up to 10% earlier, at random); 0 never ages connections out.
    #[arg(long, env = "FLOODGATE_GRPC_MAX_CONNECTION_AGE", value_name = "DURATION", default_value = DEFAULT_GRPC_MAX_CONNECTION_AGE)]
    pub grpc_max_connection_age: GoDuration,
    /// Time in-flight calls get after that GOAWAY before the connection is closed.
    #[arg(long, env = "FLOODGATE_GRPC_MAX_CONNECTION_AGE_GRACE", value_name = "DURATION", default_value = DEFAULT_GRPC_MAX_CONNECTION_AGE_GRACE)]
    pub grpc_max_connection_age_grace: GoDuration,
    /// Time a new gRPC connection gets to finish its TLS handshake and send its first call;
    /// past it, and at the connection cap, a connection that sent none is closed. 0 waits
    /// forever.
    #[arg(long, env = "FLOODGATE_GRPC_FIRST_CALL_TIMEOUT", value_name = "DURATION", default_value = DEFAULT_GRPC_FIRST_CALL_TIMEOUT)]
    pub grpc_first_call_timeout: GoDuration,
}

impl GrpcArgs {
    /// The gRPC TLS files, when TLS is asked for; the files are read by the server.
    ///
    /// # Errors
    /// A certificate without its key (or the reverse), or client checks without TLS.
    pub fn tls(&self) -> Result<Option<TlsFiles>, FlagError> {
        let (cert, key) = match (&self.grpc_tls_cert, &self.grpc_tls_key) {
            (Some(cert), Some(key)) => (cert.clone(), key.clone()),
            (None, None) => {
                if self.grpc_tls_client_ca.is_some() || self.grpc_tls_client_san.is_some() {
                    return Err(FlagError::Needs {
                        flag: "--grpc-tls-client-ca and --grpc-tls-client-san".to_owned(),
                        needs: "--grpc-tls-cert and --grpc-tls-key".to_owned(),
                    });
                }
                return Ok(None);
            }
            _ => return Err(FlagError::Together("--grpc-tls-cert", "--grpc-tls-key")),
        };
        if self.grpc_tls_client_san.is_some() && self.grpc_tls_client_ca.is_none() {
            return Err(FlagError::Needs {
                flag: "--grpc-tls-client-san".to_owned(),
                needs: "--grpc-tls-client-ca".to_owned(),
            });
        }
        Ok(Some(TlsFiles {
            cert,
            key,
            client_ca: self.grpc_tls_client_ca.clone(),
            client_san: self.grpc_tls_client_san.clone(),
        }))
    }

    /// The connection limits these flags give.
    pub fn limits(&self) -> GrpcLimits {
        let nonzero = |duration: GoDuration| Some(duration.0).filter(|d| !d.is_zero());
        GrpcLimits {
            max_message_bytes: self.grpc_max_message_bytes,
            max_concurrent_streams: self.grpc_max_concurrent_streams,
            keepalive_interval: nonzero(self.grpc_keepalive_interval),
            keepalive_timeout: self.grpc_keepalive_timeout.0,
            max_connection_age: nonzero(self.grpc_max_connection_age),
            max_connection_age_grace: self.grpc_max_connection_age_grace.0,
            max_connections: self.grpc_max_connections,
            first_call_timeout: nonzero(self.grpc_first_call_timeout),
        }
    }
}
