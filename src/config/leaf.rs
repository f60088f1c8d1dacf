//! Reading one scalar as floodgate always has (serde_yaml 0.9's rules, YAML 1.2 core
//! schema), with serde's own wording for a value of the wrong type.
//!
//! Only a plain scalar is resolved: empty, `~` and `null` are null, `true`/`false` are
//! booleans, integers may carry `+`, `0x`, `0o` or `0b`, and a number with a leading zero
//! (`010`) stays text. A quoted or block scalar is always text. Tags are not interpreted.
//! The text itself is what string fields receive, so `value: 1.10` is the text `1.10`.

use serde::de::Unexpected;
use serde_json::Value as Json;

use super::tree::Kind;

/// A scalar as YAML resolves it.
#[derive(Debug, Clone, PartialEq)]
enum Resolved<'a> {
    Null,
    Bool(bool),
    Unsigned(u64),
    Signed(i64),
    /// Beyond 64 bits: serde's description of it (`integer `N` as u128`).
    Wide(String),
    Float(f64),
    Str(&'a str),
}

impl Resolved<'_> {
    fn unexpected(&self) -> Unexpected<'_> {
        match self {
            Resolved::Null => Unexpected::Unit,
            Resolved::Bool(flag) => Unexpected::Bool(*flag),
            Resolved::Unsigned(n) => Unexpected::Unsigned(*n),
            Resolved::Signed(n) => Unexpected::Signed(*n),
            Resolved::Wide(text) => Unexpected::Other(text),
            Resolved::Float(f) => Unexpected::Float(*f),
            Resolved::Str(text) => Unexpected::Str(text),
        }
    }
}

fn resolve(text: &str, plain: bool) -> Resolved<'_> {
    if !plain {
        return Resolved::Str(text);
    }
    if is_null_text(text) {
        return Resolved::Null;
    }
    match (text, integer(text)) {
        ("true" | "True" | "TRUE", _) => return Resolved::Bool(true),
        ("false" | "False" | "FALSE", _) => return Resolved::Bool(false),
        (_, Some((false, n))) => {
            return u64::try_from(n).map_or_else(
                |_| Resolved::Wide(format!("integer `{n}` as u128")),
                Resolved::Unsigned,
            );
        }
        // Beyond i128, a negative integer is read as a float, as serde_yaml read it.
        (_, Some((true, n))) => {
            if let Some(n) = 0i128.checked_sub_unsigned(n) {
                return i64::try_from(n).map_or_else(
                    |_| Resolved::Wide(format!("integer `{n}` as i128")),
                    Resolved::Signed,
                );
            }
        }
        _ => {}
    }
    match float(text) {
        Some(f) if !leading_zero_digits(text) => Resolved::Float(f),
        _ => Resolved::Str(text),
    }
}

fn is_null_text(text: &str) -> bool {
    matches!(text, "" | "~" | "null" | "Null" | "NULL")
}

/// `010` or `-007`: digits after a leading zero are text in YAML 1.2.
fn leading_zero_digits(text: &str) -> bool {
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    digits.len() > 1 && digits.starts_with('0') && digits[1..].bytes().all(|b| b.is_ascii_digit())
}

/// An integer as YAML 1.2 writes it: an optional sign, then decimal digits (without a
/// leading zero), or `0x`, `0o` or `0b` and digits. Its sign (`true` for negative) and size.
fn integer(text: &str) -> Option<(bool, u128)> {
    let (negative, unsigned) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let (digits, radix) = [("0x", 16), ("0o", 8), ("0b", 2)]
        .into_iter()
        .find_map(|(prefix, radix)| Some((unsigned.strip_prefix(prefix)?, radix)))
        .unwrap_or((unsigned, 10));
    // `from_str_radix` would take a second sign; a leading zero makes decimal digits text.
    if digits.starts_with(['+', '-']) || (radix == 10 && leading_zero_digits(text)) {
        return None;
    }
    Some((negative, u128::from_str_radix(digits, radix).ok()?))
}

fn float(text: &str) -> Option<f64> {
    let unsigned = match text.strip_prefix('+') {
        Some(rest) if rest.starts_with(['+', '-']) => return None,
        Some(rest) => rest,
        None => text,
    };
    match (unsigned, text) {
        (".inf" | ".Inf" | ".INF", _) => Some(f64::INFINITY),
        (_, "-.inf" | "-.Inf" | "-.INF") => Some(f64::NEG_INFINITY),
        (_, ".nan" | ".NaN" | ".NAN") => Some(f64::NAN),
        _ => unsigned.parse::<f64>().ok().filter(|f| f.is_finite()),
    }
}

/// Whether a node is null: a field set to it counts as absent.
pub fn is_null(kind: &Kind) -> bool {
    matches!(kind, Kind::Scalar { text, plain: true } if is_null_text(text))
}

/// Why a leaf does not read as its field's type, in serde's words (so messages read as the
/// reference's YAML library writes them).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeafError {
    /// A node of another type: `invalid type: a sequence, expected u32`.
    #[error("invalid type: {found}, expected {expected}")]
    Type {
        /// What the node is, as serde names it.
        found: String,
        /// What the field wants.
        expected: &'static str,
    },
    /// A key met twice in one `metadata` mapping (serde_yaml's words, by key type).
    #[error("{0}")]
    DuplicateEntry(String),
    /// A value of the right type out of the field's range: `invalid value: ...`.
    #[error("invalid value: {found}, expected {expected}")]
    Value {
        /// The value, as serde names it.
        found: String,
        /// What the field wants.
        expected: &'static str,
    },
}

/// serde's error for a node of the wrong type where `expected` was wanted.
pub fn invalid_type(kind: &Kind, expected: &'static str) -> LeafError {
    let found = match kind {
        Kind::Scalar { text, plain } => resolve(text, *plain).unexpected().to_string(),
        Kind::Seq(_) => Unexpected::Seq.to_string(),
        Kind::Map(_) => Unexpected::Map.to_string(),
        Kind::Alias(_) => Unexpected::Other("alias").to_string(),
    };
    LeafError::Type { found, expected }
}

/// A string field: any scalar's text.
pub fn text(kind: &Kind) -> Result<String, LeafError> {
    match kind {
        Kind::Scalar { text, .. } => Ok(text.clone()),
        _ => Err(invalid_type(kind, "a string")),
    }
}

/// A `u32` field.
pub fn count(kind: &Kind) -> Result<u32, LeafError> {
    if let Kind::Scalar { text, plain: true } = kind
        && let Some((false, n)) = integer(text)
        && let Ok(n) = u64::try_from(n)
    {
        return u32::try_from(n).map_err(|_| LeafError::Value {
            found: Unexpected::Unsigned(n).to_string(),
            expected: "u32",
        });
    }
    Err(invalid_type(kind, "u32"))
}

const BOOLEAN: &str = "a boolean (true/false)";

/// A boolean flag, as the reference's YAML 1.1 parser reads it: `true`/`false` plus the 1.1
/// spellings (`yes`, `no`, `on`, `off`, `y`, `n` in their usual cases), so reference files
/// that use them load unchanged; null is false, as there.
pub fn flag(kind: &Kind) -> Result<bool, LeafError> {
    let Kind::Scalar { text, plain } = kind else {
        return Err(invalid_type(kind, BOOLEAN));
    };
    match resolve(text, *plain) {
        Resolved::Null => Ok(false),
        Resolved::Bool(flag) => Ok(flag),
        Resolved::Str("y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" | "True" | "TRUE") => {
            Ok(true)
        }
        Resolved::Str(
            "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" | "False" | "FALSE",
        ) => Ok(false),
        Resolved::Str(other) => Err(LeafError::Value {
            found: Unexpected::Str(other).to_string(),
            expected: BOOLEAN,
        }),
        other => Err(LeafError::Type {
            found: other.unexpected().to_string(),
            expected: BOOLEAN,
        }),
    }
}

/// A scalar of free-form `metadata` as JSON: a number JSON cannot hold (NaN, infinities)
/// keeps its YAML spelling as a string.
pub fn json(text: &str, plain: bool) -> Result<Json, LeafError> {
    Ok(match resolve(text, plain) {
        Resolved::Null => Json::Null,
        Resolved::Bool(flag) => Json::Bool(flag),
        Resolved::Unsigned(n) => Json::from(n),
        Resolved::Signed(n) => Json::from(n),
        Resolved::Float(f) => match serde_json::Number::from_f64(f) {
            Some(number) => Json::Number(number),
            None if f.is_nan() => Json::String(".nan".to_owned()),
            None if f > 0.0 => Json::String(".inf".to_owned()),
            None => Json::String("-.inf".to_owned()),
        },
        Resolved::Str(text) => Json::String(text.to_owned()),
        wide @ Resolved::Wide(_) => {
            return Err(LeafError::Type {
                found: wide.unexpected().to_string(),
                expected: "any YAML value",
            });
        }
    })
}

/// A `metadata` key as the string protobuf's `Struct` needs (YAML allows `yes:` or `1:`).
pub fn json_key(key: &Json) -> String {
    match key {
        Json::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// serde_yaml's words for a key met twice in one `metadata` mapping.
pub fn duplicate_entry(key: &Json) -> LeafError {
    LeafError::DuplicateEntry(match key {
        Json::Null => "duplicate entry with null key".to_owned(),
        Json::Bool(flag) => format!("duplicate entry with key `{flag}`"),
        Json::Number(n) => format!("duplicate entry with key {n}"),
        Json::String(text) => format!("duplicate entry with key {text:?}"),
        Json::Array(_) | Json::Object(_) => "duplicate entry in YAML map".to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(text: &str) -> Kind {
        Kind::Scalar {
            text: text.to_owned(),
            plain: true,
        }
    }

    fn quoted(text: &str) -> Kind {
        Kind::Scalar {
            text: text.to_owned(),
            plain: false,
        }
    }

    #[test]
    fn plain_scalars_resolve_as_yaml_1_2() {
        assert_eq!(resolve("~", true), Resolved::Null);
        assert_eq!(resolve("", true), Resolved::Null);
        assert_eq!(resolve("True", true), Resolved::Bool(true));
        assert_eq!(resolve("+0x10", true), Resolved::Unsigned(16));
        assert_eq!(resolve("-0o17", true), Resolved::Signed(-15));
        assert_eq!(resolve("010", true), Resolved::Str("010"));
        assert_eq!(resolve("1e3", true), Resolved::Float(1000.0));
        assert_eq!(resolve("yes", true), Resolved::Str("yes"));
        assert_eq!(resolve("5", false), Resolved::Str("5"));
        assert!(matches!(
            resolve("99999999999999999999", true),
            Resolved::Wide(_)
        ));
    }

    #[test]
    fn counts_and_their_errors_read_as_serde_words_them() {
        assert_eq!(count(&plain("0b101")), Ok(5));
        for (kind, message) in [
            (plain("ten"), "invalid type: string \"ten\", expected u32"),
            (plain("-1"), "invalid type: integer `-1`, expected u32"),
            (
                plain("1.5"),
                "invalid type: floating point `1.5`, expected u32",
            ),
            (quoted("5"), "invalid type: string \"5\", expected u32"),
            (
                plain("4294967296"),
                "invalid value: integer `4294967296`, expected u32",
            ),
            (
                Kind::Seq(Vec::new()),
                "invalid type: sequence, expected u32",
            ),
        ] {
            assert_eq!(count(&kind).unwrap_err().to_string(), message);
        }
    }

    #[test]
    fn yaml_1_1_booleans_are_accepted() {
        assert_eq!(flag(&plain("yes")), Ok(true));
        assert_eq!(flag(&plain("Off")), Ok(false));
        assert_eq!(flag(&plain("")), Ok(false));
        assert!(
            flag(&plain("maybe"))
                .unwrap_err()
                .to_string()
                .contains("expected a boolean")
        );
        assert_eq!(
            flag(&plain("1")).unwrap_err().to_string(),
            "invalid type: integer `1`, expected a boolean (true/false)"
        );
    }

    #[test]
    fn numeric_looking_values_keep_their_text() {
        assert_eq!(text(&plain("1.10")).unwrap(), "1.10");
        assert_eq!(text(&plain("200")).unwrap(), "200");
        assert_eq!(
            text(&Kind::Map(Vec::new())).unwrap_err().to_string(),
            "invalid type: map, expected a string"
        );
    }

    #[test]
    fn metadata_scalars_become_json() {
        assert_eq!(json("2.5", true), Ok(serde_json::json!(2.5)));
        assert_eq!(json(".nan", true), Ok(serde_json::json!(".nan")));
        assert_eq!(json("-7", true), Ok(serde_json::json!(-7)));
        assert_eq!(json("007", true), Ok(serde_json::json!("007")));
        assert_eq!(json_key(&serde_json::json!(7)), "7");
        assert_eq!(
            duplicate_entry(&serde_json::json!("a")).to_string(),
            "duplicate entry with key \"a\""
        );
    }
}
