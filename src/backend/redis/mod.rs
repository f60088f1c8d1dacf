//! The two Redis backends and what they share: settings and the Lua scripts.
//!
//! `single` talks to one node through a small pool of multiplexed connections and batches
//! the requests bound for it into one script call; `cluster` batches per master in the same
//! way, one script call per master for the requests bound for it (`batch`), and splits a
//! request whose buckets live on several masters into one part per master.

use std::fmt;
use std::time::Duration;

use super::BackendError;
use crate::redact::REDACTED;

mod batch;
pub mod calls;
pub mod cluster;
mod errors;
mod fair;
pub mod scripts;
pub mod sentinel;
pub mod single;

pub use cluster::ClusterBackend;
pub use scripts::Scripting;
pub use sentinel::{NodeAuth, SentinelSettings};
pub use single::RedisBackend;

/// Default number of connections (sockets) to one Redis node. Calls share sockets, and fewer
/// sockets batch more commands per write: on 2 cores 2 sockets gave ~92% of
/// `redis-benchmark -P 16` at 16 in flight, 16 sockets ~69% (`examples/redis_load.rs`).
pub const DEFAULT_POOL_SIZE: u32 = 2;

/// Settings shared by the Redis and Redis Cluster backends.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisOptions {
    /// Connections to the node (single node only; the cluster client keeps one multiplexed
    /// connection per node). Calls share connections, so a few sockets carry any load; fewer
    /// sockets batch more commands per write.
    pub pool_size: u32,
    /// Bound on every call, connecting included.
    pub timeout: Duration,
    /// Prepended to every bucket key: `<prefix>:{<hash>}`.
    pub key_prefix: String,
    /// PEM certificates to trust for `rediss://` instead of the web PKI roots, for servers
    /// with a private CA. Ignored for plain `redis://`.
    pub tls_ca_pem: Option<Vec<u8>>,
    /// Client certificate and key for `rediss://` servers that require one
    /// (`tls-auth-clients yes`). Ignored for plain `redis://`.
    pub tls_client: Option<ClientIdentity>,
    /// Function library (`FCALL`) or scripts (`EVALSHA`); `Auto` takes the library where
    /// the server has functions (Redis >= 7).
    pub scripting: Scripting,
}

/// A PEM client certificate and its private key. `Debug` shows neither.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    /// PEM certificate chain, leaf first.
    pub cert: Vec<u8>,
    /// PEM private key.
    pub key: Vec<u8>,
}

impl fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClientIdentity({REDACTED})")
    }
}

impl fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisOptions")
            .field("pool_size", &self.pool_size)
            .field("timeout", &self.timeout)
            .field("key_prefix", &self.key_prefix)
            .field("tls_ca_pem", &self.tls_ca_pem.as_ref().map(|pem| pem.len()))
            .field("tls_client", &self.tls_client)
            .field("scripting", &self.scripting)
            .finish()
    }
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            pool_size: DEFAULT_POOL_SIZE,
            timeout: crate::backend::DEFAULT_BACKEND_TIMEOUT,
            key_prefix: crate::backend::keys::DEFAULT_KEY_PREFIX.to_owned(),
            tls_ca_pem: None,
            tls_client: None,
            scripting: Scripting::Auto,
        }
    }
}

impl RedisOptions {
    /// Rejects settings that cannot work.
    ///
    /// A brace in the prefix would become the Redis Cluster hash tag of every key, putting
    /// all buckets in one slot.
    pub(crate) fn validate(&self) -> Result<(), BackendError> {
        if self.pool_size == 0 {
            return Err(config_error("pool size must be at least 1"));
        }
        if self.timeout.is_zero() {
            return Err(config_error("timeout must be positive"));
        }
        if self.key_prefix.contains(['{', '}']) {
            return Err(config_error("key prefix must not contain '{' or '}'"));
        }
        Ok(())
    }

    /// The trust roots and client certificate for `url`, when either is configured and the
    /// URL uses TLS; None keeps redis' defaults (the web PKI roots, no client certificate).
    pub(crate) fn tls_for(&self, url: &str) -> Option<redis::TlsCertificates> {
        if !url.starts_with("rediss://") || (self.tls_ca_pem.is_none() && self.tls_client.is_none())
        {
            return None;
        }
        Some(redis::TlsCertificates {
            client_tls: self
                .tls_client
                .as_ref()
                .map(|identity| redis::ClientTlsConfig {
                    client_cert: identity.cert.clone(),
                    client_key: identity.key.clone(),
                }),
            root_cert: self.tls_ca_pem.clone(),
        })
    }
}

/// Loads the function library or, failing that, the scripts with `load`, and settles
/// `Scripting::Auto`: the library when the server takes it, else scripts. Loading scripts is
/// best effort (a failure only costs the `EVAL` fallback of the first calls); the library is
/// required only when `Scripting::Functions` is asked for.
pub(crate) async fn settle_scripting<'a>(
    wanted: Scripting,
    load: impl Fn(Scripting) -> futures::future::BoxFuture<'a, Result<(), BackendError>>,
) -> Result<Scripting, BackendError> {
    if wanted != Scripting::Evalsha {
        match load(Scripting::Functions).await {
            Ok(()) => return Ok(Scripting::Functions),
            Err(error) if wanted == Scripting::Functions => {
                return Err(BackendError::failed(format!(
                    "cannot load the function library (Redis >= 7 needed for \
                     --redis-scripting functions): {error}"
                )));
            }
            Err(error) => {
                tracing::info!(%error, "no Redis functions here; running scripts by EVALSHA");
            }
        }
    }
    if let Err(error) = load(Scripting::Evalsha).await {
        tracing::warn!(%error, "could not preload the Lua scripts; they load on first use");
    }
    Ok(Scripting::Evalsha)
}

/// A server's error reply as a backend error.
pub(crate) fn server_error(error: redis::ServerError) -> BackendError {
    errors::server_error(&redis::RedisError::from(error))
}

pub(crate) fn config_error(what: &str) -> BackendError {
    BackendError::Config(what.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redact::Secrets;

    #[test]
    fn options_reject_braces_and_zeroes() {
        assert!(RedisOptions::default().validate().is_ok());
        let bad = [
            RedisOptions {
                key_prefix: "a{b}".into(),
                ..Default::default()
            },
            RedisOptions {
                pool_size: 0,
                ..Default::default()
            },
            RedisOptions {
                timeout: Duration::ZERO,
                ..Default::default()
            },
        ];
        for options in bad {
            assert!(options.validate().is_err(), "{options:?}");
        }
    }

    #[test]
    fn secrets_are_masked_in_errors() {
        let url = "redis://user:s%40cret@127.0.0.1:1/0";
        let secrets = Secrets::of(&[url]);
        let masked = secrets.scrub(BackendError::Unavailable(format!("{url} and s@cret")));
        let text = masked.to_string();
        assert!(
            !text.contains("s@cret") && !text.contains("s%40cret"),
            "{text}"
        );
        assert!(text.contains("***"));
    }
}
