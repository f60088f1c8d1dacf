//! `floodgate bench` options: what to send, how hard, for how long.
//!
//! Every run is bounded twice: by `--duration` always, and by `--count` when given. Targets
//! are loopback only, so a mistyped address cannot load someone else's service.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use clap::Args;

use super::BenchError;
use crate::duration::GoDuration;

use super::envoy_quota::{Fallback, Restart};

/// Default run length.
pub const DEFAULT_DURATION: &str = "10s";
/// Longest run accepted: a forgotten bench never loads a machine for more than an hour.
pub const MAX_DURATION: Duration = Duration::from_secs(3600);
/// Most distinct keys accepted (bounds the memory of the request pool).
pub const MAX_KEYS: u64 = 100_000_000;
/// Most descriptors per request accepted.
pub const MAX_DESCRIPTORS: usize = 64;
/// Most distinct keys `--record` may follow (it keeps counters per key and window).
pub const MAX_RECORDED_KEYS: u64 = 100_000;

/// Drive a running floodgate with ShouldRateLimit calls and report throughput and latency.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// gRPC address of the service (loopback only).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8081")]
    pub target: SocketAddr,
    /// Calls in flight: fixed (closed loop), or the most allowed at once with `--rate`.
    #[arg(long, value_name = "N", default_value_t = 64,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100_000))]
    pub concurrency: usize,
    /// Open loop: start calls at this fixed rate (e.g. `20000/s`, `600/m`), latency measured
    /// from each call's intended start, so a stalled service shows as latency, not as a
    /// lower rate.
    #[arg(long, value_name = "N/s")]
    pub rate: Option<Rate>,
    /// With `--rate`: a call due while all `--concurrency` calls are in flight fails at once
    /// (counted as `Overflow`, not sent) instead of waiting for one to end, as Envoy fails a
    /// call past its circuit breaker (`max_requests`, 1,024 by default). Without it such a
    /// call is sent late, with what is left of its deadline, or not at all once none is.
    #[arg(long, requires = "rate")]
    pub fail_when_busy: bool,
    /// Run time (e.g. `30s`, `2m`, `500ms`); the run also stops after `--count` calls.
    #[arg(long, value_name = "DURATION", default_value = DEFAULT_DURATION, value_parser = parse_duration)]
    pub duration: Duration,
    /// Stop after this many calls.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,
    /// HTTP/2 connections the calls are spread over (per replica). With `--rlqs`, more where
    /// one would carry over 500 streams.
    #[arg(long, value_name = "N", default_value_t = 4,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=256))]
    pub connections: usize,
    /// Distinct descriptor values (buckets) the calls are spread over, uniformly at random.
    #[arg(long, value_name = "N", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..=MAX_KEYS))]
    pub keys: u64,
    /// Descriptors per request: descriptor `j` of key `v` has the value `v` (j = 0) or
    /// `v.j`, so each is its own bucket of the same rule.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=MAX_DESCRIPTORS as u64))]
    pub descriptors: usize,
    /// Domain of every request.
    #[arg(long, value_name = "NAME", default_value = "bench")]
    pub domain: String,
    /// Descriptor entry key of the spread traffic.
    #[arg(long, value_name = "NAME", default_value = "user")]
    pub key: String,
    /// Share of calls (0 to 1) sent instead to one descriptor `(--over-limit-key, hot)`,
    /// meant for a rule with a tiny limit, so that share is answered OVER_LIMIT.
    #[arg(long, value_name = "FRACTION", default_value_t = 0.0, value_parser = parse_share)]
    pub over_limit_share: f64,
    /// Descriptor entry key of the over-limit traffic.
    #[arg(long, value_name = "NAME", default_value = "tiny")]
    pub over_limit_key: String,
    /// Deadline of one call (sent as `grpc-timeout`); a call past it counts as an error.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Write per-key results here (JSON): OK counts per fixed window of `--record-window`
    /// and errors per second, to check admitted counts against limits across replicas.
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// Window of the `--record` OK counts; aligned to the Unix epoch like floodgate's fixed
    /// windows.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub record_window: Duration,
    /// With `--record`: the rules directory, so each key's Redis key (and so its cluster
    /// slot) is written beside it.
    #[arg(long, value_name = "DIR", requires = "record")]
    pub record_config: Option<PathBuf>,
    /// With `--record-config`: the service's `--key-prefix`.
    #[arg(long, value_name = "STR", default_value = crate::backend::keys::DEFAULT_KEY_PREFIX)]
    pub record_key_prefix: String,
    /// No progress line on stderr.
    #[arg(long)]
    pub quiet: bool,
    /// Run simulated Envoys on quota (RLQS) streams instead of ShouldRateLimit calls; prints
    /// what they admitted per window against `--rlqs-limit` and the push latency.
    #[arg(long)]
    pub rlqs: bool,
    /// With `--rlqs`: simulated Envoys, one stream each.
    #[arg(long, value_name = "N", default_value_t = 2,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100_000))]
    pub rlqs_streams: usize,
    /// With `--rlqs`: buckets each Envoy reports, `{--key: b<i>}`, the same on every Envoy.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=10_000))]
    pub rlqs_buckets: usize,
    /// With `--rlqs`: requests each Envoy offers each bucket.
    #[arg(long, value_name = "N/s", default_value = "100/s")]
    pub rlqs_offered: Rate,
    /// With `--rlqs`: the rule's limit per `--rlqs-window`, for the admitted ratio.
    #[arg(long, value_name = "N")]
    pub rlqs_limit: Option<u64>,
    /// With `--rlqs`: the rule's window; admitted counts are per epoch-aligned window.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub rlqs_window: Duration,
    /// With `--rlqs`: windows starting within this time of the start are not counted, nor
    /// are the reports sent within it timed (Envoy's first reports and assignments take a
    /// few 5 s rounds).
    #[arg(long, value_name = "DURATION", default_value = "20s", value_parser = parse_duration)]
    pub rlqs_warmup: Duration,
    /// With `--rlqs`: what an Envoy does before its first assignment and after one expires.
    #[arg(long, value_name = "MODE", value_enum, default_value_t = Fallback::Allow)]
    pub rlqs_no_assignment: Fallback,
    /// With `--rlqs`: how an Envoy starts a token bucket whose assignment changed: at the
    /// old bucket's fill ratio (Envoy 1.33 and later), or full (Envoy 1.32 and older).
    #[arg(long, value_name = "MODE", value_enum, default_value_t = Restart::FillRatio)]
    pub rlqs_restart: Restart,
    /// With `--rlqs`: another replica's gRPC address (repeatable); streams alternate over
    /// `--target` and these.
    #[arg(long, value_name = "ADDR")]
    pub rlqs_replica: Vec<SocketAddr>,
}

impl BenchArgs {
    /// Checks what the flags alone cannot: a loopback target and bounds that go together.
    ///
    /// # Errors
    /// The first problem, as a sentence.
    pub fn check(&self) -> Result<(), BenchError> {
        let out_of_range = |flag, expected: &str| BenchError::OutOfRange {
            flag,
            expected: expected.to_owned(),
        };
        if !self.target.ip().is_loopback() {
            return Err(BenchError::NotLoopback {
                flag: "--target",
                addr: self.target,
            });
        }
        if self.duration.is_zero() || self.duration > MAX_DURATION {
            let expected = format!("between 1ms and {}s", MAX_DURATION.as_secs());
            return Err(out_of_range("--duration", &expected));
        }
        if self.timeout.is_zero() {
            return Err(out_of_range("--timeout", "positive"));
        }
        if self.record.is_some() {
            if self.keys > MAX_RECORDED_KEYS {
                return Err(BenchError::TooManyRecordedKeys {
                    max: MAX_RECORDED_KEYS,
                    keys: self.keys,
                });
            }
            if self.record_window < Duration::from_secs(1) {
                return Err(out_of_range("--record-window", "at least 1s"));
            }
        }
        if let Some(&addr) = self
            .rlqs_replica
            .iter()
            .find(|addr| !addr.ip().is_loopback())
        {
            return Err(BenchError::NotLoopback {
                flag: "--rlqs-replica",
                addr,
            });
        }
        if self.rlqs_window.is_zero() {
            return Err(out_of_range("--rlqs-window", "positive"));
        }
        if self.domain.is_empty() || self.key.is_empty() || self.over_limit_key.is_empty() {
            return Err(BenchError::EmptyName);
        }
        Ok(())
    }
}

/// Calls started per second in open-loop mode.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate(f64);

impl Rate {
    /// Calls per second.
    pub fn per_second(self) -> f64 {
        self.0
    }

    /// Time between two intended call starts.
    pub fn interval(self) -> Duration {
        Duration::from_secs_f64(1.0 / self.0)
    }
}

impl FromStr for Rate {
    type Err = String;

    /// `N`, `N/s`, `N/m` (per minute) or `N/h`; N may be fractional, between one call per
    /// hour and ten million per second.
    fn from_str(text: &str) -> Result<Rate, String> {
        let (number, per) = match text.trim().split_once('/') {
            Some((number, unit)) => {
                let per = match unit.trim() {
                    "s" | "sec" | "second" => 1.0,
                    "m" | "min" | "minute" => 60.0,
                    "h" | "hour" => 3600.0,
                    other => return Err(format!("unknown rate unit `{other}` (use s, m or h)")),
                };
                (number, per)
            }
            None => (text, 1.0),
        };
        let count: f64 = number
            .trim()
            .parse()
            .map_err(|_| format!("`{text}` is not a rate like 5000/s"))?;
        let per_second = count / per;
        if !(per_second.is_finite() && (1.0 / 3600.0..=10_000_000.0).contains(&per_second)) {
            return Err(format!("rate `{text}` is out of range (1/h to 10000000/s)"));
        }
        Ok(Rate(per_second))
    }
}

/// A duration in Go's syntax (`250ms`, `30s`, `1m30s`), as every duration flag of `serve`.
///
/// # Errors
/// Not a Go duration.
fn parse_duration(text: &str) -> Result<Duration, String> {
    text.parse::<GoDuration>().map(|duration| duration.0)
}

fn parse_share(text: &str) -> Result<f64, String> {
    let share: f64 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a fraction between 0 and 1"))?;
    if (0.0..=1.0).contains(&share) {
        Ok(share)
    } else {
        Err(format!("`{text}` is not a fraction between 0 and 1"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command, with_default_command};
    use clap::Parser;
    use std::ffi::OsString;

    fn parse(args: &[&str]) -> Result<BenchArgs, Box<dyn std::error::Error>> {
        let argv = ["floodgate", "bench"]
            .into_iter()
            .chain(args.iter().copied());
        match Cli::try_parse_from(with_default_command(argv.map(OsString::from))) {
            Ok(cli) => match cli.into_command() {
                Command::Bench(args) => Ok(args.check().map(|()| args)?),
                other => panic!("expected bench, got {other:?}"),
            },
            Err(error) => Err(error.into()),
        }
    }

    #[test]
    fn defaults_are_a_bounded_closed_loop_on_loopback() {
        let args = parse(&[]).unwrap();
        assert_eq!(args.target, "127.0.0.1:8081".parse().unwrap());
        assert_eq!(args.concurrency, 64);
        assert_eq!(args.rate, None);
        assert_eq!(args.duration, Duration::from_secs(10));
        assert_eq!(args.count, None);
        assert_eq!(args.keys, 10_000);
        assert_eq!(args.descriptors, 1);
        assert_eq!((args.domain.as_str(), args.key.as_str()), ("bench", "user"));
        assert_eq!(args.over_limit_share, 0.0);
    }

    #[test]
    fn every_option_parses() {
        let args = parse(&[
            "--target",
            "[::1]:9000",
            "--concurrency",
            "512",
            "--rate",
            "1500/s",
            "--duration",
            "2m",
            "--count",
            "1000",
            "--connections",
            "8",
            "--keys",
            "1000000",
            "--descriptors",
            "5",
            "--domain",
            "d",
            "--key",
            "k",
            "--over-limit-share",
            "0.25",
            "--over-limit-key",
            "hot",
            "--timeout",
            "250ms",
            "--quiet",
        ])
        .unwrap();
        assert_eq!(args.target.port(), 9000);
        assert_eq!(args.concurrency, 512);
        assert_eq!(args.rate.unwrap().per_second(), 1500.0);
        assert_eq!(args.duration, Duration::from_secs(120));
        assert_eq!(args.count, Some(1000));
        assert_eq!(args.connections, 8);
        assert_eq!(args.keys, 1_000_000);
        assert_eq!(args.descriptors, 5);
        assert_eq!(args.over_limit_share, 0.25);
        assert_eq!(args.over_limit_key, "hot");
        assert_eq!(args.timeout, Duration::from_millis(250));
        assert!(args.quiet);
    }

    #[test]
    fn rates_and_durations_accept_their_units() {
        assert_eq!("600/m".parse::<Rate>().unwrap().per_second(), 10.0);
        assert_eq!("7200/h".parse::<Rate>().unwrap().per_second(), 2.0);
        assert_eq!("250".parse::<Rate>().unwrap().per_second(), 250.0);
        assert_eq!(
            "4/s".parse::<Rate>().unwrap().interval(),
            Duration::from_millis(250)
        );
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("30").is_err(), "a bare number has no unit");
    }

    #[test]
    fn bad_options_are_refused_with_a_reason() {
        for args in [
            &["--target", "10.0.0.1:8081"][..],
            &["--target", "example.com:8081"],
            &["--rate", "0/s"],
            &["--rate", "fast"],
            &["--rate", "5/fortnight"],
            &["--rate", "1e12/s"],
            &["--duration", "0s"],
            &["--duration", "2h"],
            &["--duration", "soon"],
            &["--count", "0"],
            &["--concurrency", "0"],
            &["--keys", "0"],
            &["--descriptors", "0"],
            &["--descriptors", "65"],
            &["--over-limit-share", "1.5"],
            &["--over-limit-share", "-0.1"],
            &["--timeout", "0ms"],
            &["--domain", ""],
            &["--record", "out.json", "--keys", "1000000"],
            &["--record-config", "config"],
        ] {
            let error = parse(args).expect_err(&format!("{args:?} accepted"));
            assert!(!error.to_string().is_empty(), "{args:?}");
        }
    }
}
