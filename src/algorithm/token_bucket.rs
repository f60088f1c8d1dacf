//! Token bucket as GCRA with exact integer scaling: no floats, so Lua and Rust agree.
//!
//! Scaling: `g = gcd(W, L)`; one request costs `U = W / g` units; the level leaks
//! `λ = L / g` units per ms; capacity `C = B * U` (validation keeps `C <= 2^53`). A full
//! bucket drains in `C / λ = B * W / L` ms, the burst refills at exactly `L` per `W`.
//!
//! State (Lua: two hash fields) `{level u, updated t}`; a missing key is `{0, 0}`.
//!
//! - decay: `u0 = max(0, u - max(0, now - t) * λ)` (a clock going backwards leaks nothing).
//! - check `n > B` under `reject`: OVER, remaining 0, R = `ceil(u0 / λ)`, no write: such a
//!   request can never fit. Under `consume` it is a denial like any other, booked (a cost
//!   reported after the response was spent whatever the burst).
//! - check `n`: allow iff `u0 + n*U <= C`. OK: store `{u1 = u0 + n*U, now}`, remaining
//!   `floor((C - u1) / U)`, R = `ceil(u1 / λ)` (until empty again). OVER: remaining 0,
//!   R = `ceil(min(u0 + n*U - C, C) / λ)` (until this request would fit, at most one
//!   period); under `consume` store `{min(u0 + n*U, 2C - U, 2^53), now}`, else no write.
//!   Debt has an end: after any one booking a cost-1 request fits again within one period
//!   (`C / λ`, the time the burst takes to refill), whatever the cost.
//! - a cost spent over the `s` ms before now (a quota report, `s` at most [`MAX_SPREAD_MS`])
//!   is booked from its start: `a = (u decayed to max(t, now - s))`, `u0' = a + n*U - (now -
//!   max(t, now - s)) * λ`, and the check above runs with `u0'` for `u0 + n*U`, and 0 for the
//!   level when `u0'` is negative; a cost over `B` may fit. It is what requests spread evenly
//!   over that time would have left (the level rises or falls linearly between the two
//!   instants). Time before `t` is not credited: a booking made since is never leaked.
//! - peek: allowed iff `u0 + U <= C`; remaining `floor(max(0, C - u0) / U)`;
//!   R = `ceil(u0 / λ)` when allowed, else `ceil((u0 + U - C) / λ)`; no write.
//! - refund `(cost, booked_at)`: give back `r = min(u0, max(0, cost*U - leaked))` where
//!   `leaked = max(0, now - booked_at) * λ` is everything the bucket has leaked since the
//!   booking. When `r > 0` store `{u0 - r, now}`, else write nothing.
//!
//!   Why `leaked` is all of the bucket's leak: after the booking, the bucket with it and the
//!   bucket in which it was never made receive the same later bookings and leak alike, so
//!   the booking's share of the level (their difference) only shrinks while the bucket
//!   without it would be empty, which takes at most the whole leak since `booked_at`. So
//!   `cost*U - leaked` never exceeds what the booking still holds, and a refunded request
//!   never lets more through than if it had never been made. It may give back less than
//!   the booking still holds (units below it that leak first are counted as its own): the
//!   safe side. A clock going backwards (`now < booked_at`) leaks nothing.
//! - expires at `t + ceil(u / λ)`, when the level has leaked to 0.
//!
//! Arithmetic here is in 128 bits, so no input overflows; Lua stays exact below 2^53.

use super::{Counter, MAX_COUNT, Params, Verdict, instant, reset};
use crate::rules::gcd;

/// Longest spread a charge may claim (an hour, the longest reporting interval the quota
/// service learns): it keeps the leak of the spread below 2^53 for every policy.
pub const MAX_SPREAD_MS: u64 = 3_600_000;

/// GCRA level of one bucket.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenBucket {
    /// `u`: units in the bucket at `updated_ms`.
    pub level: u64,
    /// `t`: when `level` was stored.
    pub updated_ms: i64,
}

/// The scaled constants of one policy.
struct Scale {
    /// `U`: units per request.
    unit: u128,
    /// `λ`: units leaked per ms.
    leak: u128,
    /// `C`: capacity in units.
    capacity: u128,
}

impl Scale {
    /// `None` for `L = 0`, which never reaches an algorithm; it then denies everything.
    fn of(params: &Params) -> Option<Scale> {
        let window = params.window_ms.max(1) as u64;
        if params.limit == 0 {
            return None;
        }
        let g = gcd(window, params.limit);
        let unit = u128::from(window / g);
        Some(Scale {
            unit,
            leak: u128::from(params.limit / g),
            capacity: u128::from(params.burst) * unit,
        })
    }

    /// The most a level may hold after a booking under `consume`: a cost-1 request then
    /// fits again after one period (`C / λ`, the time to refill the burst), whatever was
    /// booked. Kept within 2^53 so that Lua's doubles hold it exactly.
    fn debt_cap(&self) -> u128 {
        (2 * self.capacity - self.unit).min(u128::from(MAX_COUNT))
    }

    /// ms until `units` have leaked.
    fn drain_ms(&self, units: u128) -> u64 {
        reset(units.div_ceil(self.leak) as i128)
    }
}

impl TokenBucket {
    /// `u0`: the level left at `now`.
    fn level_at(&self, scale: &Scale, now_ms: i64) -> u128 {
        let elapsed = (i128::from(now_ms) - i128::from(self.updated_ms)).max(0) as u128;
        u128::from(self.level).saturating_sub(elapsed * scale.leak)
    }
}

impl Counter for TokenBucket {
    fn check(&mut self, params: &Params, now_ms: i64, cost: u64, book_on_deny: bool) -> Verdict {
        self.check_spent(params, now_ms, cost, book_on_deny, 0)
    }

    fn check_spent(
        &mut self,
        params: &Params,
        now_ms: i64,
        cost: u64,
        book_on_deny: bool,
        spread_ms: u64,
    ) -> Verdict {
        let over = |reset_ms, booked| Verdict::denied(reset_ms, booked);
        let Some(scale) = Scale::of(params) else {
            return over(0, false);
        };
        let level = self.level_at(&scale, now_ms);
        if cost > params.burst && !book_on_deny && spread_ms == 0 {
            return over(scale.drain_ms(level), false);
        }
        let needed = if spread_ms == 0 {
            level + u128::from(cost) * scale.unit
        } else {
            // Booked at the spread's start (never before the latest write), leaked since.
            let start = (now_ms - spread_ms.min(MAX_SPREAD_MS) as i64)
                .max(self.updated_ms)
                .min(now_ms);
            let leaked = (now_ms - start) as u128 * scale.leak;
            (self.level_at(&scale, start) + u128::from(cost) * scale.unit).saturating_sub(leaked)
        };
        if needed <= scale.capacity {
            self.level = u64::try_from(needed).unwrap_or(u64::MAX);
            self.updated_ms = now_ms;
            return Verdict {
                allowed: true,
                remaining: ((scale.capacity - needed) / scale.unit) as u64,
                reset_ms: scale.drain_ms(needed),
                booked: true,
            };
        }
        if book_on_deny {
            self.level = needed.min(scale.debt_cap()) as u64;
            self.updated_ms = now_ms;
        }
        // Past one period the wait is the debt's, whatever the cost asked.
        over(
            scale.drain_ms((needed - scale.capacity).min(scale.capacity)),
            book_on_deny,
        )
    }

    fn peek(&self, params: &Params, now_ms: i64) -> Verdict {
        let Some(scale) = Scale::of(params) else {
            return Verdict::denied(0, false);
        };
        let level = self.level_at(&scale, now_ms);
        let allowed = level + scale.unit <= scale.capacity;
        let reset_ms = if allowed {
            scale.drain_ms(level)
        } else {
            scale.drain_ms(level + scale.unit - scale.capacity)
        };
        Verdict {
            allowed,
            remaining: u64::try_from(scale.capacity.saturating_sub(level) / scale.unit)
                .unwrap_or(u64::MAX),
            reset_ms,
            booked: false,
        }
    }

    fn refund(&mut self, params: &Params, now_ms: i64, cost: u64, booked_at_ms: i64) {
        let Some(scale) = Scale::of(params) else {
            return;
        };
        let since = (i128::from(now_ms) - i128::from(booked_at_ms)).max(0) as u128;
        let leaked = since.saturating_mul(scale.leak);
        let held = (u128::from(cost) * scale.unit).saturating_sub(leaked);
        let level = self.level_at(&scale, now_ms);
        let give_back = level.min(held);
        if give_back > 0 {
            self.level = (level - give_back) as u64;
            self.updated_ms = now_ms;
        }
    }

    fn expires_at_ms(&self, params: &Params) -> i64 {
        let Some(scale) = Scale::of(params) else {
            return 0;
        };
        let drain = u128::from(self.level).div_ceil(scale.leak) as i128;
        instant(i128::from(self.updated_ms) + drain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_700_000_000_000;

    fn params(limit: u64, window_ms: i64, burst: u64) -> Params {
        Params {
            window_ms,
            limit,
            burst,
        }
    }

    #[test]
    fn cost_above_burst_writes_only_under_consume() {
        let p = params(10, 1000, 10);
        let mut b = TokenBucket::default();
        b.check(&p, NOW, 4, false);
        let before = b.clone();
        let v = b.check(&p, NOW + 100, 11, false);
        assert!(!v.allowed && !v.booked);
        assert_eq!(v.reset_ms, 300, "time until the bucket is empty");
        assert_eq!(b, before);
        // Under consume it is booked: 3 held + 11 is a debt of 4, refilled in 400 ms.
        let v = b.check(&p, NOW + 100, 11, true);
        assert!(!v.allowed && v.booked);
        assert_eq!(v.reset_ms, 400);
        let v = b.check(&p, NOW, u64::MAX, true);
        assert!(!v.allowed && v.booked);
    }

    #[test]
    fn consume_books_denials_and_saturates() {
        let p = params(10, 1000, 10);
        let mut b = TokenBucket::default();
        b.check(&p, NOW, 10, false);
        let v = b.check(&p, NOW, 5, true);
        assert!(!v.allowed && v.booked);
        assert_eq!(v.reset_ms, 500);
        assert_eq!(b.level, 1500);
        assert_eq!(b.peek(&p, NOW).remaining, 0);
        assert_eq!(b.peek(&p, NOW).reset_ms, 600);
        // Debt has an end: however much is booked, the level stops at 2C - U (U = 100,
        // C = 1000 units at 10 a second), where a cost-1 request fits again after one
        // period (the burst's refill, 1 s).
        for _ in 0..100 {
            let v = b.check(&p, NOW, 10, true);
            assert!(v.reset_ms <= 1000);
        }
        assert_eq!(b.level, 1900);
        assert_eq!(b.peek(&p, NOW).reset_ms, 1000);
        let v = b.check(&p, NOW, u64::MAX, true);
        assert_eq!((v.reset_ms, b.level), (1000, 1900));
        // A level above the cap (booked before it) comes down to it at the next booking.
        b.level = MAX_COUNT - 1;
        b.check(&p, NOW, 10, true);
        assert_eq!(b.level, 1900);
    }

    #[test]
    fn refund_returns_what_has_not_leaked_since_the_booking() {
        let p = params(60, 60_000, 60);
        let mut b = TokenBucket::default();
        b.check(&p, NOW, 30, false);
        b.refund(&p, NOW + 5_000, 10, NOW);
        // 30_000 units leaked 5_000 by then; 10 requests are 10_000 units, of which the
        // booking may still hold 10_000 - 5_000.
        assert_eq!((b.level, b.updated_ms), (20_000, NOW + 5_000));
        b.refund(&p, NOW + 5_000, u64::MAX, NOW);
        assert_eq!(b.level, 0);
        // Everything leaked: nothing is given back, nothing is written.
        b.check(&p, NOW + 6_000, 3, false);
        let before = b.clone();
        b.refund(&p, NOW + 9_000, 3, NOW + 6_000);
        assert_eq!(b, before);
        // A clock going backwards leaks nothing: the whole booking comes back.
        b.refund(&p, NOW, 2, NOW + 6_000);
        assert_eq!((b.level, b.updated_ms), (1_000, NOW));
    }

    #[test]
    fn extreme_inputs_never_panic() {
        let p = params(u64::from(u32::MAX), 1000, u64::from(u32::MAX));
        let mut b = TokenBucket::default();
        for now in [i64::MIN, -1, 0, i64::MAX, i64::MIN] {
            b.check(&p, now, u64::MAX, true);
            b.check(&p, now, u64::from(u32::MAX), true);
            b.peek(&p, now);
            b.expires_at_ms(&p);
            b.refund(&p, now, u64::MAX, now);
        }
        let zero = params(0, 1000, 0);
        assert!(!b.check(&zero, NOW, 1, true).allowed);
        assert!(!b.peek(&zero, NOW).allowed);
    }
}
