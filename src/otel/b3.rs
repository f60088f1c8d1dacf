//! B3, Zipkin's trace context headers, as Envoy and Istio send them under Zipkin tracing:
//! one `b3` header (`{trace}-{span}[-{sampled}[-{parent}]]`) or the `x-b3-traceid`,
//! `x-b3-spanid`, `x-b3-sampled` and `x-b3-flags` headers. Only extraction: floodgate
//! calls nobody it would pass a context to. (opentelemetry-zipkin's propagator does this
//! too, but that crate is deprecated as a whole.)

use opentelemetry::propagation::Extractor;
use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};

/// The caller's span as its B3 headers name it; None without valid ones. The single `b3`
/// header wins when it is valid, as the B3 specification says.
pub(super) fn extract(headers: &dyn Extractor) -> Option<SpanContext> {
    headers
        .get("b3")
        .and_then(single_header)
        .or_else(|| multiple_headers(headers))
}

fn single_header(value: &str) -> Option<SpanContext> {
    let mut parts = value.trim().split('-');
    let trace = parts.next()?;
    let span = parts.next()?;
    let sampled = match parts.next() {
        None => false,
        Some("1" | "d") => true,
        Some("0") => false,
        Some(_) => return None,
    };
    match parts.next() {
        Some(parent) if !is_hex(parent, 16) => return None,
        _ => {}
    }
    if parts.next().is_some() {
        return None;
    }
    context(trace, span, sampled)
}

fn multiple_headers(headers: &dyn Extractor) -> Option<SpanContext> {
    let debug = headers.get("x-b3-flags").map(str::trim) == Some("1");
    let sampled = matches!(
        headers.get("x-b3-sampled").map(str::trim),
        Some("1" | "true")
    );
    context(
        headers.get("x-b3-traceid")?.trim(),
        headers.get("x-b3-spanid")?.trim(),
        debug || sampled,
    )
}

/// A remote span from a 16- or 32-digit trace id and a 16-digit span id; an absent
/// sampling decision reads as not sampled (the local sampler then follows its parent).
fn context(trace: &str, span: &str, sampled: bool) -> Option<SpanContext> {
    if !(is_hex(trace, 16) || is_hex(trace, 32)) || !is_hex(span, 16) {
        return None;
    }
    let flags = if sampled {
        TraceFlags::SAMPLED
    } else {
        TraceFlags::default()
    };
    let context = SpanContext::new(
        TraceId::from_hex(trace).ok()?,
        SpanId::from_hex(span).ok()?,
        flags,
        true,
        TraceState::default(),
    );
    context.is_valid().then_some(context)
}

fn is_hex(text: &str, digits: usize) -> bool {
    text.len() == digits && text.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn extracted(pairs: &[(&str, &str)]) -> Option<(String, String, bool)> {
        let headers: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        extract(&headers).map(|context| {
            (
                context.trace_id().to_string(),
                context.span_id().to_string(),
                context.is_sampled(),
            )
        })
    }

    #[test]
    fn the_single_header_in_each_form() {
        let full = "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-1-05e3ac9a4f6e3b90";
        assert_eq!(
            extracted(&[("b3", full)]),
            Some((
                "80f198ee56343ba864fe8b2a57d3eff7".into(),
                "e457b5a2e4d86bd1".into(),
                true
            ))
        );
        let short_trace = extracted(&[("b3", "a3ce929d0e0e4736-00f067aa0ba902b7-0")]).unwrap();
        assert_eq!(short_trace.0, "0000000000000000a3ce929d0e0e4736");
        assert!(!short_trace.2);
        assert!(
            extracted(&[("b3", "a3ce929d0e0e4736-00f067aa0ba902b7-d")])
                .unwrap()
                .2
        );
        for bad in [
            "0",
            "1",
            "xyz-00f067aa0ba902b7",
            "a3ce929d0e0e4736-00f067aa0ba902b7-2",
        ] {
            assert_eq!(extracted(&[("b3", bad)]), None, "{bad}");
        }
    }

    #[test]
    fn the_multiple_headers_and_their_sampling() {
        let ids = [
            ("x-b3-traceid", "463ac35c9f6413ad48485a3953bb6124"),
            ("x-b3-spanid", "a2fb4a1d1a96d312"),
        ];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut pairs = ids.to_vec();
            pairs.extend_from_slice(extra);
            extracted(&pairs).map(|(_, _, sampled)| sampled)
        };
        assert_eq!(with(&[("x-b3-sampled", "1")]), Some(true));
        assert_eq!(with(&[("x-b3-sampled", "0")]), Some(false));
        assert_eq!(with(&[("x-b3-flags", "1")]), Some(true));
        assert_eq!(with(&[]), Some(false));
        assert_eq!(extracted(&ids[..1]), None, "a trace id alone names no span");
        let zero = [("x-b3-traceid", "00000000000000000000000000000000"), ids[1]];
        assert_eq!(extracted(&zero), None);
    }

    #[test]
    fn an_invalid_single_header_falls_back_to_the_multiple_ones() {
        let pairs = [
            ("b3", "garbage"),
            ("x-b3-traceid", "463ac35c9f6413ad48485a3953bb6124"),
            ("x-b3-spanid", "a2fb4a1d1a96d312"),
        ];
        assert_eq!(
            extracted(&pairs).map(|found| found.0),
            Some("463ac35c9f6413ad48485a3953bb6124".into())
        );
    }
}
