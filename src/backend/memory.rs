//! In-process backend: bucket state in sharded maps, decided by `crate::algorithm` directly.
//!
//! For a single replica, tests and benchmarks. Numbers are identical to Redis because the
//! same `Bucket::decide` runs here that the Lua scripts mirror; time is a [`Clock`](crate::clock::Clock) in ms
//! since the Unix epoch, so windows align as they do under Redis `TIME`. (Not
//! `tokio::time::Instant`: it has no epoch to align windows to. Tests use [`ManualClock`](crate::clock::ManualClock)
//! instead of paused Tokio time.)
//!
//! Layout: 64 shards, each a `parking_lot::Mutex` (held for one decision, never across an
//! await) over a dense `Vec` of slots plus a `HashMap` from key to slot index. Keys are
//! already uniform SHA-256 prefixes, so the shard comes from bytes 8..16 and the map hashes
//! bytes 0..16 without a real hasher. The dense vector keeps the index table small and lets
//! the sweep and the eviction pick slots by position.
//!
//! Bounds, so a flood of distinct values cannot exhaust memory:
//! - Expiry: every slot stores its `Bucket::expires_at_ms`. An expired bucket found on access
//!   restarts empty in place; a decision that leaves a new bucket empty stores nothing.
//! - Sweep: each insert examines the next 4 slots at a per-shard cursor and drops expired
//!   ones; the cursor outruns the inserts, so it passes every slot within about `len / 3`
//!   inserts into the shard and expired state cannot pile up while the shard grows.
//! - Cap: each shard holds at most its share of the cap (`cap / 64`, spread exactly; caps
//!   below 64 count as 64), counted by `Bucket::size`: one per bucket, except that a sliding
//!   log counts one per logged instant, since its state grows with them. A full shard first sweeps 32 more slots; if none was expired, it
//!   drops the slot closest to expiry among 16 sampled at random. Dropping a still-live bucket
//!   is counted in [`MemoryBackend::evictions`]: its requests start over from an empty bucket.
//!
//! Refunds are applied at most once: a shard remembers the ids of the last
//! [`RECENT_REFUNDS`] refunds of each bucket that got one, and ignores a repeated id.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::{Mutex, MutexGuard};

use super::{Backend, BackendError, BucketKey, Charge, Group, Outcome, Refund, roll_back};
use crate::algorithm::Bucket;
use crate::clock::{Clock, SystemClock};

/// Default cap on live buckets: about 115 MB of resident state when full.
pub const DEFAULT_CAPACITY: usize = 1_000_000;

const SHARDS: usize = 64;
/// Slots the sweep examines on every insert.
const SWEEP_STEP: usize = 4;
/// Candidate rules' buckets are held apart, in a map of this part of the cap.
const CANDIDATE_SHARE: usize = 4;
/// Slots the sweep examines when a shard is full, before evicting a live bucket.
const FULL_SWEEP_STEP: usize = 32;
/// Slots sampled to choose an eviction victim.
const EVICTION_SAMPLE: usize = 16;
/// Refund ids a bucket remembers, as the Lua scripts do (`lua/lib.lua`).
pub const RECENT_REFUNDS: usize = 32;

/// Buckets kept in process memory.
pub struct MemoryBackend {
    shards: Box<[Padded]>,
    clock: Arc<dyn Clock>,
    capacity: usize,
}

/// One shard on its own cache lines, so cores working on neighbouring shards do not contend.
#[repr(align(128))]
struct Padded(Mutex<Shard>);

struct Shard {
    /// Key -> position in `slots`.
    index: HashMap<BucketKey, u32, BuildHasherDefault<KeyHasher>>,
    slots: Vec<Slot>,
    /// Most cap units (`Bucket::size`) this shard may hold.
    share: usize,
    /// Cap units held now: the sum of the slots' `Bucket::size`.
    size: usize,
    /// Ids of the refunds applied to held buckets, for those that got any (most never do;
    /// kept beside the slots so that slots stay small).
    refunds: HashMap<BucketKey, RecentRefunds, BuildHasherDefault<KeyHasher>>,
    /// Next slot the sweep examines.
    cursor: usize,
    /// xorshift state for eviction sampling.
    rng: u64,
    /// Live buckets dropped to make room.
    evictions: u64,
}

struct Slot {
    key: BucketKey,
    bucket: Bucket,
    /// `bucket.expires_at_ms(policy)` as of its last write: the sweep has no policy at hand.
    expires_at_ms: i64,
}

/// The last [`RECENT_REFUNDS`] refund ids applied to a bucket, in a ring.
#[derive(Default)]
struct RecentRefunds {
    ids: [u64; RECENT_REFUNDS],
    /// How many ids were ever recorded; the next goes to `len % RECENT_REFUNDS`.
    len: usize,
}

impl RecentRefunds {
    /// Records `id`, answering whether it was new.
    fn record(&mut self, id: u64) -> bool {
        if self.ids[..self.len.min(RECENT_REFUNDS)].contains(&id) {
            return false;
        }
        self.ids[self.len % RECENT_REFUNDS] = id;
        self.len += 1;
        true
    }
}

/// Hashes a `BucketKey` by folding its bytes: they already are a uniform hash.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = self.0.rotate_left(32) ^ u64::from_le_bytes(word);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl MemoryBackend {
    /// A backend on the wall clock holding at most `capacity` live buckets.
    pub fn new(capacity: usize) -> MemoryBackend {
        MemoryBackend::with_clock(capacity, Arc::new(SystemClock))
    }

    /// A backend on the given clock (tests drive a [`ManualClock`]).
    pub fn with_clock(capacity: usize, clock: Arc<dyn Clock>) -> MemoryBackend {
        let capacity = capacity.clamp(SHARDS, u32::MAX as usize);
        let shards = (0..SHARDS)
            .map(|i| {
                Padded(Mutex::new(Shard {
                    index: HashMap::default(),
                    slots: Vec::new(),
                    share: capacity / SHARDS + usize::from(i < capacity % SHARDS),
                    size: 0,
                    refunds: HashMap::default(),
                    cursor: 0,
                    rng: 0x9e37_79b9_7f4a_7c15 ^ (i as u64 + 1),
                    evictions: 0,
                }))
            })
            .collect();
        MemoryBackend {
            shards,
            clock,
            capacity,
        }
    }

    /// The cap (as clamped by the constructor), in `Bucket::size` units.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Buckets held now. Expired ones count until the sweep or an access drops them.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.0.lock().slots.len()).sum()
    }

    /// Whether no bucket is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Live buckets dropped so far to respect the cap.
    pub fn evictions(&self) -> u64 {
        self.shards.iter().map(|s| s.0.lock().evictions).sum()
    }

    fn shard_index(key: &BucketKey) -> usize {
        let bytes = key.as_bytes();
        let mut high = [0u8; 8];
        high.copy_from_slice(&bytes[8..]);
        (u64::from_le_bytes(high) % SHARDS as u64) as usize
    }

    fn shard(&self, key: &BucketKey) -> &Mutex<Shard> {
        &self.shards[Self::shard_index(key)].0
    }

    /// Decides a request's items under the locks of all their shards (taken in shard order,
    /// so two requests never wait on each other crosswise): no other request sees a booking
    /// that is then undone because this request ends rejected.
    fn decide_group(&self, group: &Group) -> Vec<Outcome> {
        let mut wanted: Vec<usize> = group
            .items
            .iter()
            .map(|item| Self::shard_index(&item.charge.bucket))
            .collect();
        wanted.sort_unstable();
        wanted.dedup();
        let mut locked: Vec<(usize, MutexGuard<'_, Shard>)> = wanted
            .into_iter()
            .map(|at| (at, self.shards[at].0.lock()))
            .collect();
        // Read under the locks, as the Lua scripts read TIME inside the atomic script: one
        // bucket then sees its decisions in clock order.
        let now_ms = self.clock.now_ms();
        let mut outcomes: Vec<Outcome> = group
            .items
            .iter()
            .map(|item| {
                let charge = &item.charge;
                let shard = locked_shard(&mut locked, &charge.bucket);
                let verdict = shard.decide(charge, now_ms);
                Outcome {
                    allowed: verdict.allowed,
                    remaining: verdict.remaining,
                    reset_ms: verdict.reset_ms,
                    now_ms,
                    booked: verdict.booked,
                    rolled_back: false,
                }
            })
            .collect();
        if group.rejects(&outcomes) {
            for refund in roll_back(group.items.iter().zip(&mut outcomes), true) {
                locked_shard(&mut locked, &refund.bucket).refund(&refund, now_ms);
            }
        }
        outcomes
    }

    fn refund_one(&self, refund: &Refund) {
        let mut shard = self.shard(&refund.bucket).lock();
        let now_ms = self.clock.now_ms();
        shard.refund(refund, now_ms);
    }
}

/// The locked shard that holds `key`, among the shards a request locked.
fn locked_shard<'a>(
    locked: &'a mut [(usize, MutexGuard<'_, Shard>)],
    key: &BucketKey,
) -> &'a mut Shard {
    let at = MemoryBackend::shard_index(key);
    let (_, shard) = locked
        .iter_mut()
        .find(|(index, _)| *index == at)
        .expect("every item's shard is locked");
    shard
}

impl Shard {
    fn decide(&mut self, charge: &Charge, now_ms: i64) -> crate::algorithm::Verdict {
        let (key, policy) = (charge.bucket, &charge.policy);
        let decide = |bucket: &mut Bucket| {
            bucket.decide_spent(policy, now_ms, charge.cost, charge.spread_ms)
        };
        if let Some(&at) = self.index.get(&key) {
            let slot = &mut self.slots[at as usize];
            let before = slot.bucket.size();
            if slot.expires_at_ms <= now_ms {
                slot.bucket = Bucket::new(policy.algorithm);
                self.refunds.remove(&key);
            }
            let verdict = decide(&mut slot.bucket);
            slot.expires_at_ms = slot.bucket.expires_at_ms(policy);
            let after = slot.bucket.size();
            self.size = self.size - before + after;
            if after > before {
                self.make_room(now_ms);
            }
            return verdict;
        }
        let mut bucket = Bucket::new(policy.algorithm);
        let verdict = decide(&mut bucket);
        let expires_at_ms = bucket.expires_at_ms(policy);
        // A bucket that is still empty (peek, rejected denial) need not be stored at all.
        if expires_at_ms > now_ms {
            self.insert(Slot {
                key,
                bucket,
                expires_at_ms,
            });
            self.make_room(now_ms);
        }
        verdict
    }

    fn refund(&mut self, refund: &Refund, now_ms: i64) {
        let Some(&at) = self.index.get(&refund.bucket) else {
            return;
        };
        let slot = &mut self.slots[at as usize];
        if slot.expires_at_ms <= now_ms {
            return;
        }
        if refund.id != 0
            && !self
                .refunds
                .entry(refund.bucket)
                .or_default()
                .record(refund.id)
        {
            return;
        }
        let before = slot.bucket.size();
        slot.bucket
            .refund(&refund.policy, now_ms, refund.cost, refund.booked_at_ms);
        slot.expires_at_ms = slot.bucket.expires_at_ms(&refund.policy);
        self.size = self.size - before + slot.bucket.size();
    }

    fn insert(&mut self, slot: Slot) {
        self.index.insert(slot.key, self.slots.len() as u32);
        self.size += slot.bucket.size();
        self.slots.push(slot);
    }

    /// Sweeps a little; over the share, sweeps more and then evicts, so `size <= share`.
    ///
    /// Runs after the new or grown slot is in place, so it competes like any other: a flood
    /// of short-lived buckets cannot push out ones that live longer.
    fn make_room(&mut self, now_ms: i64) {
        self.sweep(now_ms, SWEEP_STEP);
        if self.size > self.share {
            self.sweep(now_ms, FULL_SWEEP_STEP);
        }
        while self.size > self.share {
            self.evict(now_ms);
        }
    }

    /// Examines `steps` slots from the cursor, dropping the expired ones.
    fn sweep(&mut self, now_ms: i64, steps: usize) {
        for _ in 0..steps {
            if self.slots.is_empty() {
                return;
            }
            if self.cursor >= self.slots.len() {
                self.cursor = 0;
            }
            if self.slots[self.cursor].expires_at_ms <= now_ms {
                // The last slot moves into the cursor's place and is examined next.
                self.remove(self.cursor);
            } else {
                self.cursor += 1;
            }
        }
    }

    /// Drops the slot closest to expiry among a random sample.
    fn evict(&mut self, now_ms: i64) {
        let len = self.slots.len();
        let mut victim = self.next_random(len);
        for _ in 1..EVICTION_SAMPLE {
            let at = self.next_random(len);
            if self.slots[at].expires_at_ms < self.slots[victim].expires_at_ms {
                victim = at;
            }
        }
        if self.slots[victim].expires_at_ms > now_ms {
            self.evictions += 1;
        }
        self.remove(victim);
    }

    fn remove(&mut self, at: usize) {
        let removed = self.slots.swap_remove(at);
        self.size -= removed.bucket.size();
        self.index.remove(&removed.key);
        self.refunds.remove(&removed.key);
        if let Some(moved) = self.slots.get(at) {
            self.index.insert(moved.key, at as u32);
        }
    }

    /// A pseudo-random index below `len` (xorshift64; quality is ample for sampling).
    fn next_random(&mut self, len: usize) -> usize {
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        ((u128::from(x) * len as u128) >> 64) as usize
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    async fn decide(&self, group: &Group) -> Result<Vec<Outcome>, BackendError> {
        Ok(self.decide_group(group))
    }

    async fn refund(&self, refunds: &[Refund]) -> Result<(), BackendError> {
        refunds.iter().for_each(|r| self.refund_one(r));
        Ok(())
    }

    async fn ping(&self) -> Result<(), BackendError> {
        Ok(())
    }

    fn name(&self) -> &'static str {
        "memory"
    }

    fn candidate_store(&self) -> Option<Arc<dyn Backend>> {
        let capacity = (self.capacity / CANDIDATE_SHARE).max(SHARDS);
        Some(Arc::new(MemoryBackend::with_clock(
            capacity,
            Arc::clone(&self.clock),
        )))
    }

    fn evictions(&self) -> Option<u64> {
        Some(MemoryBackend::evictions(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::rules::{Algorithm, OnOverLimit, Policy, Unit};
    use std::time::Duration;

    const NOW: i64 = 1_700_000_000_000;

    fn key(i: u64) -> BucketKey {
        let value = i.to_string();
        BucketKey::new(
            "test",
            "user",
            [("user", value.as_str())],
            &Policy::fixed_window(1, Unit::Second),
        )
    }

    fn backend(capacity: usize) -> (MemoryBackend, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new(NOW));
        (MemoryBackend::with_clock(capacity, clock.clone()), clock)
    }

    fn charge(i: u64, policy: Policy, cost: u64) -> Charge {
        Charge {
            bucket: key(i),
            policy,
            cost,
            spread_ms: 0,
        }
    }

    async fn one(backend: &MemoryBackend, charge: Charge) -> Outcome {
        backend.charge(&[charge]).await.unwrap()[0]
    }

    #[test]
    fn slots_stay_small() {
        // 1M buckets must fit 250 MB: a slot plus its index entry stay well under 100 B.
        assert!(
            size_of::<Slot>() <= 72,
            "slot is {} bytes",
            size_of::<Slot>()
        );
    }

    #[tokio::test]
    async fn batch_sees_its_own_bookings_in_order() {
        let (backend, _) = backend(1000);
        let policy = Policy::fixed_window(5, Unit::Minute);
        let outcomes = backend
            .charge(&[
                charge(1, policy, 2),
                charge(1, policy, 2),
                charge(2, policy, 0),
                charge(1, policy, 2),
            ])
            .await
            .unwrap();
        let summary: Vec<_> = outcomes.iter().map(|o| (o.allowed, o.remaining)).collect();
        assert_eq!(summary, [(true, 3), (true, 1), (true, 5), (false, 0)]);
        assert!(outcomes.iter().all(|o| o.now_ms == NOW));
        assert_eq!(backend.len(), 1, "a peek stores nothing");
        assert_eq!(backend.name(), "memory");
        backend.ping().await.unwrap();
    }

    #[tokio::test]
    async fn refund_restores_the_budget() {
        let (backend, clock) = backend(1000);
        let policy = Policy::fixed_window(5, Unit::Minute);
        let booked = one(&backend, charge(1, policy, 4)).await;
        clock.advance(10);
        backend
            .refund(&[Refund::new(key(1), policy, 4, booked.now_ms)])
            .await
            .unwrap();
        assert_eq!(one(&backend, charge(1, policy, 0)).await.remaining, 5);
        // Refunding a bucket that was never stored is a no-op.
        backend
            .refund(&[Refund::new(key(2), policy, 4, NOW)])
            .await
            .unwrap();
        assert_eq!(backend.len(), 1);
    }

    #[tokio::test]
    async fn expired_buckets_restart_and_get_swept() {
        let (backend, clock) = backend(100_000);
        let policy = Policy::fixed_window(1, Unit::Second);
        for i in 0..1000 {
            assert!(one(&backend, charge(i, policy, 1)).await.allowed);
        }
        assert!(!one(&backend, charge(0, policy, 1)).await.allowed);
        assert_eq!(backend.len(), 1000);

        clock.advance(1000);
        assert!(
            one(&backend, charge(0, policy, 1)).await.allowed,
            "lazy restart"
        );
        // Each insert sweeps four slots: by 3000 new buckets the cursors passed every old one.
        for i in 1000..4000 {
            one(&backend, charge(i, policy, 1)).await;
        }
        assert_eq!(
            backend.len(),
            3001,
            "only the new buckets and the restarted one stay"
        );
        assert_eq!(backend.evictions(), 0);
    }

    #[tokio::test]
    async fn cap_evicts_live_buckets_and_counts_them() {
        let (backend, clock) = backend(640);
        let policy = Policy::fixed_window(1, Unit::Minute);
        for i in 0..640 {
            one(&backend, charge(i, policy, 1)).await;
        }
        // Shards fill unevenly, so a few evictions may already have happened.
        let early = backend.evictions();
        for i in 640..10_000 {
            one(&backend, charge(i, policy, 1)).await;
            assert!(backend.len() <= 640);
        }
        assert_eq!(backend.len(), 640, "every shard runs full");
        assert_eq!(backend.evictions(), 10_000 - 640);
        assert!(early < 640);

        // Once everything has expired, making room drops expired state first: a few new
        // buckets (far fewer than a shard's share) evict nothing live.
        clock.advance(60_000);
        let before = backend.evictions();
        for i in 10_000..10_064 {
            one(&backend, charge(i, policy, 1)).await;
        }
        assert_eq!(backend.evictions(), before);
        assert!(backend.len() < 640);
    }

    #[tokio::test]
    async fn eviction_prefers_buckets_closest_to_expiry() {
        let (backend, _) = backend(64);
        let short = Policy::fixed_window(1, Unit::Second);
        let long = Policy::fixed_window(1, Unit::Day);
        // Fill every shard's single slot with day-long buckets, then flood with second-long
        // ones: each new short bucket must lose against its day-long neighbour.
        let mut day_keys = 0;
        while backend.len() < 64 {
            one(&backend, charge(day_keys, long, 1)).await;
            day_keys += 1;
        }
        for j in 0..200 {
            one(&backend, charge(1_000_000 + j, short, 1)).await;
        }
        assert_eq!(backend.len(), 64);
        assert_eq!(backend.evictions(), day_keys - 64 + 200);
        let mut held = 0;
        for k in 0..day_keys {
            // A peek on a held day-long bucket (L = 1, booked) is denied.
            if !one(&backend, charge(k, long, 0)).await.allowed {
                held += 1;
            }
        }
        assert!(
            held >= 60,
            "only {held} day-long buckets survived the flood"
        );
    }

    #[tokio::test]
    async fn a_sliding_log_counts_against_the_cap_by_its_instants() {
        // Cap 64: every shard's share is 1 unit. A log with bookings at two instants takes
        // 2 units, more than its shard's share, and is evicted; a fixed window is not.
        let (backend, clock) = backend(64);
        let mut log = Policy::fixed_window(100, Unit::Minute);
        log.algorithm = Algorithm::SlidingLog;
        one(&backend, charge(1, log, 5)).await;
        one(&backend, charge(1, log, 5)).await;
        assert_eq!((backend.len(), backend.evictions()), (1, 0), "one instant");
        clock.advance(1);
        one(&backend, charge(1, log, 1)).await;
        assert_eq!((backend.len(), backend.evictions()), (0, 1));

        let window = Policy::fixed_window(100, Unit::Minute);
        one(&backend, charge(2, window, 1)).await;
        clock.advance(1);
        one(&backend, charge(2, window, 1)).await;
        assert_eq!((backend.len(), backend.evictions()), (1, 1));
    }

    #[tokio::test]
    async fn a_refund_delivered_twice_applies_once() {
        let (backend, _) = backend(1000);
        let policy = Policy::fixed_window(5, Unit::Minute);
        let first = one(&backend, charge(1, policy, 2)).await;
        one(&backend, charge(1, policy, 2)).await;
        let refund = Refund::new(key(1), policy, 2, first.now_ms);
        backend.refund(&[refund.clone(), refund]).await.unwrap();
        assert_eq!(one(&backend, charge(1, policy, 0)).await.remaining, 3);
        // Ids are remembered in a ring of RECENT_REFUNDS.
        let mut recent = RecentRefunds::default();
        for id in 0..RECENT_REFUNDS as u64 + 1 {
            assert!(recent.record(id));
        }
        assert!(!recent.record(RECENT_REFUNDS as u64));
        assert!(recent.record(0), "the oldest id was forgotten");
    }

    #[tokio::test]
    async fn lockout_state_is_kept_even_without_a_booking() {
        let (backend, clock) = backend(1000);
        let mut policy = Policy::fixed_window(2, Unit::Second);
        policy.lockout = Some(Duration::from_secs(60));
        assert!(!one(&backend, charge(1, policy, 3)).await.allowed);
        let o = one(&backend, charge(1, policy, 1)).await;
        assert!(!o.allowed);
        assert_eq!(o.reset_ms, 60_000);
        clock.advance(60_000);
        assert!(one(&backend, charge(1, policy, 1)).await.allowed);
    }

    #[tokio::test]
    async fn consume_and_every_algorithm_run_through_the_backend() {
        let (backend, _) = backend(1000);
        for (i, algorithm) in Algorithm::ALL.into_iter().enumerate() {
            let mut policy = Policy::fixed_window(3, Unit::Minute);
            policy.algorithm = algorithm;
            let i = i as u64;
            assert!(one(&backend, charge(i, policy, 3)).await.allowed);
            let o = one(&backend, charge(i, policy, 1)).await;
            assert!(!o.allowed && !o.booked, "{algorithm}");
            if algorithm != Algorithm::SlidingLog {
                policy.on_over_limit = OnOverLimit::Consume;
                let o = one(&backend, charge(i, policy, 1)).await;
                assert!(!o.allowed && o.booked, "{algorithm}");
            }
        }
    }

    #[tokio::test]
    async fn clock_going_backwards_is_harmless() {
        let (backend, clock) = backend(1000);
        let policy = Policy::fixed_window(2, Unit::Second);
        one(&backend, charge(1, policy, 1)).await;
        clock.set(NOW - 3_600_000);
        let o = one(&backend, charge(1, policy, 1)).await;
        assert!(o.allowed);
        assert!(!one(&backend, charge(1, policy, 1)).await.allowed);
        clock.set(i64::MIN);
        one(&backend, charge(2, policy, u64::MAX)).await;
        one(&backend, charge(2, policy, 1)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_tasks_on_one_bucket_admit_exactly_the_limit() {
        let (backend, _) = backend(1000);
        let backend = Arc::new(backend);
        let policy = Policy::fixed_window(100, Unit::Minute);
        let tasks: Vec<_> = (0..32)
            .map(|_| {
                let backend = backend.clone();
                tokio::spawn(async move {
                    let mut admitted = 0;
                    for _ in 0..25 {
                        if one(&backend, charge(7, policy, 1)).await.allowed {
                            admitted += 1;
                        }
                        tokio::task::yield_now().await;
                    }
                    admitted
                })
            })
            .collect();
        let mut admitted = 0;
        for task in tasks {
            admitted += task.await.unwrap();
        }
        assert_eq!(admitted, 100);
    }

    #[test]
    fn system_clock_reads_the_epoch() {
        // After 2020-01-01 and before 2200: a sanity check that it is ms since the epoch.
        let now = SystemClock.now_ms();
        assert!((1_577_836_800_000..7_258_118_400_000).contains(&now));
    }
}
