//! Turns: a connection holding far more calls than the others gets the CPU a few calls at a
//! time, so that one caller cannot make every other caller wait behind its queue.
//!
//! Every call is a task in the runtime's run queue, served in order of arrival. A caller
//! keeping 512 heavy calls in flight on one connection thus put 512 tasks ahead of every
//! call of every other connection: a light caller's p99 rose from 1.7 to 44 ms beside it on
//! one core. Counting calls only once they reached the handler (the fair share of
//! [`super::Admission`]) saw none of that queue.
//!
//! So a connection's calls are counted from when it takes them ([`super::Stamped`]). While
//! a connection holds more than [`OVER_SHARE`] times what the other connections that called
//! lately hold on average, each run of its calls needs one of its turns (as many as the
//! runtime has workers). A call that gets one goes to the back of the run queue before it
//! runs; the others wait parked, off the run queue, until a turn is given back. Once the
//! connection is back within its share, its next call releases every parked one, so that
//! none waits behind the calls that came after it. A turn is held only
//! for one run, not while the call waits on Redis, so the connection's calls still overlap on
//! the backend. A lone connection, or connections with about even loads, never take turns.
//! Beside that caller, the light caller's p50 went from 17-19 ms to 1.3-1.9 ms; the heavy
//! one kept 89-97% of its calls a second.
//!
//! A parked call waits for a turn for at most a quarter of its deadline ([`parks_until`]),
//! then runs without one, and the deadline check of [`super::Admission`] serves or sheds it
//! as any other call: parking alone never keeps a call past its deadline. (Waiting until a
//! turn came, 12,514 calls in 5 s were answered after their deadline at twice the capacity.)

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, TryAcquireError};
use tokio::time::Instant;

/// How many times the other connections' average load a connection may hold before its
/// calls take turns: loads a balancing client spreads evenly stay clear of it.
pub const OVER_SHARE: u64 = 4;

/// How long a connection counts as calling after its latest call: a light caller between
/// two calls still has its place, or the heavy connection's calls would fill the run queue
/// whenever the light one had none outstanding.
const RECENT: Duration = Duration::from_millis(100);

/// The share of its deadline a call may wait parked: the rest leaves room for its run, or
/// for its shed answer, behind the calls already in the run queue.
const PARKED_SHARE: u32 = 4;

/// When a call received at `received` with `timeout` (its `grpc-timeout`, if any) stops
/// waiting for a turn: after a [`PARKED_SHARE`] of the timeout, or of the standing-queue
/// target for a call without one.
pub fn parks_until(received: Instant, timeout: Option<Duration>) -> Instant {
    received
        + timeout.map_or(super::DEFAULT_TARGET_LATENCY, |timeout| {
            timeout / PARKED_SHARE
        })
}

/// Calls outstanding (taken, not yet answered) over every connection of a listener, and how
/// many connections called recently.
#[derive(Debug)]
pub struct Outstanding {
    calls: AtomicU64,
    origin: Instant,
    /// The latest [`RECENT`] period any call began in, counted from `origin`.
    period: AtomicU64,
    /// Connections that called in the latest period and in the one before it.
    callers: [AtomicU64; 2],
}

impl Default for Outstanding {
    fn default() -> Outstanding {
        Outstanding {
            calls: AtomicU64::new(0),
            origin: Instant::now(),
            period: AtomicU64::new(0),
            callers: [AtomicU64::new(0), AtomicU64::new(0)],
        }
    }
}

impl Outstanding {
    fn period_of(&self, at: Instant) -> u64 {
        let elapsed = at.saturating_duration_since(self.origin).as_millis();
        u64::try_from(elapsed / RECENT.as_millis()).unwrap_or(u64::MAX)
    }

    /// Counts a connection's first call of `period`.
    fn new_caller(&self, period: u64) {
        let latest = self.period.load(Ordering::Relaxed);
        if period > latest
            && self
                .period
                .compare_exchange(latest, period, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let slot = &self.callers[(period % 2) as usize];
            slot.store(0, Ordering::Relaxed);
            if period > latest + 1 {
                self.callers[((period + 1) % 2) as usize].store(0, Ordering::Relaxed);
            }
        }
        self.callers[(period % 2) as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Connections that called within the latest one or two periods.
    fn recent_callers(&self) -> u64 {
        self.callers[0]
            .load(Ordering::Relaxed)
            .max(self.callers[1].load(Ordering::Relaxed))
    }
}

/// One connection's outstanding calls and its turns.
#[derive(Debug)]
pub struct ConnectionCalls {
    outstanding: AtomicU64,
    /// Its calls waiting parked for a turn.
    parked: AtomicU64,
    /// Wakes its parked calls, to run without a turn, once it is back within its share.
    released: Notify,
    /// The latest period (of [`Outstanding`]) it called in, plus one; 0 = none yet.
    called_in: AtomicU64,
    turns: Arc<Semaphore>,
    all: Arc<Outstanding>,
}

impl ConnectionCalls {
    /// A connection of the listener whose totals are `all`, whose calls take `turns` at
    /// a time while it is over its share.
    pub fn new(all: Arc<Outstanding>, turns: usize) -> ConnectionCalls {
        ConnectionCalls {
            outstanding: AtomicU64::new(0),
            parked: AtomicU64::new(0),
            released: Notify::new(),
            called_in: AtomicU64::new(0),
            turns: Arc::new(Semaphore::new(turns.max(1))),
            all,
        }
    }

    /// Counts a call taken at `at`.
    fn begin(&self, at: Instant) {
        self.outstanding.fetch_add(1, Ordering::Relaxed);
        self.all.calls.fetch_add(1, Ordering::Relaxed);
        let period = self.all.period_of(at);
        if self.called_in.swap(period + 1, Ordering::Relaxed) != period + 1 {
            self.all.new_caller(period);
        }
    }

    /// Counts a call answered (or dropped).
    fn end(&self) {
        self.all.calls.fetch_sub(1, Ordering::Relaxed);
        self.outstanding.fetch_sub(1, Ordering::Relaxed);
    }

    /// Lets its parked calls run without a turn, where any is parked: a connection back
    /// within its share would otherwise serve them one a run-queue round, behind its
    /// newer calls, which run at once (and, while its calls kept coming, they held it in
    /// turns under an even load: half the calls of 4 even connections took turns).
    fn release_parked(&self) {
        if self.parked.load(Ordering::Relaxed) > 0 {
            self.released.notify_waiters();
        }
    }

    /// Whether this connection holds more than [`OVER_SHARE`] times what the other recent
    /// callers hold on average (each counted as holding one call at least).
    fn over_share(&self) -> bool {
        let mine = self.outstanding.load(Ordering::Relaxed);
        let others = self.all.recent_callers().saturating_sub(1);
        if others == 0 || mine <= OVER_SHARE {
            return false;
        }
        let theirs = self.all.calls.load(Ordering::Relaxed).saturating_sub(mine);
        mine * others > OVER_SHARE * theirs.max(others)
    }
}

/// A turn being waited for until the call's [`parks_until`], or until its connection is
/// back within its share; made (boxed) only when the call has to wait. None: run without
/// a turn.
type Waiting = Pin<Box<dyn Future<Output = Option<OwnedSemaphorePermit>> + Send>>;

/// Waits parked for one of `calls`' turns until `until` at most.
fn park(calls: Arc<ConnectionCalls>, until: Instant) -> Waiting {
    Box::pin(async move {
        tokio::select! {
            turn = Arc::clone(&calls.turns).acquire_owned() => turn.ok(),
            () = calls.released.notified() => None,
            () = tokio::time::sleep_until(until) => None,
        }
    })
}

pin_project_lite::pin_project! {
    /// A call counted as outstanding on its connection until it ends. While its connection
    /// is over its share, each of its runs needs a turn: it waits parked for one, or, if
    /// one is free, takes it and goes to the back of the run queue first, so that the
    /// calls already waiting there run before it.
    pub struct InTurn<F> {
        #[pin]
        call: F,
        calls: Arc<ConnectionCalls>,
        // A turn taken, for the next run.
        turn: Option<OwnedSemaphorePermit>,
        waiting: Option<Waiting>,
        // When it stops waiting for a turn.
        parks_until: Instant,
    }

    impl<F> PinnedDrop for InTurn<F> {
        fn drop(this: Pin<&mut Self>) {
            if this.waiting.is_some() {
                this.calls.parked.fetch_sub(1, Ordering::Relaxed);
            }
            this.calls.end();
        }
    }
}

impl<F> InTurn<F> {
    /// Counts `call`, taken at `at`, on `calls`; parked, it waits for a turn until
    /// `parks_until` at most.
    pub fn new(
        call: F,
        calls: Arc<ConnectionCalls>,
        at: Instant,
        parks_until: Instant,
    ) -> InTurn<F> {
        calls.begin(at);
        InTurn {
            call,
            calls,
            turn: None,
            waiting: None,
            parks_until,
        }
    }
}

impl<F: Future> Future for InTurn<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        if this.turn.is_none() {
            let taken = if let Some(waiting) = this.waiting.as_mut() {
                let granted = std::task::ready!(waiting.as_mut().poll(cx));
                *this.waiting = None;
                this.calls.parked.fetch_sub(1, Ordering::Relaxed);
                granted
            } else if this.calls.over_share() {
                match Arc::clone(&this.calls.turns).try_acquire_owned() {
                    Ok(turn) => Some(turn),
                    Err(TryAcquireError::NoPermits) => {
                        let mut waiting = park(Arc::clone(this.calls), *this.parks_until);
                        let Poll::Ready(granted) = waiting.as_mut().poll(cx) else {
                            *this.waiting = Some(waiting);
                            this.calls.parked.fetch_add(1, Ordering::Relaxed);
                            return Poll::Pending;
                        };
                        granted
                    }
                    Err(TryAcquireError::Closed) => None,
                }
            } else {
                this.calls.release_parked();
                None
            };
            if let Some(turn) = taken {
                // The calls already in the run queue go first. (A call woken by a turn given
                // back would otherwise run next, in Tokio's LIFO slot, and chain this
                // connection's calls ahead of every other.)
                *this.turn = Some(turn);
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
        }
        let polled = this.call.poll(cx);
        // Given back whether the call is done or now waits (on Redis, say): the next call
        // of the connection runs meanwhile, and this one needs a turn again to go on.
        *this.turn = None;
        polled
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    use super::*;

    /// Counts how often it is woken.
    #[derive(Default)]
    struct Wakes(AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A call that counts its runs and is done after its first; it waits parked for a turn
    /// until `parks_until` at most.
    fn call_parking_until(
        calls: &Arc<ConnectionCalls>,
        runs: &Arc<AtomicUsize>,
        parks_until: Instant,
    ) -> Pin<Box<InTurn<impl Future<Output = ()> + use<>>>> {
        let runs = Arc::clone(runs);
        let run = std::future::poll_fn(move |_| {
            runs.fetch_add(1, Ordering::Relaxed);
            Poll::Ready(())
        });
        Box::pin(InTurn::new(
            run,
            Arc::clone(calls),
            Instant::now(),
            parks_until,
        ))
    }

    /// Such a call with a deadline far off.
    fn call(
        calls: &Arc<ConnectionCalls>,
        runs: &Arc<AtomicUsize>,
    ) -> Pin<Box<InTurn<impl Future<Output = ()> + use<>>>> {
        call_parking_until(calls, runs, Instant::now() + Duration::from_secs(60))
    }

    fn connection(all: &Arc<Outstanding>) -> Arc<ConnectionCalls> {
        Arc::new(ConnectionCalls::new(Arc::clone(all), 1))
    }

    #[tokio::test]
    async fn connections_with_even_loads_never_wait_for_a_turn() {
        let all = Arc::new(Outstanding::default());
        let runs = Arc::new(AtomicUsize::new(0));
        let connections: Vec<_> = (0..4).map(|_| connection(&all)).collect();
        let mut pending: Vec<_> = connections
            .iter()
            .flat_map(|calls| (0..20).map(|_| call(calls, &runs)).collect::<Vec<_>>())
            .collect();
        let mut cx = Context::from_waker(std::task::Waker::noop());
        for call in &mut pending {
            assert!(call.as_mut().poll(&mut cx).is_ready());
        }
        assert_eq!(runs.load(Ordering::Relaxed), 80);
        drop(pending);
        assert_eq!(all.calls.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_connection_over_its_share_lets_the_others_go_first() {
        let all = Arc::new(Outstanding::default());
        let (heavy, light) = (connection(&all), connection(&all));
        let (heavy_runs, light_runs) = (Arc::default(), Arc::default());
        let mut light_call = call(&light, &light_runs);
        let mut first = call(&heavy, &heavy_runs);
        let mut second = call(&heavy, &heavy_runs);
        let mut more: Vec<_> = (0..6).map(|_| call(&heavy, &heavy_runs)).collect();
        let wakes = Arc::new(Wakes::default());
        let waker = std::task::Waker::from(Arc::clone(&wakes));
        let mut cx = Context::from_waker(&waker);

        // 8 calls against 1: the first takes the free turn and goes to the back of the
        // queue (it wakes itself); the next waits parked for the turn.
        assert!(first.as_mut().poll(&mut cx).is_pending());
        assert_eq!(wakes.0.load(Ordering::Relaxed), 1);
        assert!(second.as_mut().poll(&mut cx).is_pending());
        assert_eq!(wakes.0.load(Ordering::Relaxed), 1, "parked, not woken");
        assert_eq!(heavy_runs.load(Ordering::Relaxed), 0);
        // The light call, behind them in the queue, runs at once.
        assert!(light_call.as_mut().poll(&mut cx).is_ready());
        assert_eq!(light_runs.load(Ordering::Relaxed), 1);
        // Then the first heavy call runs, and hands its turn to the second, which goes to
        // the back of the queue once more before it runs.
        assert!(first.as_mut().poll(&mut cx).is_ready());
        assert_eq!(wakes.0.load(Ordering::Relaxed), 2, "the second is woken");
        assert!(second.as_mut().poll(&mut cx).is_pending());
        assert_eq!(wakes.0.load(Ordering::Relaxed), 3);
        assert_eq!(heavy_runs.load(Ordering::Relaxed), 1);
        assert!(second.as_mut().poll(&mut cx).is_ready());
        assert_eq!(heavy_runs.load(Ordering::Relaxed), 2);
        // Once the light caller is gone from the recent ones, nothing waits: 6 calls held
        // alone are no one's share.
        drop((light_call, first, second));
        tokio::time::pause();
        tokio::time::advance(RECENT * 3).await;
        let mut late = call(&heavy, &heavy_runs);
        assert!(late.as_mut().poll(&mut cx).is_ready());
        for call in &mut more {
            assert!(call.as_mut().poll(&mut cx).is_ready());
        }
        assert_eq!(heavy_runs.load(Ordering::Relaxed), 9);
    }

    #[tokio::test(start_paused = true)]
    async fn a_parked_call_runs_without_a_turn_once_its_share_of_the_deadline_is_spent() {
        let now = Instant::now();
        let parks_until = parks_until(now, Some(Duration::from_millis(20)));
        assert_eq!(parks_until, now + Duration::from_millis(5));
        let all = Arc::new(Outstanding::default());
        let (heavy, light) = (connection(&all), connection(&all));
        let (heavy_runs, light_runs) = (Arc::default(), Arc::default());
        let _light_call = call(&light, &light_runs);
        let mut first = call(&heavy, &heavy_runs);
        let mut second = call_parking_until(&heavy, &heavy_runs, parks_until);
        let _more: Vec<_> = (0..6).map(|_| call(&heavy, &heavy_runs)).collect();
        let wakes = Arc::new(Wakes::default());
        let waker = std::task::Waker::from(Arc::clone(&wakes));
        let mut cx = Context::from_waker(&waker);

        // The first heavy call holds the only turn; the second waits parked for it.
        assert!(first.as_mut().poll(&mut cx).is_pending());
        assert!(second.as_mut().poll(&mut cx).is_pending());
        assert_eq!(wakes.0.load(Ordering::Relaxed), 1, "parked, not woken");
        assert_eq!(heavy.parked.load(Ordering::Relaxed), 1);
        // A quarter of its 20 ms later it is woken, and runs while the turn is still held.
        tokio::time::advance(Duration::from_millis(4)).await;
        assert_eq!(wakes.0.load(Ordering::Relaxed), 1, "not before its time");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(wakes.0.load(Ordering::Relaxed), 2);
        assert!(second.as_mut().poll(&mut cx).is_ready());
        assert_eq!(heavy_runs.load(Ordering::Relaxed), 1);
        assert_eq!(heavy.parked.load(Ordering::Relaxed), 0);
        assert_eq!(
            heavy.turns.available_permits(),
            0,
            "the first call's turn is still out"
        );
    }

    #[test]
    fn a_call_without_a_deadline_parks_for_the_queue_target() {
        let now = Instant::now();
        assert_eq!(
            parks_until(now, None),
            now + super::super::DEFAULT_TARGET_LATENCY
        );
        assert_eq!(
            parks_until(now, Some(Duration::from_secs(1))),
            now + Duration::from_millis(250)
        );
    }

    #[tokio::test]
    async fn a_connection_back_within_its_share_releases_its_parked_calls() {
        let all = Arc::new(Outstanding::default());
        let (heavy, light) = (connection(&all), connection(&all));
        let (heavy_runs, light_runs) = (Arc::default(), Arc::default());
        let _light_call = call(&light, &light_runs);
        let mut first = call(&heavy, &heavy_runs);
        let mut second = call(&heavy, &heavy_runs);
        let more: Vec<_> = (0..6).map(|_| call(&heavy, &heavy_runs)).collect();
        let wakes = Arc::new(Wakes::default());
        let waker = std::task::Waker::from(Arc::clone(&wakes));
        let mut cx = Context::from_waker(&waker);
        assert!(first.as_mut().poll(&mut cx).is_pending());
        assert!(second.as_mut().poll(&mut cx).is_pending());
        assert_eq!(heavy.parked.load(Ordering::Relaxed), 1);

        // Its other calls answered, the connection holds 3 against the light one's 1: within
        // its share. Its next call runs at once and wakes the parked one, which runs too,
        // though the first still holds the only turn.
        drop(more);
        let mut third = call(&heavy, &heavy_runs);
        assert!(third.as_mut().poll(&mut cx).is_ready());
        assert_eq!(
            wakes.0.load(Ordering::Relaxed),
            2,
            "the parked call is woken"
        );
        assert!(second.as_mut().poll(&mut cx).is_ready());
        assert_eq!(heavy_runs.load(Ordering::Relaxed), 2);
        assert_eq!(heavy.parked.load(Ordering::Relaxed), 0);
        assert_eq!(heavy.turns.available_permits(), 0);
    }
}
