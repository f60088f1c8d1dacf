//! The Rate Limit Quota Service (RLQS): Envoy's streaming quota protocol, served from the
//! same rules and backend buckets as ShouldRateLimit (docs/rlqs.md).
//!
//! Envoy enforces each bucket itself and reports its usage on one long-lived stream; the
//! server books the reports into the bucket ShouldRateLimit charges and pushes each stream
//! a share of what is left. `validate` checks a message, `stream` holds one stream's
//! buckets and speaks the wire, `bounds` caps what all streams hold, `spread` places a
//! report's usage in the bucket's windows, `ledger` books through the limiter, `fair`
//! divides a bucket's rate among its streams, `assign` sizes assignments and decides
//! whether a change is worth pushing, `pace` times the start of slow ones, `strategy` is
//! what an assignment is, `wire` encodes it. Only `fair`, `assign` and `pace` decide, and
//! they are pure.

pub mod assign;
pub mod bounds;
pub mod fair;
pub mod ledger;
pub mod pace;
pub mod spread;
pub mod strategy;
pub mod stream;
pub mod validate;
mod wire;

use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use tokio::sync::{mpsc, watch};
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Response, Status, Streaming};

use crate::limiter::Limiter;
use crate::overload::{Admission, Arrival};
use crate::proto::rlqs::rate_limit_quota_response::BucketAction;
use crate::proto::rlqs::rate_limit_quota_service_server::RateLimitQuotaService;
use crate::proto::rlqs::{RateLimitQuotaResponse, RateLimitQuotaUsageReports};

use bounds::BucketBounds;
use ledger::Ledger;
use stream::{Answered, Shared, Stream};

/// Default `--rlqs-max-buckets`.
pub const DEFAULT_MAX_BUCKETS: usize = 10_000;
/// Default `--rlqs-abandon-after`.
pub const DEFAULT_ABANDON_AFTER: Duration = Duration::from_secs(60);
/// Answers queued for a client that does not read them, before the stream waits for it.
const QUEUED_ANSWERS: usize = 4;
/// How long the stream waits for a client to make room for an answer before it ends the
/// stream: a client that does not read for a reporting interval is not buffered for.
const READ_WAIT: Duration = stream::DEFAULT_INTERVAL;
/// Most encoded bytes of one answer; a larger one is split (Envoy's own gRPC clients
/// receive at most 4 MiB by default).
const MAX_ANSWER_BYTES: usize = 1 << 20;
/// Most bytes of one report message: 10,000 buckets with ids of up to 1.6 KiB each (Envoy
/// puts every bucket it holds in one message).
pub const MAX_REPORT_BYTES: usize = 16 << 20;

/// Settings of the quota service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RlqsSettings {
    /// Most buckets one stream may hold (`--rlqs-max-buckets`).
    pub max_buckets: usize,
    /// A bucket not reported for this long is abandoned (`--rlqs-abandon-after`).
    pub abandon_after: Duration,
}

impl Default for RlqsSettings {
    fn default() -> Self {
        RlqsSettings {
            max_buckets: DEFAULT_MAX_BUCKETS,
            abandon_after: DEFAULT_ABANDON_AFTER,
        }
    }
}

/// The gRPC `RateLimitQuotaService`.
#[derive(Clone)]
pub struct QuotaService {
    shared: Arc<Shared>,
    stop: watch::Receiver<bool>,
}

impl QuotaService {
    /// Serves quota streams over `limiter`'s rules and backend until `stop` turns true,
    /// which ends every open stream (so a shutdown can drain). `admission`, when shedding is
    /// on, is the one ShouldRateLimit's calls go through.
    pub fn new(
        limiter: Arc<Limiter>,
        settings: RlqsSettings,
        admission: Option<Arc<Admission>>,
        stop: watch::Receiver<bool>,
    ) -> Self {
        let ledger = Ledger::new(Arc::clone(&limiter));
        let metrics = limiter.metrics().rlqs.clone();
        QuotaService {
            shared: Arc::new(Shared {
                limiter,
                ledger,
                settings,
                bounds: Arc::new(BucketBounds::new(settings.max_buckets)),
                metrics,
                admission,
            }),
            stop,
        }
    }
}

#[tonic::async_trait]
impl RateLimitQuotaService for QuotaService {
    type StreamRateLimitQuotasStream = ReceiverStream<Result<RateLimitQuotaResponse, Status>>;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        let (answers, receiver) = mpsc::channel(QUEUED_ANSWERS);
        let connection = request
            .extensions()
            .get::<Arrival>()
            .map(|arrival| Arc::clone(&arrival.connection));
        // A shared backend's replicas then count each other's demand (`ledger`).
        self.shared.limiter.registry().want();
        let stream = Stream::new(Arc::clone(&self.shared), connection);
        tokio::spawn(serve(
            stream,
            request.into_inner(),
            answers,
            self.stop.clone(),
        ));
        Ok(Response::new(ReceiverStream::new(receiver)))
    }
}

/// Runs one stream until it ends, then takes its demand out of the shared counters.
async fn serve(
    mut stream: Stream,
    reports: Streaming<RateLimitQuotaUsageReports>,
    answers: mpsc::Sender<Result<RateLimitQuotaResponse, Status>>,
    stop: watch::Receiver<bool>,
) {
    converse(&mut stream, reports, answers, stop).await;
    stream.withdraw().await;
}

/// Answers reports and pushes what time changes, until the client goes away, sends what
/// cannot be decoded or a bad domain, stops reading, or the service shuts down.
async fn converse(
    stream: &mut Stream,
    mut reports: Streaming<RateLimitQuotaUsageReports>,
    answers: mpsc::Sender<Result<RateLimitQuotaResponse, Status>>,
    mut stop: watch::Receiver<bool>,
) {
    let metrics = stream.metrics().clone();
    loop {
        let wake = stream.next_wake();
        let actions = tokio::select! {
            report = reports.message() => match report {
                Ok(Some(report)) => match stream.report(report).await {
                    Ok(answered) => log_skipped(answered),
                    Err(invalid) => {
                        tracing::warn!(error = %invalid, "RLQS stream ended: a bad report");
                        metrics.stream_ended("bad_domain");
                        let _ = answers.try_send(Err(Status::invalid_argument(invalid.to_string())));
                        return;
                    }
                },
                Ok(None) => return,
                // The connection broke: nobody to answer.
                Err(status) if matches!(status.code(), Code::Unavailable | Code::Unknown | Code::Cancelled) => return,
                Err(status) => {
                    let (reason, answer) = ending(&status);
                    tracing::warn!(error = status.message(), reason, "RLQS stream ended: a bad frame");
                    metrics.stream_ended(reason);
                    let _ = answers.try_send(Err(answer));
                    return;
                }
            },
            () = tokio::time::sleep_until(wake) => stream.tick().await,
            () = stream.nudged() => stream.tick().await,
            () = stopped(&mut stop) => return,
            () = answers.closed() => return,
        };
        for answer in split(actions) {
            match answers.send_timeout(Ok(answer), READ_WAIT).await {
                Ok(()) => {}
                Err(mpsc::error::SendTimeoutError::Timeout(_)) => {
                    tracing::warn!("RLQS stream ended: its client does not read its answers");
                    metrics.stream_ended("not_reading");
                    return;
                }
                Err(mpsc::error::SendTimeoutError::Closed(_)) => return,
            }
        }
    }
}

/// The actions of a report, after logging what it skipped.
fn log_skipped(answered: Answered) -> Vec<BucketAction> {
    if let Some(first) = answered.skipped.first() {
        tracing::warn!(
            skipped = answered.skipped.len(),
            first = %first,
            "RLQS report: buckets left unanswered"
        );
    }
    answered.actions
}

/// How a stream ends when reading its next report failed: the `reason` it is counted
/// under and the status sent. A message that is not a report (or is over
/// [`MAX_REPORT_BYTES`]) is `INVALID_ARGUMENT`; a frame that breaks gRPC's framing keeps the
/// status the gRPC spec gives it (`INTERNAL` for a compressed flag without `grpc-encoding`,
/// doc/compression.md), never OK. A broken connection is not asked here.
fn ending(status: &Status) -> (&'static str, Status) {
    let undecodable = match status.code() {
        Code::OutOfRange | Code::ResourceExhausted => true,
        Code::Internal => status.message().starts_with("failed to decode"),
        _ => false,
    };
    if undecodable {
        let why = format!("a report that cannot be decoded: {}", status.message());
        ("undecodable", Status::invalid_argument(why))
    } else {
        let code = match status.code() {
            Code::Ok => Code::Internal,
            code => code,
        };
        let why = format!("a malformed gRPC frame: {}", status.message());
        ("malformed_frame", Status::new(code, why))
    }
}

/// `actions` as answers of at most [`MAX_ANSWER_BYTES`] each, in order.
fn split(actions: Vec<BucketAction>) -> Vec<RateLimitQuotaResponse> {
    let mut answers = Vec::new();
    let mut current = Vec::new();
    let mut bytes = 0;
    for action in actions {
        let size = action.encoded_len() + 8;
        if !current.is_empty() && bytes + size > MAX_ANSWER_BYTES {
            answers.push(RateLimitQuotaResponse {
                bucket_action: std::mem::take(&mut current),
            });
            bytes = 0;
        }
        bytes += size;
        current.push(action);
    }
    if !current.is_empty() {
        answers.push(RateLimitQuotaResponse {
            bucket_action: current,
        });
    }
    answers
}

/// Resolves once `stop` turns true (never, if its sender is gone without doing so).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    while !*stop.borrow_and_update() {
        next_change(stop).await;
    }
}

/// Resolves at the next change `receiver` has not seen; never once its sender is gone (a
/// limiter or a connection that ended sends nothing more).
pub(crate) async fn next_change<T>(receiver: &mut watch::Receiver<T>) {
    if receiver.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::rlqs::BucketId;

    /// An action whose id takes about 1 KiB.
    fn action(i: usize) -> BucketAction {
        BucketAction {
            bucket_id: Some(BucketId {
                bucket: [("k".to_owned(), format!("{i:01000}"))].into(),
            }),
            bucket_action: None,
        }
    }

    #[test]
    fn a_large_answer_is_split_in_order_and_an_empty_one_is_not_sent() {
        assert!(split(Vec::new()).is_empty());
        let answers = split((0..3000).map(action).collect());
        assert!(answers.len() >= 3);
        let sent: Vec<_> = answers
            .iter()
            .inspect(|answer| assert!(answer.encoded_len() <= MAX_ANSWER_BYTES))
            .flat_map(|answer| answer.bucket_action.iter().cloned())
            .collect();
        assert_eq!(sent, (0..3000).map(action).collect::<Vec<_>>());
    }
}
