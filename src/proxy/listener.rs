//! The proxy listener: accepts connections (plain or TLS), wraps each one's socket in the egress
//! clock, and serves HTTP/1.1 and HTTP/2 on it until shutdown, then drains. Under
//! `threading = "per_core"` every worker thread runs one of these loops ([`super::workers`]).
//!
//! Connections beyond `limits.max_connections` are answered 503 and closed at once; request heads
//! beyond `limits.max_header_bytes` are answered 431 by the HTTP/1.1 server that reads them (the
//! native one, or hyper's under `server.http1_server = "hyper"`).

use crate::poison::LockExt;
use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::task::AtomicWaker;
use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulConnection;
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

use super::body::{ClientBody, ProxyBody};
use super::egress_clock::{EgressClock, EgressIo};
use super::forward::{handle, ClientConnection};
use super::head_deadline::{Answered, ClockedIo, HeadClock, HeadDeadline};
use super::joined_writes::JoinedWrites;
use super::tunnel::Tunnels;
use super::{ProxyState, UpstreamClient};
use crate::config::ServerKind;
use crate::http1::server as h1;
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
    let accepting = Accepting {
        builders: Arc::new(Builders::new(&state)),
        acceptor,
        drain: Arc::new(Drain::default()),
        tunnels: Arc::new(Tunnels::default()),
        state,
        client,
    };
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
        accepting.connection(stream, remote);
    }
    drop(listener);
    accepting.drain().await;
}

/// What the accept loop hands every connection it takes.
struct Accepting {
    builders: Arc<Builders>,
    acceptor: Option<TlsAcceptor>,
    drain: Arc<Drain>,
    tunnels: Arc<Tunnels>,
    state: Arc<ProxyState>,
    client: UpstreamClient,
}

impl Accepting {
    /// Takes one accepted connection: over `limits.max_connections` it is told so (plain) and
    /// closed; otherwise its protocol is found (sniff or TLS handshake, in a task of its own)
    /// and it is served.
    fn connection(&self, mut stream: TcpStream, remote: SocketAddr) {
        let Ok(permit) = self.state.connections.clone().try_acquire_owned() else {
            let plain = self.acceptor.is_none();
            tokio::spawn(async move {
                if plain {
                    let _ =
                        tokio::time::timeout(Duration::from_secs(1), stream.write_all(BUSY)).await;
                }
                let _ = stream.shutdown().await;
            });
            return;
        };
        // A token must not wait for Nagle.
        let _ = stream.set_nodelay(true);
        let clock = Arc::new(EgressClock::new());
        let permit = Arc::new(permit);
        let connection = ClientConnection {
            remote,
            scheme: if self.acceptor.is_some() {
                "https"
            } else {
                "http"
            },
            clock: clock.clone(),
            client: self.client.clone(),
            place: permit.clone(),
            tunnels: self.tunnels.clone(),
        };
        let (state, watcher, builders) = (
            self.state.clone(),
            self.drain.clone(),
            self.builders.clone(),
        );
        let Some(acceptor) = self.acceptor.clone() else {
            tokio::spawn(async move {
                let within = state
                    .config
                    .timeouts
                    .sniff
                    .min(state.config.timeouts.client_idle);
                let deadline = tokio::time::Instant::now() + within;
                let protocol = match sniff(&stream, deadline).await {
                    Ok(protocol) => protocol,
                    Err(SniffEnd::Closed) => return,
                    Err(SniffEnd::TimedOut) => {
                        state.metrics.sniff_timeouts.inc();
                        tracing::debug!(%remote, "no protocol told within the sniff deadline");
                        return;
                    }
                };
                let io = EgressIo::new(stream, clock);
                builders.spawn(Some(protocol), io, watcher, state, connection, permit);
            });
            return;
        };
        let io = EgressIo::new(stream, clock);
        tokio::spawn(async move {
            let handshake =
                tokio::time::timeout(state.config.timeouts.tls_handshake, acceptor.accept(io));
            match handshake.await {
                Ok(Ok(tls)) => {
                    let protocol = Protocol::from_alpn(tls.get_ref().1.alpn_protocol());
                    // hyper's vectored writes joined before rustls (see `joined_writes`).
                    let io = JoinedWrites::new(tls);
                    builders.spawn(protocol, io, watcher, state, connection, permit)
                }
                Ok(Err(e)) => tracing::debug!(error = %e, %remote, "TLS handshake failed"),
                Err(_) => tracing::debug!(%remote, "TLS handshake timed out"),
            }
        });
    }

    /// The listener is closed: waits up to the drain grace for the connections and tunnels to
    /// finish, then closes the tunnels still open with a close frame.
    async fn drain(self) {
        let grace = self.state.config.server.drain_grace;
        let drained = async {
            self.drain.shutdown().await;
            self.tunnels.closed().await;
        };
        tokio::select! {
            _ = drained => tracing::debug!("all connections drained"),
            _ = tokio::time::sleep(grace) => {
                let (streams, requests) = cut_by_drain(&self.state);
                tracing::warn!(
                    ?grace,
                    streams_cut = streams,
                    requests_cut = requests,
                    "drain grace over; closing the remaining connections cuts {streams} streams ({requests} requests in flight on every worker)"
                );
            }
        }
        // WebSocket tunnels get a `1001` close frame to both ends rather than a cut.
        self.tunnels.close_all(TUNNEL_CLOSE_WITHIN).await;
    }
}

/// How long the tunnels still open after the drain grace may take to send their close frames.
const TUNNEL_CLOSE_WITHIN: Duration = Duration::from_secs(2);

/// What the end of the drain cuts: metered streams still open (`metronome_streams_active`,
/// summed over routes) and requests in flight (`limits.max_requests` less the free places).
fn cut_by_drain(state: &ProxyState) -> (i64, usize) {
    use prometheus::core::Collector;
    let streams = (state.metrics.streams_active.collect().iter())
        .flat_map(|family| family.get_metric())
        .map(|m| m.get_gauge().get_value() as i64)
        .sum();
    let limit = state.config.limits.max_requests;
    let requests = limit.saturating_sub(state.requests_in_flight.available_permits());
    (streams, requests)
}

/// One request's handling, from its head to its response head (see `Builders::spawn`).
type RequestFuture =
    Pin<Box<dyn Future<Output = Result<hyper::Response<ProxyBody>, Infallible>> + Send>>;

/// hyper's connection builders, each configured once from the settings.
struct Builders {
    /// Which server HTTP/1.x connections get (`server.http1_server`).
    http1_server: ServerKind,
    /// metronome's own HTTP/1.x server's settings at start; each connection takes
    /// `timeouts.client_head` from the live configuration instead (a reload changes it).
    native: h1::Settings,
    /// HTTP/1 connections, plain or TLS, under `http1_server = "hyper"`.
    h1: http1::Builder,
    /// HTTP/2 connections, plain or TLS.
    h2: http2::Builder<TokioExecutor>,
    /// TLS connections whose client named no protocol in ALPN, so only its first bytes can tell.
    auto: auto::Builder<TokioExecutor>,
}

impl Builders {
    /// The builders, configured from `state`. hyper times both the idle wait for the next
    /// request and the reading of its head. One HTTP/2 connection may carry as many streams as
    /// metronome takes requests (hyper's default is 200); `limits.max_requests` still bounds
    /// them all together.
    fn new(state: &ProxyState) -> Self {
        let limits = &state.config.limits;
        let header_read_timeout = state.config.timeouts.client_idle;
        let max_buf_size = limits.max_header_bytes.max(8192);
        let max_header_list_size = u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX);
        let max_concurrent_streams = u32::try_from(limits.max_requests).unwrap_or(u32::MAX);
        // TLS connections whose client named no protocol in ALPN: hyper-util's auto builder.
        let mut auto = auto::Builder::new(TokioExecutor::new());
        auto.http1()
            .timer(TokioTimer::new())
            .header_read_timeout(header_read_timeout)
            .max_buf_size(max_buf_size);
        // RFC 8441: HTTP/2 clients open WebSockets with an extended CONNECT.
        auto.http2()
            .enable_connect_protocol()
            .timer(TokioTimer::new())
            .max_header_list_size(max_header_list_size)
            .max_concurrent_streams(max_concurrent_streams);
        // Every other connection: hyper's HTTP/1 or HTTP/2 connection directly, chosen by ALPN
        // or, on plain connections, by peeking at the client's first bytes (see `sniff`).
        let mut h1 = http1::Builder::new();
        h1.timer(TokioTimer::new())
            .header_read_timeout(header_read_timeout)
            .max_buf_size(max_buf_size);
        let mut h2 = http2::Builder::new(TokioExecutor::new());
        h2.enable_connect_protocol()
            .timer(TokioTimer::new())
            .max_header_list_size(max_header_list_size)
            .max_concurrent_streams(max_concurrent_streams);
        let native = h1::Settings {
            max_head_bytes: limits.max_header_bytes,
            idle_timeout: header_read_timeout,
            head_timeout: state.config.timeouts.client_head,
        };
        Builders {
            http1_server: state.config.server.http1_server,
            native,
            h1,
            h2,
            auto,
        }
    }

    /// Serves HTTP on one connection in a task of its own per protocol, so that a connection
    /// holds only its protocol's state (an HTTP/1 connection does not carry an HTTP/2 one's
    /// size, nor the handshake's or the sniff's). `None`: a TLS client that named no protocol
    /// in ALPN, served by the auto builder, which tells the two apart by the first bytes.
    fn spawn<I>(
        &self,
        protocol: Option<Protocol>,
        io: I,
        watcher: Arc<Drain>,
        state: Arc<ProxyState>,
        connection: ClientConnection,
        permit: Arc<tokio::sync::OwnedSemaphorePermit>,
    ) where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let remote = connection.remote;
        if protocol == Some(Protocol::Http1) && self.http1_server == ServerKind::Native {
            let settings = h1::Settings {
                head_timeout: client_head(&state),
                ..self.native
            };
            let service = move |request: http::Request<h1::request_body::Http1RequestBody>| {
                let request = request.map(|body| ClientBody::Native { body });
                Box::pin(handle(request, state.clone(), connection.clone())) as RequestFuture
            };
            let conn = h1::serve(io, settings, service);
            tokio::spawn(Drain::watch(&watcher, conn, remote, permit));
            return;
        }
        let http2 = match protocol {
            Some(Protocol::Http1) => {
                return self.spawn_hyper_http1(io, watcher, state, connection, permit);
            }
            Some(Protocol::Http2) => true,
            None => false,
        };
        let io = TokioIo::new(io);
        // The request's future is boxed, so it is freed once the response head is out: hyper
        // keeps a service future's slot (inline in the HTTP/2 stream's task, boxed beside the
        // HTTP/1 connection) for as long as the connection or stream lives, and `handle`'s
        // state is about 3.5 KiB that an open stream would otherwise hold resident.
        let service = service_fn(
            move |request: hyper::Request<hyper::body::Incoming>| -> RequestFuture {
                let request = request.map(|body| ClientBody::Hyper { body });
                Box::pin(handle(request, state.clone(), connection.clone()))
            },
        );
        if http2 {
            let conn = self.h2.serve_connection(io, service);
            tokio::spawn(Drain::watch(&watcher, Hyper { conn }, remote, permit));
        } else {
            let conn = self
                .auto
                .serve_connection_with_upgrades(io, service)
                .into_owned();
            tokio::spawn(Drain::watch(&watcher, Hyper { conn }, remote, permit));
        }
    }
}

impl Builders {
    /// Serves HTTP/1.x on hyper's server (`server.http1_server = "hyper"`), each request head
    /// bounded by `timeouts.client_head` from its first byte (`head_deadline`), the wait between
    /// requests by hyper's `header_read_timeout` (`timeouts.client_idle`).
    fn spawn_hyper_http1<I>(
        &self,
        io: I,
        watcher: Arc<Drain>,
        state: Arc<ProxyState>,
        connection: ClientConnection,
        permit: Arc<tokio::sync::OwnedSemaphorePermit>,
    ) where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let remote = connection.remote;
        let head_timeout = client_head(&state);
        let clock = HeadClock::new();
        let answers = clock.clone();
        // Boxed for the reason `spawn` gives.
        let service = service_fn(
            move |request: hyper::Request<hyper::body::Incoming>| -> AnsweredFuture {
                answers.answering();
                let request = request.map(|body| ClientBody::Hyper { body });
                let handling = handle(request, state.clone(), connection.clone());
                let answers = answers.clone();
                Box::pin(async move {
                    let response = handling.await?;
                    Ok(response.map(|body| Answered::new(body, answers)))
                })
            },
        );
        let io = TokioIo::new(ClockedIo::new(io, clock.clone()));
        // With upgrades: a WebSocket handshake's connection is handed to its tunnel.
        let conn = Upgradeable {
            conn: self.h1.serve_connection(io, service).with_upgrades(),
        };
        let conn = HeadDeadline::new(conn, clock, head_timeout);
        tokio::spawn(Drain::watch(&watcher, conn, remote, permit));
    }
}

/// `timeouts.client_head` as the live configuration has it: a reload changes it for the
/// connections accepted after it (one read of the live configuration per HTTP/1 connection).
fn client_head(state: &ProxyState) -> Duration {
    state.live_config().timeouts.client_head
}

/// One request's handling on hyper's HTTP/1 server, its body telling the head clock when the
/// answer is over.
type AnsweredFuture =
    Pin<Box<dyn Future<Output = Result<hyper::Response<Answered<ProxyBody>>, Infallible>> + Send>>;

/// A connection the drain can ask to finish: hyper's or metronome's own HTTP/1.x one.
trait Serving: Future<Output = Result<(), Self::Error>> {
    type Error: std::fmt::Display;
    /// Finish the requests in progress, then close.
    fn graceful_shutdown(self: Pin<&mut Self>);
}

pin_project_lite::pin_project! {
    /// One of hyper's connections.
    struct Hyper<C> { #[pin] conn: C }
}

impl<C: GracefulConnection> Future for Hyper<C> {
    type Output = Result<(), C::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().conn.poll(cx)
    }
}

impl<C: GracefulConnection> Serving for Hyper<C>
where
    C::Error: std::fmt::Display,
{
    type Error = C::Error;

    fn graceful_shutdown(self: Pin<&mut Self>) {
        self.project().conn.graceful_shutdown();
    }
}

pin_project_lite::pin_project! {
    /// hyper's HTTP/1 connection with upgrades, which hyper-util's graceful trait does not cover.
    struct Upgradeable<C> { #[pin] conn: C }
}

impl<I, S, B> Future for Upgradeable<http1::UpgradeableConnection<I, S>>
where
    S: hyper::service::HttpService<hyper::body::Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    B: hyper::body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Output = Result<(), hyper::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().conn.poll(cx)
    }
}

impl<I, S, B> Serving for Upgradeable<http1::UpgradeableConnection<I, S>>
where
    S: hyper::service::HttpService<hyper::body::Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    B: hyper::body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Error = hyper::Error;

    fn graceful_shutdown(self: Pin<&mut Self>) {
        self.project().conn.graceful_shutdown();
    }
}

impl<S: Serving> Serving for HeadDeadline<S> {
    type Error = S::Error;

    fn graceful_shutdown(self: Pin<&mut Self>) {
        self.conn().graceful_shutdown();
    }
}

impl<F: Future<Output = Result<(), h1::ConnectionError>>> Serving for h1::ServerConnection<F> {
    type Error = h1::ConnectionError;

    fn graceful_shutdown(self: Pin<&mut Self>) {
        h1::ServerConnection::graceful_shutdown(self);
    }
}

/// The protocol a connection's client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Http1,
    Http2,
}

// === impl Protocol ===

impl Protocol {
    /// The protocol a TLS client chose in ALPN; `None` when it named none (the listener offers
    /// only "h2" and "http/1.1", so rustls agrees to nothing else).
    fn from_alpn(alpn: Option<&[u8]>) -> Option<Protocol> {
        match alpn? {
            b"h2" => Some(Protocol::Http2),
            b"http/1.1" => Some(Protocol::Http1),
            _ => None,
        }
    }
}

/// What an HTTP/2 client with prior knowledge sends first (RFC 9113 section 3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Why [`sniff`] told no protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SniffEnd {
    /// The client closed (or reset) the connection before its first bytes decided.
    Closed,
    /// The deadline passed first (counted in `metronome_sniff_timeouts_total`).
    TimedOut,
}

/// Tells HTTP/2 from HTTP/1 by the client's first bytes, without consuming them; an error when
/// the client closes, or sends nothing decisive, before `deadline` (`timeouts.sniff`).
///
/// hyper-util's auto builder reads the first 24 bytes itself and hands them back to hyper through
/// a rewinding reader, so hyper's first read of an HTTP/1 request returns just those 24 bytes.
/// Its next read then finds its 8 KiB buffer in use and doubles it: 16 KiB held by every HTTP/1
/// connection for its life (measured with DHAT, `scripts/heap-per-stream.sh`). Peeking leaves the
/// bytes in the socket, so hyper's first read gets the whole head into 8 KiB.
///
/// "PRI" is not an HTTP/1 method (RFC 9113 section 3.4), so four bytes decide: a client that
/// starts with "PRI " speaks HTTP/2 (hyper checks the rest of the preface). Fewer bytes that could
/// still begin the preface wait for the socket to change: a peek that finds no byte more than the
/// last one clears the socket's readiness, so the task sleeps until more bytes or the peer's close
/// arrive. A peek never consumes, so a closed peer's bytes stay readable for ever: the close is
/// seen in the readiness itself (`read_closed`, from the kernel's EPOLLRDHUP), never by a read of
/// 0 while bytes remain. A 1 ms sleep-and-peek loop here would take two cores for
/// `timeouts.client_idle` once clients sent "P" and closed.
async fn sniff(stream: &TcpStream, deadline: tokio::time::Instant) -> Result<Protocol, SniffEnd> {
    let mut first = [0u8; 4];
    let mut seen = 0;
    loop {
        let ready = match tokio::time::timeout_at(deadline, stream.ready(Interest::READABLE)).await
        {
            Ok(Ok(ready)) => ready,
            Ok(Err(_)) => return Err(SniffEnd::Closed),
            Err(_) => return Err(SniffEnd::TimedOut),
        };
        // Inside `try_io`, a WouldBlock clears the readiness this peek saw, and only that: bytes
        // arriving after it set it again, so none is missed.
        let peeked = stream.try_io(Interest::READABLE, || match peek_now(stream, &mut first) {
            Ok(n) if n == seen && n > 0 => Err(io::ErrorKind::WouldBlock.into()),
            other => other,
        });
        match peeked {
            Ok(0) => return Err(SniffEnd::Closed),
            Ok(n) => {
                seen = n;
                if !H2_PREFACE.starts_with(&first[..n]) {
                    return Ok(Protocol::Http1);
                }
                if n == first.len() {
                    return Ok(Protocol::Http2);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return Err(SniffEnd::Closed),
        }
        // The peer closed and every byte it sent is in `first`: none can follow.
        if ready.is_read_closed() {
            return Err(SniffEnd::Closed);
        }
    }
}

/// One peek at the bytes waiting now, without waiting: `WouldBlock` when there are none. Called
/// only while the socket is known readable (inside `try_io`), where tokio's `poll_peek` returns
/// at once and never keeps the no-op waker.
fn peek_now(stream: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let mut read = tokio::io::ReadBuf::new(buf);
    match stream.poll_peek(&mut cx, &mut read) {
        Poll::Ready(result) => result,
        Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
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
        self.open.lock_or_recover()
    }

    /// Serves `conn` until it ends; on shutdown, it finishes its requests and closes. `permit`
    /// holds the connection's place under `limits.max_connections` until then.
    ///
    /// The returned future is the connection's whole task. An `async fn` around it would keep its
    /// arguments and the future it awaits in separate slots, so the task would hold the hyper
    /// connection's size twice for the connection's life (2,432 bytes where this takes 1,280).
    fn watch<C: Serving>(
        drain: &Arc<Drain>,
        conn: C,
        remote: std::net::SocketAddr,
        permit: Arc<tokio::sync::OwnedSemaphorePermit>,
    ) -> Watched<C> {
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
            remote,
            _permit: permit,
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
    /// A connection served until it ends, stopping gracefully when the drain asks; the task
    /// that serves the connection is this future alone. An error ending it is logged.
    struct Watched<C> {
        #[pin]
        conn: C,
        signal: Arc<StopSignal>,
        drain: Arc<Drain>,
        id: u64,
        stopping: bool,
        remote: std::net::SocketAddr,
        _permit: Arc<tokio::sync::OwnedSemaphorePermit>,
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

impl<C> Future for Watched<C>
where
    C: Serving,
{
    type Output = ();

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
        if let Err(e) = std::task::ready!(this.conn.poll(cx)) {
            tracing::debug!(error = %e, remote = %this.remote, "client connection ended with an error");
        }
        Poll::Ready(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A connected pair on loopback: the client's end and the accepted end.
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        (client, accepted)
    }

    fn in_five_seconds() -> tokio::time::Instant {
        tokio::time::Instant::now() + Duration::from_secs(5)
    }

    /// Sends `first`, then `rest` 30 ms later, and returns what `sniff` told.
    async fn sniffed(first: &[u8], rest: &[u8]) -> Result<Protocol, SniffEnd> {
        let (mut client, accepted) = pair().await;
        client.write_all(first).await.unwrap();
        let rest = rest.to_vec();
        let writer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            client.write_all(&rest).await.unwrap();
            client
        });
        let told = sniff(&accepted, in_five_seconds()).await;
        let _client = writer.await.unwrap();
        // Nothing was consumed: the bytes are all still there for hyper.
        let mut buf = [0u8; 64];
        let n = accepted.peek(&mut buf).await.unwrap();
        assert!(n >= first.len(), "peeked {n} bytes");
        assert_eq!(&buf[..first.len()], first);
        told
    }

    #[test]
    fn alpn_names_the_protocol_and_no_name_leaves_it_to_the_first_bytes() {
        assert_eq!(Protocol::from_alpn(Some(b"h2")), Some(Protocol::Http2));
        assert_eq!(
            Protocol::from_alpn(Some(b"http/1.1")),
            Some(Protocol::Http1)
        );
        assert_eq!(Protocol::from_alpn(None), None);
        assert_eq!(Protocol::from_alpn(Some(b"spdy/3")), None);
    }

    #[tokio::test]
    async fn the_first_bytes_tell_http2_from_http1_and_stay_in_the_socket() {
        assert_eq!(
            sniffed(b"POST /v1/chat/completions HTTP/1.1\r\n", b"").await,
            Ok(Protocol::Http1)
        );
        assert_eq!(sniffed(H2_PREFACE, b"").await, Ok(Protocol::Http2));
        // Bytes that could still begin the preface wait for more.
        assert_eq!(
            sniffed(b"P", b"UT /x HTTP/1.1\r\n").await,
            Ok(Protocol::Http1)
        );
        assert_eq!(sniffed(b"PR", &H2_PREFACE[2..]).await, Ok(Protocol::Http2));
    }

    /// `sniff` within 5 s, or a failure (not a hang) if it ignores its deadline.
    async fn bounded(
        sniffing: impl Future<Output = Result<Protocol, SniffEnd>>,
    ) -> Result<Protocol, SniffEnd> {
        tokio::time::timeout(Duration::from_secs(5), sniffing)
            .await
            .expect("sniff kept to its deadline")
    }

    #[tokio::test]
    async fn a_client_that_closes_or_stays_silent_is_not_served() {
        let (client, accepted) = pair().await;
        drop(client);
        assert_eq!(
            bounded(sniff(&accepted, in_five_seconds())).await,
            Err(SniffEnd::Closed)
        );

        let (_client, accepted) = pair().await;
        let deadline = tokio::time::Instant::now() + Duration::from_millis(100);
        assert_eq!(
            bounded(sniff(&accepted, deadline)).await,
            Err(SniffEnd::TimedOut)
        );

        // Half a preface, then silence: the deadline still holds.
        let (mut client, accepted) = pair().await;
        client.write_all(b"PR").await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_millis(100);
        assert_eq!(
            bounded(sniff(&accepted, deadline)).await,
            Err(SniffEnd::TimedOut)
        );
    }

    /// A peek never consumes, so a peer that sent a prefix of the preface and closed
    /// still has bytes to peek; its close must be seen at once, not at the deadline.
    #[tokio::test]
    async fn a_prefix_of_the_preface_then_a_close_ends_the_sniff_at_once() {
        for prefix in [&b"P"[..], b"PR", b"PRI"] {
            let (mut client, accepted) = pair().await;
            client.write_all(prefix).await.unwrap();
            client.shutdown().await.unwrap();
            drop(client);
            let began = std::time::Instant::now();
            let told = bounded(sniff(&accepted, in_five_seconds())).await;
            assert_eq!(told, Err(SniffEnd::Closed), "after {prefix:?}");
            assert!(
                began.elapsed() < Duration::from_secs(4),
                "{prefix:?} then a close took {:?}",
                began.elapsed()
            );
        }
    }

    /// A prefix, then silence: the task sleeps until the deadline rather than peeking in a loop
    /// (the old loop peeked once a millisecond, about 300 times in these 300 ms).
    #[tokio::test(flavor = "current_thread")]
    async fn a_prefix_then_silence_sleeps_until_the_deadline() {
        let (mut client, accepted) = pair().await;
        client.write_all(b"P").await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let polls = std::sync::Arc::new(AtomicU64::new(0));
        let counted = polls.clone();
        let deadline = tokio::time::Instant::now() + Duration::from_millis(300);
        let sniffing = sniff(&accepted, deadline);
        tokio::pin!(sniffing);
        let told = std::future::poll_fn(|cx| {
            counted.fetch_add(1, Ordering::Relaxed);
            sniffing.as_mut().poll(cx)
        })
        .await;
        assert_eq!(told, Err(SniffEnd::TimedOut));
        let polls = polls.load(Ordering::Relaxed);
        assert!(polls <= 5, "the sniff was polled {polls} times in 300 ms");
    }
}
