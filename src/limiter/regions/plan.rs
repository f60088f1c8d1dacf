//! Where a global bucket's lease should go: max-min fair targets from the regions' demands,
//! and what this region grants toward them. Pure: the cycle (`super::cycle`) reads the
//! leases and demands and applies the grants through `lua/lease.lua`, which never grants
//! more than the bucket has unused.

/// One region's holding of a bucket, in the limit's units (requests a window).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holding {
    /// Its lease, with what was granted to it and not yet received.
    pub lease: u64,
    /// Its demand: requests it was offered, a window.
    pub demand: u64,
}

/// Max-min fair targets for `demands` out of `pool`: water filling (every region gets its
/// demand up to an equal share, the rest of the pool goes to those that want more), then
/// what no region wants split evenly, so an idle region keeps room for its next requests.
/// The targets add up to `pool`.
pub fn targets(pool: u64, demands: &[u64]) -> Vec<u64> {
    let n = demands.len() as u64;
    if n == 0 {
        return Vec::new();
    }
    let mut target = vec![0u64; demands.len()];
    let mut left = pool;
    let mut open: Vec<usize> = (0..demands.len()).collect();
    // Each round settles the regions whose demand fits an equal share of what is left.
    while !open.is_empty() && left > 0 {
        let share = left / open.len() as u64;
        let (settled, still): (Vec<usize>, Vec<usize>) =
            open.iter().partition(|&&i| demands[i] - target[i] <= share);
        if settled.is_empty() {
            for &i in &still {
                target[i] += share;
            }
            left -= share * still.len() as u64;
            break;
        }
        for &i in &settled {
            left -= demands[i] - target[i];
            target[i] = demands[i];
        }
        open = still;
    }
    // What nobody wants (or the remainder of an equal split), evenly, the first ones first.
    for (k, slot) in target.iter_mut().enumerate() {
        *slot += left / n + u64::from((k as u64) < left % n);
    }
    target
}

/// What region 0 of `holdings` grants each region (0 for itself): from its lease above its
/// target, to the regions below theirs, the furthest below first, each at most what it
/// lacks; nothing smaller than `least`, so a lease does not shuttle back and forth.
pub fn grants(holdings: &[Holding], least: u64) -> Vec<u64> {
    let pool = holdings.iter().map(|holding| holding.lease).sum();
    let demands: Vec<u64> = holdings.iter().map(|holding| holding.demand).collect();
    let target = targets(pool, &demands);
    let mut grants = vec![0; holdings.len()];
    let Some(mut spare) = holdings
        .first()
        .map(|me| me.lease.saturating_sub(target[0]))
    else {
        return grants;
    };
    let mut needy: Vec<usize> = (1..holdings.len())
        .filter(|&i| holdings[i].lease < target[i])
        .collect();
    needy.sort_by_key(|&i| std::cmp::Reverse(target[i] - holdings[i].lease));
    for i in needy {
        let amount = spare.min(target[i] - holdings[i].lease);
        if amount >= least.max(1) {
            grants[i] = amount;
            spare -= amount;
        }
    }
    grants
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// The targets add up to the pool, and a region whose demand is at most an equal
        /// share gets all of it.
        #[test]
        fn targets_fill_the_pool_and_serve_the_small_first(
            pool in 0u64..1_000_000,
            demands in prop::collection::vec(0u64..1_000_000, 1..8),
        ) {
            let target = targets(pool, &demands);
            prop_assert_eq!(target.iter().sum::<u64>(), pool);
            let share = pool / demands.len() as u64;
            for (demand, target) in demands.iter().zip(&target) {
                prop_assert!(*target >= (*demand).min(share));
            }
        }

        /// A region grants only from its own lease above its target, and no region is sent
        /// more than it lacks: the leases still add up to the pool, none goes negative.
        #[test]
        fn grants_come_from_spare_lease_and_fill_no_more_than_a_need(
            leases in prop::collection::vec(0u64..100_000, 1..6),
            demands in prop::collection::vec(0u64..200_000, 6),
            least in 0u64..100,
        ) {
            let holdings: Vec<Holding> = leases
                .iter()
                .zip(&demands)
                .map(|(&lease, &demand)| Holding { lease, demand })
                .collect();
            let pool: u64 = leases.iter().sum();
            let target = targets(pool, &demands[..leases.len()]);
            let grants = grants(&holdings, least);
            prop_assert_eq!(grants[0], 0);
            prop_assert!(grants.iter().sum::<u64>() <= leases[0].saturating_sub(target[0]));
            for i in 1..leases.len() {
                prop_assert!(leases[i] + grants[i] <= target[i].max(leases[i]));
            }
        }
    }

    #[test]
    fn the_busy_region_gets_what_the_idle_ones_do_not_use() {
        // 90/5/5 of twice a limit of 10,000.
        assert_eq!(
            targets(10_000, &[18_000, 1_000, 1_000]),
            [8_000, 1_000, 1_000]
        );
        // Nobody busy: an even split.
        assert_eq!(targets(10_000, &[0, 0, 0]), [3_334, 3_333, 3_333]);
        // Load moved from region 0 to region 1: region 0 gives region 1 what it lacks.
        let holdings = [
            Holding {
                lease: 8_000,
                demand: 1_000,
            },
            Holding {
                lease: 1_000,
                demand: 18_000,
            },
            Holding {
                lease: 1_000,
                demand: 1_000,
            },
        ];
        assert_eq!(grants(&holdings, 100), [0, 7_000, 0]);
    }
}
