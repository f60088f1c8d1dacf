//! `RateLimitConfig` resources -> validated domains, through the YAML files' own validation.
//!
//! Each resource is rendered as the equivalent domain document (JSON, which the YAML loader
//! reads) and handed to [`config::parse_domain`] under the resource's name, so an xDS rule
//! is accepted exactly when the same rule in a file would be, and its errors read the same
//! (`<resource>:<line>: descriptors[0].rate_limit.unit: ...`).
//!
//! Bounded before anything is rendered: a resource deeper than [`MAX_DEPTH`] levels or with
//! more than [`MAX_DESCRIPTORS`] descriptors is refused from the proto, and the document is
//! written one key per line without indentation, so its size grows with the resource, not
//! with the square of its depth (an 864 KB response of 2,500 chains 60 deep used to take
//! 700 MB to render pretty-printed).

use std::collections::HashMap;

use prost::Message;
use serde_json::{Map, Value, json};

use crate::config::{self, ConfigError};
use crate::matcher::DomainRules;
use crate::proto::rls_conf::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};

/// Deepest descriptor nesting a resource may have: past the YAML loader's own depth bound
/// (128 nodes, two per level) a file could not say it either.
pub const MAX_DEPTH: usize = 64;
/// Most descriptors one resource may hold.
pub const MAX_DESCRIPTORS: usize = 100_000;

/// The resource type floodgate subscribes to.
pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// Converts every resource of one response; all of them or none.
///
/// # Errors
/// Every problem of every resource (undecodable, wrong type, invalid rules, a domain defined
/// by two resources), each naming its resource.
pub fn domains(resources: &[pbjson_types::Any]) -> Result<Vec<DomainRules>, Vec<ConfigError>> {
    let mut errors = Vec::new();
    let mut domains = Vec::new();
    let mut owners: HashMap<String, String> = HashMap::new();
    for (index, resource) in resources.iter().enumerate() {
        let fallback = format!("resources[{index}]");
        if resource.type_url != TYPE_URL {
            errors.push(whole(
                &fallback,
                format!("type `{}` is not {TYPE_URL}", resource.type_url),
            ));
            continue;
        }
        let config = match RateLimitConfig::decode(resource.value.as_ref()) {
            Ok(config) => config,
            Err(error) => {
                errors.push(whole(&fallback, format!("cannot decode: {error}")));
                continue;
            }
        };
        let name = if config.name.is_empty() {
            fallback
        } else {
            config.name.clone()
        };
        if let Some(first) = owners.get(&config.domain) {
            errors.push(ConfigError {
                path: "domain".to_owned(),
                ..whole(
                    &name,
                    format!(
                        "duplicate domain `{}`: {first} already defines it",
                        config.domain
                    ),
                )
            });
            continue;
        }
        owners.insert(config.domain.clone(), name.clone());
        if let Err(too_large) = within_bounds(&config.descriptors) {
            errors.push(whole(&name, too_large.to_string()));
            continue;
        }
        match config::parse_domain(&name, &document(&config)) {
            Ok(rules) => domains.push(rules),
            Err(mut resource_errors) => errors.append(&mut resource_errors),
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    // The order the file loader produces, so unchanged rules compare equal.
    domains.sort_by(|a, b| a.domain.cmp(&b.domain));
    Ok(domains)
}

fn whole(resource: &str, message: String) -> ConfigError {
    ConfigError {
        file: resource.to_owned(),
        line: None,
        path: String::new(),
        message,
    }
}

/// A resource too deep or too large to render.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
enum TooLarge {
    #[error("descriptors nest deeper than {MAX_DEPTH} levels")]
    Depth,
    #[error("more than {MAX_DESCRIPTORS} descriptors")]
    Count,
}

/// Checks depth and size on the proto, before anything is rendered.
fn within_bounds(descriptors: &[RateLimitDescriptor]) -> Result<(), TooLarge> {
    let mut count = 0usize;
    let mut level: Vec<&RateLimitDescriptor> = descriptors.iter().collect();
    let mut depth = 0;
    while !level.is_empty() {
        depth += 1;
        count += level.len();
        if depth > MAX_DEPTH {
            return Err(TooLarge::Depth);
        }
        if count > MAX_DESCRIPTORS {
            return Err(TooLarge::Count);
        }
        level = level
            .iter()
            .flat_map(|descriptor| &descriptor.descriptors)
            .collect();
    }
    Ok(())
}

/// The domain file that says what `config` says: one key per line (so error lines point
/// somewhere useful) and no indentation (so the text grows with the resource only).
pub fn document(config: &RateLimitConfig) -> String {
    use serde::Serialize;
    let document = json!({
        "domain": config.domain,
        "descriptors": config.descriptors.iter().map(descriptor).collect::<Vec<_>>(),
    });
    let mut out = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b"");
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, formatter);
    if document.serialize(&mut serializer).is_err() {
        return String::new();
    }
    String::from_utf8(out).unwrap_or_default()
}

fn descriptor(raw: &RateLimitDescriptor) -> Value {
    let mut out = Map::new();
    out.insert("key".into(), json!(raw.key));
    if !raw.value.is_empty() {
        out.insert("value".into(), json!(raw.value));
    }
    if let Some(policy) = &raw.rate_limit {
        out.insert("rate_limit".into(), rate_limit(policy));
    }
    if !raw.descriptors.is_empty() {
        let children: Vec<Value> = raw.descriptors.iter().map(descriptor).collect();
        out.insert("descriptors".into(), Value::Array(children));
    }
    if let Some(metadata) = raw.metadata.as_ref().filter(|m| !m.fields.is_empty()) {
        // proto3 JSON of a Struct is the JSON object a YAML `metadata` mapping reads as.
        out.insert("metadata".into(), json!(metadata));
    }
    for (flag, set) in [
        ("shadow_mode", raw.shadow_mode),
        ("detailed_metric", raw.detailed_metric),
        ("quota_mode", raw.quota_mode),
    ] {
        if set {
            out.insert(flag.into(), json!(true));
        }
    }
    Value::Object(out)
}

fn rate_limit(policy: &RateLimitPolicy) -> Value {
    let mut out = Map::new();
    match RateLimitUnit::try_from(policy.unit) {
        // An unlimited policy needs no unit; a counted one without a unit is rejected by
        // validation, as an absent `unit:` is in a file.
        Ok(RateLimitUnit::Unknown) => {}
        Ok(unit) => {
            out.insert("unit".into(), json!(unit.as_str_name()));
        }
        Err(_) => {
            out.insert("unit".into(), json!(format!("unit number {}", policy.unit)));
        }
    }
    out.insert("requests_per_unit".into(), json!(policy.requests_per_unit));
    if policy.unlimited {
        out.insert("unlimited".into(), json!(true));
    }
    if !policy.name.is_empty() {
        out.insert("name".into(), json!(policy.name));
    }
    if !policy.replaces.is_empty() {
        let replaces: Vec<Value> = policy
            .replaces
            .iter()
            .map(|replace| json!({ "name": replace.name }))
            .collect();
        out.insert("replaces".into(), Value::Array(replaces));
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::rls_conf::RateLimitReplace;

    fn any(config: &RateLimitConfig) -> pbjson_types::Any {
        pbjson_types::Any {
            type_url: TYPE_URL.to_owned(),
            value: config.encode_to_vec().into(),
        }
    }

    fn config(name: &str, domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitConfig {
        RateLimitConfig {
            name: name.into(),
            domain: domain.into(),
            descriptors,
        }
    }

    fn limited(key: &str, unit: RateLimitUnit, requests: u32) -> RateLimitDescriptor {
        RateLimitDescriptor {
            key: key.into(),
            rate_limit: Some(RateLimitPolicy {
                unit: unit as i32,
                requests_per_unit: requests,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn every_field_reaches_the_rules() {
        let mut parent = RateLimitDescriptor {
            key: "user".into(),
            value: "alice".into(),
            shadow_mode: true,
            ..Default::default()
        };
        let mut child = limited("path", RateLimitUnit::Week, 3);
        child.quota_mode = true;
        child.detailed_metric = true;
        if let Some(policy) = child.rate_limit.as_mut() {
            policy.name = "weekly".into();
        }
        parent.descriptors.push(child);
        let mut replacing = limited("ip", RateLimitUnit::Second, 9);
        if let Some(policy) = replacing.rate_limit.as_mut() {
            policy.replaces.push(RateLimitReplace {
                name: "weekly".into(),
            });
        }
        let free = RateLimitDescriptor {
            key: "free".into(),
            rate_limit: Some(RateLimitPolicy {
                unlimited: true,
                ..Default::default()
            }),
            ..Default::default()
        };
        let domains = domains(&[any(&config("r", "api", vec![parent, replacing, free]))])
            .unwrap_or_else(|errors| panic!("{errors:?}"));
        let matcher = crate::matcher::Matcher::new(domains);
        let rules = matcher.rules();
        let weekly = rules
            .iter()
            .find(|rule| rule.path == "user_alice.path")
            .unwrap();
        assert_eq!(weekly.name.as_deref(), Some("weekly"));
        assert!(weekly.quota_mode && weekly.detailed_metric);
        let policy = weekly.policy().unwrap();
        assert_eq!(
            (policy.requests_per_unit, policy.unit),
            (3, crate::rules::Unit::Week)
        );
        let ip = rules.iter().find(|rule| rule.path == "ip").unwrap();
        assert_eq!(ip.replaces, ["weekly"]);
        let free = rules.iter().find(|rule| rule.path == "free").unwrap();
        assert_eq!(free.limit, crate::rules::Limit::Unlimited);
    }

    /// `metadata = 8` (go-control-plane, June 2026) reaches the rule as a YAML `metadata`
    /// mapping would; it was dropped as an unknown field before.
    #[test]
    fn descriptor_metadata_reaches_the_rule() {
        use pbjson_types::{Struct, Value as ProtoValue, value::Kind};
        let mut described = limited("route", RateLimitUnit::Minute, 5);
        let text = |text: &str| ProtoValue {
            kind: Some(Kind::StringValue(text.into())),
        };
        described.metadata = Some(Struct {
            fields: [("service".to_owned(), text("checkout"))].into(),
        });
        // Field 8, length-delimited, on the wire.
        assert!(described.encode_to_vec().contains(&((8 << 3) | 2)));
        let domains = domains(&[any(&config("m", "api", vec![described]))])
            .unwrap_or_else(|errors| panic!("{errors:?}"));
        let matcher = crate::matcher::Matcher::new(domains);
        let rule = matcher
            .rules()
            .iter()
            .find(|rule| rule.path == "route")
            .cloned();
        let metadata = rule
            .and_then(|rule| rule.metadata.clone())
            .expect("metadata");
        assert_eq!(
            Value::Object(metadata.0.clone()),
            json!({"service": "checkout"})
        );
    }

    #[test]
    fn errors_name_the_resource_and_the_field() {
        let errors = domains(&[
            any(&config(
                "good",
                "a",
                vec![limited("k", RateLimitUnit::Minute, 1)],
            )),
            any(&config(
                "bad",
                "b",
                vec![limited("k", RateLimitUnit::Unknown, 1)],
            )),
            any(&config("again", "a", vec![])),
            pbjson_types::Any {
                type_url: "type.googleapis.com/other".into(),
                value: Vec::new().into(),
            },
            pbjson_types::Any {
                type_url: TYPE_URL.into(),
                value: vec![0xff, 0xff].into(),
            },
        ])
        .unwrap_err();
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(text.len(), 4, "{text:?}");
        assert!(
            text[0].starts_with("bad:") && text[0].contains("unit"),
            "{text:?}"
        );
        assert!(
            text[1].contains("again: domain: duplicate domain `a`: good"),
            "{text:?}"
        );
        assert!(text[2].starts_with("resources[3]: type"), "{text:?}");
        assert!(
            text[3].starts_with("resources[4]: cannot decode"),
            "{text:?}"
        );
    }

    #[test]
    fn domains_come_sorted() {
        let domains = domains(&[
            any(&config("z", "z", vec![])),
            any(&config("a", "a", vec![])),
        ])
        .unwrap();
        let names: Vec<_> = domains.iter().map(|d| d.domain.as_str()).collect();
        assert_eq!(names, ["a", "z"]);
    }
}
