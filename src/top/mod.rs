//! Who is being limited: per rule, the descriptor values with the most denied hits and the
//! most hits near their limit over the last minute, in a memory bound that no key
//! cardinality can move (docs/operations.md#top-keys).
//!
//! Each rule keeps two [`SpaceSaving`] summaries per kind, one per half minute: the current
//! half and the one before it, so a reading covers between 30 and 60 s. A value is shown as
//! `#` and the first 16 hex digits of the SHA-256 of its text (`key=value`, levels joined by
//! `/`) unless the operator opts in to values: those are often addresses or API keys.

pub mod sketch;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use crate::backend::BucketKey;
pub use sketch::{Counted, SpaceSaving};

/// Length of one of the two halves a reading covers.
pub const HALF: Duration = Duration::from_secs(30);
/// Keys each summary holds by default (`--top-capacity`).
pub const DEFAULT_CAPACITY: usize = 1024;
/// Most rules (live and candidate) with summaries at once; rules past it are not ranked.
pub const MAX_RANKED_RULES: usize = 128;
/// A rule's summaries are split by key into up to this many stripes, each behind its own
/// lock, so that a flood of denials on one rule from every core does not queue on one lock.
/// Keys are split by their hash, so the stripes' totals and keys add up to the rule's.
const MAX_STRIPES: usize = 8;
/// Keys a stripe holds at least: smaller capacities are not split.
const MIN_STRIPE_KEYS: usize = 64;
/// Longest value text kept when values are shown (longer ones are cut, with `…`).
pub const MAX_SHOWN_BYTES: usize = 256;

/// How top keys are kept and shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopOptions {
    /// Keys each summary holds.
    pub capacity: usize,
    /// Show descriptor values instead of their hashes.
    pub show_values: bool,
}

impl Default for TopOptions {
    fn default() -> TopOptions {
        TopOptions {
            capacity: DEFAULT_CAPACITY,
            show_values: false,
        }
    }
}

/// What a rule's hit counts as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Over the limit (or, for a candidate rule, would have been).
    Denied,
    /// Admitted past 80% of the capacity (the reference's `near_limit`).
    NearLimit,
}

/// How a held key is shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Label {
    /// The first 8 bytes of the SHA-256 of the value text.
    Hashed(u64),
    /// The value text, cut at [`MAX_SHOWN_BYTES`].
    Shown(Box<str>),
}

impl Label {
    fn of(levels: &[(String, String)], show_values: bool) -> Label {
        let text = level_text(levels);
        if show_values {
            let mut end = text.len().min(MAX_SHOWN_BYTES);
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            let mut shown = text[..end].to_owned();
            if end < text.len() {
                shown.push('…');
            }
            return Label::Shown(shown.into_boxed_str());
        }
        let digest = Sha256::digest(text.as_bytes());
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        Label::Hashed(u64::from_be_bytes(first))
    }
}

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Label::Hashed(hash) => write!(f, "#{hash:016x}"),
            Label::Shown(text) => f.write_str(text),
        }
    }
}

/// `k1=v1/k2=v2`: the text a key is shown as, or hashed from.
pub fn level_text(levels: &[(String, String)]) -> String {
    let mut text = String::new();
    for (i, (key, value)) in levels.iter().enumerate() {
        if i > 0 {
            text.push('/');
        }
        text.push_str(key);
        text.push('=');
        text.push_str(value);
    }
    text
}

/// Which rule a summary belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RuleName {
    /// The rule's domain.
    pub domain: String,
    /// The rule's descriptor path.
    pub path: String,
    /// The rule's `name`, if it has one.
    pub name: Option<String>,
    /// Whether it is a candidate rule (`--candidate-config`).
    pub candidate: bool,
}

/// A key as read: its label, estimated weight and the most the estimate may be off by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ranked {
    /// How the key is shown.
    pub key: String,
    /// Estimated weight over the reading's span.
    pub count: u64,
    /// The true weight lies within `count - error ..= count + error`.
    pub error: u64,
}

/// One rule's reading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleReading {
    /// The rule.
    pub rule: RuleName,
    /// Every denied weight over the span, exactly.
    pub denied_total: u64,
    /// Every near-limit weight over the span, exactly.
    pub near_limit_total: u64,
    /// The heaviest denied keys, heaviest first.
    pub denied: Vec<Ranked>,
    /// The heaviest near-limit keys, heaviest first.
    pub near_limit: Vec<Ranked>,
}

impl RuleReading {
    fn totals(&self) -> (u64, u64) {
        (self.denied_total, self.near_limit_total)
    }
}

/// The two halves of one kind.
struct Halves {
    current: SpaceSaving<BucketKey, Label>,
    previous: SpaceSaving<BucketKey, Label>,
}

impl Halves {
    fn new(capacity: usize) -> Halves {
        Halves {
            current: SpaceSaving::new(capacity),
            previous: SpaceSaving::new(capacity),
        }
    }

    /// The keys of both halves, heaviest first, at most `limit`. Only the keys returned (and
    /// those tied with the last of them) have their text made.
    fn ranked(&self, limit: usize) -> Vec<Ranked> {
        if limit == 0 {
            return Vec::new();
        }
        let mut merged: HashMap<BucketKey, (u64, u64, &Label)> = HashMap::new();
        for (half, other) in [
            (&self.current, &self.previous),
            (&self.previous, &self.current),
        ] {
            for held in half.held() {
                merged.entry(held.key).or_insert_with(|| {
                    // In the other half the key is held with its own error, or was at most
                    // that half's smallest count.
                    match other.get(&held.key) {
                        Some(there) => (
                            held.count + there.count,
                            held.error + there.error,
                            &held.label,
                        ),
                        None => (held.count, held.error + other.unheld_bound(), &held.label),
                    }
                });
            }
        }
        let mut heaviest: Vec<(u64, u64, &Label)> = merged.into_values().collect();
        heaviest.sort_unstable_by_key(|&(count, ..)| std::cmp::Reverse(count));
        if let Some(&(floor, ..)) = heaviest.get(limit - 1) {
            heaviest.retain(|&(count, ..)| count >= floor);
        }
        let mut ranked: Vec<Ranked> = heaviest
            .into_iter()
            .map(|(count, error, label)| Ranked {
                key: label.to_string(),
                count,
                error,
            })
            .collect();
        ranked.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
        ranked.truncate(limit);
        ranked
    }

    fn total(&self) -> u64 {
        self.current.total() + self.previous.total()
    }

    /// How many keys the two halves hold together.
    fn len(&self) -> usize {
        let only_previous = self.previous.held();
        let only_previous = only_previous.filter(|held| self.current.get(&held.key).is_none());
        self.current.len() + only_previous.count()
    }
}

/// One rule's summaries, in stripes by key.
pub struct RuleTop {
    name: RuleName,
    show_values: bool,
    stripes: Box<[Mutex<RuleState>]>,
}

struct RuleState {
    capacity: usize,
    /// When the current half began.
    started: Instant,
    denied: Halves,
    near_limit: Halves,
}

impl RuleState {
    /// Moves to a new half when the current one is over; both are cleared after a silence of
    /// two halves.
    fn roll(&mut self, now: Instant) {
        let age = now.saturating_duration_since(self.started);
        if age < HALF {
            return;
        }
        for halves in [&mut self.denied, &mut self.near_limit] {
            let current = std::mem::replace(&mut halves.current, SpaceSaving::new(self.capacity));
            halves.previous = if age < 2 * HALF {
                current
            } else {
                SpaceSaving::new(self.capacity)
            };
        }
        self.started = now;
    }
}

impl RuleTop {
    fn new(name: RuleName, options: TopOptions) -> RuleTop {
        let count = (options.capacity / MIN_STRIPE_KEYS).clamp(1, MAX_STRIPES);
        let capacity = options.capacity.div_ceil(count);
        let stripes = (0..count)
            .map(|_| {
                Mutex::new(RuleState {
                    capacity,
                    started: Instant::now(),
                    denied: Halves::new(capacity),
                    near_limit: Halves::new(capacity),
                })
            })
            .collect();
        RuleTop {
            name,
            show_values: options.show_values,
            stripes,
        }
    }

    /// Counts `weight` of `kind` for the bucket `key`, whose matched levels are `levels`.
    pub fn offer(&self, kind: Kind, key: BucketKey, levels: &[(String, String)], weight: u64) {
        if weight == 0 {
            return;
        }
        // The key is a hash already: its first byte spreads keys evenly.
        let stripe = usize::from(key.as_bytes()[0]) % self.stripes.len();
        let mut state = self.stripes[stripe].lock();
        state.roll(Instant::now());
        let halves = match kind {
            Kind::Denied => &mut state.denied,
            Kind::NearLimit => &mut state.near_limit,
        };
        halves
            .current
            .offer(key, weight, || Label::of(levels, self.show_values));
    }

    /// The rule's heaviest keys of each kind, at most `limit` each.
    pub fn read(&self, limit: usize) -> RuleReading {
        self.read_within(limit, [limit, limit]).0
    }

    /// The rule's totals, without its keys.
    fn totals(&self) -> (u64, u64) {
        self.read_within(0, [0, 0]).0.totals()
    }

    /// The rule's heaviest keys, at most `limit` of each kind and `most[0]` denied and
    /// `most[1]` near-limit ones: a reading copies no more keys than its answer lists. Also
    /// says how many of each kind a reading of `limit` alone would list.
    fn read_within(&self, limit: usize, most: [usize; 2]) -> (RuleReading, [usize; 2]) {
        let mut reading = RuleReading {
            rule: self.name.clone(),
            denied_total: 0,
            near_limit_total: 0,
            denied: Vec::new(),
            near_limit: Vec::new(),
        };
        let [denied_most, near_most] = most.map(|most| most.min(limit));
        let now = Instant::now();
        let mut held = [0, 0];
        for stripe in &self.stripes {
            let mut state = stripe.lock();
            state.roll(now);
            reading.denied_total += state.denied.total();
            reading.near_limit_total += state.near_limit.total();
            if limit > 0 {
                held[0] += state.denied.len();
                held[1] += state.near_limit.len();
            }
            if denied_most > 0 {
                reading.denied.extend(state.denied.ranked(denied_most));
            }
            if near_most > 0 {
                reading
                    .near_limit
                    .extend(state.near_limit.ranked(near_most));
            }
        }
        for (keys, most) in [
            (&mut reading.denied, denied_most),
            (&mut reading.near_limit, near_most),
        ] {
            keys.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
            keys.truncate(most);
        }
        (reading, held.map(|held| held.min(limit)))
    }
}

/// Every rule's summaries, by rule.
pub struct TopKeys {
    options: TopOptions,
    rules: RwLock<HashMap<RuleName, Arc<RuleTop>>>,
}

impl TopKeys {
    /// No rule ranked yet.
    pub fn new(options: TopOptions) -> TopKeys {
        TopKeys {
            options,
            rules: RwLock::new(HashMap::new()),
        }
    }

    /// Keys each summary holds.
    pub fn capacity(&self) -> usize {
        self.options.capacity
    }

    /// Whether values are shown rather than hashed.
    pub fn shows_values(&self) -> bool {
        self.options.show_values
    }

    /// The summaries of `name`, made on first use; `None` once [`MAX_RANKED_RULES`] rules
    /// have them. A summary holds no keys until the rule has a denied or near-limit hit.
    pub fn rule(&self, name: RuleName) -> Option<Arc<RuleTop>> {
        if let Some(top) = self.rules.read().get(&name) {
            return Some(Arc::clone(top));
        }
        let mut rules = self.rules.write();
        if rules.len() >= MAX_RANKED_RULES && !rules.contains_key(&name) {
            return None;
        }
        let top = rules
            .entry(name.clone())
            .or_insert_with(|| Arc::new(RuleTop::new(name, self.options)));
        Some(Arc::clone(top))
    }

    /// Drops the summaries of rules for which `keep` is false (after a reload).
    pub fn retain(&self, keep: impl Fn(&RuleName) -> bool) {
        self.rules.write().retain(|name, _| keep(name));
    }

    /// Every ranked rule's reading, at most `limit` keys of each kind per rule; rules with
    /// nothing in the span are left out.
    pub fn read(&self, limit: usize) -> Vec<RuleReading> {
        self.read_within(limit, usize::MAX).0
    }

    /// As [`TopKeys::read`], listing at most `budget` keys in all, spent on the rules in
    /// their order (most denied first): rules past it keep their totals and list no keys.
    /// Says whether any key was left out. Only the keys listed are copied.
    pub fn read_within(&self, limit: usize, mut budget: usize) -> (Vec<RuleReading>, bool) {
        let tops: Vec<Arc<RuleTop>> = self.rules.read().values().cloned().collect();
        let mut ranked: Vec<((u64, u64), Arc<RuleTop>)> = tops
            .into_iter()
            .map(|top| (top.totals(), top))
            .filter(|((denied, near), _)| *denied > 0 || *near > 0)
            .collect();
        ranked.sort_by(|(a_totals, a), (b_totals, b)| {
            b_totals
                .cmp(a_totals)
                .then_with(|| (&a.name.domain, &a.name.path).cmp(&(&b.name.domain, &b.name.path)))
        });
        let mut truncated = false;
        let readings = ranked
            .iter()
            .map(|(_, top)| {
                let denied = limit.min(budget);
                let near = limit.min(budget - denied);
                let (reading, held) = top.read_within(limit, [denied, near]);
                budget -= reading.denied.len() + reading.near_limit.len();
                // Keys left out: what the lists could have held past what the budget let in.
                truncated |= held[0] > reading.denied.len() || held[1] > reading.near_limit.len();
                reading
            })
            .collect();
        (readings, truncated)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{Policy, Unit};

    fn name(path: &str) -> RuleName {
        RuleName {
            domain: "d".into(),
            path: path.into(),
            name: None,
            candidate: false,
        }
    }

    fn levels(value: &str) -> Vec<(String, String)> {
        vec![("user".to_owned(), value.to_owned())]
    }

    fn key(value: &str) -> BucketKey {
        let policy = Policy::fixed_window(1, Unit::Second);
        BucketKey::new("d", "user", [("user", value)], &policy)
    }

    #[test]
    fn values_are_hashed_unless_shown() {
        let hashed = Label::of(&levels("10.0.0.1"), false).to_string();
        // printf 'user=10.0.0.1' | sha256sum | cut -c1-16
        let digest = Sha256::digest(b"user=10.0.0.1");
        let expected: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hashed, format!("#{expected}"));
        assert_eq!(
            Label::of(&levels("10.0.0.1"), true).to_string(),
            "user=10.0.0.1"
        );
        let long = Label::of(&levels(&"é".repeat(400)), true).to_string();
        assert!(long.len() <= MAX_SHOWN_BYTES + '…'.len_utf8() && long.ends_with('…'));
    }

    #[test]
    fn a_reading_ranks_both_halves_and_bounds_the_error() {
        let top = TopKeys::new(TopOptions {
            capacity: 2,
            show_values: true,
        });
        let rule = top.rule(name("user")).unwrap();
        rule.offer(Kind::Denied, key("a"), &levels("a"), 5);
        rule.offer(Kind::Denied, key("b"), &levels("b"), 3);
        {
            let mut state = rule.stripes[0].lock();
            state.started -= HALF;
        }
        rule.offer(Kind::Denied, key("a"), &levels("a"), 2);
        rule.offer(Kind::Denied, key("c"), &levels("c"), 1);
        rule.offer(Kind::NearLimit, key("c"), &levels("c"), 4);
        let reading = rule.read(10);
        assert_eq!(reading.denied_total, 11);
        assert_eq!(reading.near_limit_total, 4);
        let denied: Vec<(&str, u64, u64)> = reading
            .denied
            .iter()
            .map(|r| (r.key.as_str(), r.count, r.error))
            .collect();
        // Both halves are full (2 keys): a key held in one half may have had up to the
        // other half's smallest count there (1 now, 3 before).
        assert_eq!(
            denied,
            [("user=a", 7, 0), ("user=b", 3, 1), ("user=c", 1, 3)]
        );
        assert_eq!(reading.near_limit[0].key, "user=c");
    }

    #[test]
    fn a_silence_of_two_halves_clears_a_rule() {
        let top = TopKeys::new(TopOptions::default());
        let rule = top.rule(name("user")).unwrap();
        rule.offer(Kind::Denied, key("a"), &levels("a"), 5);
        for stripe in &rule.stripes {
            stripe.lock().started -= 2 * HALF;
        }
        assert!(top.read(10).is_empty());
    }

    /// With the default capacity a rule's keys are split over stripes: every key lands in
    /// one of them, and a reading adds them up to the same exact totals and ranks.
    #[test]
    fn stripes_add_up_to_the_rule() {
        let top = TopKeys::new(TopOptions::default());
        let rule = top.rule(name("user")).unwrap();
        assert_eq!(rule.stripes.len(), MAX_STRIPES);
        for i in 0..200u64 {
            let value = format!("u{i}");
            rule.offer(Kind::Denied, key(&value), &levels(&value), i + 1);
        }
        let reading = rule.read(3);
        assert_eq!(reading.denied_total, (1..=200).sum::<u64>());
        let counts: Vec<(u64, u64)> = reading.denied.iter().map(|r| (r.count, r.error)).collect();
        assert_eq!(counts, [(200, 0), (199, 0), (198, 0)]);
    }

    #[test]
    fn rules_past_the_bound_are_not_ranked() {
        let top = TopKeys::new(TopOptions::default());
        for i in 0..MAX_RANKED_RULES {
            assert!(top.rule(name(&format!("r{i}"))).is_some());
        }
        assert!(top.rule(name("one-more")).is_none());
        assert!(top.rule(name("r0")).is_some());
        top.retain(|name| name.path != "r0");
        assert!(top.rule(name("one-more")).is_some());
    }
}
