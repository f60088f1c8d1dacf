//! Every guarantee tried by the client that would break it (issue 46): each test is one
//! attack from the table of `docs/reliability.md`, against a real server.

use crate::common;

use std::fmt::Write as _;

use common::{TestServer, descriptor, request, should_rate_limit};
use serde_json::Value;

/// A web page on another origin can post `text/plain` without the browser asking first;
/// `/json` spends real quota, so it takes only `application/json`.
#[tokio::test]
async fn json_from_another_origins_page_is_refused_unless_it_is_application_json() {
    let server = TestServer::start(&[("api.yaml", &rules())]).await;
    let url = server.http_url("/json");
    let body = r#"{"domain":"api","descriptors":[{"entries":[{"key":"r0","value":"a"}]}]}"#;
    let client = reqwest::Client::new();
    for content_type in [Some("text/plain"), Some("application/x-www-form-urlencoded"), None] {
        let mut post = client.post(&url).body(body);
        if let Some(content_type) = content_type {
            post = post.header("content-type", content_type);
        }
        let answer = post.send().await.expect("admin answers");
        assert_eq!(answer.status().as_u16(), 415, "{content_type:?}");
    }
    let answer = client
        .post(&url)
        .header("content-type", "Application/JSON; charset=utf-8")
        .body(body)
        .send()
        .await
        .expect("admin answers");
    assert_eq!(answer.status().as_u16(), 200);
    server.stop().await;
}

/// The page runs only its own script and every admin answer forbids sniffing.
#[tokio::test]
async fn the_page_sends_a_content_security_policy_and_nosniff() {
    let server = TestServer::start(&[("api.yaml", &rules())]).await;
    for path in ["/", "/top", "/overview", "/metrics"] {
        let answer = reqwest::get(server.http_url(path)).await.expect("admin answers");
        let headers = answer.headers();
        assert_eq!(headers["x-content-type-options"], "nosniff", "{path}");
        if path == "/" {
            let policy = headers["content-security-policy"].to_str().unwrap();
            assert!(policy.contains("default-src 'none'"), "{policy}");
            assert!(policy.contains("script-src 'sha256-"), "{policy}");
            assert!(!policy.contains("unsafe-eval"), "{policy}");
        }
    }
    server.stop().await;
}

/// 50 rules of one request an hour.
const RULES: &str = "domain: api\ndescriptors:\n";
const RULE_COUNT: usize = 50;

fn rules() -> String {
    let mut rules = RULES.to_owned();
    for rule in 0..RULE_COUNT {
        let _ = writeln!(
            rules,
            "  - key: r{rule}\n    rate_limit: {{unit: hour, requests_per_unit: 1}}"
        );
    }
    rules
}

/// `GET /top?limit=1024` over 50 rules of 200 denied keys each asked for 10,000 keys (the
/// attack took 76 MB per answer); an answer now lists at most 100 a list and 4,096 in all.
#[tokio::test]
async fn top_is_bounded_whatever_its_limit_asks() {
    let rules = rules();
    let server = TestServer::start(&[("api.yaml", &rules)]).await;
    let mut client = server.client().await;
    for user in 0..200 {
        let value = format!("user-{user}");
        let descriptors: Vec<_> = (0..RULE_COUNT)
            .map(|rule| descriptor(&[(&format!("r{rule}"), &value)]))
            .collect();
        for _ in 0..2 {
            should_rate_limit(&mut client, request("api", descriptors.clone())).await;
        }
    }
    let (status, body) = common::http("GET", &server.http_url("/top?limit=1024"), "").await;
    assert_eq!(status, 200);
    let top: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(top["limit"], 100);
    assert_eq!(top["truncated"], true);
    let listed = |kind: &str| -> usize {
        top["rules"]
            .as_array()
            .unwrap()
            .iter()
            .map(|rule| rule[kind].as_array().unwrap().len())
            .sum()
    };
    let keys = listed("denied") + listed("near_limit");
    assert!((4000..=4096).contains(&keys), "{keys} keys listed");
    assert!(body.len() < 2 << 20, "{} bytes", body.len());
    // Every rule still has its totals.
    assert_eq!(top["rules"].as_array().unwrap().len(), RULE_COUNT);
    server.stop().await;
}
