//! Lines and text positions for document paths, and the unknown-key sweep.
//!
//! serde_yaml reports a location only for the first error that stops deserialization; the
//! values it produces carry no positions. This module re-reads the same text with
//! `saphyr-parser`, an event parser with marks, into a skeleton tree that keeps only mapping
//! keys, sequence items, their lines and their character ranges. `validate` then attaches a
//! line to every error by its document path, [`key_problems`] reports every mistyped or
//! repeated key at once, and `recover` uses the ranges to blank out what serde cannot read.

use std::fmt;
use std::ops::Range;

use saphyr_parser::{Event, Parser};

use super::model::Shape;

/// One step of a document path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Segment {
    /// A mapping key.
    Key(String),
    /// A sequence index.
    Index(usize),
}

/// A path into the document, displayed like `descriptors[2].rate_limit.unit`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct DocPath(Vec<Segment>);

impl DocPath {
    /// The path extended by a mapping key.
    pub fn key(&self, key: &str) -> DocPath {
        let mut segments = self.0.clone();
        segments.push(Segment::Key(key.to_owned()));
        DocPath(segments)
    }

    /// The path extended by a sequence index.
    pub fn index(&self, index: usize) -> DocPath {
        let mut segments = self.0.clone();
        segments.push(Segment::Index(index));
        DocPath(segments)
    }

    /// Whether `self` is `ancestor` or lies below it.
    pub fn starts_with(&self, ancestor: &DocPath) -> bool {
        self.0.starts_with(&ancestor.0)
    }

    /// Reads back a displayed path, as serde_yaml prints it in front of its errors. A key
    /// containing `.` or `[` does not round-trip; such a path just resolves less deep.
    pub fn parse(text: &str) -> DocPath {
        let mut segments = Vec::new();
        for part in text.split('.').filter(|part| !part.is_empty()) {
            let (key, mut indices) = part.split_once('[').unwrap_or((part, ""));
            if !key.is_empty() {
                segments.push(Segment::Key(key.to_owned()));
            }
            while let Some((index, rest)) = indices.split_once(']') {
                match index.parse() {
                    Ok(index) => segments.push(Segment::Index(index)),
                    Err(_) => return DocPath(segments),
                }
                indices = rest.strip_prefix('[').unwrap_or(rest);
            }
        }
        DocPath(segments)
    }
}

impl fmt::Display for DocPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, segment) in self.0.iter().enumerate() {
            match segment {
                Segment::Key(key) if i == 0 => f.write_str(key)?,
                Segment::Key(key) => write!(f, ".{key}")?,
                Segment::Index(index) => write!(f, "[{index}]")?,
            }
        }
        Ok(())
    }
}

/// A node of the skeleton: its first line, its characters and, for collections, its
/// children.
#[derive(Debug)]
struct Node {
    line: usize,
    /// Character range in the text, anchor and tag included. A block collection ends where
    /// the next token starts, so the range also covers trailing blank lines and comments.
    chars: Range<usize>,
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    /// A scalar or an alias: nothing below it to locate.
    Leaf,
    Seq(Vec<Node>),
    Map(Vec<Entry>),
}

/// One `key: value` of a mapping.
#[derive(Debug)]
struct Entry {
    /// Key text; empty for a non-scalar key.
    key: String,
    /// Line of the key.
    line: usize,
    /// Character range of the key.
    key_chars: Range<usize>,
    value: Node,
}

/// Where a value sits in the text: what `recover` replaces to make serde skip it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Slot {
    /// The value of a mapping entry: the characters from the end of its key (so the `:`
    /// and any anchor or tag are included) to the end of the value.
    Value(Range<usize>),
    /// A sequence item.
    Item(Range<usize>),
}

/// The skeleton of the first document of a YAML text.
#[derive(Debug, Default)]
pub struct Located {
    root: Option<Node>,
}

impl Located {
    /// Parses `yaml`. On a syntax error, or nesting deeper than serde_yaml accepts, the
    /// result is empty: serde_yaml reports that error with its own location.
    pub fn parse(yaml: &str) -> Located {
        Located {
            root: build(yaml).ok().flatten(),
        }
    }

    /// The line of `path`: the line of its last key, or the start of its last item. When
    /// the path goes past the document (a missing field), the line of the deepest existing
    /// ancestor, so an error about a missing `unit` points at its `rate_limit`.
    pub fn line(&self, path: &DocPath) -> Option<usize> {
        let mut node = self.root.as_ref()?;
        let mut line = node.line;
        for segment in &path.0 {
            let next = match (segment, &node.kind) {
                (Segment::Key(key), Kind::Map(entries)) => entries
                    .iter()
                    .find(|entry| entry.key == *key)
                    .map(|entry| (entry.line, &entry.value)),
                (Segment::Index(index), Kind::Seq(items)) => {
                    items.get(*index).map(|item| (item.line, item))
                }
                _ => None,
            };
            let Some((next_line, next_node)) = next else {
                break;
            };
            line = next_line;
            node = next_node;
        }
        Some(line)
    }

    /// The deepest existing prefix of `path` below the root, with its slot; `None` when
    /// not even the first segment exists. A path through an alias stops at the alias.
    pub fn slot(&self, path: &DocPath) -> Option<(DocPath, Slot)> {
        let mut node = self.root.as_ref()?;
        let mut found = None;
        for (depth, segment) in path.0.iter().enumerate() {
            let (slot, next) = match (segment, &node.kind) {
                (Segment::Key(key), Kind::Map(entries)) => {
                    let Some(entry) = entries.iter().find(|entry| entry.key == *key) else {
                        break;
                    };
                    let range = entry.key_chars.end..entry.value.chars.end;
                    (Slot::Value(range), &entry.value)
                }
                (Segment::Index(index), Kind::Seq(items)) => {
                    let Some(item) = items.get(*index) else {
                        break;
                    };
                    (Slot::Item(item.chars.clone()), item)
                }
                _ => break,
            };
            found = Some((DocPath(path.0[..=depth].to_vec()), slot));
            node = next;
        }
        found
    }
}

/// A key that no raw struct accepts (with a hint when it looks like a typo), or a key
/// repeated within one mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyProblem {
    /// Path of the offending key.
    pub path: DocPath,
    /// Line of the key.
    pub line: usize,
    /// Human-readable explanation.
    pub message: String,
    /// The value this key leaves unknown: the key's own when repeated (which occurrence is
    /// meant?); the field a misspelt key most likely means, when its mapping lacks that
    /// field (`uint: second` is probably the `unit`); the whole mapping for a merge key
    /// (`<<`), whose merged fields are not read.
    pub lost: Option<DocPath>,
    /// The whole entry, key to end of value.
    pub chars: Range<usize>,
}

/// Every key of the document that the raw model would reject, in document order.
///
/// The field lists come from the serde derives ([`Shape::fields`]), so this sweep and
/// `deny_unknown_fields` cannot disagree; serde stops at the first unknown or repeated key,
/// the sweep reports them all, each on its own line.
pub fn key_problems(located: &Located) -> Vec<KeyProblem> {
    let mut found = Vec::new();
    if let Some(root) = &located.root {
        sweep(root, Shape::Domain, &DocPath::default(), &mut found);
    }
    found
}

fn sweep(node: &Node, shape: Shape, path: &DocPath, found: &mut Vec<KeyProblem>) {
    let Kind::Map(entries) = &node.kind else {
        return;
    };
    let fields = shape.fields();
    for (index, entry) in entries.iter().enumerate() {
        let key = entry.key.as_str();
        let key_path = path.key(key);
        let problem = |message, lost| KeyProblem {
            path: key_path.clone(),
            line: entry.line,
            message,
            lost,
            chars: entry.key_chars.start..entry.value.chars.end,
        };
        if !fields.contains(&key) {
            let close = fields
                .iter()
                .find(|field| edit_distance(key, field) <= 2)
                .copied();
            let present = |field: &&str| entries.iter().any(|entry| entry.key == *field);
            let lost = match close {
                _ if key == "<<" => Some(path.clone()),
                Some(field) if !present(&field) => Some(path.key(field)),
                _ => None,
            };
            found.push(problem(unknown_key_message(key, close, fields), lost));
            continue;
        }
        if let Some(first) = entries[..index].iter().find(|first| first.key == key) {
            let message = format!("duplicate key `{key}` (first on line {})", first.line);
            found.push(problem(message, Some(key_path.clone())));
            continue;
        }
        match (shape.child(key), &entry.value.kind) {
            (Some((child, true)), Kind::Seq(items)) => {
                for (i, item) in items.iter().enumerate() {
                    sweep(item, child, &key_path.index(i), found);
                }
            }
            (Some((child, false)), _) => sweep(&entry.value, child, &key_path, found),
            _ => {}
        }
    }
}

fn unknown_key_message(key: &str, close: Option<&str>, fields: &[&str]) -> String {
    let expected = fields.join(", ");
    match close {
        Some(close) => {
            format!("unknown key `{key}` (did you mean `{close}`?); expected one of: {expected}")
        }
        None => format!("unknown key `{key}`; expected one of: {expected}"),
    }
}

/// Levenshtein distance, for "did you mean" hints on short keys.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitution = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substitution.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

/// A collection being built; a mapping also holds the key waiting for its value.
enum Open {
    Seq {
        line: usize,
        start: usize,
        items: Vec<Node>,
    },
    Map {
        line: usize,
        start: usize,
        entries: Vec<Entry>,
        pending: Option<(String, usize, Range<usize>)>,
    },
}

/// Nesting beyond serde_yaml's own recursion limit is an error there anyway; stopping here
/// keeps the sweep's recursion (and the tree's drop) shallow on hostile input.
const MAX_DEPTH: usize = 128;

fn build(yaml: &str) -> Result<Option<Node>, saphyr_parser::ScanError> {
    let mut stack: Vec<Open> = Vec::new();
    for event in Parser::new_from_str(yaml) {
        let (event, span) = event?;
        if stack.len() > MAX_DEPTH {
            return Ok(None);
        }
        let line = span.start.line();
        let (start, end) = (span.start.index(), span.end.index());
        let leaf = Node {
            line,
            chars: start..end,
            kind: Kind::Leaf,
        };
        let (done, key_text) = match event {
            Event::Scalar(text, ..) => (leaf, text.into_owned()),
            Event::Alias(_) => (leaf, String::new()),
            Event::SequenceStart(..) => {
                let items = Vec::new();
                stack.push(Open::Seq { line, start, items });
                continue;
            }
            Event::MappingStart(..) => {
                let (entries, pending) = (Vec::new(), None);
                stack.push(Open::Map {
                    line,
                    start,
                    entries,
                    pending,
                });
                continue;
            }
            Event::SequenceEnd | Event::MappingEnd => match stack.pop() {
                Some(Open::Seq { line, start, items }) => (
                    Node {
                        line,
                        chars: start..end,
                        kind: Kind::Seq(items),
                    },
                    String::new(),
                ),
                Some(Open::Map {
                    line,
                    start,
                    entries,
                    ..
                }) => (
                    Node {
                        line,
                        chars: start..end,
                        kind: Kind::Map(entries),
                    },
                    String::new(),
                ),
                None => continue,
            },
            // Only the first document counts: serde_yaml rejects files with more.
            Event::DocumentEnd => break,
            _ => continue,
        };
        match stack.last_mut() {
            None => return Ok(Some(done)),
            Some(Open::Seq { items, .. }) => items.push(done),
            Some(Open::Map {
                entries, pending, ..
            }) => match pending.take() {
                None => *pending = Some((key_text, done.line, done.chars)),
                Some((key, line, key_chars)) => entries.push(Entry {
                    key,
                    line,
                    key_chars,
                    value: done,
                }),
            },
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "\
domain: api
descriptors:
  - key: a
    rate_limit:
      unit: second
  - key: b
    descriptors: [{key: c, valeu: x}]
";

    fn path(segments: &[Segment]) -> DocPath {
        DocPath(segments.to_vec())
    }

    #[test]
    fn paths_display_like_the_spec() {
        let p = DocPath::default()
            .key("descriptors")
            .index(2)
            .key("rate_limit")
            .key("unit");
        assert_eq!(p.to_string(), "descriptors[2].rate_limit.unit");
    }

    #[test]
    fn lines_follow_keys_items_and_fall_back_to_ancestors() {
        let doc = Located::parse(DOC);
        let d = || DocPath::default().key("descriptors");
        assert_eq!(doc.line(&DocPath::default().key("domain")), Some(1));
        assert_eq!(doc.line(&d().index(0)), Some(3));
        assert_eq!(
            doc.line(&d().index(0).key("rate_limit").key("unit")),
            Some(5)
        );
        assert_eq!(
            doc.line(&d().index(0).key("rate_limit").key("burst")),
            Some(4)
        );
        assert_eq!(doc.line(&d().index(1).key("descriptors").index(0)), Some(7));
        assert_eq!(
            doc.line(&path(&[Segment::Key("nope".into())])),
            Some(1),
            "a missing top-level key points at the document start"
        );
    }

    #[test]
    fn sweep_finds_every_unknown_key_with_hints() {
        let yaml = "domain: x\ndescriptor: []\ndescriptors:\n  - key: a\n    rate_limit: {uint: second, zzz: 1}\n";
        let found = key_problems(&Located::parse(yaml));
        let summary: Vec<_> = found.iter().map(|u| (u.path.to_string(), u.line)).collect();
        assert_eq!(
            summary,
            [
                ("descriptor".to_string(), 2),
                ("descriptors[0].rate_limit.uint".to_string(), 5),
                ("descriptors[0].rate_limit.zzz".to_string(), 5),
            ]
        );
        assert!(found[0].message.contains("did you mean `descriptors`?"));
        assert!(found[1].message.contains("did you mean `unit`?"));
        assert!(!found[2].message.contains("did you mean"));
        assert_eq!(
            key_problems(&Located::parse(DOC))[0].path.to_string(),
            "descriptors[1].descriptors[0].valeu"
        );
    }

    #[test]
    fn sweep_finds_repeated_keys() {
        let yaml = "domain: x\ndescriptors:\n  - key: a\n    value: b\n    key: c\n";
        let found = key_problems(&Located::parse(yaml));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(
            (found[0].path.to_string(), found[0].line),
            ("descriptors[0].key".into(), 5)
        );
        assert_eq!(found[0].message, "duplicate key `key` (first on line 3)");
    }

    #[test]
    fn paths_read_back_as_serde_yaml_prints_them() {
        for text in [
            "domain",
            "descriptors[2].rate_limit.unit",
            "descriptors[0].descriptors[11]",
            "descriptors[1].rate_limit.replaces[0].name",
        ] {
            assert_eq!(DocPath::parse(text).to_string(), text);
        }
        assert_eq!(DocPath::parse(""), DocPath::default());
        assert_eq!(DocPath::parse(".").to_string(), "");
        // A path serde cannot name past some point stops there.
        assert_eq!(
            DocPath::parse("descriptors[x].key").to_string(),
            "descriptors"
        );
        let p = DocPath::parse("descriptors[0].key");
        let parent = DocPath::parse("descriptors[0]");
        assert!(p.starts_with(&parent) && p.starts_with(&p));
        assert!(!parent.starts_with(&p) && !p.starts_with(&DocPath::parse("descriptors[1]")));
    }

    #[test]
    fn slots_cover_values_from_their_key_and_whole_items() {
        let doc = Located::parse(DOC);
        let chars: Vec<char> = DOC.chars().collect();
        let text = |range: &Range<usize>| chars[range.clone()].iter().collect::<String>();
        let d = DocPath::default().key("descriptors");
        let (path, slot) = doc.slot(&d.index(1).key("descriptors").index(0)).unwrap();
        assert_eq!(path.to_string(), "descriptors[1].descriptors[0]");
        let Slot::Item(item) = slot else {
            panic!("{slot:?}")
        };
        assert_eq!(text(&item), "{key: c, valeu: x}");
        // A block value runs to the next token, trailing line break included.
        let (_, slot) = doc.slot(&d.index(0).key("rate_limit")).unwrap();
        let Slot::Value(value) = slot else {
            panic!("{slot:?}")
        };
        assert_eq!(text(&value), ":\n      unit: second\n  ");
        // Past the document: the deepest existing prefix; nothing for the root.
        let (path, _) = doc
            .slot(&d.index(0).key("rate_limit").key("burst"))
            .unwrap();
        assert_eq!(path.to_string(), "descriptors[0].rate_limit");
        assert_eq!(doc.slot(&DocPath::default().key("nope")), None);
        assert_eq!(doc.slot(&DocPath::default()), None);
    }

    #[test]
    fn problems_name_the_field_whose_value_they_leave_unknown() {
        let yaml = "domain: x\ndescriptors:\n  - key: a\n    rate_limit: {uint: second, burst: 1, brust: 2, zzz: 3, burst: 4}\n";
        let found = key_problems(&Located::parse(yaml));
        let lost: Vec<_> = found
            .iter()
            .map(|p| (p.path.to_string(), p.lost.as_ref().map(DocPath::to_string)))
            .collect();
        let rl = "descriptors[0].rate_limit";
        let at = |key: &str| format!("{rl}.{key}");
        assert_eq!(
            lost,
            [
                (at("uint"), Some(at("unit"))),
                (at("brust"), None),
                (at("zzz"), None),
                (at("burst"), Some(at("burst"))),
            ]
        );
        let chars: Vec<char> = yaml.chars().collect();
        let entry: String = chars[found[0].chars.clone()].iter().collect();
        assert_eq!(entry, "uint: second");

        let merged = "domain: x\ndescriptors:\n  - <<: {key: a}\n    value: b\n";
        let found = key_problems(&Located::parse(merged));
        assert_eq!(found.len(), 1, "{found:?}");
        let lost = found[0].lost.as_ref().map(DocPath::to_string);
        assert_eq!(lost.as_deref(), Some("descriptors[0]"));
    }

    #[test]
    fn deep_nesting_is_not_followed() {
        let yaml = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        let doc = Located::parse(&yaml);
        assert_eq!(doc.line(&DocPath::default()), None);
    }

    #[test]
    fn metadata_contents_are_not_swept() {
        let yaml =
            "domain: x\ndescriptors:\n  - key: a\n    metadata: {anything: [1, {goes: here}]}\n";
        assert!(key_problems(&Located::parse(yaml)).is_empty());
    }

    #[test]
    fn syntax_errors_leave_no_lines() {
        let doc = Located::parse("domain: [unclosed\n");
        assert_eq!(doc.line(&DocPath::default().key("domain")), None);
    }

    #[test]
    fn edit_distance_counts_single_edits() {
        assert_eq!(edit_distance("uint", "unit"), 2);
        assert_eq!(edit_distance("burts", "burst"), 2);
        assert_eq!(edit_distance("key", "key"), 0);
        assert_eq!(edit_distance("", "abc"), 3);
    }
}
