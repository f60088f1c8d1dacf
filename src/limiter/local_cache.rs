//! Local over-limit cache: buckets known to be exhausted are denied without a backend call.
//!
//! An entry is only stored when the backend's answer proves that no cost-1 request can fit
//! before the entry's deadline (see `Limiter`), counted from when the backend was asked.
//! One thing can still free room early: another request's refund (an all-or-nothing denial
//! elsewhere); the cache then denies until the deadline, never admitting more than the
//! limit. Entries are keyed by bucket and policy, so two limits on one bucket (Envoy
//! overrides) never share an entry, and a reload clears the cache. Bounded by entry count;
//! the eviction policy is the library's (quick_cache), and expired entries are ignored.

use quick_cache::sync::Cache;
use tokio::time::{Duration, Instant};

use crate::backend::BucketKey;
use crate::rules::Policy;

/// Exhausted buckets and until when they stay exhausted.
pub struct OverLimitCache {
    entries: Cache<(BucketKey, Policy), Instant>,
}

impl OverLimitCache {
    /// A cache holding at most `capacity` buckets (`capacity >= 1`).
    pub fn new(capacity: usize) -> OverLimitCache {
        OverLimitCache {
            entries: Cache::new(capacity.max(1)),
        }
    }

    /// Time left on a cached exhaustion, if the bucket is cached and not yet expired.
    pub fn exhausted_for(&self, bucket: BucketKey, policy: Policy) -> Option<Duration> {
        let key = (bucket, policy);
        let until = self.entries.get(&key)?;
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            self.entries.remove(&key);
            return None;
        }
        Some(left)
    }

    /// Remembers that `bucket` under `policy` admits nothing for `reset_ms` milliseconds
    /// from `asked_at` (when the backend was asked, so the entry never outlives the reset).
    pub fn insert(&self, bucket: BucketKey, policy: Policy, asked_at: Instant, reset_ms: u64) {
        if reset_ms > 0 {
            let until = asked_at + Duration::from_millis(reset_ms);
            self.entries.insert((bucket, policy), until);
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
        let cache = OverLimitCache::new(8);
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

    #[test]
    fn capacity_is_bounded() {
        let cache = OverLimitCache::new(4);
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
