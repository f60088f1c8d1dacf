//! Line numbers for document paths, and the unknown-key sweep.
//!
//! serde_yaml reports a location only for the first error that stops deserialization; the
//! values it produces carry no positions. This module re-reads the same text with
//! `saphyr-parser`, an event parser with marks, into a skeleton tree that keeps only mapping
//! keys, sequence items and their lines. `validate` then attaches a line to every error by
//! its document path, and [`key_problems`] reports every mistyped or repeated key at once.

use std::fmt;

use saphyr_parser::{Event, Parser};

use super::model::Shape;

/// One step of a document path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// A mapping key.
    Key(String),
    /// A sequence index.
    Index(usize),
}

/// A path into the document, displayed like `descriptors[2].rate_limit.unit`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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

/// A node of the skeleton: its first line and, for collections, its children.
#[derive(Debug)]
struct Node {
    line: usize,
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    /// A scalar or an alias: nothing below it to locate.
    Leaf,
    Seq(Vec<Node>),
    /// Entries as (key text, line of the key, value). Non-scalar keys have empty text.
    Map(Vec<(String, usize, Node)>),
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
                    .find(|(k, _, _)| k == key)
                    .map(|(_, key_line, value)| (*key_line, value)),
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
    for (index, (key, line, value)) in entries.iter().enumerate() {
        let key_path = path.key(key);
        if !fields.contains(&key.as_str()) {
            found.push(KeyProblem {
                message: unknown_key_message(key, fields),
                path: key_path,
                line: *line,
            });
            continue;
        }
        if let Some((_, first_line, _)) = entries[..index].iter().find(|(k, _, _)| k == key) {
            found.push(KeyProblem {
                message: format!("duplicate key `{key}` (first on line {first_line})"),
                path: key_path,
                line: *line,
            });
            continue;
        }
        match (shape.child(key), &value.kind) {
            (Some((child, true)), Kind::Seq(items)) => {
                for (i, item) in items.iter().enumerate() {
                    sweep(item, child, &key_path.index(i), found);
                }
            }
            (Some((child, false)), _) => sweep(value, child, &key_path, found),
            _ => {}
        }
    }
}

fn unknown_key_message(key: &str, fields: &[&str]) -> String {
    let expected = fields.join(", ");
    match fields.iter().find(|field| edit_distance(key, field) <= 2) {
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
        items: Vec<Node>,
    },
    Map {
        line: usize,
        entries: Vec<(String, usize, Node)>,
        pending: Option<(String, usize)>,
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
        let leaf = Node {
            line,
            kind: Kind::Leaf,
        };
        let (done, key_text) = match event {
            Event::Scalar(text, ..) => (leaf, text.into_owned()),
            Event::Alias(_) => (leaf, String::new()),
            Event::SequenceStart(..) => {
                let items = Vec::new();
                stack.push(Open::Seq { line, items });
                continue;
            }
            Event::MappingStart(..) => {
                let (entries, pending) = (Vec::new(), None);
                stack.push(Open::Map {
                    line,
                    entries,
                    pending,
                });
                continue;
            }
            Event::SequenceEnd | Event::MappingEnd => match stack.pop() {
                Some(Open::Seq { line, items }) => (
                    Node {
                        line,
                        kind: Kind::Seq(items),
                    },
                    String::new(),
                ),
                Some(Open::Map { line, entries, .. }) => (
                    Node {
                        line,
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
                None => *pending = Some((key_text, done.line)),
                Some((key, key_line)) => entries.push((key, key_line, done)),
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
