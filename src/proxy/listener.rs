//! The proxy listener: accepts connections (plain or TLS), wraps each one's socket in the egress
//! clock, and serves HTTP/1.1 and HTTP/2 on it until shutdown, then drains. Under
//! `threading = "per_core"` every worker thread runs one of these loops ([`super::workers`]).
//!
//! Connections beyond `limits.max_connections` are answered 503 and closed at once; request heads
//! beyond `limits.max_header_bytes` are answered 431 by hyper.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::task::AtomicWaker;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulConnection;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::egress_clock::{EgressClock, EgressIo};
use super::forward::{handle, Connection};
use super::{ProxyState, UpstreamClient};
use crate::tls;

/// What an over-limit connection is told before it is closed.
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: 84\r\nconnection: close\r\n\r\n{\"error\":{\"type\":\"overloaded\",\"message\":\"metronome has too many open connections\"}}\n";

/// Accepts and serves connections until `shutdown` resolves, then waits up to the drain grace
/// for in-flight requests and streams to finish.
pub async fn serve(
    listener: TcpListener,
    state: Arc<ProxyState>,
    client: UpstreamClient,
    shutdown: impl Future<Output = ()> + Send,
) {
    let limits = &state.config.limits;
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        // hyper times both the idle wait for the next request and the reading of its head.
        .header_read_timeout(state.config.client_idle_timeout)
        .max_buf_size(limits.max_header_bytes.max(8192));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
        // One HTTP/2 connection may carry as many streams as metronome takes requests (hyper's
        // default is 200); `limits.max_requests` still bounds them all together.
        .max_concurrent_streams(u32::try_from(limits.max_requests).unwrap_or(u32::MAX));
    let acceptor = match &state.tls {
        Some(cert) => match tls::server_config(cert.clone()) {
            Ok(config) => Some(TlsAcceptor::from(config)),
            Err(e) => {
                tracing::error!(error = %e, "cannot build the TLS configuration; not serving");
                return;
            }
        },
        None => None,
    };
    let drain = Arc::new(Drain::default());
    tokio::pin!(shutdown);
    loop {
        let (mut stream, remote) = tokio::select! {
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
        let Ok(permit) = state.connections.clone().try_acquire_owned() else {
            let plain = acceptor.is_none();
            tokio::spawn(async move {
                if plain {
                    let _ =
                        tokio::time::timeout(Duration::from_secs(1), stream.write_all(BUSY)).await;
                }
                let _ = stream.shutdown().await;
            });
            continue;
        };
        let _ = stream.set_nodelay(true);
        let clock = Arc::new(EgressClock::new());
        let connection = Connection {
            remote,
            scheme: if acceptor.is_some() { "https" } else { "http" },
            clock: clock.clone(),
            client: client.clone(),
        };
        let io = EgressIo::new(stream, clock);
        let state = state.clone();
        let builder = builder.clone();
        let acceptor = acceptor.clone();
        let watcher = drain.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match acceptor {
                None => serve_connection(io, &builder, watcher, state, connection).await,
                Some(acceptor) => {
                    let handshake = tokio::time::timeout(
                        state.config.tls_handshake_timeout,
                        acceptor.accept(io),
                    );
                    match handshake.await {
                        Ok(Ok(tls)) => {
                            serve_connection(tls, &builder, watcher, state, connection).await
                        }
                        Ok(Err(e)) => tracing::debug!(error = %e, %remote, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%remote, "TLS handshake timed out"),
                    }
                }
            }
        });
    }
    drop(listener);
    let grace = state.config.drain_grace;
    tokio::select! {
        _ = drain.shutdown() => tracing::debug!("all connections drained"),
        _ = tokio::time::sleep(grace) => tracing::warn!(?grace, "drain grace over; closing the remaining connections"),
    }
}

/// Serves HTTP on one connection's IO (plain, or TLS over the clocked socket).
async fn serve_connection<I>(
    io: I,
    builder: &auto::Builder<TokioExecutor>,
    watcher: Arc<Drain>,
    state: Arc<ProxyState>,
    connection: Connection,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let remote = connection.remote;
    let service = service_fn(move |request| handle(request, state.clone(), connection.clone()));
    let conn = builder
        .serve_connection(TokioIo::new(io), service)
        .into_owned();
    if let Err(e) = Drain::watch(&watcher, conn).await {
        tracing::debug!(error = %e, %remote, "client connection ended with an error");
    }
}

/// Asks every open connection to finish gracefully, and waits for them. Each connection has its
/// own flag and waker, so polling a connection touches only its own state: hyper-util's
/// `GracefulShutdown` polls a channel shared by every connection on every poll, a lock taken
/// for every frame of every stream.
#[derive(Default)]
struct Drain {
    /// Set once shutdown began: a connection watched from then on stops at once.
    draining: AtomicBool,
    /// The connections open now, by number.
    open: Mutex<HashMap<u64, Weak<StopSignal>>>,
    next: AtomicU64,
    /// Told when the last connection closes during shutdown.
    all_closed: tokio::sync::Notify,
}

/// One connection's request to stop.
#[derive(Default)]
struct StopSignal {
    stop: AtomicBool,
    waker: AtomicWaker,
}

// === impl Drain ===

impl Drain {
    fn open(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Weak<StopSignal>>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Serves `conn` until it ends; on shutdown, it finishes its requests and closes.
    fn watch<C: GracefulConnection>(drain: &Arc<Drain>, conn: C) -> Watched<C> {
        let signal = Arc::new(StopSignal::default());
        let id = drain.next.fetch_add(1, Ordering::Relaxed);
        drain.open().insert(id, Arc::downgrade(&signal));
        if drain.draining.load(Ordering::Acquire) {
            signal.stop.store(true, Ordering::Release);
        }
        Watched {
            conn,
            signal,
            drain: drain.clone(),
            id,
            stopping: false,
        }
    }

    /// Tells every connection to stop and waits until all have closed.
    async fn shutdown(&self) {
        self.draining.store(true, Ordering::Release);
        let signals: Vec<_> = self.open().values().filter_map(Weak::upgrade).collect();
        for signal in signals {
            signal.stop.store(true, Ordering::Release);
            signal.waker.wake();
        }
        loop {
            let closed = self.all_closed.notified();
            tokio::pin!(closed);
            closed.as_mut().enable();
            if self.open().is_empty() {
                return;
            }
            closed.await;
        }
    }
}

pin_project_lite::pin_project! {
    /// A connection served until it ends, stopping gracefully when the drain asks.
    struct Watched<C> {
        #[pin]
        conn: C,
        signal: Arc<StopSignal>,
        drain: Arc<Drain>,
        id: u64,
        stopping: bool,
    }

    impl<C> PinnedDrop for Watched<C> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            let mut open = this.drain.open();
            open.remove(this.id);
            if open.is_empty() {
                this.drain.all_closed.notify_waiters();
            }
        }
    }
}

impl<C: GracefulConnection> Future for Watched<C> {
    type Output = C::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if !*this.stopping {
            // Waker first, then the flag: a stop set in between is seen now or wakes us.
            this.signal.waker.register(cx.waker());
            if this.signal.stop.load(Ordering::Acquire) {
                *this.stopping = true;
                this.conn.as_mut().graceful_shutdown();
            }
        }
        this.conn.poll(cx)
    }
}
