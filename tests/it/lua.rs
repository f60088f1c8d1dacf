//! The Lua scripts against a real `redis-server`: every vector of tests/vectors/algorithms.json
//! on a pinned clock, their contract (one key, TTL on every write, integer replies, argument
//! checks), and the reload after `SCRIPT FLUSH` and `FUNCTION FLUSH`. The vectors and the
//! contract run both as scripts (`EVALSHA`) and as the function library (`FCALL`).
//!
//! Scripts of `ScriptSet::pinned` read the time from a `ManualClock` instead of `TIME`, so the
//! vectors run at exactly the instants the Rust algorithms see. Tests that need no particular
//! instant run the production scripts on the server's clock.

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::redis::{Engine, RedisCluster, RedisServer};
use common::vectors::{self, Action, Observed};
use floodgate::backend::redis::Scripting;
use floodgate::backend::redis::calls::Argv;
use floodgate::backend::redis::scripts::{ScriptSet, source};
use floodgate::backend::{Backend, BucketKey, Charge, RedisBackend, RedisOptions, Refund};
use floodgate::clock::ManualClock;
use floodgate::rules::{Algorithm, OnOverLimit, Policy, Unit};
use redis::{Commands, Connection};

/// A day boundary ahead of the real clock (as the vector table's start): keys that a pinned
/// script sets to expire relative to it never expire by the server's own clock.
const START: i64 = 4_102_444_800_000;

/// A charge reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reply {
    allowed: bool,
    remaining: u64,
    reset_ms: u64,
    now_ms: i64,
    booked: bool,
}

fn connect(server: &RedisServer) -> Connection {
    redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap()
}

/// The two ways the backends run the code.
const PATHS: [Scripting; 2] = [Scripting::Evalsha, Scripting::Functions];

/// A script set, loaded on one server and called the way `scripting` calls it.
struct Lua {
    scripts: ScriptSet,
    scripting: Scripting,
}

impl Lua {
    /// Loads the scripts, or the library, of `scripts` on `conn`.
    fn load(conn: &mut Connection, scripts: ScriptSet, scripting: Scripting) -> Lua {
        for cmd in scripts.load_commands(scripting) {
            let _: redis::Value = cmd.query(conn).unwrap();
        }
        Lua { scripts, scripting }
    }
}

/// Runs the code of `argv`'s algorithm (`EVALSHA` or `FCALL`), with the pinned time after
/// the ARGV when the set is pinned.
fn eval(conn: &mut Connection, lua: &Lua, key: &str, argv: Argv) -> Vec<i64> {
    argv.command(key, &lua.scripts, lua.scripting)
        .query(conn)
        .unwrap()
}

/// The charge of `argv`.
fn charge(conn: &mut Connection, scripts: &Lua, key: &str, argv: Argv) -> Reply {
    let v = eval(conn, scripts, key, argv);
    assert_eq!(v.len(), 5, "{v:?}");
    assert!(v[0] == 0 || v[0] == 1);
    assert!(v[4] == 0 || v[4] == 1);
    Reply {
        allowed: v[0] == 1,
        remaining: u64::try_from(v[1]).unwrap(),
        reset_ms: u64::try_from(v[2]).unwrap(),
        now_ms: v[3],
        booked: v[4] == 1,
    }
}

/// A refund with a fresh id; whether it changed the bucket.
fn refund(
    conn: &mut Connection,
    scripts: &Lua,
    key: &str,
    n: u64,
    policy: Policy,
    booked_at: i64,
) -> bool {
    static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let v = eval(conn, scripts, key, Argv::refund(n, policy, booked_at, id));
    assert_eq!(v.len(), 2, "{v:?}");
    v[0] == 1
}

/// `algorithm` with `limit` per `unit`, burst `limit`.
fn policy(algorithm: Algorithm, limit: u32, unit: Unit) -> Policy {
    Policy {
        algorithm,
        ..Policy::fixed_window(limit, unit)
    }
}

/// Writes since the server started: `rdb_changes_since_last_save` counts every change to
/// the dataset (saving is off, so it never resets).
fn writes(server: &RedisServer) -> u64 {
    server
        .info_field("persistence", "rdb_changes_since_last_save")
        .unwrap()
        .parse()
        .unwrap()
}

/// The bucket's lock as the script stores it (docs/algorithms.md#lockout): the `lk` field,
/// or the sliding log's `lock` member scored `-locked_until`; 0 when there is none.
fn locked_until(conn: &mut Connection, algorithm: Algorithm, key: &str) -> i64 {
    if algorithm == Algorithm::SlidingLog {
        let score: Option<f64> = conn.zscore(key, "lock").unwrap();
        score.map_or(0, |s| -s as i64)
    } else {
        let lk: Option<i64> = conn.hget(key, "lk").unwrap();
        lk.unwrap_or(0)
    }
}

/// Every vector of the table on the Lua scripts and on the function library, each on its
/// own key of one server: the same steps and expectations that tests/algorithms.rs runs on
/// the Rust algorithms.
#[test]
fn every_vector_holds_on_the_lua_scripts() {
    every_vector_holds_on(Engine::Redis);
}

/// Every vector on an `engine` node, through `EVALSHA` and through Functions (`FUNCTION
/// LOAD`, `FCALL`).
pub(crate) fn every_vector_holds_on(engine: Engine) {
    let server = RedisServer::start_engine(engine, &[]);
    let mut conn = connect(&server);
    for scripting in PATHS {
        let clock = Arc::new(ManualClock::new(START));
        let scripts = Lua::load(&mut conn, ScriptSet::pinned(clock.clone()), scripting);
        every_vector_holds(&server, &mut conn, &clock, &scripts);
    }
    let calls = |command| server.calls_of(command);
    assert!(calls("evalsha") > 0 && calls("fcall") > 0);
}

fn every_vector_holds(
    server: &RedisServer,
    conn: &mut Connection,
    clock: &ManualClock,
    scripts: &Lua,
) {
    let path = format!("{:?}", scripts.scripting);
    for (n, case) in vectors::cases().into_iter().enumerate() {
        let key = format!("fg:{{vector-{path}-{n}}}");
        let policy = case.policy;
        for (i, step) in case.steps.iter().enumerate() {
            let context = format!("{}, step {}", case.name, i + 1);
            clock.set(step.at_ms);
            let before = writes(server);
            let (mut seen, refund_changed) = match step.action {
                Action::Charge { cost, spread_ms } => {
                    let r = charge(conn, scripts, &key, Argv::spent(cost, policy, spread_ms));
                    assert_eq!(r.now_ms, step.at_ms, "{context}: the pinned time");
                    let seen = Observed {
                        allowed: Some(r.allowed),
                        remaining: Some(r.remaining),
                        reset_ms: Some(r.reset_ms),
                        booked: Some(r.booked),
                        ..Observed::default()
                    };
                    (seen, None)
                }
                Action::Refund { cost, booked_at_ms } => {
                    let changed = refund(conn, scripts, &key, cost, policy, booked_at_ms);
                    (Observed::default(), Some(changed))
                }
            };
            seen.changed = writes(server) != before;
            if let Some(changed) = refund_changed {
                assert_eq!(changed, seen.changed, "{context}: reply vs writes");
            }
            seen.locked_until_ms = locked_until(conn, policy.algorithm, &key);
            seen.expires_at_ms = redis::cmd("PEXPIRETIME").arg(&key).query(conn).unwrap();
            step.expect.check(&seen, &context);
        }
    }
}

#[test]
fn every_write_sets_a_ttl_and_only_the_bucket_key_exists() {
    let server = RedisServer::start();
    let mut conn = connect(&server);
    for scripting in PATHS {
        let scripts = Lua::load(&mut conn, ScriptSet::new(), scripting);
        every_write_sets_a_ttl(&mut conn, &scripts);
    }
}

fn every_write_sets_a_ttl(conn: &mut Connection, scripts: &Lua) {
    for algorithm in Algorithm::ALL {
        let _: () = redis::cmd("FLUSHALL").query(conn).unwrap();
        let key = format!("fg:{{ttl-{algorithm}}}");
        let p = policy(algorithm, 3, Unit::Second);
        let mut booked_at = Vec::new();
        // Allow, deny, peek, consume, lockout and refunds, checking the key after each.
        let steps: [(u64, bool, u64); 7] = [
            (1, false, 0),
            (2, false, 0),
            (1, false, 0),
            (0, false, 0),
            (1, algorithm != Algorithm::SlidingLog, 0),
            (5, false, 4_000),
            (0, false, 4_000),
        ];
        for (n, consume, lockout) in steps {
            let step = Policy {
                on_over_limit: if consume {
                    OnOverLimit::Consume
                } else {
                    OnOverLimit::Reject
                },
                lockout: Some(Duration::from_millis(lockout)).filter(|_| lockout > 0),
                ..p
            };
            let r = charge(conn, scripts, &key, Argv::charge(n, step));
            if r.booked {
                booked_at.push((n, r.now_ms));
            }
            check_key(conn, &key, 4_000 + 2 * 1_000);
        }
        for (n, at) in booked_at {
            refund(conn, scripts, &key, n, p, at);
            check_key(conn, &key, 4_000 + 2 * 1_000);
        }
    }

    fn check_key(conn: &mut Connection, key: &str, max_ttl: i64) {
        let keys: Vec<String> = conn.keys("*").unwrap();
        assert!(keys.iter().all(|k| k == key), "stray keys: {keys:?}");
        if !keys.is_empty() {
            // 0: under a millisecond left; -2: it expired since KEYS. -1 (no TTL) fails.
            let ttl: i64 = conn.pttl(key).unwrap();
            assert!(
                ttl == -2 || (0..=max_ttl).contains(&ttl),
                "{key}: ttl {ttl}"
            );
        }
    }
}

/// Bookings older than W are not live: a seeded old one (counted in the total) does not
/// count, and the next call drops it, total included.
#[test]
fn sliding_log_drops_members_that_left_the_window() {
    let server = RedisServer::start();
    let mut conn = connect(&server);
    let clock = Arc::new(ManualClock::new(START));
    let scripts = Lua::load(
        &mut conn,
        ScriptSet::pinned(clock.clone()),
        Scripting::Evalsha,
    );
    let p = policy(Algorithm::SlidingLog, 5, Unit::Minute);
    let key = "fg:{log}";
    assert!(charge(&mut conn, &scripts, key, Argv::charge(2, p)).allowed);
    clock.set(START + 10_000);
    let old = START + 10_000 - 60_000;
    let _: () = conn.zadd(key, format!("{old}:1"), old).unwrap();
    let _: f64 = conn.zincr(key, "total", -1).unwrap();
    let g = charge(&mut conn, &scripts, key, Argv::charge(0, p));
    assert_eq!(g.remaining, 3);
    let gone: Option<f64> = conn.zscore(key, format!("{old}:1")).unwrap();
    assert_eq!(gone, None);
    let total: Option<f64> = conn.zscore(key, "total").unwrap();
    assert_eq!(total, Some(-2.0));
}

/// The ARGV of a valid charge (cost 5, W = 1000, L = 2, B = 3) with the word `from` (one
/// field's value, unique among the words) replaced by `to`, or dropped for `None`.
fn spoiled(argv: Argv, from: &str, to: Option<&str>) -> Vec<String> {
    let words: Vec<String> = redis::ToRedisArgs::to_redis_args(&argv)
        .into_iter()
        .map(|w| String::from_utf8(w).unwrap())
        .collect();
    assert_eq!(words.iter().filter(|w| *w == from).count(), 1, "{from}");
    words
        .into_iter()
        .filter_map(|w| {
            if w == from {
                to.map(String::from)
            } else {
                Some(w)
            }
        })
        .collect()
}

#[test]
fn bad_arguments_are_errors_not_decisions() {
    let server = RedisServer::start();
    let mut conn = connect(&server);
    let scripts = ScriptSet::new();
    let run = |conn: &mut Connection, algorithm, argv: &[String]| {
        let mut invocation = scripts.get(algorithm).key("fg:{bad}");
        invocation.arg(argv);
        invocation.invoke::<Vec<i64>>(conn)
    };
    for algorithm in Algorithm::ALL {
        let p = Policy {
            burst: 3,
            ..policy(algorithm, 2, Unit::Second)
        };
        let valid = Argv::charge(5, p);
        // Cost not a number, W = 0, L = 0, negative cost, unknown op.
        for (from, to) in [
            ("5", "x"),
            ("1000", "0"),
            ("2", "0"),
            ("5", "-1"),
            ("charge", "launch"),
        ] {
            let argv = spoiled(valid, from, Some(to));
            let err = run(&mut conn, algorithm, &argv)
                .expect_err(&format!("{algorithm} accepted {argv:?}"));
            assert!(err.to_string().contains("floodgate"), "{err}");
        }
        // A refund needs an id of decimal digits, and the instant of its booking.
        let refund = Argv::refund(1, p, 777_777, 424_242);
        for id in [None, Some(""), Some("x1"), Some("123456789012345678901")] {
            let argv = spoiled(refund, "424242", id);
            let err = run(&mut conn, algorithm, &argv).expect_err("no id");
            assert!(err.to_string().contains("refund id"), "{algorithm}: {err}");
        }
        for at in [Some("x"), Some("")] {
            let argv = spoiled(refund, "777777", at);
            let err = run(&mut conn, algorithm, &argv).expect_err("no booked_at");
            assert!(
                err.to_string().contains("bad booked_at"),
                "{algorithm}: {err}"
            );
        }
    }
    let too_long = Argv::charge(1, policy(Algorithm::SlidingLog, 10_001, Unit::Second));
    let mut invocation = scripts.get(Algorithm::SlidingLog).key("fg:{bad}");
    invocation.arg(too_long);
    assert!(invocation.invoke::<Vec<i64>>(&mut conn).is_err());
}

#[test]
fn scripts_use_no_float_replies_or_undeclared_keys() {
    for algorithm in Algorithm::ALL {
        let src = source(algorithm);
        // Every access goes through `key` (KEYS[1]); no second key, no clock-derived key.
        assert_eq!(
            src.matches("KEYS[").count(),
            2,
            "{algorithm}: header + one use"
        );
        assert!(
            !src.contains("tostring("),
            "{algorithm}: tostring rounds to 14 digits"
        );
    }
}

/// Writes what Redis runs, as assembled from `lua/`, to `target/lua-assembled/`: each
/// algorithm's script, the batch script and the function library, for a reader to open.
#[test]
fn assembled_scripts_are_written_under_target() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target dir holds tmp/")
        .join("lua-assembled");
    std::fs::create_dir_all(&dir).unwrap();
    let assembled = ScriptSet::new().assembled();
    assert_eq!(assembled.len(), Algorithm::ALL.len() + 2);
    for (name, code) in assembled {
        let path = dir.join(&name);
        std::fs::write(&path, &code).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), code, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_values_get_distinct_keys_spread_over_the_cluster() {
    let cluster = RedisCluster::start_async().await;
    let backend = cluster.backend().await;
    let long = "v".repeat(4096);
    let mut values: Vec<String> = vec![
        "{".into(),
        "}".into(),
        "{}".into(),
        "}{".into(),
        "{a}".into(),
        "a}{b".into(),
        ":".into(),
        "fg:{x}".into(),
        "\u{1F600}".into(),
        "\0".into(),
        "".into(),
        long.clone(),
        long[..4095].into(),
    ];
    values.extend((0..51).map(|i| format!("user-{i}")));
    let policy = Policy::fixed_window(10, Unit::Hour);
    let charges: Vec<Charge> = values
        .iter()
        .map(|v| Charge {
            bucket: BucketKey::new("api", "user", [("user", v.as_str())], &policy),
            policy,
            cost: 1,
            spread_ms: 0,
        })
        .collect();
    let outcomes = backend.charge(&charges).await.unwrap();
    assert!(outcomes.iter().all(|o| o.allowed && o.remaining == 9));
    assert_eq!(
        cluster.total_keys(),
        values.len() as u64,
        "one key per bucket"
    );
    for master in cluster.masters() {
        let keys: u64 = master.cli(&["DBSIZE"]).parse().unwrap();
        assert!(keys > 0, "master {} got no bucket", master.port());
    }
    let slots: std::collections::HashSet<String> = charges
        .iter()
        .map(|c| {
            let node = &cluster.nodes()[0];
            node.cli(&["CLUSTER", "KEYSLOT", &c.bucket.redis_key("fg")])
        })
        .collect();
    assert!(slots.len() > values.len() * 9 / 10, "{} slots", slots.len());
}

/// `SCRIPT FLUSH` (scripts) or `FUNCTION FLUSH` (library) while requests run: a call that
/// finds its code gone did not run, and runs again in the same call after the reload, so no
/// decision fails and none books twice. Refunds (one call per bucket) reload as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_mid_run_is_reloaded_without_a_failed_decision_or_double_booking() {
    const ROUNDS: u64 = 20;
    const CALLERS: u64 = 8;
    let server = RedisServer::start();
    let mut conn = connect(&server);
    for (scripting, flush) in [
        (Scripting::Evalsha, "SCRIPT"),
        (Scripting::Functions, "FUNCTION"),
    ] {
        let options = RedisOptions {
            scripting,
            key_prefix: flush.to_lowercase(),
            ..RedisOptions::default()
        };
        let backend = Arc::new(RedisBackend::connect(&server.url(), options).await.unwrap());
        let loaded = || code_loaded(&server, scripting);
        assert!(loaded(), "connect loads the code ({scripting:?})");
        let policy = |algorithm| Policy {
            algorithm,
            ..Policy::fixed_window(1_000, Unit::Hour)
        };
        let charges = |caller: u64| -> Vec<Charge> {
            let value = caller.to_string();
            Algorithm::ALL
                .iter()
                .map(|&a| Charge {
                    bucket: BucketKey::new("api", "flush", [("k", value.as_str())], &policy(a)),
                    policy: policy(a),
                    cost: 1,
                    spread_ms: 0,
                })
                .collect()
        };
        for round in 0..ROUNDS {
            if round == ROUNDS / 2 {
                server.cli(&[flush, "FLUSH"]);
                assert!(!loaded(), "{flush} FLUSH dropped the code");
            }
            let calls = (0..CALLERS).map(|caller| {
                let backend = Arc::clone(&backend);
                let charges = charges(caller);
                tokio::spawn(async move { backend.charge(&charges).await })
            });
            for call in futures::future::join_all(calls).await {
                let outcomes = call.unwrap().expect("no decision fails after a flush");
                assert!(outcomes.iter().all(|o| o.allowed && o.booked));
            }
        }
        assert!(loaded(), "the first call after the flush reloaded the code");
        server.cli(&[flush, "FLUSH"]);
        let booked = backend.charge(&charges(0)).await.unwrap();
        let refunds: Vec<Refund> = charges(0)
            .iter()
            .zip(&booked)
            .map(|(c, o)| Refund::new(c.bucket, c.policy, 1, o.now_ms))
            .collect();
        server.cli(&[flush, "FLUSH"]);
        backend
            .refund(&refunds)
            .await
            .expect("a refund reloads too");
        for caller in 0..CALLERS {
            let peeks: Vec<Charge> = charges(caller)
                .into_iter()
                .map(|c| Charge { cost: 0, ..c })
                .collect();
            for (o, a) in backend
                .charge(&peeks)
                .await
                .unwrap()
                .iter()
                .zip(Algorithm::ALL)
            {
                assert_eq!(
                    o.remaining,
                    1_000 - ROUNDS,
                    "{a} of caller {caller}: once each"
                );
            }
        }
        let _: () = redis::cmd("FLUSHALL").query(&mut conn).unwrap();
    }
}

/// Whether the server holds the code that `scripting` calls: the batch script, or a
/// floodgate function library.
fn code_loaded(server: &RedisServer, scripting: Scripting) -> bool {
    match scripting {
        Scripting::Functions => {
            let name = ScriptSet::new().library_name().to_owned();
            server
                .cli(&["FUNCTION", "LIST", "LIBRARYNAME", &name])
                .contains(&name)
        }
        _ => server.cli(&["SCRIPT", "EXISTS", ScriptSet::new().batch().get_hash()]) == "1",
    }
}

/// The table's thousands-of-units vector checks the answers; here the stored members.
#[test]
fn sliding_log_keeps_one_member_per_booking_whatever_its_cost() {
    // Lua's unpack caps the arguments of one call; the script slices ZADD and ZREM.
    let server = RedisServer::start();
    let mut conn = connect(&server);
    let scripts = Lua::load(&mut conn, ScriptSet::new(), Scripting::Functions);
    let p = policy(Algorithm::SlidingLog, 10_000, Unit::Minute);
    let key = "fg:{big-log}";
    assert!(charge(&mut conn, &scripts, key, Argv::charge(9_999, p)).allowed);
    assert!(charge(&mut conn, &scripts, key, Argv::charge(1, p)).allowed);
    // One member per booking (two here, or one when both came in the same ms) and the total.
    let members: u64 = conn.zcard(key).unwrap();
    assert!(members <= 3, "{members} members");
}

/// Issue 9 item 2: a cost-10,000 booking on a 10,000/hour sliding log is one member, not
/// 10,000 (1.3 MB before), so it takes under 8 KiB of Redis memory.
#[test]
fn sliding_log_memory_does_not_grow_with_the_cost() {
    let server = RedisServer::start();
    let mut conn = connect(&server);
    let key = "fg:{log-memory}";
    let p = policy(Algorithm::SlidingLog, 10_000, Unit::Hour);
    let scripts = Lua::load(&mut conn, ScriptSet::new(), Scripting::Functions);
    let booked = charge(&mut conn, &scripts, key, Argv::charge(10_000, p));
    assert!(booked.allowed && booked.booked);
    let bytes: u64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .query(&mut conn)
        .unwrap();
    assert!(bytes < 8 * 1024, "{bytes} bytes");
}

/// Issue 9 item 4: the same refund delivered twice changes the bucket once, for every
/// algorithm, on any backend. Two bookings of 2 (L = B = 5 per day); the first one's
/// refund, sent twice, leaves the second booked: 3 remain, not 5.
async fn refund_applies_once(backend: &dyn Backend) {
    for algorithm in Algorithm::ALL {
        let policy = Policy {
            algorithm,
            ..Policy::fixed_window(5, Unit::Day)
        };
        let bucket = BucketKey::new("api", "twice", [("k", "v")], &policy);
        let charge = Charge {
            bucket,
            policy,
            cost: 2,
            spread_ms: 0,
        };
        let first = backend.charge(std::slice::from_ref(&charge)).await.unwrap()[0];
        let second = backend.charge(std::slice::from_ref(&charge)).await.unwrap()[0];
        assert!(first.booked && second.booked, "{algorithm}");
        let refund = Refund::new(bucket, policy, 2, first.now_ms);
        backend.refund(std::slice::from_ref(&refund)).await.unwrap();
        backend.refund(&[refund]).await.unwrap();
        let peek = Charge { cost: 0, ..charge };
        let after = backend.charge(&[peek]).await.unwrap()[0];
        assert_eq!(after.remaining, 3, "{algorithm} on {}", backend.name());
    }
}

#[tokio::test]
async fn refund_delivered_twice_applies_once_on_redis_and_memory() {
    let server = RedisServer::start();
    let backend = floodgate::backend::RedisBackend::connect(&server.url(), RedisOptions::default())
        .await
        .unwrap();
    refund_applies_once(&backend).await;
    refund_applies_once(&floodgate::backend::memory::MemoryBackend::new(1_000)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refund_delivered_twice_applies_once_on_redis_cluster() {
    let cluster = RedisCluster::start_async().await;
    refund_applies_once(&cluster.backend().await).await;
}

/// Issue 20 item 3: a log holding more than its (lowered) limit is not walked; a denial
/// waits until the newest booking leaves, as the Rust twin answers
/// (`a_log_over_a_lowered_limit_waits_for_the_newest`), so no denial reads more than
/// `wait_reads` members. At the limit again, the wait is exact.
#[test]
fn a_log_over_a_lowered_limit_waits_for_the_newest() {
    let server = RedisServer::start();
    let mut conn = connect(&server);
    let clock = Arc::new(ManualClock::new(START));
    for scripting in PATHS {
        let lua = Lua::load(&mut conn, ScriptSet::pinned(clock.clone()), scripting);
        let key = format!("fg:{{lowered-{scripting:?}}}");
        let (ten, five) = (
            policy(Algorithm::SlidingLog, 10, Unit::Minute),
            policy(Algorithm::SlidingLog, 5, Unit::Minute),
        );
        clock.set(START);
        for _ in 0..10 {
            assert!(charge(&mut conn, &lua, &key, Argv::charge(1, ten)).allowed);
            clock.advance(1);
        }
        let denied = charge(&mut conn, &lua, &key, Argv::charge(1, five));
        assert_eq!((denied.allowed, denied.reset_ms), (false, 59_999));
        assert_eq!(
            charge(&mut conn, &lua, &key, Argv::charge(0, five)).reset_ms,
            59_999
        );
        let exact = charge(&mut conn, &lua, &key, Argv::charge(1, ten));
        assert_eq!((exact.allowed, exact.reset_ms), (false, 59_990));
    }
}
