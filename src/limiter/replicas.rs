//! The replica registry: every replica on a shared Redis says it is alive there once a
//! heartbeat (`lua/replicas.lua`) and learns which replicas share it: those heard from
//! lately (live) and those heard from within the grace (known).
//!
//! Two users: the quota service, which takes a silent replica's streams' demand out of the
//! shared counters within `LIVE_FOR` (`rlqs::ledger`); and failure mode `local`
//! (`fallback`), where a silent replica may be cut off and deciding from memory with `1 /
//! known` of each limit while the live ones keep `live / known`. A replica that shuts down
//! leaves at once. It starts with its first user (`Registry::want`), so a replica that
//! serves neither writes nothing of it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use arc_swap::ArcSwapOption;
use redis::Value;

use crate::backend::{Backend, BackendError, SideCall, SideScript};
use crate::metrics::Metrics;

/// How often a replica says it is alive.
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// A replica heard from within this long is live: three heartbeats, so one late or lost
/// heartbeat does not count it out.
pub const LIVE_FOR: Duration = Duration::from_secs(3);
/// Default `--replica-grace`.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(120);
/// Most silent replicas a view names (the counts go on past it): each costs a quota
/// report three peeks.
pub const MOST_NAMED: usize = 64;
/// How long a silent replica is named after its last heartbeat: the quota service's
/// counts live in sliding windows of 10 s (`rlqs::fair::DEMAND_WINDOW`), gone after two of
/// them, so a replica crash-looping with a fresh id each start costs a report peeks for
/// this long, not for the whole grace.
pub const SILENT_NAMED_FOR: Duration = Duration::from_secs(25);
/// The registry's script.
static SCRIPT: SideScript = SideScript::new(include_str!("../../lua/replicas.lua"));
/// The registry's key (under the key prefix), one slot of a Redis Cluster.
const KEY: &str = "{floodgate-replicas}";

/// What a heartbeat learned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    /// Live replicas (heard within [`LIVE_FOR`]), this one included.
    pub live: u32,
    /// Known replicas: the live ones and the silent ones heard within the grace.
    pub known: u32,
    /// The silent ones heard within [`SILENT_NAMED_FOR`], at most [`MOST_NAMED`].
    pub silent: Vec<Arc<str>>,
}

/// This replica's membership and its latest view.
#[derive(Debug)]
pub struct Registry {
    id: Arc<str>,
    grace: Duration,
    /// The latest view; none until a heartbeat was answered.
    view: ArcSwapOption<View>,
    /// Whether anything uses the registry yet, and the wake-up of the heartbeat when it does.
    wanted: AtomicBool,
    first_use: Notify,
}

impl Registry {
    /// A registry entry with a fresh id (the host's name, the process and a random part,
    /// so that two replicas never share one); silent replicas are known for `grace`.
    pub fn new(grace: Duration) -> Registry {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "floodgate".to_owned());
        Registry {
            id: Arc::from(format!(
                "{host}/{}/{:08x}",
                std::process::id(),
                rand::random::<u32>()
            )),
            grace: grace.max(LIVE_FOR),
            view: ArcSwapOption::empty(),
            wanted: AtomicBool::new(false),
            first_use: Notify::new(),
        }
    }

    /// Starts the heartbeat (where one runs), for a user of the view: failure mode `local`,
    /// a quota stream.
    pub fn want(&self) {
        if !self.wanted.swap(true, Ordering::Relaxed) {
            self.first_use.notify_one();
        }
    }

    /// This replica's id.
    pub fn id(&self) -> &Arc<str> {
        &self.id
    }

    /// The latest view, `None` until Redis first answered a heartbeat.
    pub fn view(&self) -> Option<Arc<View>> {
        self.view.load_full()
    }

    /// Says this replica is alive and reads the view.
    ///
    /// # Errors
    /// Redis could not be reached or refused the script.
    pub async fn beat(&self, backend: &dyn Backend) -> Result<Arc<View>, BackendError> {
        let view = Arc::new(self.call(backend, false).await?);
        self.view.store(Some(Arc::clone(&view)));
        Ok(view)
    }

    /// Leaves the registry (graceful shutdown), so nobody keeps counting this replica.
    pub async fn leave(&self, backend: &dyn Backend) {
        if !self.wanted.load(Ordering::Relaxed) {
            return;
        }
        if let Err(error) = self.call(backend, true).await {
            tracing::warn!(%error, "could not leave the replica registry");
        }
    }

    /// Beats every [`HEARTBEAT`] from the first [`Registry::want`] until the task is dropped;
    /// a failed beat keeps the last view.
    pub async fn run(self: Arc<Self>, backend: Arc<dyn Backend>, metrics: Arc<Metrics>) {
        if !self.wanted.load(Ordering::Relaxed) {
            self.first_use.notified().await;
        }
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
            script: &SCRIPT,
            keys: vec![KEY.to_owned()],
            args: vec![
                self.id.to_string(),
                LIVE_FOR.as_millis().to_string(),
                self.grace.as_millis().to_string(),
                u8::from(leaving).to_string(),
                MOST_NAMED.to_string(),
                SILENT_NAMED_FOR.as_millis().to_string(),
            ],
        };
        let reply = backend.side_call(&call).await?;
        let bad = |reply: &Value| BackendError::failed(format!("registry reply {reply:?}"));
        let Value::Array(values) = &reply else {
            return Err(bad(&reply));
        };
        let count = |value: Option<&Value>| match value {
            Some(Value::Int(n)) => Ok(u32::try_from(*n).unwrap_or(u32::MAX)),
            _ => Err(bad(&reply)),
        };
        let ids = |value: Option<&Value>| match value {
            Some(Value::Array(ids)) => ids
                .iter()
                .filter_map(|id| match id {
                    Value::BulkString(bytes) => std::str::from_utf8(bytes).ok().map(Arc::from),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        Ok(View {
            live: count(values.first())?,
            known: count(values.get(1))?,
            silent: ids(values.get(2)),
        })
    }
}
