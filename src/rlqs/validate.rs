//! Checks one usage-report message and turns each bucket's usage into plain values: a
//! canonical bucket id (pairs sorted by key) and its counts.
//!
//! Only the domain can make a whole message bad. A bad bucket is skipped on its own: Envoy
//! sends every bucket it holds in every report and reopens a failed stream with the same
//! report, so ending the stream over one bucket would end it for good.

use std::collections::HashMap;
use std::time::Duration;

use crate::proto::rlqs::RateLimitQuotaUsageReports;
use crate::proto::rlqs::rate_limit_quota_usage_reports::BucketQuotaUsage;

/// Most pairs in one bucket id (as many as entries in a ShouldRateLimit descriptor).
pub const MAX_PAIRS: usize = crate::limiter::request::bounds::MAX_ENTRIES;
/// Longest key or value of a bucket id pair, and longest domain, in bytes (as for a
/// ShouldRateLimit descriptor entry).
pub const MAX_TEXT_BYTES: usize = crate::limiter::request::bounds::MAX_TEXT_BYTES;

/// A bucket id: its pairs sorted by key (keys are unique, so this order is total).
pub type BucketPairs = Vec<(String, String)>;

/// One bucket's usage since its last report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    /// The bucket.
    pub id: BucketPairs,
    /// Time covered by this report; zero on a bucket's first report (Envoy sends whole
    /// seconds).
    pub elapsed: Duration,
    /// Requests the client admitted.
    pub allowed: u64,
    /// Requests the client denied.
    pub denied: u64,
}

/// Why a message ends its stream with `INVALID_ARGUMENT`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidMessage {
    /// The first message named no domain.
    #[error("the first report must name a domain")]
    NoDomain,
    /// The domain is longer than [`MAX_TEXT_BYTES`].
    #[error("domain longer than {MAX_TEXT_BYTES} bytes")]
    LongDomain,
    /// A later message named another domain.
    #[error("a stream's reports must all be for the domain of its first")]
    OtherDomain,
}

/// Why one bucket of a message is skipped (it gets no answer; Envoy then applies its
/// `no_assignment_behavior` to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadBucket {
    /// A usage without `bucket_id`.
    #[error("a usage without a bucket_id")]
    NoId,
    /// An id with no pairs (Envoy drops keys whose header value is empty).
    #[error("an empty bucket id")]
    EmptyId,
    /// More than [`MAX_PAIRS`] pairs.
    #[error("more than {MAX_PAIRS} pairs in a bucket id")]
    TooManyPairs,
    /// An empty key or value.
    #[error("an empty key or value in a bucket id")]
    EmptyText,
    /// A key or value over [`MAX_TEXT_BYTES`].
    #[error("a bucket id key or value longer than {MAX_TEXT_BYTES} bytes")]
    LongText,
    /// A negative or malformed `time_elapsed`.
    #[error("a negative or malformed time_elapsed")]
    BadElapsed,
}

impl BadBucket {
    /// The `reason` label of `floodgate_rlqs_skipped_buckets`.
    pub fn label(self) -> &'static str {
        match self {
            BadBucket::NoId | BadBucket::EmptyId => "empty_id",
            BadBucket::TooManyPairs | BadBucket::EmptyText | BadBucket::LongText => "bad_id",
            BadBucket::BadElapsed => "bad_time_elapsed",
        }
    }
}

/// Checks the domain of a message: the first names it, later ones repeat it (Envoy) or
/// leave it empty. Returns the stream's domain.
///
/// # Errors
/// No domain in the first message, another domain later, or a domain over
/// [`MAX_TEXT_BYTES`].
pub fn domain(known: Option<&str>, sent: &str) -> Result<String, InvalidMessage> {
    match known {
        None if sent.is_empty() => Err(InvalidMessage::NoDomain),
        None if sent.len() > MAX_TEXT_BYTES => Err(InvalidMessage::LongDomain),
        None => Ok(sent.to_owned()),
        Some(known) if sent.is_empty() || sent == known => Ok(known.to_owned()),
        Some(_) => Err(InvalidMessage::OtherDomain),
    }
}

/// The usages of one message in the client's order, each checked on its own.
pub fn usages(message: RateLimitQuotaUsageReports) -> Vec<Result<Usage, BadBucket>> {
    message.bucket_quota_usages.into_iter().map(usage).collect()
}

fn usage(usage: BucketQuotaUsage) -> Result<Usage, BadBucket> {
    let id = usage.bucket_id.ok_or(BadBucket::NoId)?;
    Ok(Usage {
        id: pairs(id.bucket)?,
        elapsed: elapsed(usage.time_elapsed)?,
        allowed: usage.num_requests_allowed,
        denied: usage.num_requests_denied,
    })
}

/// A bucket id's pairs, checked and sorted by key.
fn pairs(bucket: HashMap<String, String>) -> Result<BucketPairs, BadBucket> {
    if bucket.is_empty() {
        return Err(BadBucket::EmptyId);
    }
    if bucket.len() > MAX_PAIRS {
        return Err(BadBucket::TooManyPairs);
    }
    for (key, value) in &bucket {
        if key.is_empty() || value.is_empty() {
            return Err(BadBucket::EmptyText);
        }
        if key.len() > MAX_TEXT_BYTES || value.len() > MAX_TEXT_BYTES {
            return Err(BadBucket::LongText);
        }
    }
    let mut pairs: BucketPairs = bucket.into_iter().collect();
    pairs.sort_unstable();
    Ok(pairs)
}

/// `time_elapsed` as a duration; unset is zero.
fn elapsed(duration: Option<pbjson_types::Duration>) -> Result<Duration, BadBucket> {
    let Some(duration) = duration else {
        return Ok(Duration::ZERO);
    };
    if !(0..1_000_000_000).contains(&duration.nanos) {
        return Err(BadBucket::BadElapsed);
    }
    Duration::try_from(duration).map_err(|_| BadBucket::BadElapsed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::rlqs::BucketId;

    fn usage_of(bucket: &[(&str, &str)], elapsed: Option<(i64, i32)>) -> BucketQuotaUsage {
        BucketQuotaUsage {
            bucket_id: Some(BucketId {
                bucket: bucket
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            }),
            time_elapsed: elapsed.map(|(seconds, nanos)| pbjson_types::Duration { seconds, nanos }),
            num_requests_allowed: 3,
            num_requests_denied: 4,
        }
    }

    fn report(usages: Vec<BucketQuotaUsage>) -> RateLimitQuotaUsageReports {
        RateLimitQuotaUsageReports {
            domain: String::new(),
            bucket_quota_usages: usages,
        }
    }

    #[test]
    fn pairs_are_sorted_by_key() {
        let usage = usages(report(vec![usage_of(
            &[("b", "2"), ("a", "1"), ("c", "3")],
            Some((5, 0)),
        )]))
        .remove(0)
        .unwrap();
        let keys: Vec<_> = usage.id.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["a", "b", "c"]);
        assert_eq!(usage.elapsed, Duration::from_secs(5));
        assert_eq!((usage.allowed, usage.denied), (3, 4));
    }

    #[test]
    fn each_bad_bucket_is_refused_alone_and_the_good_ones_stay() {
        let long = "x".repeat(MAX_TEXT_BYTES + 1);
        let many: Vec<(String, String)> = (0..=MAX_PAIRS)
            .map(|i| (format!("k{i}"), "v".to_owned()))
            .collect();
        let many: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let mut no_id = usage_of(&[("k", "v")], None);
        no_id.bucket_id = None;
        let checked = usages(report(vec![
            usage_of(&[("k", "good")], None),
            no_id,
            usage_of(&[], None),
            usage_of(&[("", "v")], None),
            usage_of(&[("k", "")], None),
            usage_of(&[(long.as_str(), "v")], None),
            usage_of(&[("k", long.as_str())], None),
            usage_of(&many, None),
            usage_of(&[("k", "v")], Some((-1, 0))),
            usage_of(&[("k", "v")], Some((0, -5))),
            usage_of(&[("k", "v")], Some((0, 1_000_000_000))),
            usage_of(&[("k", "also-good")], Some((5, 0))),
        ]));
        let errors: Vec<_> = checked.iter().filter_map(|c| c.clone().err()).collect();
        assert_eq!(
            errors,
            [
                BadBucket::NoId,
                BadBucket::EmptyId,
                BadBucket::EmptyText,
                BadBucket::EmptyText,
                BadBucket::LongText,
                BadBucket::LongText,
                BadBucket::TooManyPairs,
                BadBucket::BadElapsed,
                BadBucket::BadElapsed,
                BadBucket::BadElapsed,
            ]
        );
        assert!(checked[0].is_ok() && checked[11].is_ok());
    }

    #[test]
    fn the_first_message_names_the_domain_and_later_ones_keep_it() {
        assert_eq!(domain(None, ""), Err(InvalidMessage::NoDomain));
        assert_eq!(
            domain(None, &"d".repeat(MAX_TEXT_BYTES + 1)),
            Err(InvalidMessage::LongDomain)
        );
        assert_eq!(domain(None, "web").unwrap(), "web");
        assert_eq!(domain(Some("web"), "").unwrap(), "web");
        assert_eq!(domain(Some("web"), "web").unwrap(), "web");
        assert_eq!(domain(Some("web"), "api"), Err(InvalidMessage::OtherDomain));
    }
}
