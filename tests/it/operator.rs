//! The operator's view (issue 39): who is being limited (`GET /top`), what a candidate rule
//! would do beside the live one (`--candidate-config`), and the admin page that shows both,
//! opened in Debian's headless Chromium by `tests/clients/page_check.js` (playwright-core).

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::{TestServer, descriptor, eventually, http, request, scrape, should_rate_limit};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use serde_json::Value;
use sha2::{Digest, Sha256};

const LIVE: &str = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 10}\n";
const CANDIDATE: &str = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 3, name: stricter}\n";

/// How `/top` shows a value it hides: `#` and the first 16 hex digits of its SHA-256.
fn hashed(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("#{hex}")
}

async fn get_json(server: &TestServer, path: &str) -> Value {
    let (status, body) = http("GET", &server.http_url(path), "").await;
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).expect("JSON")
}

async fn call(server: &TestServer, user: &str) -> (i32, u32) {
    let mut client = server.client().await;
    let answer = should_rate_limit(
        &mut client,
        request("api", vec![descriptor(&[("user", user)])]),
    )
    .await;
    (answer.overall_code, answer.statuses[0].limit_remaining)
}

/// Starts a server over the live rules, with `candidates` as candidate rules if given.
async fn start(
    candidates: Option<&Path>,
    adjust: impl FnOnce(&mut floodgate::server::Settings),
) -> TestServer {
    let candidates = candidates.map(Path::to_path_buf);
    TestServer::start_with(&[("api.yaml", LIVE)], move |settings| {
        settings.candidate_dir = candidates;
        adjust(settings);
    })
    .await
}

/// 300 users within their limit and 5 heavy ones far over it: the 5 are the top 5, with
/// their exact denied counts (the summaries are not full, so the error is 0); values are
/// hashed, and no value reaches `/metrics`.
#[tokio::test]
async fn the_heaviest_denied_keys_lead_top_hashed() {
    let server = start(None, |_| {}).await;
    let mut client = server.client().await;
    for i in 0..300 {
        let user = format!("light-{i}");
        should_rate_limit(
            &mut client,
            request("api", vec![descriptor(&[("user", &user)])]),
        )
        .await;
    }
    for (i, extra) in [30u64, 25, 20, 15, 12].iter().enumerate() {
        let user = format!("heavy-{i}");
        for _ in 0..10 + extra {
            should_rate_limit(
                &mut client,
                request("api", vec![descriptor(&[("user", &user)])]),
            )
            .await;
        }
    }
    let top = get_json(&server, "/top?limit=5").await;
    assert_eq!(top["values_shown"], false);
    let ranked: Vec<(String, u64, u64)> = top["top"]
        .as_array()
        .unwrap()
        .iter()
        .map(|key| {
            assert_eq!(key["rule"], "user");
            (
                key["key"].as_str().unwrap().to_owned(),
                key["count"].as_u64().unwrap(),
                key["error"].as_u64().unwrap(),
            )
        })
        .collect();
    let expected: Vec<(String, u64, u64)> = [30u64, 25, 20, 15, 12]
        .iter()
        .enumerate()
        .map(|(i, &denied)| (hashed(&format!("user=heavy-{i}")), denied, 0))
        .collect();
    assert_eq!(ranked, expected);
    let rule = &top["rules"][0];
    assert_eq!(rule["denied_total"], 102);
    // Each heavy user's 9th and 10th calls were admitted past 80% of 10.
    assert_eq!(rule["near_limit_total"], 10);
    let metrics = scrape(server.http).await;
    assert!(!metrics.contains("heavy-") && !metrics.contains("light-"));
    server.stop().await;
}

#[tokio::test]
async fn values_are_shown_when_the_operator_opts_in() {
    let server = start(None, |settings| settings.limiter.top.show_values = true).await;
    for _ in 0..12 {
        call(&server, "10.0.0.7").await;
    }
    let top = get_json(&server, "/top").await;
    assert_eq!(top["values_shown"], true);
    assert_eq!(top["top"][0]["key"], "user=10.0.0.7");
    assert_eq!(top["top"][0]["count"], 2);
    server.stop().await;
}

/// A stricter candidate beside the live rule: every answer and remaining count is the live
/// rule's, and the candidate's own counters say what it would have denied.
async fn candidates_never_change_an_answer(adjust: impl FnOnce(&mut floodgate::server::Settings)) {
    let candidates = common::config_dir(&[("api.yaml", CANDIDATE)]);
    let server = start(Some(candidates.path()), adjust).await;
    for i in 0..12u32 {
        let (code, remaining) = call(&server, "alice").await;
        if i < 10 {
            assert_eq!((code, remaining), (Code::Ok as i32, 9 - i), "call {i}");
        } else {
            assert_eq!(code, Code::OverLimit as i32, "call {i}");
        }
    }
    // Candidates are counted in a task of their own, once the live answer is known.
    let counted = eventually(Duration::from_secs(5), async || {
        get_json(&server, "/overview").await["candidates"][0]["hits"] == 12
    })
    .await;
    assert!(counted, "the candidate did not count every hit");
    let overview = get_json(&server, "/overview").await;
    let candidate = &overview["candidates"][0];
    assert_eq!(candidate["name"], "stricter");
    assert_eq!(candidate["limit"], "3 per hour, fixed window");
    assert_eq!(candidate["hits"], 12);
    assert_eq!(candidate["would_deny"], 9);
    assert_eq!(candidate["live_denied"], 2);
    let top = get_json(&server, "/top").await;
    assert_eq!(
        top["candidates"][0]["denied"][0]["key"],
        hashed("user=alice")
    );
    assert_eq!(top["candidates"][0]["denied"][0]["count"], 9);
    assert_eq!(top["rules"][0]["denied_total"], 2);
    let metrics = scrape(server.http).await;
    for line in [
        "floodgate_candidate_hits_total{domain=\"api\",key=\"user\"} 12",
        "floodgate_candidate_over_limit_total{domain=\"api\",key=\"user\"} 9",
        "floodgate_candidate_errors_total 0",
        "ratelimit_service_rate_limit_over_limit_total{domain=\"api\",key=\"user\"} 2",
    ] {
        assert!(metrics.contains(line), "{line}");
    }
    server.stop().await;
}

#[tokio::test]
async fn candidates_never_change_an_answer_on_memory() {
    candidates_never_change_an_answer(|_| {}).await;
}

#[tokio::test]
async fn candidates_never_change_an_answer_on_redis() {
    let redis = common::redis::RedisServer::start();
    let url = redis.url();
    candidates_never_change_an_answer(move |settings| {
        settings.backend = floodgate::backend::BackendSettings::Redis {
            url,
            options: common::redis_options(Duration::from_secs(2)),
        };
    })
    .await;
}

/// A changed candidate file is picked up while serving; a broken one keeps the last good
/// candidates and counts a rejected load.
#[tokio::test]
async fn candidate_rules_reload_and_a_bad_file_keeps_the_last_good_ones() {
    let candidates = common::config_dir(&[("api.yaml", CANDIDATE)]);
    let server = start(Some(candidates.path()), |_| {}).await;
    let file = candidates.path().join("api.yaml");
    std::fs::write(
        &file,
        CANDIDATE.replace("requests_per_unit: 3", "requests_per_unit: 1"),
    )
    .unwrap();
    let reloaded = eventually(Duration::from_secs(10), async || {
        get_json(&server, "/overview").await["candidates"][0]["limit"] == "1 per hour, fixed window"
    })
    .await;
    assert!(reloaded, "the changed candidate file was not loaded");
    std::fs::write(&file, "domain: api\ndescriptors: [oops\n").unwrap();
    let rejected = eventually(Duration::from_secs(10), async || {
        scrape(server.http)
            .await
            .contains("floodgate_candidate_config_load_error_total 1")
    })
    .await;
    assert!(
        rejected,
        "the broken candidate file was not counted as rejected"
    );
    // Apart from the live rules' load errors, which alert on the rules in force.
    assert!(
        scrape(server.http)
            .await
            .contains("floodgate_config_load_error_total 0")
    );
    let overview = get_json(&server, "/overview").await;
    assert_eq!(
        overview["candidates"][0]["limit"],
        "1 per hour, fixed window"
    );
    server.stop().await;
}

/// The page in a real browser: traffic runs while headless Chromium opens `GET /` and waits
/// until the rules table shows the rule with a rate, the top keys table the heavy key, and
/// the candidate row a would-deny count. The screenshot is kept under
/// `target/artifacts/admin-page.png`.
#[tokio::test]
async fn the_page_shows_rules_top_keys_and_candidates_in_chromium() {
    let candidates = common::config_dir(&[("api.yaml", CANDIDATE)]);
    let server = start(Some(candidates.path()), |_| {}).await;
    let mut client = server.client().await;
    let traffic = tokio::spawn(async move {
        // Bounded: at most 60 s of one call every 20 ms.
        for _ in 0..3_000 {
            let call = request("api", vec![descriptor(&[("user", "mallory")])]);
            if client.should_rate_limit(call).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let (seen, screenshot) = common::check_page(
        &server.http_url("/"),
        "admin-page.png",
        &[
            "--rule",
            "api/user",
            "--key",
            &hashed("user=mallory"),
            "--candidate",
            "api/user/stricter",
        ],
    )
    .await;
    traffic.abort();
    eprintln!(
        "admin page: first render {} ms; {}",
        seen["load_ms"],
        screenshot.display()
    );
    assert_eq!(seen["rule"]["limit"], "10 per hour, fixed window");
    assert_eq!(seen["top_key"]["key"], hashed("user=mallory"));
    assert_eq!(seen["candidate"]["name"], "stricter");
    assert!(screenshot.exists());
    server.stop().await;
}
