//! End-to-end ShouldRateLimit over gRPC against the memory backend, with requests encoded by
//! an independent implementation of Envoy's protos (`envoy-types`), proving wire identity.

use crate::common;

use common::{TestServer, descriptor, eventually, http, request, scrape, should_rate_limit};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, rate_limit::Unit};
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::google::protobuf::UInt64Value;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const API: &str = r#"
domain: api
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: path
    value: /login
    rate_limit: {unit: hour, requests_per_unit: 2, name: login}
  - key: plan
    value: free
    descriptors:
      - key: user
        rate_limit: {unit: day, requests_per_unit: 5}
  - key: internal
    rate_limit: {unlimited: true}
  - key: blocked
    rate_limit: {unit: second, requests_per_unit: 0}
"#;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

#[tokio::test]
async fn fixed_window_counts_down_then_denies() {
    common::away_from_an_hour_boundary().await;
    let server = TestServer::start(&[("api.yaml", API)]).await;
    let mut client = server.client().await;
    for expected_remaining in [2, 1, 0] {
        let response = should_rate_limit(
            &mut client,
            request("api", vec![descriptor(&[("remote_address", "10.0.0.1")])]),
        )
        .await;
        assert_eq!(response.overall_code, OK);
        let status = &response.statuses[0];
        assert_eq!(status.code, OK);
        assert_eq!(status.limit_remaining, expected_remaining);
        let limit = status.current_limit.as_ref().expect("current_limit");
        assert_eq!(
            (limit.requests_per_unit, limit.unit),
            (3, Unit::Hour as i32)
        );
        let reset = status.duration_until_reset.as_ref().expect("reset").seconds;
        assert!((1..=3600).contains(&reset), "reset {reset}");
    }
    let response = should_rate_limit(
        &mut client,
        request("api", vec![descriptor(&[("remote_address", "10.0.0.1")])]),
    )
    .await;
    assert_eq!(response.overall_code, OVER);
    assert_eq!(response.statuses[0].code, OVER);
    assert_eq!(response.statuses[0].limit_remaining, 0);
    // Another address has its own bucket.
    let other = should_rate_limit(
        &mut client,
        request("api", vec![descriptor(&[("remote_address", "10.0.0.2")])]),
    )
    .await;
    assert_eq!(
        (other.overall_code, other.statuses[0].limit_remaining),
        (OK, 2)
    );
    server.stop().await;
}

#[tokio::test]
async fn statuses_follow_request_order_and_unmatched_descriptors_pass() {
    let server = TestServer::start(&[("api.yaml", API)]).await;
    let mut client = server.client().await;
    let response = should_rate_limit(
        &mut client,
        request(
            "api",
            vec![
                descriptor(&[("nothing", "here")]),
                descriptor(&[("path", "/login")]),
                descriptor(&[("internal", "x")]),
                descriptor(&[("plan", "free"), ("user", "u1")]),
            ],
        ),
    )
    .await;
    assert_eq!(response.overall_code, OK);
    assert_eq!(response.statuses.len(), 4);
    assert!(response.statuses[0].current_limit.is_none());
    let login = response.statuses[1].current_limit.as_ref().unwrap();
    assert_eq!((login.name.as_str(), login.requests_per_unit), ("login", 2));
    assert_eq!(response.statuses[1].limit_remaining, 1);
    assert_eq!(response.statuses[2].limit_remaining, u32::MAX);
    assert!(response.statuses[2].current_limit.is_none());
    assert_eq!(response.statuses[3].limit_remaining, 4);

    let unknown = should_rate_limit(
        &mut client,
        request("nope", vec![descriptor(&[("path", "/login")])]),
    )
    .await;
    assert_eq!(unknown.overall_code, OK);
    assert!(unknown.statuses[0].current_limit.is_none());

    let blocked = should_rate_limit(
        &mut client,
        request("api", vec![descriptor(&[("blocked", "x")])]),
    )
    .await;
    assert_eq!(
        (blocked.overall_code, blocked.statuses[0].code),
        (OVER, OVER)
    );
    server.stop().await;
}

#[tokio::test]
async fn hits_addend_peek_and_refund_on_overall_denial() {
    common::away_from_an_hour_boundary().await;
    let server = TestServer::start(&[("api.yaml", API)]).await;
    let mut client = server.client().await;
    let addr = || descriptor(&[("remote_address", "1.1.1.1")]);
    // Request-level cost 2.
    let mut two = request("api", vec![addr()]);
    two.hits_addend = 2;
    assert_eq!(
        should_rate_limit(&mut client, two).await.statuses[0].limit_remaining,
        1
    );
    // A descriptor-level 0 is a peek: nothing booked.
    let mut peek = addr();
    peek.hits_addend = Some(UInt64Value { value: 0 });
    let response = should_rate_limit(&mut client, request("api", vec![peek])).await;
    assert_eq!(
        (response.overall_code, response.statuses[0].limit_remaining),
        (OK, 1)
    );
    // The last unit of the address plus a blocked descriptor: overall OVER, so the address
    // bucket is refunded and reports its pre-request remaining.
    let response = should_rate_limit(
        &mut client,
        request("api", vec![addr(), descriptor(&[("blocked", "x")])]),
    )
    .await;
    assert_eq!(response.overall_code, OVER);
    assert_eq!(
        (
            response.statuses[0].code,
            response.statuses[0].limit_remaining
        ),
        (OK, 1)
    );
    // Still one left: the denied request consumed nothing.
    let response = should_rate_limit(&mut client, request("api", vec![addr()])).await;
    assert_eq!(
        (response.overall_code, response.statuses[0].limit_remaining),
        (OK, 0)
    );
    // Descriptor-level cost overrides the request's.
    let mut big = descriptor(&[("remote_address", "2.2.2.2")]);
    big.hits_addend = Some(UInt64Value { value: 3 });
    let mut req = request("api", vec![big]);
    req.hits_addend = 1;
    assert_eq!(
        should_rate_limit(&mut client, req).await.statuses[0].limit_remaining,
        0
    );
    server.stop().await;
}

#[tokio::test]
async fn limit_override_replaces_the_configured_limit() {
    common::away_from_an_hour_boundary().await;
    let server = TestServer::start(&[("api.yaml", API)]).await;
    let mut client = server.client().await;
    let mut d = descriptor(&[("remote_address", "3.3.3.3")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: RateLimitUnit::Hour as i32,
    });
    let first = should_rate_limit(&mut client, request("api", vec![d.clone()])).await;
    let limit = first.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (1, Unit::Hour as i32)
    );
    assert_eq!(first.overall_code, OK);
    let second = should_rate_limit(&mut client, request("api", vec![d])).await;
    assert_eq!(second.overall_code, OVER);
    server.stop().await;
}

#[tokio::test]
async fn bad_input_is_invalid_argument_and_the_server_keeps_answering() {
    let server = TestServer::start(&[("api.yaml", API)]).await;
    let mut client = server.client().await;
    let long = "v".repeat(5000);
    let cases = vec![
        request("", vec![descriptor(&[("k", "v")])]),
        request("api", vec![]),
        request("api", vec![descriptor(&[])]),
        request("api", vec![descriptor(&[("", "v")])]),
        request("api", vec![descriptor(&[("k", &long)])]),
        request("api", vec![descriptor(&[("k", "v")]); 65]),
        request("api", vec![descriptor(&vec![("k", "v"); 33])]),
    ];
    for bad in cases {
        let error = client.should_rate_limit(bad).await.expect_err("rejected");
        assert_eq!(error.code(), tonic::Code::InvalidArgument);
        assert!(!error.message().is_empty());
    }
    let mut unknown_unit = descriptor(&[("remote_address", "x")]);
    unknown_unit.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 0,
    });
    let error = client
        .should_rate_limit(request("api", vec![unknown_unit]))
        .await
        .expect_err("rejected");
    assert_eq!(error.code(), tonic::Code::InvalidArgument);
    let fine = should_rate_limit(
        &mut client,
        request("api", vec![descriptor(&[("remote_address", "ok")])]),
    )
    .await;
    assert_eq!(fine.overall_code, OK);
    server.stop().await;
}

#[tokio::test]
async fn health_reports_serving_for_both_names() {
    let server = TestServer::start(&[("api.yaml", API)]).await;
    let mut health = HealthClient::new(server.channel().await);
    for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
        let mut status = ServingStatus::Unknown;
        // Readiness flips once the first backend ping answers; poll briefly.
        eventually(std::time::Duration::from_secs(1), async || {
            let request = HealthCheckRequest {
                service: service.into(),
            };
            let response = health.check(request).await.expect("health check");
            status = response.into_inner().status();
            status == ServingStatus::Serving
        })
        .await;
        assert_eq!(status, ServingStatus::Serving, "service {service:?}");
    }
    assert_eq!(
        http("GET", &server.http_url("/healthcheck"), "").await,
        (200, "OK".into())
    );
    assert_eq!(http("GET", &server.http_url("/livez"), "").await.0, 200);
    server.stop().await;
}

#[tokio::test]
async fn admin_json_metrics_and_rlconfig() {
    common::away_from_an_hour_boundary().await;
    let server = TestServer::start(&[("api.yaml", API)]).await;
    let url = server.http_url("/json");
    let body = r#"{"domain":"api","descriptors":[{"entries":[{"key":"path","value":"/login"}]}],"hitsAddend":1}"#;
    let (status, text) = http("POST", &url, body).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("\"overallCode\":\"OK\""), "{text}");
    assert_eq!(http("POST", &url, body).await.0, 200);
    let (status, text) = http("POST", &url, body).await;
    assert_eq!(status, 429);
    assert!(text.contains("OVER_LIMIT"), "{text}");
    for bad in [
        "not json",
        r#"{"domain":"api","descriptors":[],"bogus":1}"#,
        r#"{"domain":5}"#,
        r#"{"domain":"","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#,
    ] {
        let (status, text) = http("POST", &url, bad).await;
        assert_eq!(status, 400, "{bad} -> {text}");
        assert!(!text.trim().is_empty());
    }
    let metrics = scrape(server.http).await;
    assert!(
        metrics.contains(
            r#"ratelimit_service_rate_limit_total_hits_total{domain="api",key="path_/login"} 3"#
        ),
        "{metrics}"
    );
    assert!(metrics.contains(
        r#"ratelimit_service_rate_limit_over_limit_total{domain="api",key="path_/login"} 1"#
    ));
    assert!(metrics.contains("floodgate_request_latency_seconds"));
    let (status, rules) = http("GET", &server.http_url("/rlconfig"), "").await;
    assert_eq!(status, 200);
    assert!(
        rules.contains("api.path_/login: unit=HOUR requests_per_unit=2"),
        "{rules}"
    );
    assert_eq!(rules.lines().count(), 5, "{rules}");
    server.stop().await;
}

/// A multiplied window is reported per one unit, exactly when it can be: Envoy's
/// `X-RateLimit-Limit` would otherwise tell clients five times the real rate.
#[tokio::test]
async fn multiplied_windows_report_the_rate_per_unit() {
    let rules = "domain: mult\ndescriptors:\n  - key: five\n    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 5}\n  - key: three\n    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 3}\n";
    let server = TestServer::start(&[("mult.yaml", rules)]).await;
    let mut client = server.client().await;
    let response = should_rate_limit(
        &mut client,
        request(
            "mult",
            vec![descriptor(&[("five", "a")]), descriptor(&[("three", "b")])],
        ),
    )
    .await;
    let stated: Vec<(u32, i32)> = response
        .statuses
        .iter()
        .map(|status| {
            let limit = status.current_limit.as_ref().expect("a limit");
            (limit.requests_per_unit, limit.unit)
        })
        .collect();
    assert_eq!(
        stated,
        vec![(1, Unit::Minute as i32), (36, Unit::Hour as i32)]
    );
    server.stop().await;
}
