//! Why the serve flags cannot describe a service that starts: what clap cannot check on its
//! own (flags that go together, files, URL schemes), each with the flags it is about.

use std::path::PathBuf;

use crate::otel::TracingSettingsError;
use crate::tls::TlsError;
use crate::xds::XdsSettingsError;

/// A serve setting that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum FlagError {
    /// Two flags given one without the other.
    #[error("{0} and {1} go together")]
    Together(&'static str, &'static str),
    /// A flag given without one it needs.
    #[error("{flag} needs {needs}")]
    Needs {
        /// The flag (or flags) given.
        flag: String,
        /// What it needs.
        needs: String,
    },
    /// Credentials for Sentinel's data nodes without Sentinel.
    #[error("{auth} needs {master}; for one node, credentials go in {url}")]
    AuthWithoutSentinel {
        /// The credentials flag.
        auth: &'static str,
        /// The Sentinel master flag.
        master: &'static str,
        /// The URL flag.
        url: &'static str,
    },
    /// Sentinels listed with a scheme other than `redis://` or `rediss://`.
    #[error("with {master}, {url} lists sentinels: `redis://` or `rediss://` URLs")]
    SentinelScheme {
        /// The Sentinel master flag.
        master: &'static str,
        /// The URL flag.
        url: &'static str,
    },
    /// A URL of a scheme no Redis client here speaks (shown redacted).
    #[error("`{url}` is not a Redis URL: expected one of {schemes}")]
    NotRedisUrl {
        /// The URL, redacted.
        url: String,
        /// The schemes accepted.
        schemes: String,
    },
    /// An address that is not `host:port`.
    #[error("{flag} `{value}` is not HOST:PORT (e.g. localhost:8125, [::1]:8125)")]
    NotHostPort {
        /// The flag.
        flag: &'static str,
        /// Its value.
        value: String,
    },
    /// A value clap parsed that the setting cannot take.
    #[error("{flag} must be {expected}")]
    OutOfRange {
        /// The flag.
        flag: &'static str,
        /// What it must be.
        expected: &'static str,
    },
    /// A file a flag names cannot be read.
    #[error("cannot read {flag} {}: {source}", path.display())]
    Unreadable {
        /// The flag.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A certificate or key file that is not what it must be.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// TLS settings a plaintext scheme would ignore, one per line.
    #[error("{}", .0.join("\n"))]
    Plaintext(Vec<String>),
    /// The xDS settings.
    #[error(transparent)]
    Xds(#[from] XdsSettingsError),
    /// The tracing settings.
    #[error(transparent)]
    Tracing(#[from] TracingSettingsError),
}
