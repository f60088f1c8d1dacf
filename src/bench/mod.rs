//! `floodgate bench`: a load generator for a running floodgate.
//!
//! It makes ShouldRateLimit calls over a few HTTP/2 connections, either with a fixed number
//! in flight (closed loop: measures capacity) or started at a fixed rate (open loop: measures
//! latency at a given load, from each call's intended start, so a stall is not hidden by the
//! generator slowing down with the service). Requests are encoded once up front. Every run
//! is bounded by `--duration` (and `--count`); targets are loopback only. While it runs it
//! prints a progress line a second on stderr; at the end, one JSON summary line on stdout.
//!
//! `--rlqs` runs simulated Envoys on quota streams instead (`quota`).
//!
//! `--record FILE` keeps per-key results (OK answers per fixed window, errors per second)
//! for the chaos soak, which checks admitted counts against limits across replicas.
#![allow(
    clippy::disallowed_methods,
    reason = "a load generator measures and stamps real time against a separate process"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

mod args;
mod client;
pub mod envoy_quota;
mod error;
pub mod proxy;
pub mod quota;
mod stats;
mod workload;

pub use args::{BenchArgs, Rate};
pub use error::BenchError;
pub use stats::{Latency, Mode, Summary};

use crate::backend::BucketKey;
use crate::matcher::Matcher;
use client::{Caller, Outcome};
use stats::{Call, Live, Tally};
use workload::{Random, Workload};

/// How far ahead of its intended start an open-loop call may be sent: tokio's timer fires
/// on millisecond ticks, so waking a little early keeps the rate without adding the timer's
/// rounding to every latency. Such a call's latency is measured from when it was sent.
const EARLY_SEND: Duration = Duration::from_millis(1);
/// How late a caller may take a call before `--fail-when-busy` counts it as due while every
/// caller was busy: the generator's own scheduling delay, not a busy pool.
const BUSY_SLACK: Duration = Duration::from_millis(1);
/// Most tallies the callers record into. A tally holds three latency histograms of about
/// 200 KB each: one per caller cost 1 GB at 2,048 in flight, and zeroing it took most of the
/// generator's CPU, so overload runs measured the generator. Callers share these instead;
/// a shard's lock is held only to count one call.
const TALLY_SHARDS: usize = 32;

/// When calls start and when the run stops.
#[derive(Debug, Clone, Copy)]
struct Schedule {
    start: Instant,
    deadline: Instant,
    count: u64,
    /// Open loop: time between intended starts.
    interval: Option<Duration>,
    /// Open loop: a call due while every caller is busy fails at once.
    fail_when_busy: bool,
}

impl Schedule {
    /// Intended start of call `n`, or `None` once the run is over.
    fn intended(&self, n: u64) -> Option<Instant> {
        if n >= self.count {
            return None;
        }
        let at = match self.interval {
            Some(interval) => self.start + interval.mul_f64(n as f64),
            None => Instant::now(),
        };
        (at < self.deadline && Instant::now() < self.deadline).then_some(at)
    }

    /// Whether a call due at `intended`, taken by a caller now, was due while every caller
    /// was busy and must fail at once.
    fn overflows(&self, intended: Instant) -> bool {
        self.fail_when_busy && intended + BUSY_SLACK < Instant::now()
    }
}

/// Runs one bench and returns its summary; writes `--record` if asked.
///
/// # Errors
/// Invalid options, an unreadable `--record-config`, a target that cannot be reached at
/// the start, or a `--record` file that cannot be written.
pub async fn run(args: &BenchArgs) -> Result<Summary, BenchError> {
    args.check()?;
    let redis_key_of = match &args.record_config {
        Some(dir) => Some(bucket_keys(dir, args)?),
        None => None,
    };
    let workload = Arc::new(Workload::new(
        &args.domain,
        &args.key,
        args.keys,
        args.descriptors,
        &args.over_limit_key,
        args.over_limit_share,
    ));
    let links = client::connect(args.target, args.connections).await?;
    let live = Arc::new(Live::default());
    let start = Instant::now();
    let schedule = Schedule {
        start,
        deadline: start + args.duration,
        count: args.count.unwrap_or(u64::MAX),
        interval: args.rate.map(Rate::interval),
        fail_when_busy: args.fail_when_busy,
    };
    let record_window = args.record.as_ref().map(|_| args.record_window);
    let issued = Arc::new(AtomicU64::new(0));
    let tallies: Vec<_> = (0..TALLY_SHARDS.min(args.concurrency))
        .map(|_| Arc::new(parking_lot::Mutex::new(Tally::new(record_window))))
        .collect();
    let workers: Vec<_> = (0..args.concurrency)
        .map(|worker| {
            let caller = Caller::new(Arc::clone(&links[worker % links.len()]), args.timeout);
            tokio::spawn(worker_loop(
                caller,
                Arc::clone(&workload),
                Arc::clone(&issued),
                Arc::clone(&live),
                schedule,
                Random::new(worker as u64),
                Arc::clone(&tallies[worker % tallies.len()]),
            ))
        })
        .collect();
    let progress = (!args.quiet).then(|| tokio::spawn(progress(Arc::clone(&live), start)));
    for worker in workers {
        worker.await?;
    }
    let mut total = Tally::new(record_window);
    for tally in tallies {
        let tally = Arc::try_unwrap(tally)
            .map_err(|_| BenchError::Outlived)?
            .into_inner();
        total.merge(tally);
    }
    let elapsed = start.elapsed();
    if let Some(progress) = progress {
        progress.abort();
    }
    drop(links);
    let mode = match args.rate {
        Some(rate) => Mode::Open {
            rate_per_s: rate.per_second(),
            max_in_flight: args.concurrency,
        },
        None => Mode::Closed {
            concurrency: args.concurrency,
        },
    };
    if let (Some(path), Some(record)) = (&args.record, total.record()) {
        let redis_key = |value: &str| redis_key_of.as_ref().and_then(|of| of(value));
        let json = record.to_json(|key| Workload::value(key, 0), redis_key);
        std::fs::write(path, json.to_string() + "\n").map_err(|source| BenchError::Record {
            path: path.clone(),
            source,
        })?;
    }
    Ok(total.summary(mode, elapsed, args.timeout))
}

/// One caller: takes the next call number, waits for its start in open loop, calls, counts.
async fn worker_loop(
    mut caller: Caller,
    workload: Arc<Workload>,
    issued: Arc<AtomicU64>,
    live: Arc<Live>,
    schedule: Schedule,
    mut random: Random,
    tally: Arc<parking_lot::Mutex<Tally>>,
) {
    while let Some(intended) = schedule.intended(issued.fetch_add(1, Ordering::Relaxed)) {
        let overflows = schedule.overflows(intended);
        if !overflows
            && let Some(wake) = intended.checked_sub(EARLY_SEND)
            && wake > Instant::now()
        {
            tokio::time::sleep_until(wake.into()).await;
        }
        let pick = workload.pick(random.next_u64());
        let (sent_at, sent) = (Instant::now(), SystemTime::now());
        let started = sent_at.min(intended);
        let outcome = if overflows {
            Outcome::Overflow
        } else {
            caller.call(workload.body(pick), started.into()).await
        };
        let call = Call {
            pick,
            outcome,
            latency: started.elapsed(),
            descriptors: workload.descriptors_of(pick),
            sent,
            ended: SystemTime::now(),
        };
        tally.lock().add(call, &live);
    }
}

/// Prints one line a second on stderr until aborted.
async fn progress(live: Arc<Live>, start: Instant) {
    let mut tick = tokio::time::interval_at(
        (start + Duration::from_secs(1)).into(),
        Duration::from_secs(1),
    );
    let mut last = 0;
    loop {
        tick.tick().await;
        let (done, ok, over_limit, errors) = live.snapshot();
        eprintln!(
            "bench: {:>4.0}s {done} calls ({}/s) ok {ok} over_limit {over_limit} errors {errors}",
            start.elapsed().as_secs_f64(),
            done - last,
        );
        last = done;
    }
}

/// Maps a descriptor value of `--key` to the Redis key of its bucket, as the service would
/// name it with the rules in `dir` and `--record-key-prefix`.
fn bucket_keys(
    dir: &std::path::Path,
    args: &BenchArgs,
) -> Result<impl Fn(&str) -> Option<String> + use<>, BenchError> {
    let loaded = crate::config::load_dir(dir).map_err(|errors| BenchError::RecordConfig {
        dir: dir.to_path_buf(),
        errors,
    })?;
    let matcher = Matcher::new(loaded.domains);
    let (domain, key, prefix) = (
        args.domain.clone(),
        args.key.clone(),
        args.record_key_prefix.clone(),
    );
    Ok(move |value: &str| {
        let entries = [(key.clone(), value.to_owned())];
        let matched = matcher.lookup(&domain, &entries)?;
        let policy = matched.rule.policy()?;
        let levels = matched.levels.iter().map(|(k, v, _)| (*k, *v));
        Some(BucketKey::new(&domain, &matched.rule.path, levels, policy).redis_key(&prefix))
    })
}
