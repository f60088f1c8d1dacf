//! The calls of `lua/lease.lua`: one region's lease of one global bucket, in that region's
//! Redis. Every call is one script, atomic with the bucket's state.

use std::collections::HashMap;

use redis::Value;

use crate::backend::redis::scripts::LEASE;
use crate::backend::{Backend, BackendError, BucketKey, SideCall, SideScript};
use crate::rules::{Algorithm, OnOverLimit, Policy};

/// The lease script.
static SCRIPT: SideScript = SideScript::new(LEASE);

/// This region's view of a bucket after a sync.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Own {
    /// Its lease now.
    pub lease: u64,
    /// Requests a period (the larger of the current and the previous one).
    pub demand: u64,
    /// Whether this replica runs the period's transfers.
    pub runs: bool,
    /// Granted to each region, in total.
    pub granted: HashMap<String, u64>,
    /// Received from each region, in total.
    pub received: HashMap<String, u64>,
}

/// Another region's view of a bucket, read from its Redis.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Theirs {
    /// Its lease now.
    pub lease: u64,
    /// Requests a period.
    pub demand: u64,
    /// What it granted the reading region, in total.
    pub granted_to_us: u64,
    /// What it received from the reading region, in total.
    pub received_from_us: u64,
}

/// The bucket a lease call is about, with the region's base lease and the period.
pub struct Leased<'a> {
    /// The bucket.
    pub bucket: BucketKey,
    /// Its rule's policy.
    pub policy: &'a Policy,
    /// The base lease of the region whose Redis is called.
    pub base: u32,
    /// The transfer period, ms.
    pub period_ms: u64,
}

impl Leased<'_> {
    fn call(&self, op: &str, more: Vec<String>) -> SideCall {
        // `{hash}`: the side call adds the prefix and its colon, as the bucket's key has.
        let key = format!("{{{}}}", self.bucket.hash_text());
        let mut args = vec![
            op.to_owned(),
            self.base.to_string(),
            self.period_ms.to_string(),
        ];
        args.extend(more);
        SideCall {
            script: &SCRIPT,
            keys: vec![
                key.clone(),
                format!("{key}:lease:{}", self.policy.requests_per_unit),
                format!("{key}:lease-lock"),
            ],
            args,
        }
    }

    /// `algorithm W L B` as the script reads them.
    fn policy_args(&self) -> Vec<String> {
        let policy = self.policy;
        let index = Algorithm::ALL
            .iter()
            .position(|algorithm| *algorithm == policy.algorithm)
            .map_or(0, |i| i + 1);
        vec![
            index.to_string(),
            policy.window_ms().to_string(),
            policy.requests_per_unit.to_string(),
            policy.burst.to_string(),
        ]
    }

    /// Adds this replica's `demand` and reads the region's lease.
    pub async fn sync(
        &self,
        backend: &dyn Backend,
        demand: u64,
        replica: &str,
    ) -> Result<Own, BackendError> {
        let call = self.call("sync", vec![demand.to_string(), replica.to_owned()]);
        let values = array(backend.side_call(&call).await?)?;
        let mut own = Own {
            lease: int(values.first())?,
            demand: int(values.get(1))?,
            runs: int(values.get(2))? == 1,
            ..Own::default()
        };
        for pair in values.get(3..).unwrap_or_default().chunks(2) {
            let (Some(name), value) = (text(pair.first()), int(pair.get(1))?) else {
                continue;
            };
            if let Some(region) = name.strip_prefix("o.") {
                own.granted.insert(region.to_owned(), value);
            } else if let Some(region) = name.strip_prefix("i.") {
                own.received.insert(region.to_owned(), value);
            }
        }
        Ok(own)
    }

    /// Reads another region's lease, as `reader` sees it.
    pub async fn read(&self, backend: &dyn Backend, reader: &str) -> Result<Theirs, BackendError> {
        let call = self.call("read", vec![reader.to_owned()]);
        let values = array(backend.side_call(&call).await?)?;
        Ok(Theirs {
            lease: int(values.first())?,
            demand: int(values.get(1))?,
            granted_to_us: int(values.get(2))?,
            received_from_us: int(values.get(3))?,
        })
    }

    /// Applies what `from` granted this region in total (`seen`); returns what it added.
    pub async fn receive(
        &self,
        backend: &dyn Backend,
        from: &str,
        seen: u64,
    ) -> Result<u64, BackendError> {
        let mut args = vec![from.to_owned(), seen.to_string()];
        args.extend(self.policy_args());
        int(Some(&backend.side_call(&self.call("receive", args)).await?))
    }

    /// Grants `to` at most `amount` of this region's unused lease; returns what it granted.
    pub async fn grant(
        &self,
        backend: &dyn Backend,
        to: &str,
        amount: u64,
    ) -> Result<u64, BackendError> {
        let mut args = vec![to.to_owned(), amount.to_string()];
        args.extend(self.policy_args());
        args.push(u8::from(self.policy.on_over_limit == OnOverLimit::Consume).to_string());
        args.push(self.policy.lockout_ms().to_string());
        int(Some(&backend.side_call(&self.call("grant", args)).await?))
    }
}

fn array(value: Value) -> Result<Vec<Value>, BackendError> {
    match value {
        Value::Array(values) => Ok(values),
        other => Err(BackendError::failed(format!("lease reply {other:?}"))),
    }
}

fn int(value: Option<&Value>) -> Result<u64, BackendError> {
    match value {
        Some(Value::Int(n)) => Ok(u64::try_from(*n).unwrap_or(0)),
        Some(Value::BulkString(bytes)) => std::str::from_utf8(bytes)
            .ok()
            .and_then(|text| text.parse().ok())
            .ok_or_else(|| BackendError::failed("lease reply: not a number")),
        other => Err(BackendError::failed(format!("lease reply {other:?}"))),
    }
}

fn text(value: Option<&Value>) -> Option<&str> {
    match value {
        Some(Value::BulkString(bytes)) => std::str::from_utf8(bytes).ok(),
        _ => None,
    }
}
