//! The backend and Redis variables.

use super::*;

#[test]
fn an_explicit_redis_backend_still_takes_the_reference_url() {
    let (args, report) = run(
        &["--backend", "redis-cluster"],
        &[("REDIS_TYPE", "single"), ("REDIS_URL", "a:1,b:2")],
    )
    .unwrap();
    assert_eq!(args.backend, BackendKind::RedisCluster);
    assert_eq!(urls(&args), ["redis://a:1", "redis://b:2"]);
    assert_eq!(report.overridden, [("REDIS_TYPE", "--backend")]);
}

#[test]
fn redis_variables_choose_the_backend_and_its_urls() {
    let cases: [(Vars, BackendKind, &[&str]); 8] = [
        (
            &[("REDIS_SOCKET_TYPE", "tcp"), ("REDIS_URL", "redis:6379")],
            BackendKind::Redis,
            &["redis://redis:6379"],
        ),
        (
            &[("REDIS_TYPE", "CLUSTER"), ("REDIS_URL", "a:7000, b:7001,")],
            BackendKind::RedisCluster,
            &["redis://a:7000", "redis://b:7001"],
        ),
        (
            &[("BACKEND_TYPE", "redis")],
            BackendKind::Redis,
            &["redis://127.0.0.1:6379"],
        ),
        (
            &[("REDIS_TLS", "true"), ("REDIS_URL", "r:6380")],
            BackendKind::Redis,
            &["rediss://r:6380"],
        ),
        (
            &[("REDIS_URL", "/var/run/redis.sock")],
            BackendKind::Redis,
            &["unix:///var/run/redis.sock"],
        ),
        (
            &[("REDIS_URL", "rediss://r:1"), ("REDIS_TYPE", "single")],
            BackendKind::Redis,
            &["rediss://r:1"],
        ),
        (
            &[("REDIS_PERSECOND", "true"), ("REDIS_PERSECOND_URL", "r:1")],
            BackendKind::Memory,
            &["redis://127.0.0.1:6379"],
        ),
        (
            &[("REDIS_URL", "[::1]:6379")],
            BackendKind::Redis,
            &["redis://[::1]:6379"],
        ),
    ];
    for (vars, backend, expected) in cases {
        let (args, _) = mapped(vars);
        assert_eq!(args.backend, backend, "{vars:?}");
        assert_eq!(urls(&args), expected, "{vars:?}");
    }
    let (_, report) = mapped(&[("REDIS_URL", "r:1")]);
    assert_eq!(
        report.applied,
        [("REDIS_URL", "--backend"), ("REDIS_URL", "--redis-url")]
    );
}

#[test]
fn partly_honoured_redis_variables_are_reported() {
    let (args, report) = mapped(&[("REDIS_URL", "redis://a:1,redis://b:1"), ("REDIS_TLS", "1")]);
    assert_eq!(urls(&args), ["redis://a:1", "redis://b:1"]);
    assert_eq!(warned(&report), ["REDIS_TLS"]);

    let (args, report) = mapped(&[
        ("REDIS_TYPE", "cluster"),
        ("REDIS_URL", "a:1"),
        ("REDIS_POOL_SIZE", "4"),
    ]);
    assert_eq!(args.redis_pool_size, 4);
    assert_eq!(warned(&report), ["REDIS_POOL_SIZE"]);

    // Without REDIS_URL there is no reference URL to secure or authenticate.
    let (args, report) = mapped(&[("REDIS_AUTH", "pw"), ("REDIS_TLS", "true")]);
    assert_eq!(args.backend, BackendKind::Redis);
    assert_eq!(urls(&args), ["redis://127.0.0.1:6379"]);
    assert_eq!(warned(&report), ["REDIS_AUTH", "REDIS_TLS"]);
}

#[test]
fn redis_auth_reaches_the_client_intact() {
    let password = "p@ss:w/rd %+?#é";
    let auth = format!("app:{password}");
    let (args, _) = mapped(&[
        ("REDIS_TYPE", "cluster"),
        ("REDIS_URL", "a:7000,b:7001"),
        ("REDIS_AUTH", &auth),
    ]);
    let hosts: Vec<_> = args
        .redis_url
        .iter()
        .map(|url| {
            let info = url
                .as_str()
                .into_connection_info()
                .expect("redis-rs reads it");
            assert_eq!(info.redis_settings().username(), Some("app"));
            assert_eq!(info.redis_settings().password(), Some(password));
            match info.addr() {
                ConnectionAddr::Tcp(host, port) => format!("{host}:{port}"),
                other => panic!("{other:?}"),
            }
        })
        .collect();
    assert_eq!(hosts, ["a:7000", "b:7001"]);
    assert!(!format!("{args:?}").contains("w/rd"), "{args:?}");

    let (args, _) = mapped(&[("REDIS_URL", "r:1"), ("REDIS_AUTH", "only-pass")]);
    let info = args.redis_url[0].as_str().into_connection_info().unwrap();
    assert_eq!(info.redis_settings().username(), None);
    assert_eq!(info.redis_settings().password(), Some("only-pass"));

    let (args, _) = mapped(&[
        ("REDIS_SOCKET_TYPE", "unix"),
        ("REDIS_URL", "/run/redis.sock"),
        ("REDIS_AUTH", &auth),
    ]);
    let info = args.redis_url[0].as_str().into_connection_info().unwrap();
    assert_eq!(info.redis_settings().username(), Some("app"));
    assert_eq!(info.redis_settings().password(), Some(password));
    assert!(matches!(info.addr(), ConnectionAddr::Unix(path) if path.ends_with("redis.sock")));
}

#[test]
fn redis_tls_files_apply_to_a_redis_backend() {
    let vars = [
        ("REDIS_URL", "r:6380"),
        ("REDIS_TLS", "true"),
        ("REDIS_TLS_CLIENT_CERT", "/tls/client.pem"),
        ("REDIS_TLS_CLIENT_KEY", "/tls/client.key"),
        ("REDIS_TLS_CACERT", "/tls/ca.pem"),
    ];
    let (args, report) = mapped(&vars);
    assert_eq!(urls(&args), ["rediss://r:6380"]);
    assert_eq!(
        args.redis_tls_client_cert,
        Some(PathBuf::from("/tls/client.pem"))
    );
    assert_eq!(
        args.redis_tls_client_key,
        Some(PathBuf::from("/tls/client.key"))
    );
    assert_eq!(args.redis_ca_file, Some(PathBuf::from("/tls/ca.pem")));
    assert!(report.unsupported.is_empty(), "{report:?}");
    let (memory, report) = run(&["--backend", "memory"], &vars).unwrap();
    assert_eq!(memory.redis_tls_client_cert, None);
    assert!(
        report
            .overridden
            .contains(&("REDIS_TLS_CACERT", "--backend"))
    );
}

#[test]
fn sentinel_variables_name_the_master_the_sentinels_and_both_credentials() {
    let (args, report) = mapped(&[
        ("REDIS_TYPE", "sentinel"),
        ("REDIS_URL", "mymaster, s1:26379,s2:26379"),
        ("REDIS_TLS", "true"),
        ("REDIS_SENTINEL_AUTH", "s3ntinel"),
        ("REDIS_AUTH", "app:n0de"),
    ]);
    assert_eq!(args.backend, BackendKind::Redis);
    assert_eq!(
        args.topology.redis_sentinel_master.as_deref(),
        Some("mymaster")
    );
    for url in &args.redis_url {
        let info = url
            .as_str()
            .into_connection_info()
            .expect("redis-rs reads it");
        assert!(
            matches!(info.addr(), ConnectionAddr::TcpTls { .. }),
            "{url:?}"
        );
        // The sentinels get a bare `AUTH <password>`, as in the reference.
        assert_eq!(info.redis_settings().username(), None);
        assert_eq!(info.redis_settings().password(), Some("s3ntinel"));
    }
    assert_eq!(args.redis_url.len(), 2);
    let node_auth = args.topology.redis_master_auth.as_ref().unwrap();
    assert_eq!(node_auth.as_str(), "app:n0de");
    assert!(report.unsupported.is_empty(), "{report:?}");
    assert!(
        report
            .applied
            .contains(&("REDIS_AUTH", "--redis-master-auth"))
    );
    assert!(
        report
            .applied
            .contains(&("REDIS_TYPE", "--redis-sentinel-master"))
    );
    assert!(!format!("{args:?}").contains("n0de"));

    // Outside Sentinel the sentinel password has nothing to do.
    let (_, report) = mapped(&[("REDIS_URL", "r:1"), ("REDIS_SENTINEL_AUTH", "x")]);
    assert_eq!(warned(&report), ["REDIS_SENTINEL_AUTH"]);
}

#[test]
fn per_second_variables_describe_a_second_backend() {
    let (args, report) = mapped(&[
        ("REDIS_URL", "main:6379"),
        ("REDIS_PERSECOND", "true"),
        ("REDIS_PERSECOND_TYPE", "cluster"),
        ("REDIS_PERSECOND_URL", "a:7000,b:7001"),
        ("REDIS_PERSECOND_AUTH", "pw"),
        ("REDIS_PERSECOND_POOL_SIZE", "7"),
    ]);
    assert_eq!(args.backend, BackendKind::Redis);
    assert_eq!(urls(&args), ["redis://main:6379"]);
    assert_eq!(
        args.topology.per_second_backend,
        Some(BackendKind::RedisCluster)
    );
    let fast: Vec<_> = args
        .topology
        .per_second_redis_url
        .iter()
        .map(RedisUrl::as_str)
        .collect();
    assert_eq!(fast, ["redis://:pw@a:7000", "redis://:pw@b:7001"]);
    assert_eq!(args.topology.per_second_redis_pool_size, 7);
    assert_eq!(warned(&report), ["REDIS_PERSECOND_POOL_SIZE"]);
    assert!(args.check().is_ok());

    let (args, _) = mapped(&[
        ("REDIS_URL", "main:6379"),
        ("REDIS_PERSECOND", "1"),
        ("REDIS_PERSECOND_TYPE", "SENTINEL"),
        ("REDIS_PERSECOND_URL", "fast,s:26379"),
        ("REDIS_PERSECOND_SENTINEL_AUTH", "sp"),
    ]);
    assert_eq!(args.topology.per_second_backend, Some(BackendKind::Redis));
    assert_eq!(
        args.topology.per_second_redis_sentinel_master.as_deref(),
        Some("fast")
    );
    assert_eq!(
        args.topology.per_second_redis_url[0].as_str(),
        "redis://:sp@s:26379"
    );

    // Off, the details are reported; given by flag, the variables are overridden.
    let (args, report) = mapped(&[("REDIS_PERSECOND_URL", "r:1")]);
    assert_eq!(args.topology.per_second_backend, None);
    assert_eq!(warned(&report), ["REDIS_PERSECOND_URL"]);
    let (args, report) = run(
        &[
            "--per-second-backend",
            "redis",
            "--per-second-redis-url",
            "redis://f:1",
        ],
        &[("REDIS_PERSECOND", "true"), ("REDIS_PERSECOND_URL", "r:1")],
    )
    .unwrap();
    assert_eq!(
        args.topology.per_second_redis_url[0].as_str(),
        "redis://f:1"
    );
    assert!(
        report
            .overridden
            .contains(&("REDIS_PERSECOND_URL", "--per-second-backend"))
    );
}
