//! Arbitrary bytes as a directory of two domain files, `a.yaml` and `b.yml` (the input split
//! at its first NUL byte; without one, `a.yaml` alone), loaded in memory through
//! `load_sources`, the loader `load_dir` runs after reading: invalid UTF-8, duplicate
//! domains across files and errors of both files. Never a panic; every error names a file.
#![no_main]

use std::path::PathBuf;

use floodgate::config::load_sources;
use floodgate::matcher::Matcher;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut sources = Vec::with_capacity(2);
    match data.iter().position(|&byte| byte == 0) {
        Some(split) => {
            sources.push((PathBuf::from("a.yaml"), data[..split].to_vec()));
            sources.push((PathBuf::from("b.yml"), data[split + 1..].to_vec()));
        }
        None => sources.push((PathBuf::from("a.yaml"), data.to_vec())),
    }
    let count = sources.len();
    match load_sources(sources) {
        Ok(loaded) => {
            assert_eq!(loaded.files.len(), count);
            assert_eq!(
                loaded.domains.len(),
                count,
                "a valid file without its domain"
            );
            let domains: Vec<String> = loaded.domains.iter().map(|d| d.domain.clone()).collect();
            let matcher = Matcher::new(loaded.domains);
            assert!(domains.iter().all(|domain| matcher.has_domain(domain)));
        }
        Err(errors) => {
            assert!(!errors.0.is_empty(), "an invalid directory with no error");
            for error in &errors.0 {
                assert!(
                    error.file == "a.yaml" || error.file == "b.yml",
                    "an error naming no input file: {error:?}"
                );
            }
        }
    }
});
