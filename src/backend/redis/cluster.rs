//! Redis Cluster through redis-rs' async cluster client.
//!
//! The client keeps one multiplexed connection per node, follows `MOVED`/`ASK`, retries
//! `TRYAGAIN`/`CLUSTERDOWN` and refreshes the slot map after a failover.
//! `RedisOptions::pool_size` does not apply here.
//!
//! With the function library (Redis >= 7) requests are batched per master: each master has a
//! queue and a batcher (`super::batch`), and a request's charges go to the masters that hold
//! their slots (`slots`, read from `CLUSTER SLOTS`), one `FCALL` per master per batch. A
//! request whose charges all live on one master is decided there all-or-nothing in one
//! atomic step, as on a single node; one spread over several masters is decided on each
//! and its bookings refunded when it ends rejected. While a slot moves, the groups that touch
//! a key the master no longer holds fail inside the call, with nothing booked, and go again
//! one key per call (which follows `MOVED`/`ASK`); the slot map is then read again.
//!
//! With scripts (`EVALSHA`), the charges of one request run concurrently, one script call
//! each, pipelined per node by the multiplexed connections, under one deadline.
//!
//! Unlike the single-node backend, the client itself retries a command whose connection
//! broke (up to `CLIENT_RETRIES`, within the call's timeout): if the script had already run
//! on a node that then died, that one booking may count twice. It is the price of riding
//! through failovers without failing every call in flight.
//!
//! A master silent for half a second gets no decision until it answers again (`health`): a
//! master frozen past the node timeout must not wake to a decision its replica never sees.
//!
//! One failed master fails only its own buckets provided the cluster runs with
//! `cluster-require-full-coverage no`: with Redis' default every node answers `CLUSTERDOWN`
//! for every key until the failed master's replica is promoted, which no client can avoid.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::future::join_all;
use redis::Value;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, ResponsePolicy, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use tokio::time::{Instant, timeout_at};

use super::batch::{self, Lane};
use super::calls::{self, Call, GroupWords};
use super::errors;
use super::scripts::{ScriptSet, Scripting};
use super::{RedisOptions, config_error};
use crate::backend::{
    Backend, BackendError, Group, Item, Outcome, Refund, log_refund_failure, roll_back, undoable,
};
use crate::redact::{Redacted, Secrets};
use health::Health;
use node::NodeLink;
use slots::{SlotMap, slot_of};

mod health;
mod node;
mod slots;

/// Retries of one command inside the client (redirects, `TRYAGAIN`, reconnects); the call's
/// timeout bounds them all the same.
const CLIENT_RETRIES: u32 = 3;
/// Shortest wait before such a retry, in ms (the client's default of 1.28 s exceeds any
/// sensible backend timeout).
const MIN_RETRY_WAIT_MS: u64 = 10;
/// Redirects by `MOVED` that one call follows itself after the client's (see `follow_moved`).
const MAX_MOVED: usize = 3;
/// Shortest time between two reads of the slot map: a resharding fails many groups at once,
/// and one read serves them all.
const MIN_REFRESH_GAP: Duration = Duration::from_millis(100);

/// Rate limits in a Redis Cluster (docs/backends.md#redis-cluster).
pub struct ClusterBackend(Arc<Cluster>);

/// The cluster connection and what every call needs; shared with undo tasks that must
/// finish even when their caller gives up.
struct Cluster {
    conn: ClusterConnection,
    scripts: ScriptSet,
    /// `Functions` or `Evalsha`: what `options.scripting` came to at connect.
    scripting: Scripting,
    options: RedisOptions,
    secrets: Secrets,
    /// The slot map and a batcher per master (function library only).
    topology: parking_lot::RwLock<Arc<Topology>>,
    /// Set while a read of the slot map is under way or was made less than
    /// `MIN_REFRESH_GAP` ago.
    refreshing: AtomicBool,
}

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

/// The slot map and, for each of its masters in order, the batcher of its calls and the slot
/// those calls are routed by.
#[derive(Default)]
struct Topology {
    slots: SlotMap,
    /// One per master, in the order of `slots.masters()`.
    lanes: Vec<MasterLane>,
}

/// A master's batcher, the slot its calls are routed by, and whether it may get decisions.
#[derive(Clone)]
struct MasterLane {
    slot: u16,
    lane: Arc<Lane>,
    health: Arc<Health>,
}

impl fmt::Debug for ClusterBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterBackend")
            .field("urls", &Redacted)
            .field("options", &self.0.options)
            .finish_non_exhaustive()
    }
}

impl ClusterBackend {
    /// Connects to the cluster through the seed nodes `urls` (`redis://` or `rediss://`,
    /// all with the same credentials), learns the slot map and loads the scripts on every
    /// node; each step is bounded by `options.timeout`.
    ///
    /// # Errors
    /// `Config` for invalid URLs or options; `Failed` for a refused login or a server error;
    /// `Unavailable` or `Timeout` when no seed node answers. No message contains a URL or
    /// a password.
    pub async fn connect(
        urls: &[String],
        options: RedisOptions,
    ) -> Result<ClusterBackend, BackendError> {
        ClusterBackend::connect_with_scripts(urls, options, ScriptSet::new()).await
    }

    /// `connect` with the given scripts: tests pass a pinned set (`ScriptSet::pinned`).
    #[doc(hidden)]
    pub async fn connect_with_scripts(
        urls: &[String],
        options: RedisOptions,
        scripts: ScriptSet,
    ) -> Result<ClusterBackend, BackendError> {
        options.validate()?;
        if urls.is_empty() {
            return Err(config_error("no cluster seed URL"));
        }
        let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
        let secrets = Secrets::of(&refs);
        let max_wait_ms = (options.timeout.as_millis() as u64).max(MIN_RETRY_WAIT_MS);
        let mut builder = ClusterClient::builder(refs);
        if let Some(certs) = options.tls_for(&urls[0]) {
            builder = builder.certs(certs);
        }
        let client = builder
            .connection_timeout(options.timeout)
            .response_timeout(options.timeout)
            .retries(CLIENT_RETRIES)
            .min_retry_wait(MIN_RETRY_WAIT_MS)
            .max_retry_wait(max_wait_ms)
            .build()
            .map_err(|e| {
                secrets.scrub(BackendError::Config(format!(
                    "invalid Redis Cluster URLs: {e}"
                )))
            })?;
        let deadline = Instant::now() + options.timeout;
        let conn = match timeout_at(deadline, client.get_async_connection()).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => return Err(secrets.scrub(errors::classify(&e))),
            Err(_) => return Err(BackendError::Timeout),
        };
        let mut backend = Cluster {
            conn,
            scripts,
            scripting: options.scripting,
            options,
            secrets,
            topology: parking_lot::RwLock::default(),
            refreshing: AtomicBool::new(false),
        };
        backend.scripting = backend.preload().await?;
        if backend.scripting == Scripting::Functions
            && let Err(error) = backend.refresh().await
        {
            // Calls go one key each until a read of the map succeeds.
            tracing::warn!(%error, "could not read the Redis Cluster slot map");
        }
        Ok(ClusterBackend(Arc::new(backend)))
    }
}

impl Cluster {
    /// Loads the function library or the scripts on every node and settles
    /// `Scripting::Auto`, as `single::Node::preload` does. Loading scripts is best effort;
    /// besides, each load goes to every node and one node down (a failed replica) must not
    /// stop startup.
    async fn preload(&self) -> Result<Scripting, BackendError> {
        super::settle_scripting(self.options.scripting, |scripting| {
            Box::pin(self.load(scripting))
        })
        .await
    }

    /// Sends what makes the calls of `scripting` known, to every node.
    async fn load(&self, scripting: Scripting) -> Result<(), BackendError> {
        for cmd in self.scripts.load_commands(scripting) {
            let deadline = Instant::now() + self.options.timeout;
            let mut conn = self.conn.clone();
            self.bounded(deadline, cmd.query_async::<Value>(&mut conn))
                .await?;
        }
        Ok(())
    }

    async fn bounded<T>(
        &self,
        deadline: Instant,
        call: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, BackendError> {
        match timeout_at(deadline, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(self.secrets.scrub(errors::classify(&e))),
            Err(_) => Err(BackendError::Timeout),
        }
    }

    /// Runs one script call; after `NOSCRIPT` or `Function not found` (a node that never saw
    /// the script, such as a freshly promoted replica) it goes again as `EVAL`, or after the
    /// library's load on the node that owns the key.
    async fn run(&self, call: &Call, deadline: Instant) -> Result<Value, BackendError> {
        let mut conn = self.conn.clone();
        let first = call.command(&self.scripts, self.scripting.first());
        match timeout_at(deadline, follow_moved(&mut conn, first)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) if errors::is_missing_error(&e) => {
                let (load, via) = self.scripting.again(&self.scripts);
                if let Some(load) = load {
                    let owner = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                        Route::with_key(call.key(), SlotAddr::Master),
                    ));
                    self.bounded(deadline, conn.route_command(load, owner))
                        .await?;
                }
                let again = call.command(&self.scripts, via);
                self.bounded(deadline, follow_moved(&mut conn, again)).await
            }
            Ok(Err(e)) => Err(self.secrets.scrub(errors::classify(&e))),
            Err(_) => Err(BackendError::Timeout),
        }
    }

    async fn run_all(&self, calls: &[Call]) -> Result<Vec<Value>, BackendError> {
        let deadline = Instant::now() + self.options.timeout;
        join_all(calls.iter().map(|call| self.run(call, deadline)))
            .await
            .into_iter()
            .collect()
    }

    /// Decides `group`: on the one master that holds every bucket, in one atomic call and in
    /// the caller's task, as on a lone Redis (nothing to settle); else by
    /// [`Cluster::charge_and_settle`] in a task of its own, so that its undo happens whatever
    /// becomes of the caller: a caller dropped at its deadline while the charges are out (and
    /// answered by the failure mode) leaves nothing booked either, unless `keep_on_failure`
    /// admits it.
    async fn decide(self: &Arc<Self>, group: &Group) -> Result<Vec<Outcome>, BackendError> {
        if group.items.is_empty() {
            return Ok(Vec::new());
        }
        let deadline = group.work_ends_within(self.options.timeout);
        let spread = match self.plan(group) {
            Plan::OneMaster(topology, master) => {
                let lane = &topology.lanes[master].lane;
                match lane
                    .decide(GroupWords::new(group), deadline, group.deadline)
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
            let (result, kept) = cluster.charge_and_settle(&group, spread, deadline).await;
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
        deadline: Instant,
    ) -> (Result<Vec<Outcome>, BackendError>, Vec<Refund>) {
        let results = match spread {
            Spread::ByNode(topology, owners) => {
                self.charge_by_node(&topology, group, &owners, deadline)
                    .await
            }
            Spread::Each => {
                let items: Vec<&Item> = group.items.iter().collect();
                self.charge_each(&items, deadline).await
            }
        };
        self.settle(group, results).await
    }

    /// Charges `items` concurrently, one script call each (their buckets live in different
    /// slots); redis-rs follows `MOVED` and `ASK` for each.
    async fn charge_each(
        &self,
        items: &[&Item],
        deadline: Instant,
    ) -> Vec<Result<Outcome, BackendError>> {
        let prefix = &self.options.key_prefix;
        join_all(items.iter().map(|item| async move {
            let value = self
                .run(&Call::charge(&item.charge, prefix), deadline)
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
        deadline: Instant,
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
                .decide(words, deadline, group.deadline)
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
                .zip(self.charge_each(&items, deadline).await)
            {
                results[i] = Some(result);
            }
        }
        results
            .into_iter()
            .map(|result| result.expect("every item is charged once"))
            .collect()
    }

    /// Reads the slot map again in the background, at most once per `MIN_REFRESH_GAP`.
    fn refresh_soon(self: &Arc<Self>) {
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
    /// masters whose routing slot they still hold.
    async fn refresh(&self) -> Result<(), BackendError> {
        let deadline = Instant::now() + self.options.timeout;
        let mut conn = self.conn.clone();
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let any = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
        let reply = self.bounded(deadline, conn.route_command(cmd, any)).await?;
        let slots = SlotMap::parse(&reply).map_err(BackendError::failed)?;
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
                    // Calls are routed by slot through the client's own map, which still
                    // names the slot's old master until that master answers MOVED or fails
                    // to connect. A replica that took over from a silent master would so send
                    // its first calls to the frozen node, to be run if it woke before it
                    // learned it was replaced: it starts quarantined too, and gets decisions
                    // once a probe routed the same way is answered (see `health`).
                    let replaces_silent = old
                        .slots
                        .owner(slot)
                        .and_then(|old_index| old.lanes.get(old_index))
                        .is_some_and(|old_master| old_master.health.is_quarantined());
                    let health = Arc::new(if replaces_silent {
                        Health::quarantined()
                    } else {
                        Health::new()
                    });
                    let link = NodeLink {
                        conn: self.conn.clone(),
                        scripts: self.scripts.clone(),
                        secrets: self.secrets.clone(),
                        slot,
                        health: Arc::clone(&health),
                        timeout: self.options.timeout,
                        key_prefix: self.options.key_prefix.clone(),
                    };
                    let link = Arc::new(link);
                    let lane = Lane::start(link, batch::CALLS_IN_FLIGHT_PER_MASTER);
                    MasterLane {
                        slot,
                        lane: Arc::new(lane),
                        health,
                    }
                }
            };
            lanes.push(lane);
        }
        *self.topology.write() = Arc::new(Topology { slots, lanes });
        Ok(())
    }

    /// Undoes what `group`'s `results` say must not stand (see `charge_and_settle`).
    async fn settle(
        &self,
        group: &Group,
        results: Vec<Result<Outcome, BackendError>>,
    ) -> (Result<Vec<Outcome>, BackendError>, Vec<Refund>) {
        let failure = results.iter().find_map(|r| r.as_ref().err()).cloned();
        let undo_all = match &failure {
            Some(_) => !group.keep_on_failure,
            None => {
                let outcomes: Vec<Outcome> = results.iter().flatten().copied().collect();
                group.rejects(&outcomes)
            }
        };
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
    async fn undo(&self, refunds: Vec<Refund>) {
        if let Err(error) = self.refund(&refunds).await {
            log_refund_failure(&error);
        }
    }

    async fn refund(&self, refunds: &[Refund]) -> Result<(), BackendError> {
        let prefix = &self.options.key_prefix;
        let calls: Vec<Call> = refunds.iter().map(|r| Call::refund(r, prefix)).collect();
        for value in self.run_all(&calls).await? {
            calls::refunded(value).map_err(|e| self.secrets.scrub(e))?;
        }
        Ok(())
    }
}

/// Sends `cmd` (routed by its key through the client, which follows `MOVED` and `ASK` on its
/// own), and when the client still answers `MOVED` (its retries went by a slot map read from
/// a node that had not yet learnt of a slot's move), sends it to the node that the `MOVED`
/// names, up to `MAX_MOVED` times. A `MOVED` means the command did not run, so it never
/// runs twice.
async fn follow_moved(conn: &mut ClusterConnection, cmd: redis::Cmd) -> redis::RedisResult<Value> {
    let mut result = cmd.query_async::<Value>(conn).await;
    for _ in 0..MAX_MOVED {
        let target = match &result {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::Moved) => e
                .redirect_node()
                .and_then(|(address, _)| address.rsplit_once(':'))
                .and_then(|(host, port)| Some((host.to_owned(), port.parse().ok()?))),
            _ => None,
        };
        let Some((host, port)) = target else { break };
        let node = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
        result = conn.route_command(cmd.clone(), node).await;
    }
    result
}

#[async_trait]
impl Backend for ClusterBackend {
    async fn decide(&self, group: &Group) -> Result<Vec<Outcome>, BackendError> {
        self.0.decide(group).await
    }

    async fn refund(&self, refunds: &[Refund]) -> Result<(), BackendError> {
        self.0.refund(refunds).await
    }

    /// PING goes to every master and the first answer counts: the cluster is reachable while
    /// any master answers. One failed or frozen master makes only its own buckets fail (the
    /// others answer normally, given `cluster-require-full-coverage no`); reporting NOT_SERVING
    /// for it would take every floodgate replica out of rotation at once, as all of them see
    /// the same cluster.
    async fn ping(&self) -> Result<(), BackendError> {
        let cluster = &self.0;
        let deadline = Instant::now() + cluster.options.timeout;
        let mut conn = cluster.conn.clone();
        let any_master = RoutingInfo::MultiNode((
            MultipleNodeRoutingInfo::AllMasters,
            Some(ResponsePolicy::OneSucceeded),
        ));
        cluster
            .bounded(deadline, conn.route_command(redis::cmd("PING"), any_master))
            .await
            .map(|_| ())
    }

    fn name(&self) -> &'static str {
        "redis-cluster"
    }

    /// The least busy master's: a request may have all its buckets there.
    fn queue_wait(&self, items: usize) -> Duration {
        self.0
            .topology
            .read()
            .lanes
            .iter()
            .map(|master| master.lane.wait(items))
            .min()
            .unwrap_or(Duration::ZERO)
    }
}
