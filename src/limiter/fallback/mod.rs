//! Failure mode `local`: a replica that cannot reach its Redis neither admits everything nor
//! denies everything. It decides from its own memory with its share of each limit, `1 /
//! known` of the replicas it last saw in the registry (`super::replicas`), until Redis
//! answers again; the replicas still on Redis keep `live / known` of each limit between
//! them while a replica is silent, so that together they admit at most the limit
//! (docs/reliability.md#failure-mode-local).

pub mod share;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

pub use share::Share;

use super::replicas::{Registry, View};
use crate::backend::memory::MemoryBackend;
use crate::backend::{Backend, BackendError, Group, Item, Outcome};

/// Buckets the local memory holds at most while cut off (least recently used go first).
const LOCAL_BUCKETS: usize = 65_536;
/// After a failed call, how long requests go to memory without trying Redis: every call
/// would otherwise wait for the backend's timeout first. The first call after it tries
/// Redis again.
pub const RETRY_AFTER: Duration = Duration::from_millis(500);

/// The registry and the memory a cut-off replica decides from.
pub struct LocalFallback {
    registry: Arc<Registry>,
    store: MemoryBackend,
    /// When this replica was created, the origin of `cut_until_ms`.
    started: Instant,
    /// Until when (ms after `started`) requests skip Redis; 0: they try it.
    cut_until_ms: AtomicU64,
}

impl LocalFallback {
    /// A fallback on `registry`'s view of the replicas.
    pub fn new(registry: Arc<Registry>) -> LocalFallback {
        LocalFallback {
            registry,
            store: MemoryBackend::new(LOCAL_BUCKETS),
            started: Instant::now(),
            cut_until_ms: AtomicU64::new(0),
        }
    }

    /// Whether requests should skip Redis for now: a call failed within [`RETRY_AFTER`].
    pub fn is_cut_off(&self) -> bool {
        self.elapsed_ms() < self.cut_until_ms.load(Ordering::Relaxed)
    }

    /// Notes a failed call (requests skip Redis for [`RETRY_AFTER`]) or an answered one.
    pub fn note(&self, reached: bool) {
        let until = if reached {
            0
        } else {
            self.elapsed_ms() + RETRY_AFTER.as_millis() as u64
        };
        self.cut_until_ms.store(until, Ordering::Relaxed);
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// What the charges decided on Redis are held to while replicas are silent: `live /
    /// known` of each limit; `None` while every known replica is live.
    pub fn reserved(&self) -> Option<Share> {
        self.registry
            .view()
            .and_then(|view| on_redis(&view))
            .filter(|share| !share.is_whole())
    }

    /// Decides `group` from memory with `1 / known` of each limit: an outcome per item,
    /// `None` for one whose share rounds to nothing (denied as a rule with `L = 0` is).
    /// `None` when no heartbeat was ever answered: a replica that never saw its peers does
    /// not know its share.
    ///
    /// # Errors
    /// As for the memory backend (none in practice).
    pub async fn decide(
        &self,
        group: &Group,
    ) -> Option<Result<Vec<Option<Outcome>>, BackendError>> {
        let view = self.registry.view()?;
        let share = alone(&view)?;
        Some(decide_share(&self.store, group, share).await)
    }
}

/// What the live replicas may admit together from Redis: `live / known` of each limit.
fn on_redis(view: &View) -> Option<Share> {
    Share::new(view.live.max(1), view.known.max(1))
}

/// What a replica may admit alone from its memory: `1 / known` of each limit.
fn alone(view: &View) -> Option<Share> {
    Share::new(1, view.known.max(1))
}

/// `group` with `share` of each limit; every item's share must be something.
pub fn scaled(group: &Group, share: Share) -> Group {
    Group {
        items: group
            .items
            .iter()
            .map(|item| share.apply(item).unwrap_or_else(|| item.clone()))
            .collect(),
        ..group.clone()
    }
}

/// Decides `group` on `store` with `share` of each limit, all-or-nothing: `None` for an item
/// whose share rounds to nothing, which counts as denied.
pub async fn decide_share(
    store: &MemoryBackend,
    group: &Group,
    share: Share,
) -> Result<Vec<Option<Outcome>>, BackendError> {
    let scaled: Vec<Option<Item>> = group.items.iter().map(|item| share.apply(item)).collect();
    let mut prior = group.prior;
    for (item, scaled) in group.items.iter().zip(&scaled) {
        if scaled.is_none() {
            prior.add(item.weight, false);
        }
    }
    let kept = Group {
        items: scaled.iter().flatten().cloned().collect(),
        prior,
        ..group.clone()
    };
    let mut decided = if kept.items.is_empty() {
        Vec::new()
    } else {
        store.decide(&kept).await?
    }
    .into_iter();
    Ok(scaled
        .iter()
        .map(|scaled| scaled.as_ref().and_then(|_| decided.next()))
        .collect())
}
