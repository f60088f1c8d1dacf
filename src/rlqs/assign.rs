//! Sizing one stream's assignment for one bucket, and the hysteresis that decides whether a
//! new size is worth pushing. Pure: the stream hands in what the backend said.
//!
//! A stream gets a token bucket whose fill rate is its share of the bucket's rate (`L / W`,
//! or for a fixed window whatever is left of it until the reset), and whose size is a small
//! fraction of its share of what is left ([`BURST_FRACTION`]). Envoy 1.33 and later start a
//! token bucket that replaces a running one at the old one's fill ratio, rounded down, and
//! full only as a first assignment or after a blanket rule (`createTokenBucketFromAction`
//! in `source/extensions/filters/http/rate_limit_quota/global_client_impl.cc`, PR 37624):
//! so a change hands out no burst, and the rates of all streams add up to
//! `1 - ESTIMATE_MARGIN` of the limit, leaving room for the error of shares estimated from
//! 5 s reports. A spent budget is `DENY_ALL` until it refills.
//!
//! Every duration is whole seconds, as Envoy reads them
//! (`source/extensions/filters/http/rate_limit_quota/global_client_impl.cc` reads only
//! `.seconds()`): a TTL under 1 s would expire at once, and a `fill_interval` under 1 s
//! divides the fill by zero, an infinite rate.

use std::time::Duration;

use crate::rules::{Algorithm, Policy};

use super::strategy::{Assignment, Strategy};

/// The part of a stream's share handed out as burst (`max_tokens`) rather than as rate.
pub const BURST_FRACTION: f64 = 0.05;
/// The most a burst holds, in seconds of the rule's rate: a first assignment starts a full
/// bucket (and so did every change, with Envoy 1.32 and older), and with 5% of a minute's
/// limit each change of 10 streams handed out 3,000 of 60,000 tokens at once (1.075 of the
/// limit per minute).
pub const BURST_SECONDS: f64 = 1.0;
/// The part of the limit left out of the rates for the error of the shares: each stream
/// estimates everyone else's demand from counters read at its own report, and those
/// estimates, noisy, added up to 1.07 of the limit (mean; 1.12 at worst) with 10 Envoys.
pub const ESTIMATE_MARGIN: f64 = 0.05;
/// A pushed rate stands while the new one is at most this much lower...
pub const LOWER_BY: f64 = 0.10;
/// ...or at most this much higher. A wider upward band let two streams whose shares had
/// dipped together settle below them for good: at 1.25 times under, 0.72 of the limit.
pub const HIGHER_BY: f64 = 0.10;
/// Windows over which a stream's excess over a lower rate is weighed against the tokens a
/// change hands out.
pub const EXCESS_WINDOWS: u32 = 3;
/// How far a new rate must move from the pushed one to be pushed, and what a change costs
/// the client in tokens ([`moved`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hysteresis {
    /// A lower rate is pushed past this part of the running one...
    pub lower_by: f64,
    /// ...a higher one past this part...
    pub higher_by: f64,
    /// ...when it moves the window by more than the change costs, in tokens.
    pub cost: f64,
}

impl Hysteresis {
    /// A change that lands at any point of a token: Envoy drops the fraction of a token the
    /// old bucket had filled, up to a whole one.
    pub const ANY_POINT: Hysteresis = Hysteresis {
        lower_by: LOWER_BY,
        higher_by: HIGHER_BY,
        cost: 1.0,
    };
    /// A paced change, pushed just after the running bucket's next token
    /// ([`super::pace::token_wait`]): it drops 50 ms of fill, so the rate follows the share
    /// to within the shares' noise. With a whole token's cost a share of about one token a
    /// window never rose back to the fair one, and with a 10% band the rates stayed where
    /// the young estimates left them: 100 Envoys on 100 per 10 s held 0.88 of the limit.
    pub const AT_TOKEN: Hysteresis = Hysteresis {
        lower_by: 0.02,
        higher_by: 0.02,
        cost: 0.0,
    };
}
/// An assignment lives this many reporting intervals unless refreshed, so one lost or late
/// report never lets it expire.
pub const TTL_INTERVALS: u32 = 3;
/// The smallest bucket assigned. Envoy's token bucket drops what refills past its
/// `max_tokens` (`TokenBucketImpl::consume` in `source/common/common/token_bucket_impl.cc`
/// of envoyproxy/envoy @ 040783c8 sets the level to the lesser of the refilled level and
/// `max_tokens`), so a bucket of one token loses the fill between a token's completion
/// and the request that takes it: at a token a second and six requests a second, 8% of the
/// rate. With room for a second token a busy stream's bucket never fills, and keeps it all.
/// A rule that holds less (a limit of 1, a `burst` of 1) gets what it holds.
pub const MIN_TOKENS: f64 = 2.0;
/// Tokens one fill should carry at least, so that rounding `tokens_per_fill` to an integer
/// moves the rate by at most 0.5%: the fill interval (whole seconds) grows for slow rates.
const TOKENS_PER_FILL: f64 = 100.0;
/// Longest fill interval: one token an hour is the slowest rate assigned.
const MAX_FILL_SECONDS: f64 = 3600.0;
/// How far `tokens_per_fill` may move to make a new rate differ for Envoy: enough for a
/// neighbour that keeps the rate within 0.5%.
const DISTINCT_FILLS: u32 = 10;

/// The bucket's budget as the backend saw it when a report was booked (or on a peek).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Whether one more request fits now.
    pub open: bool,
    /// Requests left.
    pub remaining: u64,
    /// Time until the reset the algorithm defines (for a closed budget: until one fits).
    pub reset: Duration,
}

/// A duration as Envoy reads it: whole seconds, at least 1, rounded up.
pub fn whole_seconds(duration: Duration) -> Duration {
    let seconds = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
    Duration::from_secs(seconds.max(1))
}

/// The TTL of an assignment for a client reporting every `interval`.
pub fn ttl(interval: Duration) -> Duration {
    whole_seconds(interval * TTL_INTERVALS)
}

/// The rate a second that every stream's part of `budget` under `policy` is taken from:
/// `L / W`, or for a fixed window whatever is left of it until the reset, for clients
/// reporting every `interval`.
pub fn per_second(policy: &Policy, budget: Budget, interval: Duration) -> f64 {
    let window = Duration::from_millis(policy.window_ms().max(1));
    let per_second = f64::from(policy.requests_per_unit) / window.as_secs_f64();
    // A fixed window spent early by others (ShouldRateLimit, other replicas) has less
    // than `L / W` left; near the reset the estimate is noise, and the refill is close.
    if policy.algorithm == Algorithm::FixedWindow && budget.reset >= ttl(interval) {
        return per_second.min(budget.remaining as f64 / budget.reset.as_secs_f64());
    }
    per_second
}

/// The rate the shares of every stream add up to: the room `fair::rate` divides.
pub fn room(per_second: f64) -> f64 {
    per_second * (1.0 - ESTIMATE_MARGIN)
}

/// Sizes a stream's assignment: its `fraction` of the [`room`] of `budget` under `policy`,
/// for a client reporting every `interval`.
pub fn size(policy: &Policy, budget: Budget, fraction: f64, interval: Duration) -> Assignment {
    let ttl = ttl(interval);
    if !budget.open || policy.requests_per_unit == 0 {
        // Rounded up: the stream pushes the refill when it comes, which ends the denial on
        // time whatever the TTL.
        return Assignment {
            strategy: Strategy::DenyAll,
            ttl: whole_seconds(budget.reset),
        };
    }
    let fraction = fraction.clamp(0.0, 1.0);
    let per_second = per_second(policy, budget, interval);
    let capacity = match policy.algorithm {
        Algorithm::TokenBucket => u64::from(policy.burst),
        _ => u64::from(policy.requests_per_unit),
    };
    let burst =
        (capacity.min(budget.remaining) as f64 * BURST_FRACTION).min(per_second * BURST_SECONDS);
    // Never more than the rule itself holds (a limit of 1, a `burst` of 1).
    let burst = (fraction * burst)
        .ceil()
        .max(MIN_TOKENS.min(capacity as f64));
    let rate = fraction * room(per_second);
    Assignment {
        strategy: token_bucket(burst, rate),
        ttl,
    }
}

/// A token bucket of `burst` tokens (at least 1) refilled at `rate` per second (at least
/// one token per hour): a whole number of seconds per fill, long enough that the integer
/// `tokens_per_fill` carries the rate closely. Envoy refills continuously, so a long
/// interval admits nothing later than a short one would.
fn token_bucket(burst: f64, rate: f64) -> Strategy {
    let rate = rate.max(1.0 / MAX_FILL_SECONDS);
    let seconds = (TOKENS_PER_FILL / rate).ceil().clamp(1.0, MAX_FILL_SECONDS);
    let tokens_per_fill = (rate * seconds).round().clamp(1.0, f64::from(u32::MAX));
    Strategy::TokenBucket {
        max_tokens: burst.clamp(1.0, f64::from(u32::MAX)) as u32,
        tokens_per_fill: tokens_per_fill as u32,
        fill_interval: Duration::from_secs(seconds as u64),
    }
}

/// Whether Envoy takes `next` for the same assignment as `current`, and so keeps its
/// running bucket: token buckets with the same `max_tokens`, `tokens_per_fill` and
/// `fill_interval.nanos` (Envoy does not compare the seconds), or the same blanket rule.
pub fn same_for_envoy(current: &Strategy, next: &Strategy) -> bool {
    match (current, next) {
        (
            Strategy::TokenBucket {
                max_tokens: a_max,
                tokens_per_fill: a_fill,
                fill_interval: a_every,
            },
            Strategy::TokenBucket {
                max_tokens: b_max,
                tokens_per_fill: b_fill,
                fill_interval: b_every,
            },
        ) => a_max == b_max && a_fill == b_fill && a_every.subsec_nanos() == b_every.subsec_nanos(),
        _ => current == next,
    }
}

/// `next`, changed so that Envoy sees it differ from `current` when it does. Slow rates
/// all fill [`TOKENS_PER_FILL`] tokens and differ only in the seconds, which Envoy does not
/// compare: such a token bucket fills one token fewer (or more) over a fill interval
/// rescaled to keep its rate. `max_tokens` stays: with Envoy 1.32 and older a changed bucket
/// started full, and one token more there was one more token handed out by every change of
/// a slow rate.
pub fn distinct_for_envoy(current: &Strategy, next: Strategy) -> Strategy {
    let Strategy::TokenBucket {
        max_tokens,
        tokens_per_fill,
        fill_interval,
    } = next
    else {
        return next;
    };
    if next == *current || !same_for_envoy(current, &next) {
        return next;
    }
    let rate = next.rate().unwrap_or_default();
    let error = |&(tokens, seconds): &(u32, f64)| (f64::from(tokens) / seconds - rate).abs();
    let rescaled = (1..=DISTINCT_FILLS)
        .flat_map(|step| {
            [
                tokens_per_fill.checked_sub(step),
                tokens_per_fill.checked_add(step),
            ]
        })
        .flatten()
        .filter(|&tokens| tokens >= 1)
        .map(|tokens| (tokens, (f64::from(tokens) / rate).round()))
        .filter(|&(_, seconds)| (1.0..=MAX_FILL_SECONDS).contains(&seconds))
        .min_by(|a, b| error(a).total_cmp(&error(b)));
    match rescaled {
        Some((tokens_per_fill, seconds)) => Strategy::TokenBucket {
            max_tokens,
            tokens_per_fill,
            fill_interval: Duration::from_secs(seconds as u64),
        },
        // One token an hour or a fill of u32::MAX: no neighbour keeps the rate, so the
        // size moves, down where it can.
        None => Strategy::TokenBucket {
            max_tokens: if max_tokens > MIN_TOKENS as u32 {
                max_tokens - 1
            } else {
                max_tokens + 1
            },
            tokens_per_fill,
            fill_interval,
        },
    }
}

/// Whether `next` differs enough from the pushed `current` to push it. Otherwise the
/// client keeps `current` (resent, so only its TTL moves). Envoy 1.33 and later start a
/// changed token bucket at the old one's fill ratio, rounded down
/// (`createTokenBucketFromAction` in
/// `source/extensions/filters/http/rate_limit_quota/global_client_impl.cc`): a change hands
/// out no burst, but loses what the old bucket had refilled short of a whole token, so a
/// change must gain more than one token:
/// - a rate lower by more than [`LOWER_BY`] that takes at least the change's cost off what
///   the stream admits in [`EXCESS_WINDOWS`] windows: an excess comes back every window, a
///   change's cost once;
/// - a rate higher by more than [`HIGHER_BY`] that also moves what the stream admits in
///   one `window` of the rule by at least the change's cost: under its share the stream
///   only admits less. With 100 Envoys on 100 per 10 s, each stream's share is about one request a
///   window; the noise of the shares moved it by more than 10% at most reports, and each
///   change cost a token.
/// - a `DENY_ALL` in place of a token bucket: the running bucket would admit at least its
///   `max_tokens` before the refill, which restarts it (full, after a blanket rule) anyway.
///   Otherwise every spent window would end with every stream's bucket restarted at once.
/// - any other change of kind.
///
/// The bands and the cost are `hysteresis`'s: [`Hysteresis::AT_TOKEN`] for a paced change.
pub fn moved(
    current: &Strategy,
    next: &Assignment,
    window: Duration,
    hysteresis: Hysteresis,
) -> bool {
    let Hysteresis {
        lower_by,
        higher_by,
        cost,
    } = hysteresis;
    match (*current, next.strategy) {
        (Strategy::TokenBucket { .. }, Strategy::TokenBucket { .. }) => {
            let (old, new) = (
                current.rate().unwrap_or(0.0),
                next.strategy.rate().unwrap_or(0.0),
            );
            let per_window = (new - old) * window.as_secs_f64();
            (new < old * (1.0 - lower_by) && -per_window * f64::from(EXCESS_WINDOWS) >= cost)
                || (new > old * (1.0 + higher_by) && per_window >= cost)
        }
        (Strategy::TokenBucket { max_tokens, .. }, Strategy::DenyAll) => {
            current.rate().unwrap_or(0.0) * next.ttl.as_secs_f64() >= f64::from(max_tokens)
        }
        (current, next) => std::mem::discriminant(&current) != std::mem::discriminant(&next),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::Unit;

    /// Envoy's hard-coded reporting interval.
    const INTERVAL: Duration = Duration::from_secs(5);

    fn open(remaining: u64, reset_ms: u64) -> Budget {
        Budget {
            open: true,
            remaining,
            reset: Duration::from_millis(reset_ms),
        }
    }

    fn rate(strategy: &Strategy) -> f64 {
        strategy.rate().expect("a token bucket")
    }

    #[test]
    fn shares_split_the_rate_and_leave_room_for_the_error_of_the_shares() {
        let policy = Policy::fixed_window(1000, Unit::Second);
        let whole = size(&policy, open(1000, 1000), 1.0, INTERVAL);
        let third = size(&policy, open(1000, 1000), 1.0 / 3.0, INTERVAL);
        assert_eq!(whole.ttl, Duration::from_secs(15));
        assert!((rate(&whole.strategy) - 950.0).abs() < 1.0);
        assert!((rate(&third.strategy) - 950.0 / 3.0).abs() < 1.0);
        let Strategy::TokenBucket { max_tokens, .. } = whole.strategy else {
            unreachable!()
        };
        assert_eq!(max_tokens, 50);
    }

    #[test]
    fn paced_or_not_a_share_leaves_room_only_for_the_error_of_the_shares() {
        // 100 streams on 100 per 10 s: a token every 10.5 s each, started at its slot.
        let policy = Policy {
            unit_multiplier: 10,
            ..Policy::fixed_window(100, Unit::Second)
        };
        let paced = size(&policy, open(100, 10_000), 0.01, INTERVAL);
        assert!((rate(&paced.strategy) - 0.095).abs() < 0.001);
        // Two streams: not paced; a change hands out no burst (Envoy 1.33 and later).
        let pair = size(&policy, open(100, 10_000), 0.5, INTERVAL);
        assert!((rate(&pair.strategy) - 4.75).abs() < 4.75 * 0.005);
    }

    #[test]
    fn a_burst_holds_at_most_a_second_of_the_rate() {
        let minute = Policy::fixed_window(60_000, Unit::Minute);
        let Strategy::TokenBucket { max_tokens, .. } =
            size(&minute, open(60_000, 59_000), 0.1, INTERVAL).strategy
        else {
            unreachable!()
        };
        // A tenth of one second's 1,000, not a tenth of 5% of 60,000.
        assert_eq!(max_tokens, 100);
    }

    #[test]
    fn a_spent_budget_is_denied_until_the_refill() {
        let policy = Policy::fixed_window(10, Unit::Minute);
        let spent = Budget {
            open: false,
            remaining: 0,
            reset: Duration::from_secs(42),
        };
        assert_eq!(
            size(&policy, spent, 1.0, INTERVAL),
            Assignment {
                strategy: Strategy::DenyAll,
                ttl: Duration::from_secs(42)
            }
        );
        let zero = Policy::fixed_window(0, Unit::Minute);
        assert_eq!(
            size(&zero, open(0, 7), 1.0, INTERVAL).strategy,
            Strategy::DenyAll
        );
    }

    #[test]
    fn a_fixed_window_spent_by_others_gives_what_is_left_until_the_reset() {
        let policy = Policy::fixed_window(600, Unit::Minute);
        // 60 left for the 30 s to the reset: 2 a second, not 10.
        let left = size(&policy, open(60, 30_000), 1.0, INTERVAL);
        assert!((rate(&left.strategy) - 2.0 * 0.95).abs() < 0.01);
        // Near the reset the full rate stands.
        let near = size(&policy, open(1, 400), 1.0, INTERVAL);
        // Within the 0.5% that an integer tokens_per_fill may move it.
        assert!((rate(&near.strategy) - 10.0 * 0.95).abs() < 0.05);
    }

    #[test]
    fn slow_rates_stretch_the_fill_interval() {
        let policy = Policy::fixed_window(60, Unit::Hour);
        let slow = size(&policy, open(60, 3_600_000), 0.5, INTERVAL);
        let Strategy::TokenBucket {
            max_tokens,
            tokens_per_fill,
            fill_interval,
        } = slow.strategy
        else {
            unreachable!()
        };
        // Less than a second's rate: the two tokens every bucket holds.
        assert_eq!(max_tokens, 2);
        // 0.5 * 60 * 0.95 per hour: 28.5 tokens (28 in floating point) over the longest fill
        // interval, an hour.
        assert_eq!(fill_interval, Duration::from_secs(3600));
        assert_eq!(tokens_per_fill, 28);
    }

    #[test]
    fn a_bucket_holds_two_tokens_at_least_and_never_more_than_the_rule() {
        let bucket =
            |policy: &Policy| match size(policy, open(1, 3_600_000), 0.01, INTERVAL).strategy {
                Strategy::TokenBucket { max_tokens, .. } => max_tokens,
                other => panic!("{other:?}"),
            };
        assert_eq!(bucket(&Policy::fixed_window(100, Unit::Hour)), 2);
        assert_eq!(bucket(&Policy::fixed_window(1, Unit::Hour)), 1);
    }

    #[test]
    fn every_duration_on_the_wire_is_whole_seconds_and_at_least_one() {
        let policy = Policy::fixed_window(1000, Unit::Second);
        for rate in [0.0001, 0.3, 1.0, 1.4, 7.7, 99.0, 101.0, 950.0, 1e6, 1e12] {
            let Strategy::TokenBucket {
                tokens_per_fill,
                fill_interval,
                ..
            } = token_bucket(10.0, rate)
            else {
                unreachable!()
            };
            assert_eq!(fill_interval.subsec_nanos(), 0, "{rate}");
            assert!(fill_interval >= Duration::from_secs(1), "{rate}");
            assert!(tokens_per_fill >= 1, "{rate}");
            // Envoy's rate: tokens_per_fill over the whole seconds.
            let envoy = f64::from(tokens_per_fill) / fill_interval.as_secs() as f64;
            let wanted = rate.clamp(1.0 / 3600.0, f64::from(u32::MAX));
            assert!((envoy - wanted).abs() <= wanted * 0.006, "{rate}: {envoy}");
        }
        let spent = |reset_ms| Budget {
            open: false,
            remaining: 0,
            reset: Duration::from_millis(reset_ms),
        };
        for (reset_ms, ttl_s) in [(0, 1), (1, 1), (999, 1), (1000, 1), (1001, 2), (59_500, 60)] {
            assert_eq!(
                size(&policy, spent(reset_ms), 1.0, INTERVAL).ttl,
                Duration::from_secs(ttl_s)
            );
        }
        assert_eq!(ttl(Duration::from_millis(300)), Duration::from_secs(1));
        assert_eq!(ttl(INTERVAL), Duration::from_secs(15));
    }

    #[test]
    fn a_new_rate_that_envoy_would_take_for_the_old_one_gets_another_fill() {
        // 9.1/s and 10/s both fill 100 tokens, over 11 s and 10 s: Envoy compares no seconds.
        let old = token_bucket(5.0, 10.0);
        let new = token_bucket(5.0, 9.1);
        assert_ne!(old, new);
        assert!(same_for_envoy(&old, &new));
        let sent = distinct_for_envoy(&old, new);
        assert!(!same_for_envoy(&old, &sent));
        // A change starts Envoy's bucket full: the size stays, the rate within 0.5%.
        let Strategy::TokenBucket { max_tokens, .. } = sent else {
            unreachable!()
        };
        assert_eq!(max_tokens, 5);
        assert!((rate(&sent) - rate(&new)).abs() <= rate(&new) * 0.005);
        // 0.13/s and 0.09/s: one token a window of 10 s, each.
        let (slow, slower) = (token_bucket(1.0, 0.13), token_bucket(1.0, 0.09));
        assert!(same_for_envoy(&slow, &slower));
        let sent = distinct_for_envoy(&slow, slower);
        assert!(!same_for_envoy(&slow, &sent));
        assert!((rate(&sent) - rate(&slower)).abs() <= rate(&slower) * 0.005);
        // At one token an hour no fill keeps the rate: the size moves instead.
        let (hourly, new_hourly) = (
            token_bucket(1.0, 1.0 / 3600.0),
            Strategy::TokenBucket {
                max_tokens: 1,
                tokens_per_fill: 1,
                fill_interval: Duration::from_secs(3599),
            },
        );
        assert!(!same_for_envoy(
            &hourly,
            &distinct_for_envoy(&hourly, new_hourly)
        ));
        // The same assignment stays the same.
        assert_eq!(distinct_for_envoy(&old, old), old);
        assert!(same_for_envoy(&Strategy::DenyAll, &Strategy::DenyAll));
    }

    /// Whether `from` moves to `to` (a 15 s TTL) on a rule of `window`, for each case:
    /// (from, to, window, hysteresis, expected).
    fn check_moves(cases: &[(Strategy, Strategy, u64, Hysteresis, bool)]) {
        for &(from, to, window, hysteresis, expected) in cases {
            let next = Assignment {
                strategy: to,
                ttl: Duration::from_secs(15),
            };
            let window = Duration::from_secs(window);
            assert_eq!(
                moved(&from, &next, window, hysteresis),
                expected,
                "{from:?} -> {to:?} on {window:?}, {hysteresis:?}"
            );
        }
    }

    #[test]
    fn hysteresis_ignores_small_moves() {
        let bucket = |rate: f64| token_bucket(10.0, rate);
        let any = Hysteresis::ANY_POINT;
        check_moves(&[
            (bucket(100.0), bucket(95.0), 1, any, false),
            (bucket(100.0), bucket(108.0), 1, any, false),
            (bucket(100.0), bucket(85.0), 1, any, true),
            (bucket(100.0), bucket(115.0), 1, any, true),
            (bucket(100.0), Strategy::DenyAll, 1, any, true),
            (Strategy::AllowAll, bucket(100.0), 1, any, true),
            (Strategy::DenyAll, Strategy::DenyAll, 1, any, false),
        ]);
    }

    #[test]
    fn a_share_of_about_a_token_a_window_moves_when_it_gains_a_token() {
        let tiny = |rate: f64| token_bucket(1.0, rate);
        let (any, at_token) = (Hysteresis::ANY_POINT, Hysteresis::AT_TOKEN);
        check_moves(&[
            // A move of a fifth is worth less than the token a change loses; of three
            // times, more.
            (tiny(0.09), tiny(0.11), 10, any, false),
            (tiny(0.09), tiny(0.27), 10, any, true),
            // Lower is worth it sooner: the excess would come back every window.
            (tiny(0.09), tiny(0.072), 10, any, false),
            (tiny(0.18), tiny(0.09), 10, any, true),
            // Paced, at the running bucket's next token: any move past the band, either way.
            (tiny(0.09), tiny(0.093), 10, at_token, true),
            (tiny(0.09), tiny(0.087), 10, at_token, true),
            (tiny(0.09), tiny(0.091), 10, at_token, false),
        ]);
        // A spent window 3 s before its refill: at 0.09 a second the running bucket admits
        // less than the token the restart after a DENY_ALL hands out; at 100, far more.
        let spent = Assignment {
            strategy: Strategy::DenyAll,
            ttl: Duration::from_secs(3),
        };
        let ten_s = Duration::from_secs(10);
        assert!(!moved(&tiny(0.09), &spent, ten_s, any));
        let second = Duration::from_secs(1);
        assert!(moved(&token_bucket(10.0, 100.0), &spent, second, any));
    }
}
