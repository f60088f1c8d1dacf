//! One Redis Cluster master as its batcher sees it: where its calls go (routed by one of
//! its slots through the client's map), the `FCALL` that carries a batch, and the quarantine
//! of a master that went silent (`super::health`).

use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use tokio::time::{Instant, timeout_at};

use super::health::Health;
use crate::backend::redis::batch::Runner;
use crate::backend::redis::calls::{self, GroupWords};
use crate::backend::redis::errors;
use crate::backend::redis::scripts::ScriptSet;
use crate::backend::{BackendError, Outcome};
use crate::redact::Secrets;

/// Sends a master's batch calls: `FCALL` of the cross-slot batch function, routed to the
/// master of `slot` (one slot it held when the map was read).
pub(super) struct NodeLink {
    pub(super) conn: ClusterConnection,
    pub(super) scripts: ScriptSet,
    pub(super) secrets: Secrets,
    pub(super) slot: u16,
    /// Whether the master may get decisions after a silence (`health`).
    pub(super) health: Arc<Health>,
    /// The backend timeout, which also bounds a probe.
    pub(super) timeout: Duration,
    /// Prefix of every bucket's key (`RedisOptions::key_prefix`).
    pub(super) key_prefix: String,
}

impl NodeLink {
    /// The master of `slot`, as the client knows it.
    fn route(&self) -> RoutingInfo {
        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
            self.slot,
            SlotAddr::Master,
        )))
    }

    /// Sends one `PING` to a quarantined master, unless one is out (see `health`).
    fn probe(&self) {
        if !self.health.start_probe() {
            return;
        }
        let (mut conn, route) = (self.conn.clone(), self.route());
        let (health, timeout) = (Arc::clone(&self.health), self.timeout);
        tokio::spawn(async move {
            let ping = tokio::time::timeout(timeout, conn.route_command(redis::cmd("PING"), route));
            let answered = matches!(ping.await, Ok(Ok(_)));
            health.end_probe(answered.then(Instant::now));
        });
    }

    /// One `FCALL` for `groups`; after `Function not found` the library is loaded on the same
    /// node and the call goes again (the first one did not run).
    async fn send(
        &self,
        groups: &[&GroupWords],
        deadline: Instant,
    ) -> Result<Vec<Option<Outcome>>, BackendError> {
        let route = || self.route();
        let mut conn = self.conn.clone();
        let mut reply = Value::Nil;
        for retry in [false, true] {
            if retry {
                let load = self.scripts.library_load();
                let loaded = timeout_at(deadline, conn.route_command(load, route())).await;
                if let Ok(Err(e)) = loaded {
                    return Err(self.secrets.scrub(errors::classify(&e)));
                }
            }
            let cmd = GroupWords::command_across_slots(groups, &self.key_prefix, &self.scripts);
            reply = match timeout_at(deadline, conn.route_command(cmd, route())).await {
                Ok(Ok(value)) => value,
                Ok(Err(e)) if errors::is_missing_error(&e) && !retry => continue,
                Ok(Err(e)) => return Err(self.secrets.scrub(errors::classify(&e))),
                Err(_) => return Err(BackendError::Timeout),
            };
            if !errors::is_missing(&reply) {
                break;
            }
        }
        let items = groups.iter().map(|group| group.len()).sum();
        calls::batch_outcomes(reply, items).map_err(|e| self.secrets.scrub(e))
    }
}

impl Runner for NodeLink {
    /// Sends the call unless the master is quarantined after a silence (`health`), and
    /// notes whether it answered.
    async fn run_batch(
        &self,
        groups: &[&GroupWords],
        deadline: Instant,
    ) -> Result<Vec<Option<Outcome>>, BackendError> {
        if !self.health.admits(Instant::now()) {
            self.probe();
            return Err(BackendError::Unavailable(
                "a Redis Cluster master went silent: it gets decisions again once it answers"
                    .into(),
            ));
        }
        let result = self.send(groups, deadline).await;
        match &result {
            Err(BackendError::Timeout | BackendError::Unavailable(_)) => {
                self.health.unanswered(Instant::now());
            }
            _ => self.health.answered(Instant::now()),
        }
        result
    }
}
