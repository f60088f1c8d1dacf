//! Which backend to run and how to reach it: the settings, and the connection that turns
//! an unreachable backend at startup into one that keeps trying (`deferred`), so the service
//! starts NOT_SERVING instead of failing.

use std::sync::Arc;

use super::redis::{ClusterBackend, RedisBackend, RedisOptions, SentinelSettings};
use super::{Backend, BackendError, deferred, memory, per_second};
use crate::redact;

/// Which backend to run, and how to reach it.
#[derive(Clone)]
pub enum BackendSettings {
    /// In-process buckets; one replica only.
    Memory {
        /// Cap on live buckets.
        max_buckets: usize,
    },
    /// One Redis node through a connection pool.
    Redis {
        /// `redis://` or `rediss://` URL, possibly with credentials and a database.
        url: String,
        /// Pool, timeout, key prefix, TLS.
        options: RedisOptions,
    },
    /// A Redis Cluster reached through seed nodes.
    Cluster {
        /// Seed node URLs.
        urls: Vec<String>,
        /// Timeout, key prefix, TLS (the pool size does not apply).
        options: RedisOptions,
    },
    /// The master of a Redis Sentinel group, run as the one-node backend.
    Sentinel {
        /// The master's name, the sentinels and the data nodes' credentials.
        sentinel: SentinelSettings,
        /// Pool, timeout, key prefix, TLS files.
        options: RedisOptions,
    },
    /// Rules whose unit is `second` in one backend, every other rule in another
    /// (the reference's `REDIS_PERSECOND`).
    PerSecond {
        /// Every rule whose unit is not `second`.
        main: Box<BackendSettings>,
        /// Rules whose unit is `second`.
        per_second: Box<BackendSettings>,
    },
}

impl std::fmt::Debug for BackendSettings {
    /// Shows URLs only with their passwords masked.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendSettings::Memory { max_buckets } => f
                .debug_struct("Memory")
                .field("max_buckets", max_buckets)
                .finish(),
            BackendSettings::Redis { url, options } => f
                .debug_struct("Redis")
                .field("url", &redact::url(url))
                .field("options", options)
                .finish(),
            BackendSettings::Cluster { urls, options } => f
                .debug_struct("Cluster")
                .field(
                    "urls",
                    &urls.iter().map(|url| redact::url(url)).collect::<Vec<_>>(),
                )
                .field("options", options)
                .finish(),
            BackendSettings::Sentinel { sentinel, options } => f
                .debug_struct("Sentinel")
                .field("sentinel", sentinel)
                .field("options", options)
                .finish(),
            BackendSettings::PerSecond { main, per_second } => f
                .debug_struct("PerSecond")
                .field("main", main)
                .field("per_second", per_second)
                .finish(),
        }
    }
}

/// Builds the configured backend. Settings that cannot work (`BackendError::Config`: an
/// invalid URL or option) stop startup; any other failure (unreachable, refused login,
/// CLUSTERDOWN) starts the service NOT_SERVING with a backend that keeps connecting in the
/// background and logs why each attempt failed (see `deferred`).
///
/// A split per-second setup connects each of its two backends this way, on its own: one
/// unreachable Redis leaves the other serving its rules.
///
/// # Errors
/// `BackendError::Config` from `RedisBackend::connect` or `ClusterBackend::connect`.
pub async fn connect(settings: &BackendSettings) -> Result<Arc<dyn Backend>, BackendError> {
    let (name, attempt) = connector(settings);
    match attempt().await {
        Ok(backend) => Ok(backend),
        Err(error @ BackendError::Config(_)) => Err(error),
        Err(error) => {
            tracing::warn!(backend = name, %error, "backend unreachable at startup; serving NOT_SERVING and retrying in the background");
            Ok(Arc::new(deferred::Deferred::spawn(name, attempt)))
        }
    }
}

/// The backend's name and a repeatable connection attempt for `settings`.
fn connector(settings: &BackendSettings) -> (&'static str, deferred::Connect) {
    match settings.clone() {
        BackendSettings::Memory { max_buckets } => (
            "memory",
            Box::new(move || {
                Box::pin(async move {
                    Ok(Arc::new(memory::MemoryBackend::new(max_buckets)) as Arc<dyn Backend>)
                })
            }),
        ),
        BackendSettings::Redis { url, options } => (
            "redis",
            Box::new(move || {
                let (url, options) = (url.clone(), options.clone());
                Box::pin(async move {
                    let backend = RedisBackend::connect(&url, options).await?;
                    Ok(Arc::new(backend) as Arc<dyn Backend>)
                })
            }),
        ),
        BackendSettings::Cluster { urls, options } => (
            "redis-cluster",
            Box::new(move || {
                let (urls, options) = (urls.clone(), options.clone());
                Box::pin(async move {
                    let backend = ClusterBackend::connect(&urls, options).await?;
                    Ok(Arc::new(backend) as Arc<dyn Backend>)
                })
            }),
        ),
        BackendSettings::Sentinel { sentinel, options } => (
            "redis-sentinel",
            Box::new(move || {
                let (sentinel, options) = (sentinel.clone(), options.clone());
                Box::pin(async move {
                    let backend = RedisBackend::connect_sentinel(&sentinel, options).await?;
                    Ok(Arc::new(backend) as Arc<dyn Backend>)
                })
            }),
        ),
        BackendSettings::PerSecond { main, per_second } => (
            "per-second-split",
            Box::new(move || {
                let (main, per_second) = (main.clone(), per_second.clone());
                Box::pin(async move {
                    // Each side deferred on its own when unreachable; only `Config` fails.
                    let main = Box::pin(connect(&main)).await?;
                    let per_second = Box::pin(connect(&per_second)).await?;
                    Ok(Arc::new(per_second::PerSecondSplit::new(main, per_second))
                        as Arc<dyn Backend>)
                })
            }),
        ),
    }
}
