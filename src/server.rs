//! Wires the service together: config, backend, limiter, gRPC (RLS, RLQS, health), admin HTTP,
//! config reload, readiness, and graceful shutdown.
//!
//! `Server::bind` does everything that can fail at startup (load rules, reach the backend,
//! bind both ports) and exposes the bound addresses; `Server::serve` runs until the shutdown
//! future resolves, then reports NOT_SERVING, stops accepting, and drains in-flight calls
//! within the drain timeout.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::admin::{self, AdminState};
use crate::backend::{self, Backend, BackendError, BackendSettings};
use crate::config::{self, ConfigErrors};
use crate::headers::HeaderMode;
use crate::health::Health;
use crate::limiter::regions::{RegionSettings, Regions};
use crate::limiter::{Limiter, LimiterOptions};
use crate::listener::{self, GrpcLimits, ResetCounter, UnixSocketListener};
use crate::matcher::Matcher;
use crate::metrics::Metrics;
use crate::otel::TracingSettings;
use crate::overload::Admission;
use crate::proto::rlqs::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use crate::proto::rls::rate_limit_service_server::RateLimitServiceServer;
use crate::reload;
use crate::rlqs::{QuotaService, RlqsSettings};
use crate::rules::OnOverLimit;
use crate::service::RlsService;
use crate::statsd::{Sink, StatsdSettings};
use crate::tls::{self, ReloadingAcceptor, TlsError, TlsFiles};
use crate::xds::{XdsClient, XdsSettings};

/// How long backend pings may fail before readiness drops: long enough that one lost ping
/// does not pull every replica out of rotation at once.
const BACKEND_FAILURE_GRACE: Duration = Duration::from_secs(1);

/// Everything `serve` needs, independent of how it was given (flags, env, tests).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Directory of YAML domain files.
    pub config_dir: PathBuf,
    /// Directory of candidate rules (`--candidate-config`), evaluated beside the live ones.
    pub candidate_dir: Option<PathBuf>,
    /// Address for RLS + gRPC health (`host:port`; port 0 picks one), or `unix:PATH` for a
    /// unix socket instead of TCP.
    pub grpc_addr: String,
    /// Address for admin HTTP.
    pub http_addr: String,
    /// Which backend, and how to reach it.
    pub backend: BackendSettings,
    /// Limiter behaviour (timeouts, failure mode, shadow mode, local cache); its
    /// `accounting` is set from `on_over_limit` and the rules' source.
    pub limiter: LimiterOptions,
    /// `--on-over-limit`: the accounting of rules that do not set their own, overriding
    /// the default of their source (files `reject`, xDS `consume`).
    pub on_over_limit: Option<OnOverLimit>,
    /// Response headers to add.
    pub header_mode: HeaderMode,
    /// How long in-flight calls may take to finish after shutdown starts.
    pub drain_timeout: Duration,
    /// Pause between reporting NOT_SERVING and closing the listeners, so load balancers
    /// stop sending first.
    pub shutdown_grace: Duration,
    /// Most per-rule metric series built from request values (`--max-metric-series`).
    pub max_metric_series: usize,
    /// TLS for the gRPC listener; plaintext when None. The admin port is always plaintext.
    pub grpc_tls: Option<TlsFiles>,
    /// Bounds on gRPC connections and messages.
    pub grpc_limits: GrpcLimits,
    /// Latency target of overload shedding ([`crate::overload`]); None turns it off.
    pub overload_target: Option<Duration>,
    /// Whether the admin port answers `POST /json` (which spends real quota).
    pub admin_json: bool,
    /// Rules from an xDS management server instead of `config_dir`.
    pub xds: Option<XdsSettings>,
    /// Serving and readiness before rules arrive.
    pub startup: Startup,
    /// Answer with dynamic metadata (`--response-dynamic-metadata`).
    pub response_dynamic_metadata: bool,
    /// OpenTelemetry tracing, when on. The exporter is started by the caller (it belongs
    /// to the process's `tracing` subscriber); the server only creates the spans.
    pub tracing: Option<TracingSettings>,
    /// StatsD / DogStatsD export, when on.
    pub statsd: Option<StatsdSettings>,
    /// The quota service (RLQS) served beside RLS.
    pub rlqs: RlqsSettings,
    /// One budget across regions (`--region`), when on.
    pub regions: Option<RegionSettings>,
}

/// Serving and readiness without rules, as the reference's `FORCE_START_WITHOUT_INITIAL_CONFIG`
/// and `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED` (both off by default, as there).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Startup {
    /// xDS: bind and serve at once instead of waiting for the first rules; until they
    /// arrive, calls are answered UNAVAILABLE (Envoy's failure mode decides).
    pub force_start_without_initial_config: bool,
    /// Report NOT_SERVING while the rules in force define no domain.
    pub ready_only_with_rules: bool,
}

/// Why the server could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The rules did not load.
    #[error("invalid config:\n{0}")]
    Config(#[from] ConfigErrors),
    /// The candidate rules (`--candidate-config`) did not load.
    #[error("invalid candidate rules:\n{0}")]
    Candidates(ConfigErrors),
    /// The backend could not be set up.
    #[error("backend: {0}")]
    Backend(#[from] BackendError),
    /// The gRPC TLS files did not load.
    #[error("gRPC TLS: {0}")]
    Tls(#[from] TlsError),
    /// A listener could not be bound.
    #[error("cannot bind {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// A server stopped with an error.
    #[error("{0}")]
    Serve(String),
}

/// A started, bound, not yet serving floodgate.
pub struct Server {
    settings: Settings,
    grpc_listener: GrpcListener,
    http_listener: TcpListener,
    limiter: Arc<Limiter>,
    backend: Arc<dyn Backend>,
    tls: Option<Arc<ReloadingAcceptor>>,
    xds: Option<XdsClient>,
}

impl Server {
    /// Loads the rules (or, with xDS, subscribes and waits for the first ones unless forced
    /// to start without), connects the backend and binds both listeners.
    ///
    /// # Errors
    /// Invalid config, unreachable backend setup, or an address that cannot be bound.
    pub async fn bind(settings: Settings) -> Result<Server, ServerError> {
        let tls = match settings.grpc_tls.clone() {
            Some(files) => Some(
                tokio::task::spawn_blocking(move || ReloadingAcceptor::load(files))
                    .await
                    .map_err(|e| ServerError::Serve(e.to_string()))??,
            ),
            None => None,
        };
        let metrics = Arc::new(Metrics::with_max_series(settings.max_metric_series));
        let source = match settings.xds {
            Some(_) => config::RuleSource::Xds,
            None => config::RuleSource::Files,
        };
        let mut options = settings.limiter.clone();
        options.accounting = config::default_accounting(source, settings.on_over_limit);
        let domains = if settings.xds.is_some() {
            Vec::new()
        } else {
            let dir = settings.config_dir.clone();
            let mut loaded = tokio::task::spawn_blocking(move || config::load_dir(&dir))
                .await
                .map_err(|e| ServerError::Serve(e.to_string()))??;
            metrics.config_load_success.inc();
            config::apply_default_accounting(&mut loaded.domains, options.accounting);
            loaded.domains
        };
        let backend = backend::connect(&settings.backend).await?;
        let evicting = Arc::clone(&backend);
        metrics.export_evictions(move || evicting.evictions());
        if matches!(settings.backend, BackendSettings::Memory { .. }) {
            // The memory backend answers as fast as the cache would, and exactly.
            options.local_cache_entries = 0;
        }
        let candidates = match settings.candidate_dir.clone() {
            Some(dir) => {
                let accounting = options.accounting;
                let loaded = tokio::task::spawn_blocking(move || config::load_dir(&dir))
                    .await
                    .map_err(|e| ServerError::Serve(e.to_string()))?;
                let mut loaded = loaded.map_err(ServerError::Candidates)?;
                metrics.config_load_success.inc();
                config::apply_default_accounting(&mut loaded.domains, accounting);
                Some(Matcher::new(loaded.domains))
            }
            None => None,
        };
        let mut limiter = Limiter::new(
            Matcher::new(domains),
            Arc::clone(&backend),
            metrics,
            options,
        );
        if let Some(regions) = &settings.regions {
            let replica = Arc::clone(limiter.registry().id());
            limiter = limiter.with_regions(Arc::new(Regions::connect(regions, replica).await?));
        }
        let limiter = Arc::new(limiter);
        limiter.replace_candidates(candidates);
        let xds = settings
            .xds
            .clone()
            .map(|xds| XdsClient::start(xds, Arc::clone(&limiter)));
        if let Some(client) = &xds
            && !settings.startup.force_start_without_initial_config
        {
            tracing::info!("waiting for the first rules from the xDS server");
            client.first_update().await;
        }
        let grpc_listener = GrpcListener::bind(&settings.grpc_addr).await?;
        let http_listener = bind(&settings.http_addr).await?;
        Ok(Server {
            settings,
            grpc_listener,
            http_listener,
            limiter,
            backend,
            tls,
            xds,
        })
    }

    /// The bound gRPC TCP address; None on a unix socket.
    pub fn grpc_addr(&self) -> Option<SocketAddr> {
        match &self.grpc_listener {
            GrpcListener::Tcp(listener) => listener.local_addr().ok(),
            GrpcListener::Unix(_) => None,
        }
    }

    /// The bound gRPC address as the startup log shows it: `host:port`, or `unix:PATH`.
    pub fn grpc_endpoint(&self) -> String {
        match (&self.grpc_listener, self.grpc_addr()) {
            (GrpcListener::Tcp(_), Some(addr)) => addr.to_string(),
            (GrpcListener::Tcp(_), None) => self.settings.grpc_addr.clone(),
            (GrpcListener::Unix(listener), _) => {
                format!("{UNIX_PREFIX}{}", listener.path().display())
            }
        }
    }

    /// The bound admin HTTP address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_listener
            .local_addr()
            .expect("bound listener has an address")
    }

    /// Serves until `shutdown` resolves, then drains.
    ///
    /// # Errors
    /// A server failed while running.
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        let started = tokio::time::Instant::now();
        // Created first: this installs the SIGHUP handler before the addresses are announced.
        // With xDS the rules come from the stream, not the directory.
        let dirs = reload::RuleDirs {
            rules: self.xds.is_none().then(|| self.settings.config_dir.clone()),
            candidates: self.settings.candidate_dir.clone(),
        };
        let reloader = (dirs.rules.is_some() || dirs.candidates.is_some())
            .then(|| reload::watch(dirs, Arc::clone(&self.limiter)));
        let (reporter, health_service) = tonic_health::server::health_reporter();
        let health = Health::new(reporter, self.limiter.metrics().ready.clone()).await;
        if self.settings.startup.ready_only_with_rules {
            let limiter = Arc::clone(&self.limiter);
            health.require_rules(move || !limiter.rules().compiled_from(&[]));
        }
        health
            .check_once(self.backend.as_ref(), self.settings.limiter.backend_timeout)
            .await;
        let (grpc_addr, http_addr) = (self.grpc_endpoint(), self.http_addr());
        tracing::info!(
            backend = self.backend.name(),
            ready = health.is_ready(),
            "floodgate listening grpc_addr={grpc_addr} http_addr={http_addr}"
        );
        // Under failure mode `local` a replica that once reached Redis can decide without
        // it, so an outage does not take it out of rotation.
        let grace = match self.limiter.local_fallback() {
            Some(_) => Duration::MAX,
            None => BACKEND_FAILURE_GRACE,
        };
        let monitor = tokio::spawn(Arc::clone(&health).monitor(
            Arc::clone(&self.backend),
            grace,
            self.settings.limiter.backend_timeout,
        ));
        let reloader = reloader.map(tokio::spawn);
        // On a shared backend: say this replica is alive, from the first tick.
        let shared = !matches!(self.settings.backend, BackendSettings::Memory { .. });
        let registry = shared.then(|| Arc::clone(self.limiter.registry()));
        let heartbeat = registry.clone().map(|registry| {
            tokio::spawn(registry.run(
                Arc::clone(&self.backend),
                Arc::clone(self.limiter.metrics()),
            ))
        });
        // Regions: every period, demand out, leases in and out.
        let leases = self.limiter.regions().map(|regions| {
            tokio::spawn(Arc::clone(regions).run(
                Arc::clone(&self.backend),
                Arc::clone(self.limiter.metrics()),
            ))
        });
        let statsd = self
            .settings
            .statsd
            .clone()
            .map(|statsd| Sink::start(statsd, Arc::clone(self.limiter.metrics())));

        let admission = self.settings.overload_target.map(|target| {
            self.limiter.metrics().shed_reasons_from_zero();
            let backend = Arc::clone(&self.backend);
            Arc::new(
                Admission::new(target)
                    .with_queue_wait(Box::new(move |items| backend.queue_wait(items))),
            )
        });
        let mut service = RlsService::new(Arc::clone(&self.limiter), self.settings.header_mode)
            .with_dynamic_metadata(self.settings.response_dynamic_metadata)
            .with_tracing(self.settings.tracing.is_some())
            .with_admission(admission.clone());
        if let Some(client) = &self.xds {
            service = service.with_rules_gate(client.applied());
        }
        let (stop_tx, stop_rx) = watch::channel(false);
        let stop_rx_for_grpc = stop_rx.clone();
        let stopped = move || {
            let mut rx = stop_rx.clone();
            async move {
                let _ = rx.wait_for(|stop| *stop).await;
            }
        };
        let max_message = self.settings.grpc_limits.max_message_bytes;
        let quota = QuotaService::new(
            Arc::clone(&self.limiter),
            self.settings.rlqs,
            admission.clone(),
            stop_rx_for_grpc.clone(),
        );
        let routes = tonic::service::Routes::new(
            health_service
                .max_decoding_message_size(max_message)
                .max_encoding_message_size(max_message),
        )
        .add_service(
            RateLimitServiceServer::new(service.clone()).max_decoding_message_size(max_message),
        )
        .add_service(
            // Envoy puts every bucket it holds in one report.
            RateLimitQuotaServiceServer::new(quota)
                .max_decoding_message_size(max_message.max(crate::rlqs::MAX_REPORT_BYTES)),
        )
        .prepare();
        let tls_watch = self
            .tls
            .as_ref()
            .map(|tls| tokio::spawn(Arc::clone(tls).watch(tls::RELOAD_INTERVAL)));
        let (tls, limits) = (self.tls.clone(), self.settings.grpc_limits.clone());
        let resets = ResetCounter::new(self.limiter.metrics().http2_resets.clone());
        let mut grpc = match self.grpc_listener {
            GrpcListener::Tcp(tcp) => tokio::spawn(listener::serve(
                tcp,
                routes,
                tls,
                limits,
                resets,
                stop_rx_for_grpc,
            )),
            GrpcListener::Unix(unix) => tokio::spawn(listener::serve(
                unix,
                routes,
                tls,
                limits,
                resets,
                stop_rx_for_grpc,
            )),
        };
        let admin = axum::serve(
            self.http_listener,
            admin::router(AdminState {
                service,
                limiter: Arc::clone(&self.limiter),
                health: Arc::clone(&health),
                json_enabled: self.settings.admin_json,
                info: admin::ServiceInfo {
                    started,
                    backend: self.backend.name(),
                    config_source: if self.xds.is_some() { "xds" } else { "files" },
                },
            }),
        )
        .with_graceful_shutdown(stopped());
        let mut admin = tokio::spawn(admin.into_future());

        let failed = tokio::select! {
            () = shutdown => None,
            result = &mut grpc => Some(format!("gRPC server stopped: {result:?}")),
            result = &mut admin => Some(format!("admin server stopped: {result:?}")),
        };
        tracing::info!("shutting down: reporting NOT_SERVING and draining");
        // Stop the pinger first, so it cannot publish SERVING after NOT_SERVING.
        monitor.abort();
        health.shut_down().await;
        if failed.is_none() {
            tokio::time::sleep(self.settings.shutdown_grace).await;
        }
        let _ = stop_tx.send(true);
        let drained = tokio::time::timeout(self.settings.drain_timeout, async {
            let _ = (&mut grpc).await;
            let _ = (&mut admin).await;
        })
        .await;
        if drained.is_err() {
            tracing::warn!("drain timeout passed with calls still in flight; closing them");
            grpc.abort();
            admin.abort();
        }
        if let Some(reloader) = reloader {
            reloader.abort();
        }
        if let Some(heartbeat) = heartbeat {
            heartbeat.abort();
        }
        if let Some(leases) = leases {
            leases.abort();
        }
        if let Some(registry) = registry {
            // Drained: nothing more is decided here, so nobody need keep this share.
            registry.leave(self.backend.as_ref()).await;
        }
        if let Some(tls_watch) = tls_watch {
            tls_watch.abort();
        }
        if let Some(statsd) = statsd {
            statsd.stop().await;
        }
        match failed {
            Some(message) => Err(ServerError::Serve(message)),
            None => {
                tracing::info!("shutdown complete");
                Ok(())
            }
        }
    }
}

/// How `Settings::grpc_addr` names a unix socket.
pub const UNIX_PREFIX: &str = "unix:";

/// Where gRPC is served: TCP, or a unix socket instead.
enum GrpcListener {
    Tcp(TcpListener),
    Unix(UnixSocketListener),
}

impl GrpcListener {
    async fn bind(addr: &str) -> Result<GrpcListener, ServerError> {
        let Some(path) = addr.strip_prefix(UNIX_PREFIX) else {
            return bind(addr).await.map(GrpcListener::Tcp);
        };
        UnixSocketListener::bind(Path::new(path))
            .await
            .map(GrpcListener::Unix)
            .map_err(|source| ServerError::Bind {
                addr: addr.to_owned(),
                source,
            })
    }
}

async fn bind(addr: &str) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind {
            addr: addr.to_owned(),
            source,
        })
}
