//! Space-saving heavy hitters (Metwally, Agrawal and El Abbadi, 2005), weighted.
//!
//! At most `capacity` keys are held, whatever the number of distinct keys offered. A key not
//! held takes the place of the key with the smallest count, inheriting that count as its
//! possible overestimate (`error`). So each held key's `count` is at least its true weight
//! and at most `error` above it, and a key whose true weight exceeds `total / capacity` is
//! always held. The smallest count sits at the root of a binary min-heap, so every offer
//! costs O(log capacity).

use std::collections::HashMap;
use std::hash::Hash;

/// One held key: its estimated weight and how much of it may not be its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counted<K, L> {
    /// The key's identity.
    pub key: K,
    /// How the key is shown; made once, when the key is first held.
    pub label: L,
    /// Estimated weight, never below the true weight.
    pub count: u64,
    /// Most the estimate may exceed the true weight by.
    pub error: u64,
}

/// A bounded summary of the heaviest keys of a weighted stream.
#[derive(Debug, Clone)]
pub struct SpaceSaving<K, L> {
    capacity: usize,
    /// Min-heap on `count`.
    heap: Vec<Counted<K, L>>,
    /// Each held key's place in `heap`.
    places: HashMap<K, usize>,
    /// Every weight offered, exactly.
    total: u64,
}

impl<K: Copy + Eq + Hash, L> SpaceSaving<K, L> {
    /// An empty summary holding at most `capacity` keys (at least one).
    pub fn new(capacity: usize) -> SpaceSaving<K, L> {
        SpaceSaving {
            capacity: capacity.max(1),
            heap: Vec::new(),
            places: HashMap::new(),
            total: 0,
        }
    }

    /// Adds `weight` to `key`; `label` is called only when the key starts being held.
    pub fn offer(&mut self, key: K, weight: u64, label: impl FnOnce() -> L) {
        self.total = self.total.saturating_add(weight);
        if let Some(&place) = self.places.get(&key) {
            let held = &mut self.heap[place];
            held.count = held.count.saturating_add(weight);
            self.sift_down(place);
            return;
        }
        if self.heap.len() < self.capacity {
            self.heap.push(Counted {
                key,
                label: label(),
                count: weight,
                error: 0,
            });
            let place = self.heap.len() - 1;
            self.places.insert(key, place);
            self.sift_up(place);
            return;
        }
        let smallest = &mut self.heap[0];
        self.places.remove(&smallest.key);
        let inherited = smallest.count;
        *smallest = Counted {
            key,
            label: label(),
            count: inherited.saturating_add(weight),
            error: inherited,
        };
        self.places.insert(key, 0);
        self.sift_down(0);
    }

    /// Every weight offered, exactly.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The most weight a key not held may have had: the smallest count once full, else 0
    /// (every key offered is then held, with its exact weight).
    pub fn unheld_bound(&self) -> u64 {
        if self.heap.len() < self.capacity {
            0
        } else {
            self.heap.first().map_or(0, |smallest| smallest.count)
        }
    }

    /// The held key `key`, if held.
    pub fn get(&self, key: &K) -> Option<&Counted<K, L>> {
        self.places.get(key).map(|&place| &self.heap[place])
    }

    /// The held keys, in no order.
    pub fn held(&self) -> impl Iterator<Item = &Counted<K, L>> {
        self.heap.iter()
    }

    /// How many keys are held.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        self.places.insert(self.heap[a].key, a);
        self.places.insert(self.heap[b].key, b);
    }

    fn sift_up(&mut self, mut place: usize) {
        while place > 0 {
            let parent = (place - 1) / 2;
            if self.heap[parent].count <= self.heap[place].count {
                break;
            }
            self.swap(parent, place);
            place = parent;
        }
    }

    fn sift_down(&mut self, mut place: usize) {
        loop {
            let left = 2 * place + 1;
            let right = left + 1;
            let mut smallest = place;
            if left < self.heap.len() && self.heap[left].count < self.heap[smallest].count {
                smallest = left;
            }
            if right < self.heap.len() && self.heap[right].count < self.heap[smallest].count {
                smallest = right;
            }
            if smallest == place {
                return;
            }
            self.swap(place, smallest);
            place = smallest;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heap_holds(sketch: &SpaceSaving<u64, ()>) {
        for (place, held) in sketch.heap.iter().enumerate() {
            assert_eq!(sketch.places[&held.key], place);
            if place > 0 {
                assert!(sketch.heap[(place - 1) / 2].count <= held.count);
            }
        }
        assert_eq!(sketch.places.len(), sketch.heap.len());
    }

    #[test]
    fn below_capacity_counts_are_exact() {
        let mut sketch = SpaceSaving::new(4);
        for (key, weight) in [(1u64, 5), (2, 1), (1, 2), (3, 7)] {
            sketch.offer(key, weight, || ());
        }
        heap_holds(&sketch);
        assert_eq!(sketch.get(&1).map(|c| (c.count, c.error)), Some((7, 0)));
        assert_eq!(sketch.get(&3).map(|c| (c.count, c.error)), Some((7, 0)));
        assert_eq!(sketch.total(), 15);
        assert_eq!(sketch.unheld_bound(), 0);
    }

    #[test]
    fn a_new_key_takes_the_smallest_place_and_its_count_as_error() {
        let mut sketch = SpaceSaving::new(2);
        sketch.offer(1u64, 10, || ());
        sketch.offer(2, 3, || ());
        sketch.offer(3, 1, || ());
        heap_holds(&sketch);
        assert!(sketch.get(&2).is_none());
        assert_eq!(sketch.get(&3).map(|c| (c.count, c.error)), Some((4, 3)));
        assert_eq!(sketch.unheld_bound(), 4);
    }

    #[test]
    fn labels_are_made_only_when_a_key_starts_being_held() {
        let mut sketch: SpaceSaving<u64, u32> = SpaceSaving::new(8);
        let mut made = 0;
        for _ in 0..100 {
            sketch.offer(7, 1, || {
                made += 1;
                made
            });
        }
        assert_eq!(made, 1);
        assert_eq!(sketch.get(&7).map(|c| c.label), Some(1));
    }

    /// A million distinct keys seen once, and ten heavy keys seen 2,000 times each, in a
    /// mixed order: the ten are the ten largest counts, each within its error of the truth,
    /// and the summary holds no more than its capacity.
    #[test]
    fn ten_heavy_keys_among_a_million_are_the_top_ten() {
        let capacity = 1024;
        let mut sketch: SpaceSaving<u64, ()> = SpaceSaving::new(capacity);
        let heavy: Vec<u64> = (0..10).map(|i| u64::MAX - i).collect();
        // A fixed pseudo-random order (xorshift), so the test is the same every run.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut distinct = 0u64;
        let mut heavy_left = [2_000u32; 10];
        while distinct < 1_000_000 || heavy_left.iter().any(|&left| left > 0) {
            let roll = next();
            let pick = (roll % 10) as usize;
            if roll % 50 == 0 && heavy_left[pick] > 0 {
                heavy_left[pick] -= 1;
                sketch.offer(heavy[pick], 1, || ());
            } else if distinct < 1_000_000 {
                sketch.offer(distinct, 1, || ());
                distinct += 1;
            } else if let Some(left) = heavy_left.iter_mut().position(|left| *left > 0) {
                heavy_left[left] -= 1;
                sketch.offer(heavy[left], 1, || ());
            }
        }
        heap_holds(&sketch);
        assert_eq!(sketch.len(), capacity);
        assert_eq!(sketch.total(), 1_020_000);
        let mut ranked: Vec<&Counted<u64, ()>> = sketch.held().collect();
        ranked.sort_by_key(|held| std::cmp::Reverse(held.count));
        let mut top: Vec<u64> = ranked[..10].iter().map(|held| held.key).collect();
        top.sort_unstable();
        let mut expected = heavy;
        expected.sort_unstable();
        assert_eq!(top, expected);
        for held in &ranked[..10] {
            assert!(
                held.count >= 2_000 && held.count - held.error <= 2_000,
                "{held:?}"
            );
            assert!(held.error <= sketch.total() / capacity as u64);
        }
    }
}
