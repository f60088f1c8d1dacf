//! Storage backends: where bucket state lives and how one decision is made atomically.
//!
//! Every backend applies the same pure algorithms (`crate::algorithm`): the memory backend
//! calls them directly, the Redis backends run Lua scripts that follow them line for line.
//! A backend never sees protocol types; the limiter hands it resolved charges.

mod connect;
pub mod deferred;
pub mod keys;
pub mod memory;
pub mod per_second;
pub mod redis;
pub(crate) mod side_call;

use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

pub use connect::{BackendSettings, connect};
pub use keys::BucketKey;
pub use redis::{ClusterBackend, RedisBackend, RedisOptions, SentinelSettings};
pub use side_call::{SideCall, SideScript};

use crate::overload::{ConnectionId, Deadline};
use crate::redact::Scrub;
use crate::rules::Policy;

/// Default bound on a request's backend work, the `--backend-timeout` default (Envoy's
/// own default timeout for the whole call is 20 ms higher up, so this only bounds stragglers).
pub const DEFAULT_BACKEND_TIMEOUT: Duration = Duration::from_millis(100);

/// One bucket to charge: `cost` units under `policy`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    /// The bucket.
    pub bucket: BucketKey,
    /// How the bucket counts.
    pub policy: Policy,
    /// `n`: the cost; 0 is a peek that changes nothing.
    pub cost: u64,
    /// The ms before now over which the cost was spent (a quota report's `time_elapsed`),
    /// 0 for requests decided now. A token bucket books such a cost from its start
    /// (docs/algorithms.md#token-bucket); the other algorithms ignore it.
    pub spread_ms: u64,
}

/// What one charge decided, in the backend's own clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Whether the request fits (for a peek: whether a cost-1 request would fit).
    pub allowed: bool,
    /// Requests left after this charge (0 when denied).
    pub remaining: u64,
    /// `R`: milliseconds until the reset the algorithm defines.
    pub reset_ms: u64,
    /// The backend's clock when it decided; a refund names it to undo exactly this booking.
    pub now_ms: i64,
    /// Whether this charge changed the bucket and the change stands (a refund only makes
    /// sense when it did).
    pub booked: bool,
    /// Whether the charge fitted and was booked, but its request was rejected overall, so
    /// the booking was undone (atomically where the backend allows it, else by a refund).
    pub rolled_back: bool,
}

/// Undo of one earlier booking of `cost` made at `booked_at_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refund {
    /// The bucket.
    pub bucket: BucketKey,
    /// How the bucket counts.
    pub policy: Policy,
    /// The cost that was booked.
    pub cost: u64,
    /// `Outcome::now_ms` of the booking.
    pub booked_at_ms: i64,
    /// Names this refund, so that a bucket applies it at most once: a refund delivered
    /// again (a client re-sending it after its reply was lost) changes nothing. Each bucket
    /// remembers the ids of its last few refunds (`RECENT_REFUNDS` in `lua/lib.lua`,
    /// the memory backend alike). `0` names an undo made inside the same atomic step as its
    /// booking ([`Refund::in_place`]): it can never be delivered twice, so it is not recorded.
    pub id: u64,
}

impl Refund {
    /// The refund of one booking, with a fresh id.
    pub fn new(bucket: BucketKey, policy: Policy, cost: u64, booked_at_ms: i64) -> Refund {
        Refund {
            bucket,
            policy,
            cost,
            booked_at_ms,
            id: fresh_refund_id(),
        }
    }

    /// The refund of `item`'s booking that `outcome` reports; `in_place` as in [`roll_back`].
    pub fn of(item: &Item, outcome: &Outcome, in_place: bool) -> Refund {
        let charge = &item.charge;
        if in_place {
            Refund::in_place(charge.bucket, charge.policy, charge.cost, outcome.now_ms)
        } else {
            Refund::new(charge.bucket, charge.policy, charge.cost, outcome.now_ms)
        }
    }

    /// The undo of a booking made in the same atomic step (a rejected request's group on an
    /// atomic backend): never re-sent, so it carries no id.
    pub fn in_place(bucket: BucketKey, policy: Policy, cost: u64, booked_at_ms: i64) -> Refund {
        Refund {
            bucket,
            policy,
            cost,
            booked_at_ms,
            id: 0,
        }
    }
}

/// A random 64-bit id: two refunds meet in a bucket's short memory with odds of about
/// 2^-64 per pair (a collision only makes a refund be skipped: the safe side).
fn fresh_refund_id() -> u64 {
    // 0 is reserved for undos that carry no id.
    rand::random::<u64>().max(1)
}

/// Why a backend could not decide.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BackendError {
    /// The backend did not answer within its time budget. Transient.
    #[error("backend timed out")]
    Timeout,
    /// No connection could be made or kept (refused, reset, pool exhausted). Transient.
    #[error("backend unreachable: {0}")]
    Unavailable(String),
    /// The backend answered with an error (e.g. CLUSTERDOWN, a script error) or with a reply
    /// of the wrong shape.
    #[error("backend error: {detail}")]
    Failed {
        /// What went wrong, free of addresses and credentials.
        detail: String,
        /// Whether waiting can help (a failover, a loading replica), decided where the error
        /// was classified (`redis::errors::classify`) so nobody reads it back from `detail`.
        transient: bool,
    },
    /// The settings cannot work (an invalid URL or option): retrying will not help.
    #[error("invalid backend configuration: {0}")]
    Config(String),
    /// The backend's queue is too long to decide the group before its deadline, so it was
    /// refused at once, with nothing booked (overload shedding). Not a backend failure.
    #[error("backend queue too long to answer before the deadline")]
    Overloaded,
}

impl BackendError {
    /// A failure that waiting will not cure: a malformed reply, a refused login, a script
    /// error.
    pub fn failed(detail: impl Into<String>) -> BackendError {
        BackendError::Failed {
            detail: detail.into(),
            transient: false,
        }
    }

    /// Whether the same call may succeed later with the same settings: timeouts, lost
    /// connections and server errors classified as transient.
    pub fn is_transient(&self) -> bool {
        match self {
            BackendError::Timeout | BackendError::Unavailable(_) | BackendError::Overloaded => true,
            BackendError::Failed { transient, .. } => *transient,
            BackendError::Config(_) => false,
        }
    }

    /// Every [`BackendError::kind`], so views can show each at 0.
    pub const KINDS: [&'static str; 5] =
        ["timeout", "unavailable", "failed", "config", "overloaded"];

    /// Short, stable label for the `backend_errors` metric (one of [`BackendError::KINDS`]).
    pub fn kind(&self) -> &'static str {
        match self {
            BackendError::Timeout => "timeout",
            BackendError::Unavailable(_) => "unavailable",
            BackendError::Failed { .. } => "failed",
            BackendError::Config(_) => "config",
            BackendError::Overloaded => "overloaded",
        }
    }
}

/// Error texts may quote a client library's message, which can name a URL with its password.
impl Scrub for BackendError {
    fn map_text(self, f: impl Fn(String) -> String) -> BackendError {
        match self {
            BackendError::Unavailable(text) => BackendError::Unavailable(f(text)),
            BackendError::Failed { detail, transient } => BackendError::Failed {
                detail: f(detail),
                transient,
            },
            BackendError::Config(text) => BackendError::Config(f(text)),
            BackendError::Timeout => BackendError::Timeout,
            BackendError::Overloaded => BackendError::Overloaded,
        }
    }
}

/// How one charge's verdict weighs in its request's overall code (docs/requests.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Weight {
    /// A `quota_mode` rule: the request is rejected only when every quota rule denies.
    pub quota: bool,
    /// A `shadow_mode` rule: its denial is reported as OK and never rejects the request.
    pub shadow: bool,
}

/// The running verdict of one request: whether what is decided so far rejects it. The one
/// definition of the overall code, shared by the limiter and the backends (and mirrored in
/// `lua/batch.lua`), so a backend undoes exactly the bookings of requests the limiter rejects.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// A non-quota rule denied.
    pub over: bool,
    /// Quota rules seen.
    pub quota_total: u32,
    /// Quota rules that denied.
    pub quota_over: u32,
}

impl Tally {
    /// Counts one verdict.
    pub fn add(&mut self, weight: Weight, allowed: bool) {
        let denied = !allowed && !weight.shadow;
        if weight.quota {
            self.quota_total += 1;
            self.quota_over += u32::from(denied);
        } else {
            self.over |= denied;
        }
    }

    /// Whether the request is over limit: a non-quota rule denied, or every quota rule did.
    pub fn rejects(&self) -> bool {
        self.over || (self.quota_total > 0 && self.quota_over == self.quota_total)
    }
}

/// One charge of a request and how its verdict weighs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// The bucket, policy and cost.
    pub charge: Charge,
    /// How its verdict counts toward the overall code.
    pub weight: Weight,
    /// A global rule's (`scope: global`): this region's part of the limit before any
    /// transfer. Redis then decides with the lease its region holds now, and the memory
    /// backend, which has no regions, with the whole limit (`limiter::regions`).
    pub lease: Option<u32>,
}

/// The charges of one request, decided all-or-nothing: when the request ends over limit,
/// none of its `reject`-mode bookings stand.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Group {
    /// The charges, in request order.
    pub items: Vec<Item>,
    /// Verdicts of the request decided without the backend (`L = 0`, the local cache).
    pub prior: Tally,
    /// The request is admitted whatever its verdicts (global shadow mode): nothing is undone.
    pub admit: bool,
    /// On a partial failure, keep the bookings that succeeded (failure mode `allow` admits
    /// the request); otherwise they are undone before the error is returned.
    pub keep_on_failure: bool,
    /// The caller's deadline: the backend's work ends by then, and a backend that queues may
    /// refuse at once a group it cannot decide in time (`BackendError::Overloaded`).
    pub deadline: Option<Deadline>,
    /// The connection the request came on, where known: a backend's queue serves the
    /// connections that queued in turn.
    pub connection: Option<ConnectionId>,
}

impl Group {
    /// Independent charges: each booking stands whatever the others decide.
    pub fn independent(charges: &[Charge]) -> Group {
        Group {
            items: charges
                .iter()
                .map(|charge| Item {
                    charge: charge.clone(),
                    weight: Weight::default(),
                    lease: None,
                })
                .collect(),
            admit: true,
            keep_on_failure: true,
            ..Group::default()
        }
    }

    /// When the backend work of this group ends: `timeout` from now (the backend's own
    /// bound), or when the caller's work ends if that comes first.
    pub fn work_ends_within(&self, timeout: Duration) -> Instant {
        crate::overload::work_ends_within(self.deadline, Instant::now(), timeout)
    }

    /// Whether the request's bookings must be undone once it is settled: `outcomes` (in
    /// order) reject it, or, with no outcomes, it failed and the failure mode does not keep
    /// what succeeded. The one statement of this decision for every backend.
    pub fn must_undo(&self, outcomes: Option<&[Outcome]>) -> bool {
        match outcomes {
            Some(outcomes) => self.rejects(outcomes),
            None => !self.keep_on_failure,
        }
    }

    /// Whether the request is rejected given `outcomes` of its items (in order).
    pub fn rejects(&self, outcomes: &[Outcome]) -> bool {
        if self.admit {
            return false;
        }
        let mut tally = self.prior;
        for (item, outcome) in self.items.iter().zip(outcomes) {
            tally.add(item.weight, outcome.allowed);
        }
        tally.rejects()
    }
}

/// Settles a request that ended rejected (or failed, where its bookings must not stand): marks
/// every booking of `settled` that must be undone ([`undoable`]) as rolled back, and returns
/// the refunds that undo them, for the backend to apply. `in_place`: the refunds are applied
/// inside the same atomic step as the bookings (memory), so they carry no id. The one
/// definition of this step for every backend.
pub fn roll_back<'a>(
    settled: impl IntoIterator<Item = (&'a Item, &'a mut Outcome)>,
    in_place: bool,
) -> Vec<Refund> {
    let mut refunds = Vec::new();
    for (item, outcome) in settled {
        if undoable(item, outcome) {
            refunds.push(Refund::of(item, outcome, in_place));
            outcome.booked = false;
            outcome.rolled_back = true;
        }
    }
    refunds
}

/// Logs refunds of rolled-back bookings that could not be applied: those bookings stand,
/// although their request was answered as rejected (the limiter counts them in
/// `floodgate_refund_errors`).
pub fn log_refund_failure(error: &BackendError) {
    tracing::warn!(%error, "refund failed; a rejected request's bookings stand");
}

/// Whether a booking of `item` must be undone when its request is rejected: it fitted and
/// booked under `reject` (a `consume` rule books whatever the verdict).
pub fn undoable(item: &Item, outcome: &Outcome) -> bool {
    outcome.allowed
        && outcome.booked
        && item.charge.cost > 0
        && item.charge.policy.on_over_limit == crate::rules::OnOverLimit::Reject
}

/// A place that keeps buckets and decides charges atomically per bucket.
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// Decides every item of one request in order and returns one outcome per item. When
    /// the request ends rejected (`Group::rejects`), every undoable booking is undone and
    /// marked `rolled_back`: inside one atomic step where the backend allows it (memory, one
    /// Redis node), else by refunds.
    ///
    /// # Errors
    /// Any failure fails the whole group (after undoing its bookings unless
    /// `keep_on_failure`): the limiter then applies the failure mode.
    async fn decide(&self, group: &Group) -> Result<Vec<Outcome>, BackendError>;

    /// Applies independent charges, each booking standing on its own.
    ///
    /// # Errors
    /// As for `decide`.
    async fn charge(&self, charges: &[Charge]) -> Result<Vec<Outcome>, BackendError> {
        self.decide(&Group::independent(charges)).await
    }

    /// Undoes earlier bookings; used when a request is over limit overall.
    ///
    /// # Errors
    /// As for `charge`; a failed refund leaves the booking in place.
    async fn refund(&self, refunds: &[Refund]) -> Result<(), BackendError>;

    /// Checks that the backend answers (readiness and health).
    ///
    /// # Errors
    /// The backend is unreachable or failing.
    async fn ping(&self) -> Result<(), BackendError>;

    /// Short name for logs and metrics (`memory`, `redis`, `redis-cluster`).
    fn name(&self) -> &'static str;

    /// Runs a small script outside the decision path (the replica registry, region
    /// leases) on the node that holds its keys, for the backends whose state other
    /// replicas share.
    ///
    /// # Errors
    /// As for `charge`; `Config` for a backend that keeps its state in this process.
    async fn side_call(&self, call: &SideCall) -> Result<::redis::Value, BackendError> {
        let _ = call;
        Err(BackendError::Config(format!(
            "the {} backend keeps no state that other replicas share",
            self.name()
        )))
    }

    /// Live buckets dropped so far to respect a cap on held state, for backends that have
    /// one (memory); exported as `floodgate_memory_evictions`.
    fn evictions(&self) -> Option<u64> {
        None
    }

    /// A store of its own for candidate rules' buckets, for a backend that caps what it
    /// holds (memory), so that candidates filling it never evict a live bucket. `None`:
    /// candidates share this backend (Redis keeps every key it is given).
    fn candidate_store(&self) -> Option<std::sync::Arc<dyn Backend>> {
        None
    }

    /// How long a request of `items` charges queued now would wait before it is sent,
    /// estimated from the recent drain rate; zero for a backend that does not queue or is
    /// not busy. Admission sheds on it before a call is matched (`crate::overload`).
    fn queue_wait(&self, _items: usize) -> Duration {
        Duration::ZERO
    }
}
