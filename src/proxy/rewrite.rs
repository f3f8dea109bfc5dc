//! The request as the upstream gets it, for every request forwarded and every WebSocket upgrade:
//! the URI rewritten to the upstream, hop-by-hop fields out, forwarding fields in.

use std::net::SocketAddr;

use http::{header, HeaderValue, Request, Uri};

use super::body::{ClientBody, RequestBody};
use super::headers::{
    append_forwarded, collapse_content_length, remove_hop_by_hop, remove_underscored,
    X_FORWARDED_FOR, X_FORWARDED_PROTO,
};
use super::refusal::Refusal;

/// The request as the upstream gets it: its URI, hop-by-hop headers removed, forwarding headers
/// appended (`remote` is the client's address, `scheme` how it came: `http` or `https`), the body
/// streamed as it arrives.
pub fn upstream_request(
    request: Request<ClientBody>,
    upstream: &crate::config::Upstream,
    (remote, scheme): (SocketAddr, &str),
    body_limit: u64,
) -> Result<Request<RequestBody>, Refusal> {
    let (mut parts, body) = request.into_parts();
    let path_and_query = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let uri: Uri = format!(
        "{}://{}{}{}",
        upstream.scheme, upstream.authority, upstream.base_path, path_and_query
    )
    .parse()
    .map_err(Refusal::UpstreamUri)?;
    // An HTTP/2 client names the host in `:authority`; the HTTP/1.1 upstream needs `Host`.
    if !parts.headers.contains_key(header::HOST) {
        if let Some(authority) = parts.uri.authority() {
            if let Ok(value) = HeaderValue::from_str(authority.as_str()) {
                parts.headers.insert(header::HOST, value);
            }
        }
    }
    remove_hop_by_hop(&mut parts.headers);
    remove_underscored(&mut parts.headers);
    collapse_content_length(&mut parts.headers);
    append_forwarded(
        &mut parts.headers,
        X_FORWARDED_FOR,
        &remote.ip().to_string(),
    );
    append_forwarded(&mut parts.headers, X_FORWARDED_PROTO, scheme);
    parts.uri = uri;
    parts.version = http::Version::HTTP_11;
    Ok(Request::from_parts(
        parts,
        RequestBody::new(body, body_limit),
    ))
}
