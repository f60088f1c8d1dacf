//! The command line: parsing, defaults, env vars, redaction.

use super::*;
use std::time::Duration;

fn parse(args: &[&str]) -> Command {
    let argv = std::iter::once("floodgate").chain(args.iter().copied());
    Cli::try_parse_from(with_default_command(argv.map(OsString::from)))
        .unwrap_or_else(|e| panic!("{e}"))
        .into_command()
}

fn serve(args: &[&str]) -> ServeArgs {
    match parse(args) {
        Command::Serve(args) => args,
        other => panic!("expected serve, got {other:?}"),
    }
}

#[test]
fn cli_definition_is_consistent() {
    use clap::CommandFactory;
    Cli::command().debug_assert();
}

#[test]
fn no_subcommand_means_serve_with_spec_defaults() {
    let args = serve(&[]);
    assert_eq!(args.config, PathBuf::from("config"));
    assert_eq!(args.grpc_addr.to_string(), "0.0.0.0:8081");
    assert_eq!(args.http_addr.to_string(), "0.0.0.0:8080");
    assert_eq!(args.backend, BackendKind::Memory);
    assert_eq!(args.redis_url, ["redis://127.0.0.1:6379".parse().unwrap()]);
    assert_eq!(args.redis_pool_size, 2);
    assert_eq!(
        args.backend_timeout.0,
        crate::backend::DEFAULT_BACKEND_TIMEOUT
    );
    assert_eq!(
        args.local_cache_max_age.0,
        crate::limiter::DEFAULT_LOCAL_CACHE_MAX_AGE
    );
    assert_eq!(args.failure_mode, FailureMode::Error);
    assert_eq!(args.response_headers, ResponseHeaders::Off);
    assert_eq!(args.local_cache_entries, 10_000);
    assert!(!args.shadow_mode);
    assert_eq!(args.log_format, LogFormat::Text);
    assert_eq!(args.key_prefix, "fg");
    assert_eq!(args.memory_max_buckets, 1_000_000);
    assert_eq!(args.drain_timeout.0, Duration::from_secs(10));
    assert_eq!(args.health_grace.0, Duration::from_secs(2));
}

/// The old `-ms` spellings (flags and variables) stay as hidden aliases in whole
/// milliseconds; the new ones take Go durations only, and the two cannot be mixed.
#[test]
fn old_millisecond_spellings_still_work() {
    let settings = |argv: &[&str]| serve(argv).settings().unwrap();
    let legacy = settings(&[
        "--backend-timeout-ms",
        "250",
        "--local-cache-max-age-ms",
        "1500",
        "--drain-timeout-ms",
        "700",
        "--health-grace-ms",
        "0",
    ]);
    let current = settings(&[
        "--backend-timeout",
        "250ms",
        "--local-cache-max-age",
        "1.5s",
        "--drain-timeout",
        "700ms",
        "--health-grace",
        "0",
    ]);
    for settings in [&legacy, &current] {
        assert_eq!(settings.limiter.backend_timeout, Duration::from_millis(250));
        assert_eq!(
            settings.limiter.local_cache_max_age,
            Duration::from_millis(1500)
        );
        assert_eq!(settings.drain_timeout, Duration::from_millis(700));
        assert_eq!(settings.shutdown_grace, Duration::ZERO);
    }
    for argv in [
        &["--backend-timeout", "250"][..],
        &["--backend-timeout", "0"],
        &["--backend-timeout", "250ms", "--backend-timeout-ms", "250"],
    ] {
        let argv = std::iter::once("floodgate").chain(argv.iter().copied());
        let parsed = Cli::try_parse_from(with_default_command(argv.map(OsString::from)));
        assert!(parsed.is_err(), "{parsed:?}");
    }
}

#[test]
fn serve_flags_parse_with_or_without_the_subcommand() {
    let flags = [
        "--backend",
        "redis-cluster",
        "--redis-url",
        "redis://a:7000,rediss://b:7001",
        "--failure-mode",
        "deny",
        "--response-headers",
        "ietf",
        "--shadow-mode",
        "--log-format",
        "json",
        "--grpc-addr",
        "127.0.0.1:0",
    ];
    let bare = serve(&flags);
    let with_serve = serve(&[&["serve"][..], &flags[..]].concat());
    for args in [bare, with_serve] {
        assert_eq!(args.backend, BackendKind::RedisCluster);
        let urls: Vec<_> = args.redis_url.iter().map(RedisUrl::as_str).collect();
        assert_eq!(urls, ["redis://a:7000", "rediss://b:7001"]);
        assert_eq!(args.failure_mode, FailureMode::Deny);
        assert_eq!(args.response_headers, ResponseHeaders::Ietf);
        assert!(args.shadow_mode);
        assert_eq!(args.log_format, LogFormat::Json);
        assert_eq!(args.grpc_addr.port(), 0);
    }
}

#[test]
fn check_config_takes_a_directory() {
    match parse(&["check-config", "some/dir"]) {
        Command::CheckConfig { dir } => assert_eq!(dir, PathBuf::from("some/dir")),
        other => panic!("{other:?}"),
    }
}

#[test]
fn bad_values_are_rejected() {
    for args in [
        &["--backend", "etcd"][..],
        &["--redis-url", "http://x"],
        &["--grpc-addr", "nowhere"],
        &["--redis-pool-size", "0"],
        &["--backend-timeout-ms", "0"],
        &["--backend-timeout", "500us"],
        &["--memory-max-buckets", "0"],
        &["--backend", "redis-cluster", "--redis-sentinel-master", "m"],
        &["--backend", "redis", "--redis-master-auth", "pw"],
        &[
            "--backend",
            "redis",
            "--redis-sentinel-master",
            "m",
            "--redis-url",
            "unix:///s",
        ],
        &["--per-second-redis-url", "redis://f:1"],
        &["--per-second-backend", "redis"],
        &[
            "--per-second-backend",
            "redis",
            "--per-second-redis-url",
            "http://f",
        ],
        &["check-config"],
        &["--config", "x", "check-config", "y"],
    ] {
        let argv = std::iter::once("floodgate").chain(args.iter().copied());
        let argv = with_default_command(argv.map(OsString::from));
        let rejected = match Cli::try_parse_from(argv).map(Cli::into_command) {
            Err(_) => true,
            // URLs are checked after parsing, so clap never echoes a password.
            Ok(Command::Serve(serve)) => serve.check().is_err(),
            Ok(Command::CheckConfig { .. } | Command::Bench(_)) => false,
        };
        assert!(rejected, "{args:?}");
    }
}

#[test]
fn every_serve_flag_has_its_env_var() {
    use clap::CommandFactory;
    let command = Cli::command();
    let serve = command.find_subcommand("serve").unwrap();
    let flags: Vec<_> = serve
        .get_arguments()
        .filter(|arg| arg.get_long().is_some_and(|long| long != "help"))
        .collect();
    assert_eq!(flags.len(), 90);
    for arg in flags {
        let long = arg.get_long().unwrap();
        let expected = format!("FLOODGATE_{}", long.to_uppercase().replace('-', "_"));
        let env = arg.get_env().and_then(|env| env.to_str());
        assert_eq!(env, Some(expected.as_str()), "--{long}");
    }
}

#[test]
fn redis_passwords_never_reach_debug_or_display() {
    let cases = [
        (
            "redis://user:s3cret@host:6379/0",
            "redis://user:***@host:6379/0",
        ),
        ("rediss://:s3cret@host", "rediss://:***@host"),
        ("redis://s3cret@host", "redis://***@host"),
        (
            "redis://host:6379?password=s3cret&db=1",
            "redis://host:6379?password=***&db=1",
        ),
        ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
    ];
    for (url, shown) in cases {
        let url: RedisUrl = url.parse().unwrap();
        assert_eq!(url.to_string(), shown);
        assert!(!format!("{url:?}").contains("s3cret"));
    }
    let args = serve(&["--redis-url", "redis://u:s3cret@h:1,redis://u:s3cret@h:2"]);
    let debug = format!("{args:?}");
    assert!(
        !debug.contains("s3cret") && debug.contains("u:***@h:2"),
        "{debug}"
    );
    let bad: RedisUrl = "http://u:s3cret@h".parse().unwrap();
    let err = bad.check().unwrap_err().to_string();
    assert!(!err.contains("s3cret"), "{err}");
    let no_scheme: RedisUrl = "u:s3cret@h:6379".parse().unwrap();
    let err = no_scheme.check().unwrap_err().to_string();
    assert!(
        !err.contains("s3cret") && err.contains("***@h:6379"),
        "{err}"
    );
}

#[test]
fn rlqs_flags_become_settings() {
    let defaults = serve(&[]).rlqs.settings().unwrap();
    assert_eq!(defaults, crate::rlqs::RlqsSettings::default());
    let set = serve(&["--rlqs-max-buckets", "5", "--rlqs-abandon-after", "2m"]);
    assert_eq!(
        set.rlqs.settings().unwrap(),
        crate::rlqs::RlqsSettings {
            max_buckets: 5,
            abandon_after: Duration::from_secs(120),
        }
    );
    for bad in ["0s", "25h"] {
        let args = serve(&["--rlqs-abandon-after", bad]);
        assert!(args.rlqs.settings().is_err(), "{bad}");
    }
}

#[test]
fn region_flags_name_each_peer_on_the_backends_kind() {
    let args = serve(&[
        "--backend",
        "redis-cluster",
        "--redis-url",
        "redis://127.0.0.1:7000",
        "--region",
        "eu",
        "--peer-region",
        "us=redis://10.0.0.1:7000,redis://10.0.0.2:7000",
        "--peer-region",
        "ap=redis://10.0.1.1:7000",
        "--lease-period",
        "500ms",
        "--failure-mode",
        "local",
    ]);
    let settings = args.settings().expect("valid");
    let regions = settings.regions.expect("regions on");
    assert_eq!(regions.name, "eu");
    assert_eq!(regions.period, Duration::from_millis(500));
    let names: Vec<&str> = regions
        .peers
        .iter()
        .map(|(name, _)| name.as_str())
        .collect();
    assert_eq!(names, ["us", "ap"]);
    match &regions.peers[0].1 {
        BackendSettings::Cluster { urls, options } => {
            assert_eq!(urls.len(), 2);
            // A peer is far away: its calls are bounded by a period at least.
            assert_eq!(options.timeout, Duration::from_millis(500));
        }
        other => panic!("a cluster peer, got {other:?}"),
    }
    assert_eq!(
        settings.limiter.failure_mode,
        crate::limiter::FailureMode::Local
    );
}

#[test]
fn region_flags_that_cannot_work_are_refused() {
    // Each after `--backend redis` unless it names its own: peers without a region, a peer
    // without its name, a region on the memory backend, local on memory, a peer named as
    // this region.
    let refused: [&[&str]; 5] = [
        &["--peer-region", "us=redis://h:1"],
        &["--region", "eu", "--peer-region", "redis://h:1"],
        &[
            "--backend",
            "memory",
            "--region",
            "eu",
            "--peer-region",
            "us=redis://h:1",
        ],
        &["--backend", "memory", "--failure-mode", "local"],
        &["--region", "eu", "--peer-region", "eu=redis://h:1"],
    ];
    for flags in refused {
        let mut line = flags.to_vec();
        if !flags.contains(&"--backend") {
            line.extend(["--backend", "redis"]);
        }
        assert!(serve(&line).settings().is_err(), "{flags:?}");
    }
}
