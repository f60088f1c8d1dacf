//! Redis Cluster through redis-rs' async cluster client.
//!
//! The client keeps one multiplexed connection per node, follows `MOVED`/`ASK`, retries
//! `TRYAGAIN`/`CLUSTERDOWN` and refreshes the slot map after a failover. The charges of one
//! request may live in different slots, so they run concurrently (one script call each,
//! pipelined per node by the multiplexed connections) under one deadline.
//! `RedisOptions::pool_size` does not apply here.
//!
//! Unlike the single-node backend, the client itself retries a command whose connection
//! broke (up to `CLIENT_RETRIES`, within the call's timeout): if the script had already run
//! on a node that then died, that one booking may count twice. It is the price of riding
//! through failovers without failing every call in flight.
//!
//! One failed master fails only its own buckets provided the cluster runs with
//! `cluster-require-full-coverage no`: with Redis' default every node answers `CLUSTERDOWN`
//! for every key until the failed master's replica is promoted, which no client can avoid.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use futures::future::join_all;
use redis::Value;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, ResponsePolicy, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use tokio::time::{Instant, timeout_at};

use super::calls::{self, Call};
use super::errors;
use super::scripts::{ScriptSet, Scripting};
use super::{RedisOptions, config_error};
use crate::backend::{Backend, BackendError, Group, Outcome, Refund, undoable};
use crate::redact::{Redacted, Secrets};

/// Retries of one command inside the client (redirects, `TRYAGAIN`, reconnects); the call's
/// timeout bounds them all the same.
const CLIENT_RETRIES: u32 = 3;
/// Shortest wait before such a retry, in ms (the client's default of 1.28 s exceeds any
/// sensible backend timeout).
const MIN_RETRY_WAIT_MS: u64 = 10;

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
        };
        backend.scripting = backend.preload().await?;
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
        match timeout_at(deadline, first.query_async::<Value>(&mut conn)).await {
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
                self.bounded(deadline, again.query_async::<Value>(&mut conn))
                    .await
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

    /// Runs [`Cluster::charge_and_settle`] in a task of its own, so that its undo happens
    /// whatever becomes of the caller: a caller dropped at its deadline while the charges are
    /// out (and answered by the failure mode) leaves nothing booked either, unless
    /// `keep_on_failure` admits it.
    async fn decide(self: &Arc<Self>, group: &Group) -> Result<Vec<Outcome>, BackendError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let cluster = Arc::clone(self);
        let group = group.clone();
        tokio::spawn(async move {
            let (result, kept) = cluster.charge_and_settle(&group).await;
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

    /// Charges every item concurrently (its buckets live in different slots), then undoes
    /// the undoable bookings of a rejected request, or of a failed one unless
    /// `keep_on_failure`. Also returns the refunds of the bookings that stand, should the
    /// caller be gone.
    async fn charge_and_settle(
        self: &Arc<Self>,
        group: &Group,
    ) -> (Result<Vec<Outcome>, BackendError>, Vec<Refund>) {
        let prefix = &self.options.key_prefix;
        let deadline = Instant::now() + self.options.timeout;
        let results = join_all(group.items.iter().map(|item| async move {
            let value = self
                .run(&Call::charge(&item.charge, prefix), deadline)
                .await?;
            calls::outcome(value).map_err(|e| self.secrets.scrub(e))
        }))
        .await;
        let failure = results.iter().find_map(|r| r.as_ref().err()).cloned();
        let undo_all = match &failure {
            Some(_) => !group.keep_on_failure,
            None => {
                let outcomes: Vec<Outcome> = results.iter().flatten().copied().collect();
                group.rejects(&outcomes)
            }
        };
        let mut outcomes = Vec::with_capacity(results.len());
        let (mut undo, mut kept) = (Vec::new(), Vec::new());
        for (item, result) in group.items.iter().zip(results) {
            let Ok(mut outcome) = result else { continue };
            if undoable(item, &outcome) {
                let refund = Refund::new(
                    item.charge.bucket,
                    item.charge.policy,
                    item.charge.cost,
                    outcome.now_ms,
                );
                if undo_all {
                    undo.push(refund);
                    outcome.booked = false;
                    outcome.rolled_back = true;
                } else {
                    kept.push(refund);
                }
            }
            outcomes.push(outcome);
        }
        if !undo.is_empty() {
            self.undo(undo).await;
        }
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
            tracing::warn!(%error, "refund failed; a rejected request's bookings stand");
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
}
