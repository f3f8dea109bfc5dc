//! The request as the upstream gets it, for every request forwarded and every WebSocket upgrade:
//! the URI rewritten to the upstream, hop-by-hop fields out, forwarding fields in.

use std::net::SocketAddr;

use http::uri::PathAndQuery;
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
    let uri = upstream_uri(upstream, &parts.uri)?;
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

/// The request's path and query on the upstream: the upstream's scheme and authority as
/// configured (already parsed), its path prefix before the client's path. Without a prefix the
/// client's path and query are taken as they were parsed; only a prefix makes a new one to parse.
fn upstream_uri(upstream: &crate::config::Upstream, client: &Uri) -> Result<Uri, Refusal> {
    let client_pq = client.path_and_query();
    let path_and_query = match (client_pq, upstream.base_path.is_empty()) {
        (Some(pq), true) => pq.clone(),
        _ => PathAndQuery::try_from(prefixed(upstream, client_pq)).map_err(Refusal::UpstreamUri)?,
    };
    let mut parts = http::uri::Parts::default();
    parts.scheme = Some(upstream.scheme.clone());
    parts.authority = Some(upstream.authority.clone());
    parts.path_and_query = Some(path_and_query);
    // With a scheme, an authority and a path, the parts always make a URI; should they not,
    // the URI's text is parsed whole, which names what is wrong.
    Uri::from_parts(parts).or_else(|_| {
        let text = format!("{}://{}", upstream.scheme, upstream.authority);
        (text + &prefixed(upstream, client_pq))
            .parse()
            .map_err(Refusal::UpstreamUri)
    })
}

/// The upstream's path prefix, then the client's path and query (`/` when it had none).
fn prefixed(upstream: &crate::config::Upstream, client: Option<&PathAndQuery>) -> String {
    format!(
        "{}{}",
        upstream.base_path,
        client.map_or("/", |p| p.as_str())
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The URI as it was made before: the whole text formatted, then parsed.
    fn parsed_whole(upstream: &crate::config::Upstream, client: &Uri) -> Option<Uri> {
        let pq = client.path_and_query().map_or("/", |p| p.as_str());
        let text = format!(
            "{}://{}{}{pq}",
            upstream.scheme, upstream.authority, upstream.base_path
        );
        text.parse().ok()
    }

    proptest! {
        /// For every client target and every prefix, the URI made from parts is the one the
        /// whole text parses to, and is refused where that text is.
        #[test]
        fn the_upstream_uri_is_the_one_its_text_parses_to(
            base in prop::sample::select(vec!["", "/v1", "/a/b", "/x%20y"]),
            target in concat!(
                "/[a-zA-Z0-9/._~%!$&'()*+,;=:@-]{0,40}",
                "(\\?[a-zA-Z0-9/._~%!$&'()*+,;=:@?-]{0,20})?",
            ),
            absolute in any::<bool>(),
        ) {
            let url = format!("http://127.0.0.1:8000{base}");
            let upstream = crate::config::Upstream::parse(&url).unwrap();
            let text = if absolute { format!("http://client.example{target}") } else { target };
            let Ok(client) = text.parse::<Uri>() else { return Ok(()) };
            let made = upstream_uri(&upstream, &client).ok();
            prop_assert_eq!(made, parsed_whole(&upstream, &client));
        }
    }

    #[test]
    fn a_target_without_a_path_goes_to_the_prefix_root() {
        let upstream = crate::config::Upstream::parse("http://127.0.0.1:8000/v1").unwrap();
        let client: Uri = "http://client.example".parse().unwrap();
        let made = upstream_uri(&upstream, &client).unwrap();
        assert_eq!(made.to_string(), "http://127.0.0.1:8000/v1/");
    }
}
