//! Overload shedding end to end: a call that cannot be served before its deadline is
//! answered at once by the failure mode, counted, and never reaches the backend.

mod common;

use std::time::Duration;

use common::{TestServer, descriptor, request, sample, scrape};
use floodgate::limiter::FailureMode;
use prost::Message;
use tonic::Code;

const RULES: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n";

/// Sends one call whose `grpc-timeout` has already run out when it arrives (1 ns), over a
/// bare HTTP/2 client: tonic's own client would enforce the timeout and cancel first.
/// Returns the overall code, or the gRPC status code of an error.
async fn expired_call(server: &TestServer) -> Result<i32, Code> {
    let tcp = tokio::net::TcpStream::connect(server.grpc)
        .await
        .expect("connect");
    let (mut h2, connection) = h2::client::handshake(tcp).await.expect("h2 handshake");
    tokio::spawn(connection);
    let call = http::Request::post(format!(
        "http://{}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        server.grpc
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .header("grpc-timeout", "1n")
    .body(())
    .expect("request");
    let message = request("d", vec![descriptor(&[("k", "v")])]).encode_to_vec();
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(&message);
    let (answer, mut body) = h2.send_request(call, false).expect("send");
    body.send_data(frame.into(), true).expect("body");
    let (parts, mut body) = answer.await.expect("answer").into_parts();
    let mut bytes = Vec::new();
    while let Some(chunk) = body.data().await {
        bytes.extend_from_slice(&chunk.expect("data"));
    }
    let trailers = body.trailers().await.expect("trailers");
    let status = trailers
        .as_ref()
        .and_then(|t| t.get("grpc-status"))
        .or_else(|| parts.headers.get("grpc-status"))
        .and_then(|v| v.to_str().ok()?.parse::<i32>().ok())
        .expect("grpc-status");
    if status != 0 {
        return Err(Code::from_i32(status));
    }
    let response =
        envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse::decode(&bytes[5..])
            .expect("response");
    Ok(response.overall_code)
}

async fn shed_count(server: &TestServer, reason: &str) -> u64 {
    let body = scrape(server.http).await;
    let series = format!("floodgate_shed_total{{reason=\"{reason}\"}}");
    sample(&body, &series).unwrap_or_else(|| panic!("no {series} in:\n{body}")) as u64
}

#[tokio::test]
async fn a_call_past_its_deadline_is_answered_by_each_failure_mode_and_books_nothing() {
    for (mode, expected) in [
        (FailureMode::Error, Err(Code::Unavailable)),
        (FailureMode::Allow, Ok(1)),
        (FailureMode::Deny, Ok(2)),
    ] {
        let server =
            TestServer::start_with(&[("d.yaml", RULES)], |s| s.limiter.failure_mode = mode).await;
        let mut client = server.client().await;
        assert_eq!(expired_call(&server).await, expected, "{mode:?}");
        assert_eq!(shed_count(&server, "deadline").await, 1, "{mode:?}");
        // Nothing was booked: both of the limit's hits are still there.
        for _ in 0..2 {
            let response = common::should_rate_limit(
                &mut client,
                request("d", vec![descriptor(&[("k", "v")])]),
            )
            .await;
            assert_eq!(response.overall_code, 1, "{mode:?}");
        }
        server.stop().await;
    }
}

#[tokio::test]
async fn calls_within_their_deadline_are_served_and_shedding_can_be_turned_off() {
    let server = TestServer::start(&[("d.yaml", RULES)]).await;
    let mut client = server.client().await;
    let mut call = tonic::Request::new(request("d", vec![descriptor(&[("k", "v")])]));
    call.set_timeout(Duration::from_secs(5));
    let response = client.should_rate_limit(call).await.expect("served");
    assert_eq!(response.into_inner().overall_code, 1);
    assert_eq!(shed_count(&server, "deadline").await, 0);
    server.stop().await;

    let server = TestServer::start_with(&[("d.yaml", RULES)], |s| {
        s.grpc_limits.overload_target = None;
    })
    .await;
    // Without shedding the expired call is decided (and booked), then refused as late.
    assert_eq!(expired_call(&server).await, Err(Code::DeadlineExceeded));
    server.stop().await;
}
