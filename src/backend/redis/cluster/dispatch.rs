//! The request path: how a group's charges are made (on one master atomically, by master, or
//! one key per call) and how a request spread over several masters is settled.

use std::sync::Arc;

use futures::future::join_all;
use tokio::time::Instant;

use super::Cluster;
use super::refresh::Topology;
use super::slots::slot_of;
use crate::backend::redis::calls::{self, Call, GroupWords};
use crate::backend::redis::scripts::Scripting;
use crate::backend::{
    BackendError, Group, Item, Outcome, Refund, log_refund_failure, roll_back, undoable,
};

/// How the charges of a request are made.
enum Plan {
    /// In one atomic call through the batcher of the one master (of the slot map it was read
    /// from) that holds every bucket.
    OneMaster(Arc<Topology>, usize),
    /// Apart, then settled: no one master decides the request atomically.
    Spread(Spread),
}

/// How the charges of a request that no one master decides atomically are made.
enum Spread {
    /// Through the batchers of the masters (`owners`, one per item, of the slot map they were
    /// read from), independent charges per master.
    ByNode(Arc<Topology>, Vec<usize>),
    /// One script call per item, routed by the client (which follows `MOVED`/`ASK`).
    Each,
}

impl Cluster {
    /// Decides `group`: on the one master that holds every bucket, in one atomic call and in
    /// the caller's task, as on a lone Redis (nothing to settle); else by
    /// [`Cluster::charge_and_settle`] in a task of its own, so that its undo happens whatever
    /// becomes of the caller: a caller dropped at its deadline while the charges are out (and
    /// answered by the failure mode) leaves nothing booked either, unless `keep_on_failure`
    /// admits it.
    pub(super) async fn decide(
        self: &Arc<Self>,
        group: &Group,
    ) -> Result<Vec<Outcome>, BackendError> {
        if group.items.is_empty() {
            return Ok(Vec::new());
        }
        let work_ends = group.work_ends_within(self.options.timeout);
        let spread = match self.plan(group) {
            Plan::OneMaster(topology, master) => {
                let lane = &topology.lanes[master].lane;
                match lane
                    .decide(
                        GroupWords::new(group),
                        work_ends,
                        group.deadline,
                        group.connection,
                    )
                    .await
                {
                    Ok(Some(outcomes)) => return Ok(outcomes),
                    Err(error) => return Err(self.lane_failed(error)),
                    // A key the master no longer holds (or of another type): nothing of it
                    // stands, and it goes again one key per call.
                    Ok(None) => {
                        self.refresh_soon();
                        Spread::Each
                    }
                }
            }
            Plan::Spread(spread) => spread,
        };
        let (reply, answer) = tokio::sync::oneshot::channel();
        let cluster = Arc::clone(self);
        let group = group.clone();
        tokio::spawn(async move {
            let (result, kept) = cluster.charge_and_settle(&group, spread, work_ends).await;
            if let Err(Ok(_)) = reply.send(result)
                && !group.keep_on_failure
                && !kept.is_empty()
            {
                // The caller gave up before the answer: its request failed, so what it
                // booked goes too.
                cluster.undo(kept).await;
            }
        });
        answer.await.unwrap_or_else(|_| {
            Err(BackendError::Unavailable(
                "the Redis Cluster charge task stopped".into(),
            ))
        })
    }

    /// How `group` (not empty) is charged: by the masters that hold its buckets with the
    /// library, else one call per item (also when the slot map does not cover a bucket,
    /// which asks for the map again).
    fn plan(self: &Arc<Self>, group: &Group) -> Plan {
        if self.scripting != Scripting::Functions {
            return Plan::Spread(Spread::Each);
        }
        let topology = Arc::clone(&self.topology.read());
        let prefix = &self.options.key_prefix;
        let mut key = String::new();
        let owners: Option<Vec<usize>> = group
            .items
            .iter()
            .map(|item| {
                key.clear();
                item.charge.bucket.write_redis_key(prefix, &mut key);
                topology.slots.owner(slot_of(key.as_bytes()))
            })
            .collect();
        match owners {
            Some(owners) if owners.iter().all(|&owner| owner == owners[0]) => {
                Plan::OneMaster(topology, owners[0])
            }
            Some(owners) => Plan::Spread(Spread::ByNode(topology, owners)),
            None => {
                self.refresh_soon();
                Plan::Spread(Spread::Each)
            }
        }
    }

    /// A lane's error, after asking for the slot map again unless the error says only that
    /// the master is busy.
    fn lane_failed(self: &Arc<Self>, error: BackendError) -> BackendError {
        if !matches!(error, BackendError::Overloaded | BackendError::Timeout) {
            self.refresh_soon();
        }
        error
    }

    /// Charges every item as `spread` says, then undoes the undoable bookings of a rejected
    /// request, or of a failed one unless `keep_on_failure`. Also returns the refunds of the
    /// bookings that stand, should the caller be gone.
    async fn charge_and_settle(
        self: &Arc<Self>,
        group: &Group,
        spread: Spread,
        work_ends: Instant,
    ) -> (Result<Vec<Outcome>, BackendError>, Vec<Refund>) {
        let results = match spread {
            Spread::ByNode(topology, owners) => {
                self.charge_by_node(&topology, group, &owners, work_ends)
                    .await
            }
            Spread::Each => {
                let items: Vec<&Item> = group.items.iter().collect();
                self.charge_each(&items, work_ends).await
            }
        };
        self.settle(group, results).await
    }

    /// Charges `items` concurrently, one script call each (their buckets live in different
    /// slots); redis-rs follows `MOVED` and `ASK` for each.
    async fn charge_each(
        &self,
        items: &[&Item],
        work_ends: Instant,
    ) -> Vec<Result<Outcome, BackendError>> {
        let prefix = &self.options.key_prefix;
        join_all(items.iter().map(|item| async move {
            let value = self
                .run(&Call::charge(&item.charge, prefix), work_ends)
                .await?;
            calls::outcome(value).map_err(|e| self.secrets.scrub(e))
        }))
        .await
    }

    /// Charges `group`, whose buckets `owners` spread over several masters of `topology`,
    /// through their batchers, as independent charges per master. A part that failed inside
    /// its call (a key the master does not hold while a slot moves, or a key of another type)
    /// goes again one key per call.
    async fn charge_by_node(
        self: &Arc<Self>,
        topology: &Topology,
        group: &Group,
        owners: &[usize],
        work_ends: Instant,
    ) -> Vec<Result<Outcome, BackendError>> {
        let mut parts: Vec<(usize, Vec<usize>)> = Vec::new();
        for (index, &owner) in owners.iter().enumerate() {
            match parts.iter_mut().find(|(node, _)| *node == owner) {
                Some((_, indexes)) => indexes.push(index),
                None => parts.push((owner, vec![index])),
            }
        }
        let replies = join_all(parts.iter().map(|(node, indexes)| {
            let words = GroupWords::independent(indexes.iter().map(|&i| &group.items[i]));
            topology.lanes[*node]
                .lane
                .decide(words, work_ends, group.deadline, group.connection)
        }))
        .await;
        let mut results: Vec<Option<Result<Outcome, BackendError>>> = vec![None; owners.len()];
        let mut again = Vec::new();
        for ((_, indexes), reply) in parts.iter().zip(replies) {
            match reply {
                Ok(Some(outcomes)) => {
                    for (&i, outcome) in indexes.iter().zip(outcomes) {
                        results[i] = Some(Ok(outcome));
                    }
                }
                Ok(None) => again.extend(indexes.iter().copied()),
                Err(error) => {
                    let error = self.lane_failed(error);
                    for &i in indexes {
                        results[i] = Some(Err(error.clone()));
                    }
                }
            }
        }
        if !again.is_empty() {
            self.refresh_soon();
            let items: Vec<&Item> = again.iter().map(|&i| &group.items[i]).collect();
            for (i, result) in again
                .into_iter()
                .zip(self.charge_each(&items, work_ends).await)
            {
                results[i] = Some(result);
            }
        }
        results
            .into_iter()
            .map(|result| result.expect("every item is charged once"))
            .collect()
    }

    /// Undoes what `group`'s `results` say must not stand (see `charge_and_settle`).
    async fn settle(
        &self,
        group: &Group,
        results: Vec<Result<Outcome, BackendError>>,
    ) -> (Result<Vec<Outcome>, BackendError>, Vec<Refund>) {
        let failure = results.iter().find_map(|r| r.as_ref().err()).cloned();
        let outcomes: Option<Vec<Outcome>> = failure
            .is_none()
            .then(|| results.iter().flatten().copied().collect());
        let undo_all = group.must_undo(outcomes.as_deref());
        let mut settled: Vec<(&Item, Outcome)> = group
            .items
            .iter()
            .zip(results)
            .filter_map(|(item, result)| Some((item, result.ok()?)))
            .collect();
        let mut kept = Vec::new();
        if undo_all {
            let undo = roll_back(
                settled.iter_mut().map(|(item, outcome)| (*item, outcome)),
                false,
            );
            if !undo.is_empty() {
                self.undo(undo).await;
            }
        } else {
            kept = settled
                .iter()
                .filter(|(item, outcome)| undoable(item, outcome))
                .map(|(item, outcome)| Refund::of(item, outcome, false))
                .collect();
        }
        let outcomes = settled.into_iter().map(|(_, outcome)| outcome).collect();
        let result = match failure {
            Some(error) => Err(error),
            None => Ok(outcomes),
        };
        (result, kept)
    }

    /// Refunds bookings of a request that ended rejected or failed (it runs in the charge
    /// task, which outlives the caller). A refund that fails leaves its booking (the request
    /// was rejected all the same): counted by the caller as a backend error.
    pub(super) async fn undo(&self, refunds: Vec<Refund>) {
        if let Err(error) = self.refund(&refunds).await {
            log_refund_failure(&error);
        }
    }

    pub(super) async fn refund(&self, refunds: &[Refund]) -> Result<(), BackendError> {
        let prefix = &self.options.key_prefix;
        let calls: Vec<Call> = refunds.iter().map(|r| Call::refund(r, prefix)).collect();
        for value in self.run_all(&calls).await? {
            calls::refunded(value).map_err(|e| self.secrets.scrub(e))?;
        }
        Ok(())
    }
}
