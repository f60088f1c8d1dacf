//! Durations written as Go writes them (`300ms`, `1h30m`, `1.5h`, `0`): the reference
//! service's variables (`GRPC_MAX_CONNECTION_AGE=24h`) use this syntax, and floodgate's own
//! duration flags accept the same, so a value can move between the two unchanged.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A non-negative duration parsed from Go's syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct GoDuration(pub Duration);

/// Longest accepted duration (Go's own limit is about 292 years): a hundred years.
const MAX_SECONDS: f64 = 100.0 * 365.0 * 86_400.0;

impl FromStr for GoDuration {
    type Err = String;

    fn from_str(text: &str) -> Result<GoDuration, String> {
        let invalid = || format!("`{text}` is not a duration (e.g. 30s, 1h30m, 500ms, 0)");
        let trimmed = text.trim();
        if trimmed == "0" {
            return Ok(GoDuration(Duration::ZERO));
        }
        if trimmed.is_empty() || trimmed.starts_with(['-', '+']) {
            return Err(invalid());
        }
        let mut rest = trimmed;
        let mut seconds = 0.0_f64;
        while !rest.is_empty() {
            let number_end = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .ok_or_else(invalid)?;
            let (number, tail) = rest.split_at(number_end);
            let unit_end = tail
                .find(|c: char| c.is_ascii_digit() || c == '.')
                .unwrap_or(tail.len());
            let (unit, tail) = tail.split_at(unit_end);
            if number.is_empty() || number == "." {
                return Err(invalid());
            }
            let value: f64 = number.parse().map_err(|_| invalid())?;
            let scale = match unit {
                "ns" => 1e-9,
                "us" | "µs" | "μs" => 1e-6,
                "ms" => 1e-3,
                "s" => 1.0,
                "m" => 60.0,
                "h" => 3600.0,
                _ => return Err(invalid()),
            };
            seconds += value * scale;
            rest = tail;
        }
        if !(0.0..=MAX_SECONDS).contains(&seconds) {
            return Err(format!("`{text}` is out of range"));
        }
        Ok(GoDuration(Duration::from_secs_f64(seconds)))
    }
}

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let duration = self.0;
        if duration.is_zero() {
            return f.write_str("0s");
        }
        if duration.subsec_nanos() != 0 {
            return write!(f, "{}ms", duration.as_millis());
        }
        let secs = duration.as_secs();
        let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
        if h > 0 {
            write!(f, "{h}h")?;
        }
        if m > 0 {
            write!(f, "{m}m")?;
        }
        if s > 0 {
            write!(f, "{s}s")?;
        }
        Ok(())
    }
}

/// A duration flag's value: its Go-syntax value, or the whole milliseconds given to its old
/// `-ms` spelling (kept as a hidden alias) when that was given instead.
pub fn or_legacy_millis(duration: GoDuration, legacy_ms: Option<u64>) -> Duration {
    legacy_ms.map_or(duration.0, Duration::from_millis)
}

/// A Go duration of at least 1 ms, for bounds that cannot be zero.
///
/// # Errors
/// Not a Go duration, or under 1 ms.
pub fn parse_positive(text: &str) -> Result<GoDuration, String> {
    let duration: GoDuration = text.parse()?;
    if duration.0 < Duration::from_millis(1) {
        return Err(format!("`{text}` is under the least allowed, 1ms"));
    }
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Option<Duration> {
        text.parse::<GoDuration>().ok().map(|d| d.0)
    }

    #[test]
    fn go_syntax_parses() {
        for (text, expected) in [
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("24h", Duration::from_secs(86_400)),
            ("1h30m", Duration::from_secs(5_400)),
            ("1.5h", Duration::from_secs(5_400)),
            ("300ms", Duration::from_millis(300)),
            ("2m3s", Duration::from_secs(123)),
            ("10us", Duration::from_micros(10)),
        ] {
            assert_eq!(parse(text), Some(expected), "{text}");
        }
    }

    #[test]
    fn bad_durations_are_rejected() {
        for text in [
            "",
            "5",
            "h",
            "-1s",
            "1d",
            "1.2.3s",
            "s5",
            "9999999999h",
            ".",
        ] {
            assert!(parse(text).is_none(), "{text}");
        }
    }

    #[test]
    fn display_round_trips() {
        for text in ["0s", "24h", "1h30m", "300ms", "45s", "2h5s"] {
            let duration: GoDuration = text.parse().unwrap();
            assert_eq!(duration.to_string(), text);
            assert_eq!(duration.to_string().parse::<GoDuration>(), Ok(duration));
        }
    }
}
