//! One test per behaviour of Envoy's quota client that the simulation mirrors.

use super::*;
use crate::proto::rlqs::rate_limit_quota_response::BucketAction;
use crate::proto::rlqs::rate_limit_quota_response::bucket_action::{
    AbandonAction, QuotaAssignmentAction,
};
use crate::proto::types::rate_limit_strategy::RequestsPerTimeUnit;
use crate::proto::types::{RateLimitStrategy, TokenBucket};

fn config(expired: Option<(Fallback, Duration)>) -> EnvoyConfig {
    EnvoyConfig {
        domain: "web".into(),
        no_assignment: Fallback::Allow,
        expired,
        restart: Restart::Full,
    }
}

fn id(value: &str) -> Id {
    vec![("k".to_owned(), value.to_owned())]
}

fn duration(seconds: i64, nanos: i32) -> pbjson_types::Duration {
    pbjson_types::Duration { seconds, nanos }
}

fn answer(
    value: &str,
    strategy: Option<Strategy>,
    ttl: pbjson_types::Duration,
) -> RateLimitQuotaResponse {
    RateLimitQuotaResponse {
        bucket_action: vec![BucketAction {
            bucket_id: Some(BucketId {
                bucket: [("k".to_owned(), value.to_owned())].into(),
            }),
            bucket_action: Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
                assignment_time_to_live: Some(ttl),
                rate_limit_strategy: Some(RateLimitStrategy { strategy }),
            })),
        }],
    }
}

fn tokens(max: u32, per_fill: u32, every: pbjson_types::Duration) -> Option<Strategy> {
    Some(Strategy::TokenBucket(TokenBucket {
        max_tokens: max,
        tokens_per_fill: Some(per_fill.into()),
        fill_interval: Some(every),
    }))
}

fn deny() -> Option<Strategy> {
    Some(Strategy::BlanketRule(BlanketRule::DenyAll as i32))
}

fn admitted(envoy: &mut SimulatedEnvoy, value: &str, now: Instant, requests: usize) -> usize {
    (0..requests)
        .filter(|_| envoy.request(&id(value), now).0)
        .count()
}

#[test]
fn a_new_bucket_reports_at_once_with_no_time_elapsed() {
    let start = Instant::now();
    let mut envoy = SimulatedEnvoy::new(config(None), start);
    let (allowed, first) = envoy.request(&id("a"), start);
    assert!(allowed);
    let first = first.expect("an immediate report");
    assert!(first.opens_stream);
    assert_eq!(first.report.domain, "web");
    let usage = &first.report.bucket_quota_usages[0];
    assert_eq!(usage.time_elapsed, Some(duration(0, 0)));
    assert_eq!(
        (usage.num_requests_allowed, usage.num_requests_denied),
        (1, 0)
    );
    // A known bucket sends nothing of its own.
    assert!(envoy.request(&id("a"), start).1.is_none());
}

#[test]
fn every_five_seconds_every_bucket_is_reported_in_whole_seconds_idle_ones_at_zero() {
    let start = Instant::now();
    let mut envoy = SimulatedEnvoy::new(config(None), start);
    envoy.request(&id("a"), start);
    let later = start + Duration::from_millis(2_700);
    envoy.request(&id("b"), later);
    envoy.request(&id("b"), later);
    assert!(envoy.tick(start + Duration::from_secs(4)).is_none());
    let tick = start + REPORT_INTERVAL;
    let report = envoy.tick(tick).expect("due").report;
    assert_eq!(report.domain, "web");
    let seen: Vec<_> = report
        .bucket_quota_usages
        .iter()
        .map(|u| (u.time_elapsed.unwrap().seconds, u.num_requests_allowed))
        .collect();
    // "a": idle since its immediate report 5 s ago; "b": 2.3 s, truncated, 1 request.
    assert_eq!(seen, [(5, 0), (2, 1)]);
    let next = envoy.tick(tick + REPORT_INTERVAL).expect("due").report;
    assert!(
        next.bucket_quota_usages
            .iter()
            .all(|u| { u.time_elapsed == Some(duration(5, 0)) && u.num_requests_allowed == 0 })
    );
}

#[test]
fn only_whole_seconds_are_read_and_under_one_second_is_an_infinite_rate() {
    let now = Instant::now();
    let mut envoy = SimulatedEnvoy::new(config(None), now);
    envoy.request(&id("a"), now);
    // 10 tokens each 0.5 s: 0 whole seconds, every request admitted.
    envoy.apply(
        &answer(
            "a",
            tokens(10, 10, duration(0, 500_000_000)),
            duration(10, 0),
        ),
        now,
    );
    assert_eq!(admitted(&mut envoy, "a", now, 1000), 1000);
    // 1.9 s reads as 1 s: 2 tokens a second.
    envoy.apply(
        &answer("a", tokens(2, 2, duration(1, 900_000_000)), duration(10, 0)),
        now,
    );
    assert_eq!(admitted(&mut envoy, "a", now, 10), 2);
    assert_eq!(
        admitted(&mut envoy, "a", now + Duration::from_secs(1), 10),
        2
    );
    // An unset tokens_per_fill is 0: the bucket never refills.
    let unset = Some(Strategy::TokenBucket(TokenBucket {
        max_tokens: 1,
        tokens_per_fill: None,
        fill_interval: Some(duration(1, 0)),
    }));
    envoy.apply(&answer("a", unset, duration(100, 0)), now);
    assert_eq!(
        admitted(&mut envoy, "a", now + Duration::from_secs(50), 10),
        1
    );
}

#[test]
fn a_ttl_under_one_second_expires_at_once() {
    let now = Instant::now();
    let mut envoy = SimulatedEnvoy::new(config(None), now);
    envoy.request(&id("a"), now);
    envoy.apply(&answer("a", deny(), duration(0, 900_000_000)), now);
    // Expired: no_assignment_behavior (allow).
    assert_eq!(admitted(&mut envoy, "a", now, 1), 1);
    envoy.apply(&answer("a", deny(), duration(1, 0)), now);
    assert_eq!(admitted(&mut envoy, "a", now, 1), 0);
}

#[test]
fn equal_token_buckets_keep_their_tokens_whatever_their_seconds() {
    let now = Instant::now();
    let mut envoy = SimulatedEnvoy::new(config(None), now);
    envoy.request(&id("a"), now);
    let first = envoy.apply(
        &answer("a", tokens(3, 1, duration(1, 0)), duration(10, 0)),
        now,
    );
    assert_eq!(first, [Applied::Changed]);
    assert_eq!(admitted(&mut envoy, "a", now, 10), 3);
    // Other seconds, same max, fill and nanos: the same bucket, still empty, old rate.
    let again = envoy.apply(
        &answer("a", tokens(3, 1, duration(60, 0)), duration(10, 0)),
        now,
    );
    assert_eq!(again, [Applied::Extended]);
    assert_eq!(admitted(&mut envoy, "a", now, 10), 0);
    assert_eq!(
        admitted(&mut envoy, "a", now + Duration::from_secs(1), 10),
        1
    );
    // Another max_tokens: a new bucket, full.
    let other = envoy.apply(
        &answer("a", tokens(4, 1, duration(1, 0)), duration(10, 0)),
        now,
    );
    assert_eq!(other, [Applied::Changed]);
    assert_eq!(
        admitted(&mut envoy, "a", now + Duration::from_secs(1), 10),
        4
    );
}

#[test]
fn a_changed_bucket_starts_full_or_at_the_old_fill_ratio_rounded_down() {
    let now = Instant::now();
    let change = |restart| {
        let mut envoy = SimulatedEnvoy::new(
            EnvoyConfig {
                restart,
                ..config(None)
            },
            now,
        );
        envoy.request(&id("a"), now);
        envoy.apply(
            &answer("a", tokens(10, 1, duration(100, 0)), duration(10, 0)),
            now,
        );
        // 6 of 10 tokens spent: a ratio of 0.4.
        assert_eq!(admitted(&mut envoy, "a", now, 6), 6);
        let changed = envoy.apply(
            &answer("a", tokens(4, 1, duration(100, 0)), duration(10, 0)),
            now,
        );
        assert_eq!(changed, [Applied::Changed]);
        admitted(&mut envoy, "a", now, 10)
    };
    assert_eq!(change(Restart::Full), 4);
    // 4 x 0.4 = 1.6 tokens: 1.
    assert_eq!(change(Restart::FillRatio), 1);
    // After a blanket rule, no token bucket runs: full, whatever the version.
    let mut envoy = SimulatedEnvoy::new(
        EnvoyConfig {
            restart: Restart::FillRatio,
            ..config(None)
        },
        now,
    );
    envoy.request(&id("a"), now);
    envoy.apply(&answer("a", deny(), duration(10, 0)), now);
    envoy.apply(
        &answer("a", tokens(4, 1, duration(100, 0)), duration(10, 0)),
        now,
    );
    assert_eq!(admitted(&mut envoy, "a", now, 10), 4);
}

#[test]
fn expiry_applies_the_fallback_for_its_timeout_then_no_assignment_behavior() {
    let now = Instant::now();
    let expired = Some((Fallback::Deny, Duration::from_secs(30)));
    let mut envoy = SimulatedEnvoy::new(config(expired), now);
    envoy.request(&id("a"), now);
    envoy.apply(
        &answer("a", tokens(100, 100, duration(1, 0)), duration(15, 0)),
        now,
    );
    assert_eq!(
        admitted(&mut envoy, "a", now + Duration::from_secs(14), 1),
        1
    );
    assert_eq!(
        admitted(&mut envoy, "a", now + Duration::from_secs(15), 1),
        0
    );
    assert_eq!(
        admitted(&mut envoy, "a", now + Duration::from_secs(44), 1),
        0
    );
    assert_eq!(
        admitted(&mut envoy, "a", now + Duration::from_secs(45), 1),
        1
    );
}

#[test]
fn unsupported_strategies_keep_what_the_bucket_had() {
    let now = Instant::now();
    let mut envoy = SimulatedEnvoy::new(config(None), now);
    envoy.request(&id("a"), now);
    envoy.apply(&answer("a", deny(), duration(60, 0)), now);
    let per_unit = Some(Strategy::RequestsPerTimeUnit(RequestsPerTimeUnit::default()));
    for strategy in [per_unit, None] {
        let applied = envoy.apply(&answer("a", strategy, duration(60, 0)), now);
        assert_eq!(applied, [Applied::Unsupported]);
        assert_eq!(admitted(&mut envoy, "a", now, 1), 0);
    }
}

#[test]
fn actions_for_buckets_not_held_are_ignored_and_abandon_erases() {
    let now = Instant::now();
    let mut envoy = SimulatedEnvoy::new(config(None), now);
    assert_eq!(
        envoy.apply(&answer("x", deny(), duration(60, 0)), now),
        [Applied::Ignored]
    );
    envoy.request(&id("a"), now);
    envoy.apply(&answer("a", deny(), duration(60, 0)), now);
    let mut abandon = answer("a", None, duration(0, 0));
    abandon.bucket_action[0].bucket_action = Some(Action::AbandonAction(AbandonAction {}));
    assert_eq!(envoy.apply(&abandon, now), [Applied::Abandoned]);
    assert_eq!(envoy.buckets(), 0);
    // Its next request starts it anew, with an immediate report.
    let (allowed, report) = envoy.request(&id("a"), now);
    assert!(allowed && report.is_some());
    let mut no_id = answer("a", deny(), duration(60, 0));
    no_id.bucket_action[0].bucket_id = None;
    assert_eq!(envoy.apply(&no_id, now), [Applied::Ignored]);
}

#[test]
fn a_lost_stream_drops_immediate_reports_and_reopens_at_the_next_tick() {
    let start = Instant::now();
    let mut envoy = SimulatedEnvoy::new(config(None), start);
    assert!(envoy.request(&id("a"), start).1.is_some());
    envoy.stream_lost();
    assert!(envoy.request(&id("b"), start).1.is_none());
    let tick = envoy.tick(start + REPORT_INTERVAL).expect("due");
    assert!(tick.opens_stream);
    assert_eq!(tick.report.bucket_quota_usages.len(), 2);
    let next = envoy.tick(start + REPORT_INTERVAL * 2).expect("due");
    assert!(!next.opens_stream);
}

/// Admitted of `seconds` of six requests a second, on a token bucket of `max` tokens
/// filled with 19 every 20 s (0.95 a second, as floodgate assigns 10 streams sharing 100
/// per 10 s), started empty.
fn busy_client_admits(max: u32, seconds: u64) -> usize {
    let start = Instant::now();
    let mut envoy = SimulatedEnvoy::new(config(None), start);
    envoy.request(&id("a"), start);
    envoy.apply(
        &answer("a", tokens(max, 19, duration(20, 0)), duration(3600, 0)),
        start,
    );
    admitted(&mut envoy, "a", start, max as usize);
    (1..=seconds * 6)
        .filter(|step| {
            let now = start + Duration::from_millis(step * 1000 / 6);
            envoy.request(&id("a"), now).0
        })
        .count()
}

#[test]
fn a_bucket_drops_its_fill_past_max_tokens_so_one_token_loses_rate() {
    // Envoy caps the refill at `max_tokens`: with one token, what fills between a token's
    // completion and the request that takes it is lost; with floodgate's smallest bucket a
    // busy client's bucket never fills and keeps the whole rate (95 of 100 s at 0.95/s).
    let rate = 0.95 * 100.0;
    let one = busy_client_admits(1, 100) as f64;
    let smallest = busy_client_admits(crate::rlqs::assign::MIN_TOKENS as u32, 100) as f64;
    assert!(one < 0.94 * rate, "one token: {one}");
    assert!(smallest >= rate - 1.0, "smallest bucket: {smallest}");
}
