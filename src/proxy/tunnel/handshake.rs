//! The opening handshake as a proxy sees it (RFC 6455 §4): which requests ask for a WebSocket,
//! which of those are malformed, the request the upstream gets and the `101` the client gets.
//!
//! Only `websocket` is tunnelled. A request offering another protocol (`h2c`, say) keeps the
//! behaviour of every other request: `Upgrade` is a hop-by-hop field, dropped, and the request is
//! forwarded as it is (RFC 9110 §7.8 lets a server ignore an upgrade).

use base64::Engine;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Version};

use crate::http1::head::list_elements;
use crate::proxy::body::{ClientBody, ProxyBody, RequestBody};
use crate::proxy::refusal::Refusal;

/// What a well-formed WebSocket upgrade carries on to its streams.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UpgradeRequest {
    /// The request's `traceparent`, kept with its streams (bounded).
    pub traceparent: Option<String>,
    /// The request's `x-request-id`, kept with its streams (bounded).
    pub request_id: Option<String>,
}

/// Why a WebSocket upgrade was refused (answered 400, `bad_upgrade`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadUpgrade {
    /// RFC 6455 §4.1: the handshake is a GET.
    #[error("a WebSocket upgrade must be a GET")]
    NotGet,
    /// `Upgrade: websocket` without `Connection: upgrade`.
    #[error("a WebSocket upgrade must list upgrade in Connection")]
    NoConnectionUpgrade,
    /// No `Sec-WebSocket-Key`, or one that is not 16 bytes in base64.
    #[error("a WebSocket upgrade needs a Sec-WebSocket-Key of 16 bytes in base64")]
    Key,
    /// `Sec-WebSocket-Version` other than 13.
    #[error("a WebSocket upgrade must have Sec-WebSocket-Version: 13")]
    Version,
}

/// Whether `request` asks for a WebSocket (`Upgrade: websocket` on HTTP/1.1), and if so whether
/// it is well formed. `None` for every other request, other upgrades included.
pub fn websocket_upgrade<B>(request: &Request<B>) -> Option<Result<UpgradeRequest, BadUpgrade>> {
    if request.version() != Version::HTTP_11 {
        return None;
    }
    let headers = request.headers();
    if !list_elements(headers, header::UPGRADE).any(is_websocket) {
        return None;
    }
    Some(check(request.method(), headers))
}

/// Whether `request` is an HTTP/2 extended CONNECT for a WebSocket (RFC 8441: `:method`
/// CONNECT, `:protocol` websocket), and if so whether it is well formed (`Sec-WebSocket-Version`
/// 13; there is no key on HTTP/2). `None` for every other request.
pub fn websocket_connect<B>(request: &Request<B>) -> Option<Result<UpgradeRequest, BadUpgrade>> {
    if request.version() != Version::HTTP_2 || request.method() != Method::CONNECT {
        return None;
    }
    let protocol = request.extensions().get::<hyper::ext::Protocol>()?;
    if !is_websocket(protocol.as_str()) {
        return None;
    }
    let headers = request.headers();
    let mut versions = headers.get_all(header::SEC_WEBSOCKET_VERSION).iter();
    match (versions.next(), versions.next()) {
        (Some(v), None) if v.as_bytes().trim_ascii() == b"13" => {}
        _ => return Some(Err(BadUpgrade::Version)),
    }
    Some(Ok(UpgradeRequest {
        traceparent: bounded(headers, "traceparent"),
        request_id: bounded(headers, "x-request-id"),
    }))
}

/// The protocol token `websocket`, with or without a version (`websocket/13` is not one any
/// client sends, but the token is what counts).
fn is_websocket(protocol: &str) -> bool {
    let name = protocol.split('/').next().unwrap_or_default();
    name.trim().eq_ignore_ascii_case("websocket")
}

/// RFC 6455 §4.2.1's checks of the client's handshake, those a proxy can make.
fn check(method: &Method, headers: &HeaderMap) -> Result<UpgradeRequest, BadUpgrade> {
    if method != Method::GET {
        return Err(BadUpgrade::NotGet);
    }
    if !list_elements(headers, header::CONNECTION).any(|c| c.eq_ignore_ascii_case("upgrade")) {
        return Err(BadUpgrade::NoConnectionUpgrade);
    }
    let mut keys = headers.get_all(header::SEC_WEBSOCKET_KEY).iter();
    let key = match (keys.next(), keys.next()) {
        (Some(key), None) => key,
        _ => return Err(BadUpgrade::Key),
    };
    let decoded = base64::engine::general_purpose::STANDARD.decode(key.as_bytes().trim_ascii());
    if decoded.map_or(true, |k| k.len() != 16) {
        return Err(BadUpgrade::Key);
    }
    let mut versions = headers.get_all(header::SEC_WEBSOCKET_VERSION).iter();
    match (versions.next(), versions.next()) {
        (Some(v), None) if v.as_bytes().trim_ascii() == b"13" => {}
        _ => return Err(BadUpgrade::Version),
    }
    Ok(UpgradeRequest {
        traceparent: bounded(headers, "traceparent"),
        request_id: bounded(headers, "x-request-id"),
    })
}

/// The longest request header value kept with a stream, as for SSE streams.
const MAX_KEPT_HEADER: usize = 256;

fn bounded(headers: &HeaderMap, name: &str) -> Option<String> {
    let mut values = headers.get_all(name).iter();
    let value = values.next().filter(|_| values.next().is_none())?;
    Some(value.to_str().ok()?.chars().take(MAX_KEPT_HEADER).collect())
}

/// The request the upstream gets: rewritten as every request is (URI, hop-by-hop fields out,
/// forwarding fields in), with `Connection: upgrade` and `Upgrade: websocket` put back and every
/// `Sec-WebSocket-*` field as the client sent it.
///
/// An HTTP/2 extended CONNECT becomes the HTTP/1.1 upgrade it stands for (RFC 8441 §5): a GET
/// with a `Sec-WebSocket-Key` of metronome's own (the client checks no accept on HTTP/2).
pub fn upstream_request(
    mut request: Request<ClientBody>,
    upstream: &crate::config::Upstream,
    peer: &super::Peer,
) -> Result<Request<RequestBody>, Refusal> {
    let extended_connect = request.method() == Method::CONNECT;
    if extended_connect {
        *request.method_mut() = Method::GET;
        request.extensions_mut().remove::<hyper::ext::Protocol>();
    }
    // The handshake has no body; a client that sends one anyway gets it cut at zero bytes.
    let mut request =
        crate::proxy::rewrite::upstream_request(request, upstream, (peer.remote, peer.scheme), 0)?;
    let headers = request.headers_mut();
    if extended_connect {
        let key = base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 16]>());
        if let Ok(key) = HeaderValue::from_str(&key) {
            headers.insert(header::SEC_WEBSOCKET_KEY, key);
        }
    }
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    Ok(request)
}

/// The client's `101`: the upstream's fields (its `Sec-WebSocket-Accept`, `-Protocol` and
/// `-Extensions` above all) without the hop-by-hop ones, and the two that make it a switch.
pub fn switching_response(upstream: &HeaderMap) -> Response<ProxyBody> {
    let mut headers = upstream.clone();
    crate::proxy::headers::remove_hop_by_hop_from_response(&mut headers);
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    let mut response = Response::new(ProxyBody::local(bytes::Bytes::new()));
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    *response.headers_mut() = headers;
    response
}

/// An HTTP/2 client's answer to its extended CONNECT once the upstream switched: `200` with the
/// upstream's `Sec-WebSocket-Protocol` and `-Extensions` (RFC 8441 §5; the accept stays between
/// metronome and the upstream, and HTTP/2 has no connection-specific fields).
pub fn connect_response(upstream: &HeaderMap) -> Response<ProxyBody> {
    let mut response = Response::new(ProxyBody::local(bytes::Bytes::new()));
    for name in [
        header::SEC_WEBSOCKET_PROTOCOL,
        header::SEC_WEBSOCKET_EXTENSIONS,
    ] {
        for value in upstream.get_all(&name) {
            response.headers_mut().append(name.clone(), value.clone());
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: Method, fields: &[(&str, &str)]) -> Request<()> {
        let mut builder = Request::builder().method(method).uri("/v1/responses");
        for (name, value) in fields {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap()
    }

    const GOOD: [(&str, &str); 4] = [
        ("connection", "keep-alive, Upgrade"),
        ("upgrade", "WebSocket"),
        ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ("sec-websocket-version", "13"),
    ];

    #[test]
    fn a_well_formed_upgrade_is_one_and_other_requests_are_not() {
        assert_eq!(
            websocket_upgrade(&request(Method::GET, &GOOD)),
            Some(Ok(UpgradeRequest::default()))
        );
        let h2c = [("connection", "upgrade"), ("upgrade", "h2c")];
        assert_eq!(websocket_upgrade(&request(Method::GET, &h2c)), None);
        assert_eq!(websocket_upgrade(&request(Method::GET, &[])), None);
        let mut http10 = request(Method::GET, &GOOD);
        *http10.version_mut() = Version::HTTP_10;
        assert_eq!(websocket_upgrade(&http10), None);
    }

    #[test]
    fn each_malformed_upgrade_says_why() {
        let with = |replace: (&'static str, &'static str)| {
            let fields: Vec<_> = GOOD
                .iter()
                .map(|f| if f.0 == replace.0 { replace } else { *f })
                .collect();
            websocket_upgrade(&request(Method::GET, &fields))
        };
        assert_eq!(
            websocket_upgrade(&request(Method::POST, &GOOD)),
            Some(Err(BadUpgrade::NotGet))
        );
        assert_eq!(
            with(("connection", "keep-alive")),
            Some(Err(BadUpgrade::NoConnectionUpgrade))
        );
        assert_eq!(
            with(("sec-websocket-key", "c2hvcnQ=")),
            Some(Err(BadUpgrade::Key))
        );
        assert_eq!(
            with(("sec-websocket-key", "not base64!")),
            Some(Err(BadUpgrade::Key))
        );
        assert_eq!(
            with(("sec-websocket-version", "8")),
            Some(Err(BadUpgrade::Version))
        );
        let no_key: Vec<_> = GOOD
            .iter()
            .filter(|f| f.0 != "sec-websocket-key")
            .copied()
            .collect();
        assert_eq!(
            websocket_upgrade(&request(Method::GET, &no_key)),
            Some(Err(BadUpgrade::Key))
        );
    }

    #[test]
    fn the_101_keeps_the_upstreams_fields_and_switches() {
        let mut upstream = HeaderMap::new();
        upstream.insert(
            "sec-websocket-accept",
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=".parse().unwrap(),
        );
        upstream.insert(
            "sec-websocket-extensions",
            "permessage-deflate".parse().unwrap(),
        );
        upstream.insert("connection", "Upgrade".parse().unwrap());
        upstream.insert("upgrade", "websocket".parse().unwrap());
        upstream.insert("keep-alive", "timeout=5".parse().unwrap());
        let response = switching_response(&upstream);
        assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
        let h = response.headers();
        assert_eq!(h["sec-websocket-accept"], "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        assert_eq!(h["sec-websocket-extensions"], "permessage-deflate");
        assert_eq!(h["connection"], "upgrade");
        assert_eq!(h["upgrade"], "websocket");
        assert!(!h.contains_key("keep-alive"));
    }
}
