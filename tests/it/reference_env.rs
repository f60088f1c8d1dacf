//! The built binary run with a reference service Deployment's environment and nothing else:
//! it finds the rules under RUNTIME_ROOT, listens where HOST/PORT/GRPC_* say, answers as the
//! reference would, and names every variable it cannot honour.

use crate::common;

use std::process::Command;

use common::{Binary, descriptor, http, request, should_rate_limit};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// A rules file as the reference service's README writes them.
const RULES: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: hour
      requests_per_unit: 3
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: mock
        rate_limit:
          unit: hour
          requests_per_unit: 2
"#;

/// `<root>/ratelimit/config/edge.yaml`, the reference's layout.
fn runtime_root() -> tempfile::TempDir {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("ratelimit").join("config");
    std::fs::create_dir_all(&dir).expect("rule directory");
    std::fs::write(dir.join("edge.yaml"), RULES).expect("rules file");
    root
}

fn warnings_naming(server: &Binary, variable: &str) -> Vec<String> {
    let log = server.log.lock().unwrap();
    log.iter()
        .filter(|line| line.contains("WARN") && line.contains(variable))
        .cloned()
        .collect()
}

#[tokio::test]
async fn a_reference_environment_serves_its_rules() {
    common::away_from_an_hour_boundary().await;
    let root = runtime_root();
    let server = Binary::start_with_env_only(&[
        ("RUNTIME_ROOT", root.path().to_str().unwrap()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_APPDIRECTORY", "config"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("PORT", "0"),
        ("GRPC_PORT", "0"),
        ("HOST", "127.0.0.1"),
        ("GRPC_HOST", "127.0.0.1"),
        ("LOG_LEVEL", "info"),
        ("USE_STATSD", "false"),
        ("REDIS_PERSECOND_URL", "fast:6379"),
    ]);
    assert!(server.grpc.ip().is_loopback() && server.http.ip().is_loopback());
    assert_ne!(server.grpc.port(), 0);

    let mut client = RateLimitServiceClient::connect(format!("http://{}", server.grpc))
        .await
        .expect("client connects");
    let by_address = || request("edge", vec![descriptor(&[("remote_address", "10.0.0.1")])]);
    for (i, expected) in [OK, OK, OK, OVER].into_iter().enumerate() {
        let response = should_rate_limit(&mut client, by_address()).await;
        assert_eq!(response.overall_code, expected, "request {}", i + 1);
    }
    let nested = || {
        let pairs = [("source_cluster", "proxy"), ("destination_cluster", "mock")];
        request("edge", vec![descriptor(&pairs)])
    };
    for (i, expected) in [OK, OK, OVER].into_iter().enumerate() {
        let response = should_rate_limit(&mut client, nested()).await;
        assert_eq!(response.overall_code, expected, "nested request {}", i + 1);
    }
    let (status, rules) = http("GET", &format!("http://{}/rlconfig", server.http), "").await;
    assert_eq!(status, 200);
    assert!(rules.contains("edge"), "{rules}");

    let warned = warnings_naming(&server, "REDIS_PERSECOND");
    assert_eq!(warned.len(), 1, "{:?}", server.log.lock().unwrap());
    assert!(warned[0].contains("REDIS_PERSECOND=true"), "{}", warned[0]);
    for quiet in ["USE_STATSD", "RUNTIME_WATCH_ROOT", "LOG_LEVEL"] {
        assert!(warnings_naming(&server, quiet).is_empty(), "{quiet}");
    }
}

#[tokio::test]
async fn floodgate_variables_win_over_reference_ones() {
    // PORT and GRPC_PORT would stop startup if they were read: they must not be.
    let manifest_config = concat!(env!("CARGO_MANIFEST_DIR"), "/config");
    let server = Binary::start_with_env_only(&[
        ("FLOODGATE_HTTP_ADDR", "127.0.0.1:0"),
        ("FLOODGATE_GRPC_ADDR", "127.0.0.1:0"),
        ("FLOODGATE_CONFIG", manifest_config),
        ("PORT", "not-a-port"),
        ("GRPC_PORT", "not-a-port"),
        ("RUNTIME_ROOT", "/nonexistent"),
        ("LOG_FORMAT", "json"),
    ]);
    let (status, rules) = http("GET", &format!("http://{}/rlconfig", server.http), "").await;
    assert_eq!(status, 200);
    assert!(!rules.is_empty());
    let log = server.log.lock().unwrap();
    assert!(log.iter().all(|line| line.starts_with('{')), "{log:?}");
    assert!(
        log.iter()
            .any(|line| line.contains("RUNTIME_ROOT") && line.contains("--config")),
        "{log:?}"
    );
}

#[test]
fn settings_floodgate_cannot_honour_stop_startup() {
    for (variable, value, says) in [
        ("REDIS_TYPE", "sentinel", "Sentinel"),
        ("BACKEND_TYPE", "memcache", "memcache"),
        ("SHADOW_MODE", "yes", "boolean"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_floodgate"))
            .arg("serve")
            .env_clear()
            .env(variable, value)
            .output()
            .expect("run floodgate");
        assert_eq!(out.status.code(), Some(2), "{variable}={value}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(variable) && stderr.contains(says),
            "{variable}={value}: {stderr}"
        );
    }
}
