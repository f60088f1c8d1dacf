//! One budget across regions (docs/regions.md): a global rule (`scope: global`) is decided in
//! the local region's Redis only, within the region's lease of its limit, so no request waits
//! for another region. Every period each region publishes its demand in its own Redis, reads
//! the other regions' leases and demands from theirs, takes in what they granted it, and
//! grants its unused lease toward their max-min fair targets (`plan`). The leases add up to
//! at most the limit at every instant, under any partition (`lua/lease.lua`): the
//! demarcation protocol (Barbara-Milla and Garcia-Molina, 1992) over escrow counters
//! (O'Neil, 1986).

mod cycle;
pub mod lease;
pub mod plan;
pub mod wants;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Value, json};

use crate::backend::{Backend, BackendSettings, BucketKey};
use crate::clock::{Clock, SystemClock};
use crate::metrics::Metrics;
use crate::rules::Policy;

/// Default `--lease-period`.
pub const DEFAULT_PERIOD: Duration = Duration::from_secs(1);
/// Global buckets a replica tracks at most; past it, a new bucket decides with its region's
/// base lease and moves no lease until others go idle.
pub const MAX_TRACKED: usize = 10_000;
/// Periods without a request after which a bucket is no longer tracked.
const IDLE_PERIODS: u32 = 30;
/// Buckets whose period runs at once.
const CONCURRENT_CYCLES: usize = 16;

/// How a replica takes part in regions.
#[derive(Debug, Clone)]
pub struct RegionSettings {
    /// This region's name.
    pub name: String,
    /// The other regions: each one's name and how to reach its Redis.
    pub peers: Vec<(String, BackendSettings)>,
    /// How often leases move.
    pub period: Duration,
    /// Domains whose every rule is global (rules from xDS, which carry no `scope`).
    pub global_domains: Vec<String>,
}

/// Another region: its Redis and whether it answered lately.
struct Peer {
    name: String,
    backend: Arc<dyn Backend>,
    status: Mutex<PeerStatus>,
}

/// What this replica last knew of a peer region.
#[derive(Debug, Clone, Default)]
struct PeerStatus {
    reachable: bool,
    /// When it last answered, ms since the epoch.
    answered_ms: Option<i64>,
    /// Why it last did not.
    error: Option<String>,
}

/// A global bucket this replica has seen lately.
struct Tracked {
    policy: Policy,
    /// The rule's label, for the overview.
    rule: Arc<str>,
    /// Cost offered here since the last period.
    offered: u64,
    /// Periods since the last request.
    idle: u32,
    /// What the last period saw.
    view: Option<cycle::View>,
}

/// This replica's part in one budget across regions.
pub struct Regions {
    me: String,
    /// Every region's name, sorted: a region's base lease follows its place here.
    members: Vec<String>,
    /// This region's place in `members` (the request path asks its base).
    place: u32,
    peers: Vec<Peer>,
    period: Duration,
    global_domains: HashSet<String>,
    /// Names this replica in the period locks: its id in the replica registry.
    replica: Arc<str>,
    tracked: Mutex<HashMap<BucketKey, Tracked>>,
}

impl Regions {
    /// Connects to the peer regions (a peer that cannot be reached now is retried in the
    /// background), all at once, and starts tracking nothing. `replica` names this replica
    /// in the period locks.
    ///
    /// # Errors
    /// A peer's settings cannot work.
    pub async fn connect(
        settings: &RegionSettings,
        replica: Arc<str>,
    ) -> Result<Regions, crate::backend::BackendError> {
        let connected = futures::future::join_all(
            settings
                .peers
                .iter()
                .map(|(_, backend)| crate::backend::connect(backend)),
        )
        .await;
        let mut peers = Vec::new();
        for ((name, _), backend) in settings.peers.iter().zip(connected) {
            peers.push(Peer {
                name: name.clone(),
                backend: backend?,
                status: Mutex::new(PeerStatus::default()),
            });
        }
        let mut members: Vec<String> = settings
            .peers
            .iter()
            .map(|(name, _)| name.clone())
            .collect();
        members.push(settings.name.clone());
        members.sort();
        members.dedup();
        let place = members
            .iter()
            .position(|name| *name == settings.name)
            .unwrap_or(0) as u32;
        Ok(Regions {
            me: settings.name.clone(),
            members,
            place,
            peers,
            period: settings.period.max(Duration::from_millis(10)),
            global_domains: settings.global_domains.iter().cloned().collect(),
            replica,
            tracked: Mutex::new(HashMap::new()),
        })
    }

    /// `region`'s lease of a limit of `limit` before any transfer: an even split, the
    /// remainder to the first regions by name, so the bases add up to the limit.
    pub fn base(&self, region: &str, limit: u32) -> u32 {
        let place = self.members.iter().position(|name| name == region);
        self.base_at(place.unwrap_or(0) as u32, limit)
    }

    /// The base lease of the region at `place` in `members`.
    fn base_at(&self, place: u32, limit: u32) -> u32 {
        let count = self.members.len() as u32;
        limit / count + u32::from(place < limit % count)
    }

    /// Whether a rule of `domain` is global whatever it says (`--global-domain`).
    pub fn is_global_domain(&self, domain: &str) -> bool {
        self.global_domains.contains(domain)
    }

    /// Counts `cost` offered to a global bucket here, for its region's demand; returns this
    /// region's base lease of its limit.
    pub fn offered(&self, bucket: BucketKey, policy: &Policy, rule: &str, cost: u64) -> u32 {
        let mut tracked = self.tracked.lock();
        let count = tracked.len();
        match tracked.get_mut(&bucket) {
            Some(entry) => {
                entry.offered = entry.offered.saturating_add(cost);
                entry.idle = 0;
            }
            None if count < MAX_TRACKED => {
                tracked.insert(
                    bucket,
                    Tracked {
                        policy: *policy,
                        rule: Arc::from(rule),
                        offered: cost,
                        idle: 0,
                        view: None,
                    },
                );
            }
            None => {}
        }
        self.base_at(self.place, policy.requests_per_unit)
    }

    /// `item` held to this region's lease as last read (its base before any period ran),
    /// for a replica deciding from memory, cut off from its Redis; other items unchanged.
    pub fn held_to_last_lease(&self, item: &crate::backend::Item) -> crate::backend::Item {
        let mut item = item.clone();
        let Some(base) = item.lease else {
            return item;
        };
        let lease = self
            .tracked
            .lock()
            .get(&item.charge.bucket)
            .and_then(|entry| entry.view.as_ref().map(|view| view.lease_here))
            .unwrap_or(u64::from(base));
        let policy = &mut item.charge.policy;
        let limit = u64::from(policy.requests_per_unit);
        let held = lease.min(limit);
        policy.burst = u32::try_from(u64::from(policy.burst) * held / limit.max(1)).unwrap_or(0);
        policy.requests_per_unit = u32::try_from(held).unwrap_or(0);
        item
    }

    /// Runs a period every `period` until the task is dropped: each tracked bucket's demand
    /// goes to this region's Redis (`local`), and its lease moves.
    pub async fn run(self: Arc<Self>, local: Arc<dyn Backend>, metrics: Arc<Metrics>) {
        let mut ticks = tokio::time::interval(self.period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let due = self.take_due();
            self.exchange_wants(local.as_ref(), &due).await;
            let due = self.take_due_from_peers(due);
            metrics.region_buckets.set(due.len() as i64);
            let this = &self;
            let local = local.as_ref();
            let metrics: &Metrics = &metrics;
            futures::StreamExt::for_each_concurrent(
                futures::stream::iter(due),
                CONCURRENT_CYCLES,
                |(bucket, policy, offered)| async move {
                    let work = cycle::run(this, local, metrics, bucket, &policy, offered);
                    let view = tokio::time::timeout(this.period * 2, work).await;
                    if let Ok(Ok(view)) = view
                        && let Some(entry) = this.tracked.lock().get_mut(&bucket)
                    {
                        entry.view = Some(view);
                    }
                },
            )
            .await;
            self.count_peers(metrics);
        }
    }

    /// Publishes the buckets offered requests this period (`due`) in this region's Redis,
    /// and starts tracking those the other regions published.
    async fn exchange_wants(&self, local: &dyn Backend, due: &[(BucketKey, Policy, u64)]) {
        let horizon = self.period * IDLE_PERIODS;
        let busy: Vec<String> = due
            .iter()
            .filter(|(_, _, offered)| *offered > 0)
            .map(|(bucket, policy, _)| wants::member(*bucket, policy))
            .collect();
        if !busy.is_empty()
            && let Err(error) = wants::publish(local, busy, horizon, MAX_TRACKED).await
        {
            tracing::debug!(%error, "could not publish this region's busy buckets");
        }
        let reads = futures::future::join_all(self.peers.iter().map(|peer| {
            let read = wants::read(peer.backend.as_ref(), horizon, MAX_TRACKED);
            tokio::time::timeout(self.peer_wait(), read)
        }))
        .await;
        let mut tracked = self.tracked.lock();
        for (bucket, policy) in reads.into_iter().flatten().flatten().flatten() {
            if tracked.len() >= MAX_TRACKED && !tracked.contains_key(&bucket) {
                break;
            }
            let entry = tracked.entry(bucket).or_insert_with(|| Tracked {
                policy,
                rule: Arc::from(""),
                offered: 0,
                idle: 0,
                view: None,
            });
            entry.idle = 0;
        }
    }

    /// `due`, with the buckets only other regions are busy with added.
    fn take_due_from_peers(
        &self,
        mut due: Vec<(BucketKey, Policy, u64)>,
    ) -> Vec<(BucketKey, Policy, u64)> {
        let known: HashSet<BucketKey> = due.iter().map(|(bucket, _, _)| *bucket).collect();
        let tracked = self.tracked.lock();
        due.extend(
            tracked
                .iter()
                .filter(|(bucket, _)| !known.contains(bucket))
                .map(|(bucket, entry)| (*bucket, entry.policy, 0)),
        );
        due
    }

    /// The buckets due this period, with the cost offered since the last; forgets the idle.
    fn take_due(&self) -> Vec<(BucketKey, Policy, u64)> {
        let mut tracked = self.tracked.lock();
        tracked.retain(|_, entry| entry.idle < IDLE_PERIODS);
        tracked
            .iter_mut()
            .map(|(bucket, entry)| {
                entry.idle += 1;
                (*bucket, entry.policy, std::mem::take(&mut entry.offered))
            })
            .collect()
    }

    /// How long a read of another region may take: half a period, so that a region cut
    /// off delays the others' periods by at most that.
    fn peer_wait(&self) -> Duration {
        self.period / 2
    }

    fn peer_answered(&self, peer: &Peer, result: Result<(), String>) {
        let mut status = peer.status.lock();
        match result {
            Ok(()) => {
                status.reachable = true;
                status.answered_ms = Some(SystemClock.now_ms());
                status.error = None;
            }
            Err(error) => {
                status.reachable = false;
                status.error = Some(error);
            }
        }
    }

    fn count_peers(&self, metrics: &Metrics) {
        let reachable = self
            .peers
            .iter()
            .filter(|peer| peer.status.lock().reachable)
            .count();
        metrics.region_peers_seen(reachable, self.peers.len() - reachable);
    }

    /// The regions, their peers and the busiest global buckets, for `/overview`.
    pub fn overview(&self) -> Value {
        let peers: Vec<Value> = self
            .peers
            .iter()
            .map(|peer| {
                let status = peer.status.lock().clone();
                json!({
                    "region": peer.name,
                    "reachable": status.reachable,
                    "answered_ms": status.answered_ms,
                    "error": status.error,
                })
            })
            .collect();
        let mut buckets: Vec<(u64, Value)> = self
            .tracked
            .lock()
            .iter()
            .filter_map(|(bucket, entry)| {
                let view = entry.view.as_ref()?;
                Some((view.demand_here, view.to_json(&entry.rule, bucket)))
            })
            .collect();
        buckets.sort_by_key(|(demand, _)| std::cmp::Reverse(*demand));
        buckets.truncate(20);
        json!({
            "region": self.me,
            "regions": self.members,
            "period_ms": self.period.as_millis() as u64,
            "peers": peers,
            "buckets": buckets.into_iter().map(|(_, view)| view).collect::<Vec<_>>(),
        })
    }
}
