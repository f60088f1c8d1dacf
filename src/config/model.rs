//! The raw serde model: one struct per YAML mapping of an envoyproxy/ratelimit domain file,
//! field for field, plus floodgate's `rate_limit` extensions.
//!
//! Every struct denies unknown keys: a mistyped key must fail the load, never leave traffic
//! unlimited. Enumerated fields (`unit`, `algorithm`, `on_over_limit`) stay strings here and
//! are parsed once by `validate`, so that a bad value becomes one collected error among
//! others instead of aborting deserialization of the whole file.

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, forward_to_deserialize_any};

/// A domain file: the root mapping.
#[derive(Debug, Default, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a domain mapping with `domain` and `descriptors`"
)]
pub struct RawDomain {
    /// The domain requests name; required and non-empty (checked by `validate`).
    pub domain: Option<String>,
    /// Top-level descriptors; absent or null means none.
    pub descriptors: Option<Vec<RawDescriptor>>,
}

/// One descriptor node: matches one request entry, optionally limits, optionally nests.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a descriptor mapping with `key`")]
pub struct RawDescriptor {
    /// Entry key; required and non-empty.
    pub key: Option<String>,
    /// Exact value, or a pattern when it contains `*`; absent or empty means key-only.
    pub value: Option<String>,
    /// The limit applied when a request's last entry lands here.
    pub rate_limit: Option<RawRateLimit>,
    /// Children, matched against the next entry.
    pub descriptors: Option<Vec<RawDescriptor>>,
    /// Report OK even when over the limit.
    #[serde(default, deserialize_with = "yaml_bool")]
    pub shadow_mode: bool,
    /// Metric key built from the request's values.
    #[serde(default, deserialize_with = "yaml_bool")]
    pub detailed_metric: bool,
    /// Metric key includes runtime values at wildcard and key-only levels.
    #[serde(default, deserialize_with = "yaml_bool")]
    pub value_to_metric: bool,
    /// Every value matching the wildcard shares one bucket.
    #[serde(default, deserialize_with = "yaml_bool")]
    pub share_threshold: bool,
    /// Over-limit only denies overall when every quota-mode status does.
    #[serde(default, deserialize_with = "yaml_bool")]
    pub quota_mode: bool,
    /// Free-form data returned in the response's dynamic metadata while under the limit.
    pub metadata: Option<serde_yaml::Mapping>,
}

/// A descriptor's `rate_limit` mapping.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a rate_limit mapping")]
pub struct RawRateLimit {
    /// second | minute | hour | day | week | month | year, any case.
    pub unit: Option<String>,
    /// `L`; absent means 0, as in the reference (always over limit).
    pub requests_per_unit: Option<u32>,
    /// Always OK without touching a backend.
    #[serde(default, deserialize_with = "yaml_bool")]
    pub unlimited: bool,
    /// Reported as `current_limit.name`; the target of other rules' `replaces`.
    pub name: Option<String>,
    /// Named limits this one overrides when both match a request.
    pub replaces: Option<Vec<RawReplaces>>,
    /// Also accepted at descriptor level; either place sets the rule's quota mode.
    #[serde(default, deserialize_with = "yaml_bool")]
    pub quota_mode: bool,
    /// Extension: counting algorithm, default `fixed_window`.
    pub algorithm: Option<String>,
    /// Extension: token-bucket capacity, default `requests_per_unit`.
    pub burst: Option<u32>,
    /// Extension: window = unit x multiplier, default 1.
    pub unit_multiplier: Option<u32>,
    /// Extension: `reject` (default) or `consume`.
    pub on_over_limit: Option<String>,
    /// Extension: once the rule denies, deny everything for this long.
    pub lockout_seconds: Option<u32>,
}

/// One `replaces` entry.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a replaces entry `{name: ...}`")]
pub struct RawReplaces {
    /// Name of the replaced limit; required and non-empty.
    pub name: Option<String>,
}

/// Which raw struct a YAML mapping deserializes into: lets the key sweep in `mod.rs` walk
/// the document with the same field lists serde enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// [`RawDomain`].
    Domain,
    /// [`RawDescriptor`].
    Descriptor,
    /// [`RawRateLimit`].
    RateLimit,
    /// [`RawReplaces`].
    Replaces,
}

impl Shape {
    /// The keys serde accepts for this mapping, read from the derived impl itself.
    pub fn fields(self) -> &'static [&'static str] {
        match self {
            Shape::Domain => struct_fields::<RawDomain>(),
            Shape::Descriptor => struct_fields::<RawDescriptor>(),
            Shape::RateLimit => struct_fields::<RawRateLimit>(),
            Shape::Replaces => struct_fields::<RawReplaces>(),
        }
    }

    /// The shape of the mapping(s) under `key`: `(shape, is_list)`; `None` for scalars and
    /// for `metadata`, whose contents are free-form.
    pub fn child(self, key: &str) -> Option<(Shape, bool)> {
        match (self, key) {
            (Shape::Domain | Shape::Descriptor, "descriptors") => Some((Shape::Descriptor, true)),
            (Shape::Descriptor, "rate_limit") => Some((Shape::RateLimit, false)),
            (Shape::RateLimit, "replaces") => Some((Shape::Replaces, true)),
            _ => None,
        }
    }
}

/// Field names of a derived struct: `deserialize_struct` receives them, so a deserializer
/// that only records its arguments recovers the list serde checks keys against.
fn struct_fields<T: de::DeserializeOwned>() -> &'static [&'static str] {
    struct Capture<'a>(&'a mut &'static [&'static str]);

    impl<'de> Deserializer<'de> for Capture<'_> {
        type Error = de::value::Error;

        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _name: &'static str,
            fields: &'static [&'static str],
            _visitor: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(de::Error::custom("fields captured"))
        }

        forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }

    let mut fields: &'static [&'static str] = &[];
    // The capture always ends in an error by design; only the recorded list matters.
    let _ = T::deserialize(Capture(&mut fields));
    fields
}

/// A boolean as the reference's YAML 1.1 parser reads it: `true`/`false` plus the 1.1
/// spellings (`yes`, `no`, `on`, `off`, `y`, `n` in their usual cases), so reference files
/// that use them load unchanged. Null (`shadow_mode:` with no value) is false, as there.
fn yaml_bool<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    struct YamlBool;

    impl<'de> Visitor<'de> for YamlBool {
        type Value = bool;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a boolean (true/false)")
        }

        fn visit_bool<E: de::Error>(self, v: bool) -> Result<bool, E> {
            Ok(v)
        }

        fn visit_unit<E: de::Error>(self) -> Result<bool, E> {
            Ok(false)
        }

        fn visit_none<E: de::Error>(self) -> Result<bool, E> {
            Ok(false)
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
            match v {
                "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" | "True" | "TRUE" => {
                    Ok(true)
                }
                "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" | "False" | "FALSE" => {
                    Ok(false)
                }
                _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
            }
        }
    }

    deserializer.deserialize_any(YamlBool)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_expose_the_serde_field_lists() {
        assert_eq!(Shape::Domain.fields(), ["domain", "descriptors"]);
        assert!(Shape::Descriptor.fields().contains(&"share_threshold"));
        assert!(Shape::RateLimit.fields().contains(&"lockout_seconds"));
        assert_eq!(Shape::Replaces.fields(), ["name"]);
    }

    #[test]
    fn yaml_1_1_booleans_are_accepted() {
        let yaml = "key: k\nshadow_mode: yes\nquota_mode: Off\ndetailed_metric:\n";
        let raw: RawDescriptor = serde_yaml::from_str(yaml).unwrap();
        assert!(raw.shadow_mode && !raw.quota_mode && !raw.detailed_metric);
        let err = serde_yaml::from_str::<RawDescriptor>("{key: k, shadow_mode: maybe}");
        assert!(err.unwrap_err().to_string().contains("expected a boolean"));
    }

    #[test]
    fn numeric_looking_values_keep_their_text() {
        let raw: RawDescriptor = serde_yaml::from_str("{key: 200, value: 1.10}").unwrap();
        assert_eq!(raw.key.as_deref(), Some("200"));
        assert_eq!(raw.value.as_deref(), Some("1.10"));
    }
}
