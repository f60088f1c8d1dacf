//! The standing wait: the least time calls waited on their way in over the latest window or
//! two, which is how long the way out takes too.
//!
//! One call's wait says little about the next: a passing stall (a rules reload, a metrics
//! scrape, a page fault) stretches a few calls' waits and is gone by the time they are
//! answered. Taking each call's own wait as its way out shed such calls, and under the
//! default failure mode they were answered OK without a decision: sheds no client saw. A
//! wait that every call of the latest 20 to 40 ms met is a queue that is still there.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// How long one window lasts: Envoy's default timeout, so a stall shorter than a call's
/// whole budget never sets the standing wait alone.
const WINDOW: Duration = Duration::from_millis(20);

/// The least wait over the current and the previous window.
#[derive(Debug)]
pub struct StandingWait {
    origin: Instant,
    /// When the current window began, in µs after `origin`.
    window_start_us: AtomicU64,
    /// The least wait seen in the current window, in µs (`u64::MAX`: none yet).
    current_us: AtomicU64,
    /// The least wait of the previous window, in µs; 0 when it had no call: a service
    /// without calls has no queue.
    previous_us: AtomicU64,
}

impl Default for StandingWait {
    fn default() -> StandingWait {
        StandingWait {
            origin: Instant::now(),
            window_start_us: AtomicU64::new(0),
            current_us: AtomicU64::new(u64::MAX),
            previous_us: AtomicU64::new(0),
        }
    }
}

impl StandingWait {
    /// Records the wait of a call seen at `now` and returns the standing wait, this call
    /// included: never more than its own wait.
    pub fn record(&self, now: Instant, waited: Duration) -> Duration {
        let now_us = micros(now.saturating_duration_since(self.origin));
        let waited_us = micros(waited);
        let window_us = micros(WINDOW);
        let start = self.window_start_us.load(Ordering::Relaxed);
        let elapsed = now_us.saturating_sub(start);
        if elapsed >= window_us
            && self
                .window_start_us
                .compare_exchange(start, now_us, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            // This call opens a new window; the one just closed becomes the previous one,
            // unless more than a whole window went by without a call.
            let closed = self.current_us.swap(waited_us, Ordering::Relaxed);
            let previous = if elapsed >= 2 * window_us { 0 } else { closed };
            self.previous_us.store(previous, Ordering::Relaxed);
        } else {
            self.current_us.fetch_min(waited_us, Ordering::Relaxed);
        }
        let least = self
            .previous_us
            .load(Ordering::Relaxed)
            .min(self.current_us.load(Ordering::Relaxed))
            .min(waited_us);
        Duration::from_micros(least)
    }
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[tokio::test(start_paused = true)]
    async fn a_passing_stall_is_not_a_standing_wait() {
        let standing = StandingWait::default();
        // An idle service: no queue, whatever one call waited.
        assert_eq!(standing.record(Instant::now(), ms(6)), ms(0));
        tokio::time::advance(ms(100)).await;
        assert_eq!(standing.record(Instant::now(), ms(9)), ms(0));
        // Calls met 1 ms for a while, then a stall of 12 ms: the 1 ms still stands.
        for _ in 0..3 {
            tokio::time::advance(ms(10)).await;
            standing.record(Instant::now(), ms(1));
        }
        tokio::time::advance(ms(10)).await;
        assert_eq!(standing.record(Instant::now(), ms(12)), ms(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_every_call_meets_for_two_windows_stands() {
        let standing = StandingWait::default();
        let mut latest = Duration::ZERO;
        for _ in 0..10 {
            tokio::time::advance(ms(5)).await;
            latest = standing.record(Instant::now(), ms(8));
        }
        assert_eq!(latest, ms(8));
        // A call that waited less is its own bound.
        assert_eq!(standing.record(Instant::now(), ms(3)), ms(3));
        // Once the queue drains, the standing wait follows within two windows.
        for _ in 0..10 {
            tokio::time::advance(ms(5)).await;
            latest = standing.record(Instant::now(), ms(2));
        }
        assert_eq!(latest, ms(2));
    }
}
