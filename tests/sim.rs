//! `metronome sim` end to end: a real server on 127.0.0.1:0, a raw hyper client that stamps every
//! body frame as it arrives, and assertions on exact counts and generous time margins (CI
//! machines are loaded; a flaky test is a failing test).

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use metronome::format::Accounting;
use metronome::scan::{scan_all, CollectedEvents, Framing, Scanner};
use metronome::sim::{self, SimConfig, SimHandle};
use tokio::net::{TcpListener, TcpStream};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

async fn start(config: SimConfig) -> SimHandle {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    sim::spawn(listener, config).unwrap()
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
                    .filter(|(kind, data, truncated)| {
                        let event = metronome::scan::Event {
                            kind,
                            data,
                            truncated: *truncated,
                        };
                        accounting.classify(&event).token_event
                    })
                    .count();
                (*at, n)
            })
            .collect()
    }

    /// Gaps between consecutive token events at the client (0 within a frame).
    fn gaps(&self) -> Vec<Duration> {
        let mut arrivals = Vec::new();
        for (at, n) in self.token_events_per_frame() {
            arrivals.extend(std::iter::repeat(at).take(n));
        }
        arrivals.windows(2).map(|w| w[1] - w[0]).collect()
    }
}

/// Opens an HTTP/1.1 connection to the sim.
async fn connect(sim: &SimHandle) -> http1::SendRequest<Full<Bytes>> {
    let tcp = TcpStream::connect(sim.addr()).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let (sender, conn) = http1::handshake(TokioIo::new(tcp)).await.unwrap();
    tokio::spawn(conn);
    sender
}

/// Sends a request and reads the whole response, stamping frames.
async fn request(sim: &SimHandle, method: &str, path: &str, body: &str) -> Received {
    let mut sender = connect(sim).await;
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "sim")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let sent = Instant::now();
    let response = tokio::time::timeout(Duration::from_secs(20), sender.send_request(req))
        .await
        .expect("response head in time")
        .unwrap();
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
    for (kind, data, truncated) in &events {
        let event = metronome::scan::Event {
            kind,
            data,
            truncated: *truncated,
        };
        let c = accounting.classify(&event);
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
