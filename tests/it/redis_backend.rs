//! `RedisBackend` and `ClusterBackend` against real servers: behaviour through the `Backend`
//! trait, exactness under concurrency from several instances, outage and recovery, cluster
//! failover, connection settings (password, database, TLS) and error hygiene.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::redis::{RedisCluster, RedisServer, wait_until};
use floodgate::backend::{
    Backend, BackendError, BucketKey, Charge, ClusterBackend, Group, Item, RedisBackend,
    RedisOptions, Refund, Weight,
};
use floodgate::rules::{Algorithm, Policy, Unit};
use tokio::time::Instant;

fn options() -> RedisOptions {
    RedisOptions {
        timeout: Duration::from_millis(500),
        ..RedisOptions::default()
    }
}

fn policy(algorithm: Algorithm, limit: u32, unit: Unit) -> Policy {
    Policy {
        algorithm,
        ..Policy::fixed_window(limit, unit)
    }
}

fn charge(policy: Policy, value: &str, cost: u64) -> Charge {
    Charge {
        bucket: BucketKey::new("api", "user", [("user", value)], &policy),
        policy,
        cost,
        spread_ms: 0,
    }
}

async fn cluster() -> RedisCluster {
    RedisCluster::start_async().await
}

/// What every backend must do, whatever its topology.
async fn behaves(backend: &dyn Backend) {
    assert!(backend.charge(&[]).await.unwrap().is_empty());
    backend.refund(&[]).await.unwrap();
    backend.ping().await.unwrap();

    // One request, three rules: outcomes come back in order.
    let fixed = policy(Algorithm::FixedWindow, 3, Unit::Hour);
    let token = policy(Algorithm::TokenBucket, 5, Unit::Hour);
    let log = policy(Algorithm::SlidingLog, 1, Unit::Hour);
    let request = [
        charge(fixed, "behaves", 2),
        charge(token, "behaves", 1),
        charge(log, "behaves", 1),
    ];
    let first = backend.charge(&request).await.unwrap();
    let remaining: Vec<u64> = first.iter().map(|o| o.remaining).collect();
    assert_eq!(remaining, [1, 4, 0]);
    assert!(first.iter().all(|o| o.allowed && o.booked));

    // The same request again is over limit overall (the log is full): refund what it
    // booked, as the limiter does, and the buckets are where they were.
    let second = backend.charge(&request).await.unwrap();
    assert_eq!(
        second.iter().map(|o| o.allowed).collect::<Vec<_>>(),
        [false, true, false]
    );
    let refunds: Vec<Refund> = request
        .iter()
        .zip(&second)
        .filter(|(_, o)| o.booked)
        .map(|(c, o)| Refund::new(c.bucket, c.policy, c.cost, o.now_ms))
        .collect();
    assert_eq!(refunds.len(), 1);
    backend.refund(&refunds).await.unwrap();
    let peeks: Vec<Charge> = request.iter().map(|c| Charge { cost: 0, ..*c }).collect();
    let after = backend.charge(&peeks).await.unwrap();
    let remaining: Vec<u64> = after.iter().map(|o| o.remaining).collect();
    assert_eq!(remaining, [1, 4, 0]);
    assert!(after.iter().all(|o| !o.booked));

    // Distinct values are distinct buckets.
    let other = backend.charge(&[charge(fixed, "other", 1)]).await.unwrap();
    assert_eq!(other[0].remaining, 2);
}

#[tokio::test]
async fn redis_backend_behaves() {
    let server = RedisServer::start();
    let backend = RedisBackend::connect(&server.url(), options())
        .await
        .unwrap();
    assert_eq!(backend.name(), "redis");
    behaves(&backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_backend_behaves() {
    let cluster = cluster().await;
    let backend = ClusterBackend::connect(&cluster.urls(), options())
        .await
        .unwrap();
    assert_eq!(backend.name(), "redis-cluster");
    behaves(&backend).await;
}

const TASKS: u64 = 48;
const REQUESTS: u64 = 1_500;
const LIMIT: u32 = 500;

/// 48 tasks send 1500 requests for one bucket (limit 500 per hour) through three backend
/// instances with their own connections; exactly 500 must be admitted.
///
/// Real time may cross an hour boundary during a run (which legitimately admits more);
/// such a run is repeated on a fresh bucket. The token bucket leaks one request's worth per
/// 7.2 s, so the bound allows what leaked during the run.
async fn exactly_the_limit_is_admitted(backends: &[Arc<dyn Backend>], algorithm: Algorithm) {
    let hour = 3_600_000;
    for round in 0..3 {
        let policy = policy(algorithm, LIMIT, Unit::Hour);
        let bucket = charge(policy, &format!("exact-{round}"), 1);
        let admitted = Arc::new(AtomicU64::new(0));
        let first = Arc::new(AtomicU64::new(u64::MAX));
        let last = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for task in 0..TASKS {
            let backend = backends[task as usize % backends.len()].clone();
            let bucket = bucket.clone();
            let (admitted, first, last) = (admitted.clone(), first.clone(), last.clone());
            // 1500 = 48 * 31 + 12: the first 12 tasks send one more.
            let count = REQUESTS / TASKS + u64::from(task < REQUESTS % TASKS);
            tasks.push(tokio::spawn(async move {
                for _ in 0..count {
                    let outcome = backend.charge(std::slice::from_ref(&bucket)).await;
                    let outcome = outcome.expect("no errors under load")[0];
                    admitted.fetch_add(u64::from(outcome.allowed), Ordering::Relaxed);
                    first.fetch_min(outcome.now_ms as u64, Ordering::Relaxed);
                    last.fetch_max(outcome.now_ms as u64, Ordering::Relaxed);
                }
            }));
        }
        let started = Instant::now();
        for task in tasks {
            tokio::time::timeout(Duration::from_secs(60), task)
                .await
                .expect("load finishes within a minute")
                .unwrap();
        }
        let (first, last) = (first.load(Ordering::Relaxed), last.load(Ordering::Relaxed));
        if algorithm != Algorithm::TokenBucket && first / hour != last / hour {
            continue;
        }
        let admitted = admitted.load(Ordering::Relaxed);
        let leaked = if algorithm == Algorithm::TokenBucket {
            (last - first) / 7_200
        } else {
            0
        };
        assert!(
            admitted >= u64::from(LIMIT) && admitted <= u64::from(LIMIT) + leaked,
            "{algorithm}: {admitted} admitted in {:?}",
            started.elapsed()
        );
        return;
    }
    panic!("every round crossed an hour boundary");
}

async fn every_algorithm_admits_exactly_the_limit(backends: &[Arc<dyn Backend>]) {
    for algorithm in Algorithm::ALL {
        exactly_the_limit_is_admitted(backends, algorithm).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_admits_exactly_the_limit_under_concurrency() {
    let server = RedisServer::start();
    let mut backends: Vec<Arc<dyn Backend>> = Vec::new();
    for _ in 0..3 {
        backends.push(Arc::new(
            RedisBackend::connect(&server.url(), options())
                .await
                .unwrap(),
        ));
    }
    every_algorithm_admits_exactly_the_limit(&backends).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_admits_exactly_the_limit_under_concurrency() {
    let cluster = cluster().await;
    let mut backends: Vec<Arc<dyn Backend>> = Vec::new();
    for _ in 0..3 {
        backends.push(Arc::new(
            ClusterBackend::connect(&cluster.urls(), options())
                .await
                .unwrap(),
        ));
    }
    every_algorithm_admits_exactly_the_limit(&backends).await;
}

fn is_transient(err: &BackendError) -> bool {
    matches!(
        err,
        BackendError::Timeout | BackendError::Unavailable(_) | BackendError::Failed { .. }
    )
}

/// Retries `charge` until it succeeds or `limit` passes; the backend is never recreated.
async fn until_charge_succeeds(backend: &dyn Backend, request: &[Charge], limit: Duration) {
    let mut last_error = String::new();
    let charged = common::eventually(limit, async || match backend.charge(request).await {
        Ok(_) => true,
        Err(e) => {
            assert!(is_transient(&e));
            last_error = e.to_string();
            false
        }
    })
    .await;
    assert!(charged, "still failing after {limit:?}: {last_error}");
}

#[tokio::test]
async fn redis_outage_fails_fast_and_recovers_on_restart() {
    let mut server = RedisServer::start();
    let backend = RedisBackend::connect(
        &server.url(),
        RedisOptions {
            timeout: Duration::from_millis(200),
            ..RedisOptions::default()
        },
    )
    .await
    .unwrap();
    let request = [charge(
        policy(Algorithm::FixedWindow, 10, Unit::Minute),
        "outage",
        1,
    )];
    backend.charge(&request).await.unwrap();

    server.stop();
    for _ in 0..5 {
        let start = Instant::now();
        let err = backend.charge(&request).await.unwrap_err();
        assert!(
            matches!(err, BackendError::Unavailable(_) | BackendError::Timeout),
            "{err:?}"
        );
        assert!(start.elapsed() < Duration::from_secs(5), "bounded error");
        assert!(backend.ping().await.is_err());
    }

    server.restart();
    until_charge_succeeds(&backend, &request, Duration::from_secs(10)).await;
    // Once recovered, every call succeeds: no dead connection is left in the pool.
    for _ in 0..20 {
        backend.charge(&request).await.unwrap();
    }
    backend.ping().await.unwrap();
}

/// A backend on `cluster` with a 300 ms timeout, and a request on bucket `value` (1,000 an
/// hour) it has charged once, so that the bucket's master is known to be up.
async fn failover_backend(cluster: &RedisCluster, value: &str) -> (ClusterBackend, [Charge; 1]) {
    let backend = ClusterBackend::connect(
        &cluster.urls(),
        RedisOptions {
            timeout: Duration::from_millis(300),
            ..RedisOptions::default()
        },
    )
    .await
    .unwrap();
    let request = [charge(
        policy(Algorithm::FixedWindow, 1_000, Unit::Hour),
        value,
        1,
    )];
    backend.charge(&request).await.unwrap();
    (backend, request)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_recovers_after_a_master_fails_over() {
    let mut cluster = cluster().await;
    let (backend, request) = failover_backend(&cluster, "failover").await;
    let key = request[0].bucket.redis_key("fg");
    let victim = cluster.master_index_for(&key);
    let victim_port = cluster.nodes()[victim].port();
    cluster.node_mut(victim).stop();

    // Until the replica takes over (the node timeout alone is 2 s) calls fail, boundedly.
    let start = Instant::now();
    let during = backend.charge(&request).await.unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(is_transient(&during), "{during:?}");

    // The node timeout is 2 s; promotion and the client's slot refresh follow.
    until_charge_succeeds(&backend, &request, Duration::from_secs(30)).await;
    let new_owner = tokio::task::block_in_place(|| cluster.master_index_for(&key));
    assert_ne!(cluster.nodes()[new_owner].port(), victim_port);
    for _ in 0..20 {
        backend.charge(&request).await.unwrap();
    }
}

/// Issue 33: a master that hangs (SIGSTOP) and never comes back. Its replica takes over after
/// the node timeout (2 s); the slots it took must then be served, though the frozen node
/// keeps its sockets open and never answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_masters_slots_are_served_after_its_replica_takes_over() {
    let cluster = cluster().await;
    let (backend, request) = failover_backend(&cluster, "hung").await;
    let key = request[0].bucket.redis_key("fg");
    let victim = tokio::task::block_in_place(|| cluster.master_index_for(&key));
    let masters_before = cluster.masters().len();
    cluster.nodes()[victim].signal("STOP");
    let frozen = Instant::now();
    // When the replica is promoted: the other nodes then count as many masters as before.
    let others: Vec<&common::redis::RedisServer> = (0..cluster.nodes().len())
        .filter(|&i| i != victim)
        .map(|i| &cluster.nodes()[i])
        .collect();
    let promoted = std::thread::scope(|scope| {
        let watch = scope.spawn(|| {
            let until = Instant::now() + Duration::from_secs(30);
            while Instant::now() < until {
                let masters = others
                    .iter()
                    .filter(|n| n.info_field("replication", "role").as_deref() == Some("master"))
                    .count();
                if masters == masters_before {
                    return Some(frozen.elapsed());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            None
        });
        let served_after = tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(until_charge_succeeds(
                &backend,
                &request,
                Duration::from_secs(30),
            ));
            frozen.elapsed()
        });
        (watch.join().unwrap(), served_after)
    });
    let (promoted, served_after) = (promoted.0.expect("the replica is promoted"), promoted.1);
    eprintln!(
        "hung master: replica promoted {promoted:?} after the freeze, slots served again \
         {served_after:?} after it ({:?} after the promotion)",
        served_after.saturating_sub(promoted)
    );
    for _ in 0..20 {
        backend.charge(&request).await.unwrap();
    }
    // The frozen node is killed with the cluster; it is never resumed.
}

#[tokio::test]
async fn unreachable_nodes_give_a_bounded_error() {
    // Bind and drop to find a port with nothing listening.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let start = Instant::now();
    let err = RedisBackend::connect(&url, options()).await.unwrap_err();
    assert!(
        matches!(err, BackendError::Unavailable(_) | BackendError::Timeout),
        "{err:?}"
    );
    let err = ClusterBackend::connect(&[url], options())
        .await
        .unwrap_err();
    assert!(
        matches!(err, BackendError::Unavailable(_) | BackendError::Timeout),
        "{err:?}"
    );
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn credentials_and_database_come_from_the_url_and_never_leak() {
    let server = RedisServer::start_with(&["--requirepass", "s3cret-pw"]);
    let port = server.port();

    let wrong = format!("redis://:wrong-pw@127.0.0.1:{port}");
    let err = RedisBackend::connect(&wrong, options()).await.unwrap_err();
    assert!(matches!(err, BackendError::Failed { .. }), "{err:?}");
    let text = format!("{err} {err:?}");
    assert!(!text.contains("wrong-pw"), "{text}");

    // User and password (the default ACL user), database 3.
    let url = format!("redis://default:s3cret-pw@127.0.0.1:{port}/3");
    let backend = RedisBackend::connect(&url, options()).await.unwrap();
    assert!(!format!("{backend:?}").contains("s3cret-pw"));
    backend
        .charge(&[charge(
            policy(Algorithm::FixedWindow, 1, Unit::Minute),
            "db",
            1,
        )])
        .await
        .unwrap();
    let count =
        |db: &str| server.cli(&["-a", "s3cret-pw", "--no-auth-warning", "-n", db, "DBSIZE"]);
    assert_eq!(count("3"), "1");
    assert_eq!(count("0"), "0");

    // A prefix with a brace would become every key's hash tag.
    let bad = RedisOptions {
        key_prefix: "fg{x}".into(),
        ..options()
    };
    assert!(RedisBackend::connect(&url, bad).await.is_err());
}

#[tokio::test]
async fn key_prefix_is_applied() {
    let server = RedisServer::start();
    let backend = RedisBackend::connect(
        &server.url(),
        RedisOptions {
            key_prefix: "tenant-a".into(),
            ..options()
        },
    )
    .await
    .unwrap();
    let c = charge(policy(Algorithm::TokenBucket, 5, Unit::Second), "p", 1);
    backend.charge(std::slice::from_ref(&c)).await.unwrap();
    assert_eq!(server.cli(&["KEYS", "*"]), c.bucket.redis_key("tenant-a"));
}

/// `rediss://` speaks TLS and verifies the server's certificate: against the web PKI roots
/// by default (a private CA is refused), against `tls_ca_pem` when given.
#[tokio::test]
async fn rediss_urls_use_tls_and_verify_certificates() {
    let fixture = |name: &str| {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tls");
        dir.join(name).to_string_lossy().into_owned()
    };
    let tls_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let server = RedisServer::start_with(&[
        "--tls-port",
        &tls_port.to_string(),
        "--tls-cert-file",
        &fixture("server.pem"),
        "--tls-key-file",
        &fixture("server-key.pem"),
        "--tls-ca-cert-file",
        &fixture("ca.pem"),
        "--tls-auth-clients",
        "no",
    ]);
    wait_until("TLS port", Duration::from_secs(5), || {
        std::net::TcpStream::connect(("127.0.0.1", tls_port)).is_ok()
    });
    let url = format!("rediss://127.0.0.1:{tls_port}");

    let err = RedisBackend::connect(&url, options()).await.unwrap_err();
    let text = err.to_string().to_lowercase();
    assert!(
        text.contains("certificate") || text.contains("issuer"),
        "{err:?}"
    );

    let trusted = RedisOptions {
        tls_ca_pem: Some(std::fs::read(fixture("ca.pem")).unwrap()),
        ..options()
    };
    let backend = RedisBackend::connect(&url, trusted).await.unwrap();
    let c = charge(policy(Algorithm::SlidingWindow, 2, Unit::Minute), "tls", 1);
    let outcome = backend.charge(std::slice::from_ref(&c)).await.unwrap();
    assert_eq!(outcome[0].remaining, 1);
    // It went over TLS: the plain port saw the same bucket.
    assert_eq!(server.cli(&["KEYS", "*"]), c.bucket.redis_key("fg"));
}

/// A backend that `connect` returned has every pooled socket open and its code loaded: the
/// first calls after SERVING wait for no connect and no reload (issue 17, no cold start).
#[tokio::test(flavor = "current_thread")]
async fn connect_returns_with_every_connection_open_and_the_code_loaded() {
    let server = RedisServer::start();
    let clients = || -> u64 {
        let clients = server.info_field("clients", "connected_clients").unwrap();
        clients.parse().unwrap()
    };
    let pool_size = 8;
    let backend = RedisBackend::connect(
        &server.url(),
        RedisOptions {
            pool_size,
            ..options()
        },
    )
    .await
    .unwrap();
    // A current-thread runtime: nothing the pool spawned ran after connect returned.
    assert_eq!(
        clients(),
        u64::from(pool_size) + 1,
        "every socket (and INFO's) is open"
    );
    assert_eq!(server.calls_of("function|load"), 1, "the library is loaded");
    drop(backend);
}

/// Writes `entries` bookings of one unit, a ms apart and ending now (the server's clock),
/// into the sliding log `key`, as lua/sliding_log.lua stores them ("<ts>:<count>" scored
/// ts, and the total scored minus the sum): the worst case for a denial's wait, which reads
/// member by member.
fn fill_log(server: &RedisServer, key: &str, entries: u64) {
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut conn).unwrap();
    let now_ms = secs * 1000 + micros / 1000;
    let first = now_ms - entries;
    for chunk in (first..now_ms).collect::<Vec<_>>().chunks(1000) {
        let mut zadd = redis::cmd("ZADD");
        zadd.arg(key);
        for ts in chunk {
            zadd.arg(ts).arg(format!("{ts}:1"));
        }
        let _: u64 = zadd.query(&mut conn).unwrap();
    }
    let total = -i64::try_from(entries).unwrap();
    let _: u64 = redis::cmd("ZADD")
        .arg(key)
        .arg(total)
        .arg("total")
        .query(&mut conn)
        .unwrap();
}

/// The longest script call the node logged, in µs (`SLOWLOG`, with every command logged).
fn longest_call_us(server: &RedisServer) -> u64 {
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    // id, unix time, duration in µs, arguments (a batch's words are binary), client address,
    // client name.
    type Entry = (u64, u64, u64, Vec<Vec<u8>>, String, String);
    let log: Vec<Entry> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(-1)
        .query(&mut conn)
        .unwrap();
    log.iter()
        .filter(|(_, _, _, args, _, _)| {
            let command = args.first().map(|a| a.to_ascii_uppercase());
            matches!(command.as_deref(), Some(b"FCALL" | b"EVALSHA" | b"EVAL"))
        })
        .map(|(_, _, micros, _, _, _)| *micros)
        .max()
        .unwrap_or(0)
}

/// Issue 20 item 3: requests of 64 sliding-log charges of cost 10,000 against a full
/// 10,000-entry log (limit 10,000 per hour), sent straight to the backend (the limiter
/// refuses such a request before it reaches Redis: tests/redis_service.rs), beside 200
/// innocent requests, all on a 100 ms budget. Before, each denial's wait walked the log from
/// its oldest end, 10,000 entries by pages: one such request kept Redis busy for hundreds of
/// ms, and the innocent callers queued behind it timed out. The wait now reads from the
/// nearer end, here one entry per charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_log_walks_do_not_stall_the_callers_beside_them() {
    let server = RedisServer::start_with(&[
        "--slowlog-log-slower-than",
        "0",
        "--slowlog-max-len",
        "10000",
    ]);
    let backend = Arc::new(
        RedisBackend::connect(
            &server.url(),
            RedisOptions {
                timeout: Duration::from_millis(100),
                ..RedisOptions::default()
            },
        )
        .await
        .unwrap(),
    );
    let log = policy(Algorithm::SlidingLog, 10_000, Unit::Hour);
    let full = charge(log, "full", 10_000);
    fill_log(&server, &full.bucket.redis_key("fg"), 10_000);
    let heavy = Group {
        items: (0..64)
            .map(|_| Item {
                charge: full.clone(),
                weight: Weight::default(),
                lease: None,
            })
            .collect(),
        ..Group::default()
    };
    let innocent = policy(Algorithm::FixedWindow, 1_000, Unit::Hour);
    let mut heavies = Vec::new();
    let mut innocents = Vec::new();
    for round in 0..5 {
        let (heavy_backend, heavy) = (Arc::clone(&backend), heavy.clone());
        heavies.push(tokio::spawn(
            async move { heavy_backend.decide(&heavy).await },
        ));
        for i in 0..40 {
            let backend = Arc::clone(&backend);
            let one = charge(innocent, &format!("innocent{round}-{i}"), 1);
            innocents.push(tokio::spawn(async move { backend.charge(&[one]).await }));
        }
    }
    let mut failed = 0;
    for task in innocents {
        match task.await.unwrap() {
            Ok(outcome) => assert!(outcome[0].allowed),
            Err(_) => failed += 1,
        }
    }
    eprintln!("longest script call: {} us", longest_call_us(&server));
    assert_eq!(failed, 0, "innocent requests failed");
    for task in heavies {
        let outcomes = task.await.unwrap().expect("the heavy request is answered");
        assert!(
            outcomes
                .iter()
                .all(|o| !o.allowed && o.reset_ms > 3_500_000)
        );
    }
}
