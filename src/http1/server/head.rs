//! Message heads for the native HTTP/1.1 server: a client's request head read out of the
//! connection's buffer (RFC 9112 §2–§6), and the response head written for it.
//!
//! Parsing is httparse's, and turning its fields into `http` types is the shared wire layer's
//! ([`crate::http1::head`]); this module decides how long the request body is (§6.3, refusing the ambiguous cases that enable request smuggling), whether
//! the connection stays open (§9.3), and how the response body is framed.

use std::cell::RefCell;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri, Version};

use crate::http1::decode::BodyLength;
use crate::http1::encode::write_fields;
use crate::http1::head::{
    content_length, ends_in_chunked, header_map, list_elements, version, InvalidField,
};
use crate::http1::request_form::{self, FormError};
use crate::http1::MAX_HEADERS;

/// A request head, parsed.
#[derive(Debug)]
pub struct RequestHead {
    pub method: Method,
    pub uri: Uri,
    pub version: Version,
    pub headers: HeaderMap,
    /// How the request body is delimited (never `UntilClose`: a request has no such body).
    pub body: BodyLength,
    /// Whether the client asked to keep the connection open after this exchange.
    pub keep_alive: bool,
    /// `Expect: 100-continue`: the client waits for an interim answer before its body.
    pub expects_continue: bool,
}

/// Why a request head cannot be served; each is answered with its status and the connection
/// closed, since where the next request would begin is then unknown.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    /// Not HTTP/1.x as RFC 9112 writes it.
    #[error("malformed request head: {0}")]
    Malformed(String),
    /// Larger than `limits.max_header_bytes`, or more than [`MAX_HEADERS`] fields.
    #[error("the request head is larger than {0} bytes or has more than 100 header fields")]
    TooLarge(usize),
    /// A body length that cannot be trusted (RFC 9112 §6.3 items 3 and 5).
    #[error("{0}")]
    BodyLength(&'static str),
    /// A method, target, `Host` or `Transfer-Encoding` refused by [`request_form::check`].
    #[error("{0}")]
    Form(#[from] FormError),
}

// === impl HeadError ===

impl HeadError {
    /// The status the client is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            HeadError::TooLarge(_) => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            HeadError::Form(form) => form.status(),
            HeadError::Malformed(_) | HeadError::BodyLength(_) => StatusCode::BAD_REQUEST,
        }
    }
}

/// Parses a request head at the start of `buf`: `Ok(None)` while it is incomplete, else the head
/// and its length in bytes. `max_bytes` bounds a head that is still incomplete as well as one
/// that is whole.
pub fn parse_request(
    buf: &[u8],
    max_bytes: usize,
) -> Result<Option<(RequestHead, usize)>, HeadError> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut fields);
    let len = match request.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() >= max_bytes => {
            return Err(HeadError::TooLarge(max_bytes))
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge(max_bytes)),
        Err(e) => return Err(HeadError::Malformed(e.to_string())),
    };
    if len > max_bytes {
        return Err(HeadError::TooLarge(max_bytes));
    }
    let method = Method::from_bytes(request.method.unwrap_or_default().as_bytes())
        .map_err(|e| HeadError::Malformed(format!("method: {e}")))?;
    let uri: Uri = request
        .path
        .unwrap_or_default()
        .parse()
        .map_err(|e| HeadError::Malformed(format!("request target: {e}")))?;
    let version = version(request.version);
    let headers = header_map(request.headers).map_err(|field| match field {
        InvalidField::Name(name) => HeadError::Malformed(format!("header name {name:?}")),
        InvalidField::Value(name) => HeadError::Malformed(format!("value of header {name:?}")),
    })?;
    request_form::check(&method, &uri, version, &headers)?;
    let body = body_length(version, &headers)?;
    let keep_alive = keeps_alive(version, &headers);
    let expects_continue = version == Version::HTTP_11
        && headers
            .get(header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let head = RequestHead {
        method,
        uri,
        version,
        headers,
        body,
        keep_alive,
        expects_continue,
    };
    Ok(Some((head, len)))
}

/// How long a request body is (RFC 9112 §6.3): chunked when `transfer-encoding` ends with it,
/// `content-length` bytes, or none. A `transfer-encoding` that does not end in chunked, one
/// beside a `content-length`, one in an HTTP/1.0 request (§6.1: its framing is faulty), or
/// differing lengths are refused: a proxy that guesses here lets a client smuggle a second
/// request past it.
fn body_length(version: Version, headers: &HeaderMap) -> Result<BodyLength, HeadError> {
    let has_length = headers.contains_key(header::CONTENT_LENGTH);
    if headers.contains_key(header::TRANSFER_ENCODING) {
        if version == Version::HTTP_10 {
            return Err(HeadError::BodyLength(
                "an HTTP/1.0 request may not have a transfer-encoding",
            ));
        }
        if has_length {
            return Err(HeadError::BodyLength(
                "a request may not have both transfer-encoding and content-length",
            ));
        }
        return if ends_in_chunked(headers) {
            Ok(BodyLength::Chunked)
        } else {
            Err(HeadError::BodyLength(
                "a request's transfer-encoding must end with chunked",
            ))
        };
    }
    let length = content_length(headers).map_err(HeadError::BodyLength)?;
    Ok(match length {
        Some(0) | None => BodyLength::Empty,
        Some(n) => BodyLength::Length(n),
    })
}

/// Whether the connection may carry another request (RFC 9112 §9.3): HTTP/1.1 unless the client
/// said `close`, HTTP/1.0 only when it said `keep-alive`.
fn keeps_alive(version: Version, headers: &HeaderMap) -> bool {
    let mut close = false;
    let mut keep_alive = false;
    for option in list_elements(headers, header::CONNECTION) {
        close |= option.eq_ignore_ascii_case("close");
        keep_alive |= option.eq_ignore_ascii_case("keep-alive");
    }
    if close {
        return false;
    }
    version == Version::HTTP_11 || keep_alive
}

/// How a response body goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body bytes at all (`HEAD`, 1xx, 204, 304).
    None,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
    /// Until the connection closes (an HTTP/1.0 client and a body of unknown length).
    UntilClose,
}

/// What the response head is written from.
#[derive(Debug)]
pub struct ResponseFraming {
    pub framing: Framing,
    /// Whether the connection stays open after the response.
    pub keep_alive: bool,
}

/// Decides the response body's framing the way hyper does for a server: a body that may not have
/// one has none; a `content-length` the handler set is kept; an empty or exactly sized body gets
/// one; otherwise chunked for HTTP/1.1 and until close for HTTP/1.0. Fixes the framing headers
/// in `headers` to match.
pub fn frame_response(
    status: StatusCode,
    request_method: &Method,
    request_version: Version,
    headers: &mut HeaderMap,
    body_exact: Option<u64>,
    keep_alive: bool,
) -> ResponseFraming {
    headers.remove(header::TRANSFER_ENCODING);
    // A length that does not parse is not the handler's to keep: the body frames itself.
    let declared = content_length(headers).ok().flatten();
    if status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        if status != StatusCode::NOT_MODIFIED {
            headers.remove(header::CONTENT_LENGTH);
        }
        return ResponseFraming {
            framing: Framing::None,
            keep_alive,
        };
    }
    if request_method == Method::HEAD {
        // A HEAD answer's body is always empty, so its size says nothing of the GET's: only a
        // length the handler set is kept (an upstream that answered chunked gets none, never 0).
        return ResponseFraming {
            framing: Framing::None,
            keep_alive,
        };
    }
    if let Some(n) = declared.or(body_exact) {
        if declared.is_none() {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
        }
        return ResponseFraming {
            framing: Framing::Length(n),
            keep_alive,
        };
    }
    headers.remove(header::CONTENT_LENGTH);
    if request_version == Version::HTTP_11 {
        headers.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        ResponseFraming {
            framing: Framing::Chunked,
            keep_alive,
        }
    } else {
        ResponseFraming {
            framing: Framing::UntilClose,
            keep_alive: false,
        }
    }
}

/// Writes a response head: the status line, the handler's fields (framing already fixed by
/// [`frame_response`]), `connection` when the connection's fate must be said, and `date` when the
/// handler set none (as hyper does; RFC 9110 §6.6.1).
pub fn write_response_head(
    out: &mut Vec<u8>,
    status: StatusCode,
    headers: &HeaderMap,
    request_version: Version,
    keep_alive: bool,
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    write_fields(
        out,
        headers
            .iter()
            .filter(|(name, _)| *name != header::CONNECTION),
    );
    if !keep_alive {
        out.extend_from_slice(b"connection: close\r\n");
    } else if request_version == Version::HTTP_10 {
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }
    if !headers.contains_key(header::DATE) {
        out.extend_from_slice(b"date: ");
        with_date(|date| out.extend_from_slice(date));
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// The answer to a request head that cannot be served: a JSON error, and the connection closed.
pub fn error_response(error: &HeadError) -> Vec<u8> {
    let kind = match error {
        HeadError::TooLarge(_) => "request_head_too_large",
        _ => "invalid_request",
    };
    let body = serde_json::json!({"error": {"type": kind, "message": error.to_string()}})
        .to_string()
        + "\n";
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    let mut out = Vec::with_capacity(256 + body.len());
    write_response_head(&mut out, error.status(), &headers, Version::HTTP_11, false);
    out.extend_from_slice(body.as_bytes());
    out
}

thread_local! {
    /// The `date` value of the current second, formatted once per second per thread.
    static DATE: RefCell<(u64, [u8; 29])> = const { RefCell::new((u64::MAX, [0; 29])) };
}

/// Calls `f` with the current time as an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`).
pub(super) fn with_date(f: impl FnOnce(&[u8])) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    DATE.with(|cell| {
        let mut cached = cell.borrow_mut();
        if cached.0 != now {
            *cached = (now, imf_fixdate(now));
        }
        f(&cached.1);
    });
}

/// Seconds since the Unix epoch as an IMF-fixdate (RFC 9110 §5.6.7), by `httpdate`, which
/// hyper uses for the same field.
fn imf_fixdate(secs: u64) -> [u8; 29] {
    let text = httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(secs));
    let mut out = [b' '; 29];
    let len = text.len().min(29);
    out[..len].copy_from_slice(&text.as_bytes()[..len]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Option<(RequestHead, usize)>, HeadError> {
        parse_request(text.as_bytes(), 64 * 1024)
    }

    #[test]
    fn a_chat_request_head_is_read_whole() {
        let text = "POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\nX-Two: 1\r\nx-two: 2\r\n\r\n{\"a\":1}";
        let (head, len) = parse(text).unwrap().unwrap();
        assert_eq!(len, text.len() - 7);
        assert_eq!(head.method, Method::POST);
        assert_eq!(head.uri, "/v1/chat/completions?x=1");
        assert_eq!(head.version, Version::HTTP_11);
        assert_eq!(head.body, BodyLength::Length(12));
        assert!(head.keep_alive);
        assert!(!head.expects_continue);
        assert_eq!(head.headers.get_all("x-two").iter().count(), 2);
        assert_eq!(head.headers["host"], "a");
    }

    #[test]
    fn an_incomplete_head_waits_and_an_endless_one_is_refused() {
        assert!(parse("GET / HTTP/1.1\r\nHost: a\r\n").unwrap().is_none());
        let long = format!("GET / HTTP/1.1\r\nx: {}\r\n", "a".repeat(9000));
        assert_eq!(
            parse_request(long.as_bytes(), 8192).unwrap_err(),
            HeadError::TooLarge(8192)
        );
        let whole = format!("{long}\r\n");
        assert_eq!(
            parse_request(whole.as_bytes(), 8192).unwrap_err(),
            HeadError::TooLarge(8192)
        );
        let many: String = (0..101).map(|i| format!("x{i}: 1\r\n")).collect();
        let err = parse(&format!("GET / HTTP/1.1\r\n{many}\r\n")).unwrap_err();
        assert_eq!(err.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    }

    #[test]
    fn malformed_heads_are_refused() {
        for text in [
            "GET / HTTP/2.0\r\n\r\n",
            "GET /\r\n\r\n",
            "G\x01T / HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nbad header\r\n\r\n",
        ] {
            let err = parse(text).unwrap_err();
            assert_eq!(err.status(), StatusCode::BAD_REQUEST, "{text:?}: {err}");
        }
    }

    #[test]
    fn body_lengths_follow_rfc_9112_and_ambiguity_is_refused() {
        let length = |fields: &str| {
            parse(&format!("POST / HTTP/1.1\r\nhost: a\r\n{fields}\r\n")).map(|h| h.unwrap().0.body)
        };
        assert_eq!(length(""), Ok(BodyLength::Empty));
        assert_eq!(length("content-length: 0\r\n"), Ok(BodyLength::Empty));
        assert_eq!(length("content-length: 5\r\n"), Ok(BodyLength::Length(5)));
        assert_eq!(
            length("content-length: 5, 5\r\ncontent-length: 5\r\n"),
            Ok(BodyLength::Length(5))
        );
        // A coding before chunked is read, and refused as not implemented (request_form).
        assert_eq!(
            length("transfer-encoding: gzip, Chunked\r\n"),
            Err(HeadError::Form(FormError::CodedBody))
        );
        for refused in [
            "content-length: 5\r\ncontent-length: 6\r\n",
            "content-length: -1\r\n",
            "content-length: 5x\r\n",
            "content-length: 99999999999999999999\r\n",
            "transfer-encoding: chunked\r\ncontent-length: 5\r\n",
            "transfer-encoding: chunked, gzip\r\n",
        ] {
            let err = length(refused).unwrap_err();
            assert_eq!(err.status(), StatusCode::BAD_REQUEST, "{refused:?}");
        }
        let err = parse("POST / HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n").unwrap_err();
        assert_eq!(err.status(), StatusCode::BAD_REQUEST);
    }

    #[test]
    fn heads_refused_by_their_form_get_400() {
        for text in [
            &b"GET / HTTP/1.1\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n",
            b"GET / HTTP/1.1\r\nhost: a b\r\n\r\n",
            b"CONNECT a:443 HTTP/1.1\r\nhost: a:443\r\n\r\n",
            b"GET * HTTP/1.1\r\nhost: a\r\n\r\n",
            b"GET /v1/../admin HTTP/1.1\r\nhost: a\r\n\r\n",
            b"POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: \xffchunked\r\ntransfer-encoding: chunked\r\n\r\n",
        ] {
            let err = parse_request(text, 1 << 16).unwrap_err();
            assert!(
                matches!(err, HeadError::Form(_)),
                "{:?}: {err}",
                String::from_utf8_lossy(text)
            );
            assert_eq!(err.status(), StatusCode::BAD_REQUEST);
        }
        assert!(parse("OPTIONS * HTTP/1.1\r\nhost: a\r\n\r\n")
            .unwrap()
            .is_some());
    }

    #[test]
    fn keep_alive_follows_the_version_and_the_connection_header() {
        let alive = |version: &str, fields: &str| {
            parse(&format!("GET / {version}\r\nhost: a\r\n{fields}\r\n"))
                .unwrap()
                .unwrap()
                .0
                .keep_alive
        };
        assert!(alive("HTTP/1.1", ""));
        assert!(!alive("HTTP/1.1", "connection: Close\r\n"));
        assert!(!alive("HTTP/1.1", "connection: keep-alive, close\r\n"));
        assert!(!alive("HTTP/1.0", ""));
        assert!(alive("HTTP/1.0", "connection: Keep-Alive\r\n"));
        let head = parse(
            "POST / HTTP/1.1\r\nhost: a\r\nexpect: 100-Continue\r\ncontent-length: 3\r\n\r\n",
        )
        .unwrap()
        .unwrap()
        .0;
        assert!(head.expects_continue);
    }

    #[test]
    fn responses_are_framed_as_hyper_frames_them() {
        let frame = |status: u16, method: Method, version, set: Option<&str>, exact| {
            let mut headers = HeaderMap::new();
            headers.insert(
                header::TRANSFER_ENCODING,
                HeaderValue::from_static("chunked"),
            );
            if let Some(n) = set {
                headers.insert(header::CONTENT_LENGTH, HeaderValue::from_str(n).unwrap());
            }
            let status = StatusCode::from_u16(status).unwrap();
            let framing = frame_response(status, &method, version, &mut headers, exact, true);
            (framing.framing, framing.keep_alive, headers)
        };
        let (framing, alive, headers) = frame(200, Method::POST, Version::HTTP_11, None, None);
        assert_eq!((framing, alive), (Framing::Chunked, true));
        assert_eq!(headers[header::TRANSFER_ENCODING], "chunked");
        let (framing, _, headers) = frame(200, Method::GET, Version::HTTP_11, Some("7"), None);
        assert_eq!(framing, Framing::Length(7));
        assert!(!headers.contains_key(header::TRANSFER_ENCODING));
        let (framing, _, headers) = frame(200, Method::GET, Version::HTTP_11, None, Some(0));
        assert_eq!(framing, Framing::Length(0));
        assert_eq!(headers[header::CONTENT_LENGTH], "0");
        let (framing, alive, _) = frame(200, Method::GET, Version::HTTP_10, None, None);
        assert_eq!((framing, alive), (Framing::UntilClose, false));
        let (framing, _, headers) = frame(200, Method::HEAD, Version::HTTP_11, Some("9"), None);
        assert_eq!(framing, Framing::None);
        assert_eq!(headers[header::CONTENT_LENGTH], "9");
        // A HEAD answered chunked: no body, and no length made up from the empty one.
        let (framing, _, headers) = frame(200, Method::HEAD, Version::HTTP_11, None, Some(0));
        assert_eq!(framing, Framing::None);
        assert!(!headers.contains_key(header::CONTENT_LENGTH), "{headers:?}");
        assert!(
            !headers.contains_key(header::TRANSFER_ENCODING),
            "{headers:?}"
        );
        let (framing, _, headers) = frame(204, Method::POST, Version::HTTP_11, Some("0"), None);
        assert_eq!(framing, Framing::None);
        assert!(headers.is_empty());
    }

    #[test]
    fn a_response_head_says_the_status_fields_connection_and_date() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        headers.insert(header::CONNECTION, HeaderValue::from_static("keep-alive"));
        let mut out = Vec::new();
        write_response_head(&mut out, StatusCode::OK, &headers, Version::HTTP_11, false);
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with(
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\ndate: "
            ),
            "{text}"
        );
        assert!(text.ends_with(" GMT\r\n\r\n"), "{text}");
        assert_eq!(text.matches("connection").count(), 1);
    }

    #[test]
    fn dates_are_imf_fixdates() {
        assert_eq!(&imf_fixdate(784_111_777), b"Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(&imf_fixdate(0), b"Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(&imf_fixdate(951_825_600), b"Tue, 29 Feb 2000 12:00:00 GMT");
        assert_eq!(
            &imf_fixdate(1_798_761_599),
            b"Thu, 31 Dec 2026 23:59:59 GMT"
        );
    }

    #[test]
    fn an_unservable_head_gets_a_json_error_and_a_close() {
        let out = error_response(&HeadError::TooLarge(8192));
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"));
        assert!(text.contains("connection: close\r\n"));
        let body = text.split("\r\n\r\n").nth(1).unwrap();
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(json["error"]["type"], "request_head_too_large");
        assert!(text.contains(&format!("content-length: {}\r\n", body.len())));
    }
}
