//! Readiness: one latch behind both gRPC health and `GET /healthcheck`.
//!
//! SERVING once a config is loaded and the backend has answered; NOT_SERVING while the
//! backend stays unreachable longer than a short grace (one failed ping must not flap
//! every replica out of Envoy's pool), and from the moment shutdown starts, for good.
//!
//! With a rules gate ([`Health::require_rules`], the reference's
//! `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`), also NOT_SERVING while the rules in force
//! define no domain; the gate is re-read at every ping.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::time::Instant;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::backend::Backend;

/// The gRPC service name Envoy-facing health checks use besides `""`.
pub const RLS_SERVICE_NAME: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// How often the backend is pinged.
const PING_INTERVAL: Duration = Duration::from_millis(500);

/// Shared readiness state.
pub struct Health {
    reporter: HealthReporter,
    /// `floodgate_ready`: mirrors what was last published.
    ready_gauge: Gauge,
    ready: AtomicBool,
    /// The backend's last verdict (after the grace), apart from the rules gate.
    backend_ok: AtomicBool,
    rules_gate: OnceLock<RulesGate>,
    shutting_down: AtomicBool,
}

/// Whether rules worth serving are loaded.
type RulesGate = Box<dyn Fn() -> bool + Send + Sync>;

impl Health {
    /// Starts NOT_SERVING for both service names; every change is also set on `ready_gauge`.
    pub async fn new(reporter: HealthReporter, ready_gauge: Gauge) -> Arc<Health> {
        let health = Arc::new(Health {
            reporter,
            ready_gauge,
            ready: AtomicBool::new(false),
            backend_ok: AtomicBool::new(false),
            rules_gate: OnceLock::new(),
            shutting_down: AtomicBool::new(false),
        });
        health.publish(false).await;
        health
    }

    /// Be ready only while `has_rules` says so (set once, before serving).
    pub fn require_rules(&self, has_rules: impl Fn() -> bool + Send + Sync + 'static) {
        let _ = self.rules_gate.set(Box::new(has_rules));
    }

    /// Whether the service should receive traffic.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire) && !self.shutting_down.load(Ordering::Acquire)
    }

    /// Flips to NOT_SERVING for good: shutdown has started.
    pub async fn shut_down(&self) {
        self.shutting_down.store(true, Ordering::Release);
        self.ready.store(false, Ordering::Release);
        self.publish(false).await;
    }

    /// Pings the backend once and sets readiness from the answer (used at startup, so the
    /// service is ready by the time it announces its addresses when the backend answers).
    pub async fn check_once(&self, backend: &dyn Backend, timeout: Duration) {
        let ping = tokio::time::timeout(timeout, backend.ping()).await;
        self.set_backend(matches!(ping, Ok(Ok(())))).await;
    }

    async fn set_backend(&self, ok: bool) {
        self.backend_ok.store(ok, Ordering::Release);
        self.refresh().await;
    }

    /// Recomputes readiness from the backend verdict and the rules gate; publishes changes.
    async fn refresh(&self) {
        let rules_ok = self.rules_gate.get().is_none_or(|has_rules| has_rules());
        let ready = self.backend_ok.load(Ordering::Acquire)
            && rules_ok
            && !self.shutting_down.load(Ordering::Acquire);
        if self.ready.swap(ready, Ordering::AcqRel) != ready {
            tracing::info!(ready, "readiness changed");
            self.publish(ready).await;
        }
    }

    async fn publish(&self, ready: bool) {
        self.ready_gauge.set(i64::from(ready));
        let status = if ready {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        for name in ["", RLS_SERVICE_NAME] {
            self.reporter.set_service_status(name, status).await;
        }
    }

    /// Pings the backend forever, tracking readiness. `grace` is how long failures may last
    /// before the service reports NOT_SERVING; `timeout` bounds each ping.
    pub async fn monitor(
        self: Arc<Self>,
        backend: Arc<dyn Backend>,
        grace: Duration,
        timeout: Duration,
    ) {
        let mut failing_since: Option<Instant> = None;
        loop {
            tokio::time::sleep(PING_INTERVAL).await;
            let ping = tokio::time::timeout(timeout, backend.ping()).await;
            match ping {
                Ok(Ok(())) => {
                    if failing_since.take().is_some() {
                        tracing::info!(backend = backend.name(), "backend reachable again");
                    }
                    self.set_backend(true).await;
                }
                Ok(Err(_)) | Err(_) => {
                    let since = *failing_since.get_or_insert_with(|| {
                        tracing::warn!(backend = backend.name(), "backend ping failed");
                        Instant::now()
                    });
                    // Never ready before the first successful ping; after that, only
                    // once failures outlast the grace.
                    if !self.backend_ok.load(Ordering::Acquire) || since.elapsed() >= grace {
                        self.set_backend(false).await;
                    } else {
                        self.refresh().await;
                    }
                }
            }
        }
    }
}
