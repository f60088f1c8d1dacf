//! `floodgate bench --rlqs`: simulated Envoys on quota (RLQS) streams.
//!
//! Each stream is one Envoy: it offers `--rlqs-offered` requests a second to each of its
//! `--rlqs-buckets` buckets, decides each request as Envoy's filter would, reports as
//! Envoy does (at once for a new bucket, then every 5 s), reopens a lost stream at its next
//! report, and applies what the server pushes ([`super::envoy_quota`]). Every stream reports the same bucket ids (`{--key: b<i>}`), so they split
//! one budget per bucket. The summary counts what all of them admitted per epoch-aligned
//! window of each bucket, against `--rlqs-limit`, and the time from a report to its answer;
//! both leave out the `--rlqs-warmup`.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::mpsc;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use super::BenchArgs;
use super::BenchError;
use super::envoy_quota::{self, EnvoyConfig, Id, Outgoing, SimulatedEnvoy};
use crate::clock::{Clock, SystemClock};
use crate::proto::rlqs::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use crate::proto::rlqs::{RateLimitQuotaResponse, RateLimitQuotaUsageReports};

/// What one simulated Envoy saw.
#[derive(Debug, Default)]
struct Seen {
    /// Admitted requests per (bucket, window index).
    admitted: HashMap<(usize, u64), u64>,
    denied: u64,
    latencies: Vec<Duration>,
    /// Reports after the warm-up still unanswered when the stream's next report went out.
    unanswered: u64,
    /// From the stream's first report to its answer.
    first_answer: Option<Duration>,
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
    /// Reporting interval, ms (Envoy's, fixed).
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
    /// Actions applied, by effect (`changed` starts a new token bucket).
    pub actions: HashMap<&'static str, u64>,
    /// Time from a report to its answer, ms, for the reports sent after the warm-up.
    pub push_latency_ms: Percentiles,
    /// Reports sent after the warm-up that got no whole answer before the stream's next
    /// report (a booking that failed is not answered): not in `push_latency_ms`.
    pub unanswered_reports: u64,
    /// The cold start: every stream's first report goes out at once, as after a rollout;
    /// the time from each stream's first report to its answer, ms.
    pub cold_start_ms: Percentiles,
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
pub async fn run(args: &BenchArgs) -> Result<QuotaSummary, BenchError> {
    let mut targets = vec![args.target];
    targets.extend(&args.rlqs_replica);
    let connections = connections_per_target(args.connections, args.rlqs_streams, targets.len());
    let mut channels = Vec::new();
    for target in &targets {
        for _ in 0..connections {
            channels.push(connect(*target).await?);
        }
    }
    let start = Instant::now();
    let envoys: Vec<_> = (0..args.rlqs_streams)
        .map(|index| {
            // Streams alternate over the replicas, then over each one's connections.
            let channel = channels
                [(index % targets.len()) * connections + (index / targets.len()) % connections]
                .clone();
            tokio::spawn(envoy(channel, index, args.clone(), start))
        })
        .collect();
    let mut all = Vec::new();
    for envoy in envoys {
        all.push(envoy.await?);
    }
    Ok(summarize(args, start, all))
}

async fn connect(target: SocketAddr) -> Result<Channel, BenchError> {
    let unreachable = |reason: String| BenchError::Connect { target, reason };
    Channel::from_shared(format!("http://{target}"))
        .map_err(|error| unreachable(error.to_string()))?
        .connect()
        .await
        .map_err(|error| unreachable(error.to_string()))
}

/// Streams one connection carries at most: under the server's default limit of concurrent
/// streams a connection (1,024), past which the others would wait unopened and a run of
/// 10,000 Envoys would simulate 4,096.
const STREAMS_PER_CONNECTION: usize = 500;

/// Connections to open to each of `targets` replicas: `asked`, or more where `streams`
/// would put more than [`STREAMS_PER_CONNECTION`] on one.
fn connections_per_target(asked: usize, streams: usize, targets: usize) -> usize {
    asked.max(streams.div_ceil(targets.max(1) * STREAMS_PER_CONNECTION))
}

/// Milliseconds since the Unix epoch (windows are aligned to it, as floodgate's are).
fn epoch_ms() -> u64 {
    u64::try_from(SystemClock.now_ms()).unwrap_or(0)
}

/// One open quota stream of a simulated Envoy.
struct Open {
    reports: mpsc::Sender<RateLimitQuotaUsageReports>,
    answers: tonic::Streaming<RateLimitQuotaResponse>,
}

impl Open {
    async fn start(channel: &Channel) -> Result<Open, BenchError> {
        let (reports, receiver) = mpsc::channel(16);
        let answers = RateLimitQuotaServiceClient::new(channel.clone())
            .stream_rate_limit_quotas(ReceiverStream::new(receiver))
            .await
            .map_err(|status| BenchError::Stream(status.to_string()))?
            .into_inner();
        Ok(Open { reports, answers })
    }

    /// The next answer, or `None` once the stream has ended (with its error, if any).
    async fn answer(&mut self) -> Result<Option<RateLimitQuotaResponse>, BenchError> {
        self.answers
            .message()
            .await
            .map_err(|status| BenchError::Stream(status.to_string()))
    }
}

/// One simulated Envoy until `--duration` has passed since `start`.
async fn envoy(channel: Channel, index: usize, args: BenchArgs, start: Instant) -> Seen {
    let mut seen = Seen::default();
    let config = EnvoyConfig {
        domain: args.domain.clone(),
        no_assignment: args.rlqs_no_assignment,
        expired: None,
        restart: args.rlqs_restart,
    };
    // Envoys start at different moments: spread their ticks over one interval.
    let phase = envoy_quota::REPORT_INTERVAL.mul_f64((index as f64 * 0.618_034).fract());
    let mut client = SimulatedEnvoy::new(config, start + phase - envoy_quota::REPORT_INTERVAL);
    let ids: Vec<Id> = (0..args.rlqs_buckets)
        .map(|bucket| vec![(args.key.clone(), format!("b{bucket}"))])
        .collect();
    let mut open: Option<Open> = None;
    // Reports awaiting their answer: when each was sent, and how many buckets it named.
    let mut pending: VecDeque<(Instant, usize)> = VecDeque::new();
    // The finest step between two wakes; between requests an Envoy sleeps until the next
    // one is owed or its report is due, so a fleet of slow Envoys costs the generator little.
    let step = if args.rlqs_streams > 100 {
        Duration::from_millis(20)
    } else {
        Duration::from_millis(5)
    };
    let rate = args.rlqs_offered.per_second();
    let (mut owed, mut last) = (0.0, start);
    let end = start + args.duration;
    // Every Envoy's first request comes in the same step, so the first reports (one a
    // bucket, on streams opened at that moment) all queue at once: a cold start, not the
    // latency of a running stream. Like the admitted windows, they are not counted.
    let warm = start.checked_add(args.rlqs_warmup).unwrap_or(end);
    let mut wake = start;
    while Instant::now() < end {
        let answer = async {
            match open.as_mut() {
                Some(stream) => stream.answer().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            answer = answer => match answer {
                Ok(Some(answer)) => {
                    let now = Instant::now();
                    // The answer to a report acts on every bucket it named; a push between
                    // reports (a refill, a reload) acts on fewer and answers no report.
                    let acted = answer.bucket_action.len();
                    if pending.front().is_some_and(|&(_, named)| acted >= named)
                        && let Some((sent, _)) = pending.pop_front()
                    {
                        seen.first_answer.get_or_insert(now - sent);
                        if sent >= warm {
                            seen.latencies.push(now - sent);
                        }
                    }
                    for applied in client.apply(&answer, now) {
                        *seen.applied.entry(applied.label()).or_default() += 1;
                    }
                }
                Ok(None) | Err(_) => {
                    if let Err(error) = answer {
                        seen.error.get_or_insert(error.to_string());
                    }
                    open = None;
                    pending.clear();
                    client.stream_lost();
                }
            },
            _ = tokio::time::sleep_until(wake.into()) => {
                let now = Instant::now();
                owed += rate * (now - last).as_secs_f64();
                last = now;
                let window = epoch_ms() / args.rlqs_window.as_millis().max(1) as u64;
                let mut outgoing = Vec::new();
                while owed >= 1.0 {
                    owed -= 1.0;
                    for (bucket, id) in ids.iter().enumerate() {
                        let (admitted, report) = client.request(id, now);
                        if admitted {
                            *seen.admitted.entry((bucket, window)).or_default() += 1;
                        } else {
                            seen.denied += 1;
                        }
                        outgoing.extend(report);
                    }
                }
                outgoing.extend(client.tick(now));
                wake = next_wake(now, owed, rate, step, client.next_tick());
                for report in outgoing {
                    // A report of no bucket gets no answer to time.
                    let named = report.report.bucket_quota_usages.len();
                    if let Err(error) = send(&channel, &mut open, report).await {
                        seen.error.get_or_insert(error.to_string());
                        client.stream_lost();
                        continue;
                    }
                    if named > 0 {
                        // An answer acts on at least what its report named; one that did
                        // not come by the next report is not coming, and would otherwise
                        // be matched with this report's answer.
                        while pending.front().is_some_and(|&(sent, _)| sent < now) {
                            if pending.pop_front().is_some_and(|(sent, _)| sent >= warm) {
                                seen.unanswered += 1;
                            }
                        }
                        pending.push_back((now, named));
                    }
                }
            }
        }
    }
    seen
}

/// When an Envoy that owes `owed` requests at `rate` a second wakes next: when its next
/// request is owed or its report is due, whichever is first, and at least `step` after `now`.
fn next_wake(now: Instant, owed: f64, rate: f64, step: Duration, report: Instant) -> Instant {
    let request = if rate > 0.0 {
        now + Duration::from_secs_f64(((1.0 - owed) / rate).clamp(0.0, 3600.0))
    } else {
        report
    };
    request.min(report).max(now + step)
}

/// Sends one report, opening the stream first when the report says so.
async fn send(
    channel: &Channel,
    open: &mut Option<Open>,
    report: Outgoing,
) -> Result<(), BenchError> {
    if report.opens_stream || open.is_none() {
        *open = Some(Open::start(channel).await?);
    }
    let stream = open.as_ref().expect("opened above");
    stream
        .reports
        .send(report.report)
        .await
        .map_err(|_| BenchError::Stream("the stream closed".to_owned()))
}

fn summarize(args: &BenchArgs, start: Instant, all: Vec<Seen>) -> QuotaSummary {
    let window_ms = args.rlqs_window.as_millis().max(1) as u64;
    let begun_ms = epoch_ms().saturating_sub(start.elapsed().as_millis() as u64);
    // Windows that start after the warm-up and end before the run did.
    let first_window = (begun_ms + args.rlqs_warmup.as_millis() as u64).div_ceil(window_ms);
    let last_window = (begun_ms + args.duration.as_millis() as u64) / window_ms;
    let mut per_window: HashMap<(usize, u64), u64> = HashMap::new();
    let mut latencies = Vec::new();
    let mut cold = Vec::new();
    let mut actions: HashMap<&'static str, u64> = HashMap::new();
    let (mut admitted, mut denied, mut errors, mut first_error) = (0, 0, 0, None);
    let mut unanswered = 0;
    for seen in all {
        for (key, count) in seen.admitted {
            *per_window.entry(key).or_default() += count;
            admitted += count;
        }
        denied += seen.denied;
        latencies.extend(seen.latencies);
        unanswered += seen.unanswered;
        cold.extend(seen.first_answer);
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
        report_interval_ms: envoy_quota::REPORT_INTERVAL.as_millis() as u64,
        window_ms,
        limit: args.rlqs_limit,
        admitted_per_window: Spread::of(&steady),
        admitted_ratio: ratio,
        admitted,
        denied,
        actions,
        push_latency_ms: Percentiles::of(latencies),
        unanswered_reports: unanswered,
        cold_start_ms: Percentiles::of(cold),
        stream_errors: errors,
        first_error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_envoy_gets_a_stream_under_the_servers_limit_per_connection() {
        assert_eq!(connections_per_target(4, 100, 1), 4);
        assert_eq!(connections_per_target(4, 10_000, 1), 20);
        assert_eq!(connections_per_target(4, 10_000, 2), 10);
        assert_eq!(connections_per_target(1, 10_001, 1), 21);
    }

    #[test]
    fn a_slow_envoy_sleeps_until_its_next_request_or_report() {
        let now = Instant::now();
        let step = Duration::from_millis(20);
        let far = now + Duration::from_secs(5);
        // Owes a quarter of a request at 1/s: the next one is owed in 750 ms.
        assert_eq!(
            next_wake(now, 0.25, 1.0, step, far),
            now + Duration::from_millis(750)
        );
        // A report due sooner comes first.
        let soon = now + Duration::from_millis(100);
        assert_eq!(next_wake(now, 0.25, 1.0, step, soon), soon);
        // A fast Envoy wakes every step, not more often.
        assert_eq!(next_wake(now, 0.5, 3000.0, step, far), now + step);
        // No requests: only the report wakes it.
        assert_eq!(next_wake(now, 0.0, 0.0, step, far), far);
    }
}
