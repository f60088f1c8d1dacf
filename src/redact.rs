//! Secrets redaction, in one place: how a URL is shown with its credentials masked, which
//! strings of a set of URLs are secret (so error texts from a client library can be scrubbed
//! of them), and how `Debug` shows a value that is secret as a whole.
//!
//! Two markers, on purpose: [`MASK`] replaces the secret part of a text that stays readable
//! (`redis://user:***@host`); [`REDACTED`] stands for a whole value that is never shown
//! (`ClientIdentity(<redacted>)`).

use std::fmt;
use std::str::FromStr;

use percent_encoding::percent_decode_str;
use url::Url;

/// What replaces a secret inside a text or a URL.
pub const MASK: &str = "***";
/// What `Debug` shows instead of a value that is secret as a whole.
pub const REDACTED: &str = "<redacted>";

/// A query parameter whose value is a credential (`password=`, `pass=`): redis-rs reads a Unix
/// socket's password from the query.
fn is_secret_param(name: &str) -> bool {
    name.to_ascii_lowercase().contains("pass")
}

/// `text` as a URL with its password (or a lone userinfo, which may be a password) and
/// password query values masked. In a text that does not parse as a URL, everything before
/// the last `@` and the whole query are masked.
pub fn url(text: &str) -> String {
    match Url::parse(text) {
        Ok(url) if text.contains("://") => masked_url(url),
        _ => not_a_url(text),
    }
}

fn masked_url(mut url: Url) -> String {
    // Setting fails only for URLs without a host, which carry no userinfo to mask.
    if url.password().is_some() {
        let _ = url.set_password(Some(MASK));
    } else if !url.username().is_empty() {
        let _ = url.set_username(MASK);
    }
    if url.query_pairs().any(|(name, _)| is_secret_param(&name)) {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(name, value)| {
                let value = if is_secret_param(&name) {
                    MASK.to_owned()
                } else {
                    value.into_owned()
                };
                (name.into_owned(), value)
            })
            .collect();
        url.query_pairs_mut().clear().extend_pairs(pairs);
    }
    url.into()
}

/// A text that does not parse as a URL: anything before an `@` may be a password, and so may
/// anything after a `?`.
fn not_a_url(text: &str) -> String {
    let (scheme, rest) = match text.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), text),
    };
    let rest = match rest.split_once('?') {
        Some((before, _)) => format!("{before}?{MASK}"),
        None => rest.to_owned(),
    };
    match rest.rsplit_once('@') {
        Some((_, host)) => format!("{scheme}{MASK}@{host}"),
        None => format!("{scheme}{rest}"),
    }
}

/// Strings that must never reach an error message or a log line: the passwords of a set of
/// URLs (as written and percent-decoded) and the URLs themselves.
#[derive(Clone, Default)]
pub struct Secrets(Vec<String>);

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secrets({} masked)", self.0.len())
    }
}

impl Secrets {
    /// Collects the secrets of every URL in `urls`.
    pub fn of(urls: &[&str]) -> Secrets {
        let mut secrets = Vec::new();
        for text in urls {
            if let Ok(url) = Url::parse(text) {
                if let Some(password) = url.password() {
                    secrets.push(password.to_owned());
                    secrets.push(
                        percent_decode_str(password)
                            .decode_utf8_lossy()
                            .into_owned(),
                    );
                }
                secrets.extend(
                    url.query_pairs()
                        .filter(|(name, _)| is_secret_param(name))
                        .map(|(_, value)| value.into_owned()),
                );
            }
            secrets.push((*text).to_owned());
        }
        // Longest first, so a URL is masked whole before the password inside it.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets.retain(|s| !s.is_empty());
        secrets.dedup();
        Secrets(secrets)
    }

    /// These secrets and `secret`, a password given outside any URL.
    pub fn and(mut self, secret: &str) -> Secrets {
        if !secret.is_empty() {
            self.0.push(secret.to_owned());
            self.0.sort_by_key(|s| std::cmp::Reverse(s.len()));
            self.0.dedup();
        }
        self
    }

    /// `value` with every secret in its text replaced by [`MASK`].
    pub fn scrub<T: Scrub>(&self, value: T) -> T {
        value.map_text(|text| {
            self.0
                .iter()
                .fold(text, |text, secret| text.replace(secret.as_str(), MASK))
        })
    }
}

/// A value whose texts may carry a secret, rewritten by [`Secrets::scrub`].
pub trait Scrub {
    /// `self` with `f` applied to each of its texts.
    fn map_text(self, f: impl Fn(String) -> String) -> Self;
}

impl Scrub for String {
    fn map_text(self, f: impl Fn(String) -> String) -> String {
        f(self)
    }
}

/// A `Debug` stand-in for a field that is secret as a whole: shows [`REDACTED`].
pub struct Redacted;

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

/// A flag value that may hold credentials (e.g. xDS client headers): `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretText(String);

impl SecretText {
    /// The text, for the one place that uses it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for SecretText {
    type Err = std::convert::Infallible;

    fn from_str(text: &str) -> Result<SecretText, Self::Err> {
        Ok(SecretText(text.to_owned()))
    }
}

impl From<String> for SecretText {
    fn from(text: String) -> SecretText {
        SecretText(text)
    }
}

impl fmt::Debug for SecretText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretText({REDACTED})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The common shapes are checked through `RedisUrl` in `cli`; these are the rest.
    #[test]
    fn urls_show_everything_but_their_secrets() {
        for (given, shown) in [
            (
                "unix:///run/redis.sock?user=app&pass=s3cret",
                "unix:///run/redis.sock?user=app&pass=***",
            ),
            ("u:s3cret@h:6379", "***@h:6379"),
            ("redis://u:s3cret@[bad", "redis://***@[bad"),
            ("redis://[bad?pass=s3cret", "redis://[bad?***"),
        ] {
            assert_eq!(url(given), shown, "{given}");
        }
    }

    #[test]
    fn secrets_of_urls_are_scrubbed_from_text() {
        let given = "redis://user:s%40cret@127.0.0.1:1/0";
        let unix = "unix:///run/redis.sock?pass=s0cket";
        let secrets = Secrets::of(&[given, unix]);
        let text = secrets.scrub(format!("{given} and s@cret, s%40cret, s0cket"));
        for secret in ["s@cret", "s%40cret", "s0cket"] {
            assert!(!text.contains(secret), "{text}");
        }
        assert!(text.contains(MASK), "{text}");
        let shown = format!("{secrets:?}");
        assert!(
            !shown.contains("s@cret") && !shown.contains("s0cket"),
            "{shown}"
        );
    }

    #[test]
    fn whole_secrets_never_reach_debug() {
        let text: SecretText = "authorization=Bearer s3cret".parse().unwrap();
        assert_eq!(format!("{text:?}"), "SecretText(<redacted>)");
        assert_eq!(format!("{Redacted:?}"), REDACTED);
    }
}
