//! Local over-limit cache: buckets known to be exhausted are denied without a backend call.
//!
//! An entry is only stored when the backend's answer proves that no cost-1 request can fit
//! before the entry's deadline (see `Limiter`), counted from when the backend was asked.
//! One thing can still free room early: another request's refund (an all-or-nothing denial
//! on a backend that undoes by refunds, or another replica's view); so an entry is trusted
//! for at most `max_age`, after which the backend is asked again. Entries are keyed by bucket and policy, so two limits on one bucket (Envoy
//! overrides) never share an entry, and a reload clears the cache. Bounded by entry count;
//! the eviction policy is the library's (quick_cache), and expired entries are ignored.

use quick_cache::sync::Cache;
use tokio::time::{Duration, Instant};

use crate::backend::BucketKey;
use crate::rules::Policy;

/// Exhausted buckets: until when the entry is trusted, and when the bucket resets.
pub struct OverLimitCache {
    entries: Cache<(BucketKey, Policy), Entry>,
    max_age: Duration,
}

#[derive(Clone, Copy)]
struct Entry {
    /// Until when the entry answers (at most `max_age` after the backend was asked).
    trusted_until: Instant,
    /// When the backend said the bucket resets: what a cached answer reports.
    resets_at: Instant,
}

impl OverLimitCache {
    /// A cache holding at most `capacity` buckets (`capacity >= 1`), each trusted for at
    /// most `max_age`: a refund elsewhere, or another replica's view, is seen that soon.
    pub fn new(capacity: usize, max_age: Duration) -> OverLimitCache {
        OverLimitCache {
            entries: Cache::new(capacity.max(1)),
            max_age,
        }
    }

    /// Time left until the bucket's reset, if the bucket is cached and the entry trusted.
    pub fn exhausted_for(&self, bucket: BucketKey, policy: Policy) -> Option<Duration> {
        let key = (bucket, policy);
        let entry = self.entries.get(&key)?;
        let now = Instant::now();
        let left = entry.resets_at.saturating_duration_since(now);
        if left.is_zero() || entry.trusted_until <= now {
            self.entries.remove(&key);
            return None;
        }
        Some(left)
    }

    /// Remembers that `bucket` under `policy` admits nothing for `reset_ms` milliseconds
    /// from `asked_at` (when the backend was asked, so the entry never outlives the reset).
    pub fn insert(&self, bucket: BucketKey, policy: Policy, asked_at: Instant, reset_ms: u64) {
        if reset_ms > 0 && !self.max_age.is_zero() {
            let resets_at = asked_at + Duration::from_millis(reset_ms);
            let entry = Entry {
                trusted_until: resets_at.min(asked_at + self.max_age),
                resets_at,
            };
            self.entries.insert((bucket, policy), entry);
        }
    }

    /// Forgets every entry (the rules changed).
    pub fn clear(&self) {
        self.entries.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::Unit;

    fn policy() -> Policy {
        Policy::fixed_window(1, Unit::Second)
    }

    fn bucket(value: &str) -> BucketKey {
        BucketKey::new("d", "k", [("k", value)], &policy())
    }

    #[tokio::test(start_paused = true)]
    async fn entries_expire_at_their_deadline() {
        let cache = OverLimitCache::new(8, Duration::from_secs(60));
        let now = Instant::now();
        cache.insert(bucket("a"), policy(), now, 1500);
        cache.insert(bucket("zero"), policy(), now, 0);
        let left = |value| cache.exhausted_for(bucket(value), policy());
        assert_eq!(left("a"), Some(Duration::from_millis(1500)));
        assert_eq!(left("zero"), None);
        let other_limit = Policy::fixed_window(5, Unit::Second);
        assert_eq!(cache.exhausted_for(bucket("a"), other_limit), None);
        tokio::time::advance(Duration::from_millis(1499)).await;
        assert_eq!(left("a"), Some(Duration::from_millis(1)));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(left("a"), None);
        cache.insert(bucket("b"), policy(), Instant::now(), 1000);
        cache.clear();
        assert_eq!(left("b"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn entries_are_trusted_for_at_most_max_age_and_report_the_real_reset() {
        let cache = OverLimitCache::new(8, Duration::from_secs(2));
        cache.insert(bucket("month"), policy(), Instant::now(), 30 * 86_400_000);
        let left = || cache.exhausted_for(bucket("month"), policy());
        assert_eq!(left(), Some(Duration::from_millis(30 * 86_400_000)));
        tokio::time::advance(Duration::from_millis(1999)).await;
        assert_eq!(left(), Some(Duration::from_millis(30 * 86_400_000 - 1999)));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(left(), None, "asked again after max_age");
        let off = OverLimitCache::new(8, Duration::ZERO);
        off.insert(bucket("x"), policy(), Instant::now(), 1000);
        assert_eq!(off.exhausted_for(bucket("x"), policy()), None);
    }

    #[test]
    fn capacity_is_bounded() {
        let cache = OverLimitCache::new(4, Duration::from_secs(60));
        for i in 0..100 {
            cache.insert(bucket(&i.to_string()), policy(), Instant::now(), 60_000);
        }
        let live = (0..100)
            .filter(|i| {
                cache
                    .exhausted_for(bucket(&i.to_string()), policy())
                    .is_some()
            })
            .count();
        assert!(live <= 8, "{live} entries kept");
    }
}
