//! One test per validation rule, fed from YAML strings.
use super::super::{ConfigError, parse_domain};
use crate::matcher::DescriptorRule;
use crate::rules::{Algorithm, Limit, OnOverLimit, Unit};

fn errors(yaml: &str) -> Vec<ConfigError> {
    match parse_domain("t.yaml", yaml) {
        Ok(rules) => panic!("expected errors, loaded {rules:?}"),
        Err(errors) => errors,
    }
}

/// Asserts that `yaml` fails with exactly one error, at `line` and `path`, whose message
/// contains `needle`.
fn rejects(yaml: &str, line: usize, path: &str, needle: &str) {
    let errors = errors(yaml);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    let error = &errors[0];
    assert_eq!(
        (error.file.as_str(), error.line, error.path.as_str()),
        ("t.yaml", Some(line), path),
        "{error}"
    );
    assert!(error.message.contains(needle), "{error}");
}

/// One limited descriptor with the given `rate_limit` body lines (6-space indented).
fn limited(body: &str) -> String {
    format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n{body}")
}

fn load(yaml: &str) -> crate::matcher::DomainRules {
    parse_domain("t.yaml", yaml).unwrap_or_else(|e| panic!("{e:#?}"))
}

#[test]
fn yaml_syntax_errors_carry_their_line() {
    let errors = errors("domain: d\ndescriptors:\n  - key: a\n   value: b\n");
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(errors[0].line, Some(4), "{}", errors[0]);
    assert_eq!(errors[0].path, "");
    assert!(
        !errors[0].message.contains(" at line 4 column"),
        "{}",
        errors[0]
    );
}

#[test]
fn unknown_keys_are_all_reported_with_hints() {
    let yaml = limited("      uint: second\n      requests_per_unit: 1\n      brust: 3\n");
    let errors = errors(&yaml);
    let found: Vec<_> = errors.iter().map(|e| (e.line, e.path.as_str())).collect();
    assert_eq!(
        found,
        [
            (Some(5), "descriptors[0].rate_limit.uint"),
            (Some(7), "descriptors[0].rate_limit.brust"),
        ]
    );
    assert!(
        errors[0].message.contains("did you mean `unit`?"),
        "{}",
        errors[0]
    );
    assert!(
        errors[1].message.contains("did you mean `burst`?"),
        "{}",
        errors[1]
    );
}

#[test]
fn unknown_keys_at_the_root_and_in_replaces() {
    rejects(
        "domain: d\ndescriptor: []\n",
        2,
        "descriptor",
        "unknown key",
    );
    let yaml = limited("      unit: second\n      replaces:\n        - nme: other\n");
    rejects(
        &yaml,
        7,
        "descriptors[0].rate_limit.replaces[0].nme",
        "`name`",
    );
}

#[test]
fn wrong_types_name_path_and_line() {
    let yaml = limited("      unit: second\n      requests_per_unit: ten\n");
    rejects(
        &yaml,
        6,
        "descriptors[0].rate_limit.requests_per_unit",
        "invalid type",
    );
    rejects(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: 5\n",
        4,
        "descriptors[0].rate_limit",
        "expected a rate_limit mapping",
    );
    rejects(
        "domain: d\ndescriptors:\n  - key: a\n    shadow_mode: maybe\n",
        4,
        "descriptors[0].shadow_mode",
        "expected a boolean",
    );
}

#[test]
fn repeated_keys_in_one_mapping() {
    rejects(
        "domain: d\ndescriptors:\n  - key: a\n    value: x\n    key: b\n",
        5,
        "descriptors[0].key",
        "duplicate key `key` (first on line 3)",
    );
}

#[test]
fn more_than_one_document() {
    let errors = errors("domain: a\n---\ndomain: b\n");
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0].message.contains("more than one document"),
        "{}",
        errors[0]
    );
}

#[test]
fn empty_file_is_rejected() {
    let errors = errors("# nothing here\n");
    assert_eq!(errors.len(), 1);
    assert!(errors[0].message.contains("file is empty"), "{}", errors[0]);
}

#[test]
fn duplicate_key_value_at_one_level() {
    let yaml = "domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: other\n  - key: k\n    value: v\n";
    rejects(
        yaml,
        6,
        "descriptors[2]",
        "duplicate descriptor `k_v`: descriptors[0] (line 3) already defines it",
    );
}

#[test]
fn duplicate_key_only_nodes_and_empty_value() {
    let yaml = "domain: d\ndescriptors:\n  - key: k\n  - key: k\n    value: \"\"\n";
    rejects(yaml, 4, "descriptors[1]", "duplicate descriptor `k`");
    let nested =
        "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n      - key: b\n";
    rejects(nested, 6, "descriptors[0].descriptors[1]", "`b`");
}

#[test]
fn composite_keys_clash_as_in_the_reference() {
    let yaml = "domain: d\ndescriptors:\n  - key: a_b\n  - key: a\n    value: b\n";
    rejects(yaml, 4, "descriptors[1]", "duplicate descriptor `a_b`");
}

#[test]
fn same_key_at_different_levels_or_values_is_fine() {
    let yaml = "domain: d\ndescriptors:\n  - key: k\n    value: a\n  - key: k\n    value: b\n  - key: k\n    descriptors:\n      - key: k\n";
    assert_eq!(load(yaml).descriptors.len(), 3);
}

#[test]
fn bad_unit() {
    let yaml = limited("      unit: fortnight\n      requests_per_unit: 1\n");
    rejects(
        &yaml,
        5,
        "descriptors[0].rate_limit.unit",
        "unknown unit `fortnight`; expected one of: second, minute",
    );
}

#[test]
fn missing_unit_on_a_limited_rule() {
    let yaml = limited("      requests_per_unit: 1\n");
    rejects(
        &yaml,
        4,
        "descriptors[0].rate_limit.unit",
        "missing `unit` on a limited rule",
    );
}

#[test]
fn unlimited_with_a_unit() {
    let yaml = limited("      unlimited: true\n      unit: second\n");
    rejects(
        &yaml,
        6,
        "descriptors[0].rate_limit.unit",
        "`unit` together with `unlimited: true`",
    );
}

#[test]
fn extensions_on_an_unlimited_rule() {
    let yaml = limited("      unlimited: true\n      lockout_seconds: 5\n");
    rejects(
        &yaml,
        6,
        "descriptors[0].rate_limit.lockout_seconds",
        "no effect with `unlimited: true`",
    );
}

#[test]
fn burst_below_one() {
    let yaml = limited("      unit: second\n      algorithm: token_bucket\n      burst: 0\n");
    rejects(
        &yaml,
        7,
        "descriptors[0].rate_limit.burst",
        "`burst` must be at least 1",
    );
}

#[test]
fn burst_on_another_algorithm() {
    let yaml = limited("      unit: second\n      requests_per_unit: 5\n      burst: 10\n");
    rejects(
        &yaml,
        7,
        "descriptors[0].rate_limit.burst",
        "only applies to algorithm token_bucket",
    );
}

#[test]
fn unit_multiplier_below_one() {
    let yaml = limited("      unit: second\n      unit_multiplier: 0\n");
    rejects(
        &yaml,
        6,
        "descriptors[0].rate_limit.unit_multiplier",
        "at least 1",
    );
}

#[test]
fn unknown_algorithm() {
    let yaml = limited("      unit: second\n      algorithm: leaky\n");
    rejects(
        &yaml,
        6,
        "descriptors[0].rate_limit.algorithm",
        "unknown algorithm `leaky`; expected one of: fixed_window, token_bucket",
    );
}

#[test]
fn unknown_on_over_limit() {
    let yaml = limited("      unit: second\n      on_over_limit: drop\n");
    rejects(
        &yaml,
        6,
        "descriptors[0].rate_limit.on_over_limit",
        "unknown on_over_limit `drop`; expected one of: reject, consume",
    );
}

#[test]
fn lockout_below_one() {
    let yaml = limited("      unit: second\n      lockout_seconds: 0\n");
    rejects(
        &yaml,
        6,
        "descriptors[0].rate_limit.lockout_seconds",
        "at least 1",
    );
}

#[test]
fn sliding_log_with_consume() {
    let yaml =
        limited("      unit: second\n      algorithm: sliding_log\n      on_over_limit: consume\n");
    let rules = load(&yaml);
    let rule = rules.descriptors[0].rule.as_ref().unwrap();
    assert_eq!(rule.policy().unwrap().on_over_limit, OnOverLimit::Consume);
    assert!(rule.sets_accounting);
}

#[test]
fn sliding_log_above_its_cap() {
    let yaml =
        limited("      unit: hour\n      requests_per_unit: 10001\n      algorithm: sliding_log\n");
    rejects(
        &yaml,
        6,
        "descriptors[0].rate_limit.requests_per_unit",
        "capped at 10000 (got 10001)",
    );
    let at_cap =
        limited("      unit: hour\n      requests_per_unit: 10000\n      algorithm: sliding_log\n");
    load(&at_cap);
}

#[test]
fn policies_the_scripts_cannot_count_exactly() {
    let yaml = limited(
        "      unit: year\n      requests_per_unit: 999983\n      algorithm: token_bucket\n      burst: 1000000\n",
    );
    rejects(&yaml, 4, "descriptors[0].rate_limit", "exceeds 2^53");
    let window = limited("      unit: year\n      unit_multiplier: 4000000000\n");
    rejects(
        &window,
        6,
        "descriptors[0].rate_limit.unit_multiplier",
        "exceeds 2^53 ms",
    );
}

#[test]
fn share_threshold_without_wildcard() {
    let yaml =
        "domain: d\ndescriptors:\n  - key: path\n    value: /login\n    share_threshold: true\n";
    rejects(
        yaml,
        5,
        "descriptors[0].share_threshold",
        "needs a wildcard `value`",
    );
}

#[test]
fn missing_and_empty_domain() {
    rejects("descriptors: []\n", 1, "domain", "missing `domain`");
    rejects("domain: \"\"\n", 1, "domain", "`domain` must not be empty");
}

#[test]
fn descriptor_without_key_or_with_empty_key() {
    rejects(
        "domain: d\ndescriptors:\n  - value: v\n",
        3,
        "descriptors[0]",
        "descriptor has no `key`",
    );
    rejects(
        "domain: d\ndescriptors:\n  - key: a\n  - key: \"\"\n",
        4,
        "descriptors[1].key",
        "`key` must not be empty",
    );
}

#[test]
fn empty_replaces_name() {
    let yaml = limited("      unit: second\n      replaces:\n        - name: \"\"\n");
    rejects(
        &yaml,
        7,
        "descriptors[0].rate_limit.replaces[0].name",
        "needs a non-empty `name`",
    );
    let missing = limited("      unit: second\n      replaces: [{}]\n");
    rejects(
        &missing,
        6,
        "descriptors[0].rate_limit.replaces[0].name",
        "needs a non-empty `name`",
    );
}

#[test]
fn replaces_naming_its_own_rule() {
    let yaml =
        limited("      unit: second\n      name: mine\n      replaces:\n        - name: mine\n");
    rejects(
        &yaml,
        8,
        "descriptors[0].rate_limit.replaces[0].name",
        "own name `mine`",
    );
}

#[test]
fn every_error_of_a_file_is_collected_in_document_order() {
    let yaml = "\
domain: d
descriptors:
  - key: a
    rate_limit: {unit: parsec}
  - value: x
  - key: b
    value: exact
    share_threshold: true
    descriptors:
      - key: c
        rate_limit: {unit: second, algorithm: nope, burst: 0}
";
    let found: Vec<_> = errors(yaml)
        .iter()
        .map(|e| (e.line, e.path.clone()))
        .collect();
    assert_eq!(
        found,
        [
            (Some(4), "descriptors[0].rate_limit.unit".to_owned()),
            (Some(5), "descriptors[1]".to_owned()),
            (Some(8), "descriptors[2].share_threshold".to_owned()),
            (
                Some(11),
                "descriptors[2].descriptors[0].rate_limit.algorithm".to_owned()
            ),
            (
                Some(11),
                "descriptors[2].descriptors[0].rate_limit.burst".to_owned()
            ),
        ]
    );
}

/// Asserts that `yaml` fails with exactly the `expected` errors: (line, path, part of
/// the message), in order.
fn rejects_all(yaml: &str, expected: &[(usize, &str, &str)]) {
    let errors = errors(yaml);
    let found: Vec<_> = errors.iter().map(|e| (e.line, e.path.as_str())).collect();
    let wanted: Vec<_> = expected
        .iter()
        .map(|(line, path, _)| (Some(*line), *path))
        .collect();
    assert_eq!(found, wanted, "{errors:#?}");
    for (error, (_, _, needle)) in errors.iter().zip(expected) {
        assert!(error.message.contains(needle), "{error}");
    }
}

#[test]
fn a_typo_does_not_hide_the_other_errors_of_its_file() {
    let yaml = "\
domain: d
descriptors:
  - key: a
    descriptors:
      - key: b
        value: x
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: c
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: b
        value: x
  - key: d
    rate_limit:
      unit: second
      burst: 10
  - key: e
    rate_limit: {unit: minute, brust: 5}
";
    rejects_all(
        yaml,
        &[
            (
                10,
                "descriptors[0].descriptors[2]",
                "duplicate descriptor `b_x`: descriptors[0].descriptors[0] (line 5)",
            ),
            (
                15,
                "descriptors[1].rate_limit.burst",
                "only applies to algorithm token_bucket",
            ),
            (
                17,
                "descriptors[2].rate_limit.brust",
                "unknown key `brust` (did you mean `burst`?)",
            ),
        ],
    );
}

#[test]
fn list_entries_that_are_not_mappings_hide_nothing() {
    let yaml = "\
domain: d
descriptors:
  - just_a_string
  - key: a
    rate_limit: {unit: fortnight}
  - key: a
  - 42
  - key: b
    value: exact
    share_threshold: true
    descriptors: [[nested], {key: c, rate_limit: {unit: second}, bogus: 1}]
";
    // Each bad entry keeps its index, so later paths and lines stay right; none is
    // also reported as a descriptor without `key`.
    rejects_all(
        yaml,
        &[
            (
                3,
                "descriptors[0]",
                "invalid type: string \"just_a_string\", expected a descriptor mapping",
            ),
            (
                5,
                "descriptors[1].rate_limit.unit",
                "unknown unit `fortnight`",
            ),
            (
                6,
                "descriptors[2]",
                "duplicate descriptor `a`: descriptors[1] (line 4)",
            ),
            (7, "descriptors[3]", "invalid type: integer `42`"),
            (10, "descriptors[4].share_threshold", "wildcard"),
            (
                11,
                "descriptors[4].descriptors[1].bogus",
                "unknown key `bogus`",
            ),
            (
                11,
                "descriptors[4].descriptors[0]",
                "invalid type: sequence",
            ),
        ],
    );
    // The same for `replaces` entries, which are `{name: ...}` mappings.
    let yaml = limited(
        "      unit: second\n      name: mine\n      replaces: [other, {name: mine}]\n      name: yours\n",
    );
    rejects_all(
        &yaml,
        &[
            (
                7,
                "descriptors[0].rate_limit.replaces[0]",
                "invalid type: string \"other\", expected a replaces entry",
            ),
            (8, "descriptors[0].rate_limit.name", "duplicate key `name`"),
        ],
    );
}

#[test]
fn every_wrong_type_is_reported_and_its_siblings_still_validated() {
    let yaml = "\
domain: d
descriptors:
  - key: a
    rate_limit:
      unit: second
      algorithm: [token_bucket]
      burst: 5
  - key: b
    rate_limit: {unit: parsec, requests_per_unit: ten}
  - key: [c]
  - key: d
    value: {x: 1}
    share_threshold: true
  - key: d
    value: {y: 2}
  - key: e
    rate_limit: {unit: second, requests_per_unit: 1}
    shadow_mode: maybe
    descriptors: [{key: f, rate_limit: {unit: eon}}]
";
    // A lost value is unknown, not its default: the `burst` is not judged against
    // fixed_window, `key: [c]` is not a missing key, the two `d` descriptors with
    // unreadable values are not duplicates, and `share_threshold` is not judged
    // against a value that could not be read.
    rejects_all(
        yaml,
        &[
            (
                6,
                "descriptors[0].rate_limit.algorithm",
                "invalid type: sequence",
            ),
            (
                9,
                "descriptors[1].rate_limit.requests_per_unit",
                "invalid type: string \"ten\"",
            ),
            (9, "descriptors[1].rate_limit.unit", "unknown unit `parsec`"),
            (10, "descriptors[2].key", "invalid type: sequence"),
            (12, "descriptors[3].value", "invalid type: map"),
            (15, "descriptors[4].value", "invalid type: map"),
            (18, "descriptors[5].shadow_mode", "expected a boolean"),
            (
                19,
                "descriptors[5].descriptors[0].rate_limit.unit",
                "unknown unit `eon`",
            ),
        ],
    );
}

#[test]
fn a_misspelt_key_stands_for_its_field_only_when_that_field_is_absent() {
    // `uint` is the only unit: the rule is not also "missing `unit`" (see
    // `unknown_keys_are_all_reported_with_hints`). Here `burst` is there as well, so it
    // is judged as written.
    let yaml = limited("      unit: second\n      burst: 10\n      brust: 5\n");
    rejects_all(
        &yaml,
        &[
            (
                6,
                "descriptors[0].rate_limit.burst",
                "only applies to algorithm token_bucket",
            ),
            (
                7,
                "descriptors[0].rate_limit.brust",
                "did you mean `burst`?",
            ),
        ],
    );
    // A misspelt `algorithm` leaves the algorithm unknown: `burst` may well be right.
    let yaml = limited("      unit: second\n      algoritm: token_bucket\n      burst: 10\n");
    rejects_all(
        &yaml,
        &[(
            6,
            "descriptors[0].rate_limit.algoritm",
            "did you mean `algorithm`?",
        )],
    );
}

#[test]
fn a_merge_key_leaves_its_mapping_unknown() {
    // Merge keys are not supported; the descriptor they would complete is not also
    // missing its `key`, and the rest of the file is still checked.
    let yaml = "\
domain: d
descriptors:
  - <<: {key: a}
    value: b
  - key: c
    rate_limit: {unit: parsec}
";
    rejects_all(
        yaml,
        &[
            (3, "descriptors[0].<<", "unknown key `<<`"),
            (6, "descriptors[1].rate_limit.unit", "unknown unit `parsec`"),
        ],
    );
}

#[test]
fn a_repeated_key_leaves_its_value_unknown() {
    let yaml = limited(
        "      unit: second\n      algorithm: token_bucket\n      burst: 5\n      algorithm: fixed_window\n",
    );
    rejects_all(
        &yaml,
        &[(
            8,
            "descriptors[0].rate_limit.algorithm",
            "duplicate key `algorithm` (first on line 6)",
        )],
    );
}

#[test]
fn values_keep_their_text_while_other_errors_are_reported() {
    // Read from the text, `1.10` and `1.1` differ; a YAML value tree would make both
    // the float 1.1 and report a duplicate that is not there.
    let yaml = "\
domain: d
descriptors:
  - key: version
    value: 1.10
  - key: version
    value: 1.1
    typo: true
";
    rejects_all(yaml, &[(7, "descriptors[1].typo", "unknown key `typo`")]);
}

#[test]
fn a_wrong_value_behind_an_alias_is_repaired_where_it_is_written() {
    let yaml = "\
domain: d
descriptors:
  - key: a
    rate_limit: &shared {unit: second, requests_per_unit: lots}
  - key: b
    rate_limit: *shared
  - key: c
    rate_limit: {unit: parsec}
";
    rejects_all(
        yaml,
        &[
            (
                4,
                "descriptors[0].rate_limit.requests_per_unit",
                "invalid type: string \"lots\"",
            ),
            (8, "descriptors[2].rate_limit.unit", "unknown unit `parsec`"),
        ],
    );
}

#[test]
fn a_block_scalar_list_entry_hides_nothing() {
    // Once a limit of the text repair (a block scalar stayed a string, and the file's
    // other checks waited for the fix): the walk reads the tree, so both errors show.
    let yaml = "\
domain: d
descriptors:
  - |
    text
  - key: a
    rate_limit: {unit: parsec}
";
    let errors = errors(yaml);
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert_eq!(errors[0].path, "descriptors[0]");
    assert_eq!(errors[0].line, Some(3), "the line of its `|`");
    assert!(
        errors[0].message.contains("invalid type: string"),
        "{}",
        errors[0]
    );
    assert_eq!(errors[1].path, "descriptors[1].rate_limit.unit");
}

#[test]
fn zero_requests_is_a_valid_always_denying_limit() {
    for body in [
        "      unit: second\n      requests_per_unit: 0\n",
        "      unit: second\n",
    ] {
        let rules = load(&limited(body));
        let policy = *rules.descriptors[0]
            .rule
            .as_ref()
            .unwrap()
            .policy()
            .unwrap();
        assert_eq!(policy.requests_per_unit, 0);
    }
}

fn find<'a>(level: &'a [DescriptorRule], key: &str, value: Option<&str>) -> &'a DescriptorRule {
    level
        .iter()
        .find(|d| d.key == key && d.value.as_deref() == value)
        .unwrap_or_else(|| panic!("no {key}/{value:?}"))
}

#[test]
fn every_field_reaches_the_validated_rules() {
    let yaml = "\
domain: api
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: MINUTE, requests_per_unit: 5, name: sub, quota_mode: true}
        detailed_metric: true
  - key: path
    value: /api/*
    share_threshold: true
    shadow_mode: yes
    value_to_metric: true
    quota_mode: true
    metadata: {owner: team-a, 7: 1, nested: {list: [a, 2.5, ~]}}
    rate_limit:
      unit: second
      requests_per_unit: 10
      algorithm: GCRA
      burst: 20
      unit_multiplier: 5
      on_over_limit: Consume
      lockout_seconds: 60
      replaces: [{name: sub}]
  - key: free
    value: \"\"
    rate_limit: {unlimited: true, requests_per_unit: 7}
";
    let rules = load(yaml);
    assert_eq!(rules.domain, "api");
    let parent = find(&rules.descriptors, "key1", Some("value1"));
    assert!(parent.rule.is_none());
    let sub = find(&parent.children, "subkey1", None)
        .rule
        .as_ref()
        .unwrap();
    assert_eq!(sub.path, "key1_value1.subkey1");
    assert_eq!(sub.domain, "api");
    assert_eq!(sub.name.as_deref(), Some("sub"));
    assert!(sub.quota_mode && sub.detailed_metric && !sub.shadow_mode);
    assert_eq!(
        sub.policy().unwrap(),
        &crate::rules::Policy::fixed_window(5, Unit::Minute)
    );

    let wildcard = find(&rules.descriptors, "path", Some("/api/*"));
    assert!(wildcard.share_threshold);
    let rule = wildcard.rule.as_ref().unwrap();
    assert_eq!(rule.path, "path_/api/*");
    assert!(rule.shadow_mode && rule.value_to_metric && rule.quota_mode);
    assert_eq!(rule.replaces, ["sub"]);
    let metadata = serde_json::Value::Object(rule.metadata.as_ref().unwrap().0.clone());
    assert_eq!(
        metadata,
        serde_json::json!({"owner": "team-a", "7": 1, "nested": {"list": ["a", 2.5, null]}})
    );
    assert!(sub.metadata.is_none());
    let policy = rule.policy().unwrap();
    assert_eq!(policy.algorithm, Algorithm::TokenBucket);
    assert_eq!((policy.requests_per_unit, policy.burst), (10, 20));
    assert_eq!(policy.window_ms(), 5_000);
    assert_eq!(policy.on_over_limit, OnOverLimit::Consume);
    assert_eq!(policy.lockout_ms(), 60_000);

    let free = find(&rules.descriptors, "free", None)
        .rule
        .as_ref()
        .unwrap();
    assert_eq!(free.path, "free");
    assert_eq!(free.limit, Limit::Unlimited);
}

#[test]
fn algorithms_and_defaults() {
    for (name, algorithm) in [
        ("fixed_window", Algorithm::FixedWindow),
        ("token_bucket", Algorithm::TokenBucket),
        ("leaky_bucket", Algorithm::TokenBucket),
        ("sliding_window", Algorithm::SlidingWindow),
        ("sliding_log", Algorithm::SlidingLog),
    ] {
        let yaml = limited(&format!(
            "      unit: hour\n      requests_per_unit: 9\n      algorithm: {name}\n"
        ));
        let rules = load(&yaml);
        let policy = rules.descriptors[0]
            .rule
            .as_ref()
            .unwrap()
            .policy()
            .copied();
        let policy = policy.unwrap();
        assert_eq!(policy.algorithm, algorithm);
        assert_eq!((policy.burst, policy.unit_multiplier), (9, 1));
        assert_eq!(policy.on_over_limit, OnOverLimit::Reject);
        assert_eq!(policy.lockout, None);
    }
}

#[test]
fn anchors_and_aliases_load_like_the_reference() {
    let yaml = "\
domain: d
descriptors:
  - key: a
    rate_limit: &per_second {unit: second, requests_per_unit: 3}
  - key: b
    rate_limit: *per_second
";
    let rules = load(yaml);
    let policies: Vec<_> = rules
        .descriptors
        .iter()
        .map(|d| *d.rule.as_ref().unwrap().policy().unwrap())
        .collect();
    assert_eq!(policies[0], policies[1]);
}

#[test]
fn an_alias_of_a_value_read_as_something_else_is_checked_where_it_is_used() {
    // The anchor is free-form metadata; used as a rate_limit, it is judged at the alias.
    let yaml = "\
domain: d
descriptors:
  - key: a
    metadata: {shared: &r {unit: parsec, zzz: 1}}
  - key: b
    rate_limit: *r
";
    rejects_all(
        yaml,
        &[
            (6, "descriptors[1].rate_limit.zzz", "unknown key `zzz`"),
            (6, "descriptors[1].rate_limit.unit", "unknown unit `parsec`"),
        ],
    );
}

#[test]
fn aliases_expand_within_a_budget() {
    // Ten aliases of ten aliases of ...: 10^7 nodes if expanded; refused once, early.
    let mut yaml =
        "domain: d\ndescriptors:\n  - key: a\n    metadata:\n      l0: &l0 [x]\n".to_owned();
    for level in 1..8 {
        let items = vec![format!("*l{}", level - 1); 10].join(", ");
        yaml.push_str(&format!("      l{level}: &l{level} [{items}]\n"));
    }
    let errors = errors(&yaml);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(errors[0].message, "repetition limit exceeded");
}

#[test]
fn metadata_keys_must_differ() {
    let yaml = "domain: d\ndescriptors:\n  - key: a\n    metadata: {x: 1, y: {z: 1, z: 2}}\n";
    rejects(
        yaml,
        4,
        "descriptors[0].metadata.y",
        "duplicate entry with key \"z\"",
    );
}

#[test]
fn too_deep_a_file_is_one_error_with_its_line() {
    let yaml = format!(
        "domain: d\ndescriptors:\n  - key: a\n    metadata: {}{}\n",
        "[".repeat(200),
        "]".repeat(200)
    );
    rejects(&yaml, 4, "", "recursion limit exceeded");
}

#[test]
fn scope_global_marks_a_rule_for_one_budget_across_regions() {
    let yaml = "domain: g
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 100, scope: global}
  - key: zone
    rate_limit: {unit: minute, requests_per_unit: 100, scope: region}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 100}
";
    let rules = load(yaml);
    let global = |key: &str| {
        find(&rules.descriptors, key, None)
            .rule
            .as_ref()
            .unwrap()
            .global
    };
    assert!(global("tenant"));
    assert!(!global("zone") && !global("plain"));
}
