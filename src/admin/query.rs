//! `/streams?request_id=…&outcome=…&stalled=…&limit=…`: finding one user's stream among the
//! recent ones. A parameter that is unknown, repeated or out of range is refused by name (400),
//! rather than ignored: a typo must not return every stream as if it had matched.

use std::borrow::Cow;

use crate::metrics::Outcome;
use crate::timeline::FinishedStream;

/// The outcomes `outcome=` accepts: the `outcome` label's values.
const OUTCOMES: [Outcome; 5] = [
    Outcome::Complete,
    Outcome::ClientCancelled,
    Outcome::UpstreamError,
    Outcome::UpstreamTimeout,
    Outcome::NoToken,
];

/// Why a `/streams` query was refused; the message names the parameter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// A parameter `/streams` does not know.
    #[error("unknown parameter `{0}`: /streams takes request_id, outcome, stalled and limit")]
    Unknown(String),
    /// A parameter given twice.
    #[error("parameter `{0}` is given more than once")]
    Repeated(&'static str),
    /// A value the parameter cannot take.
    #[error("parameter `{name}` cannot be `{value}`: {expected}")]
    Invalid {
        /// The parameter.
        name: &'static str,
        /// The value given (decoded).
        value: String,
        /// What it takes.
        expected: &'static str,
    },
}

// === impl QueryError ===

impl QueryError {
    /// The parameter the error is about, for the JSON answer.
    pub fn parameter(&self) -> &str {
        match self {
            QueryError::Unknown(name) => name,
            QueryError::Repeated(name) | QueryError::Invalid { name, .. } => name,
        }
    }
}

/// The filters of one `/streams` request; none set lists every stream kept.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StreamQuery {
    /// The request's `x-request-id`, exactly.
    pub request_id: Option<String>,
    /// How the stream ended.
    pub outcome: Option<Outcome>,
    /// Whether it had a stall (at ingress or egress).
    pub stalled: Option<bool>,
    /// At most this many, newest first.
    pub limit: Option<usize>,
}

// === impl StreamQuery ===

impl StreamQuery {
    /// Reads a query string (without the `?`), percent-decoding each value.
    pub fn parse(query: Option<&str>) -> Result<Self, QueryError> {
        let mut out = StreamQuery::default();
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (raw_name, raw_value) = pair.split_once('=').unwrap_or((pair, ""));
            let name = decode(raw_name);
            let value = decode(raw_value).into_owned();
            match &*name {
                "request_id" => set(&mut out.request_id, "request_id", value)?,
                "outcome" => {
                    let outcome = OUTCOMES
                        .into_iter()
                        .find(|o| o.as_str() == value)
                        .ok_or_else(|| QueryError::Invalid {
                            name: "outcome",
                            value: value.clone(),
                            expected: "complete, client_cancelled, upstream_error, upstream_timeout or no_token",
                        })?;
                    set(&mut out.outcome, "outcome", outcome)?;
                }
                "stalled" => {
                    let stalled = match &*value {
                        "true" => true,
                        "false" => false,
                        _ => {
                            return Err(QueryError::Invalid {
                                name: "stalled",
                                value,
                                expected: "true or false",
                            })
                        }
                    };
                    set(&mut out.stalled, "stalled", stalled)?;
                }
                "limit" => {
                    let limit = value.parse::<usize>().ok().filter(|n| *n > 0).ok_or(
                        QueryError::Invalid {
                            name: "limit",
                            value,
                            expected: "a whole number of 1 or more",
                        },
                    )?;
                    set(&mut out.limit, "limit", limit)?;
                }
                _ => return Err(QueryError::Unknown(name.into_owned())),
            }
        }
        Ok(out)
    }

    /// Whether a kept stream passes every filter set.
    pub fn matches(&self, stream: &FinishedStream) -> bool {
        let request_id = self
            .request_id
            .as_deref()
            .is_none_or(|want| stream.request_id.as_deref() == Some(want));
        let outcome = self
            .outcome
            .is_none_or(|want| stream.outcome == want.as_str());
        let stalled = self.stalled.is_none_or(|want| {
            let had = stream.stalls.ingress > 0 || stream.stalls.egress > 0;
            had == want
        });
        request_id && outcome && stalled
    }
}

fn set<T>(slot: &mut Option<T>, name: &'static str, value: T) -> Result<(), QueryError> {
    if slot.replace(value).is_some() {
        return Err(QueryError::Repeated(name));
    }
    Ok(())
}

/// `application/x-www-form-urlencoded` decoding: `+` is a space, `%XX` a byte; a malformed
/// escape stays as it is, and bytes that are not UTF-8 are replaced.
fn decode(raw: &str) -> Cow<'_, str> {
    if !raw.contains(['%', '+']) {
        return Cow::Borrowed(raw);
    }
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok());
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(byte) => {
                        out.push(byte);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_query_filters_nothing() {
        assert_eq!(StreamQuery::parse(None), Ok(StreamQuery::default()));
        assert_eq!(StreamQuery::parse(Some("")), Ok(StreamQuery::default()));
    }

    #[test]
    fn every_parameter_is_read_and_decoded() {
        let q = StreamQuery::parse(Some(
            "request_id=req%2F42+b&outcome=upstream_error&stalled=true&limit=5",
        ))
        .unwrap();
        assert_eq!(q.request_id.as_deref(), Some("req/42 b"));
        assert_eq!(q.outcome, Some(Outcome::UpstreamError));
        assert_eq!(q.stalled, Some(true));
        assert_eq!(q.limit, Some(5));
    }

    #[test]
    fn a_bad_parameter_is_named() {
        let cases = [
            ("outcome=done", "outcome"),
            ("stalled=yes", "stalled"),
            ("limit=0", "limit"),
            ("limit=-3", "limit"),
            ("limit=ten", "limit"),
            ("requestid=x", "requestid"),
            ("limit=1&limit=2", "limit"),
        ];
        for (query, name) in cases {
            let err = StreamQuery::parse(Some(query)).unwrap_err();
            assert_eq!(err.parameter(), name, "{query}: {err}");
            assert!(err.to_string().contains(name), "{query}: {err}");
        }
    }

    #[test]
    fn a_malformed_escape_stays_as_written() {
        assert_eq!(decode("a%zzb%4"), "a%zzb%4");
        assert_eq!(decode("%41%42"), "AB");
    }
}
