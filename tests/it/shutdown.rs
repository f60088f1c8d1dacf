//! Graceful shutdown of the real binary: health flips to NOT_SERVING, calls still finish,
//! and the process exits 0.

use crate::common;

use std::time::Duration;

use common::{Binary, descriptor, eventually, http, request};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

#[tokio::test]
async fn sigterm_flips_health_drains_and_exits_zero() {
    // A 1 s pause between NOT_SERVING and closing the listeners makes the flip observable.
    let mut server = Binary::start(&["--config", "config", "--health-grace", "1s"], &[]);
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel.clone());
    let mut client = RateLimitServiceClient::new(channel);
    let check = HealthCheckRequest {
        service: String::new(),
    };
    let serving = eventually(Duration::from_secs(2), async || {
        let response = health.check(check.clone()).await.unwrap();
        response.into_inner().status() == ServingStatus::Serving
    })
    .await;
    assert!(serving, "never became SERVING");
    assert_eq!(
        http("GET", &format!("http://{}/healthcheck", server.http), "")
            .await
            .0,
        200
    );

    server.signal("TERM");
    // During the grace, health answers NOT_SERVING and calls are still answered.
    let flipped = eventually(Duration::from_millis(800), async || {
        match health.check(check.clone()).await {
            Ok(response) => response.get_ref().status() == ServingStatus::NotServing,
            Err(error) => panic!("health failed before the grace ended: {error}"),
        }
    })
    .await;
    assert!(flipped, "health never reported NOT_SERVING");
    let response = client
        .should_rate_limit(request(
            "api",
            vec![descriptor(&[("remote_address", "9.9.9.9")])],
        ))
        .await
        .expect("calls are still served during the grace");
    assert_eq!(response.get_ref().statuses.len(), 1);
    // Connections still open: the server's GOAWAY lets them finish, well within the drain.
    let started = tokio::time::Instant::now();
    assert_eq!(server.wait_exit(Duration::from_secs(15)).await, Some(0));
    assert!(
        started.elapsed() < Duration::from_secs(9),
        "drain ran into its timeout"
    );
    drop((client, health));
}

#[tokio::test]
async fn sigint_also_exits_zero() {
    let mut server = Binary::start(&["--config", "config", "--health-grace", "0"], &[]);
    server.signal("INT");
    assert_eq!(server.wait_exit(Duration::from_secs(15)).await, Some(0));
    let log = server.log.lock().unwrap().join("\n");
    assert!(log.contains("shutdown complete"), "{log}");
}

/// Waiting for the first xDS rules from a server that never answers, the process still
/// stops on SIGTERM (it used to ignore it until the rules came).
#[test]
fn sigterm_stops_a_replica_still_waiting_for_its_first_xds_rules() {
    use std::io::{BufRead, BufReader};
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let server = silent.local_addr().unwrap().to_string();
    let mut child = common::serve_command()
        .args(["--config-source", "xds", "--xds-server", &server])
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn floodgate");
    let stdout = child.stdout.take().unwrap();
    let waiting = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .take(50)
        .any(|line| line.contains("waiting for the first rules"));
    assert!(waiting, "the replica never said it waits for rules");
    let pid = child.id().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status();
    assert!(killed.unwrap().success());
    for _ in 0..100 {
        if let Some(status) = child.try_wait().unwrap() {
            assert_eq!(status.code(), Some(0));
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    panic!("still running 5 s after SIGTERM");
}
