//! The replica registry: every replica under failure mode `local` says it is alive in its
//! Redis once a heartbeat (`lua/replicas.lua`), and learns how many replicas share the
//! limits: those heard from lately (live) and those heard from within the grace (known). A
//! replica that went silent may be cut off from Redis and deciding from its memory with
//! `1 / known` of each limit, so the live ones keep `live / known` between them until the
//! grace ends. A replica that shuts down leaves at once, so a rollout reserves nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::Value;

use super::share::Share;
use crate::backend::{Backend, BackendError, SideCall};
use crate::metrics::Metrics;

/// How often a replica says it is alive.
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// A replica heard from within this long is live: three heartbeats, so one late or lost
/// heartbeat does not reserve its share.
pub const LIVE_FOR: Duration = Duration::from_secs(3);
/// Default `--replica-grace`.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(120);
/// The registry's key (under the key prefix), one slot of a Redis Cluster.
const KEY: &str = "{floodgate-replicas}";

/// What a heartbeat learned: replicas heard within [`LIVE_FOR`] and within the grace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View {
    /// Live replicas, this one included.
    pub live: u32,
    /// Known replicas: the live ones and the silent ones whose share is still reserved.
    pub known: u32,
}

impl View {
    /// What the live replicas may admit together from Redis: `live / known` of each limit.
    pub fn on_redis(self) -> Option<Share> {
        Share::new(self.live.max(1), self.known.max(1))
    }

    /// What this replica may admit alone from its memory: `1 / known` of each limit.
    pub fn alone(self) -> Option<Share> {
        Share::new(1, self.known.max(1))
    }
}

/// This replica's membership and its latest view.
#[derive(Debug)]
pub struct Registry {
    id: String,
    grace: Duration,
    /// The latest view, `live << 32 | known`; 0 until a heartbeat was answered.
    view: AtomicU64,
}

impl Registry {
    /// A registry entry with a fresh id (the host's name, the process and a random part,
    /// so that two replicas never share one); silent replicas are reserved for `grace`.
    pub fn new(grace: Duration) -> Registry {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "floodgate".to_owned());
        Registry {
            id: format!(
                "{host}/{}/{:08x}",
                std::process::id(),
                rand::random::<u32>()
            ),
            grace: grace.max(LIVE_FOR),
            view: AtomicU64::new(0),
        }
    }

    /// The latest view, `None` until Redis first answered a heartbeat.
    pub fn view(&self) -> Option<View> {
        let packed = self.view.load(Ordering::Relaxed);
        (packed != 0).then_some(View {
            live: (packed >> 32) as u32,
            known: packed as u32,
        })
    }

    /// Says this replica is alive and reads the view.
    ///
    /// # Errors
    /// Redis could not be reached or refused the script.
    pub async fn beat(&self, backend: &dyn Backend) -> Result<View, BackendError> {
        let view = self.call(backend, false).await?;
        let packed = u64::from(view.live) << 32 | u64::from(view.known);
        self.view.store(packed, Ordering::Relaxed);
        Ok(view)
    }

    /// Leaves the registry (graceful shutdown), so nobody keeps this replica's share.
    pub async fn leave(&self, backend: &dyn Backend) {
        if let Err(error) = self.call(backend, true).await {
            tracing::warn!(%error, "could not leave the replica registry");
        }
    }

    /// Beats every [`HEARTBEAT`] until the task is dropped; a failed beat keeps the last view.
    pub async fn run(self: Arc<Self>, backend: Arc<dyn Backend>, metrics: Arc<Metrics>) {
        let mut ticks = tokio::time::interval(HEARTBEAT);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            match self.beat(backend.as_ref()).await {
                Ok(view) => metrics.replicas_seen(view.live, view.known),
                Err(error) => tracing::debug!(%error, "replica heartbeat failed"),
            }
        }
    }

    async fn call(&self, backend: &dyn Backend, leaving: bool) -> Result<View, BackendError> {
        let call = SideCall {
            source: include_str!("../../../lua/replicas.lua"),
            keys: vec![KEY.to_owned()],
            args: vec![
                self.id.clone(),
                LIVE_FOR.as_millis().to_string(),
                self.grace.as_millis().to_string(),
                u8::from(leaving).to_string(),
            ],
        };
        match backend.side_call(&call).await? {
            Value::Array(counts) => match counts.as_slice() {
                [Value::Int(live), Value::Int(known)] => Ok(View {
                    live: u32::try_from(*live).unwrap_or(u32::MAX),
                    known: u32::try_from(*known).unwrap_or(u32::MAX),
                }),
                other => Err(BackendError::failed(format!("registry reply {other:?}"))),
            },
            other => Err(BackendError::failed(format!("registry reply {other:?}"))),
        }
    }
}
