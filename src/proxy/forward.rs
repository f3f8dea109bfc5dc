//! Forwarding one request: route it, rewrite it for the upstream, send it through the pooled
//! client with the request body streamed, and turn the upstream's answer into the client's
//! response: metered when it is a stream, passed through otherwise (a JSON answer's usage read
//! at its end), or a JSON error when the upstream cannot be reached.

use std::convert::Infallible;
use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use http::{header, HeaderValue, Method, Request, Response};

use super::body::{ClientBody, ProxyBody, TimedBody};
use super::egress_clock::EgressClock;
use super::headers::{
    collapse_content_length, content_type_essence, remove_hop_by_hop_from_response,
};
use super::metered::{meter, MeterSettings};
use super::opening::Opening;
use super::refusal::Refusal;
use super::rewrite::upstream_request;
use super::router::Route;
use super::upstream::UpstreamError;
use super::usage_body::{UsageBody, UsageTarget};
use super::{ProxyState, UpstreamClient};
use crate::format::{Accounting, Format, ThinkState};
use crate::http1::head::content_length;
use crate::metering::clock::Tick;
use crate::metering::ledger::{StreamInfo, StreamLedger};
use crate::metrics::status_class;
use crate::scan::Framing;

/// What a request handler knows about the client connection it came on.
#[derive(Debug, Clone)]
pub struct ClientConnection {
    /// The client's address (for `X-Forwarded-For`).
    pub remote: SocketAddr,
    /// `http` or `https` (for `X-Forwarded-Proto`).
    pub scheme: &'static str,
    /// Stamps frames when their bytes reach this connection's socket.
    pub clock: Arc<EgressClock>,
    /// The upstream client of the thread serving this connection.
    pub client: UpstreamClient,
    /// The connection's place under `limits.max_connections`: a WebSocket tunnel holds it on
    /// after the connection's server is done.
    pub place: Arc<tokio::sync::OwnedSemaphorePermit>,
    /// The tunnels open on this listener, which the drain closes.
    pub tunnels: Arc<super::tunnel::Tunnels>,
}

/// Handles one request from a client connection: the beacon route, or the request forwarded,
/// or the reason it was not, answered as a JSON error.
pub async fn handle(
    request: Request<ClientBody>,
    state: Arc<ProxyState>,
    connection: ClientConnection,
) -> Result<Response<ProxyBody>, Infallible> {
    let received = Instant::now();
    let beacon_path = &state.config.timeline.beacon_path;
    if !beacon_path.is_empty() && request.uri().path() == beacon_path {
        // A beacon is a request like any other: it takes a place under `limits.max_requests`
        // (a flood of them otherwise took a core outside every limit).
        let Ok(_permit) = state.requests_in_flight.clone().try_acquire_owned() else {
            return Ok(super::beacon::overloaded(&state));
        };
        return Ok(super::beacon::answer(request, &state).await);
    }
    let route = state
        .router()
        .route(request.method(), request.uri().path())
        .clone();
    // HTTP/2's WebSocket (RFC 8441) is a CONNECT with a path: its form is checked as a GET's.
    let connect = super::tunnel::websocket_connect(&request);
    let (method, uri, version) = (request.method(), request.uri(), request.version());
    let method = if connect.is_some() {
        &Method::GET
    } else {
        method
    };
    // The native server refused these from the head already; hyper's leaves them to us.
    if let Err(form) = crate::http1::request_form::check(method, uri, version, request.headers()) {
        let mut response = Refusal::Form(form).answer(&state, &route);
        if version < http::Version::HTTP_2 {
            let close = HeaderValue::from_static("close");
            response.headers_mut().insert(header::CONNECTION, close);
        }
        return Ok(response);
    }
    if uri.path() == "*" {
        // `OPTIONS *` (the only asterisk form the check lets by) asks about metronome itself,
        // not about a resource of the upstream: forwarded, it became `OPTIONS /base*`.
        return Ok(server_options());
    }
    if let Some(upgrade) = connect.or_else(|| super::tunnel::websocket_upgrade(&request)) {
        return Ok(
            tunnel_or_refusal(request, upgrade, &state, &connection, &route, received).await,
        );
    }
    Ok(
        match forward(request, &state, &connection, &route, received).await {
            Ok(response) => response,
            Err(refusal) => refusal.answer(&state, &route),
        },
    )
}

/// A WebSocket upgrade (or HTTP/2 extended CONNECT) tunnelled, or the JSON 400 that says why not.
async fn tunnel_or_refusal(
    request: Request<ClientBody>,
    upgrade: Result<super::tunnel::UpgradeRequest, super::tunnel::handshake::BadUpgrade>,
    state: &Arc<ProxyState>,
    connection: &ClientConnection,
    route: &Route,
    received: Instant,
) -> Response<ProxyBody> {
    let version = request.version();
    let bad = match upgrade {
        Ok(upgrade) => {
            let peer = super::tunnel::Peer {
                remote: connection.remote,
                scheme: connection.scheme,
                place: connection.place.clone(),
                tunnels: connection.tunnels.clone(),
            };
            let client = &connection.client;
            return super::tunnel::open(request, upgrade, state, client, peer, route, received)
                .await;
        }
        Err(bad) => bad,
    };
    state
        .tunnel_metrics
        .ended(&route.name, super::tunnel::Outcome::Error);
    let mut response = state.answer_error(
        &route.name,
        http::StatusCode::BAD_REQUEST,
        "bad_upgrade",
        &bad.to_string(),
    );
    if version < http::Version::HTTP_2 {
        let close = HeaderValue::from_static("close");
        response.headers_mut().insert(header::CONNECTION, close);
    }
    response
}

/// The answer to `OPTIONS *`: 200 with no content (RFC 9110 §9.3.7), from metronome.
fn server_options() -> Response<ProxyBody> {
    let mut response = Response::new(ProxyBody::local(""));
    response
        .headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
    response
}

/// Sends the request upstream along `route` and turns the response head into the client's.
async fn forward(
    request: Request<ClientBody>,
    state: &Arc<ProxyState>,
    connection: &ClientConnection,
    route: &Route,
    received: Instant,
) -> Result<Response<ProxyBody>, Refusal> {
    let permit = state
        .requests_in_flight
        .clone()
        .try_acquire_owned()
        .map_err(|_| Refusal::Overloaded)?;
    let asked = Asked::of(&request);
    let config = &state.config;
    let body_limit = config.limits.max_request_body_bytes;
    if asked.declared_body.is_some_and(|n| n > body_limit) {
        return Err(Refusal::BodyTooLarge(body_limit));
    }
    let mut upstream_request = upstream_request(
        request,
        &route.upstream,
        (connection.remote, connection.scheme),
        body_limit,
    )?;
    // `[otlp] traces`: the stream's span continues the client's trace; the upstream's nests in it.
    let span = state.spans.as_ref().map(|_| {
        let span = crate::trace_context::SpanContext::continue_from(asked.traceparent.as_deref());
        span.inject(upstream_request.headers_mut());
        span
    });
    let timeouts = &config.timeouts;
    // One timer per request: it bounds the wait for the head, then becomes the stream's idle
    // timer (`metered::meter`), armed while the upstream works on the first token.
    let start = tokio::time::Instant::now();
    let mut timer = Box::pin(tokio::time::sleep_until(
        start + timeouts.first_byte.min(timeouts.idle),
    ));
    let sent = connection.client.request(upstream_request);
    // While the upstream works on the request, the stream's opening is made (if it is one).
    let open = || {
        config
            .metering
            .enabled
            .then(|| Opening::new(&state.stream_ids, &state.registry, &route.name))
    };
    let (sent, opening) = within(sent, &mut timer, start + timeouts.first_byte, open).await;
    let Some(sent) = sent else {
        return Err(Refusal::NoHead {
            upstream: route.upstream.clone(),
            timeout: timeouts.first_byte,
        });
    };
    let (mut parts, body) = sent
        .map_err(|error| Refusal::from_upstream(error, &route.upstream, body_limit))?
        .into_parts();
    if parts.status.is_informational() {
        // hyper's client hands an unsolicited `101` on as the response; forwarded, it would turn
        // the client's connection into whatever the upstream switched to.
        let error = UpstreamError::unexpected_interim(parts.status);
        return Err(Refusal::from_upstream(error, &route.upstream, body_limit));
    }
    remove_hop_by_hop_from_response(&mut parts.headers);
    collapse_content_length(&mut parts.headers);
    state
        .metrics
        .requests
        .with_label_values(&[&route.name, status_class(parts.status)])
        .inc();

    let Some(framing) = stream_framing(config, &parts.headers) else {
        let usage =
            UsageTarget::for_answer(&config.metering, &state.metrics, route, &asked.line, &parts);
        let body = TimedBody::new(
            UsageBody::new(body, usage),
            state.metrics.clone(),
            route.name.clone(),
            received,
            parts.status,
            asked.line,
            permit,
        );
        let body = ProxyBody::Passthrough {
            body: Box::pin(body),
        };
        return Ok(Response::from_parts(parts, body));
    };
    let stream = Stream {
        opening: opening.flatten(),
        asked,
        route,
        received,
        span,
        permit,
        framing,
        clock: connection.clock.clone(),
        timer,
    };
    Ok(stream.metered(state, parts, body))
}

/// What the request asked for that the stream keeps: read before the request moves on.
struct Asked {
    started_unix_ms: u64,
    traceparent: Option<String>,
    request_id: Option<String>,
    line: crate::logging::RequestLine,
    slo: Option<crate::slo::StreamSlo>,
    /// With the response's framing it hints at the API.
    path_format: Option<Format>,
    /// HTTP/1.x writes one response at a time, as the connection polls its body; on HTTP/2
    /// flow control can hold a stream back while the socket takes other streams' bytes.
    client_http1: bool,
    declared_body: Option<u64>,
}

impl Asked {
    fn of(request: &Request<ClientBody>) -> Self {
        let headers = request.headers();
        // Two `traceparent` fields name no one parent: the W3C processing model starts a new
        // trace.
        let traceparent = Some(headers.get_all("traceparent").iter().count())
            .filter(|n| *n == 1)
            .and_then(|_| bounded_header(headers, "traceparent"));
        let request_id = bounded_header(headers, "x-request-id");
        let line =
            crate::logging::RequestLine::new(request.method(), request.uri(), request_id.clone());
        Asked {
            started_unix_ms: unix_ms(),
            traceparent,
            request_id,
            line,
            slo: crate::slo::StreamSlo::from_headers(headers),
            path_format: Format::from_path(request.uri().path()),
            client_http1: request.version() < http::Version::HTTP_2,
            declared_body: declared_length(headers),
        }
    }
}

/// `request`'s output, or `None` once `until` has passed: on `timer`, whose deadline may be
/// earlier (it is then moved on, which costs no re-registration) and which is first polled
/// after the request's first poll, once the request has been written upstream. `meanwhile`
/// runs once, then too (while the upstream works), and its output is returned beside.
async fn within<F: Future, M>(
    request: F,
    timer: &mut Pin<Box<tokio::time::Sleep>>,
    until: tokio::time::Instant,
    meanwhile: impl FnOnce() -> M,
) -> (Option<F::Output>, Option<M>) {
    let mut request = std::pin::pin!(request);
    let (mut meanwhile, mut made) = (Some(meanwhile), None);
    let output = poll_fn(|cx| {
        if let Poll::Ready(output) = request.as_mut().poll(cx) {
            return Poll::Ready(Some(output));
        }
        if let Some(make) = meanwhile.take() {
            made = Some(make());
        }
        loop {
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if timer.deadline() >= until {
                return Poll::Ready(None);
            }
            timer.as_mut().reset(until);
        }
    })
    .await;
    (output, made)
}

/// A response that is a stream, with what metering it needs from its request.
struct Stream<'a> {
    /// Made while the upstream worked, unless it answered at the request's first poll.
    opening: Option<Opening>,
    asked: Asked,
    route: &'a Route,
    received: Instant,
    span: Option<crate::trace_context::SpanContext>,
    permit: tokio::sync::OwnedSemaphorePermit,
    framing: Framing,
    clock: Arc<EgressClock>,
    /// The request's timer, which becomes the stream's idle timer.
    timer: Pin<Box<tokio::time::Sleep>>,
}

impl Stream<'_> {
    /// The client's response: the head with the stream's ID and beacon key, the body metered.
    fn metered<B>(
        self,
        state: &Arc<ProxyState>,
        mut parts: http::response::Parts,
        body: B,
    ) -> Response<ProxyBody>
    where
        B: http_body::Body<Data = bytes::Bytes> + Send + Unpin + 'static,
        B::Error: Into<super::BoxError>,
    {
        let config = &state.config;
        let Stream { asked, route, .. } = self;
        let opening = self
            .opening
            .unwrap_or_else(|| Opening::new(&state.stream_ids, &state.registry, &route.name));
        let opened = opening.keep();
        if let (Some(name), Some(value)) = (&config.metering.stream_id_header, opened.id_value) {
            parts.headers.insert(name.clone(), value);
        }
        let content_type = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(bounded)
            .unwrap_or_default();
        let info = StreamInfo {
            id: opened.id,
            route: route.name.clone(),
            received: Tick::from_instant(self.received),
            started_unix_ms: asked.started_unix_ms,
            content_type,
            traceparent: asked.traceparent,
            request_id: asked.request_id,
            line: asked.line,
            status: parts.status.as_u16(),
            slo: asked.slo,
            span: self.span,
        };
        let trace_id = info
            .traceparent
            .as_deref()
            .and_then(crate::metrics::trace_id);
        let probe = state.batch.open(
            &route.upstream,
            info.id.clone(),
            trace_id,
            route.name.clone(),
            info.received,
            asked.declared_body,
        );
        let ledger = StreamLedger::open(
            state.metrics.clone(),
            state.registry.clone(),
            info,
            self.permit,
        );
        if let Some(value) = opened.key_value {
            parts.headers.insert(super::beacon::KEY_HEADER, value);
        }
        let settings = MeterSettings {
            framing: self.framing,
            max_event_bytes: config.metering.max_event_bytes,
            buffer_bytes: config.metering.buffer_bytes,
            buffer_frames: config.metering.buffer_frames,
            idle_timeout: config.timeouts.idle,
            client_http1: asked.client_http1,
            live: config.flush_interval.map(|_| state.live_streams.clone()),
            backpressure: Some(state.backpressure.clone()),
        };
        let accounting = Accounting::select(route.format, self.framing, asked.path_format);
        let think = ThinkState::new(&route.think);
        let body = meter(
            body, &settings, accounting, think, ledger, self.clock, self.timer,
        );
        if let Some(probe) = probe {
            body.attach_probe(probe);
        }
        Response::from_parts(parts, ProxyBody::Metered { body })
    }
}

/// The request's `Content-Length`, when it declares one that parses (read as the HTTP/1.1
/// server reads it, which has refused one that does not).
fn declared_length(headers: &http::HeaderMap) -> Option<u64> {
    content_length(headers).ok().flatten()
}

/// How a response splits into events, when metering is on and its content type is a stream's;
/// `None` passes it through unmetered.
fn stream_framing(config: &crate::config::Config, headers: &http::HeaderMap) -> Option<Framing> {
    let essence = content_type_essence(headers)
        .filter(|_| config.metering.enabled)
        .filter(|essence| config.metering.content_types.iter().any(|c| c == essence))?;
    let encoded = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| !v.trim().eq_ignore_ascii_case("identity"));
    Some(if encoded {
        // A compressed stream is forwarded untouched and timed, but has no readable events: it
        // is counted as an opaque stream (outcome `no_token`).
        Framing::Opaque
    } else if essence.contains("ndjson") || essence.contains("jsonl") {
        Framing::Ndjson
    } else {
        Framing::Sse
    })
}

/// The longest request header value kept with a stream (`traceparent`, `x-request-id`).
const MAX_LOGGED_HEADER: usize = 256;

/// A header's value, cut to a bound, when it is text.
fn bounded_header(headers: &http::HeaderMap, name: &str) -> Option<String> {
    headers.get(name)?.to_str().ok().map(bounded)
}

/// `value` cut to [`MAX_LOGGED_HEADER`] bytes, at a character's start (`HeaderValue::to_str`
/// holds visible ASCII only, so there a byte is a character).
fn bounded(value: &str) -> String {
    let mut end = value.len().min(MAX_LOGGED_HEADER);
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    value[..end].to_string()
}

/// Wall-clock milliseconds since the Unix epoch (for people reading `/streams`).
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
