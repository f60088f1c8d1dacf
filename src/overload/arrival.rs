//! When a call arrived: the stamp its connection puts on each request ([`Stamped`]), with
//! how long the connection's latest bytes waited unread in the kernel ([`ReceiveStamp`],
//! kept by `listener::TimestampedTcp`), and the load of that connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;
use tonic::codegen::{Service, http};

/// Longest wait believed: a larger one means the wall clock stepped between the kernel's
/// stamp and the read, and says nothing about the call.
const LONGEST_WAIT: Duration = Duration::from_secs(10);

/// When the bytes of a connection's latest read reached the host (the kernel's receive stamp,
/// `listener::TimestampedTcp`), shared by the connection's reads and its calls.
#[derive(Debug, Default)]
pub struct ReceiveStamp {
    /// Nanoseconds since the Unix epoch (the kernel stamps with the wall clock); 0 = unknown.
    latest_read_ns: AtomicU64,
}

impl ReceiveStamp {
    /// How long the bytes of the latest read had waited before `now` (wall clock), or `None`
    /// when no stamp is known. The clock is read only when a stamp is known, so a
    /// connection without stamps costs its calls no clock read.
    pub fn waited(&self, now: impl FnOnce() -> SystemTime) -> Option<Duration> {
        let stamped = self.latest_read_ns.load(Ordering::Relaxed);
        if stamped == 0 {
            return None;
        }
        let now = u64::try_from(
            now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .ok()?
                .as_nanos(),
        )
        .unwrap_or(u64::MAX);
        let waited = Duration::from_nanos(now.saturating_sub(stamped));
        (waited <= LONGEST_WAIT).then_some(waited)
    }

    /// Records a read whose newest bytes arrived `since_epoch` after the Unix epoch, or that
    /// came without a stamp (`None`): the kernel turns stamping on for the whole host a
    /// moment after a socket asks, so the first packets can come unstamped, and an earlier
    /// read's stamp would then make every later call look ever older.
    pub fn stamp(&self, since_epoch: Option<Duration>) {
        let nanos = since_epoch.map_or(0, |since_epoch| {
            u64::try_from(since_epoch.as_nanos()).unwrap_or(u64::MAX)
        });
        self.latest_read_ns.store(nanos, Ordering::Relaxed);
    }
}

/// Stamped on every gRPC request by the connection that took it ([`Stamped`]): when the
/// stream arrived and the load of its connection.
#[derive(Clone)]
pub struct Arrival {
    /// When the connection handed the stream to the service.
    pub at: Instant,
    /// How long the bytes the connection read last had waited in the kernel before it read
    /// them; `None` where the kernel does not say (unix sockets).
    pub unread: Option<Duration>,
    /// Descriptors in flight on the stream's connection.
    pub connection: Arc<ConnectionLoad>,
}

impl Arrival {
    /// When the call reached this host, as far as known: `at`, less its wait unread.
    pub fn received(&self) -> Instant {
        self.unread
            .and_then(|unread| self.at.checked_sub(unread))
            .unwrap_or(self.at)
    }
}

/// Names one connection for as long as the process runs: the listener's registry keys its
/// connections by it (a later connection has a greater one), and a backend's queue serves
/// connections in turn by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnectionId(u64);

impl ConnectionId {
    /// A name no other connection of this process has had.
    fn next() -> ConnectionId {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        ConnectionId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// What one connection carries: descriptors in flight (for the fair share), how many calls
/// it has sent and when its latest arrived (for the listener, which at its connection cap
/// closes one that never sent a call, or the one idle longest); and how long what it reads
/// waited unread, where the kernel says.
#[derive(Debug)]
pub struct ConnectionLoad {
    id: ConnectionId,
    pub(super) in_flight: AtomicU64,
    calls: AtomicU64,
    /// When the latest call arrived, in ms after `opened`.
    latest_call_ms: AtomicU64,
    /// Until when a quota stream on the connection counts as reporting, in ms after
    /// `opened` (0: none has reported).
    reporting_until_ms: AtomicU64,
    opened: Instant,
    received: Option<Arc<ReceiveStamp>>,
}

impl Default for ConnectionLoad {
    fn default() -> ConnectionLoad {
        ConnectionLoad::receiving(None)
    }
}

impl ConnectionLoad {
    /// The load of a connection, opened now, whose reads keep `received`.
    pub fn receiving(received: Option<Arc<ReceiveStamp>>) -> ConnectionLoad {
        ConnectionLoad {
            id: ConnectionId::next(),
            in_flight: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            latest_call_ms: AtomicU64::new(0),
            reporting_until_ms: AtomicU64::new(0),
            opened: Instant::now(),
            received,
        }
    }

    /// The connection's name.
    pub fn id(&self) -> ConnectionId {
        self.id
    }

    /// Counts a call that arrives at `at`.
    fn called(&self, at: Instant) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let ms = at.saturating_duration_since(self.opened).as_millis();
        self.latest_call_ms
            .store(u64::try_from(ms).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Marks the connection as in use at `at` without a new call: a quota stream's report,
    /// so that at the connection cap a connection whose stream reports is not taken for an
    /// idle one.
    pub fn active(&self, at: Instant) {
        let ms = at.saturating_duration_since(self.opened).as_millis();
        self.latest_call_ms
            .fetch_max(u64::try_from(ms).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Marks the connection as carrying a quota stream that reported at `at` and reports
    /// again within `interval`: until two intervals have passed, it is never taken for an
    /// idle connection at the cap (Envoy reports every 5 s, far past the idle threshold).
    pub fn reporting(&self, at: Instant, interval: Duration) {
        self.active(at);
        let until = (at + 2 * interval).saturating_duration_since(self.opened);
        self.reporting_until_ms.fetch_max(
            u64::try_from(until.as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Whether a quota stream on the connection reported within two of its intervals of
    /// `now`.
    pub fn is_reporting(&self, now: Instant) -> bool {
        let until = self.reporting_until_ms.load(Ordering::Relaxed);
        until > 0 && self.opened + Duration::from_millis(until) > now
    }

    /// When the latest call arrived; None before the first.
    pub fn latest_call(&self) -> Option<Instant> {
        (self.calls() > 0).then(|| {
            self.opened + Duration::from_millis(self.latest_call_ms.load(Ordering::Relaxed))
        })
    }

    /// How long the bytes of the connection's latest read had waited unread.
    fn unread(&self) -> Option<Duration> {
        #[allow(
            clippy::disallowed_methods,
            reason = "the kernel stamps received bytes with the wall clock"
        )]
        self.received.as_ref()?.waited(SystemTime::now)
    }

    /// Calls the connection has sent so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }
}

/// A service that stamps each request with its [`Arrival`] before passing it on; one per
/// connection.
#[derive(Clone)]
pub struct Stamped<S> {
    inner: S,
    connection: Arc<ConnectionLoad>,
}

impl<S> Stamped<S> {
    /// Wraps the service of the connection whose load is `connection`.
    pub fn new(inner: S, connection: Arc<ConnectionLoad>) -> Stamped<S> {
        Stamped { inner, connection }
    }
}

impl<S, B> Service<http::Request<B>> for Stamped<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let now = Instant::now();
        self.connection.called(now);
        request.extensions_mut().insert(Arrival {
            at: now,
            unread: self.connection.unread(),
            connection: Arc::clone(&self.connection),
        });
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stepped_clock_or_a_read_without_a_stamp_says_nothing() {
        let stamp = ReceiveStamp::default();
        stamp.stamp(Some(Duration::from_secs(1_000)));
        let later = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000) + Duration::from_millis(3);
        assert_eq!(stamp.waited(|| later), Some(Duration::from_millis(3)));
        let far = SystemTime::UNIX_EPOCH + Duration::from_secs(2_000);
        assert_eq!(stamp.waited(|| far), None);
        let before = SystemTime::UNIX_EPOCH + Duration::from_secs(999);
        assert_eq!(stamp.waited(|| before), Some(Duration::ZERO));
        // A read without a stamp forgets the last one.
        stamp.stamp(None);
        assert_eq!(stamp.waited(|| later), None);
    }
}
