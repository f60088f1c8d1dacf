//! gRPC on a unix socket (`--grpc-uds`, the reference's `GRPC_UDS`): RLS and health answer a
//! real tonic client over the socket, a stale socket file is replaced, the file's mode lets
//! another user connect, connection limits and age apply as on TCP, and shutdown removes
//! the file. TLS over the socket is tested in `tls.rs`.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{Binary, TestServer, descriptor, eventually, request, unix_channel};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const CONFIG: &str =
    "domain: uds\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n";

async fn start_on(
    socket: &Path,
    adjust: impl FnOnce(&mut floodgate::server::Settings),
) -> TestServer {
    let grpc_addr = format!("unix:{}", socket.display());
    TestServer::start_with(&[("uds.yaml", CONFIG)], move |settings| {
        settings.grpc_addr = grpc_addr;
        adjust(settings);
    })
    .await
}

/// Whether the server closed `stream` within `limit` (what it sends before, its HTTP/2
/// SETTINGS, is read and dropped).
async fn closed_within(stream: &mut tokio::net::UnixStream, limit: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 1024];
    let until_closed = async {
        while let Ok(read) = stream.read(&mut buf).await {
            if read == 0 {
                break;
            }
        }
    };
    tokio::time::timeout(limit, until_closed).await.is_ok()
}

async fn code(channel: Channel, value: &str) -> Result<Code, tonic::Status> {
    let call = request("uds", vec![descriptor(&[("k", value)])]);
    let response = RateLimitServiceClient::new(channel)
        .should_rate_limit(call)
        .await?;
    Ok(response.into_inner().overall_code())
}

#[tokio::test]
async fn rls_and_health_answer_over_the_socket_and_shutdown_removes_it() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("rls.sock");
    // What a killed floodgate leaves behind: a socket file nobody listens on.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());

    let server = start_on(&socket, |_| {}).await;
    assert_eq!(server.grpc_endpoint, format!("unix:{}", socket.display()));
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o666, "{mode:o}");

    let channel = unix_channel(&socket, Default::default())
        .await
        .expect("connects over the socket");
    let codes = [
        code(channel.clone(), "a").await.unwrap(),
        code(channel.clone(), "a").await.unwrap(),
        code(channel.clone(), "a").await.unwrap(),
    ];
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::OverLimit]);
    let health = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: "envoy.service.ratelimit.v3.RateLimitService".into(),
        })
        .await
        .expect("health answers")
        .into_inner();
    assert_eq!(health.status(), ServingStatus::Serving);

    server.stop().await;
    assert!(!socket.exists(), "the socket file outlived the server");
}

#[tokio::test]
async fn connection_limits_and_age_apply_on_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("rls.sock");
    let server = start_on(&socket, |settings| {
        settings.grpc_limits.max_connections = 2;
        settings.grpc_limits.first_call_timeout = Some(Duration::from_secs(1));
        settings.grpc_limits.max_connection_age = Some(Duration::from_secs(1));
        settings.grpc_limits.max_connection_age_grace = Duration::from_secs(5);
    })
    .await;
    let mut silent = Vec::new();
    for _ in 0..2 {
        silent.push(tokio::net::UnixStream::connect(&socket).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // At the cap, a client still gets in (the oldest silent socket makes room) ...
    let connects = Arc::new(AtomicUsize::new(0));
    let channel = unix_channel(&socket, Arc::clone(&connects)).await.unwrap();
    assert_eq!(
        code(channel.clone(), "b").await.map_err(|s| s.code()),
        Ok(Code::Ok)
    );
    // ... and silent sockets are closed by the first call timeout.
    for stream in &mut silent {
        assert!(closed_within(stream, Duration::from_secs(10)).await);
    }
    // The connection is aged out and replaced while calls keep being answered.
    let reconnected = eventually(Duration::from_secs(5), async || {
        let answered = code(channel.clone(), "c").await.is_ok();
        answered && connects.load(Ordering::SeqCst) >= 2
    })
    .await;
    assert!(reconnected, "the aged connection was never replaced");
    server.stop().await;
}

#[tokio::test]
async fn the_reference_grpc_uds_variable_moves_grpc_to_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ratelimit.sock");
    let config = common::config_dir(&[("uds.yaml", CONFIG)]);
    let socket_text = socket.display().to_string();
    let mut server = Binary::start_with_env_only(&[
        ("FLOODGATE_CONFIG", config.path().to_str().unwrap()),
        ("FLOODGATE_HTTP_ADDR", "127.0.0.1:0"),
        ("FLOODGATE_HEALTH_GRACE", "0"),
        ("GRPC_UDS", &socket_text),
    ]);
    assert_eq!(server.grpc_endpoint, format!("unix:{socket_text}"));
    let channel = unix_channel(&socket, Default::default()).await.unwrap();
    assert_eq!(code(channel, "d").await.map_err(|s| s.code()), Ok(Code::Ok));

    server.signal("TERM");
    assert_eq!(server.wait_exit(Duration::from_secs(15)).await, Some(0));
    assert!(!socket.exists(), "the socket file outlived the process");
}

#[test]
fn a_path_that_is_not_a_socket_stops_startup_and_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("precious.txt");
    std::fs::write(&file, "keep").unwrap();
    let config = common::config_dir(&[("uds.yaml", CONFIG)]);
    let output = common::serve_command()
        .arg("--config")
        .arg(config.path())
        .arg("--grpc-uds")
        .arg(&file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success());
    assert!(
        format!("{stdout}{stderr}").contains("not a socket"),
        "{stdout}{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");
}
