//! The gRPC accept loop, with the bounds that keep one client from exhausting the server:
//! a cap on open connections, a deadline for a new connection's TLS handshake and first call,
//! HTTP/2 stream and keepalive limits, and a maximum connection age after which the
//! connection is drained (GOAWAY) and, past a grace period, closed.
//!
//! At the cap, a newcomer is not refused while some open connection has never sent a call:
//! the oldest such connection is closed to make room. Sockets that send nothing (or finish a
//! TLS handshake and then stay silent) thus cannot lock clients out, neither for the first
//! call deadline nor at all. Failing that, the connection whose latest call is oldest, if it
//! has been idle for [`IDLE_BEFORE_EVICTION`], is drained (GOAWAY): connections that made a
//! call and went quiet would otherwise hold the cap until keepalive or their age closed them.
//! Connections in use are never closed for it.
//!
//! Connections come from TCP or, instead, from a unix socket (`unix`), with the same bounds.
//!
//! tonic's own server has most of these knobs, but its connection age with a grace period
//! closes the connection at age + grace without a GOAWAY at age, and it has no connection
//! cap; so connections are accepted here and each is served by hyper directly with the
//! tonic routes as its service.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::overload::{ConnectionId, ConnectionLoad, ReceiveStamp, Stamped};
use crate::tls::ReloadingAcceptor;
use resets::ResetWatch;

mod coalesce;
mod received;
mod resets;
mod unix;

pub use coalesce::Coalesced;
pub use received::TimestampedTcp;
pub use resets::ResetCounter;
pub use unix::{SOCKET_MODE, UnixSocketListener};

/// Default largest decoded gRPC message: far above any real rate-limit request (a few
/// hundred bytes), far below tonic's 4 MiB.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 1 << 20;
/// Default concurrent streams (calls) per HTTP/2 connection; clients open more connections
/// past it.
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 1024;
/// Default interval of HTTP/2 keepalive pings to idle clients.
pub const DEFAULT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(60);
/// Default time a keepalive ping may go unanswered before the connection is closed.
pub const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// Default connection age after which a GOAWAY is sent (the reference's default).
pub const DEFAULT_MAX_CONNECTION_AGE: Duration = Duration::from_secs(24 * 3600);
/// Default time in-flight calls get after the GOAWAY (the reference's default).
pub const DEFAULT_MAX_CONNECTION_AGE_GRACE: Duration = Duration::from_secs(3600);
/// Default cap on open gRPC connections.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// Default time a new connection gets to finish its TLS handshake and send its first call.
pub const DEFAULT_FIRST_CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest header block a client may send: gRPC metadata of a rate-limit call is small.
const MAX_HEADER_LIST_BYTES: u32 = 16 * 1024;
/// Streams a client may reset before they were taken, per allowed concurrent stream (see
/// `Connection::serve`).
const PENDING_RESETS_PER_STREAM: usize = 4;
/// Streams the connection may reset itself over its whole life, per allowed concurrent
/// stream (see `Connection::serve`).
const LOCAL_RESETS_PER_STREAM: usize = 64;
/// How long a connection must have gone without a call before it may be drained to make
/// room at the connection cap.
pub const IDLE_BEFORE_EVICTION: Duration = Duration::from_secs(1);
/// Time a connection drained to make room gets to finish what it has in flight.
const EVICTION_GRACE: Duration = Duration::from_secs(5);
/// Pause after a failed accept (e.g. out of file descriptors), so the loop does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);
/// Largest share of the age taken off at random, so connections opened together (by a
/// restart of every Envoy) do not all reconnect at once.
const AGE_JITTER_PERCENT: u32 = 10;

/// Limits of the gRPC listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcLimits {
    /// Largest decoded request message, in bytes.
    pub max_message_bytes: usize,
    /// Concurrent calls per connection.
    pub max_concurrent_streams: u32,
    /// Interval of HTTP/2 keepalive pings; None disables them.
    pub keepalive_interval: Option<Duration>,
    /// How long a keepalive ping may go unanswered.
    pub keepalive_timeout: Duration,
    /// Age after which a connection gets a GOAWAY; None keeps connections forever.
    pub max_connection_age: Option<Duration>,
    /// Time in-flight calls get after that GOAWAY before the connection is closed.
    pub max_connection_age_grace: Duration,
    /// Open connections at most; past it a connection that never sent a call makes room, or
    /// else one idle for [`IDLE_BEFORE_EVICTION`]; failing both, new connections are closed
    /// at once.
    pub max_connections: usize,
    /// Time a new connection gets to finish its TLS handshake and send its first call;
    /// None waits forever.
    pub first_call_timeout: Option<Duration>,
}

impl Default for GrpcLimits {
    fn default() -> Self {
        GrpcLimits {
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
            keepalive_interval: Some(DEFAULT_KEEPALIVE_INTERVAL),
            keepalive_timeout: DEFAULT_KEEPALIVE_TIMEOUT,
            max_connection_age: Some(DEFAULT_MAX_CONNECTION_AGE),
            max_connection_age_grace: DEFAULT_MAX_CONNECTION_AGE_GRACE,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            first_call_timeout: Some(DEFAULT_FIRST_CALL_TIMEOUT),
        }
    }
}

/// A source of gRPC connections: a TCP listener or a unix socket ([`UnixSocketListener`]).
pub trait Listen: Send + 'static {
    /// One accepted connection.
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    /// The next connection, with the peer described for the log.
    fn accept(&self) -> impl Future<Output = std::io::Result<(Self::Stream, String)>> + Send;

    /// Where `stream` keeps how long what it reads waited unread, if it knows.
    fn receive_stamp(_stream: &Self::Stream) -> Option<Arc<ReceiveStamp>> {
        None
    }
}

impl Listen for TcpListener {
    type Stream = TimestampedTcp;

    async fn accept(&self) -> std::io::Result<(TimestampedTcp, String)> {
        let (tcp, peer) = TcpListener::accept(self).await?;
        // Small unary calls: Nagle's delay would dominate their latency.
        let _ = tcp.set_nodelay(true);
        Ok((TimestampedTcp::new(tcp), peer.to_string()))
    }

    fn receive_stamp(stream: &TimestampedTcp) -> Option<Arc<ReceiveStamp>> {
        Some(stream.stamp())
    }
}

/// Serves `routes` on connections from `listener` until `stop` turns true; then stops
/// accepting, sends every connection a GOAWAY and returns once all have closed. Dropping
/// the future closes every connection at once.
pub async fn serve<L: Listen>(
    listener: L,
    routes: tonic::service::Routes,
    tls: Option<Arc<ReloadingAcceptor>>,
    limits: GrpcLimits,
    resets: ResetCounter,
    stop: watch::Receiver<bool>,
) {
    let mut stopping = stop.clone();
    let limits = Arc::new(limits);
    let mut connections = JoinSet::new();
    let registry = Arc::new(Registry::default());
    let mut refusing = false;
    loop {
        tokio::select! {
            () = stopped(&mut stopping) => break,
            Some(_) = connections.join_next() => {}
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        tracing::warn!("gRPC accept failed: {error}");
                        tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                        continue;
                    }
                };
                if connections.len() >= limits.max_connections && !registry.evict_one() {
                    if !refusing {
                        tracing::warn!(
                            max = limits.max_connections,
                            "gRPC connection limit reached: closing new connections"
                        );
                    }
                    refusing = true;
                    drop(stream);
                    continue;
                }
                refusing = false;
                let registered = registry.register(L::receive_stamp(&stream));
                let connection = Connection {
                    routes: routes.clone(),
                    limits: Arc::clone(&limits),
                    resets: resets.clone(),
                    stop: stop.clone(),
                    load: Arc::clone(&registered.entry.load),
                    evicted: Arc::clone(&registered.entry.evict),
                    first_call_by: limits.first_call_timeout.map(|t| Instant::now() + t),
                };
                let tls = tls.as_ref().map(|tls| tls.acceptor());
                connections.spawn(async move {
                    // Leaves the registry whichever way the connection ends.
                    let _registered = registered;
                    match tls {
                        None => connection.serve(stream).await,
                        Some(acceptor) => {
                            let handshake = acceptor.accept(stream);
                            let stream = tokio::select! {
                                done = handshake => done,
                                () = connection.told_to_close() => {
                                    tracing::debug!(%peer, "gRPC TLS handshake timed out");
                                    return;
                                }
                            };
                            match stream {
                                Ok(stream) => connection.serve(stream).await,
                                Err(error) => {
                                    tracing::debug!(%peer, "gRPC TLS handshake failed: {error}");
                                }
                            }
                        }
                    }
                });
            }
        }
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
}

/// The open connections, so that at the cap one that never sent a call, or else the one idle
/// longest, can make room.
#[derive(Default)]
struct Registry {
    entries: parking_lot::Mutex<HashMap<ConnectionId, Entry>>,
}

/// One open connection: its load, and how the registry tells it to close.
#[derive(Clone)]
struct Entry {
    load: Arc<ConnectionLoad>,
    evict: Arc<Notify>,
}

/// A connection's place in the registry, held by its task: dropped when the connection
/// ends, which removes it.
struct Registration {
    registry: Arc<Registry>,
    id: ConnectionId,
    entry: Entry,
}

impl Registry {
    fn register(self: &Arc<Registry>, received: Option<Arc<ReceiveStamp>>) -> Registration {
        let entry = Entry {
            load: Arc::new(ConnectionLoad::receiving(received)),
            evict: Arc::default(),
        };
        let id = entry.load.id();
        self.entries.lock().insert(id, entry.clone());
        Registration {
            registry: Arc::clone(self),
            id,
            entry,
        }
    }

    /// Closes a connection to make room at the cap, if one may go: the oldest that never
    /// sent a call, else the one whose latest call is oldest, once that is over
    /// [`IDLE_BEFORE_EVICTION`] ago (it gets a GOAWAY; its client reconnects when it next
    /// calls). Connections in use are never closed for it, nor one whose quota stream
    /// reported within two of its intervals (`ConnectionLoad::reporting`).
    fn evict_one(&self) -> bool {
        let mut entries = self.entries.lock();
        let now = Instant::now();
        let silent = entries
            .iter()
            .filter(|(_, entry)| entry.load.calls() == 0)
            .map(|(&id, _)| id)
            .min();
        let idle_since = now.checked_sub(IDLE_BEFORE_EVICTION);
        let idle = || {
            entries
                .iter()
                .filter(|(_, entry)| !entry.load.is_reporting(now))
                .filter_map(|(&id, entry)| Some((entry.load.latest_call()?, id)))
                .filter(|&(latest, _)| idle_since.is_some_and(|since| latest <= since))
                .min()
                .map(|(_, id)| id)
        };
        let Some(entry) = silent.or_else(idle).and_then(|id| entries.remove(&id)) else {
            return false;
        };
        entry.evict.notify_one();
        tracing::debug!(
            calls = entry.load.calls(),
            "gRPC connection limit reached: closing an unused connection"
        );
        true
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.registry.entries.lock().remove(&self.id);
    }
}

/// What one connection needs.
struct Connection {
    routes: tonic::service::Routes,
    limits: Arc<GrpcLimits>,
    resets: ResetCounter,
    stop: watch::Receiver<bool>,
    load: Arc<ConnectionLoad>,
    /// Notified when the connection is closed to make room (see `Registry::evict_one`).
    evicted: Arc<Notify>,
    /// When it must have sent its first call (`GrpcLimits::first_call_timeout`).
    first_call_by: Option<Instant>,
}

impl Connection {
    /// Resolves once the connection must close: evicted at the cap, or past its first call
    /// deadline without a call.
    fn told_to_close(&self) -> impl Future<Output = ()> + use<> {
        let (load, evicted, first_call_by) = (
            Arc::clone(&self.load),
            Arc::clone(&self.evicted),
            self.first_call_by,
        );
        async move {
            let deadline = async {
                match first_call_by {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
                if load.calls() > 0 {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                () = deadline => {}
                () = evicted.notified() => {}
            }
        }
    }

    async fn serve<IO>(mut self, io: IO)
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let limits = &self.limits;
        let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .max_concurrent_streams(limits.max_concurrent_streams)
            .keep_alive_interval(limits.keepalive_interval)
            .keep_alive_timeout(limits.keepalive_timeout)
            .max_header_list_size(MAX_HEADER_LIST_BYTES)
            // A caller that gives up resets its stream. Under overload many do so before
            // the starved connection task has taken the stream, and h2's default (20 such
            // resets, or 1024 through hyper) then closes the whole connection as a "rapid
            // reset" attack with ENHANCE_YOUR_CALM, failing every call on it: clients saw
            // RESOURCE_EXHAUSTED and UNKNOWN. A few times the stream limit stays bounded.
            .max_pending_accept_reset_streams(Some(
                limits.max_concurrent_streams as usize * PENDING_RESETS_PER_STREAM,
            ))
            // h2 also counts, over the connection's whole life, the streams it resets on its
            // own: one the caller opened past the stream limit (the caller has reset a stream
            // whose reset the starved connection task has not read yet, so it counts one
            // stream less than h2 does), and DATA that arrives for a stream reset too long ago
            // to be remembered. Under overload both come by thousands a second, and past its
            // default of 1,024 h2 closed the connection with ENHANCE_YOUR_CALM, failing every
            // call on it (RESOURCE_EXHAUSTED at the caller). It stays bounded: each such reset
            // waits in a queue until the peer reads it, so without a bound a peer that never
            // reads could grow that queue without end.
            .max_local_error_reset_streams(Some(
                limits.max_concurrent_streams as usize * LOCAL_RESETS_PER_STREAM,
            ));
        let service =
            TowerToHyperService::new(Stamped::new(self.routes.clone(), Arc::clone(&self.load)));
        let connection = builder.serve_connection(
            TokioIo::new(ResetWatch::new(Coalesced::new(io), self.resets.clone())),
            service,
        );
        tokio::pin!(connection);
        let age = limits.max_connection_age.map(jittered);
        let aged = sleep_or_never(age);
        tokio::pin!(aged);
        let closing = sleep_or_never(None);
        tokio::pin!(closing);
        let told_to_close = self.told_to_close();
        tokio::pin!(told_to_close);
        let mut draining = false;
        loop {
            tokio::select! {
                () = &mut told_to_close, if !draining => {
                    if self.load.calls() == 0 {
                        tracing::debug!("gRPC connection sent no call in time: closing it");
                        return;
                    }
                    // Idle, evicted at the cap: a GOAWAY, so that its client reconnects
                    // rather than sees a call fail.
                    draining = true;
                    connection.as_mut().graceful_shutdown();
                    closing.set(sleep_or_never(Some(EVICTION_GRACE)));
                }
                result = &mut connection => {
                    if let Err(error) = result {
                        // hyper's own text is only "http2 error"; the cause is its source.
                        let cause = std::error::Error::source(&error)
                            .map_or_else(String::new, |source| format!(": {source}"));
                        tracing::debug!("gRPC connection ended: {error}{cause}");
                    }
                    return;
                }
                () = &mut aged, if !draining => {
                    draining = true;
                    connection.as_mut().graceful_shutdown();
                    closing.set(sleep_or_never(Some(limits.max_connection_age_grace)));
                }
                () = stopped(&mut self.stop), if !draining => {
                    // The server's drain timeout bounds this one.
                    draining = true;
                    connection.as_mut().graceful_shutdown();
                }
                () = &mut closing => {
                    tracing::debug!("gRPC connection past its age grace: closing it");
                    return;
                }
            }
        }
    }
}

/// Returns once the server is stopping (without holding the channel's lock after).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// Sleeps for `duration`, or forever when None.
async fn sleep_or_never(duration: Option<Duration>) {
    match duration {
        Some(duration) => tokio::time::sleep(duration).await,
        None => std::future::pending().await,
    }
}

/// `age` shortened by up to `AGE_JITTER_PERCENT`, at random: connections opened together
/// reconnect spread out, and never past the configured age.
fn jittered(age: Duration) -> Duration {
    let per_mille: u32 = rand::random_range(0..=AGE_JITTER_PERCENT * 10);
    age - age * per_mille / 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_only_shortens_and_by_at_most_a_tenth() {
        let age = Duration::from_secs(1000);
        for _ in 0..100 {
            let got = jittered(age);
            assert!(got <= age && got >= Duration::from_secs(900), "{got:?}");
        }
    }
}
