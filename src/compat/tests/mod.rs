//! The mapping, fed from maps: the process environment is never touched.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::{CommandFactory, FromArgMatches};
use redis::{ConnectionAddr, IntoConnectionInfo};

use super::*;
use crate::cli::{Cli, Command, serve_matches};
use crate::otel::TracingSettings;

mod redis_vars;
mod statsd_vars;
mod table;
mod xds_tracing;

/// Parses `argv` as the binary does and applies `vars` as the reference environment.
fn run(argv: &[&str], vars: &[(&str, &str)]) -> Result<(ServeArgs, Report), ReferenceEnvError> {
    let argv = std::iter::once("floodgate").chain(argv.iter().copied());
    let argv = crate::cli::with_default_command(argv.map(std::ffi::OsString::from));
    let matches = Cli::command()
        .try_get_matches_from(argv)
        .expect("argv parses");
    let Command::Serve(mut args) = Cli::from_arg_matches(&matches).unwrap().into_command() else {
        panic!("expected serve");
    };
    let env: BTreeMap<String, String> = vars
        .iter()
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect();
    let report = apply(&mut args, serve_matches(&matches), &env)?;
    Ok((args, report))
}

/// Reference variables, as a test case gives them.
type Vars<'a> = &'a [(&'a str, &'a str)];

fn mapped(vars: &[(&str, &str)]) -> (ServeArgs, Report) {
    run(&[], vars).unwrap_or_else(|error| panic!("{vars:?}: {error}"))
}

fn error(vars: &[(&str, &str)]) -> ReferenceEnvError {
    match run(&[], vars) {
        Ok((args, _)) => panic!("{vars:?} accepted: {args:?}"),
        Err(error) => error,
    }
}

fn urls(args: &ServeArgs) -> Vec<&str> {
    args.redis_url.iter().map(RedisUrl::as_str).collect()
}

fn warned(report: &Report) -> Vec<&str> {
    report
        .unsupported
        .iter()
        .map(|unsupported| unsupported.variable.as_str())
        .collect()
}

#[test]
fn setting_ids_name_the_serve_arguments() {
    let command = Cli::command();
    let serve = command.find_subcommand("serve").unwrap();
    let composites = [
        CONFIG,
        GRPC_ADDR,
        HTTP_ADDR,
        BACKEND,
        REDIS_URL,
        REDIS_POOL_SIZE,
        GRPC_TLS_CERT,
        GRPC_TLS_KEY,
        REDIS_SENTINEL_MASTER,
        REDIS_MASTER_AUTH,
        PER_SECOND_BACKEND,
        PER_SECOND_REDIS_URL,
        PER_SECOND_REDIS_POOL_SIZE,
        PER_SECOND_REDIS_SENTINEL_MASTER,
        PER_SECOND_REDIS_MASTER_AUTH,
        XDS_BACKOFF_JITTER,
        OTLP_ENDPOINT,
        OTLP_PROTOCOL,
        TRACING_SERVICE_NAME,
    ];
    let rows = super::table::ROWS.iter().map(|row| row.setting);
    for setting in composites.into_iter().chain(rows) {
        let arg = serve
            .get_arguments()
            .find(|arg| arg.get_id() == setting.id().as_str())
            .unwrap_or_else(|| panic!("no argument `{}`", setting.id()));
        assert_eq!(format!("--{}", arg.get_long().unwrap()), setting.flag);
    }
}

#[test]
fn without_reference_variables_nothing_changes() {
    let (untouched, _) = run(&[], &[]).unwrap();
    let (args, report) = mapped(&[
        ("PATH", "/usr/bin"),
        ("USE_PROMETHEUS", "true"),
        ("DEBUG_PORT", ""),
    ]);
    assert_eq!(format!("{args:?}"), format!("{untouched:?}"));
    assert_eq!(report, Report::default());
    assert_eq!(args.backend, BackendKind::Memory);
}

#[test]
fn a_reference_deployment_maps_onto_floodgate_settings() {
    let (args, report) = mapped(&[
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "redis.ns.svc:6379"),
        ("REDIS_POOL_SIZE", "20"),
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("HOST", "127.0.0.1"),
        ("PORT", "9080"),
        ("GRPC_PORT", "9081"),
        ("LOG_LEVEL", "DEBUG"),
        ("LOG_FORMAT", "json"),
        ("SHADOW_MODE", "true"),
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "True"),
        ("LOCAL_CACHE_SIZE_IN_BYTES", "1048576"),
        ("CACHE_KEY_PREFIX", "rl_"),
        ("USE_STATSD", "false"),
    ]);
    assert_eq!(args.backend, BackendKind::Redis);
    assert_eq!(urls(&args), ["redis://redis.ns.svc:6379"]);
    assert_eq!(args.redis_pool_size, 20);
    assert_eq!(args.config, PathBuf::from("/data/ratelimit/config"));
    assert_eq!(args.http_addr.to_string(), "127.0.0.1:9080");
    assert_eq!(args.grpc_addr.to_string(), "0.0.0.0:9081");
    assert_eq!(report.log_level, Some(LevelFilter::DEBUG));
    assert_eq!(args.log_format, LogFormat::Json);
    assert!(args.shadow_mode);
    assert_eq!(args.response_headers, ResponseHeaders::Legacy);
    assert_eq!(args.local_cache_entries, 10_485);
    assert_eq!(args.key_prefix, "rl_");
    assert!(report.unsupported.is_empty(), "{:?}", report.unsupported);
    assert!(report.overridden.is_empty(), "{:?}", report.overridden);
    for pair in [
        ("REDIS_URL", "--redis-url"),
        ("REDIS_SOCKET_TYPE", "--redis-url"),
        ("REDIS_URL", "--backend"),
        ("PORT", "--http-addr"),
        ("RUNTIME_SUBDIRECTORY", "--config"),
        ("LOG_LEVEL", "RUST_LOG"),
    ] {
        assert!(
            report.applied.contains(&pair),
            "{pair:?}: {:?}",
            report.applied
        );
    }
}

#[test]
fn floodgate_settings_win_and_their_stand_ins_are_not_parsed() {
    let vars = [
        ("PORT", "not-a-port"),
        ("HOST", "127.0.0.1"),
        ("GRPC_PORT", "9001"),
        ("RUNTIME_ROOT", "/data"),
        ("REDIS_URL", "r:6379"),
        ("REDIS_AUTH", "s3cret"),
        ("SHADOW_MODE", "bogus"),
        ("LOG_FORMAT", "xml"),
    ];
    let flags = [
        "--http-addr",
        "127.0.0.1:1",
        "--config",
        "mine",
        "--backend",
        "memory",
        "--shadow-mode",
        "--log-format",
        "text",
    ];
    let with_subcommand = [&["serve"][..], &flags[..]].concat();
    for argv in [&flags[..], &with_subcommand[..]] {
        let (args, report) = run(argv, &vars).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        assert_eq!(args.http_addr.to_string(), "127.0.0.1:1");
        assert_eq!(args.grpc_addr.to_string(), "0.0.0.0:9001");
        assert_eq!(args.config, PathBuf::from("mine"));
        assert_eq!(args.backend, BackendKind::Memory);
        assert_eq!(urls(&args), ["redis://127.0.0.1:6379"]);
        assert!(args.shadow_mode);
        let mut overridden = report.overridden.clone();
        overridden.sort();
        assert_eq!(
            overridden,
            [
                ("HOST", "--http-addr"),
                ("LOG_FORMAT", "--log-format"),
                ("PORT", "--http-addr"),
                ("REDIS_AUTH", "--backend"),
                ("REDIS_URL", "--backend"),
                ("RUNTIME_ROOT", "--config"),
                ("SHADOW_MODE", "--shadow-mode"),
            ]
        );
        assert_eq!(report.applied, [("GRPC_PORT", "--grpc-addr")]);
    }
}

#[test]
fn unusable_values_stop_startup_naming_the_variable() {
    let cases: [(Vars, &str); 22] = [
        (&[("REDIS_TYPE", "sentinel")], "REDIS_TYPE"),
        (&[("REDIS_TYPE", "ring")], "REDIS_TYPE"),
        (&[("BACKEND_TYPE", "memcache")], "BACKEND_TYPE"),
        (&[("BACKEND_TYPE", "etcd")], "BACKEND_TYPE"),
        (&[("REDIS_URL", "r:1"), ("REDIS_TLS", "yes")], "REDIS_TLS"),
        (&[("SHADOW_MODE", "on")], "SHADOW_MODE"),
        (
            &[("LIMIT_RESPONSE_HEADERS_ENABLED", "enabled")],
            "LIMIT_RESPONSE_HEADERS_ENABLED",
        ),
        (&[("PORT", "http")], "PORT"),
        (&[("GRPC_PORT", "70000")], "GRPC_PORT"),
        (&[("HOST", "localhost")], "HOST"),
        (&[("LOG_LEVEL", "verbose")], "LOG_LEVEL"),
        (&[("LOG_FORMAT", "xml")], "LOG_FORMAT"),
        (
            &[("LOCAL_CACHE_SIZE_IN_BYTES", "-1")],
            "LOCAL_CACHE_SIZE_IN_BYTES",
        ),
        (&[("REDIS_POOL_SIZE", "0")], "REDIS_POOL_SIZE"),
        (
            &[("REDIS_SOCKET_TYPE", "udp"), ("REDIS_URL", "r:1")],
            "REDIS_SOCKET_TYPE",
        ),
        (
            &[("REDIS_TYPE", "cluster"), ("REDIS_URL", "/run/r.sock")],
            "REDIS_SOCKET_TYPE",
        ),
        (
            &[("REDIS_URL", "/run/r.sock"), ("REDIS_TLS", "true")],
            "REDIS_TLS",
        ),
        (
            &[("REDIS_SOCKET_TYPE", "unix"), ("REDIS_URL", "r.sock")],
            "REDIS_URL",
        ),
        (&[("REDIS_URL", " , ")], "REDIS_URL"),
        (
            &[
                ("REDIS_URL", "redis://u:inurl@r:1"),
                ("REDIS_AUTH", "s3cret"),
            ],
            "REDIS_AUTH",
        ),
        (&[("REDIS_URL", "http://u:s3cret@r")], "REDIS_URL"),
        (
            &[("REDIS_URL", "redis://[r:1"), ("REDIS_AUTH", "s3cret")],
            "REDIS_URL",
        ),
    ];
    for (vars, variable) in cases {
        let error = error(vars);
        assert_eq!(error.variable, variable, "{vars:?}: {error}");
        let shown = error.to_string();
        assert!(shown.starts_with(&format!("{variable}: ")), "{shown}");
        assert!(
            !shown.contains("s3cret") && !shown.contains("inurl"),
            "{shown}"
        );
    }
    // A Sentinel URL is `master,sentinel:port,...`: never a list of seeds or nodes.
    let given = run(
        &["--backend", "redis-cluster"],
        &[("REDIS_TYPE", "sentinel"), ("REDIS_URL", "m,s1:26379")],
    );
    assert_eq!(given.unwrap_err().variable, "REDIS_TYPE");
    for (vars, variable) in [
        (
            &[("REDIS_TYPE", "sentinel"), ("REDIS_URL", "redis://a:1,b:2")][..],
            "REDIS_URL",
        ),
        (
            &[("REDIS_TYPE", "sentinel"), ("REDIS_URL", "m")],
            "REDIS_URL",
        ),
        (
            &[("REDIS_TYPE", "sentinel"), ("REDIS_URL", "m,/run/s.sock")],
            "REDIS_SOCKET_TYPE",
        ),
        (
            &[
                ("REDIS_PERSECOND", "true"),
                ("REDIS_PERSECOND_TYPE", "ring"),
            ],
            "REDIS_PERSECOND_TYPE",
        ),
        (&[("REDIS_PERSECOND", "true")], "REDIS_PERSECOND"),
    ] {
        assert_eq!(error(vars).variable, variable, "{vars:?}");
    }
    let memcache = error(&[("BACKEND_TYPE", "memcache")]).to_string();
    assert!(memcache.contains("atomically"), "{memcache}");
}

#[test]
fn quota_mode_stands_for_the_global_quota_switch() {
    assert!(mapped(&[("QUOTA_MODE", "true")]).0.quota_mode);
    assert!(!mapped(&[("QUOTA_MODE", "false")]).0.quota_mode);
    assert_eq!(error(&[("QUOTA_MODE", "maybe")]).variable, "QUOTA_MODE");
}

#[test]
fn booleans_parse_as_go_does() {
    for value in ["1", "t", "T", "TRUE", "true", "True"] {
        assert!(mapped(&[("SHADOW_MODE", value)]).0.shadow_mode, "{value}");
    }
    for value in ["0", "f", "F", "FALSE", "false", "False"] {
        assert!(!mapped(&[("SHADOW_MODE", value)]).0.shadow_mode, "{value}");
    }
    for value in ["yes", "on", "tRUE", "true ", "2"] {
        assert_eq!(error(&[("SHADOW_MODE", value)]).variable, "SHADOW_MODE");
    }
    // Empty reads as unset, as a templated manifest renders an unset value.
    assert!(!mapped(&[("SHADOW_MODE", "")]).0.shadow_mode);
}

#[test]
fn log_level_applies_unless_rust_log_is_set() {
    let levels = [
        ("trace", LevelFilter::TRACE),
        ("Debug", LevelFilter::DEBUG),
        ("INFO", LevelFilter::INFO),
        ("warn", LevelFilter::WARN),
        ("warning", LevelFilter::WARN),
        ("error", LevelFilter::ERROR),
        ("fatal", LevelFilter::ERROR),
        ("PANIC", LevelFilter::ERROR),
    ];
    for (value, level) in levels {
        assert_eq!(mapped(&[("LOG_LEVEL", value)]).1.log_level, Some(level));
    }
    let (_, report) = mapped(&[("LOG_LEVEL", "not-parsed"), ("RUST_LOG", "debug")]);
    assert_eq!(report.log_level, None);
    assert_eq!(report.overridden, [("LOG_LEVEL", "RUST_LOG")]);
    let (_, report) = mapped(&[("LOG_LEVEL", "warn"), ("RUST_LOG", "")]);
    assert_eq!(report.log_level, Some(LevelFilter::WARN));
}

#[test]
fn local_cache_bytes_become_entries() {
    for (bytes, entries) in [("1048576", 10_485), ("100", 1), ("99", 0), ("0", 0)] {
        let (args, _) = mapped(&[("LOCAL_CACHE_SIZE_IN_BYTES", bytes)]);
        assert_eq!(args.local_cache_entries, entries, "{bytes}");
    }
}

#[test]
fn rule_directory_is_root_subdirectory_and_app_directory() {
    let cases: [(Vars, &str); 5] = [
        (
            &[
                ("RUNTIME_ROOT", "/data"),
                ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ],
            "/data/ratelimit/config",
        ),
        (&[("RUNTIME_ROOT", "/data")], "/data/config"),
        (
            &[("RUNTIME_SUBDIRECTORY", "rl")],
            "/srv/runtime_data/current/rl/config",
        ),
        (
            &[
                ("RUNTIME_ROOT", "/data"),
                ("RUNTIME_SUBDIRECTORY", "/rl"),
                ("RUNTIME_APPDIRECTORY", "/rules"),
            ],
            "/data/rl/rules",
        ),
        (
            &[("RUNTIME_ROOT", "/data/"), ("RUNTIME_APPDIRECTORY", "")],
            "/data/config",
        ),
    ];
    for (vars, dir) in cases {
        assert_eq!(mapped(vars).0.config, PathBuf::from(dir), "{vars:?}");
    }
    let (args, report) = mapped(&[("RUNTIME_APPDIRECTORY", "rules")]);
    assert_eq!(args.config, PathBuf::from("config"));
    assert_eq!(warned(&report), ["RUNTIME_APPDIRECTORY"]);
}

#[test]
fn listen_addresses_come_from_host_and_port() {
    let cases: [(Vars, &str, &str); 4] = [
        (&[("HOST", "::"), ("PORT", "0")], "[::]:0", "0.0.0.0:8081"),
        (&[("HOST", "[::1]")], "[::1]:8080", "0.0.0.0:8081"),
        (&[("PORT", "9")], "0.0.0.0:9", "0.0.0.0:8081"),
        (
            &[("GRPC_HOST", "127.0.0.1"), ("GRPC_PORT", "0")],
            "0.0.0.0:8080",
            "127.0.0.1:0",
        ),
    ];
    for (vars, http, grpc) in cases {
        let (args, _) = mapped(vars);
        assert_eq!(args.http_addr.to_string(), http, "{vars:?}");
        assert_eq!(args.grpc_addr.to_string(), grpc, "{vars:?}");
    }
}

#[test]
fn response_headers_follow_the_reference_switch() {
    let (args, _) = mapped(&[("LIMIT_RESPONSE_HEADERS_ENABLED", "false")]);
    assert_eq!(args.response_headers, ResponseHeaders::Off);
    let (args, _) = run(
        &["--response-headers", "ietf"],
        &[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")],
    )
    .unwrap();
    assert_eq!(args.response_headers, ResponseHeaders::Ietf);
}

#[test]
fn unsupported_variables_are_reported_by_name() {
    let quiet = [
        ("USE_STATSD", "false"),
        ("USE_PROMETHEUS", "true"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("NEAR_LIMIT_RATIO", "0.80"),
        ("CONFIG_TYPE", "file"),
        ("REDIS_PERSECOND", "false"),
        ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"),
        ("TRACING_ENABLED", "0"),
        ("EXPIRATION_JITTER_MAX_SECONDS", "300"),
        ("LIMIT_RESET_HEADER", "ratelimit-reset"),
        ("DEBUG_PORT", ""),
    ];
    assert!(mapped(&quiet).1.unsupported.is_empty());
    let loud = [
        ("USE_DOG_STATSD_MOGRIFIERS", "TAG"),
        ("REDIS_PERSECOND_PIPELINE_WINDOW", "1ms"),
        ("MEMCACHE_HOST_PORT", "m:11211"),
        ("DEBUG_PORT", "6070"),
        ("RUNTIME_IGNOREDOTFILES", "false"),
        ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "5s"),
        ("TRACING_SERVICE_NAME", "rl"),
        ("NEAR_LIMIT_RATIO", "0.9"),
        ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
    ];
    let (args, report) = mapped(&loud);
    assert_eq!(args.backend, BackendKind::Memory);
    let mut expected: Vec<_> = loud.iter().map(|(name, _)| *name).collect();
    expected.sort();
    let mut got = warned(&report);
    got.sort();
    assert_eq!(got, expected);
    assert!(report.unsupported.iter().all(|u| !u.reason.is_empty()));
}

#[test]
fn grpc_tls_variables_apply_with_use_tls() {
    let vars = [
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", "/tls/cert.pem"),
        ("GRPC_SERVER_TLS_KEY", "/tls/key.pem"),
        ("GRPC_CLIENT_TLS_CACERT", "/tls/ca.pem"),
        ("GRPC_CLIENT_TLS_SAN", "envoy.mesh"),
    ];
    let (args, report) = mapped(&vars);
    assert_eq!(
        args.grpc.grpc_tls_cert,
        Some(PathBuf::from("/tls/cert.pem"))
    );
    assert_eq!(args.grpc.grpc_tls_key, Some(PathBuf::from("/tls/key.pem")));
    assert_eq!(
        args.grpc.grpc_tls_client_ca,
        Some(PathBuf::from("/tls/ca.pem"))
    );
    assert_eq!(args.grpc.grpc_tls_client_san.as_deref(), Some("envoy.mesh"));
    assert!(report.unsupported.is_empty(), "{report:?}");
    assert!(
        report
            .applied
            .contains(&("GRPC_CLIENT_TLS_SAN", "--grpc-tls-client-san"))
    );
    let tls = args.settings().unwrap().grpc_tls.unwrap();
    assert_eq!(tls.client_san.as_deref(), Some("envoy.mesh"));
}

#[test]
fn grpc_tls_variables_without_use_tls_are_reported_not_applied() {
    for use_tls in [None, Some("false")] {
        let mut vars = vec![
            ("GRPC_SERVER_TLS_CERT", "/c"),
            ("GRPC_SERVER_TLS_KEY", "/k"),
        ];
        vars.extend(use_tls.map(|value| ("GRPC_SERVER_USE_TLS", value)));
        let (args, report) = mapped(&vars);
        assert_eq!(args.grpc.grpc_tls_cert, None);
        assert_eq!(
            warned(&report),
            ["GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY"]
        );
    }
}

#[test]
fn grpc_tls_flags_win_over_the_variables() {
    let vars = [
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", "/ref/cert.pem"),
        ("GRPC_SERVER_TLS_KEY", "/ref/key.pem"),
    ];
    let flags = [
        "--grpc-tls-cert",
        "/fg/cert.pem",
        "--grpc-tls-key",
        "/fg/key.pem",
    ];
    let (args, report) = run(&flags, &vars).unwrap();
    assert_eq!(args.grpc.grpc_tls_cert, Some(PathBuf::from("/fg/cert.pem")));
    assert_eq!(args.grpc.grpc_tls_key, Some(PathBuf::from("/fg/key.pem")));
    assert!(
        report
            .overridden
            .contains(&("GRPC_SERVER_TLS_KEY", "--grpc-tls-key"))
    );
}

#[test]
fn use_tls_without_files_stops_startup() {
    let missing_key = error(&[
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", "/c"),
    ]);
    assert_eq!(missing_key.variable, "GRPC_SERVER_USE_TLS");
    assert_eq!(
        error(&[("GRPC_SERVER_USE_TLS", "maybe")]).variable,
        "GRPC_SERVER_USE_TLS"
    );
}

#[test]
fn connection_age_variables_are_go_durations() {
    let (args, report) = mapped(&[
        ("GRPC_MAX_CONNECTION_AGE", "30m"),
        ("GRPC_MAX_CONNECTION_AGE_GRACE", "1m30s"),
    ]);
    assert_eq!(
        args.grpc.grpc_max_connection_age.0,
        std::time::Duration::from_secs(1800)
    );
    assert_eq!(
        args.grpc.grpc_max_connection_age_grace.0,
        std::time::Duration::from_secs(90)
    );
    assert!(report.unsupported.is_empty());
    assert_eq!(
        error(&[("GRPC_MAX_CONNECTION_AGE", "1 day")]).variable,
        "GRPC_MAX_CONNECTION_AGE"
    );
}

#[test]
fn go_durations_parse() {
    let ms = |text: &str| parse_go_duration(text).map(|d| d.as_millis());
    assert_eq!(ms("10s"), Ok(10_000));
    assert_eq!(ms("1m30s"), Ok(90_000));
    assert_eq!(ms("250ms"), Ok(250));
    assert_eq!(ms("1.5h"), Ok(5_400_000));
    assert_eq!(ms("0"), Ok(0));
    for bad in ["", "10", "s", "1d", "-1s", "1.2.3s"] {
        assert!(parse_go_duration(bad).is_err(), "{bad}");
    }
}
