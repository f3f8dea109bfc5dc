//! What reading a head is the same for in both roles: httparse's fields turned into an `http`
//! [`HeaderMap`], its version into a [`Version`], and the framing fields read the one way both
//! ends must agree on (`content-length` by RFC 9110 §8.6, `transfer-encoding` ending in
//! chunked by RFC 9112 §6.3).
//!
//! Which lengths a role refuses, and what it answers, is the role's: the server refuses an
//! ambiguous request (smuggling), the client reads a response leniently.

use http::{header, HeaderMap, HeaderName, HeaderValue, Version};

/// A header field httparse accepted that `http` does not take, with the field's name (borrowed
/// from the head, so the caller says it in its own error).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InvalidField<'a> {
    /// The name is not a valid header name.
    Name(&'a str),
    /// The value of the field so named is not a valid header value.
    Value(&'a str),
}

/// Fields the proxy adds to a head it forwards (`X-Forwarded-For` and `-Proto` and a
/// `traceparent` to a request; the stream ID and the beacon key to a response): the map is made
/// with room for them, so that adding them does not grow it (a reallocation and a rehash on the
/// first token's path).
const ADDED_FIELDS: usize = 4;

/// The header fields of a parsed head as a [`HeaderMap`], repeated fields kept in order.
pub fn header_map<'a>(fields: &[httparse::Header<'a>]) -> Result<HeaderMap, InvalidField<'a>> {
    let mut headers = HeaderMap::with_capacity(fields.len() + ADDED_FIELDS);
    for field in fields {
        let name = HeaderName::from_bytes(field.name.as_bytes())
            .map_err(|_| InvalidField::Name(field.name))?;
        let value =
            HeaderValue::from_bytes(field.value).map_err(|_| InvalidField::Value(field.name))?;
        headers.append(name, value);
    }
    Ok(headers)
}

/// The version of a parsed head: httparse reads only `HTTP/1.0` (minor version 0) and
/// `HTTP/1.1`.
pub fn version(minor: Option<u8>) -> Version {
    match minor {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    }
}

/// The elements of a comma-separated header (`Connection`, `Transfer-Encoding`), over all its
/// fields, trimmed, empty ones skipped; a field that is not text is skipped.
pub fn list_elements(
    headers: &HeaderMap,
    name: HeaderName,
) -> impl DoubleEndedIterator<Item = &str> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|e| !e.is_empty())
}

/// Whether the last transfer coding is chunked (RFC 9112 §6.3 item 4): only then does the
/// chunked coding delimit the body.
pub fn ends_in_chunked(headers: &HeaderMap) -> bool {
    list_elements(headers, header::TRANSFER_ENCODING)
        .next_back()
        .is_some_and(|coding| coding.eq_ignore_ascii_case("chunked"))
}

/// The message's `content-length` (RFC 9110 §8.6): `None` without one; an error when a value is
/// not digits, or the values (several fields, or a comma list) differ. Every reader of the
/// field goes through this one: the client from upstream responses, the server from client
/// requests and the response it frames, the forwarder for the body limit.
pub fn content_length(headers: &HeaderMap) -> Result<Option<u64>, &'static str> {
    let mut length = None;
    for value in headers.get_all(header::CONTENT_LENGTH) {
        for part in value.as_bytes().split(|b| *b == b',') {
            let part = part.trim_ascii();
            if part.is_empty() || part.len() > 19 || !part.iter().all(u8::is_ascii_digit) {
                return Err("content-length is not a number");
            }
            let n = part.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
            if length.is_some_and(|l| l != n) {
                return Err("content-length values differ");
            }
            length = Some(n);
        }
    }
    Ok(length)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parsed_head_takes_the_proxys_fields_without_growing() {
        let fields = [
            httparse::Header {
                name: "content-type",
                value: b"text/event-stream",
            },
            httparse::Header {
                name: "cache-control",
                value: b"no-cache",
            },
            httparse::Header {
                name: "transfer-encoding",
                value: b"chunked",
            },
            httparse::Header {
                name: "date",
                value: b"Sun, 06 Dec 2026 21:00:00 GMT",
            },
            httparse::Header {
                name: "server",
                value: b"uvicorn",
            },
        ];
        let mut map = header_map(&fields).unwrap();
        let room = map.capacity();
        for i in 0..ADDED_FIELDS {
            map.insert(
                HeaderName::from_bytes(format!("x-added-{i}").as_bytes()).unwrap(),
                HeaderValue::from_static("v"),
            );
        }
        assert_eq!(map.len(), fields.len() + ADDED_FIELDS);
        assert_eq!(map.capacity(), room);
    }

    fn headers(fields: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in fields {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    #[test]
    fn content_lengths_that_agree_are_one_and_others_are_refused() {
        assert_eq!(content_length(&headers(&[])), Ok(None));
        assert_eq!(
            content_length(&headers(&[
                ("content-length", "5, 5"),
                ("content-length", "5")
            ])),
            Ok(Some(5))
        );
        for refused in ["-1", "5x", "+5", "", "99999999999999999999"] {
            let err = content_length(&headers(&[("content-length", refused)]));
            assert!(err.is_err(), "{refused:?}");
        }
        let differ = headers(&[("content-length", "5"), ("content-length", "6")]);
        assert_eq!(content_length(&differ), Err("content-length values differ"));
    }

    #[test]
    fn chunked_frames_the_body_only_as_the_last_coding() {
        assert!(ends_in_chunked(&headers(&[(
            "transfer-encoding",
            "gzip, Chunked"
        )])));
        assert!(ends_in_chunked(&headers(&[
            ("transfer-encoding", "gzip"),
            ("transfer-encoding", "chunked")
        ])));
        assert!(!ends_in_chunked(&headers(&[(
            "transfer-encoding",
            "chunked, gzip"
        )])));
        assert!(!ends_in_chunked(&headers(&[])));
    }

    #[test]
    fn fields_keep_their_order_and_a_bad_one_is_named() {
        let mut fields = [httparse::EMPTY_HEADER; 4];
        let mut request = httparse::Request::new(&mut fields);
        let wire = b"GET / HTTP/1.0\r\nx-a: 1\r\nX-A: 2\r\nhost: b\r\n\r\n";
        assert!(request.parse(wire).unwrap().is_complete());
        assert_eq!(version(request.version), Version::HTTP_10);
        let map = header_map(request.headers).unwrap();
        let all: Vec<_> = map.get_all("x-a").iter().collect();
        assert_eq!(all, ["1", "2"]);
        let bad = [httparse::Header {
            name: "x-b",
            value: b"\x7f",
        }];
        assert_eq!(header_map(&bad).unwrap_err(), InvalidField::Value("x-b"));
    }
}
