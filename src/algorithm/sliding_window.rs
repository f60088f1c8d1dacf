//! Sliding window: the weighted two-window counter (previous window's count fades out
//! linearly while the current window fills). Cheap and smooth, not exact: see `sliding_log`.
//!
//! State (Lua: three hash fields) `{window, current c, previous p}`; a missing key is
//! `{0, 0, 0}`. With `cur = floor(now / W)`:
//!
//! - roll: if `c == 0 and p == 0` or `cur > window + 1`: `{cur, 0, 0}`; if `cur == window + 1`:
//!   `{cur, 0, c}`; if `cur <= window` (same window, or the clock went backwards) keep it.
//!   Then `e = clamp(now - window*W, 0, W - 1)`, the elapsed ms in the window.
//! - check `n`: allow iff `c + n <= L` and `p*(W-e) + (c+n)*W <= L*W` (the first test only
//!   keeps the products small; it is implied by the second). OK: `c += n`, remaining
//!   `floor((L*W - p*(W-e) - c*W) / W)`, R = `W - e`.
//!   OVER: remaining 0, no write unless `consume`, and R = the earliest wait after which
//!   `n` fits if nothing else is booked. Under `consume` the denial books
//!   `c = min(c + n, max(c, L))`: debt has an end, a cost fills the window but never weighs
//!   into the next more than a full window does, so the lock ends within `W - e + W/L`
//!   whatever the cost; R is then the wait for a cost-1 request (`n = 1` below, after the
//!   booking). The waits:
//!   - `c + n <= L` (so `p > 0`): `ceil((p*(W-e) - (L-c-n)*W) / p)`, within this window;
//!   - `n > L` (never fits): `(W - e) + W`, the end of the next window;
//!   - otherwise it fits in the next window once `c` (then previous) has faded enough:
//!     `(W - e) + W - floor((L-n)*W / c)`.
//! - peek: the check arithmetic with `n = 1` and no write; remaining uses `c`, not `c + 1`.
//! - refund `(cost, booked_at)`: roll to now; with `b = floor(booked_at / W)`: if
//!   `window == b`, `c -= min(c, cost)`; if `window == b + 1`, `p -= min(p, cost)`.
//! - expires at `(window + 2)*W` while `c > 0`, `(window + 1)*W` when only `p > 0`, else at
//!   once (0).
//!
//! Products are computed in 128 bits here; validation keeps `L*W <= 2^53` for Lua.

use super::{Counter, Params, Verdict, div_ceil, instant, reset};

/// Counts of the current and the previous window.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlidingWindow {
    /// Index of the current window: `floor(t / W)`.
    pub window: i64,
    /// `c`: cost booked in the current window.
    pub current: u64,
    /// `p`: cost booked in the window before it.
    pub previous: u64,
}

/// A rolled state with the elapsed time in its window.
struct At {
    state: SlidingWindow,
    /// `e`, in `0..W`.
    elapsed: i128,
}

impl SlidingWindow {
    fn rolled(&self, params: &Params, now_ms: i64) -> At {
        let window = params.window();
        let cur = now_ms.div_euclid(params.window_ms.max(1));
        let next = i128::from(self.window) + 1;
        let state = if (self.current == 0 && self.previous == 0) || i128::from(cur) > next {
            SlidingWindow {
                window: cur,
                current: 0,
                previous: 0,
            }
        } else if i128::from(cur) == next {
            SlidingWindow {
                window: cur,
                current: 0,
                previous: self.current,
            }
        } else {
            self.clone()
        };
        let elapsed = (i128::from(now_ms) - i128::from(state.window) * window).clamp(0, window - 1);
        At { state, elapsed }
    }
}

impl At {
    /// Whether `cost` fits, and if so the remaining count after booking it.
    fn fit(&self, params: &Params, cost: u64) -> Option<u64> {
        let (l, p, w) = (
            i128::from(params.limit),
            i128::from(self.state.previous),
            params.window(),
        );
        let total = i128::from(self.state.current) + i128::from(cost);
        if total > l {
            return None;
        }
        let left = l * w - p * (w - self.elapsed) - total * w;
        (left >= 0).then(|| (left / w) as u64)
    }

    /// R for a denied `cost`: the earliest wait after which it fits.
    fn wait(&self, params: &Params, cost: u64) -> u64 {
        let (l, n) = (i128::from(params.limit), i128::from(cost));
        let (c, p) = (
            i128::from(self.state.current),
            i128::from(self.state.previous),
        );
        let (w, e) = (params.window(), self.elapsed);
        if c + n <= l && p > 0 {
            reset(div_ceil((p * (w - e) - (l - c - n) * w).max(0), p))
        } else if n > l || c == 0 {
            reset((w - e) + w)
        } else {
            reset((w - e) + w - (l - n) * w / c)
        }
    }
}

impl Counter for SlidingWindow {
    fn check(&mut self, params: &Params, now_ms: i64, cost: u64, book_on_deny: bool) -> Verdict {
        let at = self.rolled(params, now_ms);
        let window = params.window();
        match at.fit(params, cost) {
            Some(remaining) => {
                *self = at.state;
                self.current += cost;
                Verdict {
                    allowed: true,
                    remaining,
                    reset_ms: reset(window - at.elapsed),
                    booked: true,
                }
            }
            None if book_on_deny => {
                *self = at.state;
                let most = self.current.max(params.limit);
                self.current = self.current.saturating_add(cost).min(most);
                // Booked: the wait is until a cost-1 request fits again.
                let after = At {
                    state: self.clone(),
                    ..at
                };
                Verdict::denied(after.wait(params, 1), true)
            }
            None => Verdict::denied(at.wait(params, cost), false),
        }
    }

    fn peek(&self, params: &Params, now_ms: i64) -> Verdict {
        let at = self.rolled(params, now_ms);
        match at.fit(params, 1) {
            // Remaining without booking the probe: one more than after booking it.
            Some(remaining) => Verdict {
                allowed: true,
                remaining: remaining + 1,
                reset_ms: reset(params.window() - at.elapsed),
                booked: false,
            },
            None => Verdict::denied(at.wait(params, 1), false),
        }
    }

    fn refund(&mut self, params: &Params, now_ms: i64, cost: u64, booked_at_ms: i64) {
        *self = self.rolled(params, now_ms).state;
        let booked_window = booked_at_ms.div_euclid(params.window_ms.max(1));
        if self.window == booked_window {
            self.current -= self.current.min(cost);
        } else if Some(self.window) == booked_window.checked_add(1) {
            self.previous -= self.previous.min(cost);
        }
    }

    fn expires_at_ms(&self, params: &Params) -> i64 {
        let ahead = if self.current > 0 {
            2
        } else if self.previous > 0 {
            1
        } else {
            return 0;
        };
        instant((i128::from(self.window) + ahead) * params.window())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::test_params::minute as params;

    use crate::algorithm::test_params::W;
    /// Start of some window.
    const BASE: i64 = 1_700_000_040_000;

    /// p = 8 from the previous window, c = 3 in the current one (which starts at BASE).
    fn p8_c3() -> SlidingWindow {
        SlidingWindow {
            window: BASE / W,
            current: 3,
            previous: 8,
        }
    }

    #[test]
    fn consume_books_denials() {
        let p = params(10);
        let mut s = p8_c3();
        let v = s.check(&p, BASE + 15_000, 5, true);
        assert!(!v.allowed && v.booked);
        assert_eq!(s.current, 8);
        // A cost fills the window and no more: the debt ends with the next window's fade.
        let v = s.check(&p, BASE + 15_000, u64::MAX, true);
        assert_eq!(s.current, 10);
        // Until a cost-1 request fits: p = 10 fades to 9 in the next window.
        assert_eq!(v.reset_ms, 45_000 + 6_000);
    }

    #[test]
    fn refund_reaches_the_previous_window() {
        let p = params(10);
        let mut s = SlidingWindow::default();
        s.check(&p, BASE, 4, false);
        s.refund(&p, BASE + 1, 1, BASE);
        assert_eq!(s.current, 3);
        s.refund(&p, BASE + W, 2, BASE);
        assert_eq!((s.current, s.previous), (0, 1));
        s.refund(&p, BASE + 3 * W, 2, BASE);
        assert_eq!((s.current, s.previous), (0, 0));
    }

    #[test]
    fn rolls_and_expiry() {
        let p = params(10);
        let mut s = SlidingWindow::default();
        s.check(&p, BASE, 4, false);
        assert_eq!(s.expires_at_ms(&p), BASE + 2 * W);
        s.check(&p, BASE + W, 1, false);
        assert_eq!((s.current, s.previous), (1, 4));
        s.refund(&p, BASE + W, 1, BASE + W);
        assert_eq!(s.expires_at_ms(&p), BASE + 2 * W);
        s.check(&p, BASE + 3 * W, 1, false);
        assert_eq!((s.current, s.previous), (1, 0));
        let v = SlidingWindow::default().peek(&p, BASE + 3 * W + 5);
        assert_eq!(v.remaining, 10);
    }

    #[test]
    fn extreme_inputs_never_panic() {
        let p = params(u64::from(u32::MAX));
        let mut s = SlidingWindow::default();
        for now in [i64::MIN, -1, 0, i64::MAX, i64::MIN] {
            s.check(&p, now, u64::MAX, true);
            s.check(&p, now, 1, false);
            s.peek(&p, now);
            s.expires_at_ms(&p);
            s.refund(&p, now, u64::MAX, i64::MAX);
        }
    }
}
