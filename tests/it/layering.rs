//! "Dependencies point down": every module of `src/` uses only modules that `src/lib.rs`'s
//! module map lists below it (unit tests aside), and every module is on the map.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The modules of the map, top down.
fn map(lib: &str) -> Vec<String> {
    lib.lines()
        .filter_map(|line| line.strip_prefix("//! - "))
        .filter_map(|entry| entry.split_once(':').map(|(names, _)| names))
        .flat_map(|names| names.split('`').skip(1).step_by(2).map(str::to_owned))
        .collect()
}

/// The `crate::<module>` names in `text` outside comments and `#[cfg(test)]` code.
fn uses(text: &str) -> Vec<String> {
    let code = text.split("#[cfg(test)]").next().unwrap_or_default();
    let mut found = Vec::new();
    for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
        for (at, _) in line.match_indices("crate::") {
            let name: String = line[at + "crate::".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            found.push(name);
        }
    }
    found
}

/// Every `.rs` file of `src/`: the top-level module it belongs to (`limiter` for
/// `src/limiter/mod.rs`, `server` for `src/server.rs`), its path under `src/`, its path.
fn modules(src: &Path) -> Vec<(String, PathBuf, PathBuf)> {
    let mut paths = Vec::new();
    files(src, &mut paths);
    paths
        .into_iter()
        .map(|path| {
            let relative = path.strip_prefix(src).expect("under src").to_path_buf();
            let top = relative.components().next().expect("a component");
            let top = top
                .as_os_str()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_owned();
            (top, relative, path)
        })
        .collect()
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_module_uses_only_modules_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
    let rank: BTreeMap<String, usize> = map(&lib)
        .into_iter()
        .enumerate()
        .map(|(i, name)| (name, i))
        .collect();
    let declared: Vec<&str> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("pub mod ")?.strip_suffix(';'))
        .collect();
    for module in &declared {
        assert!(
            rank.contains_key(*module),
            "`{module}` is not on lib.rs's module map"
        );
    }
    let mut upward = Vec::new();
    for (top, relative, path) in modules(&src) {
        let Some(&mine) = rank.get(&top) else {
            continue;
        };
        let text = std::fs::read_to_string(&path).expect("read");
        for used in uses(&text) {
            if rank.get(&used).is_some_and(|&theirs| theirs < mine) {
                upward.push(format!("{} uses crate::{used}", relative.display()));
            }
        }
    }
    upward.sort();
    upward.dedup();
    assert!(
        upward.is_empty(),
        "imports up the module map:\n{}",
        upward.join("\n")
    );
}

/// Every decision and every quota booking goes through the limiter (its deadline, spans,
/// metrics and overload rules): outside `backend` itself, only `limiter`, `server` (which
/// builds the backend) and `health` (which pings it) name the `Backend` trait.
#[test]
fn only_the_limiter_reaches_the_backend() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let allowed = ["backend", "limiter", "server", "health"];
    let mut reaching = Vec::new();
    for (top, relative, path) in modules(&src) {
        if allowed.contains(&top.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read");
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let code: String = code
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join(" ");
        // Where the trait can be named: an import from `crate::backend` (to its `;`, however
        // rustfmt wraps it), or a trait object.
        let imports = code
            .match_indices("crate::backend")
            .map(|(at, _)| code[at..].split(';').next().unwrap_or_default());
        let objects = code
            .match_indices("dyn Backend")
            .map(|(at, _)| &code[at..at + "dyn Backend".len() + 1]);
        for text in imports.chain(objects) {
            let names_trait = text.match_indices("Backend").any(|(at, _)| {
                let before = text[..at].chars().next_back();
                let after = text[at + "Backend".len()..].chars().next();
                !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
                    && !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
            });
            if names_trait {
                reaching.push(format!("{}: {}", relative.display(), text.trim()));
            }
        }
    }
    assert!(
        reaching.is_empty(),
        "the backend reached around the limiter:\n{}",
        reaching.join("\n")
    );
}

/// Nothing below `service` on the module map knows the wire: `crate::proto` (Envoy's
/// generated types) is used only by `service` and the modules above it, which translate.
#[test]
fn nothing_below_service_uses_the_protocol_types() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
    let map = map(&lib);
    let service = map
        .iter()
        .position(|name| name == "service")
        .expect("service on the map");
    let below: Vec<&String> = map[service + 1..]
        .iter()
        .filter(|name| *name != "proto")
        .collect();
    let mut knowing = Vec::new();
    for (top, relative, path) in modules(&src) {
        if !below.iter().any(|name| **name == top) {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read");
        if uses(&text).iter().any(|used| used == "proto") {
            knowing.push(relative.display().to_string());
        }
    }
    assert!(
        knowing.is_empty(),
        "below `service`, yet using crate::proto: {knowing:?}"
    );
}

/// The sibling files a file of `src/` names through `super::` (outside comments and
/// `#[cfg(test)]` code), `use super::{a, b::c}` groups included.
fn sibling_uses(text: &str) -> Vec<String> {
    let code = text.split("#[cfg(test)]").next().unwrap_or_default();
    let code: String = code
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let ident = |text: &str| -> String {
        text.trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut names = Vec::new();
    for (at, _) in code.match_indices("super::") {
        let rest = &code[at + "super::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        names.push(ident(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            names.push(ident(&item));
        } else {
            names.push(ident(rest));
        }
    }
    names.retain(|name| !name.is_empty() && name != "super" && name != "self");
    names
}

/// Issue 47: no two files of one module import each other, directly or round a longer
/// cycle (`rlqs/assign.rs` and `rlqs/pace.rs` once did). Each directory of `src/` is one
/// module; its files are siblings, and `super::name` is how one names another.
#[test]
fn the_files_of_a_module_import_each_other_without_a_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut dirs = vec![src.clone()];
    let mut cycles = Vec::new();
    while let Some(dir) = dirs.pop() {
        let mut files = BTreeMap::new();
        for entry in std::fs::read_dir(&dir).expect("read dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let Some(name) = path.file_stem().map(|s| s.to_string_lossy().into_owned()) else {
                continue;
            };
            if path.extension().is_some_and(|e| e == "rs")
                && !["mod", "tests"].contains(&name.as_str())
            {
                files.insert(name, path);
            }
        }
        let edges: BTreeMap<&String, Vec<String>> = files
            .iter()
            .map(|(name, path)| {
                let text = std::fs::read_to_string(path).expect("read");
                let mut uses = sibling_uses(&text);
                uses.retain(|used| files.contains_key(used) && used != name);
                uses.sort();
                uses.dedup();
                (name, uses)
            })
            .collect();
        // Depth-first from every file; a path back to a file on the stack is a cycle.
        fn visit(
            name: &str,
            edges: &BTreeMap<&String, Vec<String>>,
            stack: &mut Vec<String>,
            cycles: &mut Vec<String>,
        ) {
            if let Some(at) = stack.iter().position(|seen| seen == name) {
                let mut cycle = stack[at..].to_vec();
                cycle.push(name.to_owned());
                cycles.push(cycle.join(" -> "));
                return;
            }
            stack.push(name.to_owned());
            for next in edges.get(&name.to_owned()).into_iter().flatten() {
                visit(next, edges, stack, cycles);
            }
            stack.pop();
        }
        for name in files.keys() {
            let mut found = Vec::new();
            visit(name, &edges, &mut Vec::new(), &mut found);
            let folder = dir.strip_prefix(&src).unwrap_or(&dir).display().to_string();
            cycles.extend(found.into_iter().map(|cycle| format!("{folder}: {cycle}")));
        }
    }
    cycles.sort();
    cycles.dedup();
    assert!(
        cycles.is_empty(),
        "import cycles between files:\n{}",
        cycles.join("\n")
    );
}
