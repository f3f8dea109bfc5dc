//! Credentials the probe sends but never shows: `--api-key` (or `OPENAI_API_KEY`) and the
//! values of credential headers given with `--header`. A report is shared and a CI log is
//! public, so neither prints them: the key is held in a type whose `Debug` hides it, the header
//! it becomes is marked sensitive, the command line in `meta` masks it, and anything a server
//! answers (an error body that echoes the key back) has it replaced before it is kept.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use http::header::HeaderName;

/// What replaces a credential in text.
pub const MASK: &str = "***";

/// Header names whose values are credentials.
const CREDENTIAL_HEADERS: [&str; 5] = [
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "api-key",
    "cookie",
];

/// An API key from `--api-key` or `OPENAI_API_KEY`.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

/// The credentials of a run, to be masked wherever text from the server is kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Secrets {
    /// Each credential as it is sent (and, for `Bearer X`, `X` alone).
    values: Vec<String>,
}

// === impl ApiKey ===

impl ApiKey {
    /// The key, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl FromStr for ApiKey {
    type Err = std::convert::Infallible;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Ok(ApiKey(text.trim().to_owned()))
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ApiKey({MASK})")
    }
}

// === impl Secrets ===

impl Secrets {
    /// Whether a header of this name carries a credential.
    pub fn is_credential(name: &HeaderName) -> bool {
        CREDENTIAL_HEADERS.contains(&name.as_str())
    }

    /// Adds a credential (and the token of a `Bearer`/`Basic` value on its own). Empty values
    /// are not kept: there is nothing to mask.
    pub fn add(&mut self, value: &str) {
        let value = value.trim();
        if value.is_empty() {
            return;
        }
        if let Some((_, token)) = value.split_once(' ') {
            let token = token.trim();
            if !token.is_empty() {
                self.values.push(token.to_owned());
            }
        }
        self.values.push(value.to_owned());
        // The longest first, so that a value is masked whole before a part of it is.
        self.values.sort_by_key(|v| std::cmp::Reverse(v.len()));
        self.values.dedup();
    }

    /// `text` with every credential replaced by [`MASK`].
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        for secret in &self.values {
            if out.contains(secret.as_str()) {
                out = Cow::Owned(out.replace(secret.as_str(), MASK));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_echoed_by_the_server_is_masked_whole_and_alone() {
        let mut secrets = Secrets::default();
        secrets.add("Bearer sk-test-123");
        secrets.add("");
        let echoed = "{\"error\": \"Incorrect API key provided: sk-test-123\", \"header\": \"Bearer sk-test-123\"}";
        assert_eq!(
            secrets.redact(echoed),
            "{\"error\": \"Incorrect API key provided: ***\", \"header\": \"***\"}"
        );
        assert!(matches!(secrets.redact("nothing here"), Cow::Borrowed(_)));
        assert_eq!(Secrets::default().redact("x"), "x");
    }

    #[test]
    fn a_key_never_shows_in_debug() {
        let key: ApiKey = "sk-test-123".parse().unwrap();
        assert_eq!(format!("{key:?}"), "ApiKey(***)");
        assert_eq!(key.expose(), "sk-test-123");
    }

    #[test]
    fn credential_headers_are_known_by_name() {
        assert!(Secrets::is_credential(&HeaderName::from_static(
            "authorization"
        )));
        assert!(Secrets::is_credential(&HeaderName::from_static(
            "x-api-key"
        )));
        assert!(!Secrets::is_credential(&HeaderName::from_static(
            "user-agent"
        )));
    }
}
