//! A rejected request books nothing, on every backend: atomically on memory and one Redis
//! node (no other request ever sees the booking), by refunds on Redis Cluster, and also when
//! part of the request failed. And a slow Redis reply fails only its own call.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::redis::{Engine, RedisCluster, RedisServer};
use floodgate::backend::memory::MemoryBackend;
use floodgate::backend::{
    Backend, BackendError, BucketKey, Charge, Group, Item, RedisBackend, RedisOptions, Weight,
};
use floodgate::rules::{Algorithm, OnOverLimit, Policy, Unit};

fn options(timeout_ms: u64) -> RedisOptions {
    RedisOptions {
        timeout: Duration::from_millis(timeout_ms),
        ..RedisOptions::default()
    }
}

fn item(policy: Policy, value: &str, cost: u64, weight: Weight) -> Item {
    Item {
        charge: Charge {
            bucket: BucketKey::new("d", "k", [("k", value)], &policy),
            policy,
            cost,
            spread_ms: 0,
        },
        weight,
        lease: None,
    }
}

fn group(items: Vec<Item>) -> Group {
    Group {
        items,
        ..Group::default()
    }
}

/// The remaining of `value`'s bucket under `policy`, by a peek.
async fn remaining(backend: &dyn Backend, policy: Policy, value: &str) -> u64 {
    let peek = item(policy, value, 0, Weight::default());
    backend.charge(&[peek.charge]).await.unwrap()[0].remaining
}

/// What every backend must do with groups; `tag` keeps each run's buckets apart.
async fn books_nothing_when_rejected(backend: &dyn Backend, tag: &str) {
    let five = Policy::fixed_window(5, Unit::Hour);
    let one = Policy::fixed_window(1, Unit::Hour);
    let consume = Policy {
        on_over_limit: OnOverLimit::Consume,
        ..Policy::fixed_window(5, Unit::Hour)
    };
    let (a, full, c) = (format!("{tag}a"), format!("{tag}full"), format!("{tag}c"));
    backend
        .charge(&[item(one, &full, 1, Weight::default()).charge])
        .await
        .unwrap();

    // A fitting charge, a consume charge, and a denial: the request is rejected.
    let rejected = group(vec![
        item(five, &a, 2, Weight::default()),
        item(consume, &c, 2, Weight::default()),
        item(one, &full, 1, Weight::default()),
    ]);
    let outcomes = backend.decide(&rejected).await.unwrap();
    assert!(outcomes[0].allowed && outcomes[0].rolled_back && !outcomes[0].booked);
    assert_eq!(outcomes[0].remaining, 3, "the verdict as if booked");
    assert!(
        outcomes[1].booked && !outcomes[1].rolled_back,
        "consume books"
    );
    assert!(!outcomes[2].allowed);
    assert_eq!(remaining(backend, five, &a).await, 5, "nothing booked");
    assert_eq!(remaining(backend, consume, &c).await, 3, "consume stands");

    // A shadow-mode denial does not reject; a prior denial (cache, L = 0) does.
    let shadowed = group(vec![
        item(five, &a, 1, Weight::default()),
        item(
            one,
            &full,
            1,
            Weight {
                shadow: true,
                quota: false,
            },
        ),
    ]);
    let outcomes = backend.decide(&shadowed).await.unwrap();
    assert!(outcomes[0].booked && !outcomes[0].rolled_back);
    let mut prior_denied = group(vec![item(five, &a, 1, Weight::default())]);
    prior_denied.prior.over = true;
    assert!(backend.decide(&prior_denied).await.unwrap()[0].rolled_back);
    assert_eq!(remaining(backend, five, &a).await, 4);

    // Quota rules reject only when all of them deny.
    let quota = Weight {
        quota: true,
        shadow: false,
    };
    let one_of_two = group(vec![item(five, &a, 1, quota), item(one, &full, 1, quota)]);
    assert!(backend.decide(&one_of_two).await.unwrap()[0].booked);
    let every_quota = group(vec![
        item(five, &a, 1, Weight::default()),
        item(one, &full, 1, quota),
    ]);
    assert!(backend.decide(&every_quota).await.unwrap()[0].rolled_back);
    assert_eq!(remaining(backend, five, &a).await, 3);

    // Global shadow mode admits the request: its bookings stand.
    let mut admitted = group(vec![
        item(five, &a, 1, Weight::default()),
        item(one, &full, 1, Weight::default()),
    ]);
    admitted.admit = true;
    assert!(backend.decide(&admitted).await.unwrap()[0].booked);
    assert_eq!(remaining(backend, five, &a).await, 2);
}

#[tokio::test]
async fn every_backend_books_nothing_for_a_rejected_request() {
    let memory = MemoryBackend::new(1000);
    books_nothing_when_rejected(&memory, "memory").await;
    redis_and_cluster_book_nothing_for_a_rejected_request(Engine::Redis).await;
}

/// A rejected request books nothing on one `engine` node and on an `engine` cluster.
pub(crate) async fn redis_and_cluster_book_nothing_for_a_rejected_request(engine: Engine) {
    let server = RedisServer::start_engine(engine, &[]);
    let redis = RedisBackend::connect(&server.url(), options(2000))
        .await
        .unwrap();
    books_nothing_when_rejected(&redis, "redis").await;

    let cluster = RedisCluster::start_engine_async(engine).await;
    let backend = cluster.backend().await;
    books_nothing_when_rejected(&backend, "cluster").await;
}

/// Requests that are always rejected (their second bucket is full) run against a bucket of
/// limit 1 while another task peeks it: an atomic backend never lets the peek see the
/// transient booking. The writer runs until the peeks are done, so every peek falls while
/// it writes.
async fn no_transient_bookings(backend: Arc<dyn Backend>) {
    let one = Policy::fixed_window(1, Unit::Hour);
    backend
        .charge(&[item(one, "full", 1, Weight::default()).charge])
        .await
        .unwrap();
    let rejected = group(vec![
        item(one, "shared", 1, Weight::default()),
        item(one, "full", 1, Weight::default()),
    ]);
    let peeking = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let writer = {
        let backend = Arc::clone(&backend);
        let peeking = Arc::clone(&peeking);
        tokio::spawn(async move {
            let mut written = 0;
            while peeking.load(std::sync::atomic::Ordering::Relaxed) || written < 400 {
                let outcomes = backend.decide(&rejected).await.unwrap();
                assert!(outcomes[0].rolled_back);
                written += 1;
            }
            written
        })
    };
    for peek in 0..400 {
        assert_eq!(
            remaining(backend.as_ref(), one, "shared").await,
            1,
            "peek {peek}"
        );
    }
    peeking.store(false, std::sync::atomic::Ordering::Relaxed);
    assert!(writer.await.unwrap() >= 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn atomic_backends_never_show_a_booking_that_is_undone() {
    no_transient_bookings(Arc::new(MemoryBackend::new(1000))).await;
    let server = RedisServer::start();
    let redis = RedisBackend::connect(&server.url(), options(2000))
        .await
        .unwrap();
    no_transient_bookings(Arc::new(redis)).await;
}

/// Two buckets on different masters; the second master dies: the request fails, and the
/// booking on the live master is undone, unless the failure mode admits the request.
#[tokio::test]
async fn a_failed_request_keeps_no_booking_on_live_shards() {
    let mut cluster = RedisCluster::start_async().await;
    let backend = cluster.backend().await;
    let five = Policy::fixed_window(5, Unit::Hour);
    let key = |value: &str| {
        item(five, value, 1, Weight::default())
            .charge
            .bucket
            .redis_key("fg")
    };
    let live = "live";
    let live_master = cluster.master_index_for(&key(live));
    let dead = (0..1000)
        .map(|i| format!("dead{i}"))
        .find(|value| cluster.master_index_for(&key(value)) != live_master)
        .expect("a bucket on another master");
    let dead_master = cluster.master_index_for(&key(&dead));
    cluster.node_mut(dead_master).stop();

    for keep_on_failure in [false, true] {
        let mut request = group(vec![
            item(five, live, 2, Weight::default()),
            item(five, &dead, 1, Weight::default()),
        ]);
        request.keep_on_failure = keep_on_failure;
        let error = backend.decide(&request).await.unwrap_err();
        assert!(
            !matches!(error, BackendError::Config(_)),
            "a failure, not a setting: {error}"
        );
        let left = remaining(&backend, five, live).await;
        let expected = if keep_on_failure { 3 } else { 5 };
        assert_eq!(left, expected, "keep_on_failure = {keep_on_failure}");
    }
}

/// `DEBUG SLEEP` stalls Redis past one call's budget: that call times out, the calls after
/// it succeed on the same connections, and no new connection is opened.
#[tokio::test]
async fn a_slow_reply_fails_only_its_own_call() {
    let server = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let backend = RedisBackend::connect(&server.url(), options(100))
        .await
        .unwrap();
    let five = Policy::fixed_window(1000, Unit::Hour);
    backend
        .charge(&[item(five, "warm", 1, Weight::default()).charge])
        .await
        .unwrap();
    let sleeper = redis::Client::open(server.url()).unwrap();
    let mut sleeper = sleeper.get_multiplexed_async_connection().await.unwrap();
    // Every redis-cli query is a connection too: one more per reading.
    let connections = || -> u64 {
        server
            .info_field("stats", "total_connections_received")
            .unwrap()
            .parse()
            .unwrap()
    };
    // The pool opens its second socket in the background: count from when both are up
    // (two pooled sockets, the sleeper, and redis-cli asking).
    let clients = || server.info_field("clients", "connected_clients");
    common::eventually(Duration::from_secs(5), async || {
        clients().as_deref() == Some("4")
    })
    .await;
    assert_eq!(clients().as_deref(), Some("4"));
    let before = connections();
    let sleep = tokio::spawn(async move {
        redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg("0.3")
            .query_async::<()>(&mut sleeper)
            .await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let slow = backend
        .charge(&[item(five, "slow", 1, Weight::default()).charge])
        .await;
    assert!(matches!(slow, Err(BackendError::Timeout)), "{slow:?}");
    sleep.await.unwrap().unwrap();
    for i in 0..20 {
        let value = format!("after{i}");
        let outcome = backend
            .charge(&[item(five, &value, 1, Weight::default()).charge])
            .await
            .unwrap();
        assert!(outcome[0].allowed);
    }
    assert_eq!(connections(), before + 1, "no reconnect after a slow reply");
}

/// One bucket's key overwritten with a string (Redis answers WRONGTYPE for it): the
/// requests that touch it fail alone and keep nothing booked; the 294 others batched with
/// them are answered. Before, the error aborted the whole batch script: every request in it
/// failed, and groups already charged kept their bookings.
async fn a_bad_key_fails_only_its_requests(backend: Arc<dyn Backend>, overwrite: impl Fn(&str)) {
    let five = Policy::fixed_window(5, Unit::Hour);
    let bad = item(five, "bad", 1, Weight::default());
    overwrite(&bad.charge.bucket.redis_key("fg"));
    let mut tasks = Vec::new();
    for i in 0..300 {
        let backend = Arc::clone(&backend);
        let touches_bad = i % 50 == 0;
        let mut items = vec![item(five, &format!("good{i}"), 1, Weight::default())];
        if touches_bad {
            items.push(item(five, "bad", 1, Weight::default()));
        }
        tasks.push(tokio::spawn(async move {
            (touches_bad, i, backend.decide(&group(items)).await)
        }));
    }
    for task in tasks {
        let (touches_bad, i, result) = task.await.unwrap();
        match (touches_bad, result) {
            (false, Ok(outcomes)) => assert!(outcomes[0].allowed && outcomes[0].booked),
            (true, Err(BackendError::Failed { .. })) => {
                // Its other bucket kept nothing.
                assert_eq!(
                    remaining(backend.as_ref(), five, &format!("good{i}")).await,
                    5
                );
            }
            (touches_bad, other) => panic!("request {i} (bad key: {touches_bad}): {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_key_fails_only_the_requests_that_touch_it() {
    let server = RedisServer::start();
    let backend = RedisBackend::connect(&server.url(), options(5000))
        .await
        .unwrap();
    a_bad_key_fails_only_its_requests(Arc::new(backend), |key| {
        assert_eq!(server.cli(&["SET", key, "not a hash"]).trim(), "OK");
    })
    .await;

    let cluster = RedisCluster::start_async().await;
    let url = cluster.urls()[0].clone();
    let port = url.rsplit(':').next().unwrap().to_owned();
    a_bad_key_fails_only_its_requests(Arc::new(cluster.backend().await), |key| {
        let out = std::process::Command::new("redis-cli")
            .args([
                "-c",
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "SET",
                key,
                "not a hash",
            ])
            .output()
            .expect("redis-cli runs");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "OK");
    })
    .await;
}

/// 300 requests at once, each charging one hot bucket and a gate of limit 40: the lane joins
/// them into calls that decide the hot bucket many times (through the script's cache of
/// lua/lib.lua), undoing its booking for every request the gate rejects. Exactly 40 are
/// admitted, and the hot bucket holds exactly their 40 bookings, on every hash algorithm.
async fn a_hot_bucket_keeps_only_the_admitted_bookings(
    backend: Arc<dyn Backend>,
    tag: &str,
    refunds_leak: bool,
) {
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::TokenBucket,
        Algorithm::SlidingWindow,
    ] {
        let hot = Policy {
            algorithm,
            ..Policy::fixed_window(1000, Unit::Day)
        };
        let gate = Policy {
            algorithm,
            ..Policy::fixed_window(40, Unit::Day)
        };
        let (hot_value, gate_value) = (
            format!("{tag}{algorithm}hot"),
            format!("{tag}{algorithm}gate"),
        );
        let mut tasks = Vec::new();
        for _ in 0..300 {
            let backend = Arc::clone(&backend);
            let request = group(vec![
                item(hot, &hot_value, 1, Weight::default()),
                item(gate, &gate_value, 1, Weight::default()),
            ]);
            tasks.push(tokio::spawn(async move { backend.decide(&request).await }));
        }
        let mut admitted = 0;
        for task in tasks {
            let outcomes = task.await.unwrap().unwrap();
            let allowed = outcomes.iter().all(|outcome| outcome.allowed);
            admitted += u64::from(allowed);
            assert_eq!(
                outcomes[0].rolled_back, !allowed,
                "{algorithm}: {outcomes:?}"
            );
        }
        assert_eq!(admitted, 40, "{tag} {algorithm}");
        let left = remaining(backend.as_ref(), hot, &hot_value).await;
        // Across cluster nodes a rejected request is undone by refunds, later calls; a
        // token-bucket refund gives back its cost less what leaked since the booking, so
        // the shortfalls of 260 refunds may add up to one request.
        let slack = u64::from(refunds_leak && algorithm == Algorithm::TokenBucket);
        assert!(
            (1000 - 40 - slack..=1000 - 40).contains(&left),
            "{tag} {algorithm}: {left} left"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_bucket_decided_many_times_in_one_call_books_only_admitted_requests() {
    a_hot_bucket_keeps_only_the_admitted_bookings(Arc::new(MemoryBackend::new(1000)), "m", false)
        .await;

    let server = RedisServer::start();
    let redis = RedisBackend::connect(&server.url(), options(5000))
        .await
        .unwrap();
    a_hot_bucket_keeps_only_the_admitted_bookings(Arc::new(redis), "r", false).await;
    // The hot bucket was read far fewer times than it was decided: calls held many of its
    // items, each read and written once.
    let hmget = server.calls_of("hmget");
    assert!(hmget > 0, "HMGET calls in INFO commandstats");
    assert!(hmget < 3 * 2 * 300, "{hmget} HMGET for 1,800 decisions");

    let cluster = RedisCluster::start_async().await;
    a_hot_bucket_keeps_only_the_admitted_bookings(Arc::new(cluster.backend().await), "c", true)
        .await;
}
