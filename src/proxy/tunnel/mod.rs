//! WebSocket tunnels (RFC 6455): an HTTP/1.1 `Upgrade: websocket` request is forwarded to the
//! route's upstream, the upstream's `101` relayed, and from then on the two connections are
//! joined byte for byte, while the frames of both directions are read as they pass to meter the
//! Responses API's WebSocket mode and the Realtime API.
//!
//! - [`handshake`] tells a WebSocket upgrade from other requests, refuses a malformed one, and
//!   builds the upstream request and the client's `101`;
//! - [`relay`] is the tunnel itself: one task copying both ways through small buffers, holding
//!   only the bytes the other end has not taken, closing one end as soon as the other goes;
//! - [`metering`] reads what passes ([`crate::websocket::FrameReader`]) and turns each response
//!   into a metered stream, as an SSE stream is;
//! - [`registry`] keeps the tunnels open on one listener (closed with `1001` after the drain
//!   grace) and their two metric families.
//!
//! The upstream is reached through hyper-util's client whatever `server.upstream_client` says:
//! metronome's own client does not do upgrades, on purpose (its connections go back to a pool).

pub mod handshake;
pub mod metering;
pub mod registry;
pub mod relay;

use std::sync::Arc;
use std::time::Instant;

use http::{header, HeaderValue, Request, Response, StatusCode};
use tokio::io::{AsyncRead, AsyncWrite};

use super::body::{ClientBody, ProxyBody, TimedBody};
use super::refusal::Refusal;
use super::router::Route;
use super::upstream::{UpstreamBody, UpstreamError};
use super::usage_body::UsageBody;
use super::ProxyState;
use crate::websocket::Extensions;
pub use handshake::{websocket_connect, websocket_upgrade, UpgradeRequest};
pub use registry::{Outcome, TunnelMetrics, Tunnels};

/// A client connection once its server has written the `101`: its socket (with whatever bytes
/// the client sent ahead already read back into it), boxed so one tunnel type serves every
/// server and transport.
pub type ClientIo = Box<dyn Io>;

/// A byte stream both ways: what a tunnel joins.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// How the client's server hands its connection over once the `101` is written.
pub type HandOver =
    std::pin::Pin<Box<dyn std::future::Future<Output = Option<ClientIo>> + Send + 'static>>;

/// Takes the means of getting the client's connection after the `101` out of `request`:
/// metronome's own server's `OnUpgrade`, or hyper's.
fn take_hand_over(request: &mut Request<ClientBody>) -> Option<HandOver> {
    let native = request
        .extensions_mut()
        .remove::<crate::http1::server::upgrade::OnUpgrade>();
    if let Some(native) = native {
        let upgraded = native.take()?;
        return Some(Box::pin(async move {
            Some(Box::new(upgraded.await?) as ClientIo)
        }));
    }
    request.extensions().get::<hyper::upgrade::OnUpgrade>()?;
    let upgrade = hyper::upgrade::on(&mut *request);
    Some(Box::pin(async move {
        let upgraded = upgrade.await.ok()?;
        Some(Box::new(hyper_util::rt::TokioIo::new(upgraded)) as ClientIo)
    }))
}

/// What a tunnel needs of the client connection it came on.
#[derive(Debug, Clone)]
pub struct Peer {
    /// The client's address (for `X-Forwarded-For`).
    pub remote: std::net::SocketAddr,
    /// `http` or `https` (for `X-Forwarded-Proto`).
    pub scheme: &'static str,
    /// The connection's place under `limits.max_connections`, held as long as the tunnel.
    pub place: Arc<tokio::sync::OwnedSemaphorePermit>,
    /// The tunnels of the listener, which its drain closes.
    pub tunnels: Arc<Tunnels>,
}

/// Forwards a WebSocket upgrade to the route's upstream and, when it switches, relays its `101`
/// and starts the tunnel; otherwise passes its answer through, or answers why not.
pub async fn open(
    mut request: Request<ClientBody>,
    upgrade: UpgradeRequest,
    state: &Arc<ProxyState>,
    client: &super::UpstreamClient,
    peer: Peer,
    route: &Route,
    received: Instant,
) -> Response<ProxyBody> {
    let metrics = &state.tunnel_metrics;
    let Ok(permit) = state.requests_in_flight.clone().try_acquire_owned() else {
        return Refusal::Overloaded.answer(state, route);
    };
    let Some(hand_over) = take_hand_over(&mut request) else {
        // A server that cannot hand its connection over (none should reach here).
        metrics.ended(&route.name, Outcome::Error);
        return state.answer_error(
            &route.name,
            StatusCode::BAD_REQUEST,
            "bad_upgrade",
            "this connection cannot be upgraded",
        );
    };
    let extended_connect = request.method() == http::Method::CONNECT;
    let path = request.uri().path().to_string();
    let query_model = metering::query_model(request.uri().query());
    let line = crate::logging::RequestLine::new(
        request.method(),
        request.uri(),
        upgrade.request_id.clone(),
    );
    let upstream_request = match handshake::upstream_request(request, &route.upstream, &peer) {
        Ok(r) => r,
        Err(refusal) => return refusal.answer(state, route),
    };
    let mut response = match send_upgrade(upstream_request, state, client, route).await {
        Ok(response) => response,
        Err(refused) => return refused,
    };
    state
        .metrics
        .requests
        .with_label_values(&[&route.name, crate::metrics::status_class(response.status())])
        .inc();
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        // The upstream did not switch: its answer goes to the client as any response does.
        metrics.ended(&route.name, Outcome::UpstreamRefused);
        return pass_through(response, state, route, received, line, permit);
    }
    let upstream_upgrade = hyper::upgrade::on(&mut response);
    let first_id: Arc<str> = Arc::from(state.stream_ids.next());
    let extensions = Extensions::from_response(
        response
            .headers()
            .get_all(header::SEC_WEBSOCKET_EXTENSIONS)
            .iter()
            .map(HeaderValue::as_bytes),
    )
    .unwrap_or(Extensions::Unsupported);
    let mut client_response = match extended_connect {
        true => handshake::connect_response(response.headers()),
        false => handshake::switching_response(response.headers()),
    };
    if let Some(name) = &state.config.metering.stream_id_header {
        if let Ok(value) = HeaderValue::from_str(&first_id) {
            client_response.headers_mut().insert(name.clone(), value);
        }
    }
    let setup = metering::Setup {
        state: state.clone(),
        route: route.name.clone(),
        api: metering::Api::of(route.format, &path),
        extensions,
        first_id,
        traceparent: upgrade.traceparent,
        request_id: upgrade.request_id,
        line,
        think: route.think.clone(),
        query_model,
    };
    drop(permit);
    tokio::spawn(relay_when_upgraded(
        upstream_upgrade,
        hand_over,
        setup,
        peer,
    ));
    client_response
}

/// Waits for both ends' upgraded connections, then relays between them; either one lost ends
/// the tunnel as an error before a byte is relayed.
async fn relay_when_upgraded(
    upstream_upgrade: hyper::upgrade::OnUpgrade,
    hand_over: HandOver,
    setup: metering::Setup,
    peer: Peer,
) {
    let upstream = match upstream_upgrade.await {
        Ok(upgraded) => hyper_util::rt::TokioIo::new(upgraded),
        Err(e) => {
            tracing::debug!(error = %e, "the upstream's upgraded connection was lost");
            setup
                .state
                .tunnel_metrics
                .ended(&setup.route, Outcome::Error);
            return;
        }
    };
    let Some(client) = hand_over.await else {
        tracing::debug!("the client's upgraded connection was lost");
        setup
            .state
            .tunnel_metrics
            .ended(&setup.route, Outcome::Error);
        return;
    };
    relay::run(client, upstream, setup, &peer).await;
}

/// Sends the upgrade request to the upstream and waits for its response head, at most
/// `timeouts.first_byte`; a failure or the timeout ends the tunnel as an error and is answered
/// as any upstream failure is.
async fn send_upgrade(
    upstream_request: Request<super::client_body::RequestBody>,
    state: &Arc<ProxyState>,
    client: &super::UpstreamClient,
    route: &Route,
) -> Result<Response<hyper::body::Incoming>, Response<ProxyBody>> {
    let metrics = &state.tunnel_metrics;
    let body_limit = state.config.limits.max_request_body_bytes;
    let sent = tokio::time::timeout(
        state.config.timeouts.first_byte,
        client.hyper().request(upstream_request),
    )
    .await;
    match sent {
        Ok(Ok(response)) => Ok(response),
        Ok(Err(error)) => {
            metrics.ended(&route.name, Outcome::Error);
            let error = UpstreamError::Hyper(error);
            Err(Refusal::from_upstream(error, &route.upstream, body_limit).answer(state, route))
        }
        Err(_elapsed) => {
            metrics.ended(&route.name, Outcome::Error);
            let timeout = state.config.timeouts.first_byte;
            let upstream = route.upstream.clone();
            Err(Refusal::NoHead { upstream, timeout }.answer(state, route))
        }
    }
}

/// The upstream's answer when it did not switch protocols, passed to the client as any
/// response is (hop-by-hop headers removed, timed, its place under `limits.max_requests` held
/// by `permit` until its body ends).
fn pass_through(
    response: Response<hyper::body::Incoming>,
    state: &Arc<ProxyState>,
    route: &Route,
    received: Instant,
    line: crate::logging::RequestLine,
    permit: tokio::sync::OwnedSemaphorePermit,
) -> Response<ProxyBody> {
    let (mut parts, body) = response.into_parts();
    super::headers::remove_hop_by_hop_from_response(&mut parts.headers);
    let body = TimedBody::new(
        UsageBody::untouched(UpstreamBody::Hyper { body }),
        state.metrics.clone(),
        route.name.clone(),
        received,
        parts.status,
        line,
        permit,
    );
    let body = ProxyBody::Passthrough {
        body: Box::pin(body),
    };
    Response::from_parts(parts, body)
}
