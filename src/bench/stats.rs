//! What a bench run counts: outcomes, a latency histogram, and optionally per-key results.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use serde::Serialize;

use super::client::Outcome;
use super::workload::Pick;

/// Highest latency the histogram tells apart, in microseconds (longer calls are recorded
/// as this): a minute, far beyond any call deadline.
const MAX_LATENCY_US: u64 = 60_000_000;

/// The `errors_by_code` entry of calls not sent because their deadline had passed.
const EXPIRED_UNSENT: &str = "ExpiredUnsent";

/// The `errors_by_code` entry of calls failed at once because every caller was busy.
const OVERFLOW: &str = "Overflow";

/// Counters every worker bumps, read once a second for the progress line.
#[derive(Debug, Default)]
pub struct Live {
    /// Calls answered or failed so far.
    pub done: AtomicU64,
    /// OK answers.
    pub ok: AtomicU64,
    /// OVER_LIMIT answers.
    pub over_limit: AtomicU64,
    /// Failed calls.
    pub errors: AtomicU64,
}

impl Live {
    fn count(&self, outcome: Outcome) {
        self.done.fetch_add(1, Ordering::Relaxed);
        let counter = match outcome {
            Outcome::Ok => &self.ok,
            Outcome::OverLimit => &self.over_limit,
            Outcome::Error(_) | Outcome::Expired | Outcome::Overflow => &self.errors,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// `(done, ok, over_limit, errors)` now.
    pub fn snapshot(&self) -> (u64, u64, u64, u64) {
        (
            self.done.load(Ordering::Relaxed),
            self.ok.load(Ordering::Relaxed),
            self.over_limit.load(Ordering::Relaxed),
            self.errors.load(Ordering::Relaxed),
        )
    }
}

/// One worker's results; merged into one at the end.
#[derive(Debug)]
pub struct Tally {
    latency_us: Histogram<u64>,
    /// Latency of answered calls (OK or OVER_LIMIT) only.
    answered_us: Histogram<u64>,
    /// Latency of UNAVAILABLE answers only: under overload, the calls the service shed.
    unavailable_us: Histogram<u64>,
    ok: u64,
    over_limit: u64,
    errors: u64,
    decisions: u64,
    errors_by_code: BTreeMap<String, u64>,
    record: Option<KeyRecord>,
}

/// One finished call.
#[derive(Debug, Clone, Copy)]
pub struct Call {
    /// What it asked.
    pub pick: Pick,
    /// How it ended.
    pub outcome: Outcome,
    /// From its intended (or, if earlier, actual) start to its end.
    pub latency: Duration,
    /// Descriptors it decided, when answered.
    pub descriptors: u64,
    /// Wall clock when it was sent and when it ended (for `--record`).
    pub sent: SystemTime,
    /// See `sent`.
    pub ended: SystemTime,
}

impl Tally {
    /// An empty tally; `record_window` keeps per-key results in windows of that length.
    pub fn new(record_window: Option<Duration>) -> Tally {
        let histogram =
            || Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("valid histogram bounds");
        Tally {
            latency_us: histogram(),
            answered_us: histogram(),
            unavailable_us: histogram(),
            ok: 0,
            over_limit: 0,
            errors: 0,
            decisions: 0,
            errors_by_code: BTreeMap::new(),
            record: record_window.map(|window| KeyRecord {
                window_secs: window.as_secs().max(1),
                ..KeyRecord::default()
            }),
        }
    }

    /// Counts one call here and in `live`.
    pub fn add(&mut self, call: Call, live: &Live) {
        live.count(call.outcome);
        let micros = u64::try_from(call.latency.as_micros()).unwrap_or(u64::MAX);
        if !matches!(call.outcome, Outcome::Expired | Outcome::Overflow) {
            // A call never sent has no latency to count.
            self.latency_us.saturating_record(micros.max(1));
        }
        match call.outcome {
            Outcome::Ok | Outcome::OverLimit => self.answered_us.saturating_record(micros.max(1)),
            Outcome::Error(tonic::Code::Unavailable) => {
                self.unavailable_us.saturating_record(micros.max(1));
            }
            Outcome::Error(_) | Outcome::Expired | Outcome::Overflow => {}
        }
        match call.outcome {
            Outcome::Ok => self.ok += 1,
            Outcome::OverLimit => self.over_limit += 1,
            Outcome::Error(code) => self.count_error(format!("{code:?}")),
            Outcome::Expired => self.count_error(EXPIRED_UNSENT.to_owned()),
            Outcome::Overflow => self.count_error(OVERFLOW.to_owned()),
        }
        if matches!(call.outcome, Outcome::Ok | Outcome::OverLimit) {
            self.decisions += call.descriptors;
        }
        if let (Some(record), Pick::Key(key)) = (&mut self.record, call.pick) {
            record.add(key, call);
        }
    }

    fn count_error(&mut self, kind: String) {
        self.errors += 1;
        *self.errors_by_code.entry(kind).or_default() += 1;
    }

    /// Adds `other` into this tally.
    pub fn merge(&mut self, other: Tally) {
        for (mine, theirs) in [
            (&mut self.latency_us, &other.latency_us),
            (&mut self.answered_us, &other.answered_us),
            (&mut self.unavailable_us, &other.unavailable_us),
        ] {
            mine.add(theirs).expect("histograms of equal bounds");
        }
        self.ok += other.ok;
        self.over_limit += other.over_limit;
        self.errors += other.errors;
        self.decisions += other.decisions;
        for (code, count) in other.errors_by_code {
            *self.errors_by_code.entry(code).or_default() += count;
        }
        if let (Some(mine), Some(theirs)) = (&mut self.record, other.record) {
            mine.merge(theirs);
        }
    }

    /// Calls counted.
    pub fn calls(&self) -> u64 {
        self.ok + self.over_limit + self.errors
    }

    /// Answered calls that took at most `deadline`.
    fn answered_within(&self, deadline: Duration) -> u64 {
        let micros = u64::try_from(deadline.as_micros()).unwrap_or(u64::MAX);
        self.answered_us
            .count_between(1, micros.min(MAX_LATENCY_US))
    }

    /// The per-key results, if kept.
    pub fn record(&self) -> Option<&KeyRecord> {
        self.record.as_ref()
    }

    /// The run's summary, over `elapsed`, with every call's deadline `deadline`.
    pub fn summary(&self, mode: Mode, elapsed: Duration, deadline: Duration) -> Summary {
        let seconds = elapsed.as_secs_f64().max(f64::EPSILON);
        let answered = self.ok + self.over_limit;
        Summary {
            mode,
            elapsed_s: round3(seconds),
            requests: self.calls(),
            requests_per_s: round1(self.calls() as f64 / seconds),
            decisions: self.decisions,
            decisions_per_s: round1(self.decisions as f64 / seconds),
            ok: self.ok,
            over_limit: self.over_limit,
            errors: self.errors,
            errors_by_code: self.errors_by_code.clone(),
            answered_per_s: round1(answered as f64 / seconds),
            in_time_per_s: round1(self.answered_within(deadline) as f64 / seconds),
            latency_us: Latency::of(&self.latency_us),
            answered_latency_us: Latency::of(&self.answered_us),
            unavailable_latency_us: Latency::of(&self.unavailable_us),
        }
    }
}

fn round1(value: f64) -> f64 {
    (value * 10.0).round() / 10.0
}

fn round3(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

/// How calls were started.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "loop", rename_all = "snake_case")]
pub enum Mode {
    /// A fixed number of calls in flight.
    Closed {
        /// Calls in flight.
        concurrency: usize,
    },
    /// Calls started at a fixed rate.
    Open {
        /// Intended calls per second.
        rate_per_s: f64,
        /// Most calls in flight at once.
        max_in_flight: usize,
    },
}

/// The JSON line printed at the end of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// How calls were started.
    pub mode: Mode,
    /// Run time in seconds.
    pub elapsed_s: f64,
    /// Calls made (answered or failed).
    pub requests: u64,
    /// Calls per second.
    pub requests_per_s: f64,
    /// Descriptors decided: each answered call counts its descriptors.
    pub decisions: u64,
    /// Decisions per second.
    pub decisions_per_s: f64,
    /// Calls answered OK.
    pub ok: u64,
    /// Calls answered OVER_LIMIT.
    pub over_limit: u64,
    /// Calls that failed (gRPC error, deadline, unknown code).
    pub errors: u64,
    /// Failed calls by gRPC code; `ExpiredUnsent` counts open-loop calls not sent because
    /// their deadline passed while they waited for a free caller, `Overflow` those failed at
    /// once because every caller was busy (`--fail-when-busy`).
    pub errors_by_code: BTreeMap<String, u64>,
    /// Calls answered (OK or OVER_LIMIT) per second, including answers that came after the
    /// deadline (the generator waits 100 ms past it, to see the service's own answer).
    pub answered_per_s: f64,
    /// Calls answered within their deadline per second: the goodput, as a caller that gives
    /// up at the deadline (Envoy) sees it.
    pub in_time_per_s: f64,
    /// Latency percentiles of the calls sent, in microseconds.
    pub latency_us: Latency,
    /// Latency of the answered calls only.
    pub answered_latency_us: Latency,
    /// Latency of the UNAVAILABLE answers only (under overload: how fast shed calls are
    /// answered).
    pub unavailable_latency_us: Latency,
}

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Latency {
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    #[serde(rename = "p99.9")]
    pub p99_9: u64,
    /// Slowest call.
    pub max: u64,
    /// Mean.
    pub mean: f64,
}

impl Latency {
    /// The percentiles of `histogram` (all 0 when it is empty).
    fn of(histogram: &Histogram<u64>) -> Latency {
        let quantile = |q: f64| histogram.value_at_quantile(q);
        Latency {
            p50: quantile(0.50),
            p90: quantile(0.90),
            p99: quantile(0.99),
            p99_9: quantile(0.999),
            max: histogram.max(),
            mean: round1(histogram.mean()),
        }
    }
}

/// Per-key results of `--record`: OK answers per fixed window (epoch-aligned, as floodgate's
/// fixed windows are) and failed calls per second.
///
/// A call sent in one window and answered in the next may have been decided in either: it
/// is counted apart, as ambiguous, so a check of OK counts against a limit can be exact for
/// the certain ones and bounded for the rest.
#[derive(Debug, Default)]
pub struct KeyRecord {
    window_secs: u64,
    ok: HashMap<(u64, u64), u32>,
    ok_ambiguous: HashMap<(u64, u64), u32>,
    errors: HashMap<(u64, u64), u32>,
}

fn unix_secs(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl KeyRecord {
    fn add(&mut self, key: u64, call: Call) {
        let (sent, ended) = (unix_secs(call.sent), unix_secs(call.ended));
        match call.outcome {
            Outcome::Ok => {
                let window = |secs: u64| secs / self.window_secs * self.window_secs;
                let map = if window(sent) == window(ended) {
                    &mut self.ok
                } else {
                    &mut self.ok_ambiguous
                };
                *map.entry((key, window(sent))).or_default() += 1;
            }
            Outcome::Error(_) | Outcome::Expired | Outcome::Overflow => {
                *self.errors.entry((key, sent)).or_default() += 1;
            }
            Outcome::OverLimit => {}
        }
    }

    fn merge(&mut self, other: KeyRecord) {
        for (mine, theirs) in [
            (&mut self.ok, other.ok),
            (&mut self.ok_ambiguous, other.ok_ambiguous),
            (&mut self.errors, other.errors),
        ] {
            for (at, count) in theirs {
                *mine.entry(at).or_default() += count;
            }
        }
    }

    /// The record as JSON: `{"window_secs", "keys": [{"key", "value", "redis_key", "ok":
    /// {window_start: n}, "ok_ambiguous": {window_start_of_send: n}, "errors": {unix_second:
    /// n}}]}`, one entry per key that saw an OK or an error.
    pub fn to_json(
        &self,
        value_of: impl Fn(u64) -> String,
        redis_key_of: impl Fn(&str) -> Option<String>,
    ) -> serde_json::Value {
        let mut keys: BTreeMap<u64, serde_json::Map<String, serde_json::Value>> = BTreeMap::new();
        for (name, map) in [
            ("ok", &self.ok),
            ("ok_ambiguous", &self.ok_ambiguous),
            ("errors", &self.errors),
        ] {
            for (&(key, at), &count) in map {
                let entry = keys.entry(key).or_default();
                let counts = entry
                    .entry(name)
                    .or_insert_with(|| serde_json::Value::Object(Default::default()));
                counts[at.to_string()] = count.into();
            }
        }
        let keys: Vec<serde_json::Value> = keys
            .into_iter()
            .map(|(key, mut entry)| {
                let value = value_of(key);
                entry.insert("redis_key".into(), redis_key_of(&value).into());
                entry.insert("value".into(), value.into());
                entry.insert("key".into(), key.into());
                serde_json::Value::Object(entry)
            })
            .collect();
        serde_json::json!({"window_secs": self.window_secs, "keys": keys})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(outcome: Outcome, latency_us: u64, sent: u64, ended: u64) -> Call {
        Call {
            pick: Pick::Key(3),
            outcome,
            latency: Duration::from_micros(latency_us),
            descriptors: 5,
            sent: UNIX_EPOCH + Duration::from_secs(sent),
            ended: UNIX_EPOCH + Duration::from_secs(ended),
        }
    }

    #[test]
    fn summary_counts_outcomes_decisions_and_percentiles() {
        let live = Live::default();
        let mut first = Tally::new(None);
        let mut second = Tally::new(None);
        for latency in 1..=1000 {
            let outcome = match latency % 10 {
                0 => Outcome::Error(tonic::Code::Unavailable),
                1 => Outcome::OverLimit,
                _ => Outcome::Ok,
            };
            let tally = if latency % 2 == 0 {
                &mut first
            } else {
                &mut second
            };
            tally.add(call(outcome, latency, 0, 0), &live);
        }
        first.merge(second);
        let deadline = Duration::from_micros(500);
        let summary = first.summary(
            Mode::Closed { concurrency: 4 },
            Duration::from_secs(2),
            deadline,
        );
        assert_eq!(summary.requests, 1000);
        assert_eq!(summary.answered_per_s, 450.0);
        // Of latencies 1..=500 us, 450 were answered (every tenth is UNAVAILABLE).
        assert_eq!(summary.in_time_per_s, 225.0);
        assert_eq!(
            (summary.ok, summary.over_limit, summary.errors),
            (800, 100, 100)
        );
        assert_eq!(summary.decisions, 900 * 5);
        assert_eq!(summary.decisions_per_s, 2250.0);
        assert_eq!(summary.errors_by_code["Unavailable"], 100);
        assert!((499..=501).contains(&summary.latency_us.p50));
        assert!((989..=991).contains(&summary.latency_us.p99));
        assert!((998..=1000).contains(&summary.latency_us.p99_9));
        assert_eq!(live.snapshot(), (1000, 800, 100, 100));
        let line = serde_json::to_string(&summary).unwrap();
        assert!(
            line.contains(r#""p99.9":"#) && line.contains(r#""loop":"closed""#),
            "{line}"
        );
    }

    #[test]
    fn record_splits_window_straddlers_from_certain_oks() {
        let live = Live::default();
        let mut tally = Tally::new(Some(Duration::from_secs(60)));
        tally.add(call(Outcome::Ok, 10, 120, 121), &live);
        tally.add(call(Outcome::Ok, 10, 179, 180), &live);
        tally.add(
            call(Outcome::Error(tonic::Code::Unavailable), 10, 200, 201),
            &live,
        );
        tally.add(call(Outcome::OverLimit, 10, 130, 130), &live);
        let json = tally.record().unwrap().to_json(
            |key| format!("v{key}"),
            |value| Some(format!("fg:{{{value}}}")),
        );
        let key = &json["keys"][0];
        assert_eq!(json["window_secs"], 60);
        assert_eq!(key["value"], "v3");
        assert_eq!(key["redis_key"], "fg:{v3}");
        assert_eq!(key["ok"]["120"], 1);
        assert_eq!(key["ok_ambiguous"]["120"], 1);
        assert_eq!(key["errors"]["200"], 1);
    }
}
