//! Sliding log: the exact algorithm. Every admitted booking is logged with its timestamp,
//! so no span of `W` ms ever admits more than `L`. Memory grows with the bookings in the
//! last `W`, which is why validation limits it to `L <= 10000`.
//!
//! State: the bookings `(ts, count)` in ascending `ts`, one element per instant (bookings
//! at the same ms merge). In Lua: a sorted set scored by `ts`, or any structure with the
//! same content. A missing key is the empty log. An entry is live at `now` iff
//! `ts > now - W`; `count` below is the sum over live entries.
//!
//! - check `n`: drop the entries that are no longer live, then allow iff `count + n <= L`.
//!   OK: add `(now, n)` (merged into an entry with the same `ts`; inserted in order when the
//!   clock went backwards, so the log stays sorted and a refund still finds it), remaining
//!   `L - count - n`, R = `newest_ts + W - now` (`W` right after a booking).
//!   OVER: remaining 0, nothing written, R = the wait until enough units leave: with
//!   `k = count + n - L`, walk from the oldest live entry summing counts until the sum
//!   reaches `k`; R = that entry's `ts + W - now`. When `n > L` (never fits), or when the
//!   log holds more than `L` (the limit was lowered), R = `newest_ts + W - now`, or `W` for
//!   a log with nothing live (a denial never answers 0).
//! - under `consume` a denial books its cost too, without a new entry: it joins the newest
//!   entry, which moves to `now` (merged in place when the clock went backwards), or starts
//!   the log when it is empty. So the log never holds more entries than admitted bookings
//!   (at most `L`), its count may pass `L` (a debt, waited out until the newest entry
//!   leaves, as for any log over its limit), and the whole debt lasts a full window from the
//!   latest denial: never shorter than booking it as an entry of its own. The count is
//!   capped at 2^53.
//! - peek: allowed iff `count + 1 <= L`; remaining `max(0, L - count)`; R = `newest_ts + W -
//!   now` when allowed (0 for an empty log), else as a denied `n = 1`. No write.
//! - refund `(cost, booked_at)`: remove up to `cost` units from the entry with
//!   `ts == booked_at`, dropping it at 0.
//! - expires at `newest_ts + W`, or at once (0) when the log is empty.

use std::collections::VecDeque;

/// Most log entries one charge of `cost` against `limit` makes Redis read (`wait` in
/// lua/sliding_log.lua: a denial reads from the nearer end of the log): `min(n, L - n + 1)`
/// for a cost `n` in `1..=L`, one for a peek or a cost above `L`. A log holding more than
/// `L` units (for one window after a rule's limit was lowered) is not walked at all (see
/// `wait`), so this bound always holds. The Redis batcher weighs calls by it.
pub fn wait_reads(limit: u64, cost: u64) -> u64 {
    if cost == 0 || cost > limit {
        return 1;
    }
    cost.min(limit - cost + 1)
}

use super::{Counter, MAX_COUNT, Params, Verdict, instant, reset};

/// Bookings of the last window, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlidingLog {
    /// `(ts, count)`, strictly ascending in `ts`.
    entries: VecDeque<(i64, u64)>,
    /// Sum of every count in `entries`, live or not yet dropped: saves a walk per decision.
    total: u64,
}

/// The live part of a log at one instant.
struct Live {
    /// Index of the oldest live entry.
    first: usize,
    /// Sum of the live counts.
    count: u64,
}

impl SlidingLog {
    /// The logged bookings, oldest first (expired ones may linger until the next write).
    pub fn entries(&self) -> impl Iterator<Item = (i64, u64)> + '_ {
        self.entries.iter().copied()
    }

    /// How many instants the log holds (expired ones until the next write drops them).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the log holds no booking.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn live(&self, params: &Params, now_ms: i64) -> Live {
        let horizon = i128::from(now_ms) - params.window();
        let first = self
            .entries
            .partition_point(|&(ts, _)| i128::from(ts) <= horizon);
        let expired: u64 = self.entries.range(..first).map(|&(_, n)| n).sum();
        Live {
            first,
            count: self.total - expired,
        }
    }

    fn drop_expired(&mut self, params: &Params, now_ms: i64) {
        let horizon = i128::from(now_ms) - params.window();
        while let Some(&(ts, n)) = self.entries.front() {
            if i128::from(ts) > horizon {
                break;
            }
            self.entries.pop_front();
            self.total -= n;
        }
    }

    /// ms from `now` until the newest booking leaves the window (0 when nothing is live).
    fn until_newest_leaves(&self, params: &Params, now_ms: i64, live: &Live) -> u64 {
        match self.entries.back() {
            Some(&(ts, _)) if live.first < self.entries.len() => {
                reset(i128::from(ts) + params.window() - i128::from(now_ms))
            }
            _ => 0,
        }
    }

    /// R for a denied `cost`: until enough of the oldest units have left the window. A log
    /// over its limit (the rule's limit was lowered) answers until the newest leaves, an
    /// upper bound, so no denial ever reads more than `wait_reads` entries in Redis.
    fn wait(&self, params: &Params, now_ms: i64, live: &Live, cost: u64) -> u64 {
        if cost > params.limit || live.count > params.limit {
            // A cost that never fits, on a log with nothing live: as long as a booking
            // of it would last, never 0 for a denial.
            return match self.until_newest_leaves(params, now_ms, live) {
                0 => reset(params.window()),
                wait => wait,
            };
        }
        let excess = u128::from(live.count) + u128::from(cost) - u128::from(params.limit);
        let mut left = 0u128;
        for &(ts, n) in self.entries.range(live.first..) {
            left += u128::from(n);
            if left >= excess {
                return reset(i128::from(ts) + params.window() - i128::from(now_ms));
            }
        }
        // Unreachable while the count is the sum of the live entries; stay well-defined.
        self.until_newest_leaves(params, now_ms, live)
    }

    /// Books a denied `cost` under `consume`: into the newest entry, moved to `now`.
    fn book_over(&mut self, now_ms: i64, cost: u64) {
        let cost = cost.min(MAX_COUNT.saturating_sub(self.total));
        self.total += cost;
        match self.entries.back_mut() {
            None => self.entries.push_back((now_ms, cost)),
            Some((ts, n)) if *ts >= now_ms => *n += cost,
            Some((ts, n)) => {
                *ts = now_ms;
                *n += cost;
            }
        }
    }

    fn book(&mut self, now_ms: i64, cost: u64) {
        self.total += cost;
        match self.entries.back_mut() {
            None => self.entries.push_back((now_ms, cost)),
            Some((ts, _)) if *ts < now_ms => self.entries.push_back((now_ms, cost)),
            Some((ts, n)) if *ts == now_ms => *n += cost,
            Some(_) => {
                let at = self.entries.partition_point(|&(ts, _)| ts < now_ms);
                match self.entries.get_mut(at) {
                    Some((ts, n)) if *ts == now_ms => *n += cost,
                    _ => self.entries.insert(at, (now_ms, cost)),
                }
            }
        }
    }
}

impl Counter for SlidingLog {
    fn check(&mut self, params: &Params, now_ms: i64, cost: u64, book_on_deny: bool) -> Verdict {
        self.drop_expired(params, now_ms);
        let live = Live {
            first: 0,
            count: self.total,
        };
        match self.total.checked_add(cost) {
            Some(after) if after <= params.limit => {
                self.book(now_ms, cost);
                let live = Live {
                    first: 0,
                    count: after,
                };
                Verdict {
                    allowed: true,
                    remaining: params.limit - after,
                    reset_ms: self.until_newest_leaves(params, now_ms, &live),
                    booked: true,
                }
            }
            _ => {
                let wait = self.wait(params, now_ms, &live, cost);
                if book_on_deny {
                    self.book_over(now_ms, cost);
                }
                Verdict::denied(wait, book_on_deny)
            }
        }
    }

    fn peek(&self, params: &Params, now_ms: i64) -> Verdict {
        let live = self.live(params, now_ms);
        let allowed = live.count < params.limit;
        Verdict {
            allowed,
            remaining: params.limit.saturating_sub(live.count),
            reset_ms: if allowed {
                self.until_newest_leaves(params, now_ms, &live)
            } else {
                self.wait(params, now_ms, &live, 1)
            },
            booked: false,
        }
    }

    fn refund(&mut self, params: &Params, now_ms: i64, cost: u64, booked_at_ms: i64) {
        self.drop_expired(params, now_ms);
        if let Ok(at) = self
            .entries
            .binary_search_by_key(&booked_at_ms, |&(ts, _)| ts)
        {
            let n = &mut self.entries[at].1;
            let taken = cost.min(*n);
            *n -= taken;
            self.total -= taken;
            if *n == 0 {
                self.entries.remove(at);
            }
        }
    }

    fn expires_at_ms(&self, params: &Params) -> i64 {
        self.entries
            .back()
            .map_or(0, |&(ts, _)| instant(i128::from(ts) + params.window()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::test_params::minute as params;

    use crate::algorithm::test_params::W;
    const NOW: i64 = 1_700_000_000_000;

    /// The log of the sliding-log vector of tests/vectors/algorithms.json (which checks its
    /// answers): what has left the window is dropped, same-instant bookings are one entry.
    #[test]
    fn the_log_keeps_the_live_bookings_in_order() {
        let p = params(5);
        let mut log = SlidingLog::default();
        for (at, cost) in [
            (NOW, 2),
            (NOW + 1_000, 3),
            (NOW + 10_000, 1),
            (NOW + 10_000, 3),
        ] {
            log.check(&p, at, cost, false);
        }
        log.check(&p, NOW + W, 2, false);
        assert_eq!(
            log.entries().collect::<Vec<_>>(),
            [(NOW + 1_000, 3), (NOW + W, 2)]
        );
    }

    #[test]
    fn a_wait_reads_at_most_half_a_full_log() {
        assert_eq!(wait_reads(10_000, 10_000), 1);
        assert_eq!(wait_reads(10_000, 1), 1);
        assert_eq!(wait_reads(10_000, 5_000), 5_000);
        assert_eq!(wait_reads(10_000, 5_001), 5_000);
        assert_eq!(wait_reads(10_000, 0), 1);
        assert_eq!(wait_reads(10_000, u64::MAX), 1);
        let most = (1..=10_000).map(|n| wait_reads(10_000, n)).max();
        assert_eq!(most, Some(5_000));
    }

    #[test]
    fn a_log_over_a_lowered_limit_waits_for_the_newest() {
        let mut log = SlidingLog::default();
        for at in 0..10 {
            log.check(&params(10), NOW + at, 1, false);
        }
        let lowered = params(5);
        let v = log.check(&lowered, NOW + 10, 1, false);
        assert_eq!((v.allowed, v.reset_ms), (false, W as u64 - 1));
        assert_eq!(log.peek(&lowered, NOW + 10).reset_ms, W as u64 - 1);
        // At the limit again, the wait is exact.
        let v = log.check(&params(10), NOW + 10, 1, false);
        assert_eq!((v.allowed, v.reset_ms), (false, W as u64 - 10));
    }

    #[test]
    fn never_fitting_cost_waits_for_the_newest() {
        let p = params(5);
        let mut log = SlidingLog::default();
        // Nothing live: as long as a booking would last, never 0 for a denial.
        assert_eq!(log.check(&p, NOW, 6, false).reset_ms, W as u64);
        log.check(&p, NOW, 1, false);
        log.check(&p, NOW + 5_000, 1, false);
        let v = log.check(&p, NOW + 6_000, 6, false);
        assert_eq!((v.allowed, v.reset_ms), (false, 59_000));
        let v = log.check(&p, NOW, u64::MAX, false);
        assert!(!v.allowed);
    }

    #[test]
    fn same_instant_bookings_merge_and_a_consumed_denial_joins_the_newest_entry() {
        let p = params(3);
        let mut log = SlidingLog::default();
        log.check(&p, NOW, 1, false);
        log.check(&p, NOW + 10, 2, false);
        assert_eq!(log.entries().collect::<Vec<_>>(), [(NOW, 1), (NOW + 10, 2)]);
        // Under reject a denial books nothing; under consume it moves the newest entry to now.
        let v = log.check(&p, NOW + 20, 1, false);
        assert!(!v.allowed && !v.booked);
        let v = log.check(&p, NOW + 20, 5, true);
        assert!(!v.allowed && v.booked);
        assert_eq!(log.entries().collect::<Vec<_>>(), [(NOW, 1), (NOW + 20, 7)]);
        assert_eq!(log.total, 8);
        // A clock gone backwards merges in place.
        log.check(&p, NOW + 15, 1, true);
        assert_eq!(log.entries().collect::<Vec<_>>(), [(NOW, 1), (NOW + 20, 8)]);
        // An empty log starts with the denied cost.
        let mut empty = SlidingLog::default();
        let v = empty.check(&p, NOW, 4, true);
        assert!(!v.allowed && v.booked);
        assert_eq!(empty.entries().collect::<Vec<_>>(), [(NOW, 4)]);
    }

    #[test]
    fn peek_changes_nothing() {
        let p = params(2);
        let mut log = SlidingLog::default();
        let v = log.peek(&p, NOW);
        assert_eq!((v.allowed, v.remaining, v.reset_ms), (true, 2, 0));
        log.check(&p, NOW, 1, false);
        let v = log.peek(&p, NOW + 100);
        assert_eq!((v.allowed, v.remaining, v.reset_ms), (true, 1, 59_900));
        log.check(&p, NOW + 100, 1, false);
        let before = log.clone();
        let v = log.peek(&p, NOW + 200);
        assert_eq!((v.allowed, v.remaining, v.reset_ms), (false, 0, 59_800));
        // Expired entries still stored do not count for a peek.
        let v = log.peek(&p, NOW + W);
        assert_eq!((v.allowed, v.remaining, v.reset_ms), (true, 1, 100));
        assert_eq!(log, before);
    }

    #[test]
    fn refund_removes_units_of_its_own_instant() {
        let p = params(5);
        let mut log = SlidingLog::default();
        log.check(&p, NOW, 3, false);
        log.check(&p, NOW + 1, 2, false);
        log.refund(&p, NOW + 2, 1, NOW);
        assert_eq!(log.entries().collect::<Vec<_>>(), [(NOW, 2), (NOW + 1, 2)]);
        log.refund(&p, NOW + 2, 9, NOW + 1);
        assert_eq!(log.entries().collect::<Vec<_>>(), [(NOW, 2)]);
        log.refund(&p, NOW + 2, 1, NOW + 5);
        assert_eq!(log.peek(&p, NOW + 2).remaining, 3);
        assert_eq!(log.expires_at_ms(&p), NOW + W);
        log.refund(&p, NOW + 2, 2, NOW);
        assert_eq!(log.expires_at_ms(&p), 0);
    }

    #[test]
    fn clock_going_backwards_keeps_the_log_sorted() {
        let p = params(4);
        let mut log = SlidingLog::default();
        log.check(&p, NOW, 1, false);
        log.check(&p, NOW + 10, 1, false);
        let v = log.check(&p, NOW + 5, 1, false);
        assert!(v.allowed);
        assert_eq!(
            v.reset_ms,
            (W + 5) as u64,
            "newest booking is still ahead of now"
        );
        log.check(&p, NOW + 10, 1, false);
        assert_eq!(
            log.entries().collect::<Vec<_>>(),
            [(NOW, 1), (NOW + 5, 1), (NOW + 10, 2)]
        );
        log.refund(&p, NOW, 1, NOW + 5);
        assert_eq!(log.total, 3);
        let v = log.check(&p, NOW - W, 2, false);
        assert!(!v.allowed);
        assert_eq!(v.reset_ms, (2 * W) as u64, "the oldest unit leaves first");
    }

    #[test]
    fn extreme_inputs_never_panic() {
        let p = params(10_000);
        let mut log = SlidingLog::default();
        for now in [i64::MIN, -1, 0, i64::MAX, i64::MIN] {
            log.check(&p, now, u64::MAX, true);
            log.check(&p, now, 1, false);
            log.peek(&p, now);
            log.expires_at_ms(&p);
            log.refund(&p, now, u64::MAX, now);
        }
    }
}
