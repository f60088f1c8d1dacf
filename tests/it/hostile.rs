//! Every guarantee tried by the client that would break it (issue 46): each test is one
//! attack from the table of `docs/reliability.md`, against a real server.

use crate::common;

use std::fmt::Write as _;
use std::time::Duration;

use crate::rlqs::{self, Kind, Quota};
use common::{TestServer, descriptor, request, should_rate_limit};
use prost::Message;
use serde_json::Value;

/// A web page on another origin can post `text/plain` without the browser asking first;
/// `/json` spends real quota, so it takes only `application/json`.
#[tokio::test]
async fn json_from_another_origins_page_is_refused_unless_it_is_application_json() {
    let server = TestServer::start(&[("api.yaml", &rules())]).await;
    let url = server.http_url("/json");
    let body = r#"{"domain":"api","descriptors":[{"entries":[{"key":"r0","value":"a"}]}]}"#;
    let client = reqwest::Client::new();
    for content_type in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        None,
    ] {
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
        let answer = reqwest::get(server.http_url(path))
            .await
            .expect("admin answers");
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

/// The quota stream's path.
const RLQS_PATH: &str =
    "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas";

/// Opens a quota stream over a bare HTTP/2 client, sends `body` as its bytes and ends the
/// request; returns the `grpc-status` the server ended the stream with.
async fn raw_quota_stream(server: &TestServer, body: Vec<u8>) -> i32 {
    let tcp = tokio::net::TcpStream::connect(server.grpc)
        .await
        .expect("connect");
    let (mut h2, connection) = h2::client::handshake(tcp).await.expect("h2 handshake");
    tokio::spawn(connection);
    let call = http::Request::post(format!("http://{}{RLQS_PATH}", server.grpc))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("request");
    let (answer, mut sending) = h2.send_request(call, false).expect("send");
    sending.send_data(body.into(), true).expect("body");
    let answer = tokio::time::timeout(Duration::from_secs(10), async move {
        let (parts, mut body) = answer.await.expect("answer").into_parts();
        while let Some(chunk) = body.data().await {
            chunk.expect("data");
        }
        let trailers = body.trailers().await.expect("trailers");
        trailers
            .as_ref()
            .and_then(|t| t.get("grpc-status"))
            .or_else(|| parts.headers.get("grpc-status"))
            .and_then(|v| v.to_str().ok()?.parse::<i32>().ok())
            .expect("grpc-status")
    });
    answer.await.expect("the server ends the stream")
}

/// A gRPC frame: its flag byte, its length, its bytes.
fn grpc_frame(flag: u8, length: u32, payload: &[u8]) -> Vec<u8> {
    let mut frame = vec![flag];
    frame.extend_from_slice(&length.to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

/// A frame with the compressed flag but no `grpc-encoding`, a flag of 2, and a frame cut
/// short each ended their stream with status 0 (OK), uncounted. Each now ends it with
/// INTERNAL (gRPC's compression spec names that status for the first), counted.
#[tokio::test]
async fn malformed_frames_end_a_quota_stream_with_an_error_not_ok() {
    let server = TestServer::start(&[("api.yaml", &rules())]).await;
    let report = rlqs::usages("api", &[(&[("r0", "a")], 1, 0)]).encode_to_vec();
    let length = u32::try_from(report.len()).unwrap();
    for (case, body) in [
        (
            "compressed without grpc-encoding",
            grpc_frame(1, length, &report),
        ),
        ("flag 2", grpc_frame(2, length, &report)),
        ("cut short", grpc_frame(0, length + 100, &report)),
    ] {
        let status = raw_quota_stream(&server, body).await;
        assert_eq!(status, tonic::Code::Internal as i32, "{case}");
    }
    let text = common::scrape(server.http).await;
    let ended = common::sample(
        &text,
        "floodgate_rlqs_stream_ends_total{reason=\"malformed_frame\"}",
    );
    assert_eq!(ended, Some(3.0));
    server.stop().await;
}

/// `--grpc-max-connections 2`: a connection whose quota stream reported 2 s ago and a unary
/// caller's from 0.2 s ago. The stream's connection was taken for idle (over 1 s) and
/// evicted, ending the stream UNAVAILABLE; a connection whose stream reported within two of
/// its intervals now stays, and the newcomer is the one refused.
#[tokio::test]
async fn at_the_cap_a_reporting_quota_connection_is_never_evicted() {
    let server = TestServer::start_with(&[("api.yaml", &rules())], |settings| {
        settings.grpc_limits.max_connections = 2;
    })
    .await;
    let id: &[(&str, &str)] = &[("r0", "quota")];
    let mut quota = Quota::open(server.grpc).await;
    quota.report("api", id, 0, 0).await;
    let mut unary = server.client().await;
    tokio::time::sleep(Duration::from_millis(1800)).await;
    should_rate_limit(&mut unary, request("api", vec![descriptor(&[("r1", "u")])])).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A third connection: nothing may make room for it.
    let newcomer = tonic::transport::Channel::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await;
    if let Ok(channel) = newcomer {
        let mut client = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::new(channel);
        let call = request("api", vec![descriptor(&[("r2", "n")])]);
        let _ = tokio::time::timeout(Duration::from_secs(3), client.should_rate_limit(call)).await;
    }
    // An evicted connection is closed 5 s after its GOAWAY (the listener's grace); the
    // stream is still open after that and answers its next report.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let kind = quota.report("api", id, 0, 0).await;
    assert!(!matches!(kind, Kind::Abandon), "{kind:?}");
    server.stop().await;
}

/// A live rule of one request an hour per user, and a candidate of a day's window.
const LIVE_USERS: &str = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
const DAY_CANDIDATE: &str = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 1000}\n  - key: fast\n    rate_limit: {unit: second, requests_per_unit: 1000}\n";

/// A memory backend capped at 6,400 buckets holds 4,000 users' live buckets. A candidate
/// rule's 4,000 buckets beside them evicted live ones, and 2,380 of 4,000 second calls were
/// wrongly admitted; candidates now live in a store of their own.
#[tokio::test]
async fn a_candidate_never_evicts_a_live_bucket_from_a_full_memory_backend() {
    common::away_from_an_hour_boundary().await;
    let candidates = common::config_dir(&[("api.yaml", DAY_CANDIDATE)]);
    let dir = candidates.path().to_path_buf();
    let server = TestServer::start_with(&[("api.yaml", LIVE_USERS)], move |settings| {
        settings.candidate_dir = Some(dir);
        settings.backend = floodgate::backend::BackendSettings::Memory { max_buckets: 6400 };
    })
    .await;
    let mut client = server.client().await;
    let mut admitted = [0u32; 2];
    for admitted in &mut admitted {
        for user in 0..4000 {
            let call = request("api", vec![descriptor(&[("user", &format!("u{user}"))])]);
            let answer = should_rate_limit(&mut client, call).await;
            *admitted += u32::from(answer.overall_code == 1);
        }
    }
    assert_eq!(admitted, [4000, 0], "first and second calls admitted");
    server.stop().await;
}

/// The per-second Redis only a candidate rule uses hangs (SIGSTOP). Every live answer
/// waited for the backend timeout (0.5 ms to 502 ms); the live answer is now sent when the
/// live decision is made, the candidate finishing on its own.
#[tokio::test]
async fn a_hung_backend_only_a_candidate_uses_never_delays_a_live_answer() {
    use floodgate::backend::BackendSettings;
    common::away_from_an_hour_boundary().await;
    let main = common::redis::RedisServer::start();
    let per_second = common::redis::RedisServer::start();
    let candidates = common::config_dir(&[("api.yaml", DAY_CANDIDATE)]);
    let dir = candidates.path().to_path_buf();
    let timeout = Duration::from_secs(3);
    let redis = |url: String| BackendSettings::Redis {
        url,
        options: common::redis_options(timeout),
    };
    let backend = BackendSettings::PerSecond {
        main: Box::new(redis(main.url())),
        per_second: Box::new(redis(per_second.url())),
    };
    let server = TestServer::start_with(&[("api.yaml", LIVE_USERS)], move |settings| {
        settings.candidate_dir = Some(dir);
        settings.backend = backend;
        settings.limiter.backend_timeout = timeout;
    })
    .await;
    let mut client = server.client().await;
    let call = || {
        request(
            "api",
            vec![descriptor(&[("user", "u")]), descriptor(&[("fast", "f")])],
        )
    };
    should_rate_limit(&mut client, call()).await;
    per_second.signal("STOP");
    let started = tokio::time::Instant::now();
    for _ in 0..3 {
        let answer = should_rate_limit(&mut client, call()).await;
        assert_eq!(answer.overall_code, 2, "the live rule denies");
    }
    let took = started.elapsed();
    per_second.signal("CONT");
    // Three answers, each of which waited the 3 s timeout before.
    assert!(took < timeout, "three live answers took {took:?}");
    server.stop().await;
}

/// One bucket of 100 a second, for the honest stream and the attacker.
const SHARED: &str = "domain: web\ndescriptors:\n  - key: shared\n    rate_limit: {unit: second, requests_per_unit: 100}\n";

/// An honest stream reports 30 a second of `value`'s 100 a second beside `attack`, which
/// returns the attacker's stream (open, for its own next report); after the honest
/// stream's second report it is assigned at least its 30 a second, and its rate and the
/// attacker's add up to at most the limit.
async fn honest_beside(
    value: &str,
    attack: impl AsyncFnOnce(&TestServer, &[(&str, &str)]) -> Quota,
) {
    let server = TestServer::start(&[("web.yaml", SHARED)]).await;
    let id: &[(&str, &str)] = &[("shared", value)];
    let mut honest = Quota::open(server.grpc).await;
    honest.report("web", id, 150, 0).await;
    let first = tokio::time::Instant::now();
    let mut attacker = attack(&server, id).await;
    // Envoy's next report comes 5 s on; 3 s is enough to read it as 30 a second.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let allowed = (30.0 * first.elapsed().as_secs_f64()).ceil() as u64;
    let honest_rate = rlqs::rate(honest.report("web", id, allowed, 0).await);
    assert!(
        honest_rate >= 30.0 * 0.995,
        "honest stream assigned {honest_rate}/s"
    );
    let attacker_rate = match attacker.report("web", id, 1_000_000, 1_000_000).await {
        Kind::Tokens { rate, .. } => rate,
        Kind::DenyAll { .. } => 0.0,
        other => panic!("attacker assigned {other:?}"),
    };
    assert!(
        honest_rate + attacker_rate <= 100.0,
        "{honest_rate} + {attacker_rate} on 100/s"
    );
    server.stop().await;
}

/// A stream repeated the bucket 1,000 times in one report: the honest stream was assigned
/// DENY_ALL for 5.5 s, then 0.04/s. Duplicates now merge and claim at most the limit's rate.
#[tokio::test]
async fn duplicates_in_one_report_leave_an_honest_stream_its_demand() {
    honest_beside("duplicates", async |server, id| {
        let attacker = Quota::open(server.grpc).await;
        let mut flood = rlqs::usages("web", &[(id, 1_000_000, 1_000_000)]);
        flood.bucket_quota_usages = vec![flood.bucket_quota_usages[0].clone(); 1_000];
        attacker.send(flood).await;
        let mut attacker = attacker;
        attacker.action_for(id).await;
        attacker
    })
    .await;
}

/// A stream sent 50 reports a second: the honest stream got 1.0/s. Reports share the real
/// time between them now, so a flood claims no more than one report would.
#[tokio::test]
async fn a_flood_of_reports_leaves_an_honest_stream_its_demand() {
    honest_beside("flood", async |server, id| {
        let mut attacker = Quota::open(server.grpc).await;
        for _ in 0..50 {
            attacker.report("web", id, 1_000_000, 1_000_000).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        attacker
    })
    .await;
}

/// A stream reopened in a loop re-armed the floor a new stream kept: assigned rates added
/// up to 112/s on 100/s. A stream that ends now takes its demand with it, and no stream
/// keeps a rate past its share.
#[tokio::test]
async fn a_stream_reopened_in_a_loop_takes_no_more_than_its_share() {
    honest_beside("reopened", async |server, id| {
        for _ in 0..5 {
            let mut attacker = Quota::open(server.grpc).await;
            attacker.report("web", id, 1_000_000, 1_000_000).await;
        }
        let mut attacker = Quota::open(server.grpc).await;
        attacker.report("web", id, 1_000_000, 1_000_000).await;
        attacker
    })
    .await;
}

/// 20 streams on one connection, each holding 60 buckets whose ids are 256 KiB (32 pairs of
/// 4 KiB keys and values): the bounds counted buckets, not bytes, and the process kept
/// +651 MiB. A connection now holds at most 16 MiB of buckets, the rest left unassigned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_bucket_ids_hold_a_bounded_number_of_bytes() {
    let dir = common::config_dir(&[("web.yaml", SHARED)]);
    let server = common::Binary::start(&["--config", dir.path().to_str().unwrap()], &[]);
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await
        .expect("connects");
    let warm = Quota::on(channel.clone()).await;
    drop(warm);
    let before = common::rss_kib(server.child.id());
    let mut streams = Vec::new();
    let mut answered = 0;
    // Reads what a stream has answered so far, waiting at most `wait` for each answer.
    async fn drain(quota: &mut Quota, wait: Duration) -> usize {
        let mut assigned = 0;
        while let Ok(Ok(answer)) = tokio::time::timeout(wait, quota.next()).await {
            assigned += answer.bucket_action.len();
        }
        assigned
    }
    for stream in 0..20 {
        let mut quota = Quota::on(channel.clone()).await;
        for bucket in 0..60 {
            let pairs: Vec<(String, String)> = (0..32)
                .map(|pair| {
                    let key = format!("{pair:02}{}", "k".repeat(4094));
                    let value = format!("{stream:02}{bucket:02}{}", "v".repeat(4092));
                    (key, value)
                })
                .collect();
            let id: Vec<(&str, &str)> = pairs
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            quota.send(rlqs::usages("web", &[(&id, 1, 0)])).await;
            answered += drain(&mut quota, Duration::from_millis(5)).await;
        }
        streams.push(quota);
    }
    // The rest of the answers (skipped buckets get none).
    for quota in &mut streams {
        answered += drain(quota, Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let grown_mib = common::rss_kib(server.child.id()).saturating_sub(before) / 1024;
    // 16 MiB hold about 60 such buckets; every other one is skipped, its stream open.
    eprintln!("{answered} of 1,200 hostile buckets held; RSS grew {grown_mib} MiB");
    assert!((50..=70).contains(&answered), "{answered} buckets assigned");
    assert!(grown_mib < 64, "RSS grew {grown_mib} MiB");
    let text = common::scrape(server.http).await;
    let skipped = common::sample(
        &text,
        "floodgate_rlqs_skipped_buckets_total{reason=\"bucket_limit\"}",
    );
    assert!(skipped.is_some_and(|n| n >= 1000.0), "{skipped:?}");
    drop(streams);
}

/// Reports `count` buckets of `shared` named `<prefix>-<i>`, idle, in one message.
async fn report_idle(quota: &Quota, prefix: &str, count: usize) {
    let values: Vec<String> = (0..count).map(|i| format!("{prefix}-{i}")).collect();
    let ids: Vec<[(&str, &str); 1]> = values.iter().map(|v| [("shared", v.as_str())]).collect();
    let reported: Vec<rlqs::Reported<'_>> = ids.iter().map(|id| (&id[..], 0, 0)).collect();
    quota.send(rlqs::usages("web", &reported)).await;
}

/// `--rlqs-max-buckets 100`: one client filled the process's 2,000 buckets over ten
/// connections, and a second Envoy's bucket was skipped (no assignment). Now the newcomer's
/// bucket is assigned, and the largest holder gives back its least active bucket.
#[tokio::test]
async fn one_client_at_the_process_bound_does_not_lock_out_another() {
    let server = TestServer::start_with(&[("web.yaml", SHARED)], |settings| {
        settings.rlqs.max_buckets = 100;
    })
    .await;
    let mut hog = Vec::new();
    for connection in 0..10 {
        let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.grpc))
            .unwrap()
            .connect()
            .await
            .expect("connects");
        // The first connection holds more than the others: it is the one to give way.
        let per_stream = if connection == 0 { 100 } else { 99 };
        for stream in 0..2 {
            let mut quota = Quota::on(channel.clone()).await;
            report_idle(&quota, &format!("hog-{connection}-{stream}"), per_stream).await;
            quota.next().await.expect("the hog's buckets are answered");
            hog.push(quota);
        }
    }
    // 1,982 held; fill to the bound with one more stream on a fresh connection.
    let mut filler = Quota::open(server.grpc).await;
    report_idle(&filler, "filler", 18).await;
    filler.next().await.expect("answered");
    // A second Envoy's bucket is assigned.
    let mut newcomer = Quota::open(server.grpc).await;
    let kind = newcomer
        .report("web", &[("shared", "newcomer")], 1, 0)
        .await;
    assert!(matches!(kind, Kind::Tokens { .. }), "{kind:?}");
    // The largest holder gave a bucket back at once (its streams are woken for it): an
    // abandon on one of its streams, and the process holds its bound again.
    let mut abandoned = false;
    for quota in &mut hog[..2] {
        while let Ok(Ok(answer)) = tokio::time::timeout(Duration::from_secs(3), quota.next()).await
        {
            abandoned |= answer
                .bucket_action
                .iter()
                .any(|action| rlqs::kind(action) == Kind::Abandon);
            if abandoned {
                break;
            }
        }
    }
    assert!(abandoned, "the largest holder gave nothing back");
    let text = common::scrape(server.http).await;
    assert_eq!(
        common::sample(&text, "floodgate_rlqs_buckets"),
        Some(2000.0)
    );
    server.stop().await;
}

/// A 1,000-bucket report that spends its buckets cost a refill read per bucket, a second
/// round trip each (9,129 Redis commands against 2,033 when nothing was spent). Each
/// booking now peeks in the same call: a spent report takes as many script calls as an
/// unspent one.
#[tokio::test]
async fn a_report_that_spends_its_buckets_costs_no_more_round_trips() {
    let redis = common::redis::RedisServer::start();
    let url = redis.url();
    let rules = "domain: web\ndescriptors:\n  - key: route\n    rate_limit: {unit: hour, requests_per_unit: 10}\n";
    let server = TestServer::start_with(&[("web.yaml", rules)], move |settings| {
        settings.backend = floodgate::backend::BackendSettings::Redis {
            url,
            options: common::redis_options(Duration::from_secs(2)),
        };
        settings.limiter.backend_timeout = Duration::from_secs(2);
    })
    .await;
    let calls = || redis.calls_of("evalsha") + redis.calls_of("fcall") + redis.calls_of("eval");
    let mut round_trips = Vec::new();
    // Kept open to the end: a stream that ends withdraws its counts, calls that would fall
    // into the next measurement.
    let mut open = Vec::new();
    for (name, allowed) in [("unspent", 0), ("spent", 10)] {
        let mut quota = Quota::open(server.grpc).await;
        let values: Vec<String> = (0..200).map(|i| format!("{name}-{i}")).collect();
        let ids: Vec<[(&str, &str); 1]> = values.iter().map(|v| [("route", v.as_str())]).collect();
        let reported: Vec<rlqs::Reported<'_>> =
            ids.iter().map(|id| (&id[..], allowed, 0)).collect();
        let before = calls();
        quota.send(rlqs::usages("web", &reported)).await;
        let mut answered = std::collections::HashSet::new();
        while answered.len() < ids.len() {
            for action in quota.next().await.expect("answered").bucket_action {
                answered.insert(format!("{:?}", action.bucket_id));
            }
        }
        round_trips.push(calls() - before);
        open.push(quota);
    }
    let [unspent, spent] = round_trips[..] else {
        unreachable!()
    };
    assert!(
        spent <= unspent + 2,
        "spent {spent} script calls, unspent {unspent}"
    );
    server.stop().await;
}
