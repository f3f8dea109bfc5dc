//! The sim's WebSocket endpoints: `GET /v1/responses` (the Responses API's WebSocket mode) and
//! `GET /v1/realtime` (the Realtime API), upgraded with hyper's upgrade support and served by
//! yawc, a WebSocket implementation independent of the proxy's frame reader, so a test of the
//! proxy checks one against the other.
//!
//! - `session`: one socket's life, one response at a time.
//! - `responses` and `realtime`: what each API's client messages ask, and their replies.
//! - `messages`: a generated stream's frames as messages (each event's data).
//!
//! What the socket's frames look like is set by [`crate::sim::WebSocketConfig`]:
//! `permessage-deflate` allowed or refused, large messages fragmented, server pings, and a
//! close with a chosen code and reason after some responses.

mod messages;
mod realtime;
mod responses;
mod session;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use http::{header, HeaderValue, Request, Response, StatusCode};
use yawc::{Options, WebSocket};

use self::realtime::RealtimeSession;
use self::session::Protocol;
use super::server::SimShared;
use super::stream::SimBody;

/// The subprotocol a browser's Realtime client offers, answered when offered.
const REALTIME_SUBPROTOCOL: &str = "realtime";

/// The subprotocol (and the `OpenAI-Beta` value) that asks for the Realtime beta interface.
const REALTIME_BETA_SUBPROTOCOL: &str = "openai-beta.realtime-v1";

/// Which WebSocket endpoint a path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// `/v1/responses`.
    Responses,
    /// `/v1/realtime`.
    Realtime,
}

// === impl Endpoint ===

impl Endpoint {
    /// The endpoint at `path`, if it is one.
    pub(crate) fn of(path: &str) -> Option<Endpoint> {
        match path {
            "/v1/responses" => Some(Endpoint::Responses),
            "/v1/realtime" => Some(Endpoint::Realtime),
            _ => None,
        }
    }
}

/// Whether `req` asks to switch to WebSocket (`Upgrade: websocket`, any case).
pub(crate) fn is_upgrade<B>(req: &Request<B>) -> bool {
    req.headers()
        .get_all(header::UPGRADE)
        .iter()
        .any(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"))
}

/// Answers an upgrade request on `endpoint` with `101 Switching Protocols` and serves the
/// socket in a task of its own; a request that is no valid upgrade gets a 400 and why.
pub(crate) fn upgrade<B>(
    shared: &Arc<SimShared>,
    endpoint: Endpoint,
    mut req: Request<B>,
) -> Result<Response<SimBody>, String> {
    let settings = &shared.config.websocket;
    let mut options = Options::default();
    if settings.deflate {
        options = options.with_low_latency_compression();
    }
    if let Some(size) = settings.fragment {
        options = options.with_max_fragment_size(size);
    }
    let offered = subprotocols(&req);
    let protocol = match endpoint {
        Endpoint::Responses => Protocol::Responses,
        Endpoint::Realtime => {
            let beta = offered.iter().any(|p| p == REALTIME_BETA_SUBPROTOCOL)
                || req
                    .headers()
                    .get_all("openai-beta")
                    .iter()
                    .any(|v| v.to_str().is_ok_and(|v| v.contains("realtime=v1")));
            let model = query_value(req.uri().query(), "model")
                .unwrap_or_else(|| shared.config.model.clone());
            let number = shared.next_session.fetch_add(1, Ordering::Relaxed);
            Protocol::Realtime(RealtimeSession::new(
                number,
                beta,
                model,
                shared.audio_b64.clone(),
            ))
        }
    };
    let (response, upgraded) =
        WebSocket::upgrade_with_options(&mut req, options).map_err(|e| e.to_string())?;
    let (mut parts, _) = response.into_parts();
    if endpoint == Endpoint::Realtime && offered.iter().any(|p| p == REALTIME_SUBPROTOCOL) {
        parts.headers.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static(REALTIME_SUBPROTOCOL),
        );
    }
    let task_shared = shared.clone();
    shared.spawn_session(async move {
        match upgraded.await {
            Ok(ws) => session::serve(ws, task_shared, protocol).await,
            Err(e) => tracing::debug!(error = %e, "sim: the WebSocket upgrade failed"),
        }
    });
    Ok(Response::from_parts(parts, SimBody::Full(None)))
}

/// The subprotocols the client offers (`Sec-WebSocket-Protocol`, comma-separated).
fn subprotocols<B>(req: &Request<B>) -> Vec<String> {
    req.headers()
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_owned())
        .collect()
}

/// The value of `name` in a query string, percent-decoding nothing (model names need none).
fn query_value(query: Option<&str>, name: &str) -> Option<String> {
    query?
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.to_owned())
}

/// The answer to a plain `GET` on a WebSocket endpoint.
pub(crate) const NOT_AN_UPGRADE: (StatusCode, &str) = (
    StatusCode::UPGRADE_REQUIRED,
    "This endpoint speaks WebSocket: send `Upgrade: websocket` (or POST /v1/responses for SSE).",
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_upgrades_and_query_values() {
        assert_eq!(Endpoint::of("/v1/realtime"), Some(Endpoint::Realtime));
        assert_eq!(Endpoint::of("/v1/responses"), Some(Endpoint::Responses));
        assert_eq!(Endpoint::of("/v1/chat/completions"), None);
        let req = Request::get("/v1/realtime?model=gpt-realtime&x=1")
            .header("upgrade", "WebSocket")
            .header(
                "sec-websocket-protocol",
                "realtime, openai-beta.realtime-v1",
            )
            .body(())
            .unwrap();
        assert!(is_upgrade(&req));
        assert_eq!(
            query_value(req.uri().query(), "model").as_deref(),
            Some("gpt-realtime")
        );
        assert_eq!(subprotocols(&req), ["realtime", REALTIME_BETA_SUBPROTOCOL]);
        assert!(!is_upgrade(&Request::get("/").body(()).unwrap()));
    }
}
