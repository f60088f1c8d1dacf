//! Resident memory of the memory backend under many distinct descriptor values.
//!
//! `cargo run --release --example memory_footprint [VALUES]`
//!
//! With VALUES up to the `--memory-max-buckets` default (1,000,000, the default VALUES), every
//! bucket stays live: The target (docs/operations.md#performance-targets) is <= 250 MB for a
//! million. Past it (e.g. `5000000`, a flood of distinct values from a hostile client) the backend
//! is capped at that default and evicts, so memory stays at the million-bucket figure instead of
//! growing with the flood. Prints the process RSS and its peak (from /proc/self/status, so Linux
//! only).

use std::sync::Arc;

use floodgate::backend::memory::MemoryBackend;
use floodgate::backend::{Backend, BucketKey, Charge};
use floodgate::clock::ManualClock;
use floodgate::rules::{Policy, Unit};

/// The `--memory-max-buckets` default: the cap a flood runs into.
const CAP: usize = floodgate::backend::memory::DEFAULT_CAPACITY;

/// A field of /proc/self/status in KiB (`VmRSS`, `VmHWM`).
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| {
            rest.trim_start_matches(':')
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let values: usize = match std::env::args().nth(1) {
        Some(text) => text.replace('_', "").parse().expect("VALUES is a number"),
        None => CAP,
    };
    let policy = Policy::fixed_window(100, Unit::Hour);
    // A fixed clock keeps every bucket live. Up to the default cap, room is left for uneven
    // shards so nothing is evicted; past it, the flood meets the default cap.
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let cap = if values <= CAP {
        values + values / 10
    } else {
        CAP
    };
    let backend = MemoryBackend::with_clock(cap, clock);
    let before = status_kib("VmRSS");
    for i in 0..values {
        let value = i.to_string();
        let charge = Charge {
            bucket: BucketKey::new("bench", "user", [("user", value.as_str())], &policy),
            policy,
            cost: 1,
            spread_ms: 0,
        };
        let outcome = backend.charge(&[charge]).await.expect("memory never fails");
        assert!(outcome[0].allowed);
    }
    let after = status_kib("VmRSS");
    let live = backend.len();
    println!(
        "distinct values: {values}, cap: {cap}, live buckets: {live}, evictions: {}",
        backend.evictions()
    );
    let grown = after.saturating_sub(before);
    println!(
        "RSS before: {} MiB, after: {} MiB, peak: {} MiB; the buckets take {} MiB ({} bytes each)",
        before / 1024,
        after / 1024,
        status_kib("VmHWM") / 1024,
        grown / 1024,
        grown * 1024 / live.max(1) as u64
    );
}
