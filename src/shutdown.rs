//! The shutdown signal: SIGTERM (Kubernetes) or SIGINT (a terminal), whichever comes first.

use std::future::Future;

/// Registers the signal handlers now and returns a future that resolves when the process is
/// asked to stop. Call it before announcing readiness: a signal that arrives before the
/// handlers exist would kill the process without a drain. Needs a Tokio runtime.
pub fn signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let terminate = signal(SignalKind::terminate());
        let interrupt = signal(SignalKind::interrupt());
        async move {
            let (mut terminate, mut interrupt) = match (terminate, interrupt) {
                (Ok(terminate), Ok(interrupt)) => (terminate, interrupt),
                (Err(error), _) | (_, Err(error)) => {
                    tracing::error!(%error, "cannot listen for SIGTERM/SIGINT");
                    return std::future::pending().await;
                }
            };
            tokio::select! {
                _ = terminate.recv() => tracing::info!("SIGTERM received"),
                _ = interrupt.recv() => tracing::info!("SIGINT received"),
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("interrupt received");
    }
}
