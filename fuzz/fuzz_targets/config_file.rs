//! Arbitrary bytes as one YAML domain file: `parse_domain` must answer rules or a non-empty
//! list of errors, never panic or hang. Rules it accepts must compile into a matcher, and
//! every limit must be one the backends compute exactly (validation's promise).
#![no_main]

use floodgate::config::parse_domain;
use floodgate::matcher::Matcher;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // `load_dir` rejects non-UTF-8 files before parsing; `config_dir` covers that path.
    let Ok(yaml) = std::str::from_utf8(data) else {
        return;
    };
    match parse_domain("fuzz.yaml", yaml) {
        Ok(rules) => {
            let domain = rules.domain.clone();
            let matcher = Matcher::new(vec![rules]);
            assert!(matcher.has_domain(&domain));
            for rule in matcher.rules() {
                if let Some(policy) = rule.policy() {
                    if let Err(message) = policy.check_exact_bounds() {
                        panic!("accepted rule {} is out of bounds: {message}", rule.path);
                    }
                }
            }
        }
        Err(errors) => {
            assert!(!errors.is_empty(), "an invalid file with no error");
            for error in &errors {
                assert!(
                    !error.message.is_empty(),
                    "an error without a message: {error:?}"
                );
                assert_eq!(error.file, "fuzz.yaml");
            }
        }
    }
});
