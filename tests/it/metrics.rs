//! Metrics (docs/operations.md#metrics, issue 9 items 1, 7 and 9, issue 12 item 5): request-made
//! series stay bounded, cost-weighted counters stay exact, `value_to_metric` keys follow the
//! reference, reloads drop removed rules' series, memory evictions and readiness are exported, and
//! every metric the shipped dashboards and alerts query exists in a real service's `/metrics`.

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use common::{
    Binary, TestServer, descriptor, eventually, request, sample, scrape, should_rate_limit,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::google::protobuf::UInt64Value;
use floodgate::backend::BackendSettings;
use tonic::transport::Channel;

/// An RLS client of a server started as a process.
async fn connect(grpc: std::net::SocketAddr) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(format!("http://{grpc}"))
        .await
        .expect("client connects")
}

/// The per-rule `total_hits` of `key` in `domain`.
fn total_hits(text: &str, domain: &str, key: &str) -> Option<f64> {
    sample(
        text,
        &format!(
            "ratelimit_service_rate_limit_total_hits_total{{domain=\"{domain}\",key=\"{key}\"}}"
        ),
    )
}

/// The `key` labels of every `total_hits` series of `domain`.
fn keys_of(text: &str, domain: &str) -> BTreeSet<String> {
    let prefix =
        format!("ratelimit_service_rate_limit_total_hits_total{{domain=\"{domain}\",key=\"");
    text.lines()
        .filter_map(|line| line.strip_prefix(prefix.as_str()))
        .filter_map(|rest| rest.split_once("\"}"))
        .map(|(key, _)| key.to_owned())
        .collect()
}

const DETAILED: &str = "\
domain: m
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 1000000}
";

fn override_descriptor(pairs: &[(&str, &str)]) -> RateLimitDescriptor {
    let mut d = descriptor(pairs);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 1_000_000,
        unit: RateLimitUnit::Hour as i32,
    });
    d
}

/// Issue 9 item 1: fresh override keys and fresh `detailed_metric` values from clients grow
/// neither the process nor `/metrics` without bound (the real binary, default settings).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_made_series_stay_bounded() {
    let dir = common::config_dir(&[("m.yaml", DETAILED)]);
    let server = Binary::start(&["--config", dir.path().to_str().unwrap()], &[]);
    let mut client = connect(server.grpc).await;
    // Warm up (connections, buffers, the allocator's first arenas), then measure while
    // 5,000 requests carry an override with two fresh 1 KB keys and 20,000 descriptors carry
    // a fresh detailed_metric value (10 per request).
    let mut before = 0;
    for round in 0..5_200 {
        if round == 200 {
            before = common::rss_kib(server.child.id());
        }
        let first = format!("{round:0>1000}a");
        let second = format!("{round:0>1000}b");
        let mut descriptors = vec![override_descriptor(&[
            (first.as_str(), "v"),
            (second.as_str(), "w"),
        ])];
        if round < 2_200 {
            descriptors.extend((0..10).map(|j| {
                let value = format!("u{round:05}-{j}");
                descriptor(&[("user", value.as_str())])
            }));
        }
        should_rate_limit(&mut client, request("m", descriptors)).await;
    }
    let after = common::rss_kib(server.child.id());
    let text = scrape(server.http).await;
    let growth_mib = after.saturating_sub(before) as f64 / 1024.0;
    eprintln!(
        "RSS {before} KiB -> {after} KiB ({growth_mib:.1} MiB), /metrics {} bytes",
        text.len()
    );
    assert!(growth_mib < 30.0, "RSS grew by {growth_mib:.1} MiB");
    assert!(text.len() < 2 << 20, "/metrics is {} bytes", text.len());
}

/// Issue 9 item 1: a cost of 2^63 is clamped when counted, so a following cost-1 hit still
/// moves `total_hits` by exactly 1 as Prometheus reads it.
#[tokio::test]
async fn a_huge_cost_then_one_moves_total_hits_by_exactly_one() {
    let rule = "domain: c\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 10}\n";
    let server = TestServer::start(&[("c.yaml", rule)]).await;
    let mut client = server.client().await;
    let mut huge = descriptor(&[("k", "x")]);
    huge.hits_addend = Some(UInt64Value { value: 1 << 63 });
    for _ in 0..2 {
        should_rate_limit(&mut client, request("c", vec![huge.clone()])).await;
    }
    let before = total_hits(&scrape(server.http).await, "c", "k").expect("series");
    should_rate_limit(&mut client, request("c", vec![descriptor(&[("k", "x")])])).await;
    let after = total_hits(&scrape(server.http).await, "c", "k").expect("series");
    assert_eq!(after - before, 1.0, "total_hits {before} -> {after}");
    assert_eq!(before, 22.0, "two clamped hits of limit + 1 each");
    server.stop().await;
}

const PER_LEVEL: &str = r#"
domain: v
descriptors:
  - key: route
    value: draw
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: hour, requests_per_unit: 100}
  - key: path
    value: "/api/*"
    value_to_metric: true
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 100}
  - key: tenant
    value: "t*"
    descriptors:
      - key: method
        value_to_metric: true
        rate_limit: {unit: hour, requests_per_unit: 100}
  - key: shared
    value: "s*"
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: id
        rate_limit: {unit: hour, requests_per_unit: 100}
  - key: region
    value_to_metric: true
    descriptors:
      - key: id
        detailed_metric: true
        rate_limit: {unit: hour, requests_per_unit: 100}
"#;

/// Issue 9 item 7: `value_to_metric` belongs to the level where it is set, as in the
/// reference: a flagged wildcard or key-only level shows the runtime value, an unflagged
/// wildcard level its pattern, a `share_threshold` level always its pattern, and a leaf's
/// `detailed_metric` takes precedence with every level's value.
#[tokio::test]
async fn value_to_metric_belongs_to_its_level() {
    let server = TestServer::start(&[("v.yaml", PER_LEVEL)]).await;
    let mut client = server.client().await;
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[
                ("route", "draw"),
                ("http_method", "GET"),
                ("subject_id", "123"),
            ],
            "route_draw.http_method_GET.subject_id",
        ),
        (
            &[("path", "/api/users"), ("user", "alice")],
            "path_/api/users.user",
        ),
        (
            &[("tenant", "t42"), ("method", "POST")],
            "tenant_t*.method_POST",
        ),
        (&[("shared", "s1"), ("id", "9")], "shared_s*.id"),
        (&[("region", "eu"), ("id", "7")], "region_eu.id_7"),
    ];
    for (entries, _) in cases {
        should_rate_limit(&mut client, request("v", vec![descriptor(entries)])).await;
    }
    let text = scrape(server.http).await;
    for (entries, key) in cases {
        assert_eq!(
            total_hits(&text, "v", key),
            Some(1.0),
            "{entries:?} should count under {key}; keys: {:?}",
            keys_of(&text, "v")
        );
    }
    server.stop().await;
}

/// Issue 9 item 1: the series of a rule a reload removes are dropped; the others stay.
#[tokio::test]
async fn a_reload_drops_the_series_of_removed_rules() {
    let both = "domain: r\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 9}\n  - key: b\n    value_to_metric: true\n    rate_limit: {unit: hour, requests_per_unit: 9}\n";
    let only_a =
        "domain: r\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 9}\n";
    let server = TestServer::start(&[("r.yaml", both)]).await;
    let mut client = server.client().await;
    let hits = vec![descriptor(&[("a", "1")]), descriptor(&[("b", "2")])];
    should_rate_limit(&mut client, request("r", hits)).await;
    let text = scrape(server.http).await;
    assert_eq!(
        keys_of(&text, "r"),
        BTreeSet::from(["a".to_owned(), "b_2".to_owned()])
    );

    std::fs::write(server.config_dir.path().join("r.yaml"), only_a).unwrap();
    let mut text = String::new();
    eventually(Duration::from_secs(10), async || {
        text = scrape(server.http).await;
        sample(&text, "floodgate_loaded_rules") == Some(1.0)
    })
    .await;
    assert_eq!(sample(&text, "floodgate_loaded_rules"), Some(1.0));
    assert_eq!(keys_of(&text, "r"), BTreeSet::from(["a".to_owned()]));
    assert!(!text.contains("key=\"b_2\""), "{text}");
    server.stop().await;
}

/// Issue 9 item 1: past `--max-metric-series` (here from its environment variable),
/// request-valued series fold into one `_overflow` series per domain, counted; every hit is
/// still counted exactly once.
#[tokio::test]
async fn valued_series_past_the_cap_fold_into_overflow() {
    let dir = common::config_dir(&[("m.yaml", DETAILED)]);
    // Each key is six series (one per per-rule counter): room for 10 keys.
    let server = Binary::start(
        &["--config", dir.path().to_str().unwrap()],
        &[("FLOODGATE_MAX_METRIC_SERIES", "60")],
    );
    let mut client = connect(server.grpc).await;
    for i in 0..30 {
        let value = format!("u{i}");
        should_rate_limit(
            &mut client,
            request("m", vec![descriptor(&[("user", value.as_str())])]),
        )
        .await;
    }
    let text = scrape(server.http).await;
    let keys = keys_of(&text, "m");
    assert_eq!(keys.len(), 11, "{keys:?}");
    assert!(keys.contains("_overflow"), "{keys:?}");
    assert_eq!(total_hits(&text, "m", "_overflow"), Some(20.0));
    let all: f64 = keys
        .iter()
        .filter_map(|key| total_hits(&text, "m", key))
        .sum();
    assert_eq!(all, 30.0);
    assert_eq!(
        sample(&text, "floodgate_metric_series_overflow_total"),
        Some(20.0)
    );
}

/// Issue 9 item 9: live buckets the memory backend drops to respect its cap are counted in
/// `floodgate_memory_evictions`.
#[tokio::test]
async fn memory_evictions_are_exported() {
    let rule =
        "domain: e\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5}\n";
    let server = TestServer::start_with(&[("e.yaml", rule)], |settings| {
        settings.backend = BackendSettings::Memory { max_buckets: 64 };
    })
    .await;
    let before = scrape(server.http).await;
    assert_eq!(
        sample(&before, "floodgate_memory_evictions_total"),
        Some(0.0)
    );
    let mut client = server.client().await;
    for i in 0..50 {
        let descriptors = (0..10)
            .map(|j| descriptor(&[("k", format!("{i}-{j}").as_str())]))
            .collect();
        should_rate_limit(&mut client, request("e", descriptors)).await;
    }
    let text = scrape(server.http).await;
    let evictions = sample(&text, "floodgate_memory_evictions_total").expect("exported");
    // 500 buckets into 64 slots: at least 500 - 64 live ones were dropped.
    assert!(evictions >= 436.0, "{evictions}");
    server.stop().await;
}

/// Issue 12 item 5: `floodgate_ready` mirrors the readiness latch.
#[tokio::test]
async fn readiness_is_exported() {
    let rule =
        "domain: h\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5}\n";
    let ready = TestServer::start(&[("h.yaml", rule)]).await;
    assert_eq!(
        sample(&scrape(ready.http).await, "floodgate_ready"),
        Some(1.0)
    );
    ready.stop().await;

    // Nothing listens on port 1: the backend never answers, so the service never turns ready.
    let unready = TestServer::start_with(&[("h.yaml", rule)], |settings| {
        settings.backend = BackendSettings::Redis {
            url: "redis://127.0.0.1:1".into(),
            options: common::redis_options(Duration::from_millis(100)),
        };
    })
    .await;
    assert_eq!(
        sample(&scrape(unready.http).await, "floodgate_ready"),
        Some(0.0)
    );
    unready.stop().await;
}

/// Every metric name in a PromQL expression: identifiers of floodgate's own families.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = ["floodgate_", "ratelimit_service_"]
        .iter()
        .filter_map(|prefix| rest.find(prefix))
        .min()
    {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

/// Every `expr` string anywhere in a JSON document (Grafana targets).
fn json_exprs(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, value) in map {
                match value {
                    serde_json::Value::String(expr) if key == "expr" => out.push(expr.clone()),
                    other => json_exprs(other, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|item| json_exprs(item, out)),
        _ => {}
    }
}

/// Every `expr` string anywhere in a YAML document (Prometheus rules).
fn yaml_exprs(value: &serde_yaml::Value, out: &mut Vec<String>) {
    match value {
        serde_yaml::Value::Mapping(map) => {
            for (key, value) in map {
                match value {
                    serde_yaml::Value::String(expr) if key.as_str() == Some("expr") => {
                        out.push(expr.clone());
                    }
                    other => yaml_exprs(other, out),
                }
            }
        }
        serde_yaml::Value::Sequence(items) => items.iter().for_each(|item| yaml_exprs(item, out)),
        _ => {}
    }
}

/// Every query in `deploy/grafana/*.json` and `deploy/prometheus/*.yaml`, with its file.
fn deploy_queries() -> Vec<(String, String)> {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    let mut queries = Vec::new();
    for (dir, extension) in [("grafana", "json"), ("prometheus", "yaml")] {
        let mut files: Vec<_> = std::fs::read_dir(deploy.join(dir))
            .unwrap_or_else(|error| panic!("deploy/{dir}: {error}"))
            .map(|entry| entry.expect("dir entry").path())
            .filter(|path| path.extension().is_some_and(|e| e == extension))
            .collect();
        files.sort();
        assert!(!files.is_empty(), "no .{extension} file in deploy/{dir}");
        for file in files {
            let text = std::fs::read_to_string(&file).expect("read");
            let mut exprs = Vec::new();
            if extension == "json" {
                let doc: serde_json::Value = serde_json::from_str(&text)
                    .unwrap_or_else(|error| panic!("{}: {error}", file.display()));
                json_exprs(&doc, &mut exprs);
            } else {
                let doc: serde_yaml::Value = serde_yaml::from_str(&text)
                    .unwrap_or_else(|error| panic!("{}: {error}", file.display()));
                yaml_exprs(&doc, &mut exprs);
            }
            assert!(!exprs.is_empty(), "{} has no queries", file.display());
            let name = file.display().to_string();
            queries.extend(exprs.into_iter().map(|expr| (name.clone(), expr)));
        }
    }
    queries
}

/// The sample names a `/metrics` text can hold: every family's own samples as its `# TYPE`
/// line declares them (a family with no sample yet still exists), and every sample seen.
fn exported_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(declared) = line.strip_prefix("# TYPE ") {
            let mut parts = declared.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                _ => &[""],
            };
            names.extend(suffixes.iter().map(|suffix| format!("{name}{suffix}")));
        } else if !line.starts_with('#') {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_owned());
        }
    }
    names
}

/// Issue 12 item 5: the dashboard and alert files parse, and every metric they query exists
/// in the `/metrics` output of a real service that has served some traffic.
#[tokio::test]
async fn dashboards_and_alerts_query_only_exported_metrics() {
    let rule =
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
    let server = TestServer::start(&[("d.yaml", rule)]).await;
    let mut client = server.client().await;
    for _ in 0..3 {
        should_rate_limit(&mut client, request("d", vec![descriptor(&[("k", "x")])])).await;
    }
    let _ = client.should_rate_limit(request("", vec![])).await;
    let mut exported = exported_names(&scrape(server.http).await);
    server.stop().await;
    // Backend failures only show once they happen: a Redis backend nobody listens for
    // (port 1), answering by `--failure-mode allow`.
    let failing = TestServer::start_with(&[("d.yaml", rule)], |settings| {
        settings.backend = BackendSettings::Redis {
            url: "redis://127.0.0.1:1".into(),
            options: common::redis_options(Duration::from_millis(100)),
        };
        settings.limiter.failure_mode = floodgate::limiter::FailureMode::Allow;
    })
    .await;
    let mut client = failing.client().await;
    should_rate_limit(&mut client, request("d", vec![descriptor(&[("k", "x")])])).await;
    exported.extend(exported_names(&scrape(failing.http).await));
    failing.stop().await;

    let queries = deploy_queries();
    let mut missing = Vec::new();
    let mut used = BTreeSet::new();
    for (file, expr) in &queries {
        for name in metric_names(expr) {
            if !exported.contains(&name) {
                missing.push(format!("{file}: {name} in `{expr}`"));
            }
            used.insert(name);
        }
    }
    assert!(missing.is_empty(), "not exported:\n{}", missing.join("\n"));
    // The dashboards cover what issue 12 asks for.
    for needed in [
        "floodgate_decisions_total",
        "ratelimit_service_rate_limit_over_limit_total",
        "floodgate_request_latency_seconds_bucket",
        "floodgate_backend_latency_seconds_bucket",
        "floodgate_backend_errors_total",
        "floodgate_local_cache_hits_total",
        "floodgate_config_load_success_total",
        "floodgate_config_load_error_total",
        "floodgate_ready",
    ] {
        assert!(used.contains(needed), "no dashboard or alert uses {needed}");
    }
}
