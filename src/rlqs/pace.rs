//! When a stream may start a slow token bucket, so that many streams sharing one bucket do
//! not refill in step.
//!
//! Envoy refills a token bucket from the moment it takes it (`createTokenBucketFromAction`
//! in `source/extensions/filters/http/rate_limit_quota/global_client_impl.cc`; since 1.33 a
//! changed one starts at the old one's fill ratio, rounded down, not full). When a
//! stream's share is less than a token per reporting interval (100 Envoys on 100 requests
//! per 10 s: one token every 11 s each), the moment of the push sets when its tokens come.
//! Pushed at the streams' reports, which all fall within one 5 s interval, the tokens of
//! every stream came within those 5 s of each 11 s: windows of 10 s admitted from 0.74 to
//! 1.06 of the limit as the beat went by. So a slow bucket's change waits for the stream's
//! own slot: a point of the token period set by the stream's phase, spread evenly over
//! the period across streams (the golden-ratio sequence) and counted from the start of
//! each minute, so that the streams of every replica fall on one clock. A stream whose
//! client already runs a token bucket changes it just after that bucket's next token
//! instead ([`token_wait`]): its tokens keep their phase, and the change drops next to
//! nothing of the old bucket's fill.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::strategy::Strategy;

/// A bucket shared by fewer streams than this (its share over this fraction) starts at
/// once: with few streams there is no beat to break, and waiting would only delay a lone
/// client's first token by up to a period.
pub const PACED_SHARE: f64 = 0.5;
/// A slot this close, or this recently passed, counts as now.
const SLOT_TOLERANCE: Duration = Duration::from_millis(200);
/// Slots repeat every token period from the start of each minute since the epoch.
const ANCHOR_MS: i64 = 60_000;

/// A paced change of a running token bucket goes out this long after (or before) the
/// bucket's next whole token: far enough that the client is past (or short of) it
/// whatever the clocks' jitter.
const PAST_TOKEN: Duration = Duration::from_millis(50);
/// The longest a paced change waits for the running bucket's next token; a slower bucket
/// changes at once.
const MAX_TOKEN_WAIT: Duration = Duration::from_secs(60);

/// Streams started in this process, for their phases.
static STREAMS: AtomicU64 = AtomicU64::new(0);

/// The phase of a new stream, in `[0, 1)`: successive streams fill the period evenly.
pub fn next_phase() -> f64 {
    phase(STREAMS.fetch_add(1, Ordering::Relaxed))
}

/// The `index`-th point of the golden-ratio sequence: every prefix of it is spread evenly.
fn phase(index: u64) -> f64 {
    (index as f64 * 0.618_033_988_749_895).fract()
}

/// Whether a stream assigned `rate` a second, `fraction` of its bucket, for a client
/// reporting every `interval`, starts its token bucket at its slot: less than a token per
/// interval, on a bucket shared by several streams.
pub fn paced(rate: f64, fraction: f64, interval: Duration) -> bool {
    fraction < PACED_SHARE && rate * interval.as_secs_f64() < 1.0
}

/// How long a stream of `phase` holding `fraction` of a bucket waits before it pushes
/// `strategy`, at `now_ms` since the epoch, for a client reporting every `interval`;
/// `None` when it pushes now. Only a [`paced`] token bucket waits, never a whole token
/// period.
pub fn wait(
    strategy: &Strategy,
    fraction: f64,
    interval: Duration,
    phase: f64,
    now_ms: i64,
) -> Option<Duration> {
    let rate = strategy.rate().filter(|&rate| rate > 0.0)?;
    if !paced(rate, fraction, interval) {
        return None;
    }
    let period_ms = (1000.0 / rate) as i64;
    // Slots count from the latest minute: streams whose rates differ a little still fall
    // on nearly the same grid, which counting from the epoch would scatter.
    let anchor = now_ms - now_ms.rem_euclid(ANCHOR_MS);
    let first = anchor + (phase.clamp(0.0, 1.0) * period_ms as f64) as i64;
    let tolerance = SLOT_TOLERANCE.as_millis() as i64;
    let periods = ((now_ms - tolerance - first).max(0) + period_ms - 1) / period_ms;
    let wait = first + periods * period_ms - now_ms;
    (wait > tolerance).then(|| Duration::from_millis(wait as u64))
}

/// Which side of the running bucket's next token a paced change aims at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aim {
    /// Just after it: the level is a whole number, and the same `max_tokens` keeps it.
    After,
    /// Just before it, for a larger `max_tokens`: a level of `1 - e` of one token becomes
    /// one token of two, where `1` just after would become two, one handed out.
    Before,
}

/// The smallest bucket a paced stream starts full, after none or after a blanket rule:
/// the token it would have at its slot anyway. Started with [`super::assign::MIN_TOKENS`],
/// every stream restarting after a spent budget handed out two, twice the rate for a
/// token period (1.2 of the limit in a window after 100 Envoys' cold start). Its next
/// change raises it, [`Aim::Before`] its next token.
pub const FIRST_TOKENS: u32 = 1;

/// How long a paced stream waits before it changes the token bucket of `rate` a second
/// that its client started at `started`: until just after (or, `aim`ing before, just
/// before) the bucket's next whole token.
/// Envoy 1.33 and later start the new bucket at `floor(new_max * level / old_max)`
/// (envoyproxy/envoy @ c33e7f82: `createTokenBucketFromAction` in
/// `source/extensions/filters/http/rate_limit_quota/global_client_impl.cc` takes
/// `max_tokens * (remainingTokens() / maxTokens())` into an integer, and
/// `AtomicTokenBucketImpl::remainingTokens` in `source/common/common/token_bucket_impl.cc`
/// is the continuous level capped at `max_tokens`; a new bucket's level starts whole), so a
/// change drops the fraction of a token the old one had filled: half a token on average,
/// at any moment; 50 ms of fill just after a token. The stream's tokens then keep their
/// phase, and a change of a slow rate costs next to nothing. `None` (change now) when the
/// token is more than a minute away. A bucket that was full restarts its phase at the
/// request that takes a token, which this does not see: it loses at most what filled
/// since.
pub fn token_wait(started: Instant, rate: f64, now: Instant, aim: Aim) -> Option<Duration> {
    if rate.is_nan() || rate <= 0.0 {
        return None;
    }
    let shift = match aim {
        Aim::After => PAST_TOKEN.as_secs_f64(),
        Aim::Before => -PAST_TOKEN.as_secs_f64(),
    };
    let elapsed = now.saturating_duration_since(started).as_secs_f64();
    let tokens = ((elapsed - shift) * rate).floor() + 1.0;
    let due = tokens.max(0.0) / rate + shift - elapsed;
    (due <= MAX_TOKEN_WAIT.as_secs_f64()).then(|| Duration::from_secs_f64(due.max(0.0)))
}

/// What a stream holds for the `wait` until its slot, given the assignment `running` on
/// the client and the `next` one: the running token bucket if the next is faster (below
/// its share a stream only admits less) or slower by less than a token over the wait;
/// `DENY_ALL` otherwise, and when no token bucket runs, so that the first tokens come at
/// the slot. A `DENY_ALL` in place of a bucket barely faster costs more than it paces:
/// Envoy starts the token bucket that follows a blanket rule full, in every release, so
/// each such change handed out `max_tokens` at its slot, and 100 Envoys sharing 100 per
/// 10 s read up to 1.11 of the limit in a window.
pub fn held(running: Option<Strategy>, next: &Strategy, wait: Duration) -> Strategy {
    let (Some(strategy), Some(old), Some(new)) = (
        running,
        running.and_then(|strategy| strategy.rate()),
        next.rate(),
    ) else {
        return Strategy::DenyAll;
    };
    if (old - new) * wait.as_secs_f64() < 1.0 {
        strategy
    } else {
        Strategy::DenyAll
    }
}

/// The slot a held change waits for, given the one chosen earlier (`chosen`) and the
/// `wait` for the next one now: the chosen slot while it is ahead (a rate that moved a
/// little since would move the slot, and the change would wait again), `None` to push now.
pub fn slot(chosen: Option<Instant>, wait: Option<Duration>, now: Instant) -> Option<Instant> {
    let wait = wait?;
    match chosen {
        Some(slot) if slot > now + SLOT_TOLERANCE => Some(slot),
        Some(_) => None,
        None => Some(now + wait),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTERVAL: Duration = Duration::from_secs(5);

    /// One token every `seconds`.
    fn every(seconds: u64) -> Strategy {
        Strategy::TokenBucket {
            max_tokens: 1,
            tokens_per_fill: 100,
            fill_interval: Duration::from_secs(100 * seconds),
        }
    }

    #[test]
    fn a_change_of_a_running_bucket_waits_for_its_next_token() {
        let started = Instant::now();
        let at = |ms| started + Duration::from_millis(ms);
        // A token every 10 s: 3 s in, the next comes at 10 s, and the change 50 ms after.
        assert_eq!(
            token_wait(started, 0.1, at(3_000), Aim::After),
            Some(Duration::from_millis(7_050))
        );
        // Aimed before it, 50 ms before.
        let before = token_wait(started, 0.1, at(3_000), Aim::Before).expect("a wait");
        assert!((before.as_secs_f64() - 6.95).abs() < 0.001, "{before:?}");
        // Just after a token the change goes out at once (within the 50 ms).
        let just_after = token_wait(started, 0.1, at(10_020), Aim::After).expect("a wait");
        assert!(just_after <= Duration::from_millis(30), "{just_after:?}");
        // Past the 50 ms it waits for the next token.
        let next = token_wait(started, 0.1, at(10_100), Aim::After).expect("a wait");
        assert!((next.as_secs_f64() - 9.95).abs() < 0.001, "{next:?}");
        // A token an hour is too far away to wait for; no rate, nothing to wait for.
        assert_eq!(
            token_wait(started, 1.0 / 3600.0, at(1_000), Aim::After),
            None
        );
        assert_eq!(token_wait(started, 0.0, at(1_000), Aim::After), None);
    }

    #[test]
    fn a_slow_shared_bucket_waits_for_the_streams_slot() {
        // A token every 11 s; the first slot of phase 0.5 is 5.5 s into the minute.
        let slow = every(11);
        let minute = 60_000 * 7;
        assert_eq!(
            wait(&slow, 0.01, INTERVAL, 0.5, minute),
            Some(Duration::from_millis(5_500))
        );
        assert_eq!(
            wait(&slow, 0.01, INTERVAL, 0.5, minute + 5_000),
            Some(Duration::from_millis(500))
        );
        // At the slot, or just after it (the wake came late): now.
        assert_eq!(wait(&slow, 0.01, INTERVAL, 0.5, minute + 5_500), None);
        assert_eq!(wait(&slow, 0.01, INTERVAL, 0.5, minute + 5_650), None);
        // Later: the next slot, a period on.
        assert_eq!(
            wait(&slow, 0.01, INTERVAL, 0.5, minute + 6_000),
            Some(Duration::from_millis(10_500))
        );
        // Never a period or more.
        for now_ms in (0..130_000).step_by(333) {
            let waited = wait(&slow, 0.01, INTERVAL, 0.3, now_ms);
            assert!(waited.is_none_or(|waited| waited < Duration::from_secs(11)));
        }
        // A rate 1% off moves the slot by less than a tenth of a second.
        let near = Strategy::TokenBucket {
            max_tokens: 1,
            tokens_per_fill: 101,
            fill_interval: Duration::from_secs(1_100),
        };
        let (a, b) = (
            wait(&slow, 0.01, INTERVAL, 0.5, minute + 30_000).unwrap(),
            wait(&near, 0.01, INTERVAL, 0.5, minute + 30_000).unwrap(),
        );
        assert!(a.abs_diff(b) < Duration::from_millis(500), "{a:?} {b:?}");
    }

    #[test]
    fn fast_lone_and_blanket_assignments_push_at_once() {
        // A token per interval or faster: the reports already spread the streams.
        assert_eq!(wait(&every(5), 0.01, INTERVAL, 0.5, 1_234), None);
        // A bucket of one or two streams.
        assert_eq!(wait(&every(11), 0.5, INTERVAL, 0.5, 1_234), None);
        assert_eq!(wait(&every(11), 1.0, INTERVAL, 0.5, 1_234), None);
        assert_eq!(wait(&Strategy::DenyAll, 0.01, INTERVAL, 0.5, 1_234), None);
        assert_eq!(wait(&Strategy::AllowAll, 0.01, INTERVAL, 0.5, 1_234), None);
    }

    #[test]
    fn a_running_bucket_is_held_unless_it_would_admit_a_token_more() {
        let (slower, faster) = (every(13), every(9));
        let wait = Duration::from_secs(8);
        // Faster next: the running bucket only admits less until the slot.
        assert_eq!(held(Some(slower), &faster, wait), slower);
        // Slower next: 1/9 - 1/13 a second over 8 s is 0.27 of a token: kept.
        assert_eq!(held(Some(faster), &slower, wait), faster);
        // From a token a second to one every 13 s: 7 tokens more over the wait; denied.
        assert_eq!(held(Some(every(1)), &slower, wait), Strategy::DenyAll);
        // Nothing running, or a blanket rule: denied until the slot.
        assert_eq!(held(None, &slower, wait), Strategy::DenyAll);
        assert_eq!(
            held(Some(Strategy::AllowAll), &slower, wait),
            Strategy::DenyAll
        );
        assert_eq!(
            held(Some(Strategy::DenyAll), &faster, wait),
            Strategy::DenyAll
        );
    }

    #[test]
    fn a_chosen_slot_stands_until_it_comes() {
        let now = Instant::now();
        let wait = Some(Duration::from_secs(3));
        let chosen = slot(None, wait, now);
        assert_eq!(chosen, Some(now + Duration::from_secs(3)));
        // A report 2 s later, whose rate puts the next slot elsewhere, keeps it.
        let later = now + Duration::from_secs(2);
        assert_eq!(slot(chosen, Some(Duration::from_secs(7)), later), chosen);
        // It came: push.
        let came = now + Duration::from_millis(2_900);
        assert_eq!(slot(chosen, Some(Duration::from_secs(7)), came), None);
        // Nothing to hold (a fast rate, a blanket rule, at a slot): push.
        assert_eq!(slot(chosen, None, later), None);
    }

    #[test]
    fn phases_fill_the_period_evenly() {
        for streams in [2, 10, 100] {
            let mut phases: Vec<f64> = (0..streams).map(phase).collect();
            phases.sort_by(f64::total_cmp);
            phases.push(1.0);
            let gaps = phases.windows(2).map(|pair| pair[1] - pair[0]);
            // The largest gap is under twice an even split's.
            assert!(gaps.fold(0.0, f64::max) < 2.0 / streams as f64, "{streams}");
        }
        assert!((0.0..1.0).contains(&next_phase()));
    }
}
