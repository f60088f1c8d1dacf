//! Rate-limit response headers (`--response-headers`, docs/operations.md#response-headers), built
//! from a decision.
//!
//! `ietf` follows draft-ietf-httpapi-ratelimit-headers (`RateLimit-Policy` and `RateLimit`
//! with one item per matched limit, plus `Retry-After` when denied); `legacy` emits the
//! reference service's `RateLimit-Limit/Remaining/Reset` from the most restrictive status.

use crate::limiter::{Code, CurrentLimit, Response, Status};

/// Which headers to add to responses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeaderMode {
    /// None; Envoy may derive `X-RateLimit-*` from the statuses itself.
    #[default]
    Off,
    /// draft-ietf-httpapi-ratelimit-headers.
    Ietf,
    /// The reference service's three plain headers.
    Legacy,
}

/// Set on every answer decided from a replica's memory while cut off from Redis (failure
/// mode `local`), whatever `--response-headers` says, so the client can tell.
pub const LOCAL_FALLBACK: &str = "x-floodgate-fallback";

/// The headers `mode` asks for, as (name, value) pairs in emission order.
pub fn build(mode: HeaderMode, response: &Response) -> Vec<(&'static str, String)> {
    match mode {
        HeaderMode::Off => Vec::new(),
        HeaderMode::Ietf => ietf(response),
        HeaderMode::Legacy => legacy(response),
    }
}

/// The statuses that carry a limit, with it.
fn limited(response: &Response) -> impl Iterator<Item = (&Status, &CurrentLimit)> {
    response
        .statuses
        .iter()
        .filter_map(|status| Some((status, status.current_limit.as_ref()?)))
}

fn ietf(response: &Response) -> Vec<(&'static str, String)> {
    let mut policies = Vec::new();
    let mut states = Vec::new();
    for (status, limit) in limited(response) {
        let name = sf_string(&limit.label);
        policies.push(format!(
            "{name};q={};w={}",
            limit.requests_per_unit,
            limit.window.as_secs()
        ));
        states.push(format!(
            "{name};r={};t={}",
            status.limit_remaining,
            status.reset_seconds.unwrap_or(0)
        ));
    }
    if policies.is_empty() {
        return Vec::new();
    }
    let mut headers = vec![
        ("RateLimit-Policy", policies.join(", ")),
        ("RateLimit", states.join(", ")),
    ];
    if response.overall == Code::OverLimit {
        // The caller must wait until every denying limit has room again: the longest wait.
        let retry_after = limited(response)
            .filter(|(status, _)| status.code == Code::OverLimit)
            .filter_map(|(status, _)| status.reset_seconds)
            .max();
        if let Some(seconds) = retry_after {
            headers.push(("Retry-After", seconds.to_string()));
        }
    }
    headers
}

fn legacy(response: &Response) -> Vec<(&'static str, String)> {
    // The most restrictive status: a denying one first, then the lowest remaining; the first
    // in request order on ties.
    let Some((status, limit)) = limited(response)
        .min_by_key(|(status, _)| (status.code != Code::OverLimit, status.limit_remaining))
    else {
        return Vec::new();
    };
    vec![
        ("RateLimit-Limit", limit.requests_per_unit.to_string()),
        ("RateLimit-Remaining", status.limit_remaining.to_string()),
        (
            "RateLimit-Reset",
            status.reset_seconds.unwrap_or(0).to_string(),
        ),
    ]
}

/// An RFC 8941 sf-string: quoted, with `"` and `\` escaped; characters a header value cannot
/// carry (controls, non-ASCII) become `?`.
fn sf_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::Unit;
    use std::time::Duration;

    fn status(
        code: Code,
        label: &str,
        limit: u32,
        window_s: u64,
        remaining: u32,
        reset: u64,
    ) -> Status {
        Status {
            code,
            current_limit: Some(CurrentLimit {
                requests_per_unit: limit,
                unit: Unit::Minute,
                name: None,
                label: label.into(),
                window: Duration::from_secs(window_s),
            }),
            limit_remaining: remaining,
            reset_seconds: Some(reset),
            metadata: None,
        }
    }

    fn response(overall: Code, statuses: Vec<Status>) -> Response {
        Response {
            overall,
            statuses,
            local: false,
        }
    }

    #[test]
    fn ietf_lists_every_matched_limit_in_order() {
        let r = response(
            Code::Ok,
            vec![
                status(Code::Ok, "per-user", 10, 60, 7, 48),
                Status::unmatched(),
                status(Code::Ok, "path_/login", 5, 300, 4, 200),
            ],
        );
        assert_eq!(
            build(HeaderMode::Ietf, &r),
            vec![
                (
                    "RateLimit-Policy",
                    "\"per-user\";q=10;w=60, \"path_/login\";q=5;w=300".to_string()
                ),
                (
                    "RateLimit",
                    "\"per-user\";r=7;t=48, \"path_/login\";r=4;t=200".to_string()
                ),
            ]
        );
    }

    #[test]
    fn ietf_adds_retry_after_from_the_longest_denial() {
        let r = response(
            Code::OverLimit,
            vec![
                status(Code::OverLimit, "a", 1, 1, 0, 1),
                status(Code::OverLimit, "b", 5, 60, 0, 30),
                status(Code::Ok, "c", 5, 3600, 2, 900),
            ],
        );
        let headers = build(HeaderMode::Ietf, &r);
        assert_eq!(headers[2], ("Retry-After", "30".to_string()));
    }

    #[test]
    fn legacy_uses_the_most_restrictive_status() {
        let r = response(
            Code::OverLimit,
            vec![
                status(Code::Ok, "a", 100, 60, 0, 10),
                status(Code::OverLimit, "b", 5, 60, 0, 30),
            ],
        );
        assert_eq!(
            build(HeaderMode::Legacy, &r),
            vec![
                ("RateLimit-Limit", "5".to_string()),
                ("RateLimit-Remaining", "0".to_string()),
                ("RateLimit-Reset", "30".to_string()),
            ]
        );
        let ok = response(
            Code::Ok,
            vec![
                status(Code::Ok, "a", 100, 60, 50, 10),
                status(Code::Ok, "b", 5, 60, 3, 30),
            ],
        );
        assert_eq!(
            build(HeaderMode::Legacy, &ok)[0],
            ("RateLimit-Limit", "5".to_string())
        );
    }

    #[test]
    fn off_and_unmatched_emit_nothing() {
        let r = response(Code::Ok, vec![Status::unmatched(), Status::unlimited()]);
        assert!(build(HeaderMode::Off, &r).is_empty());
        assert!(build(HeaderMode::Ietf, &r).is_empty());
        assert!(build(HeaderMode::Legacy, &r).is_empty());
    }

    #[test]
    fn names_are_escaped_as_structured_field_strings() {
        assert_eq!(sf_string("a\"b\\c\u{e9}\n"), "\"a\\\"b\\\\c??\"");
    }
}
