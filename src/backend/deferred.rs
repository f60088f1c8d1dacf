//! Lets the service start while its Redis is still unreachable.
//!
//! In Kubernetes, floodgate and its Redis often start together. Rather than exit and be
//! restarted with growing back-off, the service starts NOT_SERVING, answers requests by its
//! failure mode, and keeps connecting in the background; once connected it delegates every
//! call to the real backend and health turns SERVING.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;

use super::{Backend, BackendError, Group, Outcome, Refund};

/// Pause before the first retry; each failure doubles it.
const FIRST_RETRY: Duration = Duration::from_millis(100);
/// Longest pause between attempts.
const MAX_RETRY: Duration = Duration::from_secs(5);

/// One connection attempt.
pub type Connect = Box<
    dyn Fn() -> Pin<Box<dyn Future<Output = Result<Arc<dyn Backend>, BackendError>> + Send>>
        + Send
        + Sync,
>;

/// A backend that is connected in the background.
pub struct Deferred {
    name: &'static str,
    inner: Arc<OnceLock<Arc<dyn Backend>>>,
}

impl Deferred {
    /// Starts connecting with `connect` until it succeeds (doubling pauses up to 5 s).
    /// Must be called within a Tokio runtime.
    pub fn spawn(name: &'static str, connect: Connect) -> Deferred {
        let inner = Arc::new(OnceLock::new());
        let slot = Arc::clone(&inner);
        tokio::spawn(async move {
            let mut pause = FIRST_RETRY;
            loop {
                tokio::time::sleep(pause).await;
                match connect().await {
                    Ok(backend) => {
                        tracing::info!(backend = name, "backend connected");
                        let _ = slot.set(backend);
                        return;
                    }
                    Err(error) => {
                        tracing::warn!(backend = name, %error, retry_in = ?pause, "backend still unreachable");
                        pause = (pause * 2).min(MAX_RETRY);
                    }
                }
            }
        });
        Deferred { name, inner }
    }

    fn backend(&self) -> Result<&Arc<dyn Backend>, BackendError> {
        self.inner
            .get()
            .ok_or_else(|| BackendError::Unavailable("not connected yet".into()))
    }
}

#[async_trait]
impl Backend for Deferred {
    async fn decide(&self, group: &Group) -> Result<Vec<Outcome>, BackendError> {
        self.backend()?.decide(group).await
    }

    async fn refund(&self, refunds: &[Refund]) -> Result<(), BackendError> {
        self.backend()?.refund(refunds).await
    }

    async fn ping(&self) -> Result<(), BackendError> {
        self.backend()?.ping().await
    }

    fn name(&self) -> &'static str {
        self.name
    }

    async fn side_call(&self, call: &super::SideCall) -> Result<::redis::Value, BackendError> {
        self.backend()?.side_call(call).await
    }

    fn queue_wait(&self, items: usize) -> std::time::Duration {
        self.backend().map_or(std::time::Duration::ZERO, |backend| {
            backend.queue_wait(items)
        })
    }
}
