//! metronome's own HTTP/1.1 client for plain-http upstreams: it writes the request from the
//! request handler's task, reads the response head there, and leaves the connection in the
//! response body, which reads and decodes the socket when the egress body polls it.
//!
//! This is what hyper-util's client does with two tasks and a channel per frame (its connection
//! task reads and decodes, then hands each chunk to the response body); here a frame goes from
//! the upstream socket to the client socket in one poll of the client connection's task, as in
//! an event-loop proxy. What it does not do, hyper-util's client (kept for https upstreams and
//! `server.upstream_client = "hyper"`) does: TLS, HTTP/2, upgrades.
//!
//! It sends any request body of `Bytes` (the proxy's, with its limit) and hands back its own
//! [`Http1ResponseBody`]; its failures are [`ClientError`]s that keep their causes' types.

pub mod error;
pub mod pool;

use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::FutureExt;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

pub use error::{ClientError, Http1ResponseBodyError, ResponseHeadError};
use pool::{Pool, UpstreamConnection};

use crate::http1::decode::{BodyLength, Decoded, Decoder};
use crate::http1::encode::{write_fields, ChunkSize, CHUNK_END, LAST_CHUNK};
use crate::http1::head::{
    content_length, ends_in_chunked, header_map, list_elements, version, InvalidField,
};
use crate::http1::{BoxError, MAX_HEADERS};

/// The longest response head read.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// A connection's first read buffer: a few SSE frames of a chat stream (about 250 bytes each).
/// It doubles, up to [`MAX_READ`], while reads fill it (frames with log-probabilities, a large
/// body that is not a stream). Each open stream holds one, so it is small: 2 KiB rather than 4
/// saved about 2 KiB of resident memory per stream, and 1 KiB rather than 2 another 1.1
/// (docs/perf-history.md, "The upstream read buffer"); a read still takes one frame whole.
const FIRST_READ: usize = 1024;
/// The largest read buffer.
const MAX_READ: usize = 64 * 1024;
/// Request body bytes gathered before a write (a body that is all there goes out with its head
/// in one write; one that is still arriving goes out as it comes).
const WRITE_BATCH: usize = 64 * 1024;

/// Sends requests to plain-http upstreams over pooled HTTP/1.1 connections.
#[derive(Debug, Clone)]
pub struct Http1Client {
    pool: Pool,
    connect_timeout: Duration,
}

// === impl Http1Client ===

impl Http1Client {
    /// A client with its own pool (connections idle for `idle_timeout` are closed).
    pub fn new(connect_timeout: Duration, idle_timeout: Duration) -> Self {
        Http1Client {
            pool: Pool::new(idle_timeout),
            connect_timeout,
        }
    }

    /// Sends `request` (its URI absolute, http://) and reads the response head. The request body
    /// is streamed; the response body reads the connection as it is polled.
    pub async fn request<B>(
        &self,
        request: Request<B>,
    ) -> Result<Response<Http1ResponseBody>, ClientError>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: Into<BoxError>,
    {
        let authority = authority(request.uri())?;
        let (mut parts, body) = request.into_parts();
        let head_only = parts.method == Method::HEAD;
        // The whole body is written before the response is read, so waiting for a
        // `100 Continue` would only delay it.
        parts.headers.remove(header::EXPECT);
        if !parts.headers.contains_key(header::HOST) {
            if let Ok(host) = HeaderValue::from_str(&authority) {
                parts.headers.insert(header::HOST, host);
            }
        }
        let mut conn = match self.pool.checkout(&authority) {
            Some(conn) => conn,
            None => self.connect(&authority).await?,
        };
        write_request(&mut conn.io, &parts, body).await?;
        let (response, length, keep_alive) = read_head(&mut conn, head_only).await?;
        // The head's last read may have filled the buffer with the first frames too.
        let filled = conn.buf.len() == conn.buf.capacity();
        let body = Http1ResponseBody {
            filled,
            conn: Some(conn),
            decoder: Decoder::new(length),
            read_size: FIRST_READ,
            release: keep_alive.then(|| (self.pool.clone(), authority)),
            failed: None,
            read_error: None,
        };
        Ok(response.map(|()| body))
    }

    async fn connect(&self, authority: &str) -> Result<UpstreamConnection, ClientError> {
        let io =
            match tokio::time::timeout(self.connect_timeout, TcpStream::connect(authority)).await {
                Ok(Ok(io)) => io,
                Ok(Err(e)) => return Err(ClientError::Connect(e)),
                Err(_) => return Err(ClientError::ConnectTimeout(self.connect_timeout)),
            };
        // A token must not wait for Nagle, in either direction.
        let _ = io.set_nodelay(true);
        Ok(UpstreamConnection {
            io,
            buf: BytesMut::new(),
        })
    }
}

/// `host:port` of an http:// URI (port 80 when it names none).
fn authority(uri: &http::Uri) -> Result<Arc<str>, ClientError> {
    let authority = uri
        .authority()
        .ok_or_else(|| ClientError::NoAuthority(uri.clone()))?;
    Ok(match authority.port_u16() {
        Some(_) => Arc::from(authority.as_str()),
        None => Arc::from(format!("{}:80", authority.host())),
    })
}

/// Writes the request line, the header fields and the body, streamed: what has arrived of the
/// body goes out with the head, the rest as it comes (`content-length` when the length is known,
/// chunked otherwise).
async fn write_request<B>(
    io: &mut TcpStream,
    parts: &http::request::Parts,
    mut body: B,
) -> Result<(), ClientError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(parts.method.as_str().as_bytes());
    out.push(b' ');
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    write_fields(&mut out, &parts.headers);
    let declared = parts.headers.contains_key(header::CONTENT_LENGTH);
    let exact = body.size_hint().exact();
    let chunked = !declared && exact.is_none() && !body.is_end_stream();
    if chunked {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
    } else if !declared {
        let length = exact.unwrap_or(0);
        if length > 0 || !matches!(parts.method, Method::GET | Method::HEAD) {
            out.extend_from_slice(format!("content-length: {length}\r\n").as_bytes());
        }
    }
    out.extend_from_slice(b"\r\n");

    let send = ClientError::Send;
    loop {
        // Take what is there; before waiting for more, send what was gathered.
        let frame = match body.frame().now_or_never() {
            Some(frame) => frame,
            None => {
                if !out.is_empty() {
                    io.write_all(&out).await.map_err(send)?;
                    out.clear();
                }
                body.frame().await
            }
        };
        match frame {
            None => break,
            Some(Err(e)) => return Err(ClientError::RequestBody(e.into())),
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else {
                    // Request trailers are not forwarded (hyper-util's client drops them too).
                    continue;
                };
                if data.is_empty() {
                    continue;
                }
                if chunked {
                    out.extend_from_slice(ChunkSize::new(data.len()).as_bytes());
                }
                out.extend_from_slice(&data);
                if chunked {
                    out.extend_from_slice(CHUNK_END);
                }
                if out.len() >= WRITE_BATCH {
                    io.write_all(&out).await.map_err(send)?;
                    out.clear();
                }
            }
        }
    }
    if chunked {
        out.extend_from_slice(LAST_CHUNK);
    }
    if !out.is_empty() {
        io.write_all(&out).await.map_err(send)?;
    }
    Ok(())
}

/// Whether an interim (1xx) answer may come before the response: `100 Continue` and `103 Early
/// Hints` are skipped; any other (an unsolicited `101 Switching Protocols` above all) makes the
/// request fail as a protocol error. The proxy applies the same rule to hyper-util's client.
pub fn interim_allowed(status: StatusCode) -> bool {
    status == StatusCode::CONTINUE || status.as_u16() == 103
}

/// Reads the response head (skipping `100 Continue` and `103 Early Hints`; any other interim
/// answer is a protocol error): the response
/// without its body, the body's length, and whether the connection may be used again after it.
async fn read_head(
    conn: &mut UpstreamConnection,
    head_only: bool,
) -> Result<(Response<()>, BodyLength, bool), ClientError> {
    loop {
        let parsed = parse_head(&mut conn.buf, head_only)?;
        if let Some((response, length, keep_alive)) = parsed {
            if response.status().is_informational() {
                if !interim_allowed(response.status()) {
                    return Err(ClientError::UnexpectedInterim(response.status()));
                }
                continue;
            }
            return Ok((response, length, keep_alive));
        }
        if conn.buf.len() >= MAX_HEAD_BYTES {
            return Err(ClientError::HeadTooLong(MAX_HEAD_BYTES));
        }
        conn.buf.reserve(FIRST_READ);
        let read = std::future::poll_fn(|cx| poll_read(&mut conn.io, &mut conn.buf, cx)).await;
        match read {
            Ok(0) if conn.buf.is_empty() => return Err(ClientError::NoResponse),
            Ok(0) => return Err(ClientError::HeadCut),
            Ok(_) => {}
            Err(e) => return Err(ClientError::Read(e)),
        }
    }
}

/// Reads a response head off `buf` when all of it is there: the response, its body's length,
/// whether the connection may be reused. Public for the `response_head` fuzz target.
pub fn parse_head(
    buf: &mut BytesMut,
    head_only: bool,
) -> Result<Option<(Response<()>, BodyLength, bool)>, ResponseHeadError> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut head = httparse::Response::new(&mut fields);
    let end = match head.parse(buf) {
        Ok(httparse::Status::Complete(end)) => end,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(ResponseHeadError::Parse(e)),
    };
    let code = head.code.unwrap_or_default();
    let status = StatusCode::from_u16(code).map_err(|_| ResponseHeadError::Status(code))?;
    let version = version(head.version);
    let http10 = version == http::Version::HTTP_10;
    let mut response = Response::new(());
    *response.status_mut() = status;
    *response.version_mut() = version;
    *response.headers_mut() = header_map(head.headers).map_err(|field| match field {
        InvalidField::Name(name) => ResponseHeadError::FieldName(name.to_owned()),
        InvalidField::Value(name) => ResponseHeadError::FieldValue(name.to_owned()),
    })?;
    let _ = buf.split_to(end);
    let length = body_length(status, head_only, response.headers())
        .map_err(ResponseHeadError::ContentLength)?;
    if response.headers().contains_key(header::TRANSFER_ENCODING) {
        // Transfer-Encoding overrides Content-Length, and a proxy must not forward the latter
        // (RFC 9112 §6.3): the client would frame the decoded body by a length that is not its.
        response.headers_mut().remove(header::CONTENT_LENGTH);
    }
    let keep_alive = !http10
        && length != BodyLength::UntilClose
        && !list_elements(response.headers(), header::CONNECTION)
            .any(|t| t.eq_ignore_ascii_case("close"));
    Ok(Some((response, length, keep_alive)))
}

/// The body's length as RFC 9112 §6.3 reads it from the head.
fn body_length(
    status: StatusCode,
    head_only: bool,
    headers: &HeaderMap,
) -> Result<BodyLength, &'static str> {
    if head_only
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok(BodyLength::Empty);
    }
    if headers.contains_key(header::TRANSFER_ENCODING) {
        // Chunked only as the last coding; any other last coding runs until close.
        return Ok(if ends_in_chunked(headers) {
            BodyLength::Chunked
        } else {
            BodyLength::UntilClose
        });
    }
    let length = content_length(headers)?;
    Ok(length.map_or(BodyLength::UntilClose, BodyLength::Length))
}

/// Reads what the socket has into `buf`'s spare room (reserve before): the bytes read, 0 at the
/// connection's end. Through `AsyncRead::poll_read`, which takes a read shorter than the room as
/// the socket drained and waits for readiness instead of trying again: one `recvfrom` per frame,
/// not two (the second returning EAGAIN), as `try_read_buf` would do.
fn poll_read(
    io: &mut TcpStream,
    buf: &mut BytesMut,
    cx: &mut Context<'_>,
) -> Poll<std::io::Result<usize>> {
    tokio_util::io::poll_read_buf(Pin::new(io), cx, buf)
}

/// A response body read straight off its upstream connection as it is polled. At its clean end
/// the connection goes back to the pool (when the upstream keeps it open and sent nothing after
/// the body); dropped before its end, it closes the connection, so the upstream stops.
#[derive(Debug)]
pub struct Http1ResponseBody {
    /// `None` once the body ended or failed.
    conn: Option<UpstreamConnection>,
    decoder: Decoder,
    /// The next read's buffer room.
    read_size: usize,
    /// Where the connection goes after a clean end; `None` when it cannot be used again.
    release: Option<(Pool, Arc<str>)>,
    /// An error to give on the next poll.
    failed: Option<Http1ResponseBodyError>,
    /// The last read filled the buffer's room, so the socket may hold the rest of a chunk (two
    /// frames that came together, say): the next poll reads once more before decoding, so that
    /// a frame is not handed on in two parts.
    filled: bool,
    /// That extra read failed: given when the bytes before it have gone.
    read_error: Option<std::io::Error>,
}

// === impl Http1ResponseBody ===

impl Http1ResponseBody {
    /// The body has ended: the connection goes back to the pool if it can be used again.
    fn finish(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        if let Some((pool, authority)) = self.release.take() {
            // Bytes after the body are an answer to nothing: such a connection is not reused.
            if conn.buf.is_empty() {
                pool.checkin(authority, conn);
            }
        }
    }

    /// The body failed. The error waits one poll: a serving connection may abort the response
    /// as soon as it sees an error (hyper's does), dropping what it has not yet written, so it first gets a `Pending` (and an
    /// immediate wake-up) to write out the frames before the failure, as when the error came
    /// from another task.
    fn fail(
        &mut self,
        error: Http1ResponseBodyError,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Http1ResponseBodyError>>> {
        self.conn = None;
        self.failed = Some(error);
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl Body for Http1ResponseBody {
    type Data = Bytes;
    type Error = Http1ResponseBodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Http1ResponseBodyError>>> {
        let this = self.get_mut();
        if let Some(error) = this.failed.take() {
            return Poll::Ready(Some(Err(error)));
        }
        loop {
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            if std::mem::take(&mut this.filled) {
                // Nothing more, or the end, is found again by the next read.
                conn.buf.reserve(this.read_size);
                if let Poll::Ready(Err(e)) = poll_read(&mut conn.io, &mut conn.buf, cx) {
                    this.read_error = Some(e);
                }
            }
            match this.decoder.decode(&mut conn.buf) {
                Err(e) => return this.fail(e.into(), cx),
                Ok(Decoded::Data(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                Ok(Decoded::End(trailers)) => {
                    this.finish();
                    return Poll::Ready(
                        (!trailers.is_empty()).then(|| Ok(Frame::trailers(trailers))),
                    );
                }
                Ok(Decoded::NeedMore) => {
                    if let Some(e) = this.read_error.take() {
                        return this.fail(e.into(), cx);
                    }
                    // At least half the read size free, so a read takes a chat frame whole (512
                    // bytes at the first read size); reclaiming the buffer in place is cheap
                    // once the connection has written the frames split off it. So the room is
                    // made only once the socket has something: the serving connection (native
                    // or hyper's) asks for the next frame before
                    // it writes the last one, and reserving then, while that frame still shares
                    // the buffer, would allocate a new buffer (and its shared header) every
                    // other chat frame. By the time the next frame arrives the last is written.
                    if conn.buf.capacity() - conn.buf.len() < this.read_size / 2 {
                        if let Err(e) = ready!(conn.io.poll_read_ready(cx)) {
                            return this.fail(e.into(), cx);
                        }
                        conn.buf.reserve(this.read_size);
                    }
                    let room = conn.buf.capacity() - conn.buf.len();
                    match ready!(poll_read(&mut conn.io, &mut conn.buf, cx)) {
                        Ok(0) => match this.decoder.eof() {
                            Ok(()) => {
                                this.conn = None;
                                return Poll::Ready(None);
                            }
                            Err(e) => return this.fail(e.into(), cx),
                        },
                        Ok(n) => {
                            if n == room {
                                this.read_size = (this.read_size * 2).min(MAX_READ);
                                this.filled = true;
                            }
                        }
                        Err(e) => return this.fail(e.into(), cx),
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed.is_none() && (self.conn.is_none() || self.decoder.is_done())
    }

    fn size_hint(&self) -> SizeHint {
        match self.decoder.remaining() {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

impl Drop for Http1ResponseBody {
    fn drop(&mut self) {
        // The serving connection (native or hyper's) stops polling a body with a known length
        // once it has all its bytes: the upstream connection is still good for the next request.
        if self.decoder.is_done() {
            self.finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(wire: &[u8], head_only: bool) -> (Response<()>, BodyLength, bool, BytesMut) {
        let mut buf = BytesMut::from(wire);
        let (response, length, keep_alive) = parse_head(&mut buf, head_only)
            .unwrap_or_else(|e| panic!("{e}"))
            .expect("complete");
        (response, length, keep_alive, buf)
    }

    #[test]
    fn the_body_length_follows_rfc_9112() {
        let cases: [(&[u8], bool, BodyLength, bool); 9] = [
            (
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
                false,
                BodyLength::Chunked,
                true,
            ),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\n",
                false,
                BodyLength::Length(12),
                true,
            ),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 12, 12\r\n\r\n",
                false,
                BodyLength::Length(12),
                true,
            ),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\n",
                true,
                BodyLength::Empty,
                true,
            ),
            (
                b"HTTP/1.1 204 No Content\r\n\r\n",
                false,
                BodyLength::Empty,
                true,
            ),
            (
                b"HTTP/1.1 200 OK\r\n\r\n",
                false,
                BodyLength::UntilClose,
                false,
            ),
            (
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n",
                false,
                BodyLength::UntilClose,
                false,
            ),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\nconnection: keep-alive, close\r\n\r\n",
                false,
                BodyLength::Length(3),
                false,
            ),
            (
                b"HTTP/1.0 200 OK\r\ncontent-length: 3\r\n\r\n",
                false,
                BodyLength::Length(3),
                false,
            ),
        ];
        for (wire, head_only, length, keep_alive) in cases {
            let (_, l, k, _) = head(wire, head_only);
            assert_eq!(
                (l, k),
                (length, keep_alive),
                "{}",
                String::from_utf8_lossy(wire)
            );
        }
    }

    #[test]
    fn a_content_length_beside_a_transfer_encoding_is_not_forwarded() {
        let (response, length, _, _) = head(
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n",
            false,
        );
        assert_eq!(length, BodyLength::Chunked);
        assert!(!response.headers().contains_key("content-length"));
    }

    #[test]
    fn a_head_keeps_its_fields_and_leaves_the_body_in_the_buffer() {
        let (response, _, _, rest) = head(
            b"HTTP/1.1 201 Created\r\nContent-Type: text/event-stream\r\nx-a: 1\r\nx-a: 2\r\n\r\ndata: x",
            false,
        );
        assert_eq!(response.status(), StatusCode::CREATED);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        assert_eq!(response.headers().get_all("x-a").iter().count(), 2);
        assert_eq!(&rest[..], b"data: x");
    }

    #[test]
    fn a_partial_head_waits_and_a_broken_one_is_a_protocol_error() {
        let mut buf = BytesMut::from(&b"HTTP/1.1 200 OK\r\ncontent-"[..]);
        assert!(parse_head(&mut buf, false).unwrap().is_none());
        for wire in [
            &b"garbage\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\ncontent-length: 3, 4\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
        ] {
            let mut buf = BytesMut::from(wire);
            // Every refused head is a protocol error (`proxy::upstream` counts it so).
            assert!(parse_head(&mut buf, false).is_err());
        }
    }

    #[test]
    fn an_authority_without_a_port_is_port_80() {
        let a = authority(&"http://vllm/v1/chat".parse().unwrap()).unwrap();
        assert_eq!(&*a, "vllm:80");
        let a = authority(&"http://[::1]:8000/v1".parse().unwrap()).unwrap();
        assert_eq!(&*a, "[::1]:8000");
    }
}
