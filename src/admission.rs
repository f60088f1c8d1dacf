//! Admission control: a call that cannot be answered before its caller gives up is answered
//! at once (by the failure mode) instead of queued, so that in a spike the service keeps
//! doing useful work rather than answering every call after its deadline.
//!
//! Three checks run when a call reaches the handler, before it is decoded into a request:
//! 1. **Deadline.** Before the handler runs, a call waits in HTTP/2 buffers and in the
//!    runtime's run queue (its sojourn, from when the connection took the stream); its answer
//!    then waits about as long again on the way out, behind the same queue. A call whose
//!    `grpc-timeout` leaves less than its sojourn plus the recent service time cannot be
//!    answered in time, so it is answered now. Only calls that cannot make their deadline
//!    are shed this way, whatever the load.
//! 2. **Queue (CoDel).** For calls without a deadline: once the sojourn has stayed above the
//!    target for a whole interval, calls that waited longer than the target are shed until
//!    it drops below again. A short burst is absorbed, a standing queue is not.
//! 3. **Concurrency (AIMD).** Calls in flight, weighted by their descriptors, stay under an
//!    adaptive limit: cut to 4/5 in an interval in which the calls with a deadline took
//!    longer than half their budget (arrival to deadline) on average, raised by a sixteenth
//!    in an interval in which it was used and they did not. This bounds the queue of a
//!    backend that answers slowly (the Redis batch queue), where the CPU is idle and the
//!    sojourn stays short. The target follows the callers' own deadlines: with Envoy's
//!    20 ms it is about 9 ms, and calls with long deadlines are not shed for being slow.
//!    The limit never falls below one largest request.
//!    Under that limit's pressure each connection keeps a fair share: a connection with
//!    less than `limit / active connections` in flight is still admitted (up to twice the
//!    limit in all), so one caller sending 64-descriptor requests cannot lock out the rest.
//!
//! Why CoDel plus AIMD rather than a fixed limit: the right concurrency depends on the
//! backend and the machine (about 64 calls on memory, hundreds on Redis), and a fixed queue
//! bound either sheds at normal load or queues past Envoy's 20 ms.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use parking_lot::Mutex;
use prometheus_client::metrics::gauge::Gauge;
use tokio::time::Instant;
use tonic::codegen::{Service, http};

/// Default standing-queue target for calls without a deadline (CoDel): a quarter of Envoy's
/// default 20 ms timeout, several times a loaded Redis round trip.
pub const DEFAULT_TARGET_LATENCY: Duration = Duration::from_millis(5);
/// How long the sojourn must stay above the target before calls are shed, and how often
/// the concurrency limit adapts (CoDel's interval).
const INTERVAL: Duration = Duration::from_millis(100);
/// Fewest samples an interval needs before the limit moves on it.
const MIN_SAMPLES: u64 = 16;
/// The concurrency limit never goes below one largest request (64 descriptors), so a
/// request of any size can always be admitted alone.
const MIN_LIMIT: u64 = 64;
/// Starting concurrency limit, in descriptors: far above what one node serves well, so that
/// only a real latency rise brings it down.
const INITIAL_LIMIT: u64 = 4096;
/// Highest concurrency limit.
const MAX_LIMIT: u64 = 1 << 20;

/// Why a call was answered without being served (the `reason` of `floodgate_shed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShedReason {
    /// Its deadline leaves less than its wait so far plus the time calls take to be served.
    Deadline,
    /// It has no deadline and waited in a standing queue longer than the target.
    Queue,
    /// The calls in flight already reach the concurrency limit.
    Concurrency,
}

impl ShedReason {
    /// Every reason, for metric labels.
    pub const ALL: [ShedReason; 3] = [
        ShedReason::Deadline,
        ShedReason::Queue,
        ShedReason::Concurrency,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            ShedReason::Deadline => "deadline",
            ShedReason::Queue => "queue",
            ShedReason::Concurrency => "concurrency",
        }
    }
}

/// Stamped on every gRPC request by the connection that took it ([`Stamped`]): when the
/// stream arrived and the load of its connection.
#[derive(Clone)]
pub struct Arrival {
    /// When the connection handed the stream to the service.
    pub at: Instant,
    /// Descriptors in flight on the stream's connection.
    pub connection: Arc<ConnectionLoad>,
}

/// Descriptors in flight on one connection.
#[derive(Debug, Default)]
pub struct ConnectionLoad {
    in_flight: AtomicU64,
}

/// A service that stamps each request with its [`Arrival`] before passing it on; one per
/// connection.
#[derive(Clone)]
pub struct Stamped<S> {
    inner: S,
    connection: Arc<ConnectionLoad>,
}

impl<S> Stamped<S> {
    /// Wraps the service of one new connection.
    pub fn new(inner: S) -> Stamped<S> {
        Stamped {
            inner,
            connection: Arc::default(),
        }
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
        request.extensions_mut().insert(Arrival {
            at: Instant::now(),
            connection: Arc::clone(&self.connection),
        });
        self.inner.call(request)
    }
}

/// The admission controller shared by every gRPC call.
#[derive(Debug)]
pub struct Admission {
    target: Duration,
    /// Descriptors of the calls being served.
    in_flight: AtomicU64,
    /// Concurrency limit, in descriptors.
    limit: AtomicU64,
    /// Connections with at least one call being served.
    active_connections: AtomicU64,
    /// Mean service time of the latest interval, in microseconds (admission to answer).
    service_us: AtomicU64,
    /// Since when (µs after `origin`) the sojourn has been above the target; 0 = it is not.
    above_since_us: AtomicU64,
    origin: Instant,
    window: Mutex<Window>,
    /// Where the limit is exported (`floodgate_overload_limit`).
    exported: Gauge,
}

/// The latencies of the current interval.
#[derive(Debug)]
struct Window {
    started: Instant,
    samples: u64,
    /// Calls with a deadline, the sum of their latencies (arrival to answer) and of their
    /// budgets (arrival to deadline), in µs.
    budgeted: u64,
    latency_us: u64,
    budget_us: u64,
    /// Sum of service times (admission to answer), in µs.
    service_us: u64,
    /// Most descriptors in flight seen in the interval.
    peak: u64,
}

/// A call that was admitted; dropping it (when the answer is ready) ends its accounting.
#[must_use = "the call counts as in flight until the permit is dropped"]
pub struct Permit<'a> {
    admission: &'a Admission,
    units: u64,
    arrived: Instant,
    admitted: Instant,
    /// Arrival to deadline, when the call has one.
    budget: Option<Duration>,
    connection: Option<Arc<ConnectionLoad>>,
}

impl Admission {
    /// A controller that keeps calls within `target` latency and exports its limit to
    /// `exported`.
    pub fn new(target: Duration, exported: Gauge) -> Admission {
        let now = Instant::now();
        exported.set(INITIAL_LIMIT as i64);
        Admission {
            exported,
            target,
            in_flight: AtomicU64::new(0),
            limit: AtomicU64::new(INITIAL_LIMIT),
            active_connections: AtomicU64::new(0),
            service_us: AtomicU64::new(0),
            above_since_us: AtomicU64::new(0),
            origin: now,
            window: Mutex::new(Window {
                started: now,
                samples: 0,
                budgeted: 0,
                latency_us: 0,
                budget_us: 0,
                service_us: 0,
                peak: 0,
            }),
        }
    }

    /// The current concurrency limit, in descriptors.
    pub fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    /// Admits a call of `units` descriptors, or says why it must be answered at once.
    /// `arrival` is the connection's stamp (absent for calls that did not come through a
    /// stamped connection), `deadline` the caller's.
    ///
    /// # Errors
    /// The reason the call is shed.
    pub fn admit(
        &self,
        units: u64,
        arrival: Option<&Arrival>,
        deadline: Option<Instant>,
    ) -> Result<Permit<'_>, ShedReason> {
        let now = Instant::now();
        let arrived = arrival.map_or(now, |arrival| arrival.at);
        let sojourn = now.saturating_duration_since(arrived);
        match deadline {
            Some(deadline) => {
                let service = Duration::from_micros(self.service_us.load(Ordering::Relaxed));
                if deadline <= now + service + sojourn {
                    return Err(ShedReason::Deadline);
                }
            }
            None => {
                if self.standing_queue(now, sojourn) {
                    return Err(ShedReason::Queue);
                }
            }
        }
        let connection = arrival.map(|arrival| &arrival.connection);
        let limit = self.limit();
        let in_flight = self.in_flight.fetch_add(units, Ordering::Relaxed) + units;
        if in_flight > limit && !self.within_fair_share(connection, units, in_flight, limit) {
            self.in_flight.fetch_sub(units, Ordering::Relaxed);
            return Err(ShedReason::Concurrency);
        }
        if let Some(connection) = connection
            && connection.in_flight.fetch_add(units, Ordering::Relaxed) == 0
        {
            self.active_connections.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Permit {
            admission: self,
            units,
            arrived,
            admitted: now,
            budget: deadline.map(|deadline| deadline.saturating_duration_since(arrived)),
            connection: connection.cloned(),
        })
    }

    /// Whether a call that waited `sojourn` meets a standing queue: the sojourn has been
    /// above the target for a whole interval, and this call waited longer than the target.
    fn standing_queue(&self, now: Instant, sojourn: Duration) -> bool {
        let now_us = self.micros_since_origin(now).max(1);
        if sojourn <= self.target {
            self.above_since_us.store(0, Ordering::Relaxed);
            return false;
        }
        let since = match self.above_since_us.compare_exchange(
            0,
            now_us,
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => now_us,
            Err(since) => since,
        };
        now_us.saturating_sub(since) >= INTERVAL.as_micros() as u64
    }

    /// Past the limit, a connection below its fair share of it is still admitted, up to
    /// twice the limit in all.
    fn within_fair_share(
        &self,
        connection: Option<&Arc<ConnectionLoad>>,
        units: u64,
        in_flight: u64,
        limit: u64,
    ) -> bool {
        let Some(connection) = connection else {
            return false;
        };
        if in_flight > limit.saturating_mul(2) {
            return false;
        }
        let mine = connection.in_flight.load(Ordering::Relaxed);
        let active = self.active_connections.load(Ordering::Relaxed) + u64::from(mine == 0);
        mine + units <= limit / active.max(1)
    }

    fn micros_since_origin(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.origin).as_micros() as u64
    }

    /// Ends a call's accounting and learns from its latency.
    fn release(&self, permit: &Permit<'_>) {
        let in_flight = self.in_flight.fetch_sub(permit.units, Ordering::Relaxed);
        if let Some(connection) = &permit.connection
            && connection
                .in_flight
                .fetch_sub(permit.units, Ordering::Relaxed)
                == permit.units
        {
            self.active_connections.fetch_sub(1, Ordering::Relaxed);
        }
        let now = Instant::now();
        let latency = now.saturating_duration_since(permit.arrived);
        let service = now.saturating_duration_since(permit.admitted);
        let mut window = self.window.lock();
        window.samples += 1;
        if let Some(budget) = permit.budget {
            window.budgeted += 1;
            window.latency_us += latency.as_micros() as u64;
            window.budget_us += budget.as_micros() as u64;
        }
        window.service_us += service.as_micros() as u64;
        window.peak = window.peak.max(in_flight);
        if now.saturating_duration_since(window.started) >= INTERVAL
            && window.samples >= MIN_SAMPLES
        {
            self.adapt(&mut window, now);
        }
    }

    /// Moves the limit on the interval that just ended, and starts the next.
    fn adapt(&self, window: &mut Window, now: Instant) {
        // Late on average against half their budgets: the queue must shrink.
        let late = window.budgeted > 0 && window.latency_us * 2 > window.budget_us;
        let limit = self.limit();
        let next = if late {
            limit * 4 / 5
        } else if window.peak * 5 >= limit * 4 {
            // Used to at least 80 %: room to grow.
            limit + limit / 16 + 1
        } else {
            limit
        };
        let next = next.clamp(MIN_LIMIT, MAX_LIMIT);
        self.limit.store(next, Ordering::Relaxed);
        self.exported.set(next as i64);
        self.service_us
            .store(window.service_us / window.samples, Ordering::Relaxed);
        window.started = now;
        window.samples = 0;
        window.budgeted = 0;
        window.latency_us = 0;
        window.budget_us = 0;
        window.service_us = 0;
        window.peak = 0;
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        self.admission.release(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arrival(at: Instant, connection: &Arc<ConnectionLoad>) -> Arrival {
        Arrival {
            at,
            connection: Arc::clone(connection),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_whose_deadline_has_passed_is_shed() {
        let admission = Admission::new(DEFAULT_TARGET_LATENCY, Gauge::default());
        let now = Instant::now();
        assert_eq!(
            admission.admit(1, None, Some(now)).err(),
            Some(ShedReason::Deadline)
        );
        assert!(
            admission
                .admit(1, None, Some(now + Duration::from_millis(1)))
                .is_ok()
        );
        // A call that waited 6 ms of a 10 ms budget would wait as long again on the way out.
        let connection = Arc::new(ConnectionLoad::default());
        tokio::time::advance(Duration::from_millis(6)).await;
        let now = Instant::now();
        let waited = arrival(now - Duration::from_millis(6), &connection);
        let deadline = waited.at + Duration::from_millis(10);
        assert_eq!(
            admission.admit(1, Some(&waited), Some(deadline)).err(),
            Some(ShedReason::Deadline)
        );
        let waited = arrival(now - Duration::from_millis(3), &connection);
        let deadline = waited.at + Duration::from_millis(10);
        assert!(admission.admit(1, Some(&waited), Some(deadline)).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_standing_queue_sheds_and_only_calls_that_waited() {
        let admission = Admission::new(DEFAULT_TARGET_LATENCY, Gauge::default());
        let connection = Arc::new(ConnectionLoad::default());
        let waited = Duration::from_millis(8);
        // A burst: the first long wait is absorbed.
        tokio::time::advance(waited).await;
        let old = arrival(Instant::now() - waited, &connection);
        assert!(admission.admit(1, Some(&old), None).is_ok());
        // Still above the target a whole interval later: shed.
        tokio::time::advance(INTERVAL).await;
        let old = arrival(Instant::now() - waited, &connection);
        assert_eq!(
            admission.admit(1, Some(&old), None).err(),
            Some(ShedReason::Queue)
        );
        // A call that did not wait passes, and resets the state.
        let fresh = arrival(Instant::now(), &connection);
        assert!(admission.admit(1, Some(&fresh), None).is_ok());
        let old = arrival(Instant::now() - waited, &connection);
        assert!(admission.admit(1, Some(&old), None).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn past_the_limit_a_quiet_connection_keeps_its_share() {
        let admission = Admission::new(DEFAULT_TARGET_LATENCY, Gauge::default());
        admission.limit.store(128, Ordering::Relaxed);
        let heavy = Arc::new(ConnectionLoad::default());
        let quiet = Arc::new(ConnectionLoad::default());
        let now = Instant::now();
        let mut held = Vec::new();
        while let Ok(permit) = admission.admit(64, Some(&arrival(now, &heavy)), None) {
            held.push(permit);
        }
        assert_eq!(held.len(), 2, "the heavy caller fills the limit");
        assert_eq!(
            admission.admit(1, Some(&arrival(now, &heavy)), None).err(),
            Some(ShedReason::Concurrency)
        );
        let quiet_permit = admission.admit(1, Some(&arrival(now, &quiet)), None);
        assert!(quiet_permit.is_ok(), "a quiet connection is still served");
        drop(quiet_permit);
        drop(held);
        assert_eq!(admission.in_flight.load(Ordering::Relaxed), 0);
        assert_eq!(admission.active_connections.load(Ordering::Relaxed), 0);
    }

    /// Holds MIN_SAMPLES calls for `held_for` (on the paused clock), each with `budget`.
    async fn interval(admission: &Admission, budget: Option<Duration>, held_for: Duration) {
        let deadline = budget.map(|budget| Instant::now() + budget);
        let held: Vec<_> = (0..MIN_SAMPLES)
            .map(|_| admission.admit(1, None, deadline).unwrap())
            .collect();
        tokio::time::advance(held_for).await;
        drop(held);
    }

    #[tokio::test(start_paused = true)]
    async fn the_limit_falls_when_calls_take_half_their_budget_and_grows_back() {
        let admission = Admission::new(DEFAULT_TARGET_LATENCY, Gauge::default());
        let start = admission.limit();
        // Slow calls without a deadline move nothing.
        interval(&admission, None, INTERVAL).await;
        assert_eq!(admission.limit(), start);
        // Calls that took 100 ms of a 1 s budget are in time.
        interval(&admission, Some(Duration::from_secs(1)), INTERVAL).await;
        assert_eq!(admission.limit(), start);
        // Calls that took 100 ms of a 150 ms budget are late: the limit falls.
        interval(&admission, Some(INTERVAL + INTERVAL / 2), INTERVAL).await;
        assert_eq!(admission.limit(), start * 4 / 5);
        // Fast calls that use the limit grow it again.
        admission.limit.store(MIN_LIMIT, Ordering::Relaxed);
        let held: Vec<_> = (0..MIN_LIMIT)
            .map(|_| admission.admit(1, None, None).unwrap())
            .collect();
        drop(held);
        tokio::time::advance(INTERVAL).await;
        interval(&admission, Some(Duration::from_secs(1)), Duration::ZERO).await;
        assert!(admission.limit() > MIN_LIMIT, "{}", admission.limit());
    }
}
