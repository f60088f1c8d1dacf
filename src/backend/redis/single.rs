//! One Redis node through a bb8 pool of multiplexed connections.
//!
//! Requests bound for the node queue for a batcher (`super::batch`) that sends each batch as
//! one script call on a pooled connection. A pooled connection is cloned and handed back at
//! once instead of being held for the call, so any number of calls share the pool's few
//! sockets concurrently and the pool size is simply the number of sockets to Redis.
//!
//! Every call is bounded by `RedisOptions::timeout`. bb8-redis's own connection manager never
//! reports a connection as broken (only a PING per checkout would notice, doubling the round
//! trips), so this module has its own: a connection that failed at the transport level or
//! timed out is flagged and replaced on its next checkout. After an outage the backend thus
//! reconnects by itself; the calls that were on a dead connection fail and are not retried,
//! because a script whose reply was lost may have run.

use std::fmt;
use std::sync::Arc;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bb8_redis::bb8;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ErrorKind, RedisError, Value};
use tokio::time::{Instant, timeout_at};

use super::RedisOptions;
use super::batch::{self, Lane, Runner};
use super::calls::{self, Call, GroupWords};
use super::errors;
use super::scripts::{ScriptSet, Scripting, Via};
use super::sentinel::{Master, SentinelSettings};
use crate::backend::{Backend, BackendError, Group, Outcome, Refund, SideCall, side_call};
use crate::redact::{Redacted, Secrets};

/// How long a connection may deliver no reply at all, while its calls time out, before it
/// is retired as stalled (a slow command alone never retires it).
const STALLED_AFTER: Duration = Duration::from_secs(2);

/// A pooled connection and how it has been doing.
struct Link {
    conn: MultiplexedConnection,
    health: Arc<LinkHealth>,
    /// The Sentinel epoch it was made under (always 0 for a fixed node).
    epoch: u64,
}

/// Whether a connection failed, and when it last answered.
#[derive(Default)]
struct LinkHealth {
    broken: AtomicBool,
    /// When the connection last delivered a reply, in ms since `EPOCH`.
    answered_ms: AtomicU64,
}

/// The clock `LinkHealth` counts from.
#[allow(
    clippy::disallowed_methods,
    reason = "a stalled socket is judged on real time; a static epoch cannot follow the paused \
              clock of one test runtime"
)]
static EPOCH: LazyLock<std::time::Instant> = LazyLock::new(std::time::Instant::now);

fn since_epoch_ms() -> u64 {
    EPOCH.elapsed().as_millis() as u64
}

impl LinkHealth {
    fn answered(&self) {
        self.answered_ms.store(since_epoch_ms(), Ordering::Relaxed);
    }

    /// A slow reply fails only its own call: the connection is retired only when it has
    /// delivered nothing for `STALLED_AFTER` (a stalled socket, not a slow command).
    fn timed_out(&self) {
        let silent = since_epoch_ms().saturating_sub(self.answered_ms.load(Ordering::Relaxed));
        if silent >= STALLED_AFTER.as_millis() as u64 {
            self.broken.store(true, Ordering::Relaxed);
        }
    }

    fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Relaxed)
    }
}

/// Where the pool's connections go.
enum Target {
    /// One fixed node.
    Node(redis::Client),
    /// Whichever node the sentinels name master when a connection is made.
    Sentinel(Master),
}

impl Target {
    /// Whether a connection made under `epoch` may still point at the master.
    fn is_current(&self, epoch: u64) -> bool {
        match self {
            Target::Node(_) => true,
            Target::Sentinel(master) => master.epoch() == epoch,
        }
    }
}

/// Opens multiplexed connections and tells bb8 which ones failed.
struct LinkManager {
    target: Target,
    config: AsyncConnectionConfig,
    /// Why the latest connect failed (cleared by a success): bb8 only reports a timeout to
    /// a caller waiting for a connection, and "refused" or "authentication failed" is what
    /// an operator needs to read.
    last_error: Arc<parking_lot::Mutex<Option<RedisError>>>,
}

impl bb8::ManageConnection for LinkManager {
    type Connection = Link;
    type Error = RedisError;

    async fn connect(&self) -> Result<Link, RedisError> {
        let (result, epoch) = match &self.target {
            Target::Node(client) => (
                client
                    .get_multiplexed_async_connection_with_config(&self.config)
                    .await,
                0,
            ),
            Target::Sentinel(master) => {
                let epoch = master.epoch();
                let result = match master.client().await {
                    Ok(client) => {
                        client
                            .get_multiplexed_async_connection_with_config(&self.config)
                            .await
                    }
                    Err(e) => Err(e),
                };
                (result, epoch)
            }
        };
        *self.last_error.lock() = result.as_ref().err().cloned();
        let health = Arc::new(LinkHealth::default());
        health.answered();
        Ok(Link {
            conn: result?,
            health,
            epoch,
        })
    }

    // The flag, not a PING: a checkout costs no round trip.
    async fn is_valid(&self, link: &mut Link) -> Result<(), RedisError> {
        if self.has_broken(link) {
            return Err(RedisError::from((
                ErrorKind::Io,
                "connection failed earlier",
            )));
        }
        Ok(())
    }

    fn has_broken(&self, link: &mut Link) -> bool {
        link.health.is_broken() || !self.target.is_current(link.epoch)
    }
}

/// Logs failed background connects; the URL is never part of a `RedisError`'s text, and the
/// message is scrubbed all the same.
#[derive(Debug, Clone)]
struct ConnectErrorLog(Secrets);

impl bb8::ErrorSink<RedisError> for ConnectErrorLog {
    fn sink(&self, error: RedisError) {
        let error = self.0.scrub(errors::classify(&error));
        tracing::debug!(%error, "redis connect failed");
    }

    fn boxed_clone(&self) -> Box<dyn bb8::ErrorSink<RedisError>> {
        Box::new(self.clone())
    }
}

/// A connection borrowed for one call; marks the pooled connection broken on failure.
struct Borrowed {
    conn: MultiplexedConnection,
    health: Arc<LinkHealth>,
}

impl Borrowed {
    /// Runs `pipe` until `work_ends`. Transport errors retire the connection; a timeout
    /// fails this call only, unless the connection has gone silent (see `LinkHealth`).
    async fn query(
        &mut self,
        pipe: &redis::Pipeline,
        work_ends: Instant,
    ) -> Result<Vec<Value>, BackendError> {
        match timeout_at(work_ends, pipe.query_async::<Vec<Value>>(&mut self.conn)).await {
            Err(_) => {
                self.health.timed_out();
                Err(BackendError::Timeout)
            }
            Ok(Err(e)) => {
                if e.is_io_error() || e.is_unrecoverable_error() || is_readonly(&e) {
                    self.health.broken.store(true, Ordering::Relaxed);
                }
                Err(errors::classify(&e))
            }
            Ok(Ok(values)) => {
                self.health.answered();
                // A demoted master answers writes with READONLY: the next connection asks
                // the sentinels again (for a fixed node it is the same node, harmlessly).
                if values.iter().any(|value| match value {
                    Value::ServerError(error) => error.code() == "READONLY",
                    _ => false,
                }) {
                    self.health.broken.store(true, Ordering::Relaxed);
                }
                Ok(values)
            }
        }
    }
}

/// Whether `error` is a demoted master's refusal to write.
fn is_readonly(error: &RedisError) -> bool {
    error.code() == Some("READONLY")
}

/// Rate limits in one Redis node (docs/backends.md#redis), fixed or found through Redis
/// Sentinel.
pub struct RedisBackend {
    /// `redis`, or `redis-sentinel` when Sentinel names the node.
    name: &'static str,
    node: Arc<Node>,
    /// Requests waiting for the batcher (see `super::batch`).
    lane: Lane,
}

/// The connection pool and what every call to the node needs.
struct Node {
    pool: bb8::Pool<LinkManager>,
    last_connect_error: Arc<parking_lot::Mutex<Option<RedisError>>>,
    scripts: ScriptSet,
    /// `Functions` or `Evalsha`: what `options.scripting` came to on this node.
    scripting: Scripting,
    options: RedisOptions,
    secrets: Secrets,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("url", &Redacted)
            .field("options", &self.node.options)
            .finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// Connects to the node at `url` (`redis://[user:password@]host:port[/db]`, or `rediss://`
    /// for TLS), then loads the function library or the scripts (`options.scripting`); each
    /// step is bounded by `options.timeout`. The pool
    /// then keeps `options.pool_size` sockets open and replaces failed ones on its own.
    ///
    /// # Errors
    /// `Config` for an invalid URL or options; `Failed` for a refused login or a server
    /// error; `Unavailable` or `Timeout` when the node cannot be reached; `Failed` when
    /// `Scripting::Functions` is asked for and the node cannot load the library. No message
    /// contains the URL or the password.
    pub async fn connect(url: &str, options: RedisOptions) -> Result<RedisBackend, BackendError> {
        RedisBackend::connect_with_scripts(url, options, ScriptSet::new()).await
    }

    /// `connect` with the given scripts: tests pass a pinned set (`ScriptSet::pinned`).
    #[doc(hidden)]
    pub async fn connect_with_scripts(
        url: &str,
        options: RedisOptions,
        scripts: ScriptSet,
    ) -> Result<RedisBackend, BackendError> {
        options.validate()?;
        let secrets = Secrets::of(&[url]);
        let client = match options.tls_for(url) {
            Some(certs) => redis::Client::build_with_tls(url, certs),
            None => redis::Client::open(url),
        };
        let client = client
            .map_err(|e| secrets.scrub(BackendError::Config(format!("invalid Redis URL: {e}"))))?;
        RedisBackend::start("redis", Target::Node(client), options, scripts, secrets).await
    }

    /// Connects to the master that the sentinels of `settings` name, as `connect` does to a
    /// fixed node; afterwards every new connection asks them again (see `super::sentinel`).
    ///
    /// # Errors
    /// As for `connect`; `Unavailable` also when no sentinel names a reachable master.
    pub async fn connect_sentinel(
        settings: &SentinelSettings,
        options: RedisOptions,
    ) -> Result<RedisBackend, BackendError> {
        options.validate()?;
        let master = Master::new(settings, &options)?;
        let target = Target::Sentinel(master);
        let secrets = settings.secrets();
        RedisBackend::start("redis-sentinel", target, options, ScriptSet::new(), secrets).await
    }

    /// Opens the first connection to `target` (so a refused login or port is reported as
    /// such), then starts the pool and the batcher.
    async fn start(
        name: &'static str,
        target: Target,
        options: RedisOptions,
        scripts: ScriptSet,
        secrets: Secrets,
    ) -> Result<RedisBackend, BackendError> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(options.timeout))
            .set_response_timeout(None);
        let manager = LinkManager {
            target,
            config,
            last_error: Arc::default(),
        };
        let last_connect_error = manager.last_error.clone();
        let builder = bb8::Pool::builder()
            .max_size(options.pool_size)
            // Every socket stays open: calls spread over all of them (FIFO checkout).
            .min_idle(Some(options.pool_size))
            .test_on_check_out(true)
            // A caller never waits longer than its own budget for a connection, and a
            // failed connect is not retried in the background: the next call triggers one.
            .connection_timeout(options.timeout)
            .retry_connection(false)
            .error_sink(Box::new(ConnectErrorLog(secrets.clone())));
        // Every socket is open before the backend is returned (and so before SERVING): the
        // first calls do not wait for a connect. A wrong password, a certificate problem or
        // a refused port is reported as such instead of as a timeout.
        let pool = match timeout_at(Instant::now() + options.timeout, builder.build(manager)).await
        {
            Ok(Ok(pool)) => pool,
            Ok(Err(e)) => return Err(secrets.scrub(errors::classify(&e))),
            Err(_) => return Err(BackendError::Timeout),
        };
        let mut node = Node {
            pool,
            last_connect_error,
            scripts,
            scripting: options.scripting,
            options,
            secrets,
        };
        node.scripting = node.preload().await?;
        let node = Arc::new(node);
        let lane = Lane::start(Arc::clone(&node), batch::CALLS_IN_FLIGHT_ALONE);
        Ok(RedisBackend { name, node, lane })
    }
}

impl Node {
    /// Loads the function library, or the scripts, so that the first calls need no reload,
    /// and settles `Scripting::Auto`: the library when the node takes it, else scripts.
    ///
    /// Loading the scripts is best effort: a failure (say, an ACL that allows `EVALSHA` but
    /// not `SCRIPT`) only costs the `EVAL` fallback. The library is required only when
    /// `Scripting::Functions` is asked for.
    async fn preload(&self) -> Result<Scripting, BackendError> {
        super::settle_scripting(self.options.scripting, |scripting| {
            Box::pin(self.load(scripting))
        })
        .await
    }

    /// Sends what makes the calls of `scripting` known to the node.
    async fn load(&self, scripting: Scripting) -> Result<(), BackendError> {
        let mut pipe = redis::pipe();
        for cmd in self.scripts.load_commands(scripting) {
            pipe.add_command(cmd);
        }
        let work_ends = Instant::now() + self.options.timeout;
        let mut conn = self.borrow(work_ends).await?;
        conn.query(&pipe, work_ends)
            .await
            .map(|_| ())
            .map_err(|e| self.secrets.scrub(e))
    }

    /// A connection for one call. If none is ready by `work_ends`, the error says why the
    /// latest connect failed when one did, else `Unavailable`.
    async fn borrow(&self, work_ends: Instant) -> Result<Borrowed, BackendError> {
        let error = match timeout_at(work_ends, self.pool.get()).await {
            Ok(Ok(link)) => {
                return Ok(Borrowed {
                    conn: link.conn.clone(),
                    health: Arc::clone(&link.health),
                });
            }
            Ok(Err(bb8::RunError::User(e))) => errors::classify(&e),
            Ok(Err(bb8::RunError::TimedOut)) | Err(_) => match &*self.last_connect_error.lock() {
                Some(e) => errors::classify(e),
                None => BackendError::Unavailable(
                    "no Redis connection available within the timeout".into(),
                ),
            },
        };
        Err(self.secrets.scrub(error))
    }

    /// Runs `calls` as one pipeline and returns one reply per call, in order. Calls that hit
    /// `NOSCRIPT` or `Function not found` did not run; they go again in a second pipeline,
    /// as `EVAL` or after the library's load.
    async fn run(&self, calls: &[Call]) -> Result<Vec<Value>, BackendError> {
        let work_ends = Instant::now() + self.options.timeout;
        let mut conn = self.borrow(work_ends).await?;
        let first = self.scripting.first();
        let mut values = self
            .pipeline(&mut conn, None, calls.iter(), first, work_ends)
            .await?;
        let missing: Vec<usize> = (0..values.len())
            .filter(|&i| errors::is_missing(&values[i]))
            .collect();
        if !missing.is_empty() {
            let (load, via) = self.scripting.again(&self.scripts);
            let retried = self
                .pipeline(
                    &mut conn,
                    load,
                    missing.iter().map(|&i| &calls[i]),
                    via,
                    work_ends,
                )
                .await?;
            for (i, value) in missing.into_iter().zip(retried) {
                values[i] = value;
            }
        }
        Ok(values)
    }

    /// Runs `calls` as one pipeline, after `load` when given (its reply is dropped: a call
    /// that still misses its function says so itself).
    async fn pipeline<'a>(
        &self,
        conn: &mut Borrowed,
        load: Option<redis::Cmd>,
        calls: impl Iterator<Item = &'a Call>,
        via: Via,
        work_ends: Instant,
    ) -> Result<Vec<Value>, BackendError> {
        let mut pipe = redis::pipe();
        // Server errors come back per command instead of failing the whole pipeline, so a
        // NOSCRIPT can be retried alone.
        pipe.ignore_errors();
        let loads = usize::from(load.is_some());
        if let Some(load) = load {
            pipe.add_command(load);
        }
        let mut expected = 0;
        for call in calls {
            pipe.add_command(call.command(&self.scripts, via));
            expected += 1;
        }
        let mut values = conn
            .query(&pipe, work_ends)
            .await
            .map_err(|e| self.secrets.scrub(e))?;
        values.drain(..loads.min(values.len()));
        if values.len() != expected {
            return Err(BackendError::failed(format!(
                "pipeline returned {} replies for {expected} calls",
                values.len()
            )));
        }
        Ok(values)
    }
}

/// The single node's batch calls, beside `Node::run` (the calls of refunds).
impl Runner for Node {
    /// Runs one batch call until `work_ends`; a node that does not know the script or the
    /// function (flushed, restarted, promoted) gets it again, as `EVAL` or after the
    /// library's load in the same round trip: the first call did not run.
    async fn run_batch(
        &self,
        groups: &[&GroupWords],
        work_ends: Instant,
    ) -> Result<Vec<Option<Outcome>>, BackendError> {
        let mut conn = self.borrow(work_ends).await?;
        let mut reply = Value::Nil;
        for retry in [false, true] {
            let (load, via) = match retry {
                false => (None, self.scripting.first()),
                true => self.scripting.again(&self.scripts),
            };
            let mut pipe = redis::pipe();
            // The server's error comes back as the reply, so a missing script can be told
            // apart.
            pipe.ignore_errors();
            if let Some(load) = load {
                pipe.add_command(load);
            }
            let prefix = &self.options.key_prefix;
            pipe.add_command(GroupWords::command(groups, prefix, &self.scripts, via));
            let mut values = conn
                .query(&pipe, work_ends)
                .await
                .map_err(|e| self.secrets.scrub(e))?;
            reply = values.pop().unwrap_or(Value::Nil);
            if !errors::is_missing(&reply) {
                break;
            }
        }
        let items = groups.iter().map(|group| group.len()).sum();
        calls::batch_outcomes(reply, items).map_err(|e| self.secrets.scrub(e))
    }
}

#[async_trait]
impl Backend for RedisBackend {
    /// Joins the next batch script call (see `batch`): the whole group in one atomic step.
    async fn decide(&self, group: &Group) -> Result<Vec<Outcome>, BackendError> {
        if group.items.is_empty() {
            return Ok(Vec::new());
        }
        let work_ends = group.work_ends_within(self.node.options.timeout);
        let (caller, connection) = (group.deadline, group.connection);
        let group = GroupWords::new(group);
        self.lane
            .decide(group, work_ends, caller, connection)
            .await?
            .ok_or_else(|| {
                BackendError::failed(
                    "a charge of this request failed in Redis (a key of another type?)",
                )
            })
    }

    async fn refund(&self, refunds: &[Refund]) -> Result<(), BackendError> {
        if refunds.is_empty() {
            return Ok(());
        }
        let node = &self.node;
        let prefix = &node.options.key_prefix;
        let calls: Vec<Call> = refunds.iter().map(|r| Call::refund(r, prefix)).collect();
        for value in node.run(&calls).await? {
            calls::refunded(value).map_err(|e| node.secrets.scrub(e))?;
        }
        Ok(())
    }

    /// On a pooled connection, bounded by the backend's timeout.
    async fn side_call(&self, call: &SideCall) -> Result<Value, BackendError> {
        let node = &self.node;
        let work_ends = Instant::now() + node.options.timeout;
        let mut conn = node.borrow(work_ends).await?;
        let mut last = None;
        for by_text in [false, true] {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            pipe.add_command(call.command(&node.options.key_prefix, by_text));
            let mut values = conn
                .query(&pipe, work_ends)
                .await
                .map_err(|e| node.secrets.scrub(e))?;
            last = values.pop();
            if !last.as_ref().is_some_and(errors::is_missing) {
                break;
            }
        }
        side_call::reply(last).map_err(|e| node.secrets.scrub(e))
    }

    async fn ping(&self) -> Result<(), BackendError> {
        let node = &self.node;
        let work_ends = Instant::now() + node.options.timeout;
        let mut conn = node.borrow(work_ends).await?;
        let mut pipe = redis::pipe();
        pipe.add_command(redis::cmd("PING"));
        conn.query(&pipe, work_ends)
            .await
            .map_err(|e| node.secrets.scrub(e))?;
        Ok(())
    }

    fn name(&self) -> &'static str {
        self.name
    }

    fn queue_wait(&self, items: usize) -> std::time::Duration {
        self.lane.wait(items)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::redis::RedisOptions;

    #[tokio::test]
    async fn invalid_url_is_reported_without_the_url() {
        let err = RedisBackend::connect("nonsense://pw@host", RedisOptions::default())
            .await
            .unwrap_err();
        assert!(matches!(err, BackendError::Config(_)));
        assert!(!err.to_string().contains("pw@host"), "{err}");
    }
}
