//! The Rate Limit Quota Service (RLQS): Envoy's streaming quota protocol, served from the
//! same rules and backend buckets as ShouldRateLimit (docs/rlqs.md).
//!
//! Envoy enforces each bucket itself and reports its usage on one long-lived stream; the
//! server books the reports into the bucket ShouldRateLimit charges and pushes each stream
//! a share of what is left. `validate` checks a message, `stream` holds one stream's
//! buckets, `ledger` talks to the backend, `assign` sizes assignments, `wire` encodes them.

pub mod assign;
pub mod ledger;
pub mod stream;
pub mod validate;
mod wire;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::limiter::Limiter;
use crate::proto::rlqs::rate_limit_quota_service_server::RateLimitQuotaService;
use crate::proto::rlqs::{RateLimitQuotaResponse, RateLimitQuotaUsageReports};

use ledger::Ledger;
use stream::{Shared, Stream};

/// Default `--rlqs-max-buckets`.
pub const DEFAULT_MAX_BUCKETS: usize = 10_000;
/// Default `--rlqs-abandon-after`.
pub const DEFAULT_ABANDON_AFTER: Duration = Duration::from_secs(60);
/// Answers queued for a client that does not read them, before the stream waits for it.
const QUEUED_ANSWERS: usize = 16;

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
    /// which ends every open stream (so a shutdown can drain).
    pub fn new(limiter: Arc<Limiter>, settings: RlqsSettings, stop: watch::Receiver<bool>) -> Self {
        let ledger = Ledger::new(Arc::clone(limiter.backend()), limiter.backend_timeout());
        let metrics = limiter.metrics().rlqs.clone();
        QuotaService {
            shared: Arc::new(Shared {
                limiter,
                ledger,
                settings,
                metrics,
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
        let stream = Stream::new(Arc::clone(&self.shared));
        tokio::spawn(serve(
            stream,
            request.into_inner(),
            answers,
            self.stop.clone(),
        ));
        Ok(Response::new(ReceiverStream::new(receiver)))
    }
}

/// Runs one stream: answers reports, pushes what time changes, and ends on a bad message,
/// when the client goes away, or at shutdown.
async fn serve(
    mut stream: Stream,
    mut reports: Streaming<RateLimitQuotaUsageReports>,
    answers: mpsc::Sender<Result<RateLimitQuotaResponse, Status>>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let wake = stream.next_wake();
        let actions = tokio::select! {
            report = reports.message() => match report {
                Ok(Some(report)) => match stream.report(report).await {
                    Ok(actions) => actions,
                    Err(status) => {
                        let _ = answers.send(Err(status)).await;
                        return;
                    }
                },
                // The client closed its side, or the transport failed: nothing to answer.
                Ok(None) | Err(_) => return,
            },
            () = tokio::time::sleep_until(wake) => stream.tick().await,
            () = stopped(&mut stop) => return,
            () = answers.closed() => return,
        };
        if actions.is_empty() {
            continue;
        }
        let answer = RateLimitQuotaResponse {
            bucket_action: actions,
        };
        if answers.send(Ok(answer)).await.is_err() {
            return;
        }
    }
}

/// Resolves once `stop` turns true (never, if its sender is gone without doing so).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    loop {
        let now = *stop.borrow_and_update();
        if now {
            return;
        }
        if stop.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
