//! Limiter behaviour over the real memory backend with a controlled clock.

use std::sync::Arc;

use super::*;
use crate::backend::memory::MemoryBackend;
use crate::clock::ManualClock;
use crate::matcher::{DescriptorRule, DomainRules};
use crate::rules::Rule;
use crate::rules::Unit;

struct Fixture {
    limiter: Limiter,
    clock: Arc<ManualClock>,
}

fn rule(path: &str, policy: Policy) -> Rule {
    Rule {
        domain: "d".into(),
        path: path.into(),
        name: None,
        replaces: vec![],
        limit: Limit::Limited(policy),
        sets_accounting: true,
        shadow_mode: false,
        quota_mode: false,
        detailed_metric: false,
        value_to_metric: false,
        metadata: None,
        global: false,
    }
}

fn node(key: &str, rule: Rule) -> DescriptorRule {
    DescriptorRule {
        key: key.into(),
        value: None,
        share_threshold: false,
        value_to_metric: false,
        rule: Some(Arc::new(rule)),
        children: vec![],
    }
}

fn fixture_with(nodes: Vec<DescriptorRule>, options: LimiterOptions) -> Fixture {
    let clock = Arc::new(ManualClock::new(
        1_700_000_000_000 - 1_700_000_000_000 % 60_000 + 12_300,
    ));
    let backend = MemoryBackend::with_clock(10_000, clock.clone());
    let matcher = Matcher::new(vec![DomainRules {
        domain: "d".into(),
        descriptors: nodes,
    }]);
    Fixture {
        limiter: Limiter::new(
            matcher,
            Arc::new(backend),
            Arc::new(Metrics::new()),
            options,
        ),
        clock,
    }
}

fn fixture(nodes: Vec<DescriptorRule>) -> Fixture {
    fixture_with(nodes, LimiterOptions::default())
}

fn desc(key: &str, value: &str, cost: u64) -> Descriptor {
    Descriptor {
        entries: vec![(key.into(), value.into())],
        cost,
        limit_override: None,
    }
}

impl Fixture {
    async fn ask(&self, descriptors: Vec<Descriptor>) -> Response {
        let request = Request {
            domain: "d".into(),
            descriptors,
        };
        self.limiter
            .should_rate_limit(&request, Caller::default())
            .await
            .expect("memory backend never fails")
    }

    async fn one(&self, key: &str, cost: u64) -> (Code, u32, Option<u64>) {
        let response = self.ask(vec![desc(key, "v", cost)]).await;
        let status = &response.statuses[0];
        (status.code, status.limit_remaining, status.reset_seconds)
    }
}

#[tokio::test]
async fn fixed_window_vector_through_the_whole_request_path() {
    let f = fixture(vec![node(
        "k",
        rule("k", Policy::fixed_window(5, Unit::Minute)),
    )]);
    assert_eq!(f.one("k", 2).await, (Code::Ok, 3, Some(48)));
    assert_eq!(f.one("k", 4).await, (Code::OverLimit, 0, Some(48)));
    assert_eq!(f.one("k", 3).await, (Code::Ok, 0, Some(48)));
    assert_eq!(f.one("k", 0).await.0, Code::OverLimit);
    f.clock.advance(48_000);
    assert_eq!(f.one("k", 1).await, (Code::Ok, 4, Some(60)));
}

#[tokio::test]
async fn replaced_limits_are_dropped() {
    let mut base = rule("base", Policy::fixed_window(0, Unit::Second));
    base.name = Some("base".into());
    let mut premium = rule("premium", Policy::fixed_window(10, Unit::Second));
    premium.replaces = vec!["base".into()];
    let f = fixture(vec![node("base", base), node("premium", premium)]);
    let response = f
        .ask(vec![desc("base", "v", 1), desc("premium", "v", 1)])
        .await;
    assert_eq!(response.overall, Code::Ok);
    assert_eq!(response.statuses[0], Status::unmatched());
    assert_eq!(response.statuses[1].limit_remaining, 9);
    // Alone, the base rule applies.
    assert_eq!(f.one("base", 1).await.0, Code::OverLimit);
}

#[tokio::test]
async fn shadow_rules_report_ok_with_zero_remaining() {
    let mut shadow = rule("s", Policy::fixed_window(1, Unit::Minute));
    shadow.shadow_mode = true;
    let f = fixture(vec![node("s", shadow)]);
    assert_eq!(f.one("s", 1).await, (Code::Ok, 0, Some(48)));
    let response = f.ask(vec![desc("s", "v", 1)]).await;
    assert_eq!(response.overall, Code::Ok);
    assert_eq!(
        (
            response.statuses[0].code,
            response.statuses[0].limit_remaining
        ),
        (Code::Ok, 0)
    );
    let text = f.limiter.metrics().encode();
    assert!(
        text.contains(r#"ratelimit_service_rate_limit_shadow_mode_total{domain="d",key="s"} 1"#),
        "{text}"
    );
}

#[tokio::test]
async fn quota_statuses_deny_only_when_all_deny() {
    let quota = |path: &str, limit| {
        let mut r = rule(path, Policy::fixed_window(limit, Unit::Minute));
        r.quota_mode = true;
        r
    };
    let f = fixture(vec![
        node("q1", quota("q1", 0)),
        node("q2", quota("q2", 5)),
        node("n", rule("n", Policy::fixed_window(0, Unit::Minute))),
    ]);
    let one_over = f.ask(vec![desc("q1", "v", 1), desc("q2", "v", 1)]).await;
    assert_eq!(one_over.overall, Code::Ok);
    assert_eq!(one_over.statuses[0].code, Code::OverLimit);
    let all_over = f.ask(vec![desc("q1", "v", 1), desc("q1", "w", 1)]).await;
    assert_eq!(all_over.overall, Code::OverLimit);
    let plain_over = f.ask(vec![desc("q2", "v", 1), desc("n", "v", 1)]).await;
    assert_eq!(plain_over.overall, Code::OverLimit);
}

/// Rule `a` (5 a minute) and rule `z` (none), under global `options`.
fn open_and_shut(options: LimiterOptions) -> Fixture {
    fixture_with(
        vec![
            node("a", rule("a", Policy::fixed_window(5, Unit::Minute))),
            node("z", rule("z", Policy::fixed_window(0, Unit::Minute))),
        ],
        options,
    )
}

#[tokio::test]
async fn global_quota_mode_denies_only_when_every_descriptor_denies() {
    let f = open_and_shut(LimiterOptions {
        quota_mode: true,
        ..LimiterOptions::default()
    });
    let one_over = f.ask(vec![desc("a", "v", 1), desc("z", "v", 1)]).await;
    assert_eq!(one_over.overall, Code::Ok);
    assert_eq!(one_over.statuses[1].code, Code::OverLimit);
    // Admitted, so the booking on `a` stands.
    assert_eq!(f.one("a", 1).await.1, 3);
    let all_over = f.ask(vec![desc("z", "v", 1), desc("z", "w", 1)]).await;
    assert_eq!(all_over.overall, Code::OverLimit);
}

#[tokio::test]
async fn global_shadow_mode_keeps_statuses_and_bookings() {
    let f = open_and_shut(LimiterOptions {
        shadow_mode: true,
        ..LimiterOptions::default()
    });
    let response = f.ask(vec![desc("a", "v", 1), desc("z", "v", 1)]).await;
    assert_eq!(response.overall, Code::Ok);
    assert_eq!(response.statuses[1].code, Code::OverLimit);
    // The request was admitted, so its booking on `a` stands.
    assert_eq!(f.one("a", 1).await.1, 3);
}

#[tokio::test]
async fn over_limit_requests_are_refunded_but_consume_rules_keep_their_cost() {
    let mut consume = Policy::fixed_window(5, Unit::Minute);
    consume.on_over_limit = OnOverLimit::Consume;
    let f = fixture(vec![
        node("r", rule("r", Policy::fixed_window(5, Unit::Minute))),
        node("c", rule("c", consume)),
        node("z", rule("z", Policy::fixed_window(0, Unit::Minute))),
    ]);
    let response = f
        .ask(vec![
            desc("r", "v", 2),
            desc("c", "v", 2),
            desc("z", "v", 1),
        ])
        .await;
    assert_eq!(response.overall, Code::OverLimit);
    assert_eq!(
        response.statuses[0].limit_remaining, 5,
        "pre-request remaining"
    );
    assert_eq!(
        response.statuses[1].limit_remaining, 3,
        "consume keeps its booking"
    );
    assert_eq!(f.one("r", 0).await.1, 5);
    assert_eq!(f.one("c", 0).await.1, 3);
    // A consume rule books even its own denial.
    assert_eq!(f.one("c", 4).await.0, Code::OverLimit);
    assert_eq!(f.one("c", 0).await, (Code::OverLimit, 0, Some(48)));
}

#[tokio::test]
async fn local_cache_answers_exhausted_buckets() {
    let options = LimiterOptions {
        local_cache_entries: 100,
        ..LimiterOptions::default()
    };
    let f = fixture_with(
        vec![node("k", rule("k", Policy::fixed_window(1, Unit::Hour)))],
        options,
    );
    assert_eq!(f.one("k", 1).await.0, Code::Ok);
    assert_eq!(f.one("k", 1).await.0, Code::OverLimit);
    assert_eq!(f.limiter.metrics().local_cache_hits.get(), 1);
    let text = f.limiter.metrics().encode();
    assert!(text.contains(
        r#"ratelimit_service_rate_limit_over_limit_with_local_cache_total{domain="d",key="k"} 1"#
    ));
    // Another value is another bucket, not cached.
    let other = f.ask(vec![desc("k", "other", 1)]).await;
    assert_eq!(other.overall, Code::Ok);
}

#[tokio::test]
async fn limit_overrides_count_in_their_own_bucket() {
    let f = fixture(vec![node(
        "k",
        rule("k", Policy::fixed_window(100, Unit::Minute)),
    )]);
    let mut overridden = desc("k", "v", 1);
    overridden.limit_override = Some(LimitOverride {
        requests_per_unit: 1,
        unit: Unit::Minute,
    });
    let first = f.ask(vec![overridden.clone()]).await;
    assert_eq!(
        first.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit),
        Some(1)
    );
    assert_eq!(f.ask(vec![overridden]).await.overall, Code::OverLimit);
    assert_eq!(f.one("k", 1).await.1, 99);
    let text = f.limiter.metrics().encode();
    assert!(
        text.contains(r#"ratelimit_service_rate_limit_over_limit_total{domain="d",key="k"} 1"#),
        "{text}"
    );
}

#[tokio::test]
async fn near_limit_counts_hits_past_eighty_percent() {
    let f = fixture(vec![node(
        "k",
        rule("k", Policy::fixed_window(10, Unit::Minute)),
    )]);
    f.one("k", 7).await;
    f.one("k", 2).await;
    let text = f.limiter.metrics().encode();
    assert!(
        text.contains(r#"ratelimit_service_rate_limit_near_limit_total{domain="d",key="k"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"ratelimit_service_rate_limit_within_limit_total{domain="d",key="k"} 9"#)
    );
}
