//! What a client's request head must be before metronome forwards it (RFC 9112 §3, §3.2, §6.1):
//! checks on the method, the request target, `Host` and `Transfer-Encoding` that httparse and
//! hyper leave to the application. Each leniency refused here is a parse differential: a proxy
//! in front of metronome that reads the same bytes otherwise routes, or frames, the request
//! differently. Both HTTP/1.1 servers apply them (the native one from its head parser, hyper's
//! from the forwarder), HTTP/2 the ones that are not about `Host`.

use http::{header, HeaderMap, Method, StatusCode, Uri, Version};

/// Why a request head is refused; every one is answered 400 (a coded body 501) and the
/// connection closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FormError {
    /// An HTTP/1.1 request without `Host` (RFC 9112 §3.2: a server must answer 400).
    #[error("an HTTP/1.1 request must have a host header")]
    NoHost,
    /// More than one `Host` field.
    #[error("a request may have only one host header")]
    TwoHosts,
    /// A `Host` that is not `host[:port]`.
    #[error("the host header is not a valid host")]
    InvalidHost,
    /// `CONNECT`: metronome is not a tunnel.
    #[error("CONNECT is not served")]
    Connect,
    /// An asterisk-form target (`*`) with a method other than `OPTIONS`.
    #[error("only OPTIONS may have the request target *")]
    Asterisk,
    /// A target that is neither origin-form (`/path`), absolute-form (`http://host/path`) nor
    /// `*`: no leading slash, or the authority form outside CONNECT (RFC 9112 §3.2). A proxy in
    /// front may route it as it likes, and prefixed with the upstream's base path it names
    /// another resource.
    #[error("the request target must begin with a slash")]
    TargetForm,
    /// A transfer coding before `chunked` (`gzip, chunked`): metronome does not decode it, and
    /// forwarded without the field the body would arrive unmarked (RFC 9112 §6.1: 501).
    #[error("transfer codings other than chunked are not implemented")]
    CodedBody,
    /// `chunked` more than once (RFC 9112 §6.1: applied once only).
    #[error("the chunked transfer coding may be applied only once")]
    ChunkedTwice,
    /// A `.` or `..` path segment (also percent-encoded): after the upstream's base path is
    /// prefixed it would climb out of it.
    #[error("the request path has a dot segment")]
    DotSegment,
    /// A `Transfer-Encoding` field that is not text: a coding that cannot be chunked.
    #[error("the transfer-encoding header is not text")]
    TransferEncoding,
}

// === impl FormError ===

impl FormError {
    /// The status the client is answered with.
    pub fn status(self) -> StatusCode {
        match self {
            FormError::CodedBody => StatusCode::NOT_IMPLEMENTED,
            _ => StatusCode::BAD_REQUEST,
        }
    }
}

/// Checks a request head; `Ok` for one that may be forwarded.
pub fn check(
    method: &Method,
    uri: &Uri,
    version: Version,
    headers: &HeaderMap,
) -> Result<(), FormError> {
    if method == Method::CONNECT {
        return Err(FormError::Connect);
    }
    let path = uri.path();
    let (scheme, authority) = (uri.scheme().is_some(), uri.authority().is_some());
    let asterisk = !scheme && !authority && path == "*";
    if asterisk && method != Method::OPTIONS {
        return Err(FormError::Asterisk);
    }
    // On HTTP/2 the pseudo-header fields carry the target's parts, and hyper builds the URI.
    let origin = !scheme && !authority && path.starts_with('/');
    let absolute = scheme && authority;
    if version < Version::HTTP_2 && !(asterisk || origin || absolute) {
        return Err(FormError::TargetForm);
    }
    if has_dot_segment(path) {
        return Err(FormError::DotSegment);
    }
    check_transfer_codings(headers)?;
    if version < Version::HTTP_2 {
        check_host(version, headers)?;
    }
    Ok(())
}

/// `Transfer-Encoding`, all its fields read as one list: text, `chunked` at most once, and no
/// coding before it. One that does not end in `chunked` is the head parser's to refuse (400).
fn check_transfer_codings(headers: &HeaderMap) -> Result<(), FormError> {
    let mut codings = Vec::new();
    for value in headers.get_all(header::TRANSFER_ENCODING) {
        let text = value.to_str().map_err(|_| FormError::TransferEncoding)?;
        codings.extend(text.split(',').map(str::trim).filter(|c| !c.is_empty()));
    }
    let chunked = |c: &str| c.eq_ignore_ascii_case("chunked");
    if codings.iter().filter(|c| chunked(c)).count() > 1 {
        return Err(FormError::ChunkedTwice);
    }
    if codings.last().is_some_and(|c| chunked(c)) && codings.len() > 1 {
        return Err(FormError::CodedBody);
    }
    Ok(())
}

/// `Host` on HTTP/1.x: exactly one on HTTP/1.1, at most one on HTTP/1.0, and a valid
/// `host[:port]` (or empty, RFC 9112 §3.2) when there.
fn check_host(version: Version, headers: &HeaderMap) -> Result<(), FormError> {
    let mut hosts = headers.get_all(header::HOST).iter();
    let Some(host) = hosts.next() else {
        return if version == Version::HTTP_11 {
            Err(FormError::NoHost)
        } else {
            Ok(())
        };
    };
    if hosts.next().is_some() {
        return Err(FormError::TwoHosts);
    }
    let host = host.as_bytes();
    if host.is_empty() {
        return Ok(());
    }
    let valid = !host.contains(&b'@')
        && port_is_digits(host)
        && http::uri::Authority::try_from(host).is_ok_and(|a| a.as_str().len() == host.len());
    if valid {
        Ok(())
    } else {
        Err(FormError::InvalidHost)
    }
}

/// Whether what follows the host (a name, an IPv4 address, or `[an IPv6 one]`) is nothing or
/// `:` and decimal digits (`http::uri::Authority` takes `a:port`).
fn port_is_digits(host: &[u8]) -> bool {
    let after = match host.first() {
        Some(b'[') => match memchr::memchr(b']', host) {
            Some(close) => &host[close + 1..],
            None => return false,
        },
        _ => match memchr::memchr(b':', host) {
            Some(colon) => &host[colon..],
            None => return true,
        },
    };
    match after.split_first() {
        None => true,
        Some((b':', port)) => port.iter().all(u8::is_ascii_digit),
        Some(_) => false,
    }
}

/// Whether a path has a `.` or `..` segment, literal or percent-encoded (`%2e`, `%2E`).
/// Reads each segment in place: every request passes here, and decoding a copy of each segment
/// cost two allocations per segment.
fn has_dot_segment(path: &str) -> bool {
    path.split('/').any(is_dot_segment)
}

/// Whether `segment` decodes to `.` or `..`: one or two units, each a `.` or `%2e`/`%2E`.
fn is_dot_segment(segment: &str) -> bool {
    let mut rest = segment.as_bytes();
    let mut dots = 0;
    while !rest.is_empty() {
        rest = match rest {
            [b'.', tail @ ..] => tail,
            [b'%', b'2', b'e' | b'E', tail @ ..] => tail,
            _ => return false,
        };
        dots += 1;
        if dots > 2 {
            return false;
        }
    }
    dots > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checked(
        method: &str,
        target: &str,
        version: Version,
        fields: &[(&str, &[u8])],
    ) -> Result<(), FormError> {
        let mut headers = HeaderMap::new();
        for (name, value) in fields {
            headers.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                http::HeaderValue::from_bytes(value).unwrap(),
            );
        }
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        check(&method, &target.parse().unwrap(), version, &headers)
    }

    const HOST: (&str, &[u8]) = ("host", b"metronome.test:8080");

    #[test]
    fn a_plain_request_passes() {
        assert_eq!(
            checked(
                "POST",
                "/v1/chat/completions?a=1",
                Version::HTTP_11,
                &[HOST]
            ),
            Ok(())
        );
        assert_eq!(checked("GET", "/", Version::HTTP_10, &[]), Ok(()));
        assert_eq!(checked("GET", "/", Version::HTTP_2, &[]), Ok(()));
        assert_eq!(
            checked("GET", "/", Version::HTTP_11, &[("host", b"")]),
            Ok(())
        );
        assert_eq!(
            checked("GET", "/", Version::HTTP_11, &[("host", b"[::1]:80")]),
            Ok(())
        );
        assert_eq!(checked("OPTIONS", "*", Version::HTTP_11, &[HOST]), Ok(()));
        assert_eq!(
            checked("GET", "/a/.b/..c/b.", Version::HTTP_11, &[HOST]),
            Ok(())
        );
    }

    #[test]
    fn host_must_be_one_and_valid_on_http1() {
        let v11 = Version::HTTP_11;
        assert_eq!(checked("GET", "/", v11, &[]), Err(FormError::NoHost));
        assert_eq!(
            checked("GET", "/", v11, &[HOST, HOST]),
            Err(FormError::TwoHosts)
        );
        assert_eq!(
            checked("GET", "/", Version::HTTP_10, &[HOST, HOST]),
            Err(FormError::TwoHosts)
        );
        for bad in [&b"a b"[..], b"a/b", b"user@a", b"a:b:c", b"a:port"] {
            assert_eq!(
                checked("GET", "/", v11, &[("host", bad)]),
                Err(FormError::InvalidHost),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn connect_asterisk_and_dot_segments_are_refused() {
        let v11 = Version::HTTP_11;
        assert_eq!(
            checked("CONNECT", "a.test:443", v11, &[HOST]),
            Err(FormError::Connect)
        );
        assert_eq!(checked("GET", "*", v11, &[HOST]), Err(FormError::Asterisk));
        for path in ["/..", "/a/../b", "/./a", "/a/%2e%2E/b", "/a/.%2e", "/%2E"] {
            assert_eq!(
                checked("GET", path, v11, &[HOST]),
                Err(FormError::DotSegment),
                "{path}"
            );
        }
    }

    #[test]
    fn a_target_is_origin_absolute_or_asterisk_form() {
        let v11 = Version::HTTP_11;
        let mut parsed = Vec::new();
        // A target that is no URI at all ("?a=1") the head parsers refuse as malformed.
        for target in ["v1/models", "v1", "a.test:80", "a.test", "?a=1"] {
            let Ok(uri) = target.parse::<Uri>() else {
                continue;
            };
            parsed.push(target);
            for method in ["GET", "OPTIONS", "POST"] {
                let method = Method::from_bytes(method.as_bytes()).unwrap();
                assert_eq!(
                    check(
                        &method,
                        &uri,
                        v11,
                        &HeaderMap::from_iter([(header::HOST, "a".parse().unwrap())])
                    ),
                    Err(FormError::TargetForm),
                    "{method} {target}"
                );
            }
        }
        assert!(parsed.contains(&"a.test:80"), "{parsed:?}");
        // HTTP/2's pseudo-header fields are hyper's to turn into a URI.
        let h2 = checked("GET", "a.test:80", Version::HTTP_2, &[]);
        assert_eq!(h2, Ok(()));
        assert!(parsed.contains(&"v1"), "{parsed:?}");
        assert_eq!(
            checked("GET", "http://a.test/v1/models", v11, &[HOST]),
            Ok(())
        );
    }

    #[test]
    fn a_coding_before_chunked_is_not_implemented_and_chunked_twice_is_refused() {
        let te = |values: &[&'static [u8]]| {
            let mut fields = vec![HOST];
            fields.extend(values.iter().map(|v| ("transfer-encoding", *v)));
            checked("POST", "/", Version::HTTP_11, &fields)
        };
        assert_eq!(te(&[b"chunked"]), Ok(()));
        assert_eq!(te(&[b" Chunked "]), Ok(()));
        for coded in [
            &[&b"gzip, chunked"[..]][..],
            &[b"gzip", b"chunked"],
            &[b"deflate,chunked"],
            &[b"identity, chunked"],
        ] {
            assert_eq!(te(coded), Err(FormError::CodedBody), "{coded:?}");
            assert_eq!(FormError::CodedBody.status(), StatusCode::NOT_IMPLEMENTED);
        }
        for twice in [&[&b"chunked, chunked"[..]][..], &[b"chunked", b"chunked"]] {
            assert_eq!(te(twice), Err(FormError::ChunkedTwice), "{twice:?}");
        }
        // Not ending in chunked: the head parser's 400, not this check's.
        assert_eq!(te(&[b"chunked, gzip"]), Ok(()));
    }

    #[test]
    fn a_transfer_encoding_that_is_not_text_is_refused() {
        let fields = [
            HOST,
            ("transfer-encoding", b"chunked"),
            ("transfer-encoding", b"\xffchunked"),
        ];
        assert_eq!(
            checked("POST", "/", Version::HTTP_11, &fields),
            Err(FormError::TransferEncoding)
        );
        let fields = [
            HOST,
            ("transfer-encoding", b"\xff"),
            ("transfer-encoding", b"chunked"),
        ];
        assert_eq!(
            checked("POST", "/", Version::HTTP_11, &fields),
            Err(FormError::TransferEncoding)
        );
    }

    /// The decoding the in-place reader replaced: a copy of the segment with `%2e`/`%2E` decoded.
    fn dot_segment_by_copy(segment: &str) -> bool {
        let decoded = segment.replace("%2e", ".").replace("%2E", ".");
        decoded == "." || decoded == ".."
    }

    #[test]
    fn dot_segments_are_found_in_every_spelling() {
        for dot in [".", "..", "%2e", "%2E", "%2e%2E", ".%2e", "%2E."] {
            assert!(is_dot_segment(dot), "{dot}");
            assert!(has_dot_segment(&format!("/v1/{dot}/chat")), "{dot}");
        }
        for not in [
            "",
            "...",
            "%2e%2e%2e",
            ".a",
            "%2",
            "%2f",
            "%%2e",
            "%2.e",
            "%2%2ee",
            "e",
        ] {
            assert!(!is_dot_segment(not), "{not}");
        }
        assert!(!has_dot_segment("/v1/chat/completions"));
    }

    proptest::proptest! {
        /// The in-place reader decides as the decoding copy did, for any segment made of the
        /// characters that matter.
        #[test]
        fn the_in_place_reader_agrees_with_decoding(segment in "[.%2eEa]{0,8}") {
            proptest::prop_assert_eq!(is_dot_segment(&segment), dot_segment_by_copy(&segment));
        }
    }
}
