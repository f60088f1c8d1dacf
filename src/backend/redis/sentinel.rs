//! Redis Sentinel: which node is the master right now.
//!
//! The single-node backend (`super::single`) runs unchanged against whatever node this module
//! names: every new pooled connection asks the sentinels for the master first (redis-rs'
//! `SentinelClient`, which also checks the node's `ROLE`), so a failover is followed by
//! replacing connections, never by a restart. A connection is replaced when it fails at the
//! transport level, when it answers `-READONLY` (its node was demoted), or when a sentinel
//! announces `+switch-master` for our master: a task per sentinel listens for that message
//! and bumps an epoch, and connections made under an older epoch count as broken.
//!
//! While no sentinel names a reachable master, connects fail like those to a dead single
//! node: calls get `Unavailable`, the failure mode answers and readiness reports
//! NOT_SERVING until a master is known again.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{ConnectionAddr, IntoConnectionInfo, RedisError, TlsMode};
use tokio::task::JoinHandle;

use super::{RedisOptions, config_error};
use crate::backend::BackendError;
use crate::redact::{REDACTED, Secrets};

/// The pub/sub channel on which sentinels announce a new master:
/// `<name> <old ip> <old port> <new ip> <new port>`.
const SWITCH_MASTER: &str = "+switch-master";
/// Pause before a lost subscription is tried again; each failure doubles it.
const FIRST_RESUBSCRIBE: Duration = Duration::from_millis(100);
/// Longest pause between subscription attempts.
const MAX_RESUBSCRIBE: Duration = Duration::from_secs(5);

/// How to find the master through Redis Sentinel.
#[derive(Clone, PartialEq, Eq)]
pub struct SentinelSettings {
    /// The master's name as the sentinels monitor it (`sentinel monitor <name> ...`).
    pub master: String,
    /// The sentinels: `redis://[[user]:password@]host:port`, or `rediss://` for TLS to the
    /// sentinels and to the data nodes alike. All share one scheme and one set of
    /// credentials, the sentinels' own (`requirepass` in sentinel.conf).
    pub sentinels: Vec<String>,
    /// Credentials of the data nodes (master and replicas), when they require them.
    pub node_auth: Option<NodeAuth>,
}

/// `AUTH [user] password` for the data nodes. `Debug` shows neither.
#[derive(Clone, PartialEq, Eq)]
pub struct NodeAuth {
    /// ACL user; None logs in as `default`.
    pub user: Option<String>,
    /// The password.
    pub password: String,
}

impl NodeAuth {
    /// `[user:]password`, as the reference's `REDIS_AUTH` and `--redis-master-auth` write it.
    pub fn parse(text: &str) -> NodeAuth {
        match text.split_once(':') {
            Some((user, password)) => NodeAuth {
                user: Some(user.to_owned()),
                password: password.to_owned(),
            },
            None => NodeAuth {
                user: None,
                password: text.to_owned(),
            },
        }
    }
}

impl fmt::Debug for NodeAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeAuth({REDACTED})")
    }
}

impl fmt::Debug for SentinelSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sentinels: Vec<String> = self
            .sentinels
            .iter()
            .map(|url| crate::redact::url(url))
            .collect();
        f.debug_struct("SentinelSettings")
            .field("master", &self.master)
            .field("sentinels", &sentinels)
            .field("node_auth", &self.node_auth)
            .finish()
    }
}

impl SentinelSettings {
    /// Every secret of these settings, for scrubbing error texts.
    pub(super) fn secrets(&self) -> Secrets {
        let urls: Vec<&str> = self.sentinels.iter().map(String::as_str).collect();
        let secrets = Secrets::of(&urls);
        match &self.node_auth {
            Some(auth) => secrets.and(&auth.password),
            None => secrets,
        }
    }
}

/// The master's current address, asked of the sentinels at every connect.
pub(super) struct Master {
    client: tokio::sync::Mutex<SentinelClient>,
    /// Bumped by every `+switch-master` for our master: connections made under an older
    /// value point at a node that may no longer be master.
    epoch: Arc<AtomicU64>,
    /// One `+switch-master` listener per sentinel; stopped with the backend.
    watchers: Vec<JoinHandle<()>>,
}

impl Drop for Master {
    fn drop(&mut self) {
        for watcher in &self.watchers {
            watcher.abort();
        }
    }
}

impl Master {
    /// Checks `settings` and starts listening for `+switch-master`; asks nothing yet.
    /// Must be called within a Tokio runtime.
    ///
    /// # Errors
    /// `Config` for no sentinel, an empty master name, a URL that is not a `redis://` or
    /// `rediss://` sentinel, or sentinels that differ in scheme or credentials.
    pub(super) fn new(
        settings: &SentinelSettings,
        options: &RedisOptions,
    ) -> Result<Master, BackendError> {
        let secrets = settings.secrets();
        if settings.master.trim().is_empty() {
            return Err(config_error("the Sentinel master name is empty"));
        }
        let Some(first) = settings.sentinels.first() else {
            return Err(config_error("no Sentinel address"));
        };
        let tls = first.starts_with("rediss://");
        let mut addrs = Vec::new();
        let mut credentials = None;
        for url in &settings.sentinels {
            let info = url.as_str().into_connection_info().map_err(|e| {
                secrets.scrub(BackendError::Config(format!("invalid Sentinel URL: {e}")))
            })?;
            let url_tls = match info.addr() {
                ConnectionAddr::Tcp(..) => false,
                ConnectionAddr::TcpTls { .. } => true,
                _ => return Err(config_error("a Sentinel is reached over TCP, not a socket")),
            };
            if url_tls != tls {
                return Err(config_error(
                    "the Sentinel URLs mix `redis://` and `rediss://`; TLS is on for all or none",
                ));
            }
            let settings = info.redis_settings();
            let these = (
                settings.username().map(str::to_owned),
                settings.password().map(str::to_owned),
            );
            match &credentials {
                None => credentials = Some(these),
                Some(seen) if *seen == these => {}
                Some(_) => {
                    return Err(config_error(
                        "the Sentinel URLs carry different credentials; give every sentinel the same",
                    ));
                }
            }
            addrs.push(info.addr().clone());
        }
        let (user, password) = credentials.unwrap_or_default();
        let mut builder =
            SentinelClientBuilder::new(addrs, &settings.master, SentinelServerType::Master)
                .map_err(|e| config_error(&format!("invalid Sentinel settings: {e}")))?;
        if let Some(user) = user {
            builder = builder.set_client_to_sentinel_username(user);
        }
        if let Some(password) = password {
            builder = builder.set_client_to_sentinel_password(password);
        }
        if let Some(auth) = &settings.node_auth {
            if let Some(user) = &auth.user {
                builder = builder.set_client_to_redis_username(user);
            }
            builder = builder.set_client_to_redis_password(&auth.password);
        }
        let certs = options.tls_for(first);
        if tls {
            builder = builder.set_client_to_redis_tls_mode(TlsMode::Secure);
            if let Some(certs) = &certs {
                builder = builder
                    .set_client_to_sentinel_certificates(certs.clone())
                    .set_client_to_redis_certificates(certs.clone());
            }
        }
        let client = builder.build().map_err(|e| {
            secrets.scrub(BackendError::Config(format!(
                "invalid Sentinel settings: {e}"
            )))
        })?;
        let epoch = Arc::new(AtomicU64::new(0));
        let mut watchers = Vec::new();
        for url in &settings.sentinels {
            let pubsub = match &certs {
                Some(certs) => redis::Client::build_with_tls(url.as_str(), certs.clone()),
                None => redis::Client::open(url.as_str()),
            }
            .map_err(|e| {
                secrets.scrub(BackendError::Config(format!("invalid Sentinel URL: {e}")))
            })?;
            watchers.push(tokio::spawn(watch(
                pubsub,
                settings.master.clone(),
                Arc::clone(&epoch),
                secrets.clone(),
            )));
        }
        Ok(Master {
            client: tokio::sync::Mutex::new(client),
            epoch,
            watchers,
        })
    }

    /// The epoch a connection made now belongs to: read before asking the sentinels, so a
    /// switch announced meanwhile retires the new connection rather than being missed.
    pub(super) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// A client for the node the sentinels name master (and that confirms it by `ROLE`).
    /// One lookup at a time: the sentinel connections are shared.
    ///
    /// # Errors
    /// No sentinel answers, none knows the master, or the master named is unreachable or
    /// not a master (yet): the same errors as a connect to a dead node.
    pub(super) async fn client(&self) -> Result<redis::Client, RedisError> {
        self.client.lock().await.async_get_client().await
    }
}

/// Listens on one sentinel for `+switch-master` of `master` and bumps `epoch` for each,
/// resubscribing after a lost connection. A switch announced while unsubscribed may have
/// been missed, so a subscription made after a lost one bumps the epoch too.
async fn watch(client: redis::Client, master: String, epoch: Arc<AtomicU64>, secrets: Secrets) {
    let mut pause = FIRST_RESUBSCRIBE;
    let mut lost = false;
    loop {
        match subscribe(&client).await {
            Ok(mut pubsub) => {
                pause = FIRST_RESUBSCRIBE;
                if lost {
                    epoch.fetch_add(1, Ordering::AcqRel);
                }
                let mut messages = pubsub.on_message();
                while let Some(message) = messages.next().await {
                    let payload: String = message.get_payload().unwrap_or_default();
                    let mut words = payload.split_whitespace();
                    if words.next() == Some(master.as_str()) {
                        let new_master = words.skip(2).collect::<Vec<_>>().join(":");
                        tracing::info!(
                            master = %master,
                            new_master = %new_master,
                            "Sentinel switched the master; reconnecting"
                        );
                        epoch.fetch_add(1, Ordering::AcqRel);
                    }
                }
                lost = true;
                tracing::debug!(master = %master, "Sentinel subscription lost");
            }
            Err(error) => {
                let error = secrets.scrub(super::errors::classify(&error));
                tracing::debug!(master = %master, %error, "Sentinel subscription failed");
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_RESUBSCRIBE);
    }
}

async fn subscribe(client: &redis::Client) -> Result<redis::aio::PubSub, RedisError> {
    let mut pubsub = client.get_async_pubsub().await?;
    pubsub.subscribe(SWITCH_MASTER).await?;
    Ok(pubsub)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(sentinels: &[&str]) -> SentinelSettings {
        SentinelSettings {
            master: "mymaster".into(),
            sentinels: sentinels.iter().map(|s| s.to_string()).collect(),
            node_auth: Some(NodeAuth::parse("app:n0de-secret")),
        }
    }

    #[tokio::test]
    async fn settings_that_cannot_work_are_config_errors() {
        let options = RedisOptions::default();
        let bad = [
            settings(&[]),
            settings(&["redis://a:1", "rediss://b:1"]),
            settings(&["redis://:x@a:1", "redis://:y@b:1"]),
            settings(&["unix:///tmp/s.sock"]),
            SentinelSettings {
                master: " ".into(),
                ..settings(&["redis://a:1"])
            },
        ];
        for settings in bad {
            let error = Master::new(&settings, &options).err().expect("refused");
            assert!(matches!(error, BackendError::Config(_)), "{error:?}");
            assert!(!error.to_string().contains(":y@"), "{error}");
        }
        assert!(Master::new(&settings(&["redis://:x@a:1", "redis://:x@b:2"]), &options).is_ok());
    }

    #[test]
    fn debug_hides_every_password() {
        let shown = format!("{:?}", settings(&["redis://:s3ntinel@a:1"]));
        assert!(
            !shown.contains("s3ntinel") && !shown.contains("n0de-secret"),
            "{shown}"
        );
        assert_eq!(NodeAuth::parse("pw").user, None);
    }
}
