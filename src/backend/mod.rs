//! Storage backends: where bucket state lives and how one decision is made atomically.
//!
//! Every backend applies the same pure algorithms (`crate::algorithm`): the memory backend
//! calls them directly, the Redis backends run Lua scripts that follow them line for line.
//! A backend never sees protocol types; the limiter hands it resolved charges.

pub mod cluster;
pub mod deferred;
pub mod keys;
pub mod memory;
pub mod redis;
pub mod scripts;

use std::sync::Arc;

use async_trait::async_trait;

pub use cluster::ClusterBackend;
pub use keys::BucketKey;
pub use redis::{RedisBackend, RedisOptions};

use crate::rules::Policy;

/// One bucket to charge: `cost` units under `policy`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    /// The bucket.
    pub bucket: BucketKey,
    /// How the bucket counts.
    pub policy: Policy,
    /// `n`: the cost; 0 is a peek that changes nothing.
    pub cost: u64,
}

/// What one charge decided, in the backend's own clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Whether the request fits (for a peek: whether a cost-1 request would fit).
    pub allowed: bool,
    /// Requests left after this charge (0 when denied).
    pub remaining: u64,
    /// `R`: milliseconds until the reset the algorithm defines.
    pub reset_ms: u64,
    /// The backend's clock when it decided; a refund names it to undo exactly this booking.
    pub now_ms: i64,
    /// Whether this charge changed the bucket (a refund only makes sense when it did).
    pub booked: bool,
}

/// Undo of one earlier booking of `cost` made at `booked_at_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refund {
    /// The bucket.
    pub bucket: BucketKey,
    /// How the bucket counts.
    pub policy: Policy,
    /// The cost that was booked.
    pub cost: u64,
    /// `Outcome::now_ms` of the booking.
    pub booked_at_ms: i64,
    /// Names this refund, so that a bucket applies it at most once: a refund delivered
    /// again (a client re-sending it after its reply was lost) changes nothing. Each bucket
    /// remembers the ids of its last few refunds (`RECENT_REFUNDS` in `lua/prelude.lua`,
    /// the memory backend alike).
    pub id: u64,
}

impl Refund {
    /// The refund of one booking, with a fresh id.
    pub fn new(bucket: BucketKey, policy: Policy, cost: u64, booked_at_ms: i64) -> Refund {
        Refund {
            bucket,
            policy,
            cost,
            booked_at_ms,
            id: fresh_refund_id(),
        }
    }
}

/// An id unique in this process and, with a random start per process, unlikely to meet
/// another replica's in the same bucket's short memory (a collision only makes a refund
/// be skipped: the safe side).
fn fresh_refund_id() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    use std::sync::LazyLock;
    use std::sync::atomic::{AtomicU64, Ordering};

    static START: LazyLock<u64> = LazyLock::new(|| RandomState::new().hash_one(0u64));
    static NEXT: AtomicU64 = AtomicU64::new(0);
    // splitmix64 of a counter: distinct inputs give distinct outputs (it is a bijection).
    let mut z = START.wrapping_add(
        NEXT.fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15),
    );
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Why a backend could not decide.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The backend did not answer within its time budget.
    #[error("backend timed out")]
    Timeout,
    /// No connection could be made or kept (refused, reset, pool exhausted).
    #[error("backend unreachable: {0}")]
    Unavailable(String),
    /// The backend answered with an error (e.g. CLUSTERDOWN, a script error).
    #[error("backend error: {0}")]
    Failed(String),
    /// The settings cannot work (an invalid URL or option): retrying will not help.
    #[error("invalid backend configuration: {0}")]
    Config(String),
    /// The memory backend's bucket cap was reached and no bucket could be evicted.
    #[error("bucket capacity exhausted")]
    CapacityExhausted,
}

impl BackendError {
    /// Short, stable label for the `backend_errors` metric.
    pub fn kind(&self) -> &'static str {
        match self {
            BackendError::Timeout => "timeout",
            BackendError::Unavailable(_) => "unavailable",
            BackendError::Failed(_) => "failed",
            BackendError::Config(_) => "config",
            BackendError::CapacityExhausted => "capacity",
        }
    }
}

/// A place that keeps buckets and decides charges atomically per bucket.
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// Applies every charge (each atomically) and returns one outcome per charge, in order.
    ///
    /// # Errors
    /// Any failure fails the whole batch: the limiter then applies the failure mode.
    async fn charge(&self, charges: &[Charge]) -> Result<Vec<Outcome>, BackendError>;

    /// Undoes earlier bookings; used when a request is over limit overall.
    ///
    /// # Errors
    /// As for `charge`; a failed refund leaves the booking in place.
    async fn refund(&self, refunds: &[Refund]) -> Result<(), BackendError>;

    /// Checks that the backend answers (readiness and health).
    ///
    /// # Errors
    /// The backend is unreachable or failing.
    async fn ping(&self) -> Result<(), BackendError>;

    /// Short name for logs and metrics (`memory`, `redis`, `redis-cluster`).
    fn name(&self) -> &'static str;
}

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
}

impl std::fmt::Debug for BackendSettings {
    /// Never prints URLs: they may carry passwords.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendSettings::Memory { max_buckets } => f
                .debug_struct("Memory")
                .field("max_buckets", max_buckets)
                .finish(),
            BackendSettings::Redis { options, .. } => f
                .debug_struct("Redis")
                .field("url", &"<redacted>")
                .field("options", options)
                .finish(),
            BackendSettings::Cluster { urls, options } => f
                .debug_struct("Cluster")
                .field("urls", &format!("<{} redacted>", urls.len()))
                .field("options", options)
                .finish(),
        }
    }
}

/// Builds the configured backend. Settings that cannot work (`BackendError::Config`: an
/// invalid URL or option) stop startup; any other failure (unreachable, refused login,
/// CLUSTERDOWN) starts the service NOT_SERVING with a backend that keeps connecting in the
/// background and logs why each attempt failed (see `deferred`).
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
    }
}
