//! One parse of a YAML text into a tree whose every node knows its line.
//!
//! `saphyr-parser` reads the text into events with marks; this module stacks them into an
//! arena of nodes (scalars keep their text and whether they were plain, mappings keep their
//! entries in order, aliases point at their anchored node). The validating walk reads the
//! tree once and builds each error from the line of the node at fault. Nodes are only
//! referenced by index, so a hostile file can neither recurse the drop nor loop an alias.

use std::fmt;

use saphyr_parser::{Event, Parser, ScalarStyle};

/// Index of a node in its [`Tree`].
pub type NodeId = usize;

/// Collections nested deeper than this are refused, as serde_yaml refused them: it keeps
/// the walk's recursion shallow on hostile input.
const MAX_DEPTH: usize = 128;

/// The first document of a YAML text.
#[derive(Debug, Default)]
pub struct Tree {
    nodes: Vec<Node>,
    /// `None` for a text without a document (empty, or only comments).
    pub root: Option<NodeId>,
}

/// One node and where it starts.
#[derive(Debug)]
pub struct Node {
    /// 1-based line of the node's first character.
    pub line: usize,
    /// Character index of the node's first character: orders errors within a line.
    pub at: usize,
    /// Whether an anchor names this node (aliases may read it again).
    pub anchored: bool,
    /// The first node of this node's subtree: nodes are stored children first, so a
    /// subtree is the run `first..=id`.
    first: NodeId,
    /// What the node holds.
    pub kind: Kind,
}

/// What a node holds.
#[derive(Debug)]
pub enum Kind {
    /// A scalar's text; `plain` when unquoted and not a block scalar (only plain scalars are
    /// read as null, booleans or numbers).
    Scalar {
        /// The text, escapes resolved.
        text: String,
        /// Unquoted, not `|` or `>`.
        plain: bool,
    },
    /// Items in order.
    Seq(Vec<NodeId>),
    /// Entries in order, repeated keys included.
    Map(Vec<Entry>),
    /// An alias of an anchored node (never itself an alias).
    Alias(NodeId),
}

/// One `key: value` of a mapping.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    /// The key node (usually a scalar).
    pub key: NodeId,
    /// The value node.
    pub value: NodeId,
}

/// Why a text has no tree: the first problem, which hides everything after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntaxError {
    /// 1-based line, when the parser names one.
    pub line: Option<usize>,
    /// What is wrong.
    pub message: String,
}

/// A collection being built: a mapping's children alternate key, value.
struct Open {
    line: usize,
    at: usize,
    first: NodeId,
    anchor: usize,
    is_map: bool,
    children: Vec<NodeId>,
}

impl Tree {
    /// Parses the first document of `yaml`.
    ///
    /// # Errors
    /// A syntax error (with the parser's line), a second document, nesting deeper than
    /// [`MAX_DEPTH`], or an alias inside the node it names.
    pub fn parse(yaml: &str) -> Result<Tree, SyntaxError> {
        let mut tree = Tree::default();
        let mut stack: Vec<Open> = Vec::new();
        // Anchor id -> its finished node (saphyr numbers anchors from 1).
        let mut anchors: Vec<Option<NodeId>> = Vec::new();
        let mut documents = 0;
        // The text by character, for the rare block scalar (see `block_header`).
        let mut chars: Option<Vec<char>> = None;
        for event in Parser::new_from_str(yaml) {
            let (event, span) = event.map_err(|err| SyntaxError {
                line: Some(err.marker().line()),
                message: err.info().to_owned(),
            })?;
            let (mut line, mut at) = (span.start.line(), span.start.index());
            let (kind, anchor) = match event {
                Event::DocumentStart(_) => {
                    documents += 1;
                    if documents > 1 {
                        return Err(SyntaxError {
                            line: Some(line),
                            message: "deserializing from YAML containing more than one \
                                      document is not supported"
                                .to_owned(),
                        });
                    }
                    continue;
                }
                Event::Scalar(text, style, anchor, _tag) => {
                    if matches!(style, ScalarStyle::Literal | ScalarStyle::Folded) {
                        let chars = chars.get_or_insert_with(|| yaml.chars().collect());
                        (line, at) = block_header(chars, line, at);
                    }
                    let plain = style == ScalarStyle::Plain;
                    let text = text.into_owned();
                    (Kind::Scalar { text, plain }, anchor)
                }
                Event::Alias(anchor) => match anchors.get(anchor).copied().flatten() {
                    Some(target) => (Kind::Alias(target), 0),
                    None => {
                        return Err(SyntaxError {
                            line: Some(line),
                            message: "an alias inside the node its anchor names is not \
                                      supported"
                                .to_owned(),
                        });
                    }
                },
                Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                    if stack.len() >= MAX_DEPTH {
                        return Err(SyntaxError {
                            line: Some(line),
                            message: "recursion limit exceeded".to_owned(),
                        });
                    }
                    stack.push(Open {
                        line,
                        at,
                        first: tree.nodes.len(),
                        anchor,
                        is_map: matches!(event, Event::MappingStart(..)),
                        children: Vec::new(),
                    });
                    continue;
                }
                Event::SequenceEnd | Event::MappingEnd => {
                    let Some(open) = stack.pop() else { continue };
                    let kind = if open.is_map {
                        let pairs = open.children.chunks_exact(2);
                        let entry = |pair: &[NodeId]| Entry {
                            key: pair[0],
                            value: pair[1],
                        };
                        Kind::Map(pairs.map(entry).collect())
                    } else {
                        Kind::Seq(open.children)
                    };
                    let id = tree.push(open.line, open.at, open.first, open.anchor, kind);
                    tree.attach(&mut stack, &mut anchors, id, open.anchor);
                    continue;
                }
                _ => continue,
            };
            let id = tree.push(line, at, tree.nodes.len(), anchor, kind);
            tree.attach(&mut stack, &mut anchors, id, anchor);
        }
        Ok(tree)
    }

    fn push(&mut self, line: usize, at: usize, first: NodeId, anchor: usize, kind: Kind) -> NodeId {
        self.nodes.push(Node {
            line,
            at,
            anchored: anchor > 0,
            first,
            kind,
        });
        self.nodes.len() - 1
    }

    /// Hands a finished node to its parent (or makes it the root) and records its anchor.
    fn attach(
        &mut self,
        stack: &mut [Open],
        anchors: &mut Vec<Option<NodeId>>,
        id: NodeId,
        anchor: usize,
    ) {
        if anchor > 0 {
            if anchors.len() <= anchor {
                anchors.resize(anchor + 1, None);
            }
            anchors[anchor] = Some(id);
        }
        match stack.last_mut() {
            Some(open) => open.children.push(id),
            None => self.root = self.root.or(Some(id)),
        }
    }

    /// The node `id`.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id]
    }

    /// Number of nodes: the unit of the alias-expansion budget.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Nodes in the subtree of `id`, aliases counted as one.
    pub fn size(&self, id: NodeId) -> usize {
        id + 1 - self.nodes[id].first
    }

    /// The text of a scalar key; empty for any other key.
    pub fn key_text(&self, entry: &Entry) -> &str {
        match &self.nodes[entry.key].kind {
            Kind::Scalar { text, .. } => text,
            _ => "",
        }
    }
}

/// The line and position of a block scalar's `|` or `>`: the parser marks its content,
/// which starts on a later line; errors point where the value is written.
fn block_header(chars: &[char], line: usize, at: usize) -> (usize, usize) {
    let before = &chars[..at.min(chars.len())];
    match before.iter().rposition(|c| matches!(c, '|' | '>')) {
        Some(header) => {
            let breaks = before[header..].iter().filter(|&&c| c == '\n').count();
            (line.saturating_sub(breaks).max(1), header)
        }
        None => (line, at),
    }
}

/// A path into the document, displayed like `descriptors[2].rate_limit.unit`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DocPath(String);

impl DocPath {
    /// The path extended by a mapping key.
    pub fn key(&self, key: &str) -> DocPath {
        match self.0.as_str() {
            "" => DocPath(key.to_owned()),
            path => DocPath(format!("{path}.{key}")),
        }
    }

    /// The path extended by a sequence index.
    pub fn index(&self, index: usize) -> DocPath {
        DocPath(format!("{}[{index}]", self.0))
    }
}

impl fmt::Display for DocPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root_entries(tree: &Tree) -> Vec<(String, usize)> {
        let Kind::Map(entries) = &tree.node(tree.root.unwrap()).kind else {
            panic!("not a mapping")
        };
        entries
            .iter()
            .map(|entry| {
                let value = tree.node(entry.value);
                (tree.key_text(entry).to_owned(), value.line)
            })
            .collect()
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
    fn nodes_keep_lines_text_and_style() {
        let tree = Tree::parse("# c\ndomain: api\nvalue: '1.10'\nlist:\n  - a\n").unwrap();
        assert_eq!(
            root_entries(&tree),
            [
                ("domain".to_owned(), 2),
                ("value".to_owned(), 3),
                ("list".to_owned(), 5)
            ]
        );
        let Kind::Map(entries) = &tree.node(tree.root.unwrap()).kind else {
            unreachable!()
        };
        let Kind::Scalar { text, plain } = &tree.node(entries[1].value).kind else {
            panic!("not a scalar")
        };
        assert_eq!((text.as_str(), *plain), ("1.10", false));
    }

    #[test]
    fn aliases_point_at_their_anchor() {
        let tree = Tree::parse("a: &x {k: v}\nb: *x\n").unwrap();
        let Kind::Map(entries) = &tree.node(tree.root.unwrap()).kind else {
            unreachable!()
        };
        assert!(tree.node(entries[0].value).anchored);
        let Kind::Alias(target) = tree.node(entries[1].value).kind else {
            panic!("not an alias")
        };
        assert_eq!(target, entries[0].value);
        assert_eq!(tree.size(target), 3);
    }

    #[test]
    fn what_cannot_be_read_is_one_error_with_its_line() {
        let err = Tree::parse("domain: [unclosed\n").unwrap_err();
        assert!(err.line.is_some(), "{err:?}");
        let err = Tree::parse("a: 1\n---\nb: 2\n").unwrap_err();
        assert_eq!(err.line, Some(2));
        assert!(err.message.contains("more than one document"));
        let err = Tree::parse("a: &x [*x]\n").unwrap_err();
        assert_eq!(err.line, Some(1));
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        let err = Tree::parse(&deep).unwrap_err();
        assert_eq!(err.message, "recursion limit exceeded");
        assert!(Tree::parse("# nothing\n").unwrap().root.is_none());
    }
}
