//! A Redis URL as the flags hold it: its password never reaches `Debug` or `Display`, and a
//! scheme no client here speaks is refused with the URL redacted.

use std::fmt;
use std::str::FromStr;

use super::FlagError;

/// A Redis URL whose password never reaches `Debug` or `Display`.
///
/// The effective settings are logged at startup; the URL is only exposed, unredacted,
/// through [`RedisUrl::as_str`] for the client that connects.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl(String);

impl RedisUrl {
    /// The URL as given, secrets included: only for connecting.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether the URL asks for TLS (`rediss://`).
    pub fn is_tls(&self) -> bool {
        self.0.starts_with("rediss://")
    }

    /// The URL with the password (or a lone userinfo) and password query values masked.
    pub fn redacted(&self) -> String {
        crate::redact::url(&self.0)
    }
}

impl RedisUrl {
    /// Checks the scheme.
    ///
    /// # Errors
    /// A message showing the URL redacted.
    pub fn check(&self) -> Result<(), FlagError> {
        const SCHEMES: [&str; 4] = ["redis://", "rediss://", "redis+unix://", "unix://"];
        if SCHEMES.iter().any(|scheme| self.0.starts_with(scheme)) {
            return Ok(());
        }
        Err(FlagError::NotRedisUrl {
            url: self.redacted(),
            schemes: SCHEMES.join(", "),
        })
    }
}

impl From<String> for RedisUrl {
    fn from(url: String) -> RedisUrl {
        RedisUrl(url.trim().to_owned())
    }
}

/// Parsing never fails: clap would print the raw value (password included) in its error.
/// The scheme is checked after parsing, by [`ServeArgs::check`], with a redacted message.
impl FromStr for RedisUrl {
    type Err = std::convert::Infallible;

    fn from_str(url: &str) -> Result<RedisUrl, Self::Err> {
        Ok(RedisUrl(url.trim().to_owned()))
    }
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RedisUrl({:?})", self.redacted())
    }
}

impl fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}
