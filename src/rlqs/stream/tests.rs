//! One stream alone: how it learns the interval, caps a report's demand, and books under a
//! standing queue.

use super::*;
use crate::limiter::FailureMode;
use crate::rlqs::ledger::Pending;

fn tracked() -> Tracked {
    let id = Arc::new(vec![("k".to_owned(), "v".to_owned())]);
    Tracked::new(id, QuotaRule::Unlimited, Instant::now())
}

/// A stream on a memory backend with 10 an hour for `window`, failing open, whose
/// bookings go through `admission`.
fn stream(admission: &Arc<Admission>) -> (Stream, Arc<Limiter>) {
    use crate::backend::memory::MemoryBackend;
    use crate::limiter::LimiterOptions;
    let domain = crate::config::parse_domain(
        "d.yaml",
        "domain: d\ndescriptors:\n  - key: window\n    rate_limit: {unit: hour, requests_per_unit: 10}\n",
    )
    .expect("rules parse");
    let limiter = Arc::new(Limiter::new(
        Matcher::new(vec![domain]),
        Arc::new(MemoryBackend::new(1000)),
        Arc::new(crate::metrics::Metrics::new()),
        LimiterOptions {
            failure_mode: FailureMode::Allow,
            ..LimiterOptions::default()
        },
    ));
    let settings = RlqsSettings::default();
    let shared = Arc::new(Shared {
        ledger: Ledger::new(Arc::clone(&limiter)),
        limiter: Arc::clone(&limiter),
        settings,
        bounds: Arc::new(BucketBounds::new(settings.max_buckets)),
        metrics: limiter.metrics().rlqs.clone(),
        admission: Some(Arc::clone(admission)),
    });
    (Stream::new(shared, None), limiter)
}

fn report(allowed: u64) -> RateLimitQuotaUsageReports {
    use crate::proto::rlqs::BucketId;
    use crate::proto::rlqs::rate_limit_quota_usage_reports::BucketQuotaUsage;
    RateLimitQuotaUsageReports {
        domain: "d".to_owned(),
        bucket_quota_usages: vec![BucketQuotaUsage {
            bucket_id: Some(BucketId {
                bucket: [("window".to_owned(), "v".to_owned())].into(),
            }),
            time_elapsed: Some(pbjson_types::Duration {
                seconds: 5,
                nanos: 0,
            }),
            num_requests_allowed: allowed,
            num_requests_denied: 0,
        }],
    }
}

#[tokio::test(start_paused = true)]
async fn bookings_shed_under_a_standing_queue_wait_for_the_next_report() {
    use crate::overload::{Arrival, DEFAULT_TARGET_LATENCY, ShedReason};
    let admission = Arc::new(Admission::new(DEFAULT_TARGET_LATENCY));
    let (mut stream, limiter) = stream(&admission);
    // Calls that waited 8 ms for a whole interval: the queue stands.
    let connection = Arc::new(ConnectionLoad::default());
    let waited = || Arrival {
        at: Instant::now() - Duration::from_millis(8),
        unread: None,
        connection: Arc::clone(&connection),
    };
    drop(admission.admit(1, Some(&waited()), None));
    tokio::time::advance(Duration::from_millis(101)).await;
    assert!(admission.admit(1, Some(&waited()), None).is_err());
    let shed = stream.report(report(4)).await.unwrap();
    // Nothing booked: the failure mode answers the new bucket.
    assert_eq!(
        shed.actions,
        [wire::assign(
            &Arc::new(vec![("window".to_owned(), "v".to_owned())]),
            &Assignment {
                strategy: Strategy::AllowAll,
                ttl: Duration::from_secs(15)
            }
        )]
    );
    // Nothing was booked, so nothing is the stream's own: ending now would refund nothing
    // from the shared counters, which hold only the other streams' counts.
    let bucket = &stream.buckets[0];
    assert_eq!(bucket.own.withdrawals(), [vec![], vec![], vec![]]);
    assert!(bucket.unbooked.counted.demand > 0 || bucket.unbooked.counted.presence_ms > 0);
    let queue = crate::metrics::ReasonLabels {
        reason: ShedReason::Queue.as_str(),
    };
    assert_eq!(limiter.metrics().shed.get_or_create(&queue).get(), 1);
    // A call that did not wait ends the standing queue; the next report books the four.
    let fresh = Arrival {
        at: Instant::now(),
        ..waited()
    };
    drop(admission.admit(1, Some(&fresh), None));
    stream.report(report(0)).await.unwrap();
    let bucket = &stream.buckets[0];
    assert_eq!((bucket.unbooked.allowed, bucket.sent.is_some()), (0, true));
    let QuotaRule::Limited(quota) = &bucket.rule else {
        panic!("limited")
    };
    let read = stream
        .shared
        .ledger
        .book(quota, Pending::default(), Caller::default());
    assert_eq!(read.await.unwrap().budget.remaining, 6);
}

#[test]
fn the_interval_starts_at_envoys_grows_at_once_and_shrinks_slowly() {
    let mut bucket = tracked();
    // A first report (0 s) and a short first periodic one say little.
    bucket.learn_interval(Duration::ZERO);
    assert_eq!(bucket.interval, DEFAULT_INTERVAL);
    bucket.learn_interval(Duration::from_secs(1));
    assert_eq!(bucket.interval, Duration::from_secs(4));
    bucket.learn_interval(Duration::from_secs(5));
    assert_eq!(bucket.interval, Duration::from_secs(5));
    bucket.learn_interval(Duration::from_secs(86_400));
    assert_eq!(bucket.interval, MAX_INTERVAL);
}

#[tokio::test]
async fn duplicates_in_one_report_count_once_at_most_at_the_limits_rate() {
    use crate::overload::DEFAULT_TARGET_LATENCY;
    let admission = Arc::new(Admission::new(DEFAULT_TARGET_LATENCY));
    let (mut stream, _) = stream(&admission);
    let mut message = report(4);
    let mut usage = message.bucket_quota_usages[0].clone();
    usage.num_requests_denied = 1_000_000;
    message.bucket_quota_usages = vec![usage; 1_000];
    stream.report(message).await.unwrap();
    assert_eq!(stream.buckets.len(), 1);
    let bucket = &stream.buckets[0];
    // 10 an hour over the 5 s a first report covers: not one whole request to claim.
    assert_eq!(bucket.own_counts.demand, 0);
    assert!(bucket.demand_rate <= 10.0 / 3600.0);
    // Its 5 s of presence, weighted by where in the window it landed.
    assert!((3_333..=10_000).contains(&bucket.own_counts.presence_ms));
}
