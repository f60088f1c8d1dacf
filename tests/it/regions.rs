//! One budget across regions (docs/regions.md): three regions, each with its own Redis and
//! one replica, links between regions through delaying proxies. A global rule offered twice
//! its limit moves from region to region; one region is then cut off. Per window the three
//! admit at most the limit plus one cost per region, follow the load once leases move, never
//! call another region's Redis on the request path, and a cut-off region keeps deciding from
//! its own lease.

use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use floodgate::backend::BackendSettings;
use floodgate::bench::proxy::Proxy;
use floodgate::clock::{Clock, SystemClock};
use floodgate::limiter::regions::RegionSettings;
use tonic::transport::Channel;

use crate::common::redis::RedisServer;
use crate::common::{TestServer, descriptor, redis_options, request};

const LIMIT: usize = 90;
const WINDOW_MS: i64 = 3_000;
const RULES: &str = "domain: global
descriptors:
  - key: tenant
    rate_limit: {unit: second, unit_multiplier: 3, requests_per_unit: 90, scope: global}
";
const NAMES: [&str; 3] = ["a", "b", "c"];

/// Three regions: Redis servers, the proxies from each region to the others' Redis, and one
/// replica per region.
struct World {
    redis: Vec<RedisServer>,
    /// `links[i][j]`: region i's way to region j's Redis (none for i = j).
    links: Vec<Vec<Option<Proxy>>>,
    servers: Vec<TestServer>,
}

impl World {
    async fn start(delay: Duration) -> World {
        let redis: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
        let mut links = Vec::new();
        for i in 0..3 {
            let mut row = Vec::new();
            for (j, server) in redis.iter().enumerate() {
                row.push(if i == j {
                    None
                } else {
                    let target = ([127, 0, 0, 1], server.port()).into();
                    Some(Proxy::start(target, delay).await.expect("proxy"))
                });
            }
            links.push(row);
        }
        let mut servers = Vec::new();
        for (i, own) in redis.iter().enumerate() {
            let peers = (0..3)
                .filter(|&j| j != i)
                .map(|j| {
                    let proxy = links[i][j].as_ref().expect("a link");
                    let backend = BackendSettings::Redis {
                        url: format!("redis://{}", proxy.addr()),
                        options: redis_options(Duration::from_millis(500)),
                    };
                    (NAMES[j].to_owned(), backend)
                })
                .collect();
            let url = own.url();
            servers.push(
                TestServer::start_with(&[("global.yaml", RULES)], move |settings| {
                    settings.backend = BackendSettings::Redis {
                        url,
                        options: redis_options(Duration::from_millis(200)),
                    };
                    settings.regions = Some(RegionSettings {
                        name: NAMES[i].to_owned(),
                        peers,
                        period: Duration::from_millis(200),
                        global_domains: Vec::new(),
                    });
                })
                .await,
            );
        }
        World {
            redis,
            links,
            servers,
        }
    }

    /// Cuts every link to and from region `k`.
    fn partition(&self, k: usize) {
        for i in 0..3 {
            for j in 0..3 {
                if (i == k || j == k)
                    && let Some(link) = &self.links[i][j]
                {
                    link.cut();
                }
            }
        }
    }
}

/// Waits for the start of the next window, plus a little.
async fn next_window() {
    let into = SystemClock.now_ms().rem_euclid(WINDOW_MS);
    tokio::time::sleep(Duration::from_millis((WINDOW_MS - into + 50) as u64)).await;
}

/// Offers `per_region[i]` requests to region i, spread over one window; returns how many
/// each admitted, or `None` when the calls spilled into the next window (a starved machine).
async fn one_window<const N: usize>(
    clients: &mut [RateLimitServiceClient<Channel>],
    per_region: [usize; N],
) -> Option<[usize; N]> {
    next_window().await;
    let window = SystemClock.now_ms().div_euclid(WINDOW_MS);
    let start = tokio::time::Instant::now();
    let spread = Duration::from_millis(2_400);
    let counts = futures::future::join_all(clients.iter_mut().zip(per_region).map(
        async |(client, offered)| {
            let mut admitted = 0;
            for k in 0..offered {
                tokio::time::sleep_until(start + spread * k as u32 / offered as u32).await;
                let answer = client
                    .should_rate_limit(request("global", vec![descriptor(&[("tenant", "t")])]))
                    .await
                    .expect("every region answers, cut off or not")
                    .into_inner();
                admitted += usize::from(answer.overall_code == Code::Ok as i32);
            }
            admitted
        },
    ))
    .await;
    let spilled = SystemClock.now_ms().div_euclid(WINDOW_MS) != window;
    (!spilled).then(|| std::array::from_fn(|i| counts[i]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_budget_follows_the_load_and_holds_under_a_partition() {
    let world = World::start(Duration::from_millis(20)).await;
    let mut clients = Vec::new();
    for server in &world.servers {
        clients.push(server.client().await);
    }
    let bound = LIMIT + 3;
    let mut seen = Vec::new();
    let even = 2 * LIMIT / 3;
    let phases: [(&str, [usize; 3]); 4] = [
        ("load on a", [2 * LIMIT, 0, 0]),
        ("load moved to b", [0, 2 * LIMIT, 0]),
        ("load on all three", [even, even, even]),
        ("load on all three, c cut off", [even, even, even]),
    ];
    for (phase, offered) in phases {
        if phase.contains("cut off") {
            world.partition(2);
        }
        let fcalls_elsewhere = |world: &World| -> Vec<u64> {
            (0..3)
                .filter(|&i| offered[i] == 0)
                .map(|i| world.redis[i].calls_of("fcall"))
                .collect()
        };
        let before = fcalls_elsewhere(&world);
        for window in 0..3 {
            let Some(admitted) = one_window(&mut clients, offered).await else {
                continue;
            };
            let total: usize = admitted.iter().sum();
            seen.push((phase, window, admitted));
            assert!(
                total <= bound,
                "{phase}, window {window}: {admitted:?} over {bound}"
            );
            // The first window of a phase is where the lease moves; the next ones follow
            // the load, a cut-off region deciding within the lease it holds.
            if window > 0 {
                assert!(
                    total * 10 >= LIMIT * 8,
                    "{phase}, window {window}: {admitted:?}"
                );
            }
            if phase.contains("cut off") {
                assert!(admitted[2] > 0, "{phase}: c decides from its own lease");
            }
        }
        assert_eq!(
            before,
            fcalls_elsewhere(&world),
            "{phase}: no decision ran in another region's Redis"
        );
    }
    eprintln!("admitted per window (limit {LIMIT}): {seen:?}");
    assert!(seen.len() >= 6, "too few windows measured: {seen:?}");
    // The operator page, in a real browser, while a and b stay busy (bounded: 600 calls).
    let mut busy = clients[..2].to_vec();
    let traffic = tokio::spawn(async move {
        for k in 0..600 {
            let client = &mut busy[k % 2];
            let call = request("global", vec![descriptor(&[("tenant", "t")])]);
            if client.should_rate_limit(call).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let (page, _) = crate::common::check_page(
        &world.servers[0].http_url("/"),
        "regions-page.png",
        &["--rule", "global/tenant", "--regions", "a,b"],
    )
    .await;
    traffic.abort();
    let note = page["regions"]["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("here a") && note.contains("cut off"),
        "{page}"
    );
    let overview: serde_json::Value = serde_json::from_str(
        &crate::common::http("GET", &world.servers[0].http_url("/overview"), "")
            .await
            .1,
    )
    .expect("overview is JSON");
    let regions = &overview["regions"];
    assert_eq!(regions["region"], "a");
    assert_eq!(regions["peers"].as_array().map(Vec::len), Some(2));
    let c = regions["peers"]
        .as_array()
        .and_then(|peers| peers.iter().find(|peer| peer["region"] == "c"))
        .expect("c is a peer");
    assert_eq!(c["reachable"], false, "{overview}");
    assert!(
        regions["buckets"][0]["regions"].as_array().is_some(),
        "{overview}"
    );
    for server in world.servers {
        server.stop().await;
    }
}

/// The escrow's arithmetic against two real Redis servers, driven directly: random
/// interleavings of decisions in two regions, grants, and receipts delivered late, twice or
/// never. Whatever the order, the two regions never admit more than the limit together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_never_admit_more_than_the_limit_whatever_the_messages_do() {
    use floodgate::backend::{Backend, BucketKey, Charge, Group, Item, RedisBackend};
    use floodgate::limiter::regions::lease::Leased;
    use floodgate::rules::{Algorithm, Policy, Unit};
    use rand::{Rng, SeedableRng};

    let servers = [RedisServer::start(), RedisServer::start()];
    let mut backends = Vec::new();
    for server in &servers {
        let backend = RedisBackend::connect(&server.url(), redis_options(Duration::from_secs(2)))
            .await
            .expect("connects");
        backends.push(backend);
    }
    let names = ["a", "b"];
    // Hour-long: nothing refills or rolls over while the test runs.
    let policies = [
        Policy::fixed_window(90, Unit::Hour),
        Policy {
            algorithm: Algorithm::TokenBucket,
            ..Policy::fixed_window(90, Unit::Hour)
        },
        Policy {
            algorithm: Algorithm::SlidingWindow,
            ..Policy::fixed_window(90, Unit::Hour)
        },
    ];
    for (seed, policy) in (0..6u64).zip(policies.iter().cycle()) {
        crate::common::away_from_an_hour_boundary().await;
        let bucket = BucketKey::new("escrow", &format!("seed{seed}"), [], policy);
        // Both regions' base is half the limit.
        let leased = Leased {
            bucket,
            policy,
            base: 45,
            period_ms: 1_000,
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut admitted = 0;
        // What each region granted the other, as last read: receipts may use a stale one.
        let mut granted_seen = [0u64; 2];
        for _ in 0..300 {
            let region = rng.random_range(0..2);
            let other = 1 - region;
            let backend: &dyn Backend = &backends[region];
            match rng.random_range(0..10) {
                0..=5 => {
                    let group = Group::independent(&[Charge {
                        bucket,
                        policy: *policy,
                        cost: 1,
                        spread_ms: 0,
                    }]);
                    let group = Group {
                        items: vec![Item {
                            lease: Some(45),
                            ..group.items[0].clone()
                        }],
                        ..group
                    };
                    let outcomes = backend.decide(&group).await.expect("decides");
                    admitted += usize::from(outcomes[0].allowed);
                }
                6 | 7 => {
                    let amount = rng.random_range(1..60);
                    leased
                        .grant(backend, names[other], amount)
                        .await
                        .expect("grants");
                }
                _ => {
                    // The other's total granted to us, read now or (late) as read before.
                    if rng.random_bool(0.7) {
                        let theirs = leased
                            .read(&backends[other], names[region])
                            .await
                            .expect("reads");
                        granted_seen[region] = theirs.granted_to_us;
                    }
                    leased
                        .receive(backend, names[other], granted_seen[region])
                        .await
                        .expect("receives");
                }
            }
        }
        let held: u64 = {
            let a = leased.read(&backends[0], "b").await.expect("reads").lease;
            let b = leased.read(&backends[1], "a").await.expect("reads").lease;
            a + b
        };
        assert!(
            admitted <= 90,
            "seed {seed}, {policy:?}: {admitted} admitted of 90"
        );
        assert!(held <= 90, "seed {seed}: leases add up to {held}");
        assert!(
            admitted >= 30,
            "seed {seed}: the regions admitted only {admitted}"
        );
    }
}

/// Two regions, each on a 3-master Redis Cluster (the lease beside its bucket in one slot,
/// read by the cluster batch function): the lease moves to the busy region, and the two
/// never admit past the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_move_between_regions_on_redis_clusters() {
    use crate::common::redis::RedisCluster;
    let clusters = [
        RedisCluster::start_async().await,
        RedisCluster::start_async().await,
    ];
    let mut servers = Vec::new();
    for (i, cluster) in clusters.iter().enumerate() {
        let other = &clusters[1 - i];
        let cluster_of = |urls: Vec<String>| BackendSettings::Cluster {
            urls,
            options: redis_options(Duration::from_millis(500)),
        };
        let (own, peer) = (cluster_of(cluster.urls()), cluster_of(other.urls()));
        servers.push(
            TestServer::start_with(&[("global.yaml", RULES)], move |settings| {
                settings.backend = own;
                settings.regions = Some(RegionSettings {
                    name: NAMES[i].to_owned(),
                    peers: vec![(NAMES[1 - i].to_owned(), peer)],
                    period: Duration::from_millis(200),
                    global_domains: Vec::new(),
                });
            })
            .await,
        );
    }
    let mut clients = Vec::new();
    for server in &servers {
        clients.push(server.client().await);
    }
    let mut seen = Vec::new();
    for _ in 0..3 {
        if let Some(admitted) = one_window(&mut clients, [2 * LIMIT, 0]).await {
            seen.push(admitted);
        }
    }
    eprintln!("admitted per window on clusters (limit {LIMIT}): {seen:?}");
    assert!(seen.len() >= 2, "too few windows measured: {seen:?}");
    for admitted in &seen {
        assert!(admitted.iter().sum::<usize>() <= LIMIT + 2, "{seen:?}");
    }
    // Past the first window the busy region holds (nearly) the whole limit, where its base
    // is half.
    assert!(
        seen[1..]
            .iter()
            .all(|admitted| admitted[0] * 10 >= LIMIT * 8),
        "{seen:?}"
    );
    for server in servers {
        server.stop().await;
    }
}
