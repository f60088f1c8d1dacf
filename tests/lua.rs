//! The Lua scripts against a real `redis-server`: their contract (one key, TTL on every
//! write, integer replies, argument checks), the vectors of docs/algorithms.md#test-vectors that
//! real time allows, and the reload after `SCRIPT FLUSH`.
//!
//! Time comes from the server's clock, so expectations are computed from the `now_ms` each
//! reply carries; states that need time to pass are seeded into the bucket's hash instead.

mod common;

use common::redis::{RedisCluster, RedisServer};
use floodgate::backend::redis::scripts::{ScriptSet, source};
use floodgate::backend::{Backend, BucketKey, Charge, RedisOptions, Refund};
use floodgate::rules::{Algorithm, Policy, Unit};
use redis::{Commands, Connection};

/// A charge reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reply {
    allowed: bool,
    remaining: i64,
    reset_ms: i64,
    now_ms: i64,
    booked: bool,
}

fn connect(server: &RedisServer) -> Connection {
    redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap()
}

/// Runs a script by EVALSHA (loading it first when needed) with the common ARGV.
fn eval(conn: &mut Connection, algorithm: Algorithm, key: &str, argv: &[&str]) -> Vec<i64> {
    let scripts = ScriptSet::new();
    let mut invocation = scripts.get(algorithm).key(key);
    for arg in argv {
        invocation.arg(*arg);
    }
    invocation.invoke(conn).unwrap()
}

/// `charge n` with W, L, B, consume, lockout.
fn charge(
    conn: &mut Connection,
    algorithm: Algorithm,
    key: &str,
    n: u64,
    (w, l, b): (u64, u64, u64),
    consume: bool,
    lockout_ms: u64,
) -> Reply {
    let args = [
        "charge".to_owned(),
        n.to_string(),
        w.to_string(),
        l.to_string(),
        b.to_string(),
        if consume { "1" } else { "0" }.to_owned(),
        lockout_ms.to_string(),
        "0".to_owned(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let v = eval(conn, algorithm, key, &args);
    assert_eq!(v.len(), 5, "{v:?}");
    assert!(v[0] == 0 || v[0] == 1);
    assert!(v[4] == 0 || v[4] == 1);
    Reply {
        allowed: v[0] == 1,
        remaining: v[1],
        reset_ms: v[2],
        now_ms: v[3],
        booked: v[4] == 1,
    }
}

/// A refund with a fresh id.
fn refund(
    conn: &mut Connection,
    algorithm: Algorithm,
    key: &str,
    n: u64,
    p: (u64, u64, u64),
    booked_at: i64,
) -> bool {
    static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    refund_with_id(conn, algorithm, key, n, p, booked_at, id)
}

fn refund_with_id(
    conn: &mut Connection,
    algorithm: Algorithm,
    key: &str,
    n: u64,
    (w, l, b): (u64, u64, u64),
    booked_at: i64,
    id: u64,
) -> bool {
    let args = [
        "refund".to_owned(),
        n.to_string(),
        w.to_string(),
        l.to_string(),
        b.to_string(),
        "0".to_owned(),
        "0".to_owned(),
        booked_at.to_string(),
        id.to_string(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let v = eval(conn, algorithm, key, &args);
    assert_eq!(v.len(), 2, "{v:?}");
    v[0] == 1
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

/// Whether every instant lies in one window of `w` ms. Real time can cross a boundary
/// mid-sequence; tests then run the sequence again on a fresh key (a few times at most).
fn one_window(w: i64, nows: &[i64]) -> bool {
    nows.iter().all(|now| now / w == nows[0] / w)
}

const ROUNDS: usize = 5;

#[test]
fn fixed_window_spec_vector() {
    let server = RedisServer::start();
    let mut conn = connect(&server);
    let w = 60_000;
    let p = (60_000, 5, 5);
    let fw = Algorithm::FixedWindow;
    for round in 0..=ROUNDS {
        assert!(round < ROUNDS, "every round crossed a window boundary");
        let key = format!("fg:{{fixed-{round}}}");
        let end = |now: i64| (now / w + 1) * w - now;
        let a = charge(&mut conn, fw, &key, 2, p, false, 0);
        let b = charge(&mut conn, fw, &key, 4, p, false, 0);
        let c = charge(&mut conn, fw, &key, 3, p, false, 0);
        let d = charge(&mut conn, fw, &key, 0, p, false, 0);
        if !one_window(w, &[a.now_ms, b.now_ms, c.now_ms, d.now_ms]) {
            continue;
        }
        assert!(a.allowed && a.booked);
        assert_eq!((a.remaining, a.reset_ms), (3, end(a.now_ms)));
        assert!(!b.allowed && !b.booked, "{b:?}");
        assert_eq!((b.remaining, b.reset_ms), (0, end(b.now_ms)));
        assert!(c.allowed);
        assert_eq!((c.remaining, c.reset_ms), (0, end(c.now_ms)));
        assert!(!d.allowed && !d.booked);
        assert_eq!((d.remaining, d.reset_ms), (0, end(d.now_ms)));
        break;
    }

    // "next window n=1 OK rem 4": seed a full previous window instead of waiting a minute.
    let key = "fg:{fixed-next}";
    let now = charge(&mut conn, fw, key, 0, p, false, 0).now_ms;
    let _: () = conn
        .hset_multiple(key, &[("w", now / w - 1), ("c", 5), ("lk", 0)])
        .unwrap();
    let next = charge(&mut conn, fw, key, 1, p, false, 0);
    assert!(next.allowed);
    assert_eq!(next.remaining, 4);
}

#[test]
fn token_bucket_spec_vectors() {
    let server = RedisServer::start();
    let mut conn = connect(&server);
    let tb = Algorithm::TokenBucket;
    // L = 60/minute, B = 60: U = 1000 units per request, leak 1 unit per ms, C = 60000.
    let p = (60_000, 60, 60);
    let key = "fg:{tb-minute}";
    let a = charge(&mut conn, tb, key, 10, p, false, 0);
    assert!(a.allowed);
    assert_eq!((a.remaining, a.reset_ms), (50, 10_000));
    let b = charge(&mut conn, tb, key, 51, p, false, 0);
    let dt = b.now_ms - a.now_ms;
    assert!(!b.allowed && !b.booked);
    assert_eq!(b.reset_ms, 1_000 - dt, "until 1000 units leaked");
    let c = charge(&mut conn, tb, key, 50, p, false, 0);
    let dt = c.now_ms - a.now_ms;
    assert!(c.allowed);
    assert_eq!(c.remaining, dt / 1_000);
    assert_eq!(c.reset_ms, 60_000 - dt);
    assert_eq!((c.reset_ms + 999) / 1000, 60);

    // "+30500 ms": a full bucket stored 30.5 s ago holds 29500 units now.
    let _: () = conn
        .hset_multiple(key, &[("u", 60_000), ("t", c.now_ms - 30_500), ("lk", 0)])
        .unwrap();
    let d = charge(&mut conn, tb, key, 31, p, false, 0);
    let dt = d.now_ms - c.now_ms;
    assert!(!d.allowed);
    assert_eq!(d.reset_ms, 500 - dt);
    let e = charge(&mut conn, tb, key, 30, p, false, 0);
    let dt = e.now_ms - c.now_ms;
    assert!(e.allowed);
    assert_eq!((e.remaining, e.reset_ms), (0, 59_500 - dt));

    // L = 10/second: ten at once, then the eleventh waits ~100 ms. One pipeline keeps the
    // leak between them well under one request's 100 units.
    let key = "fg:{tb-second}";
    let scripts = ScriptSet::new();
    let _: String = scripts.get(tb).load(&mut conn).unwrap();
    let mut pipe = redis::pipe();
    for _ in 0..11 {
        pipe.cmd("EVALSHA")
            .arg(scripts.get(tb).get_hash())
            .arg(1)
            .arg(key)
            .arg(&["charge", "1", "1000", "10", "10", "0", "0", "0"]);
    }
    let replies: Vec<Vec<i64>> = pipe.query(&mut conn).unwrap();
    let span = replies[10][3] - replies[0][3];
    assert!(span < 100, "pipeline took {span} ms");
    for (i, r) in replies[..10].iter().enumerate() {
        assert_eq!((r[0], r[1]), (1, 9 - i as i64), "request {i}");
    }
    assert_eq!(replies[10][0], 0);
    assert_eq!(replies[10][2], 100 - span);
}

/// Issue 9's example, L = 10/s, B = 10 (U = 100 units, leak 1 per ms): X books 1 at t,
/// Y books 9 at t + 100 ms, so the bucket holds Y's 900 units. X's refund at t + 100 ms
/// gives nothing back (X's units leaked meanwhile): one request fits, as without X.
#[test]
fn token_bucket_refund_gives_back_nothing_that_has_leaked() {
    let server = RedisServer::start();
    let mut conn = connect(&server);
    let tb = Algorithm::TokenBucket;
    let p = (1_000, 10, 10);
    let key = "fg:{tb-refund}";
    let now = charge(&mut conn, tb, key, 0, p, false, 0).now_ms;
    let _: () = conn
        .hset_multiple(key, &[("u", 900), ("t", now), ("lk", 0)])
        .unwrap();
    assert!(!refund(&mut conn, tb, key, 1, p, now - 100));
    let peek = charge(&mut conn, tb, key, 0, p, false, 0);
    assert_eq!(peek.remaining, 1 + (peek.now_ms - now) / 100);
    // A booking that has not leaked at all comes back whole.
    let y = charge(&mut conn, tb, key, 1, p, false, 0);
    assert!(refund(&mut conn, tb, key, 1, p, y.now_ms + 1_000));
    let after = charge(&mut conn, tb, key, 0, p, false, 0);
    assert_eq!(after.remaining, 1 + (after.now_ms - now) / 100);
}

#[test]
fn sliding_window_seeded_vector() {
    let server = RedisServer::start();
    let mut conn = connect(&server);
    let sw = Algorithm::SlidingWindow;
    let (w, l) = (60_000i64, 10i64);
    let p = (60_000, 10, 10);
    // p = 8, c = 3 in the current window; e is wherever the clock is.
    for round in 0..=ROUNDS {
        assert!(round < ROUNDS, "every round crossed a window boundary");
        let key = format!("fg:{{sw-{round}}}");
        let now = charge(&mut conn, sw, &key, 0, p, false, 0).now_ms;
        let _: () = conn
            .hset_multiple(&key, &[("w", now / w), ("c", 3), ("p", 8), ("lk", 0)])
            .unwrap();
        let a = charge(&mut conn, sw, &key, 1, p, false, 0);
        let b = charge(&mut conn, sw, &key, 1, p, false, 0);
        if !one_window(w, &[now, a.now_ms, b.now_ms]) {
            continue;
        }
        let elapsed = |r: &Reply| r.now_ms - (r.now_ms / w) * w;
        let weight = |r: &Reply| 8 * (w - elapsed(r));
        if weight(&a) + 4 * w <= l * w {
            // e >= 15000, as in docs/algorithms.md#test-vectors (e = 15000 gives remaining 0 and
            // R = 45000).
            assert!(a.allowed, "{a:?}");
            assert_eq!(a.remaining, (l * w - weight(&a) - 4 * w) / w);
            assert_eq!(a.reset_ms, w - elapsed(&a));
            if weight(&b) + 5 * w > l * w {
                assert!(!b.allowed);
                // ceil((p*(W-e) - (L-c-n)*W) / p): 7500 at e = 15000.
                assert_eq!(b.reset_ms, (weight(&b) - 5 * w + 7) / 8);
            } else {
                assert!(b.allowed);
            }
        } else {
            assert!(!a.allowed && !a.booked, "{a:?}");
            assert_eq!(a.reset_ms, (weight(&a) - 6 * w + 7) / 8);
        }
        break;
    }
}

#[test]
fn sliding_log_admits_exactly_and_waits_for_the_oldest() {
    let server = RedisServer::start();
    let mut conn = connect(&server);
    let sl = Algorithm::SlidingLog;
    let p = (60_000, 5, 5);
    let key = "fg:{log}";
    let a = charge(&mut conn, sl, key, 2, p, false, 0);
    assert!(a.allowed);
    assert_eq!((a.remaining, a.reset_ms), (3, 60_000));
    let b = charge(&mut conn, sl, key, 3, p, false, 0);
    assert_eq!((b.allowed, b.remaining, b.reset_ms), (true, 0, 60_000));
    // One unit must leave: the oldest two were booked at a.now_ms.
    let c = charge(&mut conn, sl, key, 1, p, false, 0);
    assert!(!c.allowed && !c.booked);
    assert_eq!(c.reset_ms, a.now_ms + 60_000 - c.now_ms);
    // Three must leave: the third oldest unit is from b.
    let d = charge(&mut conn, sl, key, 3, p, false, 0);
    assert_eq!(d.reset_ms, b.now_ms + 60_000 - d.now_ms);
    // Never fits: until the newest leaves.
    let e = charge(&mut conn, sl, key, 6, p, false, 0);
    assert_eq!(e.reset_ms, b.now_ms + 60_000 - e.now_ms);
    // Refund of b gives its three units back.
    assert!(refund(&mut conn, sl, key, 3, p, b.now_ms));
    let f = charge(&mut conn, sl, key, 0, p, false, 0);
    assert_eq!((f.allowed, f.remaining), (true, 3));
    assert_eq!(f.reset_ms, a.now_ms + 60_000 - f.now_ms);
    // Bookings older than W are not live: a seeded old one (counted in the total) does not
    // count, and the next call drops it.
    let _: () = conn
        .zadd(key, format!("{}:1", f.now_ms - 60_000), f.now_ms - 60_000)
        .unwrap();
    let _: f64 = conn.zincr(key, "total", -1).unwrap();
    let g = charge(&mut conn, sl, key, 0, p, false, 0);
    assert_eq!(g.remaining, 3);
    let old: Option<f64> = conn
        .zscore(key, format!("{}:1", f.now_ms - 60_000))
        .unwrap();
    assert_eq!(old, None);
    let total: Option<f64> = conn.zscore(key, "total").unwrap();
    assert_eq!(total, Some(-2.0));
}

#[test]
fn lockout_denies_for_its_length_and_consume_books_denials() {
    let server = RedisServer::start();
    let mut conn = connect(&server);
    for algorithm in Algorithm::ALL {
        let p = (60_000, 2, 2);
        let key = format!("fg:{{lock-{algorithm}}}");
        assert!(charge(&mut conn, algorithm, &key, 2, p, false, 90_000).allowed);
        let trip = charge(&mut conn, algorithm, &key, 1, p, false, 90_000);
        assert!(!trip.allowed && !trip.booked, "{algorithm}: {trip:?}");
        assert_eq!(trip.reset_ms, 90_000, "{algorithm}");
        let locked = charge(&mut conn, algorithm, &key, 0, p, false, 90_000);
        assert!(!locked.allowed);
        assert_eq!(locked.reset_ms, 90_000 - (locked.now_ms - trip.now_ms));
        // Denials during the lock do not extend it.
        let again = charge(&mut conn, algorithm, &key, 1, p, false, 90_000);
        assert_eq!(again.reset_ms, 90_000 - (again.now_ms - trip.now_ms));
        // The key outlives the lock (and a sliding window's two windows).
        let ttl: i64 = conn.pttl(&key).unwrap();
        let lock_left = 90_000 - (again.now_ms - trip.now_ms);
        assert!(
            ttl >= lock_left - 50 && ttl <= 120_000,
            "{algorithm}: ttl {ttl}"
        );
    }
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::TokenBucket,
        Algorithm::SlidingWindow,
    ] {
        let p = (60_000, 2, 2);
        let key = format!("fg:{{consume-{algorithm}}}");
        assert!(charge(&mut conn, algorithm, &key, 2, p, true, 0).allowed);
        let over = charge(&mut conn, algorithm, &key, 1, p, true, 0);
        assert!(!over.allowed && over.booked, "{algorithm}: {over:?}");
        // A bigger-than-burst cost never fits: the token bucket books nothing then.
        let huge = charge(&mut conn, algorithm, &key, 3, p, true, 0);
        assert_eq!(
            huge.booked,
            algorithm != Algorithm::TokenBucket,
            "{algorithm}"
        );
    }
}

#[test]
fn every_write_sets_a_ttl_and_only_the_bucket_key_exists() {
    let server = RedisServer::start();
    let mut conn = connect(&server);
    for algorithm in Algorithm::ALL {
        let _: () = redis::cmd("FLUSHALL").query(&mut conn).unwrap();
        let key = format!("fg:{{ttl-{algorithm}}}");
        let p = (1_000, 3, 3);
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
            let r = charge(&mut conn, algorithm, &key, n, p, consume, lockout);
            if r.booked {
                booked_at.push((n, r.now_ms));
            }
            check_key(&mut conn, &key, 4_000 + 2 * 1_000);
        }
        for (n, at) in booked_at {
            refund(&mut conn, algorithm, &key, n, p, at);
            check_key(&mut conn, &key, 4_000 + 2 * 1_000);
        }
    }

    fn check_key(conn: &mut Connection, key: &str, max_ttl: i64) {
        let keys: Vec<String> = conn.keys("*").unwrap();
        assert!(keys.iter().all(|k| k == key), "stray keys: {keys:?}");
        if !keys.is_empty() {
            let ttl: i64 = conn.pttl(key).unwrap();
            assert!(ttl > 0 && ttl <= max_ttl, "{key}: ttl {ttl}");
        }
    }
}

#[test]
fn peeks_and_rejected_denials_write_nothing() {
    let server = RedisServer::start();
    let mut conn = connect(&server);
    for algorithm in Algorithm::ALL {
        let key = format!("fg:{{quiet-{algorithm}}}");
        let p = (60_000, 2, 2);
        assert!(charge(&mut conn, algorithm, &key, 2, p, false, 0).allowed);
        let before = writes(&server);
        let peek = charge(&mut conn, algorithm, &key, 0, p, false, 0);
        let deny = charge(&mut conn, algorithm, &key, 1, p, false, 0);
        let huge = charge(&mut conn, algorithm, &key, 3, p, false, 0);
        assert!(!peek.allowed && !deny.allowed && !huge.allowed);
        assert_eq!(
            writes(&server),
            before,
            "{algorithm} wrote on a peek or denial"
        );
        // An empty bucket is not created by a peek either.
        let _ = charge(&mut conn, algorithm, "fg:{never}", 0, p, false, 0);
        let exists: bool = conn.exists("fg:{never}").unwrap();
        assert!(!exists);
    }
}

#[test]
fn refunds_undo_only_their_own_booking() {
    let server = RedisServer::start();
    let mut conn = connect(&server);
    for algorithm in Algorithm::ALL {
        let key = format!("fg:{{refund-{algorithm}}}");
        let p = (3_600_000, 4, 4);
        let a = charge(&mut conn, algorithm, &key, 3, p, false, 0);
        assert!(a.allowed);
        assert!(!charge(&mut conn, algorithm, &key, 2, p, false, 0).allowed);
        assert!(refund(&mut conn, algorithm, &key, 2, p, a.now_ms));
        let peek = charge(&mut conn, algorithm, &key, 0, p, false, 0);
        // The token bucket leaks a little meanwhile; at one request per 900 ms it is still
        // 3 after a few ms.
        assert_eq!(peek.remaining, 3, "{algorithm}");
        // A refund naming a booking from an hour-old window changes nothing (in the token
        // bucket: everything it booked has leaked since).
        let stale = refund(&mut conn, algorithm, &key, 1, p, a.now_ms - 3_600_000);
        assert!(!stale, "{algorithm}");
        // Refunding into an empty bucket is a no-op that creates nothing.
        assert!(!refund(&mut conn, algorithm, "fg:{none}", 1, p, a.now_ms));
        let exists: bool = conn.exists("fg:{none}").unwrap();
        assert!(!exists);
    }
}

#[test]
fn bad_arguments_are_errors_not_decisions() {
    let server = RedisServer::start();
    let mut conn = connect(&server);
    let scripts = ScriptSet::new();
    for algorithm in Algorithm::ALL {
        let bad: [&[&str]; 5] = [
            &["charge", "x", "1000", "1", "1", "0", "0", "0"],
            &["charge", "1", "0", "1", "1", "0", "0", "0"],
            &["charge", "1", "1000", "0", "1", "0", "0", "0"],
            &["charge", "-1", "1000", "1", "1", "0", "0", "0"],
            &["launch", "1", "1000", "1", "1", "0", "0", "0"],
        ];
        for argv in bad {
            let mut invocation = scripts.get(algorithm).key("fg:{bad}");
            for a in argv {
                invocation.arg(*a);
            }
            let result: redis::RedisResult<Vec<i64>> = invocation.invoke(&mut conn);
            let err = result.expect_err(&format!("{algorithm} accepted {argv:?}"));
            assert!(err.to_string().contains("floodgate"), "{err}");
        }
    }
    let mut invocation = scripts.get(Algorithm::SlidingLog).key("fg:{bad}");
    invocation.arg(&["charge", "1", "1000", "10001", "1", "0", "0", "0"]);
    assert!(invocation.invoke::<Vec<i64>>(&mut conn).is_err());
    // A refund needs an id of decimal digits.
    for algorithm in Algorithm::ALL {
        for id in [None, Some(""), Some("x1"), Some("123456789012345678901")] {
            let mut invocation = scripts.get(algorithm).key("fg:{bad}");
            invocation.arg(&["refund", "1", "1000", "1", "1", "0", "0", "0"]);
            if let Some(id) = id {
                invocation.arg(id);
            }
            let err = invocation.invoke::<Vec<i64>>(&mut conn).expect_err("no id");
            assert!(err.to_string().contains("refund id"), "{algorithm}: {err}");
        }
    }
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

#[tokio::test]
async fn script_flush_is_reloaded_transparently_without_double_booking() {
    let server = RedisServer::start();
    let backend = floodgate::backend::RedisBackend::connect(&server.url(), RedisOptions::default())
        .await
        .unwrap();
    let policy = |algorithm| Policy {
        algorithm,
        ..Policy::fixed_window(5, Unit::Hour)
    };
    let charges: Vec<Charge> = Algorithm::ALL
        .iter()
        .map(|&a| Charge {
            bucket: BucketKey::new("api", "flush", [("k", "v")], &policy(a)),
            policy: policy(a),
            cost: 1,
        })
        .collect();
    let mut conn = connect(&server);
    let exists = |conn: &mut Connection| -> Vec<bool> {
        redis::cmd("SCRIPT")
            .arg("EXISTS")
            .arg(
                Algorithm::ALL
                    .map(|a| ScriptSet::new().get(a).get_hash().to_owned())
                    .to_vec(),
            )
            .query(conn)
            .unwrap()
    };
    assert_eq!(
        exists(&mut conn),
        vec![true; 4],
        "connect preloads the scripts"
    );
    let first = backend.charge(&charges).await.unwrap();
    assert!(first.iter().all(|o| o.remaining == 4));
    server.cli(&["SCRIPT", "FLUSH"]);
    // The batch script is unknown now: NOSCRIPT means it did not run, and EVAL runs it once.
    let second = backend.charge(&charges).await.unwrap();
    for (o, a) in second.iter().zip(Algorithm::ALL) {
        assert_eq!(o.remaining, 3, "{a} booked once");
    }
    let batch_known: Vec<bool> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(ScriptSet::new().batch().get_hash())
        .query(&mut conn)
        .unwrap();
    assert_eq!(
        batch_known,
        vec![true],
        "EVAL cached the batch script again"
    );
}

#[test]
fn sliding_log_books_and_refunds_thousands_of_units_at_once() {
    // Lua's unpack caps the arguments of one call; the script slices ZADD and ZREM.
    let server = RedisServer::start();
    let mut conn = connect(&server);
    let sl = Algorithm::SlidingLog;
    let p = (60_000, 10_000, 10_000);
    let key = "fg:{big-log}";
    let a = charge(&mut conn, sl, key, 9_999, p, false, 0);
    assert!(a.allowed);
    assert_eq!(a.remaining, 1);
    let b = charge(&mut conn, sl, key, 1, p, false, 0);
    assert_eq!((b.allowed, b.remaining), (true, 0));
    // One member per booking (two here, or one when both came in the same ms) and the total.
    let members: u64 = conn.zcard(key).unwrap();
    assert!(members <= 3, "{members} members");
    assert!(refund(&mut conn, sl, key, 9_999, p, a.now_ms));
    let peek = charge(&mut conn, sl, key, 0, p, false, 0);
    assert_eq!(peek.remaining, 9_999);
    // A full-limit request must wait for the one live unit (b) to leave.
    let over = charge(&mut conn, sl, key, 10_000, p, false, 0);
    assert!(!over.allowed);
    assert_eq!(over.reset_ms, b.now_ms + 60_000 - over.now_ms);
}

/// Issue 9 item 2: a cost-10,000 booking on a 10,000/hour sliding log is one member, not
/// 10,000 (1.3 MB before), so it takes under 8 KiB of Redis memory.
#[test]
fn sliding_log_memory_does_not_grow_with_the_cost() {
    let server = RedisServer::start();
    let mut conn = connect(&server);
    let key = "fg:{log-memory}";
    let booked = charge(
        &mut conn,
        Algorithm::SlidingLog,
        key,
        10_000,
        (3_600_000, 10_000, 10_000),
        false,
        0,
    );
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
