//! Test helpers that read like the scenario: a scripted upstream, the proxy in-process, a client
//! that records every frame, and a reader for the Prometheus text format.
#![allow(dead_code)]

pub mod fixtures;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use metronome::config::Config;
use metronome::proxy::ProxyHandle;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// Milliseconds, for scripts that read like prose.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// One step of an upstream script.
#[derive(Debug, Clone)]
pub enum Step {
    /// Wait, then write these bytes as one frame.
    Frame(Duration, Bytes),
    /// Wait, then fail the response (the client sees a reset mid-stream).
    Reset(Duration),
    /// Send nothing more, ever (until the client goes away).
    Hang,
}

/// A scripted upstream: what it answers, at what cadence.
#[derive(Debug, Clone)]
pub struct Upstream {
    content_type: String,
    status: u16,
    head_delay: Duration,
    steps: Vec<Step>,
    model: String,
    tokens: usize,
    every: Duration,
    stalls: Vec<(usize, Duration)>,
    usage: bool,
    scripted: bool,
    echo_headers: bool,
    content_length: bool,
    headers: Vec<(String, String)>,
    keep_alive: bool,
}

/// What a running scripted upstream saw.
#[derive(Debug, Default)]
pub struct UpstreamStats {
    /// Responses whose body was dropped before the script finished: the client went away.
    pub cancelled: AtomicUsize,
    /// Responses whose script ran to its end.
    pub completed: AtomicUsize,
    /// Requests received.
    pub requests: AtomicUsize,
    /// Headers of the last request.
    pub last_headers: Mutex<Option<HeaderMap>>,
    /// Data frames hyper has taken from response bodies: how far ahead of the client the
    /// upstream got (the script task is at most one frame ahead of this).
    pub frames_taken: AtomicUsize,
    /// Connections accepted and not yet closed.
    pub connections_open: AtomicUsize,
    /// Connections accepted in all.
    pub connections_accepted: AtomicUsize,
}

/// A running scripted upstream.
pub struct RunningUpstream {
    pub addr: SocketAddr,
    pub stats: Arc<UpstreamStats>,
}

impl RunningUpstream {
    /// Waits up to 5 s for one of this upstream's responses to be cancelled (the proxy let go of
    /// it before the script's end); panics with `failure` otherwise.
    pub async fn wait_for_a_cancel(&self, failure: &str) {
        wait_until(Duration::from_secs(5), failure, || {
            self.stats.cancelled.load(Ordering::SeqCst) > 0
        })
        .await;
    }
}

impl Upstream {
    /// An OpenAI chat-completions stream: role chunk, token chunks, finish chunk, usage chunk,
    /// `[DONE]`, one event per frame.
    pub fn openai_chat() -> Self {
        Upstream {
            content_type: "text/event-stream".into(),
            status: 200,
            head_delay: Duration::ZERO,
            steps: Vec::new(),
            model: "test-model".into(),
            tokens: 10,
            every: ms(10),
            stalls: Vec::new(),
            usage: true,
            scripted: false,
            echo_headers: false,
            content_length: false,
            headers: Vec::new(),
            keep_alive: true,
        }
    }

    /// A raw script of frames.
    pub fn script(content_type: &str, steps: Vec<Step>) -> Self {
        Upstream {
            content_type: content_type.into(),
            steps,
            scripted: true,
            ..Self::openai_chat()
        }
    }

    /// An SSE stream of `frames`, each written `gap` after the one before.
    pub fn sse_frames(frames: &[Bytes], gap: Duration) -> Self {
        let steps = frames.iter().map(|f| Step::Frame(gap, f.clone())).collect();
        Self::script("text/event-stream", steps)
    }

    /// A plain JSON response (not a stream).
    pub fn json(body: &str) -> Self {
        Self::script(
            "application/json",
            vec![Step::Frame(Duration::ZERO, Bytes::from(body.to_string()))],
        )
    }

    pub fn tokens(mut self, n: usize) -> Self {
        self.tokens = n;
        self
    }

    pub fn every(mut self, gap: Duration) -> Self {
        self.every = gap;
        self
    }

    /// An extra pause before token event `n` (1-based).
    pub fn stall_before(mut self, n: usize, pause: Duration) -> Self {
        self.stalls.push((n, pause));
        self
    }

    pub fn usage(mut self, on: bool) -> Self {
        self.usage = on;
        self
    }

    pub fn model(mut self, model: &str) -> Self {
        self.model = model.into();
        self
    }

    pub fn status(mut self, status: u16) -> Self {
        self.status = status;
        self
    }

    /// Delay before the response head (time to first byte).
    pub fn head_delay(mut self, delay: Duration) -> Self {
        self.head_delay = delay;
        self
    }

    /// Append steps after the generated stream (or the script).
    pub fn then(mut self, step: Step) -> Self {
        self.materialize();
        self.steps.push(step);
        self
    }

    /// Declare the body's length in `content-length` (instead of chunked encoding).
    pub fn with_content_length(mut self) -> Self {
        self.content_length = true;
        self
    }

    /// An extra response header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Close each connection after its response (no keep-alive), so that no pooled connection
    /// outlives a test's request: a count of live tasks then returns exactly to its baseline.
    pub fn close_after_response(mut self) -> Self {
        self.keep_alive = false;
        self
    }

    /// Answer with the request's headers as a JSON object (for header-handling tests).
    pub fn echo_headers(mut self) -> Self {
        self.echo_headers = true;
        self
    }

    /// The generated stream's frames, as a script.
    fn materialize(&mut self) {
        if self.scripted {
            return;
        }
        self.scripted = true;
        let chunk = |delta: &str, finish: &str| {
            format!(
                "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"{}\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"logprobs\":null,\"finish_reason\":{finish}}}]}}\n\n",
                self.model
            )
        };
        let mut steps = vec![Step::Frame(
            Duration::ZERO,
            Bytes::from(chunk(r#"{"role":"assistant","content":""}"#, "null")),
        )];
        for i in 1..=self.tokens {
            let mut wait = if i == 1 { Duration::ZERO } else { self.every };
            for (n, pause) in &self.stalls {
                if *n == i {
                    wait += *pause;
                }
            }
            steps.push(Step::Frame(
                wait,
                Bytes::from(chunk(&format!(r#"{{"content":" tok{i}"}}"#), "null")),
            ));
        }
        steps.push(Step::Frame(
            Duration::ZERO,
            Bytes::from(chunk("{}", "\"stop\"")),
        ));
        if self.usage {
            steps.push(Step::Frame(Duration::ZERO, Bytes::from(format!(
                "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"{}\",\"choices\":[],\"usage\":{{\"prompt_tokens\":5,\"completion_tokens\":{},\"total_tokens\":{}}}}}\n\n",
                self.model, self.tokens, self.tokens + 5
            ))));
        }
        steps.push(Step::Frame(Duration::ZERO, Bytes::from("data: [DONE]\n\n")));
        steps.append(&mut self.steps);
        self.steps = steps;
    }

    /// All the bytes the script writes, concatenated (what a client must receive).
    pub fn expected_bytes(&self) -> Vec<u8> {
        let mut me = self.clone();
        me.materialize();
        let mut out = Vec::new();
        for step in &me.steps {
            if let Step::Frame(_, b) = step {
                out.extend_from_slice(b);
            }
        }
        out
    }

    /// Starts serving on 127.0.0.1:0.
    pub async fn start(mut self) -> RunningUpstream {
        self.materialize();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stats = Arc::new(UpstreamStats::default());
        let script = Arc::new(self);
        let stats2 = stats.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let _ = stream.set_nodelay(true);
                let script = script.clone();
                let stats = stats2.clone();
                stats.connections_open.fetch_add(1, Ordering::SeqCst);
                stats.connections_accepted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let keep_alive = script.keep_alive;
                    let conn_stats = stats.clone();
                    let service = service_fn(move |req: Request<Incoming>| {
                        let script = script.clone();
                        let stats = stats.clone();
                        async move { Ok::<_, Infallible>(script.respond(req, stats).await) }
                    });
                    let mut builder = auto::Builder::new(TokioExecutor::new());
                    builder.http1().keep_alive(keep_alive);
                    let _ = builder
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                    conn_stats.connections_open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        RunningUpstream { addr, stats }
    }

    async fn respond(
        &self,
        req: Request<Incoming>,
        stats: Arc<UpstreamStats>,
    ) -> Response<ScriptBody> {
        stats.requests.fetch_add(1, Ordering::SeqCst);
        *stats.last_headers.lock().unwrap() = Some(req.headers().clone());
        let _ = req.into_body().collect().await;
        let steps = if self.echo_headers {
            let headers = stats.last_headers.lock().unwrap().clone().unwrap();
            let map: HashMap<String, String> = headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
                .collect();
            vec![Step::Frame(
                Duration::ZERO,
                Bytes::from(serde_json::to_string(&map).unwrap()),
            )]
        } else {
            self.steps.clone()
        };
        tokio::time::sleep(self.head_delay).await;
        let (tx, rx) = mpsc::channel(1);
        let stats2 = stats.clone();
        tokio::spawn(async move {
            let start = tokio::time::Instant::now();
            let mut at = start;
            for step in steps {
                match step {
                    Step::Frame(wait, bytes) => {
                        at += wait;
                        tokio::select! {
                            _ = tokio::time::sleep_until(at) => {}
                            _ = tx.closed() => { stats2.cancelled.fetch_add(1, Ordering::SeqCst); return; }
                        }
                        if tx.send(Ok(Frame::data(bytes))).await.is_err() {
                            stats2.cancelled.fetch_add(1, Ordering::SeqCst);
                            return;
                        }
                    }
                    Step::Reset(wait) => {
                        at += wait;
                        tokio::time::sleep_until(at).await;
                        let _ = tx.send(Err(std::io::Error::other("scripted reset"))).await;
                        return;
                    }
                    Step::Hang => {
                        tx.closed().await;
                        stats2.cancelled.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                }
            }
            stats2.completed.fetch_add(1, Ordering::SeqCst);
        });
        let mut response = Response::new(ScriptBody { rx, stats });
        *response.status_mut() = http::StatusCode::from_u16(self.status).unwrap();
        response
            .headers_mut()
            .insert("content-type", self.content_type.parse().unwrap());
        if self.content_length {
            let len = self.expected_bytes().len();
            response.headers_mut().insert("content-length", len.into());
        }
        for (name, value) in &self.headers {
            response.headers_mut().insert(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        response
    }
}

/// The scripted upstream's body: frames from the script task.
pub struct ScriptBody {
    rx: mpsc::Receiver<Result<Frame<Bytes>, std::io::Error>>,
    stats: Arc<UpstreamStats>,
}

impl Body for ScriptBody {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let polled = self.rx.poll_recv(cx);
        if let std::task::Poll::Ready(Some(Ok(frame))) = &polled {
            if frame.is_data() {
                self.stats.frames_taken.fetch_add(1, Ordering::SeqCst);
            }
        }
        polled
    }
}

/// A proxy in-process on loopback ports, in front of `upstream`.
pub async fn proxy_to(upstream: SocketAddr) -> ProxyHandle {
    proxy_with(upstream, |_| {}).await
}

/// `metronome sim` on an ephemeral loopback port with `config`.
pub async fn sim_with(config: metronome::sim::SimConfig) -> metronome::sim::SimHandle {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    metronome::sim::spawn(listener, config).unwrap()
}

/// The batch engine (`sim --engine batch`) stepping every `gap`, each prompt token holding the
/// shared step for 100 µs (a 3,000-token prompt holds it 300 ms): the batch tests' engine.
pub fn batch_engine(gap: Duration) -> metronome::sim::SimConfig {
    metronome::sim::SimConfig {
        engine: metronome::sim::Engine::Batch,
        gap,
        prefill_per_token: Duration::from_micros(100),
        ..metronome::sim::SimConfig::default()
    }
}

/// Same, with the configuration adjusted first.
pub async fn proxy_with(upstream: SocketAddr, adjust: impl FnOnce(&mut Config)) -> ProxyHandle {
    let mut config = Config::from_toml(&proxy_toml(upstream)).unwrap();
    adjust(&mut config);
    ProxyHandle::start(config).await.unwrap()
}

/// The TOML every test proxy starts from: loopback listeners in front of `upstream`, and one
/// route, `chat` (exact `/v1/chat/completions`). Text rather than a `Config`, so that a test can
/// append tables (more routes) before it is parsed.
pub fn proxy_toml(upstream: SocketAddr) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"
upstream = "http://{upstream}"
drain_grace = "2s"
[[routes]]
name = "chat"
path = "/v1/chat/completions"
match = "exact"
"#
    )
}

/// What a client received: each frame's bytes and arrival time, the head, and how it ended.
#[derive(Debug)]
pub struct Received {
    pub status: u16,
    pub headers: HeaderMap,
    pub frames: Vec<(Instant, Bytes)>,
    /// `Some(error)` when the body failed instead of ending cleanly.
    pub error: Option<String>,
}

impl Received {
    pub fn bytes(&self) -> Vec<u8> {
        self.frames.iter().flat_map(|(_, b)| b.to_vec()).collect()
    }

    /// The stream id the proxy gave the response (`x-metronome-stream-id`); panics without one.
    pub fn stream_id(&self) -> String {
        self.headers["x-metronome-stream-id"]
            .to_str()
            .unwrap()
            .to_string()
    }
}

/// Sends a chat request through `addr` over HTTP/1.1 and records every frame.
pub async fn stream_chat(addr: SocketAddr) -> Received {
    request(
        addr,
        "POST",
        "/v1/chat/completions",
        r#"{"model":"test-model","stream":true}"#,
        false,
    )
    .await
}

/// Sends a request and records every frame; `http2` uses HTTP/2 with prior knowledge.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    http2: bool,
) -> Received {
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .http2_only(http2)
        .build_http::<Full<Bytes>>();
    let req = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = client.request(req).await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let mut body = response.into_body();
    let mut frames = Vec::new();
    let mut error = None;
    loop {
        match body.frame().await {
            None => break,
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    frames.push((Instant::now(), data));
                }
            }
            Some(Err(e)) => {
                error = Some(e.to_string());
                break;
            }
        }
    }
    Received {
        status,
        headers,
        frames,
        error,
    }
}

/// Fetches the proxy's `/metrics`.
pub async fn scrape(proxy: &ProxyHandle) -> Metrics {
    let received = request(proxy.admin_addr, "GET", "/metrics", "", false).await;
    Metrics(String::from_utf8(received.bytes()).unwrap())
}

/// Scrapes until `ready` holds (streams are recorded just after their last byte), or panics
/// after 10 s with the last scrape.
///
/// Returns the scrape *after* the one where `ready` first held. A scrape gathers the metric
/// families one at a time, in no fixed order, so the scrape that sees a stream's counts can be
/// missing figures the stream recorded while it gathered; the ledger records those counts last,
/// so the next scrape holds the whole stream.
pub async fn scrape_until(proxy: &ProxyHandle, ready: impl Fn(&Metrics) -> bool) -> Metrics {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = scrape(proxy).await;
        if ready(&m) {
            let settled = scrape(proxy).await;
            assert!(ready(&settled), "a later scrape lost what made it ready");
            return settled;
        }
        if Instant::now() > deadline {
            panic!("metrics never got ready:\n{}", m.0);
        }
        tokio::time::sleep(ms(20)).await;
    }
}

/// Scrapes once the proxy has recorded a stream (`metronome_streams_total` is there at all): the
/// wait most tests need before reading a stream's metrics.
pub async fn scrape_after_stream(proxy: &ProxyHandle) -> Metrics {
    scrape_until(proxy, |m| m.get("metronome_streams_total", &[]).is_some()).await
}

/// Waits for a test's one stream to be recorded and checks that it ended, on the `chat` route,
/// as `outcome`; returns the scrape for the test's further checks.
pub async fn one_chat_stream_ended_as(proxy: &ProxyHandle, outcome: &str) -> Metrics {
    let m = scrape_after_stream(proxy).await;
    assert_eq!(
        m.value(
            "metronome_streams_total",
            &[("route", "chat"), ("outcome", outcome)]
        ),
        1.0,
        "one chat stream ended as {outcome}"
    );
    m
}

/// Polls `done` every 10 ms until it holds; panics with `what` if it does not within `limit`.
/// For what a test waits on that no scrape shows (an upstream's counters, open connections).
pub async fn wait_until(limit: Duration, what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(ms(10)).await;
    }
}

/// The Prometheus text exposition, with lookups by name and labels.
#[derive(Debug, Clone)]
pub struct Metrics(pub String);

impl Metrics {
    /// The value of the sample `name` whose labels include all of `labels`; `None` if absent.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut found = None;
        for line in self.0.lines() {
            if line.starts_with('#') || line.is_empty() {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').unwrap();
            let (metric, label_text) = match series.split_once('{') {
                Some((m, rest)) => (m, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            if metric != name {
                continue;
            }
            let pairs: Vec<(String, String)> = label_text
                .split("\",")
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let (k, v) = p.split_once('=').unwrap();
                    (
                        k.trim_start_matches(',').to_string(),
                        v.trim_matches('"').to_string(),
                    )
                })
                .collect();
            if labels
                .iter()
                .all(|(k, v)| pairs.iter().any(|(pk, pv)| pk == k && pv == v))
            {
                let v: f64 = value.parse().unwrap();
                found = Some(found.unwrap_or(0.0) + v);
            }
        }
        found
    }

    /// Like [`get`], 0 when absent.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels).unwrap_or(0.0)
    }
}

/// The exposition as scripts/check-openmetrics.py reads it with prometheus_client's parser.
pub fn parse_openmetrics(body: &[u8]) -> serde_json::Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/check-openmetrics.py");
    let mut child = std::process::Command::new("python3")
        .arg(script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 (with prometheus_client: pip install prometheus_client)");
    use std::io::Write;
    child.stdin.take().unwrap().write_all(body).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(body)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}
