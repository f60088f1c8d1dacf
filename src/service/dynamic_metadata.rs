//! The response's `dynamic_metadata` (`--response-dynamic-metadata`), shaped as the
//! reference service shapes it, so access logs and later filters read the same keys:
//!
//! ```text
//! domain:      the request's domain
//! descriptors: one struct per request descriptor, in order:
//!                entries:    ["key=value", ...]
//!                limit:      the override, in protobuf text form (when sent)
//!                hitsAddend: the descriptor's hits_addend (when sent)
//! hitsAddend:  the request's hits_addend (when not 0)
//! metadata:    the rule `metadata` of every descriptor that did not end OVER_LIMIT,
//!              merged in request order (when any): nested maps merge, the first writer of
//!              a key wins
//! ```
//!
//! Envoy stores it under the `envoy.filters.http.ratelimit` namespace.

use std::collections::HashMap;

use pbjson_types::{Struct, Value, value::Kind};

use crate::limiter::{Code, Response};
use crate::proto::common::RateLimitDescriptor;
use crate::proto::rls::RateLimitRequest;
use crate::proto::types::RateLimitUnit;
use crate::rules::Metadata;

/// Builds the dynamic metadata of one answered request.
pub fn build(request: &RateLimitRequest, response: &Response) -> Struct {
    let mut fields = HashMap::new();
    fields.insert("domain".to_owned(), Value::from(request.domain.clone()));
    let descriptors: Vec<Value> = request
        .descriptors
        .iter()
        .map(|descriptor| Value::from(describe(descriptor)))
        .collect();
    fields.insert("descriptors".to_owned(), Value::from(descriptors));
    if request.hits_addend != 0 {
        fields.insert(
            "hitsAddend".to_owned(),
            Value::from(f64::from(request.hits_addend)),
        );
    }
    let mut merged = Struct::default();
    for status in &response.statuses {
        if status.code == Code::OverLimit {
            continue;
        }
        if let Some(metadata) = &status.metadata {
            merge(&mut merged, metadata);
        }
    }
    if !merged.fields.is_empty() {
        fields.insert("metadata".to_owned(), Value::from(merged));
    }
    Struct::from(fields)
}

fn describe(descriptor: &RateLimitDescriptor) -> Struct {
    let mut fields = HashMap::new();
    let entries: Vec<Value> = descriptor
        .entries
        .iter()
        .map(|entry| Value::from(format!("{}={}", entry.key, entry.value)))
        .collect();
    fields.insert("entries".to_owned(), Value::from(entries));
    if let Some(limit) = &descriptor.limit {
        // Protobuf text form, as the reference prints the override: zero fields omitted.
        let mut parts = Vec::new();
        if limit.requests_per_unit != 0 {
            parts.push(format!("requests_per_unit:{}", limit.requests_per_unit));
        }
        if limit.unit != 0 {
            let unit = RateLimitUnit::try_from(limit.unit)
                .map(|unit| unit.as_str_name().to_owned())
                .unwrap_or_else(|_| limit.unit.to_string());
            parts.push(format!("unit:{unit}"));
        }
        fields.insert("limit".to_owned(), Value::from(parts.join(" ")));
    }
    if let Some(hits) = descriptor.hits_addend {
        // A Struct number is a double; hits above 2^53 lose precision, as in the reference.
        fields.insert("hitsAddend".to_owned(), Value::from(hits.value as f64));
    }
    Struct::from(fields)
}

/// Merges `source` into `into`: a key already present keeps its value, except that two
/// maps merge recursively.
fn merge(into: &mut Struct, source: &Metadata) {
    for (key, value) in &source.0 {
        match into.fields.get_mut(key) {
            None => {
                into.fields.insert(key.clone(), json_value(value));
            }
            Some(Value {
                kind: Some(Kind::StructValue(existing)),
            }) => {
                if let serde_json::Value::Object(nested) = value {
                    merge(existing, &Metadata(nested.clone()));
                }
            }
            Some(_) => {}
        }
    }
}

/// A JSON value as a protobuf `Value` (numbers become doubles, as in any `Struct`).
fn json_value(value: &serde_json::Value) -> Value {
    match value {
        serde_json::Value::Null => Value::from(()),
        serde_json::Value::Bool(flag) => Value::from(*flag),
        serde_json::Value::Number(number) => Value::from(number.as_f64().unwrap_or_default()),
        serde_json::Value::String(text) => Value::from(text.clone()),
        serde_json::Value::Array(items) => {
            Value::from(items.iter().map(json_value).collect::<Vec<_>>())
        }
        serde_json::Value::Object(map) => Value::from(
            map.iter()
                .map(|(key, value)| (key.clone(), json_value(value)))
                .collect::<HashMap<_, _>>(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::limiter::Status;

    fn metadata(value: serde_json::Value) -> Option<Arc<Metadata>> {
        match value {
            serde_json::Value::Object(map) => Some(Arc::new(Metadata(map))),
            other => panic!("not a map: {other}"),
        }
    }

    fn status(code: Code, value: serde_json::Value) -> Status {
        Status {
            code,
            metadata: metadata(value),
            ..Status::unmatched()
        }
    }

    fn to_json(value: &Struct) -> serde_json::Value {
        serde_json::to_value(value).expect("Struct serializes")
    }

    #[test]
    fn merge_keeps_the_first_writer_and_merges_nested_maps() {
        let response = Response {
            overall: Code::OverLimit,
            statuses: vec![
                status(
                    Code::Ok,
                    json!({"team": "a", "route": {"cluster": "one", "weight": 1}}),
                ),
                status(Code::OverLimit, json!({"blocked": true, "team": "x"})),
                status(
                    Code::Ok,
                    json!({"team": "b", "route": {"cluster": "two", "zone": "z"}, "tags": [1, "t"]}),
                ),
                Status::unmatched(),
            ],
            local: false,
        };
        let request = RateLimitRequest {
            domain: "d".into(),
            ..Default::default()
        };
        let built = to_json(&build(&request, &response));
        assert_eq!(
            built["metadata"],
            json!({
                "team": "a",
                "route": {"cluster": "one", "weight": 1.0, "zone": "z"},
                "tags": [1.0, "t"],
            })
        );
    }

    #[test]
    fn descriptors_carry_entries_override_and_addends() {
        use crate::proto::common::rate_limit_descriptor::{Entry, RateLimitOverride};
        let descriptor = |key: &str| RateLimitDescriptor {
            entries: vec![
                Entry {
                    key: key.into(),
                    value: "v".into(),
                },
                Entry {
                    key: "path".into(),
                    value: "/a=b".into(),
                },
            ],
            ..Default::default()
        };
        let mut overridden = descriptor("user");
        overridden.limit = Some(RateLimitOverride {
            requests_per_unit: 42,
            unit: RateLimitUnit::Hour as i32,
        });
        overridden.hits_addend = Some(0u64.into());
        let request = RateLimitRequest {
            domain: "api".into(),
            descriptors: vec![descriptor("ip"), overridden],
            hits_addend: 3,
        };
        let response = Response {
            overall: Code::Ok,
            statuses: vec![Status::unmatched(), Status::unmatched()],
            local: false,
        };
        let built = to_json(&build(&request, &response));
        assert_eq!(
            built,
            json!({
                "domain": "api",
                "hitsAddend": 3.0,
                "descriptors": [
                    {"entries": ["ip=v", "path=/a=b"]},
                    {
                        "entries": ["user=v", "path=/a=b"],
                        "limit": "requests_per_unit:42 unit:HOUR",
                        "hitsAddend": 0.0,
                    },
                ],
            })
        );
    }
}
