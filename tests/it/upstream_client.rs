//! metronome's own HTTP/1.1 upstream client (`server.upstream_client = "native"`, the default for
//! http:// upstreams) against a raw upstream that answers exactly the bytes each test scripts:
//! request bodies streamed with and without a length, interim answers, bodies without a body
//! (HEAD, 204, 304), bodies until close, and which connections go back to the pool and which must
//! not. The other behaviours (cut bodies, resets, garbage, idle expiry, cancellation) are in
//! tests/it/faults.rs and tests/proxy.rs, which run through this client too.

use crate::support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use metronome::config::ClientKind;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One scripted answer: the bytes written back, and whether the connection closes after them.
#[derive(Clone)]
struct Answer {
    bytes: Bytes,
    close: bool,
}

fn answer(bytes: &str) -> Answer {
    Answer {
        bytes: Bytes::from(bytes.to_string()),
        close: false,
    }
}

fn answer_then_close(bytes: &str) -> Answer {
    Answer {
        close: true,
        ..answer(bytes)
    }
}

/// A request as the upstream read it: its head and its body, decoded from its framing.
#[derive(Debug, Clone)]
struct Seen {
    head: String,
    body: Vec<u8>,
    chunked: bool,
}

/// An upstream that answers the scripted answers in order, whatever connection they come on,
/// and records each request and each connection.
struct RawUpstream {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    accepted: Arc<AtomicUsize>,
}

async fn raw_upstream(answers: Vec<Answer>) -> RawUpstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let accepted = Arc::new(AtomicUsize::new(0));
    let answers = Arc::new(Mutex::new(answers.into_iter()));
    let (s, a) = (seen.clone(), accepted.clone());
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            a.fetch_add(1, Ordering::SeqCst);
            let (seen, answers) = (s.clone(), answers.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                while let Some(request) = read_request(&mut socket, &mut buf).await {
                    seen.lock().unwrap().push(request);
                    let Some(answer) = answers.lock().unwrap().next() else {
                        return;
                    };
                    if socket.write_all(&answer.bytes).await.is_err() || answer.close {
                        return;
                    }
                }
            });
        }
    });
    RawUpstream {
        addr,
        seen,
        accepted,
    }
}

/// Reads one request off `socket` (`buf` keeps what was read past it); `None` at the end.
async fn read_request(socket: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Seen> {
    let head_end = loop {
        if let Some(end) = find(buf, b"\r\n\r\n") {
            break end + 4;
        }
        read_more(socket, buf).await?;
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    buf.drain(..head_end);
    let lower = head.to_ascii_lowercase();
    let chunked = lower.contains("transfer-encoding: chunked");
    let mut body = Vec::new();
    if chunked {
        loop {
            let line_end = loop {
                if let Some(end) = find(buf, b"\r\n") {
                    break end;
                }
                read_more(socket, buf).await?;
            };
            let size =
                usize::from_str_radix(std::str::from_utf8(&buf[..line_end]).ok()?, 16).ok()?;
            buf.drain(..line_end + 2);
            while buf.len() < size + 2 {
                read_more(socket, buf).await?;
            }
            body.extend_from_slice(&buf[..size]);
            buf.drain(..size + 2);
            if size == 0 {
                break;
            }
        }
    } else if let Some(at) = lower.find("content-length: ") {
        let rest = &lower[at + 16..];
        let length: usize = rest[..rest.find("\r\n").unwrap()].trim().parse().ok()?;
        while buf.len() < length {
            read_more(socket, buf).await?;
        }
        body = buf.drain(..length).collect();
    }
    Some(Seen {
        head,
        body,
        chunked,
    })
}

async fn read_more(socket: &mut TcpStream, buf: &mut Vec<u8>) -> Option<()> {
    let mut chunk = [0u8; 4096];
    match socket.read(&mut chunk).await {
        Ok(0) | Err(_) => None,
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            Some(())
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Writes `head` and then each of `pieces` (a pause between), and reads the whole answer until
/// the proxy closes the connection (each request here says `connection: close`).
async fn raw_client(addr: SocketAddr, head: &str, pieces: &[&[u8]]) -> String {
    let mut socket = TcpStream::connect(addr).await.unwrap();
    socket.write_all(head.as_bytes()).await.unwrap();
    for piece in pieces {
        tokio::time::sleep(ms(20)).await;
        socket.write_all(piece).await.unwrap();
    }
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut out))
        .await
        .expect("the proxy answers and closes")
        .unwrap();
    String::from_utf8_lossy(&out).to_string()
}

/// An SSE answer of one token event and `[DONE]`, chunked.
fn sse_answer() -> String {
    let mut out =
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            .to_string();
    for event in [
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}],\"model\":\"m\"}\n\n",
        "data: [DONE]\n\n",
    ] {
        out.push_str(&format!("{:x}\r\n{event}\r\n", event.len()));
    }
    out + "0\r\n\r\n"
}

/// The output tokens the chat route counted from token events.
fn counted_chat_tokens(m: &Metrics) -> f64 {
    m.value(
        "metronome_output_tokens_total",
        &[("route", "chat"), ("source", "counted")],
    )
}

/// A proxy in front of `upstream` whose readiness check stays away from it (each answer here is
/// scripted for one request), on one worker.
async fn proxy(
    upstream: &RawUpstream,
    adjust: impl FnOnce(&mut metronome::config::Config),
) -> metronome::proxy::ProxyHandle {
    proxy_with(upstream.addr, |c| {
        c.readiness.check_upstream = false;
        // One worker, so one pool: which connection a request comes on does not matter.
        c.server.workers = std::num::NonZeroUsize::new(1);
        adjust(c);
    })
    .await
}

#[tokio::test]
async fn a_request_body_streamed_in_chunks_reaches_the_upstream_whole_and_chunked() {
    let upstream = raw_upstream(vec![answer(&sse_answer())]).await;
    let proxy = proxy(&upstream, |_| {}).await;
    let got = raw_client(
        proxy.proxy_addr,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         transfer-encoding: chunked\r\nconnection: close\r\n\r\n",
        &[
            b"7\r\n{\"model\r\n",
            b"b\r\n\":\"m\",\"x\":1\r\n",
            b"1\r\n}\r\n0\r\n\r\n",
        ],
    )
    .await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(got.contains("data: [DONE]"), "{got}");
    let seen = upstream.seen.lock().unwrap()[0].clone();
    assert!(
        seen.chunked,
        "no length known: chunked upstream too\n{}",
        seen.head
    );
    assert_eq!(seen.body, b"{\"model\":\"m\",\"x\":1}");
    assert!(
        seen.head
            .starts_with("POST /v1/chat/completions HTTP/1.1\r\n"),
        "{}",
        seen.head
    );
    assert!(
        seen.head.contains("x-forwarded-for: 127.0.0.1"),
        "{}",
        seen.head
    );
    assert!(
        !seen.head.to_ascii_lowercase().contains("connection: close"),
        "hop-by-hop dropped"
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_request_body_with_a_length_keeps_it_and_an_oversized_stream_gets_a_413() {
    let json = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
    let upstream = raw_upstream(vec![answer(&sse_answer()), answer(json)]).await;
    let proxy = proxy(&upstream, |c| c.limits.max_request_body_bytes = 64).await;
    let got = raw_client(
        proxy.proxy_addr,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 13\r\nconnection: close\r\n\r\n",
        &[b"{\"model\":", b"\"m\"}"],
    )
    .await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    let seen = upstream.seen.lock().unwrap()[0].clone();
    assert!(!seen.chunked);
    assert!(
        seen.head.contains("content-length: 13\r\n"),
        "{}",
        seen.head
    );
    assert_eq!(seen.body, b"{\"model\":\"m\"}");

    // No length declared, and more than the limit streamed: 413, and the upstream request is
    // abandoned (its connection is not reused: the next request opens another).
    let big = format!("{:x}\r\n{}\r\n", 100, "x".repeat(100));
    let got = raw_client(
        proxy.proxy_addr,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n",
        &[b"5\r\nhello\r\n", big.as_bytes(), b"0\r\n\r\n"],
    )
    .await;
    assert!(got.starts_with("HTTP/1.1 413"), "{got}");
    assert!(got.contains("request_too_large"), "{got}");
    let next = request(proxy.proxy_addr, "GET", "/v1/models", "", false).await;
    assert_eq!((next.status, next.bytes()), (200, b"{}".to_vec()));
    assert_eq!(
        upstream.accepted.load(Ordering::SeqCst),
        2,
        "the cut-off request's connection was closed, not pooled"
    );
    assert_eq!(
        upstream.seen.lock().unwrap().len(),
        2,
        "the cut-off request never reached the upstream whole"
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn interim_answers_are_skipped_and_bodiless_answers_keep_the_connection() {
    let upstream = raw_upstream(vec![
        answer(&format!("HTTP/1.1 100 Continue\r\n\r\n{}", sse_answer())),
        answer("HTTP/1.1 204 No Content\r\n\r\n"),
        answer("HTTP/1.1 304 Not Modified\r\ncontent-length: 99\r\n\r\n"),
        // A HEAD answer names the length of the body it does not send.
        answer("HTTP/1.1 200 OK\r\ncontent-length: 99\r\n\r\n"),
        answer("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"ok\":true}"),
        answer(&sse_answer()),
    ])
    .await;
    let proxy = proxy(&upstream, |_| {}).await;
    let addr = proxy.proxy_addr;

    let stream = stream_chat(addr).await;
    assert_eq!(stream.status, 200);
    assert!(stream.error.is_none());
    assert!(String::from_utf8_lossy(&stream.bytes()).contains("[DONE]"));
    for (method, status) in [("GET", 204), ("GET", 304), ("HEAD", 200)] {
        let got = request(addr, method, "/v1/models", "", false).await;
        assert_eq!(got.status, status, "{method}");
        assert!(got.bytes().is_empty() && got.error.is_none(), "{method}");
    }
    let json = request(addr, "GET", "/v1/models", "", false).await;
    assert_eq!(json.bytes(), b"{\"ok\":true}");
    let again = stream_chat(addr).await;
    assert!(again.error.is_none());
    assert!(String::from_utf8_lossy(&again.bytes()).contains("[DONE]"));
    assert_eq!(
        upstream.accepted.load(Ordering::SeqCst),
        1,
        "every answer came on the one pooled connection"
    );
    assert_eq!(upstream.seen.lock().unwrap().len(), 6);
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_connection_the_upstream_closed_or_said_close_on_is_not_used_again() {
    let json = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
    let upstream = raw_upstream(vec![
        // Closed after the answer without saying so (as a server whose keep-alive ran out).
        answer_then_close(json),
        answer(&json.replace("\r\n\r\n", "\r\nconnection: close\r\n\r\n")),
        // Bytes after the body answer nothing: the connection is not used again.
        answer(&format!("{json}HTTP/1.1 200 OK\r\n")),
        answer(json),
        answer(json),
    ])
    .await;
    let proxy = proxy(&upstream, |_| {}).await;
    let addr = proxy.proxy_addr;
    for expected_connections in [1, 2, 3, 4, 4] {
        // Time for the close to reach the pooled socket.
        tokio::time::sleep(ms(50)).await;
        let got = request(addr, "GET", "/v1/models", "", false).await;
        assert_eq!((got.status, got.bytes()), (200, b"{}".to_vec()));
        assert_eq!(
            upstream.accepted.load(Ordering::SeqCst),
            expected_connections
        );
    }
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_body_without_a_length_runs_until_the_upstream_closes() {
    let upstream = raw_upstream(vec![answer_then_close(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n\
         data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n\
         data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"}}]}\n\ndata: [DONE]\n\n",
    )])
    .await;
    let proxy = proxy(&upstream, |_| {}).await;
    let got = stream_chat(proxy.proxy_addr).await;
    assert_eq!(got.status, 200);
    assert!(got.error.is_none(), "{:?}", got.error);
    assert!(String::from_utf8_lossy(&got.bytes()).ends_with("data: [DONE]\n\n"));
    let m = one_chat_stream_ended_as(&proxy, "complete").await;
    assert_eq!(counted_chat_tokens(&m), 2.0);
    proxy.shutdown().await;
}

/// The native client's read buffer starts small (a few SSE frames) and grows while reads fill
/// it: a response head, a chunk-size line and a frame each larger than that first buffer, written
/// in one go, arrive whole and counted.
#[tokio::test]
async fn a_head_a_chunk_line_and_a_frame_larger_than_the_first_read_arrive_whole() {
    let big_header = "h".repeat(6_000);
    let big_text = "t".repeat(40_000);
    let events = [
        format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{big_text}\"}}}}],\"model\":\"m\"}}\n\n"),
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"}}],\"model\":\"m\"}\n\n"
            .to_string(),
        "data: [DONE]\n\n".to_string(),
    ];
    let mut answer_bytes = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nx-big: {big_header}\r\n\
         transfer-encoding: chunked\r\n\r\n"
    );
    for (i, event) in events.iter().enumerate() {
        // The first chunk's size line carries an extension longer than the first read buffer
        // (within the decoder's 4 KiB bound for a size line).
        let extension = if i == 0 {
            format!(";x={}", "e".repeat(3_000))
        } else {
            String::new()
        };
        answer_bytes.push_str(&format!("{:x}{extension}\r\n{event}\r\n", event.len()));
    }
    answer_bytes.push_str("0\r\n\r\n");
    let upstream = raw_upstream(vec![answer(&answer_bytes)]).await;
    let proxy = proxy(&upstream, |_| {}).await;
    let got = stream_chat(proxy.proxy_addr).await;
    assert_eq!(got.status, 200);
    assert!(got.error.is_none(), "{:?}", got.error);
    assert_eq!(got.headers["x-big"], big_header.as_str());
    assert_eq!(got.bytes(), events.concat().into_bytes());
    let m = one_chat_stream_ended_as(&proxy, "complete").await;
    assert_eq!(counted_chat_tokens(&m), 2.0);
    assert_eq!(
        m.value(
            "metronome_inter_token_latency_seconds_count",
            &[("point", "egress")]
        ),
        1.0
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn hyper_is_still_there_when_asked_for() {
    let upstream = Upstream::openai_chat().tokens(5).every(ms(2));
    let expected = upstream.expected_bytes();
    let upstream = upstream.start().await;
    let proxy = proxy_with(upstream.addr, |c| {
        c.server.upstream_client = ClientKind::Hyper;
    })
    .await;
    assert!(proxy.state.upstream_client().native().is_none());
    let got = stream_chat(proxy.proxy_addr).await;
    assert_eq!(got.bytes(), expected);
    one_chat_stream_ended_as(&proxy, "complete").await;
    proxy.shutdown().await;
}

/// Two frames that come together, more than the read buffer has room for, are handed on as two
/// frames, not three: a read that fills the room (the body's, or the head's last one) is followed
/// at once by one that takes the rest of the chunk, before decoding. (Without it, the second
/// frame went on in two parts, each a frame to the meter: one proxy delay and one socket write
/// too many.)
#[tokio::test]
async fn two_frames_that_come_together_beyond_the_room_are_not_split() {
    // The head alone first, so that the body's first read has what the head left of the buffer;
    // then the head and the frames in one write, so that the head's read fills the buffer.
    for head_alone in [true, false] {
        assert_eq!(
            frames_metered_of_two_that_came_together(head_alone).await,
            2.0,
            "head alone: {head_alone}"
        );
    }
}

/// Streams two frames of about 700 bytes written at once (more than the first read buffer's
/// room, under 1 KiB) and returns how many frames the proxy metered.
async fn frames_metered_of_two_that_came_together(head_alone: bool) -> f64 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let text = "t".repeat(600);
    let event = format!(
        "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}}}}],\"model\":\"m\"}}\n\n"
    );
    let chunk = format!("{:x}\r\n{event}\r\n", event.len());
    let expected = format!("{event}{event}");
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut request = vec![0u8; 64 * 1024];
        let _ = socket.read(&mut request).await.unwrap();
        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                    transfer-encoding: chunked\r\n\r\n";
        let frames = if head_alone {
            socket.write_all(head.as_bytes()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            format!("{chunk}{chunk}")
        } else {
            format!("{head}{chunk}{chunk}")
        };
        socket.write_all(frames.as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        socket.write_all(b"0\r\n\r\n").await.unwrap();
        // Hold the connection until the proxy is done with it.
        let _ = socket.read(&mut request).await;
    });
    let proxy = proxy_with(addr, |c| {
        c.readiness.check_upstream = false;
    })
    .await;
    let got = stream_chat(proxy.proxy_addr).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.bytes(), expected.into_bytes());
    let m = one_chat_stream_ended_as(&proxy, "complete").await;
    let frames = m.value("metronome_proxy_delay_seconds_count", &[("route", "chat")]);
    proxy.shutdown().await;
    frames
}
