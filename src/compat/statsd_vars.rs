//! The stats variables: `USE_STATSD`, `USE_DOG_STATSD`, `STATSD_HOST`, `STATSD_PORT`,
//! `EXTRA_TAGS`, `STATS_FLUSH_INTERVAL` / `GOSTATS_FLUSH_INTERVAL_SECONDS` and
//! `DISABLE_STATS` onto the StatsD flags.
//!
//! The reference sends StatsD over TCP to localhost:8125 unless told otherwise. floodgate
//! does so when `USE_STATSD=true`, or when `USE_STATSD` is unset and `STATSD_HOST` or
//! `STATSD_PORT` names a server; with neither, it sends nothing, and a deployment that uses
//! reference variables gets one warning at startup saying so (a default that would connect
//! to a port nobody may listen on is not taken silently, nor dropped silently).

use super::*;
use crate::statsd::{Flavor, Protocol};

const STATSD_ADDR: Setting = setting("--statsd-addr");
const STATSD_PROTOCOL: Setting = setting("--statsd-protocol");
const STATSD_FLAVOR: Setting = setting("--statsd-flavor");
const STATSD_FLUSH_INTERVAL: Setting = setting("--statsd-flush-interval");

/// The reference's StatsD host when `STATSD_HOST` is unset.
const REFERENCE_STATSD_HOST: &str = "localhost";
/// The reference's StatsD port when `STATSD_PORT` is unset.
const REFERENCE_STATSD_PORT: u16 = 8125;

/// Logged when the reference's default (StatsD on) is not followed.
pub(super) const STATSD_OFF_NOTICE: &str = "USE_STATSD is unset: the reference would send StatsD over TCP to \
     localhost:8125; floodgate sends StatsD only with USE_STATSD=true, STATSD_HOST / STATSD_PORT \
     or --statsd-addr (Prometheus metrics are at /metrics on the admin port)";

impl Mapper<'_> {
    /// Chooses the sink as the reference does: `DISABLE_STATS` first, then `USE_DOG_STATSD`
    /// (UDP, DogStatsD tags), then `USE_STATSD` (TCP).
    pub(super) fn statsd(&mut self, args: &mut ServeArgs) -> Result<(), ReferenceEnvError> {
        if self.parse("DISABLE_STATS", parse_bool)? == Some(true) {
            if self.claim(STATSD_ADDR, &["DISABLE_STATS"]) {
                args.statsd.statsd_addr = None;
            }
            return Ok(());
        }
        let use_statsd = self.parse("USE_STATSD", parse_bool)?;
        let use_dog = self.parse("USE_DOG_STATSD", parse_bool)? == Some(true);
        if use_dog && use_statsd == Some(true) {
            return Err(invalid(
                "USE_DOG_STATSD",
                "goes with USE_STATSD=false: the reference sends to one stats sink",
            ));
        }
        let names_server = self.is_set("STATSD_HOST") || self.is_set("STATSD_PORT");
        let on = use_dog || use_statsd.unwrap_or(names_server);
        if !on {
            let reference_in_use = !self.report.applied.is_empty();
            let prometheus = self.parse("USE_PROMETHEUS", parse_bool).ok().flatten() == Some(true);
            if use_statsd.is_none()
                && reference_in_use
                && !prometheus
                && !self.explicit(STATSD_ADDR)
            {
                self.report.notices.push(STATSD_OFF_NOTICE);
            }
            return Ok(());
        }
        let switches = ["USE_STATSD", "USE_DOG_STATSD", "STATSD_HOST", "STATSD_PORT"];
        if self.claim(STATSD_ADDR, &switches) {
            let host = self
                .get("STATSD_HOST")
                .unwrap_or_else(|| REFERENCE_STATSD_HOST.to_owned());
            let port = self
                .parse("STATSD_PORT", |value| match value.parse::<u16>() {
                    Ok(port) if port != 0 => Ok(port),
                    _ => Err(BadValue::NotA {
                        value: value.to_owned(),
                        expected: "a port number",
                    }),
                })?
                .unwrap_or(REFERENCE_STATSD_PORT);
            let bracketed = host.contains(':') && !host.starts_with('[');
            args.statsd.statsd_addr = Some(if bracketed {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            });
        }
        if use_dog {
            if self.claim(STATSD_PROTOCOL, &["USE_DOG_STATSD"]) {
                args.statsd.statsd_protocol = Protocol::Udp;
            }
            if self.claim(STATSD_FLAVOR, &["USE_DOG_STATSD"]) {
                args.statsd.statsd_flavor = Flavor::Dogstatsd;
            }
        }
        self.flush_interval(args)?;
        self.rows(args, Gate::Statsd)
    }

    /// `STATS_FLUSH_INTERVAL` (a Go duration), else gostats' own
    /// `GOSTATS_FLUSH_INTERVAL_SECONDS` (whole seconds), which older reference releases used.
    fn flush_interval(&mut self, args: &mut ServeArgs) -> Result<(), ReferenceEnvError> {
        let positive = |duration: std::time::Duration| {
            if duration.is_zero() {
                Err(BadValue::NotA {
                    value: "0".to_owned(),
                    expected: "a flush interval longer than 0",
                })
            } else {
                Ok(GoDuration(duration))
            }
        };
        if self.is_set("STATS_FLUSH_INTERVAL") {
            if self.is_set("GOSTATS_FLUSH_INTERVAL_SECONDS") {
                self.warn(
                    "GOSTATS_FLUSH_INTERVAL_SECONDS",
                    "STATS_FLUSH_INTERVAL is set and decides the flush interval",
                );
            }
            if self.claim(STATSD_FLUSH_INTERVAL, &["STATS_FLUSH_INTERVAL"])
                && let Some(interval) = self.parse("STATS_FLUSH_INTERVAL", |value| {
                    positive(parse_go_duration(value)?)
                })?
            {
                args.statsd.statsd_flush_interval = interval;
            }
        } else if self.claim(STATSD_FLUSH_INTERVAL, &["GOSTATS_FLUSH_INTERVAL_SECONDS"])
            && let Some(interval) = self.parse("GOSTATS_FLUSH_INTERVAL_SECONDS", |value| {
                let seconds = value.parse::<u64>().map_err(|_| BadValue::NotA {
                    value: value.to_owned(),
                    expected: "a number of seconds",
                })?;
                positive(std::time::Duration::from_secs(seconds))
            })?
        {
            args.statsd.statsd_flush_interval = interval;
        }
        Ok(())
    }
}
