//! A scripted OpenAI-compatible streaming server for the probe's tests: every chunk is written at
//! an absolute deadline (`sleep_until`), so the cadence does not drift with timer granularity.
//!
//! `Upstream::sse().tokens(40).every(ms(30)).stall_at(20, ms(300)).start().await`

#![allow(dead_code)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Milliseconds, for readable scripts.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// What the scripted server streams.
#[derive(Debug, Clone)]
pub struct Upstream {
    tokens: usize,
    every: Duration,
    first_after: Duration,
    stall: Option<(usize, Duration)>,
    per_frame: usize,
    status: u16,
    error_event_at: Option<usize>,
    usage: Option<u64>,
    stream_id: bool,
    fail_every: Option<u64>,
    models: Option<&'static str>,
}

/// What the server saw, for assertions on the requests.
#[derive(Debug, Default)]
pub struct Seen {
    /// Request bodies, in arrival order.
    pub bodies: Vec<Bytes>,
    /// Request header maps, in arrival order.
    pub headers: Vec<http::HeaderMap>,
}

/// A running scripted server.
pub struct Running {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Seen>>,
}

impl Running {
    /// The chat URL of this server.
    pub fn url(&self) -> String {
        format!("http://{}/v1/chat/completions", self.addr)
    }
}

impl Upstream {
    /// 10 token events, 30 ms apart, first after 30 ms, one per frame, status 200.
    pub fn sse() -> Self {
        Upstream {
            tokens: 10,
            every: ms(30),
            first_after: ms(30),
            stall: None,
            per_frame: 1,
            status: 200,
            error_event_at: None,
            usage: None,
            stream_id: false,
            fail_every: None,
            models: Some("scripted-model"),
        }
    }

    /// Number of token events per stream.
    pub fn tokens(mut self, n: usize) -> Self {
        self.tokens = n;
        self
    }

    /// Time between frames.
    pub fn every(mut self, gap: Duration) -> Self {
        self.every = gap;
        self
    }

    /// Time from the request to the first token frame.
    pub fn first_after(mut self, d: Duration) -> Self {
        self.first_after = d;
        self
    }

    /// The gap before token event `n` (0-based) is longer by `extra`.
    pub fn stall_at(mut self, n: usize, extra: Duration) -> Self {
        self.stall = Some((n, extra));
        self
    }

    /// Token events per frame (clumps): all events of one frame arrive together.
    pub fn per_frame(mut self, n: usize) -> Self {
        self.per_frame = n.max(1);
        self
    }

    /// Answer with this status (and a JSON error body) instead of a stream.
    pub fn status(mut self, status: u16) -> Self {
        self.status = status;
        self
    }

    /// Send an OpenAI error event instead of token event `n`, then end.
    pub fn error_event_at(mut self, n: usize) -> Self {
        self.error_event_at = Some(n);
        self
    }

    /// End with a usage chunk reporting this many completion tokens.
    pub fn usage(mut self, completion_tokens: u64) -> Self {
        self.usage = Some(completion_tokens);
        self
    }

    /// Every `n`-th request (the 2nd, 4th, ... for 2) answers 500 with a JSON error body.
    pub fn fail_every(mut self, n: u64) -> Self {
        self.fail_every = Some(n);
        self
    }

    /// `GET /v1/models` answers 404 (a server without the list).
    pub fn no_models(mut self) -> Self {
        self.models = None;
        self
    }

    /// Add an `x-metronome-stream-id` header (`s-<n>`, n counting requests).
    pub fn stream_id(mut self) -> Self {
        self.stream_id = true;
        self
    }

    /// Binds 127.0.0.1:0 and serves on the current runtime until the test ends.
    pub async fn start(self) -> Running {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let script = Arc::new(self);
        let counter = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let seen2 = seen.clone();
        tokio::spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    return;
                };
                socket.set_nodelay(true).unwrap();
                let (script, seen, counter) = (script.clone(), seen2.clone(), counter.clone());
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let (script, seen, counter) =
                            (script.clone(), seen.clone(), counter.clone());
                        async move {
                            if req.uri().path() == "/v1/models" {
                                return Ok::<_, Infallible>(script.models());
                            }
                            let n = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            Ok::<_, Infallible>(script.respond(req, n, &seen).await)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(socket), service)
                        .await;
                });
            }
        });
        Running { addr, seen }
    }

    /// Starts the server on a runtime of its own thread (for tests that run the binary).
    pub fn start_in_background(self) -> Running {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let running = self.start().await;
                tx.send(running).unwrap();
                std::future::pending::<()>().await;
            });
        });
        rx.recv().unwrap()
    }

    /// The answer to `GET /v1/models`: an OpenAI list of one model, or a 404.
    fn models(&self) -> Response<Chunks> {
        let (tx, rx) = mpsc::channel(1);
        let (status, body) = match self.models {
            Some(id) => (
                200,
                format!(
                    "{{\"object\":\"list\",\"data\":[{{\"id\":\"{id}\",\"object\":\"model\"}}]}}"
                ),
            ),
            None => (404, "{\"detail\":\"Not Found\"}".to_owned()),
        };
        let _ = tx.try_send(Bytes::from(body));
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Chunks(rx))
            .unwrap()
    }

    async fn respond(
        &self,
        req: Request<Incoming>,
        n: u64,
        seen: &Mutex<Seen>,
    ) -> Response<Chunks> {
        let start = Instant::now();
        let (parts, body) = req.into_parts();
        let body = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        {
            let mut seen = seen.lock().unwrap();
            seen.bodies.push(body);
            seen.headers.push(parts.headers);
        }
        let (tx, rx) = mpsc::channel(64);
        let mut response = Response::builder().status(self.status);
        if self.stream_id {
            response = response.header("x-metronome-stream-id", format!("s-{n}"));
        }
        let status = match self.fail_every {
            Some(every) if (n + 1) % every == 0 => 500,
            _ => self.status,
        };
        if status != 200 {
            response = response.status(status);
            let _ = tx
                .send(Bytes::from_static(
                    b"{\"error\":{\"message\":\"scripted failure\"}}",
                ))
                .await;
            return response
                .header("content-type", "application/json")
                .body(Chunks(rx))
                .unwrap();
        }
        let script = self.clone();
        tokio::spawn(async move { script.stream(start, tx).await });
        response
            .header("content-type", "text/event-stream")
            .body(Chunks(rx))
            .unwrap()
    }

    /// Writes the frames at their deadlines: frame k at start + first_after + k·every (+ stall).
    async fn stream(self, start: Instant, tx: mpsc::Sender<Bytes>) {
        let role = chunk_json("{\"role\":\"assistant\",\"content\":\"\"}", None);
        if tx.send(Bytes::from(role)).await.is_err() {
            return;
        }
        let mut token = 0;
        let mut frame_no = 0u32;
        let mut extra = Duration::ZERO;
        while token < self.tokens {
            if let Some((at, stall)) = self.stall {
                if at >= token && at < token + self.per_frame && at > 0 {
                    extra = stall;
                }
            }
            let deadline = start + self.first_after + self.every * frame_no + extra;
            tokio::time::sleep_until(deadline).await;
            let mut frame = String::new();
            for _ in 0..self.per_frame {
                if token >= self.tokens {
                    break;
                }
                if self.error_event_at == Some(token) {
                    frame.push_str("data: {\"error\":{\"message\":\"scripted error\",\"type\":\"server_error\"}}\n\n");
                    let _ = tx.send(Bytes::from(frame)).await;
                    return;
                }
                frame.push_str(&chunk_json(&format!("{{\"content\":\"t{token} \"}}"), None));
                token += 1;
            }
            if tx.send(Bytes::from(frame)).await.is_err() {
                return;
            }
            frame_no += 1;
        }
        let mut tail = chunk_json("{}", Some("\"finish_reason\":\"length\""));
        if let Some(usage) = self.usage {
            tail.push_str(&format!(
                "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[],\"usage\":{{\"prompt_tokens\":5,\"completion_tokens\":{usage},\"total_tokens\":{}}}}}\n\n",
                usage + 5
            ));
        }
        tail.push_str("data: [DONE]\n\n");
        let _ = tx.send(Bytes::from(tail)).await;
    }
}

fn chunk_json(delta: &str, finish: Option<&str>) -> String {
    let finish = finish.unwrap_or("\"finish_reason\":null");
    format!(
        "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{delta},{finish}}}]}}\n\n"
    )
}

/// A response body fed by a channel: each message is one frame.
pub struct Chunks(mpsc::Receiver<Bytes>);

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
    }
}
