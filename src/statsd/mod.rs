//! StatsD and DogStatsD export (docs/operations.md#statsd): the counters of `/metrics` under
//! the reference service's StatsD names, pushed every flush interval, as envoyproxy/ratelimit
//! does with `USE_STATSD` (plain StatsD over TCP) or `USE_DOG_STATSD` (DogStatsD over UDP).
//!
//! Decisions never wait for StatsD: the limiter only bumps the atomic counters of
//! [`Metrics`]; a task of its own reads them each flush ([`lines`]) and writes one batch
//! through [`transport`], with every connect and write bounded by a deadline. Counters are
//! sent as deltas since the last flush the socket accepted, so a StatsD server that is down
//! loses no counts while floodgate runs: the next accepted flush carries them. Nothing queues
//! between flushes; a flush holds one line per series, and the series are the capped set
//! `/metrics` shows. Lines a flush could not hand to the socket are counted in
//! `floodgate_statsd_dropped_total`.
//!
//! No client crate fits: cadence (the maintained Rust StatsD client) sends over UDP and Unix
//! sockets only, while the reference's default sink is TCP, and its tags are DogStatsD-only,
//! while the reference's plain StatsD names carry tags as `.__key=value` suffixes.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

use crate::metrics::Metrics;

mod lines;
mod transport;

use lines::{Deltas, Encoder};
use transport::Transport;

/// Default interval between flushes: the reference's `STATS_FLUSH_INTERVAL`.
pub const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_secs(10);
/// Longest wait for a TCP connection (or a DNS answer) to the StatsD server.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Longest one flush may spend writing; what is not written by then waits for the next one.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// How lines travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Protocol {
    /// One TCP connection, newline-separated lines (the reference's gostats sink).
    #[default]
    Tcp,
    /// Datagrams of newline-separated lines, each at most 1432 bytes when lines allow.
    Udp,
}

/// How tags are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Flavor {
    /// Plain StatsD; tags become `.__key=value` name suffixes, as gostats writes them.
    #[default]
    Statsd,
    /// DogStatsD; tags follow the value as `|#key:value,...`.
    Dogstatsd,
}

/// A `key:value` tag added to every line (the reference's `EXTRA_TAGS`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tag {
    /// Tag name.
    pub key: String,
    /// Tag value.
    pub value: String,
}

impl FromStr for Tag {
    type Err = String;

    /// `key:value`; characters that would end a tag or a line are refused, not rewritten,
    /// so that the tag an operator wrote is the tag dashboards see.
    fn from_str(text: &str) -> Result<Tag, String> {
        let Some((key, value)) = text.trim().split_once(':') else {
            return Err(format!("`{text}` is not a tag: expected key:value"));
        };
        let breaks = |c: char| c.is_control() || matches!(c, ',' | '|' | '#' | '@');
        if key.is_empty() || key.contains(|c: char| breaks(c) || matches!(c, '=' | '.')) {
            return Err(format!(
                "`{text}`: a tag key is not empty and has none of , | # @ = . or control characters"
            ));
        }
        if value.contains(breaks) {
            return Err(format!(
                "`{text}`: a tag value has none of , | # @ or control characters"
            ));
        }
        Ok(Tag {
            key: key.to_owned(),
            value: value.to_owned(),
        })
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.key, self.value)
    }
}

/// Where and how to send.
#[derive(Debug, Clone, PartialEq)]
pub struct StatsdSettings {
    /// `host:port` of the StatsD server; the host is resolved at every (re)connect.
    pub addr: String,
    /// TCP or UDP.
    pub protocol: Protocol,
    /// Plain StatsD or DogStatsD lines.
    pub flavor: Flavor,
    /// Time between flushes; each sends what changed since the last.
    pub flush_interval: Duration,
    /// Tags added to every line.
    pub tags: Vec<Tag>,
}

/// The running sink: a task that flushes every interval until stopped.
pub struct Sink {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Sink {
    /// Starts flushing `metrics` to the server `settings` names. Never fails: an unreachable
    /// server is retried with backoff, and its lines are counted as dropped meanwhile.
    pub fn start(settings: StatsdSettings, metrics: Arc<Metrics>) -> Sink {
        tracing::info!(
            addr = %settings.addr,
            protocol = ?settings.protocol,
            flavor = ?settings.flavor,
            interval = ?settings.flush_interval,
            "sending StatsD"
        );
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(run(settings, metrics, stopped));
        Sink { stop, task }
    }

    /// Sends one last flush (what changed since the previous one, within the write
    /// timeout), then stops.
    pub async fn stop(self) {
        let Sink { stop, mut task } = self;
        let _ = stop.send(());
        let limit = CONNECT_TIMEOUT + WRITE_TIMEOUT + Duration::from_secs(1);
        if tokio::time::timeout(limit, &mut task).await.is_err() {
            task.abort();
        }
    }
}

async fn run(settings: StatsdSettings, metrics: Arc<Metrics>, mut stopped: oneshot::Receiver<()>) {
    let encoder = Encoder::new(settings.flavor, &settings.tags);
    let mut transport = Transport::new(settings.protocol, settings.addr);
    let mut deltas = Deltas::default();
    let mut ticker = tokio::time::interval_at(
        Instant::now() + settings.flush_interval,
        settings.flush_interval,
    );
    // A flush that overran its interval is followed by a full interval, not a burst.
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        let last = tokio::select! {
            _ = ticker.tick() => false,
            // Stopped, or the sink was dropped without a stop.
            _ = &mut stopped => true,
        };
        let batch = deltas.batch(&metrics, &encoder);
        let deadline = Instant::now() + WRITE_TIMEOUT;
        let delivered = transport
            .send(batch.payload(), batch.ends(), deadline)
            .await;
        let dropped = deltas.commit(batch, &delivered);
        if dropped > 0 {
            metrics.statsd_dropped.inc_by(dropped);
        }
        if last {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_parse_and_refuse_what_would_break_a_line() {
        let tag: Tag = "env:prod".parse().unwrap();
        assert_eq!((tag.key.as_str(), tag.value.as_str()), ("env", "prod"));
        let tag: Tag = "url:http://x".parse().unwrap();
        assert_eq!(tag.value, "http://x");
        for bad in [
            "env", ":prod", "a,b:c", "env:a|b", "env:a\nb", "k=1:v", "a.b:c",
        ] {
            assert!(bad.parse::<Tag>().is_err(), "{bad:?} accepted");
        }
    }
}
