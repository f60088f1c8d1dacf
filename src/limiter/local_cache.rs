//! Local over-limit cache: buckets known to be exhausted are denied without a backend call.
//!
//! An entry is only stored when the backend's answer proves that no cost-1 request can fit
//! before the entry's deadline (see `Limiter`), so a cache hit never denies a request the
//! backend would have admitted. Bounded by entry count; the eviction policy is the
//! library's (quick_cache), and expired entries are ignored on read.

use quick_cache::sync::Cache;
use tokio::time::{Duration, Instant};

use crate::backend::BucketKey;

/// Exhausted buckets and until when they stay exhausted.
pub struct OverLimitCache {
    entries: Cache<BucketKey, Instant>,
}

impl OverLimitCache {
    /// A cache holding at most `capacity` buckets (`capacity >= 1`).
    pub fn new(capacity: usize) -> OverLimitCache {
        OverLimitCache {
            entries: Cache::new(capacity.max(1)),
        }
    }

    /// Time left on a cached exhaustion, if the bucket is cached and not yet expired.
    pub fn exhausted_for(&self, bucket: &BucketKey) -> Option<Duration> {
        let until = self.entries.get(bucket)?;
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            self.entries.remove(bucket);
            return None;
        }
        Some(left)
    }

    /// Remembers that `bucket` admits nothing for the next `reset_ms` milliseconds.
    pub fn insert(&self, bucket: BucketKey, reset_ms: u64) {
        if reset_ms > 0 {
            let until = Instant::now() + Duration::from_millis(reset_ms);
            self.entries.insert(bucket, until);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{Policy, Unit};

    fn bucket(value: &str) -> BucketKey {
        BucketKey::new(
            "d",
            "k",
            [("k", value)],
            &Policy::fixed_window(1, Unit::Second),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn entries_expire_at_their_deadline() {
        let cache = OverLimitCache::new(8);
        cache.insert(bucket("a"), 1500);
        cache.insert(bucket("zero"), 0);
        assert_eq!(
            cache.exhausted_for(&bucket("a")),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(cache.exhausted_for(&bucket("zero")), None);
        tokio::time::advance(Duration::from_millis(1499)).await;
        assert_eq!(
            cache.exhausted_for(&bucket("a")),
            Some(Duration::from_millis(1))
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(cache.exhausted_for(&bucket("a")), None);
    }

    #[test]
    fn capacity_is_bounded() {
        let cache = OverLimitCache::new(4);
        for i in 0..100 {
            cache.insert(bucket(&i.to_string()), 60_000);
        }
        let live = (0..100)
            .filter(|i| cache.exhausted_for(&bucket(&i.to_string())).is_some())
            .count();
        assert!(live <= 8, "{live} entries kept");
    }
}
