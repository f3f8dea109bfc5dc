//! metronome's own HTTP/1.1 server for client connections (`server.http1_server = "native"`,
//! the default): it reads each request head off the connection, hands the request to a service
//! (the proxy's forwarder), and writes the response as its body yields frames, one vectored write per batch of
//! ready frames, in the connection's own task.
//!
//! hyper's server does the same with a dispatcher, a queue of boxed buffers, a formatted chunk
//! size, and two 8 KiB buffers held for the connection's life. What a streamed frame costs
//! between the upstream read and the client write is what a sidecar adds to every token, so the
//! path is kept short here: the frame's `Bytes` go to the socket as the upstream read gave them,
//! between a chunk-size line on the writer's own array and a CRLF (`writer`). A connection holds
//! no read buffer while it streams: the client's socket is watched for its close (which cancels
//! the upstream request) with a read into the stack, and a buffer is taken only for bytes the
//! client sends ahead (a pipelined request).
//!
//! What it serves: HTTP/1.0 and HTTP/1.1 with keep-alive and pipelining (requests answered in
//! order), request bodies of a declared length or chunked (streamed, `100 Continue` sent when
//! the body is first asked for), responses framed by length, chunked, or until close (HTTP/1.0),
//! `HEAD`, the idle timeout (`timeouts.client_idle`) and the head's own (`timeouts.client_head`,
//! from its first byte). A head it cannot serve
//! is answered with a JSON error and the connection closed: 400 for a malformed one or an
//! ambiguous body length, 431 past `limits.max_header_bytes`. Upgrades ([`upgrade`]): a request
//! that asks for one may be answered `101`, and the connection, with the bytes read past the
//! request, is handed over. HTTP/2 connections stay on hyper, and `server.http1_server = "hyper"`
//! puts HTTP/1.x back on it too.

pub mod head;
pub mod request_body;
pub mod upgrade;
mod writer;

use std::convert::Infallible;
use std::future::{poll_fn, Future};
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::{Request, Response};
use http_body::Body;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};

use super::BoxError;
use head::{Framing, HeadError};
use request_body::{Fed, Feeder, Http1RequestBody};
use writer::Writer;

/// The settings one connection is served with.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// The longest request head (`limits.max_header_bytes`).
    pub max_head_bytes: usize,
    /// How long the connection may wait for a request head's first byte, from its start or the
    /// end of the last response (`timeouts.client_idle`).
    pub idle_timeout: Duration,
    /// How long a request head may take from its first byte to its last
    /// (`timeouts.client_head`).
    pub head_timeout: Duration,
}

/// A read's size while a head or body is read: a chat request's head and JSON fit in one.
const READ_SIZE: usize = 4096;
/// Frames taken from the body before they are written: those the body has ready at once (as
/// hyper's queue, which holds 16).
const MAX_BATCH_FRAMES: usize = 16;
/// Body bytes gathered before they are written.
const MAX_BATCH_BYTES: usize = 64 * 1024;
/// While frames stream, the client's socket is looked at (for its close) once in this many polls
/// that wrote frames, and in every poll that did not. Looking costs a readiness check and a waker
/// registration on the client's socket, about 150 instructions per frame (callgrind).
const PROBE_EVERY: u8 = 8;
/// Bytes read ahead of the current request (a pipelined client) before the connection stops
/// reading until the response is out.
const MAX_READ_AHEAD: usize = 64 * 1024;

/// Why a connection ended other than cleanly.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error("client connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("the client closed the connection before the response's end")]
    ClientGone,
    #[error("{0}")]
    Head(HeadError),
    #[error("the response body failed: {0}")]
    Body(BoxError),
    #[error("{0}")]
    Framing(#[from] writer::FramingError),
}

pin_project_lite::pin_project! {
    /// One client connection served until it closes; [`ServerConnection::graceful_shutdown`] lets the
    /// request in progress finish, then closes.
    pub struct ServerConnection<F> {
        #[pin]
        serving: F,
        stop: Arc<AtomicBool>,
    }
}

// === impl ServerConnection ===

impl<F: Future<Output = Result<(), ConnectionError>>> ServerConnection<F> {
    /// Asks the connection to close once its current response is out (at once when idle).
    pub fn graceful_shutdown(self: Pin<&mut Self>) {
        self.stop.store(true, Ordering::Release);
    }
}

impl<F: Future<Output = Result<(), ConnectionError>>> Future for ServerConnection<F> {
    type Output = Result<(), ConnectionError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().serving.poll(cx)
    }
}

/// Serves HTTP/1.x on `io`, each request through `service`, until the client closes, the idle
/// timeout passes, or a graceful shutdown finds the connection between requests. The service
/// gets the request with its body streamed off the connection ([`Http1RequestBody`]) and answers
/// with any body of `Bytes`, written as it yields frames.
pub fn serve<I, S, R, B>(
    io: I,
    settings: Settings,
    service: S,
) -> ServerConnection<impl Future<Output = Result<(), ConnectionError>>>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: FnMut(Request<Http1RequestBody>) -> R,
    R: Future<Output = Result<Response<B>, Infallible>> + Unpin,
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let stop = Arc::new(AtomicBool::new(false));
    ServerConnection {
        serving: serve_requests(io, settings, service, stop.clone()),
        stop,
    }
}

/// The connection's life: one request after another.
async fn serve_requests<I, S, R, B>(
    io: I,
    settings: Settings,
    mut service: S,
    stop: Arc<AtomicBool>,
) -> Result<(), ConnectionError>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: FnMut(Request<Http1RequestBody>) -> R,
    R: Future<Output = Result<Response<B>, Infallible>> + Unpin,
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut connection = ConnectionState::new(io, settings, stop);
    while let Some(head) = connection.next_head().await? {
        match connection.serve_one(head, &mut service).await? {
            Next::Request => {}
            Next::Close => break,
            Next::Upgrade(pending) => {
                let ConnectionState { io, buf, .. } = connection;
                pending.hand_over(upgrade::Upgraded::new(Box::new(io), buf.freeze()));
                return Ok(());
            }
        }
    }
    Ok(())
}

/// What follows a request's exchange on its connection.
enum Next {
    /// The next request.
    Request,
    /// Nothing: the connection is shut.
    Close,
    /// The connection switched protocols: it goes to whoever asked.
    Upgrade(upgrade::Pending),
}

/// What the response is framed by, from its request.
struct Exchange {
    method: http::Method,
    version: http::Version,
    keep_alive: bool,
}

/// Why no request head was read.
enum HeadRead {
    Io(std::io::Error),
    Refused(HeadError),
}

/// One client connection's state, kept from request to request: the socket, the bytes read and
/// not yet used, the response's pieces, and the request body being fed while there is one.
struct ConnectionState<I> {
    io: I,
    /// Bytes read and not yet used: a head, a body, a pipelined request.
    buf: BytesMut,
    writer: Writer,
    settings: Settings,
    /// Set by [`ServerConnection::graceful_shutdown`].
    stop: Arc<AtomicBool>,
    /// Feeds the current request's body to its handler; `None` once it is whole or abandoned.
    feeder: Option<Feeder>,
    /// The current request's body has been read to its end, so the next request can be found.
    body_whole: bool,
}

// === impl ConnectionState ===

impl<I: AsyncRead + AsyncWrite + Unpin> ConnectionState<I> {
    fn new(io: I, settings: Settings, stop: Arc<AtomicBool>) -> Self {
        ConnectionState {
            io,
            buf: BytesMut::new(),
            writer: Writer::new(),
            settings,
            stop,
            feeder: None,
            body_whole: true,
        }
    }

    /// Whether a graceful shutdown was asked for.
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// The next request head, `None` when the connection is over between requests; a head that
    /// cannot be served is answered (and the connection closed) here.
    async fn next_head(&mut self) -> Result<Option<head::RequestHead>, ConnectionError> {
        match self.read_head().await {
            Ok(head) => Ok(head),
            Err(HeadRead::Io(e)) => Err(e.into()),
            Err(HeadRead::Refused(error)) => {
                let answer = head::error_response(&error);
                let _ = self.io.write_all(&answer).await;
                let _ = self.io.shutdown().await;
                Err(ConnectionError::Head(error))
            }
        }
    }

    /// Serves one request through `service`: what follows on the connection (when nothing, it
    /// is shut down here).
    async fn serve_one<S, R, B>(
        &mut self,
        head: head::RequestHead,
        service: &mut S,
    ) -> Result<Next, ConnectionError>
    where
        S: FnMut(Request<Http1RequestBody>) -> R,
        R: Future<Output = Result<Response<B>, Infallible>> + Unpin,
        B: Body<Data = Bytes> + Unpin,
        B::Error: Into<BoxError>,
    {
        let exchange = Exchange {
            method: head.method.clone(),
            version: head.version,
            keep_alive: head.keep_alive,
        };
        let (body, feeder) = request_body::channel(head.body, head.expects_continue);
        self.feeder = feeder;
        let mut request = Request::new(body);
        *request.method_mut() = head.method;
        *request.uri_mut() = head.uri;
        *request.version_mut() = head.version;
        let mut upgrade = upgrade::requested(&head.headers).map(|(on, pending)| {
            request.extensions_mut().insert(on);
            pending
        });
        *request.headers_mut() = head.headers;
        let mut handling = service(request);

        // The handler runs until the response head; meanwhile the request body is fed to it and
        // a client that goes away drops it (and with it the upstream request).
        self.body_whole = self.feeder.is_none();
        // Body bytes that came with the head are handed over before the handler first runs, so
        // that it finds them there: the upstream client then writes head and body in one write,
        // and the upstream reads the request whole in one wake-up.
        let mut primed = self.feeder.is_none() || self.buf.is_empty();
        let response = poll_fn(|cx| {
            if !std::mem::replace(&mut primed, true) {
                if let Poll::Ready(error) = self.poll_client(cx) {
                    return Poll::Ready(Err(error));
                }
            }
            if let Poll::Ready(Ok(response)) = Pin::new(&mut handling).poll(cx) {
                return Poll::Ready(Ok(response));
            }
            self.poll_client(cx).map(Err)
        })
        .await?;
        drop(handling);

        let (mut parts, body) = response.into_parts();
        if upgrade::switches(parts.status) {
            // Only a `101` to a request that asked for an upgrade, with all of the request read.
            let Some(pending) = upgrade.take().filter(|_| self.body_whole) else {
                let _ = self.io.shutdown().await;
                return Ok(Next::Close);
            };
            self.io
                .write_all(&upgrade::switching_head(&parts.headers))
                .await?;
            self.io.flush().await?;
            return Ok(Next::Upgrade(pending));
        }
        drop(upgrade);
        let framed = head::frame_response(
            parts.status,
            &exchange.method,
            exchange.version,
            &mut parts.headers,
            body.size_hint().exact(),
            exchange.keep_alive && !self.stopping(),
        );
        let mut text = Vec::with_capacity(256);
        head::write_response_head(
            &mut text,
            parts.status,
            &parts.headers,
            exchange.version,
            framed.keep_alive,
        );
        drop(parts);
        if self.body_whole && self.buf.is_empty() {
            // Nothing more to read for this request: hold no buffer while the response streams.
            self.buf = BytesMut::new();
        }
        self.writer.start(text, framed.framing);
        let mut body = (framed.framing != Framing::None).then_some(body);
        self.stream_body(&mut body).await?;
        drop(body);
        // A body still unread leaves the connection where no next request can be found.
        let next = framed.keep_alive && self.body_whole && !self.stopping();
        self.feeder = None;
        if !next {
            let _ = self.io.shutdown().await;
            return Ok(Next::Close);
        }
        Ok(Next::Request)
    }

    /// Reads the next request head: its first byte within the idle timeout, its last within the
    /// head timeout of the first. `None`: the client closed between requests, a timeout passed,
    /// or a shutdown asked the idle connection to close.
    ///
    /// Reads go into the stack and only the bytes read are kept, so a head begun and never
    /// finished holds about its own size (a buffer reserved ahead held 4 KiB for a 57-byte one),
    /// and never more than `limits.max_header_bytes` and one read.
    async fn read_head(&mut self) -> Result<Option<head::RequestHead>, HeadRead> {
        let (idle, head_timeout) = (self.settings.idle_timeout, self.settings.head_timeout);
        // Bytes already read (a pipelined request) began the head.
        let mut head_begun = !self.buf.is_empty();
        let deadline = tokio::time::sleep(if head_begun { head_timeout } else { idle });
        // The deadline already counts from the head's first byte when bytes were there.
        let mut deadline_moved = head_begun;
        let mut first_byte = None;
        tokio::pin!(deadline);
        let max_head_bytes = self.settings.max_head_bytes;
        // How much of `buf` is known to hold no head's end. A head that trickles in is parsed
        // only once its end may be there: parsing it whole after every read would cost the
        // square of its length (by arithmetic, not measured: a 64 KiB head sent a byte at a time
        // would be 65,536 parses of 32 KiB on average, about 2 GB).
        let mut searched: usize = 0;
        poll_fn(|cx| loop {
            let buf = &mut self.buf;
            let may_be_whole =
                head_may_end(&buf[searched.saturating_sub(2)..]) || buf.len() >= max_head_bytes;
            searched = buf.len();
            if may_be_whole {
                match head::parse_request(buf, max_head_bytes) {
                    Ok(Some((head, len))) => {
                        buf.advance(len);
                        return Poll::Ready(Ok(Some(head)));
                    }
                    Ok(None) => {}
                    Err(e) => return Poll::Ready(Err(HeadRead::Refused(e))),
                }
            }
            if head_begun && !deadline_moved {
                // Only now that the head is known to be unfinished: a head that came whole in
                // its first read arms no timer (moving one earlier than the event loop's next
                // wake-up costs a write to its eventfd and a spurious return of its wait).
                deadline_moved = true;
                let at = first_byte.unwrap_or_else(tokio::time::Instant::now) + head_timeout;
                deadline.as_mut().reset(at);
            }
            if self.stop.load(Ordering::Acquire) && buf.is_empty() {
                return Poll::Ready(Ok(None));
            }
            // Not initialised, as in `poll_closed`.
            let mut chunk = [const { MaybeUninit::<u8>::uninit() }; READ_SIZE];
            let mut read = ReadBuf::uninit(&mut chunk);
            match Pin::new(&mut self.io).poll_read(cx, &mut read) {
                Poll::Ready(Ok(())) if read.filled().is_empty() => return Poll::Ready(Ok(None)),
                Poll::Ready(Ok(())) => {
                    buf.extend_from_slice(read.filled());
                    if !head_begun {
                        head_begun = true;
                        first_byte = Some(tokio::time::Instant::now());
                    }
                    continue;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(HeadRead::Io(e))),
                Poll::Pending => {}
            }
            if deadline.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Ok(None));
            }
            return Poll::Pending;
        })
        .await
    }

    /// Watches the client's side while a request is handled or its response streams: feeds the
    /// request body while there is one, and otherwise notices the client's close. Ready only
    /// with the error that ends the exchange.
    fn poll_client(&mut self, cx: &mut Context<'_>) -> Poll<ConnectionError> {
        if let Some(feeding) = &mut self.feeder {
            match feeding.poll_feed(cx, &mut self.io, &mut self.buf, READ_SIZE) {
                Poll::Ready(Ok(Fed::Complete)) => {
                    self.feeder = None;
                    self.body_whole = true;
                }
                Poll::Ready(Ok(Fed::Abandoned)) => {
                    // Nobody reads the rest; the connection closes after the response.
                    self.feeder = None;
                    return Poll::Pending;
                }
                Poll::Ready(Err(request_body::RequestBodyError::Closed)) => {
                    self.feeder = None;
                    return Poll::Ready(ConnectionError::ClientGone);
                }
                Poll::Ready(Err(request_body::RequestBodyError::Invalid(_))) => {
                    // The handler gets the error through the body and answers it (the upstream
                    // request fails); the connection closes after that answer.
                    self.feeder = None;
                    return Poll::Pending;
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        if !self.body_whole {
            // An abandoned body's bytes would be read as the next request: read nothing more.
            return Poll::Pending;
        }
        poll_closed(cx, &mut self.io, &mut self.buf)
    }

    /// Writes the response head and its body, frame by frame as the body yields them, while
    /// watching the client's side.
    async fn stream_body<B>(&mut self, body: &mut Option<B>) -> Result<(), ConnectionError>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: Into<BoxError>,
    {
        // Set once the body failed: the frames before the failure still go out, then the
        // connection closes without the body's end, so the client sees the response cut.
        let mut failed: Option<ConnectionError> = None;
        // Polls since the client's side was last looked at (see `PROBE_EVERY`).
        let mut unprobed = 0u8;
        poll_fn(|cx| loop {
            // Frames are taken only while none wait for the socket: a client that reads slowly
            // holds the body back here (and its reader task reads ahead, within its bound;
            // `metered`).
            let mut body_pending = false;
            let mut frames = 0;
            if let (Some(streaming), None, 0) = (body.as_mut(), &failed, self.writer.queued_bytes())
            {
                let writer = &mut self.writer;
                loop {
                    if writer.length_reached() {
                        // A body of declared length is over once its bytes are: it is not asked
                        // for its end (as hyper does not).
                        *body = None;
                        break;
                    }
                    match Pin::new(&mut *streaming).poll_frame(cx) {
                        Poll::Ready(Some(Ok(frame))) => {
                            if let Ok(data) = frame.into_data() {
                                if let Err(e) = writer.data(data) {
                                    failed = Some(e.into());
                                    *body = None;
                                    break;
                                }
                            }
                            frames += 1;
                            if frames == MAX_BATCH_FRAMES
                                || writer.queued_bytes() >= MAX_BATCH_BYTES
                            {
                                break;
                            }
                        }
                        Poll::Ready(Some(Err(e))) => {
                            failed = Some(ConnectionError::Body(e.into()));
                            *body = None;
                            break;
                        }
                        Poll::Ready(None) => {
                            if let Err(e) = writer.end() {
                                failed = Some(e.into());
                            }
                            *body = None;
                            break;
                        }
                        Poll::Pending => {
                            body_pending = true;
                            break;
                        }
                    }
                }
            }
            match self.writer.poll_write(cx, &mut self.io) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
                Poll::Pending => return self.poll_client(cx).map(Err),
            }
            if let Some(e) = failed.take() {
                return Poll::Ready(Err(e));
            }
            if body.is_none() {
                return Poll::Ready(Ok(()));
            }
            if body_pending {
                // The body will wake the task with its next frame. A poll that wrote frames skips
                // the client's side most times: it was woken by the upstream, and the client's
                // close is seen by the probe of a poll without frames (its wake is one), by the
                // next probe within `PROBE_EVERY` frames, or by the write after it.
                if frames > 0 && self.feeder.is_none() && unprobed + 1 < PROBE_EVERY {
                    unprobed += 1;
                    return Poll::Pending;
                }
                unprobed = 0;
                return self.poll_client(cx).map(Err);
            }
        })
        .await
    }
}

/// Whether `bytes` hold what ends a head: an empty line, after CRLF or a bare LF (which
/// httparse accepts) ends it with "\n\r\n" or "\n\n".
fn head_may_end(bytes: &[u8]) -> bool {
    memchr::memmem::find(bytes, b"\n\r\n").is_some()
        || memchr::memmem::find(bytes, b"\n\n").is_some()
}

/// Reads what the client sends while its request is served: a close (or a reset) ends the
/// exchange; bytes sent ahead are kept for the next request, up to a bound, past which the
/// socket is left unread until the response is out. Reads into the stack, so a connection whose
/// client sends nothing more holds no buffer.
fn poll_closed<I: AsyncRead + Unpin>(
    cx: &mut Context<'_>,
    io: &mut I,
    buf: &mut BytesMut,
) -> Poll<ConnectionError> {
    // Not initialised: zeroing it would cost a memset per poll, and a read only writes to it.
    let mut probe = [const { MaybeUninit::<u8>::uninit() }; 512];
    while buf.len() < MAX_READ_AHEAD {
        let mut read = ReadBuf::uninit(&mut probe);
        match Pin::new(&mut *io).poll_read(cx, &mut read) {
            Poll::Ready(Ok(())) if read.filled().is_empty() => {
                return Poll::Ready(ConnectionError::ClientGone)
            }
            Poll::Ready(Ok(())) => buf.extend_from_slice(read.filled()),
            Poll::Ready(Err(e)) => return Poll::Ready(e.into()),
            Poll::Pending => return Poll::Pending,
        }
    }
    Poll::Pending
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_may_end_only_where_an_empty_line_is() {
        for ended in [
            &b"GET / HTTP/1.1\r\nhost: a\r\n\r\n"[..],
            b"GET / HTTP/1.1\nhost: a\n\n",
            b"GET / HTTP/1.1\r\nhost: a\r\n\n",
            b"\n\r\n",
        ] {
            assert!(head_may_end(ended), "{ended:?}");
        }
        for open in [
            &b"GET / HTTP/1.1\r\nhost: a\r\n"[..],
            b"GET / HTTP/1.1\r\nhost: a\r\n\r",
            b"GET / HTTP/1.1\r\n",
            b"",
        ] {
            assert!(!head_may_end(open), "{open:?}");
        }
    }

    /// A request whose body came in the same read as its head is handed to the handler with
    /// its body already there and ended, so the handler's first poll can send both in one
    /// write (the proxy's upstream client does).
    #[tokio::test]
    async fn a_body_that_came_with_its_head_is_there_at_the_first_poll() {
        use futures_util::FutureExt;
        use http_body_util::{BodyExt, Empty};
        let (mut peer, io) = tokio::io::duplex(4096);
        peer.write_all(b"POST /v1/chat HTTP/1.1\r\nhost: a\r\ncontent-length: 2\r\n\r\n{}")
            .await
            .unwrap();
        let settings = Settings {
            max_head_bytes: 8192,
            idle_timeout: Duration::from_secs(10),
            head_timeout: Duration::from_secs(10),
        };
        let (seen_by_service, seen) = tokio::sync::oneshot::channel();
        let mut seen_by_service = Some(seen_by_service);
        let service = move |request: Request<Http1RequestBody>| {
            let seen = seen_by_service.take();
            Box::pin(async move {
                let mut body = request.into_body();
                let first = body.frame().now_or_never();
                let data = first.flatten().and_then(|f| f.ok()?.into_data().ok());
                let _ = seen.map(|s| s.send((data, body.is_end_stream())));
                Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
            })
        };
        let connection = tokio::spawn(serve(io, settings, service));
        let (data, ended) = seen.await.unwrap();
        assert_eq!(data.as_deref(), Some(&b"{}"[..]));
        assert!(ended);
        drop(peer);
        let _ = connection.await;
    }

    /// A head sent a byte at a time is read whole (the search for its end misses no ending);
    /// one that grows past the limit without an end is refused. That it is parsed only once is
    /// not counted here.
    #[tokio::test]
    async fn a_head_that_trickles_in_is_read_whole() {
        let text = b"POST /v1/chat/completions HTTP/1.1\r\nhost: a\r\ncontent-length: 2\r\n\r\n{}";
        let (mut peer, io) = tokio::io::duplex(4096);
        let writer = tokio::spawn(async move {
            for byte in text {
                peer.write_all(&[*byte]).await.unwrap();
                tokio::task::yield_now().await;
            }
            peer
        });
        let settings = Settings {
            max_head_bytes: 8192,
            idle_timeout: Duration::from_secs(10),
            head_timeout: Duration::from_secs(10),
        };
        let stop = Arc::new(AtomicBool::new(false));
        let mut connection = ConnectionState::new(io, settings, stop.clone());
        let head = connection.read_head().await;
        let head = head.ok().flatten().expect("a head");
        assert_eq!(head.uri, "/v1/chat/completions");
        let _peer = writer.await.unwrap();

        let (mut peer, io) = tokio::io::duplex(16384);
        peer.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        peer.write_all(&[b'x'; 9000]).await.unwrap();
        let mut connection = ConnectionState::new(io, settings, stop);
        let refused = connection.read_head().await;
        assert!(matches!(
            refused,
            Err(HeadRead::Refused(HeadError::TooLarge(8192)))
        ));
    }
}
