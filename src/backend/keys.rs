//! Bucket identity and storage key.
//!
//! A bucket is named by an injective encoding of everything that defines it (domain, rule
//! path, runtime values, algorithm, window, and for the token bucket its limit and burst).
//! Every field is length-prefixed, so no choice of values (braces, separators, 4 KiB strings,
//! unicode) can make two different identities encode alike. The Redis key carries only a
//! hash of that encoding inside `{...}`: callers' values never reach the key, so they cannot
//! move the Redis Cluster hash tag or collide buckets.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};

use crate::rules::{Algorithm, Policy};

/// Default prefix of every Redis key (`--key-prefix`), so deployments can share a Redis.
pub const DEFAULT_KEY_PREFIX: &str = "fg";

/// What a Redis key adds to its prefix: `:{`, 22 base64url characters of 16 bytes, `}`.
const REDIS_KEY_OVERHEAD: usize = 2 + 22 + 1;

/// The first 16 bytes of SHA-256 of a bucket identity: the bucket's name everywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BucketKey([u8; 16]);

impl BucketKey {
    /// Hashes the identity of one bucket.
    ///
    /// `levels` are the (key, value) pairs the rule matched, where each value is the
    /// request's runtime value, or the configured pattern for a `share_threshold` level.
    pub fn new<'a>(
        domain: &str,
        rule_path: &str,
        levels: impl IntoIterator<Item = (&'a str, &'a str)>,
        policy: &Policy,
    ) -> BucketKey {
        BucketKey::identity(IdentityHasher::default(), domain, rule_path, levels, policy)
    }

    /// The bucket a candidate rule (`--candidate-config`) keeps for the identity
    /// [`BucketKey::new`] names: its own, so a candidate never moves a live bucket. Its
    /// encoding starts with a length no field can have (`u64::MAX`), then the live one.
    pub fn candidate<'a>(
        domain: &str,
        rule_path: &str,
        levels: impl IntoIterator<Item = (&'a str, &'a str)>,
        policy: &Policy,
    ) -> BucketKey {
        let mut hasher = IdentityHasher::default();
        hasher.number(u64::MAX);
        BucketKey::identity(hasher, domain, rule_path, levels, policy)
    }

    fn identity<'a>(
        mut hasher: IdentityHasher,
        domain: &str,
        rule_path: &str,
        levels: impl IntoIterator<Item = (&'a str, &'a str)>,
        policy: &Policy,
    ) -> BucketKey {
        hasher.field(domain.as_bytes());
        hasher.field(rule_path.as_bytes());
        let mut count = 0u64;
        for (key, value) in levels {
            hasher.field(key.as_bytes());
            hasher.field(value.as_bytes());
            count += 1;
        }
        hasher.number(count);
        hasher.field(policy.algorithm.as_str().as_bytes());
        hasher.number(policy.window_ms());
        if policy.algorithm == Algorithm::TokenBucket {
            hasher.number(u64::from(policy.requests_per_unit));
            hasher.number(u64::from(policy.burst));
        }
        BucketKey(hasher.finish())
    }

    /// The raw 16 bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// The same counter kept apart for `replica` (the quota service counts demand per
    /// replica: `rlqs::ledger`): a hash of this key and the replica's id.
    pub fn for_replica(&self, replica: &str) -> BucketKey {
        let mut hasher = IdentityHasher::default();
        hasher.field(&self.0);
        hasher.field(replica.as_bytes());
        BucketKey(hasher.finish())
    }

    /// The 16 bytes in base64url, as inside the storage key's braces.
    pub fn hash_text(&self) -> String {
        URL_SAFE_NO_PAD.encode(self.0)
    }

    /// The bucket whose [`BucketKey::hash_text`] is `text`.
    pub fn from_hash_text(text: &str) -> Option<BucketKey> {
        let bytes = URL_SAFE_NO_PAD.decode(text).ok()?;
        Some(BucketKey(bytes.try_into().ok()?))
    }

    /// The storage key: `<prefix>:{<base64url of the 16 bytes>}` (the prefix is
    /// [`DEFAULT_KEY_PREFIX`] unless configured).
    ///
    /// The whole hash is the Redis Cluster hash tag, so one bucket is one slot and distinct
    /// buckets spread evenly over the slots.
    pub fn redis_key(&self, prefix: &str) -> String {
        // One allocation of the final size.
        let mut key = String::with_capacity(prefix.len() + REDIS_KEY_OVERHEAD);
        self.write_redis_key(prefix, &mut key);
        key
    }

    /// Appends [`BucketKey::redis_key`] to `out`: a batch writes every key through one
    /// buffer.
    pub fn write_redis_key(&self, prefix: &str, out: &mut String) {
        out.push_str(prefix);
        out.push_str(":{");
        URL_SAFE_NO_PAD.encode_string(self.0, out);
        out.push('}');
    }
}

/// Length-prefixed field encoder feeding SHA-256.
#[derive(Default)]
struct IdentityHasher(Sha256);

impl IdentityHasher {
    fn field(&mut self, bytes: &[u8]) {
        self.number(bytes.len() as u64);
        self.0.update(bytes);
    }

    fn number(&mut self, value: u64) {
        self.0.update(value.to_be_bytes());
    }

    fn finish(self) -> [u8; 16] {
        let digest = self.0.finalize();
        let mut key = [0u8; 16];
        key.copy_from_slice(&digest[..16]);
        key
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::Unit;
    use std::collections::HashSet;

    fn key(levels: &[(&str, &str)]) -> BucketKey {
        BucketKey::new(
            "api",
            "user",
            levels.iter().copied(),
            &Policy::fixed_window(10, Unit::Second),
        )
    }

    #[test]
    fn a_candidate_bucket_is_never_its_live_one() {
        let policy = Policy::fixed_window(10, Unit::Second);
        let levels = [("user", "alice")];
        let live = BucketKey::new("api", "user", levels, &policy);
        let candidate = BucketKey::candidate("api", "user", levels, &policy);
        assert_ne!(live, candidate);
        assert_eq!(
            candidate,
            BucketKey::candidate("api", "user", levels, &policy)
        );
    }

    #[test]
    fn hostile_values_never_share_a_bucket() {
        let long = "x".repeat(4096);
        let cases: Vec<Vec<(&str, &str)>> = vec![
            vec![("a", "b_c")],
            vec![("a_b", "c")],
            vec![("a", "b"), ("c", "")],
            vec![("a", "bc")],
            vec![("a", "{b}")],
            vec![("a", "}{")],
            vec![("a", ":")],
            vec![("a", "b.c")],
            vec![("a.b", "c")],
            vec![("a", "\u{1F600}")],
            vec![("a", "\0")],
            vec![("a", "")],
            vec![("", "a")],
            vec![("a", &long)],
            vec![("a", &long[..4095])],
        ];
        let keys: HashSet<String> = cases.iter().map(|c| key(c).redis_key("fg")).collect();
        assert_eq!(keys.len(), cases.len());
    }

    #[test]
    fn redis_key_has_one_fixed_hash_tag() {
        let redis_key = key(&[("a", "{evil}:tag}")]).redis_key("fg");
        assert!(redis_key.starts_with("fg:{"));
        assert!(redis_key.ends_with('}'));
        assert_eq!(redis_key.matches('{').count(), 1);
        assert_eq!(redis_key.len(), "fg:{}".len() + 22);
        assert_eq!(
            redis_key.capacity(),
            redis_key.len(),
            "built in one allocation"
        );
    }

    #[test]
    fn policy_changes_make_new_buckets() {
        let levels = [("a", "b")];
        let fixed = Policy::fixed_window(10, Unit::Second);
        let mut token = fixed;
        token.algorithm = Algorithm::TokenBucket;
        let mut bigger = token;
        bigger.burst = 20;
        let minute = Policy::fixed_window(10, Unit::Minute);
        let keys: HashSet<BucketKey> = [fixed, token, bigger, minute]
            .iter()
            .map(|p| BucketKey::new("api", "user", levels, p))
            .collect();
        assert_eq!(keys.len(), 4);
        // The fixed window's identity does not include its limit: raising it keeps the count.
        let raised = Policy::fixed_window(20, Unit::Second);
        assert_eq!(
            BucketKey::new("api", "user", levels, &fixed),
            BucketKey::new("api", "user", levels, &raised)
        );
    }
}
