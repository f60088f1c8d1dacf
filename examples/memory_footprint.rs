//! Resident memory of the memory backend holding 1,000,000 live fixed-window buckets.
//!
//! SPEC 7 targets <= 250 MB. Run with `cargo run --release --example memory_footprint`;
//! prints the process RSS (from /proc/self/status, so Linux only) before and after.

use std::sync::Arc;

use floodgate::backend::memory::{ManualClock, MemoryBackend};
use floodgate::backend::{Backend, BucketKey, Charge};
use floodgate::rules::{Policy, Unit};

const BUCKETS: usize = 1_000_000;

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let policy = Policy::fixed_window(100, Unit::Hour);
    // A fixed clock keeps every bucket live; the cap leaves room for uneven shards.
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let backend = MemoryBackend::with_clock(BUCKETS + BUCKETS / 10, clock);
    let before = rss_kib();
    for i in 0..BUCKETS {
        let value = i.to_string();
        let charge = Charge {
            bucket: BucketKey::new("bench", "user", [("user", value.as_str())], &policy),
            policy,
            cost: 1,
        };
        let outcome = backend.charge(&[charge]).await.expect("memory never fails");
        assert!(outcome[0].allowed);
    }
    let after = rss_kib();
    println!(
        "live buckets: {}, evictions: {}",
        backend.len(),
        backend.evictions()
    );
    let grown = after.saturating_sub(before);
    println!(
        "RSS before: {} MiB, after: {} MiB; the buckets take {} MiB ({} bytes each)",
        before / 1024,
        after / 1024,
        grown / 1024,
        grown * 1024 / BUCKETS as u64
    );
}
