//! Faults, one test each: an upstream that cuts its body, resets its connection, speaks garbage
//! instead of HTTP, sends bytes no accountant can read, answers a stream request with an error,
//! compresses its stream, or keeps idle connections open for ever; a client that opens 200
//! streams on one HTTP/2 connection. (Refused connections, a failed body, silent upstreams and
//! clients that go away are in tests/proxy.rs; memory bounds in tests/memory.rs; a panicking
//! stream task in tests/it/panics.rs. RELIABILITY.md lists them all.)
//!
//! Every test ends with the same checks ([`Harness::finish`]): the stream gauge is back at 0, the
//! proxy still serves a healthy stream afterwards, no task panicked, and the runtime's count of
//! live tasks is back to exactly what it was before the fault. The upstreams here close each
//! connection after its response, so no pooled connection keeps a task alive; an ingress reader,
//! a connection or an upstream socket left behind would keep that count up and fail the test.

use crate::support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use metronome::config::Config;
use metronome::proxy::ProxyHandle;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

// === panics ===

/// Panics outside the tests' own code since the process started: a spawned task's panic is
/// caught by tokio and would otherwise go unnoticed. The process is every test of tests/it/, and
/// a failed assertion in one test must not fail the others, so panics located in `tests/` (the
/// injected one of tests/it/panics.rs too) are not counted.
static PANICS: AtomicUsize = AtomicUsize::new(0);

fn count_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let in_tests = info
                .location()
                .is_some_and(|l| l.file().starts_with("tests/"));
            if !in_tests {
                PANICS.fetch_add(1, Ordering::SeqCst);
            }
            default(info);
        }));
    });
}

fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

// === the harness ===

/// A proxy with two routes: `chat` (exact `/v1/chat/completions`) to the upstream under test,
/// and `healthy` (prefix `/healthy`) to a well-behaved upstream, to show the proxy still serves
/// after the fault.
struct Harness {
    proxy: ProxyHandle,
    healthy: RunningUpstream,
    healthy_bytes: Vec<u8>,
    /// Live tasks once everything was listening, before any request.
    baseline_tasks: usize,
}

const CHAT: (&str, &str) = ("route", "chat");

/// Waits for the one stream of a test to be recorded and checks that it ended as an upstream
/// error, with exactly one upstream error, of `kind`; returns the scrape for further checks.
async fn one_upstream_error(h: &Harness, kind: &str) -> Metrics {
    let m = h.scrape_after_chat_stream().await;
    assert_eq!(
        m.value(
            "metronome_streams_total",
            &[CHAT, ("outcome", "upstream_error")]
        ),
        1.0
    );
    assert_eq!(m.value("metronome_streams_total", &[CHAT]), 1.0);
    assert_one_upstream_error_of_kind(&m, kind);
    m
}

/// Checks that the chat route counted exactly one upstream error, and that it was of `kind`.
fn assert_one_upstream_error_of_kind(m: &Metrics, kind: &str) {
    assert_eq!(
        m.value("metronome_upstream_errors_total", &[CHAT, ("kind", kind)]),
        1.0,
        "one upstream error of kind {kind}"
    );
    assert_eq!(m.value("metronome_upstream_errors_total", &[CHAT]), 1.0);
}

async fn harness(upstream: SocketAddr, adjust: impl FnOnce(&mut Config)) -> Harness {
    count_panics();
    let healthy = Upstream::openai_chat()
        .tokens(5)
        .every(ms(2))
        .close_after_response();
    let healthy_bytes = healthy.expected_bytes();
    let healthy = healthy.start().await;
    let mut config = Config::from_toml(&format!(
        r#"{}
[[routes]]
name = "healthy"
path = "/healthy"
upstream = "http://{}"
"#,
        proxy_toml(upstream),
        healthy.addr
    ))
    .unwrap();
    // These tests count the upstream's connections and the runtime's tasks exactly; the
    // readiness check's periodic connection to the upstream is not part of any fault.
    config.readiness.check_upstream = false;
    adjust(&mut config);
    let proxy = ProxyHandle::start(config).await.unwrap();
    // Tasks that start on first use and live as long as the proxy (the admin listener's first
    // connection) are not leaks: count them in the baseline.
    scrape(&proxy).await;
    tokio::time::sleep(ms(50)).await;
    let baseline_tasks = alive_tasks();
    Harness {
        proxy,
        healthy,
        healthy_bytes,
        baseline_tasks,
    }
}

impl Harness {
    fn addr(&self) -> SocketAddr {
        self.proxy.proxy_addr
    }

    /// Scrapes once the stream under test (on the `chat` route) has been recorded.
    async fn scrape_after_chat_stream(&self) -> Metrics {
        scrape_until(&self.proxy, |m| {
            m.get("metronome_streams_total", &[CHAT]).is_some()
        })
        .await
    }

    /// The checks every fault ends with, then shutdown.
    async fn finish(self) {
        // The stream gauge is back at 0 (the faulty stream was recorded).
        scrape_until(&self.proxy, |m| {
            m.value("metronome_streams_active", &[CHAT]) == 0.0
        })
        .await;

        // The proxy still serves: a healthy stream, byte for byte.
        let got = request(
            self.addr(),
            "POST",
            "/healthy/v1/chat/completions",
            r#"{"stream":true}"#,
            false,
        )
        .await;
        assert_eq!(
            got.status, 200,
            "the proxy serves a healthy request afterwards"
        );
        assert!(got.error.is_none(), "{:?}", got.error);
        assert_eq!(got.bytes(), self.healthy_bytes);
        let m = scrape_until(&self.proxy, |m| {
            m.value(
                "metronome_streams_total",
                &[("route", "healthy"), ("outcome", "complete")],
            ) == 1.0
        })
        .await;
        assert_eq!(m.value("metronome_streams_active", &[]), 0.0);
        assert_eq!(self.healthy.stats.completed.load(Ordering::SeqCst), 1);

        // No task is left behind: readers, connections and upstream sockets have all ended.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let alive = alive_tasks();
            if alive == self.baseline_tasks {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{alive} tasks alive, {} before the fault: a task leaked",
                self.baseline_tasks
            );
            tokio::time::sleep(ms(20)).await;
        }
        assert_eq!(
            self.healthy.stats.connections_open.load(Ordering::SeqCst),
            0
        );
        assert_eq!(PANICS.load(Ordering::SeqCst), 0, "a task panicked");
        self.proxy.shutdown().await;
    }
}

// === a raw TCP upstream, for what a well-behaved HTTP server cannot send ===

/// One thing the raw upstream does after reading the request.
#[derive(Debug, Clone)]
enum Raw {
    Write(Bytes),
    Pause(Duration),
    /// Close the socket, whatever the state of the response.
    Close,
    /// Abort the connection with a TCP RST (`SO_LINGER` 0).
    Reset,
}

/// A raw upstream: after its script, unless it closed, it holds the connection until the proxy
/// closes it, so a proxy that never lets go keeps its task (and `open`) up.
struct RawUpstream {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    open: Arc<AtomicUsize>,
}

async fn raw_upstream(script: Vec<Raw>) -> RawUpstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let open = Arc::new(AtomicUsize::new(0));
    let (accepted2, open2) = (accepted.clone(), open.clone());
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            accepted2.fetch_add(1, Ordering::SeqCst);
            open2.fetch_add(1, Ordering::SeqCst);
            let script = script.clone();
            let open = open2.clone();
            tokio::spawn(async move {
                read_request(&mut socket).await;
                let mut closed = false;
                for step in script {
                    match step {
                        Raw::Write(bytes) => {
                            let _ = socket.write_all(&bytes).await;
                        }
                        Raw::Pause(d) => tokio::time::sleep(d).await,
                        Raw::Close => {
                            closed = true;
                            break;
                        }
                        Raw::Reset => {
                            let _ = socket.set_zero_linger();
                            closed = true;
                            break;
                        }
                    }
                }
                if !closed {
                    let mut sink = [0u8; 4096];
                    while let Ok(n) = socket.read(&mut sink).await {
                        if n == 0 {
                            break;
                        }
                    }
                }
                drop(socket);
                open.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    RawUpstream {
        addr,
        accepted,
        open,
    }
}

/// An OpenAI chat chunk carrying one token.
fn token_event(text: &str) -> Bytes {
    Bytes::from(format!(
        "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"test-model\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n"
    ))
}

/// HTTP/1.1 chunked framing of `data`.
fn chunk(data: &[u8]) -> Bytes {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    Bytes::from(out)
}

const SSE_HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";

/// Waits until the raw upstream's connections are all closed by the proxy.
async fn raw_connections_closed(upstream: &RawUpstream) {
    wait_until(
        Duration::from_secs(5),
        "the proxy never closed the upstream connection",
        || upstream.open.load(Ordering::SeqCst) == 0,
    )
    .await;
}

// === the faults ===

#[tokio::test]
async fn an_upstream_body_cut_before_the_terminal_chunk_aborts_the_client_response() {
    let (e1, e2, e3) = (token_event("a"), token_event("b"), token_event("c"));
    let half = e3.slice(..e3.len() / 2);
    // Two whole chunks, then a chunk whose header promises more than is sent, and at once the
    // socket closes: no terminal `0\r\n\r\n`. The half chunk sent just before the cut must still
    // reach the client.
    let mut partial = format!("{:x}\r\n", e3.len()).into_bytes();
    partial.extend_from_slice(&half);
    let upstream = raw_upstream(vec![
        Raw::Write(Bytes::from_static(SSE_HEAD)),
        Raw::Write(chunk(&e1)),
        Raw::Pause(ms(20)),
        Raw::Write(chunk(&e2)),
        Raw::Pause(ms(20)),
        Raw::Write(Bytes::from(partial)),
        Raw::Close,
    ])
    .await;
    let h = harness(upstream.addr, |_| {}).await;

    let got = stream_chat(h.addr()).await;
    assert_eq!(got.status, 200);
    let mut expected = e1.to_vec();
    expected.extend_from_slice(&e2);
    expected.extend_from_slice(&half);
    assert_eq!(
        got.bytes(),
        expected,
        "every byte the upstream sent reaches the client"
    );
    assert!(
        got.error.is_some(),
        "a cut body must not reach the client as a complete response"
    );

    let m = one_upstream_error(&h, "reset").await;
    // The two whole events were metered: one gap between them.
    assert_eq!(
        m.value(
            "metronome_inter_token_latency_seconds_count",
            &[CHAT, ("point", "ingress")]
        ),
        1.0
    );
    assert_eq!(upstream.accepted.load(Ordering::SeqCst), 1);
    raw_connections_closed(&upstream).await;
    h.finish().await;
}

#[tokio::test]
async fn an_upstream_tcp_reset_mid_stream_is_counted_as_a_reset() {
    // tests/proxy.rs has a scripted upstream failing its body (hyper closes the connection);
    // this one aborts it with an RST, as a crashed or killed inference server's kernel does.
    let (e1, e2) = (token_event("a"), token_event("b"));
    let upstream = raw_upstream(vec![
        Raw::Write(Bytes::from_static(SSE_HEAD)),
        Raw::Write(chunk(&e1)),
        Raw::Pause(ms(20)),
        Raw::Write(chunk(&e2)),
        Raw::Pause(ms(50)),
        Raw::Reset,
    ])
    .await;
    let h = harness(upstream.addr, |_| {}).await;

    let got = stream_chat(h.addr()).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.bytes(), [e1, e2].concat());
    assert!(got.error.is_some(), "the client response is aborted");
    one_upstream_error(&h, "reset").await;
    raw_connections_closed(&upstream).await;
    h.finish().await;
}

#[tokio::test]
async fn an_upstream_that_answers_garbage_instead_of_a_status_line_gets_a_502() {
    let upstream = raw_upstream(vec![Raw::Write(Bytes::from_static(
        b"SSH-2.0-OpenSSH_9.6\r\n\xff\xfe\x00garbage\r\n\r\n",
    ))])
    .await;
    let h = harness(upstream.addr, |_| {}).await;

    let got = stream_chat(h.addr()).await;
    assert_eq!(got.status, 502);
    assert!(got.error.is_none());
    assert_eq!(got.headers["content-type"], "application/json");
    let body: serde_json::Value = serde_json::from_slice(&got.bytes()).unwrap();
    assert_eq!(body["error"]["type"], "upstream_unavailable");

    let m = scrape(&h.proxy).await;
    assert_one_upstream_error_of_kind(&m, "protocol");
    assert_eq!(
        m.value("metronome_requests_total", &[CHAT, ("status_class", "5xx")]),
        1.0
    );
    assert_eq!(
        m.get("metronome_streams_total", &[CHAT]),
        None,
        "no stream was opened"
    );
    // The pooled client does not retry a request that was sent: one connection.
    assert_eq!(upstream.accepted.load(Ordering::SeqCst), 1);
    raw_connections_closed(&upstream).await;
    h.finish().await;
}

#[tokio::test]
async fn an_upstream_that_sends_garbage_mid_body_aborts_the_client_response() {
    let e1 = token_event("a");
    let upstream = raw_upstream(vec![
        Raw::Write(Bytes::from_static(SSE_HEAD)),
        Raw::Write(chunk(&e1)),
        Raw::Pause(ms(30)),
        // Not a chunk-size line.
        Raw::Write(Bytes::from_static(
            b"zz\xff not a chunk size\r\ndata: x\r\n\r\n",
        )),
    ])
    .await;
    let h = harness(upstream.addr, |_| {}).await;

    let got = stream_chat(h.addr()).await;
    assert_eq!(got.status, 200);
    assert_eq!(
        got.bytes(),
        e1.to_vec(),
        "the bytes before the garbage went through"
    );
    assert!(
        got.error.is_some(),
        "the response is aborted, not completed"
    );

    one_upstream_error(&h, "protocol").await;
    // The proxy lets go of a connection that spoke garbage (the raw upstream holds it open
    // until then).
    raw_connections_closed(&upstream).await;
    h.finish().await;
}

#[tokio::test]
async fn invalid_utf8_and_garbage_events_are_forwarded_untouched_and_counted_unparsed() {
    let frames: Vec<Bytes> = vec![
        token_event("a"),
        // Binary junk, invalid UTF-8, as an event's data.
        Bytes::from_static(b"data: \x00\x01\x02\xff\xfe\xc3\x28\n\n"),
        token_event("b"),
        // JSON-looking, with invalid UTF-8 inside the content string.
        Bytes::from_static(
            b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\xc3\x28\xa0\xa1\"}}]}\n\n",
        ),
        // A comment and a line without a known field: no event at all.
        Bytes::from_static(b":\xff\xfe comment with junk\n\n"),
        Bytes::from_static(b"garbage line \xff without a colon\n\n"),
        // Text that is not JSON.
        Bytes::from_static(b"data: not json at all {{{\n\n"),
        // A lone CR and a stray NUL in a line: still the SSE rules, still forwarded.
        Bytes::from_static(b"data: {\"choices\":[]\r\x00\n\n"),
        token_event("c"),
        Bytes::from_static(b"data: [DONE]\n\n"),
    ];
    let upstream = Upstream::sse_frames(&frames, ms(2))
        .close_after_response()
        .start()
        .await;
    let h = harness(upstream.addr, |_| {}).await;

    let got = stream_chat(h.addr()).await;
    assert_eq!(got.status, 200);
    assert!(got.error.is_none());
    assert_eq!(
        got.bytes(),
        frames.concat(),
        "garbage is forwarded byte for byte"
    );

    let m = h.scrape_after_chat_stream().await;
    // Unparsed: the binary event, the invalid UTF-8 in JSON, the text, and `{"choices":[]` (the
    // lone CR ends its line; the NUL line after it is a field without a colon, not data).
    assert_eq!(
        m.value(
            "metronome_unparsed_events_total",
            &[CHAT, ("reason", "invalid")]
        ),
        4.0
    );
    assert_eq!(
        m.value("metronome_streams_total", &[CHAT, ("outcome", "complete")]),
        1.0
    );
    assert_eq!(
        m.value(
            "metronome_inter_token_latency_seconds_count",
            &[CHAT, ("point", "ingress")]
        ),
        2.0,
        "three token events around the garbage"
    );
    assert_eq!(m.value("metronome_upstream_errors_total", &[]), 0.0);
    h.finish().await;
}

/// A 4xx or 5xx JSON answer to a streaming request passes through as it is: request metrics,
/// no stream metrics.
async fn error_status_passes_through(status: u16, class: &str) {
    let body = format!(r#"{{"error":{{"message":"status {status}","type":"server_error"}}}}"#);
    let upstream = Upstream::json(&body)
        .status(status)
        .close_after_response()
        .start()
        .await;
    let h = harness(upstream.addr, |_| {}).await;

    let got = stream_chat(h.addr()).await;
    assert_eq!(got.status, status);
    assert!(got.error.is_none());
    assert_eq!(got.bytes(), body.as_bytes());
    assert_eq!(got.headers["content-type"], "application/json");
    assert!(!got.headers.contains_key("x-metronome-stream-id"));

    let m = scrape_until(&h.proxy, |m| {
        m.get("metronome_request_duration_seconds_count", &[CHAT])
            .is_some()
    })
    .await;
    assert_eq!(
        m.value("metronome_requests_total", &[CHAT, ("status_class", class)]),
        1.0
    );
    assert_eq!(m.value("metronome_requests_total", &[CHAT]), 1.0);
    assert_eq!(m.get("metronome_streams_total", &[CHAT]), None);
    assert_eq!(
        m.get(
            "metronome_time_to_first_byte_seconds_count",
            &[CHAT, ("point", "ingress")]
        ),
        None
    );
    assert_eq!(
        m.value("metronome_upstream_errors_total", &[]),
        0.0,
        "an answer is not an upstream failure"
    );
    h.finish().await;
}

#[tokio::test]
async fn a_4xx_json_answer_to_a_stream_request_passes_through() {
    error_status_passes_through(429, "4xx").await;
}

#[tokio::test]
async fn a_5xx_json_answer_to_a_stream_request_passes_through() {
    error_status_passes_through(503, "5xx").await;
}

/// `gzip.compress(b'data: {...tok1...}\n\n' * 3 + b'data: [DONE]\n\n', mtime=0)`: three
/// OpenAI chunks and `[DONE]`, 386 bytes before compression.
const GZIP_SSE: &[u8] = &[
    0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x03, 0xc5, 0x8d, 0x3b, 0x0a, 0xc3, 0x30,
    0x10, 0x05, 0x7b, 0x9d, 0xc2, 0xbc, 0x5a, 0x31, 0xf9, 0x74, 0xaa, 0x93, 0x36, 0x39, 0x80, 0x71,
    0x21, 0xaf, 0x16, 0xac, 0xd8, 0xd6, 0x06, 0xbc, 0x86, 0x80, 0xd1, 0xdd, 0x2d, 0x93, 0x2a, 0x27,
    0x70, 0x39, 0xbc, 0xe1, 0x4d, 0xf0, 0xea, 0x5d, 0xb5, 0x22, 0x06, 0x38, 0x10, 0x2c, 0xa4, 0x7b,
    0x33, 0xe9, 0x0e, 0xbd, 0xd7, 0x9a, 0x64, 0xfa, 0x8c, 0xac, 0x51, 0x52, 0x4d, 0xfd, 0x92, 0x86,
    0x22, 0x4c, 0x12, 0x78, 0x2c, 0xbb, 0xf2, 0xac, 0xa7, 0x1f, 0xd8, 0x22, 0x4b, 0x24, 0x9e, 0xe1,
    0x9a, 0x72, 0x95, 0x02, 0x7f, 0xe1, 0xce, 0x16, 0x65, 0x53, 0x0f, 0xb7, 0x82, 0x24, 0x29, 0xa7,
    0xfd, 0xb5, 0x52, 0x19, 0x2e, 0xc8, 0xb9, 0xcd, 0xc6, 0x84, 0x03, 0xda, 0xd7, 0x03, 0xdb, 0xb7,
    0xbf, 0x76, 0x73, 0x7f, 0x3d, 0x1f, 0xad, 0x31, 0x1b, 0x0d, 0xc2, 0xdf, 0x17, 0x82, 0x01, 0x00,
    0x00,
];

#[tokio::test]
async fn a_gzip_encoded_stream_is_forwarded_untouched_and_metered_as_opaque() {
    // Three frames, 30 ms apart, cut anywhere in the compressed bytes.
    let cuts = [0, 50, 100, GZIP_SSE.len()];
    let steps = cuts
        .windows(2)
        .map(|w| Step::Frame(ms(30), Bytes::from_static(&GZIP_SSE[w[0]..w[1]])))
        .collect();
    let upstream = Upstream::script("text/event-stream; charset=utf-8", steps)
        .header("content-encoding", "gzip")
        .close_after_response()
        .start()
        .await;
    let h = harness(upstream.addr, |_| {}).await;

    let got = stream_chat(h.addr()).await;
    assert_eq!(got.status, 200);
    assert!(got.error.is_none());
    assert_eq!(got.bytes(), GZIP_SSE, "compressed bytes pass byte for byte");
    assert_eq!(got.headers["content-encoding"], "gzip");
    assert!(got.headers.contains_key("x-metronome-stream-id"));

    let m = h.scrape_after_chat_stream().await;
    assert_eq!(
        m.value("metronome_streams_total", &[CHAT, ("outcome", "no_token")]),
        1.0,
        "an opaque stream has no token events"
    );
    let ingress = [CHAT, ("point", "ingress")];
    assert_eq!(
        m.value("metronome_events_per_frame_sum", &ingress),
        0.0,
        "the compressed bytes were not scanned for events"
    );
    assert_eq!(
        m.value("metronome_time_to_first_token_seconds_count", &ingress),
        0.0
    );
    assert_eq!(
        m.value("metronome_time_to_first_byte_seconds_count", &ingress),
        1.0,
        "but it is timed"
    );
    assert_eq!(
        m.value("metronome_proxy_delay_seconds_count", &[CHAT]),
        3.0,
        "each of the three frames is stamped at egress"
    );
    assert_eq!(m.value("metronome_unparsed_events_total", &[]), 0.0);
    h.finish().await;
}

#[tokio::test]
async fn an_http2_client_with_200_concurrent_streams_on_one_connection_gets_them_all() {
    const STREAMS: usize = 200;
    let upstream = Upstream::openai_chat()
        .tokens(10)
        .every(ms(5))
        .close_after_response();
    let expected = Bytes::from(upstream.expected_bytes());
    let upstream = upstream.start().await;
    let h = harness(upstream.addr, |_| {}).await;

    // One TCP connection, HTTP/2 with prior knowledge, every stream opened at once.
    let tcp = tokio::net::TcpStream::connect(h.addr()).await.unwrap();
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    let conn = tokio::spawn(conn);
    let uri = format!("http://{}/v1/chat/completions", h.addr());
    let mut streams = Vec::new();
    for _ in 0..STREAMS {
        let mut sender = sender.clone();
        let uri = uri.clone();
        streams.push(tokio::spawn(async move {
            sender.ready().await.unwrap();
            let req = http::Request::post(uri)
                .body(Full::new(Bytes::from_static(b"{\"stream\":true}")))
                .unwrap();
            let response = sender.send_request(req).await.unwrap();
            let status = response.status();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (status, body)
        }));
    }
    let started = Instant::now();
    for stream in streams {
        let (status, body) = stream.await.unwrap();
        assert_eq!(status, 200);
        assert_eq!(body, expected);
    }
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    drop(sender);
    conn.await.unwrap().unwrap();

    let m = scrape_until(&h.proxy, |m| {
        m.value("metronome_streams_total", &[CHAT]) == STREAMS as f64
    })
    .await;
    let n = STREAMS as f64;
    assert_eq!(
        m.value("metronome_streams_total", &[CHAT, ("outcome", "complete")]),
        n
    );
    for point in ["ingress", "egress"] {
        assert_eq!(
            m.value(
                "metronome_inter_token_latency_seconds_count",
                &[CHAT, ("point", point)]
            ),
            9.0 * n,
            "{point}"
        );
        assert_eq!(
            m.value(
                "metronome_time_to_first_token_seconds_count",
                &[CHAT, ("point", point)]
            ),
            n,
            "{point}"
        );
    }
    assert_eq!(
        m.value(
            "metronome_output_tokens_total",
            &[CHAT, ("source", "usage")]
        ),
        10.0 * n
    );
    assert_eq!(
        m.value("metronome_requests_total", &[CHAT, ("status_class", "2xx")]),
        n
    );
    assert_eq!(upstream.stats.requests.load(Ordering::SeqCst), STREAMS);
    assert_eq!(upstream.stats.completed.load(Ordering::SeqCst), STREAMS);
    h.finish().await;
}

#[tokio::test]
async fn per_core_workers_reuse_their_pooled_upstream_connections() {
    // `per_core` with two workers: each serves the client connections it accepts, with upstream
    // connections from a pool of its own (a connection is registered with the event loop of the
    // worker that opened it). Streams one after another, each on a client connection of its own,
    // whichever worker takes it: one upstream connection per worker at most, however many
    // streams, and each waits in its pool afterwards. A worker that did not reuse its pool's
    // connection (or never checked one in) would open one per stream it served. What this cannot
    // tell is a pool per worker from one pool shared by both (at most two either way): which
    // worker accepts a connection is the kernel's choice, and nothing outside says which did.
    const STREAMS: usize = 12;
    let upstream = Upstream::openai_chat().tokens(3).start().await;
    let proxy = proxy_with(upstream.addr, |c| {
        c.server.threading = metronome::config::Threading::PerCore;
        c.server.workers = std::num::NonZeroUsize::new(2);
        // No background readiness check: its connections would count too.
        c.readiness.check_upstream = false;
    })
    .await;
    for done in 1..=STREAMS {
        let got = stream_chat(proxy.proxy_addr).await;
        assert!(got.error.is_none(), "stream {done}: {:?}", got.error);
        // Recorded: its upstream connection is back in its worker's pool.
        scrape_until(&proxy, |m| {
            m.get("metronome_streams_total", &[("outcome", "complete")]) == Some(done as f64)
        })
        .await;
    }
    assert_eq!(upstream.stats.requests.load(Ordering::SeqCst), STREAMS);
    let accepted = upstream.stats.connections_accepted.load(Ordering::SeqCst);
    assert!(
        (1..=2).contains(&accepted),
        "{accepted} upstream connections for {STREAMS} streams one after another on 2 workers"
    );
    assert_eq!(
        upstream.stats.connections_open.load(Ordering::SeqCst),
        accepted,
        "every upstream connection waits in its worker's pool"
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn idle_upstream_connections_are_reused_within_upstream_idle_and_closed_after_it() {
    // An upstream that keeps idle connections open for ever (the scripted one has no timeout):
    // the proxy's pool reuses its idle connection for the next request, and closes it once it has
    // been idle for `timeouts.upstream_idle`, before an upstream with a keep-alive timeout of its
    // own (uvicorn: 5 s) would close it under a request.
    let upstream = Upstream::openai_chat().tokens(3).start().await;
    // One worker: every worker has a pool of its own, and the two streams' client connections
    // could otherwise be accepted by two workers.
    let proxy = proxy_with(upstream.addr, |c| {
        c.timeouts.upstream_idle = Duration::from_millis(1500);
        c.server.workers = std::num::NonZeroUsize::new(1);
    })
    .await;
    for _ in 0..2 {
        let got = stream_chat(proxy.proxy_addr).await;
        assert!(got.error.is_none());
    }
    scrape_until(&proxy, |m| {
        m.get("metronome_streams_total", &[("outcome", "complete")]) == Some(2.0)
    })
    .await;
    assert_eq!(
        upstream.stats.connections_open.load(Ordering::SeqCst),
        1,
        "the second stream reused the first one's connection, which waits in the pool"
    );
    let idle_since = Instant::now();
    wait_until(
        Duration::from_secs(10),
        "the idle upstream connection was never closed",
        || upstream.stats.connections_open.load(Ordering::SeqCst) == 0,
    )
    .await;
    assert!(
        idle_since.elapsed() >= Duration::from_millis(500),
        "closed after {:?}, before upstream_idle",
        idle_since.elapsed()
    );
    proxy.shutdown().await;
}
