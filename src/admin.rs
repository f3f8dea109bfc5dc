//! The admin listener, apart from the proxy's: `/metrics` for Prometheus, `/healthz` (the process
//! is alive; never depends on the upstream), `/readyz` (ready to proxy: not draining), and
//! `/streams`, `/streams/{id}` (recent stream timelines; docs/timelines.md).

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

use crate::proxy::ProxyState;

/// The content type of the Prometheus text exposition format.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Serves the admin endpoints until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    state: Arc<ProxyState>,
    shutdown: impl Future<Output = ()> + Send,
) {
    let builder = auto::Builder::new(TokioExecutor::new());
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
        let state = state.clone();
        let service = service_fn(move |request| answer(request, state.clone()));
        let conn = builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
}

async fn answer(
    request: Request<Incoming>,
    state: Arc<ProxyState>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return Ok(text(StatusCode::METHOD_NOT_ALLOWED, "use GET\n"));
    }
    Ok(match request.uri().path() {
        "/metrics" => {
            let mut response = text(StatusCode::OK, state.metrics.encode());
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(METRICS_CONTENT_TYPE),
            );
            response
        }
        "/streams" => json(StatusCode::OK, state.registry.list_json()),
        path if path.starts_with("/streams/") => {
            let id = &path["/streams/".len()..];
            match state.registry.detail_json(id) {
                Some(body) => json(StatusCode::OK, body),
                None => json(
                    StatusCode::NOT_FOUND,
                    serde_json::json!({"error": {"type": "not_found", "message": format!("no recent stream has the ID `{id}`")}}).to_string(),
                ),
            }
        }
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" => {
            if state.draining.load(Ordering::SeqCst) {
                text(StatusCode::SERVICE_UNAVAILABLE, "draining\n")
            } else {
                text(StatusCode::OK, "ready\n")
            }
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /metrics, /healthz, /readyz or /streams\n",
        ),
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
