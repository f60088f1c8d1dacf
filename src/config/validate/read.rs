//! Reading the tree by shape: which keys a mapping may have, what type each value must be,
//! and where an error points. The rules in `validate` ask for values here; every type or
//! key error is made on the spot, at the line of the node at fault.
//!
//! A value the file does not settle is [`Field::Lost`]: a wrong type, a repeated key (which
//! occurrence is meant?), or a field a misspelt key most likely stands for (`uint:` without
//! `unit:`). Rule errors about a lost value are dropped, since they would judge a value the
//! operator did not write; a repeated key's first value and a mapping with a merge key
//! (`<<`, not supported) are read for key and type errors only.
//!
//! An alias is read where it is used: its errors point at the alias. When its anchored node
//! was already read as the same thing, its key and type errors are not repeated; its rule
//! errors are, since the rules hold where the alias is. Expanding aliases is bounded (as
//! serde_yaml bounded it) so that a file of nested aliases cannot explode.

use std::collections::HashSet;

use serde_json::{Map as JsonMap, Value as Json};

use super::super::ConfigError;
use super::super::leaf;
use super::super::tree::{DocPath, Kind, NodeId, Tree};

/// Expanding aliases may visit at most this many nodes per node of the file.
const ALIAS_EXPANSION: usize = 100;

/// Nesting the walk follows, aliases included (the tree itself stops at this depth).
const MAX_DEPTH: usize = 128;

/// The mappings of a domain file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Shape {
    /// The root.
    Domain,
    /// One descriptor.
    Descriptor,
    /// A descriptor's `rate_limit`.
    RateLimit,
    /// One `replaces` entry.
    Replaces,
}

impl Shape {
    /// The keys this mapping accepts, as error messages list them.
    fn fields(self) -> &'static str {
        match self {
            Shape::Domain => "domain, descriptors",
            Shape::Descriptor => {
                "key, value, rate_limit, descriptors, shadow_mode, detailed_metric, \
                 value_to_metric, share_threshold, quota_mode, metadata"
            }
            Shape::RateLimit => {
                "unit, requests_per_unit, unlimited, name, replaces, quota_mode, algorithm, \
                 burst, unit_multiplier, on_over_limit, lockout_seconds, scope"
            }
            Shape::Replaces => "name",
        }
    }

    fn expecting(self) -> &'static str {
        match self {
            Shape::Domain => "a domain mapping with `domain` and `descriptors`",
            Shape::Descriptor => "a descriptor mapping with `key`",
            Shape::RateLimit => "a rate_limit mapping",
            Shape::Replaces => "a replaces entry `{name: ...}`",
        }
    }
}

/// What a node is read as: an anchored node read twice as the same thing reports its key
/// and type errors once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Reading {
    Map(Shape),
    List(Shape),
    Text,
    Count,
    Flag,
    Metadata,
}

/// Which errors a subtree reports, and where.
#[derive(Debug, Clone, Copy)]
pub struct Scope {
    /// Key and type errors.
    structure: bool,
    /// Rule errors.
    rules: bool,
    /// Inside an alias: the line of the alias, for every error.
    line: Option<usize>,
}

impl Scope {
    const ALL: Scope = Scope {
        structure: true,
        rules: true,
        line: None,
    };
}

/// One field of a mapping.
#[derive(Debug, Clone, Copy)]
enum Slot {
    /// Present under its own key (`repeated`: more than once).
    Here {
        key_line: usize,
        value: NodeId,
        repeated: bool,
    },
    /// Not settled by the file.
    Lost,
}

/// A field's value as the rules see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field<T> {
    /// Not in the mapping (or null).
    Absent,
    /// In the file, but not a value the rules may judge (see the module doc).
    Lost,
    /// Read.
    Is(T),
}

impl<T> Field<T> {
    /// The value, if read.
    pub fn get(&self) -> Option<&T> {
        match self {
            Field::Is(value) => Some(value),
            _ => None,
        }
    }

    /// Whether the file left this value unsettled.
    pub fn is_lost(&self) -> bool {
        matches!(self, Field::Lost)
    }
}

/// A mapping of a known shape, its keys sorted out.
#[derive(Debug)]
pub struct Map {
    /// Where the mapping is.
    pub path: DocPath,
    /// The line its path points at: its key's, or its list item's.
    line: usize,
    scope: Scope,
    fields: Vec<(&'static str, Slot)>,
}

impl Map {
    /// The line errors about the mapping itself point at.
    pub fn line(&self) -> usize {
        self.scope.line.unwrap_or(self.line)
    }

    /// The line errors about `field` point at: its key's, or the mapping's when absent.
    pub fn line_of(&self, field: &str) -> usize {
        match self.slot(field) {
            Some(Slot::Here { key_line, .. }) => self.scope.line.unwrap_or(key_line),
            _ => self.line(),
        }
    }

    fn slot(&self, field: &str) -> Option<Slot> {
        self.fields
            .iter()
            .find(|(name, _)| *name == field)
            .map(|(_, slot)| *slot)
    }

    /// Marks a present field lost, after a type error.
    fn lose(&mut self, field: &str) {
        if let Some((_, slot)) = self.fields.iter_mut().find(|(name, _)| *name == field) {
            *slot = Slot::Lost;
        }
    }
}

/// A value found under a key or in a list, alias followed.
struct Found {
    node: NodeId,
    path: DocPath,
    line: usize,
    scope: Scope,
    /// Under a repeated key: read for its errors, but not a settled value.
    repeated: bool,
}

/// The kinds of error, in the order a line lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Rank {
    Key,
    Type,
    Rule,
}

/// The errors of one file, and the state of the walk over its tree.
pub struct Reader<'a> {
    file: &'a str,
    tree: &'a Tree,
    /// Every error, its rank and its order within the rank: the position of the key or
    /// value at fault, or for rule errors the order the rules found them in.
    errors: Vec<(Rank, usize, ConfigError)>,
    /// Anchored nodes already read, and as what.
    seen: HashSet<(NodeId, Reading)>,
    /// Nodes aliases may still expand to.
    budget: usize,
    depth: usize,
}

impl<'a> Reader<'a> {
    /// A reader of `tree`, whose errors name `file`.
    pub fn new(file: &'a str, tree: &'a Tree) -> Reader<'a> {
        Reader {
            file,
            tree,
            errors: Vec::new(),
            seen: HashSet::new(),
            budget: tree.len().saturating_mul(ALIAS_EXPANSION),
            depth: 0,
        }
    }

    /// Every error found, once, in line order: within a line key errors, then type errors
    /// (each in document order), then rule errors.
    pub fn finish(mut self) -> Vec<ConfigError> {
        self.errors
            .sort_by_key(|(rank, order, error)| (error.line.unwrap_or(usize::MAX), *rank, *order));
        self.errors.into_iter().map(|(.., error)| error).collect()
    }

    /// Errors so far: a check that added none passed.
    pub fn error_count(&self) -> usize {
        self.errors.len()
    }

    fn error(&self, path: &DocPath, line: usize, message: String) -> ConfigError {
        ConfigError {
            file: self.file.to_owned(),
            line: Some(line),
            path: path.to_string(),
            message,
        }
    }

    fn type_error(&mut self, found: &Found, error: leaf::LeafError) {
        if found.scope.structure {
            self.limit_error(found, error.to_string());
        }
    }

    /// An error at `found` reported whatever the scope: a limit of the walk, which must
    /// fail the file even where key and type errors are not repeated.
    fn limit_error(&mut self, found: &Found, message: String) {
        let node = self.tree.node(found.node);
        let line = found.scope.line.unwrap_or(node.line);
        let error = self.error(&found.path, line, message);
        self.errors.push((Rank::Type, node.at, error));
    }

    /// A rule error about `map`, or about its `field`: dropped when the rules do not hold
    /// there or the field is lost.
    pub fn rule(&mut self, map: &Map, field: Option<&str>, message: impl Into<String>) {
        if !map.scope.rules {
            return;
        }
        let (path, line) = match field {
            None => (map.path.clone(), map.line),
            Some(field) => match map.slot(field) {
                Some(Slot::Here {
                    key_line,
                    repeated: false,
                    ..
                }) => (map.path.key(field), key_line),
                Some(_) => return,
                None => (map.path.key(field), map.line),
            },
        };
        let line = map.scope.line.unwrap_or(line);
        let error = self.error(&path, line, message.into());
        self.errors.push((Rank::Rule, self.errors.len(), error));
    }

    /// The node behind `node` (an alias's anchored node), in the scope it is read in;
    /// `None`, after an error, when expanding it would exceed the budget.
    fn follow(&mut self, found: Found, reading: Reading) -> Option<Found> {
        let Kind::Alias(target) = self.tree.node(found.node).kind else {
            if self.tree.node(found.node).anchored {
                self.seen.insert((found.node, reading));
            }
            return Some(found);
        };
        let size = self.tree.size(target);
        if size > self.budget {
            // Reported once, whatever the scope (the file must fail): past the budget,
            // every alias is lost.
            if self.budget > 0 {
                self.budget = 0;
                self.limit_error(&found, "repetition limit exceeded".to_owned());
            }
            return None;
        }
        self.budget -= size;
        let echo = !self.seen.insert((target, reading));
        let scope = Scope {
            structure: found.scope.structure && !echo,
            line: Some(found.scope.line.unwrap_or(found.line)),
            ..found.scope
        };
        Some(Found {
            node: target,
            scope,
            ..found
        })
    }

    /// The root mapping; `None` for an empty document (reported by the caller) or a root
    /// of another type (reported here).
    pub fn root(&mut self) -> Option<Option<Map>> {
        let root = self.tree.root?;
        if leaf::is_null(&self.tree.node(root).kind) {
            return None;
        }
        let found = Found {
            node: root,
            path: DocPath::default(),
            line: self.tree.node(root).line,
            scope: Scope::ALL,
            repeated: false,
        };
        Some(self.map(found, Shape::Domain))
    }

    /// A mapping of `shape`, every unknown or repeated key reported.
    fn map(&mut self, found: Found, shape: Shape) -> Option<Map> {
        let found = self.follow(found, Reading::Map(shape))?;
        let tree = self.tree;
        let entries = match &tree.node(found.node).kind {
            Kind::Map(entries) => entries.as_slice(),
            // An empty list item reads as an empty mapping (a descriptor without `key`).
            Kind::Scalar { text, plain: true } if text.is_empty() => &[],
            kind => {
                self.type_error(&found, leaf::invalid_type(kind, shape.expecting()));
                return None;
            }
        };
        let mut map = Map {
            path: found.path,
            line: found.line,
            scope: found.scope,
            fields: Vec::new(),
        };
        let fields = || shape.fields().split(", ");
        for (index, entry) in entries.iter().enumerate() {
            let key = tree.key_text(entry);
            let key_node = tree.node(entry.key);
            let message = match fields().find(|field| *field == key) {
                None => {
                    let close = fields().find(|field| strsim::levenshtein(key, field) <= 2);
                    let present = |field: &&str| entries.iter().any(|e| tree.key_text(e) == *field);
                    if key == "<<" {
                        map.scope.rules = false;
                    } else if let Some(field) = close.filter(|field| !present(field)) {
                        map.fields.push((field, Slot::Lost));
                    }
                    let hint = close.map(|close| format!(" (did you mean `{close}`?)"));
                    let expected = shape.fields();
                    let hint = hint.unwrap_or_default();
                    format!("unknown key `{key}`{hint}; expected one of: {expected}")
                }
                Some(field) => match entries[..index].iter().find(|e| tree.key_text(e) == key) {
                    None => {
                        let (key_line, value) = (key_node.line, entry.value);
                        let repeated = false;
                        let slot = Slot::Here {
                            key_line,
                            value,
                            repeated,
                        };
                        map.fields.push((field, slot));
                        continue;
                    }
                    Some(first) => {
                        if let Some((_, Slot::Here { repeated, .. })) =
                            map.fields.iter_mut().find(|(name, _)| *name == field)
                        {
                            *repeated = true;
                        }
                        let first = tree.node(first.key).line;
                        format!("duplicate key `{key}` (first on line {first})")
                    }
                },
            };
            if found.scope.structure {
                let line = found.scope.line.unwrap_or(key_node.line);
                let error = self.error(&map.path.key(key), line, message);
                self.errors.push((Rank::Key, key_node.at, error));
            }
        }
        Some(map)
    }

    /// The value of `field`, alias followed; `Absent` for null.
    fn value(&mut self, map: &Map, field: &str, reading: Reading) -> Field<Found> {
        let (key_line, value, repeated) = match map.slot(field) {
            None => return Field::Absent,
            Some(Slot::Lost) => return Field::Lost,
            Some(Slot::Here {
                key_line,
                value,
                repeated,
            }) => (key_line, value, repeated),
        };
        let found = Found {
            node: value,
            path: map.path.key(field),
            line: key_line,
            scope: Scope {
                rules: map.scope.rules && !repeated,
                ..map.scope
            },
            repeated,
        };
        let Some(found) = self.follow(found, reading) else {
            return Field::Lost;
        };
        if leaf::is_null(&self.tree.node(found.node).kind) {
            return if repeated { Field::Lost } else { Field::Absent };
        }
        Field::Is(found)
    }

    fn scalar<T>(
        &mut self,
        map: &mut Map,
        field: &'static str,
        reading: Reading,
        read: fn(&Kind) -> Result<T, leaf::LeafError>,
    ) -> Field<T> {
        let found = match self.value(map, field, reading) {
            Field::Is(found) => found,
            Field::Absent => return Field::Absent,
            Field::Lost => return Field::Lost,
        };
        match read(&self.tree.node(found.node).kind) {
            Ok(_) if found.repeated => Field::Lost,
            Ok(value) => Field::Is(value),
            Err(message) => {
                self.type_error(&found, message);
                map.lose(field);
                Field::Lost
            }
        }
    }

    /// A string field.
    pub fn text(&mut self, map: &mut Map, field: &'static str) -> Field<String> {
        self.scalar(map, field, Reading::Text, leaf::text)
    }

    /// A `u32` field.
    pub fn count(&mut self, map: &mut Map, field: &'static str) -> Field<u32> {
        self.scalar(map, field, Reading::Count, leaf::count)
    }

    /// A boolean field; absent is false.
    pub fn flag(&mut self, map: &mut Map, field: &'static str) -> Field<bool> {
        match self.scalar(map, field, Reading::Flag, leaf::flag) {
            Field::Absent => Field::Is(false),
            other => other,
        }
    }

    /// The mapping under `field`.
    pub fn child(&mut self, map: &mut Map, field: &'static str, shape: Shape) -> Option<Map> {
        let Field::Is(found) = self.value(map, field, Reading::Map(shape)) else {
            return None;
        };
        let child = self.map(found, shape);
        if child.is_none() {
            map.lose(field);
        }
        child
    }

    /// The mappings listed under `field`, each `None` when it is not one (reported); the
    /// index of each stays its index in the file.
    pub fn list(&mut self, map: &mut Map, field: &'static str, shape: Shape) -> Vec<Option<Map>> {
        let Field::Is(found) = self.value(map, field, Reading::List(shape)) else {
            return Vec::new();
        };
        let items = match &self.tree.node(found.node).kind {
            Kind::Seq(items) => items.clone(),
            kind => {
                self.type_error(&found, leaf::invalid_type(kind, "a sequence"));
                map.lose(field);
                return Vec::new();
            }
        };
        if self.depth >= MAX_DEPTH {
            self.limit_error(&found, "recursion limit exceeded".to_owned());
            return Vec::new();
        }
        items
            .into_iter()
            .enumerate()
            .map(|(index, item)| {
                let item = Found {
                    node: item,
                    path: found.path.index(index),
                    line: self.tree.node(item).line,
                    scope: found.scope,
                    repeated: false,
                };
                self.map(item, shape)
            })
            .collect()
    }

    /// Enters a descriptor's children (a list of mappings: two levels towards
    /// [`MAX_DEPTH`]); [`Reader::ascend`] leaves them.
    pub fn descend(&mut self) {
        self.depth += 2;
    }

    /// Leaves what [`Reader::descend`] entered.
    pub fn ascend(&mut self) {
        self.depth -= 2;
    }

    /// The free-form mapping under `field`, as JSON.
    pub fn metadata(
        &mut self,
        map: &mut Map,
        field: &'static str,
    ) -> Option<JsonMap<String, Json>> {
        let Field::Is(found) = self.value(map, field, Reading::Metadata) else {
            return None;
        };
        if !matches!(self.tree.node(found.node).kind, Kind::Map(_)) {
            let message = leaf::invalid_type(&self.tree.node(found.node).kind, "a YAML mapping");
            self.type_error(&found, message);
            map.lose(field);
            return None;
        }
        match self.json(found) {
            Some(Json::Object(object)) => Some(object),
            _ => {
                map.lose(field);
                None
            }
        }
    }

    /// Any node as JSON; `None` after reporting what JSON cannot hold.
    fn json(&mut self, found: Found) -> Option<Json> {
        let found = self.follow(found, Reading::Metadata)?;
        let tree = self.tree;
        if self.depth >= MAX_DEPTH {
            self.limit_error(&found, "recursion limit exceeded".to_owned());
            return None;
        }
        let child = |node: NodeId, path: DocPath| Found {
            node,
            path,
            line: tree.node(node).line,
            scope: found.scope,
            repeated: false,
        };
        self.depth += 1;
        let json = match &tree.node(found.node).kind {
            Kind::Scalar { text, plain } => leaf::json(text, *plain)
                .map_err(|message| self.type_error(&found, message))
                .ok(),
            Kind::Seq(items) => {
                let items: Vec<_> = items
                    .iter()
                    .enumerate()
                    .map(|(index, &item)| self.json(child(item, found.path.index(index))))
                    .collect();
                items
                    .into_iter()
                    .collect::<Option<Vec<_>>>()
                    .map(Json::Array)
            }
            Kind::Map(entries) => {
                let mut keys = Vec::with_capacity(entries.len());
                let mut object = Some(JsonMap::new());
                for entry in entries {
                    let key = self.json(child(entry.key, found.path.clone()));
                    let Some(key) = key else {
                        object = None;
                        continue;
                    };
                    if keys.contains(&key) {
                        self.type_error(&found, leaf::duplicate_entry(&key));
                        object = None;
                        break;
                    }
                    let name = leaf::json_key(&key);
                    keys.push(key);
                    let value = self.json(child(entry.value, found.path.key(&name)));
                    if let (Some(object), Some(value)) = (&mut object, value) {
                        object.insert(name, value);
                    } else {
                        object = None;
                    }
                }
                object.map(Json::Object)
            }
            Kind::Alias(_) => None,
        };
        self.depth -= 1;
        json
    }
}
