//! Load generator for a running floodgate: concurrent ShouldRateLimit calls over a few
//! HTTP/2 connections, reporting decisions per second and latency percentiles.
//!
//! Bounded by request count and by duration, and refuses any target that is not loopback:
//!
//! ```text
//! cargo run --release --example loadgen -- --target 127.0.0.1:8081 --concurrency 64 \
//!     --requests 500000 --keys 10000 --domain bench --key user
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use floodgate::proto::common::RateLimitDescriptor;
use floodgate::proto::common::rate_limit_descriptor::Entry;
use floodgate::proto::rls::{RateLimitRequest, RateLimitResponse};
use prost::Message;
use prost::bytes::{BufMut, Bytes};
use tonic::client::Grpc;
use tonic::codec::{Codec, EncodeBuf, Encoder};
use tonic::transport::{Channel, Endpoint};
use tonic_prost::{ProstCodec, ProstDecoder};

const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// Sends requests encoded once up front, so the generator spends its share of the machine's
/// two cores on the wire rather than on building and encoding messages.
#[derive(Default)]
struct PreEncoded;

struct RawEncoder;

impl Encoder for RawEncoder {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Self::Error> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Codec for PreEncoded {
    type Encode = Bytes;
    type Decode = RateLimitResponse;
    type Encoder = RawEncoder;
    type Decoder = ProstDecoder<RateLimitResponse>;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<RateLimitRequest, RateLimitResponse>::new().decoder()
    }
}

/// One encoded request per key.
fn encoded_requests(domain: &str, key: &str, keys: u64) -> Arc<Vec<Bytes>> {
    let requests = (0..keys)
        .map(|value| {
            let request = RateLimitRequest {
                domain: domain.to_owned(),
                descriptors: vec![RateLimitDescriptor {
                    entries: vec![Entry {
                        key: key.to_owned(),
                        value: value.to_string(),
                    }],
                    ..Default::default()
                }],
                hits_addend: 0,
            };
            Bytes::from(request.encode_to_vec())
        })
        .collect();
    Arc::new(requests)
}

#[derive(Parser, Debug)]
struct Args {
    /// gRPC address of the service (loopback only).
    #[arg(long, default_value = "127.0.0.1:8081")]
    target: SocketAddr,
    /// Calls in flight at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Total calls to make.
    #[arg(long, default_value_t = 200_000)]
    requests: u64,
    /// Upper bound on the run time, seconds.
    #[arg(long, default_value_t = 60)]
    max_seconds: u64,
    /// HTTP/2 connections to spread calls over.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Distinct descriptor values (buckets).
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// Domain to call.
    #[arg(long, default_value = "bench")]
    domain: String,
    /// Descriptor key.
    #[arg(long, default_value = "user")]
    key: String,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    if !args.target.ip().is_loopback() {
        return Err("loadgen only targets loopback addresses".into());
    }
    let mut channels = Vec::new();
    for _ in 0..args.connections.max(1) {
        let channel = Endpoint::from_shared(format!("http://{}", args.target))?
            .tcp_nodelay(true)
            .connect()
            .await?;
        channels.push(channel);
    }
    let issued = Arc::new(AtomicU64::new(0));
    let requests = encoded_requests(&args.domain, &args.key, args.keys.max(1));
    let deadline = Instant::now() + Duration::from_secs(args.max_seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..args.concurrency.max(1) {
        let client = Grpc::new(channels[worker % channels.len()].clone());
        let (issued, requests) = (Arc::clone(&issued), Arc::clone(&requests));
        tasks.push(tokio::spawn(worker_loop(
            client,
            issued,
            args.requests,
            requests,
            deadline,
        )));
    }
    let mut latencies = Vec::new();
    let (mut ok, mut over, mut errors) = (0u64, 0u64, 0u64);
    for task in tasks {
        let result = task.await?;
        latencies.extend(result.latencies);
        (ok, over, errors) = (ok + result.ok, over + result.over, errors + result.errors);
    }
    let elapsed = started.elapsed();
    latencies.sort_unstable();
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
            .map_or(0.0, |d: &Duration| d.as_secs_f64() * 1000.0)
    };
    let done = ok + over + errors;
    println!(
        "{done} calls in {:.2}s: {:.0} decisions/s (ok {ok}, over_limit {over}, errors {errors})",
        elapsed.as_secs_f64(),
        done as f64 / elapsed.as_secs_f64()
    );
    println!(
        "latency ms: p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}",
        pct(0.50),
        pct(0.90),
        pct(0.99),
        pct(0.999),
        pct(1.0)
    );
    Ok(())
}

struct WorkerResult {
    latencies: Vec<Duration>,
    ok: u64,
    over: u64,
    errors: u64,
}

async fn worker_loop(
    mut client: Grpc<Channel>,
    issued: Arc<AtomicU64>,
    total: u64,
    requests: Arc<Vec<Bytes>>,
    deadline: Instant,
) -> WorkerResult {
    let mut result = WorkerResult {
        latencies: Vec::new(),
        ok: 0,
        over: 0,
        errors: 0,
    };
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(PATH);
    // A cheap deterministic spread over the key space (xorshift).
    let mut state = issued.load(Ordering::Relaxed) ^ 0x9E37_79B9_7F4A_7C15;
    loop {
        let n = issued.fetch_add(1, Ordering::Relaxed);
        if n >= total || Instant::now() >= deadline {
            return result;
        }
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let body = requests[(state % requests.len() as u64) as usize].clone();
        let started = Instant::now();
        let answer = match client.ready().await {
            Ok(()) => {
                client
                    .unary(tonic::Request::new(body), path.clone(), PreEncoded)
                    .await
            }
            Err(error) => Err(tonic::Status::unavailable(error.to_string())),
        };
        match answer {
            Ok(response) if response.get_ref().overall_code == 1 => result.ok += 1,
            Ok(_) => result.over += 1,
            Err(_) => result.errors += 1,
        }
        result.latencies.push(started.elapsed());
    }
}
