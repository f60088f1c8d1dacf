//! The compiled descriptor tree: (domain, descriptor entries) -> rule. Pure, no IO.
//!
//! Matching follows envoyproxy/ratelimit, level by level along the request's entries: an
//! exact `key`+`value` node first, then the first wildcard node of that key whose pattern
//! matches (file order), then the key-only default node. The rule applies only when the
//! request's last entry lands on a node with a rate limit (depth must match exactly), and
//! there is no backtracking to a less specific node after a more specific one was taken.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use crate::rules::Rule;

/// One domain file after validation: the input the matcher is compiled from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainRules {
    /// The domain name requests carry.
    pub domain: String,
    /// Top-level descriptors, in file order.
    pub descriptors: Vec<DescriptorRule>,
}

/// One validated YAML descriptor node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorRule {
    /// Entry key this node matches.
    pub key: String,
    /// Exact value or `*` pattern; `None` matches any value (key-only default).
    pub value: Option<String>,
    /// For a wildcard value: every matching value shares one bucket.
    pub share_threshold: bool,
    /// The request's value at this level goes into the metric key (when matched by wildcard
    /// or key only), whether or not this node has the rate limit.
    pub value_to_metric: bool,
    /// The rate limit at this node, if any.
    pub rule: Option<Arc<Rule>>,
    /// Nodes that match the next entry.
    pub children: Vec<DescriptorRule>,
}

/// How one request entry matched its level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LevelMatch {
    /// The configured value equals the entry's value.
    Exact,
    /// A wildcard pattern matched; `shared` when the node has `share_threshold`.
    Wildcard {
        /// Whether all matching values share one bucket.
        shared: bool,
    },
    /// The key-only default node matched.
    Default,
}

/// The result of a successful match.
#[derive(Debug, Clone)]
pub struct Matched<'a> {
    /// The rule the descriptor resolves to.
    pub rule: &'a Arc<Rule>,
    /// The rule's id: its index in [`Matcher::rules`], so per-rule state can live in a
    /// vector beside the matcher.
    pub rule_id: usize,
    /// Per level: the entry key, the value naming the bucket (the runtime value, or the
    /// pattern under `share_threshold`), and how the level matched.
    pub levels: Vec<(&'a str, &'a str, LevelMatch)>,
    /// Per level, for the metric key: the wildcard pattern that matched (if one did) and the
    /// matched node's `value_to_metric`.
    metric_levels: Vec<(Option<&'a str>, bool)>,
}

impl Matched<'_> {
    /// The metric key of this match, built as the reference service builds it, level by
    /// level. With the rule's `detailed_metric`, every level shows its runtime value
    /// (`key_value`; a `share_threshold` level its pattern). Otherwise an exact level shows
    /// its value, a key-only level its runtime value only under its own `value_to_metric`,
    /// and a wildcard level its pattern, or its runtime value under its own
    /// `value_to_metric` unless it shares one bucket (`share_threshold`). Without any of
    /// these flags that is the rule path, returned without allocating.
    pub fn metric_key(&self, entries: &[(String, String)]) -> Cow<'_, str> {
        let rule = self.rule;
        let any_value = self.metric_levels.iter().any(|&(_, shown)| shown);
        if !rule.detailed_metric && !any_value {
            return Cow::Borrowed(&rule.path);
        }
        let shared = |how: &LevelMatch| matches!(how, LevelMatch::Wildcard { shared: true });
        let any_shared = self.levels.iter().any(|(_, _, how)| shared(how));
        let mut key = String::new();
        let levels = self.levels.iter().zip(&self.metric_levels);
        for ((entry_key, value), ((_, bucket_value, how), &(pattern, value_to_metric))) in
            entries.iter().zip(levels)
        {
            if !key.is_empty() {
                key.push('.');
            }
            key.push_str(entry_key);
            let shown = match how {
                LevelMatch::Wildcard { shared: true } => Some(*bucket_value),
                // The reference writes `key_` for an empty value here, unless some level
                // shares its bucket.
                _ if rule.detailed_metric && !any_shared => Some(value.as_str()),
                _ if rule.detailed_metric || value_to_metric => {
                    Some(value.as_str()).filter(|value| !value.is_empty())
                }
                LevelMatch::Exact => Some(*bucket_value),
                LevelMatch::Wildcard { .. } => pattern,
                LevelMatch::Default => None,
            };
            if let Some(shown) = shown {
                let _ = write!(key, "_{shown}");
            }
        }
        if key == rule.path {
            return Cow::Borrowed(&rule.path);
        }
        Cow::Owned(key)
    }
}

/// Every loaded domain, compiled for lookup.
#[derive(Debug, Default)]
pub struct Matcher {
    domains: HashMap<String, Level>,
    rules: Vec<Arc<Rule>>,
    /// What it was compiled from, so a reload can tell an unchanged config.
    source: Vec<DomainRules>,
}

#[derive(Debug, Default)]
struct Level {
    keys: HashMap<String, KeyNodes>,
}

#[derive(Debug, Default)]
struct KeyNodes {
    exact: HashMap<String, Node>,
    wildcards: Vec<(String, Node)>,
    /// Candidate wildcards by literal prefix, so a lookup tests only patterns whose prefix
    /// the value starts with instead of every pattern of the key.
    wildcard_index: PrefixIndex,
    default: Option<Node>,
}

/// A byte trie over the literal prefixes (text before the first `*`) of a key's wildcard
/// patterns; each node lists the patterns (by file-order index) whose prefix ends there.
#[derive(Debug, Default)]
struct PrefixIndex {
    nodes: Vec<PrefixNode>,
}

#[derive(Debug, Default)]
struct PrefixNode {
    children: Vec<(u8, usize)>,
    patterns: Vec<usize>,
}

impl PrefixIndex {
    fn insert(&mut self, prefix: &[u8], pattern: usize) {
        if self.nodes.is_empty() {
            self.nodes.push(PrefixNode::default());
        }
        let mut at = 0;
        for &byte in prefix {
            let next = match self.nodes[at].children.iter().find(|(b, _)| *b == byte) {
                Some(&(_, next)) => next,
                None => {
                    self.nodes.push(PrefixNode::default());
                    let next = self.nodes.len() - 1;
                    self.nodes[at].children.push((byte, next));
                    next
                }
            };
            at = next;
        }
        self.nodes[at].patterns.push(pattern);
    }

    /// Indices of the patterns whose literal prefix `value` starts with, ascending.
    fn candidates(&self, value: &[u8]) -> Vec<usize> {
        let mut found = Vec::new();
        let Some(mut node) = self.nodes.first() else {
            return found;
        };
        found.extend_from_slice(&node.patterns);
        for byte in value {
            match node.children.iter().find(|(b, _)| b == byte) {
                Some(&(_, next)) => {
                    node = &self.nodes[next];
                    found.extend_from_slice(&node.patterns);
                }
                None => break,
            }
        }
        found.sort_unstable();
        found
    }
}

#[derive(Debug)]
struct Node {
    rule: Option<Arc<Rule>>,
    /// The rule's index in `Matcher::rules` (when it has one).
    rule_id: usize,
    share_threshold: bool,
    value_to_metric: bool,
    children: Level,
}

impl Matcher {
    /// Compiles validated domains. Validation has already rejected duplicates.
    pub fn new(domains: Vec<DomainRules>) -> Matcher {
        let mut matcher = Matcher {
            source: domains.clone(),
            ..Matcher::default()
        };
        for domain in domains {
            let level = compile_level(domain.descriptors, &mut matcher.rules);
            matcher.domains.insert(domain.domain, level);
        }
        matcher
    }

    /// Whether this matcher was compiled from exactly `domains`.
    pub fn compiled_from(&self, domains: &[DomainRules]) -> bool {
        self.source == domains
    }

    /// How many domains are loaded.
    pub fn domain_count(&self) -> usize {
        self.domains.len()
    }

    /// Whether a domain is loaded.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// Every rule with a rate limit, in load order (for `/rlconfig` and metrics); a rule's
    /// index here is its [`Matched::rule_id`].
    pub fn rules(&self) -> &[Arc<Rule>] {
        &self.rules
    }

    /// Finds the rule for one descriptor, or `None` (unknown domain, no match, depth mismatch).
    pub fn lookup<'a>(
        &'a self,
        domain: &str,
        entries: &'a [(String, String)],
    ) -> Option<Matched<'a>> {
        let mut level = self.domains.get(domain)?;
        let mut levels = Vec::with_capacity(entries.len());
        let mut metric_levels = Vec::with_capacity(entries.len());
        let last = entries.len().checked_sub(1)?;
        for (depth, (key, value)) in entries.iter().enumerate() {
            let (node, bucket_value, how, pattern) = level.find(key, value)?;
            levels.push((key.as_str(), bucket_value, how));
            metric_levels.push((pattern, node.value_to_metric));
            if depth == last {
                let rule = node.rule.as_ref()?;
                return Some(Matched {
                    rule,
                    rule_id: node.rule_id,
                    levels,
                    metric_levels,
                });
            }
            level = &node.children;
        }
        None
    }
}

/// What [`Level::find`] found: the node, the value naming its bucket, how the level matched
/// and the wildcard pattern that matched (if one did).
type Found<'a> = (&'a Node, &'a str, LevelMatch, Option<&'a str>);

impl Level {
    fn find<'a>(&'a self, key: &str, value: &'a str) -> Option<Found<'a>> {
        let nodes = self.keys.get(key)?;
        if let Some(node) = nodes.exact.get(value) {
            return Some((node, value, LevelMatch::Exact, None));
        }
        let first_match = nodes
            .wildcard_index
            .candidates(value.as_bytes())
            .into_iter()
            .map(|index| &nodes.wildcards[index])
            .find(|(pattern, _)| glob_matches(pattern, value));
        if let Some((pattern, node)) = first_match {
            let shared = node.share_threshold;
            let bucket_value = if shared { pattern.as_str() } else { value };
            let how = LevelMatch::Wildcard { shared };
            return Some((node, bucket_value, how, Some(pattern.as_str())));
        }
        nodes
            .default
            .as_ref()
            .map(|node| (node, value, LevelMatch::Default, None))
    }
}

fn compile_level(descriptors: Vec<DescriptorRule>, rules: &mut Vec<Arc<Rule>>) -> Level {
    let mut level = Level::default();
    for descriptor in descriptors {
        let rule_id = rules.len();
        if let Some(rule) = &descriptor.rule {
            rules.push(Arc::clone(rule));
        }
        let node = Node {
            rule: descriptor.rule,
            rule_id,
            share_threshold: descriptor.share_threshold,
            value_to_metric: descriptor.value_to_metric,
            children: compile_level(descriptor.children, rules),
        };
        let nodes = level.keys.entry(descriptor.key).or_default();
        match descriptor.value {
            None => nodes.default = Some(node),
            Some(value) if value.contains('*') => {
                let prefix = value.split('*').next().unwrap_or_default();
                nodes
                    .wildcard_index
                    .insert(prefix.as_bytes(), nodes.wildcards.len());
                nodes.wildcards.push((value, node));
            }
            Some(value) => {
                nodes.exact.insert(value, node);
            }
        }
    }
    level
}

/// Glob match where `*` stands for any run of characters (several allowed, anywhere).
///
/// Greedy with one backtrack point: linear in practice, O(pattern x value) at worst, and
/// values are bounded by the request rules.
pub fn glob_matches(pattern: &str, value: &str) -> bool {
    let (p, v) = (pattern.as_bytes(), value.as_bytes());
    let (mut pi, mut vi) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while vi < v.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, vi));
            pi += 1;
        } else if pi < p.len() && p[pi] == v[vi] {
            pi += 1;
            vi += 1;
        } else if let Some((star_p, star_v)) = star {
            pi = star_p + 1;
            vi = star_v + 1;
            star = Some((star_p, star_v + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&b| b == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{Limit, Policy, Unit};

    fn rule(path: &str) -> Arc<Rule> {
        Arc::new(Rule {
            domain: "d".into(),
            path: path.into(),
            name: None,
            replaces: vec![],
            limit: Limit::Limited(Policy::fixed_window(1, Unit::Second)),
            sets_accounting: false,
            shadow_mode: false,
            quota_mode: false,
            detailed_metric: false,
            value_to_metric: false,
            metadata: None,
            global: false,
        })
    }

    fn node(
        key: &str,
        value: Option<&str>,
        limited: bool,
        children: Vec<DescriptorRule>,
    ) -> DescriptorRule {
        let path = match value {
            Some(v) => format!("{key}_{v}"),
            None => key.to_string(),
        };
        DescriptorRule {
            key: key.into(),
            value: value.map(Into::into),
            share_threshold: false,
            value_to_metric: false,
            rule: limited.then(|| rule(&path)),
            children,
        }
    }

    fn entries(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// The reference service's documented example: a `key` tree with exact, wildcard and
    /// default nodes and a nested level.
    fn matcher() -> Matcher {
        Matcher::new(vec![DomainRules {
            domain: "d".into(),
            descriptors: vec![
                node(
                    "key1",
                    Some("value1"),
                    false,
                    vec![
                        node("subkey1", None, true, vec![]),
                        node("subkey1", Some("sv"), true, vec![]),
                    ],
                ),
                node("key2", None, true, vec![]),
                node("key2", Some("value2"), true, vec![]),
                node("path", Some("/api/*"), true, vec![]),
                node("path", Some("/a*/x*"), true, vec![]),
                node("path", Some("/*"), true, vec![]),
                node(
                    "parent",
                    None,
                    true,
                    vec![node("child", None, true, vec![])],
                ),
            ],
        }])
    }

    fn path_of(m: &Matcher, pairs: &[(&str, &str)]) -> Option<String> {
        let entries = entries(pairs);
        m.lookup("d", &entries)
            .map(|matched| matched.rule.path.clone())
    }

    /// Request entries and the rule path they should match.
    type Case<'a> = (&'a [(&'a str, &'a str)], Option<&'a str>);

    #[test]
    fn reference_matching_table() {
        let m = matcher();
        let cases: &[Case] = &[
            (&[("key2", "value2")], Some("key2_value2")),
            (&[("key2", "other")], Some("key2")),
            (&[("key2", "")], Some("key2")),
            (&[("key1", "value1")], None),
            (&[("key1", "value1"), ("subkey1", "x")], Some("subkey1")),
            (&[("key1", "value1"), ("subkey1", "sv")], Some("subkey1_sv")),
            (&[("key1", "nope"), ("subkey1", "x")], None),
            (&[("key2", "value2"), ("extra", "x")], None),
            (&[("unknown", "x")], None),
            (&[("parent", "p")], Some("parent")),
            (&[("parent", "p"), ("child", "c")], Some("child")),
            (&[("parent", "p"), ("child", "c"), ("deeper", "x")], None),
            (&[], None),
        ];
        for (pairs, expected) in cases {
            assert_eq!(path_of(&m, pairs).as_deref(), *expected, "{pairs:?}");
        }
    }

    #[test]
    fn wildcards_match_in_file_order() {
        let m = matcher();
        assert_eq!(
            path_of(&m, &[("path", "/api/users")]).as_deref(),
            Some("path_/api/*")
        );
        assert_eq!(
            path_of(&m, &[("path", "/ab/xy")]).as_deref(),
            Some("path_/a*/x*")
        );
        assert_eq!(
            path_of(&m, &[("path", "/login")]).as_deref(),
            Some("path_/*")
        );
        assert_eq!(path_of(&m, &[("path", "login")]), None);
    }

    #[test]
    fn an_earlier_shorter_prefix_wins_over_a_later_longer_one() {
        let m = Matcher::new(vec![DomainRules {
            domain: "d".into(),
            descriptors: vec![
                node("p", Some("*x"), true, vec![]),
                node("p", Some("/*"), true, vec![]),
                node("p", Some("/api/*"), true, vec![]),
            ],
        }]);
        assert_eq!(path_of(&m, &[("p", "/api/v")]).as_deref(), Some("p_/*"));
        assert_eq!(path_of(&m, &[("p", "/api/x")]).as_deref(), Some("p_*x"));
        assert_eq!(path_of(&m, &[("p", "api")]), None);
    }

    #[test]
    fn unknown_domain_matches_nothing() {
        let m = matcher();
        assert!(m.lookup("other", &entries(&[("key2", "v")])).is_none());
        assert!(m.has_domain("d") && !m.has_domain("other"));
    }

    #[test]
    fn glob_semantics() {
        assert!(glob_matches("*", ""));
        assert!(glob_matches("a*", "a"));
        assert!(glob_matches("*b*c", "abxbc"));
        assert!(glob_matches("a**b", "ab"));
        assert!(!glob_matches("a*b", "abc"));
        assert!(!glob_matches("abc", "ab"));
        assert!(glob_matches("/api/*/v*", "/api/x/v1"));
    }

    #[test]
    fn metric_keys_follow_value_flags() {
        let mut plain = node("user", None, true, vec![]);
        let mut detailed = plain.clone();
        let mut with_value = plain.clone();
        Arc::make_mut(detailed.rule.as_mut().unwrap()).detailed_metric = true;
        with_value.value_to_metric = true;
        let entries = entries(&[("user", "alice")]);
        for (descriptor, expected) in [
            (&mut plain, "user"),
            (&mut detailed, "user_alice"),
            (&mut with_value, "user_alice"),
        ] {
            let m = Matcher::new(vec![DomainRules {
                domain: "d".into(),
                descriptors: vec![descriptor.clone()],
            }]);
            let matched = m.lookup("d", &entries).unwrap();
            assert_eq!(matched.metric_key(&entries), expected);
        }
    }

    /// The reference's per-level `value_to_metric`: each flag shows its own level's value.
    #[test]
    fn value_to_metric_shows_the_value_of_its_own_level() {
        let flagged = |mut descriptor: DescriptorRule| {
            descriptor.value_to_metric = true;
            descriptor
        };
        let subject = node("subject_id", None, true, vec![]);
        let method = flagged(node("http_method", None, false, vec![subject.clone()]));
        let mut shared = flagged(node("s", Some("s*"), false, vec![subject.clone()]));
        shared.share_threshold = true;
        let mut detailed = node("leaf", None, true, vec![]);
        Arc::make_mut(detailed.rule.as_mut().unwrap()).detailed_metric = true;
        let m = Matcher::new(vec![DomainRules {
            domain: "d".into(),
            descriptors: vec![
                node("route", Some("draw"), false, vec![method]),
                node("w", Some("x*"), false, vec![flagged(subject.clone())]),
                flagged(node("v", Some("y*"), false, vec![subject])),
                shared,
                flagged(node("k", None, false, vec![detailed])),
            ],
        }]);
        let cases: &[(&[(&str, &str)], &str)] = &[
            (
                &[
                    ("route", "draw"),
                    ("http_method", "GET"),
                    ("subject_id", "123"),
                ],
                "route_draw.http_method_GET.subject_id",
            ),
            (&[("w", "x1"), ("subject_id", "7")], "w_x*.subject_id_7"),
            (&[("w", "x1"), ("subject_id", "")], "w_x*.subject_id"),
            (&[("v", "y1"), ("subject_id", "7")], "v_y1.subject_id"),
            (&[("s", "s1"), ("subject_id", "7")], "s_s*.subject_id"),
            (&[("k", "a"), ("leaf", "b")], "k_a.leaf_b"),
            (&[("k", ""), ("leaf", "")], "k_.leaf_"),
        ];
        for (pairs, expected) in cases {
            let entries = entries(pairs);
            let matched = m.lookup("d", &entries).unwrap();
            assert_eq!(matched.metric_key(&entries), *expected, "{pairs:?}");
        }
        let plain = entries(&[("route", "draw"), ("http_method", "GET")]);
        assert!(m.lookup("d", &plain).is_none());
    }

    #[test]
    fn share_threshold_names_the_bucket_by_pattern() {
        let mut shared = node("path", Some("/api/*"), true, vec![]);
        shared.share_threshold = true;
        let m = Matcher::new(vec![DomainRules {
            domain: "d".into(),
            descriptors: vec![shared],
        }]);
        let entries = entries(&[("path", "/api/x")]);
        let matched = m.lookup("d", &entries).unwrap();
        assert_eq!(
            matched.levels,
            vec![("path", "/api/*", LevelMatch::Wildcard { shared: true })]
        );
    }
}
