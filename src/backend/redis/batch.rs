//! Natural batching, per node (one `Lane` for a single node, one per master of a Redis
//! Cluster): requests bound for the node while script calls are in flight wait in a
//! queue, and the next call takes all of them as one `lua/batch.lua` call. At low load a
//! request finds a free slot and goes out at once; under load one call carries many
//! requests, so Redis parses one command and floodgate makes one round trip for all of
//! them. No timer ever holds a request back.
//!
//! The queue serves the connections that queued in turn (`fair`), not in arrival order.
//!
//! Under overload the queue is where a request waits, so `Backlog` estimates that wait from
//! the items queued and the drain rate of recent full calls, and a request whose deadline is
//! nearer than `ROOM_PER_WAIT` times that wait is refused before it queues
//! (`BackendError::Overloaded`, see `Deadline::leaves_room`). Until a rate is measured (a
//! fresh replica, or one idle for a while) the wait is estimated at a conservative
//! `PRIOR_ITEM_NS` per item: a spike that meets an unmeasured queue would otherwise fill it
//! past every deadline, every job would be late when its turn came, no call would complete,
//! and no rate would ever be measured to shed by.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::calls::GroupWords;
use super::fair::FairQueue;
use crate::backend::{BackendError, Outcome};
use crate::overload::{ConnectionId, Deadline};

/// Where a lane's calls go: runs one batch call deciding every one of `groups`, in order,
/// until `work_ends`, and returns every item's outcome (`None` for the items of a group that
/// failed inside the script).
pub(super) trait Runner: Send + Sync + 'static {
    fn run_batch(
        &self,
        groups: &[&GroupWords],
        work_ends: Instant,
    ) -> impl Future<Output = Result<Vec<Option<Outcome>>, BackendError>> + Send;
}

/// What a request's outcomes are: `None` when its group failed inside the script (a key of
/// another type, or on Redis Cluster a key the node does not hold): nothing of it stands.
pub(super) type Reply = Result<Option<Vec<Outcome>>, BackendError>;

/// The queue of one node and its batcher, which runs until the lane is dropped.
pub(super) struct Lane {
    queue: mpsc::UnboundedSender<Job>,
    backlog: Arc<Backlog>,
}

impl Lane {
    /// Starts the batcher of `runner`, which keeps at most `calls_in_flight` script calls
    /// in flight ([`CALLS_IN_FLIGHT_ALONE`], [`CALLS_IN_FLIGHT_PER_MASTER`]).
    pub(super) fn start(runner: Arc<impl Runner>, calls_in_flight: usize) -> Lane {
        let (queue, jobs) = mpsc::unbounded_channel();
        let backlog = Arc::new(Backlog::new(calls_in_flight));
        tokio::spawn(run(runner, Arc::clone(&backlog), jobs));
        Lane { queue, backlog }
    }

    /// How long `items` more, queued now, would wait before they are sent.
    pub(super) fn wait(&self, items: usize) -> Duration {
        self.backlog.wait(items)
    }

    /// Queues `group` (one request's, from `connection`) for a batch call, to be sent before
    /// `work_ends` (the backend's bound, `Group::work_ends_within`), unless the queue could not
    /// send it with room before `caller`, the caller's own deadline (`Overloaded`, nothing
    /// booked). The room covers the caller's whole wait, so it is not asked of the backend's
    /// bound: at 512 calls in flight of 5 descriptors on a cluster, 25 ms of queue against
    /// the 100 ms bound refused calls whose callers had given them a second (about 500-900
    /// in a 4 s run).
    pub(super) async fn decide(
        &self,
        group: GroupWords,
        work_ends: Instant,
        caller: Option<Deadline>,
        connection: Option<ConnectionId>,
    ) -> Reply {
        if caller.is_some_and(|caller| !self.backlog.in_time(group.len(), caller)) {
            return Err(BackendError::Overloaded);
        }
        let (reply, outcomes) = oneshot::channel();
        let items = group.len();
        let stopped = || BackendError::Unavailable("the Redis batcher stopped".into());
        self.backlog.queued(items);
        if self
            .queue
            .send(Job {
                group,
                work_ends,
                connection,
                reply,
            })
            .is_err()
        {
            self.backlog.taken(items);
            return Err(stopped());
        }
        outcomes.await.unwrap_or_else(|_| Err(stopped()))
    }
}

/// Script calls in flight at once on a lone Redis (one node, or Sentinel's master); more
/// requests wait and share the next call. Redis runs one script at a time, so two keep it
/// busy (one runs while the other travels); more would only split the queue into smaller
/// calls, and each call has a fixed cost in Redis (about as much as five items: `TIME`, the
/// call, the reply).
pub(super) const CALLS_IN_FLIGHT_ALONE: usize = 2;
/// Script calls in flight at once on each master of a Redis Cluster: one. The masters already
/// overlap each other's round trips, and fuller calls cost each master less CPU per decision,
/// which is what a cluster is sized by. Measured on 3 masters, 10k buckets: at 64 in flight
/// 24.1 us of Redis CPU per decision against 27.1 with two, 0.135 calls per decision against
/// 0.208, 19% more decisions/s; at 512, 28% more. The price: one hot bucket, whose master
/// alone works, decides about 18% less at 512 in flight than with two calls.
pub(super) const CALLS_IN_FLIGHT_PER_MASTER: usize = 1;
/// Most items in one call: bounds how long one script keeps Redis busy.
const MAX_ITEMS: usize = 256;
/// Most work in one call (`GroupWords::work`: one per item plus the sliding-log entries a
/// denial may read), so that items are not the only measure: a request that may read
/// thousands of log entries goes in a call of its own (a call always takes its first
/// request), and the light requests queued beside it are not made to wait for its reads
/// inside one script. 256 light items fit; reading an entry costs far less than an item.
const MAX_WORK: u64 = 1_024;
/// Time per queued item assumed while no drain rate is known: several times what a Redis
/// node takes per item of a full call (a few microseconds of script, plus the call's share of
/// its round trip), so that a spike on a fresh replica queues no more than Redis can answer
/// in time; the measured rate replaces it after the first busy window.
const PRIOR_ITEM_NS: u64 = 20_000;
/// How often the drain rate is measured.
const DRAIN_WINDOW: Duration = Duration::from_millis(100);
/// Age past which a drain rate no call has renewed is forgotten (for `PRIOR_ITEM_NS`). Only a
/// call that ends renews it, and a queue that refuses every request makes no call: a rate
/// measured in a burst (or while floodgate itself was starved of CPU) then refused every
/// later request, for good. 64-descriptor requests at 8 in flight were all refused after
/// such a burst.
const RATE_KEPT_FOR: Duration = Duration::from_millis(2 * DRAIN_WINDOW.as_millis() as u64);
/// Mean items per call from which a window counts as busy: only full-ish calls show what the
/// node drains under load (a lone item pays the whole round trip).
const BUSY_ITEMS_PER_CALL: u64 = 8;

/// The queue's length and drain rate (see the module doc).
#[derive(Debug)]
struct Backlog {
    /// Most script calls in flight at once.
    calls_in_flight: usize,
    /// Items waiting for a call.
    queued: AtomicU64,
    /// Time the queue takes per item while busy, in ns; 0 when not known (not busy lately),
    /// and then `PRIOR_ITEM_NS` stands in.
    item_ns: AtomicU64,
    /// When `item_ns` was measured, in ns since `origin`.
    measured_ns: AtomicU64,
    origin: Instant,
    window: parking_lot::Mutex<DrainWindow>,
}

#[derive(Debug, Default)]
struct DrainWindow {
    started: Option<Instant>,
    calls: u64,
    items: u64,
    busy_ns: u64,
}

impl Backlog {
    fn new(calls_in_flight: usize) -> Backlog {
        Backlog {
            calls_in_flight: calls_in_flight.max(1),
            queued: AtomicU64::default(),
            item_ns: AtomicU64::default(),
            measured_ns: AtomicU64::default(),
            origin: Instant::now(),
            window: parking_lot::Mutex::default(),
        }
    }

    /// Whether `items` more, queued now, leave room before the caller's `deadline`
    /// (`Deadline::leaves_room`).
    fn in_time(&self, items: usize, deadline: Deadline) -> bool {
        let now = Instant::now();
        deadline.leaves_room(now, self.wait_at(items, || now))
    }

    /// The queue's wait for `items` more.
    fn wait(&self, items: usize) -> Duration {
        self.wait_at(items, Instant::now)
    }

    /// The queue's wait for `items` more at `now`: the items ahead and these at the recent
    /// drain rate; while no rate is known or current, the items ahead alone at
    /// `PRIOR_ITEM_NS` (an idle queue then refuses nothing, whatever the request's size). The
    /// clock is read only when a rate is known, so an idle queue costs admission no clock
    /// read.
    fn wait_at(&self, items: usize, now: impl FnOnce() -> Instant) -> Duration {
        let queued = self.queued.load(Ordering::Relaxed);
        let measured = self.item_ns.load(Ordering::Relaxed);
        let current = measured != 0
            && self
                .nanos_at(now())
                .saturating_sub(self.measured_ns.load(Ordering::Relaxed))
                <= RATE_KEPT_FOR.as_nanos() as u64;
        let wait_ns = if current {
            (queued + items as u64).saturating_mul(measured)
        } else {
            queued.saturating_mul(PRIOR_ITEM_NS)
        };
        Duration::from_nanos(wait_ns)
    }

    fn nanos_at(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX)
    }

    fn queued(&self, items: usize) {
        self.queued.fetch_add(items as u64, Ordering::Relaxed);
    }

    fn taken(&self, items: usize) {
        self.queued.fetch_sub(items as u64, Ordering::Relaxed);
    }

    /// Learns from one call of `items` items that took `took`.
    fn drained(&self, items: usize, took: Duration) {
        let now = Instant::now();
        let mut window = self.window.lock();
        let started = *window.started.get_or_insert(now);
        window.calls += 1;
        window.items += items as u64;
        window.busy_ns += took.as_nanos() as u64;
        if now.saturating_duration_since(started) < DRAIN_WINDOW {
            return;
        }
        // Calls overlap (`calls_in_flight` at once), so the queue drains that much faster.
        let busy = window.items >= window.calls * BUSY_ITEMS_PER_CALL;
        let item_ns = if busy {
            window.busy_ns / window.items / self.calls_in_flight as u64
        } else {
            0
        };
        self.item_ns.store(item_ns, Ordering::Relaxed);
        self.measured_ns
            .store(self.nanos_at(now), Ordering::Relaxed);
        *window = DrainWindow::default();
    }
}

/// One request waiting for its call.
struct Job {
    /// The request's group, encoded.
    group: GroupWords,
    /// When the backend's work for it ends (the caller's deadline or the backend's bound,
    /// whichever comes first).
    work_ends: Instant,
    /// The connection it came on.
    connection: Option<ConnectionId>,
    /// Where its outcomes go.
    reply: oneshot::Sender<Reply>,
}

/// Takes queued jobs into calls, at most `calls_in_flight` at a time, until the lane is
/// dropped (its sender closes the queue), then lets the calls in flight finish.
///
/// The calls run inside this task (polled together), not in a task each: a batch costs no
/// spawn and no extra wake-up between the batcher and the connection's driver.
async fn run(
    node: Arc<impl Runner>,
    backlog: Arc<Backlog>,
    mut jobs: mpsc::UnboundedReceiver<Job>,
) {
    let mut in_flight = FuturesUnordered::new();
    let mut queued = FairQueue::default();
    loop {
        if in_flight.len() >= backlog.calls_in_flight {
            in_flight.next().await;
            continue;
        }
        if queued.is_empty() {
            tokio::select! {
                // A call that ends frees its slot; an empty set disables this branch.
                Some(()) = in_flight.next() => continue,
                job = jobs.recv() => match job {
                    Some(job) => queued.push(job.connection, job),
                    None => break,
                },
            }
        }
        // Every job that arrived meanwhile takes its place in the turns.
        while let Ok(job) = jobs.try_recv() {
            queued.push(job.connection, job);
        }
        let Some(first) = queued.pop() else {
            continue;
        };
        let (mut items, mut work) = (first.group.len(), first.group.work());
        let mut batch = vec![first];
        while let Some(job) = queued.peek() {
            if items + job.group.len() > MAX_ITEMS || work + job.group.work() > MAX_WORK {
                break;
            }
            items += job.group.len();
            work += job.group.work();
            batch.extend(queued.pop());
        }
        backlog.taken(items);
        in_flight.push(send(&*node, &backlog, batch));
    }
    while in_flight.next().await.is_some() {}
}

/// Sends one call for `jobs` and hands each job its outcomes (or the call's error).
async fn send(node: &impl Runner, backlog: &Backlog, jobs: Vec<Job>) {
    let now = Instant::now();
    // A caller that gave up or ran out of time is not sent: nothing is booked for it.
    let (live, late): (Vec<Job>, Vec<Job>) = jobs
        .into_iter()
        .partition(|job| !job.reply.is_closed() && job.work_ends > now);
    for job in late {
        let _ = job.reply.send(Err(BackendError::Timeout));
    }
    let Some(work_ends) = live.iter().map(|job| job.work_ends).max() else {
        return;
    };
    let groups: Vec<&GroupWords> = live.iter().map(|job| &job.group).collect();
    let items = groups.iter().map(|group| group.len()).sum();
    let result = node.run_batch(&groups, work_ends).await;
    if result.is_ok() {
        backlog.drained(items, now.elapsed());
    }
    match result {
        Ok(outcomes) => {
            let mut outcomes = outcomes.into_iter();
            for job in live {
                // A job whose charge failed in the script fails alone (nothing of it stands).
                // Every one of its outcomes is taken, failed or not, so that the next job
                // starts at its own.
                let mut mine = Vec::with_capacity(job.group.len());
                let mut failed = false;
                for outcome in outcomes.by_ref().take(job.group.len()) {
                    match outcome {
                        Some(outcome) => mine.push(outcome),
                        None => failed = true,
                    }
                }
                let _ = job.reply.send(Ok((!failed).then_some(mine)));
            }
        }
        Err(error) => {
            for job in live {
                let _ = job.reply.send(Err(error.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_queue_refuses_what_it_cannot_send_with_room_measured_or_not() {
        let backlog = Backlog::new(2);
        let soon = Deadline::ending_at(Instant::now() + Duration::from_millis(10));
        // Nothing measured yet (a fresh replica): an idle queue refuses nothing, and the
        // prior of 20 us an item bounds what waits ahead: 125 items with 10 ms of room (4
        // times 2.5 ms).
        assert!(backlog.in_time(100_000, soon));
        backlog.queued(125);
        assert!(backlog.in_time(1, soon));
        backlog.queued(1);
        assert!(!backlog.in_time(1, soon));
        backlog.queued(100_000 - 126);
        assert!(!backlog.in_time(1, soon));
        // A busy window: calls of 200 items taking 2 ms, two at a time: 5 us an item.
        for _ in 0..2 {
            backlog.drained(200, Duration::from_millis(2));
            tokio::time::advance(DRAIN_WINDOW).await;
        }
        backlog.drained(200, Duration::from_millis(2));
        assert_eq!(backlog.item_ns.load(Ordering::Relaxed), 5_000);
        let soon = Deadline::ending_at(Instant::now() + Duration::from_millis(20));
        // 100,000 items ahead take 500 ms: refused; once they are sent, admitted when the
        // deadline leaves `ROOM_PER_WAIT` (4) times their wait.
        assert!(!backlog.in_time(1, soon));
        backlog.taken(99_000);
        assert!(!backlog.in_time(1, soon), "1,001 items take just over 5 ms");
        backlog.taken(100);
        assert!(backlog.in_time(1, soon), "901 items take 4.5 ms");
        assert!(
            !backlog.in_time(2_000, soon),
            "a heavy request needs more room"
        );
        // Lone items (an idle node) say nothing about its drain rate: the prior stands in.
        tokio::time::advance(DRAIN_WINDOW).await;
        backlog.drained(200, Duration::from_millis(2));
        for _ in 0..2 {
            backlog.drained(1, Duration::from_millis(2));
            tokio::time::advance(DRAIN_WINDOW).await;
        }
        backlog.drained(1, Duration::from_millis(2));
        assert_eq!(backlog.item_ns.load(Ordering::Relaxed), 0);
        assert_eq!(backlog.wait(100), Duration::from_nanos(900 * PRIOR_ITEM_NS));
    }

    #[tokio::test(start_paused = true)]
    async fn a_rate_no_call_renews_is_forgotten() {
        let backlog = Backlog::new(1);
        // Busy windows of calls of 64 items taking 64 ms: 1 ms an item.
        for _ in 0..2 {
            backlog.drained(64, Duration::from_millis(64));
            tokio::time::advance(DRAIN_WINDOW).await;
        }
        backlog.drained(64, Duration::from_millis(64));
        let soon = || Deadline::ending_at(Instant::now() + Duration::from_millis(20));
        assert!(!backlog.in_time(64, soon()), "64 items take 64 ms");
        // Every request refused, so no call ends: the rate ages out, and requests go again
        // (at the prior's pace).
        tokio::time::advance(RATE_KEPT_FOR / 2).await;
        assert!(!backlog.in_time(64, soon()), "still current");
        tokio::time::advance(RATE_KEPT_FOR).await;
        assert!(backlog.in_time(64, soon()));
    }
}
