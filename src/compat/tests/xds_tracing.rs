//! The xDS rule source and tracing variables.

use super::*;

#[test]
fn an_envoy_gateway_xds_deployment_maps_onto_floodgate_settings() {
    let (args, report) = mapped(&[
        // Envoy Gateway's own variables for its rate-limit Deployment, then the rest.
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("LOG_LEVEL", "info"),
        ("USE_STATSD", "false"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "redis.redis-system.svc.cluster.local:6379"),
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
        ("CONFIG_GRPC_XDS_NODE_METADATA", "zone=a,team=b"),
        (
            "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
            "authorization:Bearer s3cret",
        ),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
        ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "envoy-gateway"),
        ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "1.5s"),
        ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "2m"),
        ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "0.2"),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
        ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"),
        ("RESPONSE_DYNAMIC_METADATA", "true"),
    ]);
    assert!(report.unsupported.is_empty(), "{report:?}");
    assert_eq!(args.backend, BackendKind::Redis);
    assert!(args.response_dynamic_metadata);
    let xds = &args.xds;
    assert_eq!(xds.config_source, ConfigSource::Xds);
    assert!(xds.force_start_without_initial_config && xds.healthy_with_at_least_one_config_loaded);
    assert_eq!(
        (xds.xds_backoff_initial.0, xds.xds_backoff_max.0),
        (
            std::time::Duration::from_millis(1500),
            std::time::Duration::from_secs(120)
        )
    );
    assert_eq!(xds.xds_backoff_jitter, 0.2);
    assert!(!format!("{args:?}").contains("s3cret"));
    let settings = xds.settings().unwrap().unwrap();
    assert_eq!(settings.server, "envoy-gateway:18001");
    assert_eq!(settings.node_id, "envoy-ratelimit");
    assert_eq!(settings.node_metadata.len(), 2);
    assert_eq!(
        settings.headers,
        [("authorization".to_owned(), "Bearer s3cret".to_owned())]
    );
    let tls = settings.tls.unwrap();
    assert_eq!(tls.ca, Some(PathBuf::from("/certs/ca.crt")));
    assert_eq!(tls.san.as_deref(), Some("envoy-gateway"));
    assert!(tls.cert.is_some() && tls.key.is_some());
}

#[test]
fn xds_defaults_follow_the_reference_and_flags_win() {
    let (args, _) = mapped(&[
        ("CONFIG_TYPE", "grpc_xds_sotw"),
        ("XDS_CLIENT_BACKOFF_JITTER", "false"),
    ]);
    let settings = args.xds.settings().unwrap().unwrap();
    assert_eq!(settings.server, "localhost:18000");
    assert_eq!(settings.node_id, "default");
    assert_eq!(settings.backoff.jitter, 0.0);
    assert!(settings.tls.is_none());
    let (args, report) = run(
        &["--config-source", "file", "--xds-node-id", "mine"],
        &[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_NODE_ID", "theirs"),
        ],
    )
    .unwrap();
    assert_eq!(args.xds.settings().unwrap(), None);
    assert_eq!(args.xds.xds_node_id, "mine");
    assert!(
        report
            .overridden
            .contains(&("CONFIG_TYPE", "--config-source"))
    );
    let (args, _) = mapped(&[("CONFIG_TYPE", "FILE")]);
    assert_eq!(args.xds.config_source, ConfigSource::File);
    for bad in [
        &[("CONFIG_TYPE", "GRPC_XDS_DELTA")][..],
        &[("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "ten")],
        &[("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "2")],
        &[("FORCE_START_WITHOUT_INITIAL_CONFIG", "maybe")],
    ] {
        error(bad);
    }
}

#[test]
fn the_reference_tracing_variables_map_onto_the_tracing_flags() {
    let (args, report) = mapped(&[
        ("TRACING_ENABLED", "true"),
        ("TRACING_EXPORTER_PROTOCOL", "grpc"),
        ("TRACING_SERVICE_NAME", "ratelimit"),
        ("TRACING_SERVICE_NAMESPACE", "envoy-gateway-system"),
        ("TRACING_SERVICE_INSTANCE_ID", "pod-1"),
        ("TRACING_SAMPLING_RATE", "0.25"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:4317"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
    ]);
    assert!(report.unsupported.is_empty(), "{report:?}");
    assert!(
        report
            .applied
            .contains(&("TRACING_SAMPLING_RATE", "--tracing-sampling-rate"))
    );
    let settings = args.tracing.settings().unwrap().unwrap();
    assert_eq!(
        settings,
        TracingSettings {
            // Left to the exporter, which reads OTEL_EXPORTER_OTLP_ENDPOINT.
            endpoint: None,
            // TRACING_EXPORTER_PROTOCOL wins over the standard variable, as in the reference.
            protocol: OtlpProtocol::Grpc,
            service_name: "ratelimit".to_owned(),
            service_namespace: Some("envoy-gateway-system".to_owned()),
            service_instance_id: Some("pod-1".to_owned()),
            sampling_rate: 0.25,
        }
    );
}

#[test]
fn tracing_defaults_follow_the_reference_and_flags_win() {
    // Off: the other variables do nothing and say so.
    let (args, report) = mapped(&[
        ("TRACING_ENABLED", "false"),
        ("TRACING_SERVICE_NAME", "rl"),
        ("TRACING_SAMPLING_RATE", "0.5"),
    ]);
    assert_eq!(args.tracing.settings().unwrap(), None);
    assert_eq!(
        warned(&report),
        ["TRACING_SERVICE_NAME", "TRACING_SAMPLING_RATE"]
    );
    // On alone: the reference's service name and transport, every trace sampled.
    let (args, _) = mapped(&[("TRACING_ENABLED", "true")]);
    let settings = args.tracing.settings().unwrap().unwrap();
    assert_eq!(settings.service_name, "RateLimit");
    assert_eq!(settings.protocol, OtlpProtocol::Http);
    assert_eq!(settings.sampling_rate, 1.0);
    // The standard protocol variable picks the transport when nothing else does.
    let (args, _) = mapped(&[
        ("TRACING_ENABLED", "true"),
        ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
    ]);
    assert_eq!(args.tracing.otlp_protocol, OtlpProtocol::Grpc);
    // Flags win; --otlp-endpoint alone turns tracing on with floodgate's own name.
    let (args, report) = run(
        &[
            "--otlp-endpoint",
            "http://collector:4318",
            "--otlp-protocol",
            "http",
            "--tracing-sampling-rate",
            "0.1",
        ],
        &[
            ("TRACING_ENABLED", "false"),
            ("TRACING_EXPORTER_PROTOCOL", "grpc"),
            ("TRACING_SAMPLING_RATE", "1"),
        ],
    )
    .unwrap();
    let settings = args.tracing.settings().unwrap().unwrap();
    assert_eq!(settings.endpoint.as_deref(), Some("http://collector:4318"));
    assert_eq!(settings.protocol, OtlpProtocol::Http);
    assert_eq!(settings.sampling_rate, 0.1);
    assert_eq!(settings.service_name, "floodgate");
    assert!(
        report
            .overridden
            .contains(&("TRACING_ENABLED", "--otlp-endpoint"))
    );
    for bad in [
        &[("TRACING_ENABLED", "yes please")][..],
        &[
            ("TRACING_ENABLED", "true"),
            ("TRACING_EXPORTER_PROTOCOL", "udp"),
        ],
        &[("TRACING_ENABLED", "true"), ("TRACING_SAMPLING_RATE", "2")],
        &[
            ("TRACING_ENABLED", "true"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ],
    ] {
        error(bad);
    }
}
