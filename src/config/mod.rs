//! Loading domain files: read -> parse -> validate, reporting every error with its place.
//!
//! 1. [`load_dir`] reads every `*.yaml` / `*.yml` file directly in a directory (errors name
//!    the path). Dotfiles are skipped, so a Kubernetes ConfigMap mount (`..data/` plus
//!    `name.yaml -> ..data/name.yaml` links) loads each file once, through its link.
//! 2. [`parse_domain`] parses one YAML text with serde_yaml into the raw model (`model`),
//!    which denies unknown keys. `located` re-reads the text with an event parser to find
//!    lines, and sweeps for every unknown key, since serde stops at the first one.
//! 3. `validate` turns the raw model into [`DomainRules`], collecting every error.
//!
//! serde_yaml (deprecated upstream) is used nowhere else, so replacing it touches only this
//! module. The format is envoyproxy/ratelimit's, read as its YAML 1.1 parser reads it where
//! that matters (scalars keep their text; `yes`/`no` booleans), with floodgate's extensions.
//! Not supported: merge keys (`<<`), reported as an unknown key; multi-document files.

mod located;
mod model;
mod validate;

use std::collections::HashMap;
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use crate::matcher::DomainRules;
use located::{DocPath, Located};
use model::RawDomain;

pub use validate::SLIDING_LOG_MAX_REQUESTS;

/// One problem in the configuration, located as precisely as known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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
    let (files, mut errors) = list_files(dir);
    let mut domains = Vec::new();
    let mut owners: HashMap<String, PathBuf> = HashMap::new();
    for path in &files {
        let file = path.display().to_string();
        let text = match fs::read(path).map(String::from_utf8) {
            Ok(Ok(text)) => text,
            Ok(Err(_)) => {
                errors.push(whole_file(&file, "file is not valid UTF-8".to_owned()));
                continue;
            }
            Err(err) => {
                errors.push(whole_file(&file, format!("cannot read file: {err}")));
                continue;
            }
        };
        match parse(&file, &text) {
            Ok((rules, domain_line)) => {
                if let Some(first) = owners.get(&rules.domain) {
                    errors.push(ConfigError {
                        file,
                        line: domain_line,
                        path: "domain".to_owned(),
                        message: format!(
                            "duplicate domain `{}`: {} already defines it",
                            rules.domain,
                            first.display()
                        ),
                    });
                } else {
                    owners.insert(rules.domain.clone(), path.clone());
                    domains.push(rules);
                }
            }
            Err(mut file_errors) => errors.append(&mut file_errors),
        }
    }
    if !errors.is_empty() {
        return Err(ConfigErrors(errors));
    }
    domains.sort_by(|a, b| a.domain.cmp(&b.domain));
    Ok(LoadedConfig { domains, files })
}

/// Parses and validates one domain file's text; `file` only labels the errors.
///
/// # Errors
/// Every problem found in the text (see [`load_dir`]).
pub fn parse_domain(file: &str, yaml: &str) -> Result<DomainRules, Vec<ConfigError>> {
    parse(file, yaml).map(|(rules, _)| rules)
}

/// As [`parse_domain`], also returning the line of `domain` for cross-file errors.
fn parse(file: &str, yaml: &str) -> Result<(DomainRules, Option<usize>), Vec<ConfigError>> {
    let located = Located::parse(yaml);
    let mut errors: Vec<ConfigError> = located::unknown_keys(&located)
        .into_iter()
        .map(|unknown| ConfigError {
            file: file.to_owned(),
            line: Some(unknown.line),
            path: unknown.path.to_string(),
            message: unknown.message,
        })
        .collect();
    match serde_yaml::from_str::<Option<RawDomain>>(yaml) {
        Ok(Some(raw)) => match validate::domain(file, raw, &located) {
            Ok(rules) if errors.is_empty() => {
                let line = located.line(&DocPath::default().key("domain"));
                return Ok((rules, line));
            }
            Ok(_) => {}
            Err(mut invalid) => errors.append(&mut invalid),
        },
        Ok(None) => errors.push(whole_file(
            file,
            "file is empty; expected a mapping with `domain`".to_owned(),
        )),
        Err(err) => {
            let err = from_serde(file, &err);
            // The sweep already reported serde's unknown key, with a hint; keep any other.
            let duplicate = err.message.starts_with("unknown field")
                && errors.iter().any(|known| known.line == err.line);
            if !duplicate {
                errors.push(err);
            }
        }
    }
    errors.sort_by_key(|error| error.line.unwrap_or(usize::MAX));
    Err(errors)
}

fn whole_file(file: &str, message: String) -> ConfigError {
    ConfigError {
        file: file.to_owned(),
        line: None,
        path: String::new(),
        message,
    }
}

/// Splits serde_yaml's `path: message at line L column C` into its parts.
fn from_serde(file: &str, err: &serde_yaml::Error) -> ConfigError {
    let mut message = err.to_string();
    let line = err.location().map(|location| {
        let at = format!(" at line {} column {}", location.line(), location.column());
        if let Some(start) = message.find(&at) {
            message.replace_range(start..start + at.len(), "");
        }
        location.line()
    });
    // serde_yaml prefixes the document path unless the error is at the root.
    let mut path = String::new();
    if let Some((prefix, rest)) = message.split_once(": ") {
        let looks_like_path = !prefix.is_empty()
            && !prefix.contains(' ')
            && prefix
                .chars()
                .all(|c| c.is_alphanumeric() || "_.[]".contains(c));
        if looks_like_path {
            path = prefix.to_owned();
            message = rest.to_owned();
        }
    }
    ConfigError {
        file: file.to_owned(),
        line,
        path,
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
