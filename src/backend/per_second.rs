//! Rules by unit in two backends: those whose unit is `second` in one, every other rule in
//! the main one, as the reference service's `REDIS_PERSECOND` does. Per-second buckets churn
//! fast and are short-lived; a Redis of their own keeps that load off the main one.
//!
//! A request whose charges span both backends stays all-or-nothing:
//! 1. the per-second charges go first, as a group that books but undoes nothing when
//!    rejected (`admit`); a failure there fails the request before the main backend is
//!    asked;
//! 2. the main charges go next, carrying the per-second verdicts as `Group::prior`, so the
//!    main backend reaches the request's overall verdict itself and undoes its own bookings
//!    of a rejected request inside its atomic step, exactly as for a one-backend request;
//! 3. when the request ends rejected (or fails, unless `keep_on_failure`), the per-second
//!    bookings are refunded (`Refund`, at the instant each was booked), as the cluster
//!    backend does across nodes.
//!
//! Between steps 1 and 3 another request may see a per-second booking that is about to be
//! refunded: per-second windows are one second long, and the cluster backend has the same
//! window. A refund that fails leaves its booking (logged), like a failed cluster refund.
//! The whole decision runs in a task of its own, so that a caller that stops waiting (the
//! limiter's timeout) cannot cut it between a booking and its refund.

use std::sync::Arc;

use async_trait::async_trait;

use super::{
    Backend, BackendError, Group, Item, Outcome, Refund, SideCall, Tally, log_refund_failure,
    roll_back,
};
use crate::rules::Unit;

/// The two backends and which rules each keeps.
pub struct PerSecondSplit {
    main: Arc<dyn Backend>,
    per_second: Arc<dyn Backend>,
}

impl PerSecondSplit {
    /// Rules whose unit is `second` go to `per_second`, all others to `main`.
    pub fn new(main: Arc<dyn Backend>, per_second: Arc<dyn Backend>) -> PerSecondSplit {
        PerSecondSplit { main, per_second }
    }
}

/// Whether `item` belongs to the per-second backend.
fn is_per_second(item: &Item) -> bool {
    item.charge.policy.unit == Unit::Second
}

/// Says which backend failed: both report the same kinds of errors.
fn from_per_second(error: BackendError) -> BackendError {
    use crate::redact::Scrub;
    error.map_text(|text| format!("per-second backend: {text}"))
}

#[async_trait]
impl Backend for PerSecondSplit {
    async fn decide(&self, group: &Group) -> Result<Vec<Outcome>, BackendError> {
        let (fast, rest): (Vec<&Item>, Vec<&Item>) = group.items.iter().partition(|item| {
            // Explicit closure: `partition` hands a double reference.
            is_per_second(item)
        });
        if fast.is_empty() {
            return self.main.decide(group).await;
        }
        if rest.is_empty() {
            return self.per_second.decide(group).await.map_err(from_per_second);
        }
        let (main, per_second, group) = (
            Arc::clone(&self.main),
            Arc::clone(&self.per_second),
            group.clone(),
        );
        tokio::spawn(async move { decide_split(&*main, &*per_second, &group).await })
            .await
            .unwrap_or_else(|error| {
                Err(BackendError::Unavailable(format!(
                    "per-second split task failed: {error}"
                )))
            })
    }

    /// Each refund goes to the backend that keeps its bucket's unit.
    async fn refund(&self, refunds: &[Refund]) -> Result<(), BackendError> {
        let (fast, rest): (Vec<Refund>, Vec<Refund>) = refunds
            .iter()
            .cloned()
            .partition(|refund| refund.policy.unit == Unit::Second);
        let (fast, rest) = futures::join!(self.per_second.refund(&fast), self.main.refund(&rest));
        fast.map_err(from_per_second)?;
        rest
    }

    /// Both must answer: either one down fails the rules it keeps.
    async fn ping(&self) -> Result<(), BackendError> {
        let (main, fast) = futures::join!(self.main.ping(), self.per_second.ping());
        fast.map_err(from_per_second)?;
        main
    }

    fn name(&self) -> &'static str {
        "per-second-split"
    }

    /// On the main backend, which keeps every unit but seconds.
    async fn side_call(&self, call: &SideCall) -> Result<redis::Value, BackendError> {
        self.main.side_call(call).await
    }

    /// The shorter of the two: a request may use only the less busy backend.
    fn queue_wait(&self, items: usize) -> std::time::Duration {
        self.main
            .queue_wait(items)
            .min(self.per_second.queue_wait(items))
    }

    fn evictions(&self) -> Option<u64> {
        match (self.main.evictions(), self.per_second.evictions()) {
            (None, None) => None,
            (main, fast) => Some(main.unwrap_or(0) + fast.unwrap_or(0)),
        }
    }
}

/// Steps 1 to 3 of the module docs for a group with charges on both sides.
async fn decide_split(
    main: &dyn Backend,
    per_second: &dyn Backend,
    group: &Group,
) -> Result<Vec<Outcome>, BackendError> {
    let (fast, rest): (Vec<usize>, Vec<usize>) =
        (0..group.items.len()).partition(|&i| is_per_second(&group.items[i]));
    let pick = |indices: &[usize]| -> Vec<Item> {
        indices.iter().map(|&i| group.items[i].clone()).collect()
    };
    let first = Group {
        items: pick(&fast),
        prior: Tally::default(),
        admit: true,
        keep_on_failure: group.keep_on_failure,
        deadline: group.deadline,
        connection: group.connection,
    };
    let mut fast_outcomes = per_second.decide(&first).await.map_err(from_per_second)?;
    let mut prior = group.prior;
    for (item, outcome) in first.items.iter().zip(&fast_outcomes) {
        prior.add(item.weight, outcome.allowed);
    }
    let second = Group {
        items: pick(&rest),
        prior,
        admit: group.admit,
        keep_on_failure: group.keep_on_failure,
        deadline: group.deadline,
        connection: group.connection,
    };
    let rest_outcomes = main.decide(&second).await;
    if second.must_undo(rest_outcomes.as_deref().ok()) {
        let refunds = roll_back(first.items.iter().zip(fast_outcomes.iter_mut()), false);
        if let Err(error) = per_second.refund(&refunds).await {
            log_refund_failure(&from_per_second(error));
        }
    }
    let rest_outcomes = rest_outcomes?;
    let mut outcomes = vec![None; group.items.len()];
    for (i, outcome) in fast.into_iter().zip(fast_outcomes) {
        outcomes[i] = Some(outcome);
    }
    for (i, outcome) in rest.into_iter().zip(rest_outcomes) {
        outcomes[i] = Some(outcome);
    }
    outcomes
        .into_iter()
        .map(|outcome| outcome.ok_or_else(|| BackendError::failed("a backend lost an outcome")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::memory::MemoryBackend;
    use crate::backend::{BucketKey, Charge, Weight};
    use crate::rules::Policy;

    fn item(name: &str, limit: u32, unit: Unit) -> Item {
        let policy = Policy::fixed_window(limit, unit);
        Item {
            charge: Charge {
                bucket: BucketKey::new("d", name, [], &policy),
                policy,
                cost: 1,
                spread_ms: 0,
            },
            weight: Weight::default(),
            lease: None,
        }
    }

    fn two_memories() -> (PerSecondSplit, Arc<MemoryBackend>, Arc<MemoryBackend>) {
        let main = Arc::new(MemoryBackend::new(1000));
        let fast = Arc::new(MemoryBackend::new(1000));
        let split = PerSecondSplit::new(
            Arc::clone(&main) as Arc<dyn Backend>,
            Arc::clone(&fast) as Arc<dyn Backend>,
        );
        (split, main, fast)
    }

    fn group(items: Vec<Item>) -> Group {
        Group {
            items,
            ..Group::default()
        }
    }

    #[tokio::test]
    async fn a_rejection_on_one_side_books_nothing_on_either() {
        let (split, main, _) = two_memories();
        let per_minute = item("m", 10, Unit::Minute);
        let per_second = item("s", 1, Unit::Second);
        let both = group(vec![per_minute.clone(), per_second.clone()]);
        let first = split.decide(&both).await.unwrap();
        assert!(first.iter().all(|o| o.allowed && o.booked), "{first:?}");
        // The per-second bucket is now full: the request is rejected and the per-minute
        // booking is undone where it was made.
        let second = split.decide(&both).await.unwrap();
        assert!(!second[1].allowed);
        assert!(second[0].allowed && second[0].rolled_back && !second[0].booked);
        let alone = main.decide(&group(vec![per_minute])).await.unwrap();
        assert_eq!(
            alone[0].remaining, 8,
            "only the first request's booking stands"
        );

        // The other way round: the per-minute bucket is full, the per-second booking is
        // refunded.
        let (split, _, fast) = two_memories();
        let tight = item("m", 0, Unit::Minute);
        let per_second = item("s", 5, Unit::Second);
        let outcomes = split
            .decide(&group(vec![tight, per_second.clone()]))
            .await
            .unwrap();
        assert!(!outcomes[0].allowed);
        assert!(outcomes[1].rolled_back && !outcomes[1].booked);
        let alone = fast.decide(&group(vec![per_second])).await.unwrap();
        assert_eq!(alone[0].remaining, 4, "the refunded booking is gone");
    }
}
