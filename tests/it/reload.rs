//! Hot reload: a new domain applies, an invalid file keeps the old rules, and a Kubernetes
//! ConfigMap-style `..data` symlink swap is picked up.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::{
    TestServer, descriptor, eventually, metric_line, request, should_rate_limit, wait_for_limit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

const FIRST: &str =
    "domain: one\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";
const SECOND: &str =
    "domain: two\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 7}\n";

/// The descriptor whose limit shows which rules apply; the watcher reloads asynchronously.
const PROBE: (&str, &str) = ("k", "probe");

#[tokio::test]
async fn new_domain_applies_and_invalid_file_keeps_old_rules() {
    let server = TestServer::start(&[("one.yaml", FIRST)]).await;
    let dir = server.config_dir.path().to_path_buf();
    std::fs::write(dir.join("two.yaml"), SECOND).unwrap();
    wait_for_limit(&server, "two", PROBE, Some(7)).await;

    std::fs::write(
        dir.join("broken.yaml"),
        "domain: three\ndescriptors:\n  - kee: typo\n",
    )
    .unwrap();
    // Wait for the rejection to be counted, then check the old rules still apply.
    eventually(Duration::from_secs(5), async || {
        metric_line(server.http, "floodgate_config_load_error_total")
            .await
            .ends_with(" 1")
    })
    .await;
    assert!(
        metric_line(server.http, "floodgate_config_load_error_total")
            .await
            .ends_with(" 1")
    );
    wait_for_limit(&server, "two", PROBE, Some(7)).await;
    wait_for_limit(&server, "one", PROBE, Some(1)).await;

    std::fs::remove_file(dir.join("broken.yaml")).unwrap();
    std::fs::remove_file(dir.join("two.yaml")).unwrap();
    wait_for_limit(&server, "two", PROBE, None).await;
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
    wait_for_limit(&server, "one", PROBE, Some(1)).await;
    configmap_version(dir.path(), "v2", SECOND);
    wait_for_limit(&server, "two", PROBE, Some(7)).await;
    wait_for_limit(&server, "one", PROBE, None).await;
    server.stop().await;
}
