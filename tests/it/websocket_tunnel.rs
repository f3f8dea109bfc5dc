//! WebSocket tunnels through the proxy: bytes both ways exactly as sent, the 101's fields, the
//! close both ways when an end goes, the idle timeout and the drain, the connection limit, the
//! refusals, and the streams metered inside (Responses API's WebSocket mode and Realtime API)
//! against the sim, with counts exact and TTFT checked against the client's own figure.
//!
//! Every check runs on both HTTP/1.1 servers (`server.http1_server`).

use crate::support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use metronome::config::ServerKind;
use metronome::probe::{measure, ProbeConfig, RealtimeAsk, Stop, WsProtocol, WsSettings};
use metronome::proxy::ProxyHandle;
use metronome::sim::{ResponsesReasoning, SimConfig, WebSocketConfig};
use metronome::websocket::encode::{write_frame, Deflater, FrameSpec};
use metronome::websocket::{read_all, Collected, DeflateParams, Direction, Limits, Opcode};
use sha1::{Digest, Sha1};
use support::{ms, proxy_on, proxy_with, scrape_until, sim_with};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";
const MASK: [u8; 4] = [0x12, 0x34, 0x56, 0x78];

/// What a raw upstream saw on one connection.
#[derive(Debug)]
struct Seen {
    head: String,
    received: Vec<u8>,
    /// When its client's side ended (EOF, or the expected bytes all read).
    ended: Instant,
}

/// A WebSocket server by hand: the handshake (accept computed, `extra` fields added to the 101),
/// then `send` written while it reads until it has `expect` bytes (then closes) or EOF.
struct RawUpstream {
    addr: SocketAddr,
    seen: mpsc::UnboundedReceiver<Seen>,
}

impl RawUpstream {
    async fn start(extra: &'static str, send: Vec<u8>, expect: Option<usize>) -> RawUpstream {
        RawUpstream::start_after(0, extra, send, expect).await
    }

    /// As `start`, but `send` is written only once `hold` bytes came from the client.
    async fn start_after(
        hold: usize,
        extra: &'static str,
        send: Vec<u8>,
        expect: Option<usize>,
    ) -> RawUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, seen) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                let (tx, send) = (tx.clone(), send.clone());
                tokio::spawn(async move {
                    let _ = tx.send(serve_raw(tcp, extra, send, expect, hold).await);
                });
            }
        });
        RawUpstream { addr, seen }
    }
}

async fn serve_raw(
    mut tcp: TcpStream,
    extra: &str,
    send: Vec<u8>,
    expect: Option<usize>,
    hold: usize,
) -> Seen {
    let (head, mut received) = read_head(&mut tcp).await;
    let key = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("sec-websocket-key")
                .then(|| value.trim().to_string())
        })
        .unwrap_or_default();
    let answer = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Accept: {}\r\n{extra}\r\n",
        accept(&key)
    );
    tcp.write_all(answer.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    while received.len() < hold {
        match tcp.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => received.extend_from_slice(&buf[..n]),
        }
    }
    let (mut read, mut write) = tcp.into_split();
    let writer = tokio::spawn(async move {
        let _ = write.write_all(&send).await;
        write
    });
    while expect.is_none_or(|n| received.len() < n) {
        match read.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => received.extend_from_slice(&buf[..n]),
        }
    }
    let ended = Instant::now();
    let mut write = writer.await.unwrap();
    let _ = write.shutdown().await;
    Seen {
        head,
        received,
        ended,
    }
}

/// Reads a head up to its blank line; returns it and the bytes read past it.
async fn read_head(tcp: &mut TcpStream) -> (String, Vec<u8>) {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = bytes.split_off(end + 4);
            return (String::from_utf8(bytes).unwrap(), rest);
        }
        let n = tcp.read(&mut buf).await.unwrap();
        assert!(
            n > 0,
            "closed before the head's end: {:?}",
            String::from_utf8_lossy(&bytes)
        );
        bytes.extend_from_slice(&buf[..n]);
    }
}

fn accept(key: &str) -> String {
    let mut sha = Sha1::new();
    sha.update(key.as_bytes());
    sha.update(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    base64::engine::general_purpose::STANDARD.encode(sha.finalize())
}

/// Opens a WebSocket through the proxy by hand; returns the socket, the 101's head and the
/// bytes that came after it.
async fn connect(proxy: &ProxyHandle, path: &str, extra: &str) -> (TcpStream, String, Vec<u8>) {
    let mut tcp = TcpStream::connect(proxy.proxy_addr).await.unwrap();
    let head = format!(
        "GET {path} HTTP/1.1\r\nHost: upstream\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n"
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    let (head, rest) = read_head(&mut tcp).await;
    (tcp, head, rest)
}

fn frame(opcode: Opcode, fin: bool, rsv1: bool, mask: Option<[u8; 4]>, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let spec = FrameSpec {
        opcode,
        fin,
        rsv1,
        mask,
    };
    write_frame(&mut out, spec, payload);
    out
}

/// One side's script: a text, a 1 MiB binary message, a fragmented text with a ping between its
/// fragments, a compressed text, and a close with a code and reason.
fn script(mask: Option<[u8; 4]>, seed: u8, close: u16, reason: &str) -> Vec<u8> {
    let mut out = frame(Opcode::Text, true, false, mask, b"hello");
    let big: Vec<u8> = (0..1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 ^ seed)
        .collect();
    out.extend(frame(Opcode::Binary, true, false, mask, &big));
    out.extend(frame(Opcode::Text, false, false, mask, b"frag"));
    out.extend(frame(Opcode::Ping, true, false, mask, b"are you there"));
    out.extend(frame(Opcode::Continuation, false, false, mask, b"ment"));
    out.extend(frame(Opcode::Continuation, true, false, mask, b"ed"));
    let compressed = Deflater::new(true).compress(b"squeezed squeezed squeezed");
    out.extend(frame(Opcode::Text, true, true, mask, &compressed));
    let mut payload = close.to_be_bytes().to_vec();
    payload.extend_from_slice(reason.as_bytes());
    out.extend(frame(Opcode::Close, true, false, mask, &payload));
    out
}

/// Reads until EOF (or `limit`), with what was read before.
async fn read_to_end(tcp: &mut TcpStream, mut bytes: Vec<u8>, limit: Duration) -> Vec<u8> {
    let mut buf = vec![0u8; 64 * 1024];
    let reading = async {
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => bytes.extend_from_slice(&buf[..n]),
            }
        }
        bytes
    };
    tokio::time::timeout(limit, reading)
        .await
        .expect("the tunnel closed")
}

/// The tunnel counts of `route` and `outcome`, read from the proxy's state (also after a
/// shutdown, when no scrape can).
fn tunnels_ended(proxy: &metronome::proxy::ProxyState, outcome: &str) -> u64 {
    proxy
        .tunnel_metrics
        .connections
        .with_label_values(&["other", outcome])
        .get()
}

async fn bytes_pass_both_ways_untouched(server: ServerKind) {
    let from_server = script(None, 0x5a, 4001, "server done");
    let from_client = script(Some(MASK), 0xa5, 4000, "client done");
    let extensions =
        "Sec-WebSocket-Extensions: permessage-deflate\r\nSec-WebSocket-Protocol: chat\r\n";
    let mut upstream =
        RawUpstream::start(extensions, from_server.clone(), Some(from_client.len())).await;
    let proxy = proxy_on(server, upstream.addr, |_| {}).await;
    let offer = "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n\
                 Sec-WebSocket-Protocol: chat, superchat\r\n";
    let (tcp, head, rest) = connect(&proxy, "/socket", offer).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let lower = head.to_ascii_lowercase();
    for field in [
        "sec-websocket-extensions: permessage-deflate",
        "sec-websocket-protocol: chat",
        &format!("sec-websocket-accept: {}", accept(KEY)).to_ascii_lowercase(),
        "upgrade: websocket",
        "x-metronome-stream-id: ",
    ] {
        assert!(lower.contains(field), "{field} in {head}");
    }
    let (mut read, mut write) = tcp.into_split();
    let sent = from_client.clone();
    let writer = tokio::spawn(async move {
        // In pieces that cut headers and payloads anywhere.
        for piece in sent.chunks(7001) {
            write.write_all(piece).await.unwrap();
        }
        write
    });
    let mut got = rest;
    let mut buf = vec![0u8; 64 * 1024];
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match tokio::time::timeout_at(deadline.into(), read.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => panic!("no close from the tunnel"),
        }
    }
    let _write = writer.await.unwrap();
    assert!(
        got == from_server,
        "the client got {} of {} bytes, or others",
        got.len(),
        from_server.len()
    );
    let seen = upstream.seen.recv().await.unwrap();
    assert!(
        seen.received == from_client,
        "the upstream got {} of {} bytes, or others",
        seen.received.len(),
        from_client.len()
    );
    let upstream_head = seen.head.to_ascii_lowercase();
    for field in [
        "sec-websocket-key: dghlihnhbxbszsbub25jzq==",
        "sec-websocket-version: 13",
        "sec-websocket-extensions: permessage-deflate; client_max_window_bits",
        "sec-websocket-protocol: chat, superchat",
        "connection: upgrade",
        "upgrade: websocket",
    ] {
        assert!(upstream_head.contains(field), "{field} in {}", seen.head);
    }
    // The reader saw both closes: the closing handshake took place.
    let m = scrape_until(&proxy, |m| {
        m.value(
            "metronome_websocket_connections_total",
            &[("outcome", "completed")],
        ) == 1.0
    })
    .await;
    assert_eq!(m.value("metronome_websocket_connections_active", &[]), 0.0);
    // The frames as the reader saw them (a check of the script, and of the deflate offer).
    let params = DeflateParams::default();
    let events = read_all(
        Direction::ServerToClient,
        Some(params),
        Limits::default(),
        &got,
    )
    .events;
    assert!(events.contains(&Collected::Close(Some((4001, "server done".into())))));
}

/// `n` bytes of the upstream's or client's silence, then the tunnel's own close frame.
fn close_frame_of(bytes: &[u8], direction: Direction) -> Vec<Collected> {
    read_all(direction, None, Limits::default(), bytes).events
}

async fn an_idle_tunnel_is_closed_with_1001_both_ways(server: ServerKind) {
    let mut upstream = RawUpstream::start("", Vec::new(), None).await;
    let proxy = proxy_on(server, upstream.addr, |c| {
        c.timeouts.websocket_idle = ms(300);
    })
    .await;
    let began = Instant::now();
    let (mut tcp, head, rest) = connect(&proxy, "/socket", "").await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let got = read_to_end(&mut tcp, rest, Duration::from_secs(10)).await;
    assert!(
        began.elapsed() >= ms(300),
        "closed after {:?}",
        began.elapsed()
    );
    assert_eq!(
        close_frame_of(&got, Direction::ServerToClient),
        [Collected::Close(Some((1001, "idle".into())))]
    );
    let seen = upstream.seen.recv().await.unwrap();
    assert_eq!(
        close_frame_of(&seen.received, Direction::ClientToServer),
        [Collected::Close(Some((1001, "idle".into())))],
        "masked toward the upstream"
    );
    scrape_until(&proxy, |m| {
        m.value(
            "metronome_websocket_connections_total",
            &[("outcome", "idle_timeout")],
        ) == 1.0
    })
    .await;
}

async fn traffic_keeps_a_tunnel_from_its_idle_timeout(server: ServerKind) {
    let mut upstream = RawUpstream::start("", Vec::new(), Some(6 * 6)).await;
    let proxy = proxy_on(server, upstream.addr, |c| {
        c.timeouts.websocket_idle = ms(400);
    })
    .await;
    let (mut tcp, _, _) = connect(&proxy, "/socket", "").await;
    for _ in 0..6 {
        tokio::time::sleep(ms(150)).await;
        tcp.write_all(&frame(Opcode::Ping, true, false, Some(MASK), b""))
            .await
            .unwrap();
    }
    let seen = upstream.seen.recv().await.unwrap();
    assert_eq!(seen.received.len(), 36, "six pings, no close among them");
    assert_eq!(tunnels_ended(&proxy.state, "idle_timeout"), 0);
}

async fn shutdown_closes_tunnels_with_1001_after_the_grace(server: ServerKind) {
    let mut upstream = RawUpstream::start("", Vec::new(), None).await;
    let proxy = proxy_on(server, upstream.addr, |c| {
        c.server.drain_grace = ms(300);
    })
    .await;
    let state = proxy.state.clone();
    let (mut tcp, head, rest) = connect(&proxy, "/v1/responses", "").await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let began = Instant::now();
    let shutdown = tokio::spawn(proxy.shutdown());
    let got = read_to_end(&mut tcp, rest, Duration::from_secs(10)).await;
    assert!(
        began.elapsed() >= ms(250),
        "closed after {:?}",
        began.elapsed()
    );
    assert_eq!(
        close_frame_of(&got, Direction::ServerToClient),
        [Collected::Close(Some((1001, "going away".into())))]
    );
    let seen = upstream.seen.recv().await.unwrap();
    assert_eq!(
        close_frame_of(&seen.received, Direction::ClientToServer),
        [Collected::Close(Some((1001, "going away".into())))]
    );
    shutdown.await.unwrap();
    assert_eq!(tunnels_ended(&state, "drained"), 1);
}

async fn either_end_leaving_closes_the_other_at_once(server: ServerKind) {
    // The client goes: the upstream sees its close within a second.
    let mut upstream = RawUpstream::start("", Vec::new(), None).await;
    let proxy = proxy_on(server, upstream.addr, |_| {}).await;
    let (tcp, _, _) = connect(&proxy, "/socket", "").await;
    tokio::time::sleep(ms(50)).await;
    let left = Instant::now();
    drop(tcp);
    let seen = upstream.seen.recv().await.unwrap();
    assert!(seen.ended.duration_since(left) < Duration::from_secs(1));
    assert!(seen.received.is_empty());
    // The upstream goes (after its last words): the client gets them, then the close.
    let last_words = frame(Opcode::Text, true, false, None, b"bye");
    let upstream = RawUpstream::start("", last_words.clone(), Some(0)).await;
    let proxy2 = proxy_with(upstream.addr, |c| c.server.http1_server = server).await;
    let (mut tcp, _, rest) = connect(&proxy2, "/socket", "").await;
    let got = read_to_end(&mut tcp, rest, Duration::from_secs(5)).await;
    assert_eq!(got, last_words);
    scrape_until(&proxy, |m| {
        m.value(
            "metronome_websocket_connections_total",
            &[("outcome", "client_closed")],
        ) == 1.0
    })
    .await;
    scrape_until(&proxy2, |m| {
        m.value(
            "metronome_websocket_connections_total",
            &[("outcome", "upstream_closed")],
        ) == 1.0
    })
    .await;
}

async fn tunnels_count_against_the_connection_limit(server: ServerKind) {
    let upstream = RawUpstream::start("", Vec::new(), None).await;
    let proxy = proxy_on(server, upstream.addr, |c| c.limits.max_connections = 2).await;
    let (first, _, _) = connect(&proxy, "/socket", "").await;
    let (_second, _, _) = connect(&proxy, "/socket", "").await;
    tokio::time::sleep(ms(50)).await;
    let mut third = TcpStream::connect(proxy.proxy_addr).await.unwrap();
    let busy = read_to_end(&mut third, Vec::new(), Duration::from_secs(5)).await;
    assert!(
        busy.starts_with(b"HTTP/1.1 503"),
        "{}",
        String::from_utf8_lossy(&busy)
    );
    drop(first);
    // The first tunnel's place comes back once it has closed.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut tcp = TcpStream::connect(proxy.proxy_addr).await.unwrap();
        tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let got = read_to_end(&mut tcp, Vec::new(), Duration::from_secs(5)).await;
        if !got.starts_with(b"HTTP/1.1 503") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the tunnel's place never came back"
        );
        tokio::time::sleep(ms(20)).await;
    }
}

async fn a_malformed_upgrade_gets_400_and_reaches_no_upstream(server: ServerKind) {
    let mut upstream = RawUpstream::start("", Vec::new(), None).await;
    let proxy = proxy_on(server, upstream.addr, |_| {}).await;
    for (request, why) in [
        ("POST /socket HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade, close\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nContent-Length: 0\r\n\r\n", "GET"),
        ("GET /socket HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade, close\r\nSec-WebSocket-Version: 13\r\n\r\n", "Sec-WebSocket-Key"),
        ("GET /socket HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade, close\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 8\r\n\r\n", "Version: 13"),
    ] {
        let mut tcp = TcpStream::connect(proxy.proxy_addr).await.unwrap();
        tcp.write_all(request.as_bytes()).await.unwrap();
        let got = read_to_end(&mut tcp, Vec::new(), Duration::from_secs(5)).await;
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with("HTTP/1.1 400"), "{text}");
        assert!(text.contains("\"bad_upgrade\"") && text.contains(why), "{text}");
    }
    tokio::time::sleep(ms(50)).await;
    assert!(
        upstream.seen.try_recv().is_err(),
        "no upgrade reached the upstream"
    );
}

async fn an_upstream_that_does_not_switch_is_passed_through(server: ServerKind) {
    let upstream = support::Upstream::json(r#"{"error":"no websockets here"}"#)
        .status(426)
        .start()
        .await;
    let proxy = proxy_on(server, upstream.addr, |_| {}).await;
    let (_tcp, head, rest) = connect(&proxy, "/socket", "").await;
    assert!(head.starts_with("HTTP/1.1 426"), "{head}");
    let _ = rest;
    scrape_until(&proxy, |m| {
        m.value(
            "metronome_websocket_connections_total",
            &[("outcome", "upstream_refused")],
        ) == 1.0
    })
    .await;
}

/// The sim: `tokens` answer tokens, 3 reasoning tokens and one tool call of 2 argument tokens,
/// the first after 20 ms, then one every `gap`.
fn sim_config(tokens: u64, gap: Duration) -> SimConfig {
    SimConfig {
        gap,
        ttft: ms(20),
        tokens,
        reasoning_tokens: 3,
        responses_reasoning: ResponsesReasoning::Text,
        tool_calls: 1,
        tool_call_tokens: 2,
        websocket: WebSocketConfig::default(),
        ..SimConfig::default()
    }
}

fn probe_through(proxy: &ProxyHandle, path: &str, streams: u64, per_socket: u64) -> ProbeConfig {
    let url = format!("http://{}{path}", proxy.proxy_addr);
    let api_path = path.split('?').next().unwrap();
    let mut config = ProbeConfig::new(&url, "sim-model").unwrap();
    config.body = Bytes::from_static(
        br#"{"model":"sim-model","messages":[{"role":"user","content":"Hi there"}]}"#,
    );
    config.stop = Stop::Requests(streams);
    config.timeout = Duration::from_secs(30);
    config.websocket = Some(WsSettings {
        protocol: WsProtocol::from_path(api_path).unwrap(),
        per_socket,
        realtime: RealtimeAsk {
            audio: false,
            beta: false,
        },
    });
    config
}

/// `/streams`, newest first.
async fn streams(proxy: &ProxyHandle) -> Vec<serde_json::Value> {
    let got = support::request(proxy.admin_addr, "GET", "/streams", "", false).await;
    let list: serde_json::Value = serde_json::from_slice(&got.bytes()).unwrap();
    list["streams"].as_array().unwrap().clone()
}

async fn two_responses_on_one_socket_are_two_metered_streams(server: ServerKind) {
    let gap = ms(30);
    let sim = sim_with(sim_config(6, gap)).await;
    let proxy = proxy_on(server, sim.addr(), |_| {}).await;
    let run = measure(&probe_through(&proxy, "/v1/responses", 2, 2))
        .await
        .unwrap();
    assert_eq!(run.streams.len(), 2);
    for record in &run.streams {
        assert_eq!(record.error, None, "{:?}", record.error_body);
        assert_eq!(record.token_times.len(), 11);
    }
    let m = scrape_until(&proxy, |m| {
        m.value("metronome_streams_total", &[("outcome", "complete")]) == 2.0
    })
    .await;
    assert_eq!(
        m.value(
            "metronome_stream_format_total",
            &[("format", "responses_websocket")]
        ),
        2.0
    );
    for point in ["ingress", "egress"] {
        assert_eq!(
            m.value(
                "metronome_inter_token_latency_seconds_count",
                &[("point", point)]
            ),
            2.0 * 10.0,
            "ten gaps per stream at {point}"
        );
        assert_eq!(
            m.value(
                "metronome_time_to_first_token_seconds_count",
                &[("point", point)]
            ),
            2.0
        );
    }
    assert_eq!(
        m.value("metronome_output_tokens_total", &[("source", "usage")]),
        22.0
    );
    assert_eq!(
        m.value(
            "metronome_streams_total",
            &[("model", "sim-model"), ("outcome", "complete")]
        ),
        2.0,
        "the model that response.created names"
    );
    // Each stream's TTFT, at egress, within a frame's time of the client's own figure.
    let listed = streams(&proxy).await;
    assert_eq!(listed.len(), 2);
    let first_id = run.streams[0]
        .stream_id
        .clone()
        .expect("the 101's stream ID");
    assert_eq!(
        listed[1]["id"],
        first_id.as_str(),
        "the first stream has the 101's ID"
    );
    for (record, listed) in run.streams.iter().zip(listed.iter().rev()) {
        assert_eq!(listed["outcome"], "complete");
        assert_eq!(listed["token_events"], 11);
        let client = record.ttft().unwrap().as_secs_f64();
        let proxy_egress = listed["ttft_us"]["egress"].as_f64().unwrap() / 1e6;
        assert!(
            proxy_egress <= client + 0.005 && client - proxy_egress < gap.as_secs_f64(),
            "metronome's TTFT {proxy_egress} s against the client's {client} s"
        );
    }
    assert_eq!(sim.stats().snapshot().completed, 2);
}

async fn realtime_responses_are_metered_with_their_format(server: ServerKind) {
    let sim = sim_with(sim_config(5, ms(5))).await;
    let proxy = proxy_on(server, sim.addr(), |_| {}).await;
    let run = measure(&probe_through(&proxy, "/v1/realtime?model=rt-asked", 2, 2))
        .await
        .unwrap();
    for record in &run.streams {
        assert_eq!(record.error, None, "{:?}", record.error_body);
    }
    let token_events: usize = run.streams.iter().map(|r| r.token_times.len()).sum();
    let m = scrape_until(&proxy, |m| {
        m.value("metronome_stream_format_total", &[("format", "realtime")]) == 2.0
    })
    .await;
    assert_eq!(
        m.value("metronome_streams_total", &[("outcome", "complete")]),
        2.0
    );
    assert_eq!(
        m.value(
            "metronome_streams_total",
            &[("model", "rt-asked"), ("outcome", "complete")]
        ),
        2.0,
        "the model of the sim's session (the one the query asked for)"
    );
    assert_eq!(
        m.value(
            "metronome_inter_token_latency_seconds_count",
            &[("point", "egress")]
        ),
        (token_events - 2) as f64
    );
}

/// Server messages of a Realtime response the server began, text only: `response.created`,
/// one delta per word, `response.done`.
fn realtime_turn(words: &[&str]) -> Vec<u8> {
    let mut out = frame(
        Opcode::Text,
        true,
        false,
        None,
        br#"{"type":"response.created","response":{"id":"r"}}"#,
    );
    for word in words {
        let delta = format!(r#"{{"type":"response.output_text.delta","delta":"{word}"}}"#);
        out.extend(frame(Opcode::Text, true, false, None, delta.as_bytes()));
    }
    let done = br#"{"type":"response.done","response":{"status":"completed","usage":{"output_tokens":2}}}"#;
    out.extend(frame(Opcode::Text, true, false, None, done));
    out
}

/// A Realtime server message about the session, naming `model` (raw JSON text).
fn realtime_session(kind: &str, model: &str) -> Vec<u8> {
    let event = format!(r#"{{"event_id":"e","type":"{kind}","session":{{"model":{model}}}}}"#);
    frame(Opcode::Text, true, false, None, event.as_bytes())
}

/// The completed streams one socket to `path` made on a proxy in front of `upstream`, as
/// `model=count` for each `model` label in `models` (checked to be all of them): the client
/// first sends `send`.
async fn streams_by_model(
    upstream: RawUpstream,
    path: &str,
    send: &[u8],
    models: &[&str],
) -> Vec<String> {
    let proxy = proxy_on(ServerKind::Native, upstream.addr, |_| {}).await;
    let (mut tcp, head, _) = connect(&proxy, path, "").await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    tcp.write_all(send).await.unwrap();
    let streams = models.len() as f64;
    let m = scrape_until(&proxy, |m| {
        m.value("metronome_streams_total", &[("outcome", "complete")]) == streams
    })
    .await;
    drop(tcp);
    let counted = |model| {
        let value = m.value("metronome_streams_total", &[("model", model)]);
        format!("{model}={value}")
    };
    let found = models.iter().map(|model| counted(model)).collect();
    proxy.shutdown().await;
    found
}

/// A Realtime stream takes the model of the session it runs in: `session.model` of the last
/// `session.created` or `session.updated` before it, else the upgrade's `?model=`; a name
/// the `model` label cannot show is `other`, as on SSE.
#[tokio::test]
async fn realtime_streams_take_the_model_of_their_session_or_query() {
    let mut script = realtime_session("session.created", r#""rt-session""#);
    script.extend(realtime_turn(&["Hi", " there"]));
    script.extend(realtime_session("session.updated", r#""rt-updated""#));
    script.extend(realtime_turn(&["Hello"]));
    script.extend(realtime_session("session.updated", "\"rt\u{200B}zw\""));
    script.extend(realtime_turn(&["Hey"]));
    let upstream = RawUpstream::start("", script, None).await;
    let path = "/v1/realtime?model=rt-query";
    let models = ["rt-session", "rt-updated", "other"];
    let found = streams_by_model(upstream, path, b"", &models).await;
    assert_eq!(found, ["rt-session=1", "rt-updated=1", "other=1"]);

    // A session whose model is written with escapes names none: the query's.
    let mut script = realtime_session("session.created", r#""rt\u002dsession""#);
    script.extend(realtime_turn(&["Hi"]));
    let upstream = RawUpstream::start("", script, None).await;
    let found = streams_by_model(upstream, path, b"", &["rt-query"]).await;
    assert_eq!(found, ["rt-query=1"]);

    // Neither (a query with escapes goes unnamed too): `unknown`, as before.
    let upstream = RawUpstream::start("", realtime_turn(&["Hi"]), None).await;
    let path = "/v1/realtime?model=rt%2Dquery";
    let found = streams_by_model(upstream, path, b"", &["unknown"]).await;
    assert_eq!(found, ["unknown=1"]);
}

/// A Responses stream takes the model its `response.created` names; when it names none, the
/// one its `response.create` named (top-level `model`, or `response.model`).
#[tokio::test]
async fn responses_streams_take_the_model_of_their_response_or_request() {
    let answer = |model: &str| {
        let created = format!(
            r#"{{"type":"response.created","response":{{"id":"r","status":"in_progress"{model}}}}}"#
        );
        let mut out = frame(Opcode::Text, true, false, None, created.as_bytes());
        let delta = br#"{"type":"response.output_text.delta","delta":"Hi"}"#;
        out.extend(frame(Opcode::Text, true, false, None, delta));
        let done = br#"{"type":"response.completed","response":{"id":"r","status":"completed","usage":{"output_tokens":1}}}"#;
        out.extend(frame(Opcode::Text, true, false, None, done));
        out
    };
    let asked = br#"{"type":"response.create","model":"asked-model","input":"Hi"}"#;
    let cases: [(&str, &[u8], &str); 4] = [
        (r#","model":"served-model""#, asked, "served-model"),
        ("", asked, "asked-model"),
        (
            "",
            br#"{"type":"response.create","response":{"model":"nested-model"}}"#,
            "nested-model",
        ),
        ("", br#"{"type":"response.create","input":"Hi"}"#, "unknown"),
    ];
    for (served, create, model) in cases {
        let send = frame(Opcode::Text, true, false, Some(MASK), create);
        let upstream = RawUpstream::start_after(send.len(), "", answer(served), None).await;
        let found = streams_by_model(upstream, "/v1/responses", &send, &[model]).await;
        assert_eq!(found, [format!("{model}=1")], "{served}");
    }
}

async fn a_client_leaving_mid_response_cancels_it_and_closes_the_upstream(server: ServerKind) {
    let sim = sim_with(sim_config(200, ms(20))).await;
    let proxy = proxy_on(server, sim.addr(), |_| {}).await;
    let (mut tcp, head, _) = connect(&proxy, "/v1/responses", "").await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let create = br#"{"type":"response.create","model":"sim-model","input":"Hi there"}"#;
    tcp.write_all(&frame(Opcode::Text, true, false, Some(MASK), create))
        .await
        .unwrap();
    tokio::time::sleep(ms(300)).await;
    let left = Instant::now();
    drop(tcp);
    let stats = sim.stats().clone();
    support::wait_until(
        Duration::from_secs(1),
        "the sim saw the close within 1 s",
        || stats.snapshot().cancelled == 1,
    )
    .await;
    assert!(left.elapsed() < Duration::from_secs(1));
    let m = scrape_until(&proxy, |m| {
        m.value(
            "metronome_streams_total",
            &[("outcome", "client_cancelled")],
        ) == 1.0
    })
    .await;
    assert_eq!(m.value("metronome_streams_active", &[]), 0.0);
}

async fn a_socket_on_another_path_is_a_connection_only(server: ServerKind) {
    let chatter = frame(
        Opcode::Text,
        true,
        false,
        None,
        br#"{"type":"response.output_text.delta","delta":"Hi"}"#,
    );
    let upstream = RawUpstream::start("", chatter.clone(), Some(0)).await;
    let proxy = proxy_on(server, upstream.addr, |_| {}).await;
    let (mut tcp, _, rest) = connect(&proxy, "/socket", "").await;
    assert_eq!(
        read_to_end(&mut tcp, rest, Duration::from_secs(5)).await,
        chatter
    );
    let m = scrape_until(&proxy, |m| {
        m.value("metronome_websocket_connections_total", &[]) == 1.0
    })
    .await;
    assert_eq!(m.get("metronome_streams_total", &[]), None);
}

/// Shared set-up for the test modules below: each check on each server.
macro_rules! on_both_servers {
    ($($check:ident),* $(,)?) => {
        mod native_server {
            $(
                #[tokio::test]
                async fn $check() {
                    super::$check(super::ServerKind::Native).await;
                }
            )*
        }

        mod hyper_server {
            $(
                #[tokio::test]
                async fn $check() {
                    super::$check(super::ServerKind::Hyper).await;
                }
            )*
        }
    };
}

on_both_servers!(
    bytes_pass_both_ways_untouched,
    an_idle_tunnel_is_closed_with_1001_both_ways,
    traffic_keeps_a_tunnel_from_its_idle_timeout,
    shutdown_closes_tunnels_with_1001_after_the_grace,
    either_end_leaving_closes_the_other_at_once,
    tunnels_count_against_the_connection_limit,
    a_malformed_upgrade_gets_400_and_reaches_no_upstream,
    an_upstream_that_does_not_switch_is_passed_through,
    two_responses_on_one_socket_are_two_metered_streams,
    realtime_responses_are_metered_with_their_format,
    a_client_leaving_mid_response_cancels_it_and_closes_the_upstream,
    a_socket_on_another_path_is_a_connection_only,
);

/// RFC 8441: an HTTP/2 client's extended CONNECT becomes an HTTP/1.1 upgrade upstream, its
/// `200` carries the upstream's subprotocol, and the stream carries the frames both ways.
#[tokio::test]
async fn an_http2_extended_connect_becomes_an_http11_upgrade_upstream() {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let from_server = frame(Opcode::Text, true, false, None, b"hi over h2");
    let mut from_client = frame(Opcode::Text, true, false, Some(MASK), b"hello");
    from_client.extend(frame(Opcode::Close, true, false, Some(MASK), &[0x03, 0xe8]));
    let mut upstream = RawUpstream::start(
        "Sec-WebSocket-Protocol: chat\r\n",
        from_server.clone(),
        Some(from_client.len()),
    )
    .await;
    let proxy = proxy_on(ServerKind::Native, upstream.addr, |_| {}).await;
    let tcp = TcpStream::connect(proxy.proxy_addr).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    // The server's SETTINGS (with ENABLE_CONNECT_PROTOCOL) must be in before the CONNECT.
    tokio::time::sleep(ms(100)).await;
    let mut request = http::Request::builder()
        .method("CONNECT")
        .uri(format!("http://{}/v1/responses", proxy.proxy_addr))
        .header("sec-websocket-version", "13")
        .header("sec-websocket-protocol", "chat")
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    request
        .extensions_mut()
        .insert(hyper::ext::Protocol::from_static("websocket"));
    let mut response = send.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["sec-websocket-protocol"], "chat");
    assert!(response.headers().contains_key("x-metronome-stream-id"));
    let upgraded = hyper::upgrade::on(&mut response).await.unwrap();
    let mut io = TokioIo::new(upgraded);
    io.write_all(&from_client).await.unwrap();
    let mut got = Vec::new();
    let reading = io.read_to_end(&mut got);
    let _ = tokio::time::timeout(Duration::from_secs(5), reading).await;
    assert_eq!(got, from_server);
    let seen = upstream.seen.recv().await.unwrap();
    assert_eq!(seen.received, from_client);
    let head = seen.head.to_ascii_lowercase();
    assert!(head.starts_with("get /v1/responses http/1.1"), "{head}");
    for field in [
        "upgrade: websocket",
        "connection: upgrade",
        "sec-websocket-version: 13",
        "sec-websocket-key: ",
        "sec-websocket-protocol: chat",
    ] {
        assert!(head.contains(field), "{field} in {head}");
    }
}
