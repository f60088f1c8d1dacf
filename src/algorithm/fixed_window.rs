//! Fixed window: one counter per epoch-aligned window of `W` ms (the reference's algorithm).
//!
//! State (Lua: two hash fields) `{window, count}`: the window index and the cost booked in it.
//! A missing key is `{0, 0}`. With `cur = floor(now / W)` (Euclidean, so negative times work):
//!
//! - roll: if `cur > window` or `count == 0`, then `window = cur, count = 0`. An older `cur`
//!   (the clock went backwards) keeps counting in the stored window.
//! - `end = (window + 1) * W`; R = `end - now` in every answer (clamped at 0).
//! - check `n`: allow iff `count + n <= L`. OK: `count += n`, remaining `L - count`.
//!   OVER: remaining 0; under `consume` `count = min(count + n, 2^53)`, else no write.
//! - peek: allowed iff `count + 1 <= L`; remaining `max(0, L - count)`; no write.
//! - refund `(cost, booked_at)`: if `floor(booked_at / W) == window`,
//!   `count -= min(count, cost)`. Bookings of an earlier window are already forgotten.
//! - expires at `end`, or at once (0) when `count == 0`: the TTL to set on every write.

use super::{Counter, MAX_COUNT, Params, Verdict, instant, reset};

/// Count of one fixed window.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FixedWindow {
    /// Index of the window the count belongs to: `floor(t / W)`.
    pub window: i64,
    /// Cost booked in that window.
    pub count: u64,
}

impl FixedWindow {
    /// The (window, count) that apply at `now`, after a roll.
    fn rolled(&self, params: &Params, now_ms: i64) -> FixedWindow {
        let cur = now_ms.div_euclid(params.window_ms.max(1));
        if cur > self.window || self.count == 0 {
            FixedWindow {
                window: cur,
                count: 0,
            }
        } else {
            self.clone()
        }
    }

    /// R: ms from `now` to the end of the state's window.
    fn until_end(&self, params: &Params, now_ms: i64) -> u64 {
        let window = params.window();
        reset((i128::from(self.window) + 1) * window - i128::from(now_ms))
    }
}

impl Counter for FixedWindow {
    fn check(&mut self, params: &Params, now_ms: i64, cost: u64, book_on_deny: bool) -> Verdict {
        *self = self.rolled(params, now_ms);
        let reset_ms = self.until_end(params, now_ms);
        match self.count.checked_add(cost) {
            Some(total) if total <= params.limit => {
                self.count = total;
                Verdict {
                    allowed: true,
                    remaining: params.limit - total,
                    reset_ms,
                    booked: true,
                }
            }
            _ => {
                if book_on_deny {
                    self.count = self.count.saturating_add(cost).min(MAX_COUNT);
                }
                Verdict::denied(reset_ms, book_on_deny)
            }
        }
    }

    fn peek(&self, params: &Params, now_ms: i64) -> Verdict {
        let state = self.rolled(params, now_ms);
        Verdict {
            allowed: state.count < params.limit,
            remaining: params.limit.saturating_sub(state.count),
            reset_ms: state.until_end(params, now_ms),
            booked: false,
        }
    }

    fn refund(&mut self, params: &Params, _now_ms: i64, cost: u64, booked_at_ms: i64) {
        if booked_at_ms.div_euclid(params.window_ms.max(1)) == self.window {
            self.count -= self.count.min(cost);
        }
    }

    fn expires_at_ms(&self, params: &Params) -> i64 {
        if self.count == 0 {
            return 0;
        }
        instant((i128::from(self.window) + 1) * params.window())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::test_params::minute as params;

    use crate::algorithm::test_params::W;
    /// 12.3 s into some minute, as in docs/algorithms.md#test-vectors.
    const START: i64 = 1_700_000_040_000 + 12_300;

    #[test]
    fn consume_books_denials_and_saturates() {
        let p = params(5);
        let mut c = FixedWindow::default();
        c.check(&p, START, 5, true);
        let v = c.check(&p, START, 3, true);
        assert!(!v.allowed && v.booked);
        assert_eq!(c.count, 8);
        assert_eq!(c.peek(&p, START).remaining, 0);
        c.check(&p, START, u64::MAX, true);
        assert_eq!(c.count, MAX_COUNT);
        // A refund of the allowed booking still leaves the bucket over its limit.
        c.refund(&p, START, 5, START);
        assert!(!c.peek(&p, START).allowed);
    }

    #[test]
    fn refund_only_touches_its_own_window() {
        let p = params(5);
        let mut c = FixedWindow::default();
        c.check(&p, START, 3, false);
        c.refund(&p, START, 2, START);
        assert_eq!(c.count, 1);
        c.refund(&p, START, 9, START);
        assert_eq!(c.count, 0);

        c.check(&p, START, 3, false);
        c.refund(&p, START, 3, START - W);
        assert_eq!(
            c.count, 3,
            "a booking from the previous window is already gone"
        );
        let next = START + W;
        c.check(&p, next, 1, false);
        c.refund(&p, next, 3, START);
        assert_eq!(c.count, 1);
    }

    #[test]
    fn huge_costs_and_extreme_times_never_panic() {
        let p = params(u64::from(u32::MAX));
        let mut c = FixedWindow::default();
        for now in [i64::MIN, -1, 0, i64::MAX] {
            let v = c.check(&p, now, u64::MAX, false);
            assert!(!v.allowed);
            let v = c.check(&p, now, 1, true);
            assert!(v.allowed);
            c.peek(&p, now);
            c.refund(&p, now, u64::MAX, now);
            c.expires_at_ms(&p);
        }
    }

    #[test]
    fn expiry_is_the_window_end() {
        let p = params(5);
        let mut c = FixedWindow::default();
        assert_eq!(c.expires_at_ms(&p), 0);
        c.check(&p, START, 1, false);
        assert_eq!(c.expires_at_ms(&p), START - 12_300 + W);
    }
}
