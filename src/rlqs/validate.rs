//! Checks one usage-report message against the stream's bounds and turns each bucket's
//! usage into plain values: a canonical bucket id (pairs sorted by key) and its counts.

use std::time::Duration;

use crate::proto::rlqs::RateLimitQuotaUsageReports;

/// Most pairs in one bucket id.
pub const MAX_PAIRS: usize = 32;
/// Longest key or value of a bucket id pair, and longest domain, in bytes.
pub const MAX_TEXT_BYTES: usize = 4096;

/// A bucket id: its pairs sorted by key (keys are unique, so this order is total).
pub type BucketPairs = Vec<(String, String)>;

/// One bucket's usage since its last report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    /// The bucket.
    pub id: BucketPairs,
    /// Time covered by this report; zero when the client did not say.
    pub elapsed: Duration,
    /// Requests the client admitted.
    pub allowed: u64,
    /// Requests the client denied.
    pub denied: u64,
}

/// Why a message ends its stream with `INVALID_ARGUMENT`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

/// Checks the domain of a message: the first names it, later ones repeat it or leave it
/// empty. Returns the stream's domain.
///
/// # Errors
/// No domain in the first message, another domain later, or a domain over
/// [`MAX_TEXT_BYTES`].
pub fn domain(known: Option<&str>, sent: &str) -> Result<String, Invalid> {
    match known {
        None if sent.is_empty() => Err(Invalid("the first report must name a domain".into())),
        None if sent.len() > MAX_TEXT_BYTES => Err(Invalid(format!(
            "domain longer than {MAX_TEXT_BYTES} bytes"
        ))),
        None => Ok(sent.to_owned()),
        Some(known) if sent.is_empty() || sent == known => Ok(known.to_owned()),
        Some(_) => Err(Invalid(
            "a stream's reports must all be for the domain of its first".into(),
        )),
    }
}

/// The usages of one message, in the client's id order (so answers are deterministic).
///
/// # Errors
/// A usage without a bucket id, an id with no or more than [`MAX_PAIRS`] pairs, an empty or
/// oversized key or value, or a negative or malformed `time_elapsed`.
pub fn usages(message: RateLimitQuotaUsageReports) -> Result<Vec<Usage>, Invalid> {
    let mut entries: Vec<_> = message.bucket_quota_usages.into_iter().collect();
    entries.sort_unstable_by_key(|(client_id, _)| *client_id);
    entries
        .into_iter()
        .map(|(client_id, usage)| {
            let id = usage
                .bucket_id
                .ok_or_else(|| Invalid(format!("bucket {client_id} has no bucket_id")))?;
            Ok(Usage {
                id: pairs(id.bucket)
                    .map_err(|why| Invalid(format!("bucket {client_id}: {why}")))?,
                elapsed: elapsed(usage.time_elapsed)
                    .map_err(|why| Invalid(format!("bucket {client_id}: {why}")))?,
                allowed: usage.num_requests_allowed,
                denied: usage.num_requests_denied,
            })
        })
        .collect()
}

/// A bucket id's pairs, checked and sorted by key.
fn pairs(bucket: std::collections::HashMap<String, String>) -> Result<BucketPairs, String> {
    if bucket.is_empty() {
        return Err("an empty bucket id".into());
    }
    if bucket.len() > MAX_PAIRS {
        return Err(format!("more than {MAX_PAIRS} pairs in a bucket id"));
    }
    for (key, value) in &bucket {
        if key.is_empty() || value.is_empty() {
            return Err("an empty key or value in a bucket id".into());
        }
        if key.len() > MAX_TEXT_BYTES || value.len() > MAX_TEXT_BYTES {
            return Err(format!(
                "a bucket id key or value longer than {MAX_TEXT_BYTES} bytes"
            ));
        }
    }
    let mut pairs: BucketPairs = bucket.into_iter().collect();
    pairs.sort_unstable();
    Ok(pairs)
}

/// `time_elapsed` as a duration; unset is zero.
fn elapsed(duration: Option<pbjson_types::Duration>) -> Result<Duration, String> {
    let Some(duration) = duration else {
        return Ok(Duration::ZERO);
    };
    if !(0..1_000_000_000).contains(&duration.nanos) {
        return Err("a malformed time_elapsed".into());
    }
    Duration::try_from(duration).map_err(|_| "a negative time_elapsed".into())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::proto::rlqs::BucketId;
    use crate::proto::rlqs::rate_limit_quota_usage_reports::BucketQuotaUsage;

    fn report(bucket: &[(&str, &str)], elapsed: Option<(i64, i32)>) -> RateLimitQuotaUsageReports {
        let id = BucketId {
            bucket: bucket
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        let usage = BucketQuotaUsage {
            bucket_id: Some(id),
            time_elapsed: elapsed.map(|(seconds, nanos)| pbjson_types::Duration { seconds, nanos }),
            num_requests_allowed: 3,
            num_requests_denied: 4,
            last_report: None,
        };
        RateLimitQuotaUsageReports {
            domain: String::new(),
            bucket_quota_usages: HashMap::from([(7, usage)]),
        }
    }

    #[test]
    fn pairs_are_sorted_by_key() {
        let usage = usages(report(
            &[("b", "2"), ("a", "1"), ("c", "3")],
            Some((0, 500_000_000)),
        ))
        .unwrap()
        .remove(0);
        let keys: Vec<_> = usage.id.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["a", "b", "c"]);
        assert_eq!(usage.elapsed, Duration::from_millis(500));
        assert_eq!((usage.allowed, usage.denied), (3, 4));
    }

    #[test]
    fn bad_bucket_ids_and_durations_are_refused() {
        let long = "x".repeat(MAX_TEXT_BYTES + 1);
        let many: Vec<(String, String)> = (0..=MAX_PAIRS)
            .map(|i| (format!("k{i}"), "v".to_owned()))
            .collect();
        let many: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        for bad in [
            report(&[], None),
            report(&[("", "v")], None),
            report(&[("k", "")], None),
            report(&[(long.as_str(), "v")], None),
            report(&[("k", long.as_str())], None),
            report(&many, None),
            report(&[("k", "v")], Some((-1, 0))),
            report(&[("k", "v")], Some((0, -5))),
            report(&[("k", "v")], Some((0, 1_000_000_000))),
        ] {
            assert!(usages(bad).is_err());
        }
        let mut missing = report(&[("k", "v")], None);
        missing.bucket_quota_usages.get_mut(&7).unwrap().bucket_id = None;
        assert!(usages(missing).is_err());
    }

    #[test]
    fn the_first_message_names_the_domain_and_later_ones_keep_it() {
        assert!(domain(None, "").is_err());
        assert!(domain(None, &"d".repeat(MAX_TEXT_BYTES + 1)).is_err());
        assert_eq!(domain(None, "web").unwrap(), "web");
        assert_eq!(domain(Some("web"), "").unwrap(), "web");
        assert_eq!(domain(Some("web"), "web").unwrap(), "web");
        assert!(domain(Some("web"), "api").is_err());
    }
}
