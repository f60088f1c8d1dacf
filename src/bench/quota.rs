//! `floodgate bench --rlqs`: simulated Envoys on quota (RLQS) streams.
//!
//! Each stream is one Envoy: it offers `--rlqs-offered` requests a second to each of its
//! `--rlqs-buckets` buckets, decides each request as Envoy's filter would
//! ([`super::envoy_quota`]), reports every `--rlqs-report-interval`, and applies what the
//! server pushes. Every stream reports the same bucket ids (`{--key: b<i>}`), so they split
//! one budget per bucket. The summary counts what all of them admitted per epoch-aligned
//! window of each bucket, against `--rlqs-limit`, and the time from a report to its answer.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::mpsc;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use super::BenchArgs;
use super::envoy_quota::{Applied, EnvoyBucket};
use crate::clock::{Clock, SystemClock};
use crate::proto::rlqs::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use crate::proto::rlqs::rate_limit_quota_usage_reports::BucketQuotaUsage;
use crate::proto::rlqs::{BucketId, RateLimitQuotaUsageReports};

/// What one simulated Envoy saw.
#[derive(Debug, Default)]
struct Seen {
    /// Admitted requests per (bucket, window index).
    admitted: HashMap<(usize, u64), u64>,
    denied: u64,
    latencies: Vec<Duration>,
    applied: HashMap<&'static str, u64>,
    error: Option<String>,
}

/// The JSON line `--rlqs` prints.
#[derive(Debug, Clone, Serialize)]
pub struct QuotaSummary {
    /// Simulated Envoys.
    pub streams: usize,
    /// Buckets each reports.
    pub buckets: usize,
    /// Requests offered per second per stream and bucket.
    pub offered_per_s: f64,
    /// Reporting interval, ms.
    pub report_interval_ms: u64,
    /// Window the admitted counts are per, ms.
    pub window_ms: u64,
    /// The limit per window they are compared with.
    pub limit: Option<u64>,
    /// Admitted per window over every stream, per bucket, after the warm-up and without
    /// the last, partial window: the smallest, mean and largest.
    pub admitted_per_window: Spread,
    /// The same divided by `limit`.
    pub admitted_ratio: Option<Spread>,
    /// Requests admitted, denied.
    pub admitted: u64,
    /// Requests denied.
    pub denied: u64,
    /// Actions applied, by effect (`changed` starts a full token bucket).
    pub actions: HashMap<&'static str, u64>,
    /// Time from a report to the next answer on its stream, ms.
    pub push_latency_ms: Percentiles,
    /// Streams that ended with an error, and the first error.
    pub stream_errors: usize,
    /// The first stream error.
    pub first_error: Option<String>,
}

/// Smallest, mean and largest of a set of numbers.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Spread {
    /// Smallest.
    pub min: f64,
    /// Mean.
    pub mean: f64,
    /// Largest.
    pub max: f64,
    /// How many.
    pub count: usize,
}

impl Spread {
    fn of(values: &[f64]) -> Spread {
        if values.is_empty() {
            return Spread::default();
        }
        let round = |v: f64| (v * 1000.0).round() / 1000.0;
        Spread {
            min: round(values.iter().copied().fold(f64::INFINITY, f64::min)),
            mean: round(values.iter().sum::<f64>() / values.len() as f64),
            max: round(values.iter().copied().fold(f64::NEG_INFINITY, f64::max)),
            count: values.len(),
        }
    }
}

/// Latency percentiles in ms.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
    /// Samples.
    pub count: usize,
}

impl Percentiles {
    fn of(mut samples: Vec<Duration>) -> Percentiles {
        if samples.is_empty() {
            return Percentiles::default();
        }
        samples.sort_unstable();
        let at = |q: f64| {
            let index = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1;
            (samples[index].as_secs_f64() * 1e5).round() / 100.0
        };
        Percentiles {
            p50: at(0.50),
            p99: at(0.99),
            max: at(1.0),
            count: samples.len(),
        }
    }
}

/// Runs the simulated Envoys and summarizes them.
///
/// # Errors
/// A target that cannot be reached at the start.
pub async fn run(args: &BenchArgs) -> Result<QuotaSummary, String> {
    let mut targets = vec![args.target];
    targets.extend(&args.rlqs_replica);
    let mut channels = Vec::new();
    for target in &targets {
        for _ in 0..args.connections {
            channels.push(connect(*target).await?);
        }
    }
    let start = Instant::now();
    let envoys: Vec<_> = (0..args.rlqs_streams)
        .map(|index| {
            // Streams alternate over the replicas, then over each one's connections.
            let channel = channels[(index % targets.len()) * args.connections
                + (index / targets.len()) % args.connections]
                .clone();
            tokio::spawn(envoy(channel, index, args.clone(), start))
        })
        .collect();
    let mut all = Vec::new();
    for envoy in envoys {
        all.push(
            envoy
                .await
                .map_err(|error| format!("stream task: {error}"))?,
        );
    }
    Ok(summarize(args, start, all))
}

async fn connect(target: SocketAddr) -> Result<Channel, String> {
    Channel::from_shared(format!("http://{target}"))
        .map_err(|error| error.to_string())?
        .connect()
        .await
        .map_err(|error| format!("cannot reach {target}: {error}"))
}

/// Milliseconds since the Unix epoch (windows are aligned to it, as floodgate's are).
fn epoch_ms() -> u64 {
    u64::try_from(SystemClock.now_ms()).unwrap_or(0)
}

/// One simulated Envoy until `--duration` has passed since `start`.
async fn envoy(channel: Channel, index: usize, args: BenchArgs, start: Instant) -> Seen {
    let mut seen = Seen::default();
    let (reports, receiver) = mpsc::channel(16);
    let mut client = RateLimitQuotaServiceClient::new(channel);
    let mut answers = match client
        .stream_rate_limit_quotas(ReceiverStream::new(receiver))
        .await
    {
        Ok(answers) => answers.into_inner(),
        Err(status) => {
            seen.error = Some(status.to_string());
            return seen;
        }
    };
    let ids: Vec<BucketId> = (0..args.rlqs_buckets)
        .map(|bucket| BucketId {
            bucket: HashMap::from([(args.key.clone(), format!("b{bucket}"))]),
        })
        .collect();
    let mut buckets: Vec<EnvoyBucket> = (0..args.rlqs_buckets)
        .map(|_| EnvoyBucket::new(args.rlqs_no_assignment, args.rlqs_no_assignment, start))
        .collect();
    let index_of: HashMap<String, usize> = (0..args.rlqs_buckets)
        .map(|bucket| (format!("b{bucket}"), bucket))
        .collect();
    let interval = args.rlqs_report_interval;
    let step = if args.rlqs_streams > 100 {
        Duration::from_millis(20)
    } else {
        Duration::from_millis(5)
    };
    // Envoys start at different moments: spread the reports over one interval.
    let phase = interval.mul_f64((index as f64 * 0.618_034).fract());
    let mut next_report = start + phase;
    let mut pending: VecDeque<Instant> = VecDeque::new();
    let (mut owed, mut last) = (0.0, start);
    let end = start + args.duration;
    let mut first = true;
    let mut ticker = tokio::time::interval(step);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while Instant::now() < end {
        tokio::select! {
            answer = answers.message() => {
                let answer = match answer {
                    Ok(Some(answer)) => answer,
                    Ok(None) => break,
                    Err(status) => {
                        seen.error = Some(status.to_string());
                        break;
                    }
                };
                let now = Instant::now();
                if let Some(sent) = pending.pop_front() {
                    seen.latencies.push(now - sent);
                }
                for action in &answer.bucket_action {
                    let bucket = action
                        .bucket_id
                        .as_ref()
                        .and_then(|id| id.bucket.get(&args.key))
                        .and_then(|value| index_of.get(value));
                    if let Some(&bucket) = bucket {
                        let applied = buckets[bucket].apply(action, now);
                        *seen.applied.entry(label(applied)).or_default() += 1;
                    }
                }
            }
            _ = ticker.tick() => {
                let now = Instant::now();
                owed += args.rlqs_offered.per_second() * (now - last).as_secs_f64();
                last = now;
                let window = epoch_ms() / args.rlqs_window.as_millis().max(1) as u64;
                while owed >= 1.0 {
                    owed -= 1.0;
                    for (bucket, envoy) in buckets.iter_mut().enumerate() {
                        if envoy.admit(now) {
                            *seen.admitted.entry((bucket, window)).or_default() += 1;
                        } else {
                            seen.denied += 1;
                        }
                    }
                }
                if now >= next_report {
                    next_report += interval;
                    let report = report(&args, &ids, &mut buckets, now, first);
                    first = false;
                    if reports.send(report).await.is_err() {
                        break;
                    }
                    pending.push_back(now);
                }
            }
        }
    }
    seen
}

/// The report of every bucket of one Envoy.
fn report(
    args: &BenchArgs,
    ids: &[BucketId],
    buckets: &mut [EnvoyBucket],
    now: Instant,
    first: bool,
) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: if first {
            args.domain.clone()
        } else {
            String::new()
        },
        bucket_quota_usages: buckets
            .iter_mut()
            .zip(ids)
            .enumerate()
            .map(|(i, (bucket, id))| {
                let (allowed, denied, elapsed) = bucket.take_report(now);
                let usage = BucketQuotaUsage {
                    bucket_id: Some(id.clone()),
                    time_elapsed: Some(elapsed.into()),
                    num_requests_allowed: allowed,
                    num_requests_denied: denied,
                    last_report: None,
                };
                (i as u64, usage)
            })
            .collect(),
    }
}

fn label(applied: Applied) -> &'static str {
    match applied {
        Applied::Changed => "changed",
        Applied::Extended => "extended",
        Applied::Abandoned => "abandoned",
        Applied::Unsupported => "unsupported",
    }
}

fn summarize(args: &BenchArgs, start: Instant, all: Vec<Seen>) -> QuotaSummary {
    let window_ms = args.rlqs_window.as_millis().max(1) as u64;
    let begun_ms = epoch_ms().saturating_sub(start.elapsed().as_millis() as u64);
    // Windows that start after the warm-up and end before the run did.
    let first_window = (begun_ms + args.rlqs_warmup.as_millis() as u64).div_ceil(window_ms);
    let last_window = (begun_ms + args.duration.as_millis() as u64) / window_ms;
    let mut per_window: HashMap<(usize, u64), u64> = HashMap::new();
    let mut latencies = Vec::new();
    let mut actions: HashMap<&'static str, u64> = HashMap::new();
    let (mut admitted, mut denied, mut errors, mut first_error) = (0, 0, 0, None);
    for seen in all {
        for (key, count) in seen.admitted {
            *per_window.entry(key).or_default() += count;
            admitted += count;
        }
        denied += seen.denied;
        latencies.extend(seen.latencies);
        for (label, count) in seen.applied {
            *actions.entry(label).or_default() += count;
        }
        if let Some(error) = seen.error {
            errors += 1;
            first_error.get_or_insert(error);
        }
    }
    let steady: Vec<f64> = (0..args.rlqs_buckets)
        .flat_map(|bucket| {
            (first_window..last_window)
                .map(move |window| (bucket, window))
                .map(|key| per_window.get(&key).copied().unwrap_or(0) as f64)
                .collect::<Vec<_>>()
        })
        .collect();
    let ratio = args.rlqs_limit.map(|limit| {
        let ratios: Vec<f64> = steady.iter().map(|count| count / limit as f64).collect();
        Spread::of(&ratios)
    });
    QuotaSummary {
        streams: args.rlqs_streams,
        buckets: args.rlqs_buckets,
        offered_per_s: args.rlqs_offered.per_second(),
        report_interval_ms: args.rlqs_report_interval.as_millis() as u64,
        window_ms,
        limit: args.rlqs_limit,
        admitted_per_window: Spread::of(&steady),
        admitted_ratio: ratio,
        admitted,
        denied,
        actions,
        push_latency_ms: Percentiles::of(latencies),
        stream_errors: errors,
        first_error,
    }
}
