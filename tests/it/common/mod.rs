//! Shared fixtures: a floodgate server on 127.0.0.1 port 0 over a temporary config directory,
//! and an Envoy-side client built from the independent `envoy-types` protos; real
//! `redis-server` nodes and clusters in `redis`; the algorithm test vectors in `vectors`.

pub mod pki;
pub mod redis;
pub mod vectors;

use std::path::Path;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use floodgate::backend::BackendSettings;
use floodgate::clock::{Clock, SystemClock};
use floodgate::headers::HeaderMode;
use floodgate::limiter::LimiterOptions;
use floodgate::server::{Server, Settings};
use tempfile::TempDir;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

/// What `grpc` holds for a server on a unix socket, which has no TCP address.
pub const NO_TCP_ADDR: std::net::SocketAddr =
    std::net::SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 0);

/// A running in-process server and what it needs to be reached and stopped.
pub struct TestServer {
    /// The gRPC TCP address; `0.0.0.0:0` on a unix socket (see `grpc_endpoint`).
    pub grpc: std::net::SocketAddr,
    /// The gRPC address as logged: `host:port`, or `unix:PATH`.
    pub grpc_endpoint: String,
    pub http: std::net::SocketAddr,
    pub config_dir: TempDir,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), floodgate::server::ServerError>>>,
}

/// For tests that count in hour-long fixed windows: returns once the current hour has more
/// than a few seconds left, so no test straddles two windows (waits at most 10 s).
pub async fn away_from_an_hour_boundary() {
    let now_ms = SystemClock.now_ms();
    let left = 3600 - now_ms.div_euclid(1000).rem_euclid(3600) as u64;
    if left <= 10 {
        tokio::time::sleep(Duration::from_secs(left + 1)).await;
    }
}

/// Waits for the start of the next second of the wall clock, plus a little: a test that
/// counts a per-second window must not have it roll over between its calls.
pub async fn start_of_the_next_second() {
    let into = SystemClock.now_ms().rem_euclid(1000) as u64;
    tokio::time::sleep(Duration::from_millis(1000 - into + 30)).await;
}

/// Runs `check` every 50 ms until it holds, for at most `limit`, and says whether it did:
/// for what settles in the background (a reload, a reconnection, a flush, an exit). The
/// caller asserts on the answer, or on what `check` recorded on its last run. Runs on Tokio's
/// clock, so not under a paused one.
pub async fn eventually(limit: Duration, mut check: impl AsyncFnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `/metrics` text of the admin server at `http`.
pub async fn scrape(http: std::net::SocketAddr) -> String {
    let (status, text) = self::http("GET", &format!("http://{http}/metrics"), "").await;
    assert_eq!(status, 200);
    text
}

/// The value of the sample whose name and labels are exactly `series` in a `/metrics` text,
/// read as Prometheus reads it (a float).
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter_map(|line| line.strip_prefix(series))
        .find_map(|rest| rest.strip_prefix(' '))
        .map(|value| value.trim().parse().expect("sample value"))
}

/// The first line of the admin server's `/metrics` that starts with `prefix`, or "".
pub async fn metric_line(http: std::net::SocketAddr, prefix: &str) -> String {
    let text = scrape(http).await;
    text.lines()
        .find(|line| line.starts_with(prefix))
        .unwrap_or_default()
        .to_owned()
}

/// The `requests_per_unit` of the limit `domain` applies to the descriptor `(key, value)`,
/// or None without one; the call counts as a hit.
pub async fn current_limit(server: &TestServer, domain: &str, entry: (&str, &str)) -> Option<u32> {
    let mut client = server.client().await;
    let call = request(domain, vec![descriptor(&[entry])]);
    should_rate_limit(&mut client, call).await.statuses[0]
        .current_limit
        .as_ref()
        .map(|limit| limit.requests_per_unit)
}

/// Polls (bounded) until [`current_limit`] is `expected`: rules are swapped in the background.
pub async fn wait_for_limit(
    server: &TestServer,
    domain: &str,
    entry: (&str, &str),
    expected: Option<u32>,
) {
    let mut seen = None;
    let reached = eventually(Duration::from_secs(10), async || {
        seen = current_limit(server, domain, entry).await;
        seen == expected
    })
    .await;
    assert!(
        reached,
        "domain {domain}: expected limit {expected:?}, still {seen:?}"
    );
}

/// Redis backend options with a per-call bound of `timeout`.
pub fn redis_options(timeout: Duration) -> floodgate::backend::redis::RedisOptions {
    floodgate::backend::redis::RedisOptions {
        timeout,
        ..Default::default()
    }
}

/// Settings for a memory-backed server on ephemeral loopback ports.
pub fn settings(config_dir: &Path) -> Settings {
    Settings {
        config_dir: config_dir.to_path_buf(),
        candidate_dir: None,
        grpc_addr: "127.0.0.1:0".into(),
        http_addr: "127.0.0.1:0".into(),
        backend: BackendSettings::Memory {
            max_buckets: 100_000,
        },
        limiter: LimiterOptions::default(),
        on_over_limit: None,
        header_mode: HeaderMode::Off,
        drain_timeout: Duration::from_secs(5),
        shutdown_grace: Duration::ZERO,
        max_metric_series: floodgate::metrics::DEFAULT_MAX_METRIC_SERIES,
        grpc_tls: None,
        grpc_limits: Default::default(),
        overload_target: Some(floodgate::overload::DEFAULT_TARGET_LATENCY),
        admin_json: true,
        xds: None,
        startup: Default::default(),
        response_dynamic_metadata: false,
        tracing: None,
        statsd: None,
        rlqs: Default::default(),
        regions: None,
    }
}

/// Writes `files` (name, YAML) into a fresh directory.
pub fn config_dir(files: &[(&str, &str)]) -> TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, yaml) in files {
        std::fs::write(dir.path().join(name), yaml).expect("write config");
    }
    dir
}

impl TestServer {
    /// Starts a memory-backed server over `files`, with `adjust` applied to its settings.
    pub async fn start_with(
        files: &[(&str, &str)],
        adjust: impl FnOnce(&mut Settings),
    ) -> TestServer {
        let config_dir = config_dir(files);
        let mut settings = settings(config_dir.path());
        adjust(&mut settings);
        let server = Server::bind(settings).await.expect("server binds");
        let grpc_endpoint = server.grpc_endpoint();
        let grpc = server.grpc_addr().unwrap_or(NO_TCP_ADDR);
        let http = server.http_addr();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server.serve(async {
            let _ = stopped.await;
        }));
        TestServer {
            grpc,
            grpc_endpoint,
            http,
            config_dir,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Starts a memory-backed server over `files` with default settings.
    pub async fn start(files: &[(&str, &str)]) -> TestServer {
        TestServer::start_with(files, |_| {}).await
    }

    /// An Envoy-side RLS client.
    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.grpc))
            .await
            .expect("client connects")
    }

    /// A gRPC channel (for the health client).
    pub async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.grpc))
            .expect("uri")
            .connect()
            .await
            .expect("channel connects")
    }

    /// The admin base URL.
    pub fn http_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http)
    }

    /// Stops the server and waits for it to finish draining.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await
                .expect("server task")
                .expect("server exits cleanly");
        }
    }
}

/// One raw HTTP/2 frame: a 9-byte header (length, type, flags, stream) and `payload`.
pub fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len())
        .expect("frame fits")
        .to_be_bytes();
    let mut out = vec![len[1], len[2], len[3], kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A descriptor from (key, value) pairs.
pub fn descriptor(pairs: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: pairs
            .iter()
            .map(|(key, value)| Entry {
                key: key.to_string(),
                value: value.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

/// A request for `domain` with `descriptors`.
pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    }
}

/// Sends one request and returns the response, panicking on a gRPC error.
pub async fn should_rate_limit(
    client: &mut RateLimitServiceClient<Channel>,
    request: RateLimitRequest,
) -> RateLimitResponse {
    client
        .should_rate_limit(request)
        .await
        .expect("ShouldRateLimit succeeds")
        .into_inner()
}

/// Sends an admin HTTP request and returns (status, body).
pub async fn http(method: &str, url: &str, body: &str) -> (u16, String) {
    let client = reqwest::Client::new();
    let request = match method {
        "POST" => client
            .post(url)
            .header("content-type", "application/json")
            .body(body.to_owned()),
        _ => client.get(url),
    };
    let response = request.send().await.expect("admin request");
    let status = response.status().as_u16();
    (status, response.text().await.expect("admin body"))
}

/// Resident memory of process `pid`, in KiB (`VmRSS` of `/proc/<pid>/status`).
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS line")
}

/// `floodgate serve` on ports the kernel picks on 127.0.0.1, for runs that must stop before
/// they listen or that never need the address.
pub fn serve_command() -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_floodgate"));
    command.args([
        "serve",
        "--grpc-addr",
        "127.0.0.1:0",
        "--http-addr",
        "127.0.0.1:0",
    ]);
    command
}

/// A `floodgate serve` process started from the built binary, with its bound addresses read
/// from its log, as an operator (or a black-box test) would.
pub struct Binary {
    pub child: std::process::Child,
    /// The gRPC TCP address; `0.0.0.0:0` on a unix socket (see `grpc_endpoint`).
    pub grpc: std::net::SocketAddr,
    /// The gRPC address as logged: `host:port`, or `unix:PATH`.
    pub grpc_endpoint: String,
    pub http: std::net::SocketAddr,
    pub log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Binary {
    /// Starts `floodgate serve` with `args` on ephemeral loopback ports and waits (bounded)
    /// for the line that announces the bound addresses.
    pub fn start(args: &[&str], envs: &[(&str, &str)]) -> Binary {
        let mut command = serve_command();
        command.args(args).envs(envs.iter().copied());
        Binary::spawn(command)
    }

    /// Starts `floodgate serve` with no flags and nothing but `envs` in its environment (no
    /// inherited `FLOODGATE_*`, `RUST_LOG` or reference variables), as a Deployment that
    /// only sets variables would, and waits for the address line as [`Binary::start`] does.
    pub fn start_with_env_only(envs: &[(&str, &str)]) -> Binary {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_floodgate"));
        command.arg("serve").env_clear().envs(envs.iter().copied());
        Binary::spawn(command)
    }

    fn spawn(mut command: std::process::Command) -> Binary {
        use std::io::BufRead;
        use std::process::Stdio;
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn floodgate");
        let stdout = child.stdout.take().expect("stdout");
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = std::sync::Arc::clone(&log);
        let reader = std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if line.contains("grpc_addr=") {
                    let _ = tx.send(line.clone());
                }
                sink.lock().unwrap().push(line);
            }
        });
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("no address line; log: {:?}", log.lock().unwrap()));
        let field = |name: &str| -> String {
            let start = line.find(name).expect("field") + name.len();
            let rest = &line[start..];
            let end = rest.find([' ', '"']).unwrap_or(rest.len());
            rest[..end].to_owned()
        };
        let grpc_endpoint = field("grpc_addr=");
        let grpc = match grpc_endpoint.strip_prefix("unix:") {
            Some(_) => NO_TCP_ADDR,
            None => grpc_endpoint.parse().expect("socket address"),
        };
        Binary {
            grpc,
            grpc_endpoint,
            http: field("http_addr=").parse().expect("socket address"),
            child,
            log,
            reader: Some(reader),
        }
    }

    /// Sends a signal (`TERM`, `INT`, `HUP`) to the process.
    pub fn signal(&self, name: &str) {
        let status = std::process::Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
    }

    /// Waits (bounded) for the process to exit and returns its exit code. Async, so the
    /// test's own connections keep running and can answer the server's GOAWAY.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<i32> {
        let mut status = None;
        let child = &mut self.child;
        let exited = eventually(limit, async || {
            status = child.try_wait().expect("try_wait");
            status.is_some()
        })
        .await;
        if !exited {
            let _ = self.child.kill();
            panic!("floodgate did not exit within {limit:?}");
        }
        // The log ends when the process does: wait for its last lines.
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        status.and_then(|status| status.code())
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A gRPC channel over the unix socket at `path`, through a connector that counts the
/// connections it opens in `connects`.
pub async fn unix_channel(
    path: &Path,
    connects: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> Result<Channel, tonic::transport::Error> {
    let endpoint = tonic::transport::Endpoint::from_static("http://floodgate.sock");
    unix_endpoint(endpoint, path, connects).await
}

/// Connects `endpoint` over the unix socket at `path` (its URI's host is only the TLS name),
/// counting the connections it opens in `connects`.
pub async fn unix_endpoint(
    endpoint: tonic::transport::Endpoint,
    path: &Path,
    connects: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> Result<Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    let connector = tower::service_fn(move |_: tonic::transport::Uri| {
        connects.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let path = path.clone();
        async move {
            let stream = tokio::net::UnixStream::connect(path).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
        }
    });
    endpoint
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect_with_connector(connector)
        .await
}

/// Opens `url` (the admin page) in headless Chromium with `tests/clients/page_check.js` and
/// its `checks` (see the script), waiting up to 30 s; returns what the page showed and the
/// screenshot, kept as `target/artifacts/<screenshot>`. Fails the test when the page does not
/// show it, or when Chromium or playwright-core is missing (`make clients`, `apt-get install
/// chromium`).
pub async fn check_page(
    url: &str,
    screenshot: &str,
    checks: &[&str],
) -> (serde_json::Value, std::path::PathBuf) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = root.join("tests/clients/page_check.js");
    let playwright = root.join("tests/clients/node_modules/playwright-core");
    assert!(
        playwright.exists(),
        "playwright-core is not installed: run `make clients`"
    );
    let chromium = std::env::var_os("CHROMIUM").unwrap_or_else(|| "/usr/bin/chromium".into());
    assert!(
        Path::new(&chromium).exists(),
        "Chromium is not installed ({}): apt-get install chromium",
        chromium.to_string_lossy()
    );
    let artifacts = root.join("target/artifacts");
    std::fs::create_dir_all(&artifacts).expect("artifacts directory");
    let screenshot = artifacts.join(screenshot);
    let mut command = std::process::Command::new("node");
    command
        .arg(&script)
        .args(["--url", url, "--screenshot"])
        .arg(&screenshot)
        .args(checks)
        .args(["--timeout-ms", "30000"]);
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("joined")
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "page check failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let seen = serde_json::from_str(stdout.trim().lines().last().unwrap_or_default())
        .expect("the page check prints JSON");
    (seen, screenshot)
}
