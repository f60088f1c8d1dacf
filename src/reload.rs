//! Hot reload of the rules: on a change in the config directory (or the candidate rules'
//! directory), or on SIGHUP.
//!
//! The directory itself is watched (not recursively), which also sees the Kubernetes
//! ConfigMap update: the `..data` symlink is atomically replaced next to the files. Bursts
//! of events are debounced into one reload. A valid config swaps in atomically; an invalid
//! one keeps the old rules, logs every error and counts `config_load_error`.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;

use crate::config;
use crate::limiter::Limiter;
use crate::matcher::Matcher;

/// Quiet time after the last event before reloading, so an editor's or kubelet's burst of
/// writes becomes one reload.
const DEBOUNCE: Duration = Duration::from_millis(200);

/// The directories rules are read from.
#[derive(Debug, Clone, Default)]
pub struct RuleDirs {
    /// The live rules (none when they come from xDS).
    pub rules: Option<PathBuf>,
    /// The candidate rules (`--candidate-config`).
    pub candidates: Option<PathBuf>,
}

impl RuleDirs {
    fn each(&self) -> impl Iterator<Item = &PathBuf> {
        self.rules.iter().chain(&self.candidates)
    }
}

/// Reloads `dirs` into `limiter` whenever one changes or SIGHUP arrives; runs until aborted.
///
/// The SIGHUP handler is installed before this returns its future, so a SIGHUP sent once the
/// service announced its addresses reloads instead of killing the process.
pub fn watch(dirs: RuleDirs, limiter: Arc<Limiter>) -> impl Future<Output = ()> + Send + 'static {
    let hangups = hangup_signals();
    async move { watch_with(dirs, limiter, hangups).await }
}

#[cfg(unix)]
type Hangups = Option<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
type Hangups = Option<()>;

fn hangup_signals() -> Hangups {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::hangup()) {
            Ok(hangups) => Some(hangups),
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGHUP");
                None
            }
        }
    }
    #[cfg(not(unix))]
    None
}

async fn watch_with(dirs: RuleDirs, limiter: Arc<Limiter>, hangups: Hangups) {
    let (tx, mut rx) = mpsc::channel::<()>(16);
    let watcher_tx = tx.clone();
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // Reading the files (our own reload included) raises access events: only changes
        // count. A watcher error (e.g. a queue overflow) may hide a change: reload to be sure.
        let changed = match &event {
            Ok(event) => !matches!(event.kind, EventKind::Access(_)),
            Err(error) => {
                tracing::warn!(%error, "config watcher error; reloading to be safe");
                true
            }
        };
        if changed {
            let _ = watcher_tx.try_send(());
        }
    });
    let _watcher = match watcher {
        Ok(mut watcher) => {
            for dir in dirs.each() {
                if let Err(error) = watcher.watch(dir, RecursiveMode::NonRecursive) {
                    tracing::warn!(%error, dir = %dir.display(), "cannot watch a rules directory; reload on SIGHUP only");
                }
            }
            Some(watcher)
        }
        Err(error) => {
            tracing::warn!(%error, "no file watcher available; reload on SIGHUP only");
            None
        }
    };
    let forwarder = tokio::spawn(forward_sighup(hangups, tx));
    let _stop_forwarder = AbortOnDrop(forwarder);
    // Changes made between the startup load and the watch being set up raised no event.
    reload_all(&dirs, &limiter).await;
    while rx.recv().await.is_some() {
        // Debounce: keep draining until the directory is quiet.
        while let Ok(Some(())) = tokio::time::timeout(DEBOUNCE, rx.recv()).await {}
        reload_all(&dirs, &limiter).await;
    }
}

async fn forward_sighup(hangups: Hangups, tx: mpsc::Sender<()>) {
    #[cfg(unix)]
    if let Some(mut hangups) = hangups {
        while hangups.recv().await.is_some() {
            tracing::info!("SIGHUP: reloading config");
            if tx.send(()).await.is_err() {
                return;
            }
        }
    }
    #[cfg(not(unix))]
    drop((hangups, tx));
}

/// Aborts a task when the watcher that owns it is dropped (aborted at shutdown).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn reload_all(dirs: &RuleDirs, limiter: &Limiter) {
    if let Some(dir) = &dirs.rules {
        reload(dir, limiter).await;
    }
    if let Some(dir) = &dirs.candidates {
        reload_candidates(dir, limiter).await;
    }
}

/// Reads `dir` off the async threads, with the limiter's default accounting applied.
async fn load(
    dir: &Path,
    limiter: &Limiter,
) -> Result<Result<config::LoadedConfig, config::ConfigErrors>, tokio::task::JoinError> {
    let owned = dir.to_path_buf();
    let accounting = limiter.accounting();
    tokio::task::spawn_blocking(move || {
        config::load_dir(&owned).map(|mut loaded| {
            config::apply_default_accounting(&mut loaded.domains, accounting);
            loaded
        })
    })
    .await
}

/// Loads the candidate rules of `dir` and swaps them in, or keeps the old ones and reports
/// every error; the live rules and their load counters are untouched either way (a bad
/// candidate counts in `floodgate_candidate_config_load_error`).
pub async fn reload_candidates(dir: &Path, limiter: &Limiter) {
    let metrics = limiter.metrics();
    match load(dir, limiter).await {
        Ok(Ok(loaded))
            if limiter
                .candidates()
                .is_some_and(|rules| rules.compiled_from(&loaded.domains)) => {}
        Ok(Ok(loaded)) => {
            limiter.replace_candidates(Some(Matcher::new(loaded.domains)));
            tracing::info!(dir = %dir.display(), "candidate rules reloaded");
        }
        Ok(Err(errors)) => {
            metrics.candidates.load_errors.inc();
            for error in &errors.0 {
                tracing::error!(%error, "candidate rules rejected; keeping the previous ones");
            }
        }
        Err(error) => {
            metrics.candidates.load_errors.inc();
            tracing::error!(%error, "candidate rules reload failed; keeping the previous ones");
        }
    }
}

/// Loads `dir` and swaps it in, or keeps the old rules and reports every error.
pub async fn reload(dir: &Path, limiter: &Limiter) {
    let loaded = load(dir, limiter).await;
    let metrics = limiter.metrics();
    match loaded {
        Ok(Ok(loaded)) if limiter.rules().compiled_from(&loaded.domains) => {
            // Nothing changed (a touched file, the startup reread): keep the rules and the
            // local cache as they are.
            metrics.config_load_success.inc();
            tracing::debug!("config unchanged");
        }
        Ok(Ok(loaded)) => {
            let domains = loaded.domains.len();
            limiter.replace_rules(Matcher::new(loaded.domains));
            metrics.config_load_success.inc();
            tracing::info!(
                domains,
                rules = limiter.rules().rules().len(),
                "config reloaded"
            );
        }
        Ok(Err(errors)) => {
            metrics.config_load_error.inc();
            for error in &errors.0 {
                tracing::error!(%error, "config reload rejected; keeping the previous rules");
            }
        }
        Err(error) => {
            metrics.config_load_error.inc();
            tracing::error!(%error, "config reload failed; keeping the previous rules");
        }
    }
}
