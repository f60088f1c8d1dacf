//! One period of one global bucket in this region: book the demand, read the other regions,
//! take in what they granted, grant toward the fair targets.

use serde_json::{Value, json};

use super::Regions;
use super::lease::{Leased, Theirs};
use super::plan::{self, Holding};
use crate::backend::{Backend, BackendError, BucketKey};
use crate::clock::{Clock, SystemClock};
use crate::metrics::Metrics;
use crate::rules::Policy;

/// What one period of a bucket saw, for the overview.
#[derive(Debug, Clone)]
pub(super) struct View {
    /// Requests a window offered in this region.
    pub(super) demand_here: u64,
    /// This region's lease as the period read it.
    pub(super) lease_here: u64,
    /// Each region's lease and demand as read this period (those that answered).
    regions: Vec<(String, Holding)>,
    /// The latest transfer this period: (from, to, amount).
    transfer: Option<(String, String, u64)>,
    /// When, ms since the epoch.
    at_ms: i64,
}

impl View {
    pub(super) fn to_json(&self, rule: &str, bucket: &BucketKey) -> Value {
        let regions: Vec<Value> = self
            .regions
            .iter()
            .map(|(name, holding)| {
                json!({"region": name, "lease": holding.lease, "demand": holding.demand})
            })
            .collect();
        json!({
            "rule": rule,
            "bucket": bucket.hash_text(),
            "regions": regions,
            "last_transfer": self.transfer.as_ref().map(|(from, to, amount)| {
                json!({"from": from, "to": to, "amount": amount})
            }),
            "at_ms": self.at_ms,
        })
    }
}

/// Runs the period of `bucket` (rule `policy`, `offered` here since the last period).
pub(super) async fn run(
    regions: &Regions,
    local: &dyn Backend,
    metrics: &Metrics,
    bucket: BucketKey,
    policy: &Policy,
    offered: u64,
) -> Result<View, BackendError> {
    let limit = policy.requests_per_unit;
    let period_ms = regions.period.as_millis().max(1) as u64;
    let leased = |region: &str| Leased {
        bucket,
        policy,
        base: regions.base(region, limit),
        period_ms,
    };
    // Demand a period, as requests a window.
    let per_window = |demand: u64| {
        u64::try_from(u128::from(demand) * u128::from(policy.window_ms()) / u128::from(period_ms))
            .unwrap_or(u64::MAX)
    };
    let here = leased(&regions.me);
    let mut own = here.sync(local, offered, &regions.replica).await?;
    let mut view = View {
        demand_here: per_window(own.demand),
        lease_here: own.lease,
        regions: Vec::new(),
        transfer: None,
        at_ms: SystemClock.now_ms(),
    };
    if !own.runs {
        // Another replica of this region runs this period's transfers.
        return Ok(view);
    }
    let reads = futures::future::join_all(regions.peers.iter().map(|peer| {
        let theirs = leased(&peer.name);
        async move {
            let read = tokio::time::timeout(
                regions.peer_wait(),
                theirs.read(peer.backend.as_ref(), &regions.me),
            )
            .await
            .unwrap_or(Err(BackendError::Timeout));
            regions.peer_answered(peer, read.as_ref().map(|_| ()).map_err(|e| e.to_string()));
            read.ok()
        }
    }))
    .await;
    let mut others: Vec<(&str, Theirs)> = Vec::new();
    for (peer, read) in regions.peers.iter().zip(reads) {
        let Some(theirs) = read else { continue };
        let had = own.received.get(&peer.name).copied().unwrap_or(0);
        if theirs.granted_to_us > had {
            let added = here
                .receive(local, &peer.name, theirs.granted_to_us)
                .await?;
            own.lease += added;
            metrics.region_transfer("received", added);
            if added > 0 {
                view.transfer = Some((peer.name.clone(), regions.me.clone(), added));
            }
        }
        others.push((&peer.name, theirs));
    }
    let mut holdings = vec![Holding {
        lease: own.lease,
        demand: view.demand_here,
    }];
    for (name, theirs) in &others {
        // Granted to them and not yet taken in there counts as theirs already.
        let sent = own.granted.get(*name).copied().unwrap_or(0);
        holdings.push(Holding {
            lease: theirs.lease + sent.saturating_sub(theirs.received_from_us),
            demand: per_window(theirs.demand),
        });
    }
    let least = u64::from(limit / 100).max(1);
    for (i, amount) in plan::grants(&holdings, least).into_iter().enumerate() {
        if amount == 0 {
            continue;
        }
        let to = others[i - 1].0;
        let granted = here.grant(local, to, amount).await?;
        metrics.region_transfer("granted", granted);
        if granted > 0 {
            holdings[0].lease -= granted;
            holdings[i].lease += granted;
            view.transfer = Some((regions.me.clone(), to.to_owned(), granted));
        }
    }
    view.regions = std::iter::once(regions.me.clone())
        .chain(others.iter().map(|(name, _)| (*name).to_owned()))
        .zip(holdings)
        .collect();
    Ok(view)
}
