//! The one scripted upstream of the tests: an OpenAI-compatible streaming server whose frames
//! are written at absolute deadlines from the request (`sleep_until`), so the cadence does not
//! drift with timer granularity.
//!
//! `Upstream::openai_chat().tokens(20).every(ms(10)).stall_before(5, ms(300)).start().await`
//! for the proxy's tests, `Upstream::sse()` (the probe's preset: 30 ms apart, the first after
//! 30 ms, `/v1/models` answered) for the probe's, and `Upstream::script` for raw frames.
//! Token events are counted from 1: `stall_before(n, pause)` pauses before the n-th.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use super::ms;

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

/// What `GET /v1/models` answers.
#[derive(Debug, Clone)]
enum ModelsEndpoint {
    /// The script, as every other path.
    Script,
    /// An OpenAI list of this one model.
    List(String),
    /// 404, as a server without the list.
    NotFound,
}

/// A scripted upstream: what it answers, at what cadence.
#[derive(Debug, Clone)]
pub struct Upstream {
    content_type: String,
    status: u16,
    /// Answer every request (or every `fail_every`-th) with a JSON error of this status.
    error_status: Option<u16>,
    fail_every: Option<u64>,
    head_delay: Duration,
    steps: Vec<Step>,
    model: String,
    tokens: usize,
    every: Duration,
    first_after: Duration,
    per_frame: usize,
    stalls: Vec<(usize, Duration)>,
    error_event_at: Option<usize>,
    finish: &'static str,
    usage: Option<Option<u64>>,
    scripted: bool,
    echo_headers: bool,
    content_length: bool,
    headers: Vec<(String, String)>,
    keep_alive: bool,
    stream_id: bool,
    models: ModelsEndpoint,
}

/// The requests a running scripted upstream received (`/v1/models` aside), in arrival order.
#[derive(Debug, Default)]
pub struct Seen {
    /// Request bodies.
    pub bodies: Vec<Bytes>,
    /// Request header maps.
    pub headers: Vec<HeaderMap>,
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
    /// Every request's body and headers.
    pub seen: Arc<Mutex<Seen>>,
}

impl RunningUpstream {
    /// The chat URL of this server.
    pub fn url(&self) -> String {
        format!("http://{}/v1/chat/completions", self.addr)
    }

    /// Waits up to 5 s for one of this upstream's responses to be cancelled (the proxy let go of
    /// it before the script's end); panics with `failure` otherwise.
    pub async fn wait_for_a_cancel(&self, failure: &str) {
        super::wait_until(Duration::from_secs(5), failure, || {
            self.stats.cancelled.load(Ordering::SeqCst) > 0
        })
        .await;
    }
}

impl Upstream {
    /// An OpenAI chat-completions stream: role chunk, token chunks 10 ms apart (the first at
    /// once), finish chunk, usage chunk, `[DONE]`, one event per frame.
    pub fn openai_chat() -> Self {
        Upstream {
            content_type: "text/event-stream".into(),
            status: 200,
            error_status: None,
            fail_every: None,
            head_delay: Duration::ZERO,
            steps: Vec::new(),
            model: "test-model".into(),
            tokens: 10,
            every: ms(10),
            first_after: Duration::ZERO,
            per_frame: 1,
            stalls: Vec::new(),
            error_event_at: None,
            finish: "stop",
            usage: Some(None),
            scripted: false,
            echo_headers: false,
            content_length: false,
            headers: Vec::new(),
            keep_alive: true,
            stream_id: false,
            models: ModelsEndpoint::Script,
        }
    }

    /// The probe's preset: 10 token events 30 ms apart, the first 30 ms after the request, model
    /// `m`, finish `length`, no usage chunk, and `/v1/models` listing `scripted-model`.
    pub fn sse() -> Self {
        Upstream {
            model: "m".into(),
            every: ms(30),
            first_after: ms(30),
            finish: "length",
            usage: None,
            models: ModelsEndpoint::List("scripted-model".into()),
            ..Self::openai_chat()
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

    /// Number of token events per stream.
    pub fn tokens(mut self, n: usize) -> Self {
        self.tokens = n;
        self
    }

    /// Time between token frames.
    pub fn every(mut self, gap: Duration) -> Self {
        self.every = gap;
        self
    }

    /// Time from the role chunk to the first token frame.
    pub fn first_after(mut self, d: Duration) -> Self {
        self.first_after = d;
        self
    }

    /// An extra pause before token event `n` (1-based); every later frame moves by it too.
    pub fn stall_before(mut self, n: usize, pause: Duration) -> Self {
        self.stalls.push((n, pause));
        self
    }

    /// Token events per frame (clumps): all events of one frame arrive together.
    pub fn per_frame(mut self, n: usize) -> Self {
        self.per_frame = n.max(1);
        self
    }

    /// An OpenAI error event instead of token event `n` (1-based), and the stream ends there.
    pub fn error_event_at(mut self, n: usize) -> Self {
        self.error_event_at = Some(n);
        self
    }

    /// A usage chunk after the finish chunk (counting the token events), or none.
    pub fn usage(mut self, on: bool) -> Self {
        self.usage = on.then_some(None);
        self
    }

    /// A usage chunk reporting this many completion tokens, whatever the token events were.
    pub fn usage_tokens(mut self, completion_tokens: u64) -> Self {
        self.usage = Some(Some(completion_tokens));
        self
    }

    pub fn model(mut self, model: &str) -> Self {
        self.model = model.into();
        self
    }

    /// The response status, with the stream as its body.
    pub fn status(mut self, status: u16) -> Self {
        self.status = status;
        self
    }

    /// Answer every request with this status and a JSON error body instead of a stream.
    pub fn error_status(mut self, status: u16) -> Self {
        self.error_status = Some(status);
        self
    }

    /// Every `n`-th request (the 2nd, 4th, ... for 2) answers 500 with a JSON error body.
    pub fn fail_every(mut self, n: u64) -> Self {
        self.fail_every = Some(n);
        self
    }

    /// `GET /v1/models` answers 404 (a server without the list).
    pub fn no_models(mut self) -> Self {
        self.models = ModelsEndpoint::NotFound;
        self
    }

    /// Add an `x-metronome-stream-id` header (`s-<n>`, n counting requests from 0).
    pub fn stream_id(mut self) -> Self {
        self.stream_id = true;
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

    /// One chat-completion chunk with this delta and finish reason.
    fn chunk(&self, delta: &str, finish: &str) -> String {
        format!(
            "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"{}\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"logprobs\":null,\"finish_reason\":{finish}}}]}}\n\n",
            self.model
        )
    }

    /// The generated stream's frames, as a script.
    fn materialize(&mut self) {
        if self.scripted {
            return;
        }
        self.scripted = true;
        let role = self.chunk(r#"{"role":"assistant","content":""}"#, "null");
        let mut steps = vec![Step::Frame(Duration::ZERO, Bytes::from(role))];
        let mut token = 1;
        while token <= self.tokens {
            let mut wait = if token == 1 {
                self.first_after
            } else {
                self.every
            };
            let last = (token + self.per_frame - 1).min(self.tokens);
            for (n, pause) in &self.stalls {
                if (token..=last).contains(n) {
                    wait += *pause;
                }
            }
            let mut frame = String::new();
            for n in token..=last {
                if self.error_event_at == Some(n) {
                    frame.push_str("data: {\"error\":{\"message\":\"scripted error\",\"type\":\"server_error\"}}\n\n");
                    steps.push(Step::Frame(wait, Bytes::from(frame)));
                    steps.append(&mut self.steps);
                    self.steps = steps;
                    return;
                }
                frame.push_str(&self.chunk(&format!(r#"{{"content":" tok{n}"}}"#), "null"));
            }
            steps.push(Step::Frame(wait, Bytes::from(frame)));
            token = last + 1;
        }
        let finish = format!("\"{}\"", self.finish);
        steps.push(Step::Frame(
            Duration::ZERO,
            Bytes::from(self.chunk("{}", &finish)),
        ));
        if let Some(reported) = self.usage {
            let completion = reported.unwrap_or(self.tokens as u64);
            steps.push(Step::Frame(Duration::ZERO, Bytes::from(format!(
                "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"{}\",\"choices\":[],\"usage\":{{\"prompt_tokens\":5,\"completion_tokens\":{completion},\"total_tokens\":{}}}}}\n\n",
                self.model, completion + 5
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

    /// Starts serving on 127.0.0.1:0, on the current runtime, until the test ends.
    pub async fn start(mut self) -> RunningUpstream {
        self.materialize();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stats = Arc::new(UpstreamStats::default());
        let seen = Arc::new(Mutex::new(Seen::default()));
        let script = Arc::new(self);
        let counter = Arc::new(AtomicU64::new(0));
        let running = RunningUpstream {
            addr,
            stats: stats.clone(),
            seen: seen.clone(),
        };
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let _ = stream.set_nodelay(true);
                let (script, stats, seen, counter) =
                    (script.clone(), stats.clone(), seen.clone(), counter.clone());
                stats.connections_open.fetch_add(1, Ordering::SeqCst);
                stats.connections_accepted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let keep_alive = script.keep_alive;
                    let conn_stats = stats.clone();
                    let service = service_fn(move |req: Request<Incoming>| {
                        let (script, stats, seen, counter) =
                            (script.clone(), stats.clone(), seen.clone(), counter.clone());
                        async move {
                            let answer = script.respond(req, &stats, &seen, &counter).await;
                            Ok::<_, Infallible>(answer)
                        }
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
        running
    }

    /// Starts the server on a runtime of its own thread (for tests that run the binary).
    pub fn start_in_background(self) -> RunningUpstream {
        super::in_background(|started| async move {
            started.send(self.start().await).unwrap();
            std::future::pending::<()>().await;
        })
    }

    /// The answer to `GET /v1/models` when it is not the script: a list of one model, or 404.
    fn models_answer(&self) -> Option<Response<ScriptBody>> {
        let (status, body) = match &self.models {
            ModelsEndpoint::Script => return None,
            ModelsEndpoint::List(id) => (
                200,
                format!(
                    "{{\"object\":\"list\",\"data\":[{{\"id\":\"{id}\",\"object\":\"model\"}}]}}"
                ),
            ),
            ModelsEndpoint::NotFound => (404, "{\"detail\":\"Not Found\"}".to_owned()),
        };
        Some(fixed_answer(status, Bytes::from(body)))
    }

    async fn respond(
        &self,
        req: Request<Incoming>,
        stats: &Arc<UpstreamStats>,
        seen: &Mutex<Seen>,
        counter: &AtomicU64,
    ) -> Response<ScriptBody> {
        let start = tokio::time::Instant::now();
        if req.uri().path() == "/v1/models" {
            if let Some(answer) = self.models_answer() {
                return answer;
            }
        }
        let n = counter.fetch_add(1, Ordering::Relaxed);
        stats.requests.fetch_add(1, Ordering::SeqCst);
        let (parts, body) = req.into_parts();
        let body = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        {
            let mut seen = seen.lock().unwrap();
            seen.bodies.push(body);
            seen.headers.push(parts.headers.clone());
        }
        let failed = match self.fail_every {
            Some(every) if (n + 1) % every == 0 => Some(500),
            _ => self.error_status,
        };
        let mut response = match failed {
            Some(status) => fixed_answer(
                status,
                Bytes::from_static(b"{\"error\":{\"message\":\"scripted failure\"}}"),
            ),
            None => self.stream(start, &parts.headers, stats).await,
        };
        if self.stream_id {
            let id = format!("s-{n}").parse().unwrap();
            response.headers_mut().insert("x-metronome-stream-id", id);
        }
        response
    }

    /// The script's response: its head after `head_delay`, then each step at its deadline.
    async fn stream(
        &self,
        start: tokio::time::Instant,
        request_headers: &HeaderMap,
        stats: &Arc<UpstreamStats>,
    ) -> Response<ScriptBody> {
        let steps = if self.echo_headers {
            let map: HashMap<String, String> = request_headers
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
        tokio::time::sleep_until(start + self.head_delay).await;
        let (tx, rx) = mpsc::channel(1);
        let script_stats = stats.clone();
        tokio::spawn(async move {
            let stats = script_stats;
            let mut at = tokio::time::Instant::now();
            for step in steps {
                match step {
                    Step::Frame(wait, bytes) => {
                        at += wait;
                        tokio::select! {
                            _ = tokio::time::sleep_until(at) => {}
                            _ = tx.closed() => { stats.cancelled.fetch_add(1, Ordering::SeqCst); return; }
                        }
                        if tx.send(Ok(Frame::data(bytes))).await.is_err() {
                            stats.cancelled.fetch_add(1, Ordering::SeqCst);
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
                        stats.cancelled.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                }
            }
            stats.completed.fetch_add(1, Ordering::SeqCst);
        });
        let mut response = Response::new(ScriptBody {
            rx,
            stats: Some(stats.clone()),
        });
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

/// A JSON answer of one frame with this status (an error, or the model list).
fn fixed_answer(status: u16, body: Bytes) -> Response<ScriptBody> {
    let (tx, rx) = mpsc::channel(1);
    let _ = tx.try_send(Ok(Frame::data(body)));
    let mut response = Response::new(ScriptBody { rx, stats: None });
    *response.status_mut() = http::StatusCode::from_u16(status).unwrap();
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    response
}

/// The scripted upstream's body: frames from the script task.
pub struct ScriptBody {
    rx: mpsc::Receiver<Result<Frame<Bytes>, std::io::Error>>,
    /// Where taken data frames are counted (not for a fixed answer).
    stats: Option<Arc<UpstreamStats>>,
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
            if let (true, Some(stats)) = (frame.is_data(), &self.stats) {
                stats.frames_taken.fetch_add(1, Ordering::SeqCst);
            }
        }
        polled
    }
}
