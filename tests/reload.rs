//! Hot reload: a new domain applies, an invalid file keeps the old rules, and a Kubernetes
//! ConfigMap-style `..data` symlink swap is picked up.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{TestServer, descriptor, http, request, should_rate_limit};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

const FIRST: &str =
    "domain: one\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";
const SECOND: &str =
    "domain: two\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 7}\n";

/// Polls until `domain` has a limit for `k`; the watcher reloads asynchronously.
async fn wait_for_limit(server: &TestServer, domain: &str, expected: Option<u32>) {
    let mut client = server.client().await;
    let mut seen = None;
    for _ in 0..100 {
        let response = should_rate_limit(
            &mut client,
            request(domain, vec![descriptor(&[("k", "probe")])]),
        )
        .await;
        seen = response.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit);
        if seen == expected {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("domain {domain}: expected limit {expected:?}, still {seen:?}");
}

async fn metric(server: &TestServer, name: &str) -> String {
    let (_, text) = http("GET", &server.http_url("/metrics"), "").await;
    text.lines()
        .find(|line| line.starts_with(name))
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn new_domain_applies_and_invalid_file_keeps_old_rules() {
    let server = TestServer::start(&[("one.yaml", FIRST)]).await;
    let dir = server.config_dir.path().to_path_buf();
    std::fs::write(dir.join("two.yaml"), SECOND).unwrap();
    wait_for_limit(&server, "two", Some(7)).await;

    std::fs::write(
        dir.join("broken.yaml"),
        "domain: three\ndescriptors:\n  - kee: typo\n",
    )
    .unwrap();
    // Wait for the rejection to be counted, then check the old rules still apply.
    for _ in 0..100 {
        if metric(&server, "floodgate_config_load_error_total")
            .await
            .ends_with(" 1")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        metric(&server, "floodgate_config_load_error_total")
            .await
            .ends_with(" 1")
    );
    wait_for_limit(&server, "two", Some(7)).await;
    wait_for_limit(&server, "one", Some(1)).await;

    std::fs::remove_file(dir.join("broken.yaml")).unwrap();
    std::fs::remove_file(dir.join("two.yaml")).unwrap();
    wait_for_limit(&server, "two", None).await;
    let mut client = server.client().await;
    let response =
        should_rate_limit(&mut client, request("one", vec![descriptor(&[("k", "x")])])).await;
    assert_eq!(response.overall_code, Code::Ok as i32);
    server.stop().await;
}

/// Lays out `dir` like a mounted ConfigMap: `..<version>/file`, `..data -> ..<version>`,
/// and `file -> ..data/file`.
fn configmap_version(dir: &Path, version: &str, yaml: &str) {
    let versioned = dir.join(format!("..{version}"));
    std::fs::create_dir(&versioned).unwrap();
    std::fs::write(versioned.join("rules.yaml"), yaml).unwrap();
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(format!("..{version}"), &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    let link = dir.join("rules.yaml");
    if std::fs::symlink_metadata(&link).is_err() {
        std::os::unix::fs::symlink("..data/rules.yaml", &link).unwrap();
    }
}

#[tokio::test]
async fn configmap_symlink_swap_reloads() {
    let dir = tempfile::tempdir().unwrap();
    configmap_version(dir.path(), "v1", FIRST);
    let server = TestServer::start_with(&[], |settings| {
        settings.config_dir = dir.path().to_path_buf()
    })
    .await;
    wait_for_limit(&server, "one", Some(1)).await;
    configmap_version(dir.path(), "v2", SECOND);
    wait_for_limit(&server, "two", Some(7)).await;
    wait_for_limit(&server, "one", None).await;
    server.stop().await;
}
