//! Reading as much of a broken file as serde can, so that one bad key or value does not
//! hide the file's other errors.
//!
//! serde stops at the first unknown key or wrong type. Rather than rebuild the raw model by
//! hand, this module edits the *text* until serde accepts it, and deserializes that:
//!
//! 1. Every entry the key sweep reported (unknown or repeated key) is blanked out.
//! 2. serde reads the result. Each error it still stops at (a wrong type, or a list entry
//!    that is not a mapping) is reported as serde words it, at its line; the value at the
//!    error's path is then replaced by `~` (a mapping value: every field is optional) or an
//!    item by `{}` (list items are mappings), and serde reads again. One round per error,
//!    so every independent wrong value is reported, and a bad descriptor costs its
//!    siblings nothing.
//! 3. The [`RawDomain`] serde finally accepts is validated like any other, and the paths
//!    whose values were lost are returned as [`Unreadable`]: `validate` skips checks that
//!    depend on them (a dropped `algorithm: [x]` must not make a `burst` look misplaced on
//!    the default fixed_window) and drops errors at or below them (a dropped descriptor is
//!    not also "missing `key`").
//!
//! Editing text rather than a `serde_yaml::Value` keeps every scalar exactly as serde
//! would read it from the original (`value: 1.10` stays the text `1.10`; a `Value` turns it
//! into the float 1.1), so a file with errors is validated with the same semantics as a
//! clean one. Blanked characters become spaces and line breaks are kept, so the text keeps
//! its lines and its indentation and serde's line numbers stay right.
//!
//! Syntax errors, a second document and too deep nesting come first and stop everything:
//! nothing below them can be located. Reading also stops, with the errors found so far,
//! after [`MAX_ROUNDS`] rounds, or when an edit does not take or leaves text that no longer
//! parses (YAML corner cases: a list item that is a block scalar stays a string, an
//! anchored one leaves its aliases dangling); the file's rule checks then wait until those
//! errors are fixed. Errors an edit causes are never reported.

use std::collections::{BTreeMap, HashSet};
use std::ops::Range;

use serde::de::IgnoredAny;

use super::located::{DocPath, KeyProblem, Located, Slot};
use super::model::RawDomain;
use super::{ConfigError, from_serde};

/// At most this many wrong values are repaired per file; each round re-reads the text.
const MAX_ROUNDS: usize = 100;

/// The paths of values present in the file but lost to an error already reported.
#[derive(Debug, Default)]
pub struct Unreadable(HashSet<DocPath>);

impl Unreadable {
    fn insert(&mut self, path: DocPath) {
        self.0.insert(path);
    }

    /// Whether `path` itself was lost.
    pub fn contains(&self, path: &DocPath) -> bool {
        self.0.contains(path)
    }

    /// Whether `path` or one of its ancestors was lost.
    pub fn covers(&self, path: &DocPath) -> bool {
        self.0.iter().any(|lost| path.starts_with(lost))
    }
}

/// What serde could read of one file.
#[derive(Debug, Default)]
pub struct Read {
    /// The raw model, `Some(None)` for an empty document; `None` when reading stopped.
    pub raw: Option<Option<RawDomain>>,
    /// serde's errors, in the order met.
    pub errors: Vec<ConfigError>,
    /// Values that could not be read, for `validate`.
    pub unreadable: Unreadable,
}

/// Reads `yaml` into the raw model past the `problems` of the key sweep and past every
/// wrong value, reporting each of the latter once.
pub fn read(file: &str, yaml: &str, located: &Located, problems: &[KeyProblem]) -> Read {
    let mut read = Read::default();
    if let Err(err) = serde_yaml::from_str::<IgnoredAny>(yaml) {
        read.errors.push(from_serde(file, &err));
        return read;
    }
    let mut text = Patch::new(yaml);
    for problem in problems {
        text.remove_entry(problem.chars.clone());
        if let Some(lost) = &problem.lost {
            read.unreadable.insert(lost.clone());
        }
    }
    let mut repaired = HashSet::new();
    for _ in 0..MAX_ROUNDS {
        let patched = text.apply();
        let err = match serde_yaml::from_str::<Option<RawDomain>>(&patched) {
            Ok(raw) => {
                read.raw = Some(raw);
                return read;
            }
            Err(err) => err,
        };
        let error = from_serde(file, &err);
        match located.slot(&DocPath::parse(&error.path)) {
            // The repair did not take (the value is still read as text): the error was
            // reported before the edit.
            Some((path, _)) if repaired.contains(&path) => return read,
            Some((path, slot)) => {
                let replaced = match slot {
                    Slot::Value(chars) => text.replace(chars, ": ~"),
                    Slot::Item(chars) => text.replace(chars, "{}"),
                };
                read.errors.push(error);
                if !replaced {
                    return read;
                }
                read.unreadable.insert(path.clone());
                repaired.insert(path);
            }
            // Nothing to repair: report the error unless an edit caused it.
            None => {
                if text.is_unchanged() || serde_yaml::from_str::<IgnoredAny>(&patched).is_ok() {
                    read.errors.push(error);
                }
                return read;
            }
        }
    }
    read
}

/// Edits of a text that keep every line break where it was.
struct Patch {
    chars: Vec<char>,
    /// Non-overlapping edits: start -> (end, replacement).
    edits: BTreeMap<usize, (usize, &'static str)>,
}

impl Patch {
    fn new(text: &str) -> Patch {
        Patch {
            chars: text.chars().collect(),
            edits: BTreeMap::new(),
        }
    }

    fn is_unchanged(&self) -> bool {
        self.edits.is_empty()
    }

    /// Blanks a mapping entry, with the `,` after it in a flow mapping: `{a: 1, b: 2}`
    /// loses `b: 2` as `{a: 1,     }`, and `a: 1` as `{      b: 2}` (a leading `,` would not
    /// parse; a trailing one does). A `,` cannot follow an entry in block style.
    fn remove_entry(&mut self, chars: Range<usize>) {
        let mut end = chars.end;
        let after = self.chars[end..].iter().position(|c| !c.is_whitespace());
        if let Some(skip) = after.filter(|&skip| self.chars[end + skip] == ',') {
            end += skip + 1;
        }
        self.replace(chars.start..end, "");
    }

    /// Replaces `chars` by `with`; false, changing nothing, when `chars` is empty, lies
    /// within an earlier edit or overlaps one only in part (edits must nest or be disjoint:
    /// an implicit null's span can reach past its flow mapping's `}`). An earlier edit
    /// within `chars` is superseded.
    fn replace(&mut self, chars: Range<usize>, with: &'static str) -> bool {
        let within = |start: usize, end: usize| chars.start <= start && end <= chars.end;
        let clashes = self.edits.iter().any(|(&start, &(end, _))| {
            let overlaps = start < chars.end && chars.start < end;
            overlaps && !within(start, end)
        });
        if chars.is_empty() || clashes {
            return false;
        }
        self.edits.retain(|&start, (end, _)| !within(start, *end));
        self.edits.insert(chars.start, (chars.end, with));
        true
    }

    /// The edited text. An edit writes its replacement over the start of its range and
    /// turns the rest into spaces, keeping line breaks; a replacement longer than the rest
    /// of its first line pushes only that line's remainder to the right.
    fn apply(&self) -> String {
        let is_break = |c: char| c == '\n' || c == '\r';
        let mut out = String::with_capacity(self.chars.len() + 2 * self.edits.len());
        let mut at = 0;
        for (&start, &(end, with)) in &self.edits {
            out.extend(&self.chars[at..start]);
            out.push_str(with);
            let range = &self.chars[start..end];
            let first_line = range
                .iter()
                .position(|&c| is_break(c))
                .unwrap_or(range.len());
            let pad = first_line.saturating_sub(with.chars().count());
            out.extend(std::iter::repeat_n(' ', pad));
            out.extend(
                range[first_line..]
                    .iter()
                    .map(|&c| if is_break(c) { c } else { ' ' }),
            );
            at = end;
        }
        out.extend(&self.chars[at..]);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn patched(text: &str, edits: &[(Range<usize>, &'static str)]) -> String {
        let mut patch = Patch::new(text);
        for (chars, with) in edits {
            patch.replace(chars.clone(), with);
        }
        patch.apply()
    }

    #[test]
    fn edits_keep_lines_and_indentation() {
        let text = "a:\n  - x\n  - y\nb: 1\n";
        // The value of `a` (from the end of the key to the start of `b`).
        assert_eq!(
            patched(text, &[(1..15, ": ~")]),
            "a: ~\n     \n     \nb: 1\n"
        );
        // An item, replaced in place.
        assert_eq!(patched(text, &[(7..8, "{}")]), "a:\n  - {}\n  - y\nb: 1\n");
        assert_eq!(patched("k: [1, 22]", &[(1..10, ": ~")]), "k: ~      ");
    }

    #[test]
    fn entries_in_flow_mappings_take_their_comma() {
        let remove = |text: &str, chars: Range<usize>| {
            let mut patch = Patch::new(text);
            patch.remove_entry(chars);
            patch.apply()
        };
        assert_eq!(remove("{a: 1, b: 2}", 1..5), "{      b: 2}");
        assert_eq!(remove("{a: 1, b: 2}", 7..11), "{a: 1,     }");
        assert_eq!(remove("a: 1\nb: 2\n", 0..4), "    \nb: 2\n");
        for text in ["{      b: 2}", "{a: 1,     }"] {
            serde_yaml::from_str::<serde_yaml::Value>(text).unwrap();
        }
    }

    #[test]
    fn an_edit_inside_an_earlier_one_is_refused_and_an_enclosing_one_wins() {
        let mut patch = Patch::new("k: {a: 1, b: 2}");
        assert!(patch.replace(10..14, ""));
        assert!(patch.replace(1..15, ": ~"));
        assert!(!patch.replace(4..8, ""));
        assert!(!patch.replace(3..3, "{}"));
        assert_eq!(patch.apply(), "k: ~           ");
    }

    #[test]
    fn an_edit_overlapping_an_earlier_one_in_part_is_refused() {
        // Found by fuzzing: both orders once left overlapping edits, and `apply` panicked.
        let mut patch = Patch::new("k: [{r},{}]");
        assert!(patch.replace(5..9, ""));
        assert!(!patch.replace(4..7, "{}"));
        assert!(!patch.replace(8..10, "{}"));
        assert_eq!(patch.apply(), "k: [{    }]");
    }

    #[test]
    fn repairs_are_bounded() {
        let bad_items = |n: usize| format!("domain: d\ndescriptors:\n{}", "  - 1\n".repeat(n));
        let yaml = bad_items(MAX_ROUNDS + 50);
        let bounded = read("t.yaml", &yaml, &Located::parse(&yaml), &[]);
        assert_eq!(bounded.errors.len(), MAX_ROUNDS);
        assert_eq!(bounded.errors[MAX_ROUNDS - 1].line, Some(MAX_ROUNDS + 2));
        assert!(bounded.raw.is_none(), "checks wait for the fixes");
        // Within the bound, the file is read in full.
        let yaml = bad_items(MAX_ROUNDS - 1);
        let full = read("t.yaml", &yaml, &Located::parse(&yaml), &[]);
        assert_eq!(full.errors.len(), MAX_ROUNDS - 1);
        let raw = full.raw.flatten().unwrap();
        assert_eq!(raw.descriptors.unwrap().len(), MAX_ROUNDS - 1);
    }

    #[test]
    fn multibyte_text_is_edited_by_character() {
        assert_eq!(
            patched("é: [ü]\nx: 1\n", &[(1..6, ": ~")]),
            "é: ~  \nx: 1\n"
        );
    }
}
