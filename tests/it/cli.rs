//! The built binary, run as an operator would: `check-config`, `--version`, `serve`.

use crate::common;

use std::path::Path;
use std::process::{Command, Output};

fn floodgate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_floodgate"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("FLOODGATE_CONFIG")
        .output()
        .expect("run floodgate")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn check_config_accepts_the_shipped_examples() {
    let out = floodgate(&["check-config", "config"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.starts_with("OK: 3 domains, "), "{stdout}");
    assert!(stdout.trim_end().ends_with(" rules"), "{stdout}");
    assert!(out.stderr.is_empty());
}

#[test]
fn check_config_reports_a_typo_with_file_and_line() {
    let out = floodgate(&["check-config", "tests/fixtures/bad/typo"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let stderr = text(&out.stderr);
    let expected = Path::new("tests/fixtures/bad/typo/api.yaml:8: ")
        .display()
        .to_string();
    assert!(stderr.starts_with(&expected), "{stderr}");
    assert!(stderr.contains("requests_per_unt"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[test]
fn check_config_prints_every_error_of_every_file() {
    let out = floodgate(&["check-config", "tests/fixtures/bad/two-files"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    let lines: Vec<_> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    assert!(lines[0].starts_with("tests/fixtures/bad/two-files/a.yaml:3: "));
    assert!(lines[1].starts_with("tests/fixtures/bad/two-files/b.yml:1: "));
}

#[test]
fn check_config_is_not_confused_by_serve_settings_in_the_environment() {
    let out = Command::new(env!("CARGO_BIN_EXE_floodgate"))
        .args(["check-config", "config"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("FLOODGATE_CONFIG", "elsewhere")
        .env("FLOODGATE_BACKEND", "redis")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[test]
fn version_shows_crate_version_and_git_revision() {
    let out = floodgate(&["--version"]);
    assert_eq!(out.status.code(), Some(0));
    let stdout = text(&out.stdout);
    let prefix = format!("floodgate {} (git ", env!("CARGO_PKG_VERSION"));
    assert!(stdout.starts_with(&prefix), "{stdout}");
    let revision = stdout[prefix.len()..].trim_end().trim_end_matches(')');
    assert!(
        revision == "unknown"
            || (revision.len() >= 7 && revision.chars().all(|c| c.is_ascii_hexdigit())),
        "{stdout}"
    );
}

#[test]
fn serve_never_prints_the_redis_password() {
    // Unresolvable seed nodes: startup fails fast, after logging its settings.
    let out = common::serve_command()
        .env(
            "FLOODGATE_REDIS_URL",
            "redis://app:s3cret@unresolvable.invalid:6379,rediss://app:s3cret@b.invalid:6380",
        )
        .env("FLOODGATE_BACKEND", "redis-cluster")
        .env("FLOODGATE_BACKEND_TIMEOUT_MS", "200")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(all.contains("Cluster"), "{all}");
    assert!(!all.contains("s3cret"), "{all}");
}

#[test]
fn usage_errors_exit_2() {
    let out = floodgate(&["check-config"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("DIR"));
}

#[test]
fn serve_variables_do_not_affect_check_config() {
    let out = Command::new(env!("CARGO_BIN_EXE_floodgate"))
        .args(["check-config", "config"])
        .env("FLOODGATE_SHADOW_MODE", "1")
        .env("FLOODGATE_GRPC_ADDR", "not-an-address")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[test]
fn check_config_prints_errors_that_serde_alone_would_hide() {
    let dir = tempfile::tempdir().unwrap();
    let broken = "\
domain: api
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1, brust: 5}
  - just_a_string
  - key: b
    rate_limit: {unit: fortnight}
";
    std::fs::write(dir.path().join("api.yaml"), broken).unwrap();
    std::fs::write(dir.path().join("zz.yaml"), "domain: api\n").unwrap();
    let dir_arg = dir.path().to_str().unwrap();
    let out = floodgate(&["check-config", dir_arg]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    let lines: Vec<_> = stderr.lines().collect();
    let at = |file: &str, line: usize| format!("{}:{line}: ", dir.path().join(file).display());
    let expected = [
        (
            at("api.yaml", 4),
            "descriptors[0].rate_limit.brust: unknown key",
        ),
        (at("api.yaml", 5), "descriptors[1]: invalid type: string"),
        (
            at("api.yaml", 7),
            "descriptors[2].rate_limit.unit: unknown unit",
        ),
        (at("zz.yaml", 1), "domain: duplicate domain `api`"),
    ];
    assert_eq!(lines.len(), expected.len(), "{stderr}");
    for (line, (prefix, what)) in lines.iter().zip(&expected) {
        assert!(line.starts_with(&format!("{prefix}{what}")), "{stderr}");
    }
}

/// A TLS setting beside a plaintext scheme stops startup naming both, for flags and for the
/// reference's variables alike; a matching scheme passes the check.
#[test]
fn tls_settings_with_a_plaintext_scheme_stop_startup() {
    /// Environment of one run, and the two settings its error must name.
    type Case = (Vec<(String, String)>, [&'static str; 2]);
    let pem = tempfile::NamedTempFile::new().unwrap();
    let pem = pem.path().to_str().unwrap().to_owned();
    let xds = |server: &str| -> Vec<(String, String)> {
        vec![
            ("FLOODGATE_CONFIG_SOURCE".into(), "xds".into()),
            ("FLOODGATE_XDS_SERVER".into(), server.into()),
        ]
    };
    let redis = |url: &str| -> Vec<(String, String)> {
        vec![
            ("FLOODGATE_BACKEND".into(), "redis".into()),
            ("FLOODGATE_REDIS_URL".into(), url.into()),
        ]
    };
    let with = |mut base: Vec<(String, String)>, name: &str, value: &str| {
        base.push((name.into(), value.into()));
        base
    };
    let cases: Vec<Case> = vec![
        (
            with(xds("http://u:pw@127.0.0.1:1"), "FLOODGATE_XDS_TLS", "true"),
            ["--xds-tls", "--xds-server"],
        ),
        (
            with(xds("127.0.0.1:1"), "FLOODGATE_XDS_TLS_CA", &pem),
            ["--xds-tls-ca", "--xds-tls"],
        ),
        (
            with(xds("http://127.0.0.1:1"), "FLOODGATE_XDS_TLS_CERT", &pem),
            ["--xds-tls-cert", "--xds-server"],
        ),
        (
            with(xds("127.0.0.1:1"), "FLOODGATE_XDS_TLS_KEY", &pem),
            ["--xds-tls-key", "--xds-tls"],
        ),
        (
            with(xds("127.0.0.1:1"), "FLOODGATE_XDS_TLS_SAN", "cp.internal"),
            ["--xds-tls-san", "--xds-tls"],
        ),
        (
            with(
                redis("redis://u:pw@127.0.0.1:1"),
                "FLOODGATE_REDIS_CA_FILE",
                &pem,
            ),
            ["--redis-ca-file", "--redis-url"],
        ),
        (
            with(
                with(
                    redis("redis://127.0.0.1:1"),
                    "FLOODGATE_REDIS_TLS_CLIENT_CERT",
                    &pem,
                ),
                "FLOODGATE_REDIS_TLS_CLIENT_KEY",
                &pem,
            ),
            ["--redis-tls-client-cert", "--redis-url"],
        ),
        (
            vec![
                ("BACKEND_TYPE".into(), "redis".into()),
                ("REDIS_URL".into(), "127.0.0.1:1".into()),
                ("REDIS_TLS_CACERT".into(), pem.clone()),
            ],
            ["--redis-ca-file", "--redis-url"],
        ),
        (
            vec![
                ("CONFIG_TYPE".into(), "GRPC_XDS_SOTW".into()),
                ("CONFIG_GRPC_XDS_SERVER_URL".into(), "127.0.0.1:1".into()),
                ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT".into(), pem.clone()),
            ],
            ["--xds-tls-ca", "--xds-tls"],
        ),
    ];
    for (env, names) in cases {
        let out = common::serve_command()
            .env_clear()
            .envs(env.clone())
            .output()
            .unwrap();
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{env:?}: {stderr}");
        for name in names {
            assert!(
                stderr.contains(name),
                "{env:?} does not name {name}: {stderr}"
            );
        }
        assert!(!stderr.contains("pw@"), "{stderr}");
    }
}

/// The kernel's view of a process's transparent huge pages (`THP_enabled` in its status).
fn huge_pages_allowed(pid: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let line = status
        .lines()
        .find(|line| line.starts_with("THP_enabled:"))
        .expect("kernel reports THP_enabled");
    line.ends_with('1')
}

#[test]
fn serve_runs_on_small_pages_unless_mimalloc_is_told_otherwise() {
    let plain = common::Binary::start(&[], &[]);
    assert!(!huge_pages_allowed(plain.child.id()));
    let told = common::Binary::start(&[], &[("MIMALLOC_ALLOW_THP", "1")]);
    assert!(huge_pages_allowed(told.child.id()));
}

/// Every flag of every subcommand, as `--help` shows it (the same command definition
/// renders the help): durations take one grammar (Go's), so no visible flag is named in
/// milliseconds (`-ms`; the old names are hidden aliases), and every flag that takes a value
/// names it, instead of clap's default, the flag's id in capitals (`<RLQS_NO_ASSIGNMENT>`).
#[test]
fn help_shows_one_duration_grammar_and_a_value_name_for_every_flag() {
    use clap::CommandFactory;
    let root = floodgate::cli::Cli::command();
    let mut commands = vec![&root];
    commands.extend(root.get_subcommands());
    let mut problems = Vec::new();
    let mut flags = 0;
    for command in commands {
        for arg in command.get_arguments().filter(|arg| !arg.is_hide_set()) {
            let Some(long) = arg.get_long() else {
                continue;
            };
            flags += 1;
            let name = format!("{} --{long}", command.get_name());
            if long.ends_with("-ms") || long.contains("-ms-") {
                problems.push(format!("{name}: named in milliseconds"));
            }
            if arg.get_action().takes_values() && arg.get_value_names().is_none() {
                problems.push(format!("{name}: no value name"));
            }
        }
    }
    assert!(flags > 100, "only {flags} flags");
    assert!(problems.is_empty(), "{problems:#?}");
    // And the help itself shows the durations as such.
    let help = text(&floodgate(&["serve", "--help"]).stdout);
    assert!(help.contains("--backend-timeout <DURATION>"), "{help}");
    assert!(!help.contains("-ms "), "{help}");
}
