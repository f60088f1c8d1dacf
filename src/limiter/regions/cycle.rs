//! One period of one global bucket in this region: book the demand, read the other regions,
//! take in what they granted, grant toward the fair targets.

use serde_json::{Value, json};

use super::Regions;
use super::lease::{Leased, Own, Theirs};
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

/// One bucket's period: what it is about and where its calls go.
struct Period<'a> {
    regions: &'a Regions,
    local: &'a dyn Backend,
    metrics: &'a Metrics,
    bucket: BucketKey,
    policy: &'a Policy,
    period_ms: u64,
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
    let period = Period {
        regions,
        local,
        metrics,
        bucket,
        policy,
        period_ms: regions.period.as_millis().max(1) as u64,
    };
    let mut own = period
        .leased(&regions.me)
        .sync(local, offered, &regions.replica)
        .await?;
    let mut view = View {
        demand_here: period.per_window(own.demand),
        lease_here: own.lease,
        regions: Vec::new(),
        transfer: None,
        at_ms: SystemClock.now_ms(),
    };
    if !own.runs {
        // Another replica of this region runs this period's transfers.
        return Ok(view);
    }
    let others = period.read_peers().await;
    for (name, theirs) in &others {
        let added = period.receive(name, theirs, &own).await?;
        if added > 0 {
            own.lease += added;
            view.transfer = Some(((*name).to_owned(), regions.me.clone(), added));
        }
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
            demand: period.per_window(theirs.demand),
        });
    }
    if let Some(transfer) = period.grant(&others, &mut holdings).await? {
        view.transfer = Some(transfer);
    }
    view.regions = std::iter::once(regions.me.clone())
        .chain(others.iter().map(|(name, _)| (*name).to_owned()))
        .zip(holdings)
        .collect();
    Ok(view)
}

impl Period<'_> {
    /// The bucket's lease calls in `region`'s Redis.
    fn leased(&self, region: &str) -> Leased<'_> {
        Leased {
            bucket: self.bucket,
            policy: self.policy,
            base: self.regions.base(region, self.policy.requests_per_unit),
            period_ms: self.period_ms,
        }
    }

    /// Demand a period, as requests a window.
    fn per_window(&self, demand: u64) -> u64 {
        let window = u128::from(self.policy.window_ms());
        u64::try_from(u128::from(demand) * window / u128::from(self.period_ms)).unwrap_or(u64::MAX)
    }

    /// The other regions that answered within half a period, with what they hold.
    async fn read_peers(&self) -> Vec<(&str, Theirs)> {
        let regions = self.regions;
        let reads = futures::future::join_all(regions.peers.iter().map(|peer| async move {
            let theirs = self.leased(&peer.name);
            let read = theirs.read(peer.backend.as_ref(), &regions.me);
            let read = tokio::time::timeout(regions.peer_wait(), read)
                .await
                .unwrap_or(Err(BackendError::Timeout));
            regions.peer_answered(peer, read.as_ref().map(|_| ()).map_err(|e| e.to_string()));
            read.ok().map(|theirs| (peer.name.as_str(), theirs))
        }))
        .await;
        reads.into_iter().flatten().collect()
    }

    /// Takes in what region `name` granted here and `own` has not received; returns it.
    async fn receive(&self, name: &str, theirs: &Theirs, own: &Own) -> Result<u64, BackendError> {
        let had = own.received.get(name).copied().unwrap_or(0);
        if theirs.granted_to_us <= had {
            return Ok(0);
        }
        let here = self.leased(&self.regions.me);
        let added = here.receive(self.local, name, theirs.granted_to_us).await?;
        self.metrics.region_transfer("received", added);
        Ok(added)
    }

    /// Grants toward the fair targets of `holdings` (this region first, then `others` in
    /// order), updating them; returns the last transfer made.
    async fn grant(
        &self,
        others: &[(&str, Theirs)],
        holdings: &mut [Holding],
    ) -> Result<Option<(String, String, u64)>, BackendError> {
        let here = self.leased(&self.regions.me);
        let least = u64::from(self.policy.requests_per_unit / 100).max(1);
        let mut last = None;
        for (i, amount) in plan::grants(holdings, least).into_iter().enumerate() {
            if amount == 0 {
                continue;
            }
            let to = others[i - 1].0;
            let granted = here.grant(self.local, to, amount).await?;
            self.metrics.region_transfer("granted", granted);
            if granted > 0 {
                holdings[0].lease -= granted;
                holdings[i].lease += granted;
                last = Some((self.regions.me.clone(), to.to_owned(), granted));
            }
        }
        Ok(last)
    }
}
