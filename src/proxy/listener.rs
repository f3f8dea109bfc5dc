//! The proxy listener: accepts connections, wraps each one's IO in the egress clock, and serves
//! HTTP/1.1 and HTTP/2 on it until shutdown, then drains.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

use super::egress_clock::{EgressClock, EgressIo};
use super::forward::{handle, Connection};
use super::ProxyState;

/// Accepts and serves connections until `shutdown` resolves, then waits up to the drain grace
/// for in-flight requests and streams to finish.
pub async fn serve(
    listener: TcpListener,
    state: Arc<ProxyState>,
    shutdown: impl Future<Output = ()> + Send,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(30));
    builder.http2().timer(TokioTimer::new());
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: back off rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let clock = Arc::new(EgressClock::new());
        let connection = Connection {
            remote,
            scheme: "http",
            clock: clock.clone(),
        };
        let io = TokioIo::new(EgressIo::new(stream, clock));
        let state = state.clone();
        let service = service_fn(move |request| handle(request, state.clone(), connection.clone()));
        let conn = builder.serve_connection(io, service).into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, %remote, "client connection ended with an error");
            }
        });
    }
    drop(listener);
    let grace = state.config.drain_grace;
    tokio::select! {
        _ = graceful.shutdown() => tracing::debug!("all connections drained"),
        _ = tokio::time::sleep(grace) => tracing::warn!(?grace, "drain grace over; closing the remaining connections"),
    }
}
