//! The sim's WebSocket endpoints (the Responses API's WebSocket mode, the Realtime API) driven
//! over loopback by `metronome probe --websocket` and by a raw client that reads the frames'
//! own bits. Counts are exact: token events by phase, messages per response, the sim's served
//! counters; times only bound how long a cancelled generation may go on.

use crate::support;

use std::time::Duration;

use bytes::Bytes;
use metronome::probe::{
    measure, summarize, Phase, ProbeConfig, RealtimeAsk, Stop, WsProtocol, WsSettings,
};
use metronome::sim::{CloseSpec, ResponsesReasoning, SimConfig, SimHandle, WebSocketConfig};
use support::{ms, sim_with, wait_until};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A quick sim: `tokens` answer tokens every 2 ms after 5 ms, with the reasoning and tool calls
/// given, and the WebSocket settings given.
fn sim(tokens: u64, reasoning: u64, tool_calls: u64, websocket: WebSocketConfig) -> SimConfig {
    SimConfig {
        gap: ms(2),
        ttft: ms(5),
        tokens,
        reasoning_tokens: reasoning,
        responses_reasoning: ResponsesReasoning::Text,
        tool_calls,
        tool_call_tokens: 2,
        websocket,
        ..SimConfig::default()
    }
}

/// A closed-loop probe of `path` on `sim` over a WebSocket: `streams` responses, `per_socket`
/// on each socket, a request without a token limit (so the sim's own length holds).
fn probe(sim: &SimHandle, path: &str, streams: u64, per_socket: u64, audio: bool) -> ProbeConfig {
    let mut config = ProbeConfig::new(&format!("{}{path}", sim.url()), "sim-model").unwrap();
    config.body = Bytes::from_static(
        br#"{"model":"sim-model","messages":[{"role":"user","content":"Hi there"}]}"#,
    );
    config.stop = Stop::Requests(streams);
    config.timeout = Duration::from_secs(30);
    config.websocket = Some(WsSettings {
        protocol: WsProtocol::from_path(path).unwrap(),
        per_socket,
        realtime: RealtimeAsk { audio, beta: false },
    });
    config
}

/// The phases of a record's token events, run-length encoded.
fn runs(phases: &[Phase]) -> Vec<(Phase, usize)> {
    let mut runs: Vec<(Phase, usize)> = Vec::new();
    for phase in phases {
        match runs.last_mut() {
            Some((last, n)) if last == phase => *n += 1,
            _ => runs.push((*phase, 1)),
        }
    }
    runs
}

/// Messages of one Responses-mode response of `r` reasoning, `c` answer and one tool call of 2
/// argument tokens, steps of one token: created and in_progress; the reasoning item (2 opening
/// events, `r` deltas, 3 closing); the message item (2, `c`, 3); the call (1, 2, 2); completed.
fn responses_messages(r: u64, c: u64) -> u64 {
    2 + (2 + r + 3) + (2 + c + 3) + (1 + 2 + 2) + 1
}

#[tokio::test]
async fn two_responses_on_one_socket_are_two_streams_with_exact_counts() {
    let framings = [
        WebSocketConfig::default(),
        WebSocketConfig {
            deflate: false,
            ..WebSocketConfig::default()
        },
        WebSocketConfig {
            fragment: Some(100),
            ..WebSocketConfig::default()
        },
    ];
    for framing in framings {
        let sim = sim_with(sim(6, 3, 1, framing.clone())).await;
        let run = measure(&probe(&sim, "/v1/responses", 2, 2, false))
            .await
            .unwrap();
        assert_eq!(run.streams.len(), 2);
        for record in &run.streams {
            assert_eq!(record.error, None, "{:?} {framing:?}", record.error_body);
            assert_eq!(record.status, Some(101));
            assert_eq!(
                runs(&record.token_phases),
                [
                    (Phase::Reasoning, 3),
                    (Phase::Content, 6),
                    (Phase::ToolCall, 2)
                ]
            );
            assert_eq!(record.token_times.len(), 11);
            assert_eq!(record.usage_tokens, Some(11));
            assert_eq!(record.frames, responses_messages(3, 6));
            assert!(record.ttft().unwrap() < Duration::from_secs(5));
        }
        let stats = sim.stats().snapshot();
        assert_eq!((stats.started, stats.completed, stats.cancelled), (2, 2, 0));
        assert_eq!(
            (
                stats.reasoning_events,
                stats.content_events,
                stats.tool_call_events
            ),
            (6, 12, 4)
        );
        let report = summarize(&run, ms(200));
        assert_eq!(report.errors, 0);
        let phases = report.phases.unwrap();
        assert_eq!(phases["reasoning"].token_events, 6);
        assert_eq!(phases["content"].token_events, 12);
        assert_eq!(phases["tool_call"].token_events, 4);
        assert_eq!(report.detail.gaps, 2 * 10);
    }
}

#[tokio::test]
async fn realtime_responses_speak_or_write_with_exact_counts() {
    let sim = sim_with(sim(5, 0, 1, WebSocketConfig::default())).await;
    for (audio, per_response) in [(true, 5 * 2 + 2), (false, 5 + 2)] {
        let run = measure(&probe(&sim, "/v1/realtime", 2, 1, audio))
            .await
            .unwrap();
        for record in &run.streams {
            assert_eq!(record.error, None, "{:?}", record.error_body);
            assert_eq!(record.token_times.len(), per_response, "audio {audio}");
            assert_eq!(
                runs(&record.token_phases),
                [(Phase::Content, per_response - 2), (Phase::ToolCall, 2)]
            );
            assert_eq!(
                record.usage_tokens,
                Some(7),
                "tokens from response.done's usage"
            );
            // The conversation item's added and done, then the response: created, the
            // message item (3 opening, its deltas, 4 or 5 closing), the call (2, 2, 3), done.
            let closing = if audio { 5 } else { 4 };
            let expected = 2 + 1 + 3 + (per_response - 2) + closing + (2 + 2 + 3) + 1;
            assert_eq!(record.frames, expected as u64, "audio {audio}");
        }
    }
    let stats = sim.stats().snapshot();
    assert_eq!((stats.started, stats.completed), (4, 4));
    assert_eq!(stats.content_events, 2 * 10 + 2 * 5);
}

#[tokio::test]
async fn a_server_that_closes_after_each_response_gets_a_new_socket_and_no_error() {
    let close = WebSocketConfig {
        close: Some(CloseSpec::parse("4000:one is enough").unwrap()),
        ..WebSocketConfig::default()
    };
    let sim = sim_with(sim(4, 0, 0, close)).await;
    let run = measure(&probe(&sim, "/v1/responses", 3, 3, false))
        .await
        .unwrap();
    for record in &run.streams {
        assert_eq!(record.error, None, "{:?}", record.error_body);
        assert_eq!(record.token_times.len(), 4);
    }
    assert_eq!(sim.stats().snapshot().completed, 3);
}

/// A WebSocket client of its own: the handshake by hand and frames read bit by bit, so the
/// test sees compression (RSV1), fragmentation (FIN) and close frames as they are on the wire.
struct RawClient {
    tcp: TcpStream,
    buf: Vec<u8>,
    /// The 101's head.
    head: String,
}

/// One frame as it is on the wire.
#[derive(Debug)]
struct RawFrame {
    fin: bool,
    rsv1: bool,
    opcode: u8,
    payload: Vec<u8>,
}

impl RawClient {
    async fn connect(sim: &SimHandle, path: &str, extensions: Option<&str>) -> RawClient {
        let mut tcp = TcpStream::connect(sim.addr()).await.unwrap();
        let offer = extensions
            .map(|e| format!("Sec-WebSocket-Extensions: {e}\r\n"))
            .unwrap_or_default();
        let head = format!(
            "GET {path} HTTP/1.1\r\nHost: sim\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{offer}\r\n"
        );
        tcp.write_all(head.as_bytes()).await.unwrap();
        let mut client = RawClient {
            tcp,
            buf: Vec::new(),
            head: String::new(),
        };
        let end = loop {
            if let Some(at) = client.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            client.fill().await;
        };
        client.head = String::from_utf8(client.buf.drain(..end).collect()).unwrap();
        assert!(client.head.starts_with("HTTP/1.1 101"), "{}", client.head);
        client
    }

    async fn fill(&mut self) {
        let mut chunk = [0u8; 16 * 1024];
        let n = tokio::time::timeout(Duration::from_secs(10), self.tcp.read(&mut chunk))
            .await
            .expect("the sim said nothing for 10 s")
            .unwrap();
        assert!(n > 0, "the sim closed the connection");
        self.buf.extend_from_slice(&chunk[..n]);
    }

    /// Sends a masked text frame.
    async fn send_text(&mut self, text: &str) {
        let mask = [1u8, 2, 3, 4];
        let mut frame = vec![0x81];
        let len = text.len();
        if len < 126 {
            frame.push(0x80 | len as u8);
        } else {
            frame.push(0x80 | 126);
            frame.extend_from_slice(&(len as u16).to_be_bytes());
        }
        frame.extend_from_slice(&mask);
        frame.extend(text.bytes().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.tcp.write_all(&frame).await.unwrap();
    }

    async fn frame(&mut self) -> RawFrame {
        loop {
            if let Some((frame, used)) = parse_frame(&self.buf) {
                self.buf.drain(..used);
                return frame;
            }
            self.fill().await;
        }
    }
}

/// A server frame (unmasked) at the start of `buf`, and its length.
fn parse_frame(buf: &[u8]) -> Option<(RawFrame, usize)> {
    let (&b0, &b1) = (buf.first()?, buf.get(1)?);
    let (len, mut at) = match b1 & 0x7f {
        126 => (u16::from_be_bytes([*buf.get(2)?, *buf.get(3)?]) as usize, 4),
        127 => (
            u64::from_be_bytes(buf.get(2..10)?.try_into().ok()?) as usize,
            10,
        ),
        n => (n as usize, 2),
    };
    assert_eq!(b1 & 0x80, 0, "a server frame is never masked");
    let payload = buf.get(at..at + len)?.to_vec();
    at += len;
    let frame = RawFrame {
        fin: b0 & 0x80 != 0,
        rsv1: b0 & 0x40 != 0,
        opcode: b0 & 0x0f,
        payload,
    };
    Some((frame, at))
}

/// Reads frames up to the first one that carries `needle` (a data frame) or a close.
async fn frames_until(client: &mut RawClient, needle: &[u8]) -> Vec<RawFrame> {
    let mut frames = Vec::new();
    loop {
        let frame = client.frame().await;
        let done = frame.opcode == 8 || frame.payload.windows(needle.len()).any(|w| w == needle);
        frames.push(frame);
        if done {
            return frames;
        }
    }
}

const CREATE: &str = r#"{"type":"response.create","model":"m","input":"hi"}"#;

#[tokio::test]
async fn deflate_is_negotiated_when_allowed_and_never_when_denied() {
    for deflate in [true, false] {
        let config = WebSocketConfig {
            deflate,
            ..WebSocketConfig::default()
        };
        let sim = sim_with(sim(3, 0, 0, config)).await;
        let offer = "permessage-deflate; client_max_window_bits";
        let mut client = RawClient::connect(&sim, "/v1/responses", Some(offer)).await;
        let negotiated = client
            .head
            .to_ascii_lowercase()
            .contains("sec-websocket-extensions: permessage-deflate");
        assert_eq!(negotiated, deflate, "{}", client.head);
        client.send_text(CREATE).await;
        // Compressed messages are not readable; the last one is the response's end.
        let mut frames = Vec::new();
        while frames.len() < 11 {
            frames.push(client.frame().await);
        }
        assert!(frames.iter().all(|f| f.opcode == 1 && f.fin));
        assert!(
            frames.iter().all(|f| f.rsv1 == deflate),
            "deflate {deflate}"
        );
        if !deflate {
            assert!(frames[10]
                .payload
                .starts_with(br#"{"type":"response.completed""#));
        }
    }
}

#[tokio::test]
async fn large_messages_are_fragmented_and_a_chosen_close_ends_the_socket() {
    let config = WebSocketConfig {
        deflate: false,
        fragment: Some(64),
        close: Some(CloseSpec::parse("4001:done here").unwrap()),
        ..WebSocketConfig::default()
    };
    let sim = sim_with(sim(3, 0, 0, config)).await;
    let mut client = RawClient::connect(&sim, "/v1/responses", None).await;
    client.send_text(CREATE).await;
    let frames = frames_until(&mut client, b"done here").await;
    let close = frames.last().unwrap();
    assert_eq!(close.opcode, 8);
    assert_eq!(&close.payload[..2], 4001u16.to_be_bytes());
    assert_eq!(&close.payload[2..], b"done here");
    // Every message longer than 64 bytes came as a text frame without FIN, continuations, and
    // a last continuation with FIN; reassembled, they are the 11 messages of the response.
    let data: Vec<&RawFrame> = frames.iter().filter(|f| f.opcode != 8).collect();
    assert!(data.iter().all(|f| f.payload.len() <= 64));
    let mut messages: Vec<Vec<u8>> = Vec::new();
    for frame in &data {
        match frame.opcode {
            1 => messages.push(frame.payload.clone()),
            0 => messages
                .last_mut()
                .unwrap()
                .extend_from_slice(&frame.payload),
            other => panic!("opcode {other}"),
        }
    }
    assert_eq!(messages.len(), 11);
    assert!(data.iter().any(|f| !f.fin), "some message was fragmented");
    let last: serde_json::Value = serde_json::from_slice(messages.last().unwrap()).unwrap();
    assert_eq!(last["type"], "response.completed");
}

#[tokio::test]
async fn a_client_that_leaves_mid_response_stops_generation_within_a_second() {
    let slow = SimConfig {
        gap: ms(20),
        ..sim(500, 0, 0, WebSocketConfig::default())
    };
    for polite in [true, false] {
        let sim = sim_with(slow.clone()).await;
        let mut client = RawClient::connect(&sim, "/v1/realtime", None).await;
        frames_until(&mut client, b"session.created").await;
        client
            .send_text(r#"{"type":"response.create","response":{"output_modalities":["text"]}}"#)
            .await;
        frames_until(&mut client, b"response.output_text.delta").await;
        assert_eq!(sim.stats().active(), 1);
        if polite {
            // A close frame (masked, code 1000).
            let mask = [9u8, 9, 9, 9];
            let code = 1000u16.to_be_bytes();
            let frame = [0x88, 0x82, 9, 9, 9, 9, code[0] ^ mask[0], code[1] ^ mask[1]];
            client.tcp.write_all(&frame).await.unwrap();
        }
        drop(client);
        let stats = sim.stats().clone();
        wait_until(Duration::from_secs(1), "generation goes on", || {
            stats.active() == 0
        })
        .await;
        let snapshot = sim.stats().snapshot();
        assert_eq!(
            (snapshot.cancelled, snapshot.completed),
            (1, 0),
            "polite {polite}"
        );
        assert!(snapshot.content_events < 500);
    }
}

#[tokio::test]
async fn realtime_refuses_a_second_response_and_cancels_the_running_one() {
    let slow = SimConfig {
        gap: ms(20),
        ..sim(500, 0, 0, WebSocketConfig::default())
    };
    let sim = sim_with(slow).await;
    let mut client = RawClient::connect(&sim, "/v1/realtime", None).await;
    frames_until(&mut client, b"session.created").await;
    let create = r#"{"type":"response.create","response":{"output_modalities":["text"]}}"#;
    client.send_text(create).await;
    frames_until(&mut client, b"response.output_text.delta").await;
    client.send_text(create).await;
    frames_until(&mut client, b"conversation_already_has_active_response").await;
    client.send_text(r#"{"type":"response.cancel"}"#).await;
    let frames = frames_until(&mut client, b"\"cancelled\"").await;
    let done: serde_json::Value = serde_json::from_slice(&frames.last().unwrap().payload).unwrap();
    assert_eq!(done["type"], "response.done");
    assert_eq!(
        done["response"]["status_details"]["reason"],
        "client_cancelled"
    );
    let stats = sim.stats().snapshot();
    assert_eq!((stats.started, stats.cancelled, stats.active), (1, 1, 0));
}

#[tokio::test]
async fn a_responses_create_during_a_response_waits_its_turn() {
    let sim = sim_with(sim(3, 0, 0, WebSocketConfig::default())).await;
    let mut client = RawClient::connect(&sim, "/v1/responses", None).await;
    client.send_text(CREATE).await;
    client.send_text(CREATE).await;
    let first = frames_until(&mut client, b"response.completed").await;
    let second = frames_until(&mut client, b"response.completed").await;
    assert_eq!((first.len(), second.len()), (11, 11));
    assert!(second[0]
        .payload
        .starts_with(br#"{"type":"response.created""#));
    assert_eq!(sim.stats().snapshot().completed, 2);
}

#[tokio::test]
async fn a_plain_get_on_a_websocket_endpoint_is_told_to_upgrade() {
    let sim = sim_with(SimConfig::default()).await;
    let mut tcp = TcpStream::connect(sim.addr()).await.unwrap();
    tcp.write_all(b"GET /v1/realtime HTTP/1.1\r\nHost: sim\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    tcp.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 426"), "{answer}");
    assert!(answer.contains("websocket_upgrade_required"), "{answer}");
}

#[tokio::test]
async fn pings_both_ways() {
    let config = WebSocketConfig {
        deflate: false,
        ping: Some(ms(20)),
        ..WebSocketConfig::default()
    };
    let sim = sim_with(sim(3, 0, 0, config)).await;
    let mut client = RawClient::connect(&sim, "/v1/responses", None).await;
    let ping = loop {
        let frame = client.frame().await;
        if frame.opcode == 9 {
            break frame;
        }
    };
    assert_eq!(ping.payload, b"sim");
    // A masked ping of ours, "tick", is answered with a pong of the same payload.
    let mask = [7u8, 7, 7, 7];
    let mut frame = vec![0x89, 0x84];
    frame.extend_from_slice(&mask);
    frame.extend(b"tick".iter().map(|b| b ^ 7));
    client.tcp.write_all(&frame).await.unwrap();
    let pong = loop {
        let frame = client.frame().await;
        if frame.opcode == 10 {
            break frame;
        }
    };
    assert_eq!(pong.payload, b"tick");
}

/// An upstream of its own for the probe: it answers the upgrade with a stream ID header (as
/// the proxy's tunnel does) and one Responses-mode response of two text deltas per
/// `response.create`.
async fn upstream_with_stream_id() -> std::net::SocketAddr {
    use base64::Engine as _;
    use sha1::Digest as _;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8; 1];
            tcp.read_exact(&mut byte).await.unwrap();
            head.push(byte[0]);
        }
        let head = String::from_utf8(head).unwrap();
        let key = head
            .lines()
            .find_map(|l| {
                l.strip_prefix("sec-websocket-key: ")
                    .or_else(|| l.strip_prefix("Sec-WebSocket-Key: "))
            })
            .unwrap()
            .trim();
        let mut sha1 = sha1::Sha1::new();
        sha1.update(format!("{key}258EAFA5-E914-47DA-95CA-C5AB0DC85B11").as_bytes());
        let accept = base64::engine::general_purpose::STANDARD.encode(sha1.finalize());
        let answer = format!(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Accept: {accept}\r\nx-metronome-stream-id: 0123abcd\r\n\r\n"
        );
        tcp.write_all(answer.as_bytes()).await.unwrap();
        // The client's response.create (masked, small), then the response.
        let mut frame = [0u8; 2];
        tcp.read_exact(&mut frame).await.unwrap();
        let len = match frame[1] & 0x7f {
            126 => {
                let mut ext = [0u8; 2];
                tcp.read_exact(&mut ext).await.unwrap();
                usize::from(u16::from_be_bytes(ext))
            }
            n => usize::from(n),
        };
        let mut rest = vec![0u8; 4 + len];
        tcp.read_exact(&mut rest).await.unwrap();
        for message in [
            r#"{"type":"response.created","response":{"status":"in_progress"}}"#,
            r#"{"type":"response.output_text.delta","delta":"Hi"}"#,
            r#"{"type":"response.output_text.delta","delta":" there"}"#,
            r#"{"type":"response.completed","response":{"status":"completed","usage":{"output_tokens":2}}}"#,
        ] {
            let mut frame = vec![0x81, message.len() as u8];
            frame.extend_from_slice(message.as_bytes());
            tcp.write_all(&frame).await.unwrap();
        }
        let mut drain = Vec::new();
        let _ = tcp.read_to_end(&mut drain).await;
    });
    addr
}

#[tokio::test]
async fn the_stream_id_of_the_101_goes_to_the_sockets_first_response() {
    let addr = upstream_with_stream_id().await;
    let mut config = ProbeConfig::new(&format!("http://{addr}/v1/responses"), "m").unwrap();
    config.stop = Stop::Requests(1);
    config.websocket = Some(WsSettings {
        protocol: WsProtocol::Responses,
        per_socket: 1,
        realtime: RealtimeAsk::default(),
    });
    let run = measure(&config).await.unwrap();
    let record = &run.streams[0];
    assert_eq!(record.error, None, "{:?}", record.error_body);
    assert_eq!(record.stream_id.as_deref(), Some("0123abcd"));
    assert_eq!((record.token_times.len(), record.output_tokens()), (2, 2));
}
