//! The admin listener, apart from the proxy's: `/metrics` for Prometheus, `/healthz` (the process
//! is alive; never depends on the upstream), `/readyz` (ready to proxy: not draining, and the
//! default upstream answered its last check), `/streams`, `/streams/{id}` (recent stream
//! timelines; docs/timelines.md) and `/episodes` (recent batch episodes; docs/batch.md).
//!
//! The upstream check runs in the background every `readiness.interval`, so a probe never waits
//! on the upstream and a burst of probes never becomes a burst of upstream connections; `/readyz`
//! answers from its last result. Only before the first result does it wait for one.
//!
//! The listener is bounded apart from the proxy's (`[admin]`), so its clients can never use up
//! what the proxy needs: at most `admin.max_connections` connections (more are answered 503 and
//! closed), each with a head deadline, an idle deadline and a head size bound ([`connection`]).
//! It speaks HTTP/1.1 only (hyper's server, which Prometheus and the kubelet use), and a head is
//! checked by the proxy's own request-form rules ([`AdminView::check_form`]) before it is
//! answered.

mod connection;
mod gzip;
pub mod query;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{Empty, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

use connection::{Watch, WatchedBody, WatchedIo};

use crate::batch::BatchDetector;
use crate::config::{Config, ReadinessConfig, Upstream};
use crate::metrics::exposition::Format;
use crate::metrics::Metrics;
use crate::timeline::StreamRegistry;

/// What the admin endpoints read of the running proxy, and nothing more: the proxy implements
/// it, so the admin listener depends on the metrics, the timelines and the batch detector but not
/// on the proxy's state.
pub trait AdminView: Send + Sync + 'static {
    /// The families `/metrics` encodes.
    fn metrics(&self) -> &Metrics;
    /// Recent streams (`/streams`, `/streams/{id}`).
    fn registry(&self) -> &StreamRegistry;
    /// Batch episodes and each stream's hitch marks (`/episodes`, `/streams/{id}`).
    fn batch(&self) -> &BatchDetector;
    /// Each finished stream's backpressure marks (`/streams/{id}`), when they are kept.
    fn backpressure(&self) -> Option<&crate::metering::backpressure::Backpressure> {
        None
    }
    /// Whether SIGTERM began the drain, so `/readyz` answers 503.
    fn draining(&self) -> bool;
    /// The configuration in force now, reloads included (the readiness check reads it).
    fn live_config(&self) -> Arc<Config>;
    /// The proxy's checks of a request's form (`Host`, the target, dot segments,
    /// `Transfer-Encoding`), applied to admin requests too; why a head is refused.
    fn check_form(
        &self,
        head: &http::request::Parts,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>>;
}

/// The proxy's view as the admin tasks hold it.
type View = Arc<dyn AdminView>;

/// The browser beacon module (assets/metronome-beacon.js), served for convenience.
const BEACON_MODULE: &str = include_str!("../assets/metronome-beacon.js");

/// The content type of the Prometheus text exposition format.
pub const METRICS_CONTENT_TYPE: &str = crate::metrics::TEXT_CONTENT_TYPE;

/// What a connection beyond `admin.max_connections` is told before it is closed.
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 38\r\nconnection: close\r\n\r\ntoo many admin connections; try again\n";

/// Serves the admin endpoints until `shutdown` resolves.
pub async fn serve(listener: TcpListener, state: View, shutdown: impl Future<Output = ()> + Send) {
    let bounds = state.live_config().admin.clone();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .max_header_size(bounds.max_header_bytes)
        .max_buf_size(bounds.max_header_bytes.max(8192))
        // The head deadline is `connection::serve`'s, which tells it from the idle wait.
        .header_read_timeout(None);
    let permits = Arc::new(Semaphore::new(bounds.max_connections));
    let (checked, upstream) = watch::channel(UpstreamCheck::Pending);
    let checker = tokio::spawn(check_upstream(state.clone(), checked));
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "admin accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            // Not waited for: a client that does not read gets the close alone.
            let _ = stream.try_write(BUSY);
            continue;
        };
        let watch = Watch::new();
        let (state, upstream, answers) = (state.clone(), upstream.clone(), watch.clone());
        let service = service_fn(move |request| {
            answers.answering();
            let (state, upstream, answers) = (state.clone(), upstream.clone(), answers.clone());
            async move {
                let response = answer(request, state, upstream).await?;
                Ok::<_, Infallible>(response.map(|body| WatchedBody::new(body, answers)))
            }
        });
        let io = TokioIo::new(WatchedIo::new(stream, watch.clone()));
        let conn = builder.serve_connection(io, service);
        tokio::spawn(connection::serve(conn, watch, bounds.clone(), permit));
    }
    checker.abort();
}

async fn answer(
    request: Request<Incoming>,
    state: View,
    upstream: watch::Receiver<UpstreamCheck>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (head, _body) = request.into_parts();
    if let Err(refused) = state.check_form(&head) {
        let mut response = text(StatusCode::BAD_REQUEST, format!("{refused}\n"));
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return Ok(response);
    }
    let request = Request::from_parts(head, ());
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return Ok(text(StatusCode::METHOD_NOT_ALLOWED, "use GET\n"));
    }
    Ok(match request.uri().path() {
        "/metrics" => {
            // The format the scraper's Accept header asks for; text 0.0.4 for anything else.
            let accept = request
                .headers()
                .get(header::ACCEPT)
                .and_then(|v| v.to_str().ok());
            let format = Format::from_accept(accept);
            let body = state.metrics().encode_as(format);
            let accept_encoding = request
                .headers()
                .get(header::ACCEPT_ENCODING)
                .and_then(|v| v.to_str().ok());
            let gzipped = gzip::accepts_gzip(accept_encoding)
                .then(|| gzip::compress(body.as_ref()))
                .flatten();
            let gzip = gzipped.is_some();
            let mut response = match gzipped {
                Some(gz) => text(StatusCode::OK, gz),
                None => text(StatusCode::OK, body),
            };
            let headers = response.headers_mut();
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(format.content_type()),
            );
            headers.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
            if gzip {
                headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            }
            response
        }
        "/streams" => streams(&*state, request.uri().query()),
        "/episodes" => json(StatusCode::OK, state.batch().episodes_json()),
        "/metronome-beacon.js" => {
            let mut response = text(StatusCode::OK, BEACON_MODULE);
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/javascript; charset=utf-8"),
            );
            response
        }
        path if path.starts_with("/streams/") => {
            let id = &path["/streams/".len()..];
            match state.registry().detail_json(id) {
                Some(body) => json(StatusCode::OK, with_hitches(&*state, id, body)),
                None => json(
                    StatusCode::NOT_FOUND,
                    serde_json::json!({"error": {"type": "not_found", "message": format!("no recent stream has the ID `{id}`")}}).to_string(),
                ),
            }
        }
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" => readiness(&*state, upstream).await,
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /metrics, /healthz, /readyz, /streams or /episodes\n",
        ),
    })
}

/// `/streams`, filtered by its query (`query::StreamQuery`); a bad parameter is a 400 naming it.
fn streams(state: &dyn AdminView, query: Option<&str>) -> Response<Full<Bytes>> {
    match query::StreamQuery::parse(query) {
        Ok(q) => json(
            StatusCode::OK,
            state
                .registry()
                .list_json_where(|s| q.matches(s), q.limit.unwrap_or(usize::MAX)),
        ),
        Err(e) => json(
            StatusCode::BAD_REQUEST,
            serde_json::json!({"error": {"type": "invalid_parameter", "parameter": e.parameter(), "message": e.to_string()}})
                .to_string(),
        ),
    }
}

/// A stream's detail with its hitches marked (scope and episode; docs/batch.md) and its
/// backpressure (docs/timelines.md), when it had any.
fn with_hitches(state: &dyn AdminView, id: &str, body: String) -> String {
    let marks = state.batch().hitches_of(id);
    let held = state.backpressure().and_then(|b| b.marks_of(id));
    if marks.is_empty() && held.is_none() {
        return body;
    }
    let Ok(mut detail) = serde_json::from_str::<serde_json::Value>(&body) else {
        return body;
    };
    let hitches: Vec<serde_json::Value> = marks
        .iter()
        .map(|m| {
            serde_json::json!({
                "event": m.event,
                "from_us": m.from_us,
                "to_us": m.to_us,
                "scope": m.scope.as_str(),
                "phase": m.phase.as_str(),
                "upstream": m.upstream.as_ref(),
                "episode": m.episode,
            })
        })
        .collect();
    if let Some(object) = detail.as_object_mut() {
        if !hitches.is_empty() {
            object.insert("hitches".to_owned(), serde_json::Value::from(hitches));
        }
        if let Some(held) = held {
            let marks: Vec<serde_json::Value> = held
                .marks
                .iter()
                .map(|m| serde_json::json!({"from_us": m.from_us, "to_us": m.to_us, "held_us": m.held_us}))
                .collect();
            object.insert("backpressure".to_owned(), serde_json::Value::from(marks));
            object.insert(
                "backpressure_dropped".to_owned(),
                serde_json::Value::from(held.dropped),
            );
        }
    }
    detail.to_string()
}

/// `/readyz`: 503 while draining or while the upstream fails its check, with the reason.
async fn readiness(
    state: &dyn AdminView,
    mut upstream: watch::Receiver<UpstreamCheck>,
) -> Response<Full<Bytes>> {
    if state.draining() {
        return text(StatusCode::SERVICE_UNAVAILABLE, "not ready: draining\n");
    }
    let readiness = state.live_config().readiness.clone();
    if !readiness.check_upstream {
        return text(StatusCode::OK, "ready\n");
    }
    // Only the first probe after start can find no result yet; it waits for the first check.
    let first = upstream.wait_for(|c| *c != UpstreamCheck::Pending);
    let _ = tokio::time::timeout(readiness.timeout + Duration::from_millis(500), first).await;
    let check = upstream.borrow().clone();
    match check {
        UpstreamCheck::Up => text(StatusCode::OK, "ready\n"),
        UpstreamCheck::Down(reason) => text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {reason}\n"),
        ),
        UpstreamCheck::Pending => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the upstream has not been checked yet\n",
        ),
    }
}

/// What the last check of the default upstream found.
#[derive(Debug, Clone, PartialEq, Eq)]
enum UpstreamCheck {
    /// No check has finished yet.
    Pending,
    /// The upstream answered.
    Up,
    /// It did not; why, as a sentence for `/readyz` and the log.
    Down(String),
}

/// Checks the default upstream every `readiness.interval`, reading the live configuration each
/// time so a reload's new upstream or check is used from the next round on.
async fn check_upstream(state: View, checked: watch::Sender<UpstreamCheck>) {
    loop {
        let config = state.live_config();
        let readiness = &config.readiness;
        if readiness.check_upstream {
            let now = match probe_upstream(&config.server.upstream, readiness).await {
                Ok(()) => UpstreamCheck::Up,
                Err(reason) => UpstreamCheck::Down(reason),
            };
            let before = checked.send_replace(now.clone());
            if before != now {
                match &now {
                    UpstreamCheck::Up => {
                        tracing::info!(upstream = %config.server.upstream, "upstream answers: ready")
                    }
                    UpstreamCheck::Down(reason) => tracing::warn!(
                        upstream = %config.server.upstream,
                        %reason,
                        "upstream check failed: /readyz answers 503"
                    ),
                    UpstreamCheck::Pending => {}
                }
            }
        }
        tokio::time::sleep(readiness.interval).await;
    }
}

/// One check: a TCP connection opens, and when a path is set, `GET path` answers 2xx; all within
/// the check timeout.
async fn probe_upstream(upstream: &Upstream, readiness: &ReadinessConfig) -> Result<(), String> {
    let host = upstream
        .authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    let port = upstream.authority.port_u16().unwrap_or(80);
    let attempt = async {
        let stream = TcpStream::connect((host, port))
            .await
            .map_err(|e| format!("cannot connect to upstream {upstream}: {e}"))?;
        let Some(path) = &readiness.path else {
            return Ok(());
        };
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("upstream {upstream}: {e}"))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let request = Request::get(path.as_str())
            .header(header::HOST, upstream.authority.as_str())
            .header(header::USER_AGENT, "metronome-readiness")
            .body(Empty::<Bytes>::new())
            .map_err(|e| format!("cannot build GET {path}: {e}"))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("GET {path} on upstream {upstream} failed: {e}"))?;
        if response.status().is_success() {
            Ok(())
        } else {
            Err(format!(
                "GET {path} on upstream {upstream} answered {}",
                response.status()
            ))
        }
    };
    tokio::time::timeout(readiness.timeout, attempt)
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "upstream {upstream} did not answer within {:?}",
                readiness.timeout
            ))
        })
}

fn json(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = text(status, body);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
