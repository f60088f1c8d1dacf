//! The flags of the StatsD sink (docs/operations.md#statsd): off unless `--statsd-addr`
//! names a server (or the reference's `USE_STATSD` / `USE_DOG_STATSD` ask for one).

use super::FlagError;
use clap::Args;

use super::GoDuration;
use crate::statsd::{Flavor, Protocol, StatsdSettings, Tag};

/// Default of `--statsd-flush-interval`: the reference's `STATS_FLUSH_INTERVAL`.
pub const DEFAULT_STATSD_FLUSH_INTERVAL: &str = "10s";

/// StatsD / DogStatsD export.
#[derive(Debug, Clone, Args)]
pub struct StatsdArgs {
    /// StatsD server as HOST:PORT; turns the StatsD sink on. The host is resolved at every
    /// reconnect.
    #[arg(long, env = "FLOODGATE_STATSD_ADDR", value_name = "HOST:PORT")]
    pub statsd_addr: Option<String>,
    /// Transport: `tcp` (newline-separated lines on one connection, the reference's
    /// USE_STATSD) or `udp` (the reference's USE_DOG_STATSD).
    #[arg(long, env = "FLOODGATE_STATSD_PROTOCOL", value_name = "PROTOCOL", value_enum, default_value_t = Protocol::Tcp)]
    pub statsd_protocol: Protocol,
    /// Line format: `statsd` (tags as `.__key=value` name suffixes, as the reference's
    /// gostats writes them) or `dogstatsd` (tags as `|#key:value,...`).
    #[arg(long, env = "FLOODGATE_STATSD_FLAVOR", value_name = "FLAVOR", value_enum, default_value_t = Flavor::Statsd)]
    pub statsd_flavor: Flavor,
    /// Time between flushes (Go syntax: 10s, 1m); each sends counters' change since the
    /// last one and gauges' values.
    #[arg(long, env = "FLOODGATE_STATSD_FLUSH_INTERVAL", value_name = "DURATION", default_value = DEFAULT_STATSD_FLUSH_INTERVAL)]
    pub statsd_flush_interval: GoDuration,
    /// Tags added to every line, comma-separated `key:value` pairs.
    #[arg(
        long,
        env = "FLOODGATE_STATSD_TAGS",
        value_name = "KEY:VALUE[,...]",
        value_delimiter = ','
    )]
    pub statsd_tags: Vec<Tag>,
}

impl StatsdArgs {
    /// The sink's settings, or `None` when StatsD is off.
    ///
    /// # Errors
    /// An address that is not `host:port`, or a zero flush interval.
    pub fn settings(&self) -> Result<Option<StatsdSettings>, FlagError> {
        let Some(addr) = self.statsd_addr.as_deref().map(str::trim) else {
            return Ok(None);
        };
        if addr.is_empty() {
            return Ok(None);
        }
        let port = addr.rsplit_once(':').filter(|(host, _)| !host.is_empty());
        if !port.is_some_and(|(_, port)| port.parse::<u16>().is_ok_and(|port| port != 0)) {
            return Err(FlagError::NotHostPort {
                flag: "--statsd-addr",
                value: addr.to_owned(),
            });
        }
        if self.statsd_flush_interval.0.is_zero() {
            return Err(FlagError::OutOfRange {
                flag: "--statsd-flush-interval",
                expected: "longer than 0",
            });
        }
        Ok(Some(StatsdSettings {
            addr: addr.to_owned(),
            protocol: self.statsd_protocol,
            flavor: self.statsd_flavor,
            flush_interval: self.statsd_flush_interval.0,
            tags: self.statsd_tags.clone(),
        }))
    }
}
