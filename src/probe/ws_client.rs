//! Runs the probe's streams over WebSockets (`--websocket`): each response is one stream with
//! its own record, measured at the client exactly as an SSE stream is; a socket carries
//! `--responses-per-socket` of them, one after another.
//!
//! The handshake is the probe's own (TCP, rustls for `wss://`, an HTTP/1.1 upgrade through
//! hyper), so the `101`'s headers are read (the proxy's stream ID); the frames are yawc's, a
//! WebSocket implementation independent of the proxy's frame reader, offering
//! `permessage-deflate` as browsers do. Every message is stamped as it is read: a message is
//! one event, and a token event's arrival is its message's. TTFT counts from sending the
//! `response.create` (closed loop) or from the intended start (open loop).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use futures_util::{FutureExt, SinkExt, StreamExt};
use http::header::{self, HeaderValue};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use sha1::{Digest, Sha1};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_rustls::TlsConnector;
use yawc::close::CloseCode;
use yawc::{Frame, OpCode, Options, Role, WebSocket};

use super::args::{ProbeConfig, WsSettings};
use super::backoff;
use super::client::{may_start, one_line, ProbeError, ProbeShared};
use super::stream::{Read, StreamError, StreamRecord, MAX_READS};
use super::ws_protocol::{messages_for, Message, MessageReader, WsProtocol};
use crate::error::Chain;
use crate::format::ThinkState;

/// The GUID of RFC 6455 section 1.3, hashed with the key into `Sec-WebSocket-Accept`.
const WEBSOCKET_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// What the probe offers: `permessage-deflate`, as browsers and Python's `websockets` do.
const DEFLATE_OFFER: &str = "permessage-deflate; client_max_window_bits";

/// At most this many characters of an error message are kept in a record.
const ERROR_CHARS: usize = 300;

/// How long a Realtime socket may take to say `session.created`.
const GREETING_WAIT: Duration = Duration::from_secs(10);

/// A socket's frames: yawc over hyper's upgraded connection.
type Ws = WebSocket<TokioIo<Upgraded>>;

/// What every WebSocket stream of a run shares: the messages of each request, built once, and
/// the TLS connector for `wss://`.
pub(crate) struct WsPlan {
    settings: WsSettings,
    /// The messages of `config.body` (first) and of each `config.bodies` entry.
    messages: Vec<Vec<Bytes>>,
    tls: Option<TlsConnector>,
}

// === impl WsPlan ===

impl WsPlan {
    /// The plan of `config`'s WebSocket run; a body that cannot be sent is refused here, before
    /// any stream starts.
    pub(crate) fn new(config: &ProbeConfig, settings: WsSettings) -> Result<Self, ProbeError> {
        let bodies = std::iter::once(&config.body).chain(&config.bodies);
        let messages = bodies
            .map(|body| messages_for(settings.protocol, body, settings.realtime))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ProbeError::InvalidRequest(e.to_string()))?;
        let tls = match config.url.scheme_str() {
            Some("https") => {
                let mut tls = crate::tls::client_config(config.ca.as_deref(), None)?;
                tls.alpn_protocols = vec![b"http/1.1".to_vec()];
                Some(TlsConnector::from(Arc::new(tls)))
            }
            _ => None,
        };
        Ok(WsPlan {
            settings,
            messages,
            tls,
        })
    }

    /// The messages of stream `index`'s request.
    fn messages(&self, config: &ProbeConfig, index: u64) -> &[Bytes] {
        match config.bodies.len() {
            0 => &self.messages[0],
            n => &self.messages[1 + super::workload::pick(index, n, config.seed)],
        }
    }
}

/// One open socket.
struct Socket {
    ws: Ws,
    reader: MessageReader,
    /// The `101`'s stream ID header, given to the socket's first response's record.
    stream_id: Option<String>,
    /// Responses run on the socket.
    responses: u64,
    /// The server closed the socket.
    closed: bool,
}

/// `concurrency` workers, each running its streams on a socket of its own until the socket has
/// carried `--responses-per-socket` of them (or broke), then on a new one.
pub(crate) fn closed_loop(
    shared: &Arc<ProbeShared>,
    concurrency: usize,
    started: Instant,
    tx: &mpsc::UnboundedSender<StreamRecord>,
) {
    let next = Arc::new(AtomicU64::new(0));
    for _ in 0..concurrency {
        let (shared, next, tx) = (shared.clone(), next.clone(), tx.clone());
        tokio::spawn(async move {
            let mut socket = None;
            let mut failures_in_a_row = 0;
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let now = Instant::now();
                if shared.starts.gave_up() || !may_start(shared.config.stop, index, now, started) {
                    break;
                }
                let record = run(&shared, &mut socket, index, None).await;
                failures_in_a_row = match record.error {
                    Some(_) => failures_in_a_row + 1,
                    None => 0,
                };
                if tx.send(record).is_err() {
                    break;
                }
                let wait = backoff::wait_after(failures_in_a_row, backoff::jitter());
                if !wait.is_zero() {
                    tokio::time::sleep(wait).await;
                }
            }
            if let Some(socket) = socket {
                socket.close().await;
            }
        });
    }
}

/// Open loop: stream `index` on a socket of its own, timed from its intended start.
pub(crate) async fn run_one(shared: &ProbeShared, index: u64, scheduled: Instant) -> StreamRecord {
    let mut socket = None;
    let record = run(shared, &mut socket, index, Some(scheduled)).await;
    if let Some(socket) = socket {
        socket.close().await;
    }
    record
}

/// Runs stream `index` on `socket` (opening one first when there is none, or the one there is
/// has carried its share or was closed) and returns its record. `scheduled` is the open loop's
/// intended start; the closed loop's is the moment the `response.create` goes out. A socket
/// that failed a stream is not used again.
async fn run(
    shared: &ProbeShared,
    socket: &mut Option<Socket>,
    index: u64,
    scheduled: Option<Instant>,
) -> StreamRecord {
    let plan = shared.ws.as_ref().expect("a WebSocket run has its plan");
    let mut record = StreamRecord::new(index, scheduled.unwrap_or_else(Instant::now));
    shared.starts.sent_one();
    let deadline = Instant::now() + shared.config.timeout;
    let outcome = tokio::time::timeout_at(deadline.into(), async {
        let reusable = match socket.as_mut() {
            Some(open) => open.responses < plan.settings.per_socket && open.still_open(),
            None => false,
        };
        if !reusable {
            if let Some(old) = socket.take() {
                old.close().await;
            }
            *socket = Some(connect(shared, plan, &mut record).await?);
        }
        let Some(open) = socket.as_mut() else {
            return Err(StreamError::Request("no socket".to_owned()));
        };
        open.responses += 1;
        record.status = Some(StatusCode::SWITCHING_PROTOCOLS.as_u16());
        record.stream_id = open.stream_id.take();
        let messages = plan.messages(&shared.config, index);
        respond(open, messages, scheduled.is_none(), &mut record, shared).await
    })
    .await;
    record.finished = Some(Instant::now());
    let error = match outcome {
        Ok(Ok(())) => record.error.take(),
        Ok(Err(error)) => Some(error),
        Err(_elapsed) => Some(StreamError::Timeout(shared.config.timeout)),
    };
    if error.is_some() {
        *socket = None;
    }
    record.error = error;
    shared.starts.ended_one(record.error.is_some());
    record
}

/// Opens a socket: TCP, TLS for `https`, the upgrade, and for the Realtime API its
/// `session.created`.
async fn connect(
    shared: &ProbeShared,
    plan: &WsPlan,
    record: &mut StreamRecord,
) -> Result<Socket, StreamError> {
    let config = &shared.config;
    let host = config.url.host().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let https = plan.tls.is_some();
    let port = config
        .url
        .port_u16()
        .unwrap_or(if https { 443 } else { 80 });
    let tcp = TcpStream::connect((host, port))
        .await
        .map_err(|e| StreamError::Connect(Chain(&e).to_string()))?;
    let _ = tcp.set_nodelay(true);
    let (upgraded, response) = match &plan.tls {
        Some(tls) => {
            let name = ServerName::try_from(host.to_owned())
                .map_err(|e| StreamError::Connect(e.to_string()))?;
            let io = tls
                .connect(name, tcp)
                .await
                .map_err(|e| StreamError::Connect(Chain(&e).to_string()))?;
            upgrade(shared, io, record).await?
        }
        None => upgrade(shared, tcp, record).await?,
    };
    let extensions = response
        .headers()
        .get(header::SEC_WEBSOCKET_EXTENSIONS)
        .and_then(|v| v.to_str().ok());
    let options = Options::default().with_low_latency_compression();
    let ws = WebSocket::from_stream_with_extensions(
        TokioIo::new(upgraded),
        Role::Client,
        extensions,
        options,
    )
    .map_err(|e| StreamError::Request(format!("the WebSocket could not start: {e}")))?;
    let stream_id = response
        .headers()
        .get(&config.stream_id_header)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let mut socket = Socket {
        ws,
        reader: MessageReader::new(plan.settings.protocol),
        stream_id,
        responses: 0,
        closed: false,
    };
    if plan.settings.protocol == WsProtocol::Realtime {
        socket.greeting().await?;
    }
    Ok(socket)
}

/// Sends the upgrade request over `io` and returns the upgraded connection and the `101`.
async fn upgrade<I>(
    shared: &ProbeShared,
    io: I,
    record: &mut StreamRecord,
) -> Result<(Upgraded, http::Response<hyper::body::Incoming>), StreamError>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let config = &shared.config;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| StreamError::Connect(Chain(&e).to_string()))?;
    tokio::spawn(async move {
        let _ = connection.with_upgrades().await;
    });
    let key = base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 16]>());
    let request =
        upgrade_request(config, &key).map_err(|e| StreamError::Request(Chain(&e).to_string()))?;
    let mut response = sender
        .send_request(request)
        .await
        .map_err(|e| StreamError::Request(Chain(&e).to_string()))?;
    let status = response.status();
    record.status = Some(status.as_u16());
    if status != StatusCode::SWITCHING_PROTOCOLS {
        let body = response.into_body().collect().await.map(|b| b.to_bytes());
        let text = body.map(|b| String::from_utf8_lossy(&b).into_owned());
        record.error_body = text
            .ok()
            .and_then(|t| one_line(&config.secrets.redact(&t), ERROR_CHARS));
        return Err(StreamError::Status(status.as_u16()));
    }
    let accept = response.headers().get(header::SEC_WEBSOCKET_ACCEPT);
    if accept.map(HeaderValue::as_bytes) != Some(accept_value(&key).as_bytes()) {
        return Err(StreamError::Request(
            "the server's Sec-WebSocket-Accept does not answer the key".to_owned(),
        ));
    }
    let upgraded = hyper::upgrade::on(&mut response)
        .await
        .map_err(|e| StreamError::Request(Chain(&e).to_string()))?;
    Ok((upgraded, response))
}

/// The upgrade request: the URL's path, the run's headers (without a body's), the key and the
/// deflate offer.
fn upgrade_request(config: &ProbeConfig, key: &str) -> Result<Request<Empty<Bytes>>, http::Error> {
    let target = config
        .url
        .path_and_query()
        .map_or("/", http::uri::PathAndQuery::as_str);
    let host = config
        .url
        .authority()
        .map_or("", http::uri::Authority::as_str);
    let mut builder = Request::get(target);
    if let Some(headers) = builder.headers_mut() {
        headers.extend(config.headers.clone());
        headers.remove(header::CONTENT_TYPE);
    }
    builder
        .header(header::HOST, host)
        .header(header::UPGRADE, "websocket")
        .header(header::CONNECTION, "upgrade")
        .header(header::SEC_WEBSOCKET_KEY, key)
        .header(header::SEC_WEBSOCKET_VERSION, "13")
        .header(header::SEC_WEBSOCKET_EXTENSIONS, DEFLATE_OFFER)
        .body(Empty::new())
}

/// `Sec-WebSocket-Accept` for `key`: base64 of SHA-1 of the key and the GUID.
fn accept_value(key: &str) -> String {
    let mut sha1 = Sha1::new();
    sha1.update(key.as_bytes());
    sha1.update(WEBSOCKET_GUID.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(sha1.finalize())
}

/// Sends one response's messages and reads its events until it ends; `closed_loop` times it
/// from the `response.create` (the last message).
async fn respond(
    socket: &mut Socket,
    messages: &[Bytes],
    closed_loop: bool,
    record: &mut StreamRecord,
    shared: &ProbeShared,
) -> Result<(), StreamError> {
    let Some((create, before)) = messages.split_last() else {
        return Err(StreamError::Request("no message to send".to_owned()));
    };
    let failed = |e: yawc::WebSocketError| StreamError::Request(Chain(&e).to_string());
    for message in before {
        socket
            .ws
            .feed(Frame::text(message.clone()))
            .await
            .map_err(failed)?;
    }
    let sent = Instant::now();
    if closed_loop {
        record.scheduled = sent;
    }
    record.sent = Some(sent);
    socket
        .ws
        .feed(Frame::text(create.clone()))
        .await
        .map_err(failed)?;
    socket.ws.flush().await.map_err(failed)?;
    let mut think = ThinkState::new(&shared.config.think);
    loop {
        let Some(frame) = socket.ws.next().await else {
            socket.closed = true;
            return Err(StreamError::Body(
                "the socket broke off mid-response".to_owned(),
            ));
        };
        let at = Instant::now();
        match frame.opcode() {
            OpCode::Text | OpCode::Binary => {
                let message = socket.reader.read(&mut think, frame.payload());
                note(record, at, &message);
                if message.error {
                    let text = String::from_utf8_lossy(frame.payload());
                    record.error_body = one_line(&shared.config.secrets.redact(&text), ERROR_CHARS);
                    return Err(StreamError::ErrorEvent);
                }
                if message.end {
                    break;
                }
            }
            OpCode::Close => {
                socket.closed = true;
                return Err(StreamError::Body(format!(
                    "the server closed the socket mid-response ({})",
                    close_text(&frame)
                )));
            }
            _ => {}
        }
    }
    if record.token_times.is_empty() {
        return Err(StreamError::NoToken);
    }
    Ok(())
}

/// Writes what message `message`, read at `at`, adds to the record.
fn note(record: &mut StreamRecord, at: Instant, message: &Message) {
    record.frames += 1;
    record.first_byte.get_or_insert(at);
    if let Some(phase) = message.token_event {
        record.token_times.push(at);
        record.token_phases.push(phase);
        record.counted_tokens += u64::from(message.tokens.unwrap_or(1));
    }
    if let Some(total) = message.usage_total {
        record.usage_tokens = Some(total);
    }
    if message.unparsed {
        record.unparsed_events += 1;
    }
    if record.reads.len() < MAX_READS {
        record.reads.push(Read {
            at,
            events: 1,
            token_events: u32::from(message.token_event.is_some()),
        });
    } else {
        record.reads_dropped += 1;
    }
}

/// A close frame's code and reason, for an error message.
fn close_text(frame: &Frame) -> String {
    let code = frame.close_code().map_or(1005, u16::from);
    match frame.close_reason() {
        Ok(Some(reason)) if !reason.is_empty() => format!("{code} {reason}"),
        _ => code.to_string(),
    }
}

// === impl Socket ===

impl Socket {
    /// Waits for the Realtime API's `session.created`, the first message of a session.
    async fn greeting(&mut self) -> Result<(), StreamError> {
        let wait = tokio::time::timeout(GREETING_WAIT, async {
            while let Some(frame) = self.ws.next().await {
                if frame.opcode() == OpCode::Text
                    && frame.payload().windows(15).any(|w| w == b"session.created")
                {
                    return Ok(());
                }
                if frame.opcode() == OpCode::Close {
                    break;
                }
            }
            Err(StreamError::Body(
                "the Realtime session closed before session.created".to_owned(),
            ))
        });
        wait.await.unwrap_or_else(|_| {
            Err(StreamError::Body(format!(
                "no session.created within {}",
                crate::units::format_duration(GREETING_WAIT)
            )))
        })
    }

    /// Whether the socket can carry another response: reads what waits in it without waiting
    /// (a server that closed after its last response has said so by now, in the same write).
    fn still_open(&mut self) -> bool {
        while !self.closed {
            match self.ws.next().now_or_never() {
                None => break,
                Some(Some(frame)) if frame.opcode() != OpCode::Close => {}
                Some(_) => self.closed = true,
            }
        }
        !self.closed
    }

    /// Closes the socket politely (1000), waiting briefly for the server's close.
    async fn close(mut self) {
        if self.closed {
            return;
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            if self
                .ws
                .send(Frame::close(CloseCode::Normal, b""))
                .await
                .is_ok()
            {
                while self.ws.next().await.is_some() {}
            }
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_accept_value_is_rfc_6455s() {
        // The example of RFC 6455 section 1.3.
        assert_eq!(
            accept_value("dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[test]
    fn a_message_is_one_read_and_its_token_event_keeps_its_phase() {
        let t0 = Instant::now();
        let mut record = StreamRecord::new(0, t0);
        let mut reader = MessageReader::new(WsProtocol::Responses);
        let mut think = ThinkState::default();
        for (ms, text) in [
            (5, &br#"{"type":"response.created","response":{"status":"in_progress"}}"#[..]),
            (9, br#"{"type":"response.reasoning_text.delta","delta":"hm"}"#),
            (12, br#"{"type":"response.output_text.delta","delta":"Hi"}"#),
            (
                13,
                br#"{"type":"response.completed","response":{"status":"completed","usage":{"output_tokens":7}}}"#,
            ),
        ] {
            let message = reader.read(&mut think, text);
            note(&mut record, t0 + Duration::from_millis(ms), &message);
        }
        assert_eq!(record.frames, 4);
        assert_eq!(record.first_byte, Some(t0 + Duration::from_millis(5)));
        assert_eq!(record.token_times.len(), 2);
        assert_eq!(
            record.token_phases,
            [
                super::super::stream::Phase::Reasoning,
                super::super::stream::Phase::Content
            ]
        );
        assert_eq!(record.output_tokens(), 7);
        let token_reads: Vec<u32> = record.reads.iter().map(|r| r.token_events).collect();
        assert_eq!(token_reads, [0, 1, 1, 0]);
    }
}
