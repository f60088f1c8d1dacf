//! A share `part / whole` of every limit: what a replica cut off from Redis may admit from
//! its own memory (`1 / known`), and what the replicas still on Redis may admit together
//! while others are silent (`live / known`). Pure arithmetic; the shares of all replicas add
//! up to at most each limit (the property tests below).

use crate::backend::Item;
use crate::rules::{Algorithm, Policy};

/// `part / whole` of each limit, `0 < part <= whole`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    part: u32,
    whole: u32,
}

impl Share {
    /// `part / whole`, or `None` when that is not a share (`part` 0, or above `whole`).
    pub fn new(part: u32, whole: u32) -> Option<Share> {
        (part >= 1 && part <= whole).then_some(Share { part, whole })
    }

    /// Whether the share is the whole limit.
    pub fn is_whole(self) -> bool {
        self.part == self.whole
    }

    /// `item` charged against this share of its limit, or `None` when the share rounds to
    /// nothing (the charge is then denied). Counting algorithms (windows, log) count in
    /// requests, so their limit is scaled down (rounded down); a token bucket keeps its
    /// level in units of its own rate, so a changed limit would misread what it holds:
    /// its cost is scaled up instead (rounded up).
    pub fn apply(self, item: &Item) -> Option<Item> {
        let policy = &item.charge.policy;
        if policy.requests_per_unit == 0 || policy.burst == 0 {
            return None;
        }
        let mut item = item.clone();
        let charge = &mut item.charge;
        if charge.policy.algorithm == Algorithm::TokenBucket {
            charge.cost = self.scale_cost(charge.cost);
        } else {
            charge.policy = self.scale_limit(&charge.policy)?;
        }
        Some(item)
    }

    /// `floor(L * part / whole)`, `None` when 0.
    fn scale_limit(self, policy: &Policy) -> Option<Policy> {
        let scaled =
            u64::from(policy.requests_per_unit) * u64::from(self.part) / u64::from(self.whole);
        let requests_per_unit = u32::try_from(scaled).ok().filter(|&limit| limit > 0)?;
        Some(Policy {
            requests_per_unit,
            burst: requests_per_unit,
            ..*policy
        })
    }

    /// `ceil(n * whole / part)`, at most `u64::MAX`.
    fn scale_cost(self, cost: u64) -> u64 {
        let scaled = u128::from(cost) * u128::from(self.whole);
        u64::try_from(scaled.div_ceil(u128::from(self.part))).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::rules::Unit;

    proptest! {
        /// Every replica's share of a limit adds up to at most the limit: the silent ones'
        /// `1 / known` each and the live ones' `live / known` together.
        #[test]
        fn shares_never_add_up_past_the_limit(
            limit in 1u32..1_000_000,
            known in 1u32..64,
            silent in 0u32..64,
        ) {
            let silent = silent.min(known - 1);
            let live = known - silent;
            let policy = Policy::fixed_window(limit, Unit::Minute);
            let of = |share: Share| share.scale_limit(&policy).map_or(0, |p| p.requests_per_unit);
            let on_redis = of(Share::new(live, known).unwrap());
            let alone = of(Share::new(1, known).unwrap());
            prop_assert!(u64::from(on_redis) + u64::from(silent) * u64::from(alone)
                <= u64::from(limit));
        }

        /// A token bucket's scaled cost admits at most the share of its rate: `k` requests
        /// of cost `n` fit in `L` only when `k * n * whole / part <= L`.
        #[test]
        fn a_scaled_cost_admits_at_most_the_share(
            cost in 0u64..1_000_000,
            part in 1u32..64,
            extra in 0u32..64,
        ) {
            let share = Share::new(part, part + extra).unwrap();
            let scaled = share.scale_cost(cost);
            prop_assert!(u128::from(scaled) * u128::from(part)
                >= u128::from(cost) * u128::from(part + extra));
        }
    }

    #[test]
    fn the_whole_share_changes_nothing_and_a_share_of_nothing_denies() {
        let policy = Policy::fixed_window(10, Unit::Minute);
        let whole = Share::new(3, 3).unwrap();
        assert!(whole.is_whole());
        assert_eq!(whole.scale_limit(&policy), Some(policy));
        assert_eq!(whole.scale_cost(7), 7);
        assert_eq!(Share::new(1, 11).unwrap().scale_limit(&policy), None);
        assert_eq!(Share::new(0, 3), None);
        assert_eq!(Share::new(4, 3), None);
    }
}
