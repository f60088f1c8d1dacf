//! Hot reload of the rules: on a change in the config directory, or on SIGHUP.
//!
//! The directory itself is watched (not recursively), which also sees the Kubernetes
//! ConfigMap update: the `..data` symlink is atomically replaced next to the files. Bursts
//! of events are debounced into one reload. A valid config swaps in atomically; an invalid
//! one keeps the old rules, logs every error and counts `config_load_error`.

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

/// Reloads `dir` into `limiter` whenever it changes or SIGHUP arrives; runs until aborted.
pub async fn watch(dir: PathBuf, limiter: Arc<Limiter>) {
    let (tx, mut rx) = mpsc::channel::<()>(16);
    let watcher_tx = tx.clone();
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // Reading the files (our own reload included) raises access events: only changes count.
        let changed = event.is_ok_and(|event| !matches!(event.kind, EventKind::Access(_)));
        if changed {
            let _ = watcher_tx.try_send(());
        }
    });
    let _watcher = match watcher {
        Ok(mut watcher) => match watcher.watch(&dir, RecursiveMode::NonRecursive) {
            Ok(()) => Some(watcher),
            Err(error) => {
                tracing::warn!(%error, dir = %dir.display(), "cannot watch the config directory; reload on SIGHUP only");
                None
            }
        },
        Err(error) => {
            tracing::warn!(%error, "no file watcher available; reload on SIGHUP only");
            None
        }
    };
    tokio::spawn(forward_sighup(tx));
    // Changes made between the startup load and the watch being set up raised no event.
    reload(&dir, &limiter).await;
    while rx.recv().await.is_some() {
        // Debounce: keep draining until the directory is quiet.
        while let Ok(Some(())) = tokio::time::timeout(DEBOUNCE, rx.recv()).await {}
        reload(&dir, &limiter).await;
    }
}

async fn forward_sighup(tx: mpsc::Sender<()>) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut hangups) = signal(SignalKind::hangup()) else {
            tracing::warn!("cannot listen for SIGHUP");
            return;
        };
        while hangups.recv().await.is_some() {
            tracing::info!("SIGHUP: reloading config");
            if tx.send(()).await.is_err() {
                return;
            }
        }
    }
    #[cfg(not(unix))]
    drop(tx);
}

/// Loads `dir` and swaps it in, or keeps the old rules and reports every error.
pub async fn reload(dir: &Path, limiter: &Limiter) {
    let owned = dir.to_path_buf();
    let loaded = tokio::task::spawn_blocking(move || config::load_dir(&owned)).await;
    let metrics = limiter.metrics();
    match loaded {
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
