//! Which global buckets each region is busy with (`lua/wants.lua`): a region grants only
//! from buckets it tracks, so each publishes the buckets offered requests here in its own
//! Redis, and tracks those the other regions publish. A member names the bucket and its
//! policy, so a region that never saw a request for it can still run its period.

use std::time::Duration;

use redis::Value;

use crate::backend::{Backend, BackendError, BucketKey, SideCall, SideScript};
use crate::rules::{Algorithm, OnOverLimit, Policy, Unit};

/// The wants script.
static SCRIPT: SideScript = SideScript::new(include_str!("../../../lua/wants.lua"));
/// The set's key (under the key prefix), one slot of a Redis Cluster.
const KEY: &str = "{floodgate-regions}:wants";

/// A busy bucket as a member: `hash algorithm unit multiplier L B accounting lockout_ms`.
pub fn member(bucket: BucketKey, policy: &Policy) -> String {
    format!(
        "{} {} {} {} {} {} {} {}",
        bucket.hash_text(),
        policy.algorithm.as_str(),
        policy.unit.as_str(),
        policy.unit_multiplier,
        policy.requests_per_unit,
        policy.burst,
        u8::from(policy.on_over_limit == OnOverLimit::Consume),
        policy.lockout_ms(),
    )
}

/// The bucket and policy of a member; `None` for one this version cannot read.
pub fn parse(member: &str) -> Option<(BucketKey, Policy)> {
    let mut words = member.split(' ');
    let mut next = || words.next();
    let bucket = BucketKey::from_hash_text(next()?)?;
    let algorithm = Algorithm::parse(next()?)?;
    let unit = Unit::parse(next()?)?;
    let mut number = || next()?.parse::<u64>().ok();
    let (multiplier, limit, burst) = (number()?, number()?, number()?);
    let (consume, lockout_ms) = (number()?, number()?);
    let policy = Policy {
        algorithm,
        unit,
        unit_multiplier: u32::try_from(multiplier).ok().filter(|&m| m > 0)?,
        requests_per_unit: u32::try_from(limit).ok().filter(|&l| l > 0)?,
        burst: u32::try_from(burst).ok().filter(|&b| b > 0)?,
        on_over_limit: if consume == 1 {
            OnOverLimit::Consume
        } else {
            OnOverLimit::Reject
        },
        lockout: (lockout_ms > 0).then(|| Duration::from_millis(lockout_ms)),
    };
    Some((bucket, policy))
}

fn call(op: &str, horizon: Duration, most: usize, members: Vec<String>) -> SideCall {
    let mut args = vec![
        op.to_owned(),
        horizon.as_millis().to_string(),
        most.to_string(),
    ];
    args.extend(members);
    SideCall {
        script: &SCRIPT,
        keys: vec![KEY.to_owned()],
        args,
    }
}

/// Publishes `members` as busy now in `backend` (this region's Redis).
///
/// # Errors
/// The call failed.
pub async fn publish(
    backend: &dyn Backend,
    members: Vec<String>,
    horizon: Duration,
    most: usize,
) -> Result<(), BackendError> {
    backend
        .side_call(&call("publish", horizon, most, members))
        .await
        .map(|_| ())
}

/// The buckets busy in the region of `backend`, within `horizon`.
///
/// # Errors
/// The call failed.
pub async fn read(
    backend: &dyn Backend,
    horizon: Duration,
    most: usize,
) -> Result<Vec<(BucketKey, Policy)>, BackendError> {
    match backend
        .side_call(&call("read", horizon, most, Vec::new()))
        .await?
    {
        Value::Array(members) => Ok(members
            .iter()
            .filter_map(|member| match member {
                Value::BulkString(bytes) => parse(std::str::from_utf8(bytes).ok()?),
                _ => None,
            })
            .collect()),
        other => Err(BackendError::failed(format!("wants reply {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_names_its_bucket_and_policy() {
        let policy = Policy {
            lockout: Some(Duration::from_secs(5)),
            on_over_limit: OnOverLimit::Consume,
            ..Policy::fixed_window(90, Unit::Second)
        };
        let bucket = BucketKey::new("d", "r", [("k", "v")], &policy);
        assert_eq!(parse(&member(bucket, &policy)), Some((bucket, policy)));
        assert_eq!(parse("junk"), None);
    }
}
