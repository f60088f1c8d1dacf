//! How much of one report's usage the bucket's windows hold now.
//!
//! Envoy reports every 5 s what it admitted since its last report. Booked whole at the
//! moment the report arrives, 5 s of usage would land in one window: a per-second fixed
//! window would be spent at once, starving every ShouldRateLimit caller of the same bucket,
//! while the window before it never saw those requests. So a report's requests are taken
//! as spread evenly over its `time_elapsed`, and each windowed algorithm books the part its
//! current count would hold had they been booked one by one (rounded up). Windows are
//! aligned to the epoch, as the algorithms align them (`crate::algorithm`).

use std::time::Duration;

use crate::algorithm::div_ceil;
use crate::rules::{Algorithm, Policy};

/// What to book now of `allowed` requests spread over the `elapsed` before `now_ms`.
///
/// - fixed window: the part inside the current window; the rest fell in windows gone;
/// - sliding window: the part inside the current window, plus the part inside the previous
///   one at the weight the previous window still has now;
/// - token bucket: everything, which the backend books from the report's start
///   (`Charge::spread_ms`): it leaks from then, as it would have with the requests one by
///   one;
/// - sliding log: everything, now. Booking late only makes it stricter: a log forgets
///   entries from the booking on.
pub fn booked_now(policy: &Policy, allowed: u64, elapsed: Duration, now_ms: i64) -> u64 {
    let window = i128::from(policy.window_ms().max(1));
    let spread = i128::try_from(elapsed.as_millis()).unwrap_or(i128::MAX);
    let into = i128::from(now_ms).rem_euclid(window);
    if allowed == 0 || spread <= into {
        return allowed;
    }
    let allowed = i128::from(allowed);
    let booked = match policy.algorithm {
        Algorithm::FixedWindow => div_ceil(allowed * into, spread),
        Algorithm::SlidingWindow => {
            let previous = (spread - into).min(window);
            // `previous * (window - into) / window` of the previous window's part still counts.
            let current = allowed * into * window;
            let fading = allowed * previous * (window - into);
            div_ceil(current + fading, spread * window)
        }
        Algorithm::TokenBucket | Algorithm::SlidingLog => allowed,
    };
    u64::try_from(booked.clamp(0, allowed)).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::Unit;

    const FIVE_S: Duration = Duration::from_secs(5);

    #[test]
    fn a_fixed_window_books_the_part_inside_it() {
        let per_second = Policy::fixed_window(100, Unit::Second);
        // 500 requests over 5 s, 250 ms into the current second: 25 of them fell in it.
        assert_eq!(booked_now(&per_second, 500, FIVE_S, 7_250), 25);
        // Rounded up: 1 over 5 s, 1 ms in.
        assert_eq!(booked_now(&per_second, 1, FIVE_S, 7_001), 1);
        // A window longer than the report holds all of it.
        let per_minute = Policy::fixed_window(100, Unit::Minute);
        assert_eq!(
            booked_now(&per_minute, 500, FIVE_S, 60_000 * 9 + 30_000),
            500
        );
        // 10 s in a new minute and the report covers 5 s: all of it; 2 s in: 2/5 of it.
        assert_eq!(
            booked_now(&per_minute, 500, FIVE_S, 60_000 * 9 + 10_000),
            500
        );
        assert_eq!(
            booked_now(&per_minute, 500, FIVE_S, 60_000 * 9 + 2_000),
            200
        );
        // A first report (no time elapsed) books everything now.
        assert_eq!(booked_now(&per_second, 3, Duration::ZERO, 7_250), 3);
    }

    #[test]
    fn a_sliding_window_books_what_its_weighted_count_would_hold() {
        let policy = Policy {
            algorithm: Algorithm::SlidingWindow,
            ..Policy::fixed_window(100, Unit::Second)
        };
        // 500 over 5 s, 250 ms in: 25 in the current second, 100 in the previous one, which
        // still weighs 0.75: 25 + 75.
        assert_eq!(booked_now(&policy, 500, FIVE_S, 7_250), 100);
    }

    #[test]
    fn token_buckets_and_logs_book_everything() {
        for algorithm in [Algorithm::TokenBucket, Algorithm::SlidingLog] {
            let policy = Policy {
                algorithm,
                ..Policy::fixed_window(100, Unit::Second)
            };
            assert_eq!(booked_now(&policy, 500, FIVE_S, 7_250), 500);
        }
    }
}
