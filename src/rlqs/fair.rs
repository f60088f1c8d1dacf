//! The room for the fleet's shares: how one bucket's rate is divided among the streams of
//! every replica that report it. Pure: no I/O, no wire types, no clock of its own; the
//! stream hands in what its reports and the shared counters say.
//!
//! Beside each bucket, every stream records three counters over the [`DEMAND_WINDOW`]
//! (`ledger` books them in the bucket's backend, so every replica reads the same totals):
//! - **demand**: allowed + denied, at most at the limit's rate over the real time since the
//!   stream's previous report of the bucket (a report's own claims, duplicates or floods of
//!   reports move nothing past that: [`demand_cap`]);
//! - **capped demand**: the same, at most the fair share the stream last saw;
//! - **presence**: milliseconds of reporting, so the totals also count the streams.
//!
//! A stream takes its own counts out of the totals ([`others`]) and adds its own demand
//! rate from its latest report (its own counter peaks right after its report while the
//! others' are read at any point of theirs, so counters alone overstated every share). Then
//! one step of water filling ([`rate`]) gives its max-min fair rate out of the room:
//! - the fair share is `room / streams`;
//! - when all demand fits the room, every stream gets its demand scaled up to fill it;
//! - otherwise every stream gets its demand up to the fair share, and what the room has left
//!   goes to the streams above the fair share, in proportion to their demand above it.
//!
//! Given one reading, the rates of all streams add up to the room, and a stream whose
//! demand is at most the fair share gets all of it, whatever the others report (the
//! property tests below). A stream that ends withdraws its counts at once (`Stream::
//! withdraw`); one whose replica died is taken out of the totals within seconds, as soon as
//! the registry calls its replica silent (`ledger`).

use std::time::Duration;

use crate::algorithm::{Bucket, CounterState};
use crate::rules::{Algorithm, OnOverLimit, Policy, Unit};

/// Length of the demand counters' sliding window.
pub const DEMAND_WINDOW: Duration = Duration::from_secs(10);
/// Every stream counts at least one request per demand window, so a quiet one still gets
/// room for its next request.
pub const MIN_DEMAND: f64 = 1.0 / DEMAND_WINDOW.as_secs() as f64;

/// The policy of every fairness counter: a sliding window over [`DEMAND_WINDOW`] that never
/// denies and books whatever it is given.
pub fn counter_policy() -> Policy {
    Policy {
        algorithm: Algorithm::SlidingWindow,
        unit: Unit::Second,
        unit_multiplier: DEMAND_WINDOW.as_secs() as u32,
        requests_per_unit: u32::MAX,
        burst: u32::MAX,
        on_over_limit: OnOverLimit::Consume,
        lockout: None,
    }
}

/// A counter's count, from what its outcome says remains of `u32::MAX`.
pub fn counted(remaining: u64) -> u64 {
    u64::from(u32::MAX).saturating_sub(remaining)
}

/// The three counters over the demand window, one stream's or every stream's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Requests (allowed + denied), each report's at most at the limit's rate.
    pub demand: u64,
    /// The same, each report's at most at the fair share its stream saw.
    pub capped: u64,
    /// Milliseconds of reporting.
    pub presence_ms: u64,
}

/// Rates a second of the other streams of a bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Others {
    /// Their demand, requests a second.
    pub demand: f64,
    /// Their demand up to the fair share each saw, requests a second.
    pub capped: f64,
    /// How many they are.
    pub streams: f64,
}

/// What one report adds to a stream's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Booked {
    /// Demand, capped at the limit's rate.
    pub demand: u64,
    /// Demand, capped at the fair share.
    pub capped: u64,
    /// Reporting time.
    pub presence_ms: u64,
}

/// The shortest real time a stream's unclaimed allowance is kept: two of Envoy's reporting
/// intervals (a stream banks two of its own learned intervals when longer), so a report
/// after a lost one still counts whole, and idle time banks nothing more.
pub const BANKED: Duration = Duration::from_secs(10);

/// What one stream may still claim of one bucket's demand: the limit's rate over the real
/// time between its reports, banked for at most two of its intervals ([`BANKED`] or more). Duplicates of a bucket in one
/// report are merged before they claim, and a flood of reports shares the time between
/// them, so no report, true or not, takes more of the shares than a client demanding the
/// whole limit would.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Allowance {
    banked: f64,
}

impl Allowance {
    /// Claims up to `demand` requests after `covered` of real time at `rate` a second (the
    /// limit's), banking at most `bank` of it; returns what was claimed.
    pub fn claim(&mut self, demand: u64, rate: f64, covered: Duration, bank: Duration) -> u64 {
        let rate = rate.max(0.0);
        let covered = covered.min(bank);
        let most = rate * bank.as_secs_f64();
        self.banked = (self.banked + rate * covered.as_secs_f64()).min(most);
        let claimed = (demand as f64).min(self.banked.floor());
        self.banked -= claimed;
        claimed as u64
    }
}

/// The demand rate a report makes: what it `claimed` over the real time it `covered`, read
/// as at least half the stream's reporting `interval` (a report that comes sooner is merged
/// with the time before it, not multiplied), at most the limit's `rate`.
pub fn demand_rate(claimed: u64, covered: Duration, interval: Duration, rate: f64) -> f64 {
    let over = covered.max(interval / 2).max(Duration::from_millis(1));
    (claimed as f64 / over.as_secs_f64()).min(rate.max(0.0))
}

/// The limit's rate of `policy`, requests a second.
pub fn limit_rate(policy: &Policy) -> f64 {
    f64::from(policy.requests_per_unit) * 1000.0 / policy.window_ms().max(1) as f64
}

/// What a report that claimed `demand` requests at `per_second` over `covered` adds to the
/// stream's counters, given the `fair` share a second the stream last saw.
pub fn booked(demand: u64, per_second: f64, covered: Duration, fair: f64) -> Booked {
    let capped = if per_second > fair {
        (demand as f64 * fair.max(0.0) / per_second).ceil() as u64
    } else {
        demand
    };
    Booked {
        demand,
        capped: capped.min(demand),
        presence_ms: u64::try_from(covered.as_millis()).unwrap_or(u64::MAX),
    }
}

/// Weighs what a stream's reports count by where in the demand window they land, so that
/// over time the window holds each count whole on average wherever its report falls. A
/// sliding window (windows aligned to the epoch) holds a booking made a fraction `q` into
/// its window whole for `1 - q` of a window and then, fading, half a window more: `1.5 - q`
/// windows, so it is booked at `1 / (1.5 - q)`. Booked whole, a stream's counts depended on
/// where its reports fell: with Envoy's 5 s reports on 10 s windows by up to 25% either
/// way, for good, as its phase stays. Booked spread over the time they covered (as a
/// bucket's requests are), every stream read the others' counts 5.6% low and so took more
/// than its share (1.065 of the limit with 10 Envoys). What rounding leaves of each count
/// is carried to the stream's next report, so a slow share's single requests are not read
/// high.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Weigher([f64; 3]);

impl Weigher {
    /// What to book of `counted`, reported at `now_ms` (since the epoch).
    pub fn weigh(&mut self, counted: Booked, now_ms: i64) -> Booked {
        let window = DEMAND_WINDOW.as_millis() as f64;
        let into = now_ms.rem_euclid(DEMAND_WINDOW.as_millis() as i64) as f64;
        let weight = window / (1.5 * window - into);
        let counts = [counted.demand, counted.capped, counted.presence_ms];
        let [demand, capped, presence_ms] = std::array::from_fn(|i| {
            let exact = counts[i] as f64 * weight + self.0[i];
            let whole = exact.floor().max(0.0);
            self.0[i] = exact - whole;
            whole as u64
        });
        Booked {
            demand,
            capped,
            presence_ms,
        }
    }
}

/// The other streams' rates: the shared counts (`total`) less the stream's own (`own`),
/// over the time the counters hold: the demand window, or less while the stream's own
/// presence is shorter (every stream new), so that young counters are not read as slow.
/// That presence is the one read at the stream's latest report (`at_report`, in ms) when
/// it was longer: between its reports its own count fades as its window slides, while the
/// others', at every phase, do not. Read over its faded count, a stream that looked
/// between reports saw up to 1.9x the others and pushed a share half too low.
pub fn others(total: Counts, own: Counts, at_report: u64) -> Others {
    let window = DEMAND_WINDOW.as_secs_f64();
    let held = (own.presence_ms.max(at_report) as f64 / 1000.0).clamp(1.0, window);
    let rate = |total: u64, own: u64| total.saturating_sub(own) as f64 / held;
    Others {
        demand: rate(total.demand, own.demand),
        capped: rate(total.capped, own.capped),
        streams: rate(total.presence_ms, own.presence_ms) / 1000.0,
    }
}

/// The fair share a second of each of a bucket's streams: `room` over them all.
pub fn fair_share(room: f64, others: &Others) -> f64 {
    room / (others.streams.max(0.0) + 1.0)
}

/// A stream's max-min fair rate out of `room` (requests a second all streams' rates add up
/// to), for its own demand of `own` a second beside `others`.
pub fn rate(own: f64, others: &Others, room: f64) -> f64 {
    let room = room.max(0.0);
    let own = own.max(MIN_DEMAND);
    let demand = own + others.demand.max(0.0);
    if demand <= room {
        return own * room / demand;
    }
    let fair = fair_share(room, others);
    let own_capped = own.min(fair);
    let capped = own_capped + others.capped.clamp(0.0, others.demand.max(0.0));
    let above = demand - capped;
    if above <= 0.0 {
        return own_capped.min(room);
    }
    let left = (room - capped).max(0.0);
    (own_capped + left * (own - own_capped) / above).min(room)
}

/// One stream's own counters for one bucket, counted as the shared ones are.
#[derive(Debug, Clone)]
pub struct OwnCounts {
    counters: [Bucket; 3],
    /// Its presence as read when its latest report was booked ([`others`]).
    at_report: u64,
}

impl Default for OwnCounts {
    fn default() -> Self {
        OwnCounts {
            counters: std::array::from_fn(|_| Bucket::new(Algorithm::SlidingWindow)),
            at_report: 0,
        }
    }
}

impl OwnCounts {
    /// Adds `booked` at `now` (ms since the epoch) and returns the counts over the window.
    pub fn add(&mut self, booked: Booked, now: i64) -> Counts {
        let policy = counter_policy();
        let added = [booked.demand, booked.capped, booked.presence_ms];
        let [demand, capped, presence_ms] = std::array::from_fn(|i| {
            let counter = &mut self.counters[i];
            if added[i] > 0 {
                counter.decide(&policy, now, added[i]);
            }
            counted(counter.decide(&policy, now, 0).remaining)
        });
        if booked.presence_ms > 0 {
            self.at_report = presence_ms;
        }
        Counts {
            demand,
            capped,
            presence_ms,
        }
    }

    /// Its presence as read when its latest report was booked: what [`others`] reads the
    /// totals over between reports.
    pub fn at_report(&self) -> u64 {
        self.at_report
    }

    /// What the stream still has in the shared counters, as refunds: per counter (demand,
    /// capped, presence), each `(cost, booked_at_ms)` of the two windows that may still
    /// count, so that a stream that ends takes its counts out of the totals at once. A
    /// backend refunds only what its current or previous window holds.
    pub fn withdrawals(&self) -> [Vec<(u64, i64)>; 3] {
        let window_ms = DEMAND_WINDOW.as_millis() as i64;
        std::array::from_fn(|i| match &self.counters[i].counter {
            CounterState::SlidingWindow(counter) => [
                (counter.current, counter.window * window_ms),
                (counter.previous, (counter.window - 1) * window_ms),
            ]
            .into_iter()
            .filter(|&(count, _)| count > 0)
            .collect(),
            _ => Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every stream's rate, each given the others' exact counts (one reading).
    fn rates(demands: &[f64], room: f64) -> Vec<f64> {
        let demands: Vec<f64> = demands.iter().map(|d| d.max(MIN_DEMAND)).collect();
        let fair = room / demands.len() as f64;
        (0..demands.len())
            .map(|i| {
                let others = demands.iter().enumerate().filter(|&(j, _)| j != i);
                let others = others.fold(Others::default(), |sum, (_, &d)| Others {
                    demand: sum.demand + d,
                    capped: sum.capped + d.min(fair),
                    streams: sum.streams + 1.0,
                });
                rate(demands[i], &others, room)
            })
            .collect()
    }

    /// The mean over 200 s, read every 10 ms, of what the demand window holds of a stream
    /// reporting 5,000 ms of presence every 5 s from `phase_ms` on, each booked by `book`.
    fn held_on_average(phase_ms: i64, mut book: impl FnMut(u64, i64) -> u64) -> f64 {
        let policy = counter_policy();
        let mut counter = Bucket::new(Algorithm::SlidingWindow);
        let (start, end) = (1_000_000_000 + phase_ms, 1_000_200_000);
        let (mut sum, mut reads) = (0.0, 0.0);
        for now in (start..end).step_by(10) {
            if (now - start) % 5_000 == 0 {
                counter.decide(&policy, now, book(5_000, now));
            }
            // Past the first two windows, which fill from empty.
            if now - start >= 20_000 {
                sum += counted(counter.decide(&policy, now, 0).remaining) as f64;
                reads += 1.0;
            }
        }
        sum / reads
    }

    #[test]
    fn a_streams_counts_do_not_depend_on_where_its_reports_land() {
        let whole = |count, _| count;
        let (mut whole_seen, mut weighted_seen) = (Vec::new(), Vec::new());
        for phase_ms in (0..5_000).step_by(250) {
            whole_seen.push(held_on_average(phase_ms, whole) / 10_000.0);
            let mut weigher = Weigher::default();
            let weighted = |count, now| {
                let presence = Booked {
                    presence_ms: count,
                    ..Booked::default()
                };
                weigher.weigh(presence, now).presence_ms
            };
            weighted_seen.push(held_on_average(phase_ms, weighted) / 10_000.0);
        }
        let spread = |seen: &[f64]| {
            let (low, high) = seen.iter().fold((f64::MAX, 0.0_f64), |(low, high), &x| {
                (low.min(x), high.max(x))
            });
            (low, high)
        };
        // Booked whole: up to 25% either way, by phase.
        let (low, high) = spread(&whole_seen);
        assert!(low < 0.8 && high > 1.2, "{whole_seen:?}");
        // Weighted: 10 s of presence on average, whatever the phase.
        let (low, high) = spread(&weighted_seen);
        assert!(low > 0.98 && high < 1.02, "{weighted_seen:?}");
    }

    #[test]
    fn single_requests_weigh_one_each_on_average() {
        // A request every 7.3 s: its weights round to 1 or 2 one by one, and to the
        // reports' mean weight in all.
        let mut weigher = Weigher::default();
        let one = Booked {
            demand: 1,
            ..Booked::default()
        };
        let reports = 10_000_i64;
        let booked: u64 = (0..reports)
            .map(|k| weigher.weigh(one, 1_000_000 + k * 7_300).demand)
            .sum();
        // The mean of 1 / (1.5 - q) over q in [0, 1) is ln 3, 1.0986.
        let mean = booked as f64 / reports as f64;
        assert!((mean - 3.0_f64.ln()).abs() < 0.01, "{mean}");
    }

    #[test]
    fn a_silent_replica_is_named_until_its_counts_are_gone() {
        let named = crate::limiter::replicas::SILENT_NAMED_FOR;
        assert!(named >= 2 * DEMAND_WINDOW, "{named:?}");
    }

    #[test]
    fn an_honest_stream_below_its_fair_share_gets_its_demand() {
        // Issue 46: 30/s of a 100/s bucket beside a stream claiming everything.
        let [honest, hostile] = rates(&[30.0, 1e12], 100.0)[..] else {
            unreachable!()
        };
        assert!((honest - 30.0).abs() < 1e-9, "{honest}");
        assert!((honest + hostile - 100.0).abs() < 1e-9, "{hostile}");
        // Under the room, every stream gets at least its demand.
        let under = rates(&[10.0, 20.0, 30.0], 90.0);
        assert!((under[0] - 15.0).abs() < 1e-9 && (under[2] - 45.0).abs() < 1e-9);
    }

    fn counts(demand: u64, capped: u64, presence_ms: u64) -> Counts {
        Counts {
            demand,
            capped,
            presence_ms,
        }
    }

    #[test]
    fn counters_of_young_streams_are_read_over_what_they_hold() {
        let (total, own) = (counts(210, 150, 20_000), counts(60, 50, 10_000));
        let others = others(total, own, 0);
        assert_eq!(
            (others.demand, others.capped, others.streams),
            (15.0, 10.0, 1.0)
        );
        // A stream 4 s old reads the others over 4 s.
        let young = Counts {
            presence_ms: 4_000,
            ..own
        };
        assert!((super::others(total, young, 4_000).demand - 150.0 / 4.0).abs() < 1e-9);
    }

    #[test]
    fn own_counts_keep_the_presence_read_at_the_latest_report() {
        let mut own = OwnCounts::default();
        let report = Booked {
            demand: 3,
            capped: 1,
            presence_ms: 5_000,
        };
        // Booked 2 s into a window, read 1 s into the next: the booking fades.
        let at = 1_000_000_002_000;
        assert_eq!(own.add(report, at).presence_ms, 5_000);
        let later = own.add(Booked::default(), at + 9_000);
        assert!(later.presence_ms < 5_000, "{later:?}");
        assert_eq!(own.at_report(), 5_000);
        // Counters started anew (a rule reload) hold no report yet.
        assert_eq!(OwnCounts::default().at_report(), 0);
    }

    #[test]
    fn a_stream_between_its_reports_counts_the_others_as_at_its_report() {
        // 99 others holding a window of presence each; the stream read 12 s of its own at
        // its report, and 6 s as its window slid on before its next.
        let own = counts(4, 1, 6_000);
        let total = counts(4 + 99 * 6, 1 + 99, 6_000 + 99 * 10_000);
        let others = others(total, own, 12_000);
        assert!((others.streams - 99.0).abs() < 1e-9, "{}", others.streams);
        assert!((others.demand - 99.0 * 0.6).abs() < 1e-9);
        // Read over its faded count, the others would number 165.
        let faded = super::others(total, own, 0);
        assert!(faded.streams > 160.0, "{}", faded.streams);
    }

    #[test]
    fn a_report_books_its_demand_its_capped_demand_and_its_time() {
        let second = Duration::from_secs(1);
        assert_eq!(
            booked(50, 10.0, second * 5, 4.0),
            Booked {
                demand: 50,
                capped: 20,
                presence_ms: 5_000
            }
        );
        assert_eq!(booked(50, 10.0, second * 5, 40.0).capped, 50);
        // A first report claims what its time covered at the limit's rate; a flood of
        // reports 20 ms apart claims 2 each at 100 a second, and the rate stays 100.
        let mut allowance = Allowance::default();
        assert_eq!(allowance.claim(10_000, 100.0, second * 5, BANKED), 500);
        let flood = Duration::from_millis(20);
        assert_eq!(allowance.claim(10_000, 100.0, flood, BANKED), 2);
        // Idle time banks at most two intervals.
        let mut idle = Allowance::default();
        assert_eq!(idle.claim(0, 100.0, second * 60, BANKED), 0);
        assert_eq!(idle.claim(u64::MAX, 100.0, Duration::ZERO, BANKED), 1_000);
        // A client reporting every 60 s banks two of its intervals: its 30/s counts whole.
        let mut slow = Allowance::default();
        assert_eq!(slow.claim(1_800, 100.0, second * 60, second * 120), 1_800);
        // A report 20 ms after the last is read over half an interval; never past the rate.
        let interval = second * 5;
        assert_eq!(demand_rate(500, second * 5, interval, 100.0), 100.0);
        assert_eq!(
            demand_rate(100, Duration::from_millis(20), interval, 100.0),
            40.0
        );
        assert_eq!(
            demand_rate(1_000, Duration::from_millis(20), interval, 100.0),
            100.0
        );
    }

    proptest! {
        /// For any demands of any number of streams, the rates add up to at most the room,
        /// and a stream whose demand is at most the fair share gets all of it.
        #[test]
        fn shares_add_up_to_the_room_and_honest_streams_get_their_demand(
            demands in proptest::collection::vec(
                prop_oneof![0.0..1.0f64, 0.0..200.0f64, 1e3..1e15f64],
                1..40,
            ),
            room in 1.0..10_000.0f64,
        ) {
            let rates = rates(&demands, room);
            let sum: f64 = rates.iter().sum();
            prop_assert!(sum <= room * (1.0 + 1e-9), "{sum} > {room}");
            let fair = room / demands.len() as f64;
            for (demand, rate) in demands.iter().zip(&rates) {
                let demand = demand.max(MIN_DEMAND);
                if demand <= fair {
                    prop_assert!(*rate >= demand * (1.0 - 1e-9), "{rate} < {demand}");
                }
                prop_assert!(*rate >= 0.0 && *rate <= room * (1.0 + 1e-9));
            }
        }

        /// Whatever a stream's own counts and its presence at its report say, it reads the
        /// others at least as many and as demanding as a stream present for the whole
        /// window would: no pattern of its own reports shrinks the others.
        #[test]
        fn no_stream_reads_the_others_below_what_the_window_holds(
            total in (0u64..1 << 40, 0u64..1 << 40, 0u64..1 << 40),
            own in (0u64..1 << 40, 0u64..1 << 40, 0u64..1 << 40),
            at_report in prop_oneof![0u64..20_000, 0u64..u64::MAX],
        ) {
            let total = Counts { demand: total.0, capped: total.1, presence_ms: total.2 };
            let own = Counts { demand: own.0, capped: own.1, presence_ms: own.2 };
            let read = others(total, own, at_report);
            let whole = DEMAND_WINDOW.as_secs_f64();
            // Up to the rounding of the division.
            let least = |total: u64, own: u64| {
                total.saturating_sub(own) as f64 / whole * (1.0 - 1e-12)
            };
            prop_assert!(read.demand >= least(total.demand, own.demand));
            prop_assert!(read.capped >= least(total.capped, own.capped));
            prop_assert!(read.streams * 1000.0 >= least(total.presence_ms, own.presence_ms));
        }

        /// Duplicates, floods of reports and huge counts claim nothing past the limit's
        /// rate over real time (plus what two intervals bank), whatever each report says.
        #[test]
        fn no_stream_claims_more_than_the_limits_rate_over_real_time(
            reports in proptest::collection::vec((0u64..u64::MAX, 0u64..20_000), 1..200),
            rate in 0.001..100_000.0f64,
        ) {
            let mut allowance = Allowance::default();
            let (mut claimed, mut real) = (0u64, Duration::ZERO);
            for (claim, gap_ms) in reports {
                let covered = Duration::from_millis(gap_ms);
                let taken = allowance.claim(claim, rate, covered, BANKED);
                let interval = Duration::from_secs(5);
                prop_assert!(demand_rate(taken, covered, interval, rate) <= rate);
                claimed = claimed.saturating_add(taken);
                real += covered;
            }
            prop_assert!(claimed as f64 <= rate * real.as_secs_f64() + 1e-6 * rate);
        }
    }
}
