//! Redis Cluster with the function library: a batch of concurrent requests costs far fewer
//! `FCALL`s than decisions (one call per master per batch), and a slot that moves to another
//! master under load (`CLUSTER SETSLOT ... MIGRATING/IMPORTING`, `MIGRATE`, `SETSLOT NODE`)
//! fails no decision and admits no request over a limit.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::redis::{Engine, RedisCluster, RedisServer};
use floodgate::backend::{
    Backend, BucketKey, Charge, ClusterBackend, Group, Item, RedisOptions, Weight,
};
use floodgate::rules::{Policy, Unit};
use futures::future::join_all;

/// A budget that a loaded, shared machine meets; the tests assert no timing.
fn options() -> RedisOptions {
    RedisOptions {
        timeout: Duration::from_secs(2),
        scripting: floodgate::backend::redis::Scripting::Functions,
        ..RedisOptions::default()
    }
}

fn charge(policy: Policy, value: &str) -> Charge {
    Charge {
        bucket: BucketKey::new("batching", "r", [("k", value)], &policy),
        policy,
        cost: 1,
        spread_ms: 0,
    }
}

/// `FCALL`s run so far on every master.
fn fcalls(cluster: &RedisCluster) -> u64 {
    cluster.masters().iter().map(|m| m.calls_of("fcall")).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_share_one_fcall_per_master() {
    requests_share_one_fcall_per_master(Engine::Redis).await;
}

/// Concurrent requests share one FCALL per master of an `engine` cluster, and a request
/// spread over masters books nothing when it ends rejected.
pub(crate) async fn requests_share_one_fcall_per_master(engine: Engine) {
    const REQUESTS: usize = 300;
    let cluster = RedisCluster::start_engine_async(engine).await;
    let backend = ClusterBackend::connect(&cluster.urls(), options())
        .await
        .unwrap();
    let policy = Policy::fixed_window(10, Unit::Hour);
    let charges: Vec<Charge> = (0..REQUESTS)
        .map(|i| charge(policy, &format!("b{i}")))
        .collect();
    let before = fcalls(&cluster);
    let results = join_all(
        charges
            .iter()
            .map(|c| backend.charge(std::slice::from_ref(c))),
    )
    .await;
    let calls = fcalls(&cluster) - before;
    for result in results {
        assert!(result.unwrap()[0].allowed);
    }
    assert!(
        calls < REQUESTS as u64 / 2,
        "{calls} FCALLs for {REQUESTS} decisions"
    );
    // A request spread over several masters is decided too, and one that ends rejected
    // leaves nothing booked on any of them.
    let spread: Vec<Charge> = (0..12).map(|i| charge(policy, &format!("s{i}"))).collect();
    let tight = Policy::fixed_window(1, Unit::Hour);
    let mut group = Group::independent(&spread);
    group.admit = false;
    group.keep_on_failure = false;
    group.items.push(Item {
        charge: charge(tight, "tight"),
        weight: Weight::default(),
        lease: None,
    });
    let first = backend.decide(&group).await.unwrap();
    assert!(first.iter().all(|o| o.allowed));
    let second = backend.decide(&group).await.unwrap();
    assert!(!second.last().unwrap().allowed, "the tight bucket is spent");
    for (outcome, _) in second.iter().zip(&spread) {
        assert!(outcome.rolled_back && !outcome.booked, "{outcome:?}");
    }
    let peek = backend.charge(&spread).await.unwrap();
    assert!(peek.iter().all(|o| o.remaining == 10 - 2), "{peek:?}");
}

/// The id of a node (`CLUSTER MYID`).
fn id(node: &RedisServer) -> String {
    node.cli(&["CLUSTER", "MYID"])
}

/// Moves `slot` from `from` to `to` as `redis-cli --cluster reshard` does, one step at a
/// time with a pause between, so that traffic runs through every state of the move.
fn migrate(nodes: &[&RedisServer], from: &RedisServer, to: &RedisServer, slot: u16) {
    let pause = || std::thread::sleep(Duration::from_millis(300));
    let slot = slot.to_string();
    let (from_id, to_id) = (id(from), id(to));
    to.cli(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id]);
    from.cli(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id]);
    pause();
    let keys = from.cli(&["CLUSTER", "GETKEYSINSLOT", &slot, "1000"]);
    let port = to.port().to_string();
    for key in keys.lines().filter(|k| !k.is_empty()) {
        let moved = from.cli(&["MIGRATE", "127.0.0.1", &port, key, "0", "5000"]);
        assert_eq!(moved, "OK", "MIGRATE {key}");
    }
    pause();
    // The new owner first, then the old one (the order `redis-cli --cluster` uses: the
    // other way round the two would redirect a key to each other for a moment).
    for node in [to, from].into_iter().chain(nodes.iter().copied()) {
        node.cli(&["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]);
    }
    pause();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_moving_under_load_fails_nothing_and_admits_no_more_than_the_limit() {
    const LIMIT: u32 = 40;
    const BUCKETS: usize = 24;
    const MAX_ROUNDS: usize = 400;
    let cluster = RedisCluster::start_async().await;
    let backend = Arc::new(
        ClusterBackend::connect(&cluster.urls(), options())
            .await
            .unwrap(),
    );
    let policy = Policy::fixed_window(LIMIT, Unit::Hour);
    let charges: Vec<Charge> = (0..BUCKETS)
        .map(|i| charge(policy, &format!("m{i}")))
        .collect();
    // The slot of the first bucket moves from its master to another master.
    let key = charges[0].bucket.redis_key(&options().key_prefix);
    let from = cluster.master_index_for(&key);
    let slot: u16 = cluster.nodes()[from]
        .cli(&["CLUSTER", "KEYSLOT", &key])
        .parse()
        .unwrap();
    let to = (0..cluster.nodes().len())
        .find(|&i| {
            let role = cluster.nodes()[i].info_field("replication", "role");
            i != from && role.as_deref() == Some("master")
        })
        .unwrap();
    // Every bucket has booked once, so the moving slot has a key to migrate.
    for c in &charges {
        assert!(backend.charge(std::slice::from_ref(c)).await.unwrap()[0].allowed);
    }
    let done = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn({
        let (backend, done) = (Arc::clone(&backend), Arc::clone(&done));
        async move {
            let mut admitted = vec![1u32; BUCKETS];
            let (mut rounds, mut after) = (0, 0);
            // Rounds of one concurrent request per bucket, the first bucket weighing most,
            // until 20 rounds after the move ended (bounded in count).
            while rounds < MAX_ROUNDS && after < 20 {
                rounds += 1;
                after += usize::from(done.load(Ordering::Relaxed));
                let round: Vec<usize> = (0..BUCKETS).chain([0, 0]).collect();
                let results = join_all(round.iter().map(|&bucket| {
                    let charge = charges[bucket].clone();
                    let backend = Arc::clone(&backend);
                    async move { backend.charge(&[charge]).await }
                }))
                .await;
                for (bucket, result) in round.into_iter().zip(results) {
                    let outcome = result.unwrap_or_else(|e| panic!("round {rounds}: {e}"))[0];
                    admitted[bucket] += u32::from(outcome.allowed);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (rounds, admitted)
        }
    });
    let nodes: Vec<&RedisServer> = cluster.masters();
    let (from_node, to_node) = (&cluster.nodes()[from], &cluster.nodes()[to]);
    tokio::task::block_in_place(|| migrate(&nodes, from_node, to_node, slot));
    done.store(true, Ordering::Relaxed);
    let (rounds, admitted) = load.await.unwrap();
    assert!(after_the_move(&cluster, &key, to), "the slot moved");
    assert!(rounds > 20, "traffic ran through the move");
    for (bucket, count) in admitted.iter().enumerate() {
        assert!(
            *count <= LIMIT,
            "bucket {bucket}: {count} admitted over {LIMIT}"
        );
    }
    assert_eq!(admitted[0], LIMIT, "the moving bucket was spent exactly");
}

/// Whether the cluster now names node `to` master of `key`'s slot.
fn after_the_move(cluster: &RedisCluster, key: &str, to: usize) -> bool {
    cluster.master_index_for(key) == to
}
