//! `metronome sim` end to end: a real server on 127.0.0.1:0, a raw hyper client that stamps every
//! body frame as it arrives, and assertions on exact counts and generous time margins (CI
//! machines are loaded; a flaky test is a failing test).

use crate::support;

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use metronome::format::{Accounting, Classified};
use metronome::scan::{scan_all, CollectedEvents, Framing, Scanner};
use metronome::sim::{self, SimConfig, SimHandle};
use support::ms;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

async fn start(config: SimConfig) -> SimHandle {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    sim::spawn(listener, config).unwrap()
}

/// What the proxy's accounting makes of one scanned event (kind, data, truncated): the tests
/// count token events as the proxy would.
fn classify<'a>(
    accounting: &mut Accounting,
    (kind, data, truncated): &'a (Vec<u8>, Vec<u8>, bool),
) -> Classified<'a> {
    accounting.classify(&metronome::scan::Event {
        kind,
        data,
        truncated: *truncated,
    })
}

/// One response as the client saw it.
struct Received {
    status: u16,
    headers: http::HeaderMap,
    /// Each body frame with its arrival time after the request was sent.
    frames: Vec<(Duration, Bytes)>,
}

impl Received {
    fn body(&self) -> Vec<u8> {
        self.frames.iter().flat_map(|(_, b)| b.to_vec()).collect()
    }

    fn events(&self) -> CollectedEvents {
        scan_all(Framing::Sse, &self.body(), 1 << 20)
    }

    /// Arrival time and OpenAI token-event count of each frame.
    fn token_events_per_frame(&self) -> Vec<(Duration, usize)> {
        let mut scanner = Scanner::new(Framing::Sse, 1 << 20);
        let mut accounting = Accounting::openai();
        self.frames
            .iter()
            .map(|(at, frame)| {
                let mut sink = CollectedEvents::default();
                scanner.feed(frame, &mut sink);
                let n = sink
                    .events
                    .iter()
                    .filter(|event| classify(&mut accounting, event).token_event)
                    .count();
                (*at, n)
            })
            .collect()
    }

    /// The token-event count of each frame that carries any: how the stream's tokens were
    /// grouped into frames (coalescing, edge flushes).
    fn token_events_in_token_frames(&self) -> Vec<usize> {
        self.token_events_per_frame()
            .into_iter()
            .map(|(_, n)| n)
            .filter(|n| *n > 0)
            .collect()
    }

    /// Gaps between consecutive token events at the client (0 within a frame).
    fn gaps(&self) -> Vec<Duration> {
        let mut arrivals = Vec::new();
        for (at, n) in self.token_events_per_frame() {
            arrivals.extend(std::iter::repeat_n(at, n));
        }
        arrivals.windows(2).map(|w| w[1] - w[0]).collect()
    }
}

/// Opens an HTTP/1.1 connection to the sim; aborting the task closes it.
async fn connect(sim: &SimHandle) -> (http1::SendRequest<Full<Bytes>>, JoinHandle<()>) {
    let tcp = TcpStream::connect(sim.addr()).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let (sender, conn) = http1::handshake(TokioIo::new(tcp)).await.unwrap();
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    (sender, task)
}

fn post(path: &str, body: &str) -> http::Request<Full<Bytes>> {
    http::Request::builder()
        .method("POST")
        .uri(path)
        .header("host", "sim")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap()
}

/// Sends a request and reads the whole response, stamping frames.
async fn request(sim: &SimHandle, method: &str, path: &str, body: &str) -> Received {
    let (mut sender, _conn) = connect(sim).await;
    let mut req = post(path, body);
    *req.method_mut() = method.parse().unwrap();
    let sent = Instant::now();
    let response = tokio::time::timeout(Duration::from_secs(20), sender.send_request(req))
        .await
        .expect("response head in time")
        .unwrap();
    read(response, sent).await
}

/// Reads a response to its end, stamping each data frame.
async fn read<B>(response: http::Response<B>, sent: Instant) -> Received
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Debug,
{
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let mut body = response.into_body();
    let mut frames = Vec::new();
    while let Some(frame) = tokio::time::timeout(Duration::from_secs(20), body.frame())
        .await
        .expect("frame in time")
    {
        if let Ok(data) = frame.unwrap().into_data() {
            frames.push((sent.elapsed(), data));
        }
    }
    Received {
        status,
        headers,
        frames,
    }
}

async fn chat(sim: &SimHandle, extra: &str) -> Received {
    let body = format!(
        r#"{{"model":"m","stream":true,"messages":[{{"role":"user","content":"hi"}}]{extra}}}"#
    );
    request(sim, "POST", "/v1/chat/completions", &body).await
}

fn json(data: &[u8]) -> serde_json::Value {
    serde_json::from_slice(data).unwrap()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::test]
async fn chat_stream_has_the_vllm_sequence() {
    let sim = start(SimConfig {
        gap: ms(5),
        ttft: ms(10),
        ..SimConfig::default()
    })
    .await;
    let got = chat(&sim, r#","max_tokens":40"#).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.headers["content-type"], "text/event-stream");
    assert!(got.headers.contains_key(sim::STREAM_HEADER));
    let events = got.events().events;
    assert_eq!(events.len(), 1 + 40 + 1 + 1 + 1);
    let role = json(&events[0].1);
    assert_eq!(role["object"], "chat.completion.chunk");
    assert_eq!(role["choices"][0]["delta"]["role"], "assistant");
    for (_, data, _) in &events[1..41] {
        let chunk = json(data);
        let content = chunk["choices"][0]["delta"]["content"].as_str().unwrap();
        assert!(content.starts_with(" tok"), "{content}");
    }
    let finish = json(&events[41].1);
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    assert_eq!(finish["choices"][0]["delta"], serde_json::json!({}));
    let usage = json(&events[42].1);
    assert_eq!(usage["choices"], serde_json::json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 40);
    assert_eq!(events[43].1, b"[DONE]");

    let mut accounting = Accounting::openai();
    let mut token_events = 0;
    let mut usage_total = None;
    for event in &events {
        let c = classify(&mut accounting, event);
        token_events += usize::from(c.token_event);
        usage_total = c.usage_total.or(usage_total);
    }
    assert_eq!(token_events, 40);
    assert_eq!(usage_total, Some(40));
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn steady_cadence_reaches_the_client() {
    let sim = start(SimConfig {
        gap: ms(30),
        ttft: ms(50),
        tokens: 20,
        ..SimConfig::default()
    })
    .await;
    let got = chat(&sim, "").await;
    let gaps = got.gaps();
    assert_eq!(gaps.len(), 19);
    let m = median(gaps);
    assert!(m >= ms(20) && m <= ms(45), "median gap {m:?}");
    let first = got
        .token_events_per_frame()
        .iter()
        .find(|(_, n)| *n > 0)
        .unwrap()
        .0;
    assert!(first >= ms(45), "ttft {first:?}");
    sim.shutdown().await.unwrap();
}

/// Waits (bounded) until `f` holds.
async fn eventually(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(ms(10)).await;
    }
}

fn parsed_events(got: &Received) -> Vec<(String, serde_json::Value)> {
    got.events()
        .events
        .into_iter()
        .filter(|(_, data, _)| data != b"[DONE]")
        .map(|(kind, data, _)| (String::from_utf8(kind).unwrap(), json(&data)))
        .collect()
}

#[tokio::test]
async fn placed_stall_is_the_only_long_gap() {
    let sim = start(SimConfig {
        gap: ms(20),
        ttft: ms(10),
        tokens: 12,
        stall_at: vec![5],
        stall: ms(300),
        ..SimConfig::default()
    })
    .await;
    let gaps = chat(&sim, "").await.gaps();
    assert_eq!(gaps.len(), 11);
    let long: Vec<usize> = (0..gaps.len()).filter(|i| gaps[*i] > ms(200)).collect();
    // gaps[3] is the gap before token event 5.
    assert_eq!(long, vec![3], "gaps {gaps:?}");
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn coalesced_frames_carry_four_events() {
    let sim = start(SimConfig {
        gap: ms(5),
        ttft: ms(10),
        tokens: 20,
        coalesce: 4,
        ..SimConfig::default()
    })
    .await;
    let got = chat(&sim, "").await;
    let per_frame = got.token_events_in_token_frames();
    assert_eq!(per_frame, vec![4; 5]);
    let gaps = got.gaps();
    assert_eq!(gaps.iter().filter(|g| g.is_zero()).count(), 15);
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn speculative_steps_carry_several_tokens() {
    let sim = start(SimConfig {
        gap: ms(5),
        ttft: ms(10),
        spec_k: 3,
        spec_accept: 0.7,
        seed: 9,
        ..SimConfig::default()
    })
    .await;
    let got = chat(&sim, r#","max_tokens":60"#).await;
    let events = parsed_events(&got);
    let contents: Vec<&str> = events
        .iter()
        .filter_map(|(_, v)| v["choices"][0]["delta"]["content"].as_str())
        .filter(|c| !c.is_empty())
        .collect();
    assert!(contents.len() < 60, "{} token events", contents.len());
    let words: usize = contents.iter().map(|c| c.split_whitespace().count()).sum();
    assert_eq!(words, 60);
    let usage = events.iter().find_map(|(_, v)| v.get("usage")).unwrap();
    assert_eq!(usage["completion_tokens"], 60);
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn tgi_stream_is_well_formed() {
    let sim = start(SimConfig {
        gap: ms(5),
        ttft: ms(10),
        ..SimConfig::default()
    })
    .await;
    let body = r#"{"inputs":"hello","parameters":{"max_new_tokens":10}}"#;
    let got = request(&sim, "POST", "/generate_stream", body).await;
    assert_eq!(got.status, 200);
    let events = parsed_events(&got);
    assert_eq!(events.len(), 11);
    let mut text = String::new();
    for (i, (_, event)) in events[..10].iter().enumerate() {
        assert_eq!(event["index"], i as u64 + 1);
        assert_eq!(event["token"]["special"], false);
        assert!(event["generated_text"].is_null());
        text.push_str(event["token"]["text"].as_str().unwrap());
    }
    let last = &events[10].1;
    assert_eq!(last["token"]["special"], true);
    assert_eq!(last["token"]["text"], "</s>");
    assert_eq!(last["generated_text"], text.as_str());
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn anthropic_stream_is_well_formed() {
    let sim = start(SimConfig {
        gap: ms(5),
        ttft: ms(10),
        ..SimConfig::default()
    })
    .await;
    let body = r#"{"model":"claude","stream":true,"max_tokens":10,
        "messages":[{"role":"user","content":"hello"}]}"#;
    let got = request(&sim, "POST", "/v1/messages", body).await;
    assert_eq!(got.status, 200);
    let events = parsed_events(&got);
    let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
    let mut expected = vec!["message_start", "content_block_start", "ping"];
    expected.extend(["content_block_delta"; 10]);
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(kinds, expected);
    for (kind, event) in &events {
        assert_eq!(event["type"], kind.as_str());
    }
    assert_eq!(events[3].1["delta"]["type"], "text_delta");
    assert_eq!(events[14].1["usage"]["output_tokens"], 10);
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn completions_stream_text_chunks() {
    let sim = start(SimConfig {
        gap: ms(5),
        ttft: ms(10),
        usage: sim::UsageMode::Request,
        ..SimConfig::default()
    })
    .await;
    let got = request(
        &sim,
        "POST",
        "/v1/completions",
        r#"{"prompt":"once","stream":true,"max_tokens":7}"#,
    )
    .await;
    let events = got.events().events;
    // 7 text chunks, the finish chunk, [DONE]: no usage, as the request did not ask.
    assert_eq!(events.len(), 9);
    let first = json(&events[0].1);
    assert_eq!(first["object"], "text_completion");
    assert!(first["choices"][0]["text"]
        .as_str()
        .unwrap()
        .starts_with(" tok"));
    assert_eq!(json(&events[7].1)["choices"][0]["finish_reason"], "length");
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn usage_on_request_only_when_asked() {
    let sim = start(SimConfig {
        gap: ms(2),
        ttft: ms(5),
        tokens: 5,
        usage: sim::UsageMode::Request,
        ..SimConfig::default()
    })
    .await;
    let asked = chat(&sim, r#","stream_options":{"include_usage":true}"#).await;
    let not_asked = chat(&sim, "").await;
    assert_eq!(asked.events().events.len(), 1 + 5 + 1 + 1 + 1);
    assert_eq!(not_asked.events().events.len(), 1 + 5 + 1 + 1);
    let finish = json(&not_asked.events().events[6].1);
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn non_streaming_answer_waits_for_generation() {
    let sim = start(SimConfig {
        gap: ms(10),
        ttft: ms(50),
        tokens: 10,
        ..SimConfig::default()
    })
    .await;
    let sent = Instant::now();
    let got = request(&sim, "POST", "/v1/chat/completions", r#"{"messages":[]}"#).await;
    assert!(sent.elapsed() >= ms(130), "{:?}", sent.elapsed());
    assert_eq!(got.status, 200);
    assert_eq!(got.headers["content-type"], "application/json");
    let answer = json(&got.body());
    assert_eq!(answer["object"], "chat.completion");
    assert_eq!(answer["usage"]["completion_tokens"], 10);
    let content = answer["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(content.split_whitespace().count(), 10);
    assert_eq!(sim.stats().completed(), 1);
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn plain_endpoints_and_errors() {
    let sim = start(SimConfig {
        model: "my \"model\"".to_owned(),
        ..SimConfig::default()
    })
    .await;
    assert_eq!(request(&sim, "GET", "/health", "").await.status, 200);
    let models = request(&sim, "GET", "/v1/models", "").await;
    assert_eq!(json(&models.body())["data"][0]["id"], "my \"model\"");
    let missing = request(&sim, "GET", "/nowhere", "").await;
    assert_eq!(missing.status, 404);
    assert!(json(&missing.body())["error"]["message"].is_string());
    let bad = request(&sim, "POST", "/v1/chat/completions", "{oops").await;
    assert_eq!(bad.status, 400);
    assert!(json(&bad.body())["error"]["message"].is_string());
    let wrong_method = request(&sim, "GET", "/v1/chat/completions", "").await;
    assert_eq!(wrong_method.status, 405);
    assert_eq!(sim.stats().started(), 0);
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn client_disconnect_frees_the_stream() {
    let sim = start(SimConfig {
        gap: ms(20),
        ttft: ms(10),
        tokens: 1000,
        ..SimConfig::default()
    })
    .await;
    let (mut sender, conn) = connect(&sim).await;
    let body = r#"{"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let response = sender
        .send_request(post("/v1/chat/completions", body))
        .await
        .unwrap();
    let mut body = response.into_body();
    for _ in 0..3 {
        body.frame().await.unwrap().unwrap();
    }
    assert_eq!(sim.stats().active(), 1);
    drop(body);
    drop(sender);
    conn.abort();
    let stats = sim.stats().clone();
    eventually("the stream to be cancelled", || stats.active() == 0).await;
    let snap = stats.snapshot();
    assert_eq!((snap.started, snap.cancelled, snap.completed), (1, 1, 0));
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn timeline_records_every_frame_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("timeline.jsonl");
    let sim = start(SimConfig {
        gap: ms(5),
        ttft: ms(10),
        tokens: 15,
        coalesce: 2,
        timeline: Some(path.clone()),
        ..SimConfig::default()
    })
    .await;
    let (a, b) = tokio::join!(chat(&sim, ""), chat(&sim, ""));
    let mut seqs: Vec<u64> = [&a, &b]
        .iter()
        .map(|r| {
            r.headers[sim::STREAM_HEADER]
                .to_str()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    seqs.sort();
    assert_eq!(seqs, vec![0, 1]);
    let frames_seen = a.frames.len();
    sim.shutdown().await.unwrap();

    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<serde_json::Value> = text.lines().map(json_str).collect();
    for stream in [0u64, 1] {
        let mine: Vec<&serde_json::Value> =
            lines.iter().filter(|l| l["stream"] == stream).collect();
        assert_eq!(mine[0]["request"], "/v1/chat/completions");
        assert!(mine[0]["received_unix_us"].as_u64().unwrap() > 0);
        let frames = &mine[1..];
        // role, 8 token frames (2 events each, the last 1), finish, usage, [DONE]
        assert_eq!(frames.len(), 12);
        let t: Vec<u64> = frames.iter().map(|f| f["t_us"].as_u64().unwrap()).collect();
        assert!(t.windows(2).all(|w| w[0] <= w[1]), "{t:?}");
        let token_t: Vec<u64> = frames
            .iter()
            .filter(|f| f["events"] != 0)
            .map(|f| f["t_us"].as_u64().unwrap())
            .collect();
        assert!(token_t.windows(2).all(|w| w[0] < w[1]), "{token_t:?}");
        let events: u64 = frames.iter().map(|f| f["events"].as_u64().unwrap()).sum();
        let tokens: u64 = frames.iter().map(|f| f["tokens"].as_u64().unwrap()).sum();
        assert_eq!((events, tokens), (15, 15));
        assert_eq!(frames[2]["event"], 2);
        for f in frames {
            assert_eq!(
                f["unix_us"].as_u64().unwrap(),
                mine[0]["received_unix_us"].as_u64().unwrap() + f["t_us"].as_u64().unwrap()
            );
        }
    }
    assert!(frames_seen <= 12);
}

fn json_str(line: &str) -> serde_json::Value {
    serde_json::from_str(line).unwrap()
}

#[tokio::test]
async fn edge_holds_output_until_enough_bytes() {
    let sim = start(SimConfig {
        gap: ms(2),
        ttft: ms(5),
        tokens: 10,
        edge_flush_bytes: Some(1 << 20),
        ..SimConfig::default()
    })
    .await;
    let got = chat(&sim, "").await;
    assert_eq!(got.frames.len(), 1, "everything in the one final flush");
    assert_eq!(got.events().events.len(), 1 + 10 + 1 + 1 + 1);
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn edge_flushes_on_its_interval() {
    let sim = start(SimConfig {
        gap: ms(10),
        ttft: ms(5),
        tokens: 40,
        edge_flush_interval: Some(ms(100)),
        ..SimConfig::default()
    })
    .await;
    let got = chat(&sim, "").await;
    let per_frame = got.token_events_in_token_frames();
    assert_eq!(per_frame.iter().sum::<usize>(), 40);
    // About 400ms of output in 100ms flushes: a handful of frames, far fewer than 40.
    assert!((3..=8).contains(&per_frame.len()), "{per_frame:?}");
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn contention_slows_everyone_when_a_burst_joins() {
    let config = SimConfig {
        gap: ms(10),
        ttft: ms(5),
        tokens: 12,
        contention_k: ms(5),
        ..SimConfig::default()
    };
    let sim = start(config).await;
    let alone = median(chat(&sim, "").await.gaps());
    let burst = futures_util::future::join_all((0..8).map(|_| chat(&sim, ""))).await;
    let crowded = median(burst.iter().flat_map(|r| r.gaps()).collect());
    // Alone: 10 + 5 × 1 = 15ms. Eight at once: 10 + 5 × 8 = 50ms.
    assert!(alone < ms(35), "alone {alone:?}");
    assert!(crowded > ms(35), "crowded {crowded:?}");
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn many_streams_over_one_http2_connection() {
    let sim = start(SimConfig {
        gap: ms(20),
        ttft: ms(10),
        tokens: 10,
        ..SimConfig::default()
    })
    .await;
    let tcp = TcpStream::connect(sim.addr()).await.unwrap();
    let (sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let addr = sim.addr();
    let streams = (0..300).map(|_| {
        let mut sender = sender.clone();
        async move {
            let body = r#"{"stream":true,"messages":[]}"#;
            let mut req = post("/v1/chat/completions", body);
            *req.version_mut() = http::Version::HTTP_2;
            *req.uri_mut() = format!("http://{addr}/v1/chat/completions")
                .parse()
                .unwrap();
            let sent = Instant::now();
            let response = sender.send_request(req).await.unwrap();
            read(response, sent).await
        }
    });
    let all = tokio::time::timeout(
        Duration::from_secs(30),
        futures_util::future::join_all(streams),
    )
    .await
    .expect("300 streams in time");
    for got in &all {
        assert_eq!(got.events().events.len(), 1 + 10 + 1 + 1 + 1);
    }
    let snap = sim.stats().snapshot();
    assert_eq!((snap.started, snap.completed, snap.active), (300, 300, 0));
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn shutdown_lets_streams_in_flight_finish() {
    let sim = start(SimConfig {
        gap: ms(20),
        ttft: ms(10),
        tokens: 15,
        ..SimConfig::default()
    })
    .await;
    let stats = sim.stats().clone();
    let client = tokio::spawn({
        let addr = sim.addr();
        async move {
            let tcp = TcpStream::connect(addr).await.unwrap();
            let (mut sender, conn) = http1::handshake(TokioIo::new(tcp)).await.unwrap();
            tokio::spawn(conn);
            let response = sender
                .send_request(post("/v1/chat/completions", r#"{"stream":true}"#))
                .await
                .unwrap();
            read(response, Instant::now()).await
        }
    });
    eventually("the stream to start", || stats.active() == 1).await;
    sim.shutdown().await.unwrap();
    let got = client.await.unwrap();
    assert_eq!(got.events().events.len(), 1 + 15 + 1 + 1 + 1);
    assert_eq!(stats.completed(), 1);
}

#[tokio::test]
async fn same_seed_same_output() {
    let config = SimConfig {
        gap: ms(2),
        ttft: ms(2),
        tokens: 20,
        jitter: 0.3,
        spec_k: 2,
        seed: 1234,
        ..SimConfig::default()
    };
    let mut texts = Vec::new();
    for _ in 0..2 {
        let sim = start(config.clone()).await;
        let got = chat(&sim, "").await;
        let text: Vec<String> = parsed_events(&got)
            .iter()
            .filter_map(|(_, v)| v["choices"][0]["delta"]["content"].as_str())
            .map(str::to_owned)
            .collect();
        texts.push(text);
        sim.shutdown().await.unwrap();
    }
    assert_eq!(texts[0], texts[1]);
}

/// `--engine batch`: three streams decode in one loop; a fourth request with a long prompt
/// arrives mid-decode and its prefill holds the step every decoding stream waits for, while a
/// placed stall (`--stall-at`) stays in its own stream. The timeline says which gap was which.
#[tokio::test]
async fn batch_engine_prefill_holds_every_stream_and_stalls_stay_local() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("timeline.jsonl");
    let sim = start(SimConfig {
        engine: sim::Engine::Batch,
        gap: ms(10),
        prefill_per_token: Duration::from_micros(100),
        stall: ms(150),
        stall_at: vec![30],
        timeline: Some(path.clone()),
        ..SimConfig::default()
    })
    .await;
    let decoding = futures_util::future::join_all(
        (0..3).map(|_| chat(&sim, r#","max_tokens":40,"sim_prompt_tokens":1"#)),
    );
    let late = async {
        tokio::time::sleep(ms(120)).await;
        // 3,000 prompt tokens × 100 µs: a 300 ms prefill inside the loop.
        chat(&sim, r#","max_tokens":5,"sim_prompt_tokens":3000"#).await
    };
    let (decoding, late) = tokio::join!(decoding, late);
    assert_eq!(late.status, 200);
    let late_json: Vec<serde_json::Value> = late
        .events()
        .events
        .iter()
        .filter(|(_, d, _)| d.as_slice() != b"[DONE]")
        .map(|(_, d, _)| json(d))
        .collect();
    let usage = late_json.last().unwrap();
    assert_eq!(usage["usage"]["prompt_tokens"], 3000);
    for got in &decoding {
        let gaps = got.gaps();
        assert_eq!(gaps.len(), 39);
        let long: Vec<&Duration> = gaps.iter().filter(|g| **g > ms(120)).collect();
        // The prefill (300 ms) and the stall (150 ms): two long gaps, no more.
        assert_eq!(long.len(), 2, "{gaps:?}");
        assert!(long.iter().any(|g| **g > ms(280)), "{gaps:?}");
    }
    sim.shutdown().await.unwrap();

    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<serde_json::Value> = text.lines().map(json_str).collect();
    let late_seq: u64 = late.headers[sim::STREAM_HEADER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let prefills: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l.get("prefill_step").is_some() && l["stream"] == late_seq)
        .collect();
    assert_eq!(prefills.len(), 1);
    assert_eq!(prefills[0]["prefill_tokens"], 3000);
    assert_eq!(prefills[0]["step_held_us"], 300_000);
    for stream in (0..4u64).filter(|s| *s != late_seq) {
        let frames: Vec<&serde_json::Value> = lines
            .iter()
            .filter(|l| l["stream"] == stream && l.get("event").is_some())
            .collect();
        // The other short prompts (1 token, 100 µs) hold a step a little too.
        let held: Vec<u64> = frames
            .iter()
            .filter_map(|f| f["held_us"].as_u64())
            .filter(|us| *us > 1_000)
            .collect();
        let stalled: Vec<u64> = frames
            .iter()
            .filter_map(|f| f["stalled_us"].as_u64())
            .collect();
        assert_eq!(
            held,
            vec![300_000],
            "stream {stream}: one gap held by the batch"
        );
        assert_eq!(
            stalled,
            vec![150_000],
            "stream {stream}: its own stall, once"
        );
    }
}

/// Chunked prefill spreads a long prompt over several steps: no gap holds it all.
#[tokio::test]
async fn batch_engine_chunked_prefill_spreads_the_hold() {
    let sim = start(SimConfig {
        engine: sim::Engine::Batch,
        gap: ms(10),
        prefill_per_token: Duration::from_micros(100),
        prefill_chunk: 500,
        ..SimConfig::default()
    })
    .await;
    let decoding = chat(&sim, r#","max_tokens":60,"sim_prompt_tokens":1"#);
    let late = async {
        tokio::time::sleep(ms(100)).await;
        chat(&sim, r#","max_tokens":2,"sim_prompt_tokens":3000"#).await
    };
    let (decoding, _late) = tokio::join!(decoding, late);
    let gaps = decoding.gaps();
    // Six steps of 10 + 50 ms each rather than one of 310 ms.
    let held = gaps.iter().filter(|g| **g > ms(40)).count();
    assert!((5..=7).contains(&held), "{gaps:?}");
    assert!(gaps.iter().all(|g| *g < ms(200)), "{gaps:?}");
    sim.shutdown().await.unwrap();
}
