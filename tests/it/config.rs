//! Loading whole directories: the shipped examples, invalid fixtures, and the layout of a
//! Kubernetes ConfigMap mount.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use floodgate::config::{ConfigError, load_dir};
use floodgate::matcher::Matcher;
use floodgate::rules::Algorithm;

fn manifest_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

fn errors_of(dir: &Path) -> Vec<ConfigError> {
    match load_dir(dir) {
        Ok(loaded) => panic!("{} loaded: {loaded:?}", dir.display()),
        Err(errors) => errors.0,
    }
}

/// (file name, line, path) of each error, for compact assertions.
fn places(errors: &[ConfigError]) -> Vec<(String, Option<usize>, String)> {
    errors
        .iter()
        .map(|e| {
            let name = Path::new(&e.file).file_name().unwrap();
            (name.to_string_lossy().into_owned(), e.line, e.path.clone())
        })
        .collect()
}

#[test]
fn every_example_in_config_loads_and_compiles() {
    let loaded = load_dir(&manifest_path("config")).unwrap_or_else(|e| panic!("{e}"));
    let on_disk = fs::read_dir(manifest_path("config")).unwrap().count();
    assert_eq!(
        loaded.files.len(),
        on_disk,
        "every file in config/ is a domain"
    );
    let names: Vec<_> = loaded.domains.iter().map(|d| d.domain.as_str()).collect();
    assert_eq!(
        names,
        ["algorithms", "api", "reference"],
        "sorted by domain"
    );

    // The examples promise every algorithm; check they keep that promise.
    let matcher = Matcher::new(loaded.domains.clone());
    let algorithms: Vec<_> = matcher
        .rules()
        .iter()
        .filter_map(|rule| rule.policy().map(|p| p.algorithm))
        .collect();
    for algorithm in Algorithm::ALL {
        assert!(algorithms.contains(&algorithm), "{algorithm} missing");
    }
    assert_eq!(matcher.rules().len(), loaded.rule_count());

    let entries = [("path".to_owned(), "/api/users/42".to_owned())];
    let matched = matcher.lookup("api", &entries).unwrap();
    assert_eq!(matched.rule.path, "path_/api/*");
}

#[test]
fn every_bad_fixture_fails_naming_file_and_line() {
    let root = manifest_path("tests/fixtures/bad");
    let mut cases = 0;
    for entry in fs::read_dir(&root).unwrap() {
        let dir = entry.unwrap().path();
        if !dir.is_dir() {
            continue;
        }
        cases += 1;
        for error in errors_of(&dir) {
            assert!(
                Path::new(&error.file).starts_with(&dir),
                "{error} names a file of {}",
                dir.display()
            );
            assert!(error.line.is_some(), "{error} has no line");
            let shown = error.to_string();
            let prefix = format!("{}:{}: ", error.file, error.line.unwrap());
            assert!(shown.starts_with(&prefix), "{shown}");
        }
    }
    assert_eq!(cases, 6);
}

/// (file name, line, document path, part of the message) of one expected error.
type Expected = (&'static str, usize, &'static str, &'static str);

#[test]
fn bad_fixtures_report_what_and_where() {
    let cases: &[(&str, &[Expected])] = &[
        (
            "typo",
            &[(
                "api.yaml",
                8,
                "descriptors[0].rate_limit.requests_per_unt",
                "did you mean `requests_per_unit`?",
            )],
        ),
        ("syntax", &[("api.yaml", 5, "", "")]),
        (
            "duplicate-domain",
            &[("b.yaml", 2, "domain", "duplicate domain `shared`")],
        ),
        (
            "wrong-type",
            &[(
                "api.yaml",
                6,
                "descriptors[0].rate_limit.requests_per_unit",
                "invalid type",
            )],
        ),
        (
            "rules",
            &[
                ("api.yaml", 6, "descriptors[0].share_threshold", "wildcard"),
                ("api.yaml", 8, "descriptors[0].rate_limit.unit", "fortnight"),
                ("api.yaml", 10, "descriptors[1]", "duplicate descriptor"),
                (
                    "api.yaml",
                    14,
                    "descriptors[1].rate_limit.unit",
                    "unlimited",
                ),
            ],
        ),
        (
            "two-files",
            &[
                ("a.yaml", 3, "descriptors[0]", "no `key`"),
                ("b.yml", 1, "domain", "must not be empty"),
            ],
        ),
    ];
    for (case, expected) in cases {
        let errors = errors_of(&manifest_path(&format!("tests/fixtures/bad/{case}")));
        let found = places(&errors);
        let wanted: Vec<_> = expected
            .iter()
            .map(|(file, line, path, _)| (file.to_string(), Some(*line), path.to_string()))
            .collect();
        assert_eq!(found, wanted, "{case}: {errors:#?}");
        for (error, (_, _, _, needle)) in errors.iter().zip(expected.iter()) {
            assert!(error.message.contains(needle), "{case}: {error}");
        }
    }
    let duplicate = errors_of(&manifest_path("tests/fixtures/bad/duplicate-domain"));
    assert!(duplicate[0].message.contains("a.yaml already defines it"));
}

#[test]
fn configmap_mount_loads_each_file_once_through_its_link() {
    let mount = tempfile::tempdir().unwrap();
    let root = mount.path();
    let version = root.join("..2024_05_01_12_00_00.000000001");
    fs::create_dir(&version).unwrap();
    fs::write(
        version.join("api.yaml"),
        "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    )
    .unwrap();
    fs::write(version.join("web.yml"), "domain: web\n").unwrap();
    symlink("..2024_05_01_12_00_00.000000001", root.join("..data")).unwrap();
    symlink("..data/api.yaml", root.join("api.yaml")).unwrap();
    symlink("..data/web.yml", root.join("web.yml")).unwrap();
    // Neither dotfiles, subdirectories nor other extensions are domain files.
    fs::write(root.join(".draft.yaml"), "not: [valid").unwrap();
    fs::write(root.join("README.md"), "notes").unwrap();
    fs::create_dir(root.join("nested.yaml")).unwrap();

    let loaded = load_dir(root).unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<_> = loaded.domains.iter().map(|d| d.domain.as_str()).collect();
    assert_eq!(names, ["api", "web"]);
    assert_eq!(loaded.files, [root.join("api.yaml"), root.join("web.yml")]);
    assert_eq!(loaded.rule_count(), 1);
}

#[test]
fn a_dangling_link_is_an_error_not_a_silent_skip() {
    let dir = tempfile::tempdir().unwrap();
    symlink("..data/gone.yaml", dir.path().join("gone.yaml")).unwrap();
    let errors = errors_of(dir.path());
    assert_eq!(errors.len(), 1);
    assert!(errors[0].file.ends_with("gone.yaml"), "{}", errors[0]);
    assert!(
        errors[0].message.starts_with("cannot read file"),
        "{}",
        errors[0]
    );
}

#[test]
fn empty_directory_is_valid_and_missing_directory_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let loaded = load_dir(dir.path()).unwrap();
    assert!(loaded.domains.is_empty() && loaded.files.is_empty());

    let missing = dir.path().join("missing");
    let errors = errors_of(&missing);
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].file, missing.display().to_string());
    assert!(
        errors[0]
            .to_string()
            .contains("cannot read config directory")
    );
}

#[test]
fn errors_display_one_per_line() {
    let errors = load_dir(&manifest_path("tests/fixtures/bad/two-files")).unwrap_err();
    let shown = errors.to_string();
    let lines: Vec<_> = shown.lines().collect();
    assert_eq!(lines.len(), 2, "{shown}");
    assert!(lines[0].ends_with("a.yaml:3: descriptors[0]: descriptor has no `key`"));
    assert!(lines[1].ends_with("b.yml:1: domain: `domain` must not be empty"));
    let no_line = ConfigError {
        file: "f.yaml".into(),
        line: None,
        path: "domain".into(),
        message: "m".into(),
    };
    assert_eq!(no_line.to_string(), "f.yaml: domain: m");
}

#[test]
fn duplicate_domains_are_found_even_when_a_file_is_invalid() {
    let dir = tempfile::tempdir().unwrap();
    let bad_unit = "domain: x\ndescriptors:\n  - key: k\n    rate_limit: {unit: parsec}\n";
    fs::write(dir.path().join("a.yaml"), bad_unit).unwrap();
    fs::write(dir.path().join("b.yaml"), "# b\ndomain: x\n").unwrap();
    let errors = errors_of(dir.path());
    let found = places(&errors);
    assert_eq!(
        found,
        [
            (
                "a.yaml".into(),
                Some(4),
                "descriptors[0].rate_limit.unit".into()
            ),
            ("b.yaml".into(), Some(2), "domain".into()),
        ]
    );
    assert!(errors[1].message.contains("a.yaml already defines it"));
}

#[test]
fn a_file_that_is_not_utf8_names_its_line() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("a.yaml"), b"domain: x\n# caf\xe9\n").unwrap();
    let errors = errors_of(dir.path());
    assert_eq!(places(&errors), [("a.yaml".into(), Some(2), String::new())]);
    assert_eq!(errors[0].message, "file is not valid UTF-8");
}

#[test]
fn duplicate_domains_are_found_when_the_first_file_does_not_deserialize() {
    let dir = tempfile::tempdir().unwrap();
    // An unknown key stops serde in a.yaml; a wrong type and a non-mapping list entry stop
    // it in c.yaml. Their domains still count, so the later files are told.
    fs::write(dir.path().join("a.yaml"), "domain: x\nbogus: 1\n").unwrap();
    fs::write(
        dir.path().join("b.yaml"),
        "domain: x\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    )
    .unwrap();
    fs::write(
        dir.path().join("c.yaml"),
        "descriptors:\n  - just_a_string\n  - key: [k]\ndomain: y\n",
    )
    .unwrap();
    fs::write(dir.path().join("d.yaml"), "# d\n\ndomain: y\n").unwrap();
    let errors = errors_of(dir.path());
    assert_eq!(
        places(&errors),
        [
            ("a.yaml".into(), Some(2), "bogus".into()),
            ("b.yaml".into(), Some(1), "domain".into()),
            ("c.yaml".into(), Some(2), "descriptors[0]".into()),
            ("c.yaml".into(), Some(3), "descriptors[1].key".into()),
            ("d.yaml".into(), Some(3), "domain".into()),
        ],
        "{errors:#?}"
    );
    assert!(errors[0].message.contains("unknown key `bogus`"));
    assert!(
        errors[1].message.contains("duplicate domain `x`: ")
            && errors[1].message.ends_with("a.yaml already defines it"),
        "{}",
        errors[1]
    );
    assert!(errors[4].message.ends_with("c.yaml already defines it"));
}
