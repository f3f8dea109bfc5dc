//! Header handling at the proxy boundary (RFC 9110 section 7.6.1): hop-by-hop headers belong to
//! one connection and are removed in both directions; forwarding headers are appended; everything
//! else passes as is.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::http1::head::{content_length, list_elements};

/// Headers that are always hop-by-hop.
const HOP_BY_HOP: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Removes request fields whose name has an underscore (`Transfer_Encoding`, `Content_Length`):
/// servers that map `_` and `-` to one key (CGI, some frameworks) would read them as framing.
pub fn remove_underscored(headers: &mut HeaderMap) {
    let underscored = |name: &HeaderName| name.as_str().as_bytes().contains(&b'_');
    // Checked first, so the common head without one builds no list.
    if !headers.keys().any(underscored) {
        return;
    }
    let names: Vec<HeaderName> = headers.keys().filter(|n| underscored(n)).cloned().collect();
    for name in names {
        headers.remove(name);
    }
}

/// Replaces agreeing `content-length` values (several fields, or a list: `5, 5`) with one field,
/// so the next hop is not the one that decides how to read them. Values that differ or are not
/// numbers are left alone: the head readers refuse them before this runs.
pub fn collapse_content_length(headers: &mut HeaderMap) {
    let values = headers.get_all(header::CONTENT_LENGTH);
    let mut fields = values.iter();
    let several = match (fields.next(), fields.next()) {
        (None, _) => false,
        (Some(only), None) => only.as_bytes().contains(&b','),
        (Some(_), Some(_)) => true,
    };
    if !several {
        return;
    }
    if let Ok(Some(length)) = content_length(headers) {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    }
}

/// Removes `Connection`, every header it names, and the fixed hop-by-hop headers.
///
/// The fixed names are looked for among the names the head has (a handful) rather than
/// removed one by one: a `remove` by name parses and hashes the name whether or not the head
/// has it, seven times a head, in both directions of every request.
pub fn remove_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = list_elements(headers, header::CONNECTION)
        .filter_map(|name| HeaderName::from_bytes(name.as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    // `keys` yields each name once, so at most `HOP_BY_HOP.len()` of them are found.
    let mut found: [Option<HeaderName>; HOP_BY_HOP.len()] = Default::default();
    let hops = headers.keys().filter(|n| HOP_BY_HOP.contains(&n.as_str()));
    for (slot, name) in found.iter_mut().zip(hops) {
        *slot = Some(name.clone());
    }
    for name in found.into_iter().flatten() {
        headers.remove(name);
    }
}

/// An upstream response's headers as the client gets them: a `Content-Length` beside a
/// `Transfer-Encoding` is removed (RFC 9112 §6.3: the coding frames the body, and a client that
/// read the length would cut the decoded body to it), then the hop-by-hop headers. hyper's client
/// keeps both fields; the native one already drops the length, and this holds for either.
pub fn remove_hop_by_hop_from_response(headers: &mut HeaderMap) {
    if headers.contains_key(header::TRANSFER_ENCODING) {
        headers.remove(header::CONTENT_LENGTH);
    }
    remove_hop_by_hop(headers);
}

/// `X-Forwarded-For`, the client addresses of the hops so far.
pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// `X-Forwarded-Proto`, the scheme the client used.
pub const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Appends `value` to a comma-separated forwarding header (`X-Forwarded-For: a, b`). The name
/// is a `HeaderName` made once ([`X_FORWARDED_FOR`]), not text parsed again at each lookup.
pub fn append_forwarded(headers: &mut HeaderMap, name: HeaderName, value: &str) {
    // The value is copied once, into the field; a first hop's value is not formatted first.
    let field = match headers.get(&name).and_then(|v| v.to_str().ok()) {
        Some(existing) if !existing.trim().is_empty() => {
            HeaderValue::from_str(&format!("{existing}, {value}"))
        }
        _ => HeaderValue::from_str(value),
    };
    if let Ok(v) = field {
        headers.insert(name, v);
    }
}

/// The content type without parameters, lower-cased (`text/event-stream; charset=utf-8` →
/// `text/event-stream`).
pub fn content_type_essence(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    Some(
        value
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `remove_hop_by_hop` and `remove_underscored` as they were: every fixed name removed by
    /// name, every underscored name collected first.
    fn removed_by_name(headers: &mut HeaderMap) {
        let underscored: Vec<HeaderName> = headers
            .keys()
            .filter(|name| name.as_str().contains('_'))
            .cloned()
            .collect();
        for name in underscored {
            headers.remove(name);
        }
        let named: Vec<HeaderName> = list_elements(headers, header::CONNECTION)
            .filter_map(|name| HeaderName::from_bytes(name.as_bytes()).ok())
            .collect();
        for name in named {
            headers.remove(name);
        }
        for name in HOP_BY_HOP {
            headers.remove(name);
        }
    }

    /// Names drawn from the hop-by-hop ones, names a `Connection` may list, underscored ones and
    /// ordinary ones, so that every branch meets every other.
    fn any_name() -> impl Strategy<Value = &'static str> {
        let others = [
            "x-hop",
            "x_under",
            "content_length",
            "content-type",
            "authorization",
            "x-request-id",
        ];
        prop::sample::select(
            HOP_BY_HOP
                .iter()
                .chain(&others)
                .copied()
                .collect::<Vec<_>>(),
        )
    }

    proptest! {
        #[test]
        fn property_the_same_fields_go_as_when_removed_by_name(
            fields in prop::collection::vec(
                (any_name(), prop::sample::select(vec!["1", "x-hop", "keep-alive, x-hop", "te, x_under", "close"])),
                0..12,
            )
        ) {
            let mut head = HeaderMap::new();
            for (name, value) in &fields {
                head.append(*name, HeaderValue::from_static(value));
            }
            let mut expected = head.clone();
            removed_by_name(&mut expected);
            remove_underscored(&mut head);
            remove_hop_by_hop(&mut head);
            prop_assert_eq!(head, expected);
        }
    }

    #[test]
    fn hop_by_hop_and_connection_named_headers_go() {
        let mut h = HeaderMap::new();
        h.insert("connection", "keep-alive, x-secret-hop".parse().unwrap());
        h.insert("x-secret-hop", "1".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert("te", "trailers".parse().unwrap());
        h.insert("transfer-encoding", "chunked".parse().unwrap());
        h.insert("upgrade", "h2c".parse().unwrap());
        h.insert("proxy-connection", "keep-alive".parse().unwrap());
        h.insert("trailer", "x-t".parse().unwrap());
        h.insert("authorization", "Bearer k".parse().unwrap());
        h.insert("content-type", "application/json".parse().unwrap());
        remove_hop_by_hop(&mut h);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, vec!["authorization", "content-type"]);
    }

    #[test]
    fn underscored_names_go_and_agreeing_lengths_become_one() {
        let mut h = HeaderMap::new();
        h.insert("transfer_encoding", "chunked".parse().unwrap());
        h.insert("content_length", "5".parse().unwrap());
        h.insert("x-ok", "1".parse().unwrap());
        remove_underscored(&mut h);
        assert_eq!(h.keys().map(|k| k.as_str()).collect::<Vec<_>>(), ["x-ok"]);

        let mut h = HeaderMap::new();
        h.append("content-length", "5, 5".parse().unwrap());
        h.append("content-length", "5".parse().unwrap());
        collapse_content_length(&mut h);
        assert_eq!(h.get_all("content-length").iter().count(), 1);
        assert_eq!(h["content-length"], "5");
        let mut h = HeaderMap::new();
        h.append("content-length", "5".parse().unwrap());
        h.append("content-length", "6".parse().unwrap());
        collapse_content_length(&mut h);
        assert_eq!(
            h.get_all("content-length").iter().count(),
            2,
            "left to be refused"
        );
    }

    #[test]
    fn forwarded_for_appends() {
        let mut h = HeaderMap::new();
        append_forwarded(&mut h, X_FORWARDED_FOR, "10.0.0.1");
        append_forwarded(&mut h, X_FORWARDED_FOR, "127.0.0.1");
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 127.0.0.1");
    }

    #[test]
    fn essence() {
        let mut h = HeaderMap::new();
        h.insert(
            "content-type",
            "Text/Event-Stream; charset=utf-8".parse().unwrap(),
        );
        assert_eq!(
            content_type_essence(&h).as_deref(),
            Some("text/event-stream")
        );
    }
}
