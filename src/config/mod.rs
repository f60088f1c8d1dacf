//! Loading domain files: read -> parse -> validate, reporting every error with its place.
//!
//! 1. [`load_dir`] reads every `*.yaml` / `*.yml` file directly in a directory (errors name
//!    the path). Dotfiles are skipped, so a Kubernetes ConfigMap mount (`..data/` plus
//!    `name.yaml -> ..data/name.yaml` links) loads each file once, through its link.
//!    [`load_sources`] does the same for files already in memory.
//! 2. [`parse_domain`] parses one YAML text once, with `saphyr-parser`, into a tree whose
//!    nodes know their lines (`tree`); a syntax error stops there, with its line.
//! 3. One walk over that tree (`validate`) builds [`DomainRules`] and makes every error
//!    where it finds it, with its line: unknown or repeated keys, wrong types (worded as
//!    serde words them, `leaf`), and rule violations. One bad key or value never hides the
//!    rest of the file's errors.
//!
//! A file's errors come in line order.
//!
//! No serde deserializer reads the files: the walk needs every error of a file with its
//! position, where a derived `Deserialize` stops at the first and keeps no positions.
//! serde itself only words the type errors (`serde::de::Unexpected`), so they read as they
//! always have; serde_yaml (deprecated upstream) is not used.
//!
//! Choices where the reference format or docs/config.md leaves room (see also `validate`):
//! - Scalars are read as the reference's YAML 1.1 parser reads them: `value: 1.10` is the
//!   text `1.10`, and `yes`/`no`/`on`/`off` are booleans.
//! - An empty `value` is no value (the key-only node), and an absent `requests_per_unit`
//!   is 0, both as in the reference.
//! - Duplicates compare the reference's composite key `key_value`, so `key: a_b` and
//!   `key: a, value: b` at one level clash, as they do there (they would share a rule path).
//! - Every unknown or repeated key and every wrong-typed value is reported, and the rest of
//!   the file is still validated. Checks that need a lost value are skipped, not run on its
//!   default; a misspelt key whose field is absent (`uint:` without `unit:`) counts as that
//!   field, so it is not also reported missing. A repeated key's value counts as lost.
//! - Tags (`!!str`) are not interpreted; an alias reads as its anchored node, and its errors
//!   point at the alias.
//! - A domain defined twice is kept from the first file in path order; each later file
//!   gets the error, naming the first. A file's `domain` counts whenever it can be read,
//!   however broken the rest of that file is.
//! - Extensions are matched case-insensitively (`.YAML` loads); a directory named
//!   `x.yaml` is skipped; a dangling `x.yaml` link is an error, never a silent skip.
//! - Not supported: merge keys (`<<`, reported as an unknown key) and files with more than
//!   one YAML document.

mod accounting;
mod leaf;
mod tree;
mod validate;

use std::collections::HashMap;
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use crate::matcher::DomainRules;
use tree::Tree;
use validate::Walked;

pub use accounting::{RuleSource, apply_default_accounting, default_accounting};
pub use validate::SLIDING_LOG_MAX_REQUESTS;

/// One problem in the configuration, located as precisely as known.
#[derive(Debug, Clone, PartialEq, Eq, Hash, thiserror::Error)]
pub struct ConfigError {
    /// The file (or directory) at fault, as given to the loader.
    pub file: String,
    /// 1-based line in the file, when known.
    pub line: Option<usize>,
    /// Path in the document such as `descriptors[2].rate_limit.unit`; empty for the file
    /// as a whole.
    pub path: String,
    /// What is wrong, and where useful, what is expected.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if !self.path.is_empty() {
            write!(f, ": {}", self.path)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Every error of a load, in file order and, within a file, in document order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

/// A valid configuration directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedConfig {
    /// One entry per file, sorted by domain name.
    pub domains: Vec<DomainRules>,
    /// The files loaded, sorted by path.
    pub files: Vec<PathBuf>,
}

impl LoadedConfig {
    /// Number of descriptors with a `rate_limit` (unlimited ones included).
    pub fn rule_count(&self) -> usize {
        fn count(descriptors: &[crate::matcher::DescriptorRule]) -> usize {
            descriptors
                .iter()
                .map(|d| usize::from(d.rule.is_some()) + count(&d.children))
                .sum()
        }
        self.domains.iter().map(|d| count(&d.descriptors)).sum()
    }
}

/// Loads and validates every domain file directly in `dir`.
///
/// An empty directory is valid and has no domains.
///
/// # Errors
/// Every problem of every file: an unreadable directory or file, YAML syntax, unknown keys,
/// wrong types, invalid rules, and a domain defined by more than one file (reported on each
/// later file, naming the first).
pub fn load_dir(dir: &Path) -> Result<LoadedConfig, ConfigErrors> {
    let (paths, errors) = list_files(dir);
    let files = paths
        .into_iter()
        .map(|path| {
            let read = fs::read(&path);
            (path, read)
        })
        .collect();
    load_files(files, errors)
}

/// Loads and validates domain files already in memory, exactly as [`load_dir`] does once it
/// has read them; each path only labels its file's errors. Files are taken in path order.
/// The fuzz targets start here, so that no iteration touches the filesystem.
///
/// # Errors
/// As for [`load_dir`], except that nothing is read.
pub fn load_sources(sources: Vec<(PathBuf, Vec<u8>)>) -> Result<LoadedConfig, ConfigErrors> {
    let mut files: Vec<_> = sources
        .into_iter()
        .map(|(path, bytes)| (path, Ok(bytes)))
        .collect();
    files.sort_by(|a, b| a.0.cmp(&b.0));
    load_files(files, Vec::new())
}

/// Parses and validates files in the order given; `errors` are those found while listing.
fn load_files(
    files: Vec<(PathBuf, std::io::Result<Vec<u8>>)>,
    mut errors: Vec<ConfigError>,
) -> Result<LoadedConfig, ConfigErrors> {
    let mut domains = Vec::new();
    let mut owners: HashMap<String, PathBuf> = HashMap::new();
    let mut paths = Vec::with_capacity(files.len());
    for (path, read) in files {
        let file = path.display().to_string();
        paths.push(path.clone());
        let text = match read.map(String::from_utf8) {
            Ok(Ok(text)) => text,
            Ok(Err(err)) => {
                let bytes = err.as_bytes();
                let valid = err.utf8_error().valid_up_to();
                let line = bytes[..valid].iter().filter(|&&b| b == b'\n').count() + 1;
                errors.push(ConfigError {
                    line: Some(line),
                    ..whole_file(&file, "file is not valid UTF-8".to_owned())
                });
                continue;
            }
            Err(err) => {
                errors.push(whole_file(&file, format!("cannot read file: {err}")));
                continue;
            }
        };
        let parsed = parse(&file, &text);
        // Checked for invalid files too, so that fixing them reveals nothing new.
        if let Some((domain, line)) = &parsed.domain {
            match owners.get(domain) {
                Some(first) => errors.push(ConfigError {
                    file: file.clone(),
                    line: *line,
                    path: "domain".to_owned(),
                    message: format!(
                        "duplicate domain `{domain}`: {} already defines it",
                        first.display()
                    ),
                }),
                None => {
                    owners.insert(domain.clone(), path.clone());
                }
            }
        }
        match parsed.rules {
            Ok(rules) => domains.push(rules),
            Err(mut file_errors) => errors.append(&mut file_errors),
        }
    }
    if !errors.is_empty() {
        // Stable: within a file, errors stay in document order.
        errors.sort_by(|a, b| a.file.cmp(&b.file));
        return Err(ConfigErrors(errors));
    }
    domains.sort_by(|a, b| a.domain.cmp(&b.domain));
    Ok(LoadedConfig {
        domains,
        files: paths,
    })
}

/// Parses and validates one domain file's text; `file` only labels the errors.
///
/// # Errors
/// Every problem found in the text (see [`load_dir`]).
pub fn parse_domain(file: &str, yaml: &str) -> Result<DomainRules, Vec<ConfigError>> {
    parse(file, yaml).rules
}

/// One parse, one walk: a text that parses is validated in full; one that does not has
/// the parser's error alone, since nothing after it can be located.
fn parse(file: &str, yaml: &str) -> Walked {
    match Tree::parse(yaml) {
        Ok(tree) => validate::domain(file, &tree),
        Err(err) => Walked {
            domain: None,
            rules: Err(vec![ConfigError {
                line: err.line,
                ..whole_file(file, err.message)
            }]),
        },
    }
}

fn whole_file(file: &str, message: String) -> ConfigError {
    ConfigError {
        file: file.to_owned(),
        line: None,
        path: String::new(),
        message,
    }
}

/// The domain files of `dir`, sorted, and the entries that could not be inspected.
fn list_files(dir: &Path) -> (Vec<PathBuf>, Vec<ConfigError>) {
    let dir_name = dir.display().to_string();
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) => {
            let message = format!("cannot read config directory: {err}");
            return (Vec::new(), vec![whole_file(&dir_name, message)]);
        }
    };
    let mut files = Vec::new();
    let mut errors = Vec::new();
    for entry in entries {
        let path = match entry {
            Ok(entry) => entry.path(),
            Err(err) => {
                let message = format!("cannot list config directory: {err}");
                errors.push(whole_file(&dir_name, message));
                continue;
            }
        };
        let hidden = path
            .file_name()
            .is_some_and(|name| name.to_string_lossy().starts_with('.'));
        let yaml = path
            .extension()
            .is_some_and(|ext| ext.eq_ignore_ascii_case("yaml") || ext.eq_ignore_ascii_case("yml"));
        if hidden || !yaml {
            continue;
        }
        // `metadata` follows symlinks: a ConfigMap's `name.yaml -> ..data/name.yaml` is a file.
        match fs::metadata(&path) {
            Ok(meta) if meta.is_file() => files.push(path),
            Ok(_) => {}
            Err(err) => {
                let message = format!("cannot read file: {err}");
                errors.push(whole_file(&path.display().to_string(), message));
            }
        }
    }
    files.sort();
    (files, errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_domain_is_read_however_broken_the_rest_is() {
        for yaml in [
            "domain: x\n",
            "domain: x\nbogus: 1\n",
            "domain: x\ndescriptors: 5\n",
            "domain: x\ndescriptors: [just_a_string, {key: [a]}]\n",
            "descriptors:\n  - key: a\n    rate_limit: {unit: parsec}\ndomain: x\n",
        ] {
            let parsed = parse("t.yaml", yaml);
            assert!(parsed.rules.is_ok() == (yaml == "domain: x\n"), "{yaml}");
            let line = yaml.lines().position(|l| l.starts_with("domain")).unwrap() + 1;
            assert_eq!(parsed.domain, Some(("x".to_owned(), Some(line))), "{yaml}");
        }
        // Unreadable, empty or ambiguous: no domain to register.
        for yaml in [
            "domain: [x]\n",
            "domain: \"\"\n",
            "domain: x\ndomain: y\n",
            "- domain: x\n",
            "domain: x\ndescriptors: [\n",
        ] {
            assert_eq!(parse("t.yaml", yaml).domain, None, "{yaml}");
        }
    }

    #[test]
    fn errors_of_a_file_are_merged_in_line_order() {
        let yaml = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: parsec, requests_per_unit: ten, zzz: 1}\n  - 5\n";
        let errors = parse_domain("t.yaml", yaml).unwrap_err();
        let found: Vec<_> = errors.iter().map(|e| (e.line, e.path.as_str())).collect();
        assert_eq!(
            found,
            [
                (Some(4), "descriptors[0].rate_limit.zzz"),
                (Some(4), "descriptors[0].rate_limit.requests_per_unit"),
                (Some(4), "descriptors[0].rate_limit.unit"),
                (Some(5), "descriptors[1]"),
            ]
        );
    }
}
