//! The admission controller: the deadline, queue and fair-share checks of the module doc,
//! run when a call reaches its handler.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::standing::StandingWait;
use super::{Arrival, ConnectionLoad, Deadline, ShedReason};

/// Default standing-queue target for calls without a deadline (CoDel): a quarter of Envoy's
/// default 20 ms timeout, several times a loaded Redis round trip.
pub const DEFAULT_TARGET_LATENCY: Duration = Duration::from_millis(5);
/// How long the sojourn must stay above the target before calls without a deadline are shed
/// (CoDel's interval).
const INTERVAL: Duration = Duration::from_millis(100);
/// Descriptors in flight past which each connection is held to its fair share: 64 calls of
/// 64 descriptors, or thousands of ordinary ones, far more than one node decides at once.
pub const MAX_IN_FLIGHT: u64 = 16_384;

/// The backend's estimate of how long a request of so many charges would wait in its queue
/// (`Backend::queue_wait`).
pub type QueueWait = Box<dyn Fn(usize) -> Duration + Send + Sync>;

/// The admission controller shared by every gRPC call.
pub struct Admission {
    target: Duration,
    /// The backend's queue, when it has one: asked before the call is matched.
    queue_wait: Option<QueueWait>,
    /// Descriptors of the calls being served.
    in_flight: AtomicU64,
    /// Connections with at least one call being served.
    active_connections: AtomicU64,
    /// Since when (µs after `origin`) the sojourn has been above the target; 0 = it is not.
    above_since_us: AtomicU64,
    /// Recent calls' ways in, from which each call's way out is estimated.
    standing: StandingWait,
    origin: Instant,
}

/// A call that was admitted; dropping it (when the answer is ready) ends its accounting.
#[must_use = "the call counts as in flight until the permit is dropped"]
pub struct Permit<'a> {
    admission: &'a Admission,
    units: u64,
    connection: Option<Arc<ConnectionLoad>>,
}

impl Admission {
    /// A controller that sheds calls without a deadline past a standing queue of `target`.
    pub fn new(target: Duration) -> Admission {
        Admission {
            target,
            queue_wait: None,
            in_flight: AtomicU64::new(0),
            active_connections: AtomicU64::new(0),
            above_since_us: AtomicU64::new(0),
            standing: StandingWait::default(),
            origin: Instant::now(),
        }
    }

    /// Also sheds, before matching, a call whose deadline is nearer than
    /// [`super::ROOM_PER_WAIT`] times its wait in the backend's queue (at most its `units` charges): the backend
    /// would refuse it anyway after the match, and under a flood of wide requests the
    /// matching alone took the CPU the served calls needed.
    pub fn with_queue_wait(mut self, queue_wait: QueueWait) -> Admission {
        self.queue_wait = Some(queue_wait);
        self
    }

    /// Admits a call of `units` descriptors, or says why it must be answered at once.
    /// `arrival` is the connection's stamp (absent for calls that did not come through a
    /// stamped connection), `deadline` the caller's, counted from `Arrival::received`.
    ///
    /// # Errors
    /// The reason the call is shed.
    pub fn admit(
        &self,
        units: u64,
        arrival: Option<&Arrival>,
        deadline: Option<Deadline>,
    ) -> Result<Permit<'_>, ShedReason> {
        let now = Instant::now();
        let sojourn = arrival.map_or(Duration::ZERO, |arrival| {
            now.saturating_duration_since(arrival.at)
        });
        // The way in: the wait unread and the sojourn, the wait unread taken to be about the
        // sojourn where the kernel does not say (the deadline counts from the receive stamp,
        // so such a wait is still to be taken from it). The way out is the standing wait's
        // estimate: as long as the way in, unless that was a passing stall.
        let (way_in, uncounted) = match arrival.map(|arrival| arrival.unread) {
            None => (Duration::ZERO, Duration::ZERO),
            Some(Some(unread)) => (sojourn + unread, Duration::ZERO),
            Some(None) => (sojourn * 2, sojourn),
        };
        let way_out = self.standing.record(way_in);
        match deadline {
            Some(deadline) if deadline.work_ends() <= now + uncounted + way_out => {
                return Err(ShedReason::Deadline);
            }
            Some(deadline) if !self.queue_in_time(units, now, deadline) => {
                return Err(ShedReason::Backlog);
            }
            Some(_) => {}
            None if self.standing_queue(now, sojourn) => return Err(ShedReason::Queue),
            None => {}
        }
        self.take(units, arrival.map(|arrival| &arrival.connection))
    }

    /// Admits `units` of work that no call waits for in the run queue: a quota stream
    /// booking its report. It counts in flight with the calls, on `caller` (the stream's own
    /// load, so the stream is one caller among the connections), held to its fair share
    /// past the cap; and like a call without a deadline it is shed while a standing queue
    /// stands.
    ///
    /// # Errors
    /// The reason the work is shed.
    pub fn admit_work(
        &self,
        units: u64,
        caller: &Arc<ConnectionLoad>,
    ) -> Result<Permit<'_>, ShedReason> {
        if self.queue_stands(Instant::now()) {
            return Err(ShedReason::Queue);
        }
        self.take(units, Some(caller))
    }

    /// Counts `units` in flight on `connection`, or refuses them past the cap and the
    /// connection's fair share.
    fn take(
        &self,
        units: u64,
        connection: Option<&Arc<ConnectionLoad>>,
    ) -> Result<Permit<'_>, ShedReason> {
        let in_flight = self.in_flight.fetch_add(units, Ordering::Relaxed) + units;
        if in_flight > MAX_IN_FLIGHT && !self.within_fair_share(connection, units, in_flight) {
            self.in_flight.fetch_sub(units, Ordering::Relaxed);
            return Err(ShedReason::FairShare);
        }
        if let Some(connection) = connection
            && connection.in_flight.fetch_add(units, Ordering::Relaxed) == 0
        {
            self.active_connections.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Permit {
            admission: self,
            units,
            connection: connection.cloned(),
        })
    }

    /// Whether the backend's queue would send `units` charges with enough room left
    /// before `deadline` (as the batcher itself decides).
    fn queue_in_time(&self, units: u64, now: Instant, deadline: Deadline) -> bool {
        self.queue_wait.as_ref().is_none_or(|queue_wait| {
            deadline.leaves_room(
                now,
                queue_wait(usize::try_from(units).unwrap_or(usize::MAX)),
            )
        })
    }

    /// Whether a call that waited `sojourn` meets a standing queue: the sojourn has been
    /// above the target for a whole interval, and this call waited longer than the target.
    fn standing_queue(&self, now: Instant, sojourn: Duration) -> bool {
        if sojourn <= self.target {
            self.above_since_us.store(0, Ordering::Relaxed);
            return false;
        }
        let now_us = (now.saturating_duration_since(self.origin).as_micros() as u64).max(1);
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

    /// Whether the sojourn has been above the target for a whole interval, as the calls
    /// last measured it.
    fn queue_stands(&self, now: Instant) -> bool {
        let since = self.above_since_us.load(Ordering::Relaxed);
        let now_us = now.saturating_duration_since(self.origin).as_micros() as u64;
        since != 0 && now_us.saturating_sub(since) >= INTERVAL.as_micros() as u64
    }

    /// Past the cap, a connection below its fair share of it is still admitted, up to twice
    /// the cap in all.
    fn within_fair_share(
        &self,
        connection: Option<&Arc<ConnectionLoad>>,
        units: u64,
        in_flight: u64,
    ) -> bool {
        let Some(connection) = connection else {
            return false;
        };
        if in_flight > 2 * MAX_IN_FLIGHT {
            return false;
        }
        let mine = connection.in_flight.load(Ordering::Relaxed);
        let active = self.active_connections.load(Ordering::Relaxed) + u64::from(mine == 0);
        mine + units <= MAX_IN_FLIGHT / active.max(1)
    }

    /// Ends a call's accounting.
    fn release(&self, permit: &Permit<'_>) {
        self.in_flight.fetch_sub(permit.units, Ordering::Relaxed);
        if let Some(connection) = &permit.connection
            && connection
                .in_flight
                .fetch_sub(permit.units, Ordering::Relaxed)
                == permit.units
        {
            self.active_connections.fetch_sub(1, Ordering::Relaxed);
        }
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
            unread: None,
            connection: Arc::clone(connection),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_the_backend_queue_cannot_serve_with_room_is_shed_before_matching() {
        // The queue holds 1 ms of work per 10 charges ahead, these included.
        let admission = Admission::new(DEFAULT_TARGET_LATENCY).with_queue_wait(Box::new(|items| {
            Duration::from_micros(100) * u32::try_from(items + 30).unwrap()
        }));
        let now = Instant::now();
        let in_ms = |ms| Some(Deadline::ending_at(now + Duration::from_millis(ms)));
        // 1 charge waits 3.1 ms: it needs 4 times that, 12.4 ms.
        assert!(admission.admit(1, None, in_ms(13)).is_ok());
        assert_eq!(
            admission.admit(1, None, in_ms(12)).err(),
            Some(ShedReason::Backlog)
        );
        // 64 charges wait 9.4 ms: they need 37.6 ms.
        assert_eq!(
            admission.admit(64, None, in_ms(37)).err(),
            Some(ShedReason::Backlog)
        );
        assert!(admission.admit(64, None, in_ms(38)).is_ok());
        // Without a deadline the queue alone sheds nothing.
        assert!(admission.admit(64, None, None).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_whose_deadline_is_nearer_than_its_wait_is_shed() {
        let admission = Admission::new(DEFAULT_TARGET_LATENCY);
        let now = Instant::now();
        assert_eq!(
            admission
                .admit(1, None, Some(Deadline::ending_at(now)))
                .err(),
            Some(ShedReason::Deadline)
        );
        assert!(
            admission
                .admit(
                    1,
                    None,
                    Some(Deadline::ending_at(now + Duration::from_millis(1)))
                )
                .is_ok()
        );
        // Where the kernel says how long a call waited unread, that wait counts too: 5 ms
        // unread and 3 ms taken are 8 ms of a 10 ms budget. On an otherwise idle service
        // the way out is short, so it is served.
        let connection = Arc::new(ConnectionLoad::default());
        let waited = |unread_ms, sojourn_ms| Arrival {
            unread: Some(Duration::from_millis(unread_ms)),
            ..arrival(
                Instant::now() - Duration::from_millis(sojourn_ms),
                &connection,
            )
        };
        tokio::time::advance(Duration::from_millis(100)).await;
        let stalled = waited(5, 3);
        assert_eq!(
            stalled.received(),
            Instant::now() - Duration::from_millis(8)
        );
        let in_10_ms = |arrival: &Arrival| {
            Some(Deadline::ending_at(
                arrival.received() + Duration::from_millis(10),
            ))
        };
        assert!(
            admission
                .admit(1, Some(&stalled), in_10_ms(&stalled))
                .is_ok()
        );
        // Once calls have waited 3 ms on the way in for a while, 8 ms in (over twice that)
        // is taken to leave in about 3 ms, more than the 2 ms left; 4 ms in is taken to
        // leave in as long again, and 6 ms are left.
        for _ in 0..10 {
            let _served = admission.admit(1, Some(&waited(1, 2)), None).unwrap();
        }
        let late = waited(5, 3);
        assert_eq!(
            admission.admit(1, Some(&late), in_10_ms(&late)).err(),
            Some(ShedReason::Deadline)
        );
        let in_time = waited(1, 3);
        assert!(
            admission
                .admit(1, Some(&in_time), in_10_ms(&in_time))
                .is_ok()
        );
        // Without the kernel's word (unix sockets) the wait unread is taken to be the
        // sojourn: 4 ms taken are 8 ms in, which leave 2 ms.
        let unstamped = arrival(Instant::now() - Duration::from_millis(4), &connection);
        assert_eq!(
            admission
                .admit(1, Some(&unstamped), in_10_ms(&unstamped))
                .err(),
            Some(ShedReason::Deadline)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_standing_queue_sheds_and_only_calls_that_waited() {
        let admission = Admission::new(DEFAULT_TARGET_LATENCY);
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
        // Work that waits for no call is shed while the queue stands.
        assert_eq!(
            admission.admit_work(1, &connection).err(),
            Some(ShedReason::Queue)
        );
        // A call that did not wait passes, and resets the state.
        let fresh = arrival(Instant::now(), &connection);
        assert!(admission.admit(1, Some(&fresh), None).is_ok());
        let old = arrival(Instant::now() - waited, &connection);
        assert!(admission.admit(1, Some(&old), None).is_ok());
        assert!(admission.admit_work(1, &connection).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn past_the_cap_a_quiet_connection_keeps_its_share() {
        let admission = Admission::new(DEFAULT_TARGET_LATENCY);
        let heavy = Arc::new(ConnectionLoad::default());
        let quiet = Arc::new(ConnectionLoad::default());
        let now = Instant::now();
        let mut held = Vec::new();
        while let Ok(permit) = admission.admit(64, Some(&arrival(now, &heavy)), None) {
            held.push(permit);
        }
        assert_eq!(
            held.len() as u64,
            MAX_IN_FLIGHT / 64,
            "the heavy caller fills the cap"
        );
        assert_eq!(
            admission.admit(1, Some(&arrival(now, &heavy)), None).err(),
            Some(ShedReason::FairShare)
        );
        let quiet_permit = admission.admit(1, Some(&arrival(now, &quiet)), None);
        assert!(quiet_permit.is_ok(), "a quiet connection is still served");
        // A quota stream is a caller of its own, held to its share like any.
        let stream = Arc::new(ConnectionLoad::default());
        let booking = admission.admit_work(64, &stream);
        assert!(booking.is_ok(), "a stream's first bookings fit its share");
        assert_eq!(
            admission.admit_work(MAX_IN_FLIGHT, &stream).err(),
            Some(ShedReason::FairShare)
        );
        drop((quiet_permit, booking));
        drop(held);
        assert_eq!(admission.in_flight.load(Ordering::Relaxed), 0);
        assert_eq!(admission.active_connections.load(Ordering::Relaxed), 0);
    }
}
