//! Test helpers that read like the scenario: a scripted upstream, the proxy in-process, a client
//! that records every frame, and a reader for the Prometheus text format.
#![allow(dead_code)]

pub mod child;
pub mod fixtures;
mod upstream;

#[allow(unused_imports)] // each test crate uses its own part of the helpers
pub use upstream::{RunningUpstream, Seen, Step, Upstream, UpstreamStats};

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioExecutor;
use metronome::config::Config;
use metronome::proxy::ProxyHandle;
use tokio::net::TcpListener;

/// Milliseconds, for scripts that read like prose.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Runs `serve` on a runtime of its own thread, for tests that run the binary against servers
/// of their own; `serve` sends what the test needs (an address, a handle) once it is listening,
/// and keeps running until the test process ends.
pub fn in_background<T, F>(
    serve: impl FnOnce(std::sync::mpsc::Sender<T>) -> F + Send + 'static,
) -> T
where
    T: Send + 'static,
    F: std::future::Future<Output = ()>,
{
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(serve(tx));
    });
    rx.recv().unwrap()
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

/// A reasoning agent in the sim: 6 reasoning tokens, a 400 ms think pause, a 5-token answer
/// and 2 tool calls of 3 argument tokens, one token every 5 ms.
pub fn sim_agent() -> metronome::sim::SimConfig {
    metronome::sim::SimConfig {
        gap: ms(5),
        ttft: ms(20),
        tokens: 5,
        reasoning_tokens: 6,
        think_pause: ms(400),
        tool_calls: 2,
        tool_call_tokens: 3,
        ..metronome::sim::SimConfig::default()
    }
}

/// A proxy in front of `upstream` whose HTTP/1.x server is `kind` (metronome's own or hyper's),
/// its configuration adjusted: the tests that hold for both servers run once with each.
pub async fn proxy_on(
    kind: metronome::config::ServerKind,
    upstream: SocketAddr,
    adjust: impl FnOnce(&mut Config),
) -> ProxyHandle {
    proxy_with(upstream, |config| {
        config.server.http1_server = kind;
        adjust(config);
    })
    .await
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

/// GETs `path`, which must answer 200, and reads the answer as JSON (the admin's `/streams`,
/// `/batch`).
pub async fn get_json(addr: SocketAddr, path: &str) -> serde_json::Value {
    let got = request(addr, "GET", path, "", false).await;
    assert_eq!(got.status, 200, "{path}");
    serde_json::from_slice(&got.bytes()).unwrap()
}

/// GETs `path` and reads the answer as JSON, whatever its status: the status and the value.
pub async fn status_and_json(addr: SocketAddr, path: &str) -> (u16, serde_json::Value) {
    let got = request(addr, "GET", path, "", false).await;
    (got.status, serde_json::from_slice(&got.bytes()).unwrap())
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
    parse_exposition(body, &[])
}

/// The text format 0.0.4 read by prometheus_client's parser of it, as [`parse_openmetrics`]
/// gives OpenMetrics.
pub fn parse_text_format(body: &[u8]) -> serde_json::Value {
    parse_exposition(body, &["--text"])
}

fn parse_exposition(body: &[u8], args: &[&str]) -> serde_json::Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/check-openmetrics.py");
    let mut child = std::process::Command::new("python3")
        .arg(script)
        .args(args)
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

/// Reads one HTTP/1.1 request from `io` as a hand-written upstream must before it answers: the
/// head, then `content-length` bytes of body. False when the peer closed or failed first.
pub async fn read_request(io: &mut (impl tokio::io::AsyncRead + Unpin)) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        match io.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap());
    while buf.len() < head_end + length {
        match io.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    true
}

/// Runs `metronome probe` with `args` and `env` as a CI job would (stdout and stderr piped, no
/// step summary, no API key but the one `env` gives), and waits for it.
pub fn run_probe(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    use std::process::{Command, Stdio};
    let mut command = Command::new(env!("CARGO_BIN_EXE_metronome"));
    command
        .arg("probe")
        .args(args)
        .env("RUST_LOG", "warn")
        .env_remove("GITHUB_STEP_SUMMARY")
        .env_remove("OPENAI_API_KEY")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().unwrap()
}
