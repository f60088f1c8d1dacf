//! The standing wait: how long a call's answer is taken to need on its way out, from its own
//! way in and the average of recent calls'.
//!
//! One call's wait says little about the next: a passing stall (a rules reload, a metrics
//! scrape, a page fault) stretches a few calls' waits and is gone by the time they are
//! answered. Taking each call's own wait as its way out shed such calls, and under the
//! default failure mode they were answered OK without a decision: sheds no client saw.
//!
//! So each call's wait also moves an average an eighth of the way. A call that waited over
//! twice the average met a stall, and its way out is taken to be the average; any other
//! call's way out is taken to be its own wait, as long as it came. Under overload that is
//! the estimate that answered no call late: the least wait over a window, and the average
//! alone, both let in calls whose answers then came after their deadline (1 to 2% of them at
//! twice the capacity), for some call of every window is read or run at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Each new wait moves the average by this fraction of the difference (1/8).
const WEIGHT_SHIFT: u32 = 3;
/// A wait over this many times the average is a stall's, not a queue's: the first five or so
/// calls of a stall are, and under overload a call's own wait stays the estimate, which
/// answered none of them late.
const OUTLIER: u64 = 2;

/// A moving average of recent calls' waits, in µs.
#[derive(Debug, Default)]
pub struct StandingWait {
    average_us: AtomicU64,
}

impl StandingWait {
    /// Records the wait of a call and returns how long its way out is taken to be: its own
    /// wait, unless that is over [`OUTLIER`] times the average (a passing stall, not a
    /// queue), when the average stands for it.
    pub fn record(&self, waited: Duration) -> Duration {
        let waited_us = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX >> WEIGHT_SHIFT);
        let before = self.average_us.load(Ordering::Relaxed);
        // Racing callers may each miss the other's sample: a sample lost now and then only
        // slows the average down.
        let average = before - (before >> WEIGHT_SHIFT) + (waited_us >> WEIGHT_SHIFT);
        self.average_us.store(average, Ordering::Relaxed);
        let way_out = if waited_us > average.saturating_mul(OUTLIER) {
            average
        } else {
            waited_us
        };
        Duration::from_micros(way_out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn a_passing_stall_moves_the_standing_wait_little() {
        let standing = StandingWait::default();
        for _ in 0..50 {
            standing.record(ms(1));
        }
        // One call caught in a 1.6 s stall: the way out is taken to be about 0.2 s.
        let stalled = standing.record(ms(1_600));
        assert!(stalled < ms(205) && stalled > ms(195), "{stalled:?}");
        // A call near the average is its own estimate.
        assert_eq!(standing.record(ms(200)), ms(200));
    }

    #[test]
    fn a_wait_every_call_meets_counts_whole_after_a_few_calls() {
        let standing = StandingWait::default();
        let ways_out: Vec<_> = (0..8).map(|_| standing.record(ms(8))).collect();
        // The first calls of a queue are taken for a stall; from the sixth on, each call's
        // own wait is its way out.
        assert!(ways_out[0] < ms(2), "{ways_out:?}");
        assert_eq!(ways_out[6..], [ms(8), ms(8)]);
    }
}
