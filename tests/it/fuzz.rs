//! The entry points the fuzz targets (`fuzz/`) use, held to what the service itself does,
//! and one regression test per fuzz finding.

use std::fs;
use std::path::{Path, PathBuf};

use floodgate::config::{load_dir, load_sources, parse_domain};

fn manifest_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

/// Every domain file of `dir` with its bytes, in reverse path order: `load_sources` sorts.
fn sources(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            path.extension()
                .is_some_and(|ext| ext == "yaml" || ext == "yml")
        })
        .map(|path| {
            let bytes = fs::read(&path).unwrap();
            (path, bytes)
        })
        .collect();
    files.sort();
    files.reverse();
    files
}

#[test]
fn in_memory_loading_answers_as_loading_the_directory() {
    let mut dirs = vec![manifest_path("config"), manifest_path("fuzz/rules")];
    for entry in fs::read_dir(manifest_path("tests/fixtures/bad")).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            dirs.push(path);
        }
    }
    for dir in dirs {
        let from_disk = load_dir(&dir);
        let from_memory = load_sources(sources(&dir));
        assert_eq!(
            format!("{from_memory:?}"),
            format!("{from_disk:?}"),
            "{}",
            dir.display()
        );
    }
}

#[test]
fn in_memory_loading_reports_invalid_utf8_with_its_line() {
    let errors = load_sources(vec![(
        PathBuf::from("a.yaml"),
        b"domain: a\ndescriptors:\n  - key: \xff\n".to_vec(),
    )])
    .unwrap_err();
    assert_eq!(errors.0.len(), 1, "{errors}");
    assert_eq!(errors.0[0].line, Some(3));
    assert_eq!(errors.0[0].message, "file is not valid UTF-8");
}

#[test]
fn the_request_targets_rules_load() {
    let loaded = load_dir(&manifest_path("fuzz/rules")).unwrap_or_else(|errors| panic!("{errors}"));
    assert_eq!(loaded.domains.len(), 1);
}

/// Every input the `config_file` target once crashed on (`tests/fuzz-findings/config_file-*`),
/// through the call that target makes; each must now be answered, not panic.
#[test]
fn config_file_findings_are_answered() {
    let mut checked = 0;
    for entry in fs::read_dir(manifest_path("tests/fuzz-findings")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("config_file-") {
            continue;
        }
        let text = fs::read_to_string(&path).unwrap();
        let errors = parse_domain(&name, &text).expect_err(&name);
        assert!(!errors.is_empty(), "{name}");
        checked += 1;
    }
    assert!(checked > 0, "no findings read");
}

#[test]
fn an_implicit_null_in_a_flow_mapping_next_to_a_sibling_is_reported() {
    // Fuzz finding: the unknown key's span reached into the next item, and the repair of
    // the first item overlapped its removal; the loader panicked on the overlapping edits.
    let errors = parse_domain("a.yaml", "domain: d\ndescriptors: [{r},{}]\n").unwrap_err();
    let found: Vec<_> = errors
        .iter()
        .map(|error| (error.line, error.path.as_str()))
        .collect();
    assert!(found.contains(&(Some(2), "descriptors[0].r")), "{errors:?}");
}
