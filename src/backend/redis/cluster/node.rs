//! One Redis Cluster master as its batcher sees it: where its calls go (its own address, as
//! floodgate's slot map names it), the `FCALL` that carries a batch, and the quarantine of a
//! master that went silent (`super::health`).
//!
//! Calls go by address rather than by slot through the client's own slot map: the client
//! learns of a failover only from an error or a `MOVED`, and a master that hangs answers
//! neither (every call to it is dropped at its deadline), so its map kept naming the frozen
//! node and the slots stayed down for as long as the node stayed frozen. Only when the client
//! has no connection to the address does a call fall back to routing by slot.

use std::sync::Arc;
use std::time::Duration;

use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{ServerErrorKind, Value};
use tokio::time::{Instant, timeout_at};

use super::health::Health;
use crate::backend::redis::batch::Runner;
use crate::backend::redis::calls::{self, GroupWords};
use crate::backend::redis::errors;
use crate::backend::redis::scripts::ScriptSet;
use crate::backend::{BackendError, Outcome};
use crate::redact::Secrets;

/// Sends a master's batch calls: `FCALL` of the cross-slot batch function, to the master's
/// address (or, without a connection there, to the master of `slot`, one slot it held when
/// the map was read). Cloned for a probe's task.
#[derive(Clone)]
pub(super) struct NodeLink {
    pub(super) conn: ClusterConnection,
    pub(super) scripts: ScriptSet,
    pub(super) secrets: Secrets,
    /// The master's host and port, as `CLUSTER SLOTS` names it.
    pub(super) address: Option<(String, u16)>,
    pub(super) slot: u16,
    /// Whether the master may get decisions after a silence (`health`).
    pub(super) health: Arc<Health>,
    /// The backend timeout, which also bounds a probe.
    pub(super) timeout: Duration,
    /// Prefix of every bucket's key (`RedisOptions::key_prefix`).
    pub(super) key_prefix: String,
}

impl NodeLink {
    /// `host:port` as host and port; None when it is not one.
    pub(super) fn parse_address(address: &str) -> Option<(String, u16)> {
        let (host, port) = address.rsplit_once(':')?;
        Some((host.to_owned(), port.parse().ok()?))
    }

    /// The master itself, by address.
    fn route(&self) -> RoutingInfo {
        match &self.address {
            Some((host, port)) => RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                host: host.clone(),
                port: *port,
            }),
            None => self.route_by_slot(),
        }
    }

    /// The master of `slot`, as the client knows it.
    fn route_by_slot(&self) -> RoutingInfo {
        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
            self.slot,
            SlotAddr::Master,
        )))
    }

    /// Sends the command `build` makes to the master by address, or by slot when the client
    /// has no connection to that address (it connects to the nodes of its own map). The
    /// command is built again only for that second try, so a batch is not copied per call.
    async fn send_command(&self, build: impl Fn() -> redis::Cmd) -> redis::RedisResult<Value> {
        let mut conn = self.conn.clone();
        match conn.route_command(build(), self.route()).await {
            Err(e) if e.kind() == redis::ErrorKind::ClusterConnectionNotFound => {
                conn.route_command(build(), self.route_by_slot()).await
            }
            result => result,
        }
    }

    /// Sends one `PING` to a quarantined master, unless one is out (see `health`).
    fn probe(&self) {
        if !self.health.start_probe() {
            return;
        }
        let link = self.clone();
        tokio::spawn(async move {
            let ping = tokio::time::timeout(link.timeout, link.send_command(|| redis::cmd("PING")));
            let answered = matches!(ping.await, Ok(Ok(_)));
            link.health.end_probe(answered.then(Instant::now));
        });
    }

    /// One `FCALL` for `groups`; after `Function not found` the library is loaded on the same
    /// node and the call goes again (the first one did not run). A node that answers
    /// `READONLY` has become a replica and ran nothing: every group fails inside the call, so
    /// that, as after a `MOVED`, the slot map is read again and the keys go again one per call.
    async fn send(
        &self,
        groups: &[&GroupWords],
        work_ends: Instant,
    ) -> Result<Vec<Option<Outcome>>, BackendError> {
        let items = groups.iter().map(|group| group.len()).sum();
        let mut reply = Value::Nil;
        for retry in [false, true] {
            if retry {
                let load = || self.scripts.library_load();
                let loaded = timeout_at(work_ends, self.send_command(load)).await;
                if let Ok(Err(e)) = loaded {
                    return Err(self.secrets.scrub(errors::classify(&e)));
                }
            }
            let cmd = || GroupWords::command_across_slots(groups, &self.key_prefix, &self.scripts);
            reply = match timeout_at(work_ends, self.send_command(cmd)).await {
                Ok(Ok(value)) => value,
                Ok(Err(e)) if e.kind() == redis::ErrorKind::Server(ServerErrorKind::ReadOnly) => {
                    return Ok(vec![None; items]);
                }
                Ok(Err(e)) if errors::is_missing_error(&e) && !retry => continue,
                Ok(Err(e)) => return Err(self.secrets.scrub(errors::classify(&e))),
                Err(_) => return Err(BackendError::Timeout),
            };
            if !errors::is_missing(&reply) {
                break;
            }
        }
        calls::batch_outcomes(reply, items).map_err(|e| self.secrets.scrub(e))
    }
}

impl Runner for NodeLink {
    /// Sends the call unless the master is quarantined after a silence (`health`), and
    /// notes whether it answered.
    async fn run_batch(
        &self,
        groups: &[&GroupWords],
        work_ends: Instant,
    ) -> Result<Vec<Option<Outcome>>, BackendError> {
        if !self.health.admits(Instant::now()) {
            self.probe();
            return Err(BackendError::Unavailable(
                "a Redis Cluster master went silent: it gets decisions again once it answers"
                    .into(),
            ));
        }
        let result = self.send(groups, work_ends).await;
        match &result {
            Err(BackendError::Timeout | BackendError::Unavailable(_)) => {
                self.health.unanswered(Instant::now());
            }
            _ => self.health.answered(Instant::now()),
        }
        result
    }
}
