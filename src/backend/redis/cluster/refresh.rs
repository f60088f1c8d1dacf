//! The slot map as floodgate reads it (`CLUSTER SLOTS`), and a batcher for each master in it.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
use tokio::time::Instant;

use super::health::Health;
use super::node::NodeLink;
use super::slots::SlotMap;
use super::{Cluster, MIN_REFRESH_GAP};
use crate::backend::BackendError;
use crate::backend::redis::batch::{self, Lane};
use crate::backend::redis::scripts::Scripting;

/// The slot map and, for each of its masters in order, the batcher of its calls and the slot
/// those calls are routed by.
#[derive(Default)]
pub(super) struct Topology {
    pub(super) slots: SlotMap,
    /// One per master, in the order of `slots.masters()`.
    pub(super) lanes: Vec<MasterLane>,
}

/// A master's batcher, and a slot it held when the map was read (which keeps it on refresh).
#[derive(Clone)]
pub(super) struct MasterLane {
    pub(super) slot: u16,
    pub(super) lane: Arc<Lane>,
}

impl Cluster {
    /// Reads the slot map again in the background, at most once per `MIN_REFRESH_GAP`.
    pub(super) fn refresh_soon(self: &Arc<Self>) {
        if self.scripting != Scripting::Functions || self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let cluster = Arc::clone(self);
        tokio::spawn(async move {
            if let Err(error) = cluster.refresh().await {
                tracing::debug!(%error, "could not read the Redis Cluster slot map");
            }
            tokio::time::sleep(MIN_REFRESH_GAP).await;
            cluster.refreshing.store(false, Ordering::Release);
        });
    }

    /// Reads the slot map (`CLUSTER SLOTS`) and gives each master a batcher, keeping those of
    /// masters whose routing slot they still hold. Every node is asked and the first answer
    /// counts: a node that hangs (the very master whose failover made the map change) must
    /// not keep the new map from being read.
    pub(super) async fn refresh(&self) -> Result<(), BackendError> {
        let work_ends = Instant::now() + self.options.timeout;
        let mut conn = self.conn.clone();
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let first_to_answer = RoutingInfo::MultiNode((
            MultipleNodeRoutingInfo::AllNodes,
            Some(ResponsePolicy::OneSucceeded),
        ));
        let reply = self
            .bounded(work_ends, conn.route_command(cmd, first_to_answer))
            .await?;
        let slots = SlotMap::parse(&reply).map_err(|bad| BackendError::failed(bad.to_string()))?;
        let old = Arc::clone(&self.topology.read());
        let mut lanes = Vec::with_capacity(slots.masters().len());
        for (index, address) in slots.masters().iter().enumerate() {
            let kept = old
                .slots
                .masters()
                .iter()
                .position(|old_address| old_address == address)
                .map(|old_index| &old.lanes[old_index])
                .filter(|master| slots.owner(master.slot) == Some(index));
            let lane = match kept {
                Some(kept) => kept.clone(),
                None => {
                    let slot = slots.first_slot(index);
                    let link = NodeLink {
                        conn: self.conn.clone(),
                        scripts: self.scripts.clone(),
                        secrets: self.secrets.clone(),
                        address: NodeLink::parse_address(address),
                        slot,
                        health: Arc::new(Health::new()),
                        timeout: self.options.timeout,
                        key_prefix: self.options.key_prefix.clone(),
                    };
                    let link = Arc::new(link);
                    let lane = Lane::start(link, batch::CALLS_IN_FLIGHT_PER_MASTER);
                    MasterLane {
                        slot,
                        lane: Arc::new(lane),
                    }
                }
            };
            lanes.push(lane);
        }
        *self.topology.write() = Arc::new(Topology { slots, lanes });
        Ok(())
    }
}
