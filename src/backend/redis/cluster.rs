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
//!
//! Where each part lives: `dispatch` (a request's path, and the settling of a spread one),
//! `refresh` (the slot map and a batcher per master), `node` (a master's batch calls),
//! `moved` (one call routed by its key), `health` (the quarantine of a silent master) and
//! `slots` (hash slots).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::join_all;
use redis::Value;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
use tokio::time::{Instant, timeout_at};

use super::calls::Call;
use super::errors;
use super::scripts::{ScriptSet, Scripting};
use super::{RedisOptions, config_error};
use crate::backend::{Backend, BackendError, Group, Outcome, Refund, SideCall, side_call};
use crate::redact::{Redacted, Secrets};
use refresh::Topology;

mod dispatch;
mod health;
mod moved;
mod node;
mod refresh;
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
        let work_ends = Instant::now() + options.timeout;
        let conn = match timeout_at(work_ends, client.get_async_connection()).await {
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
            let work_ends = Instant::now() + self.options.timeout;
            let mut conn = self.conn.clone();
            self.bounded(work_ends, cmd.query_async::<Value>(&mut conn))
                .await?;
        }
        Ok(())
    }

    pub(super) async fn bounded<T>(
        &self,
        work_ends: Instant,
        call: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, BackendError> {
        match timeout_at(work_ends, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(self.secrets.scrub(errors::classify(&e))),
            Err(_) => Err(BackendError::Timeout),
        }
    }

    pub(super) async fn run_all(&self, calls: &[Call]) -> Result<Vec<Value>, BackendError> {
        let work_ends = Instant::now() + self.options.timeout;
        join_all(calls.iter().map(|call| self.run(call, work_ends)))
            .await
            .into_iter()
            .collect()
    }
}

#[async_trait]
impl Backend for ClusterBackend {
    async fn decide(&self, group: &Group) -> Result<Vec<Outcome>, BackendError> {
        self.0.decide(group).await
    }

    async fn refund(&self, refunds: &[Refund]) -> Result<(), BackendError> {
        self.0.refund(refunds).await
    }

    /// Routed by its keys' hash tag, bounded by the backend's timeout.
    async fn side_call(&self, call: &SideCall) -> Result<Value, BackendError> {
        let cluster = &self.0;
        let work_ends = Instant::now() + cluster.options.timeout;
        let prefix = &cluster.options.key_prefix;
        let mut conn = cluster.conn.clone();
        for by_text in [false, true] {
            let cmd = call.command(prefix, by_text);
            match timeout_at(work_ends, cmd.query_async::<Value>(&mut conn)).await {
                Err(_) => return Err(BackendError::Timeout),
                Ok(Err(e)) if errors::is_missing_error(&e) && !by_text => {}
                Ok(Err(e)) => return Err(cluster.secrets.scrub(errors::classify(&e))),
                Ok(Ok(value)) => return side_call::reply(Some(value)),
            }
        }
        Err(BackendError::failed("the node refused the script"))
    }

    /// PING goes to every master and the first answer counts: the cluster is reachable while
    /// any master answers. One failed or frozen master makes only its own buckets fail (the
    /// others answer normally, given `cluster-require-full-coverage no`); reporting NOT_SERVING
    /// for it would take every floodgate replica out of rotation at once, as all of them see
    /// the same cluster.
    async fn ping(&self) -> Result<(), BackendError> {
        let cluster = &self.0;
        let work_ends = Instant::now() + cluster.options.timeout;
        let mut conn = cluster.conn.clone();
        let any_master = RoutingInfo::MultiNode((
            MultipleNodeRoutingInfo::AllMasters,
            Some(ResponsePolicy::OneSucceeded),
        ));
        cluster
            .bounded(
                work_ends,
                conn.route_command(redis::cmd("PING"), any_master),
            )
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
